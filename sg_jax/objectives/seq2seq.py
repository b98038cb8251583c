"""The sequence-to-sequence objective (`seq2seq`) of McCoy et al. (2020) and Ahuja et al. (2024,
transformers-hg): an encoder-decoder (`models.encoder_decoder`) reads a line's input part
`SOS w1 ... wk TASK` with its encoder and generates the output `o1 ... om EOS` with its decoder
(causal self-attention, cross-attention to the encoder), starting from the task token; the loss
is the mean token cross-entropy of the output (the targets from the task token on), as
`prefix_lm` scores it. Ahuja et al. found that seq2seq models do not generalise hierarchically
on question formation.

The model has the LM's call signature (tokens -> logits at every position), so the minimal-pair
preference (log P(output | input), `output_logprob`) and greedy decoding (`greedy_decode`, full
forward passes: the model has no key/value cache) are the LM's functions applied to it. Tasks
without a task token (Dyck) are refused.
"""

from __future__ import annotations

import dataclasses

import jax

from sg_jax.evaluation import decoding
from sg_jax.evaluation import minimal_pairs
from sg_jax.objectives import base
from sg_jax.objectives import prefix_lm

Array = jax.Array


@base.register
@dataclasses.dataclass(frozen=True)
class SequenceToSequence(prefix_lm.PrefixLanguageModeling):
  """Encoder over the input part, decoder over the output, loss on the output.

  Attributes:
    task_ids: the task tokens' ids (a line's input part ends at its first one; the decoder
      starts from it).
  """

  name = "seq2seq"
  attention = "prefix"  # the input/output split; the model builds its own masks from it
  model_family = "encoder_decoder"
  default_model = "encoder_decoder"

  @classmethod
  def from_config(cls, config) -> "SequenceToSequence":
    """Raises ValueError when the task has no task tokens (Dyck: no input/output split)."""
    try:
      return cls(task_ids=super().from_config(config).task_ids)
    except ValueError:
      raise ValueError(f"invalid config: objective 'seq2seq' needs a task whose lines have an "
                       f"input and an output part (a task token); the {config.task} task has "
                       "none") from None

  @staticmethod
  def output_logprob(apply_fn, inputs_NxL: Array, targets_NxL: Array, task_pos_N: Array,
                     lengths_N: Array) -> Array:
    """float32 [N]: log P(output | input) of each line (nats), the decoder's summed
    log-probabilities of the output's words and EOS given the encoded input
    (`preference.conditional_log_probs`; Ahuja et al. 2024 score seq2seq outputs so).

    Args:
      apply_fn: `tokens [N, L] -> logits [N, L, V]` of the encoder-decoder, deterministic.
      inputs_NxL, targets_NxL: int32 [N, L] stored lines; task_pos_N: int32 [N] the task
        token's position; lengths_N: int32 [N] the lines' lengths.
    """
    return minimal_pairs.conditional_log_probs(apply_fn(inputs_NxL), targets_NxL, task_pos_N,
                                            lengths_N)

  def sentence_scores(self, apply_fn, inputs_NxL: Array, targets_NxL: Array, task_pos_N: Array,
                      lengths_N: Array, num_positions: int) -> Array:
    """`output_logprob` (the minimal-pair preference's score); as `Objective.sentence_scores`."""
    del num_positions
    return self.output_logprob(apply_fn, inputs_NxL, targets_NxL, task_pos_N, lengths_N)

  @staticmethod
  def greedy_decode(apply_fn, inputs_BxL: Array, task_pos_B: Array, num_steps: int) -> Array:
    """int32 [B, L]: the greedy outputs decoded from the input parts (`decoding.greedy_decode`,
    one full forward pass per token: the encoder re-reads the input at every step, which gives
    the logits that caching its outputs would). Arguments as `decoding.greedy_decode`."""
    return decoding.greedy_decode(apply_fn, inputs_BxL, task_pos_B, num_steps)
