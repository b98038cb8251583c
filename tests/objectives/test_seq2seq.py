"""The model seam and `objective=seq2seq` (issue 51 item 4): the model registry, the
encoder-decoder on hand-built lines (its two parts, causality, the decoder's positions, packed
rows), the objective's choices and refusals, tree projections of the encoder against the naive
per-span computation, a seed in a group equal to the seed alone, a resumed run equal to an
uninterrupted one, and `sg_jax.main` end to end."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import checkpointing, models
from sg_jax import objectives
from sg_jax import step as step_lib
from sg_jax import train
from sg_jax.analysis import tree_projection
from sg_jax.data import input_pipeline
from sg_jax.data import packing
from sg_jax.models import attention_masks, intermediates
from sg_jax.models import encoder_decoder
from sg_jax.models.model_config import ModelConfig
from sg_jax.runtime import stop_signal
from sg_jax.training.state import seed_keys
import run_files  # pylint: disable=wrong-import-order  (tests/ is on the path)

VOCAB, SOS, QUEST = 16, 15, 9
SENTENCES = ([3, 4, 5, 6, 7], [1], [2, 5, 3, 1, 4])


@functools.lru_cache(maxsize=None)
def _config(**fields) -> ModelConfig:
  return ModelConfig(vocab_size=VOCAB, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                     max_len=32, dropout=0.0, attention="prefix", prefix_end_ids=(QUEST,),
                     name="encoder_decoder", **fields)


@functools.lru_cache(maxsize=None)
def _params(seed: int = 0):
  return models.init_params(_config(), jax.random.key(seed))


@functools.partial(jax.jit, static_argnames=("decode",))
def _jit_apply(params, tokens, decode=False, **kwargs):
  return models.build(_config()).apply({"params": params}, tokens, decode=decode, **kwargs)


def _apply(tokens, **kwargs):
  return _jit_apply(_params(), jnp.asarray(tokens, jnp.int32), **kwargs)


def test_registry_builds_each_model_and_refuses_unknown_names():
  assert models.names()[:2] == ("transformer_lm", "encoder_decoder")
  assert (models.family("transformer_lm"), models.family("encoder_decoder")) == (
      "decoder", "encoder_decoder")
  assert type(models.build(_config())) is encoder_decoder.EncoderDecoder
  params = _params()
  # encoder layers are the LM's (`layer_<i>`); decoder layers add cross-attention
  assert set(params) == {"embedding", "layer_0", "layer_1", "decoder_layer_0",
                         "decoder_layer_1", "output"}
  assert set(params["decoder_layer_0"]) == {"attention", "cross_attention", "norm1",
                                            "norm_cross", "norm2", "linear1", "linear2"}
  with pytest.raises(ValueError, match="model.name 'rnn' is not a registered model"):
    models.build(_config().__class__(vocab_size=4, name="rnn"))
  with pytest.raises(ValueError, match="already registered"):
    models.register("encoder_decoder", "decoder")(ModelConfig)


def _window(tokens_BxL, key_real_BxL, prefix_end_ids):
  """A token attends to itself and the token before it (a registered attention of the test)."""
  del key_real_BxL, prefix_end_ids
  q, k = jnp.arange(tokens_BxL.shape[1])[:, None], jnp.arange(tokens_BxL.shape[1])[None, :]
  return ((k <= q) & (k >= q - 1))[None, None]


def test_an_objective_supplies_its_own_attention_mask():
  attention_masks.register_attention("window_test", _window)
  attention_masks.register_attention("window_test", _window)  # the same function again: fine
  with pytest.raises(ValueError, match="attention 'window_test' is already registered"):
    attention_masks.register_attention("window_test", lambda *a: None)
  config = ModelConfig(vocab_size=VOCAB, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                       max_len=8, dropout=0.0, attention="window_test")
  tokens = jnp.asarray([[SOS, 3, 4, 5, 6]], jnp.int32)
  _, sown = intermediates.apply_with_intermediates(
      models.build(config), models.init_params(config, jax.random.key(0)), tokens)
  allowed = np.asarray(_window(tokens, tokens != 0, ())[0, 0])
  probs = np.asarray(sown["attention"][0, 0])  # [heads, L, L]
  assert np.all(probs[:, ~allowed] == 0) and np.allclose(probs.sum(-1), 1.0)
  with pytest.raises(ValueError, match="attention must be one of"):
    ModelConfig(vocab_size=4, attention="nowhere")


def test_part_masks_and_decoder_positions_on_hand_built_rows():
  """Padded lines, then the same lines packed into one row (positions restart per line)."""
  tokens = jnp.asarray([[SOS, 3, 4, QUEST, 5, 6, 0], [SOS, 7, QUEST, 8, 0, 0, 0],
                        [SOS, 3, 4, 5, 0, 0, 0]], jnp.int32)
  inputs, outputs = encoder_decoder.part_masks(tokens, tokens != 0, (QUEST,))
  np.testing.assert_array_equal(inputs, [[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0],
                                         [1, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(outputs, [[0, 0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0, 0],
                                          [0, 0, 0, 0, 0, 0, 0]])
  positions = jnp.broadcast_to(jnp.arange(7), (3, 7))
  np.testing.assert_array_equal(
      encoder_decoder.decoder_positions(tokens, positions, (QUEST,)),
      [[0, 1, 2, 0, 1, 2, 3], [0, 1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]])
  row = jnp.asarray([[SOS, 3, 4, QUEST, 5, 6, SOS, 7, QUEST, 8]], jnp.int32)
  row_positions = jnp.asarray([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]], jnp.int32)
  np.testing.assert_array_equal(
      encoder_decoder.decoder_positions(row, row_positions, (QUEST,)),
      [[0, 1, 2, 0, 1, 2, 0, 1, 0, 1]])


def test_encoder_reads_the_input_and_decoder_generates_the_output_causally():
  line = np.asarray([[SOS, 3, 4, QUEST, 5, 6, 7, 0]])
  _, sown = intermediates.apply_with_intermediates(models.build(_config()), _params(),
                                                   jnp.asarray(line))
  logits = _apply(line)
  assert logits.shape == (1, 8, VOCAB) and np.all(np.isfinite(logits))
  # the encoder's states at the input part see the input part only
  _, alone = intermediates.apply_with_intermediates(models.build(_config()), _params(),
                                                    jnp.asarray(line[:, :4]))
  np.testing.assert_allclose(sown["hidden"][:, :, :4], alone["hidden"], atol=1e-5)
  assert sown["hidden"].shape[0] == 3 and sown["attention"].shape[0] == 2  # encoder's
  # the decoder at output position t: unchanged by later output tokens, changed by the input
  later = _apply(np.where(np.arange(8) == 5, 8, line))
  np.testing.assert_allclose(later[0, 3:5], logits[0, 3:5], atol=1e-6)
  assert not np.allclose(later[0, 5:7], logits[0, 5:7], atol=1e-4)
  changed_input = _apply(np.where(np.arange(8) == 1, 8, line))
  assert not np.allclose(changed_input[0, 3], logits[0, 3], atol=1e-4)


def test_packed_rows_equal_padded_lines():
  """The decoder's logits at the output parts and the encoder's states at the input parts of
  packed rows equal the padded lines'."""
  lines = jnp.asarray([[SOS, 3, 4, QUEST, 5, 0], [SOS, 6, QUEST, 0, 0, 0],
                       [SOS, 8, QUEST, 10, 11, 7]], jnp.int32)
  lengths = jnp.asarray([5, 3, 6], jnp.int32)
  padded = _apply(lines)
  rows = packing.pack_lines(lines, lines, lengths, jnp.arange(3), 16)
  kwargs = dict(positions_BxL=rows["positions_BxL"], token_ids_BxL=rows["token_ids_BxL"],
                lines=rows["lines"])
  packed = _apply(rows["inputs"], **kwargs)[0]
  _, sown_padded = intermediates.apply_with_intermediates(models.build(_config()), _params(),
                                                          lines)
  _, sown_packed = intermediates.apply_with_intermediates(models.build(_config()), _params(),
                                                          rows["inputs"], **kwargs)
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
  for j, (s, n) in enumerate(zip(starts, lengths)):
    task = int(np.flatnonzero(np.asarray(lines[j]) == QUEST)[0])
    np.testing.assert_allclose(packed[s + task:s + n], padded[j, task:n], atol=1e-5)
    np.testing.assert_allclose(sown_packed["hidden"][:, 0, s:s + task + 1],
                               sown_padded["hidden"][:, j, :task + 1], atol=1e-5)


