"""The objective and loss-term registries and the one training body (sg_jax/objectives,
sg_jax/terms, sg_jax/step.py; docs/objectives.md): a toy objective and a toy term registered
from a test module train through the loop with per-seed strengths, and SAS through the generic
body equals the regularised loss written out by hand.

The masked-LM (`mlm`) and prefix-LM (`prefix_lm`) objectives and the attention they set
(sg_jax/objectives/mlm.py, prefix_lm.py, sg_jax/models/attention_masks.py): BERT masking statistics
within sampling error, masks on hand-built lines, attention that never crosses lines in packed
rows, and training equal padded / packed and grouped / alone.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from sg_jax import checkpointing, configlib, objectives, step, tasks, terms, train, step as step_lib
from sg_jax.analysis import uas
from sg_jax.config import checks as config_checks
from sg_jax.data import packing, input_pipeline
from sg_jax.models import attention_masks
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM, INTERMEDIATES, init_params
from sg_jax.records import metric_logging
from sg_jax.terms import sas, tree as tree_term
from sg_jax.training import state as train_state
from sg_jax.training.state import seed_keys

import toy_config  # pylint: disable=wrong-import-order  (tests/ is on the path)
from conftest import TEST_SIZED_FLAGS  # pylint: disable=wrong-import-order
import toy_training


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)


def test_previous_token_lines_on_a_hand_built_batch():
  inputs = jnp.asarray([[5, 7, 9, 0, 0], [5, 8, 0, 0, 0]], jnp.int32)
  lengths = jnp.asarray([3, 2], jnp.int32)
  got_in, got_t = toy_training.PreviousToken().lines(inputs, inputs, lengths, None)
  np.testing.assert_array_equal(got_in, inputs)
  np.testing.assert_array_equal(got_t, [[0, 5, 7, 0, 0], [0, 5, 0, 0, 0]])


def test_registries_refuse_unknown_and_clashing_names(tiny_config):
  assert {"lm", "prev_token"} <= set(objectives.names())
  assert {"sas", "l2"} <= set(terms.names())
  with pytest.raises(ValueError, match=r"objective 'mlmx' is not registered \(registered: lm"):
    config_checks.validate(tiny_config(objective="mlmx"))

  class Other(objectives.Objective):
    name = "lm"
  with pytest.raises(ValueError, match="objective 'lm' is already registered"):
    objectives.register(Other)

  class Nameless(terms.LossTerm):
    pass
  with pytest.raises(ValueError, match="has no name"):
    terms.register(Nameless)
  config = tiny_config()
  config.l2 = toy_training.L2.default_section()
  config.l2.lambdas = (0.1, 0.2, 0.3)
  with pytest.raises(ValueError, match=r"l2.lambdas needs one value or one per seed: got 3 "
                                       r"values for 2 seeds"):
    config_checks.validate(config)
  config.l2.lambdas, config.l2.ends = (0.1,), (-1,)
  with pytest.raises(ValueError, match="l2.starts and l2.ends must be >= 0"):
    config_checks.validate(config)
  config.l2.ends, config.l2.scale = (0,), -1.0
  with pytest.raises(ValueError, match="l2.scale must be > 0"):
    config_checks.validate(config)


def test_strengths_and_windows_per_seed(tiny_config):
  config = tiny_config(**{"sas.lambdas": (0.5, -0.5), "sas.starts": (0, 4), "sas.ends": (0, 9)})
  (term,) = terms.active(config)
  arrays = terms.seed_arrays(term, terms.schedules_from_config(config)["sas"])
  lam = lambda t: np.asarray(terms.lambdas_at(arrays, term, 2, jnp.int32(t)))
  np.testing.assert_array_equal(lam(0), [0.5, 0.0])
  np.testing.assert_array_equal(lam(4), [0.5, -0.5])
  np.testing.assert_array_equal(lam(9), [0.5, 0.0])
  assert terms.active(tiny_config()) == ()  # every lambda 0: nothing is built
  schedule = terms.schedules_from_config(config)["sas"]
  np.testing.assert_array_equal(schedule.ends, [terms.base.NO_END, 9])  # end 0 = no end
  assert terms.lambdas_per_seed({"sas": schedule})["sas.lambda"].tolist() == [0.5, -0.5]


def test_a_term_section_is_built_from_the_options_the_term_declares():
  """`default_section` = the generic fields (lambda 0: off) + each dataclass field's default;
  the built-in terms' sections of the shared config equal it (configlib restates them only
  because the term modules import JAX and config files must not)."""
  assert dict(toy_training.L2.default_section()) == {"lambdas": (0.0,), "starts": (0,),
                                                    "ends": (0,), "scale": 1.0}
  assert dict(sas.SasOptions.default_section()) == {
      "lambdas": (0.0,), "starts": (0,), "ends": (0,), "variant": "sum", "p": 1.0,
      "direction": "both"}
  config = configlib.base_config("question")
  for term in (sas.SasOptions, tree_term.TreeOptions):  # the built-in terms
    assert config[term.name].to_dict() == term.default_section().to_dict(), term.name


def _toy_run(workdir, data_dir, lambdas):
  config = toy_training_config(data_dir, **{"train.num_steps": 20, "eval.every": 20,
                                            "checkpoint.every": 20})
  config.l2.lambdas = lambdas
  train.train_and_evaluate(config, workdir)
  rows = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  p = checkpointing.restore(workdir).state["params"]
  flat = np.concatenate([np.asarray(x).reshape(x.shape[0], -1)
                         for x in jax.tree_util.tree_leaves(p)], axis=1)
  return rows, flat


def toy_training_config(data_dir, **fields):
  config = toy_config.get_config(str(data_dir))
  for field, value in fields.items():
    configlib.set_field(config, field, value)
  return config


@pytest.mark.slow
def test_toy_objective_and_term_train_with_per_seed_strengths(tiny_data, tmp_path):
  """prev_token trains (its loss falls); l2 with lambda 0 for seed 0 and 0.05 for
  seed 1: seed 0 equals the run without the term, seed 1 ends with smaller weights."""
  rows, with_l2 = _toy_run(str(tmp_path / "l2"), tiny_data, (0.0, 0.05))
  plain_rows, plain = _toy_run(str(tmp_path / "plain"), tiny_data, (0.0,))
  np.testing.assert_allclose(with_l2[0], plain[0], rtol=0, atol=1e-6)
  assert np.linalg.norm(with_l2[1]) < np.linalg.norm(plain[1]) - 0.1
  l2 = {(r["step"], r["seed"]): r["value"] for r in rows if r["name"] == "train/l2_loss"}
  assert sorted(l2) == [(10, 0), (10, 1), (20, 0), (20, 1)]
  assert l2[(20, 1)] == pytest.approx(np.sum(with_l2[1] ** 2), rel=0.05)
  assert not [r for r in plain_rows if r["name"] == "train/l2_loss"]
  loss = {(r["step"], r["seed"]): r["value"] for r in plain_rows if r["name"] == "train/loss"}
  assert loss[(20, 0)] < loss[(10, 0)]  # the prev_token loss falls


@pytest.mark.slow
def test_toy_objective_through_main(tiny_data, tmp_path):
  """`python -m sg_jax.main --config=tests/toy_config.py:DATA` trains with the user's objective
  and term (registered by the config file's import)."""
  workdir = str(tmp_path / "run")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run(
      [sys.executable, "-m", "sg_jax.main", f"--config=tests/toy_config.py:{tiny_data}",
       f"--workdir={workdir}", "--config.train.num_steps=10", "--config.eval.every=10",
       "--config.checkpoint.every=10", *TEST_SIZED_FLAGS], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  l2 = {r["seed"]: r["value"] for r in rows if r["name"] == "train/l2_loss"}
  assert sorted(l2) == [0, 1] and all(v > 0 for v in l2.values())
  assert '"objective": "prev_token"' in open(os.path.join(workdir, "config.json")).read()


@pytest.mark.slow
def test_sas_through_the_body_equals_the_hand_written_regularised_loss():
  """One seed's step: `step.loss_and_grads` with the SAS term = value_and_grad of `LM loss +
  lambda * penalty` written out as the regulariser was before the body was shared."""
  task = tasks.get_task("question")
  vocab = task.vocab()
  examples = task.generate_examples(seed=5, sizes={"train": 4, "dev": 2, "test": 2, "gen": 2})
  lines = [(vocab.encode(ex.words), task.gold_dependencies(ex)) for ex in examples["train"]]
  batch = uas.line_batches(lines, sos_id=vocab.sos_id, batch_size=4)[0]
  targets = np.zeros_like(batch["inputs"])
  targets[:, :-1] = batch["inputs"][:, 1:]
  data = {"inputs": jnp.asarray(batch["inputs"]), "targets": jnp.asarray(targets),
          "lengths": jnp.asarray((batch["inputs"] != 0).sum(1), jnp.int32),
          "dep_head": jnp.asarray(batch["dep_head"])}
  config = ModelConfig(vocab_size=vocab.size, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                       max_len=64)
  model = TransformerLM(config)
  params = init_params(config, jax.random.key(0))
  key_data, t, lam = jax.random.key_data(jax.random.key(3)), jnp.int32(7), jnp.float32(0.3)
  options = sas.SasOptions(variant="sum", p=2.0)
  idx = jnp.arange(4, dtype=jnp.int32)
  (loss, (pen,), _), grads = step.loss_and_grads(params, key_data, data, idx, t, model,
                                              objectives.from_config({}), (options,), (lam,))

  def by_hand(prm):
    dropout = jax.random.fold_in(jax.random.fold_in(jax.random.wrap_key_data(key_data),
                                                    train_state.DROPOUT_KEY), t)
    logits, state = model.apply({"params": prm}, data["inputs"], deterministic=False,
                                rngs={"dropout": dropout}, mutable=[INTERMEDIATES])
    sown = state[INTERMEDIATES]
    att = jnp.stack([sown[f"layer_{i}"]["attention"]["attention"][0] for i in range(2)])
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), data["targets"][..., None], -1)[..., 0]
    mask = data["targets"] != 0
    lm = jnp.sum(jnp.where(mask, ce, 0.0)) / jnp.sum(mask)
    p = sas.penalty(att, data["dep_head"], options)[0]
    return lm + lam * p, (lm, p)

  (_, (lm_want, pen_want)), grads_want = jax.value_and_grad(by_hand, has_aux=True)(params)
  assert float(loss) == pytest.approx(float(lm_want), rel=1e-6)
  assert float(pen) == pytest.approx(float(pen_want), rel=1e-6) and float(pen) > 0
  for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_want)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_bidirectional_attention_sees_its_whole_line_only_padded_and_packed():
  """With attention='bidirectional' a line's logits do not depend on the padding after it nor,
  in a packed row, on the other lines; and they depend on later tokens (unlike causal)."""
  cfg = ModelConfig(vocab_size=12, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_len=16,
                    attention="bidirectional", dropout=0.0)
  model = TransformerLM(cfg)
  params = init_params(cfg, jax.random.key(1))
  lines = jnp.asarray([[3, 4, 5, 0, 0, 0], [6, 7, 0, 0, 0, 0], [8, 9, 10, 11, 0, 0]], jnp.int32)
  lengths = jnp.asarray([3, 2, 4], jnp.int32)
  padded = model.apply({"params": params}, lines)
  wider = model.apply({"params": params}, jnp.pad(lines, ((0, 0), (0, 4))))
  np.testing.assert_allclose(padded, wider[:, :6], atol=1e-5)
  rows = packing.pack_lines(lines, lines, lengths, jnp.arange(3), 12)
  packed = model.apply({"params": params}, rows.pop("inputs"), positions_BxL=rows["positions_BxL"],
                       token_ids_BxL=rows["token_ids_BxL"], lines=rows["lines"])[0]
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
  for j, (s, n) in enumerate(zip(starts, lengths)):
    np.testing.assert_allclose(packed[s:s + n], padded[j, :n], atol=1e-5)
  changed = lines.at[0, 2].set(9)  # a later token changes the first position's logits
  assert not np.allclose(model.apply({"params": params}, changed)[0, 0], padded[0, 0], atol=1e-4)
  causal = TransformerLM(ModelConfig(**{**cfg.__dict__, "attention": "causal"}))
  np.testing.assert_allclose(causal.apply({"params": params}, changed)[0, 0],
                             causal.apply({"params": params}, lines)[0, 0], atol=1e-6)


