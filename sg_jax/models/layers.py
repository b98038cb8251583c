"""CPU performance layers of `model.TransformerLM`: same parameters and values, faster steps.

Each layer here computes what a stock Flax layer or `jnp` expression would, with the same
parameter names, shapes and initialisation, but written so that XLA on CPU runs the seed-vmapped
training step faster (docs/performance.md):

* `matmul` and `layer_norm`: custom VJPs whose gradients come out in the kernel's own layout
  (no transposed copies per step) and with fewer reductions; `Dense`, `HeadProjection` and
  `LayerNorm` are the modules built on them.
* `CoordinateDropout`: dropout whose mask is a hash of each element's logical coordinates, so
  that a padded batch and the same lines packed into rows drop the same units (and it is
  cheaper than threefry).
* `unpack_lines` / `repack_lines`: the gathers between packed rows and the line layout in which
  packed rows attend (`packing.pack_lines`).
* `attention_logits` / `attention_context`: scaled dot-product attention with the one-query
  path of incremental decoding.

These speed-ups were measured on XLA's CPU backend only. `layer_set` picks, per
`model.layer_impl`, either them ("tuned") or the stock Flax layers `nn.Dense`, `nn.LayerNorm`
and `nn.DenseGeneral` ("plain", standard autodiff) with the same parameter names, shapes and
initialisation, so checkpoints are interchangeable; "auto" = tuned on the CPU backend, plain on
GPU/TPU (`resolve_layer_impl`). Both use `CoordinateDropout` and pass `model.matmul_precision` to
every matmul (docs/performance.md "Plain vs tuned layers"). The architecture is in `transformer.py`.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def _fmix32(h: Array) -> Array:
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def coordinate_hash(key: Array, token_ids: Array, index: Array) -> Array:
  """Pseudo-random uint32 per (token id, index) pair under a 2-word key (broadcasting).

  For a fixed token id the map index -> hash is a bijection; different token ids and keys give
  unrelated streams. About 6x cheaper than threefry per element, which matters because dropout
  draws one number per activation (the hash of an element does not depend on the array layout).
  """
  a = _fmix32(token_ids ^ key[0])
  return _fmix32((a + index * jnp.uint32(0x9E3779B9)) ^ key[1])


class CoordinateDropout(nn.Module):
  """Inverted dropout whose mask is a counter-based hash of each element's logical coordinates.

  Every element's keep/drop bit comes from `coordinate_hash(site key, token_id, index)`, where
  `token_id` identifies the token (line slot x padded length + position in the line) and `index` the
  feature (or head x max_len + key position for attention weights). The mask of a token therefore
  does not depend on the layout of the batch: a padded `[batch, length]` batch and the same lines
  packed into one row (`packing.pack_lines`) drop exactly the same units, and a seed's
  masks do not depend on which other seeds it is trained with.

  Attributes:
    rate: the dropout rate (static); 0 = no dropout (nothing is drawn).
    keep: None, or the rate as data (a per-seed value, `per_seed.hparam_arrays`): (scale
      float32 [] = 1 / keep probability, threshold uint32 []), computed on the host from the
      rate as this module and XLA compute them from `rate`, so a rate handed in drops the
      units and scales by the value that the same rate compiled in would. Used only when
      `rate` > 0 (the largest of the run's rates); a rate of 0 in it keeps every unit, unscaled.
  """

  rate: float
  keep: Any = None

  @nn.compact
  def __call__(self, x: Array, token_ids: Array, index: Array, deterministic: bool) -> Array:
    """x: [..., F]; token_ids and index: uint32 arrays broadcastable to x's shape."""
    if deterministic or self.rate == 0.0:
      return x
    key = jax.random.key_data(self.make_rng("dropout"))
    if key.shape != (2,):  # non-threefry key implementations: derive two words
      key = jax.random.bits(jax.random.wrap_key_data(key), (2,), jnp.uint32)
    bits = coordinate_hash(key, token_ids.astype(jnp.uint32), index.astype(jnp.uint32))
    bits = jnp.broadcast_to(bits, x.shape)
    if self.keep is None:
      keep_prob = 1.0 - self.rate
      threshold = jnp.uint32(min(int(keep_prob * 2.0 ** 32), 2 ** 32 - 1))
      return jnp.where(bits < threshold, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros_like(x))
    # XLA compiles the division by a constant keep probability above as a multiplication by its
    # float32 reciprocal; `scale` is that reciprocal, so both give the same bits.
    scale, threshold = self.keep
    keep = (bits < threshold) | (threshold == jnp.uint32(2 ** 32 - 1))  # rate 0: every unit
    return jnp.where(keep, x * scale.astype(x.dtype), jnp.zeros_like(x))


def default_token_ids_and_positions(batch: int, length: int) -> tuple[Array, Array]:
  """Padded layout: token (b, l) has dropout id b * length + l (uint32) and position l."""
  ids = (jnp.arange(batch, dtype=jnp.uint32)[:, None] * jnp.uint32(length)
         + jnp.arange(length, dtype=jnp.uint32)[None, :])
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  return ids, positions


def feature_index(size: int) -> Array:
  """uint32 [size] feature indices 0..size-1 of a `CoordinateDropout` site."""
  return jnp.arange(size, dtype=jnp.uint32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x_NxI: Array, kernel_IxO: Array, precision: Any = None) -> Array:
  """`x @ kernel` ([..., I] x [I, O] -> [..., O]) whose kernel gradient is ONE [I, O] contraction.

  Same value and gradients as `jnp.dot`; only how the backward pass is written differs. JAX's
  own rule computes the kernel gradient as an [O, I] product and transposes it; under the seed
  vmap XLA on CPU keeps that [S, O, I] layout and every optimiser fusion then read the gradient
  transposed (strided) on every step. Here the gradient is `x^T dy` contracted over all leading
  axes of x, produced as [I, O] directly, and the input gradient is `(kernel dy^T)^T`, which
  spares a transposed copy of the kernel per step (docs/performance.md).

  Args:
    x_NxI: [..., I] activations (any number of leading axes).
    kernel_IxO: [I, O] weight of the same dtype.
    precision: `jax.lax.Precision` of the three matmuls (forward and both gradients), or None
      for JAX's default (`matmul_precision`).

  Returns:
    [..., O] activations.
  """
  return jnp.dot(x_NxI, kernel_IxO, precision=precision)


def _matmul_fwd(x_NxI, kernel_IxO, precision):
  return jnp.dot(x_NxI, kernel_IxO, precision=precision), (x_NxI, kernel_IxO)


def _matmul_bwd(precision, residuals, dy_NxO):
  x_NxI, kernel_IxO = residuals
  x_2d = x_NxI.reshape(-1, x_NxI.shape[-1])
  dy_2d = dy_NxO.reshape(-1, dy_NxO.shape[-1])
  dkernel_IxO = jax.lax.dot_general(x_2d, dy_2d, (((0,), (0,)), ((), ())), precision=precision)
  # dx = dy kernel^T, computed as (kernel dy^T)^T: written directly, XLA on CPU copied every
  # kernel into a transposed layout on each step under the seed vmap (one seed per device).
  dx_IxN = jax.lax.dot_general(kernel_IxO, dy_2d, (((1,), (1,)), ((), ())), precision=precision)
  dx_NxI = dx_IxN.T.reshape(*dy_NxO.shape[:-1], kernel_IxO.shape[0])
  return dx_NxI, dkernel_IxO


matmul.defvjp(_matmul_fwd, _matmul_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x_NxD: Array, scale_D: Array, bias_D: Array, eps: float) -> Array:
  """LayerNorm over the last axis (Ba et al. 2016), `(x - mean) / sqrt(var + eps) * scale + bias`.

  Same value as `flax.linen.LayerNorm` up to float rounding (two-pass variance here), with a
  closed-form VJP: `dx = rstd (g - mean(g) - xhat mean(g xhat))` with `g = dy scale`, and the
  parameter gradients as two sums over tokens. Differentiating `nn.LayerNorm` left XLA on CPU
  more and slower reductions: a depth-6 training step was 4-5% slower (docs/performance.md).

  Args:
    x_NxD: [..., D] float32 activations (any number of leading axes).
    scale_D, bias_D: [D] float32.
    eps: added to the variance.

  Returns:
    [..., D] float32.
  """
  return _layer_norm_fwd(x_NxD, scale_D, bias_D, eps)[0]


def _layer_norm_fwd(x_NxD, scale_D, bias_D, eps):
  mean = jnp.mean(x_NxD, axis=-1, keepdims=True)
  centred = x_NxD - mean
  rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
  xhat = centred * rstd
  return xhat * scale_D + bias_D, (xhat, rstd, scale_D)


def _layer_norm_bwd(eps, residuals, dy_NxD):
  del eps
  xhat, rstd, scale_D = residuals
  tokens = tuple(range(dy_NxD.ndim - 1))
  dbias = jnp.sum(dy_NxD, axis=tokens)
  dscale = jnp.sum(dy_NxD * xhat, axis=tokens)
  dxhat = dy_NxD * scale_D
  dx = rstd * (dxhat - jnp.mean(dxhat, axis=-1, keepdims=True)
               - xhat * jnp.mean(dxhat * xhat, axis=-1, keepdims=True))
  return dx, dscale, dbias


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nn.Module):
  """`nn.LayerNorm` (same `scale` [D] / `bias` [D] parameters and initialisation) computed with
  `layer_norm`; statistics in float32, output in `dtype`. Not a drop-in with flax's defaults:
  epsilon defaults to PyTorch's 1e-5 (flax: 1e-6) and dtype to float32 (flax: the input's).

  Attributes:
    epsilon: added to the variance.
    dtype: output dtype.
  """

  epsilon: float = 1e-5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    d = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones_init(), (d,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros_init(), (d,), jnp.float32)
    return layer_norm(x.astype(jnp.float32), scale, bias, self.epsilon).astype(self.dtype)


