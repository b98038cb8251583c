"""The analysis programs of `sg_jax.analyze`, built as its quantities build them, for `sg_jax.aot`.

Each analysis quantity (`sg_jax.analysis.registry`) runs one jitted, seed-vmapped function per
batch of sentences (`registry.over_seeds`). `calls` builds, for a run's config and data, those
functions with the batches `sg_jax.analyze` would give them at its defaults (`registry.Options`,
`--num_sentences=1000` of `--split=train`, every metric group), by the quantities' own planning
functions, and returns one `Call` per quantity: its largest batch (the memory peak), to be
lowered on abstract arguments. Nothing runs.

Placement: `sg_jax.analyze` reads the parameters of every analysed seed to the host and calls the
jitted functions with them, so they run on one chip with every seed (`--seeds_per_call` bounds
that); `programs.plan` compiles them so (a single-device sharding, S = the run's seeds), and a
row's cost is one call divided by S: per seed and batch.

Quantities: `weight_norm`, `attention_entropy`, `tree_projection` (tscore, and tparseval where
the task has gold trees), `training_dynamics` (cka, tvd, twonn: three checkpoints' parameters)
and `uas` (`--modules=sg_jax.analysis.uas_quantity`, where the task has gold dependencies). A
registered quantity without a builder here is reported, not compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from sg_jax import objectives
from sg_jax.analysis import attention_entropy
from sg_jax.analysis import parseval
from sg_jax.analysis import pipeline
from sg_jax.analysis import registry
from sg_jax.analysis import training_dynamics
from sg_jax.analysis import tree_projection
from sg_jax.analysis import uas
from sg_jax.analysis import weight_norm

NUM_SENTENCES = 1000  # `sg_jax.analyze --num_sentences` default
SPLIT = "train"  # `sg_jax.analyze --split` default


@dataclasses.dataclass
class Call:
  """One jitted analysis function with one call's arguments (after the parameters).

  Attributes:
    name: the quantity and its batch, e.g. 'tree_projection (8 sentences/call)'.
    fn: the jitted, seed-vmapped function, `fn(params [S, ...], *args, **static)`.
    args: the arguments after the parameters (arrays: only their shapes and dtypes are used).
    static: its static keyword arguments.
    checkpoints: 0: `fn` takes one parameter pytree; n: a tuple of n checkpoints' parameters.
    resident: bytes of the quantity's other batches, which it keeps on the chip meanwhile.
    note: how the row's cost is normalised.
  """

  name: str
  fn: Callable
  args: tuple
  static: dict
  checkpoints: int = 0
  resident: int = 0
  note: str = "one call (largest batch) / seeds: per seed and batch"

  def lower(self, params, args) -> jax.stages.Lowered:
    """Lowers `fn` on `params` (abstract, [S, ...]) and `args` (abstract `self.args`)."""
    p = params if not self.checkpoints else (params,) * self.checkpoints
    return self.fn.lower(p, *args, **self.static)


def _nbytes(tree) -> int:
  return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))


def _largest(batches: list[tuple]) -> tuple[tuple, int]:
  """(the arguments of the largest batch, bytes of the others)."""
  sizes = [_nbytes(b) for b in batches]
  k = int(np.argmax(sizes))
  return batches[k], sum(sizes) - sizes[k]


def _weight_norm(inputs: registry.Inputs) -> Call:
  return Call("weight_norm", weight_norm.weight_norm_over_seeds, (), {})


def _attention_entropy(inputs: registry.Inputs) -> Call:
  """As `attention_entropy.attention_entropy_metrics` (packed for a causal model)."""
  size = inputs.options.entropy_batch_size
  if inputs.config.attention == "causal":
    planned = attention_entropy._entropy_plan(  # pylint: disable=protected-access  (its own plan)
        tuple(tuple(int(w) for w in s) for s in inputs.entropy_inputs), int(inputs.sos_id),
        int(size))
    fn = attention_entropy.packed_attention_entropy_stats_over_seeds
    batches = [arrays for _, arrays in planned]
  else:
    fn = attention_entropy.attention_entropy_stats_over_seeds
    batches = [(b.tokens, b.lengths) for b in pipeline.make_batches(
        inputs.entropy_inputs, sos_id=inputs.sos_id, batch_size=size)]
  args, rest = _largest(batches)
  return Call(f"attention_entropy ({size} lines/call)", fn, args, {"config": inputs.config},
              resident=rest)


def _tree_projection(inputs: registry.Inputs) -> Call:
  """As `tree_projection.tree_projection_metrics` (its default 'packed' layout)."""
  o = inputs.options
  gold = None
  if inputs.gold_trees is not None:  # tparseval: the gold spans ride with the batches
    gold = tuple(tuple(sorted(parseval.tree_spans(t))) for t in inputs.gold_trees)
  planned = tree_projection._tree_plan(  # pylint: disable=protected-access  (its own plan)
      tuple(tuple(int(w) for w in s) for s in inputs.declaratives), int(inputs.sos_id),
      int(o.batch_size), gold, inputs.config.attention != "causal")
  batches = [(passes, spans, jax.random.PRNGKey(o.rng_seed), row_ids)
             for _, (passes, spans, row_ids) in planned]
  args, rest = _largest(batches)
  return Call(f"tree_projection ({o.batch_size} sentences/call{', tparseval' if gold else ''})",
              tree_projection.packed_tree_projection_stats_over_seeds, args,
              {"config": inputs.config, "method": o.method, "normalisation": o.normalisation,
               "details": False}, resident=rest)


def _training_dynamics(inputs: registry.Inputs) -> Call:
  """As `training_dynamics.dynamics_metrics` with every group (this, the previous and the
  final checkpoint's parameters)."""
  o = inputs.options
  lines = inputs.lines[:o.dynamics_lines]
  plan_key = (tuple(tuple(int(w) for w in s) for s in lines), int(inputs.sos_id),
              int(o.rng_seed), int(o.entropy_batch_size), inputs.config.attention == "causal")
  plan = training_dynamics.make_plan(*plan_key[:3], rows=plan_key[3], causal=plan_key[4])
  tvd_tokens, scored = training_dynamics.predictive_inputs(plan_key, inputs.objective,
                                                           int(o.rng_seed))
  args = (plan.tokens, tvd_tokens, scored, plan.words, plan.minibatches, plan.points)
  groups = tuple(sorted(training_dynamics.GROUPS))
  return Call(f"training_dynamics ({len(lines)} lines, {'+'.join(groups)})",
              training_dynamics.dynamics_stats_over_seeds, args,
              {"config": inputs.config, "groups": groups,
               "own_tvd_pass": not np.array_equal(tvd_tokens, plan.tokens)}, checkpoints=3,
              note="one call (every line) of 3 checkpoints / seeds: per seed")


def _uas(inputs: registry.Inputs) -> Call:
  """As `uas_quantity` (`uas.uas_metrics` over `uas.line_batches`)."""
  size = inputs.options.entropy_batch_size
  batches = uas.line_batches(inputs.dependency_lines, sos_id=inputs.sos_id, batch_size=size)
  special = np.asarray([0, inputs.sos_id - 1, inputs.sos_id], np.int32)  # as uas_quantity
  args = tuple(batches[0][k] for k in ("inputs", "dep_head", "dep_relation")) + (special,)
  return Call(f"uas ({size} lines/call)", uas.uas_stats_over_seeds, args,
              {"config": inputs.config}, resident=_nbytes(batches[1:]))


# quantity -> (builder, the `registry.Inputs` field it needs or None).
BUILDERS: dict[str, tuple[Callable[[registry.Inputs], Call], str | None]] = {
    "weight_norm": (_weight_norm, None),
    "attention_entropy": (_attention_entropy, "entropy_inputs"),
    "tree_projection": (_tree_projection, "declaratives"),
    "training_dynamics": (_training_dynamics, "lines"),
    "uas": (_uas, "dependency_lines"),
}


def calls(config, task, vocab, workdir: str) -> tuple[list[Call], list[tuple[str, str]]]:
  """The analysis calls of a run (module docstring) and (quantity, why) of those not built.

  Args:
    config: the run config (`programs.target_config` applied).
    task, vocab: the run's task and vocabulary (`input_pipeline.load_data`).
    workdir: the run directory whose data/ holds the splits (as `sg_jax.analyze --workdir`).

  Raises:
    ValueError: as `pipeline.load_sentences` (e.g. a split without lines).
  """
  has_trees = bool(getattr(task, "has_gold_trees", False))
  has_deps = bool(getattr(task, "has_gold_dependencies", False))
  data = pipeline.load_sentences(config, workdir, SPLIT, NUM_SENTENCES, has_trees, vocab,
                                 need_dependencies=has_deps)
  longest = max(len(s) for s in data["entropy_inputs"] + (data.get("lines") or [])) + 1
  inputs = registry.Inputs(
      params=None, seeds=(), groups=frozenset(registry.group_names()),
      config=objectives.model_config_from_config(config, vocab.size, max_len=max(512, longest)),
      sos_id=vocab.sos_id, objective=objectives.from_config(config), options=registry.Options(),
      **{k: data[k] for k in ("entropy_inputs", "declaratives", "gold_trees", "dependency_lines",
                              "lines")})
  names = [q.name for q in registry.quantities()]
  names += [n for n in BUILDERS if n not in names]
  built, skipped = [], []
  for name in names:
    if name not in BUILDERS:
      skipped.append((name, "no program builder in sg_jax/accelerators/analysis_programs.py"))
      continue
    build, needs = BUILDERS[name]
    if needs is not None and not getattr(inputs, needs):
      skipped.append((name, f"the task gives no {needs.replace('_', ' ')}"))
      continue
    built.append(build(inputs))
  return built, skipped

