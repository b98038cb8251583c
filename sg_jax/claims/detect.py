"""Minimum detectable effect as a function of the seeds per arm, for the seeds-needed column:
each returns `(n, alpha=ALPHA) -> effect` for `stats.seeds_per_arm` (the spread taken from the
observed runs, the test's own power formula from `sg_jax.stats.power` or `onesample`, power 0.8
at level `alpha`; `registry.seeds_needed` lowers `alpha` for a comparison in a Holm family).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from sg_jax import stats
from sg_jax.claims import onesample

Detectable = Callable[..., float]  # (n, alpha=stats.ALPHA) -> effect


def _sd(values: Sequence[float]) -> float:
  v = np.asarray(values, np.float64)
  v = v[np.isfinite(v)]
  return float(v.std(ddof=1)) if v.size > 1 else math.nan


def paired(x: Sequence[float], y: Sequence[float]) -> Detectable:
  """`onesample.paired_test` with n pairs whose differences spread as `x - y` do (value
  units; inf where the sign-flip test cannot reach alpha)."""
  sd = _sd(np.asarray(x, np.float64) - np.asarray(y, np.float64))
  return lambda n, alpha=stats.ALPHA: onesample.paired_detectable(n, sd, alpha)


def mean_difference(x: Sequence[float], y: Sequence[float]) -> Detectable:
  """`stats.compare_means` with n seeds in each arm and the arms' pooled SD (value units; inf
  while the exact permutation test's smallest p, 2 / C(2n, n), is not below alpha)."""
  a, b = (np.asarray(v, np.float64) for v in (x, y))
  a, b = a[np.isfinite(a)], b[np.isfinite(b)]
  dof = a.size + b.size - 2
  sd = (math.sqrt(((a.size - 1) * _sd(a) ** 2 if a.size > 1 else 0.0)
                  + ((b.size - 1) * _sd(b) ** 2 if b.size > 1 else 0.0)) / math.sqrt(dof)
        if dof > 0 else math.nan)
  return lambda n, alpha=stats.ALPHA: (
      math.inf if 2.0 / math.comb(2 * n, n) >= alpha
      else stats.detectable_mean_difference(n, n, sd, alpha))


def trend(num_groups: int) -> Detectable:
  """`stats.ordered_trend` over `num_groups` groups of n seeds (Kendall-type tau)."""
  return lambda n, alpha=stats.ALPHA: stats.detectable_trend_tau([n] * num_groups, alpha)


def stratified(num_strata: int) -> Detectable:
  """`stats.stratified_association` over `num_strata` strata of n seeds (Spearman rho)."""
  return lambda n, alpha=stats.ALPHA: stats.detectable_stratified_rho([n] * num_strata, alpha)


def proportion(p0: float = 0.5) -> Detectable:
  """`onesample.proportion_test` against `p0` with n seeds (proportion units). The exact
  binomial test's detectable effect is a saw-tooth in n, so the function carries
  `saw_tooth = True` for `registry.seeds_needed`'s search."""
  def detectable(n: int, alpha: float = stats.ALPHA) -> float:
    return onesample.proportion_detectable(n, p0, alpha)
  detectable.saw_tooth = True
  return detectable
