"""Tests of sg_jax.analysis: weight norm, attention entropy, SCI charts, projected trees, tscore,
tparseval and the drivers. Small random models and few sentences, so the file runs in seconds."""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax.analysis import attention_entropy, parseval, pipeline, tree_projection, weight_norm
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import init_params

VOCAB = 20
SOS = VOCAB - 1
CFG = ModelConfig(vocab_size=VOCAB, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=64,
                  dropout=0.0)
LENGTHS = (5, 7, 3, 1, 6)


@functools.lru_cache(maxsize=None)
def _params(seed: int = 0):
  return init_params(CFG, jax.random.PRNGKey(seed))


def _stack(*trees):
  return jax.tree_util.tree_map(lambda *x: jnp.stack(x), *trees)


def _sentences():
  rng = np.random.default_rng(0)
  return [list(rng.integers(1, VOCAB - 2, size=n)) for n in LENGTHS]


def _padded(sentences, length=8):
  tokens = np.zeros((len(sentences), length), np.int32)
  tokens[:, 0] = SOS
  for b, s in enumerate(sentences):
    tokens[b, 1:1 + len(s)] = s
  return jnp.asarray(tokens), jnp.asarray([len(s) for s in sentences], jnp.int32)


def _zero_attention_kernels(params, name):
  """Copy of params with the given attention kernel ('query', 'out', ...) zeroed in every layer."""
  params = jax.tree_util.tree_map(lambda x: x, params)
  for layer in range(CFG.num_layers):
    k = params[f"layer_{layer}"]["attention"][name]["kernel"]
    params[f"layer_{layer}"]["attention"][name]["kernel"] = jnp.zeros_like(k)
  return params


_chart = jax.jit(tree_projection.sci_chart, static_argnames="config")


@functools.lru_cache(maxsize=None)
def _naive_chart(seed, sentence):
  """Reference-style chart (one masked pass per span) of a sentence (tuple of ids), cached."""
  return tree_projection.naive_sci_chart(_params(seed), [SOS] + list(sentence), config=CFG)


# ---------------------------------------------------------------------------------- weight norm


@pytest.mark.slow
def test_weight_norm_matches_numpy_and_vmaps_over_seeds():
  p0, p1 = _params(0), _params(1)
  expect = [math.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64))))
                          for x in jax.tree_util.tree_leaves(p))) for p in (p0, p1)]
  np.testing.assert_allclose(jax.jit(weight_norm.weight_norm)(p0), expect[0], rtol=1e-5)
  np.testing.assert_allclose(weight_norm.weight_norm_over_seeds(_stack(p0, p1)), expect, rtol=1e-5)
  np.testing.assert_allclose(weight_norm.weight_norm_per_layer(p0, CFG.num_layers),
                             expect[0] / CFG.num_layers, rtol=1e-5)
  with pytest.raises(ValueError):
    weight_norm.weight_norm_per_layer(p0, 0)


# ---------------------------------------------------------------------------- attention entropy


def test_entropy_of_uniform_causal_attention_is_log_position():
  att = jnp.tril(jnp.ones((6, 6))) / jnp.arange(1, 7)[:, None]
  np.testing.assert_allclose(attention_entropy.entropy(att), np.log(np.arange(1, 7)), atol=1e-6)


def test_uniform_attention_model_entropies():
  """Zero query kernels => logits 0 => uniform causal attention: entropy log(i + 1) at position i.
  """
  params = _zero_attention_kernels(_params(), "query")
  tokens, num_words = _padded(_sentences())
  lengths = num_words + 1
  stats = jax.jit(attention_entropy.attention_entropy_stats, static_argnames="config")(
      params, tokens, lengths, config=CFG)
  per_sentence = [np.sum(np.log(np.arange(1, n + 1))) for n in np.asarray(lengths)]
  mean_entropy = sum(per_sentence) / int(np.sum(lengths))
  out = attention_entropy.finalize_stats(stats)
  np.testing.assert_allclose(out["head_entropy"], np.full((2, 4), mean_entropy), rtol=1e-5)
  np.testing.assert_allclose(out["paper_sparsity"], -mean_entropy, rtol=1e-5)
  # head-averaged uniform attention is uniform too; summed over positions, mean over layers.
  np.testing.assert_allclose(out["reference_entropy"], np.mean(per_sentence), rtol=1e-5)


