"""Which checkpoints a run keeps: full states for resuming, parameters for the analysis.

A full checkpoint holds the whole `TrainState`: parameters, both AdamW moments (three float32
copies of the parameters), PRNG keys and flags. Resuming needs all of it, but only the newest;
the analysis and pruning read the parameters and divergence flags of every checkpoint
(`layout.ANALYSIS_FIELDS`). With `checkpoint.keep_full = N > 0` a run therefore writes

* `WORKDIR/full_states/<step>`: the full state at every save (every `checkpoint.every` steps, the
  last step and a stop signal's step), of which orbax's `LatestN(N)` preservation policy keeps the
  newest N;
* `WORKDIR/checkpoints/<step>`: the analysis fields only, at every multiple of
  `checkpoint.params_every` (0: of `checkpoint.every`) and at the last step, kept (subject to
  `checkpoint.max_to_keep`, 0 = all).

`keep_full = 0` (the default) keeps the layout before the policy: a full state in
`checkpoints/` at every save, all kept. `disk_bytes_per_seed` gives what either layout writes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from sg_jax.checkpointing.layout import ANALYSIS_FIELDS


@dataclasses.dataclass(frozen=True)
class Preservation:
  """The checkpoint preservation policy of a run (module docstring).

  Attributes:
    every: steps between saves (`checkpoint.every`).
    params_every: steps between parameter-only checkpoints (a multiple of `every`).
    keep_full: full states kept (the newest); 0 = the layout before the policy.
    final_step: the run's last step (`train.num_steps`), always an analysis checkpoint.
  """

  every: int
  params_every: int
  keep_full: int
  final_step: int

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "Preservation":
    """From `config.checkpoint` (fields `every`, `keep_full`, `params_every`; the last two absent
    in the configs of runs written before the policy: off).

    Raises:
      ValueError: keep_full or params_every < 0, or params_every not a multiple of every.
    """
    section = config.checkpoint
    every = int(section.every)
    keep_full = int(section.get("keep_full", 0))
    params_every = int(section.get("params_every", 0)) or every
    if keep_full < 0:
      raise ValueError(f"invalid config: checkpoint.keep_full must be >= 0 (0 = every "
                       f"checkpoint a full state), got {keep_full}")
    if params_every < 0 or params_every % every:
      raise ValueError(f"invalid config: checkpoint.params_every must be 0 or a multiple of "
                       f"checkpoint.every ({every}), got {params_every}")
    return cls(every=every, params_every=params_every, keep_full=keep_full,
               final_step=int(config.train.num_steps))

  @property
  def split(self) -> bool:
    """Whether full states and analysis checkpoints are kept apart (`keep_full` > 0)."""
    return self.keep_full > 0

  def analysis_step(self, step: int) -> bool:
    """Whether `step` gets a parameter-only checkpoint (under the policy)."""
    return step % self.params_every == 0 or step == self.final_step

  def full_state_policy(self) -> ocp.checkpoint_managers.PreservationPolicy:
    """orbax's policy for `full_states/`: the newest `keep_full` steps."""
    return ocp.checkpoint_managers.LatestN(n=self.keep_full)


def analysis_state(state: Any) -> dict:
  """The fields of a `TrainState` (stacked [seed, ...]) that a parameter-only checkpoint keeps
  (`layout.ANALYSIS_FIELDS`), as a dict with the same names as a full checkpoint's."""
  return {name: getattr(state, name) for name in ANALYSIS_FIELDS}


def state_bytes(abstract_state: Any, num_seeds: int) -> tuple[int, int]:
  """(full, analysis) bytes per seed of a stacked state (arrays or `jax.ShapeDtypeStruct`s with a
  leading [seed] axis): what one checkpoint of each kind stores per seed (array data; orbax adds
  a few kB of metadata per checkpoint).

  Raises:
    ValueError: num_seeds < 1.
  """
  if num_seeds < 1:
    raise ValueError(f"num_seeds must be >= 1, got {num_seeds}")

  def nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
               for x in jax.tree_util.tree_leaves(tree))

  full = nbytes(abstract_state)
  kept = nbytes(analysis_state(abstract_state))
  return full // num_seeds, kept // num_seeds


def disk_bytes_per_seed(full_bytes: int, analysis_bytes: int, num_steps: int,
                        policy: Preservation) -> dict[str, int]:
  """Bytes on disk per seed at the end of an uninterrupted run of `num_steps` steps.

  Args:
    full_bytes: one full checkpoint's bytes per seed (`state_bytes`).
    analysis_bytes: one parameter-only checkpoint's bytes per seed.
    num_steps: the run's length (saves at step 0, every `policy.every` steps and the last).
    policy: the preservation policy.

  Returns:
    {'before': every save a full state (keep_full = 0), 'after': under `policy`,
     'full_states': full states kept, 'analysis_checkpoints': parameter-only checkpoints}.
  """
  policy = dataclasses.replace(policy, final_step=num_steps)
  saves = sorted(set(range(0, num_steps + 1, policy.every)) | {num_steps})
  before = len(saves) * full_bytes
  if not policy.split:
    return {"before": before, "after": before, "full_states": len(saves),
            "analysis_checkpoints": 0}
  analysis = [s for s in saves if policy.analysis_step(s)]
  full = min(policy.keep_full, len(saves))
  return {"before": before, "after": full * full_bytes + len(analysis) * analysis_bytes,
          "full_states": full, "analysis_checkpoints": len(analysis)}
