"""Orbax checkpoints of a multi-seed run: `WORKDIR/checkpoints/<step>/{state,meta}`.

`state` holds the stacked per-seed `TrainState` (parameters, optimiser state, step, PRNG key data,
divergence flags), every array with a leading seed axis `[seed, ...]`. `meta` (JSON) holds the
resolved config, the vocabulary and the list of seed ids, so that the analysis can rebuild the
model from a workdir alone. Checkpoints are written by orbax, which commits a step atomically
(a half-written step is never listed), and are kept forever by default because the analysis
needs the whole trajectory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger("sg_jax")

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
  """A checkpoint directory is missing, unreadable or inconsistent."""


class WorkdirError(RuntimeError):
  """The workdir cannot be written (unwritable, disk full); earlier results are intact."""


# Fault injection for tests and scripts/fault_injection.py: when this environment variable holds
# a step, the process SIGKILLs itself while that step's checkpoint is being written.
KILL_DURING_SAVE_ENV = "SG_JAX_FAULT_KILL_DURING_SAVE"


def checkpoint_dir(workdir: str) -> str:
  """Absolute path of the checkpoint folder of `workdir` (orbax needs absolute paths)."""
  return os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))


def make_manager(workdir: str, *, max_to_keep: int = 0, create: bool = True,
                 asynchronous: bool = True) -> ocp.CheckpointManager:
  """CheckpointManager for `workdir` (max_to_keep 0 = keep all)."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep or None, create=create,
      enable_async_checkpointing=asynchronous)
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
  try:
    manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)
  except Exception as e:
    raise WorkdirError(f"cannot write checkpoint step {step} in {manager.directory}: {e}; "
                       f"earlier checkpoints are intact") from e
  if os.environ.get(KILL_DURING_SAVE_ENV) == str(int(step)):
    os.kill(os.getpid(), signal.SIGKILL)


def wait(manager: ocp.CheckpointManager) -> None:
  """Waits for pending asynchronous saves.

  Raises:
    WorkdirError: a pending save failed (e.g. disk full); earlier checkpoints are intact.
  """
  try:
    manager.wait_until_finished()
  except Exception as e:
    raise WorkdirError(f"writing a checkpoint in {manager.directory} failed: {e}; earlier "
                       f"checkpoints are intact") from e


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
  checkpointer = ocp.PyTreeCheckpointer()
  metadata = checkpointer.metadata(path)
  tree = getattr(metadata, "item_metadata", metadata)
  tree = getattr(tree, "tree", tree)
  if only is not None:
    tree = {only: tree[only]}
  abstract = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), tree)
  restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                        abstract)
  return checkpointer.restore(path, args=ocp.args.PyTreeRestore(
      item=abstract, restore_args=restore_args, partial_restore=only is not None))


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
                        quarantine_bad: bool = True) -> tuple[int | None, Any]:
  """Restores the newest readable checkpoint into `target`; (None, None) if there is none.

  An unreadable newer checkpoint (truncated or corrupted files) is skipped with a warning that
  names its step and, if `quarantine_bad`, moved aside with `quarantine`.
  """
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      state = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))["state"]
      _check_finite_structure(state, target)
      return int(step), state
    except Exception as e:  # orbax/tensorstore raise many types for corrupt data
      log.warning("checkpoint step %d in %s is unreadable (%s: %s); falling back to the "
                      "previous one", step, checkpoint_dir(workdir), type(e).__name__,
                      str(e).splitlines()[0][:200] if str(e) else "")
      if quarantine_bad:
        moved = quarantine(workdir, step)
        log.warning("moved the unreadable checkpoint step %d to %s", step, moved)
        manager.reload()
  return None, None


def _check_finite_structure(state: Any, target: Any) -> None:
  got = jax.tree_util.tree_structure(state)
  want = jax.tree_util.tree_structure(target)
  if got != want:
    raise CheckpointError(f"restored tree structure {got} differs from the expected {want}")
