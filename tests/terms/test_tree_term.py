"""The tree regulariser (TreeReg; sg_jax/terms/tree.py, docs/tree_regularisation.md): chart and
loss on hand-built values, gradient against finite differences, packed = padded, lambda 0,
per-seed strengths in a group, together with SAS, and refused configs."""

import csv
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import checkpointing, objectives, step, tasks, train
from sg_jax.config import checks as config_checks
from sg_jax.data.packing import pack_lines
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import INTERMEDIATES, TransformerLM, init_params
from sg_jax.records import metric_logging
from sg_jax.report import build as report
from sg_jax.report import group_markdown, group_stats, groups
from sg_jax.tasks import trees
from sg_jax.terms import tree

from run_files import params as run_params


def test_split_nodes_and_gold_nodes():
  t = (("the", "walrus"), ("does", ("move", "it")))
  assert trees.split_nodes(t) == [(0, 1, 4), (0, 0, 1), (2, 2, 4), (3, 3, 4)]
  assert trees.split_nodes("a") == []
  with pytest.raises(ValueError, match="binary tree"):
    trees.split_nodes(("a", "b", "c"))
  nodes = tree.gold_nodes([t, ("a", "b")])
  assert nodes.shape == (2, 4, 3) and nodes.dtype == np.int32
  np.testing.assert_array_equal(nodes[1], [[0, 0, 1], [-1, -1, -1], [-1, -1, -1], [-1, -1, -1]])


def test_chart_of_hand_built_vectors():
  # h_0 = (1, 0), h_1 = (0, 1), h_2 = (2, 1): C[1, 1] = |h_1 _|_ h_0| = 1, C[1, 2] =
  # |h_2 _|_ h_0| = 1, C[2, 2] = |h_2 _|_ h_1| = 2; row 0 and i > j are 0.
  chart = tree.scin_chart(jnp.array([[[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]]))
  np.testing.assert_allclose(chart[0], [[0, 0, 0], [0, 1, 1], [0, 0, 2]], atol=1e-6)
  # Scaling h_{i-1} does not change C[i, j]; scaling h_j scales it.
  chart2 = tree.scin_chart(jnp.array([[[5.0, 0.0], [0.0, 3.0], [2.0, 1.0]]]))
  np.testing.assert_allclose(chart2[0], [[0, 0, 0], [0, 3, 1], [0, 0, 2]], atol=1e-6)
  # normalise: sines of the angles, whatever the lengths.
  r5 = np.sqrt(5.0)
  for w in ([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]], [[5.0, 0.0], [0.0, 3.0], [4.0, 2.0]]):
    chart3 = tree.scin_chart(jnp.array([w]), normalise=True)
    np.testing.assert_allclose(chart3[0], [[0, 0, 0], [0, 1, 1 / r5], [0, 0, 2 / r5]], atol=1e-6)


def test_loss_on_hand_built_chart_and_tree():
  # Three words: split scores s(0, 0, 2) = C[0,0] + C[1,1] + C[1,2] = 0 + 1 + 1 = 2 and
  # s(0, 1, 2) = C[0,1] + C[2,2] + C[2,2] = 0 + 2 + 2 = 4.
  chart = jnp.array([[[0.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 2.0]]])
  loss = lambda nodes: tree.treereg_loss(chart, jnp.array([nodes], jnp.int32))
  value, count = loss([[0, 1, 2], [0, 0, 1]])  # ((w0 w1) w2): gold split 1; (0, 0, 1) skipped
  assert float(value) == pytest.approx(np.log1p(np.exp(-2.0)), rel=1e-5) and float(count) == 1
  value, _ = loss([[0, 0, 2], [1, 1, 2]])  # (w0 (w1 w2)): gold split 0
  assert float(value) == pytest.approx(2.0 + np.log1p(np.exp(-2.0)), rel=1e-5)
  assert float(loss([[0, 0, 1], [-1, -1, -1]])[0]) == 0.0  # no node of 3 words


def _reference_loss(chart, nodes_per_line):
  """L_TR by the module docstring's formulas, with plain loops (numpy, float64)."""
  c = np.asarray(chart, np.float64)
  per_line = []
  for b, nodes in enumerate(nodes_per_line):
    ce = []
    for i, gold, j in nodes:
      if j - i < 2:
        continue
      s = np.array([c[b, i, k] + c[b, k + 1, k + 1] + c[b, k + 1, j] for k in range(i, j)])
      ce.append(np.log(np.sum(np.exp(s))) - s[gold - i])
    if ce:
      per_line.append(np.mean(ce))
  return np.mean(per_line)


