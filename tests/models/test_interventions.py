"""Tests of the model's interventions (head / MLP masks with mean ablation) and its sown
intermediates (`models/transformer.py`, `models/intermediates.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax.data import packing
from sg_jax.models import attention_masks
from sg_jax.models import transformer as model_lib
from sg_jax.models.intermediates import apply_with_intermediates, attention_probabilities

LAYERS, HEADS, HEAD_DIM, D_MODEL, VOCAB = 2, 4, 8, 32, 20


def _model(dropout=0.0, seed=0):
  cfg = model_lib.ModelConfig(vocab_size=VOCAB, num_layers=LAYERS, d_model=D_MODEL,
                              num_heads=HEADS, d_ff=64, dropout=dropout)
  return model_lib.TransformerLM(cfg), model_lib.init_params(cfg, jax.random.key(seed))


def _tokens(seed=0, shape=(3, 9)):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(1, VOCAB, size=shape), jnp.int32)


def _means(seed=0):
  kh, km = jax.random.split(jax.random.key(seed))
  return (jax.random.normal(kh, (LAYERS, HEADS, HEAD_DIM)),
          jax.random.normal(km, (LAYERS, D_MODEL)))


def _layer_norm(x, p, eps=1e-5):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def _rest_of_layer(layer_params, x_in, heads_BxLxHxP, mlp_override=None):
  """A layer's output by hand from its input and its per-head outputs (dropout-free)."""
  merge = layer_params["attention"]["out"]["kernel"]  # [H, P, D]
  x = _layer_norm(x_in + jnp.einsum("blhp,hpd->bld", heads_BxLxHxP, merge),
                  layer_params["norm1"])
  w1, w2 = layer_params["linear1"], layer_params["linear2"]
  ff = jax.nn.relu(x @ w1["kernel"] + w1["bias"]) @ w2["kernel"] + w2["bias"]
  if mlp_override is not None:
    ff = jnp.broadcast_to(mlp_override, ff.shape)
  return _layer_norm(x + ff, layer_params["norm2"])


@pytest.mark.slow
def test_all_ones_masks_equal_the_plain_model():
  """z = 1 everywhere: exactly the plain model without means (x * 1 is exact in floating
  point), within float rounding with means ((x - mu) + mu rounds to the nearest float of x's
  neighbourhood, an error of about one ulp of |mu|), also with dropout and for packed rows."""
  model, params = _model(dropout=0.2)
  tokens = _tokens()
  head_means, mlp_means = _means()
  ones = dict(head_mask=jnp.ones((LAYERS, HEADS)), mlp_mask=jnp.ones((LAYERS,)))
  for deterministic in (True, False):
    kw = dict(deterministic=deterministic, rngs={"dropout": jax.random.key(5)})
    plain = model.apply({"params": params}, tokens, **kw)
    masked = model.apply({"params": params}, tokens, **kw, **ones)
    np.testing.assert_array_equal(masked, plain)
    with_means = model.apply({"params": params}, tokens, **kw, **ones, head_means=head_means,
                             mlp_means=mlp_means)
    np.testing.assert_allclose(with_means, plain, atol=2e-5, rtol=0)
    assert float(jnp.max(jnp.abs(plain))) > 0.1  # not trivially small logits


def test_zero_head_mask_with_means_equals_the_hand_computed_replacement():
  """Head 2 of layer 1 replaced by its mean: layer 1's output equals the merge projection,
  residual add, LayerNorms and MLP computed by hand from the plain model's sown per-head
  outputs with that head's output set to mu."""
  model, params = _model()
  tokens = _tokens(1)
  head_means, _ = _means(1)
  z = jnp.ones((LAYERS, HEADS)).at[1, 2].set(0.0)
  _, plain = apply_with_intermediates(model, params, tokens)
  logits, got = apply_with_intermediates(model, params, tokens, head_mask=z,
                                         head_means=head_means)
  heads = plain["heads"][1].at[:, :, 2].set(head_means[1, 2])
  want = _rest_of_layer(params["layer_1"], plain["hidden"][1], heads)
  np.testing.assert_allclose(got["hidden"][2], want, atol=2e-5, rtol=0)
  np.testing.assert_allclose(got["heads"][1][:, :, 2], jnp.broadcast_to(
      head_means[1, 2], got["heads"][1][:, :, 2].shape), atol=1e-6, rtol=0)
  # layer 0 only computes (x - mu) * 1 + mu: x up to float rounding
  np.testing.assert_allclose(got["hidden"][1], plain["hidden"][1], atol=2e-6, rtol=0)
  out = params["output"]
  np.testing.assert_allclose(logits, want @ out["kernel"] + out["bias"], atol=1e-4, rtol=0)
  assert float(jnp.max(jnp.abs(got["hidden"][2] - plain["hidden"][2]))) > 1e-3  # it did act
  # Zero ablation (no means): the head's output is 0.
  _, zero = apply_with_intermediates(model, params, tokens, head_mask=z)
  want = _rest_of_layer(params["layer_1"], plain["hidden"][1],
                        plain["heads"][1].at[:, :, 2].set(0.0))
  np.testing.assert_allclose(zero["hidden"][2], want, atol=2e-5, rtol=0)


