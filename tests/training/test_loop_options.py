"""`training.options.LoopOptions`: the loop's schedule from a run config, and where compiled
calls end (hand-worked cases)."""

from sg_jax import configlib
from sg_jax.evaluation.scoring import EvalSchedule
from sg_jax.training.options import LoopOptions


def _options(**changes):
  base = dict(num_steps=100, steps_per_call=30, max_call_seconds=0.0, log_every=25,
              checkpoint_every=40, schedule=EvalSchedule(every=50), batch_size=8, packing=True)
  return LoopOptions(**(base | changes))


def test_from_config_reads_the_train_eval_and_checkpoint_sections():
  config = configlib.apply_config_string(configlib.base_config("question"), "tiny",
                                         configlib.PRESETS)
  config.eval.dense_until, config.eval.dense_every = 10, 5
  options = LoopOptions.from_config(config)
  assert options == LoopOptions(num_steps=40, steps_per_call=10,
                                max_call_seconds=float(config.train.max_call_seconds),
                                log_every=10, checkpoint_every=20,
                                schedule=EvalSchedule(every=20, dense_until=10, dense_every=5),
                                batch_size=int(config.train.batch_size),
                                packing=bool(config.train.packing))


def test_calls_end_at_the_next_log_eval_or_checkpoint_step():
  options = _options()
  # From 0: steps_per_call 30, but the log step 25 comes first.
  ends, step = [], 0
  while step < options.num_steps:
    step = options.next_boundary(step)
    ends.append(step)
  # logs 25, 50, 75, 100; checkpoints 40, 80; evaluations 50, 100.
  assert ends == [25, 40, 50, 75, 80, 100]
  assert options.next_boundary(0, steps=10) == 10  # a smaller call size (the call sizer's)
  dense = _options(schedule=EvalSchedule(every=50, dense_until=20, dense_every=7))
  # 7 and 14 are dense evaluations; 21 is past dense_until, so from 14 the log step 25 ends it.
  assert dense.next_boundary(0) == 7 and dense.next_boundary(14) == 25
  assert [s for s in range(1, 101) if dense.is_eval_step(s)] == [7, 14, 50, 100]
  assert [s for s in range(1, 101) if dense.is_log_step(s)] == [7, 14, 25, 50, 75, 100]
