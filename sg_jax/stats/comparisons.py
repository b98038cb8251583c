"""Exact and permutation tests on seeds, each with its minimum detectable effect.

A `Test` carries what a verdict needs besides its p-value: the observed effect, the smallest
effect the test could find at this n (alpha 0.05, power 0.8; `sg_jax.stats.power`) and the
smallest p-value the test can give at this n at all. `Test.testable` is False when the test
cannot reach p <= 0.05 whatever the data (e.g. a permutation test on 2 + 2 seeds, min p 1/3) or
no effect in the statistic's range is detectable with power 0.8: a claim is then "not testable at
this n", not "contradicted".

* `compare_proportions`: Fisher's exact test (`scipy.stats.fisher_exact`);
* `compare_means`: permutation test of the difference of means (`scipy.stats.permutation_test`,
  exact enumeration up to `EXACT_LIMIT` partitions, else `num_resamples` seeded draws);
* `ordered_trend`: Jonckheere-Terpstra over ordered groups (Jonckheere 1954; Terpstra 1952),
  its null distribution by reassigning the seeds to the groups (exact up to `EXACT_LIMIT`
  assignments, else seeded draws);
* `stratified_association`: the size-weighted mean of within-stratum Spearman correlations,
  its null distribution by permuting y within each stratum (exact when the product of the
  strata's n! is at most `EXACT_LIMIT`, else seeded draws).

Two-sided p-values are twice the smaller one-sided tail, capped at 1 (scipy's definition for
permutation tests), so every test here reads the same way. Monte Carlo p-values use
(count + 1) / (draws + 1) and a fixed seed: a report is reproducible.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import numpy as np
import scipy.special
import scipy.stats

from sg_jax.stats import power as power_lib
from sg_jax.stats.intervals import finite

ALPHA = power_lib.ALPHA
# Permutation tests enumerate every arrangement up to this many, else draw `NUM_RESAMPLES`.
EXACT_LIMIT = 100_000
NUM_RESAMPLES = 9_999
# Relative tolerance when comparing a permuted statistic with the observed one (float sums).
_GAMMA = 1e-12


@dataclasses.dataclass(frozen=True)
class Test:
  """The outcome of a test between arms (seed groups).

  Attributes:
    name: the test, e.g. "Fisher exact", "permutation (difference of means)".
    statistic: the test statistic (its unit depends on the test; see each function).
    p: the p-value (two-sided unless `alternative` says otherwise); nan when untestable data.
    n: observations per arm (per group, per stratum).
    effect: the observed effect, in the unit of `detectable`.
    detectable: the minimum detectable effect at alpha 0.05, power 0.8 at this n (same unit);
      inf when no effect in the statistic's range reaches that power.
    alternative: 'two-sided', 'less' or 'greater'.
    min_p: the smallest p-value the test can give at this n (exact and permutation tests; 0 for
      asymptotic tests).
  """
  name: str
  statistic: float
  p: float
  n: tuple[int, ...]
  effect: float
  detectable: float
  alternative: str = "two-sided"
  min_p: float = 0.0

  @property
  def testable(self) -> bool:
    """Whether the test can reject at 0.05 at this n and some effect is detectable with power
    0.8 (False: "not testable at this n")."""
    return self.min_p <= ALPHA and math.isfinite(self.detectable)

  def label(self) -> str:
    """'effect +0.25, p 0.029 (detectable 0.31)' or '... not testable at n = 2 vs 2'."""
    effect = f"effect {self.effect:+.3g}" if math.isfinite(self.effect) else "effect n/a"
    if not self.testable:
      sizes = " vs ".join(map(str, self.n))
      return f"{effect}, not testable at n = {sizes} (min p {self.min_p:.2g})"
    return f"{effect}, p {self.p:.2g} (detectable {self.detectable:.3g})"


def _two_sided(less: float, greater: float, alternative: str) -> float:
  if alternative == "less":
    return less
  if alternative == "greater":
    return greater
  return min(1.0, 2 * min(less, greater))


def compare_proportions(k1: int, n1: int, k2: int, n2: int,
                        alternative: str = "two-sided") -> Test:
  """Fisher's exact test of k1 of n1 against k2 of n2 (e.g. seeds above a threshold per arm).

  Args:
    k1, n1: successes and seeds of the first (reference) arm.
    k2, n2: successes and seeds of the second arm.
    alternative: 'greater': the second arm's proportion is the larger; 'less': the smaller.

  Returns:
    Test(name="Fisher exact", statistic=the sample odds ratio (arm 2 over arm 1),
    effect=k2/n2 - k1/n1, detectable=`power.detectable_proportion_difference` from p1 = k1/n1,
    min_p=the smallest p over every outcome of n1 and n2 seeds).

  Raises:
    ValueError: counts not integers with 0 <= k <= n, an empty arm, or an unknown alternative.
  """
  power_lib.check_alternative(alternative)
  for k, n in ((k1, n1), (k2, n2)):
    if int(k) != k or int(n) != n or not 0 <= k <= n or n == 0:
      raise ValueError(f"need integers 0 <= k <= n with n >= 1, got k={k!r}, n={n!r}")
  k1, n1, k2, n2 = int(k1), int(n1), int(k2), int(n2)
  table = power_lib.fisher_pvalues(n1, n2, alternative)
  result = scipy.stats.fisher_exact([[k2, n2 - k2], [k1, n1 - k1]], alternative=alternative)
  min_p = float(table.min())
  detectable = power_lib.detectable_proportion_difference(n1, n2, k1 / n1,
                                                          alternative=alternative)
  return Test("Fisher exact", float(result.statistic), float(result.pvalue), (n1, n2),
              k2 / n2 - k1 / n1, detectable if min_p <= ALPHA else math.inf, alternative, min_p)


def _floor(count: float, exact: bool, num_resamples: int, alternative: str) -> float:
  """The smallest p-value a permutation test can give: 1 / count arrangements one-sided (the
  most extreme arrangement, distinct values), doubled two-sided; a Monte Carlo test cannot go
  below (1 / (draws + 1)) either."""
  sides = 2 if alternative == "two-sided" else 1
  floor = sides / count
  if not exact:
    floor = max(floor, sides / (num_resamples + 1))
  return min(1.0, floor)


def compare_means(x: Sequence[float], y: Sequence[float], alternative: str = "two-sided",
                  num_resamples: int = NUM_RESAMPLES, seed: int = 0) -> Test:
  """Permutation test of mean(y) - mean(x) (seeds reassigned between the arms).

  Exact over all C(n1 + n2, n1) partitions when there are at most `EXACT_LIMIT`, else
  `num_resamples` draws seeded with `seed` (`scipy.stats.permutation_test`).

  Args:
    x: [n1] values of the first (reference) arm; non-finite dropped.
    y: [n2] values of the second arm; non-finite dropped.
    alternative: 'greater': mean(y) > mean(x); 'less': mean(y) < mean(x).

  Returns:
    Test(name="permutation (difference of means)", statistic=effect=mean(y) - mean(x),
    detectable=`power.detectable_mean_difference` with the pooled SD). With an empty arm p and
    effect are nan and the test is not testable.

  Raises:
    ValueError: unknown alternative.
  """
  power_lib.check_alternative(alternative)
  x, y = finite(x), finite(y)
  name = "permutation (difference of means)"
  if x.size == 0 or y.size == 0:
    return Test(name, math.nan, math.nan, (int(x.size), int(y.size)), math.nan, math.inf,
                alternative, 1.0)
  count = scipy.special.comb(x.size + y.size, x.size, exact=True)
  exact = count <= EXACT_LIMIT
  effect = float(y.mean() - x.mean())
  min_p = _floor(count, exact, num_resamples, alternative)
  pooled = np.concatenate([x, y])
  if np.ptp(pooled) == 0:
    p = 1.0
  elif min(x.size, y.size) == 1:  # scipy needs 2 per arm: the N partitions by hand
    single = 0 if x.size == 1 else 1
    total = pooled.sum()
    one = pooled  # the single seed's arm holds each value in turn
    rest = (total - one) / (pooled.size - 1)
    null = rest - one if single == 0 else one - rest
    p = _p_value(null, effect, True, alternative)
  else:
    p = float(scipy.stats.permutation_test(
        (x, y), lambda a, b, axis: np.mean(b, axis=axis) - np.mean(a, axis=axis),
        permutation_type="independent", vectorized=True,
        n_resamples=count if exact else num_resamples, alternative=alternative,
        rng=np.random.default_rng(seed)).pvalue)
  dof = x.size + y.size - 2
  sd = (math.sqrt(((x.size - 1) * x.var(ddof=1) if x.size > 1 else 0.0)
                  + ((y.size - 1) * y.var(ddof=1) if y.size > 1 else 0.0)) / math.sqrt(dof)
        if dof > 0 else math.nan)
  detectable = (power_lib.detectable_mean_difference(x.size, y.size, sd, alternative=alternative)
                if min_p <= ALPHA else math.inf)
  return Test(name, effect, p, (int(x.size), int(y.size)), effect, detectable, alternative, min_p)


def _arrangements(sizes: Sequence[int]) -> np.ndarray:
  """[count, N] every distinct assignment of group labels 0..G-1 (group g used sizes[g] times)
  to N = sum(sizes) positions: the multinomial count of them."""
  total = sum(sizes)
  rows = np.full((1, total), -1, dtype=np.int8)
  for g, n in enumerate(sizes):
    free = np.argsort(rows != -1, axis=1, kind="stable")[:, :int(np.sum(rows[0] == -1))]
    combos = np.asarray(list(itertools.combinations(range(free.shape[1]), n)), dtype=np.int64)
    chosen = free[:, combos]  # [R, c, n] positions of group g
    rows = np.repeat(rows, len(combos), axis=0)
    np.put_along_axis(rows, chosen.reshape(len(rows), n), np.int8(g), axis=1)
  return rows


def _jt_null(labels: np.ndarray, values: np.ndarray) -> np.ndarray:
  """[B] S = sum over pairs of seeds (a, b) of sign(label_b - label_a) sign(value_b - value_a)
  (concordant minus discordant between-group pairs) for each row of `labels` [B, N] of group
  labels 0..G-1: with the seeds sorted by value, each seed is paired with the seeds of strictly
  smaller value (earlier tie blocks), counted per label by a cumulative sum, O(B N G)."""
  order = np.argsort(values, kind="stable")
  v = values[order]
  lab = labels[:, order].astype(np.int64)  # [B, N]
  num_groups = int(labels.max()) + 1
  block_start = np.searchsorted(v, v, side="left")  # [N] first position of each tie block
  out = np.empty(len(lab))
  for start in range(0, len(lab), 5_000):
    chunk = lab[start:start + 5_000]
    onehot = (chunk[:, :, None] == np.arange(num_groups)).astype(np.float64)  # [b, N, G]
    before = np.concatenate([np.zeros_like(onehot[:, :1]), np.cumsum(onehot, axis=1)], axis=1)
    smaller = before[:, block_start, :]  # [b, N, G] seeds of smaller value, per label
    direction = np.sign(chunk[:, :, None] - np.arange(num_groups))  # [b, N, G]
    out[start:start + 5_000] = np.sum(smaller * direction, axis=(1, 2))
  return out


def ordered_trend(groups: Sequence[Sequence[float]], alternative: str = "two-sided",
                  num_resamples: int = NUM_RESAMPLES, seed: int = 0) -> Test:
  """Jonckheere-Terpstra test for a monotone trend over ordered groups (e.g. seeds per depth).

  The statistic counts, over every pair of groups i < j and every value a of group i and b of
  group j, the pairs with a < b (ties count 1/2): J. Its effect is the Kendall-type
  tau = S / M in [-1, 1], S = 2J - M the concordant minus discordant pairs, M = sum_{i<j} n_i n_j;
  tau = 1 when every value of a later group exceeds every value of an earlier one. The null
  distribution reassigns the seeds to the groups (group sizes kept): every distinct assignment
  when there are at most `EXACT_LIMIT` (the multinomial count), else `num_resamples` seeded
  draws. scipy has no Jonckheere-Terpstra test; tests/stats/test_stats.py checks this one against a
  loop over all assignments.

  Args:
    groups: [G][n_g] per-seed values of each group, in the factor's order (non-finite dropped;
      empty groups left out).
    alternative: 'greater': values rise along the order; 'less': they fall.
    num_resamples, seed: Monte Carlo draws and their seed when not exact.

  Returns:
    Test(name="Jonckheere-Terpstra", statistic=J, effect=tau, detectable=
    `power.detectable_trend_tau`). Fewer than two non-empty groups: p nan, not testable.

  Raises:
    ValueError: unknown alternative.
  """
  power_lib.check_alternative(alternative)
  kept = [finite(g) for g in groups]
  kept = [g for g in kept if g.size]
  sizes = tuple(int(g.size) for g in kept)
  name = "Jonckheere-Terpstra"
  if len(kept) < 2:
    return Test(name, math.nan, math.nan, sizes, math.nan, math.inf, alternative, 1.0)
  pairs = (sum(sizes) ** 2 - sum(n * n for n in sizes)) // 2
  count = math.factorial(sum(sizes))
  for n in sizes:
    count //= math.factorial(n)
  exact = count <= EXACT_LIMIT
  values = np.concatenate(kept)
  observed_labels = np.repeat(np.arange(len(sizes), dtype=np.int8), sizes)
  s_obs = float(_jt_null(observed_labels[None, :], values)[0])
  if exact:
    labels = _arrangements(sizes)
  else:
    rng = np.random.default_rng(seed)
    labels = observed_labels[np.argsort(rng.random((num_resamples, values.size)), axis=1)]
  null = _jt_null(labels, values)
  p = _p_value(null, s_obs, exact, alternative)
  min_p = _floor(count, exact, num_resamples, alternative)
  detectable = (power_lib.detectable_trend_tau(sizes, alternative=alternative)
                if min_p <= ALPHA else math.inf)
  return Test(name, (s_obs + pairs) / 2, p, sizes, s_obs / pairs, detectable, alternative, min_p)


def _p_value(null: np.ndarray, observed: float, exact: bool, alternative: str) -> float:
  """Permutation p-value of `observed` against the null draws (or the full enumeration when
  `exact`): one-sided tails with (count + 1) / (draws + 1) when not exact; two-sided doubles the
  smaller tail, capped at 1 (as `scipy.stats.permutation_test`)."""
  tol = _GAMMA * max(1.0, abs(observed))
  adjust = 0 if exact else 1
  less = (np.sum(null <= observed + tol) + adjust) / (null.size + adjust)
  greater = (np.sum(null >= observed - tol) + adjust) / (null.size + adjust)
  return float(_two_sided(less, greater, alternative))


def _ranks_centred(v: np.ndarray) -> np.ndarray:
  r = scipy.stats.rankdata(v)
  r = r - r.mean()
  return r / np.sqrt(np.sum(r * r))


def usable_strata(x: Sequence[float], y: Sequence[float], strata: Sequence) -> dict:
  """{stratum: [S] bool mask of its finite (x, y) pairs} of the strata `stratified_association`
  uses (>= 3 finite pairs, neither side constant), in order of first appearance; x, y, strata:
  [S] per seed."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  ok = np.isfinite(x) & np.isfinite(y)
  out = {}
  for key in dict.fromkeys(s for s, good in zip(strata, ok) if good):
    mask = ok & np.array([s == key for s in strata])
    if mask.sum() >= 3 and np.ptp(x[mask]) > 0 and np.ptp(y[mask]) > 0:
      out[key] = mask
  return out


