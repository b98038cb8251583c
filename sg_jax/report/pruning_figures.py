"""The report's pruning figures (Bhaskar, Friedman & Chen, ACL 2024; docs/pruning.md), one PNG
per figure, drawn from a workdir's `pruning_tables.Pruning`:

  pruning_accuracy_<run>.png        in-domain vs out-of-domain accuracy of every subnetwork of
                                    the last pruned step, one panel per sparsity level, colour =
                                    training seed, star = the full model
                                    (`pruning_accuracy_<run>_step<N>.png` for every step with
                                    --pruning_all_steps).
  pruning_inclusion_<run>.png       inclusion frequency of each head (layer x head) and MLP block
                                    (last column), one heat map per training seed (rows) and level
                                    (columns), last pruned step.
  pruning_effective_size_<run>.png  effective size vs training step, per training seed, mean
                                    over pruning seeds with its 95% Student-t band; one panel per
                                    variant (mean, in-domain, out-of-domain); the band is
                                    drawn clipped to [0, 1].
  pruning_core_ablation_<run>.png   from pruning_core.csv: in- and out-of-domain accuracy of the
                                    full model, the core ablated and random non-core heads
                                    ablated (bar: mean over draws; dots: the draws), per
                                    training seed and level, at the last step with ablation rows.
"""

from __future__ import annotations

import math
import os
from typing import Callable

import numpy as np

from sg_jax.models import interventions
from sg_jax.pruning import core
from sg_jax.report import pruning_tables
from sg_jax.report.plotting import legend_outside, pyplot
from sg_jax.report.pruning_tables import GEN_ACC, IN_ACC, Pruning


def _seed_colors(plt, seeds):
  cmap = plt.get_cmap("tab10" if len(seeds) <= 10 else "tab20")
  return {seed: cmap(i % cmap.N) for i, seed in enumerate(sorted(seeds))}


def _offsets(seeds, span: float, fraction: float = 0.012) -> dict:
  """{seed: x offset}: seeds spread symmetrically around 0 in steps of `fraction` x `span`, so
  equal values of different seeds stay visible side by side."""
  seeds = sorted(seeds)
  return {seed: (i - (len(seeds) - 1) / 2) * fraction * span for i, seed in enumerate(seeds)}


def _zoomed_limits(values, pad_fraction: float = 0.08, min_pad: float = 0.02
                   ) -> tuple[float, float]:
  """Axis limits around the finite `values` (accuracies in [0, 1]) with a margin, within
  [-0.02, 1.02]: a cloud of points near 1.0 is drawn large, not squeezed into a corner."""
  finite = [v for v in values if np.isfinite(v)]
  if not finite:
    return -0.02, 1.02
  low, high = min(finite), max(finite)
  pad = max(min_pad, pad_fraction * (high - low))
  return max(-0.02, low - pad), min(1.02, high + pad)


