"""Parse baselines beside tparseval (right-, left-branching and random trees) and tparseval per
sentence length (sg_jax/analysis/parseval.py, tree_projection.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax.analysis import parseval, tree_projection
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import init_params

GOLD = [
    # (the dog) (saw (a cat)): brackets (0,1) (3,4) (2,4) (0,4)
    (("the", "dog"), ("saw", ("a", "cat"))),
    # ((the (big dog)) slept): brackets (1,2) (0,2) (0,3)
    (("the", ("big", "dog")), "slept"),
]


def test_branching_trees():
  assert parseval.right_branching_tree(["a", "b", "c"]) == ("a", ("b", "c"))
  assert parseval.left_branching_tree(["a", "b", "c"]) == (("a", "b"), "c")
  assert parseval.right_branching_tree(["a"]) == "a"
  tree = parseval.random_binary_tree(list("abcdefg"), np.random.default_rng(3))
  assert parseval.tree_leaves(tree) == list("abcdefg")
  assert len(parseval.tree_spans(tree)) == 6  # a binary tree over 7 words has 6 brackets
  with pytest.raises(ValueError, match="at least one word"):
    parseval.left_branching_tree([])


def test_baseline_f1_on_hand_built_trees():
  # Right-branching: sentence 1 {(0,4),(1,4),(2,4),(3,4)} matches (0,4),(2,4),(3,4);
  # sentence 2 {(0,3),(1,3),(2,3)} matches (0,3). 4 of 7 predicted, 4 of 7 gold: F1 = 4/7.
  # Left-branching: {(0,1),(0,2),(0,3),(0,4)} matches (0,1),(0,4); {(0,1),(0,2),(0,3)} matches
  # (0,2),(0,3): F1 = 4/7 as well.
  got = parseval.baseline_parseval(GOLD)
  assert got["right_branching"] == pytest.approx(4 / 7)
  assert got["left_branching"] == pytest.approx(4 / 7)
  # The random baseline is the exact expectation over random trees (brute force below).
  assert got["random"] == pytest.approx(parseval.expected_random_parseval(GOLD)["f1"])
  # A right-branching gold corpus: right-branching F1 = 1.
  rb = [parseval.right_branching_tree(list("abcde"))]
  assert parseval.baseline_parseval(rb)["right_branching"] == 1.0


def test_tparseval_by_length_equals_corpus_parseval_per_length():
  cfg = ModelConfig(vocab_size=20, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=32,
                    dropout=0.0)
  params = jax.tree_util.tree_map(lambda *x: jnp.stack(x), init_params(cfg, jax.random.PRNGKey(0)),
                                  init_params(cfg, jax.random.PRNGKey(1)))
  rng = np.random.default_rng(0)
  lengths = (4, 6, 4, 3, 6, 6, 2)
  sentences = [list(rng.integers(1, 18, size=n)) for n in lengths]
  gold = [parseval.random_binary_tree([str(w) for w in s], rng) for s in sentences]
  out = tree_projection.tree_projection_metrics(params, sentences, config=cfg, sos_id=19,
                                                key=jax.random.PRNGKey(0), gold_trees=gold,
                                                batch_size=3, details=True)
  for seed in range(2):
    preds = [tree_projection.nodes_to_tree(np.asarray(out["trees_nodes"][b][seed]),
                                           [str(w) for w in s])
             for b, s in enumerate(sentences)]
    for n in set(lengths):
      chosen = [b for b, k in enumerate(lengths) if k == n]
      ref = parseval.corpus_parseval([preds[b] for b in chosen], [gold[b] for b in chosen])
      assert out["tparseval_f1_by_length"][seed, n] == pytest.approx(ref["f1"], abs=1e-6)
      assert out["tparseval_gold_by_length"][seed, n] == ref["gold"]
    assert not np.any(np.asarray(out["tparseval_gold_by_length"])[seed, [0, 1, 5, 7]])


def all_trees(i, j):
  """Every binary tree over words i..j with its probability under uniform top-down splits,
  as (pre-order nodes [(i, k, j)], probability)."""
  if i == j:
    yield [], 1.0
    return
  for k in range(i, j):
    for left, p in all_trees(i, k):
      for right, q in all_trees(k + 1, j):
        yield [(i, k, j)] + left + right, p * q / (j - i)


def test_span_probabilities_equal_the_enumeration_of_all_trees():
  for n in range(1, 7):
    want = np.zeros((n, n))
    total = 0.0
    for nodes, p in all_trees(0, n - 1):
      total += p
      for i, _, j in nodes:
        want[i, j] += p
    assert total == pytest.approx(1.0)
    got = parseval.random_tree_span_probabilities(n)
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert got.sum() == pytest.approx(n - 1)
  # n = 3: the root always, then (0, 1) or (1, 2) with probability 1/2 each
  np.testing.assert_allclose(parseval.random_tree_span_probabilities(3),
                             [[0, 0.5, 1], [0, 0, 0.5], [0, 0, 0]])
  with pytest.raises(ValueError, match="at least one word"):
    parseval.random_tree_span_probabilities(0)


def test_expected_random_parseval_equals_the_enumeration_over_tree_pairs():
  # Every pair of trees (14 over 5 words x 5 over 4 words), weighted by its probability.
  words = [parseval.tree_leaves(t) for t in GOLD]
  expected = {"precision": 0.0, "recall": 0.0, "f1": 0.0}
  for nodes_a, p in all_trees(0, len(words[0]) - 1):
    for nodes_b, q in all_trees(0, len(words[1]) - 1):
      trees = [tree_projection.nodes_to_tree(np.asarray(nd), w)
               for nd, w in ((nodes_a, words[0]), (nodes_b, words[1]))]
      scores = parseval.corpus_parseval(trees, GOLD)
      for k in expected:
        expected[k] += p * q * scores[k]
  got = parseval.expected_random_parseval(GOLD)
  for k, v in expected.items():
    assert got[k] == pytest.approx(v, abs=1e-6)  # float32 scores
  # and a sampled mean of seeded random trees lies near it
  rng = np.random.default_rng(0)
  draws = [parseval.corpus_parseval([parseval.random_binary_tree(w, rng) for w in words],
                                    GOLD)["f1"] for _ in range(400)]
  assert np.mean(draws) == pytest.approx(got["f1"], abs=3 * np.std(draws) / 20)


@pytest.mark.parametrize("normalisation", tree_projection.NORMALISATIONS)
def test_baseline_tscores_equal_the_enumeration_of_all_trees(normalisation):
  rng = np.random.default_rng(2)
  n_max, lengths = 6, np.array([5, 6, 1, 3])
  chart = jnp.asarray(rng.normal(size=(4, n_max, n_max)), jnp.float32)
  uniform = jnp.asarray(rng.random(size=(4, n_max, n_max)), jnp.float32)
  got = jax.jit(functools.partial(tree_projection.baseline_tscores,
                                  normalisation=normalisation))(chart, jnp.asarray(lengths),
                                                                 uniform)
  scores = jax.jit(jax.vmap(lambda chart, n, nodes, uniform: tree_projection.tree_score(
      chart, n, nodes, normalisation=normalisation, uniform_NxN=uniform),
                            in_axes=(None, None, 0, None)))
  pad = lambda nodes: nodes + [(-1, -1, -1)] * (n_max - 1 - len(nodes))
  for b, n in enumerate(lengths):
    trees = list(all_trees(0, n - 1))
    words = [str(w) for w in range(n)]
    branching = {side: np.asarray(tree_projection.branching_nodes(n, n_max, right=side == "right"))
                 for side in ("right", "left")}
    nodes = [pad(nd) for nd, _ in trees] + [branching["right"].tolist(),
                                            branching["left"].tolist()]
    nodes += [pad([])] * (44 - len(nodes))  # one compiled shape: 42 trees over 6 words + 2
    values = np.asarray(scores(chart[b], n, jnp.asarray(np.array(nodes, np.int32)), uniform[b]))
    want = sum(p * v for (_, p), v in zip(trees, values))
    assert float(got["tscore_random_tree"][b]) == pytest.approx(want, abs=1e-4)
    for k, (side, make) in enumerate((("right", parseval.right_branching_tree),
                                      ("left", parseval.left_branching_tree))):
      if n >= 2:
        assert tree_projection.nodes_to_tree(branching[side][:n - 1], words) == make(words)
      assert float(got[f"tscore_{side}_branching"][b]) == pytest.approx(
          values[len(trees) + k], abs=1e-5)
  if normalisation in ("split_mean", "random_tree"):  # the normalisation is the expectation
    np.testing.assert_allclose(got["tscore_random_tree"], 0.0, atol=1e-5)
