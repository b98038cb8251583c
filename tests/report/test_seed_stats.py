"""Seed statistics of the report (sg_jax/report/seed_stats.py) on hand-built values: the seed
mean's t-interval and how tables name it, Sarle's coefficient only where it can signal, the
kept percentile bootstrap, oscillation and rules."""

import math

import numpy as np
import pytest

from sg_jax.report import seed_stats


def test_bootstrap_ci_of_two_seeds_is_the_percentiles_of_three_possible_means():
  # Resampling {0, 1} twice gives means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 95%
  # percentile interval is [0, 1].
  mean, low, high = seed_stats.bootstrap_ci([0.0, 1.0])
  assert (mean, low, high) == (0.5, 0.0, 1.0)


def test_bootstrap_ci_matches_a_naive_resampling_loop():
  values = np.array([0.25, 0.6, 0.65, 0.7, 0.95, 1.0, 1.0, 0.3])
  mean, low, high = seed_stats.bootstrap_ci(values, num_resamples=20000, seed=1)
  rng = np.random.default_rng(7)
  means = [rng.choice(values, size=values.size, replace=True).mean() for _ in range(20000)]
  naive_low, naive_high = np.percentile(means, [2.5, 97.5])
  assert mean == pytest.approx(values.mean())
  assert low == pytest.approx(naive_low, abs=0.015)
  assert high == pytest.approx(naive_high, abs=0.015)
  assert low < mean < high


def test_bootstrap_ci_edge_cases():
  assert seed_stats.bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)
  assert seed_stats.bootstrap_ci([0.4, 0.4, 0.4]) == pytest.approx((0.4, 0.4, 0.4))
  assert all(math.isnan(x) for x in seed_stats.bootstrap_ci([math.nan, None]))
  assert seed_stats.bootstrap_ci([0.0, math.nan, 1.0])[0] == 0.5
  with pytest.raises(ValueError, match="confidence"):
    seed_stats.bootstrap_ci([0.0, 1.0], confidence=95)


def test_seed_mean_is_the_t_interval_and_tables_name_it():
  # [0.5, 0.6, 0.7]: mean 0.6, s = 0.1, t_{2, 0.975} = 4.3027: half 0.24841.
  mean, low, high = seed_stats.seed_mean([0.5, math.nan, 0.6, 0.7])
  assert (mean, low, high) == pytest.approx((0.6, 0.35159, 0.84841), abs=1e-5)
  one = seed_stats.seed_mean([0.7])
  assert one[0] == 0.7 and math.isnan(one[1]) and math.isnan(one[2])
  assert seed_stats.interval_header("gen. acc.", [4, 4, 0]) == "gen. acc.: mean [95% t-CI, n=4]"
  assert seed_stats.interval_header("x", [4, 3]) == "x: mean [95% t-CI, n per row]"
  assert seed_stats.interval_cell(mean, low, high) == "0.6 [0.352, 0.848]"
  assert seed_stats.interval_cell(0.6, 0.35, 0.85, n=3, digits=2) == "0.6 [0.35, 0.85] (n=3)"
  assert seed_stats.interval_cell(0.7, math.nan, math.nan) == "0.7"
  assert seed_stats.interval_cell(math.nan, 0, 1) == ""
  assert seed_stats.rule_counts(["hierarchical", None, "skip_relative", "hierarchical"]) == (
      "hierarchical 2, skip_relative 1")


def test_bimodality_is_shown_only_where_it_can_signal():
  # 4 seeds split 2/2: b = 2/15, and no 4 values can exceed 2/7 < 5/9: not shown.
  assert math.isnan(seed_stats.shown_bimodality([0, 0, 1, 1]))
  # 6 seeds: shown; one seed apart from five gives the maximum, 4/7 > 5/9, an even 3/3 split
  # only 12/35 (the coefficient rewards skew as much as two modes).
  assert seed_stats.shown_bimodality([0, 0, 0, 0, 0, 1]) == pytest.approx(4 / 7)
  assert seed_stats.shown_bimodality([0, 0, 0, 1, 1, 1]) == pytest.approx(12 / 35)
  assert math.isnan(seed_stats.shown_bimodality([0, 0, 0, 1, 1, math.nan]))


def test_sarle_bimodality_by_hand_and_on_shapes():
  # [0, 0, 1, 1]: skewness 0; excess kurtosis -2 (population), bias-corrected
  # ((n + 1) g2 + 6) (n - 1) / ((n - 2)(n - 3)) = -6; b = 1 / (-6 + 3 * 9 / 2) = 2 / 15.
  assert seed_stats.sarle_bimodality([0, 0, 1, 1]) == pytest.approx(2 / 15)
  rng = np.random.default_rng(0)
  two_modes = np.concatenate([rng.normal(0.3, 0.03, 200), rng.normal(1.0, 0.03, 200)])
  one_mode = rng.normal(0.7, 0.1, 400)
  assert seed_stats.sarle_bimodality(two_modes) > 5 / 9 > seed_stats.sarle_bimodality(one_mode)
  assert math.isnan(seed_stats.sarle_bimodality([0.1, 0.2, 0.3]))
  assert math.isnan(seed_stats.sarle_bimodality([0.5] * 6))


def test_oscillation_is_the_std_of_the_last_evaluations():
  series = [0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
  assert seed_stats.oscillation(series, last=4) == pytest.approx(0.5)
  assert seed_stats.oscillation([0.2, 0.9, 0.9, 0.9], last=3) == 0.0
  assert math.isnan(seed_stats.oscillation([0.3], last=3))
  with pytest.raises(ValueError, match="last"):
    seed_stats.oscillation(series, last=1)


def test_dominant_rules_and_switches():
  agreements = {"hierarchical": [0.1, 0.2, 0.6, 0.5, 0.9, 0.3],
                "move_first": [0.8, 0.3, 0.3, 0.5, 0.05, 0.2],
                "skip_relative": [0.1, 0.7, 0.1, 0.0, 0.05, 0.6]}
  rules = seed_stats.dominant_rules(agreements)
  assert rules == ["move_first", "skip_relative", "hierarchical", None, "hierarchical",
                   "skip_relative"]
  # The tie at the fourth evaluation is skipped: mf -> sr -> h -> h -> sr is 3 switches.
  assert seed_stats.rule_switches(rules) == 3
  # With a margin of 0.45 only the clear leads count: mf (0.5 ahead), h (0.8 ahead).
  assert seed_stats.dominant_rules(agreements, margin=0.45) == [
      "move_first", None, None, None, "hierarchical", None]
  with pytest.raises(ValueError, match="same length"):
    seed_stats.dominant_rules({"a": [0.1, 0.2], "b": [0.3]})
