"""Bracketing precision / recall / F1 between binary trees ("tparseval"; Murty et al., ICLR 2023
"Characterizing intrinsic compositionality in transformers with tree projections", §4; used as a
tree-structuredness measure in Murty et al., ACL 2023, §5).

Brackets are the spans of every INTERNAL node, the root included; single words are never
brackets. Spans are inclusive word-index pairs (i, j), i < j, over the declarative words of a line.
Scores are corpus-level: matched, predicted and gold bracket counts are summed over sentences
before precision = matched / predicted, recall = matched / gold, F1 = 2PR / (P + R). Within one
sentence the brackets form a set (a unary chain in a gold tree adds its span once).

Trees are nested tuples whose leaves are words (str), as the data module's
`declarative_tree(example)` returns them; projected trees come as node arrays
(see `sg_jax.analysis.tree_projection`) and are compared through [N, N] boolean span matrices,
which keeps the device-side computation vectorised over sentences and seeds.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Tree = Any  # str (a word) or tuple of Trees


def tree_leaves(tree: Tree) -> list[str]:
  """Words of a nested-tuple tree, left to right.

  Raises:
    TypeError: if a node is neither str nor tuple/list.
  """
  if isinstance(tree, str):
    return [tree]
  if not isinstance(tree, (tuple, list)):
    raise TypeError(f"tree nodes must be str or tuple, got {type(tree).__name__}: {tree!r}")
  out: list[str] = []
  for child in tree:
    out.extend(tree_leaves(child))
  return out


def tree_spans(tree: Tree) -> set[tuple[int, int]]:
  """Brackets of a tree: inclusive (i, j) word spans of every internal node covering >= 2 words.

  The root is included; single-word constituents are not brackets.
  """
  spans: set[tuple[int, int]] = set()

  def walk(node: Tree, start: int) -> int:
    if isinstance(node, str):
      return start + 1
    end = start
    for child in node:
      end = walk(child, end)
    if end - start >= 2:
      spans.add((start, end - 1))
    return end

  tree_leaves(tree)  # type check
  walk(tree, 0)
  return spans


def span_matrix(spans: Iterable[tuple[int, int]], max_words: int) -> np.ndarray:
  """bool [max_words, max_words] with True at every (i, j) in `spans`.

  Raises:
    ValueError: if a span lies outside [0, max_words).
  """
  out = np.zeros((max_words, max_words), dtype=bool)
  for i, j in spans:
    if not 0 <= i <= j < max_words:
      raise ValueError(f"span ({i}, {j}) outside a {max_words}-word matrix")
    out[i, j] = True
  return out


def gold_span_matrices(trees: Sequence[Tree], max_words: int,
                       sentences: Sequence[Sequence[str]] | None = None) -> np.ndarray:
  """bool [batch, max_words, max_words] bracket matrices of gold trees (host side, numpy).

  Args:
    trees: one nested-tuple tree per sentence (or None for no gold tree: an all-False row, which
      then also contributes no gold brackets).
    max_words: N, the padded number of words.
    sentences: optional words of each sentence; when given, each tree's leaves must equal them.

  Raises:
    ValueError: if a tree's leaves differ from its sentence, or it has more than `max_words` words.
  """
  out = np.zeros((len(trees), max_words, max_words), dtype=bool)
  for b, tree in enumerate(trees):
    if tree is None:
      continue
    leaves = tree_leaves(tree)
    if sentences is not None and tuple(leaves) != tuple(sentences[b]):
      raise ValueError(f"gold tree leaves {leaves} differ from sentence {list(sentences[b])}")
    if len(leaves) > max_words:
      raise ValueError(f"gold tree has {len(leaves)} words, more than max_words={max_words}")
    out[b] = span_matrix(tree_spans(tree), max_words)
  return out


def node_span_matrix(nodes_Mx3: Array, max_words: int) -> Array:
  """bool [N, N] bracket matrix of a projected tree given as nodes [M, 3] = (i, k, j), -1 padded."""
  i, j = nodes_Mx3[:, 0], nodes_Mx3[:, 2]
  ok = i >= 0
  out = jnp.zeros((max_words, max_words), dtype=jnp.int32)
  out = out.at[jnp.where(ok, i, 0), jnp.where(ok, j, 0)].add(ok.astype(jnp.int32))
  return out > 0


def bracket_counts(pred_BxNxN: Array, gold_BxNxN: Array) -> dict[str, Array]:
  """Corpus bracket counts of a batch: 'matched', 'predicted', 'gold' (float32 scalars)."""
  pred, gold = pred_BxNxN.astype(bool), gold_BxNxN.astype(bool)
  return {
      "bracket_matched": jnp.sum(pred & gold).astype(jnp.float32),
      "bracket_predicted": jnp.sum(pred).astype(jnp.float32),
      "bracket_gold": jnp.sum(gold).astype(jnp.float32),
  }


# Sentence lengths (words) of the per-length bracket counts; longer sentences count in the last.
LENGTH_BINS = 64


def bracket_counts_by_length(pred_BxNxN: Array, gold_BxNxN: Array, num_words_B: Array
                             ) -> dict[str, Array]:
  """Bracket counts per sentence length: 'bracket_{matched,predicted,gold}_by_length', float32
  [LENGTH_BINS] (index n = sentences of n words; n >= LENGTH_BINS - 1 share the last bin; rows
  with num_words 0 count nowhere)."""
  pred, gold = pred_BxNxN.astype(bool), gold_BxNxN.astype(bool)
  real = (num_words_B > 0).astype(jnp.float32)
  length = jnp.clip(num_words_B, 0, LENGTH_BINS - 1)
  per_row = {"matched": jnp.sum(pred & gold, axis=(1, 2)), "predicted": jnp.sum(pred, axis=(1, 2)),
             "gold": jnp.sum(gold, axis=(1, 2))}
  return {f"bracket_{k}_by_length": jax.ops.segment_sum(v.astype(jnp.float32) * real, length,
                                                         num_segments=LENGTH_BINS)
          for k, v in per_row.items()}


def precision_recall_f1(matched, predicted, gold):
  """(precision, recall, F1) from corpus counts (arrays broadcast, e.g. over seeds).

  An empty denominator gives 0 for that quantity (and F1 = 0 when P + R = 0).
  """
  matched, predicted, gold = (jnp.asarray(x, jnp.float32) for x in (matched, predicted, gold))
  p = jnp.where(predicted > 0, matched / jnp.maximum(predicted, 1.0), 0.0)
  r = jnp.where(gold > 0, matched / jnp.maximum(gold, 1.0), 0.0)
  f1 = jnp.where(p + r > 0, 2 * p * r / jnp.maximum(p + r, 1e-12), 0.0)
  return p, r, f1


def right_branching_tree(words: Sequence[str]) -> Tree:
  """The right-branching binary tree (w0 (w1 (w2 ...))) over `words` (>= 1 word).

  The classic parsing baseline (Klein & Manning 2002): English is largely right-branching, so it
  scores well against gold constituency trees.

  Raises:
    ValueError: no words.
  """
  if not words:
    raise ValueError("a tree needs at least one word")
  tree: Tree = words[-1]
  for w in reversed(words[:-1]):
    tree = (w, tree)
  return tree


def left_branching_tree(words: Sequence[str]) -> Tree:
  """The left-branching binary tree (((w0 w1) w2) ...) over `words` (>= 1 word).

  Raises:
    ValueError: no words.
  """
  if not words:
    raise ValueError("a tree needs at least one word")
  tree: Tree = words[0]
  for w in words[1:]:
    tree = (tree, w)
  return tree


def random_binary_tree(words: Sequence[str], rng: np.random.Generator) -> Tree:
  """A random binary tree over `words`: each span splits at a uniformly drawn point, recursively
  (top down), the random baseline of unsupervised parsing (e.g. Kim et al. 2019, Table 1).

  Raises:
    ValueError: no words.
  """
  if not words:
    raise ValueError("a tree needs at least one word")
  if len(words) == 1:
    return words[0]
  k = int(rng.integers(1, len(words)))
  return (random_binary_tree(words[:k], rng), random_binary_tree(words[k:], rng))


@functools.lru_cache(maxsize=None)
def _span_probabilities(n: int) -> np.ndarray:
  if n <= 1:
    return np.zeros((max(n, 1), max(n, 1)))
  out = np.zeros((n, n))
  for k in range(1, n):  # root split: words 0..k-1 | k..n-1, each with probability 1/(n-1)
    out[:k, :k] += _span_probabilities(k)
    out[k:, k:] += _span_probabilities(n - k)
  out /= n - 1
  out[0, n - 1] = 1.0
  return out


def random_tree_span_probabilities(n: int) -> np.ndarray:
  """float64 [n, n]: P[i, j] = the probability that (i, j) is a bracket of a random binary tree
  over n words grown as `random_binary_tree` does (top down, each span split at a uniform point).

  Exact, by the recursion over the root's split; 0 on and below the diagonal (single words are
  no brackets). Each row of trees has n - 1 brackets, so P sums to n - 1.

  Raises:
    ValueError: n < 1.
  """
  if n < 1:
    raise ValueError(f"a tree needs at least one word, got n={n}")
  return _span_probabilities(int(n)).copy()


# The parse baselines printed beside tparseval: name -> tree of a word list (random: the exact
# expectation over random trees, `expected_random_parseval`).
BASELINES = ("right_branching", "left_branching", "random")


def expected_random_parseval(gold_trees: Sequence[Tree]) -> dict[str, float]:
  """The expected corpus parseval of random binary trees (`random_binary_tree`, one independent
  tree per sentence) against gold, exactly.

  A binary tree over n words has n - 1 brackets whatever its shape, so the predicted and gold
  counts are fixed and precision, recall and F1 are linear in the matched count: their
  expectations are the scores of E[matched] = sum over the gold brackets (i, j) of a sentence
  of n words of `random_tree_span_probabilities(n)[i, j]` (the random baseline of unsupervised
  parsing, e.g. Kim et al. 2019, Table 1, there estimated by sampling).

  Returns:
    {'precision', 'recall', 'f1', 'matched' (expected), 'predicted', 'gold'}.
  """
  matched = predicted = gold = 0.0
  for tree in gold_trees:
    n = len(tree_leaves(tree))
    spans = tree_spans(tree)
    prob = random_tree_span_probabilities(n)
    matched += sum(prob[i, j] for i, j in spans)
    predicted += max(n - 1, 0)
    gold += len(spans)
  prec, rec, f1 = (float(x) for x in precision_recall_f1(matched, predicted, gold))
  return {"precision": prec, "recall": rec, "f1": f1, "matched": matched,
          "predicted": predicted, "gold": gold}


def baseline_parseval(gold_trees: Sequence[Tree]) -> dict[str, float]:
  """Corpus bracketing F1 of the right-branching, left-branching and random trees against gold.

  What a tparseval value should be compared with: a model whose projected trees are right-
  branching scores the right-branching F1 without having learnt any constituency. The random
  trees' F1 is the exact expectation over random binary trees (`expected_random_parseval`).

  Args:
    gold_trees: nested-tuple gold trees (one per sentence).

  Returns:
    {'right_branching', 'left_branching', 'random'}: F1 (fraction).
  """
  words = [tree_leaves(t) for t in gold_trees]
  made = {"right_branching": [right_branching_tree(w) for w in words],
          "left_branching": [left_branching_tree(w) for w in words]}
  out = {name: corpus_parseval(trees, gold_trees)["f1"] for name, trees in made.items()}
  out["random"] = expected_random_parseval(gold_trees)["f1"]
  return out


def corpus_parseval(pred_trees: Sequence[Tree], gold_trees: Sequence[Tree]) -> dict[str, float]:
  """Pure-Python corpus parseval between two lists of nested-tuple trees (for inspection/tests).

  Returns:
    {'precision', 'recall', 'f1', 'matched', 'predicted', 'gold'}.

  Raises:
    ValueError: if the lists differ in length or a pair of trees has different leaves.
  """
  if len(pred_trees) != len(gold_trees):
    raise ValueError(f"{len(pred_trees)} predicted trees but {len(gold_trees)} gold trees")
  matched = predicted = gold = 0
  for p, g in zip(pred_trees, gold_trees):
    if tree_leaves(p) != tree_leaves(g):
      raise ValueError(f"trees over different words: {tree_leaves(p)} vs {tree_leaves(g)}")
    ps, gs = tree_spans(p), tree_spans(g)
    matched += len(ps & gs)
    predicted += len(ps)
    gold += len(gs)
  prec, rec, f1 = (float(x) for x in precision_recall_f1(matched, predicted, gold))
  return {"precision": prec, "recall": rec, "f1": f1, "matched": matched, "predicted": predicted,
          "gold": gold}
