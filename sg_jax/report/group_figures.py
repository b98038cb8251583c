"""Seed-group figures of one run: `groups_<run>.png`, `time_to_generalise_<run>.png` and
`dose_response_<run>.png`.

`plot_groups` draws, per group of `groups.seed_groups`, the seed mean of each compared metric
(`group_stats.COMPARED`) with its 95% t-interval over seeds (`seed_stats.seed_mean`) and marks
each seed's onset (`sg_jax.analysis.onsets`); `plot_time_to_generalise` draws each group's
Kaplan-Meier curve of the first step above the generalisation threshold (`sg_jax.stats.survival`);
`plot_dose_response` draws the final generalisation against each numeric per-seed field.
"""

from __future__ import annotations

import collections
import math
from typing import Mapping, Sequence

import numpy as np

from sg_jax import stats
from sg_jax.analysis import onsets as onsets_lib
from sg_jax.report import seed_stats
from sg_jax.report.group_stats import COMPARED, crossings, seed_final
from sg_jax.report.groups import grouping_fields
from sg_jax.report.plotting import (CONSTRUCTION_COLORS, legend_outside, mean_band, pyplot,
                                    save_figure)
from sg_jax.report.reading import GEN_ACC, Run

# Panel titles of a run whose accuracy series are borrowed (`Run.accuracy_from`, a masked LM).
BORROWED_TITLES = {"in_domain/accuracy": "in-domain {0} (minimal pairs)",
                   "out_of_domain/accuracy": "generalisation: out-of-domain {0} (minimal pairs)"}
PANELS_PER_ROW = 4


def plot_groups(run: Run, groups: Mapping[str, Sequence[int]], path: str, title_prefix: str):
  """Per compared metric the run logged: the seed mean of each group over training with its 95%
  t-interval band over seeds, and each seed's onset as a tick at the bottom of the panel.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run has
    fewer than two groups or none of `COMPARED`.
  """
  panels = [(n, sig, t) for n, sig, t in COMPARED if run.series.get(n)]
  if len(groups) < 2 or not panels:
    return None
  plt = pyplot()
  onsets = onsets_lib.seed_onsets(run.series)
  cols = min(len(panels), PANELS_PER_ROW)
  nrows = -(-len(panels) // cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols + 2.5, 4 * nrows), squeeze=False)
  for ax in axes.flat[len(panels):]:
    ax.set_visible(False)
  cmap = plt.get_cmap("tab10")
  for ax, (name, signal, title) in zip(axes.flat, panels):
    for g, (label, seeds) in enumerate(groups.items()):
      color = cmap(g % cmap.N)
      per_step = collections.defaultdict(list)
      for seed in seeds:
        if seed in run.series[name]:
          for step, value in zip(*run.series[name][seed]):
            if math.isfinite(value):
              per_step[int(step)].append(float(value))
      steps = np.array(sorted(per_step))
      if not steps.size:
        continue
      mean_band(ax, steps, per_step, color, alpha=0.2, lw=1.8,
                label=f"{label} ({len(seeds)} seeds)")
      marks = [onsets[s][signal].step for s in seeds if s in onsets and signal in onsets[s]]
      marks = [m for m in marks if math.isfinite(m)]
      ax.plot(marks, [0.02] * len(marks), "|", color=color, ms=12, mew=2,
              transform=ax.get_xaxis_transform())
    if name == "train/loss":
      ax.set_yscale("log")
    if run.accuracy_from and name in BORROWED_TITLES:
      title = BORROWED_TITLES[name].format(run.accuracy_from)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3)
  legend_outside(axes[0][cols - 1]).set_title("band: 95% t-interval over seeds;\n"
                                         "ticks: onsets of each seed", prop={"size": 8})
  fig.suptitle(f"{title_prefix}seed groups of {run.name}")
  return save_figure(fig, path)


