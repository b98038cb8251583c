"""Packed training rows: a step's lines laid out one after another in one row of token positions.

`pack_lines` builds the row of one seed's batch; `packing_capacities` chooses the row lengths
(buckets) a run compiles; `padding_fraction` estimates the padding a layout computes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

Array = jax.Array


def pack_lines(inputs_NxL: Array, targets_NxL: Array, lengths_N: Array, idx_B: Array,
               capacity: int) -> dict:
  """Packs the lines `idx_B` of a padded set into ONE row of `capacity` token positions.

  Lines are laid out one after another; each keeps its own positions (0..n-1 for a line of n
  tokens) and attends only to itself: the model gathers each line's queries, keys and values
  into the padded layout [batch, length] for attention and the result back into the row
  (`lines`, see `model.MultiHeadAttention`), so attention costs what it costs on the padded
  batch while the dense layers run on the row's positions only. Each token keeps the identity
  it has in the padded layout (line slot x padded length + position) so dropout masks are
  unchanged (`layers.CoordinateDropout`). The loss over the row therefore equals the loss of the padded
  batch [batch, length] up to float reassociation, with far fewer padding positions.

  Args:
    inputs_NxL, targets_NxL: the padded training set [num_lines, length].
    lengths_N: non-padding positions per line.
    idx_B: int32 [batch] lines of this step.
    capacity: static row length; must be >= the lines' total length (else the tokens past it
      are silently dropped from the row and the loss; `packing_capacities` always provides a
      bucket that fits).

  Returns:
    dict with `inputs`, `targets` [1, capacity] and model keyword arguments `positions_BxL`,
    `token_ids_BxL` [1, capacity] and `lines` = (unpack_index [1, batch, length]: row position
    of token o of slot j, clipped to the row; repack_index [1, capacity]: j * length + o of the
    token at each row position, 0 for padding positions).
  """
  batch = idx_B.shape[0]
  length = inputs_NxL.shape[1]
  lens = lengths_N[idx_B]
  ends = jnp.cumsum(lens)
  q = jnp.arange(capacity, dtype=jnp.int32)
  slot = jnp.searchsorted(ends, q, side="right").astype(jnp.int32)  # [C] in 0..batch
  valid = slot < batch
  slot_c = jnp.minimum(slot, batch - 1)
  pos = jnp.clip(q - (ends - lens)[slot_c], 0, length - 1)
  line = idx_B[slot_c]
  inputs = jnp.where(valid, inputs_NxL[line, pos], 0)
  targets = jnp.where(valid, targets_NxL[line, pos], 0)
  unpack = jnp.minimum((ends - lens)[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :],
                       capacity - 1)
  repack = jnp.where(valid, slot_c * length + pos, 0)
  return {"inputs": inputs[None], "targets": targets[None],
          "positions_BxL": jnp.where(valid, pos, 0)[None],
          "token_ids_BxL": (slot_c.astype(jnp.uint32) * jnp.uint32(length)
                            + pos.astype(jnp.uint32))[None],
          "lines": (unpack.astype(jnp.int32)[None], repack.astype(jnp.int32)[None])}


def packing_capacities(lengths: np.ndarray, batch_size: int, num_seeds: int, padded_length: int,
                       num_buckets: int, samples: int = 4000, seed: int = 0) -> tuple[int, ...]:
  """Row capacities (token positions) for packed training, smallest first.

  A step uses the smallest capacity that holds the longest of its seeds' batches. The buckets
  are quantiles of that maximum, estimated by sampling random batches of the training lengths,
  rounded up to multiples of 8; the last bucket, batch_size * padded_length, always fits.
  """
  rng = np.random.default_rng(seed)
  lengths = np.asarray(lengths)
  draws = rng.integers(0, len(lengths), size=(samples, num_seeds, batch_size))
  need = lengths[draws].sum(-1).max(-1)
  qs = np.quantile(need, np.arange(1, num_buckets + 1) / (num_buckets + 1))
  caps = sorted({int(np.ceil(c / 8) * 8) for c in qs} | {batch_size * padded_length})
  return tuple(c for c in caps if c <= batch_size * padded_length)


def padding_fraction(config: ml_collections.ConfigDict, lengths: np.ndarray, num_seeds: int,
                     padded_length: int, num_steps: int = 2000, seed: int = 1) -> float:
  """Expected fraction of computed token positions that are padding during training.

  Padded layout: 1 - mean(length) / padded_length. Packed layout: capacity chosen per step as in
  training (smallest bucket holding the batch of every seed that shares it: `num_seeds` = seeds
  per device when training on a mesh), estimated over `num_steps` random steps.
  """
  lengths = np.asarray(lengths)
  batch = int(config.train.batch_size)
  if not config.train.packing:
    return float(1.0 - lengths.mean() / padded_length)
  caps = np.asarray(packing_capacities(lengths, batch, num_seeds, padded_length,
                                       config.train.packing_buckets))
  rng = np.random.default_rng(seed)
  totals = lengths[rng.integers(0, len(lengths), size=(num_steps, num_seeds, batch))].sum(-1)
  chosen = caps[np.searchsorted(caps, totals.max(-1))]
  return float(1.0 - totals.sum() / (chosen.sum() * num_seeds))
