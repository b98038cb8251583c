"""Where a run's checkpoints live and what each holds; the errors of checkpoint operations.

`WORKDIR/checkpoints/<step>/{state,meta}`: `state` holds the stacked per-seed `TrainState` (every
array with a leading seed axis `[seed, ...]`), `meta` (JSON) the resolved config, the vocabulary
and the seed ids (`make_meta`). Under a preservation policy (`checkpointing.policy`,
`checkpoint.keep_full` > 0) `checkpoints/<step>/state` holds only the fields the analysis reads
(`ANALYSIS_FIELDS`: parameters and divergence flags) and the full states of the latest saves are
in `WORKDIR/full_states/<step>/{state,meta}`. Written by `checkpointing.writer`, read by
`checkpointing.reader`.
"""

from __future__ import annotations

import glob
import inspect
import json
import os
import re
import sys

import ml_collections
import orbax.checkpoint as ocp

from sg_jax.runtime.exit_codes import OneLineError

CHECKPOINT_DIR = "checkpoints"
# The full states (optimiser moments, PRNG keys, ...) of the latest saves, kept only under a
# preservation policy (`checkpoint.keep_full` > 0); resuming reads them.
FULL_STATE_DIR = "full_states"
# The `TrainState` fields a parameter-only checkpoint keeps: what the analysis and pruning read
# (parameters; the divergence flags, `reader.diverged_seeds`; the step).
ANALYSIS_FIELDS = ("step", "params", "diverged", "diverged_step")


class CheckpointError(OneLineError, RuntimeError):
  """A checkpoint directory is missing, unreadable or inconsistent."""


class CheckpointMismatch(CheckpointError):
  """A checkpoint holds arrays of other shapes or another structure than the config gives: it was
  written with another config (model, seeds, vocabulary), which is not corruption."""


class WorkdirError(OneLineError, RuntimeError):
  """The workdir cannot be written (unwritable, disk full); earlier results are intact."""


class CheckpointWriteError(WorkdirError):
  """Writing one checkpoint failed (e.g. disk full).

  Attributes:
    step: the step whose checkpoint failed.
    path: the step's checkpoint folder.
    cause: one line on why (e.g. 'No space left on device [errno 28]').
  """

  def __init__(self, step: int, path: str, cause: str):
    super().__init__(f"cannot write checkpoint step {step} to {path}: {cause}")
    self.step, self.path, self.cause = int(step), path, cause


def _quiet_closed_loop_callbacks() -> None:
  """Drops the 'Event loop is closed' RuntimeErrors of tensorstore callbacks.

  When an orbax read or write fails, tensorstore still completes its other pending operations and
  their done-callbacks try to wake the asyncio loop orbax ran them on, which is closed by then;
  each such callback prints a traceback through `sys.unraisablehook`. The failure itself is
  raised and reported by the caller, so these (one per array) carry no information. Any other
  unraisable exception is passed to the previous hook.
  """
  previous = sys.unraisablehook
  if getattr(previous, "_sg_jax_quiet", False):
    return

  def hook(unraisable):
    if (isinstance(unraisable.exc_value, RuntimeError)
        and str(unraisable.exc_value) == "Event loop is closed"):
      return
    if _is_orbax_coroutine(unraisable.object):
      # A failed restore leaves orbax's other per-array read coroutines unfinished; when they are
      # collected each prints its own copy of the failure, which the caller already reported.
      return
    previous(unraisable)

  hook._sg_jax_quiet = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


def _is_orbax_coroutine(obj) -> bool:
  """Whether `obj` is a coroutine defined in orbax's own source."""
  code = getattr(obj, "cr_code", None)
  return inspect.iscoroutine(obj) and code is not None and (
      f"{os.sep}orbax{os.sep}" in code.co_filename)


