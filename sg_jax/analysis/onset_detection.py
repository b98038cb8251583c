"""The onset of one curve: where it rises, falls or changes most sharply (Chen et al., ICLR 2024,
docs/REFERENCE.md §3; docs/sas.md, "Onsets").

`sg_jax.analysis.onsets` applies `onset` to every signal of every seed of a run.

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

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import signal as scipy_signal

MAX_GRID = 20_000
# The fewest finite points an onset is located from. Step 4 (module docstring) compares the
# change over [onset - 2 sigma, onset + 2 sigma], sigma = 2 median gaps: a window of 8 gaps. A
# curve of fewer than 9 points lies inside one window, so its change cannot be told from its
# noise and the "onset" is wherever the smoothing's edge effects put the largest slope (a
# 3-point loss curve gave step 500 for every seed). Such curves are refused, not guessed.
MIN_POINTS = 9
# what `onset` locates (module docstring)
DIRECTIONS = ("rise", "fall", "change", "peak", "later_fall")


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