class Dense(nn.Module):
  """`nn.Dense` (same `kernel` [in, out] / `bias` [out] parameters, initialisation and outputs)
  computed with `matmul`, so that its kernel gradient comes out in the kernel's own layout.
  Maps [..., in] to [..., features] in `dtype`.

  Attributes:
    features: output size.
    kernel_init: initialiser of the float32 kernel.
    dtype: computation dtype (parameters are stored in float32).
    precision: `jax.lax.Precision` of the matmuls or None (JAX's default).
  """

  features: int
  kernel_init: Any
  dtype: Any = jnp.float32
  precision: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
    return (matmul(x.astype(self.dtype), kernel.astype(self.dtype), self.precision)
            + bias.astype(self.dtype))


class HeadProjection(nn.Module):
  """Bias-free projection between [..., d_model] and [..., num_heads, head_dim].

  Same parameter as `nn.DenseGeneral` would hold (`kernel` [d_model, num_heads, head_dim] when
  `split`, [num_heads, head_dim, d_model] when merging), applied as ONE 2-D matmul on the kernel
  reshaped to [d_model, num_heads * head_dim] (resp. [num_heads * head_dim, d_model]), a free
  reshape of a row-major array. With the 3-D kernel contracted directly, XLA on CPU transposed
  every attention kernel, and its gradient, on every training step (~10% of the op time of a
  depth-6 forward+backward; docs/performance.md).

  Attributes:
    heads: (num_heads, head_dim).
    split: True: [..., d_model] -> [..., num_heads, head_dim]; False: the reverse.
    kernel_init: initialiser called with the kernel's shape.
    dtype: computation dtype (the kernel is stored in float32).
    precision: `jax.lax.Precision` of the matmuls or None (JAX's default).
  """

  heads: tuple[int, int]
  split: bool
  kernel_init: Any
  dtype: Any = jnp.float32
  precision: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    h, p = self.heads
    if self.split:
      d = x.shape[-1]
      kernel = self.param("kernel", self.kernel_init, (d, h, p), jnp.float32)
      y = matmul(x.astype(self.dtype), kernel.reshape(d, h * p).astype(self.dtype),
                 self.precision)
      return y.reshape(*x.shape[:-1], h, p)
    kernel = self.param("kernel", self.kernel_init, (h, p, h * p), jnp.float32)  # d_model = h p
    return matmul(x.reshape(*x.shape[:-2], h * p).astype(self.dtype),
                  kernel.reshape(h * p, h * p).astype(self.dtype), self.precision)


