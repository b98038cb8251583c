"""Packed training rows: a step's lines laid out one after another in one row of token positions.

`pack_lines` builds the row of one seed's batch; `packing_capacities` chooses the row lengths
(buckets) a run compiles, from the training set's length distribution; `padding_fraction`
estimates the padding a layout computes. `BatchLayout` is the typed form of the run config's
`train` fields these read (built once at the top of a run).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """How a step's training lines are laid out (the run config's `train.batch_size`,
  `train.packing` and `train.packing_buckets`).

  Attributes:
    batch_size: lines per step per seed.
    packing: pack each step's lines into one row (`pack_lines`); False: padded [batch, length].
    packing_buckets: most row-capacity buckets (`packing_capacities`).
  """

  batch_size: int
  packing: bool
  packing_buckets: int

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "BatchLayout":
    """The layout a resolved run config sets."""
    return cls(batch_size=int(config.train.batch_size), packing=bool(config.train.packing),
               packing_buckets=int(config.train.packing_buckets))


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


# Fewer buckets are used when they compute at most this fraction more token positions than
# `train.packing_buckets` buckets would (each bucket compiles one more branch of the train step).
BUCKET_TOLERANCE = 0.02


def _round8(x):
  return (np.ceil(np.asarray(x) / 8) * 8).astype(np.int64)


def sampled_needs(lengths: np.ndarray, batch_size: int, num_seeds: int, samples: int = 4000,
                  seed: int = 0) -> np.ndarray:
  """Row positions a step needs: the most tokens any of its `num_seeds` seeds' batches of
  `batch_size` random training lines holds, for `samples` random steps (int64 [samples])."""
  rng = np.random.default_rng(seed)
  lengths = np.asarray(lengths)
  draws = rng.integers(0, len(lengths), size=(samples, num_seeds, batch_size))
  return lengths[draws].sum(-1).max(-1)


def optimal_capacities(needs: np.ndarray, top: int, num_buckets: int) -> tuple[int, ...]:
  """The `num_buckets` row capacities (multiples of 8, the largest `top`) that minimise the
  positions computed over `needs` when each step uses the smallest capacity holding its need.

  Exact dynamic programme over the distinct needs rounded up to multiples of 8 (an optimal
  capacity is always one of them): cost[j][i] = fewest positions for the needs <= value i
  with j capacities, the largest of them value i.
  """
  values, counts = np.unique(np.minimum(_round8(needs), top), return_counts=True)
  below = np.concatenate([[0], np.cumsum(counts)])  # needs among the first i values
  m, total = len(values), below[-1]
  k = min(num_buckets - 1, m)  # capacities below `top`
  inf = np.inf
  cost = np.full((k + 1, m), inf)
  back = np.zeros((k + 1, m), np.int64)
  if k >= 1:
    cost[1] = values * below[1:]
  for j in range(2, k + 1):
    for i in range(j - 1, m):
      prev = cost[j - 1, :i] - values[i] * below[1:i + 1]
      best = int(np.argmin(prev))
      cost[j, i], back[j, i] = prev[best] + values[i] * below[i + 1], best
  # The top capacity takes the needs above the largest smaller one.
  best_cost, best_j, best_i = top * total, 0, -1
  for j in range(1, k + 1):
    with np.errstate(invalid="ignore"):
      totals = cost[j] + top * (total - below[1:])
    i = int(np.argmin(totals))
    if totals[i] < best_cost:
      best_cost, best_j, best_i = totals[i], j, i
  caps = [int(top)]
  while best_j >= 1:
    caps.append(int(values[best_i]))
    best_i, best_j = back[best_j, best_i], best_j - 1
  return tuple(sorted(set(caps)))


def computed_positions(needs: np.ndarray, capacities: tuple[int, ...]) -> float:
  """Mean row positions a step computes with `capacities` (smallest holding each need)."""
  caps = np.asarray(capacities)
  return float(caps[np.searchsorted(caps, needs)].mean())


def packing_capacities(lengths: np.ndarray, batch_size: int, num_seeds: int, padded_length: int,
                       num_buckets: int, samples: int = 4000, seed: int = 0,
                       tolerance: float = BUCKET_TOLERANCE) -> tuple[int, ...]:
  """Row capacities (token positions) for packed training, smallest first: at most
  `num_buckets`, sized from the training set's length distribution.

  A step uses the smallest capacity that holds the longest of its seeds' batches (its "need",
  `sampled_needs`). The capacities minimise the positions computed over sampled steps
  (`optimal_capacities`); the fewest buckets that compute at most `tolerance` more positions
  than `num_buckets` buckets are used, as each bucket compiles one more branch of the train
  step. The largest capacity holds the `batch_size` longest lines together, so every batch fits
  (it is at most batch_size * padded_length).

  Raises:
    ValueError: no training lines, or num_buckets < 1.
  """
  lengths = np.asarray(lengths)
  if lengths.size == 0 or num_buckets < 1:
    raise ValueError(f"packing needs training lines and >= 1 bucket (got {lengths.size} lines, "
                     f"{num_buckets} buckets)")
  longest = np.sort(lengths)[::-1]
  top = int(min(_round8(longest[:batch_size].sum() if len(longest) >= batch_size
                        else longest[0] * batch_size), batch_size * padded_length))
  needs = sampled_needs(lengths, batch_size, num_seeds, samples, seed)
  best = optimal_capacities(needs, top, num_buckets)
  floor = computed_positions(needs, best)
  for k in range(1, num_buckets):
    caps = optimal_capacities(needs, top, k)
    if computed_positions(needs, caps) <= (1 + tolerance) * floor:
      return caps
  return best


def padding_fraction(layout: BatchLayout, lengths: np.ndarray, num_seeds: int,
                     padded_length: int, num_steps: int = 2000, seed: int = 1) -> float:
  """Expected fraction of computed token positions that are padding during training.

  Padded layout: 1 - mean(length) / padded_length. Packed layout: capacity chosen per step as in
  training (smallest bucket holding the batch of every seed that shares it: `num_seeds` = seeds
  per device when training on a mesh), estimated over `num_steps` random steps.
  """
  lengths = np.asarray(lengths)
  batch = layout.batch_size
  if not layout.packing:
    return float(1.0 - lengths.mean() / padded_length)
  caps = np.asarray(packing_capacities(lengths, batch, num_seeds, padded_length,
                                       layout.packing_buckets))
  rng = np.random.default_rng(seed)
  totals = lengths[rng.integers(0, len(lengths), size=(num_steps, num_seeds, batch))].sum(-1)
  chosen = caps[np.searchsorted(caps, totals.max(-1))]
  return float(1.0 - totals.sum() / (chosen.sum() * num_seeds))
