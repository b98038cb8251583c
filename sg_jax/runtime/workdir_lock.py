"""One writer per workdir: a lock file that every command writing into a workdir holds.

`sg_jax.main` (process 0 of a multi-process run), `sg_jax.analyze`, `sg_jax.prune`,
`sg_jax.prune_core` and `sg_jax.report` (when it writes into a workdir) take
`WORKDIR/sg_jax.lock` before they change anything there and remove it when they end; a second
command on the same workdir is refused with one line naming the holder (`LockHeld`), and the
workdir is left as it was. (`sg_jax.sweep` runs each job's `main` and `analyze`, which take it.)

The lock file is created atomically (`O_CREAT | O_EXCL`) and holds one JSON object: host, pid,
the process's start time (`/proc/<pid>/stat`, so that a reused pid is not taken for the holder),
the command line and when it started. The holder also keeps an `fcntl.flock` on it. A lock left
by a process that no longer runs on this host (kill -9, a crash, a power cut) is taken over with
one warning; a lock of another host cannot be checked from here and is refused with the way to
clear it (remove the file once no process of that host uses the workdir).

A process may take the same lock again while it holds it (a notebook, a test calling several
commands in turn): the lock is released when the outermost holder ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time

from sg_jax.runtime.exit_codes import OneLineError

log = logging.getLogger("sg_jax")

LOCK_NAME = "sg_jax.lock"


class LockHeld(OneLineError, RuntimeError):
  """Another command holds the lock (the message names it and what to do)."""


@dataclasses.dataclass
class _Held:
  fd: int
  count: int
  inode: int


_HELD: dict[str, _Held] = {}  # realpath of the lock file -> this process's hold
_MUTEX = threading.Lock()


def lock_path(workdir: str) -> str:
  """The lock file of `workdir`."""
  return os.path.join(workdir, LOCK_NAME)


def _start_ticks(pid: int) -> int | None:
  """The start time of process `pid` in clock ticks since boot (Linux), None when unknown."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      text = f.read()
  except OSError:
    return None
  try:  # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    return int(text[text.rindex(")") + 2:].split()[19])
  except (ValueError, IndexError):
    return None


def _alive(pid: int, ticks: int | None) -> bool:
  """Whether process `pid` (started at `ticks`, when known) still runs on this host."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # it exists, owned by another user
  if ticks is None:
    return True
  now = _start_ticks(pid)
  return now is None or now == ticks


def describe(info: dict) -> str:
  """'sg_jax.main (pid 123 on host h, started 2026-12-06 21:50:01)' for a lock's contents."""
  command = info.get("command") or "a command"
  return (f"{command} (pid {info.get('pid', '?')} on host {info.get('host', '?')}, started "
          f"{info.get('started', '?')})")


def read_holder(path: str) -> dict | None:
  """The contents of the lock file `path` (None when there is none or it cannot be parsed)."""
  try:
    with open(path) as f:
      info = json.load(f)
  except (OSError, ValueError):
    return None
  return info if isinstance(info, dict) else None


def holder(workdir: str) -> dict | None:
  """The live holder of `workdir`'s lock: its contents when the holder still runs (or runs on
  another host, which cannot be checked), None when the workdir is free or the lock is stale.
  Used by readers (the report) to say that a run is in progress."""
  info = read_holder(lock_path(workdir))
  if info is None:
    return None
  if info.get("host") == socket.gethostname() and not _alive(int(info.get("pid", -1)),
                                                            info.get("start_ticks")):
    return None
  return info


def _command_line() -> str:
  argv = [os.path.basename(sys.argv[0]) if sys.argv else "python"] + sys.argv[1:]
  if argv and argv[0] == "__main__.py":
    argv[0] = "python -m " + (sys.modules["__main__"].__spec__.name.rsplit(".", 1)[0]
                              if getattr(sys.modules["__main__"], "__spec__", None) else "?")
  text = " ".join(argv)
  return text if len(text) <= 300 else text[:297] + "..."


def _write_info(fd: int, command: str) -> None:
  pid = os.getpid()
  info = {"host": socket.gethostname(), "pid": pid, "start_ticks": _start_ticks(pid),
          "command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
          "argv": _command_line()}
  data = json.dumps(info).encode()
  os.ftruncate(fd, 0)
  os.pwrite(fd, data, 0)
  os.fsync(fd)


