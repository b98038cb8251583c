"""The means that mean ablation replaces a pruned unit's output by (docs/pruning.md).

One position-independent mean per unit over the real (non-padding) tokens of training lines: a
head's output as it enters the merge projection ([head_dim] per head) and an MLP block's output
before the residual add ([d_model] per block) (Bhaskar et al., ACL 2024; docs/REFERENCE.md §2).
The original computed them with batch size 1 because padding biased its mean; here padding
positions are masked out of the sums instead, so any batch size gives the same means.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import registry
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM

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
    (head_means float32 [num_layers, num_heads, head_dim], mlp_means float32 [num_layers,
    d_model]). Vmapped by `seed_means` to [S, ...].
  """

  model = TransformerLM(config)

  def sums(tokens_BxL):
    _, inter = apply_with_intermediates(model, params, tokens_BxL, deterministic=True)
    real_BxL = (tokens_BxL != 0).astype(jnp.float32)
    heads = jnp.einsum("nblhp,bl->nhp", inter["heads"].astype(jnp.float32), real_BxL)
    mlp = jnp.einsum("nbld,bl->nd", inter["mlp"].astype(jnp.float32), real_BxL)
    return heads, mlp, jnp.sum(real_BxL)

  heads, mlp, count = jax.lax.map(sums, inputs_NxBxL)
  count = jnp.maximum(jnp.sum(count), 1.0)
  return jnp.sum(heads, 0) / count, jnp.sum(mlp, 0) / count


def seed_means(model: TransformerLM, params_S, inputs_NxL: np.ndarray, batch_size: int = 64
               ) -> tuple[np.ndarray, np.ndarray]:
  """`unit_means` of every seed (jit of vmap over the leading seed axis, `registry.over_seeds`).

  Args:
    model: the `TransformerLM`.
    params_S: parameters with a leading seed axis [S, ...].
    inputs_NxL: int32 [N, L] training-line inputs (SOS w1 ... then padding 0).
    batch_size: lines per forward pass (the means do not depend on it).

  Returns:
    (float32 [S, num_layers, num_heads, head_dim], float32 [S, num_layers, d_model]).

  Raises:
    ValueError: as `batch_lines`.
  """
  batches = jnp.asarray(batch_lines(inputs_NxL, batch_size))
  heads, mlp = registry.over_seeds(unit_means)(params_S, batches, config=model.config)
  return np.asarray(heads), np.asarray(mlp)
