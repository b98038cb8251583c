"""Reliability: SIGTERM, kill -9 (also during a checkpoint write), corrupt checkpoints, bad
workdirs and data, config changes on resume, a full disk during a checkpoint and signals during
start-up. Each interrupted run is resumed and compared with one uninterrupted run."""

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
from sg_jax import step as step_lib
from sg_jax import tasks
from sg_jax import train
from sg_jax.data import input_pipeline
from sg_jax.records import long_csv
from sg_jax.records import metric_logging
from sg_jax.runtime import exit_codes
from sg_jax.runtime import workdir_lock
from sg_jax.tasks import vocab as vocab_lib
from run_files import params, rows  # pylint: disable=wrong-import-order

# Subprocesses / end-to-end runs (minutes on 2 cores): the full set only (pyproject.toml).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 100


@pytest.fixture(scope="module")
def data_dir(tiny_data):
  """conftest's tiny question data: the `tiny` preset's 400 training lines, 100 per other split."""
  return tiny_data


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  cache = tmp_path_factory.mktemp("jax_cache")
  return dict(os.environ, PYTHONPATH=ROOT, JAX_COMPILATION_CACHE_DIR=str(cache),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def main_cmd(data_dir, workdir, steps=STEPS):
  return [sys.executable, "-m", "sg_jax.main", "--config=configs/question.py:tiny",
          f"--workdir={workdir}", f"--config.data.dir={data_dir}",
          f"--config.train.num_steps={steps}", "--notensorboard"]


@pytest.fixture(scope="module")
def reference(data_dir, env, tmp_path_factory):
  """An uninterrupted run: (workdir, metric rows, final params)."""
  workdir = str(tmp_path_factory.mktemp("reference") / "run")
  subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=env, check=True,
                 capture_output=True)
  return workdir, rows(workdir), params(workdir)


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
  assert proc.returncode == exit_codes.EXIT_PREEMPTED, err[-2000:]
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
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert os.path.isdir(os.path.join(workdir, "corrupt_checkpoints", str(STEPS)))
  assert_same_as_reference(workdir, reference)


@pytest.mark.parametrize("damage", ["metadata", "emptied"])
def test_damaged_latest_checkpoint_metadata_is_quarantined_not_another_config(
    data_dir, env, reference, tmp_path, damage):
  """Issue 50, item 3: with the latest step's state metadata truncated (or its folder emptied)
  the run said 'written with another config ... use another --workdir'; now the step is moved
  aside with one line and the run resumes from the previous one, ending as the reference."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference[0], workdir)
  latest = os.path.join(workdir, "checkpoints", str(STEPS))
  if damage == "metadata":
    with open(os.path.join(latest, "state", "_METADATA"), "r+b") as f:
      f.truncate(100)
  else:
    for name in os.listdir(latest):
      path = os.path.join(latest, name)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  proc = subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=env, capture_output=True,
                        text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "another config" not in proc.stderr
  assert f"moved the unreadable checkpoint step {STEPS} to " in proc.stderr
  assert f"resumed from checkpoint step {STEPS - 20}" in proc.stderr
  assert os.path.isdir(os.path.join(workdir, "corrupt_checkpoints", str(STEPS)))
  assert_same_as_reference(workdir, reference)


def test_allow_config_change_with_another_model_changes_nothing(data_dir, env, reference,
                                                                 tmp_path, snapshot):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference[0], workdir)
  before = snapshot(workdir)
  proc = subprocess.run(main_cmd(data_dir, workdir) + ["--config.model.d_model=64",
                                                       "--allow_config_change"],
                        cwd=ROOT, env=env, capture_output=True, text=True)
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith("error:") and "model.d_model 32 -> 64" in lines[0], lines
  assert snapshot(workdir) == before  # checkpoints, metrics.csv, config.json: byte-identical
  assert not os.path.exists(os.path.join(workdir, "corrupt_checkpoints"))


def test_checkpoint_of_other_shapes_is_a_mismatch_and_is_not_moved(reference, tmp_path):
  """Even without config.json to compare with: stored shapes that differ from the config's are
  refused naming the array and the config field, and no checkpoint is moved aside."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference[0], workdir)
  steps = checkpointing.all_steps(workdir)
  config = checkpointing.restore(workdir).config
  config.model.d_model = 64
  with open(os.path.join(workdir, "vocab.json")) as f:
    vocab = vocab_lib.Vocab.from_json(f.read())
  fns = step_lib.train_fns_from_config(config, vocab.size)
  target = jax.eval_shape(fns.init, jax.ShapeDtypeStruct((2, 2), np.uint32))
  manager = checkpointing.make_manager(workdir, create=False, asynchronous=False)
  try:
    with pytest.raises(checkpointing.CheckpointMismatch,
                       match=r"step 100 .*\[2, 71, 32\] in the checkpoint but "
                             r"float32\[2, 71, 64\].*model.d_model 32 -> 64"):
      checkpointing.restore_latest_good(manager, workdir, target, config=config)
  finally:
    manager.close()
  assert checkpointing.all_steps(workdir) == steps
  assert not os.path.exists(os.path.join(workdir, "corrupt_checkpoints"))


