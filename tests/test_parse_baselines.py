"""Parse baselines beside tparseval (right-, left-branching and random trees) and tparseval per
sentence length (sg_jax/analysis/parseval.py, tree_projection.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax.analysis import parseval, tree_projection
from sg_jax.model import ModelConfig, init_params

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
  got = parseval.baseline_parseval(GOLD, seed=0)
  assert got["right_branching"] == pytest.approx(4 / 7)
  assert got["left_branching"] == pytest.approx(4 / 7)
  assert 0 < got["random"] <= 1
  # The random baseline is the parseval of the random trees drawn with the same seed.
  rng = np.random.default_rng(5)
  trees = [parseval.random_binary_tree(parseval.tree_leaves(t), rng) for t in GOLD]
  assert parseval.baseline_parseval(GOLD, seed=5)["random"] == pytest.approx(
      parseval.corpus_parseval(trees, GOLD)["f1"])
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
