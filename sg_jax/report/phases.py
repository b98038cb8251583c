"""Phase transitions in the report: every curve of a run on one step axis, the onsets of each
seed, their order and the lags between them with bootstrap confidence intervals over seeds.

For a workdir whose analysis.csv has the training-dynamics columns (`cka_final`, `tvd_previous`,
`twonn_dimension`; `sg_jax.analysis.training_dynamics`):

* `phases_<run>.png`: one panel per curve of `sg_jax.analysis.phases.SIGNALS` the run has
  (training loss, UAS, CKA to the final checkpoint, TVD between consecutive checkpoints, TwoNN
  intrinsic dimension, tscore, generalisation accuracy), all on the same training-step axis:
  each seed thin, the seed mean thick with its 95% bootstrap band over seeds
  (`seed_stats.bootstrap_ci`), each seed's onset a dashed vertical line in the seed's colour;
* `onset_order_<run>.png`: the signals sorted by their mean onset (earliest on top), each seed's
  onset a dot, the seed mean with its 95% bootstrap CI a bar;
* summary.md, "Phase transitions": the onset of every signal per seed with the seed mean and
  CI, then per signal, in the order of the mean onsets, its lag to the loss drop and to the
  generalisation rise (onset minus the reference's onset per seed; mean over the seeds that
  have both, 95% bootstrap CI) and in how many seeds it comes first; summary_phases.csv has
  the same rows.
"""

from __future__ import annotations

import collections
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from sg_jax.analysis import phases as phases_lib
from sg_jax.analysis.onsets import NO_ONSET, Onset
from sg_jax.report import seed_stats
from sg_jax.report.plotting import legend_outside, mean_band, pyplot
from sg_jax.report.reading import Run

# Signals the lags are measured from: (signal, how summary.md names its event).
REFERENCES = (("loss", "loss drop"), ("generalisation", "generalisation rise"))
# A run gets the phase figures when its analysis.csv has one of these.
DYNAMICS_COLUMNS = ("cka_final", "tvd_previous", "twonn_dimension")

Onsets = Mapping[int, Mapping[str, Onset]]  # {seed: {signal: Onset}}


def _steps(found: Onsets, signal: str, seeds: Sequence[int] | None = None) -> list[float]:
  """Each seed's onset step of `signal` (NaN: none), in seed order."""
  return [found[s][signal].step if signal in found[s] else math.nan
          for s in (seeds if seeds is not None else sorted(found))]


def order(found: Onsets) -> list[tuple[str, float, float, float, int]]:
  """The signals by mean onset step: (signal, mean, CI low, CI high, seeds with an onset);
  signals without any onset last."""
  signals = list(dict.fromkeys(k for by in found.values() for k in by))
  rows = []
  for signal in signals:
    steps = _steps(found, signal)
    mean, low, high = seed_stats.bootstrap_ci(steps)
    rows.append((signal, mean, low, high, int(np.sum(np.isfinite(steps)))))
  return sorted(rows, key=lambda r: (math.isnan(r[1]), r[1]))


def lag(found: Onsets, signal: str, reference: str) -> dict[str, float]:
  """The lag of `signal` after `reference` over the seeds that have both onsets.

  Returns:
    {'mean', 'low', 'high': the seed mean of onset(signal) - onset(reference) in steps and its
    95% bootstrap CI; 'seeds': seeds with both; 'first': seeds where `signal` comes strictly
    first} (NaN mean without such seeds).
  """
  a, b = np.array(_steps(found, signal)), np.array(_steps(found, reference))
  both = np.isfinite(a) & np.isfinite(b)
  mean, low, high = seed_stats.bootstrap_ci(a[both] - b[both])
  return {"mean": mean, "low": low, "high": high, "seeds": int(both.sum()),
          "first": int(np.sum(a[both] < b[both]))}