def checkpoint_dir(workdir: str, folder: str = CHECKPOINT_DIR) -> str:
  """Absolute path of the checkpoint folder of `workdir` (orbax needs absolute paths);
  `folder`: CHECKPOINT_DIR or FULL_STATE_DIR."""
  return os.path.abspath(os.path.join(workdir, folder))


def make_manager(workdir: str, *, max_to_keep: int = 0, create: bool = True,
                 asynchronous: bool = True, cleanup_tmp: bool = False,
                 folder: str = CHECKPOINT_DIR,
                 preservation_policy: ocp.checkpoint_managers.PreservationPolicy | None = None
                 ) -> ocp.CheckpointManager:
  """CheckpointManager for `workdir` (max_to_keep 0 = keep all); close it after use.

  `cleanup_tmp` removes the temporary folders of saves that never finished (a process killed
  while writing): only for the run that writes the workdir, never for a reader such as the
  analysis, which could otherwise delete a save in progress. `folder` picks the checkpoint
  folder (CHECKPOINT_DIR or FULL_STATE_DIR); `preservation_policy` (an orbax policy, e.g.
  `LatestN`) replaces `max_to_keep`.
  """
  _quiet_closed_loop_callbacks()
  if preservation_policy is not None:
    options = ocp.CheckpointManagerOptions(
        preservation_policy=preservation_policy, create=create,
        enable_async_checkpointing=asynchronous, cleanup_tmp_directories=cleanup_tmp)
  else:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep or None, create=create,
        enable_async_checkpointing=asynchronous, cleanup_tmp_directories=cleanup_tmp)
  return ocp.CheckpointManager(checkpoint_dir(workdir, folder), options=options,
                               item_names=("state", "meta"))


def make_meta(config: ml_collections.ConfigDict, vocab_json: str, seeds: list[int]) -> dict:
  """The JSON metadata stored beside every checkpoint."""
  return {"config": json.loads(config.to_json()), "vocab": json.loads(vocab_json),
          "seeds": [int(s) for s in seeds]}


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict:
  """The JSON metadata (config, vocab, seeds) stored with checkpoint `step`."""
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def error_cause(e: BaseException) -> str:
  """One line on why an orbax/tensorstore/OS operation failed.

  tensorstore wraps the OS error in a long message naming every layer (e.g. '...Failed to write
  69478 bytes to file 4: No space left on device [os_error_code='28']'); the OS error is kept.
  """
  if isinstance(e, OSError) and e.strerror:
    return f"{e.strerror} [errno {e.errno}]"
  text = " ".join(str(e).split()) or type(e).__name__
  # tensorstore appends a repr of its whole spec, and orbax the slices of the array it read.
  text = re.split(r"\.? See full TensorStore details", text)[0]
  text = re.sub(r"\(slice\([^()]*\)(, slice\([^()]*\))*,?\)", "(...)", text)
  match = re.search(r"\[os_error_code='?(\d+)'?\]", text)
  if match:  # the OS's own text for the code: what precedes it varies between tensorstore calls
    code = int(match.group(1))
    return f"{os.strerror(code)} [errno {code}]"
  return text if len(text) <= 300 else text[:297] + "..."


def temporary_folders(workdir: str) -> list[str]:
  """Folders of checkpoint saves that never finished (orbax's `*.orbax-checkpoint-tmp*`), in
  both checkpoint folders."""
  return sorted(path for folder in (CHECKPOINT_DIR, FULL_STATE_DIR) for path in glob.glob(
      os.path.join(checkpoint_dir(workdir, folder), "*.orbax-checkpoint-tmp*")))


def all_steps(workdir: str, folder: str = CHECKPOINT_DIR) -> list[int]:
  """Sorted steps with a committed checkpoint in `folder` (empty if there is none): by default
  the checkpoints the analysis reads."""
  if not os.path.isdir(checkpoint_dir(workdir, folder)):
    return []
  mngr = make_manager(workdir, create=False, asynchronous=False, folder=folder)
  try:
    return sorted(int(s) for s in mngr.all_steps())
  finally:
    mngr.close()


