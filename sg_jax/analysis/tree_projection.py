"""Tree projections of a causal transformer LM: SCI charts, projected trees, tscore, tparseval.

Definitions (Murty et al., ICLR 2023, "Characterizing intrinsic compositionality in transformers
with tree projections", §3-4, as used by Murty et al., ACL 2023, §5; `docs/REFERENCE.md`
§1 "Analysis quantities"). A sentence is the DECLARATIVE part of a line: the words before the task
token with the final "." removed, n words w_0 .. w_{n-1}; the model input is `SOS w_0 .. w_{n-1}`,
so word k sits at input position k + 1.

* contextual vector of span (i, j): sum over k = i..j of the last layer's hidden state at word k
  under the ordinary causal mask;
* context-free vector of span (i, j): the same sum when, in EVERY layer, attention may only see
  SOS and words i..j (original positions kept);
* SCI chart[i, j] = cosine similarity of the two vectors, for all 0 <= i <= j < n.

Causality makes the context-free state of word k in span (i, j) independent of j (it sees SOS and
words i..k only). So ONE forward pass per start position i gives the context-free states of every
span starting at i, and span sums are taken from it: n passes per sentence instead of the
original code's n(n + 1) / 2, with identical results. The pass with start 0 is the ordinary
causal pass, i.e. it also gives the contextual vectors. Two layouts compute the same charts:

* packed (`pack_start_passes`, `packed_sci_chart`; what `pipeline` uses): the pass with start i
  is run on the SHORTENED sequence `SOS w_i .. w_{n-1}` at its original positions
  (0, i + 1, .., n), and the n passes of every sentence of a batch are packed into rows of a
  fixed length (first fit decreasing) with a block-diagonal causal mask. SOS sees only itself,
  so its states are the same in every pass: each row starts with ONE SOS that every segment
  packed after it attends to. About n(n + 1) / 2 tokens per sentence;
* masked (`sci_chart`, the earlier implementation, kept as a reference): every start runs the
  whole padded batch row of length L under a mask hiding words < i, (L - 1) L tokens per
  sentence whatever its length.
The original code's layout (all n(n + 1) / 2 span-masked copies of one sentence in one batch) is
`span_batch_sci_chart`, and `naive_sci_chart` runs one pass per span (the tests' ground truth).
`*_over_seeds` vmaps over a leading seed axis of the parameters.

Projected trees. The split score of span (i, j) at k (i <= k < j) is
s(i, j, k) = chart[i, k] + chart[k + 1, j]; SCI(T) = sum over the internal nodes of T of their
split scores.
* `method='greedy'` (the reference): top-down, split each span at argmax_k s(i, j, k) (first
  maximum on ties).
* `method='cky'`: the exact argmax of SCI(T) over all binary trees (dynamic programming).
Trees are returned as node arrays [N - 1, 3] of (i, k, j) = (start, split, end) in pre-order,
-1 padded: the node covers words i..j, its children i..k and k + 1..j.

tscore of a sentence = SCI(T_proj) minus a normalisation (`normalisation=`):
* 'random_split' (released code, default): minus, at every node of T_proj, the split score of a
  uniformly random split k of the same span (random draws from the given key);
* 'split_mean': minus, at every node, the mean split score over all splits of that span (the
  expectation of 'random_split');
* 'random_tree': minus E_T[SCI(T)] for a random tree T grown top-down by uniform splits (exact, by
  dynamic programming): the ICLR paper's "expectation over random trees";
* 'none': SCI(T_proj) itself.
The reported tscore is the mean over sentences (higher = more tree-structured). The normalisation
changes scores only, never the greedy tree (it subtracts a constant per span).
tparseval = corpus bracketing F1 (with precision and recall) of projected vs gold binarised trees
(`sg_jax.analysis.parseval`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import parseval
from sg_jax.intermediates import apply_with_intermediates
from sg_jax.model import ModelConfig, TransformerLM

Array = jax.Array
PyTree = Any

METHODS = ("greedy", "cky")
NORMALISATIONS = ("random_split", "split_mean", "random_tree", "none")
_EPS = 1e-12


def _check_options(method: str, normalisation: str) -> None:
  if method not in METHODS:
    raise ValueError(f"unknown tree projection method {method!r}; expected one of {METHODS}")
  if normalisation not in NORMALISATIONS:
    raise ValueError(f"unknown tscore normalisation {normalisation!r}; expected one of "
                     f"{NORMALISATIONS}")


# --------------------------------------------------------------------------------------------
# SCI charts
# --------------------------------------------------------------------------------------------


def last_hidden(params: PyTree, tokens_BxL: Array, mask_BxLxL: Array | None, *,
                config: ModelConfig, positions_BxL: Array | None = None) -> Array:
  """Last-layer hidden states [B, L, d] of the dropout-free forward pass with an extra mask.

  `positions_BxL` (int32 [B, L]) gives each token's position for the position table (default
  0..L-1).
  """
  _, internals = apply_with_intermediates(
      TransformerLM(config), params, tokens_BxL, deterministic=True, attention_mask=mask_BxLxL,
      positions_BxL=positions_BxL)
  return internals["hidden"][-1].astype(jnp.float32)


def _span_indicator(num_words: int) -> Array:
  """float32 [N, N, N]: S[i, j, k] = 1 iff i <= k <= j."""
  r = jnp.arange(num_words)
  i, j, k = r[:, None, None], r[None, :, None], r[None, None, :]
  return ((i <= k) & (k <= j)).astype(jnp.float32)


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
    params: ONE seed's TransformerLM parameters.
    tokens_BxL: int32 [B, L] inputs `SOS w_0 .. w_{n-1}` then `<pad>`=0 (declarative words only;
      later tokens would not change anything because of causality, but cost time). N = L - 1.
    num_words_B: int32 [B] number of words n of each sentence (0 for batch-padding rows).

  Returns:
    float32 [B, N, N] chart: cosine similarity (unitless, in [-1, 1]) of the context-free and
    contextual vectors of span (i, j); 0 where the span is invalid (i > j or j >= n).
  """
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