def stratified_association(x: Sequence[float], y: Sequence[float], strata: Sequence,
                           alternative: str = "two-sided", num_resamples: int = NUM_RESAMPLES,
                           seed: int = 0) -> Test:
  """Association of x and y with the strata held fixed (e.g. a predictor and generalisation
  within each depth): the size-weighted mean of the within-stratum Spearman correlations, tested
  by permuting y within each stratum.

  A stratum counts when it has at least 3 finite (x, y) pairs and neither side is constant
  (otherwise its correlation is undefined, under every permutation too). The null distribution
  is the sum of independent per-stratum permutation distributions: enumerated exactly when the
  product of the strata's n! is at most `EXACT_LIMIT`, else `num_resamples` seeded draws.

  Args:
    x, y: [S] one value per seed.
    strata: [S] the stratum of each seed (any hashable, e.g. the depth).
    alternative: 'greater': positive association; 'less': negative.

  Returns:
    Test(name="stratified permutation (Spearman within strata)", statistic=effect=the weighted
    mean rho, n=pairs per counted stratum, detectable=`power.detectable_stratified_rho`). No
    stratum counts: p and effect nan, not testable.

  Raises:
    ValueError: x, y and strata of different lengths, or an unknown alternative.
  """
  power_lib.check_alternative(alternative)
  x = np.asarray([np.nan if v is None else v for v in x], dtype=np.float64)
  y = np.asarray([np.nan if v is None else v for v in y], dtype=np.float64)
  strata = list(strata)
  if not len(x) == len(y) == len(strata):
    raise ValueError(f"x, y and strata must have one entry per seed, got lengths {len(x)}, "
                     f"{len(y)}, {len(strata)}")
  name = "stratified permutation (Spearman within strata)"
  parts = []  # (n, centred ranks of x, centred ranks of y)
  for mask in usable_strata(x, y, strata).values():
    parts.append((int(mask.sum()), _ranks_centred(x[mask]), _ranks_centred(y[mask])))
  sizes = tuple(n for n, _, _ in parts)
  if not parts:
    return Test(name, math.nan, math.nan, sizes, math.nan, math.inf, alternative, 1.0)
  weights = np.asarray(sizes, dtype=np.float64) / sum(sizes)
  observed = float(sum(w * rx @ ry for w, (_, rx, ry) in zip(weights, parts)))
  count = math.prod(math.factorial(n) for n in sizes)
  exact = count <= EXACT_LIMIT
  if exact:
    null = np.zeros(1)
    for w, (n, rx, ry) in zip(weights, parts):
      perms = np.asarray(list(itertools.permutations(range(n))))  # [n!, n]
      null = np.add.outer(null, w * (ry[perms] @ rx)).ravel()
  else:
    rng = np.random.default_rng(seed)
    null = np.zeros(num_resamples)
    for w, (n, rx, ry) in zip(weights, parts):
      perms = np.argsort(rng.random((num_resamples, n)), axis=1)
      null += w * (ry[perms] @ rx)
  p = _p_value(null, observed, exact, alternative)
  min_p = _floor(count, exact, num_resamples, alternative)
  detectable = (power_lib.detectable_stratified_rho(sizes, alternative=alternative)
                if min_p <= ALPHA else math.inf)
  return Test(name, observed, p, sizes, observed, detectable, alternative, min_p)
