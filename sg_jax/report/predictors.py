"""Does a model property predict generalisation? Murty et al. (ACL 2023, §5, docs/REFERENCE.md §1
"Headline numbers") report that tree-structuredness (tscore) predicts the best depth for
structural grokking while weight norm and attention sparsity do not. This module measures it on
one's own depth sweep (issue 37).

For every seed of every depth, each predictor (`PREDICTORS`: tscore, tparseval F1, the
depth-normalised weight norm, attention sparsity; analysis.csv rows of `sg_jax.analyze`) is read
at two moments: at in-domain saturation (the first analysed step at or after the first step
whose in-domain accuracy reaches `saturation`) and at the end (the last analysed step). Against
each seed's final generalisation accuracy:

* `across_seeds`: Spearman's rho over all seeds of all depths, tested by permutation
  (`stats.stratified_association` with one stratum); depth differences feed it, so it is
  descriptive;
* `across_depths`: does the predictor's depth ordering predict generalisation's? The depths are
  ordered by the predictor's seed mean and the seeds' final generalisation is tested for a
  trend along that order (`stats.ordered_trend`, Jonckheere-Terpstra on the seeds, not a
  Spearman over 4 depth means, which reaches +-1 for anything monotone in depth); beside it
  `depth_trend`, the predictor's own trend over depth (a quantity that falls with depth by
  construction, like the weight norm per layer, orders the depths as depth itself does);
* `within_depth`: the seed-weighted mean of the within-depth Spearman correlations, tested by
  permuting generalisation within each depth (`stats.stratified_association`).

Each comes with its p-value, the p-value Holm-corrected over the predictors and moments of the
table (`stats.holm`), and the minimum detectable effect at this n (alpha 0.05, power 0.8), so a
correlation that cannot be detected with these seeds reads "not testable at this n". A
correlation with fewer than 3 points (or a constant series) is NaN.
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

import numpy as np
import scipy.stats

from sg_jax import stats
from sg_jax.report import seed_stats
from sg_jax.report.plotting import depth_label, legend_outside, pyplot
from sg_jax.report.reading import GEN_ACC, Run
from sg_jax.report.tables import final_value, saturation_step

# analysis.csv column -> label (weight_norm_per_layer: the paper's depth normalisation).
PREDICTORS = {"tscore": "tscore", "tparseval_f1": "tparseval F1",
              "weight_norm_per_layer": "weight norm / layer",
              "attention_sparsity_paper": "attention sparsity"}
MOMENTS = ("saturation", "final")
KINDS = ("across_seeds", "across_depths", "within_depth", "depth_trend")


def _value_at(run: Run, name: str, seed: int, step: int | None) -> float:
  """The analysis value of `seed` at the first analysed step >= `step` (None: the last)."""
  curve = run.series.get(name, {}).get(seed)
  if curve is None:
    return math.nan
  steps, values = curve
  keep = np.isfinite(values)
  steps, values = steps[keep], values[keep]
  if not steps.size:
    return math.nan
  if step is None:
    return float(values[-1])
  later = np.flatnonzero(steps >= step)
  return float(values[later[0]]) if later.size else math.nan


def seed_table(runs: Sequence[Run], saturation: float = 0.99) -> list[dict]:
  """One row per (run, seed): depth, final generalisation accuracy (`generalisation`), the
  saturation step, and `<predictor>@saturation`, `<predictor>@final` for each of `PREDICTORS`
  the run's analysis.csv has."""
  rows = []
  for run in runs:
    for seed, (steps, values) in sorted(run.series.get(GEN_ACC, {}).items()):
      sat = saturation_step(run, seed, saturation)
      row = {"run": run.name, "depth": run.depth, "seed": seed,
             "generalisation": final_value(steps, values)[1], "saturation_step": sat}
      for name in PREDICTORS:
        if run.series.get(name):
          row[f"{name}@saturation"] = (_value_at(run, name, seed, sat) if sat is not None
                                       else math.nan)
          row[f"{name}@final"] = _value_at(run, name, seed, None)
      rows.append(row)
  return rows


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman's rho of the finite pairs (NaN with fewer than 3, or a constant side)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  keep = np.isfinite(x) & np.isfinite(y)
  x, y = x[keep], y[keep]
  if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
    return math.nan
  return float(scipy.stats.spearmanr(x, y).statistic)


