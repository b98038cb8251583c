r"""Entry point: train many seeds of the structural-grokking LM in one process.

  python -m sg_jax.main --config=configs/tense.py:depth=8 --workdir=runs/tense8
  python -m sg_jax.main --config=configs/question.py:quick --workdir=runs/quick \
      --config.train.num_steps=5000

On a CPU-only machine the host is split into 2 x cores XLA devices and the seeds are spread
over them (`sg_jax.host_devices`; set XLA_FLAGS=--xla_force_host_platform_device_count=N yourself
to choose N).

Rerunning the same command resumes from the latest checkpoint in --workdir. On SIGTERM/SIGINT
the run finishes the current compiled call, writes a checkpoint and exits with code 75.
"""

import sys

from sg_jax import host_devices

host_devices.configure_cpu_devices()  # before JAX starts: 2 x cores CPU devices

# pylint: disable=wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from sg_jax import checkpointing
from sg_jax import metric_logging
from sg_jax import sharding
from sg_jax import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file with an optional config string, e.g. configs/question.py:quick.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and data.")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False,
    "Resume a workdir even though it was written with a different config.")
_TENSORBOARD = flags.DEFINE_bool("tensorboard", True, "Also write TensorBoard summaries (clu).")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False,
    "Call jax.distributed.initialize() first (TPU pods / multi-node GPU): the seed axis is then "
    "sharded over the devices of all hosts.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  sg_log = metric_logging.setup_cli_logging()
  if _MULTIHOST.value:
    sharding.initialize_distributed()
  try:
    result = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value,
                                      allow_config_change=_ALLOW_CONFIG_CHANGE.value,
                                      tensorboard=_TENSORBOARD.value)
  except train.Preempted as e:
    sg_log.warning("%s; rerun the same command to resume", e)
    sys.exit(train.EXIT_PREEMPTED)
  except (ValueError, OSError, checkpointing.CheckpointError, checkpointing.WorkdirError) as e:
    sys.exit(f"error: {e}")
  summary = {k: [round(float(x), 4) for x in v] for k, v in result["eval"].items()}
  print(f"finished at step {result['step']}; final per-seed metrics: {summary}")


def parse_flags(argv):
  """absl flag parsing that reports a bad --config (e.g. an unknown key in the config string)
  as one line instead of a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    sys.exit(f"error: {lines[-1] if lines else e}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