def test_zero_mlp_mask_with_means_equals_the_hand_computed_replacement():
  model, params = _model()
  tokens = _tokens(2)
  _, mlp_means = _means(2)
  z = jnp.ones((LAYERS,)).at[0].set(0.0)
  _, plain = apply_with_intermediates(model, params, tokens)
  _, got = apply_with_intermediates(model, params, tokens, mlp_mask=z, mlp_means=mlp_means)
  want = _rest_of_layer(params["layer_0"], plain["hidden"][0], plain["heads"][0],
                        mlp_override=mlp_means[0])
  np.testing.assert_allclose(got["hidden"][1], want, atol=2e-5, rtol=0)
  np.testing.assert_allclose(got["mlp"][0], jnp.broadcast_to(mlp_means[0], got["mlp"][0].shape),
                             atol=1e-6, rtol=0)


def test_per_position_means_replace_each_position():
  """Means of shape [layers, B, L, ...]: a zero mask whose means are the units' own outputs
  (per position) reproduces the plain model; constant means of another shape do not."""
  model, params = _model()
  tokens = _tokens(3)
  plain_logits, plain = apply_with_intermediates(model, params, tokens)
  zeros = dict(head_mask=jnp.zeros((LAYERS, HEADS)), mlp_mask=jnp.zeros((LAYERS,)))
  same = model.apply({"params": params}, tokens, **zeros, head_means=plain["heads"],
                     mlp_means=plain["mlp"])
  np.testing.assert_allclose(same, plain_logits, atol=1e-5, rtol=0)
  head_means, mlp_means = _means(3)
  other = model.apply({"params": params}, tokens, **zeros, head_means=head_means,
                      mlp_means=mlp_means)
  assert float(jnp.max(jnp.abs(other - plain_logits))) > 1e-2


