"""Onsets of a training run, per seed (Chen et al., ICLR 2024, docs/REFERENCE.md §3;
docs/sas.md, "Onsets").

Chen et al. see syntactic attention structure appear abruptly ("structure onset", the sharpest
rise of UAS) together with a sudden drop of the loss, and capabilities follow ("capabilities
onset"). `seed_onsets` finds, for every seed of a workdir:

* `structure`: the sharpest rise of `in_domain/uas` (metrics.csv; `uas` of analysis.csv when
  the run logged none);
* `loss_drop`: the steepest fall of `train/loss`;
* `in_domain`, `out_of_domain`: the sharpest rise of `in_domain/accuracy` and of
  `out_of_domain/accuracy` (the capabilities onsets); a run without them (a masked LM, whose
  evaluation has no teacher-forced task metric) is read on its `<split>/preference`, else its
  `<split>/masked_accuracy`.

Algorithm (`onset`), for one curve (steps [T], values [T], steps possibly irregular, e.g. the
dense-early evaluation schedule):

1. non-finite values are dropped; a running median over 3 consecutive points removes isolated
   spikes (the two end points are kept);
2. the curve is linearly interpolated onto a uniform step grid (spacing: the smallest gap
   between steps, at most `MAX_GRID` points) and smoothed with a Gaussian kernel of standard
   deviation `sigma` steps (default: 2 x the median gap between steps), edges padded with the
   end values, so smoothing does not depend on how densely a stretch was evaluated;
3. the onset is the grid step of the largest slope (rise), the most negative slope (fall) or
   the largest absolute slope (change) of the smoothed curve (`np.gradient`), or of the
   smoothed curve's maximum (peak: for a curve that is itself a rate of change, such as the
   functional change between consecutive checkpoints, its peak is the steepest change of what
   it measures);
4. robustness: the change of the smoothed curve over [onset - 2 sigma, onset + 2 sigma] (at
   least two grid spacings each side; for a peak: its drop to the lowest smoothed value on
   each side, the smaller of the two, the one side of a peak at an end of the curve) must be
   at least `min_snr` x the noise, the scaled median absolute deviation (1.4826 MAD) of the raw
   values around the smoothed curve; otherwise the curve has no onset (a flat noisy curve
   gives NaN rather than the position of its largest noise excursion).

Steps 2-4 are a one-dimensional Canny edge detector (Canny, IEEE TPAMI 8(6), 1986, "A
computational approach to edge detection"): the derivative of a Gaussian-smoothed signal, its
extremum as the location of the edge, and a threshold relative to the noise.

A symmetric transition (a sigmoid) has its largest slope at its midpoint, and a symmetric
smoothing kernel keeps it there, so the onset of `a + b / (1 + exp(-(t - t0) / w))` is `t0`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Mapping, Sequence

import numpy as np

from sg_jax import fileio
from sg_jax import long_csv

MAX_GRID = 20_000
# The fewest finite points an onset is located from. Step 4 compares the change over
# [onset - 2 sigma, onset + 2 sigma], sigma = 2 median gaps: a window of 8 gaps. A curve of
# fewer than 9 points lies inside one window, so its change cannot be told from its noise and
# the "onset" is wherever the smoothing's edge effects put the largest slope (a 3-point loss curve
# gave step 500 for every seed). Such curves are refused, not guessed.
MIN_POINTS = 9
DIRECTIONS = ("rise", "fall", "change", "peak")  # what `onset` locates (module docstring)
SIGNALS = {  # name -> (metric names, first present is used; direction)
    "structure": (("in_domain/uas", "uas"), "rise"),
    "loss_drop": (("train/loss",), "fall"),
    # a masked LM logs no teacher-forced accuracy: its minimal-pair preference, else its
    # masked-token accuracy, is its capability (docs/objectives.md)
    "in_domain": (("in_domain/accuracy", "in_domain/preference", "in_domain/masked_accuracy"),
                  "rise"),
    "out_of_domain": (("out_of_domain/accuracy", "out_of_domain/preference",
                       "out_of_domain/masked_accuracy"), "rise"),
}


@dataclasses.dataclass(frozen=True)
class Onset:
  """The onset of one curve.

  Attributes:
    step: the step of the steepest rise / fall (NaN: no onset).
    slope: the smoothed slope there (value units per step).
    change: the smoothed change over [step - 2 sigma, step + 2 sigma], or a peak's height
      (value units).
    noise: 1.4826 x median absolute deviation of the raw values from the smoothed curve.
  """

  step: float
  slope: float
  change: float
  noise: float


NO_ONSET = Onset(math.nan, math.nan, math.nan, math.nan)


def _median3(values: np.ndarray) -> np.ndarray:
  if values.size < 3:
    return values.copy()
  out = values.copy()
  out[1:-1] = np.median(np.lib.stride_tricks.sliding_window_view(values, 3), axis=-1)
  return out


def _gaussian_smooth(values: np.ndarray, sigma_points: float) -> np.ndarray:
  if sigma_points <= 0:
    return values.copy()
  half = int(math.ceil(4 * sigma_points))
  x = np.arange(-half, half + 1)
  kernel = np.exp(-0.5 * (x / sigma_points) ** 2)
  kernel /= kernel.sum()
  padded = np.concatenate([np.full(half, values[0]), values, np.full(half, values[-1])])
  return np.convolve(padded, kernel, mode="valid")


def smooth(steps: Sequence[float], values: Sequence[float], sigma: float | None = None
           ) -> tuple[np.ndarray, np.ndarray, float]:
  """Steps 1-2 of the algorithm (module docstring).

  Args:
    steps: [T] strictly increasing steps.
    values: [T] values (non-finite ones dropped).
    sigma: Gaussian standard deviation in steps (None: 2 x the median gap).

  Returns:
    (grid steps [G], smoothed values [G], sigma used).

  Raises:
    ValueError: steps and values differ in length, steps not increasing, fewer than
      `MIN_POINTS` finite points, or sigma < 0.
  """
  steps = np.asarray(steps, np.float64)
  values = np.asarray(values, np.float64)
  if steps.shape != values.shape or steps.ndim != 1:
    raise ValueError(f"steps and values must be 1-D of one length, got {steps.shape} and "
                     f"{values.shape}")
  keep = np.isfinite(values)
  steps, values = steps[keep], values[keep]
  if steps.size < MIN_POINTS:
    raise ValueError(f"an onset needs at least {MIN_POINTS} finite points (MIN_POINTS), got "
                     f"{steps.size}")
  gaps = np.diff(steps)
  if np.any(gaps <= 0):
    raise ValueError("steps must be strictly increasing")
  if sigma is not None and sigma < 0:
    raise ValueError(f"sigma must be >= 0 steps, got {sigma}")
  sigma = 2.0 * float(np.median(gaps)) if sigma is None else float(sigma)
  spacing = max(float(gaps.min()), (steps[-1] - steps[0]) / (MAX_GRID - 1))
  grid = np.arange(steps[0], steps[-1] + spacing / 2, spacing)
  curve = np.interp(grid, steps, _median3(values))
  return grid, _gaussian_smooth(curve, sigma / spacing), sigma


def onset(steps: Sequence[float], values: Sequence[float], direction: str = "rise", *,
          sigma: float | None = None, min_snr: float = 3.0) -> Onset:
  """The step of the sharpest rise (steepest fall, largest change, peak) of a curve (module
  docstring).

  Args:
    steps: [T] strictly increasing steps.
    values: [T] values.
    direction: one of `DIRECTIONS`: 'rise', 'fall', 'change' (either) or 'peak'.
    sigma: smoothing in steps (None: 2 x the median gap between steps).
    min_snr: the smoothed change around the onset must be >= min_snr x the noise.

  Returns:
    an `Onset` (`NO_ONSET` when the change is not above the noise).

  Raises:
    ValueError: unknown direction, or as `smooth`.
  """
  if direction not in DIRECTIONS:
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
  grid, curve, sigma = smooth(steps, values, sigma)
  slope = np.gradient(curve, grid) if grid.size > 1 else np.zeros(1)
  if direction == "peak":
    k = int(np.argmax(curve))
    drops = [curve[k] - side.min() for side in (curve[:k], curve[k + 1:]) if side.size]
    change = float(min(drops)) if drops else 0.0
  else:
    k = int(np.argmax({"rise": slope, "fall": -slope, "change": np.abs(slope)}[direction]))
    half = max(2 * sigma, 2 * (grid[1] - grid[0]) if grid.size > 1 else 0.0)
    lo = np.searchsorted(grid, grid[k] - half)
    hi = min(np.searchsorted(grid, grid[k] + half, side="right"), grid.size) - 1
    change = float(curve[hi] - curve[lo])
  s = np.asarray(steps, np.float64)
  v = np.asarray(values, np.float64)
  keep = np.isfinite(v)
  residual = v[keep] - np.interp(s[keep], grid, curve)
  noise = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
  signed = -change if direction == "fall" else abs(change) if direction == "change" else change
  if not signed > 0 or signed < min_snr * noise:
    return NO_ONSET
  return Onset(step=float(grid[k]), slope=float(slope[k]), change=change, noise=noise)


def series_of(rows: Sequence[tuple]) -> dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]:
  """{name: {seed: (steps [T], values [T])}} of long-format rows (a repeated row keeps the
  last)."""
  acc: dict = {}
  for step, seed, name, value in rows:
    acc.setdefault(name, {}).setdefault(int(seed), {})[int(step)] = float(value)
  return {name: {seed: (np.array(sorted(d), np.float64),
                        np.array([d[k] for k in sorted(d)], np.float64))
                 for seed, d in by_seed.items()} for name, by_seed in acc.items()}


def seed_onsets(series: Mapping[str, Mapping[int, tuple]], *, sigma: float | None = None,
                min_snr: float = 3.0, strict: bool = False) -> dict[int, dict[str, Onset]]:
  """`SIGNALS` onsets of every seed.

  Args:
    series: `series_of` output (or `report.reading.Run.series`: metrics.csv and analysis.csv
      merged).
    sigma, min_snr: as `onset`.
    strict: refuse a signal the run logged at too few points (the CLI) instead of giving it no
      onset (the report, which draws what it can).

  Returns:
    {seed: {signal: Onset}}; a signal the run did not log is `NO_ONSET`, and so is one with
    fewer than `MIN_POINTS` finite points unless `strict`.

  Raises:
    ValueError (only if `strict`): a logged signal with fewer than `MIN_POINTS` finite points
      for some seed, naming the signal, its metric, the seeds and the count.
  """
  seeds = sorted({s for by_seed in series.values() for s in by_seed})
  out: dict[int, dict[str, Onset]] = {s: {} for s in seeds}
  for signal, (names, direction) in SIGNALS.items():
    name = next((n for n in names if n in series), None)
    sparse = {}
    for seed in seeds:
      curve = series.get(name, {}).get(seed) if name else None
      points = 0 if curve is None else int(np.sum(np.isfinite(curve[1])))
      if points < MIN_POINTS:
        if points:
          sparse[seed] = points
        out[seed][signal] = NO_ONSET
        continue
      out[seed][signal] = onset(curve[0], curve[1], direction, sigma=sigma, min_snr=min_snr)
    if strict and sparse:
      raise ValueError(
          f"{signal} onset: {name} has only {min(sparse.values())} logged points for seed(s) "
          f"{sorted(sparse)} and an onset needs at least {MIN_POINTS}; evaluate (and so log "
          "train/loss) more often, e.g. --config.eval.dense_until=1000 "
          "--config.eval.dense_every=100")
  return out


def workdir_onsets(workdir: str, **kwargs) -> dict[int, dict[str, Onset]]:
  """`seed_onsets` of WORKDIR/metrics.csv and WORKDIR/analysis.csv (when present).

  Raises:
    FileNotFoundError: no metrics.csv.
  """
  rows = long_csv.read_rows(os.path.join(workdir, "metrics.csv"))
  rows += long_csv.read_rows(os.path.join(workdir, "analysis.csv"), missing_ok=True)
  return seed_onsets(series_of(rows), **kwargs)


def write_onsets(path: str, onsets: Mapping[int, Mapping[str, Onset]]) -> None:
  """Writes `seed,signal,step,slope,change,noise` rows (atomically; NaN: no onset)."""
  lines = ["seed,signal,step,slope,change,noise\n"]
  for seed, by_signal in sorted(onsets.items()):
    for signal, o in by_signal.items():
      lines.append(f"{seed},{signal},{o.step!r},{o.slope!r},{o.change!r},{o.noise!r}\n")
  fileio.write_atomic(path, "".join(lines))


def format_table(onsets: Mapping[int, Mapping[str, Onset]]) -> str:
  """A plain-text table: one line per seed, the onset step of each signal ('-' for none)."""
  signals = list(SIGNALS)
  lines = ["seed " + " ".join(f"{s:>13}" for s in signals)]
  for seed, by_signal in sorted(onsets.items()):
    cells = [("-" if math.isnan(by_signal[s].step) else f"{by_signal[s].step:.0f}")
             for s in signals]
    lines.append(f"{seed:>4} " + " ".join(f"{c:>13}" for c in cells))
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m sg_jax.analysis.onsets --workdir=W [--sigma=STEPS] [--min_snr=3]`: prints the
  onsets of every seed and writes them to W/onsets.csv. A signal logged at fewer than
  `MIN_POINTS` points is refused in one line."""
  parser = argparse.ArgumentParser(prog="python -m sg_jax.analysis.onsets",
                                   description=main.__doc__)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--sigma", type=float, default=None,
                      help="smoothing in steps (default: 2 x the median gap between steps)")
  parser.add_argument("--min_snr", type=float, default=3.0)
  args = parser.parse_args(argv)
  try:
    found = workdir_onsets(args.workdir, sigma=args.sigma, min_snr=args.min_snr, strict=True)
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"error: {e}")
  path = os.path.join(args.workdir, "onsets.csv")
  write_onsets(path, found)
  print(format_table(found))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