def table_rows(run: Run, found: Onsets) -> list[dict]:
  """summary_phases.csv rows of one run: one per signal in the order of its mean onset, with
  its metric, event, each seed's onset (`onset_seed<s>`), the mean and CI, and the lags to the
  `REFERENCES`."""
  metrics = {signal: name for signal, (name, _) in phases_lib.curves(run.series).items()}
  rows = []
  for signal, mean, low, high, n in order(found):
    row = {"run": run.name, "signal": signal, "metric": metrics.get(signal, ""),
           "event": phases_lib.SIGNALS[signal][1], "seeds_with_onset": n,
           "onset_mean": mean, "onset_ci_low": low, "onset_ci_high": high}
    row.update({f"onset_seed{s}": found[s][signal].step for s in sorted(found)})
    for reference, _ in REFERENCES:
      if reference != signal and any(reference in by for by in found.values()):
        got = lag(found, signal, reference)
        row.update({f"lag_to_{reference}": got["mean"], f"lag_to_{reference}_ci_low": got["low"],
                    f"lag_to_{reference}_ci_high": got["high"],
                    f"lag_to_{reference}_seeds": got["seeds"],
                    f"first_before_{reference}": got["first"]})
    rows.append(row)
  return rows


def _fmt(v: float) -> str:
  return "-" if v is None or not math.isfinite(v) else f"{v:.0f}"


def _ci(mean: float, low: float, high: float) -> str:
  if not math.isfinite(mean):
    return "-"
  return f"{_fmt(mean)} [{_fmt(low)}, {_fmt(high)}]" if low != high else _fmt(mean)


def markdown_lines(results: Sequence[tuple[Run, Onsets]]) -> list[str]:
  """The "Phase transitions" section of summary.md (one block per run)."""
  if not results:
    return []
  lines = ["", "## Phase transitions", "",
           "Onset step of each curve per seed (`sg_jax.analysis.phases`: the smoothed curve's "
           "steepest fall / rise / change or its peak, kept when it stands 3 x above the noise; "
           "'-' = none), seed mean with a 95% bootstrap CI over seeds; lags = onset minus the "
           "reference's onset, per seed, over the seeds with both (docs/dynamics.md)."]
  for run, found in results:
    ranked = order(found)
    signals = [r[0] for r in ranked]
    lines += ["", f"### `{run.name}`", "",
              "| seed | " + " | ".join(signals) + " |", "|" + "---|" * (len(signals) + 1)]
    for seed in sorted(found):
      lines.append(f"| {seed} | " + " | ".join(_fmt(found[seed][s].step) for s in signals)
                   + " |")
    lines.append("| mean [95% CI] | " + " | ".join(_ci(*r[1:4]) for r in ranked) + " |")
    refs = [(ref, label) for ref, label in REFERENCES if ref in signals]
    found_order = [f"{r[0]} ({_fmt(r[1])})" for r in ranked if math.isfinite(r[1])]
    lines += ["", "Order of the mean onsets: " + (" < ".join(found_order) if found_order else
                                                  "none found (a curve needs at least "
                                                  f"{phases_lib.onsets_lib.MIN_POINTS} points "
                                                  "and a transition above its noise)") + ".", "",
              "| signal | event | seeds with an onset | "
              + " | ".join(f"lag to {label} [95% CI] | first (seeds)" for _, label in refs)
              + " |", "|" + "---|" * (3 + 2 * len(refs))]
    for signal, _, _, _, n in ranked:
      cells = [signal, phases_lib.SIGNALS[signal][1], f"{n}/{len(found)}"]
      for ref, _ in refs:
        if ref == signal:
          cells += ["", ""]
          continue
        got = lag(found, signal, ref)
        cells += [_ci(got["mean"], got["low"], got["high"]),
                  f"{got['first']}/{got['seeds']}" if got["seeds"] else "-"]
      lines.append("| " + " | ".join(cells) + " |")
  return lines


def _seed_colors(seeds: Sequence[int]) -> dict[int, tuple]:
  cmap = pyplot().get_cmap("tab10")
  return {s: cmap(i % cmap.N) for i, s in enumerate(seeds)}


