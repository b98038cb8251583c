"""UAS of attention (sg_jax/analysis/uas.py; docs/sas.md): hand-built cases, the vectorised
sums against a naive loop, the seed axis, and the training / analysis integration."""

import collections
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import tasks, train
from sg_jax.analysis import pipeline, uas, uas_eval, uas_positional
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import init_params
from sg_jax.records import metric_logging
from sg_jax.tasks import dependencies
from sg_jax.tasks import io as tasks_io

SPECIAL = np.array([0, 98, 99], np.int32)  # pad, EOS, SOS of the hand-built lines
REL = {r: i for i, r in enumerate(dependencies.RELATIONS)}


def causal_uniform(batch, heads, length):
  """[1, B, H, L, L]: row i uniform over positions 0..i."""
  a = np.tril(np.ones((length, length)))
  a /= a.sum(-1, keepdims=True)
  return np.broadcast_to(a, (1, batch, heads, length, length)).astype(np.float32)


def arrays(lines, length):
  """(inputs, dep_head, dep_relation) of (num_words, arcs) lines; word ids 1..n."""
  inputs = np.zeros((len(lines), length), np.int32)
  for b, (n, _) in enumerate(lines):
    inputs[b, 0] = 99
    inputs[b, 1:n + 1] = np.arange(1, n + 1)
  arcs = dependencies.dependency_arrays([a for _, a in lines], length)
  return inputs, arcs["dep_head"], arcs["dep_relation"]


def scores(att, inputs, heads, rels, min_count=1):
  stats = uas.attention_uas_stats(jnp.asarray(att), inputs, heads, rels, SPECIAL)
  return uas.finalize(jax.tree_util.tree_map(lambda x: np.asarray(x)[None], stats), min_count)


def test_uniform_attention_scores_chance_exactly():
  # "the walrus does move ." : det 1->2, nsubj 2->4, aux 3->4 (rows 2, 4, 4).
  inputs, heads, rels = arrays([(5, [(1, 2, "det"), (2, 4, "nsubj"), (3, 4, "aux")])], 7)
  out = scores(causal_uniform(1, 2, 7), inputs, heads, rels)
  # Row r's candidates are positions 1..r-1 (SOS and the diagonal removed), all tied: the gold
  # column scores 1/(r-1): (1 + 1/3 + 1/3) / 3. The weight is the raw 1/(r+1).
  np.testing.assert_allclose(out["uas"], [5 / 9], rtol=1e-6)
  np.testing.assert_allclose(out["uas_head"], np.full((1, 1, 2), 5 / 9), rtol=1e-6)
  np.testing.assert_allclose(out["uas_weight"], [(1 / 3 + 1 / 5 + 1 / 5) / 3], rtol=1e-6)
  np.testing.assert_allclose(out["uas_relation"][0, [REL["det"], REL["aux"]]], [1, 1 / 3],
                             rtol=1e-6)
  assert np.isnan(out["uas_relation"][0, REL["obj"]])  # no arc of that relation


def test_attention_on_gold_scores_one_and_rare_relations_are_dropped():
  # Every row is the later end of one arc: 2->1, 3->2 (head first), 4->5 (dependent first).
  lines = [(6, [(2, 1, "det"), (3, 2, "nsubj"), (4, 5, "aux")]), (3, [(1, 3, "det")])]
  inputs, heads, rels = arrays(lines, 8)
  att = causal_uniform(2, 1, 8).copy()
  for b, (_, arcs) in enumerate(lines):
    for d, h, _ in arcs:
      later, earlier = max(d, h), min(d, h)
      att[0, b, 0, later] = 0.0
      att[0, b, 0, later, earlier] = 1.0
  out = scores(att, inputs, heads, rels, min_count=2)
  np.testing.assert_allclose(out["uas"], [1.0])
  np.testing.assert_allclose(out["uas_weight"], [1.0])
  np.testing.assert_allclose(out["count"][0, [REL["det"], REL["nsubj"], REL["aux"]]], [2, 1, 1])
  # min_count=2: only det (2 arcs) has a per-relation score; "all" still counts every arc.
  assert out["uas_relation"][0, REL["det"]] == 1.0
  assert np.isnan(out["uas_relation"][0, REL["nsubj"]])


