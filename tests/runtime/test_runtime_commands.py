"""`sg_jax.runtime.commands`: every command's known errors as one line and an exit code, and the
exit constants defined once."""

import ast
import pathlib

import pytest

from sg_jax import checkpointing
from sg_jax.runtime import commands
from sg_jax.runtime import exit_codes
from sg_jax.runtime import stop_signal
from sg_jax.runtime import workdir_lock

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "sg_jax"


@pytest.mark.parametrize("error", [
    ValueError("bad --steps: 'x'"),
    FileNotFoundError(2, "No such file or directory"),
    checkpointing.CheckpointError("no checkpoints in w"),
    checkpointing.WorkdirError("workdir w is not writable"),
    workdir_lock.LockHeld("w is in use by sg_jax.main"),
])
def test_known_errors_end_in_one_line(error):
  called = []
  with pytest.raises(SystemExit) as caught:
    with commands.command_errors(on_error=lambda: called.append(True)):
      raise error
  assert caught.value.code == f"error: {error}"  # sys.exit(str): exit status 1, the line on stderr
  assert called == [True]


def test_unknown_errors_keep_their_traceback():
  with pytest.raises(KeyError):
    with commands.command_errors():
      raise KeyError("a bug")
  with pytest.raises(RuntimeError):  # a RuntimeError that is not one of the project's own
    with commands.command_errors():
      raise RuntimeError("XLA failed")


def test_preempted_exits_with_75(caplog):
  codes = []
  with commands.command_errors(exit_preempted=codes.append):
    raise stop_signal.Preempted("stopped by signal 15 at step 40", step=40)
  assert codes == [75] == [exit_codes.EXIT_PREEMPTED]
  assert "stopped by signal 15 at step 40; rerun the same command to resume" in caplog.text


def test_nothing_raised_passes_through():
  with commands.command_errors(on_error=lambda: pytest.fail("no error")):
    value = 3
  assert value == 3


@pytest.mark.parametrize("name", ["EXIT_PREEMPTED", "STOP_EXIT_SECONDS"])
def test_exit_constants_are_defined_once(name):
  homes = []
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Assign) and any(
          isinstance(t, ast.Name) and t.id == name for t in node.targets):
        homes.append(path.relative_to(PACKAGE).as_posix())
  assert homes == ["runtime/exit_codes.py"]
