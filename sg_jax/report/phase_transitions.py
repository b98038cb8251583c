"""Phase transitions in the report: every curve of a run on one step axis, the onsets of each
seed, their order and the lags between them with Student t confidence intervals over seeds
(`sg_jax.stats.mean_interval`; the percentile bootstrap undercovers at 4-8 seeds).

For a workdir whose analysis.csv has the training-dynamics columns (`cka_final`, `tvd_previous`,
`twonn_dimension`; `sg_jax.analysis.training_dynamics`):

* `phases_<run>.png`: one panel per curve of `sg_jax.analysis.phase_onsets.SIGNALS` the run has
  (training loss, UAS, CKA to the final checkpoint, TVD between consecutive checkpoints, TwoNN
  intrinsic dimension, tscore, generalisation accuracy), all on the same training-step axis:
  each seed thin, the seed mean thick with its 95% t band over seeds
  (`plotting.mean_band`), each seed's onset a dashed vertical line in the seed's colour;
* `onset_order_<run>.png`: the signals sorted by their mean onset (earliest on top), each seed's
  onset a dot, the seed mean with its 95% t CI a bar;
* summary.md, "Phase transitions": the onset of every signal per seed with the seed mean and
  CI, the order of the mean onsets at their resolution, then per signal, in the order of the
  mean onsets, its resolution and its lag to the initial loss descent, to the later loss drop
  and to the generalisation rise (onset minus the reference's onset per seed; mean over the
  seeds that have both, 95% t CI) with the seeds in which it comes before the
  reference, is tied with it, or comes after it; summary_phases.csv has the same rows.

Resolution (docs/dynamics.md, "Onset order at a resolution"): an onset is located no finer than
max(the gap between its curve's points around it, the smoothing sigma) steps
(`onset_detection.Onset.resolution`). Two onsets are ordered only when they differ by more
than the coarser of the two resolutions (`onset_detection.compare`, per seed), and two mean
onsets only when their means differ by more than the coarser of the two signals' resolutions
(the median over seeds); otherwise they are "tied at this resolution" (`≈` in the order, one
letter in the order figure).
"""

from __future__ import annotations

import collections
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from sg_jax import stats
from sg_jax.analysis import onset_detection
from sg_jax.analysis import phase_onsets as phases_lib
from sg_jax.analysis.onset_detection import NO_ONSET, Onset
from sg_jax.report.plotting import legend_outside, mean_band, pyplot
from sg_jax.report.reading import Run

# Signals the lags are measured from: (signal, how summary.md names its event).
REFERENCES = (("loss", "initial loss descent"), ("later_loss_drop", "later loss drop"),
              ("generalisation", "generalisation rise"))
# A run gets the phase figures when its analysis.csv has one of these.
DYNAMICS_COLUMNS = ("cka_final", "tvd_previous", "twonn_dimension")

Onsets = Mapping[int, Mapping[str, Onset]]  # {seed: {signal: Onset}}


def _steps(found: Onsets, signal: str, seeds: Sequence[int] | None = None) -> list[float]:
  """Each seed's onset step of `signal` (NaN: none), in seed order."""
  return [found[s][signal].step if signal in found[s] else math.nan
          for s in (seeds if seeds is not None else sorted(found))]


def resolution(found: Onsets, signal: str) -> float:
  """The median over seeds of the resolution (steps) of `signal`'s onsets (NaN: none)."""
  values = [by[signal].resolution for by in found.values()
            if signal in by and math.isfinite(by[signal].step)]
  values = [v for v in values if math.isfinite(v)]
  return float(np.median(values)) if values else math.nan


def order(found: Onsets) -> list[tuple[str, float, float, float, int, float]]:
  """The signals by mean onset step: (signal, mean, CI low, CI high, seeds with an onset,
  resolution (`resolution`)); signals without any onset last."""
  signals = list(dict.fromkeys(k for by in found.values() for k in by))
  rows = []
  for signal in signals:
    steps = _steps(found, signal)
    ci = stats.mean_interval(steps)
    mean, low, high = ci.estimate, ci.low, ci.high
    rows.append((signal, mean, low, high, int(np.sum(np.isfinite(steps))),
                 resolution(found, signal)))
  return sorted(rows, key=lambda r: (math.isnan(r[1]), r[1]))


def order_signals(found: Onsets) -> list[str]:
  """The signals of `found`, in the order of `order`."""
  return [r[0] for r in order(found)]