# ----------------------------------------------------------------------------------------------
# Which layers the model uses: the tuned ones above or Flax's own (`model.layer_impl`).

LAYER_IMPLS = ("auto", "tuned", "plain")
# `model.matmul_precision` -> `jax.lax.Precision` of every matmul and einsum of the model. None:
# JAX's default (or `jax.default_matmul_precision` if set): full float32 on CPU, TF32 for float32
# on recent NVIDIA GPUs, one bfloat16 pass on TPU; HIGH: TF32 on GPU, 3 bfloat16 passes on TPU;
# HIGHEST: float32 (docs/performance.md "Matmul precision on GPU and TPU").
MATMUL_PRECISIONS = {"default": None, "high": jax.lax.Precision.HIGH,
                     "highest": jax.lax.Precision.HIGHEST}


def reshaped_init(init: Any, shape: tuple[int, ...]) -> Any:
  """Initialiser that draws with `init` at `shape` whatever shape it is asked for (the kernel's
  own [d, h, p] from `HeadProjection`, a flattened [d, h p] from `nn.DenseGeneral`), so that
  both layer sets draw the same numbers; the caller reshapes them to its kernel's shape."""

  def wrapped(key, requested_shape, dtype=jnp.float32):
    del requested_shape
    return init(key, shape, dtype)

  return wrapped


