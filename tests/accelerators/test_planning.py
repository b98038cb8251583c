"""Seeds per chip and chip-hours from a few compiles (issue 53 item 4): the linear memory fit,
the seeds that fit, interpolation in depth, the grid's chip-hours and the seed count to use,
on hand-built cases with known answers."""

import pytest

from sg_jax.accelerators import planning


def test_memory_fit_through_exact_points_and_least_squares():
  fit = planning.fit_memory([1, 4], [1.5e9, 3.0e9])  # 0.5 GB per seed on top of 1 GB
  assert fit.per_seed == pytest.approx(0.5e9) and fit.constant == pytest.approx(1.0e9)
  noisy = planning.fit_memory([1, 2, 3], [1.0, 3.0, 4.0])  # slope 1.5, intercept -1/3
  assert noisy.per_seed == pytest.approx(1.5) and noisy.constant == pytest.approx(-1 / 3)
  assert noisy.peak(4) == pytest.approx(6 - 1 / 3)
  with pytest.raises(ValueError, match="two or more seed counts"):
    planning.fit_memory([2, 2], [1.0, 1.0])


def test_max_seeds_takes_the_tightest_program():
  train = planning.MemoryFit(constant=1e9, per_seed=0.5e9, seeds=(1, 4), peaks=(1.5e9, 3e9))
  evals = planning.MemoryFit(constant=0.0, per_seed=2e9, seeds=(1, 4), peaks=(2e9, 8e9))
  # 16 GB: training alone fits floor(15 / 0.5) = 30, the evaluation floor(16 / 2) = 8.
  assert planning.max_seeds([train], 16e9) == 30
  assert planning.max_seeds([train, evals], 16e9) == 8
  assert planning.max_seeds([train], 1.2e9) == 0
  flat = planning.MemoryFit(constant=1e9, per_seed=0.0, seeds=(1, 2), peaks=(1e9, 1e9))
  with pytest.raises(ValueError, match="does not grow"):
    planning.max_seeds([flat], 16e9)


def test_interpolate_is_linear_in_depth_and_exact_at_compiled_depths():
  assert planning.interpolate([2, 10], [1.0, 5.0], 2) == 1.0
  assert planning.interpolate([2, 10], [1.0, 5.0], 6) == pytest.approx(3.0)
  assert planning.interpolate([10, 2], [5.0, 1.0], 8) == pytest.approx(4.0)  # any order
  assert planning.interpolate([2, 6, 10], [1.0, 2.0, 6.0], 8) == pytest.approx(4.0)
  assert planning.interpolate([4], [2.0], 8) == pytest.approx(4.0)  # one depth: proportional


def test_grid_chip_hours_by_hand():
  # 10 seeds x 360k steps at 100 seed-steps/s = 36,000 s = 10 h per depth; 2 depths.
  assert planning.grid_chip_hours({2: 100.0, 4: 50.0}, 360_000, depths=(2, 4)) == \
      pytest.approx(10.0 + 20.0)
  with pytest.raises(ValueError, match="depth 4"):
    planning.grid_chip_hours({2: 100.0}, 1000, depths=(2, 4))


@pytest.mark.parametrize("seeds, chips, most, use, why", [
    (12, 4, 0, 12, ""),
    (10, 4, 0, 12, "10 seeds use 2 of 4 chips (2 idle)"),
    (10, 8, 0, 16, "10 seeds use 5 of 8 chips (3 idle)"),
    (40, 4, 8, 32, "10 per chip on 4 chips, more than the 8 that fit"),
    (3, 1, 0, 3, ""),
])
def test_seeds_to_use(seeds, chips, most, use, why):
  got_use, got_why = planning.seeds_to_use(seeds, chips, most)
  assert got_use == use and why in got_why and (got_why == "") == (why == "")
