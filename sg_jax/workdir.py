"""The workdir guard: config checks on resume, writability, stop signals and call sizes.

A run refuses, in one line and before touching anything, to resume a workdir written with a
config it may not continue (`check_workdir_config`, classified by `classify_config_change`) or
to start in a workdir it cannot write (`check_writable`). SIGTERM/SIGINT are handled from the
first second of a run (`StopSignal`); since the loop acts on a signal only between compiled
calls, calls are sized to take at most `train.max_call_seconds` (`CallSizer`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time

import ml_collections

from sg_jax import checkpointing
from sg_jax import configlib
from sg_jax import fileio

log = logging.getLogger("sg_jax")
EXIT_PREEMPTED = 75  # exit code after a SIGTERM/SIGINT-triggered checkpoint (EX_TEMPFAIL)

# Config fields (dotted prefixes) that may differ between a run and its resumption without
# --allow_config_change: they never change the trained parameters. train.num_steps is one of them
# unless the learning-rate schedule ends at it (optim.decay_steps = 0).
RESUMABLE_CHANGES = ("num_devices", "train.num_steps", "train.steps_per_call",
                     "train.max_call_seconds", "train.log_every", "eval.", "checkpoint.every",
                     "checkpoint.max_to_keep")
# Fields --allow_config_change may change: they change the training from the resumed step on but
# neither a parameter shape nor what a step is (its data, batch, seeds, model, optimiser state).
CHANGEABLE_WITH_FLAG = ("train.num_steps", "optim.learning_rate", "optim.schedule",
                        "optim.warmup_steps", "optim.decay_steps", "optim.cooldown_steps",
                        "train.packing", "train.packing_buckets",
                        # same parameters and computation, other float rounding (docs/model.md)
                        "model.layer_impl", "model.matmul_precision")


def config_change_help() -> str:
  """The `--allow_config_change` flag's help, built from RESUMABLE_CHANGES and
  CHANGEABLE_WITH_FLAG so that the text and the resume rules cannot disagree."""
  flag = ", ".join(CHANGEABLE_WITH_FLAG)
  free = ", ".join(f"{p}*" if p.endswith(".") else p for p in RESUMABLE_CHANGES)
  return ("Resume a workdir whose config differs in fields that change the training from the "
          "resumed step on (or only its float rounding) but neither a parameter shape nor what a "
          f"step is: {flag} (train.num_steps needs this flag only when optim.decay_steps is 0, "
          "i.e. the schedule ends at it). These may change without the flag: "
          f"{free}. Every other field (the model's shape, task, data, seeds, objective, loss "
          "terms, train.batch_size, the other optim fields) can never change on resume (refused "
          "even with this flag): use another --workdir.")


class Preempted(Exception):
  """Raised when a SIGTERM/SIGINT stopped the run; `main` exits with EXIT_PREEMPTED.

  Attributes:
    step: the step of the latest checkpoint (a resumed run continues from it; None if the run
      stopped before its first checkpoint).
  """

  def __init__(self, message: str, step: int | None = None):
    super().__init__(message)
    self.step = step


def classify_config_change(name: str, old: dict, new: dict) -> str:
  """How resuming may treat a change of config field `name` (dotted) from `old` to `new`.

  Returns:
    'free' (never changes the trained parameters: RESUMABLE_CHANGES), 'flag' (needs
    --allow_config_change: CHANGEABLE_WITH_FLAG) or 'never' (changes parameter shapes or what a
    step is: model, task, data, seeds, batch size, the optimiser's other fields).
  """
  schedule_ends_at_num_steps = any(
      c.get("optim", {}).get("decay_steps", 1) == 0 for c in (old, new))
  if name == "train.num_steps" and schedule_ends_at_num_steps:
    return "flag"
  if name.startswith(RESUMABLE_CHANGES):
    return "free"
  if name.startswith(CHANGEABLE_WITH_FLAG):
    return "flag"
  return "never"


def with_new_fields(old: dict, defaults: dict) -> dict:
  """`old` (a stored config) with the fields it lacks taken from `defaults` (the task's
  `configlib.base_config`), recursively.

  A field added to sg_jax after a run was written defaults to what runs did before it existed
  (e.g. `model.layer_impl`, `config.sas`, the data composition), so a run from before the field
  resumes unchanged, and only a new value that differs from that default counts as a change.
  """
  out = dict(old)
  for key, value in defaults.items():
    if key not in out:
      out[key] = value
    elif isinstance(value, dict) and isinstance(out[key], dict):
      out[key] = with_new_fields(out[key], value)
  return out


def _stored_config(workdir: str) -> dict | None:
  """The config a workdir was written with: config.json, else the newest checkpoint's."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        return json.load(f)
    except ValueError as e:  # undecodable or not JSON: one line naming the file
      raise ValueError(f"{path} is not readable JSON ({e}); restore it (every checkpoint's "
                       "metadata holds the run's config) or use another --workdir") from None
  steps = checkpointing.all_steps(workdir)
  if not steps:
    return None
  manager = checkpointing.make_manager(workdir, create=False, asynchronous=False)
  try:
    return checkpointing.read_meta(manager, steps[-1])["config"]
  except Exception:  # pylint: disable=broad-except  (unreadable: restore_latest_good decides)
    return None
  finally:
    manager.close()


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict,
                         allow_config_change: bool) -> None:
  """Refuses to resume a workdir written with a different config, in one line naming the fields.

  Fields are classified by `classify_config_change`: 'free' ones may differ; 'flag' ones only
  with `allow_config_change`; 'never' ones are refused even then. Nothing in the workdir is
  touched.

  Raises:
    ValueError: naming the differing fields and what to do.
  """
  old = _stored_config(workdir)
  if old is None:
    return
  new = json.loads(config.to_json())
  old = with_new_fields(old, json.loads(configlib.base_config(config.task).to_json()))
  diffs = configlib.differences(old, new)
  kinds = {name: classify_config_change(name, old, new) for name, _, _ in diffs}
  fmt = lambda wanted: ", ".join(f"{name} {a!r} -> {b!r}" for name, a, b in diffs
                                 if kinds[name] == wanted)
  if "never" in kinds.values():
    raise ValueError(
        f"workdir {workdir} was written with another config: {fmt('never')} (these change "
        f"parameter shapes or what a step is; --allow_config_change cannot change them); use "
        f"another --workdir")
  if "flag" in kinds.values() and not allow_config_change:
    # e.g. a workdir of the padded layout, the default before packing: train.packing=False.
    keep = " ".join(f"--config.{name}={a}" for name, a, _ in diffs if kinds[name] == "flag")
    raise ValueError(
        f"workdir {workdir} was written with another config: {fmt('flag')}; pass "
        f"--allow_config_change to resume with the new values, {keep} to keep the workdir's, "
        f"or use another --workdir")
  if "flag" in kinds.values():
    log.warning("resuming %s with changed config fields (--allow_config_change): %s", workdir,
                fmt("flag"))


