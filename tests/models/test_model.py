"""Tests of the TransformerLM and its layers: causality, extra attention mask, intermediates,
packed rows, initialisers, the performance layers (`layers.py`), cached decoding."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax.data import packing
from sg_jax.evaluation import decoding
from sg_jax.models import intermediates
from sg_jax.models import layers
from sg_jax.models import transformer as model_lib


def _model(**kw):
  cfg = model_lib.ModelConfig(vocab_size=20, num_layers=2, d_model=32, num_heads=4, d_ff=64, **kw)
  return model_lib.TransformerLM(cfg), model_lib.init_params(cfg, jax.random.key(0))


def test_changing_a_later_token_never_changes_earlier_logits():
  model, params = _model()
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(1, 20, size=(3, 12)), jnp.int32)
  base = model.apply({"params": params}, tokens)
  for pos in (0, 5, 11):
    changed = tokens.at[:, pos].set((tokens[:, pos] % 19) + 1)
    out = model.apply({"params": params}, changed)
    np.testing.assert_array_equal(np.asarray(out[:, :pos]), np.asarray(base[:, :pos]))
    assert float(jnp.max(jnp.abs(out[:, pos:] - base[:, pos:]))) > 1e-4


def test_intermediates_shapes_and_attention_rows_sum_to_one_and_are_causal():
  model, params = _model()
  tokens = jnp.ones((2, 7), jnp.int32)
  logits, internals = intermediates.apply_with_intermediates(model, params, tokens)
  np.testing.assert_array_equal(logits, model.apply({"params": params}, tokens))
  assert logits.shape == (2, 7, 20)
  att = np.asarray(internals["attention"])
  assert att.shape == (2, 2, 4, 7, 7)  # [layers, batch, heads, query, key]
  assert internals["hidden"].shape == (3, 2, 7, 32)
  assert internals["heads"].shape == (2, 2, 7, 4, 8)
  assert internals["mlp"].shape == (2, 2, 7, 32)
  np.testing.assert_allclose(att.sum(-1), 1.0, rtol=1e-5)
  assert np.all(np.triu(np.ones((7, 7)), 1)[None, None, None] * att == 0)


def test_extra_attention_mask_is_applied():
  model, params = _model()
  tokens = jnp.arange(1, 7, dtype=jnp.int32)[None]
  mask = jnp.ones((1, 6, 6), bool).at[:, :, 1:3].set(False).at[:, :, 0].set(True)
  _, internals = intermediates.apply_with_intermediates(model, params, tokens,
                                                        attention_mask=mask)
  assert float(jnp.max(internals["attention"][..., 1:3])) == 0.0
  # Masking keys 1..2 must equal feeding a sequence where they cannot influence later tokens:
  # the logits at position 0 are unchanged.
  base = model.apply({"params": params}, tokens)
  masked = model.apply({"params": params}, tokens, attention_mask=mask)
  np.testing.assert_allclose(np.asarray(masked[:, 0]), np.asarray(base[:, 0]), rtol=1e-6)


def _three_packed_lines(seed: int):
  """(lengths [3], padded inputs [3, 6], packed row tokens [1, 16], model kwargs of the row) of
  three random lines of 5, 3 and 6 tokens packed with `packing.pack_lines`."""
  from sg_jax import train  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  lengths = jnp.asarray([5, 3, 6])
  inputs = jnp.asarray(rng.integers(1, 20, size=(3, 6)), jnp.int32)
  inputs = jnp.where(jnp.arange(6)[None] < lengths[:, None], inputs, 0)
  rows = packing.pack_lines(inputs, inputs, lengths, jnp.asarray([0, 1, 2]), capacity=16)
  tokens = rows.pop("inputs")
  del rows["targets"]
  return lengths, inputs, tokens, rows


def test_packed_row_with_line_indices_equals_the_padded_batch():
  """Three lines packed into one row (`packing.pack_lines` layout) give the padded batch's logits
  at every line token, its attention weights in the line layout, and the same dropout masks."""
  model, params = _model(dropout=0.3)
  lengths, inputs, tokens, rows = _three_packed_lines(seed=1)
  key = {"dropout": jax.random.key(3)}
  for deterministic in (True, False):
    padded, pad_int = intermediates.apply_with_intermediates(
        model, params, inputs, deterministic=deterministic, rngs=key)
    packed, pack_int = intermediates.apply_with_intermediates(
        model, params, tokens, deterministic=deterministic, rngs=key, **rows)
    assert pack_int["attention"].shape == pad_int["attention"].shape == (2, 3, 4, 6, 6)
    starts = [0, 5, 8]
    for j in range(3):
      n = int(lengths[j])
      np.testing.assert_allclose(np.asarray(packed[0, starts[j]:starts[j] + n]),
                                 np.asarray(padded[j, :n]), atol=1e-5)
      np.testing.assert_allclose(np.asarray(pack_int["attention"][:, j, :, :n, :n]),
                                 np.asarray(pad_int["attention"][:, j, :, :n, :n]), atol=1e-6)
  with pytest.raises(ValueError, match="not both"):
    model.apply({"params": params}, tokens, attention_mask=jnp.ones((1, 16, 16), bool), **rows)


def test_a_packed_row_may_be_longer_than_max_len_when_its_lines_fit():
  """Dyck's packed rows (up to ~800 positions) exceed max_len 512 while every line fits: the
  row of three lines (16 positions) through a model with max_len 8 equals the padded batch."""
  model, params = _model(dropout=0.3, max_len=8)
  lengths, inputs, tokens, rows = _three_packed_lines(seed=2)
  key = {"dropout": jax.random.key(4)}
  for deterministic in (True, False):
    padded = model.apply({"params": params}, inputs, deterministic=deterministic, rngs=key)
    packed = model.apply({"params": params}, tokens, deterministic=deterministic, rngs=key, **rows)
    for j, start in enumerate([0, 5, 8]):
      n = int(lengths[j])
      np.testing.assert_allclose(np.asarray(packed[0, start:start + n]),
                                 np.asarray(padded[j, :n]), atol=1e-5)
  with pytest.raises(ValueError, match="sequence length 16 exceeds model max_len 8"):
    model.apply({"params": params}, tokens)  # unpacked, the same row is too long


def test_unpack_and_repack_lines_are_inverse_on_line_tokens():
  x = jnp.arange(2 * 7 * 3, dtype=jnp.float32).reshape(2, 7, 3)
  unpack = jnp.asarray([[[0, 1, 2], [3, 4, 4]], [[2, 3, 4], [5, 6, 6]]])  # [B=2, N=2, M=3]
  lines = layers.unpack_lines(x, unpack)
  assert lines.shape == (4, 3, 3)
  np.testing.assert_array_equal(lines[3, 1], x[1, 6])
  repack = jnp.asarray([[0, 1, 2, 3, 4, 0, 0], [0, 0, 0, 1, 2, 3, 4]])  # j * M + o per position
  back = layers.repack_lines(lines, repack)
  np.testing.assert_array_equal(back[0, :5], x[0, :5])
  np.testing.assert_array_equal(back[1, 2:7], x[1, 2:7])


def test_dropout_only_in_training_mode():
  model, params = _model()
  tokens = jnp.ones((1, 5), jnp.int32)
  a = model.apply({"params": params}, tokens, deterministic=True)
  b = model.apply({"params": params}, tokens, deterministic=True)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  c = model.apply({"params": params}, tokens, deterministic=False,
                  rngs={"dropout": jax.random.key(1)})
  assert float(jnp.max(jnp.abs(a - c))) > 1e-4


def test_initialisers_follow_the_reference_fans():
  cfg = model_lib.ModelConfig(vocab_size=71, num_layers=1, d_model=64, num_heads=8, d_ff=256)
  params = model_lib.init_params(cfg, jax.random.key(3))
  layer = params["layer_0"]
  bound = lambda fi, fo, g=1.0: g * math.sqrt(6 / (fi + fo))
  checks = [
      (params["embedding"]["embedding"], bound(71, 64)),
      (layer["attention"]["query"]["kernel"], bound(64, 64)),
      (layer["attention"]["key"]["kernel"], bound(64, 128)),  # fused kv [2d, d] in the reference
      (layer["linear1"]["kernel"], bound(64, 256, math.sqrt(2))),
      (layer["linear2"]["kernel"], bound(256, 64)),
  ]
  for w, b in checks:
    w = np.asarray(w)
    assert np.abs(w).max() <= b
    assert np.abs(w).max() > 0.9 * b  # uniform on [-b, b]


def test_sinusoidal_positions_match_the_formula():
  pe = model_lib.sinusoidal_positions(10, 8)
  assert pe[3, 0] == pytest.approx(math.sin(3.0))
  assert pe[3, 1] == pytest.approx(math.cos(3.0))
  assert pe[5, 2] == pytest.approx(math.sin(5 / 10000 ** (2 / 8)), rel=1e-6)


def test_bad_model_config_names_the_field():
  with pytest.raises(ValueError, match="num_heads"):
    model_lib.ModelConfig(vocab_size=5, d_model=30, num_heads=4)
  with pytest.raises(ValueError, match="num_layers"):
    model_lib.ModelConfig(vocab_size=5, num_layers=0)


def test_coordinate_dropout_keeps_the_right_fraction_independently_of_layout():
  drop = layers.CoordinateDropout(0.25)
  x = jnp.ones((4, 50, 64))
  ids = (jnp.arange(4, dtype=jnp.uint32)[:, None] * 50
         + jnp.arange(50, dtype=jnp.uint32))[..., None]
  index = jnp.arange(64, dtype=jnp.uint32)
  out = drop.apply({}, x, ids, index, False, rngs={"dropout": jax.random.key(0)})
  kept = np.asarray(out) > 0
  assert abs(kept.mean() - 0.75) < 0.01
  np.testing.assert_allclose(np.asarray(out)[kept], 1 / 0.75, rtol=1e-6)
  # The same tokens in another layout (flattened, reversed) get the same mask.
  out2 = drop.apply({}, x.reshape(1, 200, 64)[:, ::-1], ids.reshape(1, 200, 1)[:, ::-1], index,
                    False, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_array_equal(np.asarray(out2)[0, ::-1], np.asarray(out).reshape(200, 64))
  # Another key gives another mask.
  out3 = drop.apply({}, x, ids, index, False, rngs={"dropout": jax.random.key(1)})
  assert not np.array_equal(np.asarray(out3), np.asarray(out))


def test_head_projection_equals_the_3d_kernel_contraction():
  """HeadProjection = einsum with its 3-D kernel, both ways (the layout the analysis relies on)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  h, p = 4, 8
  x = jax.random.normal(jax.random.key(0), (2, 5, h * p))
  init = nn.initializers.normal(1.0)
  split = layers.HeadProjection((h, p), split=True, kernel_init=init)
  params = split.init(jax.random.key(1), x)
  kernel = params["params"]["kernel"]
  assert kernel.shape == (h * p, h, p)
  np.testing.assert_allclose(split.apply(params, x), jnp.einsum("bld,dhp->blhp", x, kernel),
                             rtol=1e-5, atol=1e-5)
  merge = layers.HeadProjection((h, p), split=False, kernel_init=init)
  y = x.reshape(2, 5, h, p)
  params = merge.init(jax.random.key(2), y)
  kernel = params["params"]["kernel"]
  assert kernel.shape == (h, p, h * p)
  np.testing.assert_allclose(merge.apply(params, y), jnp.einsum("blhp,hpd->bld", y, kernel),
                             rtol=1e-5, atol=1e-5)


