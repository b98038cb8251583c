"""Pruning runs stopped mid-way: their state saved by a stopped `sg_jax.prune`, resumed by a rerun.

On SIGTERM/SIGINT, `sg_jax.prune` finishes its current compiled call, saves the runs it was
training (every `run.RunState` leaf, [S, K, ...] on the host) and their objective history
(float32 [T, S, K], one row per pruning step done) to `partial_path` (next to the step's masks
file), and exits with code 75. The rows of the checkpoints it had finished are in the table
already. A rerun with the same runs (checkpoint step, training seeds, (level, pruning seed)
pairs) and the same table options loads the file and trains only the remaining steps: each step
is a pure function of the run's state (its key and step included), so the table equals that of
an uninterrupted command (tests/pruning/test_prune_interrupt.py). A file written for other runs or
options is ignored with a warning (those runs start afresh); it is deleted once its step's rows
are written.
"""

from __future__ import annotations

import io
import json
import logging as py_logging
import os
from typing import Any

import jax
import numpy as np

from sg_jax.pruning import table
from sg_jax.records import fileio

log = py_logging.getLogger("sg_jax.prune")


def partial_path(workdir: str, step: int, table_name: str = table.DEFAULT_TABLE) -> str:
  """`pruning/[<table stem>/]partial_step<N>.npz`: beside `table.masks_path` of the step."""
  return os.path.join(os.path.dirname(table.masks_path(workdir, step, table_name)),
                      f"partial_step{step}.npz")


def identity(step: int, seeds: list[int], pairs: list[tuple[float, int]],
             options: dict[str, Any]) -> str:
  """What a saved state must match to be resumed, as canonical JSON."""
  return json.dumps({"step": int(step), "seeds": [int(s) for s in seeds],
                     "pairs": [[float(lv), int(ps)] for lv, ps in pairs], "options": options},
                    sort_keys=True)


def save(path: str, states, history: np.ndarray, key: str) -> None:
  """Writes the runs' states (a `RunState` of host arrays [S, K, ...]) and objective history
  (float32 [T, S, K]) atomically, with `key` (`identity`).

  Raises:
    OSError: the file cannot be written (naming it).
  """
  leaves = jax.tree_util.tree_leaves(states)
  buf = io.BytesIO()
  np.savez(buf, identity=np.asarray(key), history=np.asarray(history, np.float32),
           **{f"leaf{i}": np.asarray(x) for i, x in enumerate(leaves)})
  fileio.write_atomic(path, buf.getvalue())


def load(path: str, template, key: str):
  """The saved (states, history [T, S, K]) when `path` holds runs matching `key` and shaped as
  `template` (freshly initialised states of the same runs); None when there is no file, or
  (with a warning) when it is unreadable or was written for other runs or options."""
  if not os.path.exists(path):
    return None
  leaves, treedef = jax.tree_util.tree_flatten(template)
  try:
    with np.load(path, allow_pickle=False) as f:
      if str(f["identity"]) != key:
        log.warning("%s holds runs of other seeds, levels or options: ignored (these runs start "
                    "afresh)", path)
        return None
      saved = [f[f"leaf{i}"] for i in range(len(leaves))]
      history = f["history"]
  except (OSError, ValueError, KeyError) as e:
    log.warning("%s is unreadable (%s): ignored (these runs start afresh)", path, e)
    return None
  if any(np.shape(a) != np.shape(b) or np.asarray(a).dtype != np.asarray(b).dtype
         for a, b in zip(saved, leaves)):
    log.warning("%s does not match the runs' shapes: ignored (these runs start afresh)", path)
    return None
  return jax.tree_util.tree_unflatten(treedef, saved), history


def remove(path: str) -> None:
  """Deletes a saved state once its runs' rows are written (no error when absent)."""
  try:
    os.remove(path)
  except FileNotFoundError:
    pass