def test_loss_equals_loops_on_a_random_chart():
  rng = np.random.default_rng(1)
  chart = np.triu(rng.uniform(0, 3, size=(2, 6, 6)))
  chart[:, 0] = 0.0
  t1 = ((("a", "b"), "c"), (("d", "e"), "f"))
  t2 = ("a", ("b", ("c", "d")))
  nodes = tree.gold_nodes([t1, t2])
  value, count = tree.treereg_loss(jnp.asarray(chart, jnp.float32), jnp.asarray(nodes))
  assert float(value) == pytest.approx(_reference_loss(chart, [trees.split_nodes(t1),
                                                               trees.split_nodes(t2)]), rel=1e-5)
  assert float(count) == 3 + 2  # t1: root, (a b c), (d e f); t2: root, (b c d)


def tiny_batch(num_lines=4):
  task = tasks.get_task("question")
  vocab = task.vocab()
  data = task.generate_examples(seed=5, sizes={"train": num_lines, "dev": 2, "test": 2,
                                               "gen": 2})
  examples = data["train"]
  split = tasks.encode(examples, vocab)  # inputs `SOS w_1 .. w_n`, targets `w_1 .. w_n EOS`
  options = tree.TreeOptions(layer=-1, dims=0.5)
  arrays = options.train_arrays(task, examples, split.inputs.shape[1])
  config = ModelConfig(vocab_size=vocab.size, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                       max_len=128)
  data = {"inputs": split.inputs, "targets": split.targets, "lengths": split.lengths, **arrays}
  return config, options, {k: jnp.asarray(v) for k, v in data.items()}


def test_packed_rows_give_the_padded_penalty():
  config, options, data = tiny_batch()
  model = TransformerLM(config)
  params = init_params(config, jax.random.PRNGKey(0))
  idx = jnp.arange(data["inputs"].shape[0])
  pen = lambda out: options.penalty(params, out[1][INTERMEDIATES], data, idx, config)
  padded = jax.jit(lambda: pen(model.apply({"params": params}, data["inputs"],
                                           mutable=[INTERMEDIATES])))()
  rows = pack_lines(data["inputs"], data["targets"], data["lengths"], idx, 128)
  packed = jax.jit(lambda: pen(model.apply(
      {"params": params}, rows["inputs"], mutable=[INTERMEDIATES],
      positions_BxL=rows["positions_BxL"], lines=rows["lines"])))()
  assert float(padded) > 0.0
  np.testing.assert_allclose(float(packed), float(padded), rtol=1e-5)


def _directional(f, params, direction, eps):
  """(central difference of f along `direction`, gradient of f . direction); f is jitted."""
  shifted = lambda s: jax.tree_util.tree_map(lambda x, d: x + s * eps * d, params, direction)
  f_jit = jax.jit(f)
  numeric = (float(f_jit(shifted(1.0))) - float(f_jit(shifted(-1.0)))) / (2 * eps)
  grads = jax.jit(jax.grad(f))(params)
  analytic = sum(float(jnp.vdot(g, d)) for g, d in zip(jax.tree_util.tree_leaves(grads),
                                                        jax.tree_util.tree_leaves(direction)))
  return numeric, analytic


# The direction moves only parameters after the last ReLU below the regularised layer's output
# (and the output layer): the loss is smooth along it. Along a direction through a ReLU,
# units switching sign make central differences converge only linearly in eps (a kink per
# switch), too slowly for float32.
SMOOTH = {-1: ("['layer_1']['linear2']", "['layer_1']['norm2']", "['output']"),
          1: ("['layer_0']['linear2']", "['layer_0']['norm2']")}


