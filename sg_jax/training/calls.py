"""The training loop's compiled calls: from a step to the run's last step, each call sized to
end within `train.max_call_seconds` and never past a log, evaluation or checkpoint step, with
the logging, evaluation, checkpoints and stop signals between calls (`run_calls`)."""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.accelerators import profiling
from sg_jax.evaluation import scoring as evaluation
from sg_jax.runtime import compile_cache
from sg_jax.runtime import sharding
from sg_jax.runtime import stop_signal
from sg_jax.runtime.call_sizer import CallSizer
from sg_jax.runtime.stop_signal import Preempted, StopSignal
from sg_jax.training.logs import Loop, log_compiled, log_eval, log_train
from sg_jax.training.options import LoopOptions
from sg_jax.training.state import TrainState


# Rough training speed per device before anything is measured (FLOP/s of 6 x parameters x
# tokens per step): only the first call's size depends on it.
_GUESSED_FLOPS_PER_SECOND = {"cpu": 2e10}
_GUESSED_ACCELERATOR_FLOPS = 1e13


def guess_seconds_per_step(num_params: int, options: LoopOptions, host_data: dict,
                           per_device: int) -> float:
  """Seconds one compiled step of `per_device` seeds of `num_params` parameters each is guessed
  to take before any call is timed (6 x parameters x tokens FLOP at a rough speed per device):
  the first call's size (`runtime.call_sizer.CallSizer`)."""
  lengths = np.asarray(host_data["lengths"])
  tokens = options.batch_size * (float(lengths.mean()) if options.packing
                                 else host_data["inputs"].shape[1])
  speed = _GUESSED_FLOPS_PER_SECOND.get(jax.default_backend(), _GUESSED_ACCELERATOR_FLOPS)
  return 6.0 * num_params * tokens * per_device / speed


def save(loop: Loop, step: int, state: TrainState) -> None:
  """Checkpoints `state` at `step` (asynchronously: `CheckpointWriter.save`)."""
  # Not stopped at once inside orbax's save: a signal now is acted on right after it.
  immediate, loop.stop.immediate = loop.stop.immediate, False
  try:
    loop.ckpt.save(step, state, loop.meta)
  finally:
    loop.stop.immediate = immediate


def run_calls(loop: Loop, fns, sizer: CallSizer, state: TrainState, train_data: dict, step: int,
              last_eval: dict, state_hook: Callable | None) -> tuple[TrainState, int, dict]:
  """Compiled calls from `step` to the last step, logging, evaluating and saving between them.

  Args:
    fns: the run's compiled functions (`step.TrainFns`: its `chunk`).
    sizer: steps per call (`runtime.call_sizer.CallSizer`).
    state_hook: test hook `(state, step) -> state` called before every call, or None.

  Returns:
    (state, final step, the last evaluation or `last_eval` when none ran).

  Raises:
    Preempted: a stop signal arrived (after the checkpoint of the step reached).
  """
  options, stop, ckpt = loop.options, loop.stop, loop.ckpt
  # Several processes stop together: each acts on `agreed_signal`, never on its own signal at
  # once, so that all of them checkpoint the same step (or they would wait for each other).
  alone = jax.process_count() == 1
  saved = step  # the state at `saved` is in a checkpoint (written or being written)
  while step < options.num_steps:
    received = agreed_signal(stop)
    if received is not None and step == saved:
      ckpt.wait()
      raise Preempted(f"signal {received}: checkpoint written at step {step}", step)
    end = options.next_boundary(step, sizer.size_at(step))
    end = profiling.call_end(step, end)  # --profile_steps: cut at A and B, trace A..B
    if state_hook is not None:
      state = state_hook(state, step)
    # A call from the step just checkpointed loses nothing when a signal stops it at once.
    stop.set_immediate(step == saved and alone, f"at step {step}")
    started = time.perf_counter()
    with compile_cache.CompileWatch() as watch:
      state = fns.chunk(state, train_data, jnp.asarray(step, jnp.int32), end - step)
      jax.block_until_ready(state)  # the signal and the saves are checked after every call
    log_compiled(watch, f"train step ({end - step} steps per call)")
    stop.set_immediate(False)
    sizer.observe(end - step, time.perf_counter() - started)
    step = end
    received = agreed_signal(stop)
    # A failed save stops the run before any metric row of a later step is written: rows are
    # written at log/eval steps only, and there the pending save is waited for (it has
    # usually long finished); between them a failure is picked up as soon as it is known.
    if any(step % every == 0 for every in (options.log_every, options.checkpoint_every)) \
        or evaluation.is_eval_step(step, options.schedule):
      ckpt.wait()
    else:
      ckpt.check()
    if options.is_log_step(step):
      state = log_train(loop, step=step, state=state)
    if options.is_eval_step(step):
      # A stop signal before or during the evaluation skips it: the step is checkpointed at
      # once, and the resumed run evaluates it first (`logs.evaluate_if_missing`).
      try:
        if received is not None:
          raise stop_signal.StopNow(received, "before the evaluation")
        last_eval = log_eval(loop, step, state, interruptible=alone)
      except stop_signal.StopNow as e:
        save(loop, step, state)
        ckpt.wait()
        raise Preempted(f"signal {e.signum}: checkpoint written at step {step} without its "
                        f"evaluation, which the resumed run does first", step) from None
    if (step % options.checkpoint_every == 0 or step == options.num_steps
        or received is not None):
      save(loop, step, state)
      saved = step
    if received is not None and step < options.num_steps:
      ckpt.wait()
      raise Preempted(f"signal {received}: checkpoint written at step {step}", step)
  return state, step, last_eval


def agreed_signal(stop: StopSignal) -> int | None:
  """The stop signal received, the same on every process: with several processes the first
  any of them has received (a collective), so that all of them stop after the same call."""
  if jax.process_count() == 1:
    return stop.received
  return sharding.max_over_processes(stop.received or 0) or None
