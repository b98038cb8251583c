"""Unlabelled attachment score (UAS) of attention heads (Chen et al., ICLR 2024; docs/sas.md).

Definitions (docs/REFERENCE.md §3, the original's public code). Each gold arc (`dependencies`:
dependent -> head, input positions) is scored in the directions the model's attention
(`ModelConfig.attention`, `DIRECTIONS`) can read it in:

* causal (`lm`): only the later token's attention row can see the earlier one, so each arc is
  scored in that one direction, `later_to_earlier`: row = the later token, gold column = the
  earlier one (the original's dependent->head map when the head comes first; when the dependent
  comes first, the head's row looking for its dependent).
* prefix (`prefix_lm`): the same single direction, `later_to_earlier` (the later token sees the
  earlier one under prefix attention too), so prefix and causal UAS compare directly. The
  candidates are what the row may attend to: for a token of the input part, every real token of
  the input part, later ones included. The earlier token's row, which also sees the later one
  inside the input part, is not scored.
* bidirectional (`mlm`): both of the original's maps (its `attn_head_predictor` modes "normal"
  and "transpose"), as two directions of every head: `dependent_to_head` (the dependent's row;
  its argmax over the columns is its predicted head) and `head_to_dependent` (the transposed
  map: the dependent's COLUMN; the token that attends to it most is its predicted head). The
  best (layer, head, direction) is reported, as the original does.

* Argmax UAS: the prediction is the argmax over the candidates: the positions the row may attend
  to (column direction: the rows that may attend to the column), less the diagonal and the
  special tokens (SOS, EOS, padding; punctuation and task tokens stay candidates). A maximum
  that k candidates share counts `1/k` when the gold position is one of them: the expected score
  under random tie-breaking, so a uniform row scores exactly chance, `1/(number of candidates)`.
* Attention-weight variant (the original's second): the attention probability on the arc as
  the model computes it (not renormalised): `later_to_earlier` and `dependent_to_head` read
  A[row token, gold], `head_to_dependent` reads A[head, dependent].
* Roots, punctuation and task tokens have no arc, so they are never scored, in the per-relation
  rows nor in the "all" row (the original's "all" row counts the roots, which can never be right;
  sg_jax does not copy that). Per-relation tables leave out relations with fewer than
  `min_count` arcs (the original: 100); the "all" row counts every arc.
* The best single (layer, head, direction) is reported per relation and overall (`uas`,
  `uas_weight`); per head, the better of its directions.

Batch functions return sums, so that batches combine exactly (`registry.accumulate`);
`finalize` turns them into scores. `uas_stats` is written for one seed; `uas_stats_over_seeds`
adds the seed axis (`registry.over_seeds`). The module also builds the per-evaluation UAS of
training (`eval_batches`, `make_uas_eval`, run by the `uas` evaluator, `sg_jax.evaluation.uas`:
`in_domain/uas` and `in_domain/uas_weight` in metrics.csv); `sg_jax.analysis.uas_quantity` registers the `uas` metric group of
`sg_jax.analyze` (`--modules=sg_jax.analysis.uas_quantity`).

Baselines (`positional_uas_stats`, `positional_baselines`): the UAS of positional heads, scored
as model heads are on the same lines and arcs: the previous token, the next token, and the best
fixed offset per relation (Clark et al. 2019, "What does BERT look at?", §4.2). Training logs
them as `in_domain/uas_prev_token`, `in_domain/uas_next_token`, `in_domain/uas_best_offset`
(constants of the evaluation lines, computed once); the analysis as `uas_prev_token`, ...
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import registry
from sg_jax.models.attention_masks import line_mask
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM
from sg_jax.runtime import sharding
from sg_jax.tasks import dependencies

Array = jax.Array
PyTree = Any

MIN_RELATION_COUNT = 100  # the original's threshold of the per-relation tables
NUM_RELATIONS = len(dependencies.RELATIONS)
# The directions each attention scores an arc in (module docstring), in the order of the
# direction axis of the stats.
DIRECTIONS = {"causal": ("later_to_earlier",), "prefix": ("later_to_earlier",),
              "bidirectional": ("dependent_to_head", "head_to_dependent")}


def directions(attention: str) -> tuple[str, ...]:
  """The directions an arc is scored in under `attention` (`DIRECTIONS`).

  Raises:
    ValueError: an unknown attention.
  """
  if attention not in DIRECTIONS:
    raise ValueError(f"attention must be one of {tuple(DIRECTIONS)}, got {attention!r}")
  return DIRECTIONS[attention]


def _score_rows(maps_NxBxHxLxL: Array, row_BxL: Array, gold_BxL: Array, allowed_BxLxL: Array
                ) -> tuple[Array, Array]:
  """(argmax hit with ties split, value at the gold position), float32 [B, L, N, H] each, of
  row `row_BxL[b, l]` of `maps[:, b]` with candidates `allowed_BxLxL[b, l]` (one arc per (b, l)).
  """
  b_idx = jnp.arange(maps_NxBxHxLxL.shape[1])[:, None]
  rows_BxLxNxHxL = maps_NxBxHxLxL[:, b_idx, :, row_BxL, :]
  allowed = allowed_BxLxL[:, :, None, None, :]
  masked = jnp.where(allowed, rows_BxLxNxHxL, -jnp.inf)
  top_BxLxNxH = jnp.max(masked, axis=-1)
  ties_BxLxNxH = jnp.sum(allowed & (masked == top_BxLxNxH[..., None]), axis=-1)
  gold_onehot = jax.nn.one_hot(gold_BxL, maps_NxBxHxLxL.shape[-1],
                               dtype=jnp.float32)[:, :, None, None, :]
  gold_BxLxNxH = jnp.sum(rows_BxLxNxHxL * gold_onehot, axis=-1)
  hit_BxLxNxH = jnp.where(gold_BxLxNxH == top_BxLxNxH,
                          1.0 / jnp.maximum(ties_BxLxNxH, 1).astype(jnp.float32), 0.0)
  return hit_BxLxNxH, gold_BxLxNxH


def attention_uas_stats(attention_NxBxHxLxL: Array, inputs_BxL: Array, dep_head_BxL: Array,
                        dep_relation_BxL: Array, special_ids: Array, *,
                        attention: str = "causal", prefix_end_ids: tuple = ()
                        ) -> dict[str, Array]:
  """UAS sums of one batch from given attention probabilities (one seed).

  Args:
    attention_NxBxHxLxL: float [layers, batch, heads, L(query), L(key)] probabilities.
    inputs_BxL: int32 [B, L] the model inputs (`SOS w1 .. wn` then `<pad>`=0).
    dep_head_BxL: int32 [B, L] head position of the word at each position, -1 = no arc
      (`dependencies.dependency_arrays`).
    dep_relation_BxL: int32 [B, L] relation index (`dependencies.RELATIONS`), -1 = no arc.
    special_ids: int32 [K] ids that are never a candidate (SOS, EOS, pad).
    attention: the model's attention (`ModelConfig.attention`): which directions are scored
      (`DIRECTIONS`) and what each row may attend to (`attention_masks.line_mask`).
    prefix_end_ids: the ids that end the prefix ('prefix' attention).

  Returns:
    {'hits': float32 [layers, heads, D, R] argmax hits (ties split), 'weight': float32
    [layers, heads, D, R] summed attention on the gold position, 'count': float32 [R] arcs},
    D = `len(directions(attention))`, R = `len(dependencies.RELATIONS)`.

  Raises:
    ValueError: an unknown attention, or 'prefix' without prefix-end ids.
  """
  names = directions(attention)
  att = attention_NxBxHxLxL.astype(jnp.float32)
  length = att.shape[-1]
  pos = jnp.arange(length)
  has_BxL = (dep_head_BxL >= 0) & (dep_relation_BxL >= 0)
  head_BxL = jnp.where(has_BxL, dep_head_BxL, 0)
  dep_BxL = jnp.broadcast_to(pos[None, :], head_BxL.shape)
  # visible[b, q, k]: query q may attend to key k (the model's own mask), less the diagonal
  visible_BxLxL = jnp.broadcast_to(
      line_mask(attention, inputs_BxL, inputs_BxL != 0, prefix_end_ids)[:, 0],
      (inputs_BxL.shape[0], length, length)) & ~jnp.eye(length, dtype=bool)[None]
  candidate_BxL = ~jnp.isin(inputs_BxL, special_ids)
  b_idx = jnp.arange(att.shape[1])[:, None]
  per_direction = []
  for name in names:
    if name == "head_to_dependent":  # the transposed map: the dependent's column
      maps, row, gold = jnp.swapaxes(att, -1, -2), dep_BxL, head_BxL
      allowed = jnp.swapaxes(visible_BxLxL, -1, -2)[b_idx, row] & candidate_BxL[:, None, :]
    else:
      row, gold = ((jnp.maximum(dep_BxL, head_BxL), jnp.minimum(dep_BxL, head_BxL))
                   if name == "later_to_earlier" else (dep_BxL, head_BxL))
      maps, allowed = att, visible_BxLxL[b_idx, row] & candidate_BxL[:, None, :]
    per_direction.append(_score_rows(maps, row, gold, allowed))
  hit_BxLxNxHxD = jnp.stack([h for h, _ in per_direction], axis=-1)
  gold_BxLxNxHxD = jnp.stack([g for _, g in per_direction], axis=-1)
  rel_BxLxR = jax.nn.one_hot(jnp.where(has_BxL, dep_relation_BxL, 0), NUM_RELATIONS,
                             dtype=jnp.float32) * has_BxL[..., None]
  return {"hits": jnp.einsum("blnhd,blr->nhdr", hit_BxLxNxHxD, rel_BxLxR),
          "weight": jnp.einsum("blnhd,blr->nhdr", gold_BxLxNxHxD, rel_BxLxR),
          "count": jnp.sum(rel_BxLxR, axis=(0, 1))}


def uas_stats(params: PyTree, inputs_BxL: Array, dep_head_BxL: Array, dep_relation_BxL: Array,
              special_ids: Array, *, config: ModelConfig) -> dict[str, Array]:
  """`attention_uas_stats` of ONE seed's real (dropout-free) forward pass, scored in the
  directions of the model's attention (`config.attention`).

  Pure and jit-able (`config` static); `uas_stats_over_seeds` maps it over a leading seed axis
  of `params` (every value then has a leading [S] axis). Arguments as `attention_uas_stats`.
  """
  _, internals = apply_with_intermediates(TransformerLM(config), params, inputs_BxL,
                                          deterministic=True)
  return attention_uas_stats(internals["attention"], inputs_BxL, dep_head_BxL,
                             dep_relation_BxL, special_ids, attention=config.attention,
                             prefix_end_ids=config.prefix_end_ids)


uas_stats_over_seeds = registry.over_seeds(uas_stats)


def finalize(stats: dict, min_count: int = MIN_RELATION_COUNT) -> dict[str, np.ndarray]:
  """Scores from summed stats (with a leading seed axis [S]).

  Args:
    stats: summed `attention_uas_stats` / `uas_stats_over_seeds` outputs, 'hits' and 'weight'
      [S, layers, heads, D, R], 'count' [S, R].
    min_count: relations with fewer arcs get NaN in the per-relation scores (the original: 100).

  Returns:
    numpy: 'uas_head_direction' / 'weight_head_direction' [S, layers, heads, D] (all arcs);
    'uas_head' / 'weight_head' [S, layers, heads] (the better direction of each head);
    'uas_direction' / 'weight_direction' [S, D] (best head in each direction); 'uas' /
    'uas_weight' [S] (best head and direction); 'uas_relation' / 'weight_relation' [S, R]
    (best head and direction per relation, NaN when rare); 'count' [S, R]. NaN everywhere when
    there is no arc.

  Raises:
    ValueError: min_count < 1.
  """
  if min_count < 1:
    raise ValueError(f"min_count must be >= 1, got {min_count}")
  hits, weight = np.asarray(stats["hits"]), np.asarray(stats["weight"])
  count = np.asarray(stats["count"])
  num_seeds = count.shape[0]
  with np.errstate(invalid="ignore", divide="ignore"):
    total = count.sum(-1)[:, None, None, None]
    uas_dir = np.where(total > 0, hits.sum(-1) / total, np.nan)
    weight_dir = np.where(total > 0, weight.sum(-1) / total, np.nan)
    ok = (count >= min_count)[:, None, None, None, :]
    per_rel = np.where(ok, hits / count[:, None, None, None, :], np.nan)
    per_rel_w = np.where(ok, weight / count[:, None, None, None, :], np.nan)
  over_heads = lambda x: np.moveaxis(x, 3, 1).reshape(num_seeds, x.shape[3], -1)  # [S, D, N H]
  best = lambda x: _nanmax(np.moveaxis(x.reshape(num_seeds, -1, x.shape[-1]), -1, 1))
  return {"uas_head_direction": uas_dir, "weight_head_direction": weight_dir,
          "uas_head": _nanmax(uas_dir), "weight_head": _nanmax(weight_dir),
          "uas_direction": _nanmax(over_heads(uas_dir)),
          "weight_direction": _nanmax(over_heads(weight_dir)),
          "uas": _nanmax(uas_dir.reshape(num_seeds, -1)),
          "uas_weight": _nanmax(weight_dir.reshape(num_seeds, -1)),
          "uas_relation": best(per_rel), "weight_relation": best(per_rel_w), "count": count}


def _nanmax(x: np.ndarray) -> np.ndarray:
  """Max over the last axis ignoring NaN (NaN where all are NaN; an empty axis gives NaN)."""
  if x.shape[-1] == 0:
    return np.full(x.shape[:-1], np.nan)
  with np.errstate(invalid="ignore"):
    return np.where(np.all(np.isnan(x), axis=-1), np.nan,
                    np.max(np.where(np.isnan(x), -np.inf, x), axis=-1))


# --------------------------------------------------------------------------------------------
# Positional baselines (Clark et al. 2019, "What does BERT look at?", §4.2 and Fig. 5)
# --------------------------------------------------------------------------------------------

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


def line_batches(lines: Sequence[tuple[Sequence[int], Sequence[tuple]]], *, sos_id: int,
                 batch_size: int, length: int | None = None) -> list[dict[str, np.ndarray]]:
  """Padded batches of whole lines with their arcs.

  Args:
    lines: (word ids without SOS, arcs `[(dependent, head, relation)]` in input positions).
    sos_id: SOS id.
    batch_size: lines per batch (the last batch is filled with empty rows, which count nothing).
    length: L (default: longest line + 1).

  Returns:
    list of {'inputs', 'dep_head', 'dep_relation': int32 [batch, L]}.

  Raises:
    ValueError: no lines or batch_size < 1.
  """
  if not lines or batch_size < 1:
    raise ValueError(f"need at least one line and batch_size >= 1, got {len(lines)} lines and "
                     f"batch_size {batch_size}")
  length = length or max(len(w) for w, _ in lines) + 1
  total = -(-len(lines) // batch_size) * batch_size
  inputs = np.zeros((total, length), np.int32)
  for n, (words, _) in enumerate(lines):
    inputs[n, 0] = sos_id
    inputs[n, 1:len(words) + 1] = words
  arcs = dependencies.dependency_arrays([a for _, a in lines] + [()] * (total - len(lines)),
                                        length)
  return [{"inputs": inputs[s:s + batch_size], "dep_head": arcs["dep_head"][s:s + batch_size],
           "dep_relation": arcs["dep_relation"][s:s + batch_size]}
          for s in range(0, total, batch_size)]


def special_ids_of(vocab) -> np.ndarray:
  """int32 [3]: pad, EOS and SOS ids of a `Vocab` (never candidate columns)."""
  return np.asarray([vocab.pad_id, vocab.eos_id, vocab.sos_id], np.int32)


def uas_metrics(params_S: PyTree, batches: Sequence[dict], special_ids: np.ndarray, *,
                config: ModelConfig, min_count: int = MIN_RELATION_COUNT,
                seeds_per_call: int | None = None) -> dict[str, np.ndarray]:
  """`finalize`d UAS of every seed over batches of `line_batches`.

  Args:
    params_S: parameters with a leading seed axis [S, ...].
    batches: `line_batches` output.
    special_ids: `special_ids_of(vocab)`.
    config: model config (max_len covers the batches).
    min_count, seeds_per_call: as `finalize` and `registry.in_seed_chunks`.
  """
  special = jnp.asarray(special_ids)
  device = [tuple(jnp.asarray(b[k]) for k in ("inputs", "dep_head", "dep_relation"))
            for b in batches]

  def chunk(params):
    total = None
    for arrays in device:
      total = registry.accumulate(total, uas_stats_over_seeds(params, *arrays, special,
                                                              config=config))
    return total

  return finalize(registry.in_seed_chunks(chunk, params_S, seeds_per_call), min_count)


# --------------------------------------------------------------------------------------------
# The UAS of the training evaluation
# --------------------------------------------------------------------------------------------


def eval_batches(num_lines: int, batch_size: int, task, vocab, data_dir: str
                 ) -> dict[str, np.ndarray]:
  """Arrays [num_batches, batch, L] (`line_batches`, stacked; batches of min(batch_size, 64)
  lines) of the first `num_lines` in-domain lines with their arcs, or {} when `num_lines` is 0
  or the task declares no dependencies (Dyck: its evaluation is unchanged). The training
  evaluation's `uas` evaluator (`sg_jax.evaluation.uas`) scores them with `make_uas_eval`.

  Args:
    data_dir: the folder of the run's split files (`tasks.io.run_data_dir`).

  Raises:
    ValueError: a line whose trees no head rule covers.
  """
  num = int(num_lines)
  if num <= 0 or not getattr(task, "has_gold_dependencies", False):
    return {}
  examples = task.read_split(data_dir, task.in_domain_split)[:num]
  lines = [(vocab.encode(ex.words), task.gold_dependencies(ex)) for ex in examples]
  batches = line_batches(lines, sos_id=vocab.sos_id,
                         batch_size=min(int(batch_size), 64, len(lines)))
  return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


# The positional baselines written beside `uas` at every evaluation (`positional_baselines`).
EVAL_BASELINES = ("prev_token", "next_token", "best_offset")


def make_uas_eval(model: TransformerLM, vocab, batches: dict) -> Callable[[PyTree], dict]:
  """`params [S, ...] -> {'uas': [S], 'uas_weight': [S], 'uas_prev_token': [S],
  'uas_next_token': [S], 'uas_best_offset': [S]}` over `eval_batches(...)`
  ([num_batches, batch, L] arrays), one seed-vmapped call per batch.

  'uas' / 'uas_weight': the best head overall, all arcs. The three positional baselines
  (`positional_baselines`, all arcs) depend on the lines only: they are computed once, here,
  and repeated for every seed, so that metrics.csv has them beside `in_domain/uas`.
  """
  special = jnp.asarray(special_ids_of(vocab))
  config = model.config
  host = sharding.to_host(dict(batches))
  positional = positional_baselines(positional_uas_stats(
      [{k: host[k][i] for k in ("inputs", "dep_head", "dep_relation")}
       for i in range(host["inputs"].shape[0])], special_ids_of(vocab),
      attention=config.attention, prefix_end_ids=config.prefix_end_ids), min_count=1)

  def evaluate(params):
    total = None
    for i in range(batches["inputs"].shape[0]):
      stats = uas_stats_over_seeds(params, batches["inputs"][i], batches["dep_head"][i],
                                   batches["dep_relation"][i], special, config=config)
      total = registry.accumulate(total, stats)
    out = finalize(sharding.to_host(total), min_count=1)  # multi-process: all-gathered
    return {"uas": out["uas"], "uas_weight": out["uas_weight"],
            **{f"uas_{name}": np.full_like(out["uas"], positional[name])
               for name in EVAL_BASELINES}}

  return evaluate
