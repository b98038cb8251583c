"""Minimal-pair preference (sg_jax/evaluation/minimal_pairs.py): the grammar's foils on hand-built lines, the
encoding of the pairs, the counts on a hand-built score table, a hand-set model of known
preference, and the pseudo-log-likelihood against a naive per-token loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import objectives, tasks
from sg_jax.evaluation import minimal_pairs
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM, init_params
from sg_jax.tasks import question, tense
from sg_jax.tasks.examples import Example

QUESTION = tasks.get_task("question")
VOCAB = QUESTION.vocab()


def _words(text):
  return tuple(text.split())


def test_question_foils_of_a_gen_line():
  decl = _words("her xylophones who our orangutans do entertain don't sleep .")
  correct = _words("don't her xylophones who our orangutans do entertain sleep ?")
  foils = question.question_foils(decl, correct)
  assert foils == {"move_first": _words("do her xylophones who our orangutans entertain don't "
                                        "sleep ?"),
                   "skip_relative": _words("do her xylophones who our orangutans entertain "
                                           "don't sleep ?")}
  # subject relative clause: skip-relative fronts the right auxiliary, so only move-first is a
  # foil; an in-domain line with an object relative clause has a move-last foil only
  decl = _words("my quails that don't move do smile .")
  assert set(question.question_foils(decl, _words("do my quails that don't move smile ?"))) == {
      "move_first"}
  decl = _words("some vulture doesn't confuse her zebra that doesn't high_five my quail .")
  got = question.question_foils(decl, _words("doesn't some vulture confuse her zebra that "
                                             "doesn't high_five my quail ?"))
  assert got == {"move_last": _words("doesn't some vulture doesn't confuse her zebra that "
                                     "high_five my quail ?")}


def test_tense_foils_swap_the_main_verb_only():
  past = _words("my vulture that her orangutans applauded amused the zebra .")
  present = _words("my vulture that her orangutans applaud amuses the zebra .")
  foils = tense.tense_foils(past, present, 6)
  want = _words("my vulture that her orangutans applaud amuse the zebra .")
  assert foils == {"number": want, "attractor": want}
  past = _words("the orangutan applauded your salamanders .")
  foils = tense.tense_foils(past, _words("the orangutan applauds your salamanders ."), 2)
  assert foils == {"number": _words("the orangutan applaud your salamanders .")}
  assert tense.tense_foils(past, past, -1) == {}


def test_pair_lines_encode_each_sentence_as_training_does():
  decl = _words("my quails that don't move do smile .")
  ex = Example(source=decl + ("quest",), target=_words("do my quails that don't move smile ?"),
               transformed=True, task_token="quest")
  identity = Example(source=decl + ("decl",), target=decl, transformed=False, task_token="decl")
  got = minimal_pairs.pair_lines(QUESTION, VOCAB, [identity, ex])
  assert got["inputs"].shape[:2] == (1, 4)  # only the quest line; correct + 3 foil kinds
  np.testing.assert_array_equal(got["pair_valid"][0], [True, True, False, False])
  encoded = VOCAB.encode(ex.source + ex.target)
  n = len(encoded) + 1
  np.testing.assert_array_equal(got["inputs"][0, 0, :n], [VOCAB.sos_id] + encoded)
  np.testing.assert_array_equal(got["targets"][0, 0, :n], encoded + [VOCAB.eos_id])
  assert got["lengths"][0, 0] == n and got["task_pos"][0] == len(ex.source)
  foil = VOCAB.encode(ex.source + _words("don't my quails that move do smile ?"))
  np.testing.assert_array_equal(got["inputs"][0, 1, :n], [VOCAB.sos_id] + foil)
  assert got["construction"][0] == QUESTION.constructions.index("RC-intrans")


def test_preference_sums_on_a_hand_built_table():
  scores = jnp.asarray([[-1.0, -2.0, -3.0],    # beats both
                        [-1.0, -0.5, -3.0],    # loses to foil 1
                        [-1.0, -1.0, 0.0],     # tie with foil 1 (not a win); foil 2 invalid
                        [-1.0, 0.0, 0.0]])     # no valid foil
  valid = jnp.asarray([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)
  sums = minimal_pairs.preference_sums(scores, valid, jnp.ones(4, bool), jnp.asarray([0, 0, 1, 1]),
                                    ("a", "b"), ("x", "y"))
  got = {k: float(v) for k, v in sums.items()}
  assert got == {"wins": 1, "lines": 3, "wins_a": 1, "pairs_a": 3, "wins_b": 2, "pairs_b": 2,
                 "wins@x": 1, "lines@x": 2, "wins@y": 0, "lines@y": 1}
  out = minimal_pairs.summarize(got, ("a", "b"), ("x", "y"))
  assert out["preference"] == pytest.approx(1 / 3) and out["preference_vs_b"] == 1.0
  assert out["preference/x"] == 0.5 and out["preference/y"] == 0.0
  none = minimal_pairs.summarize({**got, "lines": 0.0, "pairs_b": 0.0}, ("a", "b"), ())
  assert np.isnan(none["preference"]) and "preference_vs_b" not in none


def test_a_hand_set_model_prefers_what_it_was_set_to():
  """A 'model' whose next-token log-probabilities favour `do` over every other word by a known
  margin prefers a question fronting `do` and disprefers one fronting `don't`, by exactly the
  margin; a causal objective scores from the task token on."""
  do, dont = VOCAB.id_of("do"), VOCAB.id_of("don't")
  bias = jnp.zeros(VOCAB.size).at[do].set(2.0)
  apply_fn = lambda tokens: jnp.broadcast_to(bias, tokens.shape + (VOCAB.size,))
  decl = _words("my quails that don't move do smile .")
  ex = Example(source=decl + ("quest",), target=_words("do my quails that don't move smile ?"),
               transformed=True, task_token="quest")
  pairs = minimal_pairs.pair_lines(QUESTION, VOCAB, [ex])
  flat = lambda x: jnp.asarray(x[0])
  scores = objectives.from_config({}).sentence_scores(
      apply_fn, flat(pairs["inputs"]), flat(pairs["targets"]),
      jnp.repeat(jnp.asarray(pairs["task_pos"]), 4), flat(pairs["lengths"]), 20)
  logz = float(jax.nn.logsumexp(bias))
  out_len = len(ex.target) + 1  # words + EOS
  # correct: `do` fronted (2 - logz) and the declarative's `do` removed; the move-first foil
  # fronts `don't` and keeps `do` in place: the same words, so the same score.
  correct = 2.0 + (out_len - 1) * 0.0 - out_len * logz
  assert float(scores[0]) == pytest.approx(correct, rel=1e-5)
  assert float(scores[1]) == pytest.approx(correct, rel=1e-5)
  # a model that also likes `do` first: score the first output position higher
  first = jnp.zeros(VOCAB.size).at[do].set(5.0)
  task_pos = int(pairs["task_pos"][0])

  def apply_first(tokens):
    logits = jnp.zeros(tokens.shape + (VOCAB.size,))
    return logits.at[:, task_pos].set(first)

  scores = objectives.from_config({}).sentence_scores(
      apply_first, flat(pairs["inputs"]), flat(pairs["targets"]),
      jnp.repeat(jnp.asarray(pairs["task_pos"]), 4), flat(pairs["lengths"]), 20)
  margin = float(scores[0] - scores[1])
  assert margin == pytest.approx(5.0, rel=1e-5)  # log-odds of `do` over `don't` at that position
  sums = minimal_pairs.preference_sums(scores.reshape(1, 4), jnp.asarray(pairs["pair_valid"]),
                                    jnp.ones(1, bool), jnp.asarray(pairs["construction"]),
                                    QUESTION.foil_kinds, QUESTION.constructions)
  assert float(sums["wins"]) == 1.0 and float(sums["wins_move_first"]) == 1.0
  del dont


def test_pseudo_log_likelihood_equals_a_naive_loop():
  cfg = ModelConfig(vocab_size=14, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_len=16,
                    attention="bidirectional", dropout=0.0)
  model = TransformerLM(cfg)
  params = init_params(cfg, jax.random.key(4))
  apply_fn = lambda t: model.apply({"params": params}, t)
  mask_id = 13
  inputs = jnp.asarray([[12, 3, 4, 9, 5, 6, 0, 0], [12, 7, 9, 8, 10, 11, 3, 0]], jnp.int32)
  task_pos, lengths = jnp.asarray([3, 2]), jnp.asarray([6, 7])
  got = minimal_pairs.pseudo_log_likelihood(apply_fn, inputs, task_pos, lengths, mask_id, 6)
  for i in range(2):
    want = 0.0
    for p in range(int(task_pos[i]) + 1, int(lengths[i])):
      masked = inputs[i].at[p].set(mask_id)[None]
      logp = jax.nn.log_softmax(apply_fn(masked)[0, p])
      want += float(logp[inputs[i, p]])
    assert float(got[i]) == pytest.approx(want, rel=1e-5)
  # the mlm objective scores with it
  mlm = objectives.mlm.MaskedLanguageModeling(mask_id=mask_id, num_words=11)
  np.testing.assert_allclose(mlm.sentence_scores(apply_fn, inputs, inputs, task_pos, lengths, 6),
                             got, rtol=1e-6)
