"""The SAS regulariser (sg_jax/terms/sas.py; docs/sas.md): penalty on hand-built attention, its
gradient against finite differences, lambda 0, per-seed lambdas in a group, windows and packing."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import objectives, step, tasks, terms, train
from sg_jax.analysis import uas
from sg_jax.config import checks as config_checks
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM, init_params
from sg_jax.records import metric_logging
from sg_jax.terms import sas

from run_files import params as run_params


def test_penalty_on_hand_built_attention():
  # One line, L = 5, arcs: 1 -> 2 (dependent first: row 2 reads column 1), 4 -> 2 (head first:
  # row 4 reads column 2). Two layers x one head.
  heads = jnp.array([[-1, 2, -1, -1, 2]], jnp.int32)
  att = np.zeros((2, 1, 1, 5, 5), np.float32)
  att[0, 0, 0, 2, 1], att[1, 0, 0, 2, 1] = 0.5, 0.25
  att[0, 0, 0, 4, 2], att[1, 0, 0, 4, 2] = 0.1, 0.3
  att = jnp.asarray(att)
  pen = lambda **kw: float(sas.penalty(att, heads, sas.SasOptions(**kw))[0])
  assert pen() == pytest.approx(((0.5 + 0.25) + (0.1 + 0.3)) / 2)
  assert pen(variant="max") == pytest.approx((0.5 + 0.3) / 2)
  assert pen(p=2.0) == pytest.approx((np.hypot(0.5, 0.25) + np.hypot(0.1, 0.3)) / 2, rel=1e-6)
  assert pen(direction="head") == pytest.approx(0.1 + 0.3)  # 4 -> 2: the dependent's row
  assert pen(direction="children") == pytest.approx(0.5 + 0.25)  # 1 -> 2: the head's row
  assert sas.penalty(att, jnp.full((1, 5), -1), sas.SasOptions())[0] == 0.0


def tiny_batch():
  task = tasks.get_task("question")
  vocab = task.vocab()
  data = task.generate_examples(seed=5, sizes={"train": 4, "dev": 2, "test": 2, "gen": 2})
  lines = [(vocab.encode(ex.words), task.gold_dependencies(ex)) for ex in data["train"]]
  batch = uas.line_batches(lines, sos_id=vocab.sos_id, batch_size=4)[0]
  targets = np.zeros_like(batch["inputs"])
  targets[:, :-1] = batch["inputs"][:, 1:]
  config = ModelConfig(vocab_size=vocab.size, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                       max_len=64)
  return config, batch, targets


@pytest.mark.parametrize("variant,p", [("sum", 1.0), ("max", 1.0), ("sum", 3.0)])
def test_gradient_matches_finite_differences(variant, p):
  config, batch, targets = tiny_batch()
  model = TransformerLM(config)
  params = init_params(config, jax.random.PRNGKey(0))
  options = sas.SasOptions(variant=variant, p=p)

  objective = objectives.from_config({})
  data, idx = {"dep_head": batch["dep_head"]}, jnp.arange(batch["inputs"].shape[0])
  loss = lambda prm, lam: step.total_loss(prm, model, objective, (options,), (lam,),
                                          batch["inputs"], targets, None, data, idx)

  def f(prm):
    return loss(prm, jnp.float32(-0.7))[0]

  grads = jax.grad(f)(params)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(0)
  direction = jax.tree_util.tree_unflatten(
      treedef, [rng.normal(size=x.shape).astype(np.float32) for x in leaves])
  eps = 1e-2
  shifted = lambda s: jax.tree_util.tree_map(lambda x, d: x + s * eps * d, params, direction)
  numeric = (float(f(shifted(1.0))) - float(f(shifted(-1.0)))) / (2 * eps)
  analytic = sum(float(jnp.vdot(g, d)) for g, d in zip(jax.tree_util.tree_leaves(grads),
                                                        jax.tree_util.tree_leaves(direction)))
  assert numeric == pytest.approx(analytic, rel=2e-2)
  # The penalty's own gradient is not negligible in that check.
  pen_only = jax.grad(lambda prm: loss(prm, jnp.float32(1.0))[1][1][0])(params)
  assert optax_norm(pen_only) > 1e-3


def optax_norm(tree):
  return float(jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree_util.tree_leaves(tree))))


def run(tiny_config, tmp_path, name, **fields):
  config = tiny_config(**{"train.num_steps": 10, "eval.every": 10, "checkpoint.every": 10,
                          "eval.uas_lines": 0, **fields})
  workdir = str(tmp_path / name)
  train.train_and_evaluate(config, workdir)
  table = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  return workdir, table


@pytest.mark.slow
def test_lambda_zero_mixed_group_window_and_packing(tiny_config, tmp_path):
  """lambda 0 = bit-identical to no regulariser; a seed of a mixed-lambda group = that seed
  alone (1e-5); a window leaves the learning-rate schedule alone; packed = padded."""
  plain, plain_rows = run(tiny_config, tmp_path, "plain")
  zero, _ = run(tiny_config, tmp_path, "zero", **{"sas.lambdas": (0.0, 0.0)})
  np.testing.assert_array_equal(run_params(plain), run_params(zero))
  # A regularised group: seed 0 suppressed from step 0, seed 1 promoted from step 4 on.
  mixed, rows = run(tiny_config, tmp_path, "mixed", **{
      "sas.lambdas": (0.5, -0.5), "sas.starts": (0, 4), "sas.variant": "max"})
  alone, _ = run(tiny_config, tmp_path, "alone", **{
      "first_seed": 1, "num_seeds": 1, "sas.lambdas": (-0.5,), "sas.starts": (4,),
      "sas.variant": "max"})
  p_mixed = checkpoint_params(mixed)
  np.testing.assert_allclose(p_mixed[1], checkpoint_params(alone)[0], atol=1e-5)
  assert not np.allclose(p_mixed[0], checkpoint_params(plain)[0], atol=1e-4)
  sas_rows = [r for r in rows if r["name"] == "train/sas_loss"]
  assert len(sas_rows) == 2 and all(0 < r["value"] < 4 for r in sas_rows)
  assert not [r for r in plain_rows if r["name"] == "train/sas_loss"]
  # The window changes the loss only: the same learning rates as the unregularised run.
  lr = lambda rs: [(r["step"], r["seed"], r["value"]) for r in rs
                   if r["name"] == "train/learning_rate"]
  assert lr(rows) == lr(plain_rows)
  # Packed rows carry the arcs alike (the same lines, dropout masks and penalty).
  packed, _ = run(tiny_config, tmp_path, "packed", **{
      "sas.lambdas": (0.5, -0.5), "sas.starts": (0, 4), "sas.variant": "max",
      "train.packing": True})
  np.testing.assert_allclose(checkpoint_params(packed), p_mixed, atol=2e-5)


def checkpoint_params(workdir):
  """[S, P] every seed's flat parameters of the latest checkpoint."""
  from sg_jax import checkpointing
  p = checkpointing.restore(workdir).state["params"]
  leaves = jax.tree_util.tree_leaves(p)
  return np.concatenate([np.asarray(x).reshape(x.shape[0], -1) for x in leaves], axis=1)


def test_bad_sas_config_is_refused(tiny_config):
  with pytest.raises(ValueError, match=r"sas.lambdas needs one value or one per seed"):
    config_checks.validate(tiny_config(**{"sas.lambdas": (0.1, 0.2, 0.3)}))
  with pytest.raises(ValueError, match="sas.variant must be one of"):
    config_checks.validate(tiny_config(**{"sas.variant": "mean"}))
  config = tiny_config(task="dyck", **{"sas.lambdas": (0.1,)})
  with pytest.raises(ValueError, match="declares no gold dependencies"):
    terms.train_arrays(terms.active(config), terms.schedules_from_config(config),
                       tasks.from_config(config), [], 8)
