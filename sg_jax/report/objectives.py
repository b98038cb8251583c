"""Runs of different training objectives side by side (issue 36): `lm`, `mlm`, `prefix_lm`.

The one metric every objective has is the minimal-pair preference (`sg_jax.evaluation.minimal_pairs`), so the
comparison reads it (in- and out-of-domain, per construction), beside the syntactic attention
structure (`in_domain/uas`), the training loss and the onsets of each seed
(`analysis.onsets`: the sharpest rise of UAS, the steepest fall of the loss, the sharpest rise of
out-of-domain preference). The unregularised seeds of every run of one objective are pooled
(`unregularised_seeds`: a run of SAS regimes contributes its lambda-0 group only), within one depth
where the runs have several (a depth sweep: `by_objective`); means come with
95% t-intervals over seeds (`seed_stats.seed_mean`; the method and n in the table header).

A masked LM logs no teacher-forced accuracy: `reading.load_run` gives such runs the preference
as their accuracy series (`Run.accuracy_from`), so that the figures of one run work for it too.
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

import numpy as np

from sg_jax.analysis import onset_detection
from sg_jax.report import seed_stats
from sg_jax.report.plotting import legend_outside, mean_band, pyplot
from sg_jax.report.reading import Run

PANELS = (("out_of_domain/preference", "out-of-domain preference"),
          ("in_domain/preference", "in-domain preference"),
          ("in_domain/uas", "UAS of the best head (in-domain)"),
          ("train/loss", "training loss (objective's own, nats)"))
# Onset signals: (name in the table, metric, direction).
ONSETS = (("structure", "in_domain/uas", "rise"), ("loss_drop", "train/loss", "fall"),
          ("preference", "out_of_domain/preference", "rise"))
OBJECTIVE_COLORS = {"lm": "#1f77b4", "prefix_lm": "#2ca02c", "mlm": "#d62728"}


def objective_of(run: Run) -> str:
  """The run's `config.objective` ('lm' for runs from before objectives existed)."""
  return str(run.config.get("objective", "lm"))


def unregularised_seeds(run: Run) -> list[int]:
  """The seeds of `run` (those that logged the preference) whose every loss term (`sas`, `tree`,
  ...: each config section with `lambdas`) has strength 0, one value or one per seed."""
  num_seeds = int(run.config.get("num_seeds", 1))
  first = int(run.config.get("first_seed", 0))
  per_term = [section["lambdas"] for section in run.config.values()
              if isinstance(section, dict) and "lambdas" in section]

  def strength(lambdas, k: int) -> float:
    values = list(lambdas) if isinstance(lambdas, (list, tuple)) else [lambdas]
    return float(values[k] if len(values) == num_seeds else values[0])

  return [s for s in sorted(run.series.get("out_of_domain/preference", {}))
          if all(strength(lambdas, s - first) == 0.0 for lambdas in per_term)]


def by_objective(runs: Sequence[Run]) -> dict[tuple[str, int | None], list[Run]]:
  """{(objective, depth): runs} of the runs with unregularised seeds that logged the preference,
  objectives in a fixed order, then depths. The depth is None (one group per objective) when
  these runs all have one depth; a depth sweep gets one group per objective and depth, so that
  depths are never pooled."""
  out = collections.defaultdict(list)
  kept = [run for run in runs if unregularised_seeds(run)]
  several_depths = len({run.depth for run in kept}) > 1
  for run in kept:
    out[(objective_of(run), run.depth if several_depths else None)].append(run)
  order = {name: k for k, name in enumerate(OBJECTIVE_COLORS)}
  return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][0],
                                                  -1 if kv[0][1] is None else kv[0][1])))


def group_label(key: tuple[str, int | None]) -> str:
  """'lm', or 'lm, depth 6' for a group of a depth sweep (`by_objective`)."""
  objective, depth = key
  return objective if depth is None else f"{objective}, depth {depth}"


def _final(run: Run, name: str, seed: int) -> float:
  steps_values = run.series.get(name, {}).get(seed)
  if steps_values is None:
    return math.nan
  finite = np.isfinite(steps_values[1])
  return float(steps_values[1][finite][-1]) if finite.any() else math.nan


