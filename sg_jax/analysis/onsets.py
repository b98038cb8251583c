"""Onsets of a training run, per seed (Chen et al., ICLR 2024, docs/REFERENCE.md §3;
docs/sas.md, "Onsets").

Chen et al. see syntactic attention structure appear abruptly ("structure onset", the sharpest
rise of UAS) together with a sudden drop of the loss, and capabilities follow ("capabilities
onset"). `seed_onsets` finds, for every seed of a workdir:

* `structure`: the sharpest rise of `in_domain/uas` (metrics.csv; `uas` of analysis.csv when
  the run logged none);
* `loss_drop`: the steepest fall of `train/loss` (in practice the initial descent, which every
  run has; it cannot test whether structure arrives with a *later* drop);
* `later_loss_drop`: the largest drop of `train/loss` after the initial descent (`later_fall`,
  below), NaN when the loss only decelerates;
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

**A drop after the initial descent** (`later_fall`; `later_drop`). Chen et al. (ICLR 2024,
abstract, §3, Fig. 1) see the structure onset "concurrent with a steep drop in loss" but give no
rule for the drop, and their released code (github.com/angie-chen55/sudden-drops-in-the-loss:
pre-training with the regulariser, attention extraction, the dependency probe) locates none. The steepest
fall of a loss curve is its initial descent, so sg_jax uses a documented rule of its own, the
steepest fall after the first plateau:

1. the curve is log(loss) (a drop is a relative change; values must be > 0), smoothed as in
   steps 1-2 above; its steepness v(t) = -d log L / dt;
2. the candidate drops are the local maxima of v (`scipy.signal.find_peaks`; the first grid
   point counts when v falls from there, the last one never: a fall still steepening at the end
   of the run is not located);
3. the initial descent is the first candidate whose fall over [t - 2 sigma, t + 2 sigma] is at
   least `min_snr` x the noise (the test of step 4 above);
4. each later candidate t_k is measured against the plateau before it: v_p = max(0, min of v
   between the initial descent and t_k), at step t_p. Its excess fall is the smoothed log-loss
   fall over [max(t_k - 2 sigma, t_p), min(t_k + 2 sigma, t_n)] minus v_p times the window's
   length, where t_n is the lowest-v step between t_k and the next candidate (or the end): how
   much more the loss fell than the plateau's own rate would give;
5. the drop is the candidate of the largest excess, kept if that is at least `min_snr` x the
   noise (1.4826 MAD of the raw log-loss around the smoothed one); otherwise none.

A loss that only decelerates (an exponential or a power-law decay: v falls monotonically) has
no later drop, whatever its noise; a plateau followed by a sigmoid drop has it at the drop's
midpoint (tests/analysis/test_onsets.py).

**Resolution** (`Onset.resolution`, `compare`). An onset is located no finer than the curve's
spacing and its smoothing: its resolution is max(the gap between the curve's points around the
onset, sigma) steps (2 gaps with the default sigma on an even grid). Two onsets are ordered
(`compare`) only when they differ by more than the coarser of their two resolutions; otherwise
they are tied at this resolution.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Mapping, Sequence

import numpy as np
from scipy import signal as scipy_signal

from sg_jax.records import fileio
from sg_jax.records import long_csv

MAX_GRID = 20_000
# The fewest finite points an onset is located from. Step 4 compares the change over
# [onset - 2 sigma, onset + 2 sigma], sigma = 2 median gaps: a window of 8 gaps. A curve of
# fewer than 9 points lies inside one window, so its change cannot be told from its noise and
# the "onset" is wherever the smoothing's edge effects put the largest slope (a 3-point loss curve
# gave step 500 for every seed). Such curves are refused, not guessed.
MIN_POINTS = 9
# what `onset` locates (module docstring)
DIRECTIONS = ("rise", "fall", "change", "peak", "later_fall")
SIGNALS = {  # name -> (metric names, first present is used; direction)
    "structure": (("in_domain/uas", "uas"), "rise"),
    "loss_drop": (("train/loss",), "fall"),
    "later_loss_drop": (("train/loss",), "later_fall"),
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
    slope: the smoothed slope there (value units per step; `later_fall`: log units per step).
    change: the smoothed change over [step - 2 sigma, step + 2 sigma], or a peak's height
      (value units); `later_fall`: minus the excess fall of the log-loss (module docstring).
    noise: 1.4826 x median absolute deviation of the raw values from the smoothed curve
      (`later_fall`: of the log values).
    resolution: max(the gap between the curve's points around `step`, sigma), in steps: two
      onsets closer than the coarser of their resolutions are not ordered (`compare`).
  """

  step: float
  slope: float
  change: float
  noise: float
  resolution: float = math.nan


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