def test_seq2seq_objective_picks_its_model_and_refuses_mismatches(tiny_config):
  config = tiny_config(objective="seq2seq")
  objective = objectives.from_config(config)
  model_config = objectives.model_config_from_config(config, 30)
  assert (model_config.name, model_config.attention) == ("encoder_decoder", "prefix")
  assert model_config.prefix_end_ids == objective.task_ids and objective.task_ids
  assert objectives.model_config_from_config(tiny_config(), 30).name == "transformer_lm"
  task, words = objective.task_ids[0], [i for i in range(1, 12) if i not in objective.task_ids]
  inputs = jnp.asarray([[words[0], words[1], task, words[2], words[3]]], jnp.int32)
  targets = jnp.asarray([[words[1], task, words[2], words[3], words[4]]], jnp.int32)
  _, scored = objective.lines(inputs, targets, jnp.asarray([5]), jax.random.key(0))
  np.testing.assert_array_equal(scored, [[0, 0, words[2], words[3], words[4]]])  # output only
  with pytest.raises(ValueError, match="objective 'seq2seq' trains a model of family "
                                       "'encoder_decoder'; model.name 'transformer_lm'"):
    objectives.model_config_from_config(tiny_config(objective="seq2seq",
                                                    **{"model.name": "transformer_lm"}), 30)
  with pytest.raises(ValueError, match="objective 'lm' trains a model of family 'decoder'"):
    objectives.model_config_from_config(tiny_config(**{"model.name": "encoder_decoder"}), 30)
  with pytest.raises(ValueError, match="objective 'seq2seq' needs a task whose lines have an "
                                       "input and an output part"):
    objectives.from_config(tiny_config(task="dyck", objective="seq2seq"))
  with pytest.raises(ValueError, match="no key/value-cached decoding"):
    _apply(np.asarray([[SOS, QUEST]]), decode=True, positions_BxL=jnp.zeros((1, 2), jnp.int32))