def test_matmul_value_and_gradients_equal_jnp_dot_with_and_without_a_seed_axis():
  """`layers.matmul` only rewrites the backward pass: value, d/dx and d/dkernel = `jnp.dot`'s."""
  kx, kw, kg = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (3, 2, 5, 16))  # [seeds, batch, length, in]
  kernel = jax.random.normal(kw, (3, 16, 8))
  cotangent = jax.random.normal(kg, (3, 2, 5, 8))

  def value_and_vjp(fn, x, kernel, cotangent):
    y, vjp = jax.vjp(fn, x, kernel)
    return (y,) + vjp(cotangent)

  for batched in (False, True):
    run = (jax.vmap(value_and_vjp, in_axes=(None, 0, 0, 0)) if batched
           else lambda fn, *a: value_and_vjp(fn, *(v[0] for v in a)))
    got = jax.jit(run, static_argnums=0)(layers.matmul, x, kernel, cotangent)
    want = jax.jit(run, static_argnums=0)(jnp.dot, x, kernel, cotangent)
    assert got[2].shape == (kernel.shape if batched else kernel.shape[1:])
    for g, w in zip(got, want):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_dense_equals_flax_dense_in_parameters_outputs_and_gradients():
  """Same key -> same parameters as `nn.Dense`; same outputs and parameter gradients."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  init = model_lib.xavier_uniform(16, 8)
  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  ours = layers.Dense(8, kernel_init=init)
  theirs = nn.Dense(8, kernel_init=init)
  params = ours.init(jax.random.key(1), x)
  reference = theirs.init(jax.random.key(1), x)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, reference)
  params = jax.tree_util.tree_map(lambda p: p + 0.1, params)  # a non-zero bias as well
  np.testing.assert_allclose(ours.apply(params, x), theirs.apply(params, x), rtol=1e-6, atol=1e-6)
  loss = lambda module: lambda p: jnp.sum(jnp.sin(module.apply(p, x)))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         jax.grad(loss(ours))(params), jax.grad(loss(theirs))(params))


def test_layer_norm_equals_flax_layer_norm_with_and_without_a_seed_axis():
  """Same parameters as `nn.LayerNorm`; outputs and gradients (input, scale, bias) equal, also
  under a seed vmap (the custom VJP must batch)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  x = 3.0 * jax.random.normal(jax.random.key(0), (2, 2, 5, 16)) + 1.0  # [seeds, B, L, D]
  ours, theirs = layers.LayerNorm(epsilon=1e-5), nn.LayerNorm(epsilon=1e-5)
  params = ours.init(jax.random.key(1), x[0])
  jax.tree_util.tree_map(np.testing.assert_array_equal, params,
                         theirs.init(jax.random.key(1), x[0]))
  keys = jax.random.split(jax.random.key(2), 2)
  params = {"params": {name: jax.random.normal(k, (2, 16))  # per seed, non-trivial
                       for name, k in zip(("scale", "bias"), keys)}}
  loss = lambda module: lambda p, xs: jnp.sum(jnp.sin(module.apply(p, xs)) * xs)
  for seed in range(2):
    one = jax.tree_util.tree_map(lambda a, s=seed: a[s], params)
    np.testing.assert_allclose(ours.apply(one, x[seed]), theirs.apply(one, x[seed]), atol=2e-6)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
        jax.grad(loss(ours), argnums=(0, 1))(one, x[seed]),
        jax.grad(loss(theirs), argnums=(0, 1))(one, x[seed]))
  vmapped = jax.vmap(jax.grad(loss(ours), argnums=(0, 1)))(params, x)
  looped = [jax.grad(loss(theirs), argnums=(0, 1))(
      jax.tree_util.tree_map(lambda a, s=s: a[s], params), x[s]) for s in range(2)]
  jax.tree_util.tree_map(
      lambda a, *b: np.testing.assert_allclose(a, np.stack(b), rtol=1e-5, atol=1e-5),
      vmapped, *looped)


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_parameters_and_tracks_float32_values():
  """`dtype='bfloat16'` (the bf16 compute option): parameters and their gradients stay float32,
  logits are float32 and within bf16 rounding of the float32 model's, also for packed rows."""
  model32, params = _model()
  model16, params16 = _model(dtype="bfloat16")
  assert all(p.dtype == jnp.float32 for p in jax.tree_util.tree_leaves(params16))
  _, inputs, tokens, rows = _three_packed_lines(seed=2)
  for args, kwargs in (((inputs,), {}), ((tokens,), rows)):
    full = model32.apply({"params": params}, *args, **kwargs)
    half = model16.apply({"params": params}, *args, **kwargs)
    assert half.dtype == jnp.float32
    scale = float(jnp.max(jnp.abs(full)))
    assert float(jnp.max(jnp.abs(half - full))) < 0.05 * scale
    assert float(jnp.max(jnp.abs(half - full))) > 0.0  # it really computed in bf16
  loss = lambda m: lambda p: jnp.mean(m.apply({"params": p}, inputs) ** 2)
  g32, g16 = jax.grad(loss(model32))(params), jax.grad(loss(model16))(params)
  for a, b in zip(jax.tree_util.tree_leaves(g32), jax.tree_util.tree_leaves(g16)):
    assert b.dtype == jnp.float32
    np.testing.assert_allclose(b, a, atol=0.05 * float(jnp.max(jnp.abs(a))) + 1e-6)