def test_entropy_ignores_padding_and_vmaps_over_seeds():
  sentences = _sentences()
  params_s = _stack(_params(0), _params(1))
  tokens, num_words = _padded(sentences, length=12)
  batched = attention_entropy.finalize_stats(
      attention_entropy.attention_entropy_stats_over_seeds(params_s, tokens, num_words + 1,
                                                           config=CFG))
  total = None
  for s in sentences:  # one unpadded sentence at a time, single seed
    t, n = _padded([s], length=len(s) + 1)
    st = attention_entropy.attention_entropy_stats_over_seeds(params_s, t, n + 1, config=CFG)
    total = attention_entropy.combine_stats(total, st)
  single = attention_entropy.finalize_stats(total)
  for k in single:
    np.testing.assert_allclose(batched[k], single[k], rtol=2e-5, atol=1e-6)
  assert batched["head_entropy"].shape == (2, CFG.num_layers, CFG.num_heads)


def test_reference_entropy_uses_input_embeddings_for_every_layer():
  """Changing layer-0 FF weights changes the real forward pass but not the reference quantity."""
  params = _params()
  tokens, num_words = _padded(_sentences())
  p2 = jax.tree_util.tree_map(lambda x: x, params)
  p2["layer_0"]["linear1"]["kernel"] = 3.0 * p2["layer_0"]["linear1"]["kernel"]
  f = jax.jit(attention_entropy.attention_entropy_stats, static_argnames="config")
  a = attention_entropy.finalize_stats(f(params, tokens, num_words + 1, config=CFG))
  b = attention_entropy.finalize_stats(f(p2, tokens, num_words + 1, config=CFG))
  np.testing.assert_allclose(a["reference_entropy"], b["reference_entropy"], rtol=1e-6)
  assert not np.allclose(a["head_entropy"][1], b["head_entropy"][1])


# ------------------------------------------------------------------------------------ SCI chart


def test_batched_chart_equals_naive_per_span_passes():
  sentences = _sentences()
  tokens, num_words = _padded(sentences)
  chart = np.asarray(_chart(_params(), tokens, num_words, config=CFG))
  for b, s in enumerate(sentences):
    naive = _naive_chart(0, tuple(s))
    n = len(s)
    np.testing.assert_allclose(chart[b, :n, :n], naive, atol=2e-5)
    assert np.all(chart[b, n:] == 0) and np.all(chart[b, :, n:] == 0)
  assert not np.allclose(chart[1][np.triu_indices(7)], 1.0)  # a real model is not trivially 1


def test_chart_over_seeds_equals_single_seed():
  tokens, num_words = _padded(_sentences())
  charts = tree_projection.sci_chart_over_seeds(_stack(_params(0), _params(1)), tokens, num_words,
                                                config=CFG)
  for s in range(2):
    np.testing.assert_allclose(charts[s], _chart(_params(s), tokens, num_words, config=CFG),
                               atol=1e-6)


def test_context_ignoring_model_has_chart_one():
  """With zero head-merge kernels attention adds nothing, so states ignore context."""
  params = _zero_attention_kernels(_params(), "out")
  tokens, num_words = _padded(_sentences())
  chart = np.asarray(_chart(params, tokens, num_words, config=CFG))
  valid = np.asarray(tree_projection.valid_spans(num_words, 7))
  np.testing.assert_allclose(chart[valid], 1.0, atol=1e-5)


def _config(depth):
  return ModelConfig(vocab_size=VOCAB, num_layers=depth, d_model=32, num_heads=4, d_ff=64,
                     max_len=64, dropout=0.0)


