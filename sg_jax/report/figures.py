"""The report's figures (matplotlib, Agg backend, one figure per PNG file)."""

from __future__ import annotations

import collections
import math
from typing import Sequence

import numpy as np

from sg_jax.analysis import registry
from sg_jax.report import seed_stats
from sg_jax.report.reading import GEN_ACC, IN_ACC, Run, analysis_sentences
from sg_jax.report.tables import _finite, saturation_step


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _depth_label(depth) -> str:
  return f"depth {depth}" if depth is not None else "depth ?"


def _task_prefix(runs: Sequence[Run]) -> str:
  tasks = sorted({r.task for r in runs if r.task})
  return f"{'/'.join(tasks)}: " if tasks else ""


def _legend_outside(ax, handles=None, labels=None, fontsize=8):
  """Legend to the right of `ax`, outside every axes, so that it never hides data."""
  if handles is None:
    handles, labels = ax.get_legend_handles_labels()
  return ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.02, 0.5),
                   fontsize=fontsize, frameon=False)


def mean_band(ax, xs, samples, color, alpha: float = 0.18, **plot_kwargs):
  """Draws, at each x of `xs`, the mean of `samples[x]` (one value per seed) as a line and its
  95% bootstrap CI over seeds (`seed_stats.bootstrap_ci`) as a shaded band; with fewer than 3
  points also as markers (a single point draws no line)."""
  mean, low, high = np.array([seed_stats.bootstrap_ci(samples[x], num_resamples=2000)
                              for x in xs]).T
  ax.fill_between(xs, low, high, color=color, alpha=alpha, lw=0)
  if len(xs) < 3:
    plot_kwargs = {"marker": "o", **plot_kwargs}
  ax.plot(xs, mean, color=color, **plot_kwargs)


def plot_grokking(runs: Sequence[Run], depth, path: str, saturation: float):
  """(a) In-domain and generalisation accuracy vs step for every seed of one depth.

  Returns:
    the (closed) matplotlib Figure written to `path`.
  """
  plt = _pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True, sharey=True)
  cmap = plt.get_cmap("tab10" if sum(len(r.series.get(IN_ACC, {})) for r in runs) <= 10
                      else "tab20")
  n = 0
  marked = False
  for run in runs:
    seeds = sorted(set(run.series.get(IN_ACC, {})) | set(run.series.get(GEN_ACC, {})))
    for seed in seeds:
      color = cmap(n % cmap.N)
      n += 1
      label = f"seed {seed}" if len(runs) == 1 else f"{run.name} seed {seed}"
      for ax, name in zip(axes, (IN_ACC, GEN_ACC)):
        if seed in run.series.get(name, {}):
          steps, values = run.series[name][seed]
          ax.plot(steps, values, color=color, lw=1.4, label=label if ax is axes[1] else None)
      sat = saturation_step(run, seed, saturation)
      if sat is not None:
        for ax in axes:
          ax.axvline(sat, color=color, ls=":", lw=1.0, alpha=0.8)
        marked = True
  for ax, title in zip(axes, ("In-domain accuracy", "Generalisation (out-of-domain) accuracy")):
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("accuracy (fraction correct)")
  handles, labels = axes[1].get_legend_handles_labels()
  if marked:
    handles.append(plt.Line2D([], [], color="gray", ls=":"))
    labels.append(f"in-domain acc. first >= {saturation:g}")
  axes[1].legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8,
                 frameon=False)
  fig.suptitle(f"{_task_prefix(runs)}grokking curves, {_depth_label(depth)}")
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


