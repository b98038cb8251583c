"""An encoder-decoder transformer (`encoder_decoder`, family 'encoder_decoder'), the seq2seq model
of McCoy et al. (2020) and Ahuja et al. (2024, transformers-hg), trained by `objective=seq2seq`.

A stored line `SOS w1 ... wk TASK o1 ... om` (`TASK` the task token, `quest`/`decl` or
`PAST`/`PRESENT`: `ModelConfig.prefix_end_ids`) is split where its input part ends
(`attention_masks.prefix_keys`):

* the **encoder** reads the input part `SOS w1 ... wk TASK` with bidirectional self-attention
  (positions 0..k+1), `num_layers` post-LN layers (`model.TransformerLayer`, the LM's layer);
* the **decoder** reads the output part `TASK o1 ... om` (the task token is its start token;
  positions restart at 0 there) with causal self-attention, then cross-attention to the
  encoder's outputs at the input positions, then the feed-forward block, each followed by the
  residual add and LayerNorm (post-LN, as PyTorch's `nn.TransformerDecoderLayer` with
  `norm_first=False`); `num_layers` layers as well. So depth = encoder and decoder layers each,
  as the encoder-decoder transformer is sized (Vaswani et al. 2017, §3.1: N = 6 layers each);
  at equal depth it has about 2.3x the decoder-only LM's parameters.

Sizes, dropout and initialisation are the LM's (`model.ModelConfig`, Xavier-uniform, ReLU gain
for W1, bias-free attention projections); the one token embedding is shared by encoder,
decoder (one vocabulary) and, with `tied_embeddings`, the output layer.

Both stacks run over the whole row, in the LM's layout: the encoder's outputs at input positions
depend on the input part only and the decoder's at output positions on the input part and the
output before them, so the logits at the output positions are exactly an encoder-decoder's,
and the model has the LM's call signature (`models.registry`): training with packed rows, the
evaluations (full forward passes; no key/value cache), the minimal-pair preference
(log P(output | input)) and the analyses run it unchanged. Its other positions' outputs are not
trained (the `seq2seq` objective scores the output part only) and mean nothing.

Sown intermediates (`intermediates.apply_with_intermediates`) are the ENCODER's: `hidden` (the
embedding output and each encoder layer's output) and per encoder layer `layer_<i>` its
attention, heads and MLP output, so tree projections (Murty et al., ICLR 2023, defined on
encoders), UAS and the attention analyses read the encoder. The decoder sows `decoder_hidden`
and `decoder_layer_<i>` (self- and cross-attention, MLP). An analysis's `attention_mask` is
AND-ed with the encoder's self-attention mask only.

Not supported (a one-line ValueError): incremental decoding with a key/value cache and head/MLP
interventions (pruning).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from sg_jax.models import layers
from sg_jax.models.attention_masks import causal_mask, line_key_mask, prefix_keys
from sg_jax.models.transformer import (INTERMEDIATES, MultiHeadAttention, TransformerLayer,
                                       sinusoidal_positions, xavier_uniform)
from sg_jax.models import registry
from sg_jax.models.model_config import ModelConfig

Array = jax.Array


def part_masks(tokens_BxL: Array, key_real_BxL: Array, split_ids: tuple[int, ...]
               ) -> tuple[Array, Array]:
  """(input part, output part), bool [B, L] each, of lines laid out one per row.

  The input part is the line up to and including its first token in `split_ids` (the whole
  line when it has none: an analysis's sentence); the output part is the line from that token
  on (it belongs to both: the encoder's last token, the decoder's start token).
  """
  inputs = prefix_keys(tokens_BxL, key_real_BxL, split_ids)
  is_split = jnp.isin(tokens_BxL, jnp.asarray(split_ids, tokens_BxL.dtype)) & key_real_BxL
  return inputs, key_real_BxL & (jnp.cumsum(is_split, axis=1) > 0)


def decoder_positions(tokens_BxL: Array, positions_BxL: Array, split_ids: tuple[int, ...]
                      ) -> Array:
  """int32 [B, L]: each output-part token's position counted from its line's task token (0),
  other tokens' positions unchanged; works on packed rows, whose `positions_BxL` restart at 0
  at every line."""
  is_split = jnp.isin(tokens_BxL, jnp.asarray(split_ids, tokens_BxL.dtype))
  index = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1])[None, :], tokens_BxL.shape)
  marker = jnp.where(is_split | (positions_BxL == 0), index, 0)
  last = jax.lax.cummax(marker, axis=1)  # the line's start or its task token, whichever is later
  after_split = jnp.take_along_axis(is_split, last, axis=1)
  start = jnp.take_along_axis(positions_BxL, last, axis=1)
  return jnp.where(after_split, positions_BxL - start, positions_BxL)


class DecoderLayer(nn.Module):
  """One post-LN decoder layer: causal self-attention, cross-attention to the encoder, MLP.

  Sows `mlp` (as `model.TransformerLayer`) and, through its attentions, `attention/*` and
  `cross_attention/*`.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, y_BxLxD: Array, memory_BxLxD: Array, self_mask: Array, cross_mask: Array,
               deterministic: bool, ids_BxL: Array, positions_BxL: Array,
               lines: tuple[Array, Array] | None = None) -> Array:
    """Returns the layer's output [B, L, d_model]; `memory_BxLxD` is the encoder's output."""
    cfg = self.config
    dtype, lay = jnp.dtype(cfg.dtype), layers.layer_set(cfg.layer_impl, cfg.matmul_precision)
    ids = ids_BxL[..., None]
    drop = lambda y, name: layers.CoordinateDropout(cfg.dropout, cfg.dropout_keep, name=name)(
        y, ids, layers.feature_index(y.shape[-1]), deterministic)
    norm = lambda name: lay.layer_norm(epsilon=cfg.layer_norm_eps, dtype=dtype, name=name)
    attn_BxLxD = MultiHeadAttention(cfg, name="attention")(
        y_BxLxD, self_mask, deterministic, ids_BxL, positions_BxL, lines)
    y_BxLxD = norm("norm1")(y_BxLxD + drop(attn_BxLxD, "attention_output_dropout"))
    cross_BxLxD = MultiHeadAttention(cfg, name="cross_attention")(
        y_BxLxD, cross_mask, deterministic, ids_BxL, positions_BxL, lines,
        memory_BxLxD=memory_BxLxD)
    y_BxLxD = norm("norm_cross")(y_BxLxD + drop(cross_BxLxD, "cross_attention_output_dropout"))
    h_BxLxF = lay.dense(cfg.d_ff, dtype=dtype, name="linear1",
                        kernel_init=xavier_uniform(cfg.d_model, cfg.d_ff, gain=math.sqrt(2.0)))(
                            y_BxLxD)
    h_BxLxF = drop(nn.relu(h_BxLxF), "hidden_dropout")
    ff_BxLxD = lay.dense(cfg.d_model, dtype=dtype, name="linear2",
                         kernel_init=xavier_uniform(cfg.d_ff, cfg.d_model))(h_BxLxF)
    self.sow(INTERMEDIATES, "mlp", ff_BxLxD)
    return norm("norm2")(y_BxLxD + drop(ff_BxLxD, "output_dropout"))