@functools.partial(jax.jit, static_argnames=("config",))
def sci_chart_over_seeds(params_S: PyTree, tokens_BxL: Array, num_words_B: Array, *,
                         config: ModelConfig) -> Array:
  """`sci_chart` vmapped over seeds (jitted): params [S, ...] -> chart [S, B, N, N]."""
  fn = functools.partial(sci_chart, config=config)
  return jax.vmap(fn, in_axes=(0, None, None))(params_S, tokens_BxL, num_words_B)


class StartPasses(NamedTuple):
  """The context-free passes of a batch of sentences packed into rows (`pack_start_passes`).

  A pytree of arrays, so it can be passed to jitted functions. P rows of R tokens; each row is
  SOS then segments `w_i .. w_{n-1}`, one per (sentence, start i), that all attend to the row's
  SOS; B sentences of at most N words.

  Attributes:
    tokens: int32 [P, R] SOS, the segments, then `<pad>`=0.
    positions: int32 [P, R] original position of each token (SOS 0, word k at k + 1; padding 0).
    segments: int32 [P, R] segment id of each word, -1 for SOS and padding; a word attends to the
      words of its own segment (causally) and to the row's SOS.
    gather: int32 [N, B, N] flat index r * R + c of the token of word k in the pass with start i
      of sentence b, at [i, b, k]; 0 where k < i, k >= n or b is a padding row.
    num_words: int32 [B] n per sentence (0 for padding rows).
  """

  tokens: Any
  positions: Any
  segments: Any
  gather: Any
  num_words: Any


def start_pass_words(num_words: int) -> np.ndarray:
  """int [n] words of the pass with start i = 0..n-1 of an n-word sentence: n - i (SOS, shared
  within a packed row, not counted); n(n + 1) / 2 in all."""
  return np.arange(num_words, 0, -1)


