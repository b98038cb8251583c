"""One writer per workdir (`sg_jax.runtime.workdir_lock`): the lock's logic, in-process, against holders
built by hand (a live process of this host, a dead one, a reused pid, another host). The
commands' refusals (two `main`, two `analyze`, `analyze` while `main` trains, kill -9) are in
tests/runtime/test_reliability.py."""

import errno
import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from sg_jax.runtime import workdir_lock


def _write_holder(workdir, **fields):
  info = {"host": socket.gethostname(), "pid": 1, "start_ticks": None, "command": "sg_jax.main",
          "started": "2026-01-01 00:00:00", **fields}
  path = workdir_lock.lock_path(str(workdir))
  with open(path, "w") as f:
    json.dump(info, f)
  return path, info


@pytest.fixture
def sleeper():
  """A live process of this host (not this one) and its start ticks."""
  proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    yield proc.pid, workdir_lock._start_ticks(proc.pid)  # pylint: disable=protected-access
  finally:
    proc.kill()
    proc.wait()


def test_acquire_writes_the_holder_and_release_removes_it(tmp_path):
  with workdir_lock.locked(str(tmp_path), "sg_jax.analyze"):
    info = workdir_lock.read_holder(workdir_lock.lock_path(str(tmp_path)))
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert info["command"] == "sg_jax.analyze"
    assert info["start_ticks"] == workdir_lock._start_ticks(os.getpid())  # pylint: disable=protected-access
    assert workdir_lock.holder(str(tmp_path)) == info
    with workdir_lock.locked(str(tmp_path), "sg_jax.report"):  # the same process: re-entrant
      pass
    assert os.path.exists(workdir_lock.lock_path(str(tmp_path)))  # the outer hold remains
  assert os.listdir(tmp_path) == []
  assert workdir_lock.holder(str(tmp_path)) is None


def test_a_live_holder_is_refused_in_one_line_and_its_lock_kept(tmp_path, sleeper):
  pid, ticks = sleeper
  path, _ = _write_holder(tmp_path, pid=pid, start_ticks=ticks)
  before = open(path).read()
  with pytest.raises(workdir_lock.LockHeld) as caught:
    with workdir_lock.locked(str(tmp_path), "sg_jax.analyze"):
      raise AssertionError("must not run")
  message = str(caught.value)
  assert "\n" not in message
  assert f"{tmp_path} is in use by sg_jax.main (pid {pid} on host {socket.gethostname()}" in message
  assert open(path).read() == before
  assert workdir_lock.holder(str(tmp_path))["pid"] == pid


def test_a_dead_holder_is_taken_over_with_one_warning(tmp_path, caplog):
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()  # its pid is free now
  path, _ = _write_holder(tmp_path, pid=proc.pid, start_ticks=12345)
  assert workdir_lock.holder(str(tmp_path)) is None  # stale: a reader sees no run in progress
  with caplog.at_level(logging.WARNING, logger="sg_jax"):
    with workdir_lock.locked(str(tmp_path), "sg_jax.main"):
      assert workdir_lock.read_holder(path)["pid"] == os.getpid()
  warnings = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
  assert len(warnings) == 1 and f"pid {proc.pid}" in warnings[0], warnings
  assert not os.path.exists(path)


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path, sleeper):
  pid, ticks = sleeper
  if ticks is None:
    pytest.skip("no /proc/<pid>/stat on this system")
  path, _ = _write_holder(tmp_path, pid=pid, start_ticks=ticks - 1)  # another process's start
  with workdir_lock.locked(str(tmp_path), "sg_jax.prune"):
    assert workdir_lock.read_holder(path)["command"] == "sg_jax.prune"


def test_another_hosts_lock_is_refused_with_the_way_to_clear_it(tmp_path):
  path, _ = _write_holder(tmp_path, host="node-17.cluster", pid=4242)
  with pytest.raises(workdir_lock.LockHeld) as caught:
    workdir_lock.acquire(path, "sg_jax.main")
  message = str(caught.value)
  assert "pid 4242 on host node-17.cluster" in message and f"remove {path}" in message
  assert "ssh node-17.cluster ps -p 4242" in message
  assert workdir_lock.holder(str(tmp_path))["host"] == "node-17.cluster"  # cannot be checked


def test_an_empty_lock_file_is_named_once_its_wait_is_over(tmp_path):
  path = workdir_lock.lock_path(str(tmp_path))
  open(path, "w").close()
  with pytest.raises(workdir_lock.LockHeld, match="names no holder; if no sg_jax command uses"):
    workdir_lock.acquire(path, "sg_jax.main", wait_seconds=0.1)


def test_a_read_only_workdir_runs_without_a_lock_only_when_allowed(tmp_path, monkeypatch):
  def read_only(path, command, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")

  monkeypatch.setattr(workdir_lock, "acquire", read_only)
  with workdir_lock.locked(str(tmp_path), "sg_jax.analyze", read_only_ok=True):
    pass
  with pytest.raises(OSError, match=r"cannot create the lock file .*sg_jax.lock: Read-only"):
    with workdir_lock.locked(str(tmp_path), "sg_jax.main"):
      pass


def test_a_lock_held_by_another_process_of_this_host_is_refused(tmp_path):
  """A real second process holding the lock (created, flocked) refuses this one."""
  code = ("import sys, time; from sg_jax.runtime import workdir_lock; "
          f"workdir_lock.acquire({workdir_lock.lock_path(str(tmp_path))!r}, 'sg_jax.main'); "
          "print('held', flush=True); time.sleep(60)")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=root))
  try:
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(workdir_lock.LockHeld, match=f"pid {proc.pid} "):
      workdir_lock.acquire(workdir_lock.lock_path(str(tmp_path)), "sg_jax.analyze")
  finally:
    proc.kill()
    proc.wait()
  # killed (as by kill -9): the next command takes the lock over
  with workdir_lock.locked(str(tmp_path), "sg_jax.analyze"):
    assert workdir_lock.holder(str(tmp_path))["pid"] == os.getpid()


def test_a_second_sweep_on_a_root_is_refused_before_any_job(tmp_path, sleeper, monkeypatch):
  from sg_jax.sweeps import driver as sweep  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  monkeypatch.chdir(root)
  pid, ticks = sleeper
  _write_holder(tmp_path, pid=pid, start_ticks=ticks, command="sg_jax.sweep")
  with pytest.raises(workdir_lock.LockHeld, match=f"is in use by sg_jax.sweep \\(pid {pid} "):
    sweep.run_sweep("configs/question.py:tiny", [1], 1, str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == [workdir_lock.LOCK_NAME]  # no sweep.json, no logs/
