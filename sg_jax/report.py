r"""Report: the structural-grokking figures and summary tables of a sweep or a single run.

  python -m sg_jax.report --root=runs/qf              # a sweep root (sg_jax.sweep)
  python -m sg_jax.report --root=runs/quick           # a single workdir
  python -m sg_jax.report --root=runs/qf --out_dir=figures/qf --threshold=0.8

Reads `metrics.csv` (training and evaluation, `step,seed,name,value`) and, where present,
`analysis.csv` (`sg_jax.analyze`) of every run below `--root`: the root itself when it holds a
`metrics.csv`, else the workdirs listed in `root/sweep.json`, else every direct subfolder holding
a `metrics.csv`. Runs are grouped by depth (`model.num_layers` of each workdir's `config.json`).
Writes into `--out_dir` (default `<root>/report`), one figure per PNG file (Murty et al., ACL 2023,
figures 1-5 for one's own runs):

  grokking_depth<D>.png      (a) in-domain and generalisation (out-of-domain) accuracy vs step,
                             one line per seed; a dotted line marks the first step where a seed's
                             in-domain accuracy reaches --saturation (default 0.99).
  early_stopping.png         (b) generalisation accuracy at the checkpoint chosen by early
                             stopping on in-domain accuracy (first best and last best) vs at the
                             end of training: bars = mean over seeds, dots = seeds.
  inverted_u.png             (c) fraction of seeds whose final generalisation accuracy exceeds
                             --threshold (default 0.8), per depth.
  trajectories_depth<D>.png  (a') where analysis.csv exists: one column per seed, accuracy (top)
                             with tscore / tparseval F1 (middle) and attention sparsity (bottom)
                             beside it on the same step axis, saturation step marked.
  rules_depth<D>.png         (a'') question formation, where metrics.csv has the rule agreements:
                             per seed, generalisation accuracy beside agreement with the
                             move-first and skip-relative rules on gen lines.
  dynamics_<metric>.png      (d) weight_norm, attention_sparsity_paper, tscore, tparseval_f1 vs
                             step: mean over seeds per depth (thick) and each seed (thin). A
                             metric with no data is skipped and the skip noted in summary.md.
  summary.csv / summary.md   (e) one row per depth; summary_seeds.csv one row per seed.

Early stopping (docs/REFERENCE.md §1): the checkpoint with the highest in-domain accuracy is
selected; ties (common: in-domain accuracy sits at 1.0 for most of training) are broken two
ways, both reported: "first best" takes the earliest tied evaluation, "last best" the latest.
Values within --tie_tolerance of the maximum count as tied. Steps where a seed's value is not
finite (a diverged seed logs NaN) are ignored. "Final" = a seed's last evaluated step.

Figures never hide data behind a legend (legends sit outside the axes), fractions are plotted on
[0, 1] plus a small margin, and the analysis figures (a', d) give in their title how many
sentences the analysis read (from `analysis.csv.options.json`, written by `sg_jax.analyze`).
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import logging as py_logging
import math
import os
import sys
from typing import Iterable, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

IN_ACC = "in_domain/accuracy"
GEN_ACC = "out_of_domain/accuracy"
# (d): analysis metric -> (y-axis label with units, title).
DYNAMICS = {
    "weight_norm": ("weight norm (global L2 norm of sg_jax's parameters)",
                    "Weight norm (the model sg_jax trains; no unused decoder)"),
    "attention_sparsity_paper": ("attention sparsity (negative mean entropy, nats)",
                                 "Attention sparsity (paper: higher = sparser)"),
    "tscore": ("tscore (tree-structuredness, unitless)", "Tree-structuredness (tscore)"),
    "tparseval_f1": ("tparseval (bracketing F1 vs gold trees, fraction)",
                     "Projected trees vs gold trees (tparseval F1)"),
}

log = py_logging.getLogger("sg_jax.report")


class ReportError(ValueError):
  """No usable runs or metrics under the given root."""


@dataclasses.dataclass
class Run:
  """One workdir: its depth and metric series.

  Attributes:
    workdir: path of the run directory.
    name: short label (folder name).
    depth: model.num_layers from config.json (None when unknown).
    task: task name from config.json ('' when unknown).
    num_steps: requested train.num_steps (None when unknown).
    series: {name: {seed: (steps int [T], values float [T])}} sorted by step, metrics.csv and
      analysis.csv merged.
    analysis_options: contents of `analysis.csv.options.json` (`sg_jax.analyze`: split, sentence
      set, `sentences_used`, ...), {} when absent.
  """

  workdir: str
  name: str
  depth: int | None
  task: str
  num_steps: int | None
  series: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]
  analysis_options: dict = dataclasses.field(default_factory=dict)


def _read_long_csv(path: str) -> list[tuple[int, int, str, float]]:
  """Rows (step, seed, name, value) of a `step,seed,name,value` CSV; malformed lines skipped."""
  rows = []
  with open(path, newline="") as f:
    for r in csv.reader(f):
      if len(r) != 4 or r[0] == "step":
        continue
      try:
        rows.append((int(r[0]), int(r[1]), r[2], float(r[3])))
      except ValueError:
        continue
  return rows


def _to_series(rows: Iterable[tuple[int, int, str, float]]):
  acc = collections.defaultdict(lambda: collections.defaultdict(dict))
  for step, seed, name, value in rows:
    acc[name][seed][step] = value  # a repeated (step, seed, name) keeps the last row
  out = {}
  for name, by_seed in acc.items():
    out[name] = {}
    for seed, by_step in by_seed.items():
      steps = np.array(sorted(by_step), dtype=np.int64)
      out[name][seed] = (steps, np.array([by_step[s] for s in steps], dtype=np.float64))
  return out


def load_run(workdir: str) -> Run:
  """Reads one workdir's metrics.csv, analysis.csv (optional) and config.json (optional).

  Raises:
    ReportError: no metrics.csv in `workdir`.
  """
  path = os.path.join(workdir, "metrics.csv")
  if not os.path.exists(path):
    raise ReportError(f"no metrics.csv in {workdir}")
  rows = _read_long_csv(path)
  analysis = os.path.join(workdir, "analysis.csv")
  analysis_options = {}
  if os.path.exists(analysis):
    rows += _read_long_csv(analysis)
    if os.path.exists(analysis + ".options.json"):
      try:
        with open(analysis + ".options.json") as f:
          analysis_options = json.load(f)
      except (OSError, ValueError) as e:
        log.warning("ignoring unreadable %s.options.json: %s", analysis, e)
  depth = task = num_steps = None
  config_path = os.path.join(workdir, "config.json")
  if os.path.exists(config_path):
    with open(config_path) as f:
      config = json.load(f)
    depth = config.get("model", {}).get("num_layers")
    task = config.get("task")
    num_steps = config.get("train", {}).get("num_steps")
  name = os.path.basename(os.path.normpath(workdir))
  if depth is None and name.startswith("depth") and name[5:].isdigit():
    depth = int(name[5:])
  return Run(workdir=workdir, name=name, depth=depth, task=task or "", num_steps=num_steps,
             series=_to_series(rows), analysis_options=analysis_options)


def find_runs(root: str) -> list[str]:
  """Workdirs to report on (see module docstring), sorted.

  Raises:
    ReportError: `root` does not exist or holds no metrics.csv (naming the folder).
  """
  if not os.path.isdir(root):
    raise ReportError(f"--root {root} is not a folder")
  if os.path.exists(os.path.join(root, "metrics.csv")):
    return [root]
  sweep = os.path.join(root, "sweep.json")
  found = []
  if os.path.exists(sweep):
    with open(sweep) as f:
      jobs = json.load(f).get("jobs", {})
    for job in jobs.values():
      workdir = os.path.join(root, job.get("workdir", ""))
      if os.path.exists(os.path.join(workdir, "metrics.csv")):
        found.append(workdir)
  if not found:
    for entry in sorted(os.listdir(root)):
      workdir = os.path.join(root, entry)
      if os.path.isdir(workdir) and os.path.exists(os.path.join(workdir, "metrics.csv")):
        found.append(workdir)
  if not found:
    raise ReportError(f"no metrics.csv in {root} or its subfolders (expected a sg_jax workdir "
                      "or a sweep root)")
  return sorted(set(found))


def _finite(steps: np.ndarray, values: np.ndarray):
  ok = np.isfinite(values)
  return steps[ok], values[ok]


def first_reaching(steps: np.ndarray, values: np.ndarray, level: float) -> int | None:
  """First step whose value is >= `level` (None if never)."""
  hit = np.nonzero(np.isfinite(values) & (values >= level))[0]
  return int(steps[hit[0]]) if hit.size else None


def saturation_step(run: "Run", seed: int, saturation: float) -> int | None:
  """First step where `seed`'s in-domain accuracy reaches `saturation` (None: never / no rows)."""
  if seed not in run.series.get(IN_ACC, {}):
    return None
  return first_reaching(*run.series[IN_ACC][seed], saturation)