def first_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int
                         ) -> tuple[np.ndarray, np.ndarray, int]:
  """Packs items of the given lengths into bins of `capacity` (first fit, longest first).

  Returns:
    (bin [M] and offset [M] of every item, number of bins used); items keep their input order.

  Raises:
    ValueError: an item longer than `capacity`.
  """
  lengths = np.asarray(lengths, np.int64)
  if lengths.size and int(lengths.max()) > capacity:
    raise ValueError(f"a segment of {int(lengths.max())} tokens does not fit in rows of "
                     f"{capacity}")
  bins = np.zeros(lengths.size, np.int64)
  offsets = np.zeros(lengths.size, np.int64)
  space = np.zeros(lengths.size, np.int64)
  used = 0
  for item in np.argsort(-lengths, kind="stable"):
    m = lengths[item]
    fits = np.flatnonzero(space[:used] >= m)
    if fits.size:
      row = int(fits[0])
    else:
      row, used = used, used + 1
      space[row] = capacity
    bins[item], offsets[item] = row, capacity - space[row]
    space[row] -= m
  return bins, offsets, used


def pack_segments(segments: Sequence[tuple[Sequence[int], int]], *, sos_id: int,
                  num_rows: int, row_length: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Packs word segments into rows that each start with ONE SOS (host side, numpy).

  A segment is a run of words at consecutive positions; packed after a row's SOS with
  `first_fit_decreasing`, it can be run with the mask "same segment, or the row's SOS" (plus the
  causal mask): each word then sees exactly what it sees in `SOS + segment` at those positions.

  Args:
    segments: (word ids [m >= 1], position of the first word) per segment.
    sos_id: id of SOS (column 0 of every row, position 0).
    num_rows: P.
    row_length: R (at least the longest segment + 1).

  Returns:
    (tokens int32 [P, R] (`<pad>`=0 after the segments), positions int32 [P, R] (0 for SOS and
    padding), segment ids int32 [P, R] (index into `segments`; -1 for SOS and padding), flat
    index r * R + c of each segment's first word int64 [M]).

  Raises:
    ValueError: an empty segment, a segment longer than `row_length - 1` or more rows needed
      than `num_rows`.
  """
  lens = np.array([len(w) for w, _ in segments], np.int64)
  if np.any(lens == 0):
    raise ValueError(f"empty segment at index {int(np.argmin(lens))}")
  if lens.size and int(lens.max()) + 1 > row_length:
    raise ValueError(f"rows of {row_length} tokens cannot hold SOS and a segment of "
                     f"{int(lens.max())} words")
  bins, offsets, used = first_fit_decreasing(lens, row_length - 1)  # after the row's SOS
  if used > num_rows:
    raise ValueError(f"{len(segments)} segments of {int(lens.sum())} words need {used} rows "
                     f"of {row_length} tokens; only {num_rows} given")
  tokens = np.zeros((num_rows, row_length), np.int32)
  tokens[:, 0] = sos_id
  positions = np.zeros((num_rows, row_length), np.int32)
  seg_ids = np.full((num_rows, row_length), -1, np.int32)
  first = bins * row_length + 1 + offsets
  for index, ((words, position), m) in enumerate(zip(segments, lens)):
    row, col = divmod(int(first[index]), row_length)
    tokens[row, col:col + m] = np.asarray(words, np.int32)
    positions[row, col:col + m] = np.arange(position, position + m)
    seg_ids[row, col:col + m] = index
  return tokens, positions, seg_ids, first


def packed_mask(segments_PxR: Array) -> Array:
  """bool [P, R, R] attention mask of rows from `pack_segments`: a token sees its own segment and
  the row's SOS in column 0 (the model adds the causal mask, so SOS sees itself only, as in every
  unpacked sequence)."""
  seg = jnp.asarray(segments_PxR)
  sos_key_R = jnp.arange(seg.shape[1]) == 0
  return (seg[:, :, None] == seg[:, None, :]) | sos_key_R[None, None, :]


def pack_start_passes(sentences: Sequence[Sequence[int]], *, sos_id: int, num_rows: int,
                      row_length: int, max_words: int | None = None,
                      batch_rows: int | None = None) -> StartPasses:
  """Packs the n context-free passes of each sentence into `num_rows` rows (host side, numpy).

  The pass with start i is the segment `w_i .. w_{n-1}` at positions i + 1 .. n after the row's
  SOS (`pack_segments`).

  Args:
    sentences: word ids of each declarative part, WITHOUT SOS (at least one word each).
    sos_id: id of SOS.
    num_rows: P, rows of the packed batch.
    row_length: R, tokens per row: SOS, then segments (at least the longest sentence + 1).
    max_words: N, words of the chart axes (default: the longest sentence).
    batch_rows: B, sentence rows (default: len(sentences)); rows past the sentences are padding.

  Returns:
    a `StartPasses` of numpy arrays (`packed_sci_chart` takes it).

  Raises:
    ValueError: an empty sentence, a sentence longer than `max_words` or than `row_length - 1`
      words, more sentences than `batch_rows`, or passes that need more than `num_rows` rows.
  """
  lens = np.array([len(s) for s in sentences], np.int64)
  if np.any(lens == 0):
    raise ValueError(f"empty sentence at index {int(np.argmin(lens))}")
  n_max = int(lens.max(initial=0)) if max_words is None else int(max_words)
  batch = len(sentences) if batch_rows is None else int(batch_rows)
  if lens.size and int(lens.max()) > n_max:
    raise ValueError(f"a sentence of {int(lens.max())} words exceeds max_words={n_max}")
  if len(sentences) > batch:
    raise ValueError(f"{len(sentences)} sentences exceed batch_rows={batch}")
  segments = [(list(words)[i:], i + 1) for words in sentences for i in range(len(words))]
  tokens, positions, seg_ids, first = pack_segments(segments, sos_id=sos_id, num_rows=num_rows,
                                                    row_length=row_length)
  gather = np.zeros((n_max, batch, n_max), np.int32)
  seg = 0
  for b, n in enumerate(lens):
    for i in range(n):
      gather[i, b, i:n] = first[seg] + np.arange(n - i)
      seg += 1
  num_words = np.zeros(batch, np.int32)
  num_words[:len(sentences)] = lens
  return StartPasses(tokens, positions, seg_ids, gather, num_words)


def packed_sci_chart(params: PyTree, passes: StartPasses, *, config: ModelConfig) -> Array:
  """Batched SCI chart of ONE seed from the packed, shortened start passes (module docstring).

  Same charts as `sci_chart` and `naive_sci_chart` (up to float rounding, ~1e-6). Pure and
  jit-able (`config` static); runs P * R tokens in one forward batch.

  Args:
    params: ONE seed's TransformerLM parameters.
    passes: from `pack_start_passes` (P rows of R tokens, B sentences of at most N words).

  Returns:
    float32 [B, N, N] chart: cosine similarity (unitless, in [-1, 1]) of the context-free and
    contextual vectors of span (i, j); 0 where the span is invalid (i > j or j >= n).
  """
  h_PxRxD = last_hidden(params, jnp.asarray(passes.tokens), packed_mask(passes.segments),
                        config=config, positions_BxL=jnp.asarray(passes.positions))
  h_flat = h_PxRxD.reshape(-1, h_PxRxD.shape[-1])
  return _chart_from_start_states(h_flat[jnp.asarray(passes.gather)],
                                  jnp.asarray(passes.num_words))


@functools.partial(jax.jit, static_argnames=("config",))
def packed_sci_chart_over_seeds(params_S: PyTree, passes: StartPasses, *,
                                config: ModelConfig) -> Array:
  """`packed_sci_chart` vmapped over seeds (jitted): params [S, ...] -> chart [S, B, N, N]."""
  fn = functools.partial(packed_sci_chart, config=config)
  return jax.vmap(fn, in_axes=(0, None))(params_S, passes)


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


# --------------------------------------------------------------------------------------------
# Projected trees (per sentence; vmap over sentences and seeds)
# --------------------------------------------------------------------------------------------


def split_scores(chart_NxN: Array) -> tuple[Array, Array]:
  """Split scores s[i, j, k] = chart[i, k] + chart[k + 1, j] and validity (i <= k < j).

  Returns:
    (float32 [N, N, N] scores, bool [N, N, N] valid).
  """
  n_max = chart_NxN.shape[0]
  below = jnp.concatenate([chart_NxN[1:], jnp.zeros((1, n_max), chart_NxN.dtype)], axis=0)
  scores = chart_NxN[:, None, :] + below.T[None, :, :]
  r = jnp.arange(n_max)
  i, j, k = r[:, None, None], r[None, :, None], r[None, None, :]
  return scores, (i <= k) & (k < j)


def _traverse(split_NxN: Array, num_words: Array) -> Array:
  """Pre-order node list [N - 1, 3] (i, k, j) of the tree with split table `split_NxN`, -1 pad."""
  n_max = split_NxN.shape[0]
  n_nodes = max(n_max - 1, 0)
  stack = jnp.zeros((n_max + 1, 2), jnp.int32).at[0].set(jnp.stack([0, num_words - 1]))
  sp = (num_words >= 2).astype(jnp.int32)
  nodes = jnp.full((n_nodes, 3), -1, jnp.int32)

  def body(t, carry):
    stack, sp, nodes = carry
    active = sp > 0
    top = stack[jnp.maximum(sp - 1, 0)]
    i, j = top[0], top[1]
    k = split_NxN[i, j].astype(jnp.int32)
    nodes = nodes.at[t].set(jnp.where(active, jnp.stack([i, k, j]), -1))
    sp = sp - active.astype(jnp.int32)
    push_r = active & (j > k + 1)
    stack = stack.at[sp].set(jnp.where(push_r, jnp.stack([k + 1, j]), stack[sp]))
    sp = sp + push_r.astype(jnp.int32)
    push_l = active & (k > i)
    stack = stack.at[sp].set(jnp.where(push_l, jnp.stack([i, k]), stack[sp]))
    sp = sp + push_l.astype(jnp.int32)
    return stack, sp, nodes

  _, _, nodes = jax.lax.fori_loop(0, n_nodes, body, (stack, sp, nodes))
  return nodes


def greedy_splits(chart_NxN: Array) -> Array:
  """int32 [N, N]: the greedy (top-down) best split k of every span (i, j), first max on ties."""
  scores, valid = split_scores(chart_NxN)
  return jnp.argmax(jnp.where(valid, scores, -jnp.inf), axis=-1).astype(jnp.int32)


def cky_splits(chart_NxN: Array) -> tuple[Array, Array]:
  """Exact argmax of SCI(T) over binary trees by dynamic programming (CKY).

  Returns:
    (int32 [N, N] best split of each span, float32 [N, N] best SCI of the subtree over (i, j)).
  """
  n_max = chart_NxN.shape[0]
  scores, valid = split_scores(chart_NxN)
  r = jnp.arange(n_max)
  internal = r[:, None] < r[None, :]

  def totals(inside):
    below = jnp.concatenate([inside[1:], jnp.zeros((1, n_max), inside.dtype)], axis=0)
    return jnp.where(valid, scores + inside[:, None, :] + below.T[None, :, :], -jnp.inf)

  def body(_, inside):
    return jnp.where(internal, jnp.max(totals(inside), axis=-1), 0.0)

  # after t iterations every span of <= t + 1 words holds its exact optimum.
  inside = jax.lax.fori_loop(0, max(n_max - 1, 0), body, jnp.zeros_like(chart_NxN))
  return jnp.argmax(totals(inside), axis=-1).astype(jnp.int32), inside


def project_tree(chart_NxN: Array, num_words: Array, *, method: str = "greedy") -> Array:
  """Projected binary tree of one sentence as nodes [N - 1, 3] = (i, k, j), pre-order, -1 padded.

  Args:
    chart_NxN: SCI chart of the sentence (padded to N words).
    num_words: scalar int, n (the tree covers words 0..n-1; n <= 1 gives no nodes).
    method: 'greedy' (top-down, the reference) or 'cky' (exact argmax of SCI(T)).

  Raises:
    ValueError: for an unknown method.
  """
  _check_options(method, "none")
  split = greedy_splits(chart_NxN) if method == "greedy" else cky_splits(chart_NxN)[0]
  return _traverse(split, jnp.asarray(num_words, jnp.int32))


def random_tree_expectation(chart_NxN: Array) -> Array:
  """float32 [N, N]: E[SCI(T)] over random trees of span (i, j) grown by uniform random splits."""
  n_max = chart_NxN.shape[0]
  scores, valid = split_scores(chart_NxN)
  r = jnp.arange(n_max)
  width = jnp.maximum(r[None, :] - r[:, None], 1).astype(jnp.float32)
  internal = r[:, None] < r[None, :]

  def body(_, e):
    below = jnp.concatenate([e[1:], jnp.zeros((1, n_max), e.dtype)], axis=0)
    tot = jnp.where(valid, scores + e[:, None, :] + below.T[None, :, :], 0.0)
    return jnp.where(internal, jnp.sum(tot, axis=-1) / width, 0.0)

  return jax.lax.fori_loop(0, max(n_max - 1, 0), body, jnp.zeros_like(chart_NxN))


def tree_score(chart_NxN: Array, num_words: Array, nodes_Mx3: Array, *,
               normalisation: str = "random_split", uniform_NxN: Array | None = None) -> Array:
  """tscore contribution of ONE sentence: SCI(T) of the given tree minus its normalisation.

  Args:
    chart_NxN: SCI chart.
    num_words: scalar int n.
    nodes_Mx3: the tree (e.g. from `project_tree`).
    normalisation: one of NORMALISATIONS (module docstring).
    uniform_NxN: uniform [0, 1) draws, one per span, choosing each node's random split
      k = i + floor(u * (j - i)); required for 'random_split'.

  Returns:
    float32 scalar (unitless; 0 for n <= 1).

  Raises:
    ValueError: unknown normalisation, or 'random_split' without `uniform_NxN`.
  """
  _check_options("greedy", normalisation)
  scores, valid = split_scores(chart_NxN)
  i, k, j = nodes_Mx3[:, 0], nodes_Mx3[:, 1], nodes_Mx3[:, 2]
  ok = i >= 0
  i0, k0, j0 = (jnp.where(ok, x, 0) for x in (i, k, j))
  sci = jnp.sum(jnp.where(ok, scores[i0, j0, k0], 0.0))
  if normalisation == "none":
    return sci
  if normalisation == "random_split":
    if uniform_NxN is None:
      raise ValueError("normalisation='random_split' needs uniform_NxN (random draws)")
    kr = i0 + jnp.floor(uniform_NxN[i0, j0] * (j0 - i0)).astype(jnp.int32)
    kr = jnp.clip(kr, i0, jnp.maximum(j0 - 1, i0))
    return sci - jnp.sum(jnp.where(ok, scores[i0, j0, kr], 0.0))
  if normalisation == "split_mean":
    mean = jnp.sum(jnp.where(valid, scores, 0.0), -1) / jnp.maximum(
        jnp.sum(valid, -1), 1).astype(jnp.float32)
    return sci - jnp.sum(jnp.where(ok, mean[i0, j0], 0.0))
  expect = random_tree_expectation(chart_NxN)
  n = jnp.asarray(num_words, jnp.int32)
  return sci - jnp.where(n >= 2, expect[0, jnp.maximum(n - 1, 0)], 0.0)


# --------------------------------------------------------------------------------------------
# Batch statistics (one seed) and the seed-vmapped version
# --------------------------------------------------------------------------------------------


def span_uniforms(key: Array, row_ids_B: Array, max_words: int) -> Array:
  """float32 [B, N, N] uniform [0, 1) draws for span (i, j) of sentence `row_ids_B[b]`.

  Each draw depends only on (key, sentence id, i, j), not on the batch it is computed in or on
  the padding, so random-split tscores do not depend on how sentences are batched.
  """
  r = jnp.arange(max_words)

  def one(row):
    k = jax.random.fold_in(key, row)
    draw = lambda i, j: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(k, i), j))
    return jax.vmap(lambda i: jax.vmap(lambda j: draw(i, j))(r))(r)

  return jax.vmap(one)(jnp.maximum(row_ids_B, 0).astype(jnp.uint32))


def chart_stats(chart_BxNxN: Array, num_words_B: Array, gold_spans_BxNxN: Array | None,
                key: Array, row_ids_B: Array | None = None, *, method: str = "greedy",
                normalisation: str = "random_split", details: bool = False) -> dict[str, Array]:
  """Tree-projection sums of a batch of SCI charts (pure, jit-able; options static).

  Args:
    chart_BxNxN: float32 [B, N, N] charts (`sci_chart`, `packed_sci_chart`).
    num_words_B: int32 [B] n per sentence; 0 marks batch-padding rows (ignored everywhere).
    gold_spans_BxNxN: bool [B, N, N] gold brackets (`parseval.gold_span_matrices`) or None.
    key: PRNG key for the random splits of 'random_split' (same draws for every seed when vmapped).
    row_ids_B: int [B] sentence ids that, with `key`, determine each sentence's random draws
      (`span_uniforms`); default 0..B-1.
    method / normalisation: see module docstring.
    details: also return 'chart' [B, N, N], 'nodes' [B, N - 1, 3] and per-sentence 'tscore' [B].

  Returns:
    dict of sums over the batch: 'tscore_sum', 'num_sentences' and, with gold spans,
    'bracket_matched', 'bracket_predicted', 'bracket_gold' (float32 scalars); see `finalize_stats`.

  Raises:
    ValueError: unknown method or normalisation.
  """
  _check_options(method, normalisation)
  chart = chart_BxNxN
  n_max = chart.shape[-1]
  nodes = jax.vmap(functools.partial(project_tree, method=method))(chart, num_words_B)
  if row_ids_B is None:
    row_ids_B = jnp.arange(chart.shape[0])
  uniform = span_uniforms(key, row_ids_B, n_max)
  score_B = jax.vmap(functools.partial(tree_score, normalisation=normalisation))(
      chart, num_words_B, nodes, uniform_NxN=uniform)
  real_B = num_words_B > 0
  out = {"tscore_sum": jnp.sum(jnp.where(real_B, score_B, 0.0)),
         "num_sentences": jnp.sum(real_B).astype(jnp.float32)}
  if gold_spans_BxNxN is not None:
    pred = jax.vmap(lambda nd: parseval.node_span_matrix(nd, n_max))(nodes)
    out.update(parseval.bracket_counts(pred, gold_spans_BxNxN & real_B[:, None, None]))
  if details:
    out.update(chart=chart, nodes=nodes, tscore=score_B)
  return out


def tree_projection_stats(params: PyTree, tokens_BxL: Array, num_words_B: Array,
                          gold_spans_BxNxN: Array | None, key: Array,
                          row_ids_B: Array | None = None, *, config: ModelConfig,
                          method: str = "greedy", normalisation: str = "random_split",
                          details: bool = False) -> dict[str, Array]:
  """Tree-projection sums of one padded batch for ONE seed, masked layout (`sci_chart`).

  Args:
    params: ONE seed's parameters.
    tokens_BxL: int32 [B, L] `SOS w_0 .. w_{n-1}` + padding (declarative words).
    num_words_B, gold_spans_BxNxN, key, row_ids_B, method, normalisation, details: see
      `chart_stats` (N = L - 1).

  Returns:
    `chart_stats`'s dict.
  """
  _check_options(method, normalisation)
  chart = sci_chart(params, tokens_BxL, num_words_B, config=config)
  return chart_stats(chart, num_words_B, gold_spans_BxNxN, key, row_ids_B, method=method,
                     normalisation=normalisation, details=details)


def packed_tree_projection_stats(params: PyTree, passes: StartPasses,
                                 gold_spans_BxNxN: Array | None, key: Array,
                                 row_ids_B: Array | None = None, *, config: ModelConfig,
                                 method: str = "greedy", normalisation: str = "random_split",
                                 details: bool = False) -> dict[str, Array]:
  """Tree-projection sums of one packed batch for ONE seed (`packed_sci_chart`).

  Args:
    params: ONE seed's parameters.
    passes: from `pack_start_passes` (B sentences of at most N words; `passes.num_words`).
    gold_spans_BxNxN, key, row_ids_B, method, normalisation, details: see `chart_stats`.

  Returns:
    `chart_stats`'s dict.
  """
  _check_options(method, normalisation)
  chart = packed_sci_chart(params, passes, config=config)
  return chart_stats(chart, jnp.asarray(passes.num_words), gold_spans_BxNxN, key, row_ids_B,
                     method=method, normalisation=normalisation, details=details)


_STATIC = ("config", "method", "normalisation", "details")


@functools.partial(jax.jit, static_argnames=_STATIC)
def tree_projection_stats_over_seeds(params_S: PyTree, tokens_BxL: Array, num_words_B: Array,
                                     gold_spans_BxNxN: Array | None, key: Array,
                                     row_ids_B: Array | None = None, *,
                                     config: ModelConfig, method: str = "greedy",
                                     normalisation: str = "random_split",
                                     details: bool = False) -> dict[str, Array]:
  """`tree_projection_stats` vmapped over seeds (jitted): every output gains a leading [S] axis."""
  fn = functools.partial(tree_projection_stats, config=config, method=method,
                         normalisation=normalisation, details=details)
  return jax.vmap(fn, in_axes=(0, None, None, None, None, None))(
      params_S, tokens_BxL, num_words_B, gold_spans_BxNxN, key, row_ids_B)


@functools.partial(jax.jit, static_argnames=_STATIC)
def packed_tree_projection_stats_over_seeds(params_S: PyTree, passes: StartPasses,
                                            gold_spans_BxNxN: Array | None, key: Array,
                                            row_ids_B: Array | None = None, *,
                                            config: ModelConfig, method: str = "greedy",
                                            normalisation: str = "random_split",
                                            details: bool = False) -> dict[str, Array]:
  """`packed_tree_projection_stats` vmapped over seeds (jitted): outputs gain a leading [S]."""
  fn = functools.partial(packed_tree_projection_stats, config=config, method=method,
                         normalisation=normalisation, details=details)
  return jax.vmap(fn, in_axes=(0, None, None, None, None))(
      params_S, passes, gold_spans_BxNxN, key, row_ids_B)


def finalize_stats(stats: dict[str, Array]) -> dict[str, Array]:
  """Summed stats (optionally with a seed axis) -> 'tscore' and, if present, 'tparseval_f1',
  'tparseval_precision', 'tparseval_recall' (corpus level)."""
  out = {"tscore": stats["tscore_sum"] / jnp.maximum(stats["num_sentences"], 1.0)}
  if "bracket_matched" in stats:
    p, r, f1 = parseval.precision_recall_f1(
        stats["bracket_matched"], stats["bracket_predicted"], stats["bracket_gold"])
    out.update(tparseval_f1=f1, tparseval_precision=p, tparseval_recall=r)
  return out


def nodes_to_tree(nodes_Mx3: np.ndarray, words: Sequence[str]) -> Any:
  """Nested-tuple tree (leaves = words) from a node array of `project_tree` (host side).

  Raises:
    ValueError: if the nodes do not form a binary tree over `words`.
  """
  n = len(words)
  split = {}
  for i, k, j in np.asarray(nodes_Mx3).tolist():
    if i >= 0:
      split[(i, j)] = k

  def build(i, j):
    if i == j:
      return words[i]
    if (i, j) not in split:
      raise ValueError(f"span ({i}, {j}) has no node")
    k = split[(i, j)]
    return (build(i, k), build(k + 1, j))

  if n == 0:
    raise ValueError("empty sentence")
  return build(0, n - 1)