def _depth_order(rows: Sequence[dict]):
  return sorted({r["depth"] for r in rows}, key=lambda d: (d is None, d))


def correlations(rows: Sequence[dict], column: str) -> dict[str, stats.Test]:
  """{'across_seeds', 'across_depths', 'within_depth', 'depth_trend': stats.Test} of `column`
  (a `seed_table` column) against the final generalisation (module docstring). The effects are
  Spearman's rho (across seeds, within depth) and Jonckheere-Terpstra's tau (across depths:
  generalisation along the depths ordered by the predictor's mean; depth trend: the predictor
  along depth).

  Raises:
    KeyError: no row has `column`.
  """
  if not any(column in r for r in rows):
    raise KeyError(f"no row has {column!r}")
  pairs = [(r["depth"], r.get(column, math.nan), r["generalisation"]) for r in rows]
  pairs = [(d, x, y) for d, x, y in pairs if math.isfinite(x) and math.isfinite(y)]
  depths = _depth_order([{"depth": d} for d, _, _ in pairs])
  x = [p[1] for p in pairs]
  y = [p[2] for p in pairs]
  strata = [p[0] for p in pairs]
  by_predictor = sorted(depths, key=lambda d: np.mean([v for e, v, _ in pairs if e == d]))
  return {"across_seeds": stats.stratified_association(x, y, [0] * len(pairs)),
          "across_depths": stats.ordered_trend([[g for e, _, g in pairs if e == d]
                                                for d in by_predictor]),
          "within_depth": stats.stratified_association(x, y, strata),
          "depth_trend": stats.ordered_trend([[v for e, v, _ in pairs if e == d]
                                              for d in depths if d is not None])}


def correlation_rows(rows: Sequence[dict]) -> list[dict]:
  """One row per (predictor, moment) present: for each of `KINDS` the effect (`<kind>`), its
  p-value (`<kind>_p`), the p-value Holm-corrected over the table's rows (`<kind>_p_holm`), the
  minimum detectable effect (`<kind>_detectable`; inf: none at this n) and the seeds per
  depth or stratum (`<kind>_n`)."""
  out = []
  for name in PREDICTORS:
    for moment in MOMENTS:
      column = f"{name}@{moment}"
      if not any(math.isfinite(r.get(column, math.nan)) for r in rows):
        continue
      row = {"predictor": name, "moment": moment}
      for kind, test in correlations(rows, column).items():
        row.update({kind: test.effect, f"{kind}_p": test.p, f"{kind}_detectable": test.detectable,
                    f"{kind}_min_p": test.min_p, f"{kind}_n": " ".join(map(str, test.n))})
      out.append(row)
  for kind in KINDS:
    for row, p in zip(out, stats.holm([r[f"{kind}_p"] for r in out])):
      row[f"{kind}_p_holm"] = float(p)
  return out


def plot_predictors(rows: Sequence[dict], path: str, title_prefix: str = "",
                    moment: str = "final"):
  """Each predictor at `moment` against final generalisation, one panel per predictor, dots
  coloured by depth (the paper's scatter figure).

  Returns:
    the (closed) Figure written to `path`, or None when no row has a predictor.
  """
  names = [n for n in PREDICTORS if any(math.isfinite(r.get(f"{n}@{moment}", math.nan))
                                        for r in rows)]
  if not names:
    return None
  plt = pyplot()
  depths = sorted({r["depth"] for r in rows}, key=lambda d: (d is None, d))
  cmap = plt.get_cmap("viridis", max(len(depths), 2))
  fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names) + 2, 4), squeeze=False,
                           sharey=True)
  for ax, name in zip(axes[0], names):
    for k, depth in enumerate(depths):
      xy = [(r.get(f"{name}@{moment}", math.nan), r["generalisation"]) for r in rows
            if r["depth"] == depth]
      xy = np.asarray([p for p in xy if all(map(math.isfinite, p))]).reshape(-1, 2)
      ax.scatter(xy[:, 0], xy[:, 1], color=cmap(k), s=30, label=depth_label(depth))
    x = [r.get(f"{name}@{moment}", math.nan) for r in rows]
    rho = spearman(x, [r["generalisation"] for r in rows])
    ax.set_title(f"{PREDICTORS[name]} ({moment}); Spearman {rho:.2f}", fontsize=9)
    ax.set_xlabel(PREDICTORS[name])
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("final generalisation accuracy")
  axes[0][0].set_ylim(-0.02, 1.02)
  legend_outside(axes[0][-1])
  fig.suptitle(f"{title_prefix}what predicts generalisation (each dot a seed)")
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


