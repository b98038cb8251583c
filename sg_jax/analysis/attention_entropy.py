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
`packed_attention_entropy_stats` (what `attention_entropy_metrics` uses), takes rows that each
start with ONE SOS followed by the words of several sequences (`packing.pack_segments`), every
word seeing its own sequence and the row's SOS: since SOS sees only itself, every attention
distribution of a word is the one of its unpacked sequence, and each sequence's own SOS query
(entropy 0) is counted without being computed. Same values, fewer tokens (no per-sequence SOS, no
padding to the longest line of a batch) and one shape for a whole sentence set.

Attention. Every quantity reads the attention the model computes under its own mask
(`ModelConfig.attention`, set by the objective): causal for `lm`, bidirectional within the line
for `mlm`, prefix for `prefix_lm` (bidirectional over the input part, which is the whole
declarative input). The released variant's per-layer attention on the embeddings uses the same
mask. The packed layout relies on causality (a shared SOS that sees only itself), so for the
other attentions `attention_entropy_metrics` runs the padded layout, one input per row.

All functions are written for one seed; the `*_over_seeds` versions add the seed axis
(`registry.over_seeds`). Batch functions return *sums and counts* so that several batches can be
combined exactly with `combine_stats` and then turned into means with `finalize_stats`;
`attention_entropy_metrics` does so over a whole set of inputs for every seed. The module
registers the `attention_entropy` metric group of `sg_jax.analyze`.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy
import numpy as np

from sg_jax import models
from sg_jax.analysis import pipeline, registry
from sg_jax.models.attention_masks import causal_mask, line_mask
from sg_jax.models.intermediates import apply_with_intermediates, attention_probabilities
from sg_jax.models.model_config import ModelConfig

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


