"""The masked language-modelling objective (`mlm`) of Chen et al. (ICLR 2024), who study
syntactic attention structure in BERT-style masked LMs, with BERT's masking (Devlin et al.,
NAACL 2019, §3.1).

Each line's words (`w1 ... wn` of the stored inputs `SOS w1 ... wn`; SOS is never selected) are
selected with probability `select_rate` (15%); a selected word is replaced by `[MASK]` with
probability `mask_rate` (80%), by a uniformly drawn word with probability `random_rate` (10%),
and left unchanged otherwise (10%). The targets are the original words at the selected positions
and 0 (not scored) elsewhere; attention is bidirectional within a line. `[MASK]` is the id
`vocab.size` (one row more than the task's vocabulary: `Objective.extra_tokens`). The draws
come from the seed's objective key folded with the step (`step.model_inputs`), so a resumed run
equals an uninterrupted one and a seed trained in a group equals the seed trained alone.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sg_jax import tasks
from sg_jax.evaluation import minimal_pairs
from sg_jax.objectives import base

Array = jax.Array


@base.register
@dataclasses.dataclass(frozen=True)
class MaskedLanguageModeling(base.Objective):
  """BERT masking of a line's words; loss on the selected positions only.

  Attributes:
    mask_id: the `[MASK]` id (the task vocabulary's size).
    num_words: word ids are 1..num_words (the random replacements are drawn among them).
    select_rate, mask_rate, random_rate: BERT's 15% / 80% / 10%.
  """

  name = "mlm"
  attention = "bidirectional"
  extra_tokens = 1
  metric_names = ("masked_accuracy",)
  teacher_forced_metrics = False

  mask_id: int = 0
  num_words: int = 0
  select_rate: float = 0.15
  mask_rate: float = 0.8
  random_rate: float = 0.1

  @classmethod
  def from_config(cls, config) -> "MaskedLanguageModeling":
    vocab = tasks.from_config(config).vocab()
    return cls(mask_id=vocab.size, num_words=len(vocab.words))

  def lines(self, inputs_BxL: Array, targets_BxL: Array, lengths_B: Array, key: Array
            ) -> tuple[Array, Array]:
    """(corrupted inputs, targets at the selected positions) of one seed's lines; shapes and
    arguments as `Objective.lines`."""
    del targets_BxL
    k_select, k_kind, k_word = jax.random.split(key, 3)
    pos = jnp.arange(inputs_BxL.shape[1])[None, :]
    words = (pos >= 1) & (pos < lengths_B[:, None])
    selected = words & (jax.random.uniform(k_select, inputs_BxL.shape) < self.select_rate)
    kind = jax.random.uniform(k_kind, inputs_BxL.shape)
    random_words = jax.random.randint(k_word, inputs_BxL.shape, 1, self.num_words + 1,
                                      dtype=inputs_BxL.dtype)
    corrupted = jnp.where(kind < self.mask_rate, jnp.asarray(self.mask_id, inputs_BxL.dtype),
                          jnp.where(kind < self.mask_rate + self.random_rate, random_words,
                                    inputs_BxL))
    return (jnp.where(selected, corrupted, inputs_BxL),
            jnp.where(selected, inputs_BxL, jnp.zeros_like(inputs_BxL)))

  def sentence_scores(self, apply_fn, inputs_NxL: Array, targets_NxL: Array, task_pos_N: Array,
                      lengths_N: Array, num_positions: int) -> Array:
    """The pseudo-log-likelihood of each output (`preference.pseudo_log_likelihood`)."""
    del targets_NxL
    return minimal_pairs.pseudo_log_likelihood(apply_fn, inputs_NxL, task_pos_N, lengths_N,
                                             self.mask_id, num_positions)

  def metrics(self, logits_BxLxV: Array, targets_BxL: Array) -> dict[str, Array]:
    """`masked_accuracy`: the fraction of selected positions whose word is predicted (argmax)."""
    return {"masked_accuracy": base.masked_accuracy(logits_BxLxV, targets_BxL)}
