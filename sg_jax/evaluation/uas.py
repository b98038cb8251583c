"""The `uas` evaluator: the unlabelled attachment score of the model's attention heads on
in-domain lines at every evaluation (Chen et al., ICLR 2024; docs/sas.md).

Logged: `in_domain/uas`, `in_domain/uas_weight` (the best head) and the positional baselines
`in_domain/uas_prev_token`, `uas_next_token`, `uas_best_offset`
(`analysis.uas_eval.make_uas_eval`).
Options (`evals.uas`): `lines`, the first in-domain lines scored (0 disables; formerly
`eval.uas_lines`, which still sets it). A task without gold dependencies (Dyck) logs none.
"""

from __future__ import annotations

import dataclasses

from sg_jax.evaluation import registry


@registry.register
@dataclasses.dataclass(frozen=True)
class AttentionUAS(registry.Evaluator):
  """UAS of attention (`analysis.uas`); `lines`: in-domain lines scored (0 = off)."""

  name = "uas"
  legacy_fields = {"lines": "uas_lines"}

  lines: int = 256

  def check(self) -> None:
    if self.lines < 0:
      raise ValueError(f"lines must be >= 0 (0 disables), got {self.lines}")

  def build(self, context: registry.Context) -> registry.Evaluation | None:
    # pylint: disable-next=import-outside-toplevel  (task_metric.py)
    from sg_jax.analysis import uas_eval
    batches = uas_eval.eval_batches(self.lines, context.options.batch_size, context.task,
                                    context.vocab, context.data_dir)
    if not batches:
      return None
    batches = context.put(batches)
    scores = uas_eval.make_uas_eval(context.model, context.vocab, batches)

    def programs():
      fn, args, static, calls = uas_eval.eval_program(context.model, context.vocab, batches)
      return (registry.Program(f"in_domain ({batches['inputs'].shape[1]} lines/batch)", fn,
                               args, static, calls),)

    return registry.Evaluation(evaluate=lambda params, progress: {"in_domain": scores(params)},
                               programs=programs)