@pytest.mark.slow
def test_cached_decoding_logits_equal_the_full_forward_pass_per_line_position():
  """Prefix in one call, then one token per call with every line at its own position: each
  fed token's logits equal the full forward pass of its line at that position."""
  for depth in (1, 3):
    cfg = model_lib.ModelConfig(vocab_size=20, num_layers=depth, d_model=32, num_heads=4,
                                d_ff=64)
    model, params = model_lib.TransformerLM(cfg), model_lib.init_params(cfg, jax.random.key(depth))
    rng = np.random.default_rng(depth)
    tokens = jnp.asarray(rng.integers(1, 20, size=(3, 10)), jnp.int32)
    full = np.asarray(model.apply({"params": params}, tokens))
    prefix_end = np.array([2, 5, 3])  # last prefix position of each line
    cache = decoding.init_cache(model, params, 3, 10)
    assert cache["layer_0"]["attention"]["cached_key"].shape == (3, 10, 4, 8)
    # The whole line in one decoding call is the full forward pass (the evaluation's
    # teacher-forced pass fills the cache this way).
    whole, _ = decoding.apply_cached(model, params, tokens,
                                     jnp.broadcast_to(jnp.arange(10), (3, 10)), cache)
    np.testing.assert_array_equal(np.asarray(whole), full)
    prefix = jnp.where(jnp.arange(6)[None] <= prefix_end[:, None], tokens[:, :6], 0)
    logits, cache = decoding.apply_cached(model, params, prefix,
                                          jnp.broadcast_to(jnp.arange(6), (3, 6)), cache)
    rows = np.arange(3)
    np.testing.assert_allclose(np.asarray(logits)[rows, prefix_end], full[rows, prefix_end],
                               atol=2e-5, rtol=0)
    for k in range(1, 5):
      pos = prefix_end + k
      logits, cache = decoding.apply_cached(model, params, tokens[rows, pos][:, None],
                                            jnp.asarray(pos)[:, None], cache)
      np.testing.assert_allclose(np.asarray(logits)[:, 0], full[rows, pos], atol=2e-5, rtol=0)
    # The cache holds real keys: feeding the wrong earlier token changes the logits.
    assert np.abs(full[:, 1:] - full[:, :1]).max() > 1e-3


def test_cached_decoding_refuses_dropout_and_missing_positions():
  model, params = _model()
  tokens = jnp.ones((2, 4), jnp.int32)
  with pytest.raises(ValueError, match="decode=True needs causal attention, deterministic"):
    model.apply({"params": params}, tokens, decode=True, mutable=["cache"])
  with pytest.raises(ValueError, match="decode=True needs causal attention, deterministic"):
    model.apply({"params": params}, tokens, decode=True, deterministic=False,
                positions_BxL=jnp.zeros((2, 4), jnp.int32), mutable=["cache"],
                rngs={"dropout": jax.random.key(0)})
