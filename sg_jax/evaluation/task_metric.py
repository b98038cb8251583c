"""The `task` evaluator: the objective's loss and the task's own metric on each held-out split.

Logged per split (`in_domain/...`, `out_of_domain/...`): `loss` (the objective's loss,
`evaluation.objective_line_losses`), the task's metric (`accuracy` and its further sums, per
construction tag `accuracy/<tag>`: `tasks.base.Task.make_metrics`; greedy decoding for a task
that decodes) where the objective is teacher-forced, else the objective's own metrics (a masked
LM's `masked_accuracy`). Options: the shared `eval.batch_size`, `eval.max_lines` and
`eval.kv_cache` (`registry.EvalOptions`); `evals.task.enabled`.
"""

from __future__ import annotations

import dataclasses

from sg_jax.evaluation import registry


@registry.register
@dataclasses.dataclass(frozen=True)
class TaskMetric(registry.Evaluator):
  """Loss and task metric of the held-out splits (`evaluator.task_evaluation`)."""

  name = "task"

  def build(self, context: registry.Context) -> registry.Evaluation:
    # JAX is imported when an evaluation is built, not when the evaluator is declared: config
    # files read the declared options before JAX starts (`registry`).
    from sg_jax.evaluation import (evaluator)  # pylint: disable=import-outside-toplevel  (module docstring)
    from sg_jax.data import input_pipeline  # pylint: disable=import-outside-toplevel
    o = context.options
    data = context.put({name: input_pipeline.prepare_eval_batches(
        split, o.batch_size, o.max_lines, context.task.eval_fields)
                        for name, split in context.splits.items()})
    return evaluator.task_evaluation(context.task, context.model, context.vocab, data,
                                     kv_cache=o.kv_cache, objective=context.objective)