def _save(plt, fig, path):
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_accuracy(data: Pruning, step: int, path: str, title_prefix: str = ""):
  """In-domain (x) vs out-of-domain (y) accuracy of every subnetwork at `step`, one panel per
  level; the full model of each training seed is a star.

  Returns:
    the (closed) Figure written to `path`, or None (nothing written) when no run at `step` has
    both accuracies.
  """
  seeds = data.seeds(step)
  levels = sorted({lv for seed in seeds for lv in data.runs[(step, seed)]})
  points = {(seed, lv): [(v[IN_ACC], v[GEN_ACC]) for v in data.runs[(step, seed)].get(lv, {}
                                                                                      ).values()
                         if IN_ACC in v and GEN_ACC in v] for seed in seeds for lv in levels}
  if not any(points.values()):
    return None
  plt = pyplot()
  colors = _seed_colors(plt, seeds)
  fulls = {seed: data.full.get((step, seed), {}) for seed in seeds}
  fulls = {seed: (f[IN_ACC], f[GEN_ACC]) for seed, f in fulls.items()
           if IN_ACC in f and GEN_ACC in f}
  every = [xy for xys in points.values() for xy in xys] + list(fulls.values())
  xlim = _zoomed_limits([x for x, _ in every])
  ylim = _zoomed_limits([y for _, y in every])
  shift = _offsets(seeds, xlim[1] - xlim[0])  # seeds side by side: equal points stay visible
  fig, axes = plt.subplots(1, len(levels), figsize=(4 * len(levels) + 2, 4), squeeze=False,
                           sharex=True, sharey=True)
  for ax, level in zip(axes[0], levels):
    for seed in seeds:
      if seed in fulls:  # beneath the subnetworks' dots, which often sit on it
        ax.scatter([fulls[seed][0] + shift[seed]], [fulls[seed][1]], marker="*", s=260,
                   color=colors[seed], edgecolor="black", lw=0.8, alpha=0.45, zorder=1,
                   label=f"seed {seed} full model")
      xy = np.array(points[(seed, level)]).reshape(-1, 2)
      ax.scatter(xy[:, 0] + shift[seed], xy[:, 1], color=colors[seed], s=28, alpha=0.85,
                 edgecolor="white", lw=0.4, zorder=3, label=f"seed {seed} subnetworks")
    ax.set_title(f"sparsity {level:g}")
    ax.set_xlabel("in-domain accuracy")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("out-of-domain (generalisation) accuracy")
  legend_outside(axes[0][-1])
  fig.suptitle(f"{title_prefix}subnetworks of {data.name}, step {step} (one dot per pruning "
               "seed; axes zoomed to the data; seeds offset horizontally by "
               f"{abs(shift[seeds[0]] - shift[seeds[-1]]) / max(1, len(seeds) - 1):.3f} "
               "each)", fontsize=10)
  return _save(plt, fig, path)


