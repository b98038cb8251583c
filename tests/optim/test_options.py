"""`optim.OptimOptions`: the `optim` section resolved once (decay end, one value per seed), and
the one-value functions refusing per-seed values in one line."""

import pytest

from sg_jax import configlib
from sg_jax.optim import adamw, schedules
from sg_jax.optim.options import OptimOptions


def _config(**fields):
  config = configlib.apply_config_string(configlib.base_config("question"), "tiny",
                                         configlib.PRESETS)
  for field, value in fields.items():
    configlib.set_field(config, field, value)
  return config


def test_decay_end_and_per_seed_values_are_resolved():
  options = OptimOptions.from_config(_config(**{"num_seeds": 3, "optim.decay_steps": 0,
                                                "train.num_steps": 77,
                                                "optim.learning_rate": (1e-3, 2e-3, 3e-3)}))
  assert options.decay_steps == 77  # 0 = the run's last step
  assert options.learning_rate == (1e-3, 2e-3, 3e-3)
  assert options.warmup_steps == (10, 10, 10)  # the tiny preset's one value, once per seed
  assert options.seed(1).learning_rate == (2e-3,) and options.seed(1).b1 == (0.9,)
  set_end = OptimOptions.from_config(_config(**{"optim.decay_steps": 500}))
  assert set_end.decay_steps == 500


def test_a_compiled_in_value_needs_one_value():
  options = OptimOptions.from_config(_config(**{"optim.b2": (0.99, 0.999)}))
  assert options.single("b1") == 0.9
  with pytest.raises(ValueError, match=r"^optim.b2 holds one value per seed \(0.99, 0.999\)"):
    adamw.make_optimizer(options)
  # The learning rate of each seed is its own schedule's.
  lrs = OptimOptions.from_config(_config(**{"optim.learning_rate": (1e-3, 4e-3),
                                            "optim.warmup_steps": (4, 0),
                                            "optim.schedule": "constant"}))
  assert schedules.learning_rates(lrs, 2).tolist() == pytest.approx([5e-4, 4e-3])
