"""The prefix language-modelling objective (`prefix_lm`), one of the objectives Ahuja et al.
(2024, "Learning syntax without planting trees") compare with the LM on question formation and
tense: the input part of a line (`SOS w1 ... wk` up to and including its task token `quest` /
`decl` / `PAST` / `PRESENT`) is read with bidirectional attention, the output part causally
after it (`attention_masks`, 'prefix'), and the loss is next-token cross-entropy on the output
only (the targets from the task token on: the output's words and EOS)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import tasks
from sg_jax.objectives import base
from sg_jax.tasks import vocab as vocab_lib

Array = jax.Array


@base.register
@dataclasses.dataclass(frozen=True)
class PrefixLanguageModeling(base.Objective):
  """Bidirectional over the input part, causal over the output, loss on the output.

  Attributes:
    task_ids: the task tokens' ids (the prefix ends at a line's first one).
  """

  name = "prefix_lm"
  attention = "prefix"

  task_ids: tuple = ()

  @classmethod
  def from_config(cls, config) -> "PrefixLanguageModeling":
    """Raises ValueError when the task has no task tokens (Dyck: no input/output split)."""
    vocab = tasks.from_config(config).vocab()
    ids = tuple(int(i) for i in np.flatnonzero(vocab.pos_table == vocab_lib.POS_TASK))
    if not ids:
      raise ValueError(f"invalid config: objective 'prefix_lm' needs a task whose lines have an "
                       f"input and an output part (a task token); the {config.task} task has "
                       "none")
    return cls(task_ids=ids)

  @property
  def prefix_end_ids(self) -> tuple[int, ...]:
    return self.task_ids

  def lines(self, inputs_BxL: Array, targets_BxL: Array, lengths_B: Array, key: Array
            ) -> tuple[Array, Array]:
    """(inputs, targets scored from the task token on); as `Objective.lines`."""
    del lengths_B, key
    is_task = jnp.isin(inputs_BxL, jnp.asarray(self.task_ids, inputs_BxL.dtype))
    output = jnp.cumsum(is_task, axis=1) > 0
    return inputs_BxL, jnp.where(output, targets_BxL, jnp.zeros_like(targets_BxL))
