"""Does a model property predict generalisation? Murty et al. (ACL 2023, §5, docs/REFERENCE.md §1
"Headline numbers") report that tree-structuredness (tscore) predicts the best depth for
structural grokking while weight norm and attention sparsity do not. This module measures it on
one's own depth sweep (issue 37).

For every seed of every depth, each predictor (`PREDICTORS`: tscore, tparseval F1, the
depth-normalised weight norm, attention sparsity; analysis.csv rows of `sg_jax.analyze`) is read
at two moments: at in-domain saturation (the first analysed step at or after the first step
whose in-domain accuracy reaches `saturation`) and at the end (the last analysed step). Against
each seed's final generalisation accuracy:

* `across_seeds`: Spearman's rho over all seeds of all depths, with a bootstrap CI (seeds
  resampled as pairs);
* `across_depths`: Spearman's rho between the depths' seed means of the predictor and of the
  generalisation, with a CI from resampling seeds within each depth (stratified bootstrap);
* `within_depth`: the seed-weighted mean over depths of the Spearman rho among a depth's seeds
  (depth held fixed), with a stratified bootstrap CI.

Percentile bootstrap intervals (Efron & Tibshirani 1993, ch. 13), seeded, so a report is
reproducible. A correlation with fewer than 3 points (or a constant series) is NaN.
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

import numpy as np
import scipy.stats

from sg_jax.report import seed_stats
from sg_jax.report.plotting import depth_label, legend_outside, pyplot
from sg_jax.report.reading import GEN_ACC, Run
from sg_jax.report.tables import final_value, saturation_step

# analysis.csv column -> label (weight_norm_per_layer: the paper's depth normalisation).
PREDICTORS = {"tscore": "tscore", "tparseval_f1": "tparseval F1",
              "weight_norm_per_layer": "weight norm / layer",
              "attention_sparsity_paper": "attention sparsity"}
MOMENTS = ("saturation", "final")
NUM_RESAMPLES = 2000


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


def _stratified(groups: Sequence[np.ndarray], statistic, seed: int, num_resamples: int,
                confidence: float) -> tuple[float, float, float]:
  """(statistic of `groups`, percentile CI) with the rows of each group ([n_g, 2] arrays of
  (x, y)) resampled with replacement within the group."""
  rng = np.random.default_rng(seed)
  point = statistic(groups)
  draws = []
  for _ in range(num_resamples):
    draws.append(statistic([g[rng.integers(0, len(g), len(g))] for g in groups]))
  draws = np.asarray(draws)
  draws = draws[np.isfinite(draws)]
  if not math.isfinite(point) or draws.size == 0:
    return point, math.nan, math.nan
  alpha = (1.0 - confidence) / 2
  low, high = np.quantile(draws, [alpha, 1.0 - alpha])
  return point, float(low), float(high)


def correlations(rows: Sequence[dict], column: str, *, seed: int = 0,
                 num_resamples: int = NUM_RESAMPLES, confidence: float = 0.95) -> dict:
  """{'across_seeds', 'across_depths', 'within_depth': (rho, ci_low, ci_high)} of `column`
  (a `seed_table` column) against the final generalisation (module docstring).

  Raises:
    KeyError: no row has `column`.
  """
  if not any(column in r for r in rows):
    raise KeyError(f"no row has {column!r}")
  by_depth = collections.defaultdict(list)
  for r in rows:
    x, y = r.get(column, math.nan), r["generalisation"]
    if math.isfinite(x) and math.isfinite(y):
      by_depth[r["depth"]].append((x, y))
  groups = [np.asarray(v, np.float64) for _, v in sorted(by_depth.items(),
                                                          key=lambda kv: (kv[0] is None, kv[0]))]
  pooled = lambda gs: spearman(np.concatenate(gs)[:, 0], np.concatenate(gs)[:, 1]) if gs else \
      math.nan
  means = lambda gs: spearman([g[:, 0].mean() for g in gs], [g[:, 1].mean() for g in gs])

  def within(gs):
    rhos = [(spearman(g[:, 0], g[:, 1]), len(g)) for g in gs]
    rhos = [(r, n) for r, n in rhos if math.isfinite(r)]
    return (float(np.average([r for r, _ in rhos], weights=[n for _, n in rhos]))
            if rhos else math.nan)

  all_rows = [np.concatenate(groups)] if groups else []
  args = dict(seed=seed, num_resamples=num_resamples, confidence=confidence)
  return {"across_seeds": _stratified(all_rows, pooled, **args),
          "across_depths": _stratified(groups, means, **args),
          "within_depth": _stratified(groups, within, **args)}


def correlation_rows(rows: Sequence[dict]) -> list[dict]:
  """One row per (predictor, moment) present: the three correlations with their CIs."""
  out = []
  for name in PREDICTORS:
    for moment in MOMENTS:
      column = f"{name}@{moment}"
      if not any(math.isfinite(r.get(column, math.nan)) for r in rows):
        continue
      row = {"predictor": name, "moment": moment}
      for kind, (rho, low, high) in correlations(rows, column).items():
        row.update({kind: rho, f"{kind}_ci_low": low, f"{kind}_ci_high": high})
      out.append(row)
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
    rho = correlations(rows, f"{name}@{moment}", num_resamples=200)["across_seeds"][0]
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


def markdown_lines(correlation_table: Sequence[dict]) -> list[str]:
  """The "Predictors of generalisation" section of summary.md ([] without rows)."""
  if not correlation_table:
    return []
  cell = lambda r, k: ("" if not math.isfinite(r[k]) else
                       f"{r[k]:.2f} [{r[k + '_ci_low']:.2f}, {r[k + '_ci_high']:.2f}]"
                       if math.isfinite(r[k + "_ci_low"]) else f"{r[k]:.2f}")
  lines = ["", "## Predictors of generalisation", "",
           "| predictor | measured at | across seeds | across depths | within depth |",
           "|---|---|---|---|---|"]
  for r in correlation_table:
    lines.append(f"| {PREDICTORS[r['predictor']]} | {r['moment']} | {cell(r, 'across_seeds')} | "
                 f"{cell(r, 'across_depths')} | {cell(r, 'within_depth')} |")
  lines += ["", "Spearman's rho with final generalisation accuracy [95% bootstrap CI]: over all "
            "seeds; over the depths' seed means (seeds resampled within depths); and the "
            "seed-weighted mean of the within-depth correlations (`report.predictors`). "
            "'saturation' reads the predictor at the first analysed step at or after in-domain "
            "saturation, 'final' at the last analysed step."]
  return lines


def depth_rows(rows: Sequence[dict]) -> list[dict]:
  """Each predictor per depth and moment: the seed mean with its 95% bootstrap CI over seeds
  (`seed_stats.bootstrap_ci`) and the seed count, beside the depth's final generalisation (the
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
        mean, low, high = seed_stats.bootstrap_ci([x for x, _ in pairs],
                                                  num_resamples=NUM_RESAMPLES)
        out.append({"predictor": name, "moment": moment, "depth": depth, "seeds": len(pairs),
                    "mean": mean, "ci_low": low, "ci_high": high,
                    "generalisation": float(np.nanmean([g for _, g in pairs]))})
  return out


