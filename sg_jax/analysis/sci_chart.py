"""SCI charts of a transformer LM: how compositional each span's representation is.

Definitions (Murty et al., ICLR 2023, "Characterizing intrinsic compositionality in transformers
with tree projections", §3-4, as used by Murty et al., ACL 2023, §5; `docs/REFERENCE.md`
§1 "Analysis quantities"). A sentence is the DECLARATIVE part of a line: the words before the task
token with the final "." removed, n words w_0 .. w_{n-1}; the model input is `SOS w_0 .. w_{n-1}`,
so word k sits at input position k + 1.

* contextual vector of span (i, j): sum over k = i..j of the last layer's hidden state at word k
  under the model's own mask (causal for `lm`; bidirectional for `mlm`, and for `prefix_lm`,
  whose input part the declarative words are);
* context-free vector of span (i, j): the same sum when, in EVERY layer, attention may only see
  SOS and words i..j (original positions kept), within the model's own mask;
* SCI chart[i, j] = cosine similarity of the two vectors, for all 0 <= i <= j < n.

Models that are not causal (`ModelConfig.attention` 'bidirectional' or 'prefix') have no
shortcut: every span needs its own pass, in which SOS and the words see the whole span and
nothing else. `span_sci_chart` runs the n (n + 1) / 2 passes of every sentence of a batch packed
into rows (`packing.pack_span_passes`: one segment `SOS w_i .. w_j` per span, each attending to
itself), in one forward batch; the whole-sentence segment gives the contextual states. It works
for causal models too (same charts as the start passes, more work). The functions below that
rely on causality (`sci_chart`, `packed_sci_chart`) refuse other attentions.

Causality makes the context-free state of word k in span (i, j) independent of j (it sees SOS and
words i..k only). So ONE forward pass per start position i gives the context-free states of every
span starting at i, and span sums are taken from it: n passes per sentence instead of the
original code's n(n + 1) / 2, with identical results. The pass with start 0 is the ordinary
causal pass, i.e. it also gives the contextual vectors. Two layouts compute the same charts:

* packed (`packing.pack_start_passes`, `packed_sci_chart`; what `tree_projection` uses): the
  pass with start i is run on the SHORTENED sequence `SOS w_i .. w_{n-1}` at its original
  positions (0, i + 1, .., n), and the n passes of every sentence of a batch are packed into
  rows of a fixed length (first fit decreasing) with a block-diagonal causal mask. SOS sees only
  itself, so its states are the same in every pass: each row starts with ONE SOS that every
  segment packed after it attends to. About n(n + 1) / 2 tokens per sentence;
* masked (`sci_chart`, the earlier implementation, kept as a reference): every start runs the
  whole padded batch row of length L under a mask hiding words < i, (L - 1) L tokens per
  sentence whatever its length.
The original code's layout (all n(n + 1) / 2 span-masked copies of one sentence in one batch) is
`span_batch_sci_chart`, and `naive_sci_chart` runs one pass per span (the tests' ground truth).
Every chart function is written for ONE seed; `*_over_seeds` (`registry.over_seeds`) maps it over
a leading seed axis of the parameters.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import models
from sg_jax.analysis import registry
from sg_jax.analysis.span_packing import SpanPasses, StartPasses, packed_mask, span_mask
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.models.model_config import ModelConfig

Array = jax.Array
PyTree = Any
_EPS = 1e-12


def last_hidden(params: PyTree, tokens_BxL: Array, mask_BxLxL: Array | None, *,
                config: ModelConfig, positions_BxL: Array | None = None) -> Array:
  """Last-layer hidden states [B, L, d] of the dropout-free forward pass with an extra mask.

  `positions_BxL` (int32 [B, L]) gives each token's position for the position table (default
  0..L-1).
  """
  _, internals = apply_with_intermediates(
      models.build(config), params, tokens_BxL, deterministic=True, attention_mask=mask_BxLxL,
      positions_BxL=positions_BxL)
  return internals["hidden"][-1].astype(jnp.float32)


def _check_causal(config: ModelConfig, name: str) -> None:
  if config.attention != "causal":
    raise ValueError(f"{name} relies on causal attention; the model's is {config.attention!r} "
                     "(use span_sci_chart)")


def _cosine(a: Array, b: Array) -> Array:
  dot = jnp.sum(a * b, axis=-1)
  return dot / jnp.sqrt(jnp.maximum(jnp.sum(a * a, -1) * jnp.sum(b * b, -1), _EPS))


def valid_spans(num_words_B: Array, max_words: int) -> Array:
  """bool [B, N, N]: True at spans (i, j) with i <= j < num_words."""
  r = jnp.arange(max_words)
  return (r[:, None] <= r[None, :])[None] & (r[None, None, :] < num_words_B[:, None, None])


def _chart_from_start_states(h_NxBxNxD: Array, num_words_B: Array) -> Array:
  """SCI charts [B, N, N] from h[i, b, k] = last-layer state of word k in the pass with start i
  of sentence b (any finite value where k < i or k >= n: those never enter a valid span)."""
  n_max = h_NxBxNxD.shape[0]
  r = jnp.arange(n_max)
  from_start = (r[None, :] >= r[:, None])[:, None, :, None]  # [i, 1, k, 1]: k >= i
  # Running sums from each start i over words k = i..j: the context-free vector of (i, j) from
  # the pass with start i, the contextual one from the pass with start 0 (cumulative sums are
  # several times cheaper than span-indicator contractions on CPU).
  free_NxBxNxD = jnp.cumsum(jnp.where(from_start, h_NxBxNxD, 0.0), axis=2)
  ctx_NxBxNxD = jnp.cumsum(jnp.where(from_start, h_NxBxNxD[0][None], 0.0), axis=2)
  chart = _cosine(free_NxBxNxD, ctx_NxBxNxD).transpose(1, 0, 2)  # [b, i, j]
  return jnp.where(valid_spans(num_words_B, n_max), chart, 0.0)


def sci_chart(params: PyTree, tokens_BxL: Array, num_words_B: Array, *,
              config: ModelConfig) -> Array:
  """Batched SCI chart of ONE seed in the masked layout (module docstring): one full-length
  forward pass per start position, words before the start hidden by the attention mask.

  The earlier implementation, kept as a reference for `packed_sci_chart` (same charts, about
  2-3x the work). Pure and jit-able (`config` static). Runs B * N sequences of length L in one
  forward batch, so choose B with memory in mind.

  Args:
    params: ONE seed's model parameters.
    tokens_BxL: int32 [B, L] inputs `SOS w_0 .. w_{n-1}` then `<pad>`=0 (declarative words only;
      later tokens would not change anything because of causality, but cost time). N = L - 1.
    num_words_B: int32 [B] number of words n of each sentence (0 for batch-padding rows).

  Returns:
    float32 [B, N, N] chart: cosine similarity (unitless, in [-1, 1]) of the context-free and
    contextual vectors of span (i, j); 0 where the span is invalid (i > j or j >= n).
  """
  _check_causal(config, "sci_chart")
  batch, length = tokens_BxL.shape
  n_max = length - 1
  t = jnp.arange(length)
  start = jnp.arange(n_max)
  # key position t visible in the pass for start i iff t is SOS or a word >= i.
  key_ok_NxL = (t[None, :] == 0) | (t[None, :] >= start[:, None] + 1)
  mask = jnp.broadcast_to(key_ok_NxL[:, None, None, :], (n_max, batch, length, length))
  toks = jnp.broadcast_to(tokens_BxL[None], (n_max, batch, length))
  h = last_hidden(params, toks.reshape(n_max * batch, length),
                  mask.reshape(n_max * batch, length, length), config=config)
  h_NxBxNxD = h.reshape(n_max, batch, length, -1)[:, :, 1:, :]  # [start, B, word, d]
  return _chart_from_start_states(h_NxBxNxD, num_words_B)


# params [S, ...] -> chart [S, B, N, N].
sci_chart_over_seeds = registry.over_seeds(sci_chart)


def packed_sci_chart(params: PyTree, passes: StartPasses, *, config: ModelConfig) -> Array:
  """Batched SCI chart of ONE seed from the packed, shortened start passes (module docstring).

  Same charts as `sci_chart` and `naive_sci_chart` (up to float rounding, ~1e-6). Pure and
  jit-able (`config` static); runs P * R tokens in one forward batch.

  Args:
    params: ONE seed's model parameters.
    passes: from `pack_start_passes` (P rows of R tokens, B sentences of at most N words).

  Returns:
    float32 [B, N, N] chart: cosine similarity (unitless, in [-1, 1]) of the context-free and
    contextual vectors of span (i, j); 0 where the span is invalid (i > j or j >= n).
  """
  _check_causal(config, "packed_sci_chart")
  h_PxRxD = last_hidden(params, jnp.asarray(passes.tokens), packed_mask(passes.segments),
                        config=config, positions_BxL=jnp.asarray(passes.positions))
  h_flat = h_PxRxD.reshape(-1, h_PxRxD.shape[-1])
  return _chart_from_start_states(h_flat[jnp.asarray(passes.gather)],
                                  jnp.asarray(passes.num_words))


# params [S, ...] -> chart [S, B, N, N].
packed_sci_chart_over_seeds = registry.over_seeds(packed_sci_chart)


def span_sci_chart(params: PyTree, passes: SpanPasses, *, config: ModelConfig) -> Array:
  """Batched SCI chart of ONE seed from the packed span passes, for any attention (module
  docstring): what the tree projections of bidirectional and prefix models run.

  Same charts as `naive_sci_chart` (up to float rounding, ~1e-6). Pure and jit-able (`config`
  static); runs P * R tokens in one forward batch.

  Args:
    params: ONE seed's model parameters.
    passes: from `packing.pack_span_passes` (P rows of R tokens, B sentences of at most N words).

  Returns:
    float32 [B, N, N] chart: cosine similarity (unitless, in [-1, 1]) of the context-free and
    contextual vectors of span (i, j); 0 where the span is invalid (i > j or j >= n).
  """
  seg_PxR = jnp.asarray(passes.segments)
  positions_PxR = jnp.asarray(passes.positions)
  h_PxRxD = last_hidden(params, jnp.asarray(passes.tokens), span_mask(seg_PxR), config=config,
                        positions_BxL=positions_PxR)
  h_flat = h_PxRxD.reshape(-1, h_PxRxD.shape[-1])
  batch, n_max = passes.span_segment.shape[:2]
  dummy = batch * n_max * (n_max + 1) // 2  # the id of invalid spans (no token has it)
  word_ids = jnp.where((seg_PxR >= 0) & (positions_PxR > 0), seg_PxR, dummy).reshape(-1)
  # each span's words are its segment's words: one segment sum per span, in one call
  sums_MxD = jax.ops.segment_sum(h_flat, word_ids, num_segments=dummy + 1)
  free_BxNxNxD = sums_MxD[jnp.asarray(passes.span_segment)]
  full_BxNxD = h_flat[jnp.asarray(passes.full_words)]
  r = jnp.arange(n_max)
  from_start = (r[None, :] >= r[:, None])[None, :, :, None]  # [1, i, k, 1]: k >= i
  ctx_BxNxNxD = jnp.cumsum(jnp.where(from_start, full_BxNxD[:, None], 0.0), axis=2)
  chart = _cosine(free_BxNxNxD, ctx_BxNxNxD)
  return jnp.where(valid_spans(jnp.asarray(passes.num_words), n_max), chart, 0.0)


# params [S, ...] -> chart [S, B, N, N].
span_sci_chart_over_seeds = registry.over_seeds(span_sci_chart)


@functools.partial(jax.jit, static_argnames=("config",))
def span_batch_sci_chart(params: PyTree, tokens_L: Array, *, config: ModelConfig) -> Array:
  """SCI chart of ONE sentence in the original code's layout (`get_tree_projection`).

  All n(n + 1) / 2 span-masked copies of the sentence (length n + 1, attention limited to SOS
  and the span's words in every layer) go through the model as one batch, plus one ordinary
  causal pass for the contextual vectors. The baseline of `benchmarks/analysis_throughput.py`;
  jitted (one compilation per sentence length).

  Args:
    params: ONE seed's parameters.
    tokens_L: int32 [n + 1] unpadded input `SOS w_0 .. w_{n-1}`.

  Returns:
    float32 [n, n] chart (0 below the diagonal).
  """
  length = tokens_L.shape[0]
  n = length - 1
  lo, hi = np.triu_indices(n)  # one copy per span (lo, hi), static
  t = np.arange(length)
  in_span_MxL = (t[None] >= lo[:, None] + 1) & (t[None] <= hi[:, None] + 1)
  visible_MxL = jnp.asarray(in_span_MxL | (t[None] == 0))
  mask = jnp.broadcast_to(visible_MxL[:, None, :], (lo.size, length, length))
  h_free = last_hidden(params, jnp.broadcast_to(tokens_L, (lo.size, length)), mask,
                       config=config)
  weights_MxL = jnp.asarray(in_span_MxL, jnp.float32)
  free_MxD = jnp.einsum("ml,mld->md", weights_MxL, h_free)
  ctx_MxD = weights_MxL @ last_hidden(params, tokens_L[None], None, config=config)[0]
  return jnp.zeros((n, n), jnp.float32).at[lo, hi].set(_cosine(free_MxD, ctx_MxD))


@functools.partial(jax.jit, static_argnames=("config",))
def _naive_context_free(params, tokens_1xL, lo, hi, *, config):
  length = tokens_1xL.shape[1]
  t = jnp.arange(length)
  key_ok = (t == 0) | ((t >= lo + 1) & (t <= hi + 1))
  mask = jnp.broadcast_to(key_ok[None, None, :], (1, length, length))
  in_span = ((t >= lo + 1) & (t <= hi + 1)).astype(jnp.float32)[:, None]
  return jnp.sum(last_hidden(params, tokens_1xL, mask, config=config)[0] * in_span, axis=0)


@functools.partial(jax.jit, static_argnames=("config",))
def _naive_contextual(params, tokens_1xL, *, config):
  return last_hidden(params, tokens_1xL, None, config=config)[0]


def naive_sci_chart(params: PyTree, tokens_L: Sequence[int] | np.ndarray, *,
                    config: ModelConfig) -> np.ndarray:
  """Reference-style SCI chart of ONE sentence and ONE seed: one masked forward pass per span.

  This is how the original code computes charts (O(n^2) passes); kept as the ground truth for
  tests and as the baseline of `benchmarks/analysis_throughput.py`. Host loop, not jit-able.
  Right for every attention: the span mask is ANDed with the model's own.

  Args:
    params: ONE seed's parameters.
    tokens_L: int [n + 1] unpadded input `SOS w_0 .. w_{n-1}`.

  Returns:
    float32 numpy [n, n] chart (0 below the diagonal).
  """
  tokens = jnp.asarray(np.asarray(tokens_L, np.int32)[None])
  n = tokens.shape[1] - 1
  ctx_h = _naive_contextual(params, tokens, config=config)  # [L, d]; one full causal pass
  ctx_cum = np.cumsum(np.asarray(ctx_h[1:], np.float64), axis=0)
  chart = np.zeros((n, n), np.float32)
  for i in range(n):
    for j in range(i, n):
      free = np.asarray(_naive_context_free(params, tokens, i, j, config=config), np.float64)
      ctx = ctx_cum[j] - (ctx_cum[i - 1] if i > 0 else 0.0)
      chart[i, j] = free @ ctx / max(np.linalg.norm(free) * np.linalg.norm(ctx), 1e-12)
  return chart