@pytest.mark.parametrize("depth", [1, 3])
def test_packed_chart_equals_masked_and_naive_charts(depth):
  """Shortened passes packed into rows (one shared SOS per row) give the charts of the masked
  layout and of one pass per span, on lengths 1..12 words and two depths."""
  cfg = _config(depth)
  params = init_params(cfg, jax.random.PRNGKey(depth))
  rng = np.random.default_rng(depth)
  lengths = (12, 1, 5, 9, 2, 7, 11, 3)
  sentences = [list(rng.integers(1, VOCAB - 2, size=n)) for n in lengths]
  passes = tree_projection.pack_start_passes(sentences, sos_id=SOS, num_rows=12, row_length=24,
                                             batch_rows=10)
  packed = np.asarray(jax.jit(tree_projection.packed_sci_chart, static_argnames="config")(
      params, passes, config=cfg))
  assert packed.shape == (10, 12, 12)
  tokens, num_words = _padded(sentences, length=16)
  masked = np.asarray(_chart(params, tokens, num_words, config=cfg))
  np.testing.assert_allclose(packed[:8], masked[:, :12, :12], atol=1e-5)
  assert np.all(packed[8:] == 0)  # batch-padding rows
  for b in (0, 2, 6):  # the per-span loop is slow: three sentences
    s = sentences[b]
    naive = tree_projection.naive_sci_chart(params, [SOS] + s, config=cfg)
    np.testing.assert_allclose(packed[b, :len(s), :len(s)], naive, atol=1e-5)
  assert not np.allclose(packed[0][np.triu_indices(12)], 1.0)


def test_span_batch_chart_is_the_per_span_chart():
  """The original code's layout (all span-masked copies in one batch) is the per-span chart."""
  s = _sentences()[1]
  chart = tree_projection.span_batch_sci_chart(_params(), jnp.asarray([SOS] + s, jnp.int32),
                                               config=CFG)
  np.testing.assert_allclose(chart, _naive_chart(0, tuple(s)), atol=1e-5)


def test_pack_start_passes_layout():
  sentences = [[3, 4, 5], [6, 7]]
  passes = tree_projection.pack_start_passes(sentences, sos_id=SOS, num_rows=2, row_length=6,
                                             max_words=4, batch_rows=3)
  tokens, positions, segments = (np.asarray(a) for a in passes[:3])
  assert np.all(tokens[:, 0] == SOS) and np.all(segments[:, 0] == -1)
  # 5 passes of 3, 2, 1, 2, 1 words in 2 rows of 1 SOS + 5 words: nothing else fits.
  assert sorted(np.bincount(segments[segments >= 0]).tolist()) == [1, 1, 2, 2, 3]
  flat_t, flat_p = tokens.reshape(-1), positions.reshape(-1)
  for b, s in enumerate(sentences):
    for i in range(len(s)):
      idx = passes.gather[i, b, i:len(s)]
      assert flat_t[idx].tolist() == s[i:]  # word k of the pass with start i ...
      assert flat_p[idx].tolist() == list(range(i + 1, len(s) + 1))  # ... at position k + 1
      assert len(set(segments.reshape(-1)[idx].tolist())) == 1  # one segment per pass
  assert passes.num_words.tolist() == [3, 2, 0]
  with pytest.raises(ValueError, match="only 1 given"):
    tree_projection.pack_start_passes(sentences, sos_id=SOS, num_rows=1, row_length=6)
  with pytest.raises(ValueError, match="cannot hold"):
    tree_projection.pack_start_passes(sentences, sos_id=SOS, num_rows=9, row_length=3)
  with pytest.raises(ValueError, match="max_words"):
    tree_projection.pack_start_passes(sentences, sos_id=SOS, num_rows=9, row_length=6,
                                      max_words=2)


