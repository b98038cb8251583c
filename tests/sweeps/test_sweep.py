"""Tests of the sweep driver (`sg_jax.sweep`): job commands and config resolution, the
finished-run check, one real tiny sweep (a single depth, two seeds, 10 steps) that is skipped
when rerun and resumed when asked to train longer, and a grid sweep (depth x weight decay)
stopped mid-way by SIGINT whose rerun equals an uninterrupted sweep. The grid's expansion and
refusals: tests/sweeps/test_sweep_grid.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sg_jax.sweeps import driver as sweep
import run_files  # pylint: disable=wrong-import-order  (tests/ is on the path)
from conftest import TEST_SIZED_OVERRIDES  # pylint: disable=wrong-import-order

# Subprocesses / end-to-end runs (minutes on 2 cores): the full set only (pyproject.toml).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "question.py")


def test_job_command_appends_depth_seeds_overrides_and_extra_flags():
  cmd = sweep.job_command(f"{CONFIG}:quick,heads=2", 4, 3, "runs/qf/depth4",
                          overrides=["train.num_steps=300", "--config.model.d_model=64"],
                          extra=["--allow_config_change"])
  assert cmd[:3] == [sys.executable, "-m", "sg_jax.main"]
  assert cmd[3] == f"--config={CONFIG}:quick,heads=2,depth=4,seeds=3"
  assert cmd[4:] == ["--workdir=runs/qf/depth4", "--config.train.num_steps=300",
                     "--config.model.d_model=64", "--allow_config_change"]
  assert sweep.job_config_arg(CONFIG, 2, 10) == f"{CONFIG}:depth=2,seeds=10"


def test_resolve_config_applies_depth_seeds_and_overrides():
  config = sweep.resolve_config(f"{CONFIG}:quick,depth=9", 2, 5, ["train.num_steps=123"])
  assert (config.model.num_layers, config.num_seeds, config.train.num_steps) == (2, 5, 123)
  assert config.model.d_model == 128  # from the quick preset


@pytest.mark.parametrize("kwargs, message", [
    (dict(depths=[]), "--depths"), (dict(depths=[2, 2]), "twice"), (dict(seeds=0), "--seeds"),
    (dict(overrides=["train.num_steps"]), "section.field=value"),
    (dict(overrides=["train.nope=3"]), "unknown config field"),
])
def test_plan_rejects_bad_input(tmp_path, kwargs, message):
  args = dict(config_arg=CONFIG, depths=[2], seeds=2, root=str(tmp_path))
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    sweep.plan(**args)


def test_missing_config_file_is_named(tmp_path):
  with pytest.raises(ValueError, match="nope.py"):
    sweep.plan("configs/nope.py:quick", [2], 2, str(tmp_path))


def test_is_finished_needs_config_and_final_checkpoint(tmp_path):
  assert not sweep.is_finished(str(tmp_path), 10)
  (tmp_path / "config.json").write_text(json.dumps({"train": {"num_steps": 10}}))
  assert not sweep.is_finished(str(tmp_path), 10)  # no checkpoint yet


TINY = f"{CONFIG}:tiny"


def _tiny_overrides(data_dir, steps):
  """The tiny preset (conftest's `tiny_data`), smaller still and test-sized
  (`conftest.TEST_SIZED`), evaluated every 10 steps."""
  return [f"data.dir={data_dir}", "model.d_model=16", "model.d_ff=32", f"train.num_steps={steps}",
          "eval.every=10", "checkpoint.every=10", "optim.warmup_steps=2", *TEST_SIZED_OVERRIDES]


def test_tiny_sweep_runs_skips_and_resumes(tmp_path, tiny_data):
  root = str(tmp_path / "sweep")
  args = [sys.executable, "-m", "sg_jax.sweep", f"--config={TINY}", "--depths=1", "--seeds=2",
          f"--root={root}"]
  overrides = [f"--override={o}" for o in _tiny_overrides(tiny_data, 10)]
  done = subprocess.run(args + overrides + ["--", "--notensorboard"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr
  index = json.load(open(os.path.join(root, "sweep.json")))
  job = index["jobs"]["1"]
  assert (job["status"], job["returncode"], job["latest_step"]) == ("finished", 0, 10)
  assert job["workdir"] == "depth1" and index["seeds"] == 2
  assert "--config.train.num_steps=10" in job["command"] and "--notensorboard" in job["command"]
  assert job["started"] and job["ended"]
  assert os.path.exists(os.path.join(root, "depth1", "metrics.csv"))
  assert os.path.exists(os.path.join(root, "logs", "depth1.log"))

  # Rerun: nothing to do (no subprocess); the index says skipped.
  assert index["analyze_flags"] == []
  statuses = sweep.run_sweep(TINY, [1], 2, root, overrides=_tiny_overrides(tiny_data, 10),
                             extra=["--notensorboard"], analyze_flags=["--num_sentences=3"])
  assert statuses == {"1": "skipped"}
  assert json.load(open(os.path.join(root, "sweep.json")))["analyze_flags"] == [
      "--num_sentences=3"]
  # A longer run is not finished: dry run plans to run it again (it would resume at step 10).
  jobs = sweep.plan(TINY, [1], 2, root, _tiny_overrides(tiny_data, 20))
  assert jobs[0]["initial_status"] == "pending"


def _fake_job(tmp_path, depth, code):
  return {"key": str(depth), "label": f"depth {depth}", "workdir": f"depth{depth}",
          "workdir_path": str(tmp_path / f"d{depth}"),
          "command": [sys.executable, "-c", code], "analyze_command": None,
          "log": f"depth{depth}.log", "analyze_log": f"depth{depth}.analyze.log",
          "initial_status": "pending"}


def _stop_once_ready(runner, jobs, log, signum):
  """Runs `jobs` in a thread, sends `signum` to the sweep once `log` has the child's own 'ready'
  line, and returns the statuses. (The log's header line repeats the command, which contains
  'ready': wait for the child's output line, printed only once its handlers are installed.)"""
  import threading
  import time

  result = {}
  thread = threading.Thread(target=lambda: result.update(s=runner.run(jobs)))
  thread.start()
  deadline = time.time() + 30
  while time.time() < deadline and not (log.exists() and "ready" in log.read_text().splitlines()):
    time.sleep(0.1)
  runner.stop(signum)
  thread.join(timeout=30)
  return result["s"]


def test_runner_parallel_statuses_and_signal_forwarding(tmp_path):
  import signal
  import time

  index = sweep.SweepIndex(str(tmp_path), {"config": "x"})
  jobs = [_fake_job(tmp_path, 1, "import time; time.sleep(1.5)"),
          _fake_job(tmp_path, 2, "import time, sys; time.sleep(1.5); sys.exit(3)")]
  t0 = time.time()
  assert sweep.Runner(index, str(tmp_path), parallel=2).run(jobs) == ["finished", "failed"]
  assert time.time() - t0 < 2.9  # ran at once
  saved = json.load(open(tmp_path / "sweep.json"))["jobs"]
  assert saved["2"]["returncode"] == 3 and saved["1"]["status"] == "finished"

  # SIGTERM to the sweep reaches a running job, which checkpoints and exits 75 -> preempted;
  # the queued job is not started.
  slow = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(75)); "
          "print('ready', flush=True); time.sleep(60)")
  runner = sweep.Runner(index, str(tmp_path), parallel=1)
  jobs = [_fake_job(tmp_path, 3, slow), _fake_job(tmp_path, 4, "pass")]
  assert _stop_once_ready(runner, jobs, tmp_path / "depth3.log", signal.SIGTERM) == [
      "preempted", "pending"]
  assert not (tmp_path / "depth4.log").exists()


