r"""Sweep driver: one training job per depth, run or resumed one after another (or N at once).

  python -m sg_jax.sweep --config=configs/question.py --depths=2,4,6,8,10 --seeds=10 \
      --root=runs/qf
  python -m sg_jax.sweep --config=configs/question.py:quick --depths=1,2 --seeds=4 \
      --root=runs/qf_quick --override=model.d_model=64 --override=train.num_steps=600 --analyze
  python -m sg_jax.sweep ... -- --allow_config_change     # flags after `--` go to sg_jax.main

Depth D runs as the subprocess

  python -m sg_jax.main --config=<file>:<config string>,depth=D,seeds=S \
      --workdir=<root>/depth<D> [--config.<override> ...] [flags after --]

so every job is an ordinary `sg_jax.main` run: rerunning the sweep resumes each unfinished job
from its latest checkpoint, and a depth whose latest checkpoint step equals the requested
`train.num_steps` (read with `sg_jax.checkpointing.all_steps` and the workdir's `config.json`) is
skipped. Jobs are queued on this machine (`--parallel=1`, the default, runs one at a time: each
job already uses every local device through its seed axis); `--parallel=N` runs N at once.
`--analyze` runs `python -m sg_jax.analyze --workdir=<root>/depth<D>` after each finished depth
(extra analysis flags through `--analyze_flag`).

The sweep index `root/sweep.json` records the config, depths, seeds, overrides, analysis flags
and, per depth, the workdir (relative to the root), the exact command, its status (pending,
running, finished, skipped, failed, preempted), return code, latest checkpoint step, log file,
analysis status (finished, failed, interrupted) and UTC timestamps. It
is rewritten atomically after every change, so it can be read while the sweep runs. Each job's
output goes to `root/logs/depth<D>.log` (`.analyze.log` for the analysis).

Exit code: 0 when every depth finished, 75 (like `sg_jax.main`) when the sweep was interrupted by
SIGTERM/SIGINT (rerun the same command to resume; an analysis stopped midway is redone), 1 when a
job failed.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from typing import Any, Sequence

from absl import app
from absl import flags
from absl import logging

from sg_jax import configlib
from sg_jax import fileio
from sg_jax.runtime import workdir_lock
from sg_jax.runtime.exit_codes import EXIT_PREEMPTED  # a job stopped by a signal: rerun resumes

SWEEP_FILE = "sweep.json"

FLAGS = flags.FLAGS


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def split_config_arg(config_arg: str) -> tuple[str, str]:
  """'configs/question.py:quick' -> ('configs/question.py', 'quick'); no ':' -> (file, '')."""
  if ":" in config_arg:
    path, string = config_arg.split(":", 1)
    return path, string
  return config_arg, ""


def job_config_arg(config_arg: str, depth: int, seeds: int) -> str:
  """The `--config` value of depth `depth`'s job: the given string plus `depth=D,seeds=S`
  (appended last, so they win over the same keys in the string)."""
  path, string = split_config_arg(config_arg)
  items = [s for s in string.split(",") if s.strip()] + [f"depth={depth}", f"seeds={seeds}"]
  return f"{path}:{','.join(items)}"


def parse_override(text: str) -> tuple[str, str]:
  """'train.num_steps=300' -> ('train.num_steps', '300').

  Raises:
    ValueError: no '=' or an empty field name.
  """
  text = text.strip()
  if text.startswith("--config."):
    text = text[len("--config."):]
  if "=" not in text or not text.split("=", 1)[0]:
    raise ValueError(f"--override must look like section.field=value, got {text!r}")
  field, value = text.split("=", 1)
  return field.strip(), value.strip()


def job_command(config_arg: str, depth: int, seeds: int, workdir: str,
                overrides: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
  """argv of depth `depth`'s training job (see module docstring)."""
  cmd = [sys.executable, "-m", "sg_jax.main",
         f"--config={job_config_arg(config_arg, depth, seeds)}", f"--workdir={workdir}"]
  cmd += [f"--config.{f}={v}" for f, v in map(parse_override, overrides)]
  return cmd + list(extra)


