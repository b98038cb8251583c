"""Dry runs of the launch scripts (`launch/tpu_vm.sh`, `launch/gpu_host.sh`): the exact gcloud,
pip and python commands they print, and their errors on bad input. The loop that mirrors runs/
while a job runs is also executed for real, with a fake short job (`python` on PATH is a script
that sleeps) and a stub `gcloud` that records its calls: it must end within one period of the job.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
SWEEP_ARGS = ["--", "--config=configs/question.py", "--depths=2,4", "--seeds=10",
              "--root=runs/qf"]


def _run(script, *args, ok=True):
  done = subprocess.run(["bash", os.path.join(ROOT, "launch", script), *args],
                        capture_output=True, text=True, timeout=30, cwd=ROOT)
  if ok:
    assert done.returncode == 0, done.stderr
  return done


def _lines(script, *args):
  return [l for l in _run(script, *args).stdout.splitlines() if l and not l.startswith("#")]


def test_tpu_create_on_demand_spot_and_queued():
  assert _lines("tpu_vm.sh", "create", "--name=sg-qf", "--dry_run") == [
      "gcloud compute tpus tpu-vm create sg-qf --zone=us-central2-b --accelerator-type=v4-8 "
      "--version=tpu-ubuntu2204-base"]
  spot = _lines("tpu_vm.sh", "create", "--name=sg-qf", "--spot", "--project=p",
                "--accelerator=v4-32", "--dry_run")
  assert spot == ["gcloud compute tpus tpu-vm create sg-qf --zone=us-central2-b --project=p "
                  "--accelerator-type=v4-32 --version=tpu-ubuntu2204-base --spot"]
  queued = _lines("tpu_vm.sh", "create", "--name=sg-qf", "--queued", "--spot", "--dry_run")
  assert queued[0] == ("gcloud compute tpus queued-resources create sg-qf --zone=us-central2-b "
                       "--node-id=sg-qf --accelerator-type=v4-8 "
                       "--runtime-version=tpu-ubuntu2204-base --spot")
  assert "queued-resources describe sg-qf" in queued[1]  # waits for ACTIVE


def test_tpu_install_on_all_workers():
  lines = _lines("tpu_vm.sh", "install", "--name=sg-qf", "--dry_run")
  assert lines[0].startswith("git -C ") and lines[0].endswith(
      "archive --format=tar.gz --output=sg_jax_src.tar.gz HEAD")
  assert lines[1] == ("gcloud compute tpus tpu-vm scp sg_jax_src.tar.gz 'sg-qf:~/sg_jax_src.tar.gz'"
                      " --zone=us-central2-b --worker=all")
  assert "--worker=all" in lines[3] and "pip install -q -U '\\''jax[tpu]'\\''" in lines[3]
  assert "pip install -q -e ." in lines[3]
  cloned = _lines("tpu_vm.sh", "install", "--name=sg-qf", "--repo=https://example.com/sg_jax.git",
                  "--dry_run")
  assert len(cloned) == 1 and "git clone --branch main https://example.com/sg_jax.git" in cloned[0]


def test_tpu_sweep_starts_on_every_worker_and_syncs_from_worker_0():
  lines = _lines("tpu_vm.sh", "sweep", "--name=sg-qf", "--bucket=gs://b/sg", "--dry_run",
                 *SWEEP_ARGS)
  assert lines[0] == (
      "gcloud compute tpus tpu-vm ssh sg-qf --zone=us-central2-b --worker=all '--command=cd "
      "sg_jax && { nohup python -m sg_jax.sweep --config=configs/question.py --depths=2,4 "
      "--seeds=10 --root=runs/qf > ~/sg_jax.log 2>&1 & echo $! > ~/sg_jax.pid; }'")
  assert "--worker=0" in lines[1] and "gcloud storage rsync --recursive runs gs://b/sg/runs" in lines[1]
  train = _lines("tpu_vm.sh", "train", "--name=sg-qf", "--dry_run", "--",
                 "--config=configs/question.py:depth=6", "--workdir=runs/q6")
  assert len(train) == 1 and "python -m sg_jax.main --config=configs/question.py:depth=6" in train[0]


def test_tpu_resume_recreates_installs_restores_and_reruns():
  lines = _lines("tpu_vm.sh", "resume", "--name=sg-qf", "--spot", "--job=sweep",
                 "--bucket=gs://b/sg", "--dry_run", *SWEEP_ARGS)
  order = ["tpu-vm delete sg-qf", "tpu-vm create sg-qf", "archive", "tpu-vm scp",
           "tar -xzf", "gcloud storage rsync --recursive gs://b/sg/runs sg_jax/runs",
           "python -m sg_jax.sweep", "gcloud storage rsync --recursive runs gs://b/sg/runs"]
  positions = [next(i for i, l in enumerate(lines) if key in l) for key in order]
  assert positions == sorted(positions), lines


def test_tpu_pull_push_status_delete():
  assert _lines("tpu_vm.sh", "pull", "--name=x", "--bucket=gs://b/sg", "--dest=out", "--dry_run") == [
      "mkdir -p out", "gcloud storage rsync --recursive gs://b/sg/runs out"]
  push = _lines("tpu_vm.sh", "push", "--name=x", "--bucket=gs://b/sg", "--dry_run")
  assert push == ["gcloud compute tpus tpu-vm ssh x --zone=us-central2-b --worker=0 "
                  "'--command=cd sg_jax && gcloud storage rsync --recursive runs gs://b/sg/runs'"]
  assert _lines("tpu_vm.sh", "delete", "--name=x", "--queued", "--dry_run") == [
      "gcloud compute tpus queued-resources delete x --zone=us-central2-b --force --quiet"]
  status = _lines("tpu_vm.sh", "status", "--name=x", "--dry_run")
  assert "tpu-vm describe x" in status[0] and "tail -n 20" in status[1]


@pytest.mark.parametrize("args, message", [
    (["create", "--dry_run"], "--name"),
    (["push", "--name=x", "--dry_run"], "--bucket"),
    (["pull", "--name=x", "--bucket=s3://x", "--dry_run"], "gs://"),
    (["resume", "--name=x", "--bucket=gs://b", "--dry_run"], "--job"),
    (["sweep", "--name=x", "--dry_run"], "after --"),
    (["frobnicate", "--name=x"], "unknown command"),
    (["create", "--name=x", "--bogus"], "unknown option"),
])
def test_tpu_errors(args, message):
  done = _run("tpu_vm.sh", *args, ok=False)
  assert done.returncode == 2 and message in done.stderr


def test_gpu_host_dry_runs():
  lines = _lines("gpu_host.sh", "sweep", "--gpus=0,1", "--dry_run", *SWEEP_ARGS)
  assert lines[0].startswith("cd ")
  assert lines[1] == ("nohup env CUDA_VISIBLE_DEVICES=0,1 XLA_PYTHON_CLIENT_PREALLOCATE=false "
                      "python -m sg_jax.sweep --config=configs/question.py --depths=2,4 "
                      "--seeds=10 --root=runs/qf > sg_jax_job.log 2>&1 &")
  install = _lines("gpu_host.sh", "install", "--dry_run")
  assert install[1:] == ["pip install -r requirements.txt", "pip install -U 'jax[cuda12]'",
                         "pip install -e ."]
  push = _lines("gpu_host.sh", "push", "--bucket=gs://b/sg/", "--dry_run")
  assert push[1] == "gcloud storage rsync --recursive runs gs://b/sg/runs"
  pull = _lines("gpu_host.sh", "pull", "--bucket=backup:/data/sg", "--dry_run")
  assert pull[1:] == ["mkdir -p runs", "rsync -a backup:/data/sg/runs/ runs/"]
  done = _run("gpu_host.sh", "train", "--gpus=a", "--dry_run", ok=False)
  assert done.returncode == 2 and "--gpus" in done.stderr


def test_gpu_host_bucket_mirrors_train_and_sweep():
  for job in ("train", "sweep"):
    lines = _lines("gpu_host.sh", job, "--bucket=gs://b/sg/", "--sync_every=60", "--dry_run",
                   *SWEEP_ARGS)
    assert len(lines) == 3 and lines[1].endswith("> sg_jax_job.log 2>&1 &"), lines
    loop = shlex.split(lines[2])
    assert loop[:3] == ["nohup", "bash", "-c"] and loop[4:] == ["sync_loop", "$!", ">",
                                                                "sg_jax_job_sync.log", "2>&1", "&"]
    sync = "gcloud storage rsync --recursive runs gs://b/sg/runs"
    assert "sleep 60" in loop[3] and loop[3].count(sync) == 2, loop[3]
  rsync = _lines("gpu_host.sh", "train", "--bucket=backup:/data/sg", "--log=j.log", "--dry_run",
                 *SWEEP_ARGS)
  assert "rsync -a runs/ backup:/data/sg/runs/" in rsync[2] and "> j_sync.log" in rsync[2]
  assert len(_lines("gpu_host.sh", "train", "--bucket=gs://b", "--sync_every=0", "--dry_run",
                    *SWEEP_ARGS)) == 2  # no mirror
  assert len(_lines("gpu_host.sh", "train", "--dry_run", *SWEEP_ARGS)) == 2
  done = _run("gpu_host.sh", "train", "--sync_every=x", "--dry_run", *SWEEP_ARGS, ok=False)
  assert done.returncode == 2 and "--sync_every" in done.stderr


# --- the sync loop, executed --------------------------------------------------------------------

JOB_SECONDS = 1.5
PERIOD = 1  # --sync_every of the executed loops
SLACK = 2.0  # seconds allowed beyond one period (process start-up, the stub's own run)


def _stub_path(tmp_path):
  """A PATH whose `python` is a fake job and whose `gcloud` records its calls; the environment."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "python").write_text(
      f"#!/bin/sh\nsleep {JOB_SECONDS}\ndate +%s.%N > '{tmp_path}/job_ended'\n")
  (bin_dir / "gcloud").write_text(f"#!/bin/sh\necho \"$(date +%s.%N) $*\" >> '{tmp_path}/calls'\n")
  for stub in bin_dir.iterdir():
    stub.chmod(0o755)
  return {**os.environ, "HOME": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _live_in_group(pgid):
  """Processes of process group `pgid` that are running (zombies excluded), from /proc."""
  live = 0
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    live += fields[2] == str(pgid) and fields[0] != "Z"
  return live


def _start(command, env, cwd):
  """Starts `bash -c command` in a new session, so that the processes it leaves behind form one
  process group whose end can be watched and which the test can kill."""
  return subprocess.Popen(["bash", "-c", command], env=env, cwd=cwd, start_new_session=True)


def _wait_until_gone(pgid, timeout):
  """Time (time.time()) at which group `pgid` has no live process, or None after `timeout` s."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if not _live_in_group(pgid):
      return time.time()
    time.sleep(0.05)
  return None


def _kill(*procs):
  for proc in procs:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()


def _check_syncs(tmp_path, loop_end, expected_args):
  assert loop_end is not None, "the sync loop did not end after the job"
  job_end = float((tmp_path / "job_ended").read_text())
  assert loop_end - job_end <= PERIOD + SLACK, (loop_end, job_end)
  calls = [line.split(" ", 1) for line in (tmp_path / "calls").read_text().splitlines()]
  assert all(args == expected_args for _, args in calls), calls
  assert float(calls[-1][0]) >= job_end  # the last sync ran after the job's last write
  assert len(calls) >= 2  # at least one while the job ran


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


@needs_proc
def test_tpu_sync_loop_ends_within_one_period_of_the_job(tmp_path):
  lines = _lines("tpu_vm.sh", "sweep", "--name=sg-qf", "--bucket=gs://b/sg",
                 f"--sync_every={PERIOD}", "--dry_run", *SWEEP_ARGS)
  job_cmd, sync_cmd = (next(w[len("--command="):] for w in shlex.split(l)
                            if w.startswith("--command=")) for l in lines)
  (tmp_path / "sg_jax").mkdir()
  env = _stub_path(tmp_path)
  job = _start(job_cmd, env, tmp_path)
  job.wait()  # returns at once: the job runs in the background
  loop = _start(sync_cmd, env, tmp_path)
  try:
    loop.wait()
    loop_end = _wait_until_gone(loop.pid, JOB_SECONDS + PERIOD + SLACK + 3)
  finally:
    _kill(job, loop)
  _check_syncs(tmp_path, loop_end, "storage rsync --recursive runs gs://b/sg/runs")
  assert "final sync done" in (tmp_path / "sg_jax_sync.log").read_text()


@needs_proc
def test_gpu_host_sync_loop_ends_within_one_period_of_the_job(tmp_path):
  env = _stub_path(tmp_path)
  command = shlex.join(["bash", os.path.join(ROOT, "launch", "gpu_host.sh"), "sweep",
                        "--bucket=gs://b/sg", f"--sync_every={PERIOD}",
                        f"--log={tmp_path / 'job.log'}", *SWEEP_ARGS])
  started = _start(command, env, tmp_path)
  try:
    assert started.wait(timeout=30) == 0
    loop_end = _wait_until_gone(started.pid, JOB_SECONDS + PERIOD + SLACK + 3)
  finally:
    _kill(started)
  _check_syncs(tmp_path, loop_end, "storage rsync --recursive runs gs://b/sg/runs")
  assert "final sync done" in (tmp_path / "job_sync.log").read_text()
