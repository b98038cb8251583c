"""`launch/slurm.sh`: the sbatch script its dry run prints (SBATCH lines, the srun command,
--multihost, the requeue logic), that script executed with stub `srun`/`scontrol`/`sbatch`
programs that record their calls (exit code 75 requeues, 0 ends, others fail), and its refusals
(node-local or relative workdirs, bad options). No SLURM and no JAX needed."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "launch", "slurm.sh")
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
WORKDIR = "/shared/sg/q6"  # never created: dry runs and stubbed jobs only name it
TRAIN = ["train", f"--workdir={WORKDIR}", "--nodes=2", "--gpus_per_node=4", "--partition=gpu",
         "--time=04:00:00", "--account=lab", "--sbatch=--qos=high"]
TRAIN_ARGS = ["--", "--config=configs/question.py:depth=6,seeds=64", "--config.train.num_steps=9"]


def _run(*args, ok=True, env=None):
  done = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=30,
                        cwd=ROOT, env=env)
  if ok:
    assert done.returncode == 0, done.stderr
  return done


def _dry(command, *args):
  return _run(command, "--dry_run", *args).stdout


def _sbatch_lines(script):
  return [l[len("#SBATCH "):] for l in script.splitlines() if l.startswith("#SBATCH ")]


def _srun_words(script):
  """The srun command of the script as words (without its trailing `|| rc=$?`)."""
  lines = [l for l in script.splitlines() if l.startswith("srun ")]
  assert len(lines) == 1, script
  assert lines[0].endswith(" || rc=$?")
  return shlex.split(lines[0][:-len(" || rc=$?")])


def test_train_dry_run_sbatch_lines_and_srun_command():
  script = _dry(*TRAIN, "--signal_secs=240", *TRAIN_ARGS)
  assert script.startswith("#!/bin/bash\n")
  assert _sbatch_lines(script) == [
      "--job-name=sg_jax-q6", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4",
      "--cpus-per-task=8", "--partition=gpu", "--account=lab", "--time=04:00:00",
      f"--output={WORKDIR}/slurm/%x-%j.out", "--open-mode=append", "--requeue",
      "--signal=TERM@240", "--qos=high"]
  assert _srun_words(script) == [
      "srun", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=8", "--kill-on-bad-exit=0",
      "python", "-m", "sg_jax.main", "--config=configs/question.py:depth=6,seeds=64",
      "--config.train.num_steps=9", f"--workdir={WORKDIR}", "--multihost"]
  lines = [l.strip() for l in script.splitlines()]
  assert f"cd {ROOT}" in lines
  # One process per node sees all 4 GPUs (not only the one numbered SLURM_LOCALID).
  assert "export JAX_LOCAL_DEVICE_IDS=0,1,2,3" in lines
  assert 'scontrol requeue "$SLURM_JOB_ID" && exit 0' in lines
  assert "if [[ $rc == 75 ]]; then" in lines


def test_defaults_and_cpu_nodes():
  script = _dry("train", "--workdir=/shared/runs/quick/", "--gpus_per_node=0", "--cpus_per_task=0",
                "--", "--config=configs/question.py:quick")
  assert _sbatch_lines(script) == [
      "--job-name=sg_jax-quick", "--nodes=1", "--ntasks-per-node=1",
      "--output=/shared/runs/quick/slurm/%x-%j.out", "--open-mode=append", "--requeue",
      "--signal=TERM@300"]
  assert "JAX_LOCAL_DEVICE_IDS" not in script
  assert _srun_words(script)[:4] == ["srun", "--nodes=1", "--ntasks-per-node=1",
                                     "--kill-on-bad-exit=0"]


def test_sweep_runs_on_one_node_without_multihost():
  script = _dry("sweep", "--root=/shared/sg/qf", "--gpus_per_node=2", "--job_name=qf",
                "--setup=module load cuda", "--", "--config=configs/question.py", "--depths=2,4",
                "--seeds=10", "--", "--allow_config_change")
  sbatch = _sbatch_lines(script)
  assert sbatch[:4] == ["--job-name=qf", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=2"]
  # The root goes before the nested `--`, whose flags sg_jax.sweep hands to sg_jax.main.
  assert _srun_words(script)[5:] == [
      "python", "-m", "sg_jax.sweep", "--config=configs/question.py", "--depths=2,4",
      "--seeds=10", "--root=/shared/sg/qf", "--", "--allow_config_change"]
  assert "--multihost" not in script and "JAX_LOCAL_DEVICE_IDS" not in script
  typed = _dry("train", "--workdir=/shared/x", "--gpus_per_node=a100:2", "--",
               "--config=configs/question.py")
  assert "--gpus-per-node=a100:2" in _sbatch_lines(typed)
  assert "export JAX_LOCAL_DEVICE_IDS=0,1" in typed.splitlines()
  lines = script.splitlines()
  assert lines.index("module load cuda") < lines.index("rc=0")
  assert "export XLA_PYTHON_CLIENT_PREALLOCATE=false" in lines


def _stubs(tmp_path):
  """A bin/ folder with srun, scontrol and sbatch stubs that append their call to calls.log."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "calls.log"
  body = {
      "srun": 'echo "JAX_LOCAL_DEVICE_IDS=${JAX_LOCAL_DEVICE_IDS:-} PWD=$PWD '
              'SETUP=${SG_TEST_SETUP:-}" >> "$STUB_LOG"\nexit "${STUB_SRUN_RC:-0}"',
      "scontrol": 'exit "${STUB_SCONTROL_RC:-0}"',
      "sbatch": 'echo "Submitted batch job 4242"',
  }
  for name, text in body.items():
    path = bin_dir / name
    path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "$STUB_LOG"\n{text}\n')
    path.chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STUB_LOG=str(log),
             SLURM_JOB_ID="4242")
  return env, log