def early_stopping(in_steps: np.ndarray, in_acc: np.ndarray, gen_steps: np.ndarray,
                   gen_acc: np.ndarray, tie: str, tolerance: float = 0.0):
  """Generalisation accuracy at the early-stopping checkpoint chosen on in-domain accuracy.

  Args:
    in_steps, in_acc: [T] evaluation steps and in-domain accuracy (fraction) of one seed.
    gen_steps, gen_acc: [T'] steps and generalisation accuracy of the same seed.
    tie: 'first' (earliest step with the best in-domain accuracy) or 'last' (latest).
    tolerance: values >= max - tolerance count as best.

  Returns:
    (selected step, generalisation accuracy there), or (None, nan) when there is no finite
    in-domain value at a step that also has a finite generalisation value.

  Raises:
    ValueError: unknown `tie`.
  """
  if tie not in ("first", "last"):
    raise ValueError(f"tie must be 'first' or 'last', got {tie!r}")
  gen = dict(zip(_finite(gen_steps, gen_acc)[0].tolist(), _finite(gen_steps, gen_acc)[1]))
  steps, acc = _finite(in_steps, in_acc)
  keep = np.array([s in gen for s in steps.tolist()], dtype=bool)
  steps, acc = steps[keep], acc[keep]
  if steps.size == 0:
    return None, math.nan
  best = np.nonzero(acc >= acc.max() - tolerance)[0]
  step = int(steps[best[0] if tie == "first" else best[-1]])
  return step, float(gen[step])