def test_output_logprob_and_greedy_decoding_use_the_decoder():
  """log P(output | input) is the decoder's summed log-probabilities of the output tokens; greedy
  decoding continues from the task token with the decoder's argmax."""
  line = np.asarray([[SOS, 3, 4, QUEST, 5, 6, 0]])
  targets = np.asarray([[3, 4, QUEST, 5, 6, 2, 0]])
  apply_fn = lambda t: _apply(t)
  got = objectives.seq2seq.SequenceToSequence.output_logprob(
      apply_fn, jnp.asarray(line), jnp.asarray(targets), jnp.asarray([3]), jnp.asarray([6]))
  logp = jax.nn.log_softmax(_apply(line)[0])
  np.testing.assert_allclose(got[0], logp[3, 5] + logp[4, 6] + logp[5, 2], rtol=1e-5)
  decoded = objectives.seq2seq.SequenceToSequence.greedy_decode(
      apply_fn, jnp.asarray(line), jnp.asarray([3]), 2)
  first = int(jnp.argmax(_apply(line[:, :4])[0, 3]))
  assert int(decoded[0, 3]) == first and np.all(np.asarray(decoded[0, :3]) == 0)
  second = int(jnp.argmax(_apply(np.asarray([[SOS, 3, 4, QUEST, first]]))[0, 4]))
  assert int(decoded[0, 4]) == second


def test_tree_projections_of_the_encoder_equal_the_naive_per_span_computation():
  """The packed span passes (vmapped over 2 seeds) give the charts of one masked forward pass
  per span; and a chart entry equals the cosine of the encoder run on the span `SOS w_i .. w_j`
  alone (original positions) with the span's slice of the whole sentence's pass."""
  config = _config()
  params_s = jax.tree_util.tree_map(lambda *x: jnp.stack(x), _params(0), _params(1))
  out = tree_projection.tree_projection_metrics(
      params_s, SENTENCES, config=config, sos_id=SOS, key=jax.random.key(0), batch_size=2,
      details=True)
  for s, sentence in enumerate(SENTENCES):
    for seed in range(2):
      naive = tree_projection.naive_sci_chart(_params(seed), [SOS] + sentence, config=config)
      np.testing.assert_allclose(out["charts"][s][seed], naive, atol=2e-5)
  last_fn = jax.jit(lambda tokens, positions: intermediates.apply_with_intermediates(
      models.build(config), _params(0), tokens, positions_BxL=positions)[1]["hidden"][-1, 0])
  last = lambda tokens, positions: last_fn(jnp.asarray([tokens]), jnp.asarray([positions]))
  sentence = SENTENCES[0]
  full = last([SOS] + sentence, list(range(len(sentence) + 1)))
  for i, j in ((1, 3), (2, 2)):
    free = last([SOS] + sentence[i:j + 1], [0] + list(range(i + 1, j + 2)))[1:].sum(0)
    ctx = full[i + 1:j + 2].sum(0)
    cosine = float(free @ ctx / (jnp.linalg.norm(free) * jnp.linalg.norm(ctx)))
    np.testing.assert_allclose(out["charts"][0][0][i, j], cosine, atol=2e-5)


