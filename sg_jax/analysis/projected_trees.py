"""Projected trees of SCI charts and their tscore (Murty et al., ICLR 2023, §3-4).

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
Per sentence and pure (jit- and vmap-able); the charts come from `sci_chart`.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


METHODS = ("greedy", "cky")
NORMALISATIONS = ("random_split", "split_mean", "random_tree", "none")


def _check_options(method: str, normalisation: str) -> None:
  if method not in METHODS:
    raise ValueError(f"unknown tree projection method {method!r}; expected one of {METHODS}")
  if normalisation not in NORMALISATIONS:
    raise ValueError(f"unknown tscore normalisation {normalisation!r}; expected one of "
                     f"{NORMALISATIONS}")


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