def reference_entropy_per_sentence(params: PyTree, hidden0_BxLxD: Array, lengths_B: Array,
                                   tokens_BxL: Array | None = None, *,
                                   config: ModelConfig) -> Array:
  """The released code's attention "entropy" of each sentence (see module docstring).

  Args:
    params: ONE seed's model parameters.
    hidden0_BxLxD: the input embeddings (token embedding * sqrt(d) + positions), [B, L, d].
    lengths_B: int [B] non-padding positions.
    tokens_BxL: int32 [B, L] the inputs, for the mask of a model that is not causal
      (`attention_masks.line_mask`); unused (may be None) for a causal model.
    config: the model config (static).

  Returns:
    float32 [B]: mean over layers of (sum over valid query positions of the entropy of the
    head-averaged attention of layer l applied to the input embeddings). Nats, not negated.

  Raises:
    ValueError: a model that is not causal without `tokens_BxL`.
  """
  length = hidden0_BxLxD.shape[1]
  if config.attention == "causal":
    mask = causal_mask(length)[None, None]
  elif tokens_BxL is None:
    raise ValueError(f"the {config.attention} attention's mask needs the tokens")
  else:
    mask = line_mask(config.attention, tokens_BxL, tokens_BxL != 0, config.prefix_end_ids)
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
  """Entropy sums of one batch for ONE seed, from the real (dropout-free) forward pass under the
  model's own mask (any attention).

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
      models.build(config), params, tokens_BxL, deterministic=True)
  sums, count = head_entropy_sums(internals["attention"], lengths_B)
  ref_B = reference_entropy_per_sentence(params, internals["hidden"][0], lengths_B, tokens_BxL,
                                         config=config)
  return {
      "head_entropy_sum": sums,
      "head_entropy_count": count,
      "reference_entropy_sum": jnp.sum(ref_B),
      "num_sentences": jnp.sum(lengths_B > 0).astype(jnp.float32),
  }


# params [S, ...] -> every value with a leading [S] axis; the batch is shared by all seeds.
attention_entropy_stats_over_seeds = registry.over_seeds(attention_entropy_stats)


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

  Raises:
    ValueError: a model that is not causal (the shared SOS would see the words).
  """
  if config.attention != "causal":
    raise ValueError(f"the packed attention-entropy layout needs a causal model; this one's "
                     f"attention is {config.attention!r} (use the padded layout)")
  seg = jnp.asarray(segments_PxR)
  # a word sees its own sequence and the row's SOS (the model adds the causal mask).
  mask_PxRxR = (seg[:, :, None] == seg[:, None, :]) | (jnp.arange(seg.shape[1]) == 0)[None, None]
  _, internals = apply_with_intermediates(
      models.build(config), params, tokens_PxR, deterministic=True, attention_mask=mask_PxRxR,
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


# params [S, ...] -> every value with a leading [S] axis.
packed_attention_entropy_stats_over_seeds = registry.over_seeds(packed_attention_entropy_stats)


def combine_stats(a: dict[str, Array] | None, b: dict[str, Array]) -> dict[str, Array]:
  """Adds two stats dicts entry by entry (`a=None` returns `b`)."""
  return registry.accumulate(a, b)


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


@functools.lru_cache(maxsize=4)
def _entropy_plan(sequences: tuple[tuple[int, ...], ...], sos_id: int, batch_size: int
                  ) -> list[tuple[int, tuple]]:
  """(inputs, device arrays) of each `pipeline.make_packed_line_batches` batch, cached: an
  analysis of several checkpoints on the same inputs plans and transfers them once."""
  return [(len(b.indices), (jnp.asarray(b.tokens), jnp.asarray(b.positions),
                            jnp.asarray(b.segments), jnp.asarray(len(b.indices), jnp.int32)))
          for b in pipeline.make_packed_line_batches(sequences, sos_id=sos_id,
                                                     batch_size=batch_size)]


ENTROPY_LAYOUTS = ("packed", "padded")


def attention_entropy_metrics(params_S: PyTree, sentences: Sequence[Sequence[int]], *,
                              config: ModelConfig, sos_id: int, batch_size: int = 64,
                              seeds_per_call: int | None = None,
                              progress: Any = None, layout: str = "packed"
                              ) -> dict[str, np.ndarray]:
  """Attention entropies over a set of model inputs for every seed.

  Args:
    params_S: parameters with a leading seed axis [S, ...].
    sentences: word ids of each input without SOS (`pipeline.entropy_inputs`: the declarative
      part, the released input, or the whole LM line); every quantity is computed on exactly
      these inputs.
    config: model config.
    sos_id: SOS id.
    batch_size: inputs per batch (on average with the packed layout).
    seeds_per_call: process this many seeds per compiled call (None = all).
    progress: optional callable(int) called with the number of lines finished per batch.
    layout: 'packed' (inputs packed into rows with one SOS each,
      `pipeline.make_packed_line_batches`; the default; a model that is not causal runs
      'padded' instead) or 'padded' (one input per row, sorted by length,
      `pipeline.make_batches`); same values.

  Returns:
    numpy dict: 'head_entropy' [S, layers, heads], 'paper_sparsity' [S], 'reference_entropy' [S]
    (module docstring).

  Raises:
    ValueError: an unknown layout or an empty input.
  """
  if layout not in ENTROPY_LAYOUTS:
    raise ValueError(f"unknown attention-entropy layout {layout!r}; expected one of "
                     f"{ENTROPY_LAYOUTS}")
  if layout == "packed" and config.attention == "causal":
    calls = _entropy_plan(tuple(tuple(int(w) for w in s) for s in sentences), int(sos_id),
                          int(batch_size))
    fn = packed_attention_entropy_stats_over_seeds
  else:
    calls = [(int(np.sum(b.indices >= 0)), (jnp.asarray(b.tokens), jnp.asarray(b.lengths)))
             for b in pipeline.make_batches(sentences, sos_id=sos_id, batch_size=batch_size)]
    fn = attention_entropy_stats_over_seeds
  def chunk(params):
    total = None
    for count, arrays in calls:
      total = combine_stats(total, fn(params, *arrays, config=config))
      if progress is not None:
        progress(count)
    return finalize_stats(total)

  return registry.in_seed_chunks(chunk, params_S, seeds_per_call)


def _compute(inputs: registry.Inputs) -> dict[str, Any]:
  """attention_sparsity_paper, attention_entropy_reference, attention_entropy_mean and
  attention_entropy_l{layer}_h{head} [S]."""
  ent = attention_entropy_metrics(
      inputs.params, inputs.entropy_inputs, config=inputs.config, sos_id=inputs.sos_id,
      batch_size=inputs.options.entropy_batch_size, seeds_per_call=inputs.options.seeds_per_call)
  head_SxNxH = ent["head_entropy"]
  columns = {"attention_sparsity_paper": ent["paper_sparsity"],
             "attention_entropy_reference": ent["reference_entropy"],
             "attention_entropy_mean": [float(np.mean(h)) for h in head_SxNxH]}
  for layer in range(head_SxNxH.shape[1]):
    for h in range(head_SxNxH.shape[2]):
      columns[f"attention_entropy_l{layer}_h{h}"] = head_SxNxH[:, layer, h]
  return columns


registry.register_quantity(registry.Quantity(
    name="attention_entropy",
    groups=(registry.Group("attention_entropy", (
        "attention_sparsity_paper", "attention_entropy_reference", "attention_entropy_mean",
        "attention_entropy_l{layer}_h{head}"), inputs=("entropy_inputs",)),),
    compute=_compute,
    dynamics=(registry.Dynamic(
        "attention_sparsity_paper", axis="attention sparsity (negative mean entropy, nats)",
        title="Attention sparsity (paper: higher = sparser)", label="attention sparsity",
        trajectory_row=2, trajectory_axis="sparsity (-entropy, nats)"),),
))
