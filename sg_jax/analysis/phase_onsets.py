"""Phase transitions of a training run: one onset per curve and seed, all curves on one step
axis (docs/dynamics.md, "Phase transitions").

Every curve of `SIGNALS` is given the onset rule of `sg_jax.analysis.onsets` (a Gaussian-smoothed
curve's steepest rise / fall / change or its peak, kept only when it stands `min_snr` times above
the noise; a one-dimensional Canny edge detector), with the direction that marks its
transition:

| signal | curve (first one present) | event |
| --- | --- | --- |
| loss | `train/loss` | steepest fall (in practice the initial descent) |
| later_loss_drop | `train/loss` | the largest drop after the initial descent (`later_fall`) |
| uas | `in_domain/uas` (metrics.csv), else `uas` (analysis.csv) | sharpest rise |
| cka_final | `cka_final` (CKA with the final checkpoint) | sharpest rise |
| tvd | `tvd_previous` (TVD between consecutive checkpoints) | peak |
| intrinsic_dimension | `twonn_dimension` | largest change, either sign |
| tscore | `tscore` | sharpest rise |
| generalisation | `out_of_domain/accuracy` | sharpest rise |

TVD between consecutive checkpoints is itself a rate of change of the function, so its event is
its peak: the step where the function changes fastest. A row of a consecutive quantity (written
at the later checkpoint, `training_dynamics`) is placed at the midpoint between that checkpoint
and the one before it among the analysed steps (`CONSECUTIVE`), where the change it measures
happened. Curves with fewer than `onset_detection.MIN_POINTS` finite points have no onset.
Every onset carries its resolution (`onset_detection.Onset.resolution`: max(the gap between
the curve's points around it, the smoothing sigma)); two onsets closer than the coarser
resolution are tied at this resolution (`onset_detection.compare`).

`sg_jax.report.phase_transitions` tabulates the onsets, their order and the lags between them with
bootstrap confidence intervals over seeds, and draws them.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from sg_jax.analysis import onset_detection

# signal -> (metric names, the first one present is used; event
# (`onset_detection.DIRECTIONS`); label)
SIGNALS = {
    "loss": (("train/loss",), "fall", "training loss (steepest fall)"),
    "later_loss_drop": (("train/loss",), "later_fall",
                        "training loss (drop after the initial descent)"),
    "uas": (("in_domain/uas", "uas"), "rise", "UAS (best head)"),
    "cka_final": (("cka_final",), "rise", "CKA to final"),
    "tvd": (("tvd_previous",), "peak", "TVD to previous"),
    "intrinsic_dimension": (("twonn_dimension",), "change", "intrinsic dimension (TwoNN)"),
    "tscore": (("tscore",), "rise", "tscore"),
    "generalisation": (("out_of_domain/accuracy",), "rise", "generalisation accuracy"),
}
# Quantities between a checkpoint and the one before it: placed at the midpoint of the two.
CONSECUTIVE = ("tvd_previous", "cka_previous")
# Columns written at every analysed checkpoint: their steps give the checkpoint before a row.
_EVERY_CHECKPOINT = ("cka_final", "tvd_final", "twonn_dimension")

Series = Mapping[str, Mapping[int, tuple[np.ndarray, np.ndarray]]]


def midpoints(steps: np.ndarray, checkpoints: np.ndarray) -> np.ndarray:
  """(previous checkpoint + step) / 2 for each step, the previous checkpoint being the largest
  of `checkpoints` below it (a step with none stays where it is).

  Args:
    steps: [T] steps of a consecutive quantity's rows.
    checkpoints: [C] every analysed checkpoint step, sorted.

  Returns:
    float64 [T].
  """
  steps = np.asarray(steps, np.float64)
  checkpoints = np.asarray(checkpoints, np.float64)
  i = np.searchsorted(checkpoints, steps) - 1
  previous = np.where(i >= 0, checkpoints[np.maximum(i, 0)], steps)
  return (previous + steps) / 2


def curves(series: Series) -> dict[str, tuple[str, dict[int, tuple[np.ndarray, np.ndarray]]]]:
  """The curve of every signal of `SIGNALS` the run has.

  Args:
    series: {name: {seed: (steps [T], values [T])}} (`report.reading.Run.series`, or
      `onsets.series_of`): metrics.csv and analysis.csv merged.

  Returns:
    {signal: (metric name, {seed: (steps float64 [T], values float64 [T])})} in `SIGNALS`
    order; consecutive quantities at their midpoints (`CONSECUTIVE`).
  """
  out = {}
  for signal, (names, _, _) in SIGNALS.items():
    name = next((n for n in names if series.get(n)), None)
    if name is None:
      continue
    by_seed = {}
    for seed, (steps, values) in series[name].items():
      steps = np.asarray(steps, np.float64)
      if name in CONSECUTIVE:
        every = [np.asarray(series[c][seed][0]) for c in _EVERY_CHECKPOINT
                 if seed in series.get(c, {})]
        checkpoints = np.unique(np.concatenate(every + [steps]))
        steps = midpoints(steps, checkpoints)
      by_seed[int(seed)] = (steps, np.asarray(values, np.float64))
    out[signal] = (name, by_seed)
  return out


def phase_onsets(series: Series, *, sigma: float | None = None, min_snr: float = 3.0
                 ) -> dict[int, dict[str, onset_detection.Onset]]:
  """The onset of every signal of every seed (module docstring).

  Args:
    series: as `curves`.
    sigma: smoothing in steps (None: 2 x the median gap of each curve; `onset_detection.onset`).
    min_snr: as `onset_detection.onset`.

  Returns:
    {seed: {signal: Onset}} for the signals the run has (in `SIGNALS` order); `NO_ONSET`
    where a curve has no onset or fewer than `onset_detection.MIN_POINTS` finite points.
  """
  found = curves(series)
  seeds = sorted({s for _, by_seed in found.values() for s in by_seed})
  out: dict[int, dict[str, onset_detection.Onset]] = {s: {} for s in seeds}
  for signal, (_, by_seed) in found.items():
    direction = SIGNALS[signal][1]
    for seed in seeds:
      curve = by_seed.get(seed)
      if curve is None or int(np.sum(np.isfinite(curve[1]))) < onset_detection.MIN_POINTS:
        out[seed][signal] = onset_detection.NO_ONSET
        continue
      out[seed][signal] = onset_detection.onset(curve[0], curve[1], direction, sigma=sigma,
                                           min_snr=min_snr)
  return out