def final_value(steps: np.ndarray, values: np.ndarray) -> tuple[int | None, float]:
  """(last step with a finite value, that value); (None, nan) when there is none."""
  steps, values = _finite(steps, values)
  if steps.size == 0:
    return None, math.nan
  return int(steps[-1]), float(values[-1])


def seed_summary(runs: Sequence[Run], threshold: float, saturation: float,
                 tie_tolerance: float) -> list[dict]:
  """One dict per (run, seed) with final / early-stopping accuracies and final analysis values."""
  out = []
  for run in runs:
    in_series = run.series.get(IN_ACC, {})
    gen_series = run.series.get(GEN_ACC, {})
    for seed in sorted(set(in_series) | set(gen_series)):
      in_s, in_v = in_series.get(seed, (np.zeros(0, int), np.zeros(0)))
      gen_s, gen_v = gen_series.get(seed, (np.zeros(0, int), np.zeros(0)))
      final_step, final_gen = final_value(gen_s, gen_v)
      _, final_in = final_value(in_s, in_v)
      first_step, first_gen = early_stopping(in_s, in_v, gen_s, gen_v, "first", tie_tolerance)
      last_step, last_gen = early_stopping(in_s, in_v, gen_s, gen_v, "last", tie_tolerance)
      row = {"run": run.name, "depth": run.depth, "seed": seed, "final_step": final_step,
             "final_in_domain": final_in, "final_generalisation": final_gen,
             "generalises": (bool(final_gen > threshold) if math.isfinite(final_gen) else None),
             "in_domain_saturation_step": first_reaching(in_s, in_v, saturation),
             "early_stop_first_step": first_step, "early_stop_first_generalisation": first_gen,
             "early_stop_last_step": last_step, "early_stop_last_generalisation": last_gen}
      for metric in DYNAMICS:
        if seed in run.series.get(metric, {}):
          row[f"final_{metric}"] = final_value(*run.series[metric][seed])[1]
      out.append(row)
  return out