QUEST, DECL = 9, 10  # task-token ids of the hand-built lines below


def _mlm(num_words=60, mask_id=71):
  return objectives.mlm.MaskedLanguageModeling(mask_id=mask_id, num_words=num_words)


def test_mlm_masking_statistics_are_berts_within_sampling_error():
  """15% of the words selected (SOS and padding never), of those 80% [MASK], 10% a random word
  (uniform over the words), 10% unchanged: binomial tests at the 1e-4 level on 200k words."""
  objective = _mlm()
  n, length = 4000, 60
  rng = np.random.default_rng(0)
  lengths = rng.integers(10, length + 1, n)
  pos = np.arange(length)[None, :]
  inputs = np.where(pos < lengths[:, None], rng.integers(1, 61, (n, length)), 0)
  inputs[:, 0] = 72  # SOS
  got_in, got_t = jax.jit(objective.lines)(jnp.asarray(inputs, jnp.int32),
                                           jnp.zeros((n, length), jnp.int32),
                                           jnp.asarray(lengths, jnp.int32), jax.random.key(3))
  got_in, got_t = np.asarray(got_in), np.asarray(got_t)
  words = (pos >= 1) & (pos < lengths[:, None])
  selected = got_t != 0
  assert not np.any(selected & ~words)  # SOS and padding never scored
  np.testing.assert_array_equal(got_t[selected], inputs[selected])
  np.testing.assert_array_equal(got_in[~selected], inputs[~selected])  # the rest untouched

  def check(k, total, p):
    assert scipy.stats.binomtest(int(k), int(total), p).pvalue > 1e-4, (k, total, p)

  check(selected.sum(), words.sum(), 0.15)
  masked = got_in[selected] == objective.mask_id
  same = got_in[selected] == inputs[selected]
  check(masked.sum(), selected.sum(), 0.8)
  # a random word equals the original 1/60 of the time: "unchanged" = 10% + 10% / 60
  check(same.sum(), selected.sum(), 0.1 + 0.1 / 60)
  replaced = got_in[selected][~masked & ~same]
  assert replaced.min() >= 1 and replaced.max() <= 60
  # uniform over the 60 words (chi-square on the replacements)
  counts = np.bincount(replaced, minlength=61)[1:]
  assert scipy.stats.chisquare(counts).pvalue > 1e-4
  # the draws are a pure function of the key
  again = objective.lines(jnp.asarray(inputs, jnp.int32), jnp.zeros((n, length), jnp.int32),
                          jnp.asarray(lengths, jnp.int32), jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(again[0]), got_in)


