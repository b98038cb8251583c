"""Unlabelled attachment score (UAS) of attention heads (Chen et al., ICLR 2024; docs/sas.md).

Definitions (docs/REFERENCE.md §3, the original's public code), adapted to a causal LM:

* Each gold arc (`dependencies`: dependent -> head, input positions) joins an earlier and a later
  token. In a causal LM only the later token's attention row can see the earlier one, so each arc
  is scored in that one direction: row = the later token, gold column = the earlier one (the
  original's dependent->head direction when the head comes first, its head->dependent
  direction, the transposed map, when the dependent comes first).
* Argmax UAS: the row's prediction is its argmax over the columns left after removing the
  diagonal and the special tokens (SOS, EOS, padding; punctuation and task tokens stay
  candidates). A row whose maximum several candidates share counts `1/k` when the gold column is
  one of the k: the expected score under random tie-breaking, so a uniform row scores exactly
  chance, `1/(number of candidates)`.
* Attention-weight variant (the original's second): the attention probability the later token
  puts on the earlier one (the softmax as the model computes it, not renormalised).
* Roots, punctuation and task tokens have no arc, so they are never scored, in the per-relation
  rows nor in the "all" row (the original's "all" row counts the roots, which can never be right;
  sg_jax does not copy that). Per-relation tables leave out relations with fewer than
  `min_count` arcs (the original: 100); the "all" row counts every arc.
* The best single (layer, head) is reported per relation and overall (`uas`, `uas_weight`).

Batch functions return sums, so that batches combine exactly (`registry.accumulate`);
`finalize` turns them into scores. `uas_stats` is written for one seed; `uas_stats_over_seeds`
adds the seed axis (`registry.over_seeds`). The module also builds the per-evaluation UAS of
training (`eval_batches`, `make_uas_eval`: `in_domain/uas` and `in_domain/uas_weight` in
metrics.csv); `sg_jax.analysis.uas_quantity` registers the `uas` metric group of
`sg_jax.analyze` (`--modules=sg_jax.analysis.uas_quantity`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import sharding
from sg_jax.analysis import registry
from sg_jax.intermediates import apply_with_intermediates
from sg_jax.model import ModelConfig, TransformerLM
from sg_jax.tasks import dependencies
from sg_jax.tasks import io as tasks_io

Array = jax.Array
PyTree = Any

MIN_RELATION_COUNT = 100  # the original's threshold of the per-relation tables
NUM_RELATIONS = len(dependencies.RELATIONS)
EVAL_KEY = "in_domain_uas"  # the key of the UAS lines in the training evaluation's data


def attention_uas_stats(attention_NxBxHxLxL: Array, inputs_BxL: Array, dep_head_BxL: Array,
                        dep_relation_BxL: Array, special_ids: Array) -> dict[str, Array]:
  """UAS sums of one batch from given attention probabilities (one seed).

  Args:
    attention_NxBxHxLxL: float [layers, batch, heads, L(query), L(key)] probabilities.
    inputs_BxL: int32 [B, L] the model inputs (`SOS w1 .. wn` then `<pad>`=0).
    dep_head_BxL: int32 [B, L] head position of the word at each position, -1 = no arc
      (`dependencies.dependency_arrays`).
    dep_relation_BxL: int32 [B, L] relation index (`dependencies.RELATIONS`), -1 = no arc.
    special_ids: int32 [K] ids that are never a candidate column (SOS, EOS, pad).

  Returns:
    {'hits': float32 [layers, heads, R] argmax hits (ties split), 'weight': float32 [layers,
    heads, R] summed attention on the gold column, 'count': float32 [R] arcs}, R =
    `len(dependencies.RELATIONS)`.
  """
  att = attention_NxBxHxLxL.astype(jnp.float32)
  length = att.shape[-1]
  pos = jnp.arange(length)
  has_BxL = (dep_head_BxL >= 0) & (dep_relation_BxL >= 0)
  head_BxL = jnp.where(has_BxL, dep_head_BxL, 0)
  later_BxL = jnp.maximum(pos[None, :], head_BxL)
  earlier_BxL = jnp.minimum(pos[None, :], head_BxL)
  b_idx = jnp.arange(att.shape[1])[:, None]
  rows_BxLxNxHxL = att[:, b_idx, :, later_BxL, :]  # the later token's row of each arc
  candidate_BxL = ~jnp.isin(inputs_BxL, special_ids)
  allowed_BxLxL = (pos[None, None, :] < later_BxL[:, :, None]) & candidate_BxL[:, None, :]
  allowed = allowed_BxLxL[:, :, None, None, :]
  masked = jnp.where(allowed, rows_BxLxNxHxL, -jnp.inf)
  top_BxLxNxH = jnp.max(masked, axis=-1)
  ties_BxLxNxH = jnp.sum(allowed & (masked == top_BxLxNxH[..., None]), axis=-1)
  gold_onehot = jax.nn.one_hot(earlier_BxL, length, dtype=jnp.float32)[:, :, None, None, :]
  gold_BxLxNxH = jnp.sum(rows_BxLxNxHxL * gold_onehot, axis=-1)
  hit_BxLxNxH = jnp.where(gold_BxLxNxH == top_BxLxNxH,
                          1.0 / jnp.maximum(ties_BxLxNxH, 1).astype(jnp.float32), 0.0)
  rel_BxLxR = jax.nn.one_hot(jnp.where(has_BxL, dep_relation_BxL, 0), NUM_RELATIONS,
                             dtype=jnp.float32) * has_BxL[..., None]
  return {"hits": jnp.einsum("blnh,blr->nhr", hit_BxLxNxH, rel_BxLxR),
          "weight": jnp.einsum("blnh,blr->nhr", gold_BxLxNxH, rel_BxLxR),
          "count": jnp.sum(rel_BxLxR, axis=(0, 1))}


def uas_stats(params: PyTree, inputs_BxL: Array, dep_head_BxL: Array, dep_relation_BxL: Array,
              special_ids: Array, *, config: ModelConfig) -> dict[str, Array]:
  """`attention_uas_stats` of ONE seed's real (causal, dropout-free) forward pass.

  Pure and jit-able (`config` static); `uas_stats_over_seeds` maps it over a leading seed axis
  of `params` (every value then has a leading [S] axis). Arguments as `attention_uas_stats`.
  """
  _, internals = apply_with_intermediates(TransformerLM(config), params, inputs_BxL,
                                          deterministic=True)
  return attention_uas_stats(internals["attention"], inputs_BxL, dep_head_BxL,
                             dep_relation_BxL, special_ids)


uas_stats_over_seeds = registry.over_seeds(uas_stats)


def finalize(stats: dict, min_count: int = MIN_RELATION_COUNT) -> dict[str, np.ndarray]:
  """Scores from summed stats (with a leading seed axis [S]).

  Args:
    stats: summed `attention_uas_stats` / `uas_stats_over_seeds` outputs, 'hits' and 'weight'
      [S, layers, heads, R], 'count' [S, R].
    min_count: relations with fewer arcs get NaN in the per-relation scores (the original: 100).

  Returns:
    numpy: 'uas_head' / 'weight_head' [S, layers, heads] (all arcs), 'uas' / 'uas_weight' [S]
    (best head), 'uas_relation' / 'weight_relation' [S, R] (best head per relation, NaN when
    rare), 'count' [S, R]. NaN everywhere when there is no arc.

  Raises:
    ValueError: min_count < 1.
  """
  if min_count < 1:
    raise ValueError(f"min_count must be >= 1, got {min_count}")
  hits, weight = np.asarray(stats["hits"]), np.asarray(stats["weight"])
  count = np.asarray(stats["count"])
  with np.errstate(invalid="ignore", divide="ignore"):
    total = count.sum(-1)[:, None, None]
    uas_head = np.where(total > 0, hits.sum(-1) / total, np.nan)
    weight_head = np.where(total > 0, weight.sum(-1) / total, np.nan)
    ok = (count >= min_count)[:, None, None, :]
    per_rel = np.where(ok, hits / count[:, None, None, :], np.nan)
    per_rel_w = np.where(ok, weight / count[:, None, None, :], np.nan)
  best = lambda x: np.max(x.reshape(x.shape[0], -1, *x.shape[3:]), axis=1) if x.size else x
  return {"uas_head": uas_head, "weight_head": weight_head,
          "uas": _nanmax(uas_head.reshape(uas_head.shape[0], -1)),
          "uas_weight": _nanmax(weight_head.reshape(weight_head.shape[0], -1)),
          "uas_relation": best(per_rel), "weight_relation": best(per_rel_w), "count": count}


def _nanmax(x_SxK: np.ndarray) -> np.ndarray:
  with np.errstate(invalid="ignore"):
    return np.where(np.all(np.isnan(x_SxK), axis=-1), np.nan,
                    np.max(np.where(np.isnan(x_SxK), -np.inf, x_SxK), axis=-1))


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


def eval_batches(config, task, vocab, workdir: str) -> dict[str, dict[str, np.ndarray]]:
  """`{EVAL_KEY: arrays [num_batches, batch, L]}` of the first `eval.uas_lines` in-domain lines
  with their arcs, or {} when `eval.uas_lines` is 0 or the task declares no dependencies (Dyck:
  its evaluation is unchanged).

  Raises:
    ValueError: a line whose trees no head rule covers.
  """
  num = int(config.eval.get("uas_lines", 0))
  if num <= 0 or not getattr(task, "has_gold_dependencies", False):
    return {}
  data_dir = tasks_io.run_data_dir(config.data, workdir)
  examples = task.read_split(data_dir, task.in_domain_split)[:num]
  lines = [(vocab.encode(ex.words), task.gold_dependencies(ex)) for ex in examples]
  batches = line_batches(lines, sos_id=vocab.sos_id,
                         batch_size=min(int(config.eval.batch_size), 64, len(lines)))
  return {EVAL_KEY: {k: np.stack([b[k] for b in batches]) for k in batches[0]}}


def make_uas_eval(model: TransformerLM, vocab, batches: dict) -> Callable[[PyTree], dict]:
  """`params [S, ...] -> {'uas': [S], 'uas_weight': [S]}` (best head overall, all arcs) over
  `eval_batches(...)[EVAL_KEY]` ([num_batches, batch, L] arrays), one seed-vmapped call per
  batch."""
  special = jnp.asarray(special_ids_of(vocab))
  config = model.config

  def evaluate(params):
    total = None
    for i in range(batches["inputs"].shape[0]):
      stats = uas_stats_over_seeds(params, batches["inputs"][i], batches["dep_head"][i],
                                   batches["dep_relation"][i], special, config=config)
      total = registry.accumulate(total, stats)
    out = finalize(sharding.to_host(total), min_count=1)  # multi-process: all-gathered
    return {"uas": out["uas"], "uas_weight": out["uas_weight"]}

  return evaluate
