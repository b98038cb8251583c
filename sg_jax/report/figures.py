"""The report's figures of one depth's seeds over training: grokking curves, trajectories, rule
agreement, losses and accuracy by construction (matplotlib, Agg backend, one figure per PNG
file; the figures that compare depths are in `depth_figures`, shared helpers in `plotting`).
"""

from __future__ import annotations

from typing import Sequence

from sg_jax.analysis import registry
from sg_jax.report.plotting import (CONSTRUCTION_COLORS, depth_label, legend_outside, pyplot,
                                    task_prefix)
from sg_jax.report.reading import GEN_ACC, IN_ACC, Run, analysis_sentences
from sg_jax.report.tables import _finite, saturation_step


def plot_grokking(runs: Sequence[Run], depth, path: str, saturation: float):
  """(a) In-domain and generalisation accuracy vs step for every seed of one depth.

  Returns:
    the (closed) matplotlib Figure written to `path`.
  """
  plt = pyplot()
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
  fig.suptitle(f"{task_prefix(runs)}grokking curves, {depth_label(depth)}")
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

  One column per seed (at most `max_seeds`), rows sharing the step axis and, within a row, the
  y-scale, so that seeds compare at a glance (`trajectory_rows`):
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
  plt = pyplot()
  fig, axes = plt.subplots(len(rows), len(columns),
                           figsize=(3.2 * len(columns) + 1, 8 * len(rows) / 3), sharex=True,
                           sharey="row", squeeze=False)  # the seeds of a row on one y-scale
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
      legend_outside(axes[r, -1], *legend, fontsize=7)
  note = analysis_sentences([run for run, _ in columns], analysed)
  fig.suptitle(f"{task_prefix(runs)}accuracy and syntactic structure per seed, "
               f"{depth_label(depth)} (dotted: in-domain acc. first >= {saturation:g})"
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
  (`tasks.question.question_rule_auxiliaries`), all fractions of gen `quest` lines, over training
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
      f"{task_prefix(runs)}which rule fronts the auxiliary on gen lines, "
      f"{depth_label(depth)} (dotted: in-domain acc. first >= {saturation:g})",
      path, saturation)


def _seed_panels(columns, lines_of, ylabel: str, suptitle: str, path: str, saturation: float):
  """One panel per (run, seed) of `columns` with the curves `lines_of(run, seed)` ([(steps,
  values, label, plot kwargs)]) on [0, 1], the seed's first step with in-domain accuracy >=
  `saturation` dotted, and the legend right of the last panel, outside every panel."""
  plt = pyplot()
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
  legend_outside(axes[0, -1], handles, labels, fontsize=7)
  fig.suptitle(suptitle)
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
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
  plt = pyplot()
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
  legend_outside(axes[0][-1])
  fig.suptitle(f"{task_prefix(runs)}loss curves, {depth_label(depth)}")
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


CONSTRUCTION_PREFIX = GEN_ACC + "/"
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
      f"{task_prefix(runs)}generalisation by construction (what modifies the subject), "
      f"{depth_label(depth)} (dotted: in-domain acc. first >= {saturation:g})", path, saturation)