def resolve_layer_impl(layer_impl: str) -> str:
  """'tuned' or 'plain' for a `model.layer_impl` value.

  'auto' means 'tuned' on XLA's CPU backend (`jax.default_backend()`), where the tuned layers
  were measured faster, and 'plain' on GPU/TPU, where nothing has shown that they help
  (docs/performance.md). Calling it with 'auto' initialises JAX's backends.

  Raises:
    ValueError: `layer_impl` is not one of `LAYER_IMPLS`.
  """
  if layer_impl not in LAYER_IMPLS:
    raise ValueError(f"model.layer_impl must be one of {', '.join(LAYER_IMPLS)} "
                     f"(got {layer_impl!r})")
  if layer_impl == "auto":
    return "tuned" if jax.default_backend() == "cpu" else "plain"
  return layer_impl


def matmul_precision(name: str) -> Any:
  """`jax.lax.Precision` (or None, JAX's default) of a `model.matmul_precision` value.

  Raises:
    ValueError: `name` is not a key of `MATMUL_PRECISIONS`.
  """
  if name not in MATMUL_PRECISIONS:
    raise ValueError(f"model.matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)} "
                     f"(got {name!r})")
  return MATMUL_PRECISIONS[name]


def layer_set(layer_impl: str, precision_name: str = "default") -> types.SimpleNamespace:
  """The layer constructors of `model.TransformerLM` for `model.layer_impl`/`matmul_precision`.

  Both sets hold the same parameters (names, shapes, float32 storage, initialisers given by the
  caller) and compute the same values up to float rounding; "tuned" are this module's layers
  (custom VJPs, one 2-D matmul per head projection), "plain" Flax's `nn.Dense`, `nn.LayerNorm`
  (two-pass variance, as `layer_norm`) and `nn.DenseGeneral` under JAX's own autodiff.

  Args:
    layer_impl: "auto", "tuned" or "plain" (`resolve_layer_impl`).
    precision_name: "default", "high" or "highest" (`matmul_precision`).

  Returns:
    A namespace: `impl` ("tuned" | "plain"), `precision` (for the attention einsums) and the
    constructors `dense(features, kernel_init=, dtype=, name=)` ([..., in] -> [..., features]),
    `layer_norm(epsilon=, dtype=, name=)` ([..., D] -> [..., D]) and `head_projection(heads,
    split=, kernel_init=, dtype=, name=)` (as `HeadProjection`).

  Raises:
    ValueError: an unknown `layer_impl` or `precision_name`.
  """
  impl, precision = resolve_layer_impl(layer_impl), matmul_precision(precision_name)
  if impl == "tuned":
    return types.SimpleNamespace(
        impl=impl, precision=precision, dense=functools.partial(Dense, precision=precision),
        layer_norm=LayerNorm, head_projection=functools.partial(HeadProjection,
                                                                precision=precision))

  def head_projection(heads, split, kernel_init, dtype=jnp.float32, name=None):
    return nn.DenseGeneral(heads if split else heads[0] * heads[1],
                           axis=-1 if split else (-2, -1), use_bias=False,
                           kernel_init=kernel_init, dtype=dtype, param_dtype=jnp.float32,
                           precision=precision, name=name)

  return types.SimpleNamespace(
      impl=impl, precision=precision,
      dense=functools.partial(nn.Dense, param_dtype=jnp.float32, precision=precision),
      layer_norm=functools.partial(nn.LayerNorm, param_dtype=jnp.float32,
                                   use_fast_variance=False),
      head_projection=head_projection)