def test_first_fit_decreasing_packs_without_overlap():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 11, size=200)
  bins, offsets, used = tree_projection.first_fit_decreasing(lengths, 15)
  occupied = np.zeros((used, 15), int)
  for b, o, m in zip(bins, offsets, lengths):
    occupied[b, o:o + m] += 1
  assert occupied.max() == 1 and occupied.sum() == lengths.sum()
  assert used <= int(np.ceil(lengths.sum() / 15)) + 2  # a few percent above the lower bound
  with pytest.raises(ValueError, match="does not fit"):
    tree_projection.first_fit_decreasing([16], 15)


def test_start_pass_batches_cover_every_sentence_once_in_one_shape():
  rng = np.random.default_rng(3)
  sentences = [list(rng.integers(1, VOCAB - 2, size=n)) for n in rng.integers(1, 15, size=60)]
  batches = pipeline.make_start_pass_batches(sentences, sos_id=SOS, batch_size=6)
  assert len({tuple(a.shape for a in b.passes) for b in batches}) == 1
  seen = np.concatenate([b.indices[b.indices >= 0] for b in batches])
  assert sorted(seen.tolist()) == list(range(60))
  words = sum(len(s) * (len(s) + 1) // 2 for s in sentences)
  shape = batches[0].passes.tokens.shape
  assert words / (len(batches) * shape[0] * shape[1]) > 0.8  # little padding
  for b in batches:
    assert [len(sentences[i]) for i in b.indices if i >= 0] == [
        n for n in b.passes.num_words.tolist() if n]


def test_packed_entropy_equals_padded_entropy():
  rng = np.random.default_rng(4)
  sentences = [list(rng.integers(1, VOCAB - 2, size=n)) for n in rng.integers(1, 15, size=40)]
  params_s = _stack(_params(0), _params(1))
  common = dict(config=CFG, sos_id=SOS, batch_size=8)
  padded = attention_entropy.attention_entropy_metrics(params_s, sentences, layout="padded",
                                                       **common)
  packed = attention_entropy.attention_entropy_metrics(params_s, sentences, layout="packed",
                                                       **common)
  for k in padded:
    np.testing.assert_allclose(packed[k], padded[k], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="layout"):
    attention_entropy.attention_entropy_metrics(params_s, sentences, layout="bogus", **common)


@pytest.mark.slow
def test_packed_and_masked_pipelines_agree():
  sentences = _sentences()
  gold = [parseval.right_branching_tree([str(w) for w in s]) for s in sentences]
  common = dict(config=CFG, sos_id=SOS, key=jax.random.PRNGKey(1), gold_trees=gold,
                batch_size=2, details=True)
  params_s = _stack(_params(0), _params(1))
  packed = tree_projection.tree_projection_metrics(params_s, sentences, layout="packed", **common)
  masked = tree_projection.tree_projection_metrics(params_s, sentences, layout="masked", **common)
  for k in ("tscore", "tparseval_f1", "tscore_per_sentence"):
    np.testing.assert_allclose(packed[k], masked[k], rtol=1e-5, atol=1e-6)
  for a, b in zip(packed["charts"], masked["charts"]):
    np.testing.assert_allclose(a, b, atol=1e-5)
  with pytest.raises(ValueError, match="layout"):
    tree_projection.tree_projection_metrics(params_s, sentences, layout="bogus", **common)


# ------------------------------------------------------------------------------ projected trees


def _all_trees(i, j):
  """Every binary tree over words i..j as a tuple of (i, k, j) nodes."""
  if i == j:
    return [()]
  return [((i, k, j),) + left + right for k in range(i, j)
          for left in _all_trees(i, k) for right in _all_trees(k + 1, j)]


def _sci(chart, nodes):
  return sum(chart[i, k] + chart[k + 1, j] for i, k, j in nodes)


def _naive_greedy(chart, i, j):
  if i == j:
    return ()
  k = max(range(i, j), key=lambda k: (chart[i, k] + chart[k + 1, j], -k))
  return ((i, k, j),) + _naive_greedy(chart, i, k) + _naive_greedy(chart, k + 1, j)


def _random_chart(rng, n_max=8):
  return np.triu(rng.uniform(-1, 1, size=(n_max, n_max))).astype(np.float32)


def _nodes_set(nodes):
  return {tuple(x) for x in np.asarray(nodes).tolist() if x[0] >= 0}


def test_cky_equals_brute_force_and_greedy_equals_naive_recursion():
  rng = np.random.default_rng(1)
  proj = jax.jit(tree_projection.project_tree, static_argnames="method")
  for n in range(1, 8):
    for _ in range(3):
      chart = _random_chart(rng)
      chart[:, n:] = 0
      cky = _nodes_set(proj(jnp.asarray(chart), n, method="cky"))
      best = max(_all_trees(0, n - 1), key=lambda t: _sci(chart, t))
      assert cky == set(best), (n, cky, best)
      greedy = proj(jnp.asarray(chart), n, method="greedy")
      assert [tuple(x) for x in np.asarray(greedy).tolist() if x[0] >= 0] == list(
          _naive_greedy(chart, 0, n - 1))  # same nodes, same pre-order
      assert _sci(chart, cky) >= _sci(chart, _nodes_set(greedy)) - 1e-6


def _expected_random_tree(chart, i, j):
  if i == j:
    return 0.0
  return np.mean([chart[i, k] + chart[k + 1, j] + _expected_random_tree(chart, i, k)
                  + _expected_random_tree(chart, k + 1, j) for k in range(i, j)])


def test_tree_score_normalisations():
  rng = np.random.default_rng(2)
  n = 6
  chart = _random_chart(rng)
  chart[:, n:] = 0
  uniform = rng.uniform(size=(8, 8)).astype(np.float32)
  nodes = tree_projection.project_tree(jnp.asarray(chart), n)
  node_list = _nodes_set(nodes)
  score = functools.partial(tree_projection.tree_score, jnp.asarray(chart), n, nodes,
                            uniform_NxN=jnp.asarray(uniform))
  sci = _sci(chart, node_list)
  np.testing.assert_allclose(score(normalisation="none"), sci, rtol=1e-5)
  split_mean = sum(np.mean([chart[i, m] + chart[m + 1, j] for m in range(i, j)])
                   for i, _, j in node_list)
  np.testing.assert_allclose(score(normalisation="split_mean"), sci - split_mean, rtol=1e-5)
  rand = sum(chart[i, m] + chart[m + 1, j] for i, _, j in node_list
             for m in [i + int(math.floor(uniform[i, j] * (j - i)))])
  np.testing.assert_allclose(score(normalisation="random_split"), sci - rand, rtol=1e-5)
  np.testing.assert_allclose(score(normalisation="random_tree"),
                             sci - _expected_random_tree(chart, 0, n - 1), rtol=1e-5)
  with pytest.raises(ValueError):
    tree_projection.tree_score(jnp.asarray(chart), n, nodes, normalisation="bogus")
  with pytest.raises(ValueError):
    tree_projection.project_tree(jnp.asarray(chart), n, method="bogus")


def test_nodes_to_tree():
  nodes = np.array([[0, 0, 3], [1, 2, 3], [1, 1, 2], [-1, -1, -1]])
  assert tree_projection.nodes_to_tree(nodes, "a b c d".split()) == ("a", (("b", "c"), "d"))


# ------------------------------------------------------------------------------------- parseval


def test_tree_spans_excludes_single_words_and_includes_root():
  tree = (("the", "dog"), ("did", ("not", "sleep")))
  assert parseval.tree_spans(tree) == {(0, 1), (2, 4), (3, 4), (0, 4)}
  assert parseval.tree_spans("word") == set()


def test_corpus_parseval_known_f1():
  gold = [(("the", "dog"), ("did", ("not", "sleep"))), (("a", "b"), "c")]
  pred = [((("the", "dog"), "did"), ("not", "sleep")), ("a", ("b", "c"))]
  # sentence 1: gold {01, 24, 34, 04}, pred {01, 02, 34, 04} -> 3 matched; sentence 2: root only.
  out = parseval.corpus_parseval(pred, gold)
  assert (out["matched"], out["predicted"], out["gold"]) == (4, 6, 6)
  np.testing.assert_allclose([out["precision"], out["recall"], out["f1"]], [4 / 6] * 3, rtol=1e-6)
  # unequal counts: a flat (non-binary) gold tree has fewer brackets.
  out = parseval.corpus_parseval([("a", ("b", "c"))], [("a", "b", "c")])
  np.testing.assert_allclose([out["precision"], out["recall"], out["f1"]], [0.5, 1.0, 2 / 3])
  with pytest.raises(ValueError):
    parseval.corpus_parseval([("a", "b")], [("a", "c")])


def test_device_bracket_counts_match_python():
  gold = [(("the", "dog"), ("did", ("not", "sleep")))]
  nodes = jnp.asarray([[0, 2, 4], [0, 1, 2], [0, 0, 1], [3, 3, 4]])
  pred = parseval.node_span_matrix(nodes, 6)[None]
  counts = parseval.bracket_counts(pred, jnp.asarray(parseval.gold_span_matrices(gold, 6)))
  assert [float(counts[k]) for k in ("bracket_matched", "bracket_predicted", "bracket_gold")] == [
      3.0, 4.0, 4.0]
  with pytest.raises(ValueError):
    parseval.gold_span_matrices(gold, 6, sentences=[["the", "cat", "did", "not", "sleep"]])


# -------------------------------------------------------------------------------------- drivers


@pytest.mark.slow
def test_pipeline_over_seeds_matches_per_sentence_computation():
  sentences = _sentences()
  gold = [parseval.right_branching_tree([str(w) for w in s]) for s in sentences]
  params_s = _stack(_params(0), _params(1))
  key = jax.random.PRNGKey(0)
  common = dict(config=CFG, sos_id=SOS, key=key, gold_trees=gold)
  out = tree_projection.tree_projection_metrics(params_s, sentences, batch_size=2, details=True,
                                                **common)
  # random-split draws depend on the sentence, not on batching or seed chunking.
  out3 = tree_projection.tree_projection_metrics(params_s, sentences, batch_size=3,
                                                 seeds_per_call=1, **common)
  for k in ("tscore", "tparseval_f1", "tparseval_precision", "tparseval_recall"):
    assert out[k].shape == (2,)
    np.testing.assert_allclose(out[k], out3[k], rtol=1e-5)
  batched_seed1 = np.asarray(_chart(_params(1), *_padded(sentences), config=CFG))
  for seed in range(2):
    preds, scores = [], []
    for b, s in enumerate(sentences):
      chart = _naive_chart(0, tuple(s)) if seed == 0 else batched_seed1[b, :len(s), :len(s)]
      np.testing.assert_allclose(out["charts"][b][seed], chart, atol=2e-5)
      nodes = _naive_greedy(chart, 0, len(s) - 1)
      assert [tuple(x) for x in out["trees_nodes"][b][seed].tolist()] == list(nodes)
      preds.append(tree_projection.nodes_to_tree(np.array(nodes).reshape(-1, 3),
                                                 [str(w) for w in s]))
      u = np.asarray(tree_projection.span_uniforms(key, jnp.asarray([b]), len(s))[0])
      rand = [i + int(math.floor(u[i, j] * (j - i))) for i, _, j in nodes]
      scores.append(_sci(chart, nodes) - sum(
          chart[i, m] + chart[m + 1, j] for (i, _, j), m in zip(nodes, rand)))
    np.testing.assert_allclose(out["tscore_per_sentence"][seed], scores, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["tscore"][seed], np.mean(scores), rtol=1e-4)
    ref = parseval.corpus_parseval(preds, gold)
    np.testing.assert_allclose(out["tparseval_f1"][seed], ref["f1"], rtol=1e-6)
    np.testing.assert_allclose(out["tparseval_recall"][seed], ref["recall"], rtol=1e-6)

  ent = attention_entropy.attention_entropy_metrics(params_s, sentences, config=CFG, sos_id=SOS,
                                           batch_size=2)
  assert ent["head_entropy"].shape == (2, 2, 4) and ent["paper_sparsity"].shape == (2,)


def test_declarative_words_and_make_batches():
  class Ex:
    source = ("the", "dog", "did", "sleep", ".", "quest")
    task_token = "quest"
  assert pipeline.declarative_words(Ex()) == ("the", "dog", "did", "sleep")
  batches = pipeline.make_batches([[3, 4], [5], [6, 7, 8]], sos_id=SOS, batch_size=2)
  assert [b.tokens.shape for b in batches] == [(2, 4), (2, 4)]
  assert batches[0].indices.tolist() == [1, 0] and batches[1].indices.tolist() == [2, -1]
  assert batches[1].num_words.tolist() == [3, 0] and batches[1].lengths.tolist() == [4, 0]
  with pytest.raises(ValueError):
    pipeline.make_batches([[]], sos_id=SOS, batch_size=2)


def test_select_lines_and_entropy_inputs_on_hand_built_lines():
  from sg_jax.tasks.base import Example  # pylint: disable=import-outside-toplevel
  decl = Example(source=("her", "dog", "does", "sleep", ".", "decl"),
                 target=("her", "dog", "does", "sleep", "."), task_token="decl")
  quest = Example(source=("my", "yak", "doesn't", "read", ".", "quest"),
                  target=("doesn't", "my", "yak", "read", "?"), task_token="quest",
                  transformed=True)
  lines = [decl, quest, decl, quest]
  # the released set: quest (transformed) lines only, in file order; 'all' keeps every line.
  assert pipeline.select_lines(lines, "transformed") == [quest, quest]
  assert pipeline.select_lines(lines, "all") == lines
  dyck = [Example(source=("(a", "a)")), Example(source=("(b", "(a", "a)", "b)"))]
  assert pipeline.select_lines(dyck, "transformed") == dyck  # no task token: every line
  # the released input: words before the task token, final "." removed (SOS added later).
  assert pipeline.entropy_inputs([quest], "declarative") == [("my", "yak", "doesn't", "read")]
  assert pipeline.entropy_inputs([quest], "line") == [
      ("my", "yak", "doesn't", "read", ".", "quest", "doesn't", "my", "yak", "read", "?")]
  with pytest.raises(ValueError, match="sentence set"):
    pipeline.select_lines(lines, "quest")
  with pytest.raises(ValueError, match="entropy input"):
    pipeline.entropy_inputs(lines, "source")


def test_released_weight_norm_adds_the_decoder_in_squares():
  np.testing.assert_allclose(weight_norm.released_weight_norm([3.0, 6.0], 4.0), [5.0, 7.2111026],
                             rtol=1e-7)
  with pytest.raises(ValueError, match="decoder norm"):
    weight_norm.released_weight_norm(3.0, -1.0)


def test_released_sentence_set_of_question_dev():
  """On the released question.dev (594 decl + 406 quest lines) the released set is the 406 quest
  lines, and their declarative parts are the sources without the final `. quest`."""
  root = os.environ.get("SG_JAX_REFERENCE_DATA")
  if not root:
    pytest.skip("SG_JAX_REFERENCE_DATA is not set (the released McCoy et al. files)")
  tasks = pytest.importorskip("sg_jax.tasks")
  examples = tasks.get_task("question").read_split(os.path.join(root, "mccoy2020"), "dev")
  chosen = pipeline.select_lines(examples, "transformed")
  assert len(examples) == 1000 and len(chosen) == 406
  assert {ex.task_token for ex in chosen} == {"quest"}
  words = pipeline.entropy_inputs(chosen, "declarative")
  assert words == [tuple(ex.source[:-2]) for ex in chosen]
  assert all(ex.source[-2:] == (".", "quest") for ex in chosen)