@pytest.mark.parametrize("srun_rc, scontrol_rc, want_rc, requeued", [
    (75, 0, 0, True),     # checkpointed after SIGTERM: requeued
    (0, 0, 0, False),     # finished
    (1, 0, 1, False),     # failed: the job fails with the same code
    (75, 1, 75, True),    # requeue refused: the job fails with 75 (submit again to resume)
])
def test_generated_script_requeues_only_on_75(tmp_path, srun_rc, scontrol_rc, want_rc, requeued):
  script = _dry(*TRAIN, "--setup=export SG_TEST_SETUP=ran", *TRAIN_ARGS)
  job = tmp_path / "job.sbatch"
  job.write_text(script)
  env, log = _stubs(tmp_path)
  env.update(STUB_SRUN_RC=str(srun_rc), STUB_SCONTROL_RC=str(scontrol_rc))
  done = subprocess.run(["bash", str(job)], capture_output=True, text=True, timeout=30,
                        cwd=tmp_path, env=env)
  assert done.returncode == want_rc, done.stdout + done.stderr
  calls = log.read_text().splitlines()
  assert calls[0] == shlex.join(_srun_words(script))
  assert calls[1] == f"JAX_LOCAL_DEVICE_IDS=0,1,2,3 PWD={ROOT} SETUP=ran"
  assert calls[2:] == (["scontrol requeue 4242"] if requeued else [])


def test_generated_script_needs_slurm_job_id(tmp_path):
  job = tmp_path / "job.sbatch"
  job.write_text(_dry(*TRAIN, *TRAIN_ARGS))
  env, log = _stubs(tmp_path)
  del env["SLURM_JOB_ID"]
  done = subprocess.run(["bash", str(job)], capture_output=True, text=True, timeout=30, env=env)
  assert done.returncode != 0 and "run this script with sbatch" in done.stderr
  assert not log.exists()  # srun never ran


def test_submit_writes_the_script_into_the_workdir_and_calls_sbatch(tmp_path):
  # The workdir must not look node-local, so it cannot live in tmp_path (under /tmp here).
  parent = os.path.join(ROOT, ".pytest_cache")
  os.makedirs(parent, exist_ok=True)
  workdir = tempfile.mkdtemp(prefix="slurm_test_", dir=parent)
  try:
    env, log = _stubs(tmp_path)
    done = _run("train", f"--workdir={workdir}", "--", "--config=configs/question.py:quick",
                ok=False, env=env)
    if "is under" in done.stderr:
      pytest.skip(f"this checkout ({ROOT}) lies under a node-local prefix")
    assert done.returncode == 0, done.stderr
    files = os.listdir(os.path.join(workdir, "slurm"))
    assert len(files) == 1 and files[0].startswith(f"sg_jax-{os.path.basename(workdir)}-")
    path = os.path.join(workdir, "slurm", files[0])
    assert log.read_text().splitlines() == [f"sbatch {path}"]
    with open(path) as f:
      written = f.read()
    assert written == _dry("train", f"--workdir={workdir}", "--",
                           "--config=configs/question.py:quick")
    assert "Submitted batch job 4242" in done.stdout
  finally:
    shutil.rmtree(workdir)