def plot_phases(run: Run, found: Onsets, path: str, title_prefix: str = ""):
  """All the run's curves on one step axis (module docstring).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run
    has none of `DYNAMICS_COLUMNS`.
  """
  if not any(run.series.get(c) for c in DYNAMICS_COLUMNS):
    return None
  found_curves = phases_lib.curves(run.series)
  plt = pyplot()
  seeds = sorted(found)
  colors = _seed_colors(seeds)
  fig, axes = plt.subplots(len(found_curves), 1, figsize=(9, 2.1 * len(found_curves) + 0.8),
                           sharex=True, squeeze=False)
  for ax, (signal, (name, by_seed)) in zip(axes[:, 0], found_curves.items()):
    per_step = collections.defaultdict(list)
    for seed, (steps, values) in sorted(by_seed.items()):
      ok = np.isfinite(values)
      ax.plot(steps[ok], values[ok], color=colors.get(seed, "grey"), lw=0.8, alpha=0.45)
      for x, v in zip(steps[ok], values[ok]):
        per_step[float(x)].append(float(v))
    xs = np.array(sorted(per_step))
    if xs.size:
      mean_band(ax, xs, per_step, "black", alpha=0.2, lw=1.8)
    for seed in seeds:
      step = found[seed].get(signal, NO_ONSET).step
      if math.isfinite(step):
        ax.axvline(step, color=colors[seed], ls="--", lw=1.1)
    if name == "train/loss":
      ax.set_yscale("log")
    ax.set_title(f"{phases_lib.SIGNALS[signal][2]} ({name}; onset: "
                 f"{phases_lib.SIGNALS[signal][1]})", fontsize=9)
    ax.grid(alpha=0.3)
  axes[-1, 0].set_xlabel("training step")
  handles = [plt.Line2D([], [], color="black", lw=1.8, label="seed mean (95% bootstrap band)")]
  handles += [plt.Line2D([], [], color=colors[s], ls="--", label=f"seed {s} (onset dashed)")
              for s in seeds]
  legend_outside(axes[0, 0], handles, [h.get_label() for h in handles])
  fig.suptitle(f"{title_prefix}training phases of {run.name}")
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_onset_order(run: Run, found: Onsets, path: str, title_prefix: str = ""):
  """The onset order (module docstring).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run
    has none of `DYNAMICS_COLUMNS` or no onset at all.
  """
  ranked = [r for r in order(found) if r[4]]
  if not any(run.series.get(c) for c in DYNAMICS_COLUMNS) or not ranked:
    return None
  plt = pyplot()
  seeds = sorted(found)
  colors = _seed_colors(seeds)
  fig, ax = plt.subplots(figsize=(8, 0.55 * len(ranked) + 1.6))
  for y, (signal, mean, low, high, _) in enumerate(ranked):
    for i, seed in enumerate(seeds):
      step = found[seed][signal].step
      if math.isfinite(step):
        ax.plot(step, y + 0.25 * (i / max(len(seeds) - 1, 1) - 0.5), "o", ms=5,
                color=colors[seed], label=f"seed {seed}" if y == 0 else None)
    ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="D", color="black", ms=6,
                capsize=4, label="seed mean, 95% bootstrap CI" if y == 0 else None)
  ax.set_yticks(range(len(ranked)), [phases_lib.SIGNALS[r[0]][2] for r in ranked])
  ax.invert_yaxis()
  ax.set_xlabel("onset step")
  ax.grid(alpha=0.3)
  handles, labels = ax.get_legend_handles_labels()
  legend_outside(ax, handles, labels)
  fig.suptitle(f"{title_prefix}order of the onsets in {run.name}")
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


def draw(run: Run, optional: Callable, title_prefix: str = "") -> Onsets | None:
  """Draws the two figures of one run through the report's `optional(name, plot)` (which
  records a written figure and removes a stale one).

  Returns:
    the run's onsets ({seed: {signal: Onset}}, `phases_lib.phase_onsets`), or None when the
    run has none of `DYNAMICS_COLUMNS`.
  """
  has = any(run.series.get(c) for c in DYNAMICS_COLUMNS)
  found = phases_lib.phase_onsets(run.series) if has else {}
  optional(f"phases_{run.name}.png", lambda p: plot_phases(run, found, p, title_prefix))
  optional(f"onset_order_{run.name}.png",
           lambda p: plot_onset_order(run, found, p, title_prefix))
  return found if has else None