def resolution_at(steps: Sequence[float], step: float, sigma: float) -> float:
  """How finely an onset at `step` is located: max(gap, sigma) steps, the gap being the larger
  of the gaps between the curve's points on either side of `step` (the gap of the interval
  holding it when `step` falls between two points).

  Args:
    steps: [T] strictly increasing steps of the curve's finite points (T >= 2).
    step: the onset step (NaN gives NaN).
    sigma: the smoothing used, in steps.

  Returns:
    the resolution in steps.
  """
  s = np.asarray(steps, np.float64)
  if not math.isfinite(step) or s.size < 2:
    return math.nan
  left = int(np.searchsorted(s, step, side="left")) - 1  # last point strictly before
  right = int(np.searchsorted(s, step, side="right"))  # first point strictly after
  gaps = []
  if left >= 0:
    gaps.append(s[left + 1] - s[left])
  if right < s.size:
    gaps.append(s[right] - s[right - 1])
  return float(max(max(gaps), sigma))


def compare(a: Onset, b: Onset) -> int | None:
  """The order of two onsets at their resolution (module docstring, "Resolution").

  Returns:
    -1 when `a` comes first by more than the coarser of the two resolutions, 1 when `b` does,
    0 when they are tied at this resolution, None when either has no onset. A NaN resolution
    counts as 0 (a hand-made `Onset` without one).
  """
  if not (math.isfinite(a.step) and math.isfinite(b.step)):
    return None
  r = max(np.nan_to_num(a.resolution), np.nan_to_num(b.resolution))
  if b.step - a.step > r:
    return -1
  if a.step - b.step > r:
    return 1
  return 0


def _window(grid: np.ndarray, k: int, half: float, lo_floor: int = 0,
            hi_ceiling: int | None = None) -> tuple[int, int]:
  """Grid indices of [grid[k] - half, grid[k] + half], clipped to [lo_floor, hi_ceiling]."""
  hi_ceiling = grid.size - 1 if hi_ceiling is None else hi_ceiling
  lo = max(int(np.searchsorted(grid, grid[k] - half)), lo_floor)
  hi = min(int(np.searchsorted(grid, grid[k] + half, side="right")) - 1, hi_ceiling)
  return lo, hi


def later_drop(grid: np.ndarray, curve: np.ndarray, half: float, noise: float,
               min_snr: float) -> tuple[int, float] | None:
  """Steps 2-5 of the drop after the initial descent (module docstring).

  Args:
    grid: [G] uniform grid steps.
    curve: [G] the smoothed log-loss on the grid.
    half: the half-width of the window, in steps (2 sigma, at least 2 grid spacings).
    noise: the noise of the raw log-loss (1.4826 MAD of its residuals).
    min_snr: a fall counts when it is at least min_snr x noise.

  Returns:
    (grid index of the drop, its excess fall in log units), or None when there is none.
  """
  if grid.size < 3:
    return None
  steep = -np.gradient(curve, grid)
  # A left-edge maximum counts (the loss is steepest at its first point); a right-edge one not.
  peaks = scipy_signal.find_peaks(np.concatenate([[-np.inf], steep]))[0] - 1
  threshold = min_snr * noise
  initial = None
  for p in peaks:
    lo, hi = _window(grid, p, half)
    if curve[lo] - curve[hi] >= threshold and curve[lo] > curve[hi]:
      initial = int(p)
      break
  if initial is None:
    return None
  later = [int(p) for p in peaks if p > initial]
  best = None
  for i, p in enumerate(later):
    valley = initial + int(np.argmin(steep[initial:p + 1]))
    plateau = max(0.0, float(steep[valley]))
    end = later[i + 1] if i + 1 < len(later) else grid.size - 1
    after = p + int(np.argmin(steep[p:end + 1]))
    lo, hi = _window(grid, p, half, valley, after)
    excess = float(curve[lo] - curve[hi]) - plateau * float(grid[hi] - grid[lo])
    if excess > 0 and excess >= threshold and (best is None or excess > best[1]):
      best = (p, excess)
  return best


