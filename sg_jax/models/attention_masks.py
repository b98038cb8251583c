"""Which keys a query may attend to within a line, for each attention of `ModelConfig.attention`.

The objective sets the attention (`objectives`; Chen et al., ICLR 2024 train masked LMs, Ahuja et
al. 2024 prefix LMs, Murty et al., ACL 2023 causal LMs):

* `causal`: a token attends to itself and the tokens before it (next-token prediction);
* `bidirectional`: to every real token of its line (masked LMs);
* `prefix`: to every real token of the line's prefix (up to and including its first
  prefix-end token: the task token `quest`/`decl`, `PAST`/`PRESENT`) and causally after it
  (prefix LMs: the input part is read bidirectionally, the output generated left to right). A
  line without a prefix-end token is all prefix.

Masks are boolean, True = may attend, for lines laid out one per row ([batch, length], `<pad>`
after a line's end); in packed rows the model gathers each line into that layout first
(`packing.pack_lines`, `line_key_mask`).

The list is open: an objective that needs another mask registers its function
(`register_attention`) and names it as its `attention` (docs/model.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array



def causal_mask(length: int) -> Array:
  """Boolean [length, length] mask, True where query position q may attend to key k <= q."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))


def prefix_keys(tokens_BxL: Array, key_real_BxL: Array, prefix_end_ids: tuple[int, ...]
                ) -> Array:
  """Boolean [batch, length]: True at the real tokens of each line's prefix, i.e. up to and
  including its first token in `prefix_end_ids` (every real token when it has none)."""
  is_end = jnp.isin(tokens_BxL, jnp.asarray(prefix_end_ids, tokens_BxL.dtype)) & key_real_BxL
  ended_before = (jnp.cumsum(is_end, axis=1) - is_end) > 0
  return key_real_BxL & ~ended_before


def _causal(tokens_BxL: Array, key_real_BxL: Array, prefix_end_ids: tuple[int, ...]) -> Array:
  del key_real_BxL, prefix_end_ids  # padding after a line only meets padding queries
  return causal_mask(tokens_BxL.shape[1])[None, None]


def _bidirectional(tokens_BxL: Array, key_real_BxL: Array, prefix_end_ids: tuple[int, ...]
                   ) -> Array:
  del prefix_end_ids
  length = tokens_BxL.shape[1]
  return jnp.broadcast_to(key_real_BxL[:, None, None, :], (tokens_BxL.shape[0], 1, length, length))


def _prefix(tokens_BxL: Array, key_real_BxL: Array, prefix_end_ids: tuple[int, ...]) -> Array:
  if not prefix_end_ids:
    raise ValueError("prefix attention needs the ids that end the prefix (the task tokens)")
  prefix = prefix_keys(tokens_BxL, key_real_BxL, prefix_end_ids)
  return (causal_mask(tokens_BxL.shape[1])[None] | prefix[:, None, :])[:, None]


# name -> mask function (tokens [B, L], key_real [B, L], prefix_end_ids) -> bool [B or 1, 1, L, L]
ATTENTIONS: dict = {"causal": _causal, "bidirectional": _bidirectional, "prefix": _prefix}


def register_attention(name: str, mask_fn) -> None:
  """Makes `name` an attention an objective may name (`Objective.attention`).

  Args:
    mask_fn: `(tokens [B, L] int32, key_real [B, L] bool, prefix_end_ids tuple) -> bool
      [B or 1, 1, L, L]`, True = may attend, for lines laid out one per row (as `line_mask`).

  Raises:
    ValueError: the name is taken by another function.
  """
  if ATTENTIONS.get(name, mask_fn) is not mask_fn:
    raise ValueError(f"attention {name!r} is already registered")
  ATTENTIONS[name] = mask_fn


def line_mask(attention: str, tokens_BxL: Array, key_real_BxL: Array,
              prefix_end_ids: tuple[int, ...] = ()) -> Array:
  """Boolean [batch or 1, 1, length, length] self-attention mask of lines laid out one per row.

  Args:
    attention: a name in `ATTENTIONS` ('causal', 'bidirectional', 'prefix' or a registered one).
    tokens_BxL: int32 [batch, length] token ids of each line (only read for `prefix`).
    key_real_BxL: bool [batch, length], True at the positions holding a token of the row's own
      line (not `<pad>` after its end, nor, in the line layout of packed rows, another line's
      token).
    prefix_end_ids: ids that end the prefix (`prefix`).

  Raises:
    ValueError: an unknown attention, or `prefix` without prefix-end ids.
  """
  if attention not in ATTENTIONS:
    raise ValueError(f"attention must be one of {tuple(ATTENTIONS)}, got {attention!r}")
  return ATTENTIONS[attention](tokens_BxL, key_real_BxL, tuple(prefix_end_ids))


def line_key_mask(unpack_BxNxM: Array, repack_BxL: Array) -> Array:
  """Boolean [B * N, M]: True at the slots of the line layout that hold a token of their own
  line (`packing.pack_lines`: slot o of line j is its token when the row position it reads
  maps back to j * M + o), False past a line's end."""
  b, n, m = unpack_BxNxM.shape
  back = jnp.take_along_axis(repack_BxL, unpack_BxNxM.reshape(b, n * m), axis=1)
  want = jnp.arange(n * m, dtype=back.dtype)[None, :]
  return (back == want).reshape(b * n, m)
