r"""Bytes on disk per seed that a run's checkpoints take, with and without the preservation
policy (issue 53 item 5; `sg_jax.checkpointing.policy`). Computed from the config alone: the
shapes of the stacked training state (`jax.eval_shape` of the run's own init, nothing trained or
compiled) and the save schedule.

  python benchmarks/checkpoint_disk.py --config=configs/tense.py:depth=8
  python benchmarks/checkpoint_disk.py --config=configs/tense.py:depth=8 --keep_full=2 \
      --params_every=30000 --num_steps=300000

Prints the bytes of one full checkpoint and one parameter-only checkpoint per seed, the saves of
a `--num_steps` run (default: the config's) and the disk per seed and per run at its end: every
save a full state (`checkpoint.keep_full=0`, the default) against the policy (`--keep_full`,
`--params_every`; default: the config's, else 2 and checkpoint.every).
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
import jax
import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from sg_jax import checkpointing
from sg_jax import tasks
from sg_jax.config import per_seed
from sg_jax.config.cli_options import parse_flags
from sg_jax.step import train_fns_from_config
from sg_jax.training.state import seed_keys

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file with a config string.",
                                          lock_config=False)
_KEEP_FULL = flags.DEFINE_integer("keep_full", None, "checkpoint.keep_full of the policy "
                                  "(default: the config's, else 2).")
_PARAMS_EVERY = flags.DEFINE_integer("params_every", None, "checkpoint.params_every of the "
                                     "policy (default: the config's).")
_NUM_STEPS = flags.DEFINE_integer("num_steps", None, "Run length (default: train.num_steps).")
flags.mark_flags_as_required(["config"])


def abstract_state(config):
  """The stacked training state's shapes [seed, ...] (padded layout: the state does not depend
  on the packing)."""
  config.train.packing = False
  vocab_size = tasks.from_config(config).vocab().size
  fns = train_fns_from_config(config, vocab_size)
  return jax.eval_shape(fns.init, np.asarray(seed_keys(per_seed.seed_ids(config, "data"))),
                        np.asarray(seed_keys(per_seed.seed_ids(config, "init"))),
                        per_seed.hparam_arrays(config)["init_scale"])


def main(argv):
  del argv
  config = _CONFIG.value
  if _NUM_STEPS.value is not None:
    config.train.num_steps = _NUM_STEPS.value
  if _KEEP_FULL.value is not None:
    config.checkpoint.keep_full = _KEEP_FULL.value
  elif not config.checkpoint.keep_full:
    config.checkpoint.keep_full = 2
  if _PARAMS_EVERY.value is not None:
    config.checkpoint.params_every = _PARAMS_EVERY.value
  policy = checkpointing.Preservation.from_config(config)
  seeds = int(config.num_seeds)
  full, analysis = checkpointing.state_bytes(abstract_state(config), seeds)
  num_steps = int(config.train.num_steps)
  disk = checkpointing.disk_bytes_per_seed(full, analysis, num_steps, policy)
  gb = 1e9
  print(f"config: {config.task}, depth {config.model.num_layers}, d_model {config.model.d_model},"
        f" {seeds} seeds, {num_steps} steps, checkpoint.every {policy.every}")
  print(f"one checkpoint per seed: full state {full / 1e6:.1f} MB, parameters only "
        f"{analysis / 1e6:.1f} MB")
  print(f"keep_full=0 (every save a full state): {disk['before'] / gb:.2f} GB per seed, "
        f"{disk['before'] * seeds / gb:.1f} GB for {seeds} seeds")
  print(f"keep_full={policy.keep_full}, params_every={policy.params_every}: "
        f"{disk['after'] / gb:.2f} GB per seed ({disk['full_states']} full states + "
        f"{disk['analysis_checkpoints']} parameter-only), {disk['after'] * seeds / gb:.1f} GB for "
        f"{seeds} seeds ({disk['before'] / disk['after']:.1f}x less)")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