@registry.register("encoder_decoder", "encoder_decoder")
class EncoderDecoder(nn.Module):
  """The encoder-decoder of the module docstring, for one seed.

  Call signature and arguments as `model.TransformerLM` (tokens_BxL [B, L], deterministic,
  attention_mask, positions_BxL, token_ids_BxL, lines); `config.prefix_end_ids` must name the
  task tokens. Returns logits float32 [B, L, vocab_size]; the logits at a line's output part
  (from its task token on) are the decoder's predictions of the next output token.

  Raises:
    ValueError: no `prefix_end_ids`; `decode` or an intervention (head/MLP masks or means);
      `attention_mask` with `lines`; a sequence longer than `max_len` (as `TransformerLM`).
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
    dtype = jnp.dtype(cfg.dtype)
    batch, length = tokens_BxL.shape
    if not cfg.prefix_end_ids:
      raise ValueError("model encoder_decoder needs the ids that end a line's input part "
                       "(ModelConfig.prefix_end_ids: the task tokens)")
    if decode:
      raise ValueError("model encoder_decoder has no key/value-cached decoding; decode with "
                       "full forward passes")
    if any(a is not None for a in (head_mask, head_means, mlp_mask, mlp_means)):
      raise ValueError("model encoder_decoder takes no head/MLP interventions (pruning "
                       "supports model transformer_lm only)")
    if length > cfg.max_len and positions_BxL is None:
      raise ValueError(f"sequence length {length} exceeds model max_len {cfg.max_len}")
    if attention_mask is not None and lines is not None:
      raise ValueError("pass either attention_mask or lines (packed rows), not both")
    default_ids, default_positions = layers.default_token_ids_and_positions(batch, length)
    positions_BxL = default_positions if positions_BxL is None else positions_BxL
    token_ids_BxL = default_ids if token_ids_BxL is None else token_ids_BxL
    split = tuple(cfg.prefix_end_ids)

    if lines is None:
      line_tokens, key_real = tokens_BxL, tokens_BxL != 0
    else:  # the line layout [B * N, M] of packed rows (`model.MultiHeadAttention`)
      line_tokens, key_real = layers.unpack_lines(tokens_BxL, lines[0]), line_key_mask(*lines)
    inputs_part, outputs_part = part_masks(line_tokens, key_real, split)
    cross_mask = inputs_part[:, None, None, :]  # [B, 1, 1, L]: keys of the input part
    encoder_mask = cross_mask
    if attention_mask is not None:
      extra = attention_mask if attention_mask.ndim == 4 else attention_mask[:, None]
      encoder_mask = jnp.logical_and(encoder_mask, extra)
    decoder_mask = causal_mask(line_tokens.shape[1])[None, None] & outputs_part[:, None, None, :]

    embed = nn.Embed(cfg.vocab_size, cfg.d_model, name="embedding",
                     embedding_init=xavier_uniform(cfg.vocab_size, cfg.d_model))
    e_BxLxD = embed(tokens_BxL).astype(dtype) * jnp.asarray(math.sqrt(cfg.d_model), dtype)
    table = jnp.asarray(sinusoidal_positions(cfg.max_len, cfg.d_model), dtype)
    embed_drop = lambda x, name: layers.CoordinateDropout(cfg.dropout, cfg.dropout_keep,
                                                          name=name)(
        x, token_ids_BxL[..., None], layers.feature_index(cfg.d_model), deterministic)
    x_BxLxD = embed_drop(e_BxLxD + table[positions_BxL], "embedding_dropout")
    y_BxLxD = embed_drop(e_BxLxD + table[decoder_positions(tokens_BxL, positions_BxL, split)],
                         "decoder_embedding_dropout")

    self.sow(INTERMEDIATES, "hidden", x_BxLxD)
    for i in range(cfg.num_layers):
      x_BxLxD = TransformerLayer(cfg, name=f"layer_{i}")(
          x_BxLxD, encoder_mask, deterministic, token_ids_BxL, positions_BxL, lines)
      self.sow(INTERMEDIATES, "hidden", x_BxLxD)
    self.sow(INTERMEDIATES, "decoder_hidden", y_BxLxD)
    for i in range(cfg.num_layers):
      y_BxLxD = DecoderLayer(cfg, name=f"decoder_layer_{i}")(
          y_BxLxD, x_BxLxD, decoder_mask, cross_mask, deterministic, token_ids_BxL,
          positions_BxL, lines)
      self.sow(INTERMEDIATES, "decoder_hidden", y_BxLxD)

    lay = layers.layer_set(cfg.layer_impl, cfg.matmul_precision)
    if cfg.tied_embeddings:
      logits_BxLxV = jnp.dot(y_BxLxD.astype(jnp.float32), embed.embedding.T,
                             precision=lay.precision)
    else:
      logits_BxLxV = lay.dense(cfg.vocab_size, name="output",
                               kernel_init=xavier_uniform(cfg.d_model, cfg.vocab_size))(
                                   y_BxLxD.astype(jnp.float32))
    return logits_BxLxV.astype(jnp.float32)
