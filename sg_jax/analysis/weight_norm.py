"""Weight norm of a model's parameters (Murty et al., ACL 2023, §5 "weight norm").

The structural-grokking study tracks the global L2 norm of all parameters over training. The
released code reports it as is; the paper divides it by the number of layers to compare depths
(`docs/REFERENCE.md` §1, "Where the paper and the released code differ"). sg_jax offers
both, computed for one seed and vmapped over the seed axis.

Difference from the reference numbers: the reference module also builds a 6-layer
encoder-decoder *decoder* that the LM never calls; its parameters stay at initialisation and are
included in the reference's norm. sg_jax's model has no such decoder, so `weight_norm` here is the
norm of the parameters the LM actually uses. Its square is smaller than the reference's by the
squared norm of that (constant) decoder, so absolute values differ from the published curves by a
roughly constant offset in squared norm, while trends over training are the same.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
PyTree = Any


def weight_norm(params: PyTree) -> Array:
  """Global L2 norm of all parameters of one seed (the released code's quantity).

  Args:
    params: parameter pytree of ONE seed (float arrays of any shape).

  Returns:
    float32 scalar: sqrt(sum of squares of every parameter entry).
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


@jax.jit
def weight_norm_over_seeds(params_S: PyTree) -> Array:
  """`weight_norm` vmapped over a leading seed axis: params [seed, ...] -> [seed] float32."""
  return jax.vmap(weight_norm)(params_S)