@pytest.mark.parametrize("layer", [1, -1])
def test_gradient_matches_finite_differences(layer):
  config, _, data = tiny_batch()
  options = tree.TreeOptions(layer=layer, dims=0.5)
  model = TransformerLM(config)
  params = init_params(config, jax.random.PRNGKey(0))
  objective = objectives.from_config({})
  idx = jnp.arange(data["inputs"].shape[0])
  loss = lambda prm, lam: step.total_loss(prm, model, objective, (options,), (lam,),
                                          data["inputs"], data["targets"], None, data, idx)
  rng = np.random.default_rng(0)
  direction = jax.tree_util.tree_map_with_path(
      lambda path, x: (rng.normal(size=x.shape).astype(np.float32)
                       if jax.tree_util.keystr(path).startswith(SMOOTH[layer])
                       else np.zeros(x.shape, np.float32)), params)
  # The penalty alone (through the model), then the whole training loss (layer -1: the LM loss
  # is smooth along the direction too).
  numeric, analytic = _directional(lambda prm: loss(prm, jnp.float32(1.0))[1][1][0], params,
                                   direction, 1e-3)
  assert abs(analytic) > 1e-2 and numeric == pytest.approx(analytic, rel=1e-2)
  if layer == -1:
    numeric, analytic = _directional(lambda prm: loss(prm, jnp.float32(0.8))[0], params,
                                     direction, 1e-3)
    assert numeric == pytest.approx(analytic, rel=1e-2)


def test_loss_gradient_in_the_states_matches_finite_differences():
  rng = np.random.default_rng(3)
  words = jnp.asarray(rng.normal(size=(2, 6, 4)), jnp.float32)
  nodes = jnp.asarray(tree.gold_nodes([((("a", "b"), "c"), (("d", "e"), "f")),
                                       ("a", ("b", ("c", ("d", "e"))))]))
  for normalise in (False, True):
    f = lambda w: tree.treereg_loss(tree.scin_chart(w, normalise), nodes)[0]
    for _ in range(3):
      direction = jnp.asarray(rng.normal(size=words.shape), jnp.float32)
      numeric, analytic = _directional(f, words, direction, 1e-3)
      assert abs(analytic) > 1e-3 and numeric == pytest.approx(analytic, rel=1e-2, abs=1e-4)


def run(tiny_config, tmp_path, name, **fields):
  config = tiny_config(**{"train.num_steps": 10, "eval.every": 10, "checkpoint.every": 10,
                          **fields})
  workdir = str(tmp_path / name)
  train.train_and_evaluate(config, workdir)
  return workdir, metric_logging.read_table(os.path.join(workdir, "metrics.csv"))


def checkpoint_params(workdir):
  """[S, P] every seed's flat parameters of the latest checkpoint."""
  p = checkpointing.restore(workdir).state["params"]
  leaves = jax.tree_util.tree_leaves(p)
  return np.concatenate([np.asarray(x).reshape(x.shape[0], -1) for x in leaves], axis=1)


@pytest.mark.slow
def test_lambda_zero_per_seed_group_and_with_sas(tiny_config, tmp_path):
  """lambda 0 = bit-identical to no term; a seed of a mixed-strength group = that seed trained
  alone (1e-5); tree and sas together log both penalties; packed = padded."""
  plain, plain_rows = run(tiny_config, tmp_path, "plain")
  zero, _ = run(tiny_config, tmp_path, "zero", **{"tree.lambdas": (0.0, 0.0)})
  np.testing.assert_array_equal(run_params(plain), run_params(zero))
  mixed, rows = run(tiny_config, tmp_path, "mixed", **{
      "tree.lambdas": (1.0, -1.0), "tree.starts": (0, 4)})
  alone, _ = run(tiny_config, tmp_path, "alone", **{
      "first_seed": 1, "num_seeds": 1, "tree.lambdas": (-1.0,), "tree.starts": (4,)})
  p_mixed = checkpoint_params(mixed)
  np.testing.assert_allclose(p_mixed[1], checkpoint_params(alone)[0], atol=1e-5)
  assert not np.allclose(p_mixed[0], checkpoint_params(plain)[0], atol=1e-4)
  tree_rows = [r for r in rows if r["name"] == "train/tree_loss"]
  assert len(tree_rows) == 2 and all(0 < r["value"] < 10 for r in tree_rows)
  assert not [r for r in plain_rows if r["name"] == "train/tree_loss"]
  both, both_rows = run(tiny_config, tmp_path, "both", **{
      "tree.lambdas": (1.0, -1.0), "tree.starts": (0, 4), "sas.lambdas": (0.5,)})
  names = {r["name"] for r in both_rows}
  assert {"train/tree_loss", "train/sas_loss"} <= names
  assert not np.allclose(checkpoint_params(both), p_mixed, atol=1e-4)
  packed, _ = run(tiny_config, tmp_path, "packed", **{
      "tree.lambdas": (1.0, -1.0), "tree.starts": (0, 4), "train.packing": True})
  np.testing.assert_allclose(checkpoint_params(packed), p_mixed, atol=2e-5)


