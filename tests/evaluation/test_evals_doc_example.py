"""docs/evaluation.md "An evaluator over held-out lines": the page's own code block, executed as
a module, registers `last_entropy`, and what it logs equals a per-line loop over the unpadded
in-domain lines (so the page cannot go stale, and its masking of padding lines and positions
is right)."""

import dataclasses
import os
import re
import types

import jax
import numpy as np
import pytest

from sg_jax import configlib, evaluation as evals, models, tasks
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.objectives import model_config_from_config

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "docs", "evaluation.md")


def _doc_module() -> types.ModuleType:
  """The page's python block that defines `last_entropy`, run as a module (it registers)."""
  with open(DOC, encoding="utf-8") as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  (source,) = [b for b in blocks if 'name = "last_entropy"' in b]
  module = types.ModuleType("doc_last_entropy")
  exec(compile(source, DOC, "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


@pytest.fixture
def doc_evaluator():
  module = _doc_module()
  yield module.LastLayerEntropy
  evals.unregister("last_entropy")


class _Progress:
  def __init__(self):
    self.lines = 0

  def update(self, lines, split):
    assert split == "in_domain"
    self.lines += lines

  def note(self, text):
    del text


def test_the_docs_entropy_evaluator_equals_a_per_line_loop(doc_evaluator, tiny_data):
  config = configlib.base_config("question")
  assert config.evals.last_entropy.to_dict() == {"enabled": True, "lines": 128}
  task = tasks.get_task("question")
  vocab = task.vocab()
  split = task.encode(task.read_split(tiny_data, task.in_domain_split), vocab)
  # Three lines of each of two lengths, in batches of 4: the second batch has 2 padding lines,
  # and the per-line loop below runs one unpadded batch per length.
  lengths = np.asarray(split.lengths)
  values, counts = np.unique(lengths, return_counts=True)
  short, long = sorted(values[np.argsort(-counts, kind="stable")[:2]])  # two lengths of >= 3 lines
  assert short < long and min(np.sum(lengths == short), np.sum(lengths == long)) >= 3
  picked = np.concatenate([np.flatnonzero(lengths == short)[:3],
                           np.flatnonzero(lengths == long)[:3]])
  split = split.take(picked)
  model_config = dataclasses.replace(
      model_config_from_config(config, vocab.size), num_layers=1, d_model=16, num_heads=2,
      d_ff=32)
  model = models.build(model_config)
  # Random parameters of the model's shapes (shapes traced only, nothing compiled).
  shapes = jax.eval_shape(lambda: models.init_params(model_config, jax.random.key(0)))
  rng = np.random.default_rng(0)
  params_S = jax.tree_util.tree_map(
      lambda x: rng.normal(0.0, 0.5, (2,) + x.shape).astype(np.float32), shapes)
  context = evals.Context(task=task, vocab=vocab, model=model, objective=None,
                          splits={"in_domain": split, "out_of_domain": split},
                          data_dir=tiny_data, options=evals.EvalOptions(batch_size=4),
                          put=lambda tree: tree)
  evaluation = doc_evaluator(lines=6).build(context)
  progress = _Progress()
  got_S = np.asarray(evaluation.evaluate(params_S, progress)["in_domain"]["last_layer_entropy"])
  assert progress.lines == evaluation.lines == 6

  attention = jax.jit(lambda p, t: apply_with_intermediates(model, p, t, deterministic=True)[1]
                      ["attention"][-1])
  for s in range(2):
    params = jax.tree_util.tree_map(lambda x, s=s: x[s], params_S)
    rows = []
    for n, lines in ((short, slice(0, 3)), (long, slice(3, 6))):
      tokens = np.asarray(split.inputs)[lines, :n]  # the lines of length n, no padding at all
      att = np.asarray(attention(params, tokens), np.float64)  # [3, heads, n, n]
      rows.append(-np.sum(att * np.log(np.where(att > 0, att, 1.0)), axis=-1).ravel())
    np.testing.assert_allclose(got_S[s], np.concatenate(rows).mean(), rtol=1e-5)
  assert doc_evaluator(lines=0).build(context) is None


def test_the_docs_entropy_evaluator_refuses_negative_lines_in_one_line(doc_evaluator):
  config = configlib.base_config("question")
  config.evals.last_entropy.lines = -1
  with pytest.raises(ValueError, match=r"evals\.last_entropy: lines must be >= 0"):
    evals.enabled_from_config(config)
