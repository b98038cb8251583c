"""sg_jax.stats: interval coverage by simulation at the seed counts used, every test's p-value
against a brute-force enumeration on a small hand-made case, Kaplan-Meier and the log-rank test
on hand-computed values, Holm by hand, and when Sarle's coefficient can signal."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from sg_jax import stats

REPLICATES = 4000


def _mixture(rng, shape, p=0.5):
  """Seeds that generalise (about 0.9) or not (about 0.2), each with probability p / 1 - p."""
  high = rng.random(shape) < p
  return np.where(high, rng.normal(0.9, 0.05, shape), rng.normal(0.2, 0.05, shape)), 0.2 + 0.7 * p


@pytest.mark.parametrize("n, normal_band, mixture_band", [
    (4, (0.93, 0.97), (0.85, 0.90)), (8, (0.93, 0.97), (0.91, 0.95)),
    (16, (0.93, 0.97), (0.92, 0.96))])
def test_t_interval_coverage_at_the_seed_counts_used(n, normal_band, mixture_band):
  """95% t-interval of a seed mean, 4000 simulated samples each. Normal data: 0.93-0.97 at every
  n (measured 0.949, 0.947, 0.950). A 50/50 mixture of seeds near 0.9 and near 0.2: below 95% at
  n = 4 because 2 of 16 samples have all four seeds in one mode (an interval around one mode
  cannot hold the mean; measured 0.885), close to 95% from n = 8 (0.931, 0.946)."""
  rng = np.random.default_rng(n)
  x = rng.normal(0.6, 0.15, (REPLICATES, n))
  _, low, high = stats.mean_intervals(x)
  covered = np.mean((low <= 0.6) & (0.6 <= high))
  assert normal_band[0] <= covered <= normal_band[1], covered
  y, mean = _mixture(rng, (REPLICATES, n))
  _, low, high = stats.mean_intervals(y)
  covered = np.mean((low <= mean) & (mean <= high))
  assert mixture_band[0] <= covered <= mixture_band[1], covered


def test_the_percentile_bootstrap_it_replaces_undercovers_at_four_seeds():
  """The old report interval (percentile bootstrap of the mean) on the same normal data at n = 4
  covers about 0.79: below the t-interval's band."""
  rng = np.random.default_rng(4)
  x = rng.normal(0.6, 0.15, (1500, 4))
  idx = rng.integers(0, 4, (1500, 400, 4))
  means = x[np.arange(1500)[:, None, None], idx].mean(axis=2)  # [R, B]
  low, high = np.percentile(means, [2.5, 97.5], axis=1)
  covered = np.mean((low <= 0.6) & (0.6 <= high))
  assert 0.74 <= covered <= 0.83, covered
  _, t_low, t_high = stats.mean_intervals(x)
  assert np.mean((t_low <= 0.6) & (0.6 <= t_high)) > covered + 0.1


def test_mean_interval_by_hand_and_edge_cases():
  # [0.6, 0.7, 0.5, 0.8]: mean 0.65, s = 0.12910, t_{3, 0.975} = 3.18245; half 0.20543.
  got = stats.mean_interval([0.6, 0.7, None, 0.5, 0.8, math.nan])
  assert (got.estimate, got.n, got.method) == (pytest.approx(0.65), 4, "t")
  assert (got.low, got.high) == (pytest.approx(0.44457, abs=1e-5), pytest.approx(0.85543, abs=1e-5))
  assert got.label() == "0.650 [0.445, 0.855]" and got.header == "95% t CI, n=4"
  one = stats.mean_interval([0.7])
  assert one.estimate == 0.7 and math.isnan(one.low) and one.label() == "0.700"
  assert stats.mean_interval([]).n == 0 and stats.mean_interval([]).label() == ""
  assert stats.mean_interval([0.4] * 3).low == pytest.approx(0.4)
  rows = np.random.default_rng(0).normal(size=(5, 6))
  mean, low, high = stats.mean_intervals(rows)
  for k in range(5):
    single = stats.mean_interval(rows[k])
    assert (mean[k], low[k], high[k]) == pytest.approx((single.estimate, single.low, single.high))
  with pytest.raises(ValueError, match="confidence"):
    stats.mean_interval([0.0, 1.0], confidence=95)
  with pytest.raises(ValueError, match="n >= 2"):
    stats.mean_intervals(np.zeros((3, 1)))