def _test_cell(row: dict, kind: str) -> str:
  """'+0.40, p 0.02 (Holm 0.08; detectable 0.45)', or '+0.40, not testable at this n'."""
  effect = row.get(kind, math.nan)
  if not math.isfinite(effect):
    return ""
  detectable, min_p = row[f"{kind}_detectable"], row[f"{kind}_min_p"]
  if min_p > stats.ALPHA or not math.isfinite(detectable):
    sizes = " / ".join(str(row[f"{kind}_n"]).split())
    return f"{effect:+.2f}, not testable at n = {sizes} seeds"
  return (f"{effect:+.2f}, p {row[f'{kind}_p']:.2g} (Holm {row[f'{kind}_p_holm']:.2g}; "
          f"detectable {detectable:.2f})")


def markdown_lines(correlation_table: Sequence[dict]) -> list[str]:
  """The "Predictors of generalisation" section of summary.md ([] without rows)."""
  if not correlation_table:
    return []
  headers = {"across_seeds": "across seeds (Spearman rho)",
             "across_depths": "across depths (Jonckheere-Terpstra tau)",
             "within_depth": "within depth (Spearman rho)",
             "depth_trend": "predictor over depth (Jonckheere-Terpstra tau)"}
  # A test no row has (the two across-depth tests with one depth) gets no column.
  kinds = [k for k in KINDS if any(_test_cell(r, k) for r in correlation_table)]
  lines = ["", "## Predictors of generalisation", "",
           "| predictor | measured at | " + " | ".join(headers[k] for k in kinds) + " |",
           "|---|---|" + "---|" * len(kinds)]
  for r in correlation_table:
    lines.append(f"| {PREDICTORS[r['predictor']]} | {r['moment']} | "
                 + " | ".join(_test_cell(r, k) for k in kinds) + " |")
  if len(kinds) < len(KINDS):
    lines += ["", "Not shown (no row could compute them: they need two depths or more): "
              + ", ".join(headers[k] for k in KINDS if k not in kinds) + "."]
  lines += ["", "Against final generalisation accuracy, each seed one observation: across seeds, "
            "Spearman's rho over all seeds (permutation p; depth differences feed it); across "
            "depths, Jonckheere-Terpstra's tau of the seeds' generalisation along the depths "
            "ordered by the predictor's depth mean (does the predictor's ordering of the depths "
            "predict generalisation's?); within depth, the seed-weighted mean of the "
            "within-depth Spearman correlations, p by permuting generalisation within each "
            "depth; and the predictor's own trend over depth (a predictor monotone in depth "
            "orders the depths as depth itself does, so its across-depth test is depth's). "
            "p: exact or 9,999 seeded permutations; Holm: corrected over the rows of this "
            "table; detectable: the minimum detectable effect at alpha 0.05, power 0.8 with "
            "these seeds (`sg_jax.stats`; docs/analysis.md, \"Statistics\"). 'saturation' reads "
            "the predictor at the first analysed step at or after in-domain saturation, "
            "'final' at the last analysed step."]
  return lines


