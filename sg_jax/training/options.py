"""The typed options of the training loop's schedule, built once at the top of the loop
(`LoopOptions.from_config`): how far to train, how long a compiled call may run, and when to
log, evaluate and checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Any

from sg_jax.evaluation import scoring
from sg_jax.evaluation.scoring import EvalSchedule


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """When the loop trains, logs, evaluates and checkpoints (steps, unless said otherwise).

  Attributes:
    num_steps: the run's last step (`train.num_steps`).
    steps_per_call: the most steps of one compiled call (`train.steps_per_call`).
    max_call_seconds: a call is sized to end within this many seconds so that a stop signal
      is acted on in time (`train.max_call_seconds`; 0 = no bound; `runtime.call_sizer`).
    log_every: training metrics are logged every this many steps (`train.log_every`).
    checkpoint_every: a checkpoint every this many steps (`checkpoint.every`).
    schedule: when the run evaluates (`evaluation.scoring.EvalSchedule`: `eval.every`,
      `eval.dense_until`, `eval.dense_every`).
    batch_size, packing: the training batch (lines per seed and step; packed rows or padded),
      for the first call's size before any call is timed.
  """

  num_steps: int
  steps_per_call: int
  max_call_seconds: float
  log_every: int
  checkpoint_every: int
  schedule: EvalSchedule
  batch_size: int
  packing: bool

  @classmethod
  def from_config(cls, config: Any) -> "LoopOptions":
    """The loop options of a run config (its `train`, `eval` and `checkpoint` sections)."""
    t = config.train
    return cls(num_steps=int(t.num_steps), steps_per_call=int(t.steps_per_call),
               max_call_seconds=float(t.get("max_call_seconds", 0.0)),
               log_every=int(t.log_every), checkpoint_every=int(config.checkpoint.every),
               schedule=EvalSchedule.from_config(config), batch_size=int(t.batch_size),
               packing=bool(t.packing))

  def is_log_step(self, step: int) -> bool:
    """Training metrics are logged every `log_every` steps, at the last step, and at every
    evaluation step (so a dense evaluation schedule, `eval.dense_until`, densifies the loss
    curve too: an onset located on `train/loss` needs its points, `analysis.onsets`)."""
    return (step % self.log_every == 0 or step == self.num_steps
            or scoring.is_eval_step(step, self.schedule))

  def is_eval_step(self, step: int) -> bool:
    """The loop evaluates after `step`: an evaluation step of the schedule, or the last step."""
    return scoring.is_eval_step(step, self.schedule) or step == self.num_steps

  def next_boundary(self, step: int, steps: int | None = None) -> int:
    """End of the next compiled call: at most `steps` (default `steps_per_call`) steps, and
    never past a log, evaluation or checkpoint step."""
    end = min(step + (steps or self.steps_per_call), self.num_steps)
    for every in (self.log_every, self.schedule.every, self.checkpoint_every):
      end = min(end, (step // every + 1) * every)
    return min(end, scoring.next_eval_step(step, self.schedule))