def trajectory_rows() -> list[tuple[str, tuple[tuple[str, str], ...]]]:
  """Rows of the trajectories figure as (y-axis label, ((column, legend label), ...)): the
  accuracies, then the registered analysis columns by `Dynamic.trajectory_row`."""
  rows: dict[int, tuple[str, list]] = {}
  for d in registry.dynamics().values():
    if d.trajectory_row is not None:
      rows.setdefault(d.trajectory_row, (d.trajectory_axis, []))[1].append((d.column, d.short))
  return [("accuracy (fraction)", ((IN_ACC, "in-domain acc."), (GEN_ACC, "generalisation acc.")))
          ] + [(axis, tuple(series)) for _, (axis, series) in sorted(rows.items())]


def plot_trajectories(runs: Sequence[Run], depth, path: str, saturation: float,
                      max_seeds: int = 12):
  """(a') Per seed: accuracy, tree-structuredness and attention sparsity over training.

  One column per seed (at most `max_seeds`), rows sharing the step axis (`trajectory_rows`):
  in-domain and generalisation accuracy (fraction), then the registered analysis columns: tscore
  and tparseval F1 (unitless / fraction; Murty et al. 2023 §4); attention sparsity (negative mean
  entropy, nats; Chen et al. 2024). A dotted line
  marks the first step where the seed's in-domain accuracy reaches `saturation`. Legends sit
  right of the last column; the title gives the sentences the analysis read
  (`analysis_sentences`).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (and nothing is written) when no run
    of this depth has analysis rows.
  """
  rows = trajectory_rows()
  analysed = [name for _, series in rows[1:] for name, _ in series]
  columns = []
  for run in runs:
    if not any(run.series.get(name) for name in analysed):
      continue
    seeds = sorted(set(run.series.get(IN_ACC, {})) | set(run.series.get(GEN_ACC, {})))
    columns += [(run, seed) for seed in seeds]
  if not columns:
    return None
  columns = columns[:max_seeds]
  plt = _pyplot()
  fig, axes = plt.subplots(len(rows), len(columns),
                           figsize=(3.2 * len(columns) + 1, 8 * len(rows) / 3), sharex=True,
                           squeeze=False)
  legends = [None] * len(rows)
  colors = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
  for c, (run, seed) in enumerate(columns):
    sat = saturation_step(run, seed, saturation)
    for r, (axis, row) in enumerate(rows):
      ax = axes[r, c]
      for (name, label), color in zip(row, colors):
        if seed in run.series.get(name, {}):
          steps, values = _finite(*run.series[name][seed])
          ax.plot(steps, values, color=color, lw=1.4, marker="o", ms=2, label=label)
      if sat is not None:
        ax.axvline(sat, color="gray", ls=":", lw=1.0)
      ax.grid(alpha=0.3)
      if r == 0:
        ax.set_ylim(-0.02, 1.02)
      if c == 0:
        ax.set_ylabel(axis)
      handles, labels = ax.get_legend_handles_labels()
      if legends[r] is None or len(handles) > len(legends[r][0]):
        legends[r] = (handles, labels)
    axes[0, c].set_title(f"seed {seed}" if len(runs) == 1 else f"{run.name} seed {seed}")
    axes[-1, c].set_xlabel("training step")
  for r, legend in enumerate(legends):
    if legend and legend[0]:  # a row without data (e.g. no gold trees) has none
      _legend_outside(axes[r, -1], *legend, fontsize=7)
  note = analysis_sentences([run for run, _ in columns], analysed)
  fig.suptitle(f"{_task_prefix(runs)}accuracy and syntactic structure per seed, "
               f"{_depth_label(depth)} (dotted: in-domain acc. first >= {saturation:g})"
               + (f"\n{note}" if note else ""))
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


SKIP_RELATIVE = "out_of_domain/skip_relative_agreement"
RULE_SERIES = ((GEN_ACC, "generalisation acc. (hierarchical rule)", "#d62728"),
               ("out_of_domain/move_first_agreement", "agrees with move-first", "#7f7f7f"),
               (SKIP_RELATIVE, "agrees with skip-relative", "#2ca02c"))


