"""Orbax checkpoints of a multi-seed run: `WORKDIR/checkpoints/<step>/{state,meta}`.

`state` holds the stacked per-seed `TrainState` (parameters, optimiser state, step, PRNG key data,
divergence flags), every array with a leading seed axis `[seed, ...]`. `meta` (JSON) holds the
resolved config, the vocabulary and the list of seed ids, so that the analysis can rebuild the
model from a workdir alone. Checkpoints are written by orbax, which commits a step atomically
(a half-written step is never listed), and are kept forever by default because the analysis
needs the whole trajectory.

A checkpoint whose arrays have other shapes (or another structure) than the run's config gives
was written with another config: restoring it is refused (`CheckpointMismatch`) and nothing is
moved. Only a checkpoint that cannot be read for another reason is moved aside, to
`WORKDIR/corrupt_checkpoints/`. Every manager and checkpointer made here is closed after use.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from sg_jax import configlib

log = logging.getLogger("sg_jax")

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
  """A checkpoint directory is missing, unreadable or inconsistent."""


class CheckpointMismatch(CheckpointError):
  """A checkpoint holds arrays of other shapes or another structure than the config gives: it was
  written with another config (model, seeds, vocabulary), which is not corruption."""


class WorkdirError(RuntimeError):
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


# Fault injection for tests and scripts/fault_injection.py: when this environment variable holds
# a step, the process SIGKILLs itself while that step's checkpoint is being written.
KILL_DURING_SAVE_ENV = "SG_JAX_FAULT_KILL_DURING_SAVE"
# When this one holds a step, files can no longer grow past DISK_FULL_BYTES from the moment that
# step's checkpoint starts (RLIMIT_FSIZE, SIGXFSZ ignored): its background writes then fail in
# orbax/tensorstore with EFBIG, the way they fail with ENOSPC on a full disk.
DISK_FULL_AT_SAVE_ENV = "SG_JAX_FAULT_DISK_FULL_AT_SAVE"
DISK_FULL_BYTES = 16 * 1024


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
    previous(unraisable)

  hook._sg_jax_quiet = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


def checkpoint_dir(workdir: str) -> str:
  """Absolute path of the checkpoint folder of `workdir` (orbax needs absolute paths)."""
  return os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))


def make_manager(workdir: str, *, max_to_keep: int = 0, create: bool = True,
                 asynchronous: bool = True, cleanup_tmp: bool = False) -> ocp.CheckpointManager:
  """CheckpointManager for `workdir` (max_to_keep 0 = keep all); close it after use.

  `cleanup_tmp` removes the temporary folders of saves that never finished (a process killed
  while writing): only for the run that writes the workdir, never for a reader such as the
  analysis, which could otherwise delete a save in progress.
  """
  _quiet_closed_loop_callbacks()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep or None, create=create,
      enable_async_checkpointing=asynchronous, cleanup_tmp_directories=cleanup_tmp)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_names=("state", "meta"))


def make_meta(config: ml_collections.ConfigDict, vocab_json: str, seeds: list[int]) -> dict:
  """The JSON metadata stored beside every checkpoint."""
  return {"config": json.loads(config.to_json()), "vocab": json.loads(vocab_json),
          "seeds": [int(s) for s in seeds]}


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict,
         force: bool = True) -> None:
  """Saves the stacked state at `step` (asynchronously; call `wait`).

  Raises:
    WorkdirError: the checkpoint cannot be written (e.g. disk full), naming the step; orbax
      writes into a temporary folder and renames it on success, so earlier steps are intact.
  """
  if os.environ.get(DISK_FULL_AT_SAVE_ENV) == str(int(step)):
    _limit_file_size(DISK_FULL_BYTES)
  try:
    manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)
  except Exception as e:
    raise WorkdirError(f"cannot write checkpoint step {step} in {manager.directory}: "
                       f"{error_cause(e)}; earlier checkpoints are intact") from e
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


def error_cause(e: BaseException) -> str:
  """One line on why an orbax/tensorstore/OS operation failed.

  tensorstore wraps the OS error in a long message naming every layer (e.g. '...Failed to write
  69478 bytes to file 4: No space left on device [os_error_code='28']'); the OS error is kept.
  """
  if isinstance(e, OSError) and e.strerror:
    return f"{e.strerror} [errno {e.errno}]"
  text = " ".join(str(e).split()) or type(e).__name__
  match = re.search(r"([^:]+)\[os_error_code='?(\d+)'?\]", text)
  if match:
    return f"{match.group(1).strip()} [errno {match.group(2)}]"
  return text if len(text) <= 300 else text[:297] + "..."


def temporary_folders(workdir: str) -> list[str]:
  """Folders of checkpoint saves that never finished (orbax's `*.orbax-checkpoint-tmp*`)."""
  return sorted(glob.glob(os.path.join(checkpoint_dir(workdir), "*.orbax-checkpoint-tmp*")))


class CheckpointWriter:
  """The checkpoint saves of a training run, asynchronous, each failure named by its step.

  orbax writes a checkpoint in a background thread, and an error there (e.g. a full disk)
  surfaces only when the manager is next waited on, which orbax does at the start of the next
  save. Here `check()` (non-blocking), `wait()` and `save()` (which first waits for the previous
  save) raise it as `CheckpointWriteError` naming the step that failed, its folder and the
  cause; the training loop calls `check()` after every compiled call and `wait()` before it
  writes metric rows. After a failure, `abandon()` closes the manager and removes the failed
  save's temporary folder.

  Attributes:
    manager: the run's CheckpointManager (also used for restoring).
    pending: the step being written in the background (None when none is).
  """

  def __init__(self, workdir: str, max_to_keep: int = 0):
    self.workdir = workdir
    self.manager = make_manager(workdir, max_to_keep=max_to_keep, cleanup_tmp=True)
    self.pending: int | None = None

  def step_path(self, step: int) -> str:
    return os.path.join(checkpoint_dir(self.workdir), str(int(step)))

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Starts writing `state` at `step` (see `save`); returns before the files are written.

    Raises:
      CheckpointWriteError: this save could not start, or the previous one failed.
    """
    self.wait()
    if os.environ.get(DISK_FULL_AT_SAVE_ENV) == str(int(step)):
      _limit_file_size(DISK_FULL_BYTES)
    self.pending = int(step)
    try:
      self.manager.save(int(step), args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    except Exception as e:  # orbax/tensorstore raise many types (disk full is a ValueError)
      self.pending = None
      raise CheckpointWriteError(step, self.step_path(step), error_cause(e)) from e
    if os.environ.get(KILL_DURING_SAVE_ENV) == str(int(step)):
      os.kill(os.getpid(), signal.SIGKILL)

  def check(self) -> None:
    """Raises CheckpointWriteError if the background save has failed; never blocks."""
    if self.pending is not None and not self.manager.is_saving_in_progress():
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
      self.manager.wait_until_finished()
      self.manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except  (see save)
      raise CheckpointWriteError(step, self.step_path(step), error_cause(e)) from e

  def close(self) -> None:
    """Waits for the background save (raising CheckpointWriteError) and closes the manager."""
    try:
      self.wait()
    finally:
      self.manager.close()

  def abandon(self, settle_seconds: float = 5.0) -> list[str]:
    """After a failure: closes the manager without raising and removes the temporary folders of
    unfinished saves. Returns the folders removed."""
    self.pending = None
    try:
      self.manager.close()
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
    return removed


def all_steps(workdir: str) -> list[int]:
  """Sorted steps with a committed checkpoint (empty if there is none)."""
  if not os.path.isdir(checkpoint_dir(workdir)):
    return []
  mngr = make_manager(workdir, create=False, asynchronous=False)
  try:
    return sorted(int(s) for s in mngr.all_steps())
  finally:
    mngr.close()


@dataclasses.dataclass
class Restored:
  """A restored checkpoint.

  Attributes:
    step: training step of the checkpoint.
    state: the stacked per-seed state (pytree of arrays with leading axis [seed]); when restored
      without a target it is a nested dict with keys params, opt_state, step, key, ...
    config: the run's resolved config.
    vocab_json: the vocabulary (see `sg_jax.tasks.vocab.Vocab.from_json`).
    seeds: the seed ids along the leading axis.
  """

  step: int
  state: Any
  config: ml_collections.ConfigDict
  vocab_json: str
  seeds: list[int]


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict:
  """The JSON metadata (config, vocab, seeds) stored with checkpoint `step`."""
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def restore(workdir: str, step: int | None = None, target: Any = None,
            params_only: bool = False) -> Restored:
  """Restores checkpoint `step` (default: latest) of `workdir`.

  Args:
    workdir: run directory.
    step: checkpoint step; None = latest.
    target: optional abstract pytree (e.g. from `jax.eval_shape`, with shardings) the state is
      restored into; None restores the saved tree as nested dicts of numpy arrays, whatever
      devices wrote it.
    params_only: restore only `state['params']` (faster, for the analysis).

  Raises:
    CheckpointError: no checkpoint, unknown step, or an unreadable checkpoint (naming the step).
  """
  steps = all_steps(workdir)
  if not steps:
    raise CheckpointError(f"no checkpoint in {checkpoint_dir(workdir)}")
  if step is None:
    step = steps[-1]
  if step not in steps:
    raise CheckpointError(f"no checkpoint for step {step} in {checkpoint_dir(workdir)}; "
                          f"available: {steps}")
  mngr = make_manager(workdir, create=False, asynchronous=False)
  try:
    meta = read_meta(mngr, step)
    if target is not None:
      state = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))["state"]
    else:
      state = _restore_as_numpy(os.path.join(checkpoint_dir(workdir), str(step), "state"),
                                "params" if params_only else None)
  except CheckpointError:
    raise
  except Exception as e:  # orbax/tensorstore raise many types for corrupt data
    raise CheckpointError(
        f"checkpoint step {step} in {checkpoint_dir(workdir)} is unreadable: {e}") from e
  finally:
    mngr.close()
  config = ml_collections.ConfigDict(meta["config"])
  return Restored(step=int(step), state=state, config=config,
                  vocab_json=json.dumps(meta["vocab"]), seeds=list(meta["seeds"]))


class _DropItemMetadataWarning(logging.Filter):
  """Orbax warns that an item folder has no step-level metadata file when an item is read on its
  own (as `_restore_as_numpy` does); that is expected here."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "Metadata file does not exist" not in record.getMessage()


logging.getLogger("absl").addFilter(_DropItemMetadataWarning())


def _restore_as_numpy(path: str, only: str | None = None) -> dict:
  """Reads a saved state (or only its top-level entry `only`, e.g. 'params') as numpy arrays.

  Numpy targets make the restore independent of the devices the checkpoint was written from
  (a run on 8 CPU devices is read by an analysis process with one).
  """
  with ocp.PyTreeCheckpointer() as checkpointer:
    tree = _metadata_tree(checkpointer, path)
    if only is not None:
      tree = {only: tree[only]}
    abstract = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), tree)
    restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                          abstract)
    return checkpointer.restore(path, args=ocp.args.PyTreeRestore(
        item=abstract, restore_args=restore_args, partial_restore=only is not None))