def test_prefix_lm_scores_the_output_only():
  objective = objectives.prefix_lm.PrefixLanguageModeling(task_ids=(QUEST, DECL))
  inputs = jnp.asarray([[70, 3, 4, QUEST, 5, 6, 0], [70, 7, DECL, 8, 0, 0, 0]], jnp.int32)
  targets = jnp.asarray([[3, 4, QUEST, 5, 6, 71, 0], [7, DECL, 8, 71, 0, 0, 0]], jnp.int32)
  got_in, got_t = objective.lines(inputs, targets, jnp.asarray([6, 4]), None)
  np.testing.assert_array_equal(got_in, inputs)
  # from the task token on: its target is the output's first word
  np.testing.assert_array_equal(got_t, [[0, 0, 0, 5, 6, 71, 0], [0, 0, 8, 71, 0, 0, 0]])


def test_line_masks_on_a_hand_built_line():
  tokens = jnp.asarray([[70, 3, QUEST, 5, 6, 0]], jnp.int32)
  real = tokens != 0
  causal = np.tril(np.ones((6, 6), bool))
  np.testing.assert_array_equal(attention_masks.line_mask("causal", tokens, real)[0, 0], causal)
  bidi = attention_masks.line_mask("bidirectional", tokens, real)[0, 0]
  np.testing.assert_array_equal(bidi, np.broadcast_to([1, 1, 1, 1, 1, 0], (6, 6)).astype(bool))
  prefix = np.asarray(attention_masks.line_mask("prefix", tokens, real, (QUEST,))[0, 0])
  # SOS, 3 and quest see each other; 5 and 6 see the prefix and themselves causally
  want = causal.copy()
  want[:, :3] = True
  np.testing.assert_array_equal(prefix, want)
  # a line without a task token is all prefix: bidirectional for its real queries
  none = jnp.asarray([[70, 3, 4, 0]], jnp.int32)
  np.testing.assert_array_equal(
      attention_masks.line_mask("prefix", none, none != 0, (QUEST,))[0, 0, :3],
      attention_masks.line_mask("bidirectional", none, none != 0)[0, 0, :3])
  with pytest.raises(ValueError, match="prefix attention needs"):
    attention_masks.line_mask("prefix", tokens, real, ())