@pytest.mark.parametrize("args, message", [
    (["train", "--workdir=/tmp/runs/q6"], "under /tmp, which is local to each node"),
    (["train", "--workdir=/dev/shm/q6"], "under /dev/shm"),
    (["train", "--workdir=/shared/../var/tmp/q6"], "under /var/tmp"),
    (["sweep", "--root=/tmp"], "under /tmp"),
    (["train", "--workdir=runs/q6"], "must be an absolute path"),
    (["train"], "needs --workdir=DIR"),
    (["sweep", "--workdir=/shared/x"], "sweep takes --root"),
    (["train", "--root=/shared/x"], "train takes --workdir"),
    (["sweep", "--root=/shared/x", "--nodes=2"], "sweep runs on one node"),
    (["train", "--workdir=/shared/x", "--nodes=0"], "--nodes"),
    (["train", "--workdir=/shared/x", "--gpus_per_node=two"], "--gpus_per_node"),
    (["train", "--workdir=/shared/x", "--gpus_per_node=a100:"], "--gpus_per_node"),
    (["train", "--workdir=/shared/x", "--time=4h"], "--time must be a SLURM time limit"),
    (["train", "--workdir=/shared/x", "--time=6:00"], "must exceed --signal_secs=300"),
    (["train", "--workdir=/shared/my runs"], "must not contain spaces"),
    (["train", "--workdir=/shared/x", "--bogus"], "unknown option --bogus"),
    (["frobnicate", "--workdir=/shared/x"], "unknown command"),
])
def test_errors(args, message):
  done = _run(*args, "--dry_run", "--", "--config=configs/question.py", ok=False)
  assert done.returncode == 2 and message in done.stderr, done.stderr
  assert done.stdout == ""


@pytest.mark.parametrize("job_args, message", [
    ([], "give the sg_jax.main arguments after --"),
    (["--", "--seeds=3"], "needs --config"),
    (["--", "--config=configs/question.py", "--workdir=/shared/other"], "before --"),
])
def test_job_argument_errors(job_args, message):
  done = _run("train", "--workdir=/shared/x", "--dry_run", *job_args, ok=False)
  assert done.returncode == 2 and message in done.stderr, done.stderr


def test_node_local_tmpdir_is_refused():
  env = dict(os.environ, TMPDIR="/scratch/node_tmp/")
  done = _run("train", "--workdir=/scratch/node_tmp/q6", "--dry_run", "--",
              "--config=configs/question.py", ok=False, env=env)
  assert done.returncode == 2 and "under /scratch/node_tmp" in done.stderr
  assert _run("train", "--workdir=/scratch/shared/q6", "--dry_run", "--",
              "--config=configs/question.py", env=env).returncode == 0


def test_jax_reads_the_slurm_variables_the_script_relies_on():
  """jax.distributed's SLURM detection reads srun's variables, and JAX_LOCAL_DEVICE_IDS (set by
  the script) overrides its one-GPU-per-process default; checked in jax's source, no import."""
  spec = importlib.util.find_spec("jax")
  if spec is None or not spec.submodule_search_locations:
    pytest.skip("jax is not installed")
  src = os.path.join(list(spec.submodule_search_locations)[0], "_src")
  with open(os.path.join(src, "clusters", "slurm_cluster.py")) as f:
    slurm = f.read()
  for var in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
              "SLURM_LOCALID"):
    assert f"'{var}'" in slurm, var
  with open(os.path.join(src, "distributed.py")) as f:
    assert "os.environ.get('JAX_LOCAL_DEVICE_IDS')" in f.read()