def relations(ranked: Sequence[tuple]) -> list[str]:
  """Between each two neighbours of `order`'s rows with an onset: '<' when their means differ
  by more than the coarser of their resolutions, '≈' (tied at this resolution) otherwise.

  Returns:
    [len(rows with a finite mean) - 1] strings.
  """
  rows = [r for r in ranked if math.isfinite(r[1])]
  out = []
  for a, b in zip(rows, rows[1:]):
    r = max(np.nan_to_num(a[5]), np.nan_to_num(b[5]))
    out.append("<" if b[1] - a[1] > r else "≈")
  return out


def tie_groups(ranked: Sequence[tuple]) -> list[int]:
  """A group number (0, 1, ...) per row of `order` with a finite mean: neighbours joined by '≈'
  (`relations`) share a group."""
  groups = [0] if any(math.isfinite(r[1]) for r in ranked) else []
  for rel in relations(ranked):
    groups.append(groups[-1] + (rel == "<"))
  return groups


def lag(found: Onsets, signal: str, reference: str) -> dict[str, float]:
  """The lag of `signal` after `reference` over the seeds that have both onsets.

  Returns:
    {'mean', 'low', 'high': the seed mean of onset(signal) - onset(reference) in steps and its
    95% Student t CI (`stats.mean_interval`); 'seeds': seeds with both; 'before', 'tied',
    'after': seeds where
    `signal` comes before `reference` by more than the coarser resolution, within it, or after
    it (`onset_detection.compare`)} (NaN mean without such seeds).
  """
  seeds = sorted(found)
  a, b = np.array(_steps(found, signal, seeds)), np.array(_steps(found, reference, seeds))
  both = np.isfinite(a) & np.isfinite(b)
  ci = stats.mean_interval(a[both] - b[both])
  mean, low, high = ci.estimate, ci.low, ci.high
  verdicts = [onset_detection.compare(found[s][signal], found[s][reference])
              for s, ok in zip(seeds, both) if ok]
  return {"mean": mean, "low": low, "high": high, "seeds": int(both.sum()),
          "before": verdicts.count(-1), "tied": verdicts.count(0), "after": verdicts.count(1)}


def table_rows(run: Run, found: Onsets) -> list[dict]:
  """summary_phases.csv rows of one run: one per signal in the order of its mean onset, with
  its metric, event, each seed's onset (`onset_seed<s>`), the mean and CI, its resolution, and
  the lags to the `REFERENCES` with the seeds before / tied / after at the resolution."""
  metrics = {signal: name for signal, (name, _) in phases_lib.curves(run.series).items()}
  rows = []
  for signal, mean, low, high, n, res in order(found):
    row = {"run": run.name, "signal": signal, "metric": metrics.get(signal, ""),
           "event": phases_lib.SIGNALS[signal][1], "seeds_with_onset": n,
           "onset_mean": mean, "onset_ci_low": low, "onset_ci_high": high, "resolution": res}
    row.update({f"onset_seed{s}": found[s][signal].step for s in sorted(found)})
    for reference, _ in REFERENCES:
      if reference != signal and any(reference in by for by in found.values()):
        got = lag(found, signal, reference)
        row.update({f"lag_to_{reference}": got["mean"], f"lag_to_{reference}_ci_low": got["low"],
                    f"lag_to_{reference}_ci_high": got["high"],
                    f"lag_to_{reference}_seeds": got["seeds"],
                    f"before_{reference}": got["before"], f"tied_{reference}": got["tied"],
                    f"after_{reference}": got["after"]})
    rows.append(row)
  return rows


