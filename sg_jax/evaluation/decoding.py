"""Greedy decoding of `model.TransformerLM`, one seed at a time, with or without a KV cache.

`greedy_decode` runs one full forward pass per decoded token. `greedy_decode_cached` (what the
evaluation of a decoding task runs, `evaluation.make_split_evaluator`) feeds each line's prefix in
one call, then one token per call: every layer keeps the keys and values of the tokens fed so far
in the flax collection `cache` (`init_cache`, `apply_cached`; `model.MultiHeadAttention`,
`decode=True`), so a step costs one token's forward pass instead of the whole line's. The logits
equal the full forward pass's up to float rounding.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from sg_jax.models.transformer import TransformerLM

Array = jax.Array


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


def greedy_decode(apply_fn: Callable[[Array], Array], inputs_BxL: Array, task_pos_B: Array,
                  num_steps: int) -> Array:
  """Greedy continuation after the task token.

  Args:
    apply_fn: tokens [batch, length+1] -> logits [batch, length+1, vocab] (deterministic).
    inputs_BxL: teacher-forced inputs; only positions <= task_pos are used.
    task_pos_B: index of the task token in each line.
    num_steps: tokens to decode (static), e.g. the longest target incl. EOS.

  Returns:
    decoded_BxL: int32 [batch, length]; decoded[t] is the token predicted after position t, for
    t >= task_pos (aligned with `targets`); 0 before task_pos.
  """
  batch, length = inputs_BxL.shape
  positions = jnp.arange(length + 1)[None]
  buf = jnp.pad(inputs_BxL, ((0, 0), (0, 1)))
  buf = jnp.where(positions <= task_pos_B[:, None], buf, 0)
  rows = jnp.arange(batch)

  def body(k, buf):
    logits = apply_fn(buf)
    p = jnp.minimum(task_pos_B + k, length - 1)
    nxt = jnp.argmax(logits[rows, p], axis=-1).astype(buf.dtype)
    return buf.at[rows, p + 1].set(nxt)

  buf = jax.lax.fori_loop(0, num_steps, body, buf)
  decoded = buf[:, 1:]
  return jnp.where(jnp.arange(length)[None] >= task_pos_B[:, None], decoded, 0)


def greedy_decode_cached(apply_cached: Callable, init_cache: Callable, inputs_BxL: Array,
                         task_pos_B: Array, num_steps: int, prefix_length: int = 0,
                         prefilled: tuple[Array, object] | None = None) -> Array:
  """`greedy_decode` with a key/value cache: the same tokens, for far less computation.

  The prefix (positions <= task_pos, the rest zeroed as `greedy_decode` does) is fed in one call
  (or taken from `prefilled`), then one token per line and call, each line at its own position,
  so lines with different prefix lengths in one batch decode exactly the tokens
  `greedy_decode` decodes (its positions are clamped to length - 1 in the same way); the logits
  agree with the full forward pass up to float rounding (`model.TransformerLM`, `decode`).

  Args:
    apply_cached: `(tokens [batch, T], positions [batch, T], cache) -> (logits [batch, T, vocab],
      cache)` (deterministic; `apply_cached`).
    init_cache: `(batch, slots) -> cache`, an empty cache (`init_cache`).
    inputs_BxL: teacher-forced inputs; only positions <= task_pos are used.
    task_pos_B: index of the task token in each line.
    num_steps: tokens to decode (static), e.g. the longest target incl. EOS.
    prefix_length: static number of leading positions fed in the first call, > every
      task_pos (0 = length): positions past it are never read before they are decoded.
    prefilled: optional `(logits [batch, T, vocab], cache)` returned by `apply_cached` on
      tokens that equal `inputs_BxL` at every position <= task_pos, at positions 0..T-1
      (T > every task_pos) into `init_cache(batch, length)`, e.g. the teacher-forced pass on
      the whole line: it replaces the prefix call (later positions are overwritten in the
      cache before any query reads them).

  Returns:
    decoded_BxL: int32 [batch, length], as `greedy_decode`.
  """
  batch, length = inputs_BxL.shape
  prefix_length = prefix_length or length
  positions = jnp.arange(length + 1)[None]
  buf = jnp.pad(inputs_BxL, ((0, 0), (0, 1)))
  buf = jnp.where(positions <= task_pos_B[:, None], buf, 0)
  rows = jnp.arange(batch)
  if num_steps > 0:
    if prefilled is None:
      prefix_positions = jnp.broadcast_to(jnp.arange(prefix_length, dtype=jnp.int32),
                                          (batch, prefix_length))
      prefilled = apply_cached(buf[:, :prefix_length], prefix_positions,
                               init_cache(batch, length))
    logits, cache = prefilled
    p = jnp.minimum(task_pos_B, length - 1)
    buf = buf.at[rows, p + 1].set(jnp.argmax(logits[rows, p], axis=-1).astype(buf.dtype))

    def body(k, carry):
      buf, cache = carry
      p = jnp.minimum(task_pos_B + k, length - 1)
      # The token at p: decoded by the previous call, or (once p is clamped) left unchanged.
      logits, cache = apply_cached(buf[rows, p][:, None], p[:, None].astype(jnp.int32), cache)
      nxt = jnp.argmax(logits[:, 0], axis=-1).astype(buf.dtype)
      return buf.at[rows, p + 1].set(nxt), cache

    buf, _ = jax.lax.fori_loop(1, num_steps, body, (buf, cache))
  decoded = buf[:, 1:]
  return jnp.where(jnp.arange(length)[None] >= task_pos_B[:, None], decoded, 0)
