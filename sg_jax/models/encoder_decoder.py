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
and `decoder_layer_<i>` (self- and cross-attention, MLP), and the model sows `unit_tokens`
(input part, output part: bool [B, L] each, the positions where the encoder's and the decoder's
units compute something used; `intermediates.unit_outputs`). An analysis's `attention_mask` is
AND-ed with the encoder's self-attention mask only.

Head and MLP interventions (pruning; Bhaskar et al., ACL 2024) gate every attention head and
MLP block: `head_mask` [3 num_layers, num_heads] has the encoder's self-attention rows, then the
decoder's self-attention rows, then its cross-attention rows; `mlp_mask` [2 num_layers] the
encoder's, then the decoder's MLP blocks (`interventions.unit_rows`: `enc_l<i>`, `dec_l<i>`,
`cross_l<i>`). A head's mask and mean act on its output before the merge projection, as in
`TransformerLM`.

Not supported (a one-line ValueError): incremental decoding with a key/value cache.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from sg_jax.models import layers
from sg_jax.models.attention_masks import causal_mask, line_key_mask, prefix_keys
from sg_jax.models.interventions import check_interventions
from sg_jax.models.transformer import (INTERMEDIATES, MultiHeadAttention, TransformerLayer,
                                       add_positions, embed_tokens, feed_forward,
                                       layer_dropout, output_logits, with_attention_mask)
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
               lines: tuple[Array, Array] | None = None,
               interventions: tuple[Array | None, ...] = (None,) * 6) -> Array:
    """Returns the layer's output [B, L, d_model]; `memory_BxLxD` is the encoder's output.

    `interventions` = this layer's (self-attention head mask [H], its means, cross-attention
    head mask [H], its means, MLP mask [], its means), each None or as
    `model.TransformerLayer`'s slices (`interventions.mean_ablate`).
    """
    self_z, self_mu, cross_z, cross_mu, mlp_z, mlp_mu = interventions
    cfg = self.config
    dtype, lay = jnp.dtype(cfg.dtype), layers.layer_set(cfg.layer_impl, cfg.matmul_precision)
    drop = layer_dropout(cfg, ids_BxL, deterministic)
    norm = lambda name: lay.layer_norm(epsilon=cfg.layer_norm_eps, dtype=dtype, name=name)
    attn_BxLxD = MultiHeadAttention(cfg, name="attention")(
        y_BxLxD, self_mask, deterministic, ids_BxL, positions_BxL, lines,
        head_mask_H=self_z, head_means=self_mu)
    y_BxLxD = norm("norm1")(y_BxLxD + drop(attn_BxLxD, "attention_output_dropout"))
    cross_BxLxD = MultiHeadAttention(cfg, name="cross_attention")(
        y_BxLxD, cross_mask, deterministic, ids_BxL, positions_BxL, lines,
        head_mask_H=cross_z, head_means=cross_mu, memory_BxLxD=memory_BxLxD)
    y_BxLxD = norm("norm_cross")(y_BxLxD + drop(cross_BxLxD, "cross_attention_output_dropout"))
    ff_BxLxD = feed_forward(cfg, y_BxLxD, drop, mlp_z, mlp_mu)
    self.sow(INTERMEDIATES, "mlp", ff_BxLxD)
    return norm("norm2")(y_BxLxD + drop(ff_BxLxD, "output_dropout"))


FAMILY = "encoder_decoder"


