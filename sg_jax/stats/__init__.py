"""Statistics over seeds that hold at the seed counts sg_jax runs (4-16 seeds per arm).

Plain sequences of per-seed values in (NaN entries dropped), small frozen results out:
`Interval` (an estimate with its interval, its method and n) and `Test` (p-value, observed
effect, minimum detectable effect at alpha 0.05 / power 0.8, and the smallest p the test can reach
at this n, so that "not testable at this n" is computed). Modules by concern: `intervals`,
`comparisons`, `survival`, `power`, `multiple`, `shape`, `crossed` (two crossed factors:
variance shares and restricted permutation tests). The reasons and the coverage measured
at n = 4, 8, 16 are in docs/analysis.md ("Statistics").

  from sg_jax import stats
  stats.mean_interval([0.6, 0.7, 0.5, 0.8]).label()   # '0.650 [0.445, 0.855]'
  stats.compare_proportions(1, 4, 4, 4).p              # Fisher exact
"""

from sg_jax.stats.comparisons import (EXACT_LIMIT, NUM_RESAMPLES, Test, compare_means,
                                      compare_proportions, ordered_trend, stratified_association,
                                      usable_strata)
from sg_jax.stats.crossed import CrossedResult, FactorShare, crossed_variance
from sg_jax.stats.intervals import (Interval, finite, mean_interval, mean_intervals,
                                    proportion_interval)
from sg_jax.stats.multiple import holm
from sg_jax.stats.power import (ALPHA, POWER, detectable_log_hazard_ratio,
                                detectable_mean_difference, detectable_proportion_difference,
                                detectable_stratified_rho, detectable_trend_tau, fisher_power,
                                seeds_per_arm)
from sg_jax.stats.shape import SARLE_THRESHOLD, sarle_bimodality, sarle_max, sarle_signals
from sg_jax.stats.survival import KaplanMeier, kaplan_meier, logrank, sustained

__all__ = ["ALPHA", "compare_means", "compare_proportions", "crossed_variance", "CrossedResult",
           "detectable_log_hazard_ratio", "detectable_mean_difference",
           "detectable_proportion_difference", "detectable_stratified_rho", "detectable_trend_tau",
           "EXACT_LIMIT", "FactorShare", "finite", "fisher_power", "holm", "Interval",
           "kaplan_meier", "KaplanMeier", "logrank", "mean_interval", "mean_intervals",
           "NUM_RESAMPLES", "ordered_trend", "POWER", "proportion_interval", "sarle_bimodality",
           "sarle_max", "sarle_signals", "SARLE_THRESHOLD", "seeds_per_arm",
           "stratified_association", "sustained", "Test", "usable_strata"]