def naive_stats(att, inputs, heads, rels):
  """The definitions of the module docstring, one arc and one head at a time."""
  num_layers, _, num_heads, _, _ = att.shape
  hits = np.zeros((num_layers, num_heads, len(REL)))
  weight = np.zeros_like(hits)
  count = np.zeros(len(REL))
  for b in range(inputs.shape[0]):
    for d in range(inputs.shape[1]):
      h = heads[b, d]
      if h < 0:
        continue
      later, earlier = max(d, h), min(d, h)
      cands = [c for c in range(later) if inputs[b, c] not in SPECIAL]
      count[rels[b, d]] += 1
      for layer in range(num_layers):
        for k in range(num_heads):
          row = att[layer, b, k, later]
          top = max(row[c] for c in cands)
          winners = [c for c in cands if row[c] == top]
          hits[layer, k, rels[b, d]] += (earlier in winners) / len(winners)
          weight[layer, k, rels[b, d]] += row[earlier]
  return hits, weight, count


def test_vectorised_equals_naive_loop_on_real_lines():
  task = tasks.get_task("question")
  vocab = task.vocab()
  data = task.generate_examples(seed=3, sizes={"train": 6, "dev": 2, "test": 2, "gen": 6})
  examples = data["train"] + data["gen"]
  lines = [(vocab.encode(ex.words), task.gold_dependencies(ex)) for ex in examples]
  batch = uas.line_batches(lines, sos_id=vocab.sos_id, batch_size=len(lines))[0]
  length = batch["inputs"].shape[1]
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, len(lines), 3, length, length)) * 3
  logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
  att = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1))
  special = uas.special_ids_of(vocab)
  got = uas.attention_uas_stats(jnp.asarray(att), batch["inputs"], batch["dep_head"],
                                batch["dep_relation"], special)
  global SPECIAL
  saved, SPECIAL = SPECIAL, special
  try:
    hits, weight, count = naive_stats(att, batch["inputs"], batch["dep_head"],
                                      batch["dep_relation"])
  finally:
    SPECIAL = saved
  assert count.sum() == sum(len(a) for _, a in lines) > 100
  np.testing.assert_allclose(np.asarray(got["count"]), count)
  # causal attention: one direction (later -> earlier), the stats' direction axis has size 1
  np.testing.assert_allclose(np.asarray(got["hits"])[:, :, 0], hits, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got["weight"])[:, :, 0], weight, atol=1e-5)


@pytest.mark.slow
def test_over_seeds_equals_each_seed_alone():
  task = tasks.get_task("question")
  vocab = task.vocab()
  data = task.generate_examples(seed=4, sizes={"train": 8, "dev": 2, "test": 2, "gen": 2})
  lines = [(vocab.encode(ex.words), task.gold_dependencies(ex)) for ex in data["train"]]
  batch = uas.line_batches(lines, sos_id=vocab.sos_id, batch_size=8)[0]
  config = ModelConfig(vocab_size=vocab.size, num_layers=2, d_model=32, num_heads=2, d_ff=64,
                       max_len=64)
  params = [init_params(config, jax.random.PRNGKey(s)) for s in range(2)]
  stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *params)
  args = (batch["inputs"], batch["dep_head"], batch["dep_relation"],
          jnp.asarray(uas.special_ids_of(vocab)))
  both = uas.uas_stats_over_seeds(stacked, *args, config=config)
  for s in range(2):
    alone = uas.uas_stats(params[s], *args, config=config)
    for k in alone:
      np.testing.assert_allclose(np.asarray(both[k][s]), np.asarray(alone[k]), atol=1e-6)