@pytest.mark.parametrize("n", [4, 8, 16])
def test_clopper_pearson_covers_at_least_95_percent_at_every_p(n):
  """Exact coverage (sum over the n + 1 outcomes) on a grid of true proportions."""
  bounds = np.array([[stats.proportion_interval(k, n).low, stats.proportion_interval(k, n).high]
                     for k in range(n + 1)])
  for p in np.linspace(0.001, 0.999, 199):
    pmf = scipy.stats.binom.pmf(np.arange(n + 1), n, p)
    assert pmf[(bounds[:, 0] <= p) & (p <= bounds[:, 1])].sum() >= 0.95 - 1e-9


def test_clopper_pearson_by_hand():
  # k = 0: upper = 1 - 0.025^(1/n); k = n: lower = 0.025^(1/n).
  none = stats.proportion_interval(0, 4)
  assert none.low == 0 and none.high == pytest.approx(1 - 0.025 ** 0.25)
  assert stats.proportion_interval(4, 4).low == pytest.approx(0.025 ** 0.25)
  assert stats.proportion_interval(3, 4).estimate == 0.75
  assert stats.proportion_interval(3, 4).method == "Clopper-Pearson"
  with pytest.raises(ValueError, match="0 <= k <= n"):
    stats.proportion_interval(5, 4)


def _fisher_brute(k1, n1, k2, n2):
  """Two-sided Fisher p: the probability, under the hypergeometric law of the margins, of every
  table no more likely than the observed one."""
  total, successes = n1 + n2, k1 + k2
  prob = lambda a: math.comb(n2, a) * math.comb(n1, successes - a) / math.comb(total, successes)
  tables = [a for a in range(max(0, successes - n1), min(n2, successes) + 1)]
  observed = prob(k2)
  return sum(prob(a) for a in tables if prob(a) <= observed * (1 + 1e-7))


def test_fisher_against_enumeration_and_its_power():
  for k1, n1, k2, n2 in ((1, 4, 4, 4), (0, 4, 4, 4), (2, 5, 3, 4), (3, 8, 8, 8)):
    got = stats.compare_proportions(k1, n1, k2, n2)
    assert got.p == pytest.approx(_fisher_brute(k1, n1, k2, n2))
    assert got.effect == pytest.approx(k2 / n2 - k1 / n1)
  # 4 + 4 seeds: only 0/4 vs 4/4 reaches p <= 0.05 (2/70); from p1 = 0.25 no p2 has power 0.8
  # (the first arm must show 0/4, probability 0.32), so the comparison is not testable.
  four = stats.compare_proportions(1, 4, 4, 4)
  assert four.min_p == pytest.approx(2 / 70) and four.p == pytest.approx(_fisher_brute(1, 4, 4, 4))
  assert four.detectable == math.inf and not four.testable
  # From p1 = 0: power p2^4 (only the table 0/4 vs 4/4 rejects) reaches 0.8 at p2 = 0.8^(1/4).
  assert stats.detectable_proportion_difference(4, 4, 0.0) == pytest.approx(0.8 ** 0.25, abs=1e-3)
  # 8 + 8 from 0.25: the exact power by brute force just below / at the detectable difference.
  d = stats.detectable_proportion_difference(8, 8, 0.25)
  reject = np.array([[_fisher_brute(a, 8, b, 8) <= 0.05 for b in range(9)] for a in range(9)])
  brute = lambda p2: sum(scipy.stats.binom.pmf(a, 8, 0.25) * scipy.stats.binom.pmf(b, 8, p2)
                         for a in range(9) for b in range(9) if reject[a, b])
  assert brute(0.25 + d) >= 0.8 > brute(0.25 + d - 0.002)
  assert stats.compare_proportions(0, 2, 2, 2).min_p == pytest.approx(1 / 3)
  with pytest.raises(ValueError, match="0 <= k <= n"):
    stats.compare_proportions(5, 4, 1, 4)