def _mean(values) -> float:
  v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
  return float(v.mean()) if v.size else math.nan


def _median(values) -> float:
  v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
  return float(np.median(v)) if v.size else math.nan


def depth_summary(seed_rows: Sequence[dict]) -> list[dict]:
  """One dict per depth aggregating `seed_summary` rows (means over seeds with finite values)."""
  by_depth = collections.defaultdict(list)
  for r in seed_rows:
    by_depth[r["depth"]].append(r)
  out = []
  for depth in sorted(by_depth, key=lambda d: (d is None, d)):
    rows = by_depth[depth]
    counted = [r for r in rows if r["generalises"] is not None]
    row = {"depth": depth, "num_seeds": len(rows),
           "final_step": max((r["final_step"] or 0) for r in rows),
           "final_in_domain_mean": _mean(r["final_in_domain"] for r in rows),
           "final_generalisation_mean": _mean(r["final_generalisation"] for r in rows),
           "final_generalisation_median": _median(r["final_generalisation"] for r in rows),
           "seeds_above_threshold": sum(bool(r["generalises"]) for r in counted),
           "fraction_above_threshold": (sum(bool(r["generalises"]) for r in counted)
                                        / len(counted) if counted else math.nan),
           "early_stop_first_generalisation_mean": _mean(
               r["early_stop_first_generalisation"] for r in rows),
           "early_stop_last_generalisation_mean": _mean(
               r["early_stop_last_generalisation"] for r in rows),
           "in_domain_saturation_step_median": _median(
               r["in_domain_saturation_step"] for r in rows),
           "seeds_saturated": sum(r["in_domain_saturation_step"] is not None for r in rows)}
    for metric in DYNAMICS:
      row[f"final_{metric}_mean"] = _mean(r.get(f"final_{metric}") for r in rows)
    out.append(row)
  return out


# ---------------------------------------------------------------------------------------------
# Figures (matplotlib, Agg backend, one figure per file).


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


# analysis metric -> the `sentences_used` entry (sg_jax.analyze) of the sentences it reads.
_SENTENCES_OF = {"attention_sparsity_paper": "attention_entropy", "tscore": "tree_projection",
                 "tparseval_f1": "tree_projection"}
_SENTENCE_KIND_LABEL = {"attention_entropy": "entropy", "tree_projection": "tree projections"}