def test_tiny_run_logs_uas_per_seed_with_dense_schedule(tiny_config, tmp_path,
                                                         uas_quantity_registered):
  from sg_jax.analysis import driver as analyze
  config = tiny_config(**{"eval.uas_lines": 256, "eval.dense_until": 10, "eval.dense_every": 5,
                          "train.num_steps": 20,
                          "checkpoint.every": 10})
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  table = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  rows = {(r["step"], r["seed"]): r["value"] for r in table if r["name"] == "in_domain/uas"}
  # eval.every 20 plus every 5 steps up to step 10.
  assert sorted(rows) == [(s, seed) for s in (0, 5, 10, 20) for seed in (0, 1)]
  assert all(0.0 < v < 1.0 for v in rows.values())
  weights = [r["value"] for r in table if r["name"] == "in_domain/uas_weight"]
  assert len(weights) == 8 and all(0.0 < v < 1.0 for v in weights)
  assert not [r for r in table if r["name"].startswith("out_of_domain/uas")]
  # the positional baselines (uas_positional.positional_baselines) of the same lines, at every
  # evaluation and seed, one value each
  eval_lines = uas_eval.eval_batches(256, config.eval.batch_size, tasks.from_config(config),
                                     tasks.get_task("question").vocab(),
                                     tasks_io.run_data_dir(config.data, workdir))
  want = uas_positional.positional_baselines(uas_positional.positional_uas_stats(
      [{k: v[i] for k, v in eval_lines.items()} for i in range(eval_lines["inputs"].shape[0])],
      uas.special_ids_of(tasks.get_task("question").vocab())), min_count=1)
  for name in uas_eval.EVAL_BASELINES:
    logged = {(r["step"], r["seed"]): r["value"] for r in table
              if r["name"] == f"in_domain/uas_{name}"}
    assert sorted(logged) == sorted(rows)
    np.testing.assert_allclose(list(logged.values()), want[name], rtol=1e-6)
  assert 0 < want["prev_token"] <= want["best_offset"] < 1
  # the training loss is logged at every evaluation too (log_every is 10): the dense schedule
  # densifies the loss curve that onsets read
  loss_steps = sorted({r["step"] for r in table if r["name"] == "train/loss"})
  assert {5, 10, 20} <= set(loss_steps) and config.train.log_every == 10
  # The analysis: per-head and per-relation rows; `uas` is the best head's.
  analyze.analyze(workdir, steps=[20], groups=["uas"], num_sentences=50, uas_min_count=100)
  got = {}
  for r in metric_logging.read_table(os.path.join(workdir, "analysis.csv")):
    got.setdefault(r["seed"], {})[r["name"]] = r["value"]
  assert sorted(got) == [0, 1]
  lines = pipeline.load_sentences(config, workdir, "train", 50, False, tasks.get_task(
      "question").vocab(), need_dependencies=True)["dependency_lines"]
  counts = collections.Counter(r for _, arcs in lines for _, _, r in arcs)
  frequent = {f"uas_rel_{r}" for r, n in counts.items() if n >= 100}
  assert {"uas_rel_det", "uas_rel_nsubj"} <= frequent < {f"uas_rel_{r}" for r in counts}
  for seed, cols in got.items():
    heads = [cols[f"uas_l0_h{h}"] for h in range(2)]
    assert cols["uas"] == pytest.approx(max(heads))
    assert {c for c in cols if c.startswith("uas_rel_")} == frequent
    assert {c[len("uas_best_offset_rel_"):] for c in cols
            if c.startswith("uas_best_offset_rel_")} == {f[len("uas_rel_"):] for f in frequent}
  for name in ("uas_prev_token", "uas_next_token", "uas_best_offset"):
    assert got[0][name] == got[1][name]  # a constant of the sentence set
  assert 0 < got[0]["uas_prev_token"] <= got[0]["uas_best_offset"] < 1


def test_eval_batches_skip_tasks_without_dependencies(tiny_config):
  config = tiny_config(task="dyck")
  assert uas_eval.eval_batches(256, 64, tasks.from_config(config), None, "unused") == {}
  off = tiny_config(**{"eval.uas_lines": 0})  # the old name of evals.uas.lines
  assert off.evals.uas.lines == 0
  assert uas_eval.eval_batches(off.evals.uas.lines, 64, tasks.from_config(off), None,
                               "unused") == {}
