"""sg_jax.stats.crossed: the two-way decomposition against statsmodels' ANOVA, the restricted
permutation p-value against a brute-force enumeration of every arrangement, hand-built designs
with a known answer, and the categorical (indicator) form against the Gini impurity."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf

from sg_jax.stats import crossed


def _design(levels_a, levels_b, per_cell=1):
  a = np.repeat(np.arange(levels_a), levels_b * per_cell)
  b = np.tile(np.repeat(np.arange(levels_b), per_cell), levels_a)
  return a, b


@pytest.mark.parametrize("per_cell", [1, 2])
def test_sums_of_squares_equal_statsmodels_anova(per_cell):
  rng = np.random.default_rng(1)
  a, b = _design(4, 3, per_cell)
  y = 0.3 * a + 0.1 * b + rng.normal(0, 0.2, a.size)
  result = crossed.crossed_variance(y, a, b, num_resamples=199)
  formula = "y ~ C(a) + C(b)" + (" + C(a):C(b)" if per_cell > 1 else "")
  table = sm.stats.anova_lm(smf.ols(formula, pd.DataFrame({"y": y, "a": a, "b": b})).fit(),
                            typ=2)
  total = table["sum_sq"].sum()
  assert result.total_ss == pytest.approx(total)
  assert result.factors[0].share == pytest.approx(table.loc["C(a)", "sum_sq"] / total)
  assert result.factors[1].share == pytest.approx(table.loc["C(b)", "sum_sq"] / total)
  assert result.residual_share == pytest.approx(table.loc["Residual", "sum_sq"] / total)
  if per_cell > 1:
    assert result.interaction_share == pytest.approx(table.loc["C(a):C(b)", "sum_sq"] / total)
  else:
    assert math.isnan(result.interaction_share)


def _brute_force_p(y, codes, levels, other):
  """Every arrangement of y within the strata of `other` (no symmetry used)."""
  strata = [np.flatnonzero(other == l) for l in np.unique(other)]
  observed = crossed._factor_ss(y[:, None], codes, levels)  # pylint: disable=protected-access
  hits = count = 0
  for perms in itertools.product(*[itertools.permutations(s) for s in strata]):
    order = np.empty(y.size, np.int64)
    for s, p in zip(strata, perms):
      order[s] = p
    count += 1
    ss = crossed._factor_ss(y[order][:, None], codes, levels)  # pylint: disable=protected-access
    hits += ss >= observed - 1e-12
  return hits / count


@pytest.mark.parametrize("seed", [0, 3])
def test_permutation_p_equals_brute_force_enumeration(seed):
  """3 x 3, one seed per cell: (3!)^3 = 216 arrangements by brute force; the module fixes the
  first stratum (36) and must give the same p for both factors."""
  rng = np.random.default_rng(seed)
  a, b = _design(3, 3)
  y = 0.4 * a + rng.normal(0, 0.3, a.size)
  result = crossed.crossed_variance(y, a, b)
  assert result.factors[0].exact and result.factors[1].exact
  assert result.factors[0].p == pytest.approx(_brute_force_p(y, a, 3, b))
  assert result.factors[1].p == pytest.approx(_brute_force_p(y, b, 3, a))
  assert result.factors[0].min_p == pytest.approx(math.factorial(3) / 216)


def test_drawn_p_near_brute_force(monkeypatch):
  """2 x 2 with 2 seeds per cell: exact p equals the brute force; with enumeration switched
  off (EXACT_LIMIT 10) 20,000 draws land within 0.01 of it."""
  rng = np.random.default_rng(2)
  a, b = _design(2, 2, 2)
  y = 0.5 * a + rng.normal(0, 0.3, a.size)
  exact = _brute_force_p(y, a, 2, b)
  result = crossed.crossed_variance(y, a, b)
  assert result.factors[0].exact
  assert result.factors[0].p == pytest.approx(exact)
  monkeypatch.setattr(crossed, "EXACT_LIMIT", 10)
  drawn = crossed.crossed_variance(y, a, b, num_resamples=20_000)
  assert not drawn.factors[0].exact
  assert drawn.factors[0].p == pytest.approx(exact, abs=0.01)


def test_outcome_set_by_one_factor():
  """Final accuracy = the initialisation's level exactly: init explains all of it (share 1,
  p = min p, the most extreme arrangement), data order none (share 0, p = 1)."""
  a, b = _design(4, 4)
  result = crossed.crossed_variance(a / 3.0, a, b, names=("seeds.init", "seeds.data"))
  init, data = result.factors
  assert (init.name, data.name) == ("seeds.init", "seeds.data")
  assert init.share == pytest.approx(1.0) and data.share == pytest.approx(0.0)
  assert init.p == pytest.approx(init.min_p) == pytest.approx(1 / 24 ** 3)
  assert data.p == pytest.approx(1.0)
  assert init.detectable < 1 and math.isfinite(init.detectable)


def test_categorical_outcome_is_gini_decomposition():
  """Final rules as categories: the total sum of squares of the indicator columns is n times
  the Gini impurity, and a rule fixed by the data order gives the data order share 1."""
  a, b = _design(4, 4)
  rules = np.array(["hierarchical", "linear", "linear", "other"])[b]
  result = crossed.crossed_variance(rules, a, b)
  share = np.array([4, 8, 4]) / 16
  assert result.total_ss == pytest.approx(16 * (1 - np.sum(share ** 2)))
  assert result.factors[1].share == pytest.approx(1.0)
  assert result.factors[0].share == pytest.approx(0.0)


def test_bad_designs_raise_one_clear_error():
  a, b = _design(2, 2)
  with pytest.raises(ValueError, match="balanced, complete"):
    crossed.crossed_variance([0.1, 0.2, 0.3], a[:3], b[:3])
  with pytest.raises(ValueError, match="at least 2 levels"):
    crossed.crossed_variance([0.1, 0.2], [0, 0], [0, 1])
  with pytest.raises(ValueError, match="finite"):
    crossed.crossed_variance([0.1, math.nan, 0.3, 0.4], a, b)
  with pytest.raises(ValueError, match="one entry per seed"):
    crossed.crossed_variance([0.1, 0.2, 0.3, 0.4], a, b[:3])
