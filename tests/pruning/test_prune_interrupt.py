"""A stopped `sg_jax.prune` keeps what it finished and resumes the rest (sg_jax/pruning/partial.py):
SIGINT in the middle of a checkpoint's runs saves them after the current call; the rerun's table
equals an uninterrupted command's, value for value; the command line exits 75 with one line
(its resume is the in-process test's)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from sg_jax.pruning import driver as prune
from sg_jax.pruning import partial, placement, table
from sg_jax.runtime import exit_codes
from sg_jax.runtime import stop_signal
import run_files  # pylint: disable=wrong-import-order  (tests/ is on the path)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = [3, 5]
STEPS = (0, 10)
# 12 pruning steps in calls of 5, 5 and 2.
FAST = dict(sparsities=[0.3, 0.6], pruning_seeds=2, num_steps=12, sparsity_warmup_steps=8,
            num_lines=16, batch_size=8, eval_lines=8, steps_per_call=5, last_only=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  return run_files.random_checkpoint_workdir(tmp_path_factory.mktemp("prune_stop"), STEPS, SEEDS,
                                             eval_lines=8, **{"eval.batch_size": 8})


def _copy(source, tmp_path, name):
  return shutil.copytree(source, str(tmp_path / name))


def _signal_after_calls(monkeypatch, num_calls):
  """Sends SIGINT to this process when the `num_calls`-th compiled pruning call returns."""
  original = placement.train_runs_fn
  calls = []

  def wrapped(mesh):
    fn = original(mesh)

    def counting(*args, **kwargs):
      out = fn(*args, **kwargs)
      calls.append(kwargs["num_steps"])
      if len(calls) == num_calls:
        os.kill(os.getpid(), signal.SIGINT)
      return out

    return counting

  monkeypatch.setattr(placement, "train_runs_fn", wrapped)
  return calls


def test_stopped_mid_step_then_rerun_equals_uninterrupted(source, tmp_path, monkeypatch):
  straight = _copy(source, tmp_path, "straight")
  prune.prune(straight, **FAST)
  expected = table.read_rows(os.path.join(straight, "pruning.csv"))

  stopped = _copy(source, tmp_path, "stopped")
  # calls 1-3 prune step 0; the 4th is the first call (5 of 12 pruning steps) of step 10.
  calls = _signal_after_calls(monkeypatch, 4)
  with pytest.raises(stop_signal.Preempted, match=r"signal 2 at pruning step 5/12 of checkpoint "
                                                  r"step 10") as e:
    prune.prune(stopped, **FAST)
  assert "partial_step10.npz" in str(e.value)
  assert calls == [5, 5, 2, 5]
  saved = partial.partial_path(stopped, 10)
  assert os.path.exists(saved)
  kept = table.read_rows(os.path.join(stopped, "pruning.csv"))
  assert kept == [r for r in expected if r[0] == 0]  # step 0 finished and written
  assert table.load_masks(stopped, 10) is None
  monkeypatch.undo()

  calls = _signal_after_calls(monkeypatch, 99)  # counts only
  again = prune.prune(stopped, **FAST)
  assert calls == [5, 2]  # only the remaining pruning steps of step 10
  assert again["runs"] == 8 and not os.path.exists(saved)
  assert table.read_rows(os.path.join(stopped, "pruning.csv")) == expected
  for step in STEPS:
    a, b = table.load_masks(straight, step), table.load_masks(stopped, step)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_a_saved_state_of_other_runs_is_ignored(source, tmp_path, monkeypatch, caplog):
  stopped = _copy(source, tmp_path, "other")
  _signal_after_calls(monkeypatch, 1)
  with pytest.raises(stop_signal.Preempted):
    prune.prune(stopped, **{**FAST, "last_only": True})
  monkeypatch.undo()
  calls = _signal_after_calls(monkeypatch, 99)
  with caplog.at_level("WARNING", logger="sg_jax.prune"):
    prune.prune(stopped, **{**FAST, "last_only": True, "seeds": [5]})  # other seeds: afresh
  assert calls == [5, 5, 2]
  assert any("other seeds, levels or options" in r.getMessage() for r in caplog.records)
  assert {r[1] for r in table.read_rows(os.path.join(stopped, "pruning.csv"))} == {5}


@pytest.mark.slow
def test_command_line_exits_75_with_one_line(source, tmp_path):
  workdir = _copy(source, tmp_path, "cli")
  args = [sys.executable, "-m", "sg_jax.prune", f"--workdir={workdir}", "--sparsities=0.3,0.6",
          "--pruning_seeds=2", "--num_steps=4000", "--sparsity_warmup_steps=8", "--num_lines=16",
          "--batch_size=8", "--eval_lines=8", "--steps_per_call=5"]
  proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True)
  lines = []
  deadline = time.time() + 240
  for line in proc.stderr:  # wait until it prunes, then stop it
    lines.append(line)
    if "pruning step 10/4000" in line or time.time() > deadline:
      break
  proc.send_signal(signal.SIGINT)
  rest = proc.stderr.read()
  assert proc.wait(timeout=120) == exit_codes.EXIT_PREEMPTED, "".join(lines) + rest
  tail = [l for l in rest.splitlines() if ": pruning step" not in l and "received signal" not in l]
  assert len(tail) == 1 and tail[0].endswith("rerun the same command to resume"), rest
  assert "runs are saved in" in tail[0]
  assert "Traceback" not in rest and "KeyboardInterrupt" not in rest
  assert os.path.exists(partial.partial_path(workdir, 10))