def unpack_lines(x_BxLxF: Array, unpack_BxNxM: Array) -> Array:
  """Gathers packed rows into the line layout: [B, L, ...] -> [B * N, M, ...].

  `unpack_BxNxM[b, j, o]` is the row position of token o of the j-th line packed in row b
  (`packing.pack_lines`); entries past a line's end may point anywhere in the row (they are
  computed and discarded).
  """
  b, n, m = unpack_BxNxM.shape
  y = jnp.take_along_axis(x_BxLxF, unpack_BxNxM.reshape(b, n * m, *([1] * (x_BxLxF.ndim - 2))),
                          axis=1)
  return y.reshape(b * n, m, *x_BxLxF.shape[2:])


def repack_lines(y_BNxMxF: Array, repack_BxL: Array) -> Array:
  """Gathers the line layout back into packed rows: [B * N, M, ...] -> [B, L, ...].

  `repack_BxL[b, q]` is the index j M + o of the line token stored at row position q. On line
  tokens this inverts `unpack_lines`; padding positions get whatever their index points at
  (`packing.pack_lines` uses 0, line 0's first token), and no line token ever reads them.
  """
  b = repack_BxL.shape[0]
  y = y_BNxMxF.reshape(b, -1, *y_BNxMxF.shape[2:])
  return jnp.take_along_axis(y, repack_BxL.reshape(*repack_BxL.shape, *([1] * (y.ndim - 2))),
                             axis=1)


def attention_logits(q_BxLxHxP: Array, k_BxCxHxP: Array, one_query: bool,
                     precision: Any = None) -> Array:
  """Scaled dot products q.k / sqrt(head_dim): [B, L, H, P] x [B, C, H, P] -> [B, H, L, C].

  `one_query` (L = 1, a decoding step) computes them as products summed over the head
  dimension: as the batched [1, P] x [P, C] dots of the einsum, XLA on CPU took twice as long.
  `precision`: `jax.lax.Precision` of the einsum or None (JAX's default).
  """
  p = q_BxLxHxP.shape[-1]
  dtype = q_BxLxHxP.dtype
  if one_query:
    logits_BxCxH = jnp.sum(q_BxLxHxP * k_BxCxHxP, axis=-1)
    return jnp.transpose(logits_BxCxH, (0, 2, 1))[:, :, None] / jnp.sqrt(p).astype(dtype)
  return (jnp.einsum("bqhp,bkhp->bhqk", q_BxLxHxP, k_BxCxHxP, precision=precision)
          / jnp.sqrt(p).astype(dtype))


def attention_context(weights_BxHxLxC: Array, v_BxCxHxP: Array, one_query: bool,
                      precision: Any = None) -> Array:
  """Attention-weighted values: [B, H, L, C] x [B, C, H, P] -> [B, L, H, P] in v's dtype.

  `one_query` and `precision` as in `attention_logits`.
  """
  dtype = v_BxCxHxP.dtype
  if one_query:
    weights_BxCxHx1 = jnp.transpose(weights_BxHxLxC[:, :, 0], (0, 2, 1))[..., None].astype(dtype)
    return jnp.sum(weights_BxCxHx1 * v_BxCxHxP, axis=1)[:, None]
  return jnp.einsum("bhqk,bkhp->bqhp", weights_BxHxLxC.astype(dtype), v_BxCxHxP,
                    precision=precision)
