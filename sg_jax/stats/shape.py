"""The shape of a seed distribution: Sarle's bimodality coefficient, and whether it can signal at
all at a given number of seeds."""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import scipy.stats

from sg_jax.stats.intervals import finite

# b above this (the value of a uniform distribution) suggests two modes (Pfister et al. 2013).
SARLE_THRESHOLD = 5 / 9


def sarle_bimodality(values: Sequence[float]) -> float:
  """Sarle's bimodality coefficient b = (g^2 + 1) / (k + 3 (n-1)^2 / ((n-2)(n-3))).

  g is the sample skewness and k the sample excess kurtosis, both bias-corrected
  (SAS Institute 1990; Pfister et al. 2013, "Good things peak in pairs"). b > 5/9 suggests two
  modes, e.g. seeds that generalise next to seeds stuck on a linear rule; it can only do so
  from 6 values on (`sarle_signals`).

  Args:
    values: [S] one value per seed (non-finite dropped).

  Returns:
    b, unitless; nan with fewer than 4 finite values or when all values are equal.
  """
  v = finite(values)
  n = v.size
  if n < 4 or np.all(v == v[0]):
    return math.nan
  g = scipy.stats.skew(v, bias=False)
  k = scipy.stats.kurtosis(v, fisher=True, bias=False)
  return float((g ** 2 + 1) / (k + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))))


@functools.lru_cache(maxsize=None)
def sarle_max(n: int) -> float:
  """The largest Sarle coefficient any n values can have: attained by two-point samples (for
  population moments b <= 1 with equality only for two points, Pearson's kurtosis >= skewness^2
  + 1; tests/stats/test_stats.py checks the sample version against a numerical search), so the
  maximum over the n - 1 splits of n values into two points. 2/7 at n = 4, 6/13 at 5, 4/7 at 6.

  Returns:
    the maximum (nan for n < 4).
  """
  if n < 4:
    return math.nan
  return max(sarle_bimodality([0.0] * m + [1.0] * (n - m)) for m in range(1, n))


def sarle_signals(n: int) -> bool:
  """Whether Sarle's coefficient of n values can exceed 5/9 at all (False for n < 6): below that
  a table shows the count of seeds per final rule instead."""
  return n >= 4 and sarle_max(n) > SARLE_THRESHOLD
