"""The UAS of the training evaluation: `in_domain/uas` and `in_domain/uas_weight` of the best
head, beside the positional baselines `in_domain/uas_prev_token`, `uas_next_token` and
`uas_best_offset`, on the first in-domain lines (run by the `uas` evaluator,
`sg_jax.evaluation.uas`; definitions: `sg_jax.analysis.uas`, `sg_jax.analysis.uas_positional`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import registry
from sg_jax.analysis.uas import finalize, line_batches, special_ids_of, uas_stats_over_seeds
from sg_jax.analysis.uas_positional import positional_baselines, positional_uas_stats
from sg_jax.models.transformer import TransformerLM
from sg_jax.runtime import sharding

PyTree = Any


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


def _batch_args(batches: dict, special, i: int) -> tuple:
  """The arguments of `uas_stats_over_seeds` after the parameters for batch `i` of
  `eval_batches(...)`: inputs, dep_head, dep_relation [batch, L] and the special ids [3]."""
  return batches["inputs"][i], batches["dep_head"][i], batches["dep_relation"][i], special


def eval_program(model: TransformerLM, vocab, batches: dict) -> tuple[Callable, tuple, dict, int]:
  """What `make_uas_eval(model, vocab, batches)` compiles, for `sg_jax.aot`: (the jitted
  function `uas_stats_over_seeds`, one call's arguments after the parameters as
  `jax.ShapeDtypeStruct`s, its static keyword arguments, calls per evaluation). All batches of
  `eval_batches` have one shape, so one call stands for all."""
  special = special_ids_of(vocab)
  args = jax.eval_shape(lambda b, s: _batch_args(b, s, 0), dict(batches), special)
  return uas_stats_over_seeds, args, {"config": model.config}, int(batches["inputs"].shape[0])


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
      stats = uas_stats_over_seeds(params, *_batch_args(batches, special, i), config=config)
      total = registry.accumulate(total, stats)
    out = finalize(sharding.to_host(total), min_count=1)  # multi-process: all-gathered
    return {"uas": out["uas"], "uas_weight": out["uas_weight"],
            **{f"uas_{name}": np.full_like(out["uas"], positional[name])
               for name in EVAL_BASELINES}}

  return evaluate
