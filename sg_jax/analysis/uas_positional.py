"""Positional baselines of the UAS (Clark et al. 2019, "What does BERT look at?", §4.2 and
Fig. 5): the attachment score of heads that attend at a fixed relative offset.

Baselines (`positional_uas_stats`, `positional_baselines`): the UAS of positional heads, scored
as model heads are on the same lines and arcs: the previous token, the next token, and the best
fixed offset per relation (Clark et al. 2019, "What does BERT look at?", §4.2). Training logs
them as `in_domain/uas_prev_token`, `in_domain/uas_next_token`, `in_domain/uas_best_offset`
(constants of the evaluation lines, computed once); the analysis as `uas_prev_token`, ...
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis.uas import (MIN_RELATION_COUNT, NUM_RELATIONS, attention_uas_stats,
                                 directions)

Array = jax.Array


POSITIONAL_CHUNK = 8  # offsets scored per compiled call (bounds the [O, B, L, L] maps)


def positional_maps(offsets: Sequence[int], batch: int, length: int) -> Array:
  """float32 [O, B, 1, L, L]: the attention of a positional head per offset o, all of query
  q's mass on key q + o (an all-zero row where q + o lies outside the line)."""
  offsets = jnp.asarray(offsets, jnp.int32)
  pos = jnp.arange(length)
  target = pos[None, :] + offsets[:, None]  # [O, L]
  maps = (pos[None, None, :] == target[:, :, None]).astype(jnp.float32)  # [O, L, L]
  return jnp.broadcast_to(maps[:, None, None], (offsets.shape[0], batch, 1, length, length))


@functools.partial(jax.jit, static_argnames=("attention", "prefix_end_ids"))
def _positional_chunk(inputs_BxL, dep_head_BxL, dep_relation_BxL, special_ids, offsets_O, *,
                      attention, prefix_end_ids):
  maps = positional_maps(offsets_O, inputs_BxL.shape[0], inputs_BxL.shape[1])
  stats = attention_uas_stats(maps, inputs_BxL, dep_head_BxL, dep_relation_BxL, special_ids,
                              attention=attention, prefix_end_ids=prefix_end_ids)
  return stats["hits"][:, 0], stats["count"]


def positional_uas_stats(batches: Sequence[dict], special_ids: np.ndarray, *,
                         attention: str = "causal", prefix_end_ids: tuple = ()
                         ) -> dict[str, np.ndarray]:
  """Argmax-UAS sums of positional heads, one per fixed relative offset, over batches of lines.

  A positional head of offset o puts all of row q's attention on position q + o (o = -1: the
  previous token, +1: the next token). It is scored exactly as a model head is
  (`attention_uas_stats`: the directions and candidates of `attention`, ties split), on the same
  lines and arcs. Where q + o is no candidate of the row (outside the line or the mask, or a
  special token such as SOS) every candidate ties at 0 and the arc scores 1/(number of
  candidates), as a real head that parks its mass on SOS would. Under `later_to_earlier` (`lm`,
  `prefix_lm`) the row is the later token of each arc, so the offset is minus the arc's length
  whichever end is the head; under `bidirectional` the dependent's row (`dependent_to_head`,
  Clark et al.'s offset from the dependent) and the dependent's column (`head_to_dependent`).

  Args:
    batches: `line_batches` output (numpy or device arrays; int32 [B, L] each).
    special_ids: `special_ids_of(vocab)`.
    attention, prefix_end_ids: as `attention_uas_stats` (`ModelConfig.attention`,
      `ModelConfig.prefix_end_ids`).

  Returns:
    {'offsets': int32 [O] (-(L-1) .. L-1 without 0, L the longest batch), 'hits': float64
    [O, D, R] summed argmax hits, 'count': float64 [R] arcs}, D = `len(directions(attention))`,
    R = `len(dependencies.RELATIONS)`.

  Raises:
    ValueError: no batch, or an unknown attention.
  """
  names = directions(attention)
  if not batches:
    raise ValueError("positional_uas_stats needs at least one batch of lines")
  length = max(int(np.shape(b["inputs"])[-1]) for b in batches)
  offsets = tuple(o for o in range(-(length - 1), length) if o != 0)
  hits = np.zeros((len(offsets), len(names), NUM_RELATIONS))
  count = np.zeros(NUM_RELATIONS)
  special = jnp.asarray(special_ids, jnp.int32)
  for b in batches:
    arrays = tuple(jnp.asarray(b[k], jnp.int32) for k in ("inputs", "dep_head", "dep_relation"))
    for start in range(0, len(offsets), POSITIONAL_CHUNK):
      chunk = offsets[start:start + POSITIONAL_CHUNK]
      padded = np.zeros(POSITIONAL_CHUNK, np.int32)  # one compiled shape; the filler is dropped
      padded[:len(chunk)] = chunk
      h, c = _positional_chunk(*arrays, special, jnp.asarray(padded), attention=attention,
                               prefix_end_ids=tuple(prefix_end_ids))
      hits[start:start + len(chunk)] += np.asarray(h, np.float64)[:len(chunk)]
    count += np.asarray(c, np.float64)
  return {"offsets": np.asarray(offsets, np.int32), "hits": hits, "count": count}


def positional_baselines(stats: dict, min_count: int = MIN_RELATION_COUNT
                         ) -> dict[str, np.ndarray | float]:
  """The positional-attention baselines of the best-head UAS from `positional_uas_stats` sums.

  Clark et al. (2019, §4.2) compare each head with "a simple fixed-offset baseline": the head of
  a dependent predicted at the best single relative offset for its relation. Here:

  * 'prev_token' / 'next_token': UAS over all arcs of the offset -1 / +1 head (the better
    direction under bidirectional attention, as a model head's `uas_head`);
  * 'best_offset': every relation scored at its own best (offset, direction), the hits summed
    over relations and divided by all arcs (the per-relation choice of Clark et al.; every
    relation counts, rare ones included, as every arc counts in `uas`);
  * 'best_offset_relation' float [R] (NaN below `min_count` arcs, as `uas_relation`) and
    'best_offset_of_relation' int [R] (the offset chosen, the nearest on ties, a left one
    before a right one; 0 where the relation has no arc).

  Returns:
    the above; the scalars are floats (NaN without any arc).

  Raises:
    ValueError: min_count < 1.
  """
  if min_count < 1:
    raise ValueError(f"min_count must be >= 1, got {min_count}")
  offsets, hits, count = (np.asarray(stats[k]) for k in ("offsets", "hits", "count"))
  total = count.sum()
  at = {o: int(np.flatnonzero(offsets == o)[0]) for o in (-1, 1) if o in offsets}
  with np.errstate(invalid="ignore", divide="ignore"):
    fixed = {name: (float(np.max(hits[at[o]].sum(-1)) / total) if o in at and total > 0
                    else float("nan")) for name, o in (("prev_token", -1), ("next_token", 1))}
    per_rel_hits = hits.max(axis=(0, 1))  # [R]
    best = float(per_rel_hits.sum() / total) if total > 0 else float("nan")
    per_rel = np.where(count >= min_count, per_rel_hits / count, np.nan)
  nearest_first = np.argsort(np.abs(offsets) * 2 + (offsets > 0), kind="stable")
  flat = hits.max(axis=1)[nearest_first].argmax(axis=0)  # [R] ties: the nearest, left first
  chosen = np.where(count > 0, offsets[nearest_first][flat], 0)
  return {**fixed, "best_offset": best, "best_offset_relation": per_rel,
          "best_offset_of_relation": chosen.astype(np.int32)}
