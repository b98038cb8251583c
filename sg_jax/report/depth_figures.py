"""The report's figures that compare depths: early stopping, the inverted U, the analysis
dynamics per depth, the seed spread and tparseval by sentence length (matplotlib, Agg backend,
one figure per PNG file; the figures of one depth's seeds over training are in `figures`).
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

import numpy as np

from sg_jax import stats
from sg_jax.analysis import registry
from sg_jax.report import seed_stats
from sg_jax.report.plotting import depth_label, legend_outside, mean_band, pyplot
from sg_jax.report.reading import analysis_sentences
from sg_jax.report.tables import _finite


def plot_early_stopping(seed_rows: Sequence[dict], path: str, title_prefix: str):
  """(b) Generalisation at early stopping (first / last best) vs at the end, per depth.

  Returns:
    the (closed) matplotlib Figure written to `path`.
  """
  plt = pyplot()
  depths = sorted({r["depth"] for r in seed_rows}, key=lambda d: (d is None, d))
  kinds = (("early_stop_first_generalisation", "early stop, first best in-domain", "#9ecae1"),
           ("early_stop_last_generalisation", "early stop, last best in-domain", "#4292c6"),
           ("final_generalisation", "end of training", "#08519c"))
  width = 0.8 / len(kinds)
  rng = np.random.default_rng(0)
  fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(depths) + 3), 4.5))
  for k, (key, label, color) in enumerate(kinds):
    for d, depth in enumerate(depths):
      values = np.array([r[key] for r in seed_rows if r["depth"] == depth], dtype=np.float64)
      values = values[np.isfinite(values)]
      x = d + (k - (len(kinds) - 1) / 2) * width
      if values.size:
        ax.bar(x, values.mean(), width * 0.9, color=color, label=label if d == 0 else None,
               edgecolor="black", lw=0.5)
        ax.scatter(x + rng.uniform(-width / 4, width / 4, values.size), values, s=14,
                   color="black", zorder=3, label="one seed" if (d == 0 and k == 0) else None)
  ax.set_xticks(range(len(depths)))
  ax.set_xticklabels([depth_label(d) for d in depths])
  ax.set_ylabel("generalisation accuracy (fraction correct)")
  ax.set_xlabel("model depth (layers)")
  ax.set_ylim(0, 1.05)
  ax.grid(axis="y", alpha=0.3)
  ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
  ax.set_title(f"{title_prefix}early stopping on in-domain accuracy vs end of training\n"
               "(bars: mean over seeds; dots: seeds)", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_inverted_u(depth_rows: Sequence[dict], path: str, threshold: float,
                    title_prefix: str):
  """(c) Fraction of seeds with final generalisation accuracy > threshold, per depth, with its
  95% Clopper-Pearson interval (`stats.proportion_interval`).

  The y axis is the fraction's range [0, 1] plus a 0.05 margin; each point is labelled with its
  count (k/n), below the point near the top so that the label stays inside the axes.

  Returns:
    the (closed) matplotlib Figure written to `path`.
  """
  plt = pyplot()
  rows = [r for r in depth_rows if r["depth"] is not None and
          math.isfinite(r["fraction_above_threshold"])]
  fig, ax = plt.subplots(figsize=(6, 4.5))
  depths = [r["depth"] for r in rows]
  fractions = [r["fraction_above_threshold"] for r in rows]
  ax.plot(depths, fractions, "o-", color="#08519c", lw=2, ms=8)
  bounds = [stats.proportion_interval(r["seeds_above_threshold"], r["num_seeds"]) for r in rows]
  ax.errorbar(depths, fractions, yerr=[[f - b.low for f, b in zip(fractions, bounds)],
                                       [b.high - f for f, b in zip(fractions, bounds)]],
              fmt="none", ecolor="#08519c", capsize=4, lw=1)
  for r in rows:
    counted = r["num_seeds"]
    high = r["fraction_above_threshold"] > 0.85
    ax.annotate(f"{r['seeds_above_threshold']}/{counted}", (r["depth"],
                r["fraction_above_threshold"]), textcoords="offset points",
                xytext=(0, -10 if high else 9), va="top" if high else "bottom", ha="center",
                fontsize=9)
  ax.set_xticks(depths)
  if depths:
    ax.set_xlim(min(depths) - 0.6, max(depths) + 0.6)
  ax.set_xlabel("model depth (layers)")
  ax.set_ylabel(f"fraction of seeds (final gen. acc. > {threshold:g})")
  ax.set_ylim(-0.05, 1.05)
  ax.grid(alpha=0.3)
  ax.set_title(f"{title_prefix}generalising seeds per depth (inverted U)\n"
               f"seeds whose final gen. acc. > {threshold:g}, with counts and 95% "
               "Clopper-Pearson intervals", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_dynamics(by_depth: dict, metric: str, path: str, title_prefix: str):
  """(d) One analysis metric vs step: mean over seeds per depth (with a 95% t-interval band over
  seeds, `seed_stats.seed_mean`) and each seed.

  The title gives the sentences the analysis read (`analysis_sentences`; none for weight_norm).

  A metric no run's analysis.csv has is drawn from the metrics.csv rows named by its
  `Dynamic.logged_as` where there is one (UAS: `in_domain/uas`, logged at every evaluation).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (and nothing is written) when no run
    has the metric (nor its `logged_as`).
  """
  dynamic = registry.dynamics()[metric]
  ylabel, title = dynamic.axis, dynamic.title
  present = {d: runs for d, runs in by_depth.items()
             if any(run.series.get(metric) for run in runs)}
  logged = not present and dynamic.logged_as
  if logged:  # no analysis rows: the quantity as training logged it (`Dynamic.logged_as`)
    metric = dynamic.logged_as
    present = {d: runs for d, runs in by_depth.items()
               if any(run.series.get(metric) for run in runs)}
  if not present:
    return None
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  cmap = plt.get_cmap("tab10")
  order = sorted(present, key=lambda d: (d is None, d))
  for i, depth in enumerate(order):
    color = cmap(i % cmap.N)
    per_step = collections.defaultdict(list)
    for run in present[depth]:
      for steps, values in run.series.get(metric, {}).values():
        ax.plot(steps, values, color=color, lw=0.6, alpha=0.35)
        for s, v in zip(steps.tolist(), values.tolist()):
          if math.isfinite(v):
            per_step[s].append(v)
    steps = np.array(sorted(per_step))
    mean_band(ax, steps, per_step, color, lw=2.4, marker="o", ms=3,
              label=f"{depth_label(depth)} (mean of {len(per_step[steps[0]])} seeds)")
  runs = [run for runs in present.values() for run in runs]
  for k, (column, ref) in enumerate((c, d) for c, d in registry.dynamics().items()
                                    if d.reference_for == metric):
    values = [v for run in runs for _, vs in run.series.get(column, {}).values() for v in vs]
    if values:  # the same sentences at every step: one level (mean over runs)
      ax.axhline(float(np.nanmean(values)), color="0.35", lw=1.0, ls=("--", ":", "-.")[k % 3],
                 label=ref.short)
  ax.set_xlabel("training step")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  legend = legend_outside(ax)
  legend.set_title("thin lines: seeds; band: 95% t-interval over seeds", prop={"size": 8})
  note = (f"{metric} of metrics.csv (logged during training; `sg_jax.analyze` not run)" if logged
          else analysis_sentences([run for runs in present.values() for run in runs], [metric]))
  ax.set_title(f"{title_prefix}{title} during training" + (f"\n{note}" if note else ""),
               fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_seed_spread(seed_rows: Sequence[dict], path: str, threshold: float, title_prefix: str):
  """(f) How seeds differ: each seed's final generalisation accuracy per depth (a strip plot),
  the seed mean with its 95% t-interval, and above each depth Sarle's bimodality coefficient
  where it can signal (6 or more seeds, `stats.sarle_signals`; b > 5/9 suggests two groups of
  seeds, e.g. hierarchical vs linear rule), else the seeds per final rule. Dots are coloured by
  the rule the seed ends on where the run logged the rule agreements.

  Returns:
    the (closed) matplotlib Figure written to `path`.
  """
  plt = pyplot()
  depths = sorted({r["depth"] for r in seed_rows}, key=lambda d: (d is None, d))
  colors = {"hierarchical": "#08519c", "move_first": "#7f7f7f", "skip_relative": "#d95f02",
            None: "black"}
  rng = np.random.default_rng(0)
  fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(depths) + 3), 4.5))
  shown = set()
  for d, depth in enumerate(depths):
    rows = [r for r in seed_rows if r["depth"] == depth
            and math.isfinite(r["final_generalisation"])]
    for r in rows:
      rule = r.get("final_rule")
      ax.scatter(d + rng.uniform(-0.15, 0.15), r["final_generalisation"], s=22, zorder=3,
                 color=colors.get(rule, "black"),
                 label=(f"ends on {rule.replace('_', '-')}" if rule else "seed (no final rule)")
                 if rule not in shown else None)
      shown.add(rule)
    mean, low, high = seed_stats.seed_mean([r["final_generalisation"] for r in rows])
    if math.isfinite(mean):
      label = f"mean, 95% t-interval (n={len(rows)})"
      ax.errorbar(d + 0.3, mean, yerr=[[mean - low], [high - mean]], fmt="D", color="#c51b8a",
                  capsize=4, label=label if label not in shown else None)
      shown.add(label)  # one legend entry per seed count
      b = seed_stats.shown_bimodality([r["final_generalisation"] for r in rows])
      counts = seed_stats.rule_counts([r.get("final_rule") for r in rows])
      note = (f"b={b:.2f}" if math.isfinite(b) else
              counts.replace("hierarchical", "h").replace("move_first", "mf")
              .replace("skip_relative", "sr").replace(", ", "\n"))
      if note:
        ax.annotate(note, (d, 1.04), ha="center", va="bottom", fontsize=7)
  ax.axhline(threshold, color="gray", ls="--", lw=0.8, label=f"threshold {threshold:g}")
  ax.set_xticks(range(len(depths)))
  ax.set_xticklabels([depth_label(d) for d in depths])
  ax.set_xlim(-0.6, len(depths) - 0.4)
  ax.set_ylim(-0.03, 1.12)
  ax.set_xlabel("model depth (layers)")
  ax.set_ylabel("final generalisation accuracy (fraction)")
  ax.grid(axis="y", alpha=0.3)
  legend_outside(ax)
  ax.set_title(f"{title_prefix}final generalisation of every seed\n"
               "(b: Sarle's bimodality coefficient, from 6 seeds; > 0.56 suggests two groups; "
               "below 6 seeds the seeds per final rule: h, mf, sr)", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


LENGTH_PREFIX = "tparseval_f1_length"


def plot_tparseval_by_length(by_depth: dict, path: str, title_prefix: str):
  """(g) Final tparseval F1 against sentence length (words), per depth: the seed mean with its
  95% t-interval, from the `tparseval_f1_length<n>` rows of analysis.csv (each seed's last
  analysed step), beside the right-branching baseline.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when no run has
    per-length rows.
  """
  curves = {}
  for depth, runs in by_depth.items():
    per_length = collections.defaultdict(list)
    for run in runs:
      for name, by_seed in run.series.items():
        if name.startswith(LENGTH_PREFIX) and name[len(LENGTH_PREFIX):].isdigit():
          for steps, values in by_seed.values():
            _, final = _finite(steps, values)
            if final.size:
              per_length[int(name[len(LENGTH_PREFIX):])].append(float(final[-1]))
    if per_length:
      curves[depth] = per_length
  if not curves:
    return None
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  cmap = plt.get_cmap("tab10")
  for i, depth in enumerate(sorted(curves, key=lambda d: (d is None, d))):
    lengths = sorted(curves[depth])
    mean_band(ax, lengths, curves[depth], cmap(i % cmap.N), marker="o", lw=2, ms=4,
              label=depth_label(depth))
  rb = [v for runs in by_depth.values() for run in runs
        for _, vs in run.series.get("tparseval_f1_right_branching", {}).values() for v in vs]
  if rb:
    ax.axhline(float(np.nanmean(rb)), color="0.35", ls="--", lw=1.0,
               label="right-branching F1 (all lengths)")
  ax.xaxis.get_major_locator().set_params(integer=True)
  ax.set_xlabel("sentence length (words of the declarative)")
  ax.set_ylabel("tparseval F1 at the last analysed step")
  ax.set_ylim(-0.02, 1.02)
  ax.grid(alpha=0.3)
  legend_outside(ax).set_title("band: 95% t-interval over seeds", prop={"size": 8})
  ax.set_title(f"{title_prefix}projected trees vs gold trees by sentence length", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig
