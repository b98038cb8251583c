"""Writing checkpoints: asynchronous orbax saves, each failure raised naming its step.

orbax commits a step atomically (a half-written step is never listed). Environment variables
inject faults (a kill or a full disk during one step's save) for tests and
scripts/fault_injection.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import warnings
from typing import Any

import ml_collections
import orbax.checkpoint as ocp

from sg_jax.checkpointing import policy as policy_lib
from sg_jax.checkpointing.layout import (CHECKPOINT_DIR, FULL_STATE_DIR, CheckpointWriteError,
                                         WorkdirError, all_steps, checkpoint_dir, error_cause,
                                         make_manager, temporary_folders)

# Fault injection for tests and scripts/fault_injection.py: when this environment variable holds
# a step, the process SIGKILLs itself while that step's checkpoint is being written.
KILL_DURING_SAVE_ENV = "SG_JAX_FAULT_KILL_DURING_SAVE"
# When this one holds a step, files can no longer grow past DISK_FULL_BYTES from the moment that
# step's checkpoint starts (RLIMIT_FSIZE, SIGXFSZ ignored): its background writes then fail in
# orbax/tensorstore with EFBIG, the way they fail with ENOSPC on a full disk.
DISK_FULL_AT_SAVE_ENV = "SG_JAX_FAULT_DISK_FULL_AT_SAVE"
DISK_FULL_BYTES = 16 * 1024


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict,
         force: bool = True) -> None:
  """Saves the stacked state at `step` (asynchronously; call `wait`).

  Raises:
    WorkdirError: the checkpoint cannot be written (e.g. disk full), naming the step; orbax
      writes into a temporary folder and renames it on success, so earlier steps are intact.
  """
  try:
    _start_save(manager, step, state, meta, force)
  except Exception as e:
    raise WorkdirError(f"cannot write checkpoint step {step} in {manager.directory}: "
                       f"{error_cause(e)}; earlier checkpoints are intact") from e


def _start_save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict,
                force: bool) -> None:
  """Starts orbax's save of `step`; the injected faults (see above) act here."""
  if os.environ.get(DISK_FULL_AT_SAVE_ENV) == str(int(step)):
    _limit_file_size(DISK_FULL_BYTES)
  manager.save(int(step), args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)
  if os.environ.get(KILL_DURING_SAVE_ENV) == str(int(step)):
    os.kill(os.getpid(), signal.SIGKILL)


def _limit_file_size(num_bytes: int) -> None:
  import resource  # pylint: disable=import-outside-toplevel  (POSIX only; fault injection)

  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
  _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (num_bytes, hard))


def wait(manager: ocp.CheckpointManager) -> None:
  """Waits for pending asynchronous saves.

  Raises:
    WorkdirError: a pending save failed (e.g. disk full); earlier checkpoints are intact.
  """
  try:
    manager.wait_until_finished()
  except Exception as e:
    raise WorkdirError(f"writing a checkpoint in {manager.directory} failed: {error_cause(e)}; "
                       f"earlier checkpoints are intact") from e


class CheckpointWriter:
  """The checkpoint saves of a training run, asynchronous, each failure named by its step.

  The preservation policy (`checkpointing.policy`) is read from the config in the metadata of
  the first save: with `checkpoint.keep_full` > 0 each save writes the full state into
  `full_states/` (orbax `LatestN(keep_full)`) and the analysis fields into `checkpoints/`
  (orbax `EveryNSteps(params_every)` or `LatestN(keep_full)`, so the newest analysis checkpoint
  is always the newest full state's step).

  orbax writes a checkpoint in a background thread, and an error there (e.g. a full disk)
  surfaces only when the manager is next waited on, which orbax does at the start of the next
  save. Here `check()` (non-blocking), `wait()` and `save()` (which first waits for the previous
  save) raise it as `CheckpointWriteError` naming the step that failed, its folder and the
  cause; the training loop calls `check()` after every compiled call and `wait()` before it
  writes metric rows. After a failure, `abandon()` closes the manager and removes the failed
  save's temporary folder.

  Attributes:
    manager: the CheckpointManager of `checkpoints/` (also used for restoring).
    full_manager: the CheckpointManager of `full_states/` (None without a policy).
    policy: the preservation policy (None until the first save).
    pending: the step being written in the background (None when none is).
  """

  def __init__(self, workdir: str, max_to_keep: int = 0):
    self.workdir = workdir
    self.manager = make_manager(workdir, max_to_keep=max_to_keep, cleanup_tmp=True)
    self.full_manager: ocp.CheckpointManager | None = None
    self.policy: policy_lib.Preservation | None = None
    self.pending: int | None = None

  def _managers(self) -> list[ocp.CheckpointManager]:
    return [m for m in (self.manager, self.full_manager) if m is not None]

  def _configure(self, meta: dict) -> None:
    """Reads the preservation policy from the config in `meta`; under a policy, reopens
    `checkpoints/` with orbax's preservation policy and opens `full_states/`."""
    if self.policy is not None:
      return
    self.policy = policy_lib.Preservation.from_config(ml_collections.ConfigDict(meta["config"]))
    if not self.policy.split:
      return
    self.manager.close()
    latest = ocp.checkpoint_managers.LatestN(n=self.policy.keep_full)
    self.manager = make_manager(
        self.workdir, cleanup_tmp=True, folder=CHECKPOINT_DIR,
        preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy([
            ocp.checkpoint_managers.EveryNSteps(interval_steps=self.policy.params_every),
            latest]))
    self.full_manager = make_manager(self.workdir, cleanup_tmp=True, folder=FULL_STATE_DIR,
                                     preservation_policy=self.policy.full_state_policy())

  def step_path(self, step: int) -> str:
    folder = FULL_STATE_DIR if self.full_manager is not None else CHECKPOINT_DIR
    return os.path.join(checkpoint_dir(self.workdir, folder), str(int(step)))

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Starts writing `state` at `step` (see `save`; under a preservation policy, the full
    state and the analysis fields); returns before the files are written.

    Raises:
      CheckpointWriteError: this save could not start, or the previous one failed.
    """
    self.wait()
    self.pending = int(step)
    try:
      self._configure(meta)
      if self.full_manager is None:
        _start_save(self.manager, step, state, meta, force=True)
      else:
        # A step written by an attempt resumed from an earlier full state is written again.
        for manager in self._managers():
          if int(step) in manager.all_steps():
            manager.delete(int(step))
        _start_save(self.full_manager, step, state, meta, force=True)
        _start_save(self.manager, step, policy_lib.analysis_state(state), meta, force=True)
    except Exception as e:  # orbax/tensorstore raise many types (disk full is a ValueError)
      self.pending = None
      raise CheckpointWriteError(step, self.step_path(step), error_cause(e)) from e

  def check(self) -> None:
    """Raises CheckpointWriteError if the background save has failed; never blocks."""
    if self.pending is not None and not any(m.is_saving_in_progress()
                                            for m in self._managers()):
      self.wait()

  def wait(self) -> None:
    """Blocks until the background save has finished.

    Raises:
      CheckpointWriteError: it failed.
    """
    if self.pending is None:
      return
    step, self.pending = self.pending, None
    try:
      for manager in self._managers():
        manager.wait_until_finished()
        manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except  (see save)
      raise CheckpointWriteError(step, self.step_path(step), error_cause(e)) from e

  def close(self) -> None:
    """Waits for the background save (raising CheckpointWriteError) and closes the manager."""
    try:
      self.wait()
    finally:
      for manager in self._managers():
        manager.close()

  def abandon(self, settle_seconds: float = 5.0) -> list[str]:
    """After a failure: closes the manager without raising and removes the temporary folders of
    unfinished saves. Returns the folders removed."""
    self.pending = None
    # The failed save's unfinished tensorstore writes are coroutines nobody awaits any more;
    # Python would warn about each at exit, after the run's one-line error.
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                            category=RuntimeWarning)
    for manager in self._managers():
      try:
        manager.close()
      except Exception:  # pylint: disable=broad-except  (the failure was reported already)
        pass
    # tensorstore may still finish an operation of the failed save (e.g. write the database
    # manifest) after orbax has given up on it, recreating the folder: remove until it stays
    # away (a few tenths of a second in practice; at most `settle_seconds`).
    removed: list[str] = []
    deadline = time.monotonic() + settle_seconds
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
      found = temporary_folders(self.workdir)
      for path in found:
        shutil.rmtree(path, ignore_errors=True)
        if path not in removed:
          removed.append(path)
      quiet = 0 if found else quiet + 1
      time.sleep(0.2)
    if self.full_manager is not None:
      # The analysis checkpoints newer than the newest full state (its pair failed): the run
      # resumes from that full state, and metrics.csv is cut at the newest analysis step.
      full = all_steps(self.workdir, FULL_STATE_DIR)
      for step in all_steps(self.workdir):
        if step > (full[-1] if full else -1):
          path = os.path.join(checkpoint_dir(self.workdir), str(step))
          shutil.rmtree(path, ignore_errors=True)
          removed.append(path)
    return removed


