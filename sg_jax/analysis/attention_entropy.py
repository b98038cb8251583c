"""Attention entropy / sparsity (Murty et al., ACL 2023, §5 "attention sparsity").

Three quantities, named so that nobody confuses them (`docs/REFERENCE.md` §1):

* `head_entropy` [layers, heads]: mean entropy (nats) of each head's attention distributions in
  the *actual* forward pass, averaged over every non-padding query position of every sentence
  (the SOS position, whose distribution has a single outcome and entropy 0, included).
* `paper_sparsity` (the paper's "attention sparsity"): the NEGATIVE mean entropy over all
  attention distributions of the actual forward pass = `-mean(head_entropy)` (every head has the
  same number of distributions). Higher = sparser.
* `reference_entropy` (what the released code logs, with its quirks): per sentence, the entropy of
  the HEAD-AVERAGED attention, SUMMED over (non-padding) query positions, then AVERAGED over
  layers, where every layer's attention is computed from the INPUT EMBEDDINGS (layer l's q/k
  parameters applied to `hidden[0]`, because the reference's layer loop never feeds a layer's
  output to the next); NOT negated; then averaged over sentences. Higher = less sparse. Padding
  positions are excluded here (their rows are not attention distributions of the sentence).

Input. Every quantity is computed on the token sequences the caller passes. `sg_jax.analyze`
passes, by default, the released input: SOS + the declarative words (source words before the task
token, final "." removed) of the transformed (`quest` / `PRESENT`) lines; `--entropy_input=line`
passes SOS + whole LM lines instead (`pipeline.ENTROPY_INPUTS`). The choice matters most for
`reference_entropy`, a SUM over positions: whole question-formation lines are about twice as long
as their declarative part, and the sum grows faster than the length (about 3x on the same lines).

Layouts. `attention_entropy_stats` takes a padded batch (one sequence per row). The packed one,
`packed_attention_entropy_stats` (what `pipeline` uses), takes rows that each start with ONE SOS
followed by the words of several sequences (`tree_projection.pack_segments`), every word seeing
its own sequence and the row's SOS: since SOS sees only itself, every attention distribution of
a word is the one of its unpacked sequence, and each sequence's own SOS query (entropy 0) is
counted without being computed. Same values, fewer tokens (no per-sequence SOS, no padding to the
longest line of a batch) and one shape for a whole sentence set.

All functions are written for one seed; the `*_over_seeds` versions add the seed axis.
Batch functions return *sums and counts* so that several batches can be combined exactly with
`combine_stats` and then turned into means with `finalize_stats`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy

from sg_jax.intermediates import apply_with_intermediates, attention_probabilities
from sg_jax.model import ModelConfig, TransformerLM, causal_mask

Array = jax.Array
PyTree = Any


def entropy(probs: Array, axis: int = -1) -> Array:
  """Shannon entropy in nats along `axis`, with 0 log 0 = 0."""
  return -jnp.sum(xlogy(probs, probs), axis=axis)


def _query_mask(lengths_B: Array, length: int) -> Array:
  """bool [B, L]: True at the non-padding positions (0 .. lengths-1) of each sequence."""
  return jnp.arange(length)[None, :] < lengths_B[:, None]


def head_entropy_sums(attention_NxBxHxLxL: Array, lengths_B: Array) -> tuple[Array, Array]:
  """Sums of attention entropies per layer and head over valid query positions.

  Args:
    attention_NxBxHxLxL: attention probabilities [layers, batch, heads, L(query), L(key)].
    lengths_B: int [batch], number of non-padding input positions (SOS + words).

  Returns:
    (sums [layers, heads] float32 nats, count: scalar number of query positions summed).
  """
  ent = entropy(attention_NxBxHxLxL.astype(jnp.float32))  # [N, B, H, L]
  valid_BxL = _query_mask(lengths_B, attention_NxBxHxLxL.shape[-1])
  sums = jnp.sum(jnp.where(valid_BxL[None, :, None, :], ent, 0.0), axis=(1, 3))
  return sums, jnp.sum(valid_BxL).astype(jnp.float32)


def reference_entropy_per_sentence(params: PyTree, hidden0_BxLxD: Array, lengths_B: Array, *,
                                   config: ModelConfig) -> Array:
  """The released code's attention "entropy" of each sentence (see module docstring).

  Args:
    params: ONE seed's TransformerLM parameters.
    hidden0_BxLxD: the input embeddings (token embedding * sqrt(d) + positions), [B, L, d].
    lengths_B: int [B] non-padding positions.
    config: the model config (static).

  Returns:
    float32 [B]: mean over layers of (sum over valid query positions of the entropy of the
    head-averaged attention of layer l applied to the input embeddings). Nats, not negated.
  """
  length = hidden0_BxLxD.shape[1]
  mask = causal_mask(length)[None, None]
  valid_BxL = _query_mask(lengths_B, length)
  per_layer = []
  for layer in range(config.num_layers):
    weights_BxHxLxL = attention_probabilities(
        config, params[f"layer_{layer}"]["attention"], hidden0_BxLxD, mask)
    ent_BxL = entropy(jnp.mean(weights_BxHxLxL.astype(jnp.float32), axis=1))
    per_layer.append(jnp.sum(jnp.where(valid_BxL, ent_BxL, 0.0), axis=-1))
  return jnp.mean(jnp.stack(per_layer), axis=0)


def attention_entropy_stats(params: PyTree, tokens_BxL: Array, lengths_B: Array, *,
                            config: ModelConfig) -> dict[str, Array]:
  """Entropy sums of one batch for ONE seed, from the real (causal, dropout-free) forward pass.

  Pure and jit-able (`config` static); see `attention_entropy_stats_over_seeds` for the jitted,
  seed-vmapped version.

  Args:
    params: ONE seed's parameters.
    tokens_BxL: int32 [B, L] inputs `SOS w1 .. wn` then `<pad>`=0.
    lengths_B: int32 [B] non-padding input positions (n + 1; = EncodedSplit.lengths); rows with
      length 0 are batch padding and contribute nothing (not even to 'num_sentences').
    config: model config (static).

  Returns:
    dict of sums (combine batches with `combine_stats`, then `finalize_stats`):
      'head_entropy_sum' [layers, heads] nats, 'head_entropy_count' scalar (query positions),
      'reference_entropy_sum' scalar (sum over sentences), 'num_sentences' scalar.
  """
  _, internals = apply_with_intermediates(
      TransformerLM(config), params, tokens_BxL, deterministic=True)
  sums, count = head_entropy_sums(internals["attention"], lengths_B)
  ref_B = reference_entropy_per_sentence(params, internals["hidden"][0], lengths_B, config=config)
  return {
      "head_entropy_sum": sums,
      "head_entropy_count": count,
      "reference_entropy_sum": jnp.sum(ref_B),
      "num_sentences": jnp.sum(lengths_B > 0).astype(jnp.float32),
  }


@functools.partial(jax.jit, static_argnames=("config",))
def attention_entropy_stats_over_seeds(params_S: PyTree, tokens_BxL: Array, lengths_B: Array, *,
                                       config: ModelConfig) -> dict[str, Array]:
  """`attention_entropy_stats` vmapped over seeds: params [seed, ...] -> every value [seed, ...].

  Jitted (config static). The batch is shared by all seeds.
  """
  fn = functools.partial(attention_entropy_stats, config=config)
  return jax.vmap(fn, in_axes=(0, None, None))(params_S, tokens_BxL, lengths_B)


def packed_attention_entropy_stats(params: PyTree, tokens_PxR: Array, positions_PxR: Array,
                                   segments_PxR: Array, num_lines: Array, *,
                                   config: ModelConfig) -> dict[str, Array]:
  """`attention_entropy_stats` of packed rows for ONE seed (module docstring, "Layouts").

  Pure and jit-able (`config` static).

  Args:
    params: ONE seed's parameters.
    tokens_PxR: int32 [P, R] rows from `tree_projection.pack_segments`: SOS in column 0, then
      the words of the sequences (each sequence = SOS + its words), then `<pad>`=0.
    positions_PxR: int32 [P, R] position of each token in its sequence (SOS 0, words 1..n).
    segments_PxR: int32 [P, R] sequence id of each word, -1 for SOS and padding.
    num_lines: int32 scalar, the number of sequences in the rows (their SOS queries count as
      query positions of entropy 0).
    config: model config (static).

  Returns:
    the dict of `attention_entropy_stats`.
  """
  seg = jnp.asarray(segments_PxR)
  # a word sees its own sequence and the row's SOS (the model adds the causal mask).
  mask_PxRxR = (seg[:, :, None] == seg[:, None, :]) | (jnp.arange(seg.shape[1]) == 0)[None, None]
  _, internals = apply_with_intermediates(
      TransformerLM(config), params, tokens_PxR, deterministic=True, attention_mask=mask_PxRxR,
      positions_BxL=positions_PxR)
  word_PxR = seg >= 0
  ent_NxPxHxR = entropy(internals["attention"].astype(jnp.float32))
  sums = jnp.sum(jnp.where(word_PxR[None, :, None, :], ent_NxPxHxR, 0.0), axis=(1, 3))
  lines = jnp.asarray(num_lines, jnp.float32)
  per_layer = []
  for layer in range(config.num_layers):  # the released variant: every layer on the embeddings
    weights_PxHxRxR = attention_probabilities(
        config, params[f"layer_{layer}"]["attention"], internals["hidden"][0],
        mask_PxRxR[:, None] & causal_mask(seg.shape[1])[None, None])
    ent_PxR = entropy(jnp.mean(weights_PxHxRxR.astype(jnp.float32), axis=1))
    per_layer.append(jnp.sum(jnp.where(word_PxR, ent_PxR, 0.0)))
  return {
      "head_entropy_sum": sums,
      "head_entropy_count": jnp.sum(word_PxR).astype(jnp.float32) + lines,
      "reference_entropy_sum": jnp.mean(jnp.stack(per_layer)),
      "num_sentences": lines,
  }


@functools.partial(jax.jit, static_argnames=("config",))
def packed_attention_entropy_stats_over_seeds(params_S: PyTree, tokens_PxR: Array,
                                              positions_PxR: Array, segments_PxR: Array,
                                              num_lines: Array, *,
                                              config: ModelConfig) -> dict[str, Array]:
  """`packed_attention_entropy_stats` vmapped over seeds (jitted): every value gains [seed]."""
  fn = functools.partial(packed_attention_entropy_stats, config=config)
  return jax.vmap(fn, in_axes=(0, None, None, None, None))(
      params_S, tokens_PxR, positions_PxR, segments_PxR, num_lines)


def combine_stats(a: dict[str, Array] | None, b: dict[str, Array]) -> dict[str, Array]:
  """Adds two stats dicts entry by entry (`a=None` returns `b`)."""
  if a is None:
    return b
  return jax.tree_util.tree_map(lambda x, y: x + y, a, b)


def finalize_stats(stats: dict[str, Array]) -> dict[str, Array]:
  """Turns summed stats (with or without a leading seed axis) into the reported quantities.

  Returns:
    'head_entropy' [..., layers, heads] mean entropy (nats) per head;
    'paper_sparsity' [...] negative mean entropy over all attention distributions (the paper's);
    'reference_entropy' [...] mean over sentences of the released code's per-sentence quantity.
  """
  head = stats["head_entropy_sum"] / stats["head_entropy_count"][..., None, None]
  return {
      "head_entropy": head,
      "paper_sparsity": -jnp.mean(head, axis=(-2, -1)),
      "reference_entropy": stats["reference_entropy_sum"] / stats["num_sentences"],
  }
