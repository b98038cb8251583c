"""Reading checkpoints: restore, metadata-only inspection, and the resume-time fallback.

A checkpoint whose arrays have other shapes (or another structure) than the run's config gives
was written with another config: restoring it is refused (`CheckpointMismatch`) and nothing is
moved. Only a checkpoint that cannot be read for another reason is moved aside, to
`WORKDIR/corrupt_checkpoints/` (`quarantine`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from sg_jax import configlib
from sg_jax.checkpointing.layout import (ANALYSIS_FIELDS, CHECKPOINT_DIR, FULL_STATE_DIR,
                                         CheckpointError, CheckpointMismatch, all_steps,
                                         checkpoint_dir, error_cause, make_manager, read_meta)
from sg_jax.runtime import config_changes

log = logging.getLogger("sg_jax")


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


def _restore_as_numpy(path: str, only: str | tuple[str, ...] | None = None) -> dict:
  """Reads a saved state (or only its top-level entries `only`, e.g. 'params') as numpy arrays.

  Numpy targets make the restore independent of the devices the checkpoint was written from
  (a run on 8 CPU devices is read by an analysis process with one).
  """
  with ocp.PyTreeCheckpointer() as checkpointer:
    tree = _metadata_tree(checkpointer, path)
    if not tree:  # orbax logs a warning and returns no tree for missing or damaged metadata
      raise CheckpointError(f"{path} has no readable array metadata (missing or damaged files)")
    if only is not None:
      tree = {name: tree[name] for name in ((only,) if isinstance(only, str) else only)}
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


def stored_arrays(workdir: str, step: int,
                  folder: str = CHECKPOINT_DIR) -> dict[str, tuple[tuple[int, ...], str]]:
  """Shapes and dtypes of the state stored at `step` (in `folder`: CHECKPOINT_DIR or
  FULL_STATE_DIR), read from its metadata only (no arrays).

  Returns:
    {'params/embedding/embedding': ((seed, vocab, d_model), 'float32'), ...}.

  Raises:
    Exception: whatever orbax raises for an unreadable checkpoint.
  """
  path = os.path.join(checkpoint_dir(workdir, folder), str(int(step)), "state")
  with ocp.PyTreeCheckpointer() as checkpointer:
    specs = _array_specs(_metadata_tree(checkpointer, path))
  if not specs:  # orbax logs a warning and returns no tree for missing or damaged metadata
    raise CheckpointError(f"{path} has no readable array metadata (missing or damaged files)")
  return specs


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


def diverged_seeds(workdir: str, step: int) -> dict[int, int]:
  """The seeds marked diverged in checkpoint `step` (`TrainState.diverged`): {seed id: the step
  its loss or gradient norm became non-finite}. Their parameters are frozen at their last finite
  values, so no analysis of them is a trained seed's (docs/reliability.md).

  Reads only the two flags [seed] and the metadata (seed ids); a state saved without them (only
  parameters: a converted or hand-made checkpoint) has no diverged seed.

  Raises:
    CheckpointError: the checkpoint cannot be read (naming the step).
  """
  path = os.path.join(checkpoint_dir(workdir), str(int(step)), "state")
  mngr = make_manager(workdir, create=False, asynchronous=False)
  try:
    seeds = [int(s) for s in read_meta(mngr, step)["seeds"]]
    with ocp.PyTreeCheckpointer() as checkpointer:
      names = set(_metadata_tree(checkpointer, path) or ())
    if not {"diverged", "diverged_step"} <= names:
      if not names:
        raise CheckpointError(f"{path} has no readable array metadata (missing or damaged "
                              "files)")
      return {}  # a state without the flags (e.g. converted parameters): nothing recorded
    flags = _restore_as_numpy(path, ("diverged", "diverged_step"))
  except Exception as e:  # orbax/tensorstore raise many types for corrupt data
    raise CheckpointError(f"checkpoint step {step} in {checkpoint_dir(workdir)} is unreadable: "
                          f"{error_cause(e)}") from e
  finally:
    mngr.close()
  marked = np.asarray(flags["diverged"]).reshape(-1)
  at = np.asarray(flags["diverged_step"]).reshape(-1)
  return {seeds[i]: int(at[i]) for i in np.flatnonzero(marked)}


def quarantine(workdir: str, step: int, folder: str = CHECKPOINT_DIR) -> str:
  """Moves an unreadable checkpoint (of `folder`) to WORKDIR/corrupt_checkpoints/<step> (nothing
  is deleted).

  Returns the new path. The step can then be written again by a resumed run.
  """
  src = os.path.join(checkpoint_dir(workdir, folder), str(step))
  dst_root = os.path.join(os.path.abspath(workdir), "corrupt_checkpoints")
  os.makedirs(dst_root, exist_ok=True)
  dst = os.path.join(dst_root, str(step))
  suffix = 1
  while os.path.exists(dst):
    dst = os.path.join(dst_root, f"{step}.{suffix}")
    suffix += 1
  os.replace(src, dst)
  return dst


def is_analysis_only(stored: dict[str, tuple[tuple[int, ...], str]]) -> bool:
  """Whether a stored state (`stored_arrays`) is a parameter-only checkpoint written under a
  preservation policy (`layout.ANALYSIS_FIELDS`): the analysis reads it, a resume cannot."""
  return {name.split("/")[0] for name in stored} == set(ANALYSIS_FIELDS)


def restore_latest_good(manager: ocp.CheckpointManager, workdir: str, target: Any,
                        quarantine_bad: bool = True,
                        config: ml_collections.ConfigDict | None = None
                        ) -> tuple[int | None, Any]:
  """Restores the newest readable full state into `target`; (None, None) if there is none.

  Full states are in `manager`'s folder (`checkpoints/`) and, under a preservation policy
  (`checkpointing.policy`), in `WORKDIR/full_states/`; the newest of either is restored, and the
  parameter-only checkpoints of `checkpoints/` are passed over. Each checkpoint's stored shapes
  are compared with `target`'s first (from its metadata). An unreadable newer checkpoint
  (truncated or corrupted files) is skipped with a warning that names its step and, if
  `quarantine_bad`, moved aside with `quarantine`.

  Args:
    manager: the workdir's manager (of `checkpoints/`).
    workdir: run directory.
    target: abstract stacked state [seed, ...] (e.g. `sharding.abstract_like`).
    quarantine_bad: move unreadable checkpoints to WORKDIR/corrupt_checkpoints/.
    config: the run's config; when given, a mismatch also names the config fields that differ
      from the checkpoint's.

  Raises:
    CheckpointMismatch: a readable checkpoint holds other shapes or another structure than
      `target` (written with another config); nothing is moved.
  """
  full_steps = all_steps(workdir, FULL_STATE_DIR)
  newest_full = full_steps[-1] if full_steps else -1
  # A full state in checkpoints/ newer than every one in full_states/ (the policy switched off).
  step, state = _restore_newest(manager, workdir, CHECKPOINT_DIR, target, quarantine_bad, config,
                                after=newest_full)
  if step is not None or not full_steps:
    return step, state
  full_manager = make_manager(workdir, create=False, asynchronous=False, folder=FULL_STATE_DIR)
  try:
    step, state = _restore_newest(full_manager, workdir, FULL_STATE_DIR, target, quarantine_bad,
                                  config)
  finally:
    full_manager.close()
  if step is not None:
    return step, state
  return _restore_newest(manager, workdir, CHECKPOINT_DIR, target, quarantine_bad, config)


def _restore_newest(manager: ocp.CheckpointManager, workdir: str, folder: str, target: Any,
                    quarantine_bad: bool, config: ml_collections.ConfigDict | None,
                    after: int = -1) -> tuple[int | None, Any]:
  """`restore_latest_good` within one folder, over its steps > `after`."""
  for step in sorted((s for s in manager.all_steps() if s > after), reverse=True):
    try:
      stored = stored_arrays(workdir, step, folder)
    except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
      _skip_unreadable(manager, workdir, step, e, quarantine_bad, folder)
      continue
    if is_analysis_only(stored):
      continue  # parameters only (preservation policy): its full state is in full_states/
    mismatch = _describe_mismatch(stored, _array_specs(target))
    if mismatch is not None and _same_config(manager, step, config):
      # Other arrays than its own config gives: damaged files, not another config.
      _skip_unreadable(manager, workdir, step, CheckpointError(
          f"its stored arrays do not match the config it was written with: {mismatch}"),
          quarantine_bad, folder)
      continue
    if mismatch is not None:
      raise CheckpointMismatch(
          f"checkpoint step {step} in {checkpoint_dir(workdir, folder)} was written with another "
          f"config: {mismatch}{_differing_fields(manager, step, config)}; nothing was changed; "
          f"use another --workdir")
    try:
      state = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))["state"]
      _check_finite_structure(state, target)
      return int(step), state
    except Exception as e:  # pylint: disable=broad-except  (tensorstore: many types)
      _skip_unreadable(manager, workdir, step, e, quarantine_bad, folder)
  return None, None


def _skip_unreadable(manager, workdir: str, step: int, error: Exception,
                     quarantine_bad: bool, folder: str = CHECKPOINT_DIR) -> None:
  log.warning("checkpoint step %d in %s is unreadable (%s: %s); falling back to the previous "
              "one", step, checkpoint_dir(workdir, folder), type(error).__name__,
              error_cause(error))
  if quarantine_bad:
    moved = quarantine(workdir, step, folder)
    log.warning("moved the unreadable checkpoint step %d to %s", step, moved)
    manager.reload()


def _same_config(manager, step: int, config: ml_collections.ConfigDict | None) -> bool:
  """Whether checkpoint `step`'s metadata holds `config` with no field changing a parameter shape
  or what a step is (only those can give other arrays); False when it cannot tell (no `config`,
  unreadable metadata)."""
  if config is None:
    return False
  try:
    old = read_meta(manager, step)["config"]
  except Exception:  # pylint: disable=broad-except  (then the stored shapes decide)
    return False
  new = json.loads(config.to_json())
  defaults = json.loads(configlib.base_config(config.task).to_json())
  old = config_changes.with_new_fields(old, defaults)
  return all(config_changes.classify_config_change(name, old, new) != "never"
             for name, _, _ in configlib.differences(old, new))


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
