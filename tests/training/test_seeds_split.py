"""The initialisation seed apart from the data order (`seeds.init`, `seeds.data`;
sg_jax.config.per_seed.seed_ids): equal init seeds give equal initial parameters whatever the data
seeds, equal data seeds give the same batches (and dropout keys) whatever the init seeds, and
the defaults keep every run as it was."""

import jax
import numpy as np
import pytest

from sg_jax import configlib
from sg_jax import step as step_lib
from sg_jax.config import checks as config_checks
from sg_jax.config import per_seed
from sg_jax.training.sampling import batch_indices, epoch_permutation
from sg_jax.training.state import seed_keys

NUM_LINES, BATCH = 64, 8


def _config(**fields):
  config = configlib.apply_config_string(configlib.base_config("question"), "tiny",
                                         configlib.PRESETS)
  config.num_seeds = 4  # one compilation of the init functions serves every test
  for field, value in fields.items():
    configlib.set_field(config, field, value)
  config_checks.validate(config)
  return config


def _init(config):
  """(initial params [S, ...] flattened per seed, data key data [S, 2]).

  The init functions of one config serve all (the seeds and scales are arguments): one
  compilation per number of seeds."""
  fns = step_lib.train_fns_from_config(_config(), 20)
  state = fns.init(seed_keys(per_seed.seed_ids(config, "data")),
                   seed_keys(per_seed.seed_ids(config, "init")),
                   per_seed.hparam_arrays(config)["init_scale"])
  flat = np.stack([np.concatenate([np.asarray(x[i]).reshape(-1)
                                   for x in jax.tree_util.tree_leaves(state.params)])
                   for i in range(int(config.num_seeds))])
  return flat, state.key


def _first_batches(keys, steps=3):
  """int32 [S, steps, batch]: the lines of each seed's first steps
  (`training.sampling.line_sampler`)."""
  spe = NUM_LINES // BATCH
  out = []
  for key in keys:
    perm = epoch_permutation(key, 0, NUM_LINES, spe)
    out.append([np.asarray(batch_indices(perm, t, BATCH, spe)) for t in range(steps)])
  return np.asarray(out)


def test_same_init_seed_other_data_seed_same_params_other_batches():
  params, keys = _init(_config(**{"seeds.init": (7,), "seeds.data": (0, 1, 0, 1)}))
  np.testing.assert_array_equal(params[0], params[1])
  batches = _first_batches(keys)
  assert not np.array_equal(batches[0], batches[1])
  assert not np.array_equal(np.asarray(keys[0]), np.asarray(keys[1]))  # dropout, masking too


def test_same_data_seed_other_init_seed_other_params_same_batches():
  params, keys = _init(_config(**{"seeds.init": (0, 1, 0, 1), "seeds.data": (5,)}))
  assert np.abs(params[0] - params[1]).max() > 1e-2
  batches = _first_batches(keys)
  np.testing.assert_array_equal(batches[0], batches[1])
  np.testing.assert_array_equal(np.asarray(keys[0]), np.asarray(keys[1]))


def test_defaults_are_the_seed_ids_and_change_nothing():
  config = _config(first_seed=3)
  assert per_seed.seed_ids(config, "init") == per_seed.seed_ids(config, "data") == [3, 4, 5, 6]
  params, keys = _init(config)
  # The call of runs from before seeds.* (the init keys are the data keys, no scale).
  before = step_lib.train_fns_from_config(_config(), 20).init(seed_keys([3, 4, 5, 6]))
  np.testing.assert_array_equal(np.asarray(keys), np.asarray(before.key))
  np.testing.assert_array_equal(
      params, np.stack([np.concatenate([np.asarray(x[i]).reshape(-1)
                                        for x in jax.tree_util.tree_leaves(before.params)])
                        for i in range(4)]))
  # A seed's own id given explicitly is the default.
  crossed = _config(**{"seeds.init": (3, -1, 5, -1), "seeds.data": (-1, 4, -1, 6)},
                    first_seed=3)
  np.testing.assert_array_equal(_init(crossed)[0], params)


def test_crossing_inits_and_data_orders():
  config = _config(**{"seeds.init": (0, 1, 0, 1), "seeds.data": (0, 0, 1, 1)})
  assert per_seed.seed_ids(config, "init") == [0, 1, 0, 1]
  assert per_seed.seed_ids(config, "data") == [0, 0, 1, 1]
  params, keys = _init(config)
  np.testing.assert_array_equal(params[0], params[2])
  np.testing.assert_array_equal(params[1], params[3])
  batches = _first_batches(keys)
  np.testing.assert_array_equal(batches[0], batches[1])
  np.testing.assert_array_equal(batches[2], batches[3])
  assert not np.array_equal(batches[0], batches[2])


def test_init_scale_multiplies_weight_matrices_only():
  base, _ = _init(_config(**{"seeds.init": (0,)}))
  scaled, _ = _init(_config(**{"seeds.init": (0,), "model.init_scale": (1.0, 0.5, 1.0, 2.0)}))
  np.testing.assert_array_equal(scaled[0], base[0])
  changed = scaled[1] != base[1]
  np.testing.assert_allclose(scaled[1][changed], 0.5 * base[1][changed], rtol=1e-7)
  # LayerNorm gains (1) and biases (0) stay; the matrices (most of the scalars) move.
  assert 0.5 < changed.mean() < 1.0
  assert set(np.unique(base[1][~changed])) <= {0.0, 1.0}


@pytest.mark.parametrize("value,message", [
    ((-2,), r"seeds.init needs integers >= 0 \(or -1 = the seed id\)"),
    ((0, 1, 2), r"seeds.init needs one value or one per seed: got 3 values for 4 seeds"),
    ((0.5,), r"seeds.init needs integers")])
def test_bad_seeds_are_refused_in_one_line(value, message):
  with pytest.raises(ValueError, match=message):
    _config(**{"seeds.init": value})
