"""The structural-grokking transformer language model (Murty et al., ACL 2023, §3).

`TransformerLM` reproduces the reference "TransformerLM" *as the released code builds it*
(`docs/REFERENCE.md` §1 "Model"): a decoder-only stack of post-LayerNorm layers,

    x = LN(x + Dropout(MHA(x)))
    x = LN(x + Dropout(W2 Dropout(ReLU(W1 x))))

with bias-free q/k/v/merge projections, token embeddings scaled by sqrt(d_model) plus sinusoidal
positions, an untied output layer (tied as an option), Xavier-uniform initialisers (ReLU gain for
W1) and dropout 0.1. Written for ONE seed; `step.py` adds the seed axis with `jax.vmap`. This
file is the architecture: the layers that make it fast on CPU are in `layers.py`, KV-cached
decoding in `sg_jax/evaluation/decoding.py`, and reading the intermediates it sows (attention
probabilities, head and MLP outputs, hidden states) in `intermediates.py`. The embedding, output
and MLP-block functions here (`embed_tokens`, `add_positions`, `output_logits`, `feed_forward`)
are shared with the encoder-decoder (`encoder_decoder.py`). `head_mask`/`mlp_mask` with optional means
mean-ablate heads and MLP blocks, `x <- (x - mu) * z + mu` (the heuristic-core pruning of
Bhaskar et al. 2024, `docs/REFERENCE.md` §2); left None, the computation is the plain model's.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.models import layers
from sg_jax.models.attention_masks import line_key_mask, line_mask
from sg_jax.models.interventions import check_interventions, mean_ablate
from sg_jax.models.model_config import ModelConfig

Array = jax.Array

INTERMEDIATES = "intermediates"  # the flax collection the forward pass sows into


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


def embed_tokens(cfg: ModelConfig, tokens_BxL: Array, positions_BxL: Array | None,
                 token_ids_BxL: Array | None) -> tuple[nn.Embed, Array, Array, Array]:
  """The token embedding of a model's `__call__` (`TransformerLM`, `EncoderDecoder`).

  Creates the `embedding` submodule (Xavier-uniform, [vocab_size, d_model]) in the calling
  module and scales the looked-up rows by sqrt(d_model) (Vaswani et al. 2017, §3.4).

  Args:
    cfg: the model config.
    tokens_BxL: int32 [B, L] token ids.
    positions_BxL, token_ids_BxL: the caller's, or None for the padded layout's defaults
      (`layers.default_token_ids_and_positions`).

  Returns:
    (the `nn.Embed` module (the tied output layer reads its table), embeddings [B, L, d_model]
    in the model's dtype, positions int32 [B, L], token ids uint32 [B, L]).
  """
  dtype = jnp.dtype(cfg.dtype)
  embed = nn.Embed(cfg.vocab_size, cfg.d_model, name="embedding",
                   embedding_init=xavier_uniform(cfg.vocab_size, cfg.d_model))
  e_BxLxD = embed(tokens_BxL).astype(dtype) * jnp.asarray(math.sqrt(cfg.d_model), dtype)
  default_ids, default_positions = layers.default_token_ids_and_positions(*tokens_BxL.shape)
  if positions_BxL is None:  # packed sequences pass each line's positions (restarting at 0)
    positions_BxL = default_positions
  if token_ids_BxL is None:  # padded layout: token (b, l) has id b * length + l
    token_ids_BxL = default_ids
  return embed, e_BxLxD, positions_BxL, token_ids_BxL


def add_positions(cfg: ModelConfig, e_BxLxD: Array, positions_BxL: Array, token_ids_BxL: Array,
                  deterministic: bool, name: str = "embedding_dropout") -> Array:
  """Embeddings plus sinusoidal positions (`sinusoidal_positions`), then the dropout site `name`
  (`layers.CoordinateDropout`): [B, L, d_model] in the model's dtype."""
  table = jnp.asarray(sinusoidal_positions(cfg.max_len, cfg.d_model), jnp.dtype(cfg.dtype))
  x_BxLxD = e_BxLxD + table[positions_BxL]
  return layers.CoordinateDropout(cfg.dropout, cfg.dropout_keep, name=name)(
      x_BxLxD, token_ids_BxL[..., None], layers.feature_index(cfg.d_model), deterministic)


def with_attention_mask(mask: Array, attention_mask: Array | None) -> Array:
  """`mask` AND-ed with a caller's `attention_mask` ([B, L, L] or [B, H, L, L]; None = as is)."""
  if attention_mask is None:
    return mask
  extra = attention_mask if attention_mask.ndim == 4 else attention_mask[:, None]
  return jnp.logical_and(mask, extra)


def output_logits(cfg: ModelConfig, embed: nn.Embed, y_BxLxD: Array) -> Array:
  """The output layer: float32 logits [B, L, vocab_size] of the last hidden states, through the
  embedding table when `tied_embeddings`, else the `output` Dense layer created here."""
  lay = layers.layer_set(cfg.layer_impl, cfg.matmul_precision)
  if cfg.tied_embeddings:  # embed.attend, at the model's matmul precision
    logits_BxLxV = jnp.dot(y_BxLxD.astype(jnp.float32), embed.embedding.T,
                           precision=lay.precision)
  else:
    logits_BxLxV = lay.dense(cfg.vocab_size, name="output",
                             kernel_init=xavier_uniform(cfg.d_model, cfg.vocab_size))(
                                 y_BxLxD.astype(jnp.float32))
  return logits_BxLxV.astype(jnp.float32)


def layer_dropout(cfg: ModelConfig, ids_BxL: Array, deterministic: bool):
  """`drop(y [B, L, F], site name) -> y` with dropout: a layer's `CoordinateDropout` sites."""
  ids = ids_BxL[..., None]
  return lambda y, name: layers.CoordinateDropout(cfg.dropout, cfg.dropout_keep, name=name)(
      y, ids, layers.feature_index(y.shape[-1]), deterministic)


def feed_forward(cfg: ModelConfig, x_BxLxD: Array, drop, mlp_mask: Array | None = None,
                 mlp_means: Array | None = None) -> Array:
  """A layer's MLP block W2 Dropout(ReLU(W1 x)) (submodules `linear1`, `hidden_dropout`,
  `linear2` of the calling layer), then the optional intervention (`mean_ablate`): its output
  [B, L, d_model] before the output dropout and the residual add."""
  dtype, lay = jnp.dtype(cfg.dtype), layers.layer_set(cfg.layer_impl, cfg.matmul_precision)
  h_BxLxF = lay.dense(cfg.d_ff, dtype=dtype, name="linear1",
                      kernel_init=xavier_uniform(cfg.d_model, cfg.d_ff, gain=math.sqrt(2.0)))(
                          x_BxLxD)
  h_BxLxF = drop(nn.relu(h_BxLxF), "hidden_dropout")
  ff_BxLxD = lay.dense(cfg.d_model, dtype=dtype, name="linear2",
                       kernel_init=xavier_uniform(cfg.d_ff, cfg.d_model))(h_BxLxF)
  if mlp_mask is not None:
    ff_BxLxD = mean_ablate(ff_BxLxD, mlp_mask, mlp_means)
  return ff_BxLxD


class MultiHeadAttention(nn.Module):
  """Bias-free multi-head self-attention (docs/REFERENCE.md §1 "Model").

  Parameters: `query`, `key`, `value` kernels [d_model, num_heads, head_dim] and `out` kernel
  [num_heads, head_dim, d_model]. Xavier fans follow the reference's fused matrices: q [d, d],
  kv [2d, d], merge [d, d]. Sows `attention` (the probabilities, float32, before attention
  dropout) and `heads` (the per-head outputs [B, L, H, P] that enter the merge projection, after
  any intervention) into the `'intermediates'` collection.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_BxHxLxL: Array, deterministic: bool,
               ids_BxL: Array | None = None, positions_BxL: Array | None = None,
               lines: tuple[Array, Array] | None = None, decode: bool = False,
               head_mask_H: Array | None = None, head_means: Array | None = None,
               memory_BxLxD: Array | None = None) -> Array:
    """Returns the attention output [B, L, d_model].

    With `memory_BxLxD` (cross-attention, `models.encoder_decoder`) the keys and values are
    projected from it instead of from `x_BxLxD` (the same row layout and length); the
    parameters and their initialisation are the same.

    The sown probabilities are [B, H, L, L] under `mask_BxHxLxL` (boolean, broadcastable to
    that shape) in the padded layout.

    With `decode` (incremental decoding, `TransformerLM`): the keys and values of the L tokens
    are written into the `cache` collection (`cached_key`, `cached_value` [B, C, H, P]) at the
    slots `positions_BxL` of their own line, and each query attends to the cache slots <= its
    position (`mask_BxHxLxL` is then not used); the probabilities are [B, H, L, C]. The
    variables are created, as zeros of the input's length (C = L), on the first call
    (`init_cache`).

    `ids_BxL`/`positions_BxL` identify tokens for the dropout masks (if either is None both take
    the padded layout's defaults). With `lines` = (unpack_index [B, N, M], repack_index [B, L])
    the rows hold N packed lines of at most M tokens (`packing.pack_lines`): queries, keys and
    values are gathered into the line layout [B * N, M] (`layers.unpack_lines`), each line
    attends to itself only (`mask_BxHxLxL` is then the line layout's mask [B * N, 1, M, M], made
    by `TransformerLM`; `ids_BxL` and `positions_BxL` are not used: line j's token o has the
    padded layout's id (b N + j) M + o and position o), the
    probabilities are [B * N, H, M, M] (rows past a line's end are computed from whatever the
    unpack index points at and are meaningless), and the head outputs are gathered back to the
    rows (`layers.repack_lines`) before the intervention and the merge projection.

    `head_mask_H` (float [H]) and `head_means` ([H, P] or [B, L, H, P] in the row layout)
    mean-ablate head outputs (`mean_ablate`).
    """
    cfg = self.config
    d, h, p = cfg.d_model, cfg.num_heads, cfg.head_dim
    if ids_BxL is None or positions_BxL is None:
      ids_BxL, positions_BxL = layers.default_token_ids_and_positions(*x_BxLxD.shape[:2])
    dtype, lay = jnp.dtype(cfg.dtype), layers.layer_set(cfg.layer_impl, cfg.matmul_precision)
    proj = lambda name, fan_out: lay.head_projection(
        (h, p), split=True, dtype=dtype, name=name,
        kernel_init=layers.reshaped_init(xavier_uniform(d, fan_out), (d, h, p)))
    q_BxLxHxP = proj("query", d)(x_BxLxD)
    kv_BxLxD = x_BxLxD if memory_BxLxD is None else memory_BxLxD
    k_BxLxHxP = proj("key", 2 * d)(kv_BxLxD)
    v_BxLxHxP = proj("value", 2 * d)(kv_BxLxD)
    if decode:  # from here on the keys and values are the cache's C slots
      k_BxLxHxP, v_BxLxHxP, mask_BxHxLxL = self._update_cache(k_BxLxHxP, v_BxLxHxP,
                                                              positions_BxL)
    if lines is not None:  # from here on B, L = lines, line length (B * N, M)
      unpack_BxNxM, repack_BxL = lines
      q_BxLxHxP, k_BxLxHxP, v_BxLxHxP = (layers.unpack_lines(t, unpack_BxNxM)
                                         for t in (q_BxLxHxP, k_BxLxHxP, v_BxLxHxP))
      ids_BxL, positions_BxL = layers.default_token_ids_and_positions(*q_BxLxHxP.shape[:2])
    one_query = decode and q_BxLxHxP.shape[1] == 1
    logits_BxHxLxL = layers.attention_logits(q_BxLxHxP, k_BxLxHxP, one_query, lay.precision)
    logits_BxHxLxL = jnp.where(mask_BxHxLxL, logits_BxHxLxL, jnp.finfo(dtype).min)
    weights_BxHxLxL = jax.nn.softmax(logits_BxHxLxL.astype(jnp.float32), axis=-1)
    self.sow(INTERMEDIATES, "attention", weights_BxHxLxL)
    # Element (b, head, q, k) is identified by token q and (head, position of key k).
    index = (jnp.arange(h, dtype=jnp.uint32)[None, :, None, None] * jnp.uint32(cfg.max_len)
             + positions_BxL.astype(jnp.uint32)[:, None, None, :])
    dropped = layers.CoordinateDropout(cfg.dropout, cfg.dropout_keep, name="attention_dropout")(
        weights_BxHxLxL, ids_BxL[:, None, :, None], index, deterministic)
    ctx_BxLxHxP = layers.attention_context(dropped, v_BxLxHxP, one_query, lay.precision)
    if lines is not None:
      ctx_BxLxHxP = layers.repack_lines(ctx_BxLxHxP, repack_BxL)
    if head_mask_H is not None:
      ctx_BxLxHxP = mean_ablate(ctx_BxLxHxP, head_mask_H[:, None], head_means)
    self.sow(INTERMEDIATES, "heads", ctx_BxLxHxP)
    return lay.head_projection(
        (h, p), split=False, dtype=dtype, name="out",
        kernel_init=layers.reshaped_init(xavier_uniform(d, d), (h, p, d)))(ctx_BxLxHxP)

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


class TransformerLayer(nn.Module):
  """One post-LayerNorm transformer layer (docs/REFERENCE.md §1 "Model").

  Sows `mlp`, the MLP block's output [B, L, d_model] before dropout and the residual add (after
  any intervention), into the `'intermediates'` collection.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: Array, mask_BxHxLxL: Array, deterministic: bool,
               ids_BxL: Array, positions_BxL: Array, lines: tuple[Array, Array] | None = None,
               decode: bool = False, head_mask_H: Array | None = None,
               head_means: Array | None = None, mlp_mask: Array | None = None,
               mlp_means: Array | None = None) -> Array:
    """Returns the layer's output [B, L, d_model]; masks and means are this layer's slices."""
    cfg = self.config
    dtype, lay = jnp.dtype(cfg.dtype), layers.layer_set(cfg.layer_impl, cfg.matmul_precision)
    drop = layer_dropout(cfg, ids_BxL, deterministic)
    attn_BxLxD = MultiHeadAttention(cfg, name="attention")(
        x_BxLxD, mask_BxHxLxL, deterministic, ids_BxL, positions_BxL, lines, decode,
        head_mask_H, head_means)
    x_BxLxD = lay.layer_norm(epsilon=cfg.layer_norm_eps, dtype=dtype, name="norm1")(
        x_BxLxD + drop(attn_BxLxD, "attention_output_dropout"))
    ff_BxLxD = feed_forward(cfg, x_BxLxD, drop, mlp_mask, mlp_means)
    self.sow(INTERMEDIATES, "mlp", ff_BxLxD)
    return lay.layer_norm(epsilon=cfg.layer_norm_eps, dtype=dtype, name="norm2")(
        x_BxLxD + drop(ff_BxLxD, "output_dropout"))


class TransformerLM(nn.Module):
  """The transformer LM of the structural-grokking study, for one seed: causal, or
  bidirectional / prefix attention as the objective sets (`ModelConfig.attention`).

  Call signature: `apply({'params': p}, tokens_BxL, deterministic=..., attention_mask=None,
  rngs={'dropout': key})`; shapes below are one seed's (vmap adds the seed axis in front).

  Args (of `__call__`):
    tokens_BxL: int32 [batch, length] input ids (`SOS w1 ... wn` then `<pad>`=0).
    deterministic: disable dropout (evaluation/analysis).
    attention_mask: optional bool [batch, length, length] or [batch, heads, length, length];
      True = may attend. It is AND-ed with the attention's line mask (`attention_masks`) in
      every layer.
    positions_BxL: optional int32 [batch, length] position of each token for the sinusoidal
      table (default 0..length-1); packed training rows restart it at every line.
    token_ids_BxL: optional uint32 [batch, length] identity of each token for the dropout masks
      (default b * length + l); see `layers.CoordinateDropout`.
    lines: optional (unpack_index int32 [batch, N, M], repack_index int32 [batch, length]) of
      rows that pack N lines of at most M tokens each (`packing.pack_lines`): attention then runs
      in the line layout [batch * N, M], within each line (`MultiHeadAttention`), so its
      cost follows the lines, not the row length. Excludes `attention_mask`.
    decode: incremental (KV-cached) decoding, deterministic only: pass `positions_BxL` (the
      slot of each token in its line) and a mutable `cache` collection (`init_cache`,
      `apply_cached`); every layer writes the keys and values of `tokens_BxL` into its cache at
      those slots and each token attends to its line's slots <= its position, so a line's
      prefix can be fed in one call and then one token per call, with lines at different
      positions. The logits equal those of the full forward pass on the line up to float
      rounding. Excludes `attention_mask` and `lines`.
    head_mask: optional float [num_layers, num_heads] z per head: head h of layer l outputs
      `(x - mu) * z[l, h] + mu` before the merge projection (1 = kept, 0 = ablated).
    head_means: optional mu of the heads: [num_layers, num_heads, head_dim] (one mean per head,
      position-independent) or [num_layers, batch, length, num_heads, head_dim] (per position,
      in the row layout of `tokens_BxL`). None = zero ablation (mu = 0). Needs `head_mask`.
    mlp_mask: optional float [num_layers] z per MLP block, applied to its output before the
      residual add (and before dropout).
    mlp_means: optional mu of the MLP blocks: [num_layers, d_model] or [num_layers, batch,
      length, d_model]. None = zero ablation. Needs `mlp_mask`.

  The masks and means are traced arrays: they may be gradients' targets (hard-concrete gates)
  and be vmapped over leading axes (pruning runs, seeds). Left None, no op is added.

  Sown into the `'intermediates'` collection (only when it is mutable;
  `apply_with_intermediates` stacks them): `hidden` (the embedding output, then each layer's
  output), and per layer `mlp` and `attention/attention`, `attention/heads` (see the layers).

  Returns:
    logits [batch, length, vocab_size] (float32).

  Raises:
    ValueError: a sequence longer than `max_len` (a packed row with `positions_BxL` may be
      longer: its lines must each fit); `attention_mask` with `lines`; `decode` with
      dropout on, without `positions_BxL`, or with `attention_mask` / `lines`; an intervention
      array of the wrong shape, or means without their mask.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL: Array, *, deterministic: bool = True,
               attention_mask: Array | None = None, positions_BxL: Array | None = None,
               token_ids_BxL: Array | None = None, lines: tuple[Array, Array] | None = None,
               decode: bool = False, head_mask: Array | None = None,
               head_means: Array | None = None, mlp_mask: Array | None = None,
               mlp_means: Array | None = None) -> Array:
    cfg = self.config
    _, length = tokens_BxL.shape
    # A packed row (positions_BxL given, each line's restarting at 0) may be longer than max_len:
    # only its lines must fit the position table, which the input pipeline guarantees.
    if length > cfg.max_len and (positions_BxL is None or decode):
      raise ValueError(f"sequence length {length} exceeds model max_len {cfg.max_len}")
    if decode and (not deterministic or positions_BxL is None or attention_mask is not None
                   or lines is not None or cfg.attention != "causal"):
      raise ValueError("decode=True needs causal attention, deterministic=True and "
                       "positions_BxL, and takes neither attention_mask nor lines")
    check_interventions(cfg, head_mask, head_means, mlp_mask, mlp_means)
    embed, x_BxLxD, positions_BxL, token_ids_BxL = embed_tokens(cfg, tokens_BxL, positions_BxL,
                                                                token_ids_BxL)
    x_BxLxD = add_positions(cfg, x_BxLxD, positions_BxL, token_ids_BxL, deterministic)

    if lines is None:  # no real token attends to the padding after its line
      mask = line_mask(cfg.attention, tokens_BxL, tokens_BxL != 0, cfg.prefix_end_ids)
    else:  # the line layout [B * N, M] of the packed rows (`MultiHeadAttention`)
      mask = line_mask(cfg.attention, layers.unpack_lines(tokens_BxL, lines[0]),
                       line_key_mask(*lines), cfg.prefix_end_ids)
    if attention_mask is not None and lines is not None:
      raise ValueError("pass either attention_mask or lines (packed rows), not both")
    mask = with_attention_mask(mask, attention_mask)

    self.sow(INTERMEDIATES, "hidden", x_BxLxD)
    at = lambda a, i: None if a is None else a[i]  # layer i's slice of an intervention
    for i in range(cfg.num_layers):
      x_BxLxD = TransformerLayer(cfg, name=f"layer_{i}")(
          x_BxLxD, mask, deterministic, token_ids_BxL, positions_BxL, lines, decode,
          at(head_mask, i), at(head_means, i), at(mlp_mask, i), at(mlp_means, i))
      self.sow(INTERMEDIATES, "hidden", x_BxLxD)
    return output_logits(cfg, embed, x_BxLxD)


def init_params(config: ModelConfig, key: Array, length: int = 8):
  """Initial parameters of one seed (a pytree of float32 arrays)."""
  tokens = jnp.zeros((1, length), jnp.int32)
  return TransformerLM(config).init({"params": key}, tokens, deterministic=True)["params"]


def num_params(params) -> int:
  """Number of scalars in a parameter pytree (per seed if unstacked)."""
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