def test_bad_tree_config_is_refused(tiny_config):
  with pytest.raises(ValueError, match=r"tree.lambdas needs one value or one per seed"):
    config_checks.validate(tiny_config(**{"tree.lambdas": (0.1, 0.2, 0.3)}))
  with pytest.raises(ValueError, match=r"tree.layer must be -1 \(last\) or in 1..1"):
    config_checks.validate(tiny_config(**{"tree.layer": 2}))
  with pytest.raises(ValueError, match=r"tree.dims must be in \(0, 1\]"):
    config_checks.validate(tiny_config(**{"tree.dims": 0.01}))
  with pytest.raises(ValueError, match="dyck task has no gold trees"):
    config_checks.validate(tiny_config(task="dyck", **{"tree.lambdas": (0.1,)}))
  config_checks.validate(tiny_config(task="dyck"))  # lambda 0: nothing is built, no refusal
  for name in objectives.names():  # every registered objective that is not causal
    config = tiny_config(**{"objective": name, "tree.lambdas": (0.1,)})
    if objectives.from_config(config).attention != "causal":
      with pytest.raises(ValueError, match="assumes a causal LM"):
        config_checks.validate(config)


def test_report_groups_give_threshold_steps_and_tree_metrics(tmp_path):
  """A dose-response run's seed groups (`report.groups`): labels keep the section where two
  per-seed fields share a name, the first step above the threshold per group (seeds that never
  get there left out), and the in-domain loss, tscore and tree loss among the compared metrics."""
  workdir = tmp_path / "dose"
  os.makedirs(workdir)
  tree_l, sas_l = [0.0, 0.0, 0.1, 0.1], [0.0, 0.01, 0.0, 0.01]
  with open(workdir / "config.json", "w") as f:
    json.dump({"task": "question", "num_seeds": 4, "first_seed": 0,
               "model": {"num_layers": 2}, "tree": {"lambdas": tree_l},
               "sas": {"lambdas": sas_l}}, f)
  reach = {0: 300, 1: None, 2: 100, 3: 200}  # first step with generalisation > 0.8
  metrics, analysis = [], []
  for seed in range(4):
    for step in range(0, 501, 100):
      gen = 0.9 if reach[seed] is not None and step >= reach[seed] else 0.8  # 0.8 is not above
      metrics += [(step, seed, "out_of_domain/accuracy", gen),
                  (step, seed, "in_domain/loss", 1.0 + seed),
                  (step, seed, "train/tree_loss", 0.5)]
      analysis.append((step, seed, "tscore", 0.1 * seed))
  for name, rows in (("metrics.csv", metrics), ("analysis.csv", analysis)):
    with open(workdir / name, "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(["step", "seed", "name", "value"])
      w.writerows(rows)
  run = report.load_run(str(workdir))
  found = groups.seed_groups(run)
  assert list(found) == ["tree.lambdas=0.0, sas.lambdas=0.0", "tree.lambdas=0.0, sas.lambdas=0.01",
                         "tree.lambdas=0.1, sas.lambdas=0.0", "tree.lambdas=0.1, sas.lambdas=0.01"]
  by_tree = {"0.0": [0, 1], "0.1": [2, 3]}
  table = {r["group"]: r for r in group_stats.group_rows(run, by_tree, threshold=0.8)}
  assert table["0.0"]["gen_above_seeds"] == "1/2" and table["0.0"]["gen_above_step"] == 300
  assert table["0.1"]["gen_above_seeds"] == "2/2" and table["0.1"]["gen_above_step"] == 150
  assert table["0.1"]["in_domain/loss"] == pytest.approx(3.5)
  assert table["0.1"]["tscore"] == pytest.approx(0.25)
  assert table["0.0"]["train/tree_loss"] == pytest.approx(0.5)
  md = "\n".join(group_markdown.markdown_lines(list(table.values())))
  # the first crossing as a Kaplan-Meier median (seed 1 censored): 300 for tree 0.0, and for
  # tree 0.1 (crossings 100, 200) the first step where half have crossed, 100
  assert (table["0.0"]["gen_crossing_median"], table["0.1"]["gen_crossing_median"]) == (300, 100)
  assert "first step gen. > 0.8: Kaplan-Meier median [95% CI] | seeds that cross" in md
  assert "| 1/2 |" in md and "tscore (final): mean [95% t-CI, n=2]" in md
  result = report.build_report(str(workdir))
  assert any(p.endswith("groups_dose.png") for p in result["figures"])