def acquire(path: str, command: str, *, wait_seconds: float = 2.0) -> None:
  """Takes the lock file `path` for `command` (e.g. 'sg_jax.analyze'); see the module docstring.

  Raises:
    LockHeld: another live process holds it (one line naming it), or a process of another host
      does (with how to clear it).
    OSError: the lock file cannot be created (e.g. a read-only workdir); nothing was written.
  """
  key = os.path.realpath(path)
  with _MUTEX:
    held = _HELD.get(key)
    if held is not None:
      held.count += 1
      return
  deadline = time.monotonic() + wait_seconds
  while True:
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      fd = None
    if fd is not None:
      try:
        _write_info(fd, command)
        fcntl.flock(fd, fcntl.LOCK_EX)  # only a checker of a stale lock holds it, briefly
      except BaseException:
        os.close(fd)
        _unlink_quietly(path)
        raise
      _hold(key, fd)
      return
    taken = _take_over_if_stale(path, command)
    if taken is not None:
      _hold(key, taken)
      return
    if time.monotonic() > deadline:  # an empty lock file: its writer died while creating it
      raise LockHeld(f"{path} exists but names no holder; if no sg_jax command uses "
                     f"{os.path.dirname(path) or '.'}, remove it")
    time.sleep(0.05)


def _hold(key: str, fd: int) -> None:
  with _MUTEX:
    _HELD[key] = _Held(fd=fd, count=1, inode=os.fstat(fd).st_ino)


def _unlink_quietly(path: str) -> None:
  try:
    os.unlink(path)
  except OSError:
    pass


def _take_over_if_stale(path: str, command: str) -> int | None:
  """The fd of the lock file `path` taken over from a dead holder; None to retry (it vanished
  or is being written). Raises LockHeld for a live holder or one of another host."""
  try:
    fd = os.open(path, os.O_RDWR)
  except FileNotFoundError:
    return None
  keep = False
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      locked = True
    except OSError as e:
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise
      locked = False
    try:
      still_there = os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
      still_there = False
    if not still_there:
      return None  # released meanwhile: try to create it again
    info = read_holder(path)
    if info is None:
      return None  # being written by its creator (or left empty: `acquire` gives up in time)
    workdir = os.path.dirname(path) or "."
    if info.get("host") != socket.gethostname():
      raise LockHeld(
          f"{workdir} is in use by {describe(info)}; if that process has ended (check on its "
          f"host, e.g. `ssh {info.get('host')} ps -p {info.get('pid')}`), remove {path}")
    if not locked or _alive(int(info.get("pid", -1)), info.get("start_ticks")):
      raise LockHeld(f"{workdir} is in use by {describe(info)}; wait for it to end or stop it "
                     "(it can be resumed), then rerun")
    log.warning("taking over the lock of %s from %s, which no longer runs", workdir,
                describe(info))
    _write_info(fd, command)
    keep = True
    return fd
  finally:
    if not keep:
      os.close(fd)


def release(path: str) -> None:
  """Releases this process's hold of the lock file `path` (removed by the outermost holder)."""
  key = os.path.realpath(path)
  with _MUTEX:
    held = _HELD.get(key)
    if held is None:
      return
    held.count -= 1
    if held.count > 0:
      return
    del _HELD[key]
  try:
    if os.stat(path).st_ino == held.inode:
      os.unlink(path)
  except OSError:
    pass  # removed with its workdir (a failed first run), or a read-only folder
  os.close(held.fd)


# errnos of a lock file that cannot be created because the folder is not writable by anyone here
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


@contextlib.contextmanager
def locked(workdir: str, command: str, *, enabled: bool = True, read_only_ok: bool = False):
  """Holds `workdir`'s lock for `command` within (nothing when not `enabled`, e.g. a process of
  a multi-process run other than process 0).

  `read_only_ok`: in a workdir where no lock file can be created (a read-only mount or folder)
  run without one: no command can write there either, so there is nothing to protect, and a
  command that finds its work done (e.g. `sg_jax.analyze` re-checking a finished run) succeeds;
  one that has something to write fails at its first write, naming the file.

  Raises:
    LockHeld: see `acquire`.
    OSError: the lock file cannot be written (e.g. a read-only workdir, unless `read_only_ok`).
  """
  if not enabled:
    yield
    return
  path = lock_path(workdir)
  try:
    acquire(path, command)
  except OSError as e:
    if not (read_only_ok and e.errno in _READ_ONLY):
      raise OSError(f"cannot create the lock file {path}: {e.strerror or e}") from e
    yield
    return
  try:
    yield
  finally:
    release(path)