def resolve_config(config_arg: str, depth: int, seeds: int, overrides: Sequence[str] = ()):
  """The config a job will train with (config file + string + depth/seeds + overrides).

  Raises:
    ValueError: missing config file, no get_config in it, or a bad override (naming it).
  """
  path, _ = split_config_arg(config_arg)
  if not os.path.isfile(path):
    raise ValueError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path!r} has no get_config()")
  config = module.get_config(split_config_arg(job_config_arg(config_arg, depth, seeds))[1])
  for text in overrides:
    field, value = parse_override(text)
    # pylint: disable-next=protected-access
    configlib.set_field(config, field, configlib._parse_value(value))
  return config


def latest_step(workdir: str) -> int | None:
  """Latest committed checkpoint step of `workdir` (None when there is none)."""
  # Not for a circle: checkpointing imports orbax and JAX (seconds), which the sweep driver
  # needs only here; it runs no JAX itself (its jobs are subprocesses).
  from sg_jax import checkpointing  # pylint: disable=import-outside-toplevel

  steps = checkpointing.all_steps(workdir)
  return steps[-1] if steps else None


def is_finished(workdir: str, num_steps: int) -> bool:
  """True when `workdir` holds a config.json with `train.num_steps == num_steps` and a checkpoint
  at that step (a run asked to train longer than it did is not finished)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    saved = json.load(f)
  if saved.get("train", {}).get("num_steps") != num_steps:
    return False
  return latest_step(workdir) == num_steps


class SweepIndex:
  """`root/sweep.json`, rewritten atomically under a lock after every change."""

  def __init__(self, root: str, header: dict[str, Any]):
    self.path = os.path.join(root, SWEEP_FILE)
    self._lock = threading.Lock()
    old = {}
    if os.path.exists(self.path):
      with open(self.path) as f:
        old = json.load(f)
    # Depths of earlier invocations that this one does not list are kept.
    self.data = {**header, "jobs": dict(old.get("jobs", {})), "created": old.get("created", _now()),
                 "updated": _now()}
    self.write()

  def update(self, depth: int, **fields) -> None:
    with self._lock:
      self.data["jobs"].setdefault(str(depth), {}).update(fields)
      self.data["updated"] = _now()
      self._write_locked()

  def write(self) -> None:
    with self._lock:
      self._write_locked()

  def _write_locked(self) -> None:
    fileio.write_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=False) + "\n")


class Runner:
  """Runs the jobs (training, then optionally analysis) with at most `parallel` at once."""

  def __init__(self, index: SweepIndex, root: str, parallel: int):
    self.index = index
    self.root = root
    self.parallel = parallel
    self.stopping = False
    self._procs: set[subprocess.Popen] = set()
    self._lock = threading.Lock()

  def _run(self, cmd: list[str], log_path: str) -> int:
    with self._lock:
      if self.stopping:
        return EXIT_PREEMPTED
      with open(log_path, "ab") as log_file:
        log_file.write(f"\n# {_now()} {shlex.join(cmd)}\n".encode())
        log_file.flush()
        # Own process group: a Ctrl-C in the terminal reaches the sweep only, which forwards it.
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
      self._procs.add(proc)
    try:
      return proc.wait()
    finally:
      with self._lock:
        self._procs.discard(proc)

  def stop(self, signum: int) -> None:
    """Forwards `signum` to every running job (each checkpoints and exits 75)."""
    with self._lock:
      self.stopping = True
      for proc in self._procs:
        try:
          proc.send_signal(signum)
        except ProcessLookupError:
          pass

  def run_job(self, job: dict) -> str:
    depth = job["depth"]
    status = job["initial_status"]
    if self.stopping:  # the sweep was stopped before this job's turn
      return "pending" if status != "skipped" else status
    if status != "skipped":
      self.index.update(depth, status="running", started=_now(), ended=None, returncode=None)
      print(f"[sweep] depth {depth}: training -> {job['log']}", flush=True)
      rc = self._run(job["command"], os.path.join(self.root, job["log"]))
      step = latest_step(job["workdir_path"])
      status = ("finished" if rc == 0 else "preempted" if rc == EXIT_PREEMPTED else "failed")
      self.index.update(depth, status=status, ended=_now(), returncode=rc, latest_step=step)
      print(f"[sweep] depth {depth}: {status} (exit code {rc}, latest checkpoint {step})",
            flush=True)
    if status in ("finished", "skipped") and job["analyze_command"] and not self.stopping:
      self.index.update(depth, analysis="running")
      rc = self._run(job["analyze_command"], os.path.join(self.root, job["analyze_log"]))
      if rc != 0 and self.stopping:
        # Stopped by the sweep's own signal (sg_jax.analyze exits 75; another command may die
        # of it): an interruption, redone by the rerun, not a failure.
        analysis, status = f"interrupted (exit code {rc}; rerun to redo)", "preempted"
      elif rc != 0:
        analysis, status = f"failed (exit code {rc})", "failed"
      else:
        analysis = "finished"
      self.index.update(depth, analysis=analysis, analysis_ended=_now())
      print(f"[sweep] depth {depth}: analysis {analysis} -> {job['analyze_log']}", flush=True)
    return status

  def run(self, jobs: list[dict]) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(self.parallel, 1)) as pool:
      return list(pool.map(self.run_job, jobs))


def plan(config_arg: str, depths: Sequence[int], seeds: int, root: str,
         overrides: Sequence[str] = (), extra: Sequence[str] = (), analyze: bool = False,
         analyze_flags: Sequence[str] = ()) -> list[dict]:
  """One job description per depth: commands, workdir, log files and whether it is finished.

  Raises:
    ValueError: bad depths/seeds, or a config that cannot be resolved.
  """
  if not depths or any(d < 1 for d in depths):
    raise ValueError(f"--depths must be positive integers, got {list(depths)}")
  if len(set(depths)) != len(depths):
    raise ValueError(f"--depths lists a depth twice: {list(depths)}")
  if seeds < 1:
    raise ValueError(f"--seeds must be >= 1, got {seeds}")
  jobs = []
  for depth in depths:
    config = resolve_config(config_arg, depth, seeds, overrides)
    name = f"depth{depth}"
    workdir = os.path.join(root, name)
    finished = is_finished(workdir, config.train.num_steps)
    analyze_cmd = None
    if analyze:
      analyze_cmd = [sys.executable, "-m", "sg_jax.analyze", f"--workdir={workdir}",
                     *analyze_flags]
    jobs.append({"depth": depth, "workdir": name, "workdir_path": workdir,
                 "num_steps": int(config.train.num_steps),
                 "command": job_command(config_arg, depth, seeds, workdir, overrides, extra),
                 "analyze_command": analyze_cmd, "log": os.path.join("logs", f"{name}.log"),
                 "analyze_log": os.path.join("logs", f"{name}.analyze.log"),
                 "initial_status": "skipped" if finished else "pending"})
  return jobs


def run_sweep(config_arg: str, depths: Sequence[int], seeds: int, root: str, *,
              parallel: int = 1, overrides: Sequence[str] = (), extra: Sequence[str] = (),
              analyze: bool = False, analyze_flags: Sequence[str] = ()) -> dict[int, str]:
  """Runs or resumes every depth's job and writes `root/sweep.json`.

  Returns:
    {depth: final status}, status in finished | skipped | failed | preempted | pending (not
    started because the sweep was stopped).

  Raises:
    ValueError: as `plan`, or `parallel` < 1.
    workdir_lock.LockHeld: another sweep runs on `root` (`sg_jax.runtime.workdir_lock`).
  """
  if parallel < 1:
    raise ValueError(f"--parallel must be >= 1, got {parallel}")
  jobs = plan(config_arg, depths, seeds, root, overrides, extra, analyze, analyze_flags)
  os.makedirs(root, exist_ok=True)
  # One sweep per root (its sweep.json); each job's main and analyze lock their own workdir.
  with workdir_lock.locked(root, "sg_jax.sweep"):
    os.makedirs(os.path.join(root, "logs"), exist_ok=True)
    return _run_jobs(jobs, config_arg, depths, seeds, root, parallel=parallel,
                     overrides=overrides, extra=extra, analyze=analyze,
                     analyze_flags=analyze_flags)


def _run_jobs(jobs, config_arg, depths, seeds, root, *, parallel, overrides, extra, analyze,
              analyze_flags) -> dict[int, str]:
  index = SweepIndex(root, {
      "config": config_arg, "depths": list(depths), "seeds": seeds,
      "overrides": list(overrides), "extra_flags": list(extra), "parallel": parallel,
      "analyze": analyze, "analyze_flags": list(analyze_flags)})
  for job in jobs:
    index.update(job["depth"], workdir=job["workdir"], num_steps=job["num_steps"],
                 command=shlex.join(job["command"]), log=job["log"],
                 status=job["initial_status"])
    if job["initial_status"] == "skipped":
      print(f"[sweep] depth {job['depth']}: already finished at step {job['num_steps']}, "
            "skipping", flush=True)
  runner = Runner(index, root, parallel)
  handlers = {}

  def forward(signum, frame):
    del frame
    print(f"[sweep] signal {signum}: stopping jobs (they checkpoint and exit)", flush=True)
    runner.stop(signum)

  if threading.current_thread() is threading.main_thread():
    for sig in (signal.SIGTERM, signal.SIGINT):
      handlers[sig] = signal.signal(sig, forward)
  try:
    statuses = runner.run(jobs)
  finally:
    for sig, old in handlers.items():
      signal.signal(sig, old)
  for job, status in zip(jobs, statuses):
    if status == "pending":  # never started because the sweep was stopped
      index.update(job["depth"], status="pending")
  return {job["depth"]: status for job, status in zip(jobs, statuses)}


def define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importing this module never clashes
  with the flags of sg_jax.main or sg_jax.analyze)."""
  flags.DEFINE_string(
      "config", None, "Config file with an optional config string, e.g. configs/question.py or "
      "configs/question.py:quick,heads=4. depth=D,seeds=S are appended per job.")
  flags.DEFINE_list("depths", "2,4,6,8,10", "Comma-separated depths (num_layers).")
  flags.DEFINE_integer("seeds", 10, "Seeds per depth (config num_seeds).")
  flags.DEFINE_string("root", None, "Sweep folder; depth D trains in <root>/depth<D>.")
  flags.DEFINE_integer("parallel", 1, "Jobs run at once on this machine.")
  flags.DEFINE_multi_string(
      "override", [], "Config override section.field=value, passed as --config.section.field=value "
      "to every job (repeatable).")
  flags.DEFINE_bool("analyze", False, "Run sg_jax.analyze after each finished depth.")
  flags.DEFINE_multi_string(
      "analyze_flag", [], "Extra flag for sg_jax.analyze, e.g. --analyze_flag=--num_sentences=200.")
  flags.DEFINE_bool("dry_run", False, "Print the job commands and exit.")
  flags.mark_flags_as_required(["config", "root"])