def plot_rules(runs: Sequence[Run], depth, path: str, saturation: float,
               max_seeds: int = 12):
  """(a'') Question formation, per seed: which rule the model's fronted auxiliary follows on gen.

  One panel per seed (at most `max_seeds`): generalisation accuracy (agreement with the
  hierarchical rule) beside the agreement with the move-first and skip-relative rules
  (`evaluation.question_rule_auxiliaries`), all fractions of gen `quest` lines, over training
  steps; a dotted line marks the first step where in-domain accuracy reaches `saturation`. The
  legend sits right of the last panel, outside every panel, so it never hides a curve.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (and nothing is written) when no run
    of this depth logged rule agreement (runs of other tasks, or made before the metric existed).
  """
  columns = []
  for run in runs:
    columns += [(run, seed) for seed in sorted(run.series.get(SKIP_RELATIVE, {}))]
  if not columns:
    return None
  return _seed_panels(
      columns[:max_seeds],
      lambda run, seed: [(*_finite(*run.series[name][seed]), label,
                          dict(color=color, lw=1.4, marker="o", ms=2))
                         for name, label, color in RULE_SERIES if seed in run.series.get(name, {})],
      "fraction of gen lines",
      f"{_task_prefix(runs)}which rule fronts the auxiliary on gen lines, "
      f"{_depth_label(depth)} (dotted: in-domain acc. first >= {saturation:g})",
      path, saturation)


