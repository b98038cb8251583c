"""The checkpoints a checkpoint is compared with: the `references` input of the analysis.

Quantities that compare checkpoints (`training_dynamics`: CKA and TVD to the previous and to the
final checkpoint) read `registry.References`. `ReferenceParams` finds, for a step of a workdir,
the checkpoint just before it and the last one, restores their parameters (parameters only,
`checkpointing.restore`) and keeps a few of them, so that an analysis running through the steps
in order restores the final checkpoint once and reuses each checkpoint as the next one's
previous (`keep`).
"""

from __future__ import annotations

import bisect
from typing import Any, Sequence

import jax
import numpy as np

from sg_jax import checkpointing
from sg_jax.analysis import registry

PyTree = Any

# Checkpoints kept besides the final one (the analysed one and the one before it).
KEPT = 2


class ReferenceParams:
  """The previous and final checkpoints of every step of one workdir (module docstring).

  Args:
    workdir: the run directory.
    steps: every checkpoint step of the workdir (the last is "final").

  Raises:
    ValueError: no steps.
  """

  def __init__(self, workdir: str, steps: Sequence[int]):
    if not steps:
      raise ValueError(f"no checkpoint steps to compare with in {workdir}")
    self._workdir = workdir
    self._steps = sorted(int(s) for s in steps)
    self._kept: dict[int, tuple[list[int], PyTree]] = {}

  @property
  def final_step(self) -> int:
    """The last checkpoint of the workdir."""
    return self._steps[-1]

  def previous_step(self, step: int) -> int | None:
    """The checkpoint just before `step` (None for the first one)."""
    i = bisect.bisect_left(self._steps, step)
    return self._steps[i - 1] if i > 0 else None

  def keep(self, step: int, seeds: Sequence[int], params_all: PyTree) -> None:
    """Keeps a checkpoint the caller has restored, with its seed ids ([S] leading axis), for
    later steps; forgets the oldest kept one beyond `KEPT` (never the final one)."""
    self._kept[int(step)] = ([int(s) for s in seeds], params_all)
    others = sorted(s for s in self._kept if s != self.final_step)
    for old in others[:-KEPT]:
      del self._kept[old]

  def _params(self, step: int, seed_ids: Sequence[int]) -> PyTree:
    if step not in self._kept:
      restored = checkpointing.restore(self._workdir, step, params_only=True)
      self.keep(step, restored.seeds, restored.state["params"])
    seeds, params = self._kept[step]
    missing = [s for s in seed_ids if s not in seeds]
    if missing:
      raise ValueError(f"seeds {missing} are not in the checkpoint of step {step} "
                       f"(seeds: {seeds}), which they are compared with")
    idx = np.array([seeds.index(s) for s in seed_ids])
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[idx], params)

  def references(self, step: int, seed_ids: Sequence[int]) -> registry.References:
    """The `registry.References` of `step` for the seeds `seed_ids` (restoring as needed).

    Raises:
      ValueError: a seed missing from a reference checkpoint.
      checkpointing.CheckpointError: a reference checkpoint cannot be read.
    """
    previous = self.previous_step(step)
    return registry.References(
        final_step=self.final_step, final=self._params(self.final_step, seed_ids),
        previous_step=previous,
        previous=None if previous is None else self._params(previous, seed_ids))
