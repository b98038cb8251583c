"""The analysis of models that are not causal (`mlm`: bidirectional, `prefix_lm`: prefix
attention): tree projections from one pass per span restricted to the span, against the naive
per-span computation; attention entropies under the model's own mask, on hand-built uniform
attention (docs/analysis.md, "Objectives")."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax.analysis import attention_entropy, span_packing, pipeline, tree_projection
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import init_params

VOCAB, SOS, QUEST = 16, 15, 9
SENTENCES = ([3, 4, 5, 6, 7], [1], [2, 5, 3, 1, 4], [7, 7, 2, 1, 6])


@functools.lru_cache(maxsize=None)
def _config(attention: str) -> ModelConfig:
  return ModelConfig(vocab_size=VOCAB, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                     max_len=32, dropout=0.0, attention=attention,
                     prefix_end_ids=(QUEST,) if attention == "prefix" else ())


@functools.lru_cache(maxsize=None)
def _params(attention: str, seed: int = 0):
  return init_params(_config(attention), jax.random.PRNGKey(seed))


def _stack(*trees):
  return jax.tree_util.tree_map(lambda *x: jnp.stack(x), *trees)


def test_pack_span_passes_lays_out_every_span_with_its_own_sos():
  passes = span_packing.pack_span_passes([[3, 4, 5], [7]], sos_id=SOS, num_rows=3, row_length=8,
                                    batch_rows=3)
  flat_tok, flat_pos = passes.tokens.reshape(-1), passes.positions.reshape(-1)
  flat_seg = passes.segments.reshape(-1)
  for b, words in enumerate([[3, 4, 5], [7]]):
    for i in range(len(words)):
      for j in range(i, len(words)):
        seg = passes.span_segment[b, i, j]
        where = np.flatnonzero(flat_seg == seg)
        np.testing.assert_array_equal(flat_tok[where], [SOS] + words[i:j + 1])
        np.testing.assert_array_equal(flat_pos[where], [0] + list(range(i + 1, j + 2)))
    n = len(words)
    np.testing.assert_array_equal(flat_tok[passes.full_words[b, :n]], words)
  dummy = 3 * 3 * 4 // 2
  assert passes.span_segment[0, 2, 1] == dummy and passes.span_segment[2, 0, 0] == dummy
  # tokens j - i + 2 per span: 2 + 3 + 4 + 2 + 3 + 2 of the first sentence, 2 of the second
  assert np.sum(passes.segments >= 0) == 18
  with pytest.raises(ValueError, match="need 4 rows"):
    span_packing.pack_span_passes([[3, 4, 5, 6]], sos_id=SOS, num_rows=1, row_length=8)


@pytest.mark.parametrize("attention", ["bidirectional", "prefix"])
def test_span_pass_charts_equal_naive_per_span_passes(attention):
  """The batched span passes (several batches of packed rows, vmapped over 2 seeds) give the
  charts of one masked forward pass per span, for each seed."""
  config = _config(attention)
  params_s = _stack(_params(attention, 0), _params(attention, 1))
  out = tree_projection.tree_projection_metrics(
      params_s, SENTENCES, config=config, sos_id=SOS, key=jax.random.PRNGKey(0), batch_size=2,
      details=True)
  assert len(pipeline.make_span_pass_batches(SENTENCES, sos_id=SOS, batch_size=2)) > 1
  for s, sentence in enumerate(SENTENCES):
    for seed in range(2):
      naive = tree_projection.naive_sci_chart(_params(attention, seed), [SOS] + sentence,
                                              config=config)
      np.testing.assert_allclose(out["charts"][s][seed], naive, atol=2e-5)


def test_causal_span_passes_equal_start_passes_and_causal_layouts_refuse_other_models():
  config = _config("causal")
  params_s = _stack(_params("causal", 0))
  common = dict(config=config, sos_id=SOS, key=jax.random.PRNGKey(0), batch_size=3,
                details=True)
  starts = tree_projection.tree_projection_metrics(params_s, SENTENCES, **common)
  spans = tree_projection.tree_projection_metrics(params_s, SENTENCES, layout="spans", **common)
  for a, b in zip(starts["charts"], spans["charts"]):
    np.testing.assert_allclose(a, b, atol=2e-5)
  np.testing.assert_allclose(starts["tscore"], spans["tscore"], atol=1e-5)
  bidi = _config("bidirectional")
  with pytest.raises(ValueError, match="masked tree-projection layout needs a causal model"):
    tree_projection.tree_projection_metrics(params_s, SENTENCES, **dict(common, config=bidi),
                                            layout="masked")
  passes = span_packing.pack_start_passes(SENTENCES[:1], sos_id=SOS, num_rows=4, row_length=8)
  with pytest.raises(ValueError, match="relies on causal attention"):
    tree_projection.packed_sci_chart(_params("bidirectional"), passes, config=bidi)


def _uniform(attention: str):
  """Parameters whose attention logits are all 0 (zero query kernels): uniform attention over
  the keys the model's mask allows."""
  params = jax.tree_util.tree_map(lambda x: x, _params(attention))
  for layer in range(2):
    kernel = params[f"layer_{layer}"]["attention"]["query"]["kernel"]
    params[f"layer_{layer}"]["attention"]["query"]["kernel"] = jnp.zeros_like(kernel)
  return params


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_uniform_bidirectional_attention_entropy_is_log_line_length(layout):
  """Bidirectional: every real position (SOS included) attends uniformly to the n + 1 tokens
  of its line, entropy log(n + 1); the packed layout falls back to the padded one."""
  sentences = list(SENTENCES)
  out = attention_entropy.attention_entropy_metrics(
      _stack(_uniform("bidirectional")), sentences, config=_config("bidirectional"),
      sos_id=SOS, batch_size=2, layout=layout)
  sizes = np.array([len(s) + 1 for s in sentences])
  mean = np.sum(sizes * np.log(sizes)) / np.sum(sizes)
  np.testing.assert_allclose(out["head_entropy"][0], np.full((2, 2), mean), rtol=1e-5)
  np.testing.assert_allclose(out["paper_sparsity"], [-mean], rtol=1e-5)
  np.testing.assert_allclose(out["reference_entropy"], [np.mean(sizes * np.log(sizes))],
                             rtol=1e-5)


def test_uniform_prefix_attention_entropy_follows_the_task_token():
  """Prefix: positions up to the task token attend uniformly to the prefix (t + 1 tokens, the
  task token at t), later positions p causally to p + 1 tokens."""
  lines = [[3, 4, QUEST, 5, 6], [2, QUEST, 7], [1, 2, 3]]  # the last one has no task token
  out = attention_entropy.attention_entropy_metrics(
      _stack(_uniform("prefix")), lines, config=_config("prefix"), sos_id=SOS, batch_size=3)
  per_line = []
  for words in lines:
    tokens = [SOS] + words
    t = tokens.index(QUEST) if QUEST in tokens else len(tokens) - 1
    per_line.append([math.log(t + 1) if p <= t else math.log(p + 1) for p in range(len(tokens))])
  mean = np.mean(np.concatenate(per_line))
  np.testing.assert_allclose(out["head_entropy"][0], np.full((2, 2), mean), rtol=1e-5)
  np.testing.assert_allclose(out["reference_entropy"], [np.mean([sum(x) for x in per_line])],
                             rtol=1e-5)
  with pytest.raises(ValueError, match="packed attention-entropy layout needs a causal"):
    attention_entropy.packed_attention_entropy_stats(
        _params("prefix"), jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32),
        jnp.zeros((1, 4), jnp.int32), 1, config=_config("prefix"))
