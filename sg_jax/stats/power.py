"""Minimum detectable effects: the smallest true effect a test finds with probability `power`
(0.8) at level `alpha` (0.05) with the observations it has, so that "not testable at this n" is
a computed outcome rather than a judgement (docs/analysis.md, "Statistics").

Each function returns the effect in the unit of the matching `Test.effect`
(`sg_jax.stats.comparisons`), or inf when no effect in the statistic's range can be found with
that power (e.g. Fisher's exact test on 2 + 2 seeds, whose smallest p-value is 1/3).

* difference of means: the permutation test's simulated power up to 5 + 5 seeds, the two-sample
  t-test's (noncentral t; `statsmodels.stats.power.TTestIndPower`, Cohen 1988 ch. 2) above,
  times the observed pooled SD;
* difference of proportions: the exact power of Fisher's test (every table enumerated), from
  the first arm's proportion;
* Jonckheere-Terpstra tau, stratified Spearman rho: normal approximation with the statistic's
  null variance, (z_{1-alpha/2} + z_{power}) * sd_0;
* log hazard ratio (log-rank): Schoenfeld (1981), (z_{1-alpha/2} + z_{power}) / sqrt(d p (1-p)).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Callable, Sequence

import numpy as np
import scipy.stats
import statsmodels.stats.power

ALPHA = 0.05
POWER = 0.8
ALTERNATIVES = ("two-sided", "less", "greater")


def check_alternative(alternative: str) -> None:
  """Raises ValueError unless `alternative` is 'two-sided', 'less' or 'greater'."""
  if alternative not in ALTERNATIVES:
    raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")


def _z_sum(alpha: float, power: float, alternative: str) -> float:
  sides = 2 if alternative == "two-sided" else 1
  return float(scipy.stats.norm.ppf(1 - alpha / sides) + scipy.stats.norm.ppf(power))


# Up to this many partitions the permutation test's power is simulated (its discreteness costs
# power at small n: at 4 + 4 seeds the t-test's detectable shift has power 0.64 with it).
SIMULATE_LIMIT = 300
SIMULATED_REPLICATES = 2_000


@functools.lru_cache(maxsize=128)
def _permutation_shift(n1: int, n2: int, alpha: float, power: float, sides: int) -> float:
  """The shift (in SD units) of normal data at which the exact permutation test of the
  difference of means has `power`: seeded simulation (`SIMULATED_REPLICATES` normal samples,
  the same draws at every shift), bisection to 0.01 SD; inf when even a shift of 20 SD fails."""
  total = n1 + n2
  combos = np.asarray(list(itertools.combinations(range(total), n2)))
  mask = np.zeros((len(combos), total))
  np.put_along_axis(mask, combos, 1.0, axis=1)  # [C, N] the second arm of each partition
  observed = int(np.flatnonzero((mask[:, n1:].sum(1) == n2))[0])
  z = np.random.default_rng(0).standard_normal((SIMULATED_REPLICATES, total))
  shift_y = (np.arange(total) >= n1).astype(np.float64)

  def reaches(delta: float) -> bool:
    data = z + delta * shift_y
    sum_y = data @ mask.T  # [R, C]
    stat = sum_y / n2 - (data.sum(1, keepdims=True) - sum_y) / n1
    obs = stat[:, observed:observed + 1]
    greater = np.mean(stat >= obs - 1e-9, axis=1)
    p = greater if sides == 1 else np.minimum(
        1.0, 2 * np.minimum(greater, np.mean(stat <= obs + 1e-9, axis=1)))
    return float(np.mean(p <= alpha + 1e-12)) >= power

  low, high = 0.0, 20.0
  if not reaches(high):
    return math.inf
  while high - low > 0.01:
    mid = (low + high) / 2
    low, high = (low, mid) if reaches(mid) else (mid, high)
  return high


def detectable_mean_difference(n1: int, n2: int, sd: float, alpha: float = ALPHA,
                               power: float = POWER, alternative: str = "two-sided") -> float:
  """Smallest |mean(y) - mean(x)| the permutation test of the difference of means
  (`comparisons.compare_means`) detects with `power` at `alpha`, for normal data of SD `sd`.

  With at most `SIMULATE_LIMIT` partitions (up to 5 + 5 seeds) the exact permutation test's
  power is simulated (seeded, `SIMULATED_REPLICATES` samples); above that the two-sample
  t-test's power is used (noncentral t, `statsmodels.stats.power.TTestIndPower`; Cohen 1988,
  ch. 2), which the permutation test's approaches (at 8 + 8 seeds the t-test's shift gives the
  permutation test power 0.79).

  Args:
    n1, n2: observations per arm.
    sd: the common standard deviation (the data's unit); the pooled SD of the observed arms.
    alpha, power: level and power.
    alternative: 'two-sided', 'less' or 'greater'.

  Returns:
    The effect in the unit of `sd`; inf with fewer than 2 observations in an arm or when the
    test cannot reach `alpha` at this n; nan when `sd` is not finite.

  Raises:
    ValueError: unknown `alternative`.
  """
  check_alternative(alternative)
  if n1 < 2 or n2 < 2:
    return math.inf
  if not math.isfinite(sd):
    return math.nan
  sides = 2 if alternative == "two-sided" else 1
  if math.comb(n1 + n2, n1) <= SIMULATE_LIMIT:
    return float(_permutation_shift(n1, n2, alpha, power, sides) * sd)
  d = statsmodels.stats.power.TTestIndPower().solve_power(
      effect_size=None, nobs1=n1, alpha=alpha, power=power, ratio=n2 / n1,
      alternative="two-sided" if sides == 2 else "larger")
  return float(abs(np.ravel(d)[0]) * sd)


@functools.lru_cache(maxsize=256)
def fisher_pvalues(n1: int, n2: int, alternative: str = "two-sided") -> np.ndarray:
  """[n1 + 1, n2 + 1] Fisher's exact p-value (`scipy.stats.fisher_exact`) of every outcome: k1 of
  n1 in the first arm, k2 of n2 in the second; 'greater' means the second arm's proportion is
  the larger (table [[k2, n2 - k2], [k1, n1 - k1]], odds ratio > 1)."""
  check_alternative(alternative)
  out = np.empty((n1 + 1, n2 + 1))
  for k1 in range(n1 + 1):
    for k2 in range(n2 + 1):
      out[k1, k2] = scipy.stats.fisher_exact([[k2, n2 - k2], [k1, n1 - k1]],
                                             alternative=alternative).pvalue
  out.setflags(write=False)
  return out


def fisher_power(n1: int, n2: int, p1: float, p2: np.ndarray, alpha: float = ALPHA,
                 alternative: str = "two-sided") -> np.ndarray:
  """Exact power of Fisher's test: P(p <= alpha) when the arms' true proportions are p1, p2.

  Args:
    n1, n2: seeds per arm.
    p1: the first arm's true proportion.
    p2: [G] the second arm's true proportions.

  Returns:
    [G] the power at each p2 (sum over all (n1 + 1)(n2 + 1) outcomes).
  """
  reject = (fisher_pvalues(n1, n2, alternative) <= alpha + 1e-12).astype(np.float64)
  pmf1 = scipy.stats.binom.pmf(np.arange(n1 + 1), n1, p1)  # [n1 + 1]
  p2 = np.atleast_1d(np.asarray(p2, dtype=np.float64))
  pmf2 = scipy.stats.binom.pmf(np.arange(n2 + 1)[None, :], n2, p2[:, None])  # [G, n2 + 1]
  return pmf2 @ (reject.T @ pmf1)


def detectable_proportion_difference(n1: int, n2: int, p1: float, alpha: float = ALPHA,
                                     power: float = POWER, alternative: str = "two-sided"
                                     ) -> float:
  """Smallest |p2 - p1| at which Fisher's exact test has `power` at `alpha` (exact power,
  `fisher_power`, on a grid of step 0.001), with the first arm's proportion held at `p1`.

  Two-sided: the nearer of the two directions (p2 above or below p1) that reaches `power`;
  'greater' looks only above p1, 'less' only below.

  Returns:
    The difference of proportions (a fraction), or inf when no p2 in [0, 1] reaches `power`
    (e.g. 4 + 4 seeds from p1 = 0.5).

  Raises:
    ValueError: `p1` outside [0, 1], an arm without seeds or an unknown `alternative`.
  """
  check_alternative(alternative)
  if not 0 <= p1 <= 1:
    raise ValueError(f"p1 must be a proportion in [0, 1], got {p1!r}")
  if n1 < 1 or n2 < 1:
    raise ValueError(f"both arms need seeds, got n1={n1}, n2={n2}")
  grid = np.linspace(0.0, 1.0, 1001)
  reached = fisher_power(n1, n2, p1, grid, alpha, alternative) >= power
  best = math.inf
  if alternative in ("two-sided", "greater"):
    up = np.flatnonzero(reached & (grid > p1))
    best = min(best, grid[up[0]] - p1) if up.size else best
  if alternative in ("two-sided", "less"):
    down = np.flatnonzero(reached & (grid < p1))
    best = min(best, p1 - grid[down[-1]]) if down.size else best
  return float(best)


def detectable_trend_tau(sizes: Sequence[int], alpha: float = ALPHA, power: float = POWER,
                         alternative: str = "two-sided") -> float:
  """Smallest |tau| (`comparisons.ordered_trend`'s effect) a Jonckheere-Terpstra test over
  groups of `sizes` detects, by the normal approximation with the null variance of the
  statistic without ties (Hollander & Wolfe 1999, §6.2):
  Var(J) = (N^2 (2N + 3) - sum n_i^2 (2 n_i + 3)) / 72, S = 2J - M, tau = S / M,
  M = sum_{i<j} n_i n_j pairs.

  Returns:
    tau in (0, 1], or inf when it would exceed 1 or there are fewer than two non-empty groups.
  """
  check_alternative(alternative)
  n = np.asarray([s for s in sizes if s > 0], dtype=np.float64)
  if n.size < 2:
    return math.inf
  total = n.sum()
  pairs = (total ** 2 - np.sum(n ** 2)) / 2
  var_j = (total ** 2 * (2 * total + 3) - np.sum(n ** 2 * (2 * n + 3))) / 72
  tau = _z_sum(alpha, power, alternative) * 2 * math.sqrt(var_j) / pairs
  return float(tau) if tau <= 1 else math.inf


def detectable_stratified_rho(sizes: Sequence[int], alpha: float = ALPHA, power: float = POWER,
                              alternative: str = "two-sided") -> float:
  """Smallest |rho| (`comparisons.stratified_association`'s effect: the size-weighted mean of
  within-stratum Spearman correlations) detectable, by the normal approximation with the null
  variance of Spearman's rho, 1 / (n - 1) per stratum (Kendall & Gibbons 1990, ch. 4).

  Args:
    sizes: [K] pairs per stratum (strata with fewer than 3 are not counted).

  Returns:
    rho in (0, 1], or inf when it would exceed 1 or no stratum has 3 pairs.
  """
  check_alternative(alternative)
  n = np.asarray([s for s in sizes if s >= 3], dtype=np.float64)
  if n.size == 0:
    return math.inf
  sd = math.sqrt(np.sum(n ** 2 / (n - 1))) / n.sum()
  rho = _z_sum(alpha, power, alternative) * sd
  return float(rho) if rho <= 1 else math.inf


def detectable_log_hazard_ratio(events: int, fraction_first: float, alpha: float = ALPHA,
                                power: float = POWER, alternative: str = "two-sided") -> float:
  """Smallest |log hazard ratio| a log-rank test detects with `events` events in all, a fraction
  `fraction_first` of the subjects in the first arm (Schoenfeld 1981):
  (z_{1-alpha/2} + z_power) / sqrt(events p (1 - p)).

  Returns:
    The log hazard ratio (natural log), or inf without events or with an empty arm.
  """
  check_alternative(alternative)
  if events <= 0 or not 0 < fraction_first < 1:
    return math.inf
  return float(_z_sum(alpha, power, alternative)
               / math.sqrt(events * fraction_first * (1 - fraction_first)))


def seeds_per_arm(effect: float, detectable: Callable[[int], float], max_n: int = 64,
                  saw_tooth: bool = False) -> int | None:
  """The fewest seeds per arm n at which `detectable(n)` <= |effect|: how many seeds would make an
  effect of this size testable. Doubling from 2 finds an n that reaches it, then bisection (for
  a `detectable` that falls with n), or, with `saw_tooth`, every smaller n in turn: an exact
  test with discrete outcomes has a detectable effect that falls with n in a saw-tooth (the
  exact binomial test against 0.5 detects 0.34 at 15 seeds, 0.35 at 16, 0.31 at 17), where
  bisection could return an n above the fewest.

  Args:
    effect: the effect to detect, in the unit of `detectable`'s result.
    detectable: n -> minimum detectable effect with n seeds per arm, e.g.
      `lambda n: detectable_proportion_difference(n, n, 0.25)`.
    max_n: the largest n tried.
    saw_tooth: `detectable` need not fall monotonically with n (try every n below the first
      power of two that reaches `effect`).

  Returns:
    n, or None when even `max_n` seeds per arm do not reach it (or `effect` is 0 or not finite).
  """
  if not math.isfinite(effect) or effect == 0:
    return None
  ok = lambda n: detectable(n) <= abs(effect)
  low, high = 1, 2
  while not ok(high):
    if high >= max_n:
      return None
    low, high = high, min(2 * high, max_n)
  if saw_tooth:
    return next(n for n in range(2, high + 1) if n == high or ok(n))
  while high - low > 1:  # ok(high), not ok(low)
    mid = (low + high) // 2
    low, high = (low, mid) if ok(mid) else (mid, high)
  return high