def test_disk_full_during_a_checkpoint_stops_the_run_in_one_line(data_dir, env, reference,
                                                                  tmp_path):
  workdir = str(tmp_path / "run")
  full = dict(env, **{checkpointing.DISK_FULL_AT_SAVE_ENV: "60"})
  proc = subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=full, capture_output=True,
                        text=True)
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and "Event loop" not in proc.stderr, proc.stderr[-3000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1], proc.stderr
  checkpoint_60 = os.path.join(os.path.abspath(workdir), "checkpoints", "60")
  assert f"checkpoint step 60 to {checkpoint_60}:" in errors[0], errors
  assert "File too large" in errors[0] and "last good checkpoint is step 40" in errors[0]
  assert "step 60/100" in proc.stderr and "step 70" not in proc.stderr  # stopped at once
  assert checkpointing.all_steps(workdir) == [0, 20, 40]
  assert checkpointing.temporary_folders(workdir) == []
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["0", "20", "40"]
  assert max(r[0] for r in rows(workdir)) == 40
  _, ref_rows, _ = reference
  assert rows(workdir) == [r for r in ref_rows if r[0] <= 40]
  np.testing.assert_array_equal(
      params_at(workdir, 40), params_at(reference[0], 40))  # the last good one is intact


def params_at(workdir, step):
  p = checkpointing.restore(workdir, step).state["params"]
  return np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(p)])


