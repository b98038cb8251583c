r"""Entry point: train many seeds of the structural-grokking LM in one process.

  python -m sg_jax.main --config=configs/tense.py:depth=8 --workdir=runs/tense8
  python -m sg_jax.main --config=configs/question.py:quick --workdir=runs/quick \
      --config.train.num_steps=5000

On a CPU-only machine the host is split into 2 x cores XLA devices and the seeds are spread
over them (`sg_jax.runtime.host_devices`; set XLA_FLAGS=--xla_force_host_platform_device_count=N yourself
to choose N).

Several processes together (on this machine or on several hosts; docs/sweeps_and_launch.md):
start the same command once per process with `--multihost --coordinator_address=HOST:PORT
--num_processes=N --process_id=I`. If one process dies the others stop within about
--heartbeat_timeout_seconds with one line; rerunning every process resumes.

Rerunning the same command resumes from the latest checkpoint in --workdir (a finished run says
so and trains nothing). SIGTERM/SIGINT end the run with exit code 75 and one line: from the first
second of start-up (data generation, compilation, the step-0 evaluation) at once, as nothing is
unsaved then; during training after the current compiled call (at most about
`train.max_call_seconds`, 10 s by default), with a checkpoint of that step.
"""

import logging
import os
import signal
import sys

from sg_jax.runtime import startup_signals
from sg_jax.runtime.exit_codes import STOP_EXIT_SECONDS


if __name__ == "__main__":
  # The imports below take seconds and nothing is unsaved yet: a stop signal ends the process
  # with one line from here on, until train_and_evaluate installs its own handling.
  startup_signals.install()
from sg_jax.runtime import host_devices  # pylint: disable=wrong-import-position

host_devices.configure_cpu_devices()  # before JAX starts: 2 x cores CPU devices

# pylint: disable=wrong-import-position
from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from sg_jax import configlib
from sg_jax.config.cli_options import parse_flags
from sg_jax import train
from sg_jax.accelerators import profiling
from sg_jax.config import checks as config_checks
from sg_jax.records import metric_logging
from sg_jax.runtime import compile_cache
from sg_jax.runtime import config_changes
from sg_jax.runtime import sharding
from sg_jax.runtime.commands import command_errors, exit_at_once

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file with an optional config string, e.g. configs/question.py:quick.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and data.")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False,
    config_changes.config_change_help())
_SKIP_MEMORY_CHECK = flags.DEFINE_bool(
    "skip_memory_check", False,
    "Start even when the run's estimated memory (training state of every seed, gradients, data, "
    "the largest program's activations: sg_jax.runtime.cost_check) exceeds the machine's.")
_TENSORBOARD = flags.DEFINE_bool(
    "tensorboard", True,
    "Also write TensorBoard summaries (WORKDIR/tensorboard; TensorFlow is not needed).")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False,
    "Run as one of several processes (jax.distributed): on several hosts (TPU pods, multi-node "
    "GPU, CPU clusters) or on one. The seed axis is sharded over the devices of all processes; "
    "process 0 writes metrics and logs, every process writes its part of the checkpoints. "
    "Start every process with the same command except --process_id.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None,
    "With --multihost: host:port of process 0 (e.g. 127.0.0.1:12355 for processes on this "
    "machine, which then share its CPU cores). Unset: from JAX_COORDINATOR_ADDRESS or the "
    "cluster (SLURM, Open MPI, Cloud TPU).")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "With --multihost: the number of processes (unset: as above).",
    lower_bound=1)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "With --multihost: this process's index, 0 .. num_processes - 1.",
    lower_bound=0)
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", sharding.HEARTBEAT_TIMEOUT_SECONDS,
    "With --multihost: a process silent for this long is taken for dead and the others stop.",
    lower_bound=1)
_COMPILATION_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir", None,
    "Folder of JAX's persistent compilation cache: a resumed run or another run of the same "
    "config loads the compiled programs from it instead of compiling them again. Unset: "
    "$JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/sg_jax/jax_cache (~/.cache/sg_jax/"
    "jax_cache); '' turns the cache off.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False,
    "Parse the flags, build the config (file, config string, --config.* overrides) and check it "
    "(sg_jax.config.checks.validate), print one line and exit: nothing is trained, no data is "
    "generated and --workdir is not touched.")
