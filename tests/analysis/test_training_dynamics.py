"""Tests of the training-dynamics quantities (sg_jax/analysis/cka.py, twonn.py,
training_dynamics.py): each against a direct numpy computation on small arrays, and their
invariances (CKA with a rotated and scaled copy = 1, TVD of a model with itself = 0, TwoNN on a
known d-dimensional manifold close to d); the seed axis equals a loop over seeds."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.spatial
import scipy.special

from sg_jax.analysis import cka, registry, training_dynamics, twonn
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM, init_params


def numpy_hsic1(x, y):
  """Song et al. (2012) eq. 5 with explicit Gram matrices (float64)."""
  k, l = x @ x.T, y @ y.T
  np.fill_diagonal(k, 0.0)
  np.fill_diagonal(l, 0.0)
  n = k.shape[0]
  one = np.ones(n)
  return (np.trace(k @ l) + (one @ k @ one) * (one @ l @ one) / ((n - 1) * (n - 2))
          - 2.0 / (n - 2) * (one @ k @ l @ one)) / (n * (n - 3))


def numpy_minibatch_cka(xs, ys):
  """Nguyen et al. (2021) eq. 2-3: HSIC_1 averaged over minibatches."""
  xy = np.mean([numpy_hsic1(x, y) for x, y in zip(xs, ys)])
  xx = np.mean([numpy_hsic1(x, x) for x in xs])
  yy = np.mean([numpy_hsic1(y, y) for y in ys])
  return xy / np.sqrt(xx * yy)


def test_hsic1_and_minibatch_cka_equal_the_gram_matrix_formulas():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 12, 5)) + 2.0  # uncentred features: the estimator centres implicitly
  y = x @ rng.normal(size=(5, 7)) + 0.5 * rng.normal(size=(3, 12, 7))
  np.testing.assert_allclose(float(cka.hsic1(jnp.asarray(x[0]), jnp.asarray(y[0]))),
                             numpy_hsic1(x[0], y[0]), rtol=1e-4)
  np.testing.assert_allclose(float(cka.minibatch_cka(jnp.asarray(x), jnp.asarray(y))),
                             numpy_minibatch_cka(x, y), rtol=1e-4)
  with pytest.raises(ValueError, match="n >= 4"):
    cka.hsic1(jnp.ones((3, 2)), jnp.ones((3, 2)))


def test_cka_is_one_for_a_rotated_and_scaled_copy_and_small_for_independent_features():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(4, 64, 16))
  q, _ = np.linalg.qr(rng.normal(size=(16, 16)))
  copy = 3.7 * x @ q + 5.0  # orthogonal transform, isotropic scaling (and a translation)
  assert float(cka.minibatch_cka(jnp.asarray(x), jnp.asarray(copy))) == pytest.approx(1, abs=1e-5)
  other = rng.normal(size=(4, 64, 16))
  assert abs(float(cka.minibatch_cka(jnp.asarray(x), jnp.asarray(other)))) < 0.1
  # an anisotropic scaling is not an invariance of linear CKA.
  stretched = x * np.geomspace(0.05, 20, 16)
  assert float(cka.minibatch_cka(jnp.asarray(x), jnp.asarray(stretched))) < 0.9


def test_twonn_ratios_equal_a_kd_tree_and_duplicates_are_dropped():
  rng = np.random.default_rng(2)
  points = rng.normal(size=(60, 4))
  dist, _ = scipy.spatial.cKDTree(points).query(points, k=3)  # self, first, second neighbour
  np.testing.assert_allclose(np.asarray(twonn.ratios(jnp.asarray(points))),
                             dist[:, 2] / dist[:, 1], rtol=1e-4)
  with_copy = np.concatenate([points, points[:5]])
  mu = np.asarray(twonn.ratios(jnp.asarray(with_copy)))
  assert np.all(np.isnan(mu[60:]))  # the copies
  np.testing.assert_allclose(mu[:60], dist[:, 2] / dist[:, 1], rtol=1e-4)  # originals kept
  with pytest.raises(ValueError, match="at least 3 points"):
    twonn.ratios(jnp.ones((2, 3)))


def numpy_twonn(points, discard=0.1):
  """Facco et al. (2017): the line through the origin of -log(1 - i/N) against log mu_(i)."""
  dist, _ = scipy.spatial.cKDTree(points).query(points, k=3)
  mu = np.sort(dist[:, 2] / dist[:, 1])
  n = mu.size
  keep = int(np.floor(n * (1 - discard)))
  x, y = np.log(mu[:keep]), -np.log(1 - np.arange(1, keep + 1) / n)
  return float(np.linalg.lstsq(x[:, None], y, rcond=None)[0][0])


@pytest.mark.parametrize("d", [2, 5])
def test_twonn_on_a_known_manifold_is_close_to_its_dimension(d):
  rng = np.random.default_rng(d)
  # a d-dimensional flat patch rotated into 24 dimensions, and a curved d-manifold (a d-sphere)
  patch = rng.uniform(size=(1000, d)) @ np.linalg.qr(rng.normal(size=(24, 24)))[0][:d]
  sphere = rng.normal(size=(1000, d + 1))
  sphere /= np.linalg.norm(sphere, axis=1, keepdims=True)
  for points in (patch, sphere):
    got = twonn.dimension(np.asarray(twonn.ratios(jnp.asarray(points, jnp.float32))))
    assert got == pytest.approx(numpy_twonn(points), rel=1e-3)
    assert got == pytest.approx(d, rel=0.15)
  assert np.isnan(twonn.dimension(np.array([1.5, np.nan])))


def test_total_variation_equals_numpy_and_is_zero_for_equal_distributions():
  rng = np.random.default_rng(3)
  p, q = (scipy.special.softmax(rng.normal(size=(6, 9)), axis=-1) for _ in range(2))
  got = training_dynamics.total_variation(jnp.log(jnp.asarray(p)), jnp.log(jnp.asarray(q)))
  np.testing.assert_allclose(float(got), np.mean(0.5 * np.abs(p - q).sum(-1)), rtol=1e-5)
  assert float(training_dynamics.total_variation(jnp.log(p), jnp.log(p))) == 0.0


CONFIG = ModelConfig(vocab_size=12, num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0)
LINES = [[3, 4, 5, 6], [3, 4, 7], [8, 9, 10, 4, 5], [5, 6, 7, 8, 9, 10, 3], [4, 4, 4]]
SOS = 11


@jax.jit
def _alone(params, tokens):
  """(logits [L, V], hidden [layers + 1, L, d]) of ONE line `SOS w1 .. wn` padded to 8."""
  tokens = jnp.zeros((1, 8), jnp.int32).at[0, :tokens.shape[0]].set(tokens)
  logits, inter = apply_with_intermediates(TransformerLM(CONFIG), params, tokens)
  return logits[0], inter["hidden"][:, 0]


def _params(seeds):
  stacked = [init_params(CONFIG, jax.random.PRNGKey(s)) for s in seeds]
  return jax.tree_util.tree_map(lambda *x: jnp.stack(x), *stacked)


def test_plan_reads_every_word_once_and_twonn_points_have_distinct_contexts():
  plan = training_dynamics.make_plan(tuple(map(tuple, LINES)), SOS, 0, rows=2)
  words = sum(len(line) for line in LINES)
  assert plan.tokens.shape == (3, 2, 8) and plan.lengths[-1, -1] == 0  # an empty last row
  assert plan.words.size == words
  assert plan.minibatches.shape == (1, words)  # fewer words than cka.MINIBATCH: one minibatch
  assert sorted(plan.minibatches.ravel()) == list(range(words))
  for t, (line, position) in enumerate(zip(plan.word_lines, plan.word_positions)):
    assert plan.tokens.reshape(-1)[plan.words[t]] == LINES[line][position - 1]
    assert plan.targets.reshape(-1)[plan.words[t] - 1] == LINES[line][position - 1]
  # causal: distinct prefixes (lines 0 and 1 share "3" and "3 4"); otherwise every word.
  prefixes = {tuple(line[:k]) for line in LINES for k in range(1, len(line) + 1)}
  assert plan.points.size == len(prefixes) == words - 2
  assert training_dynamics.make_plan(tuple(map(tuple, LINES)), SOS, 0,
                                     causal=False).points.size == words


def test_dynamics_of_a_checkpoint_with_itself_and_the_seed_axis():
  params = _params([0, 1])
  other = _params([5, 6])
  itself = registry.References(final_step=1, final=params, previous_step=0, previous=params)
  same = training_dynamics.dynamics_metrics(params, LINES, config=CONFIG, sos_id=SOS,
                                            groups=("cka", "tvd", "twonn"), references=itself)
  np.testing.assert_allclose(same["cka_final"], 1.0, atol=1e-5)
  np.testing.assert_allclose(same["cka_previous"], 1.0, atol=1e-5)
  np.testing.assert_allclose(same["tvd_final"], 0.0, atol=1e-6)  # float32 rounding of 2 passes
  assert same["twonn_dimension"].shape == (2, CONFIG.num_layers)
  # against another model: per seed equal to the one-seed computation.
  refs = registry.References(final_step=1, final=other)  # first checkpoint: no previous
  both = training_dynamics.dynamics_metrics(params, LINES, config=CONFIG, sos_id=SOS,
                                            groups=("cka", "tvd", "twonn"), references=refs)
  assert np.all(np.isnan(both["cka_previous"])) and np.all(np.isnan(both["tvd_previous"]))
  assert np.all(both["tvd_final"] > 0) and np.all(both["cka_final"] < 1)
  plan = training_dynamics.make_plan(tuple(map(tuple, LINES)), SOS, 0)
  single_seed = jax.jit(functools.partial(training_dynamics.dynamics_stats, config=CONFIG,
                                          groups=("cka", "tvd")))
  for s in range(2):
    one = lambda tree: jax.tree_util.tree_map(lambda x: x[s], tree)
    single = single_seed((one(params), one(params), one(other)), plan.tokens, plan.tokens,
                         plan.targets != 0, plan.words, plan.minibatches, plan.points)
    np.testing.assert_allclose(both["cka_final"][s], single["cka_final"], rtol=1e-5)
    np.testing.assert_allclose(both["tvd_final"][s], single["tvd_final"], rtol=1e-5)
  with pytest.raises(ValueError, match="references"):
    training_dynamics.dynamics_metrics(params, LINES, config=CONFIG, sos_id=SOS, groups=("tvd",))
  with pytest.raises(ValueError, match="unknown training-dynamics groups"):
    training_dynamics.dynamics_metrics(params, LINES, config=CONFIG, sos_id=SOS,
                                       groups=("bogus",))


def test_padded_forward_equals_each_line_alone():
  """The padded rows give each word the hidden state and next-token distribution of its own
  line run alone (SOS + words), and TVD against numpy on those."""
  params, other = _params([0]), _params([3])
  one = lambda tree: jax.tree_util.tree_map(lambda x: x[0], tree)
  plan = training_dynamics.make_plan(tuple(map(tuple, LINES)), SOS, 0)
  forward = jax.jit(functools.partial(training_dynamics._forward,  # pylint: disable=protected-access
                                      config=CONFIG))

  def features(params, tokens, words):  # what dynamics_stats reads: word positions
    hidden, logp = forward(params, tokens)
    return hidden[:, words], logp[words]

  hidden, logp = features(one(params), plan.tokens, plan.words)
  _, logq = features(one(other), plan.tokens, plan.words)
  want_h, want_p, want_q = [], [], []
  for line in LINES:
    n = len(line) + 1
    logits, inter = _alone(one(params), jnp.asarray([SOS] + line))
    logits_o, _ = _alone(one(other), jnp.asarray([SOS] + line))
    want_h.append(np.asarray(inter[:, 1:n]))
    want_p.append(scipy.special.softmax(np.asarray(logits[1:n], np.float64), axis=-1))
    want_q.append(scipy.special.softmax(np.asarray(logits_o[1:n], np.float64), axis=-1))
  # the plan's word order: each word position's (line, position) in the lines' concatenation.
  start = np.cumsum([0] + [len(line) for line in LINES])
  match = start[plan.word_lines] + plan.word_positions - 1
  assert sorted(match) == list(range(start[-1]))
  np.testing.assert_allclose(np.asarray(hidden), np.concatenate(want_h, axis=1)[:, match],
                             atol=1e-4)
  p, q = np.concatenate(want_p)[match], np.concatenate(want_q)[match]
  np.testing.assert_allclose(np.exp(np.asarray(logp)), p, atol=1e-5)
  tvd = float(training_dynamics.total_variation(logp, logq))
  assert tvd == pytest.approx(float(np.mean(0.5 * np.abs(p - q).sum(-1))), rel=1e-4)


@dataclasses.dataclass(frozen=True)
class MaskSecondWord:
  """An objective in the manner of a masked LM (`Objective.lines`): each line's second word
  becomes MASK, the only scored position."""

  mask_id: int = 9

  def lines(self, inputs_BxL, targets_BxL, lengths_B, key):
    del targets_BxL, key
    at = (jnp.arange(inputs_BxL.shape[1])[None, :] == 2) & (lengths_B[:, None] > 2)
    return jnp.where(at, self.mask_id, inputs_BxL), jnp.where(at, inputs_BxL, 0)


def test_tvd_reads_the_objectives_inputs_and_scored_positions():
  """With an objective that masks, the TV distances are those of the masked positions' output
  distributions on the masked lines (what a masked LM predicts), the representations those of
  the plain lines."""
  params, other = _params([0]), _params([3])
  one = lambda tree: jax.tree_util.tree_map(lambda x: x[0], tree)
  refs = registry.References(final_step=1, final=other)
  got = training_dynamics.dynamics_metrics(params, LINES, config=CONFIG, sos_id=SOS,
                                           groups=("cka", "tvd"), references=refs,
                                           objective=MaskSecondWord())
  plain = training_dynamics.dynamics_metrics(params, LINES, config=CONFIG, sos_id=SOS,
                                             groups=("cka", "tvd"), references=refs)
  np.testing.assert_allclose(got["cka_final"], plain["cka_final"], rtol=1e-6)
  want = []
  for line in LINES:
    tokens = jnp.asarray([SOS, line[0], MaskSecondWord.mask_id, *line[2:]])
    p, q = (scipy.special.softmax(np.asarray(_alone(one(x), tokens)[0][2], np.float64))
            for x in (params, other))
    want.append(0.5 * np.abs(p - q).sum())
  assert got["tvd_final"][0] == pytest.approx(np.mean(want), rel=1e-4)
  assert got["tvd_final"][0] != pytest.approx(plain["tvd_final"][0], rel=1e-3)
