"""Plotting helpers shared by the report's figures (`figures`, `depth_figures`, `groups`,
`pruning_figures`): matplotlib on the Agg backend, legends outside the axes, seed-mean bands,
title pieces, the colour of each construction tag, and writing a figure (`save_figure`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sg_jax.report import seed_stats
from sg_jax.report.reading import Run

# Colour of each construction tag (`Task.constructions`) in every figure.
CONSTRUCTION_COLORS = {"none": "#7f7f7f", "PP": "#9467bd", "RC-subj": "#1f77b4",
                       "RC-obj": "#d62728", "RC-intrans": "#2ca02c"}


def pyplot():
  """matplotlib.pyplot on the Agg backend (files only, no display).

  Imported here, not at the top: the backend must be chosen before pyplot is first imported,
  and `sg_jax.report` (its tables) works without importing matplotlib at all.
  """
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def save_figure(fig, path: str, dpi: int = 100):
  """Lays out `fig`, writes it to `path` (PNG, tight bounding box) and closes it; returns it."""
  plt = pyplot()
  fig.tight_layout()
  fig.savefig(path, dpi=dpi, bbox_inches="tight")
  plt.close(fig)
  return fig


def depth_label(depth) -> str:
  """'depth 6', or 'depth ?' when the run's depth is unknown."""
  return f"depth {depth}" if depth is not None else "depth ?"


def task_prefix(runs: Sequence[Run]) -> str:
  """'question: ' (the runs' tasks joined by '/') to start a figure title; '' when unknown."""
  tasks = sorted({r.task for r in runs if r.task})
  return f"{'/'.join(tasks)}: " if tasks else ""


def legend_outside(ax, handles=None, labels=None, fontsize=8):
  """Legend to the right of `ax`, outside every axes, so that it never hides data."""
  if handles is None:
    handles, labels = ax.get_legend_handles_labels()
  return ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.02, 0.5),
                   fontsize=fontsize, frameon=False)


def mean_band(ax, xs, samples, color, alpha: float = 0.18, **plot_kwargs):
  """Draws, at each x of `xs`, the mean of `samples[x]` (one value per seed) as a line and its
  95% t-interval over seeds (`seed_stats.seed_mean`; none where a step has one seed) as a
  shaded band; with fewer than 3 points also as markers (a single point draws no line)."""
  mean, low, high = np.array([seed_stats.seed_mean(samples[x]) for x in xs]).T
  ax.fill_between(xs, low, high, color=color, alpha=alpha, lw=0)
  if len(xs) < 3:
    plot_kwargs = {"marker": "o", **plot_kwargs}
  ax.plot(xs, mean, color=color, **plot_kwargs)