def check_writable(workdir: str) -> list[str]:
  """Creates `workdir` and checks a file can be written there.

  Returns:
    The directories this call created (`workdir` and its missing parents, deepest first; empty
    if `workdir` existed), for `remove_created`.

  Raises:
    checkpointing.WorkdirError: naming the workdir and the OS error.
  """
  created = []
  parent = os.path.abspath(workdir)
  while not os.path.exists(parent):
    created.append(parent)
    parent = os.path.dirname(parent)
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_probe.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise checkpointing.WorkdirError(f"workdir {workdir} is not writable: {e}") from e
  return created


def remove_created(created: list[str]) -> None:
  """Removes the directories `check_writable` created, with what this run wrote into them (e.g.
  data generated into WORKDIR/data), after a run failed before writing any state of its own.
  A workdir that existed before the run is never touched (`created` is then empty)."""
  if created:
    shutil.rmtree(created[0], ignore_errors=True)
  for parent in created[1:]:
    try:
      os.rmdir(parent)  # only if still empty
    except OSError:
      break


# config.json and vocab.json: a reader sees the old file or the whole new one.
write_json_atomic = fileio.write_atomic


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


class CallSizer:
  """Steps per compiled call, so that one call takes at most `max_seconds`.

  The size is the largest divisor of `steps_per_call` whose call is expected to fit (divisors
  keep calls aligned with intervals that are multiples of `steps_per_call`, so few sizes get
  compiled). The first guess comes from `guess_seconds_per_step`; after that from the measured
  duration of calls of a size already compiled (a size's first call includes its compilation):
  a call measured over `max_seconds` (e.g. under load from other processes) shrinks the size,
  and it grows only when at least twice as many steps fit. A new size takes effect at a step
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
    fit = self._fit(per_step)
    # Shrink as soon as the current size is measured over the limit (a call cut short at a
    # log/eval/checkpoint step counts at its speed per step); grow only by 2x or more, so that
    # timing noise does not compile sizes back and forth.
    if ((self.current * per_step > self.max_seconds or fit >= 2 * self.current)
        and fit != self.wanted):
      log.info("steps per compiled call: %d -> %d (%.3f s per step measured; "
               "train.max_call_seconds %g)", self.current, fit, per_step, self.max_seconds)
      self.wanted = fit


# Rough training speed per device before anything is measured (FLOP/s of 6 x parameters x
