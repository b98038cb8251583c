"""A `model.TransformerLM`'s intermediates, read from the flax collection it sows into.

Every forward pass sows, per layer, the attention probabilities, the per-head outputs that enter
the merge projection and the MLP block outputs, and the residual stream after every layer
(`model.INTERMEDIATES`). Flax stores them only when the collection is mutable, so the training
step, which never asks, computes nothing for them. `apply_with_intermediates` asks and stacks
them over layers; `attention_probabilities` runs one layer's attention alone on given inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sg_jax import models
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import INTERMEDIATES, MultiHeadAttention, TransformerLM

Array = jax.Array


def apply_with_intermediates(model: TransformerLM, params, tokens_BxL: Array,
                             **kwargs) -> tuple[Array, dict[str, Array]]:
  """The forward pass of one seed with its intermediates, stacked over layers.

  Pure and jit-able; vmap it over params (and masks) for seeds. XLA drops whatever the caller
  does not use, so asking for all of them costs only what is read.

  Args:
    model: a model module of a `ModelConfig` (`models.build`); the module run is the registered
      model of its config's `name` (`models.build(model.config)`), so a caller that built
      `TransformerLM(config)` for another model's config (an `encoder_decoder`) runs that model.
      An encoder-decoder's intermediates are its encoder's (`models.encoder_decoder`).
    params: its parameters (one seed).
    tokens_BxL: int32 [B, L] inputs.
    **kwargs: `TransformerLM.__call__` keywords (deterministic, attention_mask, positions_BxL,
      lines, head_mask, ...), except `decode`; and `rngs` (`{'dropout': key}` with dropout on).

  Returns:
    (logits [B, L, vocab_size] float32, dict) with
      'attention': float32 [num_layers, B, heads, L, L], the attention probabilities before
        dropout (rows sum to 1; with `lines` [num_layers, B * N, heads, M, M]);
      'heads': [num_layers, B, L, heads, head_dim], each head's output as it enters the merge
        projection (after `head_mask`);
      'mlp': [num_layers, B, L, d_model], each MLP block's output before dropout and the
        residual add (after `mlp_mask`);
      'hidden': [num_layers + 1, B, L, d_model], the residual stream: hidden[0] = embedding +
        positions after dropout, hidden[l] = output of layer l (after its second LayerNorm).
    Arrays are in the model's computation dtype except 'attention'. Vmapped over seeds (or
    pruning runs) every array gains that leading axis, e.g. 'hidden' [seed, num_layers + 1,
    B, L, d_model]. The tree projections read 'hidden' and the attention entropy
    'attention' (docs/REFERENCE.md §1, "Analysis quantities").

  Raises:
    ValueError: `decode` is passed, or as `TransformerLM.__call__`.
  """
  if "decode" in kwargs:
    raise ValueError("apply_with_intermediates does not decode; use apply_cached")
  model = models.build(model.config)
  logits, state = model.apply({"params": params}, tokens_BxL, mutable=[INTERMEDIATES], **kwargs)
  sown = state[INTERMEDIATES]
  per_layer = lambda get: jnp.stack([get(sown[f"layer_{i}"])[0]
                                     for i in range(model.config.num_layers)])
  return logits, {
      "attention": per_layer(lambda s: s["attention"]["attention"]),
      "heads": per_layer(lambda s: s["attention"]["heads"]),
      "mlp": per_layer(lambda s: s["mlp"]),
      "hidden": jnp.stack(sown["hidden"]),
  }


def unit_outputs(model: TransformerLM, params, tokens_BxL: Array, **kwargs
                 ) -> tuple[Array, dict[str, Array]]:
  """The forward pass of one seed with the outputs of every gated unit, in the rows of its
  head and MLP masks (`interventions.unit_rows`), and where each unit's output is used.

  A decoder-only model's rows are its layers; an encoder-decoder's head rows are the encoder's
  self-attention, the decoder's self-attention and its cross-attention, its MLP rows the
  encoder's then the decoder's (`models.encoder_decoder`).

  Args:
    model, params, tokens_BxL, **kwargs: as `apply_with_intermediates` (the padded layout:
      no `lines`).

  Returns:
    (logits [B, L, vocab_size] float32, dict) with
      'heads': [R_h, B, L, heads, head_dim], each head's output as it enters the merge
        projection (after `head_mask`);
      'mlp': [R_m, B, L, d_model], each MLP block's output before dropout and the residual add;
      'encoder_tokens', 'decoder_tokens': bool [B, L], the positions whose outputs the model
        uses, of the first num_layers rows of 'heads' and 'mlp' (a decoder-only model's every
        row: the real tokens; an encoder-decoder's encoder rows: each line's input part) and of
        the other rows (an encoder-decoder's decoder rows: the output part).

  Raises:
    ValueError: `decode` or `lines` is passed, or as the model's `__call__`.
  """
  if "decode" in kwargs or "lines" in kwargs:
    raise ValueError("unit_outputs runs the padded layout (no decode, no lines)")
  model = models.build(model.config)
  logits, state = model.apply({"params": params}, tokens_BxL, mutable=[INTERMEDIATES], **kwargs)
  sown = state[INTERMEDIATES]
  n = model.config.num_layers
  encoder = [sown[f"layer_{i}"] for i in range(n)]
  decoder = [sown[f"decoder_layer_{i}"] for i in range(n) if f"decoder_layer_{i}" in sown]
  real = tokens_BxL != 0
  enc_tokens, dec_tokens = sown["unit_tokens"][0] if "unit_tokens" in sown else (real, real)
  heads = ([s["attention"]["heads"][0] for s in encoder + decoder]
           + [s["cross_attention"]["heads"][0] for s in decoder])
  return logits, {"heads": jnp.stack(heads), "mlp": jnp.stack([s["mlp"][0] for s in
                                                               encoder + decoder]),
                  "encoder_tokens": enc_tokens, "decoder_tokens": dec_tokens}


def attention_probabilities(config: ModelConfig, attention_params, x_BxLxD: Array,
                            mask_BxHxLxL: Array) -> Array:
  """One layer's attention probabilities on given inputs (dropout-free), for one seed.

  Args:
    config: the model config.
    attention_params: the layer's `MultiHeadAttention` parameters
      (`params['layer_l']['attention']`).
    x_BxLxD: [B, L, d_model] inputs of the attention (e.g. `hidden[0]`, the embeddings).
    mask_BxHxLxL: bool, broadcastable to [B, H, L, L]; True = may attend (not AND-ed with the
      causal mask here).

  Returns:
    float32 [B, heads, L, L], rows summing to 1 over the allowed keys.
  """
  _, state = MultiHeadAttention(config).apply({"params": attention_params}, x_BxLxD,
                                              mask_BxHxLxL, True, mutable=[INTERMEDIATES])
  return state[INTERMEDIATES]["attention"][0]
