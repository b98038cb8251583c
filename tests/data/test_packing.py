"""Packing buckets sized from the length distribution (sg_jax.data.packing.packing_capacities)."""

import itertools

import numpy as np
import pytest

from sg_jax.data import packing


def brute_force_cost(needs, top, num_buckets):
  """Fewest mean positions over every choice of < num_buckets capacities below `top`."""
  values = sorted(set(np.minimum(-(-np.asarray(needs) // 8) * 8, top).tolist()))
  return min(packing.computed_positions(needs, tuple(sorted(set(chosen) | {top})))
             for r in range(num_buckets) for chosen in itertools.combinations(values, r))


def test_optimal_capacities_equal_brute_force():
  rng = np.random.default_rng(0)
  for _ in range(60):
    needs = rng.integers(1, 80, size=rng.integers(1, 25))
    top = int(-(-needs.max() // 8) * 8 + 8 * rng.integers(0, 3))
    for k in (1, 2, 3, 4):
      caps = packing.optimal_capacities(needs, top, k)
      assert len(caps) <= k and caps[-1] == top and list(caps) == sorted(set(caps))
      assert all(c % 8 == 0 for c in caps)
      assert packing.computed_positions(needs, caps) == pytest.approx(
          brute_force_cost(needs, top, k), abs=1e-9)


def test_optimal_capacities_known_answer():
  # Needs 10 x 3, 20 x 1, 30 x 6 (rounded: 16, 24, 32); top 48. Two buckets: 32 + 48 computes
  # 32 for every step; three: 16 for the 3 short ones, 32 for the rest.
  needs = np.array([10] * 3 + [20] + [30] * 6)
  assert packing.optimal_capacities(needs, 48, 1) == (48,)
  assert packing.optimal_capacities(needs, 48, 2) == (32, 48)
  assert packing.optimal_capacities(needs, 48, 3) == (16, 32, 48)
  assert packing.computed_positions(needs, (16, 32, 48)) == pytest.approx((3 * 16 + 7 * 32) / 10)


def test_fewer_buckets_when_they_cost_little():
  # Every line equally long: one bucket, exactly the batch, no padding.
  lengths = np.full(100, 12)
  assert packing.packing_capacities(lengths, 8, 2, 12, num_buckets=8) == (96,)
  # Two lengths: two buckets are optimal, more add nothing.
  lengths = np.array([8] * 900 + [24] * 100)
  caps = packing.packing_capacities(lengths, 4, 1, 24, num_buckets=8)
  assert len(caps) <= 4 and caps[-1] == 96  # the 4 longest lines fit together
  # A tolerance of 0 keeps every bucket that lowers the padding at all.
  many = packing.packing_capacities(lengths, 4, 1, 24, num_buckets=8, tolerance=0.0)
  few = packing.packing_capacities(lengths, 4, 1, 24, num_buckets=8, tolerance=0.5)
  assert len(few) < len(many)


def test_every_batch_fits_the_largest_bucket_and_padding_falls():
  rng = np.random.default_rng(1)
  # A long tail (as Dyck's: mean about 40, a few lines of several hundred tokens).
  lengths = np.minimum(rng.geometric(1 / 40, size=3000), 657)
  width, batch = int(lengths.max()), 8
  caps = packing.packing_capacities(lengths, batch, 2, width, num_buckets=8)
  assert caps[-1] >= np.sort(lengths)[::-1][:batch].sum() and caps[-1] <= batch * width
  for _ in range(200):
    idx = rng.choice(len(lengths), size=batch, replace=False)
    assert lengths[idx].sum() <= caps[-1]
  needs = packing.sampled_needs(lengths, batch, 2)
  # Quantile buckets (the previous sizing) computed far more than the optimal ones.
  qs = np.quantile(needs, np.arange(1, 9) / 9)
  quantile = tuple(sorted({int(np.ceil(c / 8) * 8) for c in qs} | {batch * width}))
  assert (packing.computed_positions(needs, caps)
          < 0.7 * packing.computed_positions(needs, quantile))


def test_bad_input_is_refused_in_one_line():
  with pytest.raises(ValueError, match="packing needs training lines"):
    packing.packing_capacities(np.array([], np.int32), 8, 1, 10, num_buckets=4)
  with pytest.raises(ValueError, match="0 buckets"):
    packing.packing_capacities(np.array([3, 4]), 8, 1, 10, num_buckets=0)
