"""The `preference` evaluator: the minimal-pair preference of each held-out split at every
evaluation (`sg_jax.evaluation.minimal_pairs`; docs/objectives.md): does the model score a line's correct
output above the outputs of non-hierarchical rules (its foils)?

Logged per split: `preference`, `preference_vs_<kind>`, `preference/<tag>`. The sentences are
scored by the objective (`Objective.sentence_scores`: log P(output | input), or a masked LM's
pseudo-log-likelihood). Options (`evals.preference`): `lines`, the first transformed lines of
each split (0 disables; formerly `eval.preference_lines`, which still sets it). A task without
foils (Dyck) logs none.
"""

from __future__ import annotations

import dataclasses

from sg_jax.evaluation import registry


@registry.register
@dataclasses.dataclass(frozen=True)
class MinimalPairPreference(registry.Evaluator):
  """Minimal-pair preference (`sg_jax.evaluation.minimal_pairs`); `lines`: lines per split (0 = off)."""

  name = "preference"
  legacy_fields = {"lines": "preference_lines"}

  lines: int = 256

  def check(self) -> None:
    if self.lines < 0:
      raise ValueError(f"lines must be >= 0 (0 disables), got {self.lines}")

  def build(self, context: registry.Context) -> registry.Evaluation | None:
    from sg_jax.evaluation import (minimal_pairs)  # pylint: disable=import-outside-toplevel  (task_metric.py)
    batches = minimal_pairs.eval_batches(self.lines, context.options.batch_size, context.task,
                                      context.vocab, context.data_dir)
    if not batches:
      return None
    batches = context.put(batches)
    score = minimal_pairs.make_preference_eval(context.model, context.objective, context.task,
                                            batches)

    def evaluate(params, progress):
      progress.note("scoring the minimal pairs of both splits (sg_jax/evaluation/minimal_pairs.py)")
      return score(params)

    def programs():  # splits of the same function and shapes share one program
      shared = {}
      for split, fn, args, calls in minimal_pairs.eval_programs(
          context.model, context.objective, context.task, batches):
        key = (fn, tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(args[0].items())))
        shared.setdefault(key, (fn, args, []))[2].append((split, calls))
      return tuple(registry.Program(f"{'+'.join(s for s, _ in splits)} "
                                    f"({args[0]['inputs'].shape[0]} pairs/batch)", fn, args,
                                    calls=sum(c for _, c in splits))
                   for fn, args, splits in shared.values())

    return registry.Evaluation(evaluate=evaluate, programs=programs)