@registry.register("encoder_decoder", FAMILY)
class EncoderDecoder(nn.Module):
  """The encoder-decoder of the module docstring, for one seed.

  Call signature and arguments as `model.TransformerLM` (tokens_BxL [B, L], deterministic,
  attention_mask, positions_BxL, token_ids_BxL, lines, head_mask, head_means, mlp_mask,
  mlp_means); `config.prefix_end_ids` must name the task tokens. The interventions' leading axis
  is the rows of the module docstring: head_mask float [3 num_layers, num_heads], head_means
  [3 num_layers, num_heads, head_dim] or [3 num_layers, B, L, num_heads, head_dim], mlp_mask
  [2 num_layers], mlp_means [2 num_layers, d_model] or [2 num_layers, B, L, d_model]. Returns
  logits float32 [B, L, vocab_size]; the logits at a line's output part (from its task token on)
  are the decoder's predictions of the next output token.

  Raises:
    ValueError: no `prefix_end_ids`; `decode`; an intervention array of the wrong shape, or
      means without their mask; `attention_mask` with `lines`; a sequence longer than `max_len`
      (as `TransformerLM`).
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
    length = tokens_BxL.shape[1]
    if not cfg.prefix_end_ids:
      raise ValueError("model encoder_decoder needs the ids that end a line's input part "
                       "(ModelConfig.prefix_end_ids: the task tokens)")
    if decode:
      raise ValueError("model encoder_decoder has no key/value-cached decoding; decode with "
                       "full forward passes")
    check_interventions(cfg, head_mask, head_means, mlp_mask, mlp_means, FAMILY)
    if length > cfg.max_len and positions_BxL is None:
      raise ValueError(f"sequence length {length} exceeds model max_len {cfg.max_len}")
    if attention_mask is not None and lines is not None:
      raise ValueError("pass either attention_mask or lines (packed rows), not both")
    split = tuple(cfg.prefix_end_ids)

    if lines is None:
      line_tokens, key_real = tokens_BxL, tokens_BxL != 0
    else:  # the line layout [B * N, M] of packed rows (`model.MultiHeadAttention`)
      line_tokens, key_real = layers.unpack_lines(tokens_BxL, lines[0]), line_key_mask(*lines)
    inputs_part, outputs_part = part_masks(line_tokens, key_real, split)
    cross_mask = inputs_part[:, None, None, :]  # [B, 1, 1, L]: keys of the input part
    encoder_mask = with_attention_mask(cross_mask, attention_mask)
    decoder_mask = causal_mask(line_tokens.shape[1])[None, None] & outputs_part[:, None, None, :]

    embed, e_BxLxD, positions_BxL, token_ids_BxL = embed_tokens(cfg, tokens_BxL, positions_BxL,
                                                                token_ids_BxL)
    x_BxLxD = add_positions(cfg, e_BxLxD, positions_BxL, token_ids_BxL, deterministic)
    y_BxLxD = add_positions(cfg, e_BxLxD, decoder_positions(tokens_BxL, positions_BxL, split),
                            token_ids_BxL, deterministic, "decoder_embedding_dropout")

    n = cfg.num_layers
    at = lambda a, i: None if a is None else a[i]  # row i of an intervention (`unit_rows`)
    self.sow(INTERMEDIATES, "unit_tokens", (inputs_part, outputs_part))
    self.sow(INTERMEDIATES, "hidden", x_BxLxD)
    for i in range(n):
      x_BxLxD = TransformerLayer(cfg, name=f"layer_{i}")(
          x_BxLxD, encoder_mask, deterministic, token_ids_BxL, positions_BxL, lines,
          head_mask_H=at(head_mask, i), head_means=at(head_means, i),
          mlp_mask=at(mlp_mask, i), mlp_means=at(mlp_means, i))
      self.sow(INTERMEDIATES, "hidden", x_BxLxD)
    self.sow(INTERMEDIATES, "decoder_hidden", y_BxLxD)
    for i in range(n):
      y_BxLxD = DecoderLayer(cfg, name=f"decoder_layer_{i}")(
          y_BxLxD, x_BxLxD, decoder_mask, cross_mask, deterministic, token_ids_BxL,
          positions_BxL, lines, (at(head_mask, n + i), at(head_means, n + i),
                                 at(head_mask, 2 * n + i), at(head_means, 2 * n + i),
                                 at(mlp_mask, n + i), at(mlp_means, n + i)))
      self.sow(INTERMEDIATES, "decoder_hidden", y_BxLxD)
    return output_logits(cfg, embed, y_BxLxD)
