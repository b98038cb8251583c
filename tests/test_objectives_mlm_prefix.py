"""The masked-LM (`mlm`) and prefix-LM (`prefix_lm`) objectives and the attention they set
(sg_jax/objectives/mlm.py, prefix_lm.py, sg_jax/attention_masks.py): BERT masking statistics
within sampling error, masks on hand-built lines, attention that never crosses lines in packed
rows, and training equal padded / packed and grouped / alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from sg_jax import attention_masks, input_pipeline, objectives, packing
from sg_jax import step as step_lib
from sg_jax.model import ModelConfig, TransformerLM, init_params

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
  fns = step_lib.make_train_fns(config, vocab.size, capacities)
  state = fns.init(step_lib.seed_keys(seeds))
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
  from sg_jax import metric_logging, train
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