def main(argv):
  logging.set_verbosity(logging.WARNING)  # orbax chatter when reading checkpoint steps
  extra = list(argv[1:])
  try:
    depths = [int(d) for d in FLAGS.depths]
  except ValueError:
    sys.exit(f"error: --depths must be comma-separated integers, got {FLAGS.depths}")
  try:
    if FLAGS.dry_run:
      for job in plan(FLAGS.config, depths, FLAGS.seeds, FLAGS.root, FLAGS.override, extra,
                      FLAGS.analyze, FLAGS.analyze_flag):
        state = "finished, would skip" if job["initial_status"] == "skipped" else "would run"
        print(f"# depth {job['depth']} ({state})")
        print(shlex.join(job["command"]))
        if job["analyze_command"]:
          print(shlex.join(job["analyze_command"]))
      return
    statuses = run_sweep(FLAGS.config, depths, FLAGS.seeds, FLAGS.root,
                         parallel=FLAGS.parallel, overrides=FLAGS.override, extra=extra,
                         analyze=FLAGS.analyze, analyze_flags=FLAGS.analyze_flag)
  except (ValueError, workdir_lock.LockHeld) as e:
    sys.exit(f"error: {e}")
  print(f"[sweep] done: {statuses}; index: {os.path.join(FLAGS.root, SWEEP_FILE)}")
  values = set(statuses.values())
  if "failed" in values:
    sys.exit(1)
  if values - {"finished", "skipped"}:
    sys.exit(EXIT_PREEMPTED)


if __name__ == "__main__":
  define_flags()
  app.run(main)