@pytest.mark.parametrize("attention", ["prefix", "bidirectional"])
def test_packed_rows_equal_padded_lines(attention):
  """Attention never crosses lines in a packed row, in either direction."""
  cfg = ModelConfig(vocab_size=12, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_len=16,
                    attention=attention, dropout=0.0,
                    prefix_end_ids=(QUEST,) if attention == "prefix" else ())
  model = TransformerLM(cfg)
  params = init_params(cfg, jax.random.key(1))
  lines = jnp.asarray([[3, 4, QUEST, 5, 0, 0], [6, QUEST, 0, 0, 0, 0],
                       [8, QUEST, 10, 11, 7, 0]], jnp.int32)
  lengths = jnp.asarray([4, 2, 5], jnp.int32)
  padded = model.apply({"params": params}, lines)
  rows = packing.pack_lines(lines, lines, lengths, jnp.arange(3), 12)
  packed = model.apply({"params": params}, rows.pop("inputs"),
                       positions_BxL=rows["positions_BxL"], token_ids_BxL=rows["token_ids_BxL"],
                       lines=rows["lines"])[0]
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
  for j, (s, n) in enumerate(zip(starts, lengths)):
    np.testing.assert_allclose(packed[s:s + n], padded[j, :n], atol=1e-5)
  if attention == "prefix":
    # a change after the task token leaves the prefix's logits alone, one before it does not
    later = model.apply({"params": params}, lines.at[0, 3].set(6))
    np.testing.assert_allclose(later[0, :3], padded[0, :3], atol=1e-6)
    earlier = model.apply({"params": params}, lines.at[0, 1].set(6))
    assert not np.allclose(earlier[0, 0], padded[0, 0], atol=1e-4)


