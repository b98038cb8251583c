"""SIGTERM/SIGINT during a command's work: stop at once when nothing is unsaved, else after the
current compiled call with a checkpoint (`StopSignal`); `Preempted` tells the command line to
exit with `exit_codes.EXIT_PREEMPTED`.

Before a command's imports finish, `startup_signals` handles the signals instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time

from sg_jax.runtime.exit_codes import EXIT_PREEMPTED

log = logging.getLogger("sg_jax")


class Preempted(Exception):
  """Raised when a SIGTERM/SIGINT stopped the run; a command exits with
  `exit_codes.EXIT_PREEMPTED`.

  Attributes:
    step: the step of the latest checkpoint (a resumed run continues from it; None if the run
      stopped before its first checkpoint).
  """

  def __init__(self, message: str, step: int | None = None):
    super().__init__(message)
    self.step = step


class StopNow(BaseException):
  """Raised by `StopSignal`'s handler when stopping at once loses nothing a checkpoint lacks.

  A BaseException, like KeyboardInterrupt, so that the `except Exception` of data or checkpoint
  code (which treats an unreadable checkpoint as corrupt) never mistakes it for a failure.
  """

  def __init__(self, signum: int, where: str):
    super().__init__(signum, where)
    self.signum, self.where = signum, where


def quiet_stop_in_callbacks() -> None:
  """Drops a `StopNow` raised while Python ran a callback (e.g. JAX's garbage-collection
  callback) instead of the code the signal interrupted.

  Python cannot propagate an exception out of such a callback and prints it through
  `sys.unraisablehook`, with a traceback, although nothing is lost: the handler has recorded the
  signal (`StopSignal.received`), and the run stops at its next check, after checkpointing, with
  its usual one line. Other unraisable exceptions go to the previous hook. Idempotent.
  """
  previous = sys.unraisablehook
  if getattr(previous, "_sg_jax_stop", False):
    return

  def hook(unraisable):
    if isinstance(unraisable.exc_value, StopNow):
      return
    previous(unraisable)

  hook._sg_jax_stop = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


class StopSignal:
  """SIGTERM/SIGINT handling for the whole of a run, from its first second.

  While the run holds nothing a checkpoint lacks (`immediate`: start-up, i.e. data generation,
  compilation and the step-0 evaluation, and every compiled call that starts from the step just
  checkpointed), the handler stops the run at once by raising `StopNow` in the main thread.
  Otherwise it records the signal (`received`) and the loop checkpoints after the current call;
  a second signal stops at once without that checkpoint.

  The handler runs only when the main thread executes Python, not during one long native call (an
  XLA compilation, a device computation). With `exit_after` > 0 (the command line) a watchdog
  thread, woken by `signal.set_wakeup_fd`, ends the process with EXIT_PREEMPTED and one line when
  a signal that should stop the run at once has not reached the main thread within `exit_after`
  seconds; nothing is lost that a rerun does not redo, as after kill -9.
  """

  def __init__(self, exit_after: float = 0.0):
    self.exit_after = exit_after
    self.received: int | None = None
    self.immediate = True
    self.where = "during start-up (data, compilation or the step-0 evaluation)"
    self._count = 0
    self._handled = 0
    self._stopping = False
    self._old: dict = {}
    self._pipe = None
    self._old_wakeup = -1
    self._closed = False
    self._watchdog = True  # False while `interrupting`

  def __enter__(self):
    if threading.current_thread() is not threading.main_thread():
      return self  # signal handlers can only be installed from the main thread
    quiet_stop_in_callbacks()
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._old[sig] = signal.signal(sig, self._handle)
    if self.exit_after > 0:
      read_fd, write_fd = os.pipe()
      os.set_blocking(write_fd, False)
      self._pipe = (read_fd, write_fd)
      self._old_wakeup = signal.set_wakeup_fd(write_fd)
      threading.Thread(target=self._watch, args=(read_fd,), daemon=True,
                       name="sg_jax-stop-watchdog").start()
    return self

  def set_immediate(self, immediate: bool, where: str | None = None) -> None:
    """Whether a signal now stops the run at once (`where` says when, for the message)."""
    if where is not None:
      self.where = where
    self.immediate = immediate

  @contextlib.contextmanager
  def interrupting(self, where: str):
    """Within: a signal stops at once (`StopNow` in the main thread, between two compiled calls
    of a Python-driven sequence such as the evaluation), but the watchdog never ends the
    process, so that the caller can still checkpoint the training state it holds."""
    saved = self.immediate, self.where, self._watchdog
    self.immediate, self.where, self._watchdog = True, where, False
    try:
      yield
    finally:
      self.immediate, self.where, self._watchdog = saved

  def _handle(self, signum, frame):
    del frame
    self._handled += 1
    if self._stopping:
      return  # already stopping at once
    first = self.received is None
    self.received = signum
    if self.immediate or not first:
      self._stopping = True
      raise StopNow(signum, self.where if first else
                     "by a second signal, without a checkpoint of the current step")
    log.warning("received signal %d: checkpointing after the current call, then exiting",
                signum)

  def _watch(self, read_fd: int) -> None:
    stops = (signal.SIGTERM, signal.SIGINT)
    while True:
      try:
        data = os.read(read_fd, 64)
      except OSError:
        return
      if not data or self._closed:
        return
      for signum in data:
        if signum not in stops:
          continue
        self._count += 1
        if not ((self.immediate and self._watchdog) or self._count > 1):
          continue
        deadline = time.monotonic() + self.exit_after
        while time.monotonic() < deadline and not self._closed:
          time.sleep(0.05)
        if self._closed or self._handled >= self._count:
          continue  # the main thread got it and is stopping
        where = self.where if self._count == 1 else "by a second signal"
        os.write(2, f"{time.strftime('%H:%M:%S')} stopped by signal {signum} {where}; rerun "
                    f"the same command to resume\n".encode())
        os._exit(EXIT_PREEMPTED)

  def __exit__(self, *exc):
    self._closed = True
    for sig, old in self._old.items():
      signal.signal(sig, old)
    if self._pipe is not None:
      signal.set_wakeup_fd(self._old_wakeup)
      os.close(self._pipe[1])  # the watchdog reads end-of-file and returns
    return False