def seed_onsets(run: Run, seed: int) -> dict[str, float]:
  """{signal: onset step (NaN: none, or too few points)} of one seed (`ONSETS`)."""
  out = {}
  for signal, name, direction in ONSETS:
    curve = run.series.get(name, {}).get(seed)
    if curve is None or np.sum(np.isfinite(curve[1])) < onset_detection.MIN_POINTS:
      out[signal] = math.nan
      continue
    out[signal] = onset_detection.onset(curve[0], curve[1], direction).step
  return out


def objective_rows(runs: Sequence[Run]) -> list[dict]:
  """One row per objective (per objective and depth when the runs have several depths; `depth`:
  None otherwise): seeds, final in- and out-of-domain preference and per construction
  (`<metric>`, `<metric>_ci_low`, `<metric>_ci_high`: seed mean and 95% t-interval), final
  UAS, the median onset of each `ONSETS` signal and the fraction of seeds whose structure onset
  lies within `coincide` steps of their loss drop (`structure_with_loss_drop`; Chen et al.'s
  claim is that they coincide), with `coincide` = 2 x the median gap between evaluations, over
  the `structure_past_start` seeds whose onset is more than `coincide` after the first
  evaluation (`structure_at_start` seeds are left out: their tie with the initial descent cannot
  fail)."""
  rows = []
  for (objective, depth), group in by_objective(runs).items():
    seeds = [(run, s) for run in group for s in unregularised_seeds(run)]
    row = {"objective": objective, "depth": depth, "runs": " ".join(r.name for r in group),
           "seeds": len(seeds)}
    names = ["in_domain/preference", "out_of_domain/preference", "in_domain/uas"]
    names += sorted({n for run in group for n in run.series
                     if n.startswith("out_of_domain/preference/")})
    for name in names:
      mean, low, high = seed_stats.seed_mean([_final(run, name, s) for run, s in seeds])
      row.update({name: mean, f"{name}_ci_low": low, f"{name}_ci_high": high})
    onsets = [seed_onsets(run, s) for run, s in seeds]
    for signal, _, _ in ONSETS:
      finite = [o[signal] for o in onsets if math.isfinite(o[signal])]
      row[f"{signal}_onset_median"] = float(np.median(finite)) if finite else math.nan
    steps = group[0].series["out_of_domain/preference"][seeds[0][1]][0]
    window = 2.0 * float(np.median(np.diff(steps))) if len(steps) > 1 else 0.0
    # an onset within `window` of the first evaluation ties with the initial descent whatever
    # happens (every run starts with it): left out, as `chen.structure_with_loss_drop` does
    start = float(steps[0]) if len(steps) else 0.0
    with_structure = [o for o in onsets if math.isfinite(o["structure"])]
    later = [o for o in with_structure if o["structure"] - start > window]
    both = [o for o in later if math.isfinite(o["loss_drop"])]
    row["structure_at_start"] = len(with_structure) - len(later)
    row["structure_past_start"] = len(both)
    row["structure_with_loss_drop"] = (
        float(np.mean([abs(o["structure"] - o["loss_drop"]) <= window for o in both]))
        if both else math.nan)
    rows.append(row)
  return rows


def plot_objectives(runs: Sequence[Run], path: str, title_prefix: str = ""):
  """`PANELS` over training: per objective (and depth, in line styles, when the runs have several:
  `by_objective`) the seed mean with a 95% t-interval band, and each seed's onsets (`ONSETS`) as
  ticks at the bottom of its panel.

  Returns:
    the (closed) Figure written to `path`, or None (nothing written) when no run logged the
    preference.
  """
  groups = by_objective(runs)
  if not groups:
    return None
  plt = pyplot()
  panels = [(n, t) for n, t in PANELS if any(r.series.get(n) for g in groups.values() for r in g)]
  fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 2.5, 4), squeeze=False)
  onset_of_panel = {metric: signal for signal, metric, _ in ONSETS}
  depths = sorted({d for _, d in groups if d is not None})
  styles = ("-", "--", ":", "-.")
  for ax, (name, title) in zip(axes[0], panels):
    for (objective, depth), group in groups.items():
      color = OBJECTIVE_COLORS.get(objective, "#7f7f7f")
      style = styles[depths.index(depth) % len(styles)] if depth is not None else "-"
      per_step = collections.defaultdict(list)
      for run in group:
        curves = run.series.get(name, {})
        for steps, values in (curves[s] for s in unregularised_seeds(run) if s in curves):
          for step, value in zip(steps.tolist(), values.tolist()):
            if math.isfinite(value):
              per_step[step].append(value)
      if not per_step:
        continue
      xs = sorted(per_step)
      mean_band(ax, xs, per_step, color, lw=1.8, ls=style,
                label=f"{group_label((objective, depth))} ({len(group)} run(s))")
      signal = onset_of_panel.get(name)
      if signal is not None:
        ticks = [seed_onsets(run, s)[signal] for run in group for s in unregularised_seeds(run)
                 if s in run.series.get(name, {})]
        ticks = [t for t in ticks if math.isfinite(t)]
        ax.plot(ticks, [0.02] * len(ticks), "|", color=color, ms=12, mew=2,
                transform=ax.get_xaxis_transform())
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("training step")
    ax.locator_params(axis="x", nbins=5)  # tick labels of 5-digit steps must not overlap
    if name == "train/loss":
      ax.set_yscale("log")
    ax.grid(alpha=0.3)
  legend_outside(axes[0][-1]).set_title("mean, 95% t-interval band;\nticks: seeds' onsets",
                                        prop={"size": 8})
  fig.suptitle(f"{title_prefix}objectives side by side")
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