def plot_inclusion(data: Pruning, step: int, path: str, title_prefix: str = ""):
  """Heat maps of inclusion frequency, [R_h, num_heads + 1] (a row per attention block, named
  as `interventions.rows_of_shape`; last column: the row's MLP block, blank for an
  encoder-decoder's cross-attention rows), one per (training seed, level) at `step`; core
  units (frequency 1) are outlined.

  Returns:
    the (closed) Figure written to `path`, or None when `step` has no masks file.
  """
  cells = data.masks.get(step)
  if not cells or data.shape is None:
    return None
  plt = pyplot()
  num_layers, num_heads = data.shape
  seeds = sorted({s for s, _ in cells})
  levels = sorted({lv for _, lv in cells})
  fig, axes = plt.subplots(len(seeds), len(levels), squeeze=False, layout="constrained",
                           figsize=(max(2.8, 0.5 * (num_heads + 1)) * len(levels) + 1.5,
                                    (max(1.6, 0.45 * num_layers) + 0.6) * len(seeds) + 0.8))
  image = None
  for i, seed in enumerate(seeds):
    for j, level in enumerate(levels):
      ax = axes[i][j]
      if (seed, level) not in cells:
        ax.axis("off")
        continue
      heads, mlp = core.split_units(core.inclusion_frequency(cells[(seed, level)]), num_layers,
                                    num_heads)
      # MLP column: row r's block (an encoder-decoder's cross-attention rows have none: blank).
      mlp_column = np.full((num_layers, 1), np.nan)
      mlp_column[:mlp.shape[0], 0] = mlp
      grid = np.concatenate([heads, mlp_column], axis=1)
      image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
      for layer, col in zip(*np.nonzero(grid >= 1.0)):
        ax.add_patch(plt.Rectangle((col - 0.5, layer - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
      ax.axvline(num_heads - 0.5, color="white", lw=2)
      if grid.size <= 64:  # small models: the frequencies as numbers too
        for (layer, col), f in ((at, f) for at, f in np.ndenumerate(grid) if not np.isnan(f)):
          ax.text(col, layer, f"{f:.2g}", ha="center", va="center", fontsize=7,
                  color="black" if f > 0.6 else "white")
      ax.set_xticks(range(num_heads + 1))
      ax.set_xticklabels([f"h{h}" for h in range(num_heads)] + ["MLP"], fontsize=7)
      ax.set_yticks(range(num_layers))
      ax.set_yticklabels(interventions.rows_of_shape(num_layers, mlp.shape[0])[0], fontsize=7)
      ax.set_title(f"seed {seed}, sparsity {level:g}\n"
                   f"({cells[(seed, level)].shape[0]} subnetworks)", fontsize=8)
  fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8,
               label="inclusion frequency (red outline: core)")
  fig.suptitle(f"{title_prefix}inclusion frequency of {data.name}, step {step}")
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_effective_size(data: Pruning, path: str, title_prefix: str = ""):
  """Effective size vs training step per training seed (mean over pruning seeds, 95%
  Student-t band, and a bar at each step), one panel per variant of `core.VARIANTS`.

  Returns:
    the (closed) Figure written to `path`, or None when no (step, seed) has an effective size.
  """
  sizes = pruning_tables.effective_sizes(data)
  if not sizes:
    return None
  plt = pyplot()
  colors = _seed_colors(plt, sizes)
  titles = {"mean": "in- and out-of-domain accuracy averaged", "in_domain": "in-domain accuracy",
            "out_of_domain": "out-of-domain accuracy"}
  fig, axes = plt.subplots(1, len(core.VARIANTS), figsize=(4.2 * len(core.VARIANTS) + 2, 4),
                           squeeze=False, sharey=True)
  steps = sorted({int(x) for entry in sizes.values() for x in entry["step"]})
  # Seeds side by side at each step, so equal sizes of different seeds do not hide each other;
  # a single pruned step is drawn on an axis of +-10% of its step.
  span = (steps[-1] - steps[0]) or max(abs(steps[0]), 1) * 0.2
  shift = _offsets(sizes, span)
  for ax, variant in zip(axes[0], core.VARIANTS):
    for seed, entry in sorted(sizes.items()):
      x = entry["step"] + shift[seed]
      low, high = entry[variant + "/ci_low"], entry[variant + "/ci_high"]
      band = np.isfinite(low)  # nan for one pruning seed; clipped to [0, 1] (core_table)
      ax.fill_between(x, np.where(band, low, entry[variant]),
                      np.where(band, high, entry[variant]), color=colors[seed], alpha=0.15, lw=0)
      # The interval as a bar at each step too: a band over a single step has no width.
      ax.vlines(x[band], low[band], high[band], color=colors[seed], alpha=0.5, lw=1.2)
      ax.plot(x, entry[variant], "o-", color=colors[seed], lw=1.6, ms=4, label=f"seed {seed}")
      bound = entry.get(variant + "/at_highest_level", np.zeros_like(x)) > 0
      if bound.any():  # an upper bound: some pruning seeds reached the highest level tried
        ax.scatter(x[bound], entry[variant][bound], marker="v", s=40, facecolor="none",
                   edgecolor=colors[seed], lw=1.0, zorder=3)
    ax.set_title(f"effective size from {titles[variant]}", fontsize=9)
    ax.set_xlabel("training step")
    if len(steps) == 1:  # one pruned checkpoint: a readable axis around it
      ax.set_xlim(steps[0] - span / 2, steps[0] + span / 2)
      ax.set_xticks(steps)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("effective size (1 - sparsity)")
  legend_outside(axes[0][-1]).set_title(
      "band and bars: 95% t-interval\nover pruning seeds (in [0, 1]);\nseeds offset along x;"
      "\n▽: an upper bound (pruning seeds\nat the highest level tried)", prop={"size": 8})
  fig.suptitle(f"{title_prefix}effective size of {data.name} (within {core.TOLERANCE:g} of the "
               "full model)")
  return _save(plt, fig, path)


def ablation_step(data: Pruning) -> int | None:
  """The last step of pruning_core.csv with core-ablation rows, None when there is none."""
  steps = [step for (step, _, level), named in data.core_rows.items() if level is not None
           and any(n.startswith("core_ablation/") for n in named)]
  return max(steps) if steps else None


def plot_core_ablation(data: Pruning, path: str, title_prefix: str = ""):
  """Bars of the full model, the core ablated and random non-core heads ablated (mean over the
  draws, the draws as dots), per (training seed, level), for in- and out-of-domain accuracy.

  Returns:
    the (closed) Figure written to `path`, or None without core-ablation rows.
  """
  step = ablation_step(data)
  if step is None:
    return None
  plt = pyplot()
  groups = sorted((seed, level) for (s, seed, level), named in data.core_rows.items()
                  if s == step and level is not None
                  and any(n.startswith("core_ablation/") for n in named))
  kinds = (("full", "full model", "#7f7f7f"), ("core_ablation", "core ablated", "#d62728"),
           ("random_ablation", "random heads ablated", "#1f77b4"))
  fig, axes = plt.subplots(1, 2, figsize=(max(6, 1.1 * len(groups)) * 2 + 2, 4), squeeze=False,
                           sharey=True)
  x = np.arange(len(groups))
  width = 0.27
  for ax, (metric, title) in zip(axes[0], ((IN_ACC, "in-domain accuracy"),
                                           (GEN_ACC, "out-of-domain accuracy"))):
    for k, (prefix, label, color) in enumerate(kinds):
      values = [data.core_rows[(step, seed, level)].get(f"{prefix}/{metric}", math.nan)
                for seed, level in groups]
      ax.bar(x + (k - 1) * width, values, width, color=color, label=label)
      if prefix == "random_ablation":
        for i, (seed, level) in enumerate(groups):
          named = data.core_rows[(step, seed, level)]
          draws = [v for n, v in named.items() if n.startswith(f"{prefix}/{metric}/draw")]
          ax.scatter(np.full(len(draws), x[i] + width), draws, s=10, color="black", zorder=3,
                     label="draws" if i == 0 else None)
    cores = [data.core_rows[(step, seed, level)].get("core/num_heads", math.nan)
             for seed, level in groups]
    ax.set_xticks(x)
    ax.set_xticklabels([f"seed {s}\nsp. {lv:g}\n{_count(c)} core head{'' if c == 1 else 's'}"
                        for (s, lv), c in zip(groups, cores)], fontsize=7)
    ax.set_title(title)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3, axis="y")
  legend_outside(axes[0][-1])
  fig.suptitle(f"{title_prefix}core ablation in the full model of {data.name}, step {step}")
  return _save(plt, fig, path)


def _count(v: float) -> str:
  return "?" if math.isnan(v) else str(int(v))


def draw(workdir: str, name: str, out_dir: str, optional: Callable, title_prefix: str = "",
         all_steps: bool = False) -> Pruning | None:
  """Draws the pruning figures of one workdir through the report's `optional(name, plot)`
  (which records a written figure and removes a stale one); nothing without pruning.csv.

  Returns:
    the workdir's `Pruning` tables, or None when it has no finished pruning run.
  """
  data = pruning_tables.load_pruning(workdir, name)
  if data is None:
    for kind in ("accuracy", "inclusion", "effective_size", "core_ablation"):
      stale = os.path.join(out_dir, f"pruning_{kind}_{name}.png")
      if os.path.exists(stale):
        os.remove(stale)
    return None
  last = data.steps[-1]
  optional(f"pruning_accuracy_{name}.png", lambda p: plot_accuracy(data, last, p, title_prefix))
  if all_steps:
    for step in data.steps:
      optional(f"pruning_accuracy_{name}_step{step}.png",
               lambda p, s=step: plot_accuracy(data, s, p, title_prefix))
  optional(f"pruning_inclusion_{name}.png", lambda p: plot_inclusion(data, last, p, title_prefix))
  optional(f"pruning_effective_size_{name}.png",
           lambda p: plot_effective_size(data, p, title_prefix))
  optional(f"pruning_core_ablation_{name}.png",
           lambda p: plot_core_ablation(data, p, title_prefix))
  return data


__all__ = ["ablation_step", "draw", "plot_accuracy", "plot_core_ablation",
           "plot_effective_size", "plot_inclusion"]