def plot_time_to_generalise(run: Run, groups: Mapping[str, Sequence[int]], path: str,
                             title_prefix: str, threshold: float):
  """Per group: the Kaplan-Meier estimate of the fraction of seeds whose generalisation accuracy
  (`out_of_domain/accuracy`, 0-1) has exceeded `threshold` by each training step (one minus the
  survival curve of `stats.kaplan_meier`; the time to generalise of issue 49 item 1), a step
  curve from 0 at step 0, seeds that never cross censored at their last evaluated step (a
  cross on the curve). The legend gives each group's n, the seeds that cross and the median
  first crossing with its Brookmeyer-Crowley 95% interval ('not reached' below half).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run has
    fewer than two groups or no generalisation rows.
  """
  if len(groups) < 2 or not run.series.get(GEN_ACC):
    return None
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(8, 4))
  cmap = plt.get_cmap("tab10")
  last = 0.0
  for g, (label, seeds) in enumerate(groups.items()):
    times, reached = crossings(run, seeds, threshold)
    if not times:
      continue
    color = cmap(g % cmap.N)
    curve = stats.kaplan_meier(times, reached)
    last = max(last, max(times))
    xs = np.concatenate([[0.0], curve.steps])
    ys = np.concatenate([[0.0], 1.0 - curve.survival])
    median = curve.median
    said = (f"median {median.estimate:g} [{median.low:g}, {median.high:g}]"
            if math.isfinite(median.estimate) else "median not reached")
    ax.step(xs, ys, where="post", color=color, lw=2,
            label=f"{label}: {curve.events}/{curve.n} cross; {said}")
    censored = [t for t, r in zip(times, reached) if not r]
    ax.plot(censored, [1.0 - curve.at(t) for t in censored], "x", color=color, ms=8, mew=2)
  ax.set_xlim(0, last * 1.03 if last else 1)
  ax.set_ylim(-0.02, 1.02)
  ax.set_xlabel("training step")
  ax.set_ylabel(f"fraction of seeds with generalisation > {threshold:g}")
  ax.grid(alpha=0.3)
  legend_outside(ax).set_title("Kaplan-Meier (x: censored, never crossed);\n"
                               "median first crossing, 95% Brookmeyer-Crowley", prop={"size": 8})
  fig.suptitle(f"{title_prefix}time to generalise in {run.name}")
  return save_figure(fig, path)


def plot_dose_response(run: Run, path: str, title_prefix: str,
                       by: Sequence[str] | None = None):
  """Final generalisation against each numeric per-seed config field (e.g. the number of
  disambiguating questions, the weight decay of a grid sweep, `seeds.init`), or each of those
  `by` names (`grouping_fields`): per value, the seed mean of the final `out_of_domain/accuracy`
  and of each construction's (`out_of_domain/accuracy/<tag>`) with its 95% t-interval over the
  seeds of each value (n in the legend title), the seeds of the other per-seed fields' values
  pooled.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run has
    no numeric per-seed field or no generalisation rows.
  """
  fields = {n: v for n, v in grouping_fields(run.config, by).items()
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)}
  metrics = ["out_of_domain/accuracy"] + sorted(
      n for n in run.series if n.startswith("out_of_domain/accuracy/"))
  if not fields or not run.series.get(metrics[0]):
    return None
  plt = pyplot()
  first = int(run.config.get("first_seed", 0))
  fig, axes = plt.subplots(1, len(fields), figsize=(5 * len(fields) + 2.5, 4), squeeze=False)
  for ax, (field, values) in zip(axes[0], fields.items()):
    doses = sorted(set(values))
    for name in metrics:
      tag = name.split("/")[-1] if name.count("/") == 2 else ""
      got = np.array([seed_stats.seed_mean(
          [seed_final(run, name, first + k) for k, v in enumerate(values) if v == dose])
          for dose in doses])
      ax.errorbar(doses, got[:, 0], yerr=[got[:, 0] - got[:, 1], got[:, 2] - got[:, 0]],
                  fmt="o-" if not tag else "s--", capsize=3, lw=2.2 if not tag else 1.2,
                  color="black" if not tag else CONSTRUCTION_COLORS.get(tag),
                  label="all gen lines" if not tag else tag)
    ax.set_xticks(doses, [f"{d:g}" for d in doses], rotation=45 if len(doses) > 4 else 0)
    ax.set_xlabel(field)
    ax.set_ylabel("final generalisation accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  sizes = sorted({values.count(v) for values in fields.values() for v in set(values)})
  legend_outside(axes[0][-1]).set_title(
      f"seed mean, 95% t-interval (n={'/'.join(map(str, sizes))} seeds per value)",
      prop={"size": 8})
  fig.suptitle(f"{title_prefix}dose response of {run.name}")
  return save_figure(fig, path)
