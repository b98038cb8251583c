"""Predictors of generalisation (sg_jax/report/predictors.py) on hand-built tables with known
rank correlations: across seeds (permutation), across depths (Jonckheere-Terpstra along the
predictor's depth order), within depth (stratified permutation), Holm over the table."""

import math

import numpy as np
import pytest
import scipy.stats

from sg_jax import stats
from sg_jax.report import predictors
from sg_jax.report.reading import Run


def _rows(table):
  return [{"depth": d, "seed": s, "generalisation": g, "tscore@final": t}
          for d, s, g, t in table]


def test_perfectly_ordered_table_reaches_the_smallest_p_of_each_test():
  """3 depths x 4 seeds, predictor = generalisation, both rising with depth and with the seed:
  rho = 1 across seeds and within each depth (p = 2 / 24^3, every within-depth permutation
  enumerated), tau = 1 across depths (p = 2 / 34650 assignments of 12 seeds to 3 depths)."""
  rows = _rows([(d, s, 0.1 * d + 0.01 * s, 0.1 * d + 0.01 * s) for d in (2, 4, 6) for s in range(4)])
  got = predictors.correlations(rows, "tscore@final")
  assert got["across_seeds"].effect == pytest.approx(1.0)
  assert got["within_depth"].effect == pytest.approx(1.0)
  assert got["within_depth"].p == pytest.approx(2 / 24 ** 3) and got["within_depth"].n == (4, 4, 4)
  assert got["across_depths"].effect == 1.0 and got["across_depths"].p == pytest.approx(2 / 34650)
  assert got["depth_trend"].effect == 1.0
  assert all(t.testable for t in got.values())


def test_within_depth_and_across_depths_can_disagree():
  """Across depths the predictor tracks generalisation (depth means rise together), but within
  each depth it is reversed: tau across depths = 1, within = -1; the pooled rho equals scipy's
  Spearman of all pairs, with a permutation p."""
  table = []
  for k, d in enumerate((2, 4, 6)):
    for s in range(4):
      table.append((d, s, k + 0.1 * s, k - 0.05 * s))
  rows = _rows(table)
  got = predictors.correlations(rows, "tscore@final")
  assert got["across_depths"].effect == pytest.approx(1.0)
  assert got["within_depth"].effect == pytest.approx(-1.0)
  want = scipy.stats.spearmanr([t for *_, t in table], [g for _, _, g, _ in table]).statistic
  assert got["across_seeds"].effect == pytest.approx(want)
  assert 0 < got["across_seeds"].p < 0.05


def test_a_predictor_monotone_in_depth_orders_the_depths_as_depth_does():
  """A predictor that falls with depth by construction (like the weight norm per layer) and
  generalisation unrelated to it within depths: its across-depth test is the trend of
  generalisation over (reversed) depth, the same test as for any other monotone predictor."""
  rng = np.random.default_rng(0)
  table = [(d, s, rng.uniform(0, 1), 1 / math.sqrt(d) + 0.001 * rng.uniform())
           for d in (2, 4, 6, 8) for s in range(4)]
  rows = _rows(table)
  falling = predictors.correlations(rows, "tscore@final")
  assert falling["depth_trend"].effect == -1.0
  rising = predictors.correlations(_rows([(d, s, g, -t) for d, s, g, t in table]), "tscore@final")
  gen = [[g for d, _, g, _ in table if d == depth] for depth in (2, 4, 6, 8)]
  assert falling["across_depths"] == stats.ordered_trend(gen[::-1])
  assert rising["across_depths"] == stats.ordered_trend(gen)
  assert rising["across_depths"].effect == pytest.approx(-falling["across_depths"].effect)


