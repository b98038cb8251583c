"""Incremental (KV-cached) decoding of `model.TransformerLM`, one seed at a time.

The evaluation's greedy decoder (`evaluation.greedy_decode_cached`) feeds each line's prefix in
one call, then one token per call: every layer keeps the keys and values of the tokens fed so far
in the flax collection `cache` (`model.MultiHeadAttention`, `decode=True`), so a step costs one
token's forward pass instead of the whole line's. The logits equal the full forward pass's up to
float rounding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

if TYPE_CHECKING:  # model.py re-exports this module's functions, so it cannot be imported here
  from sg_jax.model import TransformerLM

Array = jax.Array


def init_cache(model: "TransformerLM", params, batch: int, length: int):
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


def apply_cached(model: "TransformerLM", params, tokens_BxT: Array, positions_BxT: Array, cache
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