def depth_rows(rows: Sequence[dict]) -> list[dict]:
  """Each predictor per depth and moment: the seed mean with its 95% t-interval over seeds
  (`seed_stats.seed_mean`) and the seed count, beside the depth's final generalisation (the
  numbers behind the paper's tscore-vs-depth figure, Murty et al. 2023 §5).

  Args:
    rows: `seed_table` rows.

  Returns:
    one dict per (predictor, moment, depth) with a finite value: `predictor`, `moment`,
    `depth`, `seeds`, `mean`, `ci_low`, `ci_high`, and `generalisation` (the seed mean of the
    final generalisation accuracy over the same seeds). Rows without a depth are skipped.
  """
  depths = sorted({r["depth"] for r in rows if r["depth"] is not None})
  out = []
  for name in PREDICTORS:
    for moment in MOMENTS:
      column = f"{name}@{moment}"
      for depth in depths:
        pairs = [(r.get(column, math.nan), r["generalisation"]) for r in rows
                 if r["depth"] == depth and math.isfinite(r.get(column, math.nan))]
        if not pairs:
          continue
        mean, low, high = seed_stats.seed_mean([x for x, _ in pairs])
        out.append({"predictor": name, "moment": moment, "depth": depth, "seeds": len(pairs),
                    "mean": mean, "ci_low": low, "ci_high": high,
                    "generalisation": float(np.nanmean([g for _, g in pairs]))})
  return out


def depth_markdown_lines(table: Sequence[dict]) -> list[str]:
  """The "Predictors per depth" section of summary.md ([] without rows): one row per depth,
  one column per (predictor, moment), seed mean [95% t-CI] (n in the header, or per cell when
  the depths' seed counts differ)."""
  if not table:
    return []
  columns = [(n, m) for n in PREDICTORS for m in MOMENTS
             if any(r["predictor"] == n and r["moment"] == m for r in table)]
  cells = {(r["predictor"], r["moment"], r["depth"]): r for r in table}
  depths = sorted({r["depth"] for r in table})
  ns = [r["seeds"] for r in table if r["seeds"] >= 2]
  varied = len(set(ns)) > 1
  lines = ["", "## Predictors per depth", "",
           "| depth | " + " | ".join(seed_stats.interval_header(f"{PREDICTORS[n]} ({m})", ns)
                                    for n, m in columns) + " |",
           "|---" * (len(columns) + 1) + "|"]
  for depth in depths:
    row = [str(depth)]
    for n, m in columns:
      r = cells.get((n, m, depth))
      row.append("" if r is None else seed_stats.interval_cell(
          r["mean"], r["ci_low"], r["ci_high"], r["seeds"] if varied else None))
    lines.append("| " + " | ".join(row) + " |")
  lines += ["", "Seed mean [95% Student t interval over seeds] of each predictor at in-domain "
            "saturation and at the end (as in the correlations above); `summary_predictors_by_depth.csv` "
            "has the same with the seed counts."]
  return lines


def plot_by_depth(rows: Sequence[dict], path: str, title_prefix: str = "",
                  moment: str = "final", table: Sequence[dict] | None = None):
  """Each predictor at `moment` per depth: seed mean with its 95% t-interval and the seeds
  (the paper's tscore-vs-depth figure), one panel per predictor.

  `table` is `depth_rows(rows)` when the caller already has it (computed here otherwise).

  Returns:
    the (closed) Figure written to `path`, or None when no row has a predictor.
  """
  table = [r for r in (depth_rows(rows) if table is None else table) if r["moment"] == moment]
  names = [n for n in PREDICTORS if any(r["predictor"] == n for r in table)]
  if not names:
    return None
  plt = pyplot()
  fig, axes = plt.subplots(1, len(names), figsize=(3.8 * len(names) + 1, 3.6), squeeze=False)
  for ax, name in zip(axes[0], names):
    stats = [r for r in table if r["predictor"] == name]
    depths = [r["depth"] for r in stats]
    for depth in depths:
      values = [r.get(f"{name}@{moment}", math.nan) for r in rows if r["depth"] == depth]
      ax.scatter([depth] * len(values), values, color="0.6", s=14, zorder=2)
    mean, low, high = (np.asarray([r[k] for r in stats]) for k in ("mean", "ci_low", "ci_high"))
    ax.errorbar(depths, mean, yerr=[mean - low, high - mean], color="black", marker="o",
                capsize=4, zorder=3)
    ax.set_xticks(depths)
    ax.set_xlabel("depth (layers)")
    ax.set_title(f"{PREDICTORS[name]} ({moment})", fontsize=9)
    ax.grid(alpha=0.3)
  fig.suptitle(f"{title_prefix}predictors per depth (seed mean, 95% t-interval over "
               f"n={'/'.join(str(n) for n in sorted({r['seeds'] for r in table}))} seeds; "
               "grey: seeds)")
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig
