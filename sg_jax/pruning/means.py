"""The means that mean ablation replaces a pruned unit's output by (docs/pruning.md).

One position-independent mean per unit over the real (non-padding) tokens of training lines: a
head's output as it enters the merge projection ([head_dim] per head) and an MLP block's output
before the residual add ([d_model] per block) (Bhaskar et al., ACL 2024; docs/REFERENCE.md §2).
The original computed them with batch size 1 because padding biased its mean; here padding
positions are masked out of the sums instead, so any batch size gives the same means. An
encoder-decoder's units average over the positions where their outputs are used
(`intermediates.unit_outputs`): the encoder's over the input part of each line, the decoder's
(self-attention, cross-attention, MLP) over its output part.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import models
from sg_jax.analysis import registry
from sg_jax.models.intermediates import unit_outputs
from sg_jax.models.model_config import ModelConfig

Array = jax.Array


def batch_lines(inputs_NxL: np.ndarray, batch_size: int) -> np.ndarray:
  """int32 [num_batches, batch_size, L]: the lines in batches, the last padded with all-pad
  (id 0) lines, which have no real token and so add nothing to any mean or loss.

  Raises:
    ValueError: no line, or batch_size < 1.
  """
  inputs_NxL = np.asarray(inputs_NxL, np.int32)
  if inputs_NxL.shape[0] == 0 or batch_size < 1:
    raise ValueError(f"need at least one line and batch_size >= 1 (got {inputs_NxL.shape[0]} "
                     f"lines, batch_size {batch_size})")
  batch_size = min(batch_size, inputs_NxL.shape[0])
  total = -(-inputs_NxL.shape[0] // batch_size) * batch_size
  padded = np.zeros((total, inputs_NxL.shape[1]), np.int32)
  padded[:inputs_NxL.shape[0]] = inputs_NxL
  return padded.reshape(-1, batch_size, inputs_NxL.shape[1])


def unit_means(params, inputs_NxBxL: Array, *, config: ModelConfig) -> tuple[Array, Array]:
  """Mean head and MLP outputs of ONE seed over the real tokens of `inputs_NxBxL`.

  The model runs without dropout and without interventions.

  Args:
    params: one seed's parameters.
    inputs_NxBxL: int32 [num_batches, B, L] input ids (`batch_lines`); id 0 is padding.
    config: the model's `ModelConfig` (static).

  Returns:
    (head_means float32 [R_h, num_heads, head_dim], mlp_means float32 [R_m, d_model]), the rows
    of the model's masks (`interventions.unit_rows`: R_h = R_m = num_layers for the LM). Vmapped
    by `seed_means` to [S, ...].
  """

  model = models.build(config)
  n = config.num_layers  # rows [:n]: the encoder's (a decoder-only LM's: every row)

  def sums(tokens_BxL):
    _, units = unit_outputs(model, params, tokens_BxL, deterministic=True)
    real_BxL = units["encoder_tokens"].astype(jnp.float32)
    heads = jnp.einsum("nblhp,bl->nhp", units["heads"][:n].astype(jnp.float32), real_BxL)
    mlp = jnp.einsum("nbld,bl->nd", units["mlp"][:n].astype(jnp.float32), real_BxL)
    out = {"heads": heads, "mlp": mlp, "count": jnp.sum(real_BxL)}
    if units["heads"].shape[0] > n:  # an encoder-decoder's decoder rows: its output part
      dec_BxL = units["decoder_tokens"].astype(jnp.float32)
      out["dec_heads"] = jnp.einsum("nblhp,bl->nhp", units["heads"][n:].astype(jnp.float32),
                                    dec_BxL)
      out["dec_mlp"] = jnp.einsum("nbld,bl->nd", units["mlp"][n:].astype(jnp.float32), dec_BxL)
      out["dec_count"] = jnp.sum(dec_BxL)
    return out

  total = jax.tree_util.tree_map(lambda x: jnp.sum(x, 0), jax.lax.map(sums, inputs_NxBxL))
  count = jnp.maximum(total["count"], 1.0)
  heads, mlp = total["heads"] / count, total["mlp"] / count
  if "dec_count" in total:
    dec_count = jnp.maximum(total["dec_count"], 1.0)
    heads = jnp.concatenate([heads, total["dec_heads"] / dec_count])
    mlp = jnp.concatenate([mlp, total["dec_mlp"] / dec_count])
  return heads, mlp


def seed_means(model, params_S, inputs_NxL: np.ndarray, batch_size: int = 64
               ) -> tuple[np.ndarray, np.ndarray]:
  """`unit_means` of every seed (jit of vmap over the leading seed axis, `registry.over_seeds`).

  Args:
    model: the model module (`models.build`; its config is what is read).
    params_S: parameters with a leading seed axis [S, ...].
    inputs_NxL: int32 [N, L] training-line inputs (SOS w1 ... then padding 0).
    batch_size: lines per forward pass (the means do not depend on it).

  Returns:
    (float32 [S, R_h, num_heads, head_dim], float32 [S, R_m, d_model]).

  Raises:
    ValueError: as `batch_lines`.
  """
  batches = jnp.asarray(batch_lines(inputs_NxL, batch_size))
  heads, mlp = registry.over_seeds(unit_means)(params_S, batches, config=model.config)
  return np.asarray(heads), np.asarray(mlp)