def curve_points(run: Run) -> dict[str, int]:
  """{signal: the most finite points any seed's curve of it has} (`phases_lib.curves`): an onset
  needs `onset_detection.MIN_POINTS` of them."""
  return {signal: max((int(np.isfinite(np.asarray(v, float)).sum()) for _, v in by_seed.values()),
                      default=0)
          for signal, (_, by_seed) in phases_lib.curves(run.series).items()}


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
           "Onset step of each curve per seed (`sg_jax.analysis.phase_onsets`: the smoothed curve's "
           "steepest fall / rise / change, its peak, or the largest loss drop after the initial "
           "descent, kept when it stands 3 x above the noise; '-' = none), seed mean with a 95% "
           "t CI over seeds; lags = onset minus the reference's onset, per seed, over "
           "the seeds with both. Resolution = max(the gap between the curve's points around "
           "the onset, the smoothing sigma), median over seeds; two onsets closer than the "
           "coarser resolution are tied at this resolution (≈), and 'before / tied / after' "
           "counts the seeds at that resolution (docs/dynamics.md)."]
  for run, found in results:
    points = curve_points(run)
    few = {s: points[s] for s in order_signals(found)
           if s in points and points[s] < onset_detection.MIN_POINTS}
    too_few = (f"too few evaluations for an onset: "
               + ", ".join(f"{s} {n} points" for s, n in few.items())
               + f" (an onset needs at least {onset_detection.MIN_POINTS}; docs/dynamics.md)")
    lines += ["", f"### `{run.name}`", ""]
    ranked = [r for r in order(found) if r[0] not in few]
    if not ranked:
      lines.append(f"No onset table: {too_few}.")
      continue
    if few:
      lines += [f"Left out, {too_few}.", ""]
    signals = [r[0] for r in ranked]
    lines += ["| seed | " + " | ".join(signals) + " |", "|" + "---|" * (len(signals) + 1)]
    for seed in sorted(found):
      lines.append(f"| {seed} | " + " | ".join(_fmt(found[seed][s].step) for s in signals)
                   + " |")
    lines.append("| mean [95% CI] | " + " | ".join(_ci(*r[1:4]) for r in ranked) + " |")
    lines.append("| resolution | " + " | ".join(_fmt(r[5]) for r in ranked) + " |")
    refs = [(ref, label) for ref, label in REFERENCES if ref in signals]
    finite = [r for r in ranked if math.isfinite(r[1])]
    chain = ""
    for k, r in enumerate(finite):
      chain += (f" {relations(ranked)[k - 1]} " if k else "") + f"{r[0]} ({_fmt(r[1])})"
    lines += ["", "Order of the mean onsets at their resolution (neighbours: '<' = apart by "
              "more than the coarser resolution, '≈' = tied at this resolution): "
              + (chain if finite else "none found (a curve needs at least "
                 f"{onset_detection.MIN_POINTS} points and a transition above its noise)")
              + ".", "",
              "| signal | event | seeds with an onset | resolution | "
              + " | ".join(f"lag to {label} [95% CI] | before / tied / after (seeds)"
                           for _, label in refs)
              + " |", "|" + "---|" * (4 + 2 * len(refs))]
    for signal, _, _, _, n, res in ranked:
      cells = [signal, phases_lib.SIGNALS[signal][1], f"{n}/{len(found)}", _fmt(res)]
      for ref, _ in refs:
        if ref == signal:
          cells += ["", ""]
          continue
        got = lag(found, signal, ref)
        cells += [_ci(got["mean"], got["low"], got["high"]),
                  f"{got['before']} / {got['tied']} / {got['after']}" if got["seeds"] else "-"]
      lines.append("| " + " | ".join(cells) + " |")
  return lines


def _seed_colors(seeds: Sequence[int]) -> dict[int, tuple]:
  cmap = pyplot().get_cmap("tab10")
  return {s: cmap(i % cmap.N) for i, s in enumerate(seeds)}


def plot_phases(run: Run, found: Onsets, path: str, title_prefix: str = ""):
  """All the run's curves on one step axis (module docstring). Signals read from one metric
  (the loss's steepest fall and its later drop) share a panel: the first signal's onsets are
  dashed, the next one's dotted. Each panel's title gives its onsets' resolution.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run
    has none of `DYNAMICS_COLUMNS`.
  """
  if not any(run.series.get(c) for c in DYNAMICS_COLUMNS):
    return None
  found_curves = phases_lib.curves(run.series)
  panels: dict[str, list[str]] = {}  # metric -> its signals
  for signal, (name, _) in found_curves.items():
    panels.setdefault(name, []).append(signal)
  plt = pyplot()
  seeds = sorted(found)
  colors = _seed_colors(seeds)
  styles = ("--", ":", "-.")
  points = curve_points(run)
  fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.1 * len(panels) + 0.8),
                           sharex=True, squeeze=False)
  for ax, (name, signals) in zip(axes[:, 0], panels.items()):
    by_seed = found_curves[signals[0]][1]
    per_step = collections.defaultdict(list)
    for seed, (steps, values) in sorted(by_seed.items()):
      ok = np.isfinite(values)
      ax.plot(steps[ok], values[ok], color=colors.get(seed, "grey"), lw=0.8, alpha=0.45)
      for x, v in zip(steps[ok], values[ok]):
        per_step[float(x)].append(float(v))
    xs = np.array(sorted(per_step))
    if xs.size:
      mean_band(ax, xs, per_step, "black", alpha=0.2, lw=1.8)
    events = []
    for signal, style in zip(signals, styles):
      for seed in seeds:
        step = found[seed].get(signal, NO_ONSET).step
        if math.isfinite(step):
          ax.axvline(step, color=colors[seed], ls=style, lw=1.1)
      res = resolution(found, signal)
      if not any(math.isfinite(found[s].get(signal, NO_ONSET).step) for s in seeds):
        n = points.get(signal, 0)
        events.append(f"{phases_lib.SIGNALS[signal][1]}: none found"
                      + (f" ({n} points, {onset_detection.MIN_POINTS} needed)"
                         if n < onset_detection.MIN_POINTS else ""))
        continue
      events.append(f"{phases_lib.SIGNALS[signal][1]}"
                    + (f" ({style})" if len(signals) > 1 else "")
                    + (f", resolution {res:.0f}" if math.isfinite(res) else ""))
    if name == "train/loss":
      ax.set_yscale("log")
    label = phases_lib.SIGNALS[signals[0]][2].split(" (")[0]
    ax.set_title(f"{label} ({name}; onset: {'; '.join(events)})", fontsize=9)
    ax.grid(alpha=0.3)
  axes[-1, 0].set_xlabel("training step")
  handles = [plt.Line2D([], [], color="black", lw=1.8, label="seed mean (95% t band)")]
  # "(onset dashed)" only for a seed with an onset drawn
  drawn = {s for s in seeds if any(math.isfinite(o.step) for o in found[s].values())}
  handles += [plt.Line2D([], [], color=colors[s], ls="--" if s in drawn else "-",
                         label=f"seed {s}" + (" (onset dashed)" if s in drawn else ""))
              for s in seeds]
  legend_outside(axes[0, 0], handles, [h.get_label() for h in handles])
  fig.suptitle(f"{title_prefix}training phases of {run.name}")
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


