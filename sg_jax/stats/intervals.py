"""Confidence intervals over seeds whose coverage holds at the seed counts sg_jax runs (4-16).

* `mean_interval`: Student's t interval of a seed mean. At n = 4 it covers the true mean of
  normal data 95% of the time (docs/analysis.md, "Statistics", measured in
  tests/stats/test_stats.py); the percentile bootstrap it replaces covers about 78% there.
* `proportion_interval`: Clopper-Pearson ("exact") interval of a proportion (e.g. the seeds above
  a threshold), conservative at every n (Clopper & Pearson 1934; `scipy.stats.binomtest`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
import scipy.stats


@dataclasses.dataclass(frozen=True)
class Interval:
  """A point estimate with its confidence interval.

  Attributes:
    estimate: the point estimate (a mean, a proportion, a median time, ...) in the data's unit.
    low, high: the interval's bounds (nan where the data give none, e.g. one seed; `high` is inf
      for a Kaplan-Meier median whose upper bound was not reached).
    n: observations used (seeds, after dropping non-finite values).
    method: short name for a table header, e.g. "t" or "Clopper-Pearson".
    confidence: the nominal coverage, in (0, 1).
  """
  estimate: float
  low: float
  high: float
  n: int
  method: str
  confidence: float = 0.95

  def label(self, digits: int = 3) -> str:
    """'0.649 [0.520, 0.780]' (`digits` decimals); '0.649' without an interval; '' without an
    estimate."""
    if math.isnan(self.estimate):
      return ""
    fmt = lambda v: f"{v:.{digits}f}" if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    if math.isnan(self.low) or math.isnan(self.high):
      return fmt(self.estimate)
    return f"{fmt(self.estimate)} [{fmt(self.low)}, {fmt(self.high)}]"

  @property
  def header(self) -> str:
    """'95% t-CI, n=4': the method and n, for a table header or a legend."""
    return f"{self.confidence:.0%} {self.method} CI, n={self.n}"


def finite(values: Sequence[float]) -> np.ndarray:
  """[n] the finite float64 entries of `values` (None, nan and inf dropped)."""
  v = np.asarray([np.nan if x is None else x for x in np.ravel(np.asarray(values, dtype=object))],
                 dtype=np.float64)
  return v[np.isfinite(v)]


def _check_confidence(confidence: float) -> None:
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
  """Seed mean with Student's t confidence interval: mean +- t_{n-1} s / sqrt(n).

  Args:
    values: [S] one value per seed; non-finite entries (seeds without the value) are dropped.
    confidence: nominal coverage, in (0, 1).

  Returns:
    Interval(method="t"). With one finite value the bounds are nan (no interval from one seed);
    with none all fields are nan and n = 0; equal values give a zero-width interval.

  Raises:
    ValueError: `confidence` outside (0, 1).
  """
  _check_confidence(confidence)
  v = finite(values)
  if v.size == 0:
    return Interval(math.nan, math.nan, math.nan, 0, "t", confidence)
  mean = float(v.mean())
  if v.size == 1:
    return Interval(mean, math.nan, math.nan, 1, "t", confidence)
  half = float(scipy.stats.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1)
               / math.sqrt(v.size))
  return Interval(mean, mean - half, mean + half, int(v.size), "t", confidence)


def mean_intervals(samples: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, ...]:
  """`mean_interval` of many samples at once (e.g. simulated replicates), vectorised.

  Args:
    samples: [R, n] R samples of n finite values each (n >= 2).
    confidence: nominal coverage, in (0, 1).

  Returns:
    (mean, low, high), each [R].

  Raises:
    ValueError: `samples` not 2-D with n >= 2, or `confidence` outside (0, 1).
  """
  _check_confidence(confidence)
  samples = np.asarray(samples, dtype=np.float64)
  if samples.ndim != 2 or samples.shape[1] < 2:
    raise ValueError(f"samples must be [R, n] with n >= 2, got shape {samples.shape}")
  n = samples.shape[1]
  mean = samples.mean(axis=1)
  half = scipy.stats.t.ppf(0.5 + confidence / 2, n - 1) * samples.std(axis=1, ddof=1) / math.sqrt(n)
  return mean, mean - half, mean + half


def proportion_interval(k: int, n: int, confidence: float = 0.95) -> Interval:
  """k of n with its Clopper-Pearson interval (`scipy.stats.binomtest(...).proportion_ci`,
  method 'exact'), e.g. the seeds whose final generalisation exceeds a threshold.

  Args:
    k: successes (seeds), 0 <= k <= n.
    n: trials (seeds); n = 0 gives an all-nan Interval.
    confidence: nominal coverage, in (0, 1).

  Returns:
    Interval(estimate=k / n, method="Clopper-Pearson").

  Raises:
    ValueError: k or n negative or not integers, k > n, or `confidence` outside (0, 1).
  """
  _check_confidence(confidence)
  if int(k) != k or int(n) != n or not 0 <= k <= n:
    raise ValueError(f"need integers 0 <= k <= n, got k={k!r}, n={n!r}")
  k, n = int(k), int(n)
  if n == 0:
    return Interval(math.nan, math.nan, math.nan, 0, "Clopper-Pearson", confidence)
  ci = scipy.stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
  return Interval(k / n, float(ci.low), float(ci.high), n, "Clopper-Pearson", confidence)