def depth_markdown_lines(table: Sequence[dict]) -> list[str]:
  """The "Predictors per depth" section of summary.md ([] without rows): one row per depth,
  one column per (predictor, moment), seed mean [95% CI]."""
  if not table:
    return []
  columns = [(n, m) for n in PREDICTORS for m in MOMENTS
             if any(r["predictor"] == n and r["moment"] == m for r in table)]
  cells = {(r["predictor"], r["moment"], r["depth"]): r for r in table}
  depths = sorted({r["depth"] for r in table})
  lines = ["", "## Predictors per depth", "",
           "| depth | " + " | ".join(f"{PREDICTORS[n]} ({m})" for n, m in columns) + " |",
           "|---" * (len(columns) + 1) + "|"]
  for depth in depths:
    row = [str(depth)]
    for n, m in columns:
      r = cells.get((n, m, depth))
      row.append("" if r is None else f"{r['mean']:.3g} [{r['ci_low']:.3g}, {r['ci_high']:.3g}]")
    lines.append("| " + " | ".join(row) + " |")
  lines += ["", "Seed mean [95% bootstrap CI over seeds] of each predictor at in-domain saturation "
            "and at the end (as in the correlations above); `summary_predictors_by_depth.csv` "
            "has the same with the seed counts."]
  return lines


def plot_by_depth(rows: Sequence[dict], path: str, title_prefix: str = "",
                  moment: str = "final", table: Sequence[dict] | None = None):
  """Each predictor at `moment` per depth: seed mean with its 95% bootstrap CI and the seeds
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
  fig.suptitle(f"{title_prefix}predictors per depth (seed mean, 95% bootstrap CI; grey: seeds)")
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig
