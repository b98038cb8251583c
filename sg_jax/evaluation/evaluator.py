"""The run's evaluator: every enabled training-time evaluation, seed-vmapped, compiled once.

`run_evaluations` runs the evaluations the registered evaluators built (`sg_jax.evaluation`: the
task's metric, UAS, the minimal-pair preference, ...; it names none of them) under one progress
log (`evaluation.ProgressLog`) and merges their `{split: {metric: [S]}}`. `task_evaluation` is
the `task` evaluator's: per split, one jitted, seed-vmapped call per batch (the per-seed
evaluation of `evaluation.make_split_evaluator`: the objective's loss and the task's metric),
the batches driven from Python so that a long evaluation logs its progress; `make_eval_fn` runs
it alone.
The jitted functions are cached on what shapes them (the model, the task and its options, the
vocabulary, the decoding steps, the key/value cache, the construction tags), as
`step.make_train_fns` caches the training functions: a second run in the same process (tests,
sweeps, notebooks) reuses them instead of compiling again.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.evaluation import decoding
from sg_jax.evaluation import scoring as evaluation
from sg_jax.evaluation.registry import Evaluation, Program
from sg_jax.models.transformer import TransformerLM

# (model, task key, vocab, decode steps, kv cache, constructions) -> (one_batch, summarize).
_SPLIT_FNS_CACHE: dict = {}
# (split functions' key, batch shapes, seeds) of every split evaluated so far in this process.
_COMPILED: set = set()


def present_constructions(task, batches: dict) -> dict[str, int]:
  """{tag: index} of the task's constructions that occur on the valid lines of `batches`."""
  if "construction" not in batches:
    return {}
  ids = np.asarray(batches["construction"])[np.asarray(batches["valid"])]
  return {name: k for k, name in enumerate(task.constructions) if np.any(ids == k)}


def task_key(task):
  """What identifies a task's metric in the cache: its class and its public attributes (the
  task's options, `base.Task`); the task object itself when an option is unhashable."""
  options = tuple(sorted((k, v) for k, v in vars(task).items() if not k.startswith("_")))
  key = (type(task), options)
  try:
    hash(key)
  except TypeError:
    return task
  return key


def _shapes(batches: dict) -> tuple:
  """(field, shape, dtype) of every array of a split's batches."""
  return tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(batches.items()))


def split_fns(task, model: TransformerLM, vocab, batches: dict, kv_cache: bool = True,
              objective=None) -> tuple[tuple, Callable, Callable]:
  """(cache key, `one_batch`, `summarize`) of one split, from the cache when built before.

  `one_batch(params [S, ...], batches, i) -> {sum: [S]}` evaluates batch `i` of `batches`
  ([num_batches, batch, ...] arrays, `input_pipeline.prepare_eval_batches`) for every seed;
  `summarize(list of those) -> {metric: [S]}` (`evaluation.SplitEvaluator`). Both are jitted
  and take the data as arguments, so they serve any split of the same task and model.
  """
  task_metrics = objective is None or objective.teacher_forced_metrics
  decode_steps = evaluation.decode_steps(task, batches) if task_metrics else 0
  # The key/value cache decodes causally: a prefix LM decodes with full forward passes.
  use_cache = bool(task.decodes and kv_cache and model.config.attention == "causal")
  constructions = present_constructions(task, batches) if task_metrics else {}
  key = (model, task_key(task), vocab, decode_steps, use_cache,
         tuple(sorted(constructions.items())), objective)
  if key not in _SPLIT_FNS_CACHE:
    apply_fn = lambda p, t: model.apply({"params": p}, t, deterministic=True)
    kv_cache_fns = None
    if use_cache:
      kv_cache_fns = (lambda p, t, pos, c: decoding.apply_cached(model, p, t, pos, c),
                      lambda p, b, n: decoding.init_cache(model, p, b, n))
    split = evaluation.make_split_evaluator(task, apply_fn, vocab, decode_steps=decode_steps,
                                            kv_cache_fns=kv_cache_fns,
                                            constructions=constructions, objective=objective)
    one_batch = lambda p, data, i: split.batch_sums(p, jax.tree_util.tree_map(lambda x: x[i],
                                                                              data))
    stack = lambda sums: jax.tree_util.tree_map(lambda *x: jnp.stack(x, axis=1), *sums)
    summarize = lambda sums: jax.vmap(split.summarize)(stack(sums))
    _SPLIT_FNS_CACHE[key] = (jax.jit(jax.vmap(one_batch, in_axes=(0, None, None))),
                             jax.jit(summarize))
  return (key,) + _SPLIT_FNS_CACHE[key]


def task_evaluation(task, model: TransformerLM, vocab, eval_data: dict, *, kv_cache: bool = True,
                    batch_callback: Callable[[str, int, int], None] | None = None,
                    objective=None) -> Evaluation:
  """The evaluation of the held-out splits by the objective's loss and the task's metric
  (`evals.Evaluation`; the `task` evaluator's).

  Its `evaluate(params [S, ...], progress) -> {split: {'loss': [S], 'accuracy': [S], ...}}` runs,
  per split of `eval_data`, one jitted, seed-vmapped call per batch ([num_batches, batch, ...]
  arrays, `input_pipeline.prepare_eval_batches`), reporting each batch's lines to `progress`.
  The jitted functions are cached (`split_fns`).

  Args:
    task: the run's `tasks.Task` (`tasks.from_config(config)`): its `make_metrics` is the metric.
    model: the model (`step.TrainFns.model`; `apply(tokens) -> logits`).
    vocab: the task's vocabulary.
    eval_data: {split: batches}.
    kv_cache: a task that decodes (tense) decodes with the key/value cache (`config.eval.kv_cache`;
      False: one full forward pass per decoded token, the same tokens).
    batch_callback: optional `(split, batch index, real lines)`, called once a batch is done
      (the benchmarks time batches with it).
    objective: the run's `objectives.Objective` (None: `lm`): the loss is its loss, and a masked
      LM gets `masked_accuracy` instead of the task's teacher-forced metric
      (`evaluation.make_split_evaluator`).
  """
  per_split = {}
  for name, batches in eval_data.items():
    key, one_batch, summarize = split_fns(task, model, vocab, batches, kv_cache, objective)
    per_split[name] = (one_batch, summarize, np.asarray(batches["valid"]).sum(axis=1),
                       (key, _shapes(batches)))

  def describe(num_seeds: int, first: bool) -> str:
    compiled = all(v[3] + (num_seeds,) in _COMPILED for v in per_split.values())
    splits = " and ".join(f"{name} ({int(v[2].sum())} lines)" for name, v in per_split.items())
    batch = next(iter(eval_data.values()))["inputs"].shape[1]
    return (f"{splits} x {num_seeds} seeds, {batch} lines per batch"
            + ("; compiling first (the first batch of each split includes its compilation)"
               if first and not compiled else ""))

  def evaluate(params, progress: evaluation.ProgressLog) -> dict:
    num_seeds = jax.tree_util.tree_leaves(params)[0].shape[0]
    results = {}
    for name, (one_batch, summarize, lines, compiled_key) in per_split.items():
      sums = []
      for i, n in enumerate(lines):
        sums.append(jax.block_until_ready(one_batch(params, eval_data[name], np.int32(i))))
        progress.update(n, name)
        if batch_callback is not None:
          batch_callback(name, i, int(n))
      results[name] = summarize(sums)
      _COMPILED.add(compiled_key + (num_seeds,))
    return results

  def programs() -> tuple[Program, ...]:
    """One `Program` per distinct compiled function: splits of the same shapes share one."""
    shared = {}
    for name, (one_batch, _, lines, compiled_key) in per_split.items():
      shared.setdefault(compiled_key, (one_batch, name, []))[2].append((name, len(lines)))
    return tuple(Program(f"{'+'.join(n for n, _ in names)} "
                         f"({eval_data[first]['inputs'].shape[1]} lines/batch)", one_batch,
                         (eval_data[first], np.int32(0)), calls=sum(c for _, c in names))
                 for one_batch, first, names in shared.values())

  return Evaluation(evaluate=evaluate, lines=sum(int(v[2].sum()) for v in per_split.values()),
                    describe=describe, programs=programs)


def run_evaluations(evaluations: list[Evaluation]) -> Callable:
  """`params [S, ...] -> {split: {metric: [S]}}`: every evaluation in turn, their results
  merged per split (a later evaluation adds metrics to a split an earlier one reported).

  One `evaluation.ProgressLog` covers them (lines done, rate, time left, at most every 15 s);
  the first evaluation, and any after a long one, say what they evaluate before their first
  batch (each evaluation's `describe`, e.g. that it compiles first).
  """
  last_seconds = []  # durations of the evaluations so far

  def evaluate(params):
    num_seeds = jax.tree_util.tree_leaves(params)[0].shape[0]
    progress = evaluation.ProgressLog(sum(e.lines for e in evaluations), num_seeds)
    # A line before the first batch (its first batches can take minutes at the reference size
    # when it compiles) or when the last evaluation took long.
    if not last_seconds or last_seconds[-1] >= progress.first_after_s:
      what = [e.describe(num_seeds, not last_seconds) for e in evaluations
              if e.describe is not None]
      if what:
        progress.open("; ".join(what))
    results = {}
    for e in evaluations:
      for split, values in e.evaluate(params, progress).items():
        results[split] = {**results.get(split, {}), **values}
    progress.close()
    last_seconds.append(progress.clock() - progress.start)
    return results

  return evaluate


def make_eval_fn(task, model: TransformerLM, vocab, eval_data: dict, *, kv_cache: bool = True,
                 batch_callback: Callable[[str, int, int], None] | None = None,
                 objective=None) -> Callable:
  """`params [S, ...] -> {split: {'loss': [S], 'accuracy': [S], ...}}`, seed-vmapped: the
  `task_evaluation` alone (arguments as there), with its progress log (`run_evaluations`)."""
  return run_evaluations([task_evaluation(task, model, vocab, eval_data, kv_cache=kv_cache,
                                          batch_callback=batch_callback, objective=objective)])
