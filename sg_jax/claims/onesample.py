"""Tests the claims need beside `sg_jax.stats`: a paired (sign-flip) permutation test and an
exact binomial test of a proportion, each with its minimum detectable effect at its n.

Both return `stats.Test` (name, statistic, p, n, effect, detectable, alternative, min_p), so the
decision rules of `registry.decide` read them like the contract's two-sample tests.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import scipy.optimize
import scipy.stats
from statsmodels.stats import power as sm_power

from sg_jax import stats

ALPHA = 0.05
POWER = 0.8


def _finite_pairs(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape or x.ndim != 1:
    raise ValueError(f"paired_test needs two 1-d arrays of one length, got {x.shape} and "
                     f"{y.shape}")
  keep = np.isfinite(x) & np.isfinite(y)
  return x[keep], y[keep]


def paired_detectable(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
  """The smallest mean paired difference a two-sided test at `alpha` detects with `power` at n
  pairs whose differences have standard deviation `sd` (the paired t-test's power, statsmodels
  `TTestPower`, which the sign-flip test's approaches; Lehmann 1975 ch. 2): value units.
  Infinite when n < 2, and when the exact sign-flip test cannot reach `alpha` at n
  (2 / 2^n >= alpha, i.e. n <= 5)."""
  if n < 2 or 2.0 / 2.0**n >= alpha or not math.isfinite(sd):
    return math.inf
  d = sm_power.TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power,
                                        alternative="two-sided")
  # statsmodels' fallback root finder returns a 1-element array, sometimes the negative root
  # (e.g. n = 73 at alpha 0.05), where its first one fails
  return float(abs(np.ravel(d)[0]) * sd)


def paired_test(x: Sequence[float], y: Sequence[float], shift: float = 0.0) -> stats.Test:
  """Exact sign-flip permutation test of the mean of `x - y - shift` against 0 (pairs with a
  NaN dropped): every one of the 2^n sign assignments for n <= 16, else 100,000 Monte Carlo
  draws with a fixed seed (scipy.stats.permutation_test, permutation_type="samples";
  Fisher 1935).

  Args:
    x, y: float [seeds] per-seed values, paired by position (e.g. final and early-stopping
      generalisation of the same seed).
    shift: the difference under the null hypothesis (e.g. a minimum gain).

  Returns:
    `stats.Test`: statistic = effect = mean(x - y) - shift (value units), p two-sided, n =
    (pairs,), detectable = `paired_detectable` (same units), min_p = 2 / 2^n.

  Raises:
    ValueError: `x` and `y` differ in shape, or fewer than 2 finite pairs.
  """
  x, y = _finite_pairs(x, y)
  n = x.size
  if n < 2:
    raise ValueError(f"paired_test needs at least 2 finite pairs, got {n}")
  d = x - y - shift
  effect = float(d.mean())
  if np.all(d == 0):
    p = 1.0
  else:
    res = scipy.stats.permutation_test(
        (d,), lambda a, axis: np.mean(a, axis=axis), permutation_type="samples",
        vectorized=True, n_resamples=np.inf if n <= 16 else 100_000,
        alternative="two-sided", random_state=0)
    p = float(res.pvalue)
  sd = float(np.std(x - y, ddof=1)) if n > 1 else math.nan
  return stats.Test(name="sign-flip permutation (paired mean)", statistic=effect, p=p, n=(n,),
                    effect=effect, detectable=paired_detectable(n, sd), min_p=2.0 / 2.0**n)


def proportion_detectable(n: int, p0: float = 0.5, alpha: float = ALPHA,
                          power: float = POWER) -> float:
  """The smallest true proportion above `p0` that the exact two-sided binomial test at `alpha`
  rejects with probability >= `power` at n trials, minus `p0` (so in proportion units);
  infinite when no outcome of n trials reaches `alpha`. Exact (scipy.stats.binom)."""
  ks = np.arange(n + 1)
  pvalues = np.array([scipy.stats.binomtest(int(k), n, p0).pvalue for k in ks])
  reject = ks[(pvalues < alpha) & (ks > n * p0)]
  if not reject.size:
    return math.inf
  k_min = int(reject.min())
  reach = lambda q: scipy.stats.binom.sf(k_min - 1, n, q) - power
  if reach(1.0) < 0:
    return math.inf
  return float(scipy.optimize.brentq(reach, p0, 1.0) - p0)


def proportion_test(k: int, n: int, p0: float = 0.5) -> stats.Test:
  """Exact two-sided binomial test of k successes in n trials against proportion `p0`
  (scipy.stats.binomtest; Clopper-Pearson is its interval, `stats.proportion_interval`).

  Returns:
    `stats.Test`: statistic = k / n, effect = k / n - p0, detectable =
    `proportion_detectable`, min_p = the p of k = n.

  Raises:
    ValueError: n < 1 or k outside [0, n].
  """
  if n < 1 or not 0 <= k <= n:
    raise ValueError(f"proportion_test needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
  p = float(scipy.stats.binomtest(int(k), int(n), p0).pvalue)
  return stats.Test(name="exact binomial", statistic=k / n, p=p, n=(n,), effect=k / n - p0,
                    detectable=proportion_detectable(n, p0),
                    min_p=float(scipy.stats.binomtest(n, n, p0).pvalue))