def analysis_sentences(runs: Sequence[Run], metrics: Sequence[str]) -> str:
  """How many sentences the analysis behind `metrics` read, for a figure title.

  Read from each run's `analysis.csv.options.json` (`sentences_used`, written by
  `sg_jax.analyze`); older files give the requested number ("at most N lines of SPLIT").

  Args:
    runs: the runs shown in the figure.
    metrics: analysis metric names shown (weight_norm reads no sentences).

  Returns:
    e.g. "analysis on 1000 'quest' lines of train" (runs that differ are joined with "; ",
    entropy and tree-projection counts that differ are both given); "" when no shown metric
    reads sentences.
  """
  notes = []
  for run in runs:
    kinds = sorted({_SENTENCES_OF[m] for m in metrics if m in _SENTENCES_OF and run.series.get(m)})
    if not kinds:
      continue
    options = run.analysis_options
    used = options.get("sentences_used") or {}
    if all(k in used for k in kinds):
      counts = {k: int(used[k]) for k in kinds}
      if len(set(counts.values())) == 1:
        number = str(counts[kinds[0]])
      else:
        number = " / ".join(f"{counts[k]} ({_SENTENCE_KIND_LABEL[k]})" for k in kinds)
      notes.append(f"{number} {used.get('label', 'lines')}".replace("`", "'"))
    elif "num_sentences" in options:
      notes.append(f"at most {options['num_sentences']} lines of {options.get('split', '?')}")
    else:
      notes.append("an unknown number of sentences (no analysis.csv.options.json)")
  notes = list(dict.fromkeys(notes))
  return f"analysis on {'; '.join(notes)}" if notes else ""


def _legend_outside(ax, handles=None, labels=None, fontsize=8):
  """Legend to the right of `ax`, outside every axes, so that it never hides data."""
  if handles is None:
    handles, labels = ax.get_legend_handles_labels()
  return ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.02, 0.5),
                   fontsize=fontsize, frameon=False)


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


TRAJECTORY_ROWS = (
    ((IN_ACC, "in-domain acc."), (GEN_ACC, "generalisation acc.")),
    (("tscore", "tscore"), ("tparseval_f1", "tparseval F1")),
    (("attention_sparsity_paper", "attention sparsity"),),
)