def _metadata_tree(checkpointer: ocp.PyTreeCheckpointer, path: str) -> Any:
  metadata = checkpointer.metadata(path)
  tree = getattr(metadata, "item_metadata", metadata)
  return getattr(tree, "tree", tree)


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey / FlattenedIndexKey
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _array_specs(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  """{'params/embedding/embedding': (shape, dtype name), ...} of a tree of arrays, abstract
  arrays or orbax array metadata (dicts, dataclasses and tuples named alike)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(_key_name(k) for k in path): (tuple(int(d) for d in leaf.shape),
                                                 np.dtype(leaf.dtype).name)
          for path, leaf in leaves}


def stored_arrays(workdir: str, step: int) -> dict[str, tuple[tuple[int, ...], str]]:
  """Shapes and dtypes of the state stored at `step`, read from its metadata only (no arrays).

  Returns:
    {'params/embedding/embedding': ((seed, vocab, d_model), 'float32'), ...}.

  Raises:
    Exception: whatever orbax raises for an unreadable checkpoint.
  """
  path = os.path.join(checkpoint_dir(workdir), str(int(step)), "state")
  with ocp.PyTreeCheckpointer() as checkpointer:
    return _array_specs(_metadata_tree(checkpointer, path))


def _describe_mismatch(stored: dict, wanted: dict) -> str | None:
  """None when `stored` and `wanted` (`_array_specs`) agree, else one clause naming the first
  difference."""
  if stored == wanted:
    return None
  for name in sorted(set(stored) & set(wanted)):
    if stored[name] != wanted[name]:
      (s_shape, s_dtype), (w_shape, w_dtype) = stored[name], wanted[name]
      return (f"{name} is {s_dtype}{list(s_shape)} in the checkpoint but "
              f"{w_dtype}{list(w_shape)} under this config")
  missing, extra = sorted(set(wanted) - set(stored)), sorted(set(stored) - set(wanted))
  if missing:
    return f"the checkpoint has no {missing[0]} ({len(missing)} arrays of this config missing)"
  return f"the checkpoint has {extra[0]}, which this config has not ({len(extra)} such arrays)"


def restore_seed_params(workdir: str, seed: int, step: int | None = None):
  """Parameters of ONE seed (by seed id, not position) from checkpoint `step` (default latest).

  Returns:
    (params pytree without a seed axis, Restored with `state` holding the stacked params).

  Raises:
    CheckpointError: as `restore`, or the seed is not part of the run.
  """
  restored = restore(workdir, step, params_only=True)
  if seed not in restored.seeds:
    raise CheckpointError(f"seed {seed} is not in the run at {workdir}; seeds: {restored.seeds}")
  index = restored.seeds.index(seed)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x)[index], restored.state["params"])
  return params, restored


def quarantine(workdir: str, step: int) -> str:
  """Moves an unreadable checkpoint to WORKDIR/corrupt_checkpoints/<step> (nothing is deleted).

  Returns the new path. The step can then be written again by a resumed run.
  """
  src = os.path.join(checkpoint_dir(workdir), str(step))
  dst_root = os.path.join(os.path.abspath(workdir), "corrupt_checkpoints")
  os.makedirs(dst_root, exist_ok=True)
  dst = os.path.join(dst_root, str(step))
  suffix = 1
  while os.path.exists(dst):
    dst = os.path.join(dst_root, f"{step}.{suffix}")
    suffix += 1
  os.replace(src, dst)
  return dst


def restore_latest_good(manager: ocp.CheckpointManager, workdir: str, target: Any,
                        quarantine_bad: bool = True,
                        config: ml_collections.ConfigDict | None = None
                        ) -> tuple[int | None, Any]:
  """Restores the newest readable checkpoint into `target`; (None, None) if there is none.

  Each checkpoint's stored shapes are compared with `target`'s first (from its metadata). An
  unreadable newer checkpoint (truncated or corrupted files) is skipped with a warning that
  names its step and, if `quarantine_bad`, moved aside with `quarantine`.

  Args:
    manager: the workdir's manager.
    workdir: run directory.
    target: abstract stacked state [seed, ...] (e.g. `sharding.abstract_like`).
    quarantine_bad: move unreadable checkpoints to WORKDIR/corrupt_checkpoints/.
    config: the run's config; when given, a mismatch also names the config fields that differ
      from the checkpoint's.

  Raises:
    CheckpointMismatch: a readable checkpoint holds other shapes or another structure than
      `target` (written with another config); nothing is moved.
  """
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      stored = stored_arrays(workdir, step)
    except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
      _skip_unreadable(manager, workdir, step, e, quarantine_bad)
      continue
    mismatch = _describe_mismatch(stored, _array_specs(target))
    if mismatch is not None:
      raise CheckpointMismatch(
          f"checkpoint step {step} in {checkpoint_dir(workdir)} was written with another "
          f"config: {mismatch}{_differing_fields(manager, step, config)}; nothing was changed; "
          f"use another --workdir")
    try:
      state = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))["state"]
      _check_finite_structure(state, target)
      return int(step), state
    except Exception as e:  # pylint: disable=broad-except  (tensorstore: many types)
      _skip_unreadable(manager, workdir, step, e, quarantine_bad)
  return None, None


def _skip_unreadable(manager, workdir: str, step: int, error: Exception,
                     quarantine_bad: bool) -> None:
  log.warning("checkpoint step %d in %s is unreadable (%s: %s); falling back to the previous "
              "one", step, checkpoint_dir(workdir), type(error).__name__, error_cause(error))
  if quarantine_bad:
    moved = quarantine(workdir, step)
    log.warning("moved the unreadable checkpoint step %d to %s", step, moved)
    manager.reload()


def _differing_fields(manager, step: int, config: ml_collections.ConfigDict | None) -> str:
  """' (config fields that differ: model.d_model 128 -> 64)' from the checkpoint's metadata."""
  if config is None:
    return ""
  try:
    old = read_meta(manager, step)["config"]
  except Exception:  # pylint: disable=broad-except  (the shapes already say enough)
    return ""
  diffs = [f"{name} {a!r} -> {b!r}"
           for name, a, b in configlib.differences(old, json.loads(config.to_json()))]
  return f" (config fields that differ: {', '.join(diffs)})" if diffs else ""


def _check_finite_structure(state: Any, target: Any) -> None:
  got = jax.tree_util.tree_structure(state)
  want = jax.tree_util.tree_structure(target)
  if got != want:
    raise CheckpointError(f"restored tree structure {got} differs from the expected {want}")
