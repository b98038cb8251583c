"""Steps per compiled call, sized so that a call ends within `train.max_call_seconds`: the loop
acts on a stop signal only between compiled calls (`stop_signal.StopSignal`).
"""

from __future__ import annotations

import logging

log = logging.getLogger("sg_jax")

# A size grows only to one whose call is expected to take at most max_seconds / GROW_MARGIN: a
# speed just under the limit (e.g. 0.099 s per step at 100 steps and 10 s) would otherwise grow
# back to the size it had just shrunk from, and flip between two sizes.
GROW_MARGIN = 1.25


class CallSizer:
  """Steps per compiled call, so that one call takes at most `max_seconds`.

  The size is the largest divisor of `steps_per_call` whose call is expected to fit (divisors
  keep calls aligned with intervals that are multiples of `steps_per_call`, so few sizes get
  compiled). The first guess comes from `guess_seconds_per_step`; after that from the measured
  duration of calls of a size already compiled (a size's first call includes its compilation):
  a call measured over `max_seconds` (e.g. under load from other processes) shrinks the size,
  and it grows only when at least twice as many steps fit with a margin (`GROW_MARGIN`). A new size takes effect at a step
  that is a multiple of it. Results do not depend on the call
  sizes (every step is a pure function of the seed and the step number; tested bit for bit).

  Args:
    steps_per_call: the most steps per call (train.steps_per_call).
    max_seconds: the longest wanted call (train.max_call_seconds); 0 = always steps_per_call.
    guess_seconds_per_step: estimate before any call has been measured.
  """

  def __init__(self, steps_per_call: int, max_seconds: float, guess_seconds_per_step: float):
    self.max_steps = int(steps_per_call)
    self.max_seconds = float(max_seconds)
    self.sizes = [d for d in range(1, self.max_steps + 1) if self.max_steps % d == 0]
    self.compiled: set[int] = set()
    self.current = self._fit(guess_seconds_per_step) if self.max_seconds > 0 else self.max_steps
    self.wanted = self.current
    self._guess = float(guess_seconds_per_step)

  def log_first_size(self) -> None:
    """Logs the first call size when the time limit made it smaller than steps_per_call."""
    if self.current != self.max_steps:
      log.info("steps per compiled call: %d at first (about %.2f s per step estimated; "
               "train.max_call_seconds %g)", self.current, self._guess, self.max_seconds)

  def _fit(self, seconds_per_step: float) -> int:
    fits = [d for d in self.sizes if d * seconds_per_step <= self.max_seconds]
    return max(fits) if fits else 1

  def size_at(self, step: int) -> int:
    """Steps of the call that starts at `step` (before the log/eval/checkpoint cut)."""
    if self.wanted != self.current and step % self.wanted == 0:
      self.current = self.wanted
    return self.current

  def observe(self, num_steps: int, seconds: float) -> None:
    """Records that a call of `num_steps` steps took `seconds` (dispatch to result)."""
    first = num_steps not in self.compiled
    self.compiled.add(num_steps)
    if self.max_seconds <= 0 or first:
      return
    per_step = seconds / num_steps
    # Shrink as soon as the current size is measured over the limit (a call cut short at a
    # log/eval/checkpoint step counts at its speed per step); grow only by 2x or more and with
    # the margin, so that timing noise does not compile sizes back and forth.
    if self.current * per_step > self.max_seconds:
      fit = self._fit(per_step)
    else:
      fit = self._fit(per_step * GROW_MARGIN)
      fit = fit if fit >= 2 * self.current else self.wanted
    if fit != self.wanted:
      log.info("steps per compiled call: %d -> %d (%.3f s per step measured; "
               "train.max_call_seconds %g)", self.current, fit, per_step, self.max_seconds)
      self.wanted = fit