def test_an_analysis_stopped_by_the_sweep_is_interrupted_and_a_crashing_one_failed(tmp_path):
  """SIGINT reaching a running analysis (which dies of it with a KeyboardInterrupt) marks the
  depth preempted (sweep exit 75, the rerun redoes the analysis), not failed; an analysis that
  fails on its own still marks the depth failed."""
  import signal

  index = sweep.SweepIndex(str(tmp_path), {"config": "x"})
  crash = _fake_job(tmp_path, 1, "pass")
  crash["analyze_command"] = [sys.executable, "-c", "import sys; sys.exit(2)"]
  assert sweep.Runner(index, str(tmp_path), parallel=1).run([crash]) == ["failed"]
  assert json.load(open(tmp_path / "sweep.json"))["jobs"]["1"]["analysis"] == (
      "failed (exit code 2)")

  job = _fake_job(tmp_path, 2, "pass")
  # Like sg_jax.analyze, the child installs its own SIGINT handler (a shell's background job
  # inherits SIGINT ignored).
  job["analyze_command"] = [sys.executable, "-c",
                            "import signal, time; signal.signal(signal.SIGINT, "
                            "signal.default_int_handler); print('ready', flush=True); "
                            "time.sleep(60)"]
  runner = sweep.Runner(index, str(tmp_path), parallel=1)
  assert _stop_once_ready(runner, [job], tmp_path / "depth2.analyze.log", signal.SIGINT) == [
      "preempted"]
  saved = json.load(open(tmp_path / "sweep.json"))["jobs"]["2"]
  assert saved["status"] == "finished"  # its training
  # Python exits a KeyboardInterrupt by re-raising SIGINT: -2.
  assert saved["analysis"].startswith("interrupted (exit code -2;")


