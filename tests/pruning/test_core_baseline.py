"""The random-mask baseline of the heuristic core (sg_jax/pruning/core.py, core_table.py;
docs/pruning.md, "The random-mask baseline"): the exact core-size distribution and expected
Jaccard against a brute-force enumeration of every set of masks on a small case, the simulated
intervals, and the rows prune_core writes."""

import itertools

import numpy as np
import pytest

from sg_jax.pruning import core, core_table

UNITS, SIZES = 6, (3, 3, 2)


def enumeration():
  """(core sizes, mean pairwise Jaccards) of every equally likely set of masks of SIZES."""
  subsets = [list(itertools.combinations(range(UNITS), m)) for m in SIZES]
  cores, jaccards = [], []
  for chosen in itertools.product(*subsets):
    masks = np.zeros((len(SIZES), UNITS), bool)
    for p, units in enumerate(chosen):
      masks[p, list(units)] = True
    cores.append(int(masks.all(0).sum()))
    jaccards.append(core.mean_jaccard(masks))
  return np.array(cores), np.array(jaccards)


def test_exact_baseline_equals_brute_force_enumeration():
  cores, jaccards = enumeration()
  assert len(cores) == 20 * 20 * 15
  pmf = core.random_core_size_pmf(UNITS, SIZES)
  np.testing.assert_allclose(pmf, np.bincount(cores, minlength=UNITS + 1) / len(cores),
                             atol=1e-12)
  base = core.random_mask_baseline(UNITS, SIZES, observed_core=2, num_draws=4000, seed=1)
  # E[core] = 6 * (1/2)(1/2)(1/3) = 0.5
  assert base["core_mean"] == pytest.approx(cores.mean()) == pytest.approx(0.5)
  assert base["core_p_value"] == pytest.approx(np.mean(cores >= 2))
  assert base["jaccard_mean"] == pytest.approx(jaccards.mean())
  # the simulated 95% ranges are the enumeration's percentiles, up to sampling
  assert (base["core_q025"], base["core_q975"]) == tuple(
      float(q) for q in np.percentile(cores, [2.5, 97.5]))
  lo, hi = np.percentile(jaccards, [2.5, 97.5])
  assert base["jaccard_q025"] == pytest.approx(lo, abs=0.03)
  assert base["jaccard_q975"] == pytest.approx(hi, abs=0.03)


def test_pairwise_jaccard_expectation_and_edge_cases():
  # two random 1-of-2 subsets: equal (J = 1) or disjoint (J = 0) with probability 1/2
  assert core.expected_random_jaccard(2, 1, 1) == pytest.approx(0.5)
  assert core.expected_random_jaccard(5, 0, 0) == 1.0
  assert core.expected_random_jaccard(5, 5, 2) == pytest.approx(2 / 5)
  one = core.random_mask_baseline(4, [2], observed_core=2, num_draws=10)
  assert one["core_mean"] == 2.0 and one["core_p_value"] == 1.0
  assert np.isnan(one["jaccard_mean"]) and np.isnan(one["jaccard_q025"])
  with pytest.raises(ValueError, match="subset sizes"):
    core.random_core_size_pmf(4, [5])
  with pytest.raises(ValueError, match="num_draws"):
    core.random_mask_baseline(4, [2, 2], num_draws=0)


def test_core_rows_carry_the_baseline_of_their_masks():
  # 3 subnetworks of 6 heads (+ 2 MLP blocks, which the baseline ignores) keeping 3, 3, 2 heads
  subnetworks = np.zeros((3, 8), bool)
  subnetworks[0, [0, 1, 2, 6, 7]] = True
  subnetworks[1, [0, 1, 3, 6, 7]] = True
  subnetworks[2, [0, 1, 6]] = True
  names = [f"u{i}" for i in range(8)]
  rows = core_table.core_rows(10, 0, 0.5, subnetworks, names, 6, subnetworks.all(0), {})
  got = {r[3]: r[4] for r in rows}
  assert got["core/num_heads"] == 2
  cores, jaccards = enumeration()
  assert got["core_random/num_heads"] == pytest.approx(0.5)
  assert got["core_random/num_heads/p_value"] == pytest.approx(np.mean(cores >= 2))
  assert got["core_random/jaccard_within_heads"] == pytest.approx(jaccards.mean())
  assert {f"core_random/{n}" for n in core_table.RANDOM_CORE} <= set(got)
  # seeded: the same rows again
  assert core_table.core_rows(10, 0, 0.5, subnetworks, names, 6, subnetworks.all(0), {}) == rows