def plot_onset_order(run: Run, found: Onsets, path: str, title_prefix: str = ""):
  """The onset order (module docstring): per signal its seeds' onsets as dots, the seed mean
  with its 95% t CI, a grey bar of +- half its resolution around the mean, and a
  letter per tie group (`tie_groups`: signals with one letter are tied at this resolution).

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run
    has none of `DYNAMICS_COLUMNS` or no onset at all.
  """
  ranked = [r for r in order(found) if r[4]]
  if not any(run.series.get(c) for c in DYNAMICS_COLUMNS) or not ranked:
    return None
  groups = tie_groups(ranked)
  plt = pyplot()
  seeds = sorted(found)
  colors = _seed_colors(seeds)
  fig, ax = plt.subplots(figsize=(8, 0.55 * len(ranked) + 1.6))
  for y, (signal, mean, low, high, _, res) in enumerate(ranked):
    if math.isfinite(res):
      ax.barh(y, res, left=mean - res / 2, height=0.6, color="0.85", zorder=0,
              label="+- half the resolution" if y == 0 else None)
    for i, seed in enumerate(seeds):
      step = found[seed][signal].step
      if math.isfinite(step):
        ax.plot(step, y + 0.25 * (i / max(len(seeds) - 1, 1) - 0.5), "o", ms=5,
                color=colors[seed], label=f"seed {seed}" if y == 0 else None)
    ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="D", color="black", ms=6,
                capsize=4, label="seed mean, 95% t CI" if y == 0 else None)
  ax.set_yticks(range(len(ranked)),
                [f"({chr(ord('A') + g % 26)}) {phases_lib.SIGNALS[r[0]][2]}"
                 for g, r in zip(groups, ranked)])
  ax.invert_yaxis()
  ax.set_xlabel("onset step (same letter: tied at this resolution)")
  ax.grid(alpha=0.3)
  handles, labels = ax.get_legend_handles_labels()
  legend_outside(ax, handles, labels)
  fig.suptitle(f"{title_prefix}order of the onsets in {run.name}")
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


def onsets(run: Run) -> Onsets | None:
  """The run's onsets ({seed: {signal: Onset}}, `phases_lib.phase_onsets`), or None when it has
  none of `DYNAMICS_COLUMNS`."""
  if not any(run.series.get(c) for c in DYNAMICS_COLUMNS):
    return None
  return phases_lib.phase_onsets(run.series)


def draw(run: Run, optional: Callable, title_prefix: str = "") -> Onsets | None:
  """Draws the two figures of one run through the report's `optional(name, plot)` (which
  records a written figure and removes a stale one).

  Returns:
    the run's onsets ({seed: {signal: Onset}}, `phases_lib.phase_onsets`), or None when the
    run has none of `DYNAMICS_COLUMNS`.
  """
  found = onsets(run)
  optional(f"phases_{run.name}.png", lambda p: plot_phases(run, found or {}, p, title_prefix))
  optional(f"onset_order_{run.name}.png",
           lambda p: plot_onset_order(run, found or {}, p, title_prefix))
  return found
