"""The structural-grokking transformer language model (Murty et al., ACL 2023, §3).

`TransformerLM` reproduces the reference "TransformerLM" *as the released code builds it*
(`docs/REFERENCE.md` §1 "Model"): a decoder-only stack of post-LayerNorm layers,

    x = LN(x + Dropout(MHA(x)))
    x = LN(x + Dropout(W2 Dropout(ReLU(W1 x))))

with bias-free q/k/v/merge projections, token embeddings scaled by sqrt(d_model) plus sinusoidal
positions, an untied output layer (tied as an option), Xavier-uniform initialisers (ReLU gain for
W1) and dropout 0.1. The module is written for ONE seed; the seed axis is added with `jax.vmap`
in `train.py`.

The forward pass can also return every layer's attention weights and hidden states and accepts an
extra boolean attention mask, which the analysis (tree projections, attention entropy) needs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of `TransformerLM` (keyword-only, so nothing lands in the wrong slot).

  Attributes:
    vocab_size: rows of the embedding and output layers (`<pad>`=0, words, EOS, SOS).
    num_layers: number of transformer layers ("depth" in the paper).
    d_model: residual width.
    num_heads: attention heads; must divide `d_model`.
    d_ff: feed-forward hidden width (2048 in the released code: 4 x 512).
    dropout: dropout rate on attention probabilities, residual branches, feed-forward hidden
      layer and the input embedding + position sum.
    tied_embeddings: use the transposed input embedding as the output layer (the paper's
      description) instead of a separate linear layer (the released code).
    max_len: longest sequence the sinusoidal position table covers.
    dtype: computation dtype ("float32" or "bfloat16"); parameters stay float32.
    layer_norm_eps: LayerNorm epsilon (PyTorch's default 1e-5).
  """

  vocab_size: int
  num_layers: int = 6
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  dropout: float = 0.1
  tied_embeddings: bool = False
  max_len: int = 512
  dtype: str = "float32"
  layer_norm_eps: float = 1e-5

  def __post_init__(self):
    # The one statement of the model fields' rules: configlib.validate checks a run config's
    # `model` section by building a ModelConfig from it.
    rules = (
        (self.num_layers >= 1, "num_layers", "(depth) must be >= 1"),
        (self.d_model >= 1, "d_model", "must be >= 1"),
        (self.num_heads >= 1, "num_heads", "must be >= 1"),
        (self.d_model % max(self.num_heads, 1) == 0, "d_model",
         f"must be divisible by model.num_heads={self.num_heads}"),
        (self.d_ff >= 1, "d_ff", "must be >= 1"),
        (0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)"),
        (self.dtype in ("float32", "bfloat16"), "dtype", "must be float32 or bfloat16"),
    )
    for ok, name, rule in rules:
      if not ok:
        raise ValueError(f"invalid config: model.{name} {rule} (got {getattr(self, name)!r})")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @classmethod
  def from_config(cls, model_cfg: Any, vocab_size: int, max_len: int = 512) -> "ModelConfig":
    """Builds a ModelConfig from the `model` section of an ml_collections config.

    Each field of `model_cfg` sets the ModelConfig field of the same name (cast to the type of
    its default); fields it does not set keep their defaults.

    Raises:
      ValueError: `model_cfg` has a field ModelConfig lacks (or sets `vocab_size`/`max_len`,
        which come from the arguments), or a value breaks a rule of `__post_init__`.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in ("vocab_size",
                                                                           "max_len")}
    values = {}
    for name, value in model_cfg.items():
      if name not in fields:
        raise ValueError(f"invalid config: model.{name} is not a model field (fields: "
                         f"{', '.join(fields)})")
      default = fields[name].default
      values[name] = type(default)(value) if isinstance(default, (bool, int, float, str)) else value
    return cls(vocab_size=vocab_size, max_len=max_len, **values)


def xavier_uniform(fan_in: int, fan_out: int, gain: float = 1.0) -> nn.initializers.Initializer:
  """Glorot/Xavier-uniform initialiser with explicit fans (PyTorch `xavier_uniform_` semantics).

  The reference initialises fused matrices (e.g. the [2d, d] key-value projection) as one
  matrix, so the fans are given explicitly instead of being read from the (split) Flax shape.
  Bound = gain * sqrt(6 / (fan_in + fan_out)).
  """
  bound = gain * math.sqrt(6.0 / (fan_in + fan_out))

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def sinusoidal_positions(max_len: int, d_model: int) -> np.ndarray:
  """Sinusoidal position table [max_len, d_model] (Vaswani et al. 2017, §3.5).

  Even features sin(pos / 10000^(2i/d)), odd features cos(...), as the reference's `pos.pe`.
  """
  pos = np.arange(max_len, dtype=np.float64)[:, None]
  div = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-math.log(10000.0) / d_model))
  pe = np.zeros((max_len, d_model), dtype=np.float64)
  pe[:, 0::2] = np.sin(pos * div)
  pe[:, 1::2] = np.cos(pos * div)[:, : d_model // 2]
  return pe.astype(np.float32)


def causal_mask(length: int) -> Array:
  """Boolean [length, length] mask, True where query position q may attend to key k <= q."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))


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
  packed into one row (`train.py`, `train.packing`) drop exactly the same units, and a seed's
  masks do not depend on which other seeds it is trained with.
  """

  rate: float

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
    keep_prob = 1.0 - self.rate
    threshold = jnp.uint32(min(int(keep_prob * 2.0 ** 32), 2 ** 32 - 1))
    keep = bits < threshold
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros_like(x))


def default_token_ids_and_positions(batch: int, length: int) -> tuple[Array, Array]:
  """Padded layout: token (b, l) has dropout id b * length + l (uint32) and position l."""
  ids = (jnp.arange(batch, dtype=jnp.uint32)[:, None] * jnp.uint32(length)
         + jnp.arange(length, dtype=jnp.uint32)[None, :])
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  return ids, positions


def _feature_index(size: int) -> Array:
  return jnp.arange(size, dtype=jnp.uint32)


@jax.custom_vjp
def matmul(x_NxI: Array, kernel_IxO: Array) -> Array:
  """`x @ kernel` ([..., I] x [I, O] -> [..., O]) whose kernel gradient is ONE [I, O] contraction.

  Same value and gradients as `jnp.dot`; only how the backward pass is written differs. JAX's
  own rule computes the kernel gradient as an [O, I] product and transposes it; under the seed
  vmap XLA on CPU keeps that [S, O, I] layout and every optimiser fusion then read the gradient
  transposed (strided) on every step. Here the gradient is `x^T dy` contracted over all leading
  axes of x, produced as [I, O] directly, and the input gradient is `(kernel dy^T)^T`, which
  spares a transposed copy of the kernel per step (README, Performance).

  Args:
    x_NxI: [..., I] activations (any number of leading axes).
    kernel_IxO: [I, O] weight of the same dtype.

  Returns:
    [..., O] activations.
  """
  return jnp.dot(x_NxI, kernel_IxO)


def _matmul_fwd(x_NxI, kernel_IxO):
  return jnp.dot(x_NxI, kernel_IxO), (x_NxI, kernel_IxO)


def _matmul_bwd(residuals, dy_NxO):
  x_NxI, kernel_IxO = residuals
  x_2d = x_NxI.reshape(-1, x_NxI.shape[-1])
  dy_2d = dy_NxO.reshape(-1, dy_NxO.shape[-1])
  dkernel_IxO = jax.lax.dot_general(x_2d, dy_2d, (((0,), (0,)), ((), ())))
  # dx = dy kernel^T, computed as (kernel dy^T)^T: written directly, XLA on CPU copied every
  # kernel into a transposed layout on each step under the seed vmap (one seed per device).
  dx_IxN = jax.lax.dot_general(kernel_IxO, dy_2d, (((1,), (1,)), ((), ())))
  dx_NxI = dx_IxN.T.reshape(*dy_NxO.shape[:-1], kernel_IxO.shape[0])
  return dx_NxI, dkernel_IxO


matmul.defvjp(_matmul_fwd, _matmul_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x_NxD: Array, scale_D: Array, bias_D: Array, eps: float) -> Array:
  """LayerNorm over the last axis (Ba et al. 2016), `(x - mean) / sqrt(var + eps) * scale + bias`.

  Same value as `flax.linen.LayerNorm` up to float rounding (two-pass variance here), with a
  closed-form VJP: `dx = rstd (g - mean(g) - xhat mean(g xhat))` with `g = dy scale`, and the
  parameter gradients as two sums over tokens. Differentiating `nn.LayerNorm` left XLA on CPU
  more and slower reductions: a depth-6 training step was 4-5% slower (README, Performance).

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
  """

  features: int
  kernel_init: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
    return matmul(x.astype(self.dtype), kernel.astype(self.dtype)) + bias.astype(self.dtype)


class HeadProjection(nn.Module):
  """Bias-free projection between [..., d_model] and [..., num_heads, head_dim].

  Same parameter as `nn.DenseGeneral` would hold (`kernel` [d_model, num_heads, head_dim] when
  `split`, [num_heads, head_dim, d_model] when merging), applied as ONE 2-D matmul on the kernel
  reshaped to [d_model, num_heads * head_dim] (resp. [num_heads * head_dim, d_model]), a free
  reshape of a row-major array. With the 3-D kernel contracted directly, XLA on CPU transposed
  every attention kernel, and its gradient, on every training step (~10% of the op time of a
  depth-6 forward+backward; README, Performance).

  Attributes:
    heads: (num_heads, head_dim).
    split: True: [..., d_model] -> [..., num_heads, head_dim]; False: the reverse.
    kernel_init: initialiser called with the kernel's shape.
    dtype: computation dtype (the kernel is stored in float32).
  """

  heads: tuple[int, int]
  split: bool
  kernel_init: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    h, p = self.heads
    if self.split:
      d = x.shape[-1]
      kernel = self.param("kernel", self.kernel_init, (d, h, p), jnp.float32)
      y = matmul(x.astype(self.dtype), kernel.reshape(d, h * p).astype(self.dtype))
      return y.reshape(*x.shape[:-1], h, p)
    kernel = self.param("kernel", self.kernel_init, (h, p, h * p), jnp.float32)  # d_model = h p
    return matmul(x.reshape(*x.shape[:-2], h * p).astype(self.dtype),
                  kernel.reshape(h * p, h * p).astype(self.dtype))


def unpack_lines(x_BxLxF: Array, unpack_BxNxM: Array) -> Array:
  """Gathers packed rows into the line layout: [B, L, ...] -> [B * N, M, ...].

  `unpack_BxNxM[b, j, o]` is the row position of token o of the j-th line packed in row b
  (`train.pack_lines`); entries past a line's end may point anywhere in the row (they are
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
  (`train.pack_lines` uses 0, line 0's first token), and no line token ever reads them.
  """
  b = repack_BxL.shape[0]
  y = y_BNxMxF.reshape(b, -1, *y_BNxMxF.shape[2:])
  return jnp.take_along_axis(y, repack_BxL.reshape(*repack_BxL.shape, *([1] * (y.ndim - 2))),
                             axis=1)


class MultiHeadAttention(nn.Module):
  """Bias-free multi-head self-attention returning its attention weights.

  Parameters: `query`, `key`, `value` kernels [d_model, num_heads, head_dim] and `out` kernel
  [num_heads, head_dim, d_model]. Xavier fans follow the reference's fused matrices: q [d, d],
  kv [2d, d], merge [d, d].
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_BxHxLxL: Array, deterministic: bool,
               ids_BxL: Array | None = None, positions_BxL: Array | None = None,
               lines: tuple[Array, Array] | None = None, decode: bool = False):
    """Returns (output [B, L, d_model], attention weights float32, before attention dropout).

    With `decode` (incremental decoding, `TransformerLM`): the keys and values of the L tokens
    are written into the `cache` collection (`cached_key`, `cached_value` [B, C, H, P]) at the
    slots `positions_BxL` of their own line, and each query attends to the cache slots <= its
    position (`mask_BxHxLxL` is then not used); the weights are [B, H, L, C]. The variables
    are created, as zeros of the input's length (C = L), on the first call (`init_cache`).

    `ids_BxL`/`positions_BxL` identify tokens for the dropout masks (if either is None both take
    the padded layout's defaults). Without `lines` the weights are [B, H, L, L] under
    `mask_BxHxLxL` (boolean, broadcastable to that shape). With `lines` =
    (unpack_index [B, N, M], repack_index [B, L]) the rows hold N packed lines of at most M
    tokens (`train.pack_lines`): queries, keys and values are gathered into the line layout
    [B * N, M] (`unpack_lines`), each line attends causally to itself only (`mask_BxHxLxL`,
    `ids_BxL` and `positions_BxL` are then not used: line j's token o has the padded layout's
    id (b N + j) M + o and position o), the weights are [B * N, H, M, M] (rows past a line's
    end are computed from whatever the unpack index points at and are meaningless), and the
    attention output is gathered back to the rows (`repack_lines`).
    """
    cfg = self.config
    d, h, p = cfg.d_model, cfg.num_heads, cfg.head_dim
    if ids_BxL is None or positions_BxL is None:
      ids_BxL, positions_BxL = default_token_ids_and_positions(*x_BxLxD.shape[:2])
    dtype = jnp.dtype(cfg.dtype)
    proj = lambda name, fan_out: HeadProjection(
        (h, p), split=True, dtype=dtype, name=name,
        kernel_init=_reshaped(xavier_uniform(d, fan_out), (d, h, p)))
    q_BxLxHxP = proj("query", d)(x_BxLxD)
    k_BxLxHxP = proj("key", 2 * d)(x_BxLxD)
    v_BxLxHxP = proj("value", 2 * d)(x_BxLxD)
    if decode:  # from here on the keys and values are the cache's C slots
      k_BxLxHxP, v_BxLxHxP, mask_BxHxLxL = self._update_cache(k_BxLxHxP, v_BxLxHxP,
                                                              positions_BxL)
    if lines is not None:  # from here on B, L = lines, line length (B * N, M)
      unpack_BxNxM, repack_BxL = lines
      q_BxLxHxP, k_BxLxHxP, v_BxLxHxP = (unpack_lines(t, unpack_BxNxM)
                                         for t in (q_BxLxHxP, k_BxLxHxP, v_BxLxHxP))
      ids_BxL, positions_BxL = default_token_ids_and_positions(*q_BxLxHxP.shape[:2])
      mask_BxHxLxL = causal_mask(q_BxLxHxP.shape[1])[None, None]
    # One query per line (a decoding step): products summed over the head dimension; as the
    # batched [1, P] x [P, C] dots of the einsum, XLA on CPU took twice as long.
    one_query = decode and q_BxLxHxP.shape[1] == 1
    if one_query:
      logits_BxCxH = jnp.sum(q_BxLxHxP * k_BxLxHxP, axis=-1)
      logits_BxHxLxL = (jnp.transpose(logits_BxCxH, (0, 2, 1))[:, :, None]
                        / jnp.sqrt(p).astype(dtype))
    else:
      logits_BxHxLxL = (jnp.einsum("bqhp,bkhp->bhqk", q_BxLxHxP, k_BxLxHxP)
                        / jnp.sqrt(p).astype(dtype))
    logits_BxHxLxL = jnp.where(mask_BxHxLxL, logits_BxHxLxL, jnp.finfo(dtype).min)
    weights_BxHxLxL = jax.nn.softmax(logits_BxHxLxL.astype(jnp.float32), axis=-1)
    # Element (b, head, q, k) is identified by token q and (head, position of key k).
    index = (jnp.arange(h, dtype=jnp.uint32)[None, :, None, None] * jnp.uint32(cfg.max_len)
             + positions_BxL.astype(jnp.uint32)[:, None, None, :])
    dropped = CoordinateDropout(cfg.dropout, name="attention_dropout")(
        weights_BxHxLxL, ids_BxL[:, None, :, None], index, deterministic)
    if one_query:
      weights_BxCxHx1 = jnp.transpose(dropped[:, :, 0], (0, 2, 1))[..., None].astype(dtype)
      ctx_BxLxHxP = jnp.sum(weights_BxCxHx1 * v_BxLxHxP, axis=1)[:, None]
    else:
      ctx_BxLxHxP = jnp.einsum("bhqk,bkhp->bqhp", dropped.astype(dtype), v_BxLxHxP)
    if lines is not None:
      ctx_BxLxHxP = repack_lines(ctx_BxLxHxP, repack_BxL)
    out_BxLxD = HeadProjection(
        (h, p), split=False, dtype=dtype, name="out",
        kernel_init=_reshaped(xavier_uniform(d, d), (h, p, d)))(ctx_BxLxHxP)
    return out_BxLxD, weights_BxHxLxL

  def _update_cache(self, k_BxLxHxP: Array, v_BxLxHxP: Array, positions_BxL: Array
                    ) -> tuple[Array, Array, Array]:
    """Writes k/v at their lines' slots; returns (keys, values [B, C, H, P], mask [B, 1, L, C])."""
    zeros = lambda: jnp.zeros(k_BxLxHxP.shape, k_BxLxHxP.dtype)
    cached_k = self.variable("cache", "cached_key", zeros)
    cached_v = self.variable("cache", "cached_value", zeros)
    rows_Bx1 = jnp.arange(k_BxLxHxP.shape[0])[:, None]
    cached_k.value = cached_k.value.at[rows_Bx1, positions_BxL].set(k_BxLxHxP)
    cached_v.value = cached_v.value.at[rows_Bx1, positions_BxL].set(v_BxLxHxP)
    slots_C = jnp.arange(cached_k.value.shape[1])
    mask_Bx1xLxC = (slots_C[None, None, None, :] <= positions_BxL[:, None, :, None])
    return cached_k.value, cached_v.value, mask_Bx1xLxC


