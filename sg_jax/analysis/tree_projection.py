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
words i..k only). So ONE forward pass per start position i, with attention limited to SOS and
positions >= i + 1, gives the context-free states of every span starting at i, and span sums are
taken from it: n passes per sentence instead of the reference's n(n + 1) / 2, with identical
results (`sci_chart`; the naive reference-style computation is `naive_sci_chart`). The pass with
start 0 is the ordinary causal pass, i.e. it also gives the contextual vectors. All starts of a
padded batch of sentences are run as one batch of forward passes, and `*_over_seeds` vmaps over
a leading seed axis of the parameters.

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
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import parseval
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
                config: ModelConfig) -> Array:
  """Last-layer hidden states [B, L, d] of the dropout-free forward pass with an extra mask."""
  _, internals = TransformerLM(config).apply(
      {"params": params}, tokens_BxL, deterministic=True, attention_mask=mask_BxLxL,
      return_internals=True)
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


def sci_chart(params: PyTree, tokens_BxL: Array, num_words_B: Array, *,
              config: ModelConfig) -> Array:
  """Batched SCI chart of ONE seed with one forward pass per start position (see module doc).

  Pure and jit-able (`config` static). Runs B * N sequences of length L in one forward batch, so
  choose B with memory in mind (the drivers below chunk sentences).

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
  span = _span_indicator(n_max)
  # context-free vector of (i, j) uses the pass with start i; contextual uses start 0.
  free_BxNxNxD = jnp.einsum("ijk,ibkd->bijd", span, h_NxBxNxD)
  ctx_BxNxNxD = jnp.einsum("ijk,bkd->bijd", span, h_NxBxNxD[0])
  chart = _cosine(free_BxNxNxD, ctx_BxNxNxD)
  return jnp.where(valid_spans(num_words_B, n_max), chart, 0.0)


@functools.partial(jax.jit, static_argnames=("config",))
def sci_chart_over_seeds(params_S: PyTree, tokens_BxL: Array, num_words_B: Array, *,
                         config: ModelConfig) -> Array:
  """`sci_chart` vmapped over seeds (jitted): params [S, ...] -> chart [S, B, N, N]."""
  fn = functools.partial(sci_chart, config=config)
  return jax.vmap(fn, in_axes=(0, None, None))(params_S, tokens_BxL, num_words_B)


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


def tree_projection_stats(params: PyTree, tokens_BxL: Array, num_words_B: Array,
                          gold_spans_BxNxN: Array | None, key: Array,
                          row_ids_B: Array | None = None, *, config: ModelConfig,
                          method: str = "greedy", normalisation: str = "random_split",
                          details: bool = False) -> dict[str, Array]:
  """Tree-projection sums of one padded batch for ONE seed (pure, jit-able; options static).

  Args:
    params: ONE seed's parameters.
    tokens_BxL: int32 [B, L] `SOS w_0 .. w_{n-1}` + padding (declarative words).
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
  """
  _check_options(method, normalisation)
  chart = sci_chart(params, tokens_BxL, num_words_B, config=config)
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


@functools.partial(jax.jit, static_argnames=("config", "method", "normalisation", "details"))
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
