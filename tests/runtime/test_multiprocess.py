"""Two processes on 127.0.0.1 (`python -m sg_jax.main --multihost`) train 4 seeds on 2 + 2 CPU
devices exactly as one process does on 4; one of them dying stops the other with one line, and
rerunning both resumes from the last checkpoint and ends identical to the one-process run."""

import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from sg_jax import checkpointing
from sg_jax import tasks
from conftest import TEST_SIZED_FLAGS  # pylint: disable=wrong-import-order
from run_files import params, rows  # pylint: disable=wrong-import-order

# Subprocesses / end-to-end runs (minutes on 2 cores): the full set only (pyproject.toml).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 60
KILLED_AT_SAVE = 40  # process 1 dies while this checkpoint is being written
HEARTBEAT_SECONDS = 10
NUM_TRAIN = 400


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("question_data")
  tasks.get_task("question").generate(str(d), seed=0, num_train=NUM_TRAIN,
                                      sizes={"dev": 64, "test": 64, "gen": 64})
  return str(d)


@pytest.fixture(scope="module")
def env():
  if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs 2 cores: 2 x cores CPU devices shared by 2 processes, 2 each")
  # The rerun loads what the first two-process run compiled from JAX's persistent cache (the
  # session's folder, conftest.JAX_CACHE_DIR), even the programs that compile in under 1 s.
  environment = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
                     JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  # The device counts under test are sg_jax's own (2 x cores, shared by the processes).
  environment.pop("XLA_FLAGS", None)
  return environment


def main_cmd(data_dir, workdir, *extra):
  return [sys.executable, "-m", "sg_jax.main", "--config=configs/question.py:quick",
          f"--workdir={workdir}", f"--config.data.dir={data_dir}",
          f"--config.data.num_train={NUM_TRAIN}", "--config.num_seeds=4",
          "--config.model.num_layers=1", "--config.model.d_model=32",
          "--config.model.num_heads=2", "--config.model.d_ff=64",
          f"--config.train.num_steps={STEPS}", "--config.train.steps_per_call=10",
          "--config.train.log_every=10", "--config.eval.every=20",
          "--config.eval.max_lines=16", "--config.checkpoint.every=20", "--notensorboard",
          *TEST_SIZED_FLAGS, *extra]


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_two(data_dir, workdir, env, env_of_process_1=None):
  """Popen of processes 0 and 1 (stdout, stderr piped as text)."""
  port = free_port()
  procs = []
  for i in range(2):
    e = dict(env, **(env_of_process_1 or {})) if i == 1 else env
    procs.append(subprocess.Popen(
        main_cmd(data_dir, workdir, "--multihost", f"--coordinator_address=127.0.0.1:{port}",
                 "--num_processes=2", f"--process_id={i}",
                 f"--heartbeat_timeout_seconds={HEARTBEAT_SECONDS}"),
        cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  return procs


@pytest.fixture(scope="module")
def reference(data_dir, env, tmp_path_factory):
  """One process on 4 devices: (metric rows, final params)."""
  workdir = str(tmp_path_factory.mktemp("one_process") / "run")
  proc = subprocess.run(main_cmd(data_dir, workdir), cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "4 seeds on 4 device(s) (1 per device), 1 process(es)" in proc.stderr
  return rows(workdir), params(workdir)


def test_two_processes_survive_a_death_and_end_equal_to_one(data_dir, env, reference, tmp_path):
  workdir = str(tmp_path / "run")
  # Process 1 SIGKILLs itself once the save of step 40 has started (checkpoint 20 is complete):
  # process 0 then waits for it inside orbax's save.
  procs = start_two(data_dir, workdir, env,
                    {checkpointing.KILL_DURING_SAVE_ENV: str(KILLED_AT_SAVE)})
  _, err1 = procs[1].communicate(timeout=600)
  died = time.monotonic()
  assert procs[1].returncode == -9, err1[-3000:]
  _, err0 = procs[0].communicate(timeout=300)
  waited = time.monotonic() - died
  assert procs[0].returncode == 1, err0[-3000:]
  print(f"process 0 stopped {waited:.1f} s after process 1 died")
  assert waited < 3 * HEARTBEAT_SECONDS + 15, f"process 0 took {waited:.0f} s to stop"
  assert "Traceback" not in err0 and "Fatal Python error" not in err0, err0[-3000:]
  last = err0.strip().splitlines()[-1]
  assert re.match(r"error: process 0 of 2 lost contact with the run \(.+\); rerun every "
                  r"process with the same command to resume", last), last
  assert "4 seeds on 4 device(s) (1 per device), 2 process(es)" in err0
  steps = checkpointing.all_steps(workdir)
  assert 20 in steps and steps[-1] < KILLED_AT_SAVE, steps

  procs = start_two(data_dir, workdir, env)
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  assert "resumed from checkpoint step 20" in outs[0][1]
  # Only process 0 logs progress and prints the summary.
  assert "finished at step 60" in outs[0][0] and "finished" not in outs[1][0]
  assert not re.search(r"^\d\d:\d\d:\d\d ", outs[1][1], re.M), outs[1][1][-2000:]

  ref_rows, ref_params = reference
  got = rows(workdir)
  assert [r[:3] for r in got] == [r[:3] for r in ref_rows]
  np.testing.assert_allclose([r[3] for r in got], [r[3] for r in ref_rows], atol=1e-5, rtol=0)
  assert checkpointing.all_steps(workdir)[-1] == STEPS
  np.testing.assert_allclose(params(workdir), ref_params, atol=1e-5, rtol=0)