def _reshaped(init, shape):
  """Initialiser that draws with `init` and reshapes to the requested Flax kernel shape."""

  def wrapped(key, requested_shape, dtype=jnp.float32):
    del requested_shape
    return init(key, shape, dtype)

  return wrapped


class TransformerLayer(nn.Module):
  """One post-LayerNorm transformer layer (docs/REFERENCE.md §1 "Model")."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_BxHxLxL: Array, deterministic: bool,
               ids_BxL: Array, positions_BxL: Array, lines: tuple[Array, Array] | None = None,
               decode: bool = False):
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    ids = ids_BxL[..., None]
    drop = lambda y, name: CoordinateDropout(cfg.dropout, name=name)(
        y, ids, _feature_index(y.shape[-1]), deterministic)
    attn_BxLxD, weights = MultiHeadAttention(cfg, name="attention")(
        x_BxLxD, mask_BxHxLxL, deterministic, ids_BxL, positions_BxL, lines, decode)
    x_BxLxD = LayerNorm(epsilon=cfg.layer_norm_eps, dtype=dtype, name="norm1")(
        x_BxLxD + drop(attn_BxLxD, "attention_output_dropout"))
    h_BxLxF = Dense(cfg.d_ff, dtype=dtype, name="linear1",
                    kernel_init=xavier_uniform(cfg.d_model, cfg.d_ff, gain=math.sqrt(2.0)))(
                        x_BxLxD)
    h_BxLxF = drop(nn.relu(h_BxLxF), "hidden_dropout")
    ff_BxLxD = Dense(cfg.d_model, dtype=dtype, name="linear2",
                     kernel_init=xavier_uniform(cfg.d_ff, cfg.d_model))(h_BxLxF)
    x_BxLxD = LayerNorm(epsilon=cfg.layer_norm_eps, dtype=dtype, name="norm2")(
        x_BxLxD + drop(ff_BxLxD, "output_dropout"))
    return x_BxLxD, weights


class TransformerLM(nn.Module):
  """Causal transformer LM of the structural-grokking study, for one seed.

  Call signature: `apply({'params': p}, tokens_BxL, deterministic=..., attention_mask=None,
  return_internals=False, rngs={'dropout': key})`.

  Args (of `__call__`):
    tokens_BxL: int32 [batch, length] input ids (`SOS w1 ... wn` then `<pad>`=0).
    deterministic: disable dropout (evaluation/analysis).
    attention_mask: optional bool [batch, length, length] or [batch, heads, length, length];
      True = may attend. It is AND-ed with the causal mask in every layer.
    positions_BxL: optional int32 [batch, length] position of each token for the sinusoidal
      table (default 0..length-1); packed training rows restart it at every line.
    token_ids_BxL: optional uint32 [batch, length] identity of each token for the dropout masks
      (default b * length + l); see `CoordinateDropout`.
    lines: optional (unpack_index int32 [batch, N, M], repack_index int32 [batch, length]) of
      rows that pack N lines of at most M tokens each (`train.pack_lines`): attention then runs
      in the line layout [batch * N, M], causal within each line (`MultiHeadAttention`), so its
      cost follows the lines, not the row length. Excludes `attention_mask`.
    decode: incremental (KV-cached) decoding, deterministic only: pass `positions_BxL` (the
      slot of each token in its line) and a mutable `cache` collection (`init_cache`,
      `apply_cached`); every layer writes the keys and values of `tokens_BxL` into its cache at
      those slots and each token attends to its line's slots <= its position, so a line's
      prefix can be fed in one call and then one token per call, with lines at different
      positions. The logits equal those of the full forward pass on the line up to float
      rounding. Excludes `attention_mask` and `lines`.
    return_internals: also return `{'attention': [num_layers, batch, heads, L, L] float32,
      'hidden': [num_layers + 1, batch, L, d_model]}` (hidden[0] = embedding + positions after
      dropout, hidden[l] = output of layer l); with `lines` the attention is
      [num_layers, batch * N, heads, M, M]; with `decode` [num_layers, batch, heads, L, C].

  Returns:
    logits [batch, length, vocab_size] (float32), or `(logits, internals)`.

  Raises:
    ValueError: a sequence longer than `max_len`; `attention_mask` with `lines`; `decode` with
      dropout on, without `positions_BxL`, or with `attention_mask` / `lines`.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL: Array, *, deterministic: bool = True,
               attention_mask: Array | None = None, positions_BxL: Array | None = None,
               token_ids_BxL: Array | None = None, lines: tuple[Array, Array] | None = None,
               return_internals: bool = False, decode: bool = False):
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    _, length = tokens_BxL.shape
    if length > cfg.max_len:
      raise ValueError(f"sequence length {length} exceeds model max_len {cfg.max_len}")
    if decode and (not deterministic or positions_BxL is None or attention_mask is not None
                   or lines is not None):
      raise ValueError("decode=True needs deterministic=True and positions_BxL, and takes "
                       "neither attention_mask nor lines")
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, name="embedding",
                     embedding_init=xavier_uniform(cfg.vocab_size, cfg.d_model))
    x_BxLxD = embed(tokens_BxL).astype(dtype) * jnp.asarray(math.sqrt(cfg.d_model), dtype)
    default_ids, default_positions = default_token_ids_and_positions(tokens_BxL.shape[0], length)
    if positions_BxL is None:  # packed sequences pass each line's positions (restarting at 0)
      positions_BxL = default_positions
    if token_ids_BxL is None:  # padded layout: token (b, l) has id b * length + l
      token_ids_BxL = default_ids
    table = jnp.asarray(sinusoidal_positions(cfg.max_len, cfg.d_model), dtype)
    x_BxLxD = x_BxLxD + table[positions_BxL]
    x_BxLxD = CoordinateDropout(cfg.dropout, name="embedding_dropout")(
        x_BxLxD, token_ids_BxL[..., None], _feature_index(cfg.d_model), deterministic)

    mask = causal_mask(length)[None, None]
    if attention_mask is not None and lines is not None:
      raise ValueError("pass either attention_mask or lines (packed rows), not both")
    if attention_mask is not None:
      extra = attention_mask if attention_mask.ndim == 4 else attention_mask[:, None]
      mask = jnp.logical_and(mask, extra)

    hidden, attention = [x_BxLxD], []
    for i in range(cfg.num_layers):
      x_BxLxD, weights = TransformerLayer(cfg, name=f"layer_{i}")(
          x_BxLxD, mask, deterministic, token_ids_BxL, positions_BxL, lines, decode)
      hidden.append(x_BxLxD)
      attention.append(weights)

    if cfg.tied_embeddings:
      logits_BxLxV = embed.attend(x_BxLxD.astype(jnp.float32))
    else:
      logits_BxLxV = Dense(cfg.vocab_size, name="output",
                           kernel_init=xavier_uniform(cfg.d_model, cfg.vocab_size))(
                               x_BxLxD.astype(jnp.float32))
    logits_BxLxV = logits_BxLxV.astype(jnp.float32)
    if return_internals:
      return logits_BxLxV, {"attention": jnp.stack(attention), "hidden": jnp.stack(hidden)}
    return logits_BxLxV


