"""Predictors of generalisation (sg_jax/report/predictors.py) on hand-built tables with known
rank correlations: across seeds, across depths (stratified bootstrap) and within depth."""

import math

import numpy as np
import pytest
import scipy.stats

from sg_jax.report import predictors
from sg_jax.report.reading import Run


def _rows(table):
  return [{"depth": d, "seed": s, "generalisation": g, "tscore@final": t}
          for d, s, g, t in table]


def test_perfectly_ordered_table_gives_rho_one_with_a_degenerate_interval():
  rows = _rows([(d, s, 0.1 * d + 0.01 * s, 0.1 * d + 0.01 * s) for d in (2, 4, 6) for s in range(4)])
  got = predictors.correlations(rows, "tscore@final", num_resamples=300)
  for kind in ("across_seeds", "across_depths", "within_depth"):
    rho, low, high = got[kind]
    assert rho == pytest.approx(1.0) and low == pytest.approx(1.0) and high == pytest.approx(1.0)


def test_within_depth_and_across_depths_can_disagree():
  """Across depths the predictor tracks generalisation (depth means rise together), but within
  each depth it is reversed: rho_across_depths = 1, within = -1; the pooled value lies between
  and equals scipy's Spearman of all pairs."""
  table = []
  for k, d in enumerate((2, 4, 6)):
    for s in range(4):
      table.append((d, s, k + 0.1 * s, k - 0.05 * s))
  rows = _rows(table)
  got = predictors.correlations(rows, "tscore@final", num_resamples=300)
  assert got["across_depths"][0] == pytest.approx(1.0)
  assert got["within_depth"][0] == pytest.approx(-1.0)
  want = scipy.stats.spearmanr([t for *_, t in table], [g for _, _, g, _ in table]).statistic
  assert got["across_seeds"][0] == pytest.approx(want)
  low, high = got["across_seeds"][1:]
  assert low <= got["across_seeds"][0] <= high


def test_a_noisy_table_has_an_interval_around_its_rho_and_nan_for_too_few():
  rng = np.random.default_rng(0)
  g = rng.uniform(0, 1, 40)
  t = g + rng.normal(0, 0.3, 40)
  rows = _rows([(2 + 2 * (i % 4), i, g[i], t[i]) for i in range(40)])
  rho, low, high = predictors.correlations(rows, "tscore@final", num_resamples=500)["across_seeds"]
  assert low < rho < high and 0.3 < rho < 0.95
  assert math.isnan(predictors.spearman([1, 2], [1, 2]))
  assert math.isnan(predictors.spearman([1, 1, 1], [1, 2, 3]))
  with pytest.raises(KeyError):
    predictors.correlations(rows, "weight_norm@final")


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
  1.0 (mean 0.8, interval inside [0.6, 1.0]); a NaN seed is left out of the count and of the
  generalisation mean; the table lists both depths in order."""
  rows = _rows([(2, 0, 0.1, 0.5), (2, 1, 0.3, 0.5), (4, 0, 0.9, 0.6), (4, 1, 0.7, 1.0),
                (4, 2, 0.0, math.nan)])
  table = predictors.depth_rows(rows)
  assert [(r["predictor"], r["moment"], r["depth"]) for r in table] == [
      ("tscore", "final", 2), ("tscore", "final", 4)]
  two, four = table
  assert (two["seeds"], two["mean"], two["ci_low"], two["ci_high"]) == (2, 0.5, 0.5, 0.5)
  assert two["generalisation"] == pytest.approx(0.2)
  assert four["seeds"] == 2 and four["mean"] == pytest.approx(0.8)
  assert 0.6 <= four["ci_low"] < 0.8 < four["ci_high"] <= 1.0
  assert four["generalisation"] == pytest.approx(0.8)
  lines = predictors.depth_markdown_lines(table)
  assert lines[3] == "| depth | tscore (final) |"
  assert lines[5].startswith("| 2 | 0.5 [0.5, 0.5] |") and lines[6].startswith("| 4 | 0.8 [")