def _doubled_tail(null, observed):
  less = np.mean(null <= observed + 1e-12)
  greater = np.mean(null >= observed - 1e-12)
  return min(1.0, 2 * min(less, greater)), less, greater


def test_permutation_of_means_against_enumeration():
  x, y = [0.1, 0.5, 0.3, 0.3], [0.7, 0.2, 0.9, 0.95]
  pooled = np.array(x + y)
  null = []
  for chosen in itertools.combinations(range(8), 4):
    rest = [i for i in range(8) if i not in chosen]
    null.append(pooled[list(chosen)].mean() - pooled[rest].mean())
  observed = np.mean(y) - np.mean(x)
  two, less, greater = _doubled_tail(np.array(null), observed)
  got = stats.compare_means(x, y)
  assert got.p == pytest.approx(two) and got.effect == pytest.approx(observed)
  assert stats.compare_means(x, y, alternative="greater").p == pytest.approx(greater)
  assert stats.compare_means(x, y, alternative="less").p == pytest.approx(less)
  assert got.min_p == pytest.approx(2 / 70) and got.n == (4, 4)
  # the detectable shift: 2.86 pooled SDs at 4 + 4 (simulated permutation power), none at 3 + 3
  sd = math.sqrt((np.var(x, ddof=1) + np.var(y, ddof=1)) / 2)
  assert got.detectable == pytest.approx(2.86 * sd, rel=0.02)
  assert not stats.compare_means([1, 2, 3], [4, 5, 6]).testable
  # many seeds: seeded Monte Carlo, reproducible
  rng = np.random.default_rng(0)
  a, b = rng.normal(0, 1, 11), rng.normal(1, 1, 11)
  first = stats.compare_means(a, b, num_resamples=2000)
  assert first.p == stats.compare_means(a, b, num_resamples=2000).p
  assert first.min_p == pytest.approx(2 / 2001)
  # one seed against three: the 4 ways to pick the single seed, enumerated
  values = np.array([0.5, 0.1, 0.7, 0.9])
  null = np.array([(values.sum() - v) / 3 - v for v in values])
  assert stats.compare_means([0.5], [0.1, 0.7, 0.9]).p == pytest.approx(
      _doubled_tail(null, null[0])[0])
  assert stats.compare_means([0.5], [0.1, 0.7, 0.9]).min_p == 0.5


def test_permutation_power_at_the_detectable_shift():
  """The permutation test's power at its detectable shift, simulated afresh: 0.8 at 4 + 4 (its
  own simulation) and close to it at 8 + 8 (the t-test's shift; measured 0.79)."""
  for n, band, replicates in ((4, (0.76, 0.84), 600), (8, (0.72, 0.86), 300)):
    d = stats.detectable_mean_difference(n, n, 1.0)
    combos = np.array(list(itertools.combinations(range(2 * n), n)))
    mask = np.zeros((len(combos), 2 * n))
    np.put_along_axis(mask, combos, 1.0, axis=1)
    rng = np.random.default_rng(100 + n)
    z = np.concatenate([rng.normal(0, 1, (replicates, n)), rng.normal(d, 1, (replicates, n))],
                       axis=1)
    inside = z @ mask.T
    stat = inside / n - (z.sum(1, keepdims=True) - inside) / n
    observed = z[:, n:].mean(1) - z[:, :n].mean(1)
    p = np.minimum(1, 2 * np.minimum(np.mean(stat >= observed[:, None] - 1e-9, axis=1),
                                     np.mean(stat <= observed[:, None] + 1e-9, axis=1)))
    assert band[0] <= np.mean(p <= 0.05) <= band[1]