def init_params(config: ModelConfig, key: Array, length: int = 8):
  """Initial parameters of one seed (a pytree of float32 arrays)."""
  tokens = jnp.zeros((1, length), jnp.int32)
  return TransformerLM(config).init({"params": key}, tokens, deterministic=True)["params"]


def num_params(params) -> int:
  """Number of scalars in a parameter pytree (per seed if unstacked)."""
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def init_cache(model: TransformerLM, params, batch: int, length: int):
  """Empty (all-zero) key/value cache of `length` slots for `batch` lines of one seed.

  Args:
    model: the `TransformerLM`.
    params: its parameters (one seed; only their shapes are used).
    batch: lines decoded together.
    length: cache slots C, i.e. one more than the last position that will be fed.

  Returns:
    The `cache` collection: per layer `cached_key` / `cached_value` [batch, C, heads, head_dim]
    in the model's computation dtype.

  Raises:
    ValueError: `length` exceeds the model's `max_len`.
  """
  tokens = jnp.zeros((batch, length), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  _, shapes = jax.eval_shape(
      lambda p: model.apply({"params": p}, tokens, positions_BxL=positions, decode=True,
                            mutable=["cache"]), params)
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])


def apply_cached(model: TransformerLM, params, tokens_BxT: Array, positions_BxT: Array, cache
                 ) -> tuple[Array, Any]:
  """One incremental decoding call of one seed: logits of T new tokens per line, and the cache.

  Args:
    model: the `TransformerLM`.
    params: its parameters (one seed).
    tokens_BxT: int32 [batch, T] tokens to feed (a prefix, or the last decoded token with T=1).
    positions_BxT: int32 [batch, T] their positions in their lines (< the cache's length C);
      each token attends to its line's tokens already in the cache at positions <= its own.
    cache: from `init_cache` or a previous `apply_cached` call.

  Returns:
    (logits [batch, T, vocab_size] float32, the updated cache).
  """
  logits, mutated = model.apply({"params": params, "cache": cache}, tokens_BxT,
                                positions_BxL=positions_BxT, decode=True, mutable=["cache"])
  return logits, mutated["cache"]
