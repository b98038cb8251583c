"""The checkpoint preservation policy (issue 53 item 5): what it keeps and deletes, what the
analysis and a resume read, the disk it needs, and a resumed run equal to an uninterrupted one."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from sg_jax import checkpointing
from sg_jax import configlib
from sg_jax import train
from sg_jax.analysis import driver as analysis_driver
from sg_jax.records import long_csv
from sg_jax.records import metric_logging
from sg_jax.runtime import stop_signal
from sg_jax.training.state import TrainState
from tests import run_files


def _state(step, seeds=2):
  """A small stacked TrainState whose arrays all hold `step` (params, moments, flags)."""
  full = lambda shape, dtype=jnp.float32: jnp.full((seeds,) + shape, step, dtype)
  return TrainState(
      step=full((), jnp.int32), params={"w": full((3, 4)), "b": full((4,))},
      opt_state={"mu": {"w": full((3, 4))}, "nu": {"w": full((3, 4))}},
      key=full((2,), jnp.uint32), diverged=jnp.zeros((seeds,), bool),
      diverged_step=full((), jnp.int32) * 0 - 1, sums={"loss": full(())})


def _meta(keep_full, params_every, every=10, num_steps=60):
  config = configlib.base_config("question")
  config.checkpoint.every, config.checkpoint.keep_full = every, keep_full
  config.checkpoint.params_every, config.train.num_steps = params_every, num_steps
  return checkpointing.make_meta(config, '{"tokens": []}', [0, 1])


def test_policy_keeps_the_newest_full_states_and_the_analysis_steps(tmp_path):
  """Saves at 0, 10, 20, 30 and 40 (the last step) and a stop signal's save at 25, with
  keep_full=2 and params_every=20: full states of the newest 2 saves; parameter-only checkpoints
  at the multiples of 20 and the newest 2 saves."""
  workdir = str(tmp_path)
  writer = checkpointing.CheckpointWriter(workdir)
  meta = _meta(keep_full=2, params_every=20, num_steps=40)
  for step in (0, 10, 20, 25, 30, 40):
    writer.save(step, _state(step), meta)
  writer.close()
  assert checkpointing.all_steps(workdir, checkpointing.FULL_STATE_DIR) == [30, 40]
  assert checkpointing.all_steps(workdir) == [0, 20, 30, 40]
  for step in (0, 20, 30):
    stored = checkpointing.stored_arrays(workdir, step)
    assert checkpointing.is_analysis_only(stored)
    assert sorted(stored) == ["diverged", "diverged_step", "params/b", "params/w", "step"]
  assert not checkpointing.is_analysis_only(
      checkpointing.stored_arrays(workdir, 40, checkpointing.FULL_STATE_DIR))
  # The analysis reads parameters and divergence flags of a parameter-only checkpoint.
  restored = checkpointing.restore(workdir, 20, params_only=True)
  np.testing.assert_array_equal(restored.state["params"]["w"], np.full((2, 3, 4), 20.0))
  assert restored.seeds == [0, 1] and checkpointing.diverged_seeds(workdir, 20) == {}
  # A resume restores the newest full state, moments included.
  manager = checkpointing.make_manager(workdir, create=False, asynchronous=False)
  try:
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                      _state(0))
    step, state = checkpointing.restore_latest_good(manager, workdir, abstract)
  finally:
    manager.close()
  assert step == 40
  np.testing.assert_array_equal(state.opt_state["nu"]["w"], np.full((2, 3, 4), 40.0))


def test_without_a_policy_every_checkpoint_is_a_full_state(tmp_path):
  workdir = str(tmp_path)
  writer = checkpointing.CheckpointWriter(workdir)
  for step in (0, 10, 20):
    writer.save(step, _state(step), _meta(keep_full=0, params_every=0))
  writer.close()
  assert checkpointing.all_steps(workdir) == [0, 10, 20]
  assert not os.path.exists(os.path.join(workdir, checkpointing.FULL_STATE_DIR))
  assert not checkpointing.is_analysis_only(checkpointing.stored_arrays(workdir, 10))


def test_disk_bytes_of_a_300k_step_run_by_hand():
  """Saves at 0, 3k, ..., 300k (101); 300 bytes full, 100 parameters only per seed."""
  config = ml_collections.ConfigDict({"checkpoint": {"every": 3000, "keep_full": 2,
                                                     "params_every": 0},
                                      "train": {"num_steps": 300_000}})
  policy = checkpointing.Preservation.from_config(config)
  got = checkpointing.disk_bytes_per_seed(300, 100, 300_000, policy)
  assert got == {"before": 101 * 300, "after": 2 * 300 + 101 * 100, "full_states": 2,
                 "analysis_checkpoints": 101}
  config.checkpoint.params_every = 30_000  # 0, 30k, ..., 300k: 11
  got = checkpointing.disk_bytes_per_seed(300, 100, 300_000,
                                          checkpointing.Preservation.from_config(config))
  assert got["after"] == 2 * 300 + 11 * 100 and got["analysis_checkpoints"] == 11


def test_state_bytes_counts_the_analysis_fields_apart():
  abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))
  full, kept = checkpointing.state_bytes(abstract, num_seeds=2)
  # params 16 floats, moments 24, key 2 uint32, sums 1, step and diverged_step 2 int32, 1 bool
  assert (full, kept) == (4 * (16 + 24 + 2 + 1 + 2) + 1, 4 * (16 + 2) + 1)
  with pytest.raises(ValueError, match="num_seeds"):
    checkpointing.state_bytes(abstract, num_seeds=0)


@pytest.mark.parametrize("fields, message", [({"keep_full": -1}, "keep_full"),
                                             ({"params_every": 15}, "params_every")])
def test_bad_policy_fields_are_named(fields, message):
  config = ml_collections.ConfigDict({"checkpoint": {"every": 10, "keep_full": 1,
                                                     "params_every": 0},
                                      "train": {"num_steps": 60}})
  config.checkpoint.update(fields)
  with pytest.raises(ValueError, match=message):
    checkpointing.Preservation.from_config(config)


@pytest.mark.slow
def test_resume_under_the_policy_equals_an_uninterrupted_run(tiny_config, tmp_path):
  """tiny preset, 60 steps, saves every 20: stopped by SIGTERM after the call 20 -> 30 (a save
  outside the analysis steps) and resumed with keep_full=1, against one uninterrupted run without
  a policy."""
  fields = {"train.num_steps": 60, "train.steps_per_call": 10}
  plain = str(tmp_path / "plain")
  train.train_and_evaluate(tiny_config(**fields), plain, tensorboard=False)
  kept = str(tmp_path / "kept")

  config = tiny_config(**fields, **{"checkpoint.keep_full": 1})
  with pytest.raises(stop_signal.Preempted, match="step 30"):
    # the call 20 -> 30 is the one running when the signal is handled
    train.train_and_evaluate(config, kept, tensorboard=False,
                             state_hook=run_files.sigterm_at(20))
  assert checkpointing.all_steps(kept, checkpointing.FULL_STATE_DIR) == [30]
  assert checkpointing.all_steps(kept) == [0, 20, 30]
  train.train_and_evaluate(config, kept, tensorboard=False)
  assert run_files.rows(kept) == run_files.rows(plain)
  assert checkpointing.all_steps(kept) == checkpointing.all_steps(plain) == [0, 20, 40, 60]
  assert checkpointing.all_steps(kept, checkpointing.FULL_STATE_DIR) == [60]
  for step in (20, 60):
    a = checkpointing.restore(kept, step, params_only=True).state["params"]
    b = checkpointing.restore(plain, step, params_only=True).state["params"]
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)
  assert metric_logging.read_table(os.path.join(kept, "metrics.csv"))
  # The analysis reads the parameter-only checkpoints as it reads full ones.
  for workdir in (kept, plain):
    analysis_driver.analyze(workdir, groups=["weight_norm"], num_sentences=4)
  rows = long_csv.read_rows(os.path.join(kept, "analysis.csv"))
  assert {r[0] for r in rows} == {0, 20, 40, 60}  # every analysis checkpoint, weight norms
  assert rows == long_csv.read_rows(os.path.join(plain, "analysis.csv"))
