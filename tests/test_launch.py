"""Dry runs of the launch scripts (`launch/tpu_vm.sh`, `launch/gpu_host.sh`): the exact gcloud,
pip and python commands they print, and their errors on bad input. Nothing is executed."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
      "sg_jax && nohup python -m sg_jax.sweep --config=configs/question.py --depths=2,4 "
      "--seeds=10 --root=runs/qf > ~/sg_jax.log 2>&1 &'")
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