def plot_trajectories(runs: Sequence[Run], depth, path: str, saturation: float,
                      max_seeds: int = 12):
  """(a') Per seed: accuracy, tree-structuredness and attention sparsity over training.

  One column per seed (at most `max_seeds`), three rows sharing the step axis: in-domain and
  generalisation accuracy (fraction); tscore and tparseval F1 (unitless / fraction; Murty et
  al. 2023 §4); attention sparsity (negative mean entropy, nats; Chen et al. 2024). A dotted line
  marks the first step where the seed's in-domain accuracy reaches `saturation`. Legends sit
  right of the last column; the title gives the sentences the analysis read
  (`analysis_sentences`).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (and nothing is written) when no run
    of this depth has analysis rows.
  """
  columns = []
  for run in runs:
    if not any(run.series.get(name) for row in TRAJECTORY_ROWS[1:] for name, _ in row):
      continue
    seeds = sorted(set(run.series.get(IN_ACC, {})) | set(run.series.get(GEN_ACC, {})))
    columns += [(run, seed) for seed in seeds]
  if not columns:
    return None
  columns = columns[:max_seeds]
  plt = _pyplot()
  fig, axes = plt.subplots(3, len(columns), figsize=(3.2 * len(columns) + 1, 8), sharex=True,
                           squeeze=False)
  legends = [None] * len(TRAJECTORY_ROWS)
  colors = ("#1f77b4", "#d62728")
  for c, (run, seed) in enumerate(columns):
    sat = saturation_step(run, seed, saturation)
    for r, row in enumerate(TRAJECTORY_ROWS):
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
        ax.set_ylabel(("accuracy (fraction)", "tscore / tparseval F1",
                       "sparsity (-entropy, nats)")[r])
      handles, labels = ax.get_legend_handles_labels()
      if legends[r] is None or len(handles) > len(legends[r][0]):
        legends[r] = (handles, labels)
    axes[0, c].set_title(f"seed {seed}" if len(runs) == 1 else f"{run.name} seed {seed}")
    axes[-1, c].set_xlabel("training step")
  for r, legend in enumerate(legends):
    if legend and legend[0]:  # a row without data (e.g. no gold trees) has none
      _legend_outside(axes[r, -1], *legend, fontsize=7)
  note = analysis_sentences([run for run, _ in columns],
                            [name for row in TRAJECTORY_ROWS[1:] for name, _ in row])
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
  columns = columns[:max_seeds]
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns) + 1, 3.4), sharey=True,
                           squeeze=False)
  for c, (run, seed) in enumerate(columns):
    ax = axes[0, c]
    for name, label, color in RULE_SERIES:
      if seed in run.series.get(name, {}):
        ax.plot(*_finite(*run.series[name][seed]), color=color, lw=1.4, marker="o", ms=2,
                label=label)
    sat = saturation_step(run, seed, saturation)
    if sat is not None:
      ax.axvline(sat, color="gray", ls=":", lw=1.0)
    ax.set_ylim(-0.02, 1.02)
    ax.locator_params(axis="x", nbins=4)
    ax.grid(alpha=0.3)
    ax.set_title(f"seed {seed}" if len(runs) == 1 else f"{run.name} seed {seed}")
    ax.set_xlabel("training step")
  axes[0, 0].set_ylabel("fraction of gen lines")
  handles, labels = max((ax.get_legend_handles_labels() for ax in axes[0]),
                        key=lambda hl: len(hl[0]))
  _legend_outside(axes[0, -1], handles, labels, fontsize=7)
  fig.suptitle(f"{_task_prefix(runs)}which rule fronts the auxiliary on gen lines, "
               f"{_depth_label(depth)} (dotted: in-domain acc. first >= {saturation:g})")
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
  """(d) One analysis metric vs step: mean over seeds per depth and each seed.

  The title gives the sentences the analysis read (`analysis_sentences`; none for weight_norm).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (and nothing is written) when no run
    has the metric.
  """
  ylabel, title = DYNAMICS[metric]
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
    ax.plot(steps, [np.mean(per_step[s]) for s in steps], color=color, lw=2.4, marker="o", ms=3,
            label=f"{_depth_label(depth)} (mean of {len(per_step[steps[0]])} seeds)")
  ax.set_xlabel("training step")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  legend = _legend_outside(ax)
  legend.set_title("thin lines: seeds", prop={"size": 8})
  note = analysis_sentences([run for runs in present.values() for run in runs], [metric])
  ax.set_title(f"{title_prefix}{title} during training" + (f"\n{note}" if note else ""),
               fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return fig


# ---------------------------------------------------------------------------------------------
# Tables and the driver.


def _fmt(v) -> str:
  if v is None:
    return ""
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, float):
    return "" if math.isnan(v) else f"{v:.4g}"
  return str(v)


def write_csv(path: str, rows: Sequence[dict]) -> None:
  """Writes dict rows (keys of the first row as header; missing values empty)."""
  keys = []
  for r in rows:
    keys += [k for k in r if k not in keys]
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(keys)
    for r in rows:
      w.writerow([_fmt(r.get(k)) for k in keys])


