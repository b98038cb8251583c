"""The "Baselines" section of summary.md: every structure measure beside its trivial baselines
(docs/analysis.md, "Baselines"; issue 49 item 2).

| measure | baselines | source |
| --- | --- | --- |
| UAS of the best head (`uas` of analysis.csv, else `in_domain/uas` of metrics.csv) | previous-token, next-token and best-fixed-offset heads on the same lines and arcs (`uas_prev_token`, `uas_next_token`, `uas_best_offset`; `analysis/uas_positional.py`) | Clark et al. 2019, "What does BERT look at?", §4.2 |
| tparseval F1 (`tparseval_f1`) | right-branching, left-branching and random binary trees on the same gold trees (random: the exact expectation; `analysis/parseval.py`) | Klein & Manning 2002; Kim et al. 2019, Table 1 |
| tscore (`tscore`) | the expected tscore of random binary trees, and the tscore of the right- and left-branching trees, under the same chart and normalisation (`tree_projection.baseline_tscores`) | Murty et al., ICLR 2023, §3 |

One row per run and measure, read at each seed's last step with the measure; a baseline is
read at the same step of the same seed (the tscore baselines change with the checkpoint, the
others are constants of the sentence set). The measure is given as its seed mean with the
range over seeds; each baseline as its seed mean; "seeds above" counts the seeds whose measure
exceeds every baseline of that seed: a count, not a test. Runs without a measure's rows get
no row for it.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# (measure key, title, [(column, metrics.csv fallback)] of the measure then its baselines, with
# short labels); the first source that a run has is used for every column of the measure.
MEASURES = (
    ("uas", "UAS of the best head (argmax)", "Clark et al. 2019, §4.2",
     (("uas", "in_domain/uas", "best head"),
      ("uas_prev_token", "in_domain/uas_prev_token", "previous token"),
      ("uas_next_token", "in_domain/uas_next_token", "next token"),
      ("uas_best_offset", "in_domain/uas_best_offset", "best offset per relation"))),
    ("tparseval", "tparseval F1 (projected trees vs gold)", "Klein & Manning 2002; Kim et al. "
     "2019", (("tparseval_f1", "", "projected trees"),
              ("tparseval_f1_right_branching", "", "right-branching"),
              ("tparseval_f1_left_branching", "", "left-branching"),
              ("tparseval_f1_random", "", "random (expected)"))),
    ("tscore", "tscore (tree-structuredness)", "Murty et al., ICLR 2023, §3",
     (("tscore", "", "projected trees"),
      ("tscore_random_tree", "", "random (expected)"),
      ("tscore_right_branching", "", "right-branching"),
      ("tscore_left_branching", "", "left-branching"))),
)


def _at(series: tuple | None, step: int) -> float:
  """The value of a (steps, values) series at `step`, nan when absent or not finite."""
  if series is None:
    return math.nan
  steps, values = series
  hit = np.flatnonzero(np.asarray(steps) == step)
  return float(values[hit[-1]]) if hit.size and np.isfinite(values[hit[-1]]) else math.nan


def _source(run, columns) -> list[str] | None:
  """The column names the run has for a measure: analysis.csv's, else metrics.csv's; None when
  it has neither for the measure itself."""
  for pick in (0, 1):
    names = [c[pick] for c in columns]
    if names[0] and run.series.get(names[0]):
      return names
  return None


def baseline_rows(runs: Sequence) -> list[dict]:
  """One row per (run, measure of `MEASURES`) the run has.

  Args:
    runs: `reading.Run`s.

  Returns:
    dicts with 'run', 'depth', 'measure', 'column' (the name read: analysis.csv's, or
    metrics.csv's for a run without analysis rows), 'seeds', 'step' (the latest final step over
    seeds), 'value' (seed mean of the final values), 'value_min', 'value_max', and per baseline
    column `<column>` (seed mean at the same steps; nan when the run lacks it),
    'strongest_baseline' (the baseline column with the largest seed mean) and
    'seeds_above_baselines' (seeds whose measure exceeds every baseline of theirs; nan when a
    seed lacks a baseline).
  """
  out = []
  for run in runs:
    for key, _, _, columns in MEASURES:
      names = _source(run, columns)
      if names is None:
        continue
      measure, bases = names[0], names[1:]
      finals, per_base, above = [], {b: [] for b in bases}, []
      last_step = None
      for seed, (steps, values) in sorted(run.series[measure].items()):
        ok = np.flatnonzero(np.isfinite(values))
        if not ok.size:
          continue
        step, value = int(steps[ok[-1]]), float(values[ok[-1]])
        last_step = step if last_step is None else max(last_step, step)
        finals.append(value)
        seen = [_at(run.series.get(b, {}).get(seed), step) for b in bases]
        for b, v in zip(bases, seen):
          per_base[b].append(v)
        above.append(math.nan if any(math.isnan(v) for v in seen) else float(value > max(seen)))
      if not finals:
        continue
      row = {"run": run.name, "depth": run.depth, "measure": key, "column": measure,
             "seeds": len(finals), "step": last_step, "value": float(np.mean(finals)),
             "value_min": float(np.min(finals)), "value_max": float(np.max(finals))}
      means = {}
      for (column, _, _), b in zip(columns[1:], bases):
        values = [v for v in per_base[b] if not math.isnan(v)]
        means[column] = float(np.mean(values)) if values else math.nan
        row[column] = means[column]
      finite = {c: v for c, v in means.items() if not math.isnan(v)}
      row["strongest_baseline"] = max(finite, key=finite.get) if finite else ""
      row["seeds_above_baselines"] = (math.nan if any(math.isnan(a) for a in above)
                                      else float(sum(above)))
      out.append(row)
  return out


def _f(v) -> str:
  return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def markdown_lines(rows: Sequence[dict]) -> list[str]:
  """The "Baselines" section of summary.md ([] without rows): one table per measure."""
  if not rows:
    return []
  lines = ["", "## Baselines", "",
           "Each structure measure beside trivial baselines computed on the same sentences "
           "(docs/analysis.md, \"Baselines\"): the measure's seed mean [min, max over seeds] at "
           "each seed's last step, each baseline's seed mean at the same steps, and the seeds "
           "whose measure exceeds all of that seed's baselines (a count, not a test)."]
  for key, title, source, columns in MEASURES:
    chosen = [r for r in rows if r["measure"] == key]
    if not chosen:
      continue
    labels = [label for _, _, label in columns[1:]]
    lines += ["", f"**{title}** (baselines: {source})", "",
              "| run | depth | column | step | seeds | " + columns[0][2] + " mean [min, max] | "
              + " | ".join(labels) + " | seeds above all baselines |",
              "|" + "---|" * (7 + len(labels))]
    for r in chosen:
      above = r["seeds_above_baselines"]
      cells = [r["run"], "" if r["depth"] is None else str(r["depth"]), f"`{r['column']}`",
               str(r["step"]), str(r["seeds"]),
               f"{_f(r['value'])} [{_f(r['value_min'])}, {_f(r['value_max'])}]"]
      cells += [_f(r[c]) for c, _, _ in columns[1:]]
      cells.append("" if math.isnan(above) else f"{above:.0f}/{r['seeds']}")
      lines.append("| " + " | ".join(cells) + " |")
  return lines
