"""Reliability: SIGTERM, kill -9 (also during a checkpoint write), corrupt checkpoints, bad
workdirs and data. Each interrupted run is resumed and compared with one uninterrupted run."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from sg_jax import checkpointing
from sg_jax import configlib
from sg_jax import metric_logging
from sg_jax import tasks
from sg_jax import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 100


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("question_data")
  tasks.get_task("question").generate(str(d), seed=0, num_train=400,
                                      sizes={"dev": 100, "test": 100, "gen": 100})
  return str(d)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  cache = tmp_path_factory.mktemp("jax_cache")
  return dict(os.environ, PYTHONPATH=ROOT, JAX_COMPILATION_CACHE_DIR=str(cache),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def main_cmd(data_dir, workdir, steps=STEPS):
  return [sys.executable, "-m", "sg_jax.main", "--config=configs/question.py:quick",
          f"--workdir={workdir}", f"--config.data.dir={data_dir}", "--config.num_seeds=2",
          "--config.model.num_layers=1", "--config.model.d_model=32",
          "--config.model.num_heads=2", "--config.model.d_ff=64",
          f"--config.train.num_steps={steps}", "--config.train.steps_per_call=10",
          "--config.train.log_every=10", "--config.eval.every=20",
          "--config.eval.max_lines=64", "--config.checkpoint.every=20", "--notensorboard"]


@pytest.fixture(scope="module")
def reference(data_dir, env, tmp_path_factory):
  """An uninterrupted run: (workdir, metric rows, final params)."""
  workdir = str(tmp_path_factory.mktemp("reference") / "run")
  subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=env, check=True,
                 capture_output=True)
  return workdir, rows(workdir), params(workdir)


def rows(workdir):
  table = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  return sorted((r["step"], r["seed"], r["name"], r["value"]) for r in table)


def params(workdir):
  p = checkpointing.restore(workdir).state["params"]
  return np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(p)])


def assert_same_as_reference(workdir, reference):
  _, ref_rows, ref_params = reference
  assert checkpointing.all_steps(workdir)[-1] == STEPS
  assert rows(workdir) == ref_rows
  np.testing.assert_array_equal(params(workdir), ref_params)


def wait_for_checkpoint(proc, workdir, step, timeout=300):
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    if os.path.isdir(os.path.join(workdir, "checkpoints", str(step))):
      return
    time.sleep(0.02)
  raise AssertionError(f"checkpoint {step} never appeared (exit code {proc.poll()})")


def test_kill_9_midway_then_rerun_equals_uninterrupted(data_dir, env, reference, tmp_path):
  workdir = str(tmp_path / "run")
  proc = subprocess.Popen(main_cmd(data_dir, workdir), cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  wait_for_checkpoint(proc, workdir, 40)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert 40 in checkpointing.all_steps(workdir) and checkpointing.all_steps(workdir)[-1] < STEPS
  subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=env, check=True,
                 capture_output=True)
  assert_same_as_reference(workdir, reference)


def test_sigterm_checkpoints_exits_75_and_resume_equals_uninterrupted(data_dir, env, reference,
                                                                      tmp_path):
  workdir = str(tmp_path / "run")
  proc = subprocess.Popen(main_cmd(data_dir, workdir), cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  wait_for_checkpoint(proc, workdir, 20)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == train.EXIT_PREEMPTED, err[-2000:]
  steps = checkpointing.all_steps(workdir)
  assert steps[-1] < STEPS, steps
  # The signal-triggered checkpoint is the step the run stopped at (metrics end there too).
  assert max(r[0] for r in rows(workdir)) <= steps[-1]
  subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=env, check=True,
                 capture_output=True)
  assert_same_as_reference(workdir, reference)


def test_kill_9_during_a_checkpoint_write_then_resume(data_dir, env, reference, tmp_path):
  workdir = str(tmp_path / "run")
  killer = dict(env, **{checkpointing.KILL_DURING_SAVE_ENV: "60"})
  proc = subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=killer, capture_output=True)
  assert proc.returncode == -signal.SIGKILL
  steps = checkpointing.all_steps(workdir)
  assert steps[-1] == 40, steps  # step 60 was never committed
  checkpointing.restore(workdir, 40)  # the previous checkpoint is restorable
  subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=env, check=True,
                 capture_output=True)
  assert_same_as_reference(workdir, reference)


def test_corrupt_latest_checkpoint_is_skipped_with_a_warning(data_dir, env, reference, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference[0], workdir)
  state_dir = os.path.join(workdir, "checkpoints", str(STEPS), "state")
  for root, _, files in os.walk(state_dir):
    for name in files:
      path = os.path.join(root, name)
      if os.path.getsize(path) > 200 and "ocdbt" in root:
        with open(path, "r+b") as f:
          f.truncate(100)
  proc = subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=env, capture_output=True,
                        text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"checkpoint step {STEPS}" in proc.stderr and "unreadable" in proc.stderr
  assert os.path.isdir(os.path.join(workdir, "corrupt_checkpoints", str(STEPS)))
  assert_same_as_reference(workdir, reference)


def test_unwritable_workdir_is_a_clear_error(data_dir, tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  config = configlib.apply_config_string(configlib.base_config("question"), "quick",
                                         configlib.PRESETS)
  config.data.dir = data_dir
  with pytest.raises(checkpointing.WorkdirError, match="is not writable"):
    train.train_and_evaluate(config, str(blocker / "run"), tensorboard=False)


def test_failed_metrics_append_leaves_no_torn_line(tmp_path, monkeypatch):
  table = metric_logging.MetricsTable(str(tmp_path / "metrics.csv"))
  table.write(10, [0, 1], {"train/loss": np.array([1.5, 2.5])})
  before = (tmp_path / "metrics.csv").read_bytes()
  real_write = os.write

  def disk_full(fd, data):
    real_write(fd, data[: len(data) // 2])  # a partial write, then the disk is full
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "write", disk_full)
  with pytest.raises(OSError, match="metrics.csv"):
    table.write(20, [0, 1], {"train/loss": np.array([1.0, 2.0])})
  monkeypatch.undo()
  assert (tmp_path / "metrics.csv").read_bytes() == before
  assert len(table.rows()) == 2


def test_unknown_word_in_data_names_file_and_line(data_dir, tmp_path):
  bad = tmp_path / "bad"
  shutil.copytree(data_dir, bad)
  for name in os.listdir(bad):
    if name.endswith(".meta.json"):
      os.remove(bad / name)
  dev = bad / "question_bracket.dev"
  lines = dev.read_text().splitlines(True)
  lines[2] = lines[2].replace(" . ]", " blorp . ]", 1)
  dev.write_text("".join(lines))
  config = configlib.base_config("question")
  config.data.dir = str(bad)
  with pytest.raises(tasks.DataError, match=r"question_bracket.dev:3: .*'blorp'"):
    train.load_data(config, str(tmp_path))
