"""`model.layer_impl` and `model.matmul_precision`: the plain Flax layers (`nn.Dense`,
`nn.LayerNorm`, `nn.DenseGeneral`) against the tuned CPU layers of `sg_jax.models.layers`, in
parameters, outputs and gradients (padded and packed rows, dropout on and off), the resolution of
"auto", the precision passed to every matmul, and a few training steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import objectives
from sg_jax import step as step_lib
from sg_jax.data import input_pipeline
from sg_jax.models import layers
from sg_jax.models import transformer as model_lib
from sg_jax.training.state import seed_keys

VOCAB = 20


def _config(layer_impl, **kw):
  return model_lib.ModelConfig(vocab_size=VOCAB, num_layers=1, d_model=32, num_heads=4, d_ff=64,
                               dropout=0.3, layer_impl=layer_impl, **kw)


def _batch(packed: bool):
  """(inputs, targets, model kwargs): 3 random lines of 5, 3 and 6 tokens, padded to [3, 6] or
  packed into one row of 16 positions (`step.pack_lines`)."""
  rng = np.random.default_rng(0)
  lengths = jnp.asarray([5, 3, 6])
  valid = jnp.arange(6)[None] < lengths[:, None]
  inputs = jnp.where(valid, jnp.asarray(rng.integers(1, VOCAB, (3, 6)), jnp.int32), 0)
  targets = jnp.where(valid, jnp.asarray(rng.integers(1, VOCAB, (3, 6)), jnp.int32), 0)
  if not packed:
    return inputs, targets, {}
  rows = step_lib.pack_lines(inputs, targets, lengths, jnp.asarray([0, 1, 2]), capacity=16)
  return rows.pop("inputs"), rows.pop("targets"), rows


def _custom_vjps(fn, *args) -> int:
  """Number of custom-VJP calls in the jaxpr of `fn(*args)` (the tuned layers' mark)."""
  text = str(jax.make_jaxpr(fn)(*args))
  return text.count("custom_vjp_call")


def test_both_layer_sets_hold_the_same_parameter_tree_and_values():
  for tied in (False, True):
    tuned, plain = (model_lib.init_params(_config(impl, tied_embeddings=tied), jax.random.key(4))
                    for impl in ("tuned", "plain"))
    assert jax.tree_util.tree_structure(tuned) == jax.tree_util.tree_structure(plain)
    for a, b in zip(jax.tree_util.tree_leaves(tuned), jax.tree_util.tree_leaves(plain)):
      assert a.shape == b.shape and a.dtype == b.dtype == jnp.float32
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert tuned["layer_0"]["attention"]["query"]["kernel"].shape == (32, 4, 8)
  assert tuned["layer_0"]["attention"]["out"]["kernel"].shape == (4, 8, 32)


def _loss_grads_logits(model, inputs, targets, rows):
  """Jitted params -> {deterministic: (loss, grads, logits)}, without and with dropout."""
  key = jax.random.key(7)

  def loss_fn(params, deterministic):
    logits = model.apply({"params": params}, inputs, deterministic=deterministic,
                         rngs={"dropout": key}, **rows)
    loss_sum, count = objectives.token_losses(logits, targets)
    return jnp.sum(loss_sum) / jnp.sum(count), logits

  def run(params):
    out = {}
    for deterministic in (True, False):
      (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, deterministic)
      out[deterministic] = (loss, grads, logits)
    return out

  return jax.jit(run), lambda p: loss_fn(p, False)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_plain_layers_equal_tuned_in_logits_loss_and_every_gradient(packed):
  """With dropout off and on (same key: the same coordinate-hash masks), float32."""
  inputs, targets, rows = _batch(packed)
  params = model_lib.init_params(_config("tuned"), jax.random.key(1))
  out, vjps = {}, {}
  for impl in ("tuned", "plain"):
    run, forward = _loss_grads_logits(model_lib.TransformerLM(_config(impl)), inputs, targets,
                                      rows)
    out[impl], vjps[impl] = run(params), _custom_vjps(forward, params)
  # The switch took effect: tuned = 4 head projections, 2 dense and 2 LayerNorms in the layer
  # and the output dense, each a custom VJP; plain has none.
  assert vjps == {"tuned": 9, "plain": 0}
  # Dropout really is on (so equal logits below mean equal masks).
  assert float(jnp.max(jnp.abs(out["tuned"][False][2] - out["tuned"][True][2]))) > 1e-2
  for deterministic in (True, False):
    (loss_t, grads_t, logits_t), (loss_p, grads_p, logits_p) = (out[i][deterministic]
                                                                for i in ("tuned", "plain"))
    np.testing.assert_allclose(np.asarray(logits_p), np.asarray(logits_t), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(loss_p), float(loss_t), rtol=1e-6)
    flat_t = jax.tree_util.tree_flatten_with_path(grads_t)[0]
    for (path, g_t), g_p in zip(flat_t, jax.tree_util.tree_leaves(grads_p)):
      g_t, g_p = np.asarray(g_t), np.asarray(g_p)
      scale = np.abs(g_t).max()
      assert scale > 0, path  # every parameter gets a gradient
      # Elementwise against the leaf's largest entry: float32 reassociation (the custom VJPs
      # sum in another order) leaves ~1e-7 of it; a wrong gradient would be off by O(1).
      np.testing.assert_allclose(g_p, g_t, rtol=0, atol=1e-5 * scale, err_msg=str(path))
      assert np.linalg.norm(g_p - g_t) <= 1e-5 * np.linalg.norm(g_t), path


def test_auto_is_tuned_on_cpu_and_plain_on_accelerators(monkeypatch):
  here = "tuned" if jax.default_backend() == "cpu" else "plain"
  assert layers.resolve_layer_impl("auto") == here
  monkeypatch.setattr(layers.jax, "default_backend", lambda: "cpu")
  assert layers.resolve_layer_impl("auto") == "tuned"
  for backend in ("gpu", "tpu"):
    monkeypatch.setattr(layers.jax, "default_backend", lambda b=backend: b)
    assert layers.resolve_layer_impl("auto") == "plain"
    assert layers.layer_set("auto").impl == "plain"
  assert layers.resolve_layer_impl("tuned") == "tuned"
  assert layers.resolve_layer_impl("plain") == "plain"
  assert model_lib.ModelConfig(vocab_size=5).layer_impl == "auto"


def _dot_precisions(cfg) -> list:
  tokens = jnp.ones((2, 5), jnp.int32)
  model = model_lib.TransformerLM(cfg)
  params = model_lib.init_params(cfg, jax.random.key(0))
  loss = lambda p: step_lib.total_loss(p, model, objectives.from_config({}), (), (), tokens,
                                      tokens, None)[0]
  jaxpr = jax.make_jaxpr(jax.grad(loss))(params)
  found = []

  def walk(j):
    for eqn in j.eqns:
      if eqn.primitive.name == "dot_general":
        found.append(eqn.params["precision"])
      for v in eqn.params.values():
        for sub in (v if isinstance(v, (tuple, list)) else (v,)):
          if hasattr(sub, "jaxpr"):
            walk(sub.jaxpr if hasattr(sub.jaxpr, "eqns") else sub.jaxpr.jaxpr)
          elif hasattr(sub, "eqns"):
            walk(sub)

  walk(jaxpr.jaxpr)
  return found


@pytest.mark.parametrize("impl", ["tuned", "plain"])
def test_matmul_precision_reaches_every_matmul_forward_and_backward(impl):
  highest = jax.lax.Precision.HIGHEST
  for tied in (False, True):
    got = _dot_precisions(_config(impl, matmul_precision="highest", tied_embeddings=tied))
    # forward: 4 projections, 2 attention einsums, 2 dense and the output layer; backward: two
    # more for each (the tied output's gradient reaches the embedding by a gather, no matmul).
    assert len(got) == 3 * (8 + 1), len(got)
    assert all(p in (highest, (highest, highest)) for p in got), set(map(str, got))
  # "default" leaves the precision to JAX: what a plain jnp.dot gets (None, or the value of
  # JAX_DEFAULT_MATMUL_PRECISION where that is set).
  plain_dot = jax.make_jaxpr(jnp.dot)(jnp.ones((2, 2)), jnp.ones((2, 2))).eqns[0].params
  assert all(p == plain_dot["precision"] for p in _dot_precisions(_config(impl)))
  high = _dot_precisions(_config(impl, matmul_precision="high"))
  assert {str(p) for p in high} <= {str(jax.lax.Precision.HIGH),
                                    str((jax.lax.Precision.HIGH,) * 2)}


def test_bad_layer_impl_or_matmul_precision_is_a_one_line_error(load_config):
  cases = (({"layer_impl": "fast"}, "model.layer_impl must be auto, tuned or plain"),
           ({"matmul_precision": "max"}, "model.matmul_precision must be default, high or highest"))
  for fields, message in cases:
    with pytest.raises(ValueError, match=message) as error:
      model_lib.ModelConfig(vocab_size=5, **fields)
    assert "\n" not in str(error.value)
    config = load_config("question", None)
    config.model.update(fields)
    with pytest.raises(ValueError, match=message):
      model_lib.ModelConfig.from_config(config.model, vocab_size=5)
  for value in ("default", "high", "highest"):
    assert model_lib.ModelConfig(vocab_size=5, matmul_precision=value).matmul_precision == value
  with pytest.raises(ValueError, match="model.layer_impl must be one of auto, tuned, plain"):
    layers.resolve_layer_impl("Plain")


@pytest.mark.slow
def test_training_steps_with_plain_layers_equal_tuned(tiny_config, tmp_path):
  from sg_jax import train  # pylint: disable=import-outside-toplevel
  losses, params, fns_of = {}, {}, {}
  for impl in ("tuned", "plain"):
    config = tiny_config(**{"model.layer_impl": impl, "train.packing": False})
    data_options = input_pipeline.DataOptions.from_config(config)
    _, vocab, splits = input_pipeline.load_data(data_options, str(tmp_path))
    host, caps = input_pipeline.make_train_data(data_options, splits["train"], 2)
    fns = fns_of[impl] = step_lib.train_fns_from_config(config, vocab.size, caps)
    state = fns.init(seed_keys([0, 1]))
    state = fns.chunk(state, jax.tree_util.tree_map(jnp.asarray, host),
                      jnp.asarray(0, jnp.int32), 5)
    losses[impl] = np.asarray(state.sums["loss"])
    params[impl] = np.concatenate([np.asarray(x).ravel()
                                   for x in jax.tree_util.tree_leaves(state.params)])
  assert fns_of["plain"] is not fns_of["tuned"]  # compiled per layer_impl, never shared
  assert losses["tuned"].shape == (2,) and np.all(losses["tuned"] > 0)
  np.testing.assert_allclose(losses["plain"], losses["tuned"], rtol=1e-5)
  np.testing.assert_allclose(params["plain"], params["tuned"], rtol=0, atol=1e-5)