def _seed_panels(columns, lines_of, ylabel: str, suptitle: str, path: str, saturation: float):
  """One panel per (run, seed) of `columns` with the curves `lines_of(run, seed)` ([(steps,
  values, label, plot kwargs)]) on [0, 1], the seed's first step with in-domain accuracy >=
  `saturation` dotted, and the legend right of the last panel, outside every panel."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns) + 1, 3.4), sharey=True,
                           squeeze=False)
  runs = {id(run) for run, *_ in columns}
  for c, (run, seed, *_) in enumerate(columns):
    ax = axes[0, c]
    for steps, values, label, kwargs in lines_of(run, seed):
      ax.plot(steps, values, label=label, **kwargs)
    sat = saturation_step(run, seed, saturation)
    if sat is not None:
      ax.axvline(sat, color="gray", ls=":", lw=1.0)
    ax.set_ylim(-0.02, 1.02)
    ax.locator_params(axis="x", nbins=4)
    ax.grid(alpha=0.3)
    ax.set_title(f"seed {seed}" if len(runs) == 1 else f"{run.name} seed {seed}")
    ax.set_xlabel("training step")
  axes[0, 0].set_ylabel(ylabel)
  handles, labels = max((ax.get_legend_handles_labels() for ax in axes[0]),
                        key=lambda hl: len(hl[0]))
  _legend_outside(axes[0, -1], handles, labels, fontsize=7)
  fig.suptitle(suptitle)
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_early_stopping(seed_rows: Sequence[dict], path: str, title_prefix: str):
  """(b) Generalisation at early stopping (first / last best) vs at the end, per depth.

  Returns:
    the (closed) matplotlib Figure written to `path`.
  """
  plt = _pyplot()
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
  ax.set_xticklabels([_depth_label(d) for d in depths])
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
  """(c) Fraction of seeds with final generalisation accuracy > threshold, per depth.

  The y axis is the fraction's range [0, 1] plus a 0.05 margin; each point is labelled with its
  count (k/n), below the point near the top so that the label stays inside the axes.

  Returns:
    the (closed) matplotlib Figure written to `path`.
  """
  plt = _pyplot()
  rows = [r for r in depth_rows if r["depth"] is not None and
          math.isfinite(r["fraction_above_threshold"])]
  fig, ax = plt.subplots(figsize=(6, 4.5))
  depths = [r["depth"] for r in rows]
  fractions = [r["fraction_above_threshold"] for r in rows]
  ax.plot(depths, fractions, "o-", color="#08519c", lw=2, ms=8)
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
               f"seeds whose final gen. acc. > {threshold:g}, with counts", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_dynamics(by_depth: dict, metric: str, path: str, title_prefix: str):
  """(d) One analysis metric vs step: mean over seeds per depth (with a 95% bootstrap confidence
  band over seeds, `seed_stats.bootstrap_ci`) and each seed.

  The title gives the sentences the analysis read (`analysis_sentences`; none for weight_norm).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (and nothing is written) when no run
    has the metric.
  """
  dynamic = registry.dynamics()[metric]
  ylabel, title = dynamic.axis, dynamic.title
  present = {d: runs for d, runs in by_depth.items()
             if any(run.series.get(metric) for run in runs)}
  if not present:
    return None
  plt = _pyplot()
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
              label=f"{_depth_label(depth)} (mean of {len(per_step[steps[0]])} seeds)")
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
  legend = _legend_outside(ax)
  legend.set_title("thin lines: seeds; band: 95% bootstrap CI over seeds", prop={"size": 8})
  note = analysis_sentences([run for runs in present.values() for run in runs], [metric])
  ax.set_title(f"{title_prefix}{title} during training" + (f"\n{note}" if note else ""),
               fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_seed_spread(seed_rows: Sequence[dict], path: str, threshold: float, title_prefix: str):
  """(f) How seeds differ: each seed's final generalisation accuracy per depth (a strip plot),
  the seed mean with its 95% bootstrap confidence interval, and Sarle's bimodality coefficient
  (`seed_stats`; b > 5/9 suggests two groups of seeds, e.g. hierarchical vs linear rule). Dots
  are coloured by the rule the seed ends on where the run logged the rule agreements.

  Returns:
    the (closed) matplotlib Figure written to `path`.
  """
  plt = _pyplot()
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
    mean, low, high = seed_stats.bootstrap_ci([r["final_generalisation"] for r in rows])
    if math.isfinite(mean):
      ax.errorbar(d + 0.3, mean, yerr=[[mean - low], [high - mean]], fmt="D", color="#c51b8a",
                  capsize=4, label="mean, 95% bootstrap CI" if d == 0 else None)
      b = seed_stats.sarle_bimodality([r["final_generalisation"] for r in rows])
      if math.isfinite(b):
        ax.annotate(f"b={b:.2f}", (d, 1.04), ha="center", va="bottom", fontsize=8)
  ax.axhline(threshold, color="gray", ls="--", lw=0.8, label=f"threshold {threshold:g}")
  ax.set_xticks(range(len(depths)))
  ax.set_xticklabels([_depth_label(d) for d in depths])
  ax.set_xlim(-0.6, len(depths) - 0.4)
  ax.set_ylim(-0.03, 1.12)
  ax.set_xlabel("model depth (layers)")
  ax.set_ylabel("final generalisation accuracy (fraction)")
  ax.grid(axis="y", alpha=0.3)
  _legend_outside(ax)
  ax.set_title(f"{title_prefix}final generalisation of every seed\n"
               "(b: Sarle's bimodality coefficient; > 0.56 suggests two groups)", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


LENGTH_PREFIX = "tparseval_f1_length"


def plot_tparseval_by_length(by_depth: dict, path: str, title_prefix: str):
  """(g) Final tparseval F1 against sentence length (words), per depth: the seed mean with its
  95% bootstrap CI, from the `tparseval_f1_length<n>` rows of analysis.csv (each seed's last
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
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  cmap = plt.get_cmap("tab10")
  for i, depth in enumerate(sorted(curves, key=lambda d: (d is None, d))):
    lengths = sorted(curves[depth])
    mean_band(ax, lengths, curves[depth], cmap(i % cmap.N), marker="o", lw=2, ms=4,
              label=_depth_label(depth))
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
  _legend_outside(ax).set_title("band: 95% bootstrap CI over seeds", prop={"size": 8})
  ax.set_title(f"{title_prefix}projected trees vs gold trees by sentence length", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


LOSS_SERIES = (("train/loss", "training loss (per token, batch mean)"),
               ("in_domain/loss", "in-domain validation loss"),
               ("out_of_domain/loss", "generalisation (out-of-domain) loss"))


def plot_losses(runs: Sequence[Run], depth, path: str):
  """(h) Training and validation losses vs step, one line per seed (the original's loss curves;
  mean cross-entropy per target token, nats, log scale). Panels without rows are left out.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when no run of
    this depth logged any of `LOSS_SERIES`.
  """
  panels = [(name, title) for name, title in LOSS_SERIES if any(r.series.get(name) for r in runs)]
  if not panels:
    return None
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 2, 4.2), squeeze=False)
  cmap = plt.get_cmap("tab10" if sum(len(r.series.get(panels[0][0], {})) for r in runs) <= 10
                      else "tab20")
  for ax, (name, title) in zip(axes[0], panels):
    n = 0
    for run in runs:
      for seed, (steps, values) in sorted(run.series.get(name, {}).items()):
        steps, values = _finite(steps, values)
        ok = values > 0
        label = f"seed {seed}" if len(runs) == 1 else f"{run.name} seed {seed}"
        ax.plot(steps[ok], values[ok], color=cmap(n % cmap.N), lw=1.2, label=label)
        n += 1
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3, which="both")
  axes[0][0].set_ylabel("cross-entropy (nats per token, log scale)")
  _legend_outside(axes[0][-1])
  fig.suptitle(f"{_task_prefix(runs)}loss curves, {_depth_label(depth)}")
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