def _flat(tree):
  return np.concatenate([np.asarray(x).reshape(-1) for x in jax.tree_util.tree_leaves(tree)])


def _train_params(config, vocab, split, seeds, steps):
  data_options = input_pipeline.DataOptions.from_config(config)
  host, capacities = input_pipeline.make_train_data(data_options, split, len(seeds))
  fns = step_lib.train_fns_from_config(config, vocab.size, capacities)
  state = fns.init(seed_keys(seeds))
  state = fns.chunk(state, jax.tree_util.tree_map(jnp.asarray, host), jnp.asarray(0, jnp.int32),
                    steps)
  return jax.device_get(state.params), jax.device_get(state.sums)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm", "prefix_lm"])
def test_training_padded_equals_packed_and_grouped_equals_alone(objective, tiny_config,
                                                                 tmp_path):
  config = tiny_config(objective=objective)
  data_options = input_pipeline.DataOptions.from_config(config)
  _, vocab, splits = input_pipeline.load_data(data_options, str(tmp_path))
  padded, sums = _train_params(config, vocab, splits["train"], [0, 1], 20)
  config.train.packing = True
  packed, _ = _train_params(config, vocab, splits["train"], [0, 1], 20)
  np.testing.assert_allclose(_flat(packed), _flat(padded), atol=2e-5, rtol=0)
  config.train.packing = False
  alone, _ = _train_params(config, vocab, splits["train"], [1], 20)
  np.testing.assert_allclose(_flat(jax.tree_util.tree_map(lambda x: x[1], padded)),
                             _flat(jax.tree_util.tree_map(lambda x: x[0], alone)), atol=1e-5,
                             rtol=0)
  if objective == "mlm":  # the [MASK] row, and the masked accuracy summed per step
    assert padded["embedding"]["embedding"].shape[1] == vocab.size + 1
    assert np.all((sums["masked_accuracy"] >= 0) & (sums["masked_accuracy"] <= 20))


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm", "prefix_lm"])
def test_a_run_logs_the_objectives_metrics_and_the_preference(objective, tiny_config, tmp_path):
  from sg_jax.records import metric_logging
  from sg_jax import train
  config = tiny_config(objective=objective, **{"eval.preference_lines": 24,
                                               "train.num_steps": 20, "eval.every": 20})
  train.train_and_evaluate(config, str(tmp_path), tensorboard=False)
  rows = metric_logging.read_table(str(tmp_path / "metrics.csv"))
  names = {r["name"] for r in rows}
  for split in ("in_domain", "out_of_domain"):
    assert {f"{split}/loss", f"{split}/preference"} <= names
  assert "out_of_domain/preference_vs_move_first" in names
  assert "in_domain/preference_vs_move_first" not in names  # in-domain: move-first is right
  values = [r["value"] for r in rows if "preference" in r["name"]]
  assert values and all(0.0 <= v <= 1.0 for v in values)
  if objective == "mlm":
    assert {"train/masked_accuracy", "in_domain/masked_accuracy"} <= names
    assert "in_domain/accuracy" not in names  # no teacher-forced task metric for a masked LM
  else:
    assert "in_domain/accuracy" in names