def onset(steps: Sequence[float], values: Sequence[float], direction: str = "rise", *,
          sigma: float | None = None, min_snr: float = 3.0) -> Onset:
  """The step of the sharpest rise (steepest fall, largest change, peak, drop after the initial
  descent) of a curve (module docstring).

  Args:
    steps: [T] strictly increasing steps.
    values: [T] values (`later_fall`: a loss, > 0 where finite).
    direction: one of `DIRECTIONS`: 'rise', 'fall', 'change' (either), 'peak' or 'later_fall'
      (the largest drop of log(values) after the initial descent).
    sigma: smoothing in steps (None: 2 x the median gap between steps).
    min_snr: the smoothed change around the onset must be >= min_snr x the noise.

  Returns:
    an `Onset` (`NO_ONSET` when the change is not above the noise), with its resolution.

  Raises:
    ValueError: unknown direction, a value <= 0 for 'later_fall', or as `smooth`.
  """
  if direction not in DIRECTIONS:
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
  values = np.asarray(values, np.float64)
  if direction == "later_fall":
    finite = values[np.isfinite(values)]
    if np.any(finite <= 0):
      raise ValueError(f"a later_fall onset reads log(values), so values must be > 0; got "
                       f"{float(finite.min())!r}")
    with np.errstate(divide="ignore", invalid="ignore"):
      values = np.log(values)
  grid, curve, sigma = smooth(steps, values, sigma)
  slope = np.gradient(curve, grid) if grid.size > 1 else np.zeros(1)
  s = np.asarray(steps, np.float64)
  keep = np.isfinite(values)
  residual = values[keep] - np.interp(s[keep], grid, curve)
  noise = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
  half = max(2 * sigma, 2 * (grid[1] - grid[0]) if grid.size > 1 else 0.0)
  if direction == "later_fall":
    found = later_drop(grid, curve, half, noise, min_snr)
    if found is None:
      return NO_ONSET
    k, excess = found
    return Onset(step=float(grid[k]), slope=float(slope[k]), change=-excess, noise=noise,
                 resolution=resolution_at(s[keep], float(grid[k]), sigma))
  if direction == "peak":
    k = int(np.argmax(curve))
    drops = [curve[k] - side.min() for side in (curve[:k], curve[k + 1:]) if side.size]
    change = float(min(drops)) if drops else 0.0
  else:
    k = int(np.argmax({"rise": slope, "fall": -slope, "change": np.abs(slope)}[direction]))
    lo, hi = _window(grid, k, half)
    change = float(curve[hi] - curve[lo])
  signed = -change if direction == "fall" else abs(change) if direction == "change" else change
  if not signed > 0 or signed < min_snr * noise:
    return NO_ONSET
  return Onset(step=float(grid[k]), slope=float(slope[k]), change=change, noise=noise,
               resolution=resolution_at(s[keep], float(grid[k]), sigma))


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
  """Writes `seed,signal,step,slope,change,noise,resolution` rows (atomically; NaN: no
  onset)."""
  lines = ["seed,signal,step,slope,change,noise,resolution\n"]
  for seed, by_signal in sorted(onsets.items()):
    for signal, o in by_signal.items():
      lines.append(f"{seed},{signal},{o.step!r},{o.slope!r},{o.change!r},{o.noise!r},"
                   f"{o.resolution!r}\n")
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