def _jt_naive(groups):
  s = 0.0
  for i, j in itertools.combinations(range(len(groups)), 2):
    for a in groups[i]:
      for b in groups[j]:
        s += np.sign(b - a)
  return s


def test_jonckheere_terpstra_against_enumeration_with_ties():
  groups = [[0.2, 0.5, 0.5], [0.4, 0.9], [0.5, 0.8, 1.0]]
  values = np.concatenate(groups)
  sizes = [3, 2, 3]
  observed = _jt_naive(groups)
  null = []
  for labels in set(itertools.permutations([0, 0, 0, 1, 1, 2, 2, 2])):
    null.append(_jt_naive([values[np.array(labels) == g] for g in range(3)]))
  assert len(null) == 560
  two, _, greater = _doubled_tail(np.array(null), observed)
  got = stats.ordered_trend(groups)
  pairs = 3 * 2 + 3 * 3 + 2 * 3
  assert got.effect == pytest.approx(observed / pairs) and got.statistic == (observed + pairs) / 2
  assert got.p == pytest.approx(two)
  assert stats.ordered_trend(groups, alternative="greater").p == pytest.approx(greater)
  assert got.n == tuple(sizes) and got.min_p == pytest.approx(2 / 560)
  # every value of a later group above every earlier one: tau = 1, the smallest p
  ordered = stats.ordered_trend([[1, 2], [3, 4], [5, 6]])
  assert ordered.effect == 1.0 and ordered.p == pytest.approx(2 / 90)
  assert stats.ordered_trend([[1.0], [math.nan]]).p != stats.ordered_trend([[1.0], [math.nan]]).p


def test_jonckheere_terpstra_monte_carlo_is_seeded_and_near_the_normal_approximation():
  rng = np.random.default_rng(3)
  groups = [rng.normal(0.1 * k, 1, 8) for k in range(4)]
  got = stats.ordered_trend(groups)
  assert got.p == stats.ordered_trend(groups).p
  # the null variance of J without ties (Hollander & Wolfe 1999) gives the normal p
  n = np.array([8] * 4)
  var = (32 ** 2 * (2 * 32 + 3) - np.sum(n ** 2 * (2 * n + 3))) / 72
  z = (got.statistic - (32 ** 2 - np.sum(n ** 2)) / 4) / math.sqrt(var)
  assert got.p == pytest.approx(2 * scipy.stats.norm.sf(abs(z)), abs=0.02)
  assert stats.detectable_trend_tau([8] * 4) == pytest.approx(
      (1.959964 + 0.841621) * 2 * math.sqrt(var) / 384, rel=1e-5)


def test_stratified_association_against_enumeration():
  x = [1, 2, 3, 1, 2, 3, 4, 5, 1, 2, 3, 7]
  y = [0.1, 0.3, 0.2, 0.5, 0.4, 0.9, 0.8, 0.95, 0.3, 0.1, 0.2, 0.6]
  strata = [2] * 3 + [4] * 5 + [6] * 4
  x, y = np.array(x, float), np.array(y, float)
  masks = [np.array(strata) == s for s in (2, 4, 6)]
  weights = np.array([3, 5, 4]) / 12
  per_stratum = []
  for mask in masks:
    xs, ys = x[mask], y[mask]
    per_stratum.append([scipy.stats.spearmanr(xs, ys[list(p)]).statistic
                        for p in itertools.permutations(range(mask.sum()))])
  null = np.array([np.dot(weights, combo) for combo in itertools.product(*per_stratum)])
  observed = sum(w * scipy.stats.spearmanr(x[m], y[m]).statistic for w, m in zip(weights, masks))
  two, less, _ = _doubled_tail(null, observed)
  got = stats.stratified_association(x, y, strata)
  assert got.effect == pytest.approx(observed) and got.p == pytest.approx(two)
  assert stats.stratified_association(x, y, strata, alternative="less").p == pytest.approx(less)
  assert got.n == (3, 5, 4) and got.min_p == pytest.approx(2 / (6 * 120 * 24))
  # a stratum with a constant side or under 3 pairs does not count
  flat = stats.stratified_association([1, 2, 3, 1, 2, 5], [1, 1, 1, 3, 2, 1], [0] * 3 + [1] * 3)
  assert flat.n == (3,) and flat.effect == pytest.approx(-1.0)
  with pytest.raises(ValueError, match="one entry per seed"):
    stats.stratified_association([1, 2], [1, 2, 3], [0, 0, 0])
  # 4 depths x 8 seeds: seeded Monte Carlo, reproducible
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=32), rng.normal(size=32)
  d = np.repeat(np.arange(4), 8)
  assert stats.stratified_association(a, b, d).p == stats.stratified_association(a, b, d).p