def test_correlation_rows_holm_and_the_table():
  rng = np.random.default_rng(1)
  g = rng.uniform(0, 1, 24)
  rows = [{"depth": 2 + 2 * (i % 2), "seed": i, "generalisation": g[i],
           "tscore@final": g[i] + rng.normal(0, 0.3), "tscore@saturation": rng.uniform()}
          for i in range(10)]
  table = predictors.correlation_rows(rows)
  assert [(r["predictor"], r["moment"]) for r in table] == [("tscore", "saturation"),
                                                            ("tscore", "final")]
  for kind in predictors.KINDS:
    want = np.minimum(1, 2 * np.sort([r[f"{kind}_p"] for r in table]))  # Holm with m = 2
    want[1] = max(want[0], min(1, np.sort([r[f"{kind}_p"] for r in table])[1]))
    assert sorted(r[f"{kind}_p_holm"] for r in table) == pytest.approx(sorted(want))
  lines = predictors.markdown_lines(table)
  assert lines[3].startswith("| predictor | measured at | across seeds (Spearman rho) |")
  final = table[1]
  assert f"{final['within_depth']:+.2f}, p " in lines[6]
  assert math.isnan(predictors.spearman([1, 2], [1, 2]))
  assert math.isnan(predictors.spearman([1, 1, 1], [1, 2, 3]))
  with pytest.raises(KeyError):
    predictors.correlations(rows, "weight_norm@final")
  # 2 seeds per depth: nothing within depth can be tested
  few = predictors.correlations(rows[:4], "tscore@final")
  assert not few["within_depth"].testable


def test_seed_table_reads_values_at_saturation_and_at_the_end():
  steps = np.array([0, 100, 200, 300])
  run = Run(workdir="w", name="d2", depth=2, task="question", num_steps=300, series={
      "in_domain/accuracy": {0: (steps, np.array([0.1, 0.995, 1.0, 1.0]))},
      "out_of_domain/accuracy": {0: (steps, np.array([0.0, 0.1, 0.4, 0.7]))},
      "tscore": {0: (np.array([0, 150, 300]), np.array([0.5, 0.6, 0.8]))}})
  row = predictors.seed_table([run], saturation=0.99)[0]
  assert row["saturation_step"] == 100 and row["generalisation"] == 0.7
  assert row["tscore@saturation"] == 0.6  # the first analysed step at or after step 100
  assert row["tscore@final"] == 0.8
  assert "weight_norm_per_layer@final" not in row


def test_depth_rows_give_each_depths_seed_mean_with_its_interval():
  """Depth 2's seeds all have tscore 0.5 (a degenerate interval at 0.5); depth 4's are 0.6 and
  1.0 (mean 0.8, t-interval 0.8 +- 12.706 x 0.2828 / sqrt(2) = 0.8 +- 2.541); a NaN seed is
  left out of the count and of the generalisation mean; the table lists both depths in order."""
  rows = _rows([(2, 0, 0.1, 0.5), (2, 1, 0.3, 0.5), (4, 0, 0.9, 0.6), (4, 1, 0.7, 1.0),
                (4, 2, 0.0, math.nan)])
  table = predictors.depth_rows(rows)
  assert [(r["predictor"], r["moment"], r["depth"]) for r in table] == [
      ("tscore", "final", 2), ("tscore", "final", 4)]
  two, four = table
  assert (two["seeds"], two["mean"], two["ci_low"], two["ci_high"]) == (2, 0.5, 0.5, 0.5)
  assert two["generalisation"] == pytest.approx(0.2)
  assert four["seeds"] == 2 and four["mean"] == pytest.approx(0.8)
  assert (four["ci_low"], four["ci_high"]) == (pytest.approx(0.8 - 2.5412, abs=1e-4),
                                              pytest.approx(0.8 + 2.5412, abs=1e-4))
  assert four["generalisation"] == pytest.approx(0.8)
  lines = predictors.depth_markdown_lines(table)
  assert lines[3] == "| depth | tscore (final): mean [95% t-CI, n=2] |"
  assert lines[5].startswith("| 2 | 0.5 [0.5, 0.5] |")
  assert lines[6].startswith("| 4 | 0.8 [-1.74, 3.34] |")


def test_one_depth_has_no_across_depth_columns():
  rng = np.random.default_rng(2)
  g = rng.uniform(0, 1, 8)
  rows = [{"depth": 6, "seed": i, "generalisation": g[i], "tscore@final": g[i] + 0.1 * i,
           "tscore@saturation": rng.uniform()} for i in range(8)]
  table = predictors.correlation_rows(rows)
  lines = predictors.markdown_lines(table)
  assert lines[3] == ("| predictor | measured at | across seeds (Spearman rho) | within depth "
                      "(Spearman rho) |")
  assert lines[4] == "|---|---|---|---|"
  assert all(line.count("|") == 5 for line in lines[5:7])
  assert any(line.startswith("Not shown (no row could compute them: they need two depths or "
                             "more): across depths") for line in lines)
