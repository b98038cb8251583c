"""Task metrics on hand-built logits with known answers."""

import jax.numpy as jnp
import numpy as np

from sg_jax import evaluation


def test_question_auxiliary_ranking():
  # vocab: 0 pad, 1 do, 2 does, 3 don't, 4 doesn't, 5 other
  aux = jnp.asarray([1, 2, 3, 4])
  logits = np.zeros((2, 4, 6), np.float32)
  logits[0, 2, 2] = 5.0  # line 0 at task position 2: "does" wins among auxiliaries
  logits[0, 2, 5] = 9.0  # a non-auxiliary scores higher but is not a candidate
  logits[1, 1, 3] = 1.0  # line 1: "don't"
  targets = np.array([[7, 7, 2, 0], [7, 4, 0, 0]])
  task_pos = jnp.asarray([2, 1])
  ok = evaluation.question_correct(jnp.asarray(logits), task_pos, jnp.asarray(targets), aux)
  np.testing.assert_array_equal(np.asarray(ok), [True, False])


def test_dyck_closing_bracket_accuracy_and_min_distance():
  # ids: 1 "(a", 2 "(b", 3 "a)", 4 "b)"
  close_ids = jnp.asarray([3, 4])
  targets = np.array([[2, 1, 3, 4]])
  logits = np.zeros((1, 4, 5), np.float32)
  logits[0, 2, 3] = 1.0  # correct "a)"
  logits[0, 3, 3] = 1.0  # wrong: predicts "a)" where "b)" is due
  logits[0, 3, 1] = 5.0  # an opening bracket is not a candidate
  close_mask = np.array([[False, False, True, True]])
  distance = np.array([[0, 0, 1, 3]])
  c, n = evaluation.dyck_correct(jnp.asarray(logits), jnp.asarray(targets),
                                 jnp.asarray(close_mask), jnp.asarray(distance), close_ids)
  assert (float(c[0]), float(n[0])) == (1.0, 2.0)
  c, n = evaluation.dyck_correct(jnp.asarray(logits), jnp.asarray(targets),
                                 jnp.asarray(close_mask), jnp.asarray(distance), close_ids,
                                 min_distance=2)
  assert (float(c[0]), float(n[0])) == (0.0, 1.0)


def test_greedy_decode_and_tense_metric():
  # A fake "model" that always predicts token (previous token + 1), EOS = 6.
  vocab = 8

  def apply_fn(tokens):
    nxt = jnp.minimum(tokens + 1, 6)
    return jnp.eye(vocab)[nxt] * 10.0

  inputs = jnp.asarray([[7, 1, 2, 3, 0, 0, 0]])  # SOS=7, task token at position 2
  decoded = evaluation.greedy_decode(apply_fn, inputs, jnp.asarray([2]), num_steps=4)
  # after position 2 (token 2) the model emits 3, 4, 5, 6
  np.testing.assert_array_equal(np.asarray(decoded), [[0, 0, 3, 4, 5, 6, 0]])
  targets = jnp.asarray([[1, 2, 3, 4, 5, 6, 0]])
  pos_table = jnp.asarray([0, 1, 2, 3, 4, 5, 9, 9])
  ok = evaluation.tense_correct(decoded, targets, jnp.asarray([2]), jnp.asarray([6]),
                                jnp.asarray([3]), pos_table)
  assert bool(ok[0])
  # Same POS class but a different main verb -> wrong.
  pos_table2 = pos_table.at[4].set(7).at[2].set(7)
  targets2 = targets.at[0, 3].set(2)
  ok = evaluation.tense_correct(decoded, targets2, jnp.asarray([2]), jnp.asarray([6]),
                                jnp.asarray([3]), pos_table2)
  assert not bool(ok[0])
  # A target one word longer (EOS later) -> wrong POS sequence.
  targets3 = jnp.asarray([[1, 2, 3, 4, 5, 5, 6]])
  ok = evaluation.tense_correct(decoded, targets3, jnp.asarray([2]), jnp.asarray([7]),
                                jnp.asarray([3]), pos_table)
  assert not bool(ok[0])


def test_token_losses_ignore_padding():
  logits = jnp.zeros((1, 3, 4))
  loss, count = evaluation.token_losses(logits, jnp.asarray([[1, 2, 0]]))
  assert float(count[0]) == 2.0
  np.testing.assert_allclose(float(loss[0]), 2 * np.log(4), rtol=1e-6)


def test_pad_to_multiple_marks_valid_lines():
  arrays, n = evaluation.pad_to_multiple({"x": np.arange(5)}, 4)
  assert n == 5 and arrays["x"].shape == (8,)
  np.testing.assert_array_equal(arrays["valid"], [1, 1, 1, 1, 1, 0, 0, 0])
