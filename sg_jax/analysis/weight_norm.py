"""Weight norms of a model's parameters (Murty et al., ACL 2023, §5 "weight norm").

The structural-grokking study tracks the global L2 norm of all parameters over training. Three
quantities, named so that nobody confuses them (`docs/REFERENCE.md` §1, "Where the paper and the
released code differ"):

* `weight_norm`: the global L2 norm of the parameters of the model sg_jax trains (embedding,
  layers, output layer). It is NOT the released code's number: the reference module also builds
  a 6-layer encoder-decoder *decoder* that the LM never calls; its parameters stay at
  initialisation and are included in the released norm. sg_jax's model has no such decoder.
* `weight_norm_per_layer`: `weight_norm / num_layers`, the paper's depth normalisation applied to
  sg_jax's norm.
* `weight_norm_released` (computed by `released_weight_norm`): the released code's global norm,
  decoder included:
  sqrt(weight_norm ** 2 + decoder_norm ** 2). Only available where the decoder's norm is known,
  i.e. for checkpoints converted from the original with `sg_jax.checkpointing.convert_torch` (which records it).
  Because the decoder is constant, the two norms differ by a constant in squared norm and have
  the same trends over training.

Norms are computed for one seed and vmapped over the seed axis (`registry.over_seeds`). The
module registers the `weight_norm` metric group of `sg_jax.analyze`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import registry

Array = jax.Array
PyTree = Any

# checkpoint-metadata key under which `sg_jax.checkpointing.convert_torch` records the unused decoder's norm:
# {seed id (str): float}.
DECODER_NORM_META_KEY = "released_decoder_norm"


def weight_norm(params: PyTree) -> Array:
  """Global L2 norm of all parameters of one seed of sg_jax's model (no unused decoder).

  Args:
    params: parameter pytree of ONE seed (float arrays of any shape).

  Returns:
    float32 scalar: sqrt(sum of squares of every parameter entry).

  Raises:
    ValueError: the pytree has no leaves.
  """
  leaves = jax.tree_util.tree_leaves(params)
  if not leaves:
    raise ValueError("weight_norm: the parameter pytree has no leaves")
  sq = sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)
  return jnp.sqrt(sq)


def weight_norm_per_layer(params: PyTree, num_layers: int) -> Array:
  """The paper's depth-normalised weight norm: `weight_norm(params) / num_layers`.

  Args:
    params: parameter pytree of ONE seed.
    num_layers: model depth (must be >= 1).

  Returns:
    float32 scalar.

  Raises:
    ValueError: if `num_layers < 1`.
  """
  if num_layers < 1:
    raise ValueError(f"num_layers must be >= 1, got {num_layers}")
  return weight_norm(params) / num_layers


def released_weight_norm(model_norm: Any, decoder_norm: Any) -> np.ndarray:
  """The released code's global norm from sg_jax's norm and the unused decoder's norm.

  Args:
    model_norm: `weight_norm` of the converted parameters, any shape (e.g. [seed]).
    decoder_norm: L2 norm of the original's `trafo.decoder.*` parameters
      (`sg_jax.checkpointing.convert_torch.decoder_norm`), broadcastable to `model_norm`.

  Returns:
    float64 numpy array: sqrt(model_norm ** 2 + decoder_norm ** 2).

  Raises:
    ValueError: a negative or non-finite decoder norm.
  """
  model_norm = np.asarray(model_norm, np.float64)
  decoder_norm = np.asarray(decoder_norm, np.float64)
  if not np.all(np.isfinite(decoder_norm) & (decoder_norm >= 0)):
    raise ValueError(f"decoder norm must be finite and >= 0, got {decoder_norm}")
  return np.sqrt(model_norm ** 2 + decoder_norm ** 2)


# params [seed, ...] -> [seed] float32.
weight_norm_over_seeds = registry.over_seeds(weight_norm)


def _compute(inputs: registry.Inputs) -> dict[str, Any]:
  """weight_norm, weight_norm_per_layer and (converted checkpoints) weight_norm_released [S]."""
  norms = np.asarray(weight_norm_over_seeds(inputs.params))
  decoder = inputs.meta.get(DECODER_NORM_META_KEY, {})  # converted checkpoints only
  return {"weight_norm": norms,
          "weight_norm_per_layer": [v / inputs.config.num_layers for v in norms],
          "weight_norm_released": [released_weight_norm(v, decoder[str(s)])
                                   if str(s) in decoder else None
                                   for s, v in zip(inputs.seeds, norms)]}


registry.register_quantity(registry.Quantity(
    name="weight_norm",
    groups=(registry.Group("weight_norm", ("weight_norm", "weight_norm_per_layer",
                                           "weight_norm_released"), inputs=("meta",)),),
    compute=_compute,
    dynamics=(registry.Dynamic(
        "weight_norm", axis="weight norm (global L2 norm of sg_jax's parameters)",
        title="Weight norm (the model sg_jax trains; no unused decoder)", label="global weight norm",
        in_summary=True),),
))