CONSTRUCTION_PREFIX = GEN_ACC + "/"
CONSTRUCTION_COLORS = {"none": "#7f7f7f", "PP": "#9467bd", "RC-subj": "#1f77b4",
                       "RC-obj": "#d62728", "RC-intrans": "#2ca02c"}


def plot_constructions(runs: Sequence[Run], depth, path: str, saturation: float,
                       max_seeds: int = 12):
  """(i) Per seed: generalisation accuracy by construction over training.

  One panel per seed (at most `max_seeds`): the gen split's accuracy on the lines of each
  construction tag (`out_of_domain/accuracy/<tag>`, `Task.constructions`; question and tense:
  what modifies the subject) beside the whole split's, fractions of lines over training steps; a
  dotted line marks the first step where in-domain accuracy reaches `saturation`.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when no run of
    this depth logged per-construction accuracy.
  """
  columns = []
  for run in runs:
    tags = sorted(name[len(CONSTRUCTION_PREFIX):] for name in run.series
                  if name.startswith(CONSTRUCTION_PREFIX))
    seeds = sorted({s for t in tags for s in run.series[CONSTRUCTION_PREFIX + t]})
    columns += [(run, seed, tags) for seed in seeds]
  if not columns:
    return None

  def lines_of(run, seed):
    out = []
    if seed in run.series.get(GEN_ACC, {}):
      out.append((*_finite(*run.series[GEN_ACC][seed]), "all gen lines",
                  dict(color="black", lw=2.2, alpha=0.35)))
    tags = [n[len(CONSTRUCTION_PREFIX):] for n in sorted(run.series)
            if n.startswith(CONSTRUCTION_PREFIX)]
    out += [(*_finite(*run.series[CONSTRUCTION_PREFIX + t][seed]), t,
             dict(lw=1.4, marker="o", ms=2, color=CONSTRUCTION_COLORS.get(t)))
            for t in tags if seed in run.series[CONSTRUCTION_PREFIX + t]]
    return out

  return _seed_panels(
      columns[:max_seeds], lines_of, "gen. accuracy (fraction of lines)",
      f"{_task_prefix(runs)}generalisation by construction (what modifies the subject), "
      f"{_depth_label(depth)} (dotted: in-domain acc. first >= {saturation:g})", path, saturation)