def _stop_during_start_up(data_dir, env, workdir, sig, after_line=None, delay=0.0):
  """Starts a run, sends `sig` once stderr shows `after_line` (or after `delay` seconds) and
  returns (exit code, stderr, seconds from the signal to the exit)."""
  proc = subprocess.Popen(main_cmd(data_dir, workdir), cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  seen = []
  if after_line is not None:
    for line in proc.stderr:
      seen.append(line)
      if after_line in line:
        break
  else:
    time.sleep(delay)
  sent = time.time()
  proc.send_signal(sig)
  rest = proc.stderr.read()
  proc.wait(timeout=120)
  return proc.returncode, "".join(seen) + rest, time.time() - sent


@pytest.mark.parametrize("sig, after_line, delay", [
    (signal.SIGTERM, None, 0.3),  # importing
    (signal.SIGINT, "training batches", 0.0),  # compiling the first functions
    (signal.SIGTERM, " seeds on ", 0.0),  # the step-0 evaluation (logged just before it)
])
def test_signal_during_start_up_exits_75_in_one_line(data_dir, env, tmp_path, sig, after_line,
                                                     delay):
  code, err, seconds = _stop_during_start_up(data_dir, env, str(tmp_path / "run"), sig,
                                             after_line, delay)
  assert code == exit_codes.EXIT_PREEMPTED, err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  # "stopped by signal N ..." during start-up; a step-0 evaluation loaded from the compilation
  # cache may finish before the signal lands: "signal N: checkpoint written at step 0; ...".
  assert f"signal {int(sig)}" in last and "rerun the same command" in last, err
  assert seconds < 30, seconds


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
  # The same word in both files of the split, so that they agree and the vocabulary check (not
  # the plain/bracketed agreement check) is the one that fails.
  for name, old, new in (("question_bracket.dev", " . ]", " blorp . ]"),
                         ("question.dev", " . decl", " blorp . decl")):
    lines = (bad / name).read_text().splitlines(True)
    assert old in lines[2], lines[2]
    lines[2] = lines[2].replace(old, new, 1)
    (bad / name).write_text("".join(lines))
  config = configlib.base_config("question")
  config.data.dir = str(bad)
  data_options = input_pipeline.DataOptions.from_config(config)
  with pytest.raises(tasks.DataError) as error:
    input_pipeline.load_data(data_options, str(tmp_path))
  message = str(error.value)
  assert message.startswith(f"{bad / 'question_bracket.dev'}:3: "), message
  assert "word 'blorp' is not in the question vocabulary" in message, message


@pytest.mark.parametrize("config_arg, wanted", [
    ("configs/tense.py:depht=8", "error: unknown config field 'depht'; did you mean depth?"),
    ("configs/tense.py:quik", "error: unknown preset 'quik' in config string 'quik'; did you "
                              "mean quick?"),
])
def test_misspelled_alias_or_preset_is_one_clean_line(tmp_path, config_arg, wanted):
  proc = subprocess.run([sys.executable, "-m", "sg_jax.main", f"--config={config_arg}",
                         f"--workdir={tmp_path}/w"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(wanted), proc.stderr[-2000:]
  assert "Error:" not in lines[0], lines  # no exception class name such as "ValueError:"
  assert not os.path.exists(tmp_path / "w")


def _malformed_data_dir(data_dir, path):
  shutil.copytree(data_dir, path)
  for name in os.listdir(path):
    if name.endswith(".meta.json"):
      os.remove(path / name)  # else files of another size would be generated over them
  for name in ("question.train", "question_bracket.train"):
    lines = (path / name).read_text().splitlines(True)
    lines[4] = lines[4].replace("\t", " ", 1)  # a missing tab
    (path / name).write_text("".join(lines))
  return str(path)


def test_data_error_leaves_no_workdir_behind(data_dir, tmp_path):
  config = configlib.apply_config_string(configlib.base_config("question"), "quick",
                                         configlib.PRESETS)
  config.data.dir = _malformed_data_dir(data_dir, tmp_path / "bad")
  fresh = tmp_path / "runs" / "new" / "run"  # its parents are created by the run too
  with pytest.raises(tasks.DataError, match=r"question_bracket.train:5: "):
    train.train_and_evaluate(config, str(fresh), tensorboard=False)
  assert not os.path.exists(tmp_path / "runs"), list((tmp_path / "runs").rglob("*"))
  # A workdir that existed before the run keeps exactly what it held.
  existing = tmp_path / "existing"
  existing.mkdir()
  (existing / "notes.txt").write_text("mine")
  with pytest.raises(tasks.DataError):
    train.train_and_evaluate(config, str(existing), tensorboard=False)
  assert sorted(os.listdir(existing)) == ["notes.txt"]
  assert (existing / "notes.txt").read_text() == "mine"


def analyze_cmd(workdir, *extra):
  return [sys.executable, "-m", "sg_jax.analyze", f"--workdir={workdir}", "--num_sentences=12",
          "--metrics=weight_norm,tscore", *extra]


def _keys_unique(path):
  keys = [tuple(r[:-1]) for r in long_csv.read_rows(path)]
  return len(keys) == len(set(keys)), len(keys)


def test_a_workdir_in_use_refuses_main_and_analyze_then_kill_9_and_rerun_takes_over(
    data_dir, env, reference, tmp_path):
  """Issue 50, item 1: a second `main` (and an `analyze`) on a workdir `main` is training are
  refused in one line naming the holder; after kill -9 of the holder, a rerun takes the lock
  over with one warning and resumes (metric keys unique)."""
  workdir = str(tmp_path / "run")
  proc = subprocess.Popen(main_cmd(data_dir, workdir, steps=100_000), cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    wait_for_checkpoint(proc, workdir, 20)
    for cmd in (main_cmd(data_dir, workdir), analyze_cmd(workdir)):
      second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
      assert second.returncode == 1, second.stderr[-3000:]
      last = second.stderr.strip().splitlines()[-1]
      assert last.startswith(f"error: {workdir} is in use by sg_jax.main (pid {proc.pid} on "
                             "host "), second.stderr[-3000:]
      assert "Traceback" not in second.stderr
    assert proc.poll() is None  # the first run was not disturbed
    assert not os.path.exists(os.path.join(workdir, "analysis.csv"))
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert os.path.exists(os.path.join(workdir, workdir_lock.LOCK_NAME))  # left by kill -9
  end = checkpointing.all_steps(workdir)[-1] + 20
  rerun = subprocess.run(main_cmd(data_dir, workdir, steps=end), cwd=ROOT, env=env,
                         capture_output=True, text=True)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert f"taking over the lock of {workdir} from sg_jax.main (pid {proc.pid}" in rerun.stderr
  assert not os.path.exists(os.path.join(workdir, workdir_lock.LOCK_NAME))
  assert checkpointing.all_steps(workdir)[-1] == end
  unique, _ = _keys_unique(os.path.join(workdir, "metrics.csv"))
  assert unique and max(r[0] for r in rows(workdir)) == end
  assert [r for r in rows(workdir) if r[0] <= STEPS] == [r for r in reference[1] if r[0] <= STEPS]


def test_two_analyze_at_once_one_is_refused_and_no_row_is_doubled(env, reference, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference[0], workdir)
  procs = [subprocess.Popen(analyze_cmd(workdir), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(2)]
  results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
  codes = sorted(code for code, _ in results)
  assert codes == [0, 1], [err[-2000:] for _, err in results]
  refused = next(err for code, err in results if code == 1)
  assert refused.strip().splitlines()[-1].startswith(f"error: {workdir} is in use by "
                                                     "sg_jax.analyze (pid "), refused[-2000:]
  unique, count = _keys_unique(os.path.join(workdir, "analysis.csv"))
  assert unique and count > 0
  # A rerun finds every row done: nothing new, the table unchanged.
  before = open(os.path.join(workdir, "analysis.csv")).read()
  again = subprocess.run(analyze_cmd(workdir), cwd=ROOT, env=env, capture_output=True, text=True)
  assert again.returncode == 0 and "analysis: 0 new rows" in again.stdout, again.stderr[-2000:]
  assert open(os.path.join(workdir, "analysis.csv")).read() == before


def test_absurd_seed_count_is_refused_before_anything_is_allocated(data_dir, env, tmp_path):
  """Issue 50, item 6: seeds=10000 of `tiny` reached 22 GB before its first evaluation; now the
  memory estimate refuses it in one line and leaves no workdir."""
  workdir = str(tmp_path / "run")
  start = time.time()
  proc = subprocess.run(main_cmd(data_dir, workdir) + ["--config.num_seeds=10000"], cwd=ROOT,
                        env=env, capture_output=True, text=True)
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: this run needs about ") and "10000 seeds" in last, last
  assert "--skip_memory_check" in last and "Traceback" not in proc.stderr
  assert time.time() - start < 120
  assert not os.path.exists(workdir)