def _cell(row: dict, name: str) -> str:
  value = row.get(name, math.nan)
  if not isinstance(value, float) or not math.isfinite(value):
    return ""
  low, high = row.get(f"{name}_ci_low", math.nan), row.get(f"{name}_ci_high", math.nan)
  return f"{value:.3f} [{low:.2f}, {high:.2f}]" if math.isfinite(low) else f"{value:.3f}"


def markdown_lines(rows: Sequence[dict]) -> list[str]:
  """The "Objectives" section of summary.md ([] without rows)."""
  if not rows:
    return []
  tags = sorted({n.rsplit("/", 1)[1] for r in rows for n in r
                 if n.startswith("out_of_domain/preference/") and not n.endswith(("_low",
                                                                                   "_high"))})
  with_depth = any(r.get("depth") is not None for r in rows)
  ns = [r["seeds"] for r in rows if r["seeds"] >= 2]
  ci = lambda what: seed_stats.interval_header(what, ns)
  head = (["objective"] + (["depth"] if with_depth else []) + ["seeds", ci("in-domain pref."),
                                                               ci("out-of-domain pref.")]
          + [ci(f"pref. {t}") for t in tags]
          + [ci("UAS (final)"), "structure onset", "loss-drop onset", "preference onset",
             "structure within 2 evals of loss drop (seeds past the start)"])
  lines = ["", "## Objectives", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  fmt = lambda v: "" if not math.isfinite(v) else f"{v:.0f}"
  for r in rows:
    depth = [] if not with_depth else ["" if r.get("depth") is None else str(r["depth"])]
    cells = [r["objective"], *depth, str(r["seeds"]), _cell(r, "in_domain/preference"),
             _cell(r, "out_of_domain/preference")]
    cells += [_cell(r, f"out_of_domain/preference/{t}") for t in tags]
    cells += [_cell(r, "in_domain/uas"), fmt(r["structure_onset_median"]),
              fmt(r["loss_drop_onset_median"]), fmt(r["preference_onset_median"]),
              ("" if not math.isfinite(r["structure_with_loss_drop"])
               else f"{r['structure_with_loss_drop']:.2f} ")
              + f"({r.get('structure_past_start', 0)} of "
                f"{r.get('structure_past_start', 0) + r.get('structure_at_start', 0)})"]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "Final values: seed mean [95% Student t interval over the seeds; n = the seeds "
            "column]; onsets: median step over "
            "seeds (`sg_jax.analysis.onsets`; blank: no seed has one, or the curves have fewer "
            f"than {onset_detection.MIN_POINTS} evaluations); preference: minimal pairs from the "
            "grammar (`sg_jax.evaluation.minimal_pairs`, docs/objectives.md). The last column is the fraction of "
            "seeds whose structure onset lies within two evaluation intervals of their loss "
            "drop (Chen et al. 2024 find them together in masked LMs), over the seeds whose "
            "onset lies more than two intervals after the first evaluation (in brackets: those "
            "of all seeds with an onset; an onset nearer the start ties with the initial loss "
            "descent whatever happens, so it is left out)."]
  return lines
