"""`--profile_steps=A:B` of `sg_jax.main`: a JAX profiler trace of training steps A to B.

The trace (`jax.profiler.start_trace` / `stop_trace`: host and device activity, XLA ops) goes to
WORKDIR/profile/plugins/profile/<time>/, which TensorBoard's profile plugin reads
(`pip install tensorboard-plugin-profile`, then `tensorboard --logdir WORKDIR/profile`), as does
Perfetto (WORKDIR/profile/.../*.trace.json.gz).

How: `StepProfiler` is a context manager around a training run; while it is open, the training
loop asks `call_end(step, end)` before each compiled call (from `step` to `end`). The call is cut
at A and at B, so that the trace holds the calls of steps A..B exactly; the trace starts before
the first call at or after A and stops before the first call at or after B (or when the
profiler closes: the run ended or stopped). A run resumed after A starts tracing at its resume
step. A call cut short has another size than the others and is compiled on first use, inside the
trace: A and B on multiples of `train.steps_per_call` (and of the log/eval/checkpoint
intervals) trace calls of the usual size. Only one trace can run in a process (JAX's rule), so
one `StepProfiler` is active at a time.
"""

from __future__ import annotations

import logging
import os
import re

import jax

log = logging.getLogger("sg_jax")

_active: "StepProfiler | None" = None


def parse_steps(text: str) -> tuple[int, int]:
  """'A:B' -> (A, B), 0 <= A < B (training steps: the trace covers steps A+1..B, the calls
  that start at A and end at B).

  Raises:
    ValueError: not two integers A < B separated by ':' (one line).
  """
  m = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-9]+)\s*", text)
  if not m or int(m.group(1)) >= int(m.group(2)):
    raise ValueError(f"--profile_steps must be A:B with integers 0 <= A < B (e.g. 100:200), "
                     f"not {text!r}")
  return int(m.group(1)), int(m.group(2))


class StepProfiler:
  """Traces training steps A..B of the run inside the `with` block (module docstring).

  Args:
    steps: 'A:B' (`parse_steps`); '' = no profiling (the context manager does nothing).
    workdir: the run directory; the trace goes to `<workdir>/profile`.

  Raises:
    ValueError: a malformed `steps`.
  """

  def __init__(self, steps: str, workdir: str):
    self.window = parse_steps(steps) if steps else None
    self.log_dir = os.path.join(workdir, "profile")
    self.tracing = False
    self.traced = None  # (first, last) step traced, once a trace was written

  def __enter__(self) -> "StepProfiler":
    global _active
    if self.window is not None:
      if _active is not None:
        raise RuntimeError("a StepProfiler is already active in this process")
      _active = self
    return self

  def __exit__(self, *exc) -> None:
    global _active
    if _active is self:
      _active = None
      if self.tracing:
        self._stop(None)

  def call_end(self, step: int, end: int) -> int:
    """Before a compiled call from `step` to `end`: starts or stops the trace, and returns the
    call's end cut at A or B."""
    if self.window is None:
      return end
    first, last = self.window
    if self.tracing and step >= last:
      self._stop(step)
    if not self.tracing and self.traced is None and first <= step < last:
      os.makedirs(self.log_dir, exist_ok=True)
      jax.profiler.start_trace(self.log_dir)
      self.tracing, self.traced = True, (step, None)
      log.info("profiling steps %d to %d into %s", step, last, self.log_dir)
    for cut in (first, last):
      if step < cut < end:
        return cut
    return end

  def _stop(self, step: int | None) -> None:
    jax.profiler.stop_trace()
    self.tracing = False
    self.traced = (self.traced[0], step)
    until = f"step {step}" if step is not None else "the end of the run"
    log.info("profiler trace of steps %d to %s written to %s (tensorboard --logdir %s, with "
             "tensorboard-plugin-profile)", self.traced[0], until, self.log_dir, self.log_dir)


def call_end(step: int, end: int) -> int:
  """The training loop's hook: `StepProfiler.call_end` of the active profiler, else `end`."""
  return end if _active is None else _active.call_end(step, end)