def build_report(root: str, out_dir: str | None = None, *, threshold: float = 0.8,
                 saturation: float = 0.99, tie_tolerance: float = 0.0) -> dict:
  """Writes every figure and table of the report (see module docstring).

  Args:
    root: a workdir or a sweep root.
    out_dir: output folder (created); default `<root>/report`.
    threshold: final generalisation accuracy above which a seed "generalises" (c).
    saturation: in-domain accuracy level whose first step is marked in (a).
    tie_tolerance: in-domain accuracies within this of the best count as tied (b).

  Returns:
    {'out_dir': str, 'figures': [paths], 'skipped': [notes], 'depths': [summary rows]}.

  Raises:
    ReportError: no run under `root`, or no accuracy metrics in any run.
  """
  out_dir = out_dir or os.path.join(root, "report")
  runs = [load_run(w) for w in find_runs(root)]
  if not any(run.series.get(IN_ACC) or run.series.get(GEN_ACC) for run in runs):
    raise ReportError(f"no {IN_ACC} or {GEN_ACC} rows in the metrics.csv files under {root}")
  os.makedirs(out_dir, exist_ok=True)
  by_depth = collections.defaultdict(list)
  for run in runs:
    by_depth[run.depth].append(run)
  prefix = _task_prefix(runs)
  figures, skipped = [], []

  for depth in sorted(by_depth, key=lambda d: (d is None, d)):
    path = os.path.join(out_dir, f"grokking_depth{depth if depth is not None else 'unknown'}.png")
    plot_grokking(by_depth[depth], depth, path, saturation)
    figures.append(path)
    path = os.path.join(out_dir,
                        f"trajectories_depth{depth if depth is not None else 'unknown'}.png")
    if plot_trajectories(by_depth[depth], depth, path, saturation) is not None:
      figures.append(path)
    elif os.path.exists(path):
      os.remove(path)
    path = os.path.join(out_dir, f"rules_depth{depth if depth is not None else 'unknown'}.png")
    if plot_rules(by_depth[depth], depth, path, saturation) is not None:
      figures.append(path)
    elif os.path.exists(path):
      os.remove(path)

  seed_rows = seed_summary(runs, threshold, saturation, tie_tolerance)
  depth_rows = depth_summary(seed_rows)
  path = os.path.join(out_dir, "early_stopping.png")
  plot_early_stopping(seed_rows, path, prefix)
  figures.append(path)
  path = os.path.join(out_dir, "inverted_u.png")
  plot_inverted_u(depth_rows, path, threshold, prefix)
  figures.append(path)
  for metric in DYNAMICS:
    path = os.path.join(out_dir, f"dynamics_{metric}.png")
    if plot_dynamics(by_depth, metric, path, prefix) is not None:
      figures.append(path)
    else:
      if os.path.exists(path):
        os.remove(path)  # a stale figure from an earlier report would mislead
      skipped.append(f"dynamics_{metric}.png skipped: no `{metric}` rows in any analysis.csv "
                     f"(run `python -m sg_jax.analyze --workdir=<run>`)")

  write_csv(os.path.join(out_dir, "summary.csv"), depth_rows)
  write_csv(os.path.join(out_dir, "summary_seeds.csv"), seed_rows)
  _write_markdown(os.path.join(out_dir, "summary.md"), root, runs, depth_rows, figures, skipped,
                  threshold, saturation, tie_tolerance)
  for note in skipped:
    log.warning("%s", note)
  return {"out_dir": out_dir, "figures": figures, "skipped": skipped, "depths": depth_rows}