def _flat(tree):
  return np.concatenate([np.asarray(x).reshape(-1) for x in jax.tree_util.tree_leaves(tree)])


def _train_params(config, vocab, split, seeds, steps):
  data_options = input_pipeline.DataOptions.from_config(config)
  host, capacities = input_pipeline.make_train_data(data_options, split, len(seeds))
  fns = step_lib.train_fns_from_config(config, vocab.size, capacities)
  state = fns.init(seed_keys(seeds))
  state = fns.chunk(state, jax.tree_util.tree_map(jnp.asarray, host), jnp.asarray(0, jnp.int32),
                    steps)
  return jax.device_get(state.params)


@pytest.mark.slow
def test_seq2seq_seed_in_a_group_equals_the_seed_alone_and_packed_equals_padded(tiny_config,
                                                                              tmp_path):
  config = tiny_config(objective="seq2seq", **{"model.dropout": 0.1})
  data_options = input_pipeline.DataOptions.from_config(config)
  _, vocab, splits = input_pipeline.load_data(data_options, str(tmp_path))
  group = _train_params(config, vocab, splits["train"], [0, 1], 12)
  assert "decoder_layer_0" in group
  alone = _train_params(config, vocab, splits["train"], [1], 12)
  np.testing.assert_allclose(_flat(jax.tree_util.tree_map(lambda x: x[1], group)),
                             _flat(jax.tree_util.tree_map(lambda x: x[0], alone)), atol=1e-5,
                             rtol=0)
  config.train.packing = True
  packed = _train_params(config, vocab, splits["train"], [0, 1], 12)
  np.testing.assert_allclose(_flat(packed), _flat(group), atol=2e-5, rtol=0)


@pytest.mark.slow
def test_seq2seq_run_resumed_after_sigterm_equals_the_uninterrupted_run(tiny_config, tmp_path):
  """Stopped by SIGTERM at step 20 and resumed, a seq2seq run's metrics.csv and parameters
  equal an uninterrupted run's; it logs the task accuracy (greedy decoding) and the
  encoder's UAS."""
  config = tiny_config(objective="seq2seq", **{"eval.uas_lines": 32})
  reference = str(tmp_path / "reference")
  train.train_and_evaluate(config, reference, tensorboard=False)

  workdir = str(tmp_path / "run")
  with pytest.raises(stop_signal.Preempted):
    train.train_and_evaluate(config, workdir, tensorboard=False,
                             state_hook=run_files.sigterm_at(20))
  assert checkpointing.all_steps(workdir)[-1] < 40
  train.train_and_evaluate(config, workdir, tensorboard=False)
  assert run_files.rows(workdir) == run_files.rows(reference)
  np.testing.assert_array_equal(run_files.params(workdir), run_files.params(reference))
  names = {r[2] for r in run_files.rows(workdir)}
  assert {"in_domain/accuracy", "out_of_domain/accuracy", "in_domain/uas"} <= names


@pytest.mark.slow
def test_main_trains_seq2seq_end_to_end_and_the_report_reads_it(tiny_data, tmp_path):
  """`python -m sg_jax.main --config=configs/question.py:tiny,objective=seq2seq`, then
  `sg_jax.report` on its workdir."""
  workdir = str(tmp_path / "run")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  subprocess.run([sys.executable, "-m", "sg_jax.main",
                  "--config=configs/question.py:tiny,objective=seq2seq",
                  f"--config.data.dir={tiny_data}", f"--workdir={workdir}"],
                 check=True, env=env, capture_output=True)
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert '"objective": "seq2seq"' in f.read()
  subprocess.run([sys.executable, "-m", "sg_jax.report", f"--root={workdir}"], check=True,
                 env=env, capture_output=True)
  assert os.path.exists(os.path.join(workdir, "report", "summary.md"))
