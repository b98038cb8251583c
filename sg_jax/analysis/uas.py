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
adds the seed axis (`registry.over_seeds`).

Beside this module: `uas_positional` (the UAS of positional heads, the baselines of Clark et
al. 2019), `uas_eval` (the per-evaluation UAS of training, run by the `uas` evaluator,
`sg_jax.evaluation.uas`: `in_domain/uas`, `in_domain/uas_weight` and the baselines in
metrics.csv) and `uas_quantity` (the `uas` metric group of `sg_jax.analyze`,
`--modules=sg_jax.analysis.uas_quantity`).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import registry
from sg_jax.models.attention_masks import line_mask
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM
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