def _write_markdown(path, root, runs, depth_rows, figures, skipped, threshold, saturation,
                    tie_tolerance):
  columns = [
      ("depth", "depth"), ("num_seeds", "seeds"), ("final_step", "last step"),
      ("final_in_domain_mean", "in-domain acc. (final, mean)"),
      ("final_generalisation_mean", "gen. acc. (final, mean)"),
      ("final_generalisation_median", "gen. acc. (final, median)"),
      ("seeds_above_threshold", f"seeds gen. > {threshold:g}"),
      ("early_stop_first_generalisation_mean", "gen. acc. early stop (first best)"),
      ("early_stop_last_generalisation_mean", "gen. acc. early stop (last best)"),
      ("in_domain_saturation_step_median", f"median step in-domain >= {saturation:g}"),
      ("final_tscore_mean", "tscore (final)"), ("final_tparseval_f1_mean", "tparseval F1 (final)"),
      ("final_weight_norm_mean", "weight norm (final)")]
  run_list = ", ".join(f"`{r.name}` (depth {r.depth}, {r.task or 'task ?'})" for r in runs)
  analysed = [f"`{r.name}`: {note}" for r in runs
              if (note := analysis_sentences([r], list(_SENTENCES_OF)))]
  lines = [f"# Report for `{os.path.basename(os.path.normpath(root))}`", "",
           f"Runs: {run_list}."]
  if analysed:
    lines += ["", "Sentences the analysis read (tscore, tparseval, attention entropy): "
              f"{'; '.join(analysed)}."]
  lines += ["", "| " + " | ".join(c[1] for c in columns) + " |", "|" + "---|" * len(columns)]
  for row in depth_rows:
    cells = []
    for key, _ in columns:
      value = row.get(key)
      if key == "seeds_above_threshold":
        value = f"{value}/{row['num_seeds']}"
      cells.append(_fmt(value))
    lines.append("| " + " | ".join(cells) + " |")
  ties = ("exact ties" if tie_tolerance == 0 else
          f"values within {tie_tolerance:g} of the best count as tied")
  incomplete = [r for r in runs if r.num_steps and r.series.get(GEN_ACC) and
                max(int(s[0][-1]) for s in r.series[GEN_ACC].values() if len(s[0])) < r.num_steps]
  lines += [
      "", "Means are over seeds with a finite value; accuracies are fractions of lines correct.",
      "", "**Early stopping rule.** For each seed the evaluation with the highest in-domain "
      f"accuracy is selected ({ties}). Because "
      "in-domain accuracy usually sits at its maximum for most of training, the tie-breaking "
      "rule decides the result: *first best* takes the earliest tied evaluation (what early "
      "stopping with patience does), *last best* the latest (close to the end of training). "
      "Both are reported (docs/REFERENCE.md §1: on the released question-formation curves first "
      "best gives ~7% generalisation, last best the final value).",
      "", f"**Generalising seed**: final generalisation accuracy > {threshold:g} (final = the "
      "seed's last evaluated step).", "", "## Figures", ""]
  lines += [f"* `{os.path.basename(f)}`" for f in figures]
  if skipped or incomplete:
    lines += ["", "## Notes", ""]
    lines += [f"* {note}" for note in skipped]
    lines += [f"* `{r.name}` is unfinished: last evaluation before train.num_steps={r.num_steps}"
              for r in incomplete]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importing this module from a notebook
  or a test never clashes with other modules' flags)."""
  flags.DEFINE_string("root", None, "A sweep root (sg_jax.sweep) or a single workdir.")
  flags.DEFINE_string("out_dir", None, "Output folder (default <root>/report).")
  flags.DEFINE_float("threshold", 0.8, "Final generalisation accuracy above which a seed counts "
                     "as generalising (inverted-U figure).")
  flags.DEFINE_float("saturation", 0.99, "In-domain accuracy whose first step is marked on the "
                     "grokking curves.")
  flags.DEFINE_float("tie_tolerance", 0.0, "In-domain accuracies within this of the best count "
                     "as tied for early stopping.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if FLAGS.root is None:
    raise app.UsageError("--root is required")
  logging.set_verbosity(logging.WARNING)
  handler = py_logging.StreamHandler(sys.stderr)
  handler.setFormatter(py_logging.Formatter("%(message)s"))
  log.addHandler(handler)
  log.setLevel(py_logging.INFO)
  log.propagate = False
  try:
    result = build_report(FLAGS.root, FLAGS.out_dir, threshold=FLAGS.threshold,
                          saturation=FLAGS.saturation, tie_tolerance=FLAGS.tie_tolerance)
  except ReportError as e:
    sys.exit(f"error: {e}")
  print(f"report: {len(result['figures'])} figures, summary.md and summary.csv in "
        f"{result['out_dir']}")
  for row in result["depths"]:
    print(f"  depth {row['depth']}: {row['num_seeds']} seeds, final gen. acc. mean "
          f"{_fmt(row['final_generalisation_mean'])}, {row['seeds_above_threshold']} above "
          "threshold, early stop (first/last best) "
          f"{_fmt(row['early_stop_first_generalisation_mean'])}"
          f"/{_fmt(row['early_stop_last_generalisation_mean'])}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