def test_kaplan_meier_on_a_censored_case():
  """Six seeds: crossings at 100, 200, 200, 300; two never cross (censored at their last steps,
  400 and 500). S = 5/6 after 100, 5/6 * 3/5 = 1/2 after 200, 1/2 * 2/3 = 1/3 after 300: the
  median is 200. The interval is where the log-log band (Greenwood) crosses 0.5."""
  km = stats.kaplan_meier([100, 200, 200, 300, 400, 500], [1, 1, 1, 1, 0, 0])
  np.testing.assert_allclose(km.steps, [100, 200, 300])
  np.testing.assert_allclose(km.survival, [5 / 6, 1 / 2, 1 / 3])
  assert (km.median.estimate, km.n, km.events) == (200, 6, 4)
  assert km.at(50) == 1.0 and km.at(250) == 0.5
  # Greenwood: sum d / (n (n - d)) over 6 (1 event), 5 (2), 3 (1) at risk.
  var = np.cumsum([1 / (6 * 5), 2 / (5 * 3), 1 / (3 * 2)])
  s = km.survival
  z = scipy.stats.norm.ppf(0.975)
  half = z * np.sqrt(var) / np.log(s)
  low, high = s ** np.exp(-half), s ** np.exp(half)
  first = lambda curve: next((t for t, c in zip(km.steps, curve) if c <= 0.5), math.inf)
  assert (km.median.low, km.median.high) == (first(low), first(high))
  assert km.median.low <= 200 <= km.median.high
  # censoring before the first crossing; a curve that never reaches 0.5
  assert stats.kaplan_meier([100, 200, 300, 400], [0, 1, 1, 1]).median.estimate == 300
  never = stats.kaplan_meier([500, 500, 300], [0, 0, 1])
  assert never.median.estimate == math.inf and never.at(400) == pytest.approx(2 / 3)
  assert stats.kaplan_meier([500, 500], [0, 0]).median.estimate == math.inf
  with pytest.raises(ValueError, match="finite time"):
    stats.kaplan_meier([100, math.nan], [1, 0])


def test_logrank_against_a_hand_computed_value():
  """Arm 1: events at 1 and 3; arm 2: an event at 2, censored at 4. Risk sets (2, 2), (1, 2),
  (1, 1): O1 = 2, E1 = 1/2 + 1/3 + 1/2 = 4/3, V = 1/4 + 2/9 + 1/4 = 13/18, so
  Z1 = (2/3) / sqrt(13/18) = 0.7845 (chi-square 8/13), p = 0.4328; arm 2's Z is -0.7845. Peto
  hazard ratio (O2/E2) / (O1/E1) = (1 / (5/3)) / (2 / (4/3)) = 0.4."""
  got = stats.logrank([1, 3], [1, 1], [2, 4], [1, 0])
  assert got.statistic == pytest.approx(-(2 / 3) / math.sqrt(13 / 18))
  assert got.statistic ** 2 == pytest.approx(8 / 13)
  assert got.p == pytest.approx(2 * scipy.stats.norm.sf((2 / 3) / math.sqrt(13 / 18)))
  assert got.p == pytest.approx(0.4328, abs=1e-4)
  assert got.effect == pytest.approx(math.log(0.4))
  assert got.detectable == pytest.approx((1.959964 + 0.841621) / math.sqrt(3 * 0.25), rel=1e-5)
  assert stats.logrank([1, 3], [1, 1], [2, 4], [1, 0], alternative="less").p == pytest.approx(
      scipy.stats.norm.cdf(-(2 / 3) / math.sqrt(13 / 18)))
  assert math.isnan(stats.logrank([5], [0], [5], [0]).p)