def test_gradients_flow_to_the_masks_and_equal_finite_differences(monkeypatch):
  """Nonzero gradients with the real model; equal to central differences once the ReLU is
  swapped for GELU: with ReLU the loss has kinks wherever a hidden unit crosses 0 (thousands of
  them here), and a float32 step small enough to miss them all drowns in rounding noise."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  model, params = _model()
  tokens = _tokens(4, (2, 7))
  head_means, mlp_means = _means(4)

  def loss(head_mask, mlp_mask):
    logits = model.apply({"params": params}, tokens, head_mask=head_mask, head_means=head_means,
                         mlp_mask=mlp_mask, mlp_means=mlp_means)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], axis=-1))

  rng = np.random.default_rng(4)
  z_heads = jnp.asarray(rng.uniform(0.3, 0.9, (LAYERS, HEADS)), jnp.float32)
  z_mlp = jnp.asarray(rng.uniform(0.3, 0.9, (LAYERS,)), jnp.float32)
  g_heads, g_mlp = jax.jit(jax.grad(loss, argnums=(0, 1)))(z_heads, z_mlp)
  assert g_heads.shape == (LAYERS, HEADS) and g_mlp.shape == (LAYERS,)
  assert np.all(np.abs(np.asarray(g_heads)) > 1e-6) and np.all(np.abs(np.asarray(g_mlp)) > 1e-6)
  monkeypatch.setattr(nn, "relu", jax.nn.gelu)  # model.py calls nn.relu at trace time
  g_heads, g_mlp = jax.jit(jax.grad(loss, argnums=(0, 1)))(z_heads, z_mlp)
  f = jax.jit(loss)
  eps = 1e-2  # float32 model: rounding noise of the differences stays below 1e-4
  for layer, head in ((0, 1), (0, 3), (1, 0), (1, 3)):
    e = jnp.zeros((LAYERS, HEADS)).at[layer, head].set(eps)
    fd = (f(z_heads + e, z_mlp) - f(z_heads - e, z_mlp)) / (2 * eps)
    np.testing.assert_allclose(g_heads[layer, head], fd, rtol=2e-3, atol=1e-4)
  for layer in range(LAYERS):
    e = jnp.zeros((LAYERS,)).at[layer].set(eps)
    fd = (f(z_heads, z_mlp + e) - f(z_heads, z_mlp - e)) / (2 * eps)
    np.testing.assert_allclose(g_mlp[layer], fd, rtol=2e-3, atol=1e-4)


def test_vmap_over_seeds_and_pruning_runs_equals_a_loop():
  """Masks [seed, run, ...] and params [seed, ...] vmapped twice = one call per (seed, run)."""
  model, _ = _model()
  params_s = jax.tree_util.tree_map(lambda *a: jnp.stack(a),
                                    *(_model(seed=s)[1] for s in range(2)))
  tokens = _tokens(5)
  head_means, mlp_means = _means(5)
  rng = np.random.default_rng(5)
  z_heads = jnp.asarray(rng.uniform(0, 1, (2, 3, LAYERS, HEADS)), jnp.float32)
  z_mlp = jnp.asarray(rng.uniform(0, 1, (2, 3, LAYERS)), jnp.float32)

  def run(params, head_mask, mlp_mask):
    return model.apply({"params": params}, tokens, head_mask=head_mask, head_means=head_means,
                       mlp_mask=mlp_mask, mlp_means=mlp_means)

  batched = jax.jit(jax.vmap(jax.vmap(run, in_axes=(None, 0, 0))))(params_s, z_heads, z_mlp)
  assert batched.shape == (2, 3, 3, 9, VOCAB)
  one = jax.jit(run)
  for s in range(2):
    params = jax.tree_util.tree_map(lambda a, s=s: a[s], params_s)
    for r in range(3):
      np.testing.assert_allclose(batched[s, r], one(params, z_heads[s, r], z_mlp[s, r]),
                                 atol=1e-5, rtol=0)
  assert float(jnp.max(jnp.abs(batched[0, 0] - batched[0, 1]))) > 1e-3  # runs differ


def test_sown_intermediates_in_the_packed_layout_and_one_layers_attention():
  """Packed rows: attention in the line layout, the rest in the row layout; rows sum to 1.
  `attention_probabilities` of layer 0 on hidden[0] is the model's own layer-0 attention."""
  from sg_jax import train  # pylint: disable=import-outside-toplevel
  model, params = _model()
  lengths = jnp.asarray([5, 3, 6])
  inputs = jnp.where(jnp.arange(6)[None] < lengths[:, None], _tokens(6, (3, 6)), 0)
  rows = packing.pack_lines(inputs, inputs, lengths, jnp.asarray([0, 1, 2]), capacity=16)
  tokens = rows.pop("inputs")
  del rows["targets"]
  _, got = apply_with_intermediates(model, params, tokens, **rows)
  assert got["attention"].shape == (LAYERS, 3, HEADS, 6, 6)  # [layers, B * N lines, H, M, M]
  assert got["heads"].shape == (LAYERS, 1, 16, HEADS, HEAD_DIM)
  assert got["mlp"].shape == (LAYERS, 1, 16, D_MODEL)
  assert got["hidden"].shape == (LAYERS + 1, 1, 16, D_MODEL)
  np.testing.assert_allclose(np.asarray(got["attention"]).sum(-1), 1.0, rtol=1e-5)
  padded_tokens = _tokens(7)
  _, padded = apply_with_intermediates(model, params, padded_tokens)
  weights = attention_probabilities(model.config, params["layer_0"]["attention"],
                                    padded["hidden"][0], attention_masks.causal_mask(9)[None, None])
  np.testing.assert_allclose(weights, padded["attention"][0], atol=1e-6, rtol=0)


def test_bad_intervention_arguments_give_one_line_errors():
  model, params = _model()
  tokens = _tokens()
  head_means, mlp_means = _means()
  bad = [
      (dict(head_mask=jnp.ones((HEADS,))), "head_mask must have shape"),
      (dict(mlp_mask=jnp.ones((LAYERS, 1))), "mlp_mask must have shape"),
      (dict(head_mask=jnp.ones((LAYERS, HEADS)), head_means=head_means[..., :4]),
       "head_means must have shape"),
      (dict(mlp_mask=jnp.ones((LAYERS,)), mlp_means=mlp_means[:1]), "mlp_means must have shape"),
      (dict(head_means=head_means), "head_means needs head_mask"),
      (dict(mlp_means=mlp_means), "mlp_means needs mlp_mask"),
  ]
  for kwargs, message in bad:
    with pytest.raises(ValueError, match=message):
      model.apply({"params": params}, tokens, **kwargs)
  with pytest.raises(ValueError, match="does not decode"):
    apply_with_intermediates(model, params, tokens, decode=True)