_PROFILE_STEPS = flags.DEFINE_string(
    "profile_steps", "",
    "A:B: write a JAX profiler trace of training steps A to B into WORKDIR/profile "
    "(tensorboard --logdir WORKDIR/profile, with tensorboard-plugin-profile; "
    "sg_jax.accelerators.profiling). Unset: no trace.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _DRY_RUN.value:
    print(dry_run(_CONFIG.value))
    return
  sg_log = metric_logging.setup_cli_logging()
  compile_cache.enable(_COMPILATION_CACHE_DIR.value)  # train logs the folder
  watchdog = None
  if _MULTIHOST.value:
    watchdog = _start_processes(sg_log)
  on_error = watchdog.check_now if watchdog is not None else None  # a save failed: a process died?
  try:
    with command_errors(on_error=on_error, exit_preempted=_exit_at_once), \
        profiling.StepProfiler(_PROFILE_STEPS.value, _WORKDIR.value):
      result = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value,
                                        allow_config_change=_ALLOW_CONFIG_CHANGE.value,
                                        tensorboard=_TENSORBOARD.value,
                                        signal_exit_seconds=STOP_EXIT_SECONDS,
                                        memory_check=not _SKIP_MEMORY_CHECK.value)
      if watchdog is not None:
        # JAX's shutdown does not wait for the other processes (recoverable mode, see
        # sharding.initialize_distributed): without this barrier one could leave while another
        # still writes, and its watchdog would take that for a lost process.
        sharding.sync_processes("sg_jax.main: trained")
        watchdog.stop()
  except jax.errors.JaxRuntimeError as e:  # a collective or barrier failed: a process died
    if watchdog is None:
      raise
    _lost_contact(str(e))
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  if sharding.is_writer():
    print(metric_logging.format_summary(result, _WORKDIR.value))


def dry_run(config) -> str:
  """`--dry_run`: checks the built config (`config_checks.validate`) and returns one line
  describing the run it would start; a bad config ends the command with one line."""
  with command_errors():
    config_checks.validate(config)
  return (f"config ok: task {config.task}, objective {config.get('objective', 'lm')}, "
          f"{config.num_seeds} seeds, {config.model.num_layers} layers, "
          f"{config.train.num_steps} steps (dry run: nothing was run)")


def _start_processes(sg_log: logging.Logger) -> sharding.ProcessWatchdog:
  """--multihost: joins the run's other processes and watches them (see `_lost_contact`)."""
  host_devices.share_among_processes(host_devices.processes_on_this_host(
      _COORDINATOR.value or os.environ.get("JAX_COORDINATOR_ADDRESS"), _NUM_PROCESSES.value))
  try:
    sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                                    heartbeat_timeout_seconds=_HEARTBEAT.value)
  except (ValueError, RuntimeError) as e:
    sys.exit(f"error: {' '.join(str(e).split())[:300]}")
  if not sharding.is_writer():
    sg_log.setLevel(logging.WARNING)  # process 0 logs the run's progress
  return sharding.ProcessWatchdog(_lost_contact).start()


def _lost_contact(reason: str) -> None:
  """Ends a process of a multi-process run whose peers are gone, with one line: waiting would
  hang (a collective or barrier never completes), and JAX's own shutdown would wait for them."""
  lines = [l.strip() for l in reason.strip().splitlines() if l.strip()]
  first = lines[0][:200] if lines else reason
  sys.stderr.write(f"error: process {jax.process_index()} of {jax.process_count()} lost contact "
                   f"with the run ({first}); rerun every process with the same command to "
                   f"resume from the latest checkpoint\n")
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(1)  # not `sharding.leave`: the coordinator may be gone


def _exit_at_once(code: int) -> None:
  """Exits without the interpreter's teardown, once a stopped run has closed everything it wrote
  (checkpoints waited for, metric rows fsynced, summaries closed): XLA's teardown of compiled
  programs and buffers took 6 s (quick preset) to 20 s (reference size) on a 2-core CPU, too long
  after a preemption notice."""
  sharding.leave(_HEARTBEAT.value)  # the other processes of a multi-process run see a clean exit
  exit_at_once(code)



if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