def test_holm_by_hand():
  # sorted 0.005, 0.01, 0.03, 0.04 -> 4 x 0.005, 3 x 0.01, 2 x 0.03, max(1 x 0.04, 0.06)
  got = stats.holm([0.01, 0.04, 0.03, 0.005, math.nan])
  np.testing.assert_allclose(got[:4], [0.03, 0.06, 0.06, 0.02])
  assert math.isnan(got[4])
  np.testing.assert_allclose(stats.holm([0.5, 0.9]), [1.0, 1.0])
  # the same as statsmodels' Holm on a random family with ties (one call: each runs gc.collect)
  import statsmodels.stats.multitest  # pylint: disable=import-outside-toplevel
  p = np.round(np.random.default_rng(0).uniform(0, 0.2, 12), 2)
  np.testing.assert_allclose(stats.holm(p), statsmodels.stats.multitest.multipletests(
      p, method="holm")[1])
  with pytest.raises(ValueError, match="in \\[0, 1\\]"):
    stats.holm([1.5])


def test_sarle_signals_only_from_six_seeds():
  assert stats.sarle_max(4) == pytest.approx(2 / 7) and not stats.sarle_signals(4)
  assert stats.sarle_max(5) == pytest.approx(6 / 13) and not stats.sarle_signals(5)
  assert stats.sarle_max(6) == pytest.approx(4 / 7) and stats.sarle_signals(6)
  assert not stats.sarle_signals(3) and stats.sarle_signals(16)
  assert stats.sarle_bimodality([0, 0, 1, 1]) == pytest.approx(2 / 15)
  # no sample of 5 beats the two-point maximum (random search around two clusters)
  rng = np.random.default_rng(0)
  samples = np.where(rng.random((20000, 5)) < 0.5, 0.0, 1.0) + rng.normal(0, 0.3, (20000, 5))
  g = scipy.stats.skew(samples, axis=1, bias=False)
  k = scipy.stats.kurtosis(samples, axis=1, bias=False)
  b = (g ** 2 + 1) / (k + 3 * 16 / 6)
  assert stats.sarle_bimodality(samples[0]) == pytest.approx(b[0])
  assert 0.4 < b.max() <= stats.sarle_max(5) + 1e-12


def test_sustained_and_seeds_per_arm():
  steps, values = [0, 100, 200, 300], [0.1, 0.9, 0.5, 0.85]
  assert stats.sustained(steps, values, 0.8)
  assert not stats.sustained(steps, values, 0.8, last_k=2)
  assert stats.sustained(steps, [0.1, 0.9, 0.95, math.nan], 0.8, last_k=2)
  assert not stats.sustained([0], [0.9], 0.8, last_k=2)
  with pytest.raises(ValueError, match="last_k"):
    stats.sustained(steps, values, 0.8, last_k=0)
  # 0.25 -> 1.0 needs n with detectable(n) <= 0.75 and detectable(n - 1) > 0.75
  detectable = lambda n: stats.detectable_proportion_difference(n, n, 0.25)
  n = stats.seeds_per_arm(0.75, detectable)
  assert detectable(n) <= 0.75 < detectable(n - 1)
  assert stats.seeds_per_arm(0.0, detectable) is None
  # a saw-tooth (an exact test's discreteness): the fewest n, not where bisection lands
  tooth = lambda n: 0.3 if n in (15, 17) or n >= 19 else 0.5
  assert stats.seeds_per_arm(0.35, tooth, saw_tooth=True) == 15
  assert stats.seeds_per_arm(0.35, tooth) == 19  # bisection (16, 32] assumes a falling function
  assert stats.seeds_per_arm(0.35, tooth, max_n=8, saw_tooth=True) is None
