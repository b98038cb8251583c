"""tests/conftest.py's crash rerun: a test whose pytest-xdist worker dies is run once more on a
fresh worker (and passes if it passes then); a test that kills its worker every time fails."""

import os
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = textwrap.dedent("""
    import ctypes, os

    def test_crashes_once():
      flag = os.path.join(os.environ["PROBE_DIR"], "crashed_once")
      if not os.path.exists(flag):
        open(flag, "w").close()
        ctypes.string_at(0)  # reads address 0: the worker dies of SIGSEGV

    def test_always_crashes():
      ctypes.string_at(0)

    def test_passes():
      pass
""")


@pytest.mark.slow
def test_a_crashed_test_runs_once_more_and_a_second_crash_fails(tmp_path):
  (tmp_path / "test_probe.py").write_text(PROBE)
  env = dict(os.environ, PROBE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
      [TESTS, os.path.dirname(TESTS)]))
  # The suite's conftest loaded as a plugin, on a folder of its own (no other conftest).
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p",
                         "no:cacheprovider", "-n", "2", "--rootdir", str(tmp_path), "-c",
                         os.devnull, "-rfE", "test_probe.py"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  summary = proc.stdout.strip().splitlines()[-1]
  assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert summary.startswith("1 failed, 2 passed, 2 rerun"), summary
  assert "FAILED test_probe.py::test_always_crashes" in proc.stdout
  assert (tmp_path / "crashed_once").exists()