@pytest.mark.slow
def test_a_grid_sweep_stopped_by_sigint_and_rerun_equals_an_uninterrupted_sweep(tmp_path,
                                                                                tiny_data):
  """A grid over depth (jobs, --depths shorthand) and weight decay (each job's seed axis: 0 and
  0.1, one seed each). SIGINT while depth 2 trains (depth 1 done): the sweep exits 75 and its
  index says preempted; the rerun skips depth 1 (its files untouched), resumes depth 2, and depth
  2's metrics and parameters equal those of a sweep of depth 2 that was never stopped. The index
  records the grid and each job's seed-to-value map; the same root with another grid is refused
  in one line."""
  import signal
  import time

  overrides = [f"--override={o}" for o in _tiny_overrides(tiny_data, 40)]
  overrides += ["--override=train.steps_per_call=5", "--override=train.max_call_seconds=0"]

  def sweep_args(root, depths="1,2", decays="0,0.1"):
    return [sys.executable, "-m", "sg_jax.sweep", f"--config={TINY}", f"--depths={depths}",
            f"--grid=optim.weight_decay={decays}", "--seeds=1", f"--root={root}"] + overrides + [
                "--", "--notensorboard"]

  straight = str(tmp_path / "straight")
  done = subprocess.run(sweep_args(straight, depths="2"), cwd=ROOT, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stdout + done.stderr

  stopped = str(tmp_path / "stopped")
  proc = subprocess.Popen(sweep_args(stopped), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  log = os.path.join(stopped, "logs", "depth2.log")
  deadline = time.time() + 300
  while time.time() < deadline:  # depth 2 has trained some steps, not all
    if os.path.exists(log) and "step 10/40" in open(log).read():
      break
    time.sleep(0.2)
  proc.send_signal(signal.SIGINT)
  out = proc.communicate(timeout=120)[0]
  assert proc.returncode == 75, out
  index = json.load(open(os.path.join(stopped, "sweep.json")))
  assert index["jobs"]["1"]["status"] == "finished"
  assert index["jobs"]["2"]["status"] == "preempted" and index["jobs"]["2"]["latest_step"] < 40
  assert [(a["field"], a["values"], a["axis"]) for a in index["grid"]["axes"]] == [
      ("model.num_layers", [1, 2], "job"), ("optim.weight_decay", [0.0, 0.1], "seed")]
  assert index["jobs"]["2"]["seeds"] == {"0": {"optim.weight_decay": 0.0},
                                         "1": {"optim.weight_decay": 0.1}}
  assert json.load(open(os.path.join(stopped, "depth2", "config.json")))["optim"][
      "weight_decay"] == [0.0, 0.1]
  depth1 = os.path.join(stopped, "depth1")
  depth1_before = (run_files.rows(depth1), run_files.params(depth1))
  changed = subprocess.run(sweep_args(stopped, decays="0,0.2"), cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
  assert changed.returncode == 1
  assert changed.stderr.strip().splitlines()[-1].startswith(
      f"error: {os.path.join(stopped, 'sweep.json')} records the grid model.num_layers=1,2 "
      "optim.weight_decay=0,0.1 x 1 seeds per grid point, this command asks for")
  again = subprocess.run(sweep_args(stopped), cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
  assert again.returncode == 0, again.stdout + again.stderr
  index = json.load(open(os.path.join(stopped, "sweep.json")))
  assert index["jobs"]["1"]["status"] == "skipped" and index["jobs"]["2"]["status"] == "finished"
  assert run_files.rows(depth1) == depth1_before[0]
  np.testing.assert_array_equal(run_files.params(depth1), depth1_before[1])
  a, b = os.path.join(straight, "depth2"), os.path.join(stopped, "depth2")
  assert run_files.rows(a) == run_files.rows(b)
  np.testing.assert_array_equal(run_files.params(a), run_files.params(b))
