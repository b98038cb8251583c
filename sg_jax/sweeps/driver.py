"""The sweep behind `python -m sg_jax.sweep` (whose module docstring describes the options; its
flags and `main` stay there): the jobs, their finished-run check, and running or resuming them.
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
from typing import Any, Mapping, Sequence

from sg_jax import configlib
from sg_jax.records import fileio
from sg_jax.config import per_seed
from sg_jax.runtime import workdir_lock
from sg_jax.runtime.exit_codes import EXIT_PREEMPTED  # a job stopped by a signal: rerun resumes
from sg_jax.sweeps import grid as grid_lib


SWEEP_FILE = "sweep.json"


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def split_config_arg(config_arg: str) -> tuple[str, str]:
  """'configs/question.py:quick' -> ('configs/question.py', 'quick'); no ':' -> (file, '')."""
  if ":" in config_arg:
    path, string = config_arg.split(":", 1)
    return path, string
  return config_arg, ""


def job_config_arg(config_arg: str, depth: int | None, seeds: int) -> str:
  """The `--config` value of a job: the given string plus `depth=D,seeds=S` (`depth=D` only when
  the depth is a job axis; appended last, so they win over the same keys in the string)."""
  path, string = split_config_arg(config_arg)
  items = [s for s in string.split(",") if s.strip()]
  items += ([] if depth is None else [f"depth={depth}"]) + [f"seeds={seeds}"]
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


def _flag_value(value: Any) -> str:
  """A value as `--config.<field>=` text that ml_collections parses back to it."""
  if isinstance(value, str):
    return value
  if isinstance(value, bool):
    return "true" if value else "false"
  return repr(tuple(value)) if isinstance(value, (tuple, list)) else repr(value)


def _grid_flags(job_values: Mapping[str, Any], seed_values: Mapping[str, Sequence]
                ) -> list[tuple[str, Any]]:
  """(field, value) of the grid's `--config.<field>=<value>` flags of a job: its job-axis values
  other than the depth (which goes into the config string), then its per-seed values."""
  out = [(f, v) for f, v in job_values.items() if f != grid_lib.DEPTH_FIELD]
  return out + [(f, tuple(v)) for f, v in seed_values.items()]


def job_command(config_arg: str, job_values: Mapping[str, Any] | int, seeds: int, workdir: str,
                overrides: Sequence[str] = (), extra: Sequence[str] = (),
                seed_values: Mapping[str, Sequence] | None = None) -> list[str]:
  """argv of one training job (see module docstring).

  Args:
    job_values: {job-axis field: value} (an int: the depth alone, as `--depths`).
    seeds: the job's number of seeds S.
    seed_values: {seed-axis field: one value per seed, [S]}.
  """
  if not isinstance(job_values, Mapping):
    job_values = {grid_lib.DEPTH_FIELD: job_values}
  depth = job_values.get(grid_lib.DEPTH_FIELD)
  cmd = [sys.executable, "-m", "sg_jax.main",
         f"--config={job_config_arg(config_arg, depth, seeds)}", f"--workdir={workdir}"]
  cmd += [f"--config.{f}={v}" for f, v in map(parse_override, overrides)]
  cmd += [f"--config.{f}={_flag_value(v)}"
          for f, v in _grid_flags(job_values, seed_values or {})]
  return cmd + list(extra)


def resolve_config(config_arg: str, job_values: Mapping[str, Any] | int | None, seeds: int,
                   overrides: Sequence[str] = (),
                   seed_values: Mapping[str, Sequence] | None = None):
  """The config a job will train with (config file + string + depth/seeds + overrides + the
  grid's other job-axis values and per-seed values).

  Raises:
    ValueError: missing config file, no get_config in it, a bad override or grid field
      (naming it: an unknown field with the nearest known ones).
  """
  if job_values is not None and not isinstance(job_values, Mapping):
    job_values = {grid_lib.DEPTH_FIELD: job_values}
  job_values = job_values or {}
  path, _ = split_config_arg(config_arg)
  if not os.path.isfile(path):
    raise ValueError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path!r} has no get_config()")
  depth = job_values.get(grid_lib.DEPTH_FIELD)
  config = module.get_config(split_config_arg(job_config_arg(config_arg, depth, seeds))[1])
  for text in overrides:
    field, value = parse_override(text)
    # pylint: disable-next=protected-access
    configlib.set_field(config, field, configlib._parse_value(value))
  for field, value in _grid_flags(job_values, seed_values or {}):
    try:
      configlib.set_field(config, field, value)
    except ValueError as e:
      raise ValueError(f"--grid {field}: {e}") from None
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


class GridChanged(ValueError):
  """A sweep root's sweep.json records another grid than the one asked for."""


class SweepIndex:
  """`root/sweep.json`, rewritten atomically under a lock after every change."""

  def __init__(self, root: str, header: dict[str, Any]):
    self.path = os.path.join(root, SWEEP_FILE)
    self._lock = threading.Lock()
    old = read_index(root)
    # Jobs of earlier invocations that this one does not list are kept.
    self.data = {**header, "jobs": dict(old.get("jobs", {})), "created": old.get("created", _now()),
                 "updated": _now()}
    self.write()

  def update(self, key: str | int, **fields) -> None:
    with self._lock:
      self.data["jobs"].setdefault(str(key), {}).update(fields)
      self.data["updated"] = _now()
      self._write_locked()

  def write(self) -> None:
    with self._lock:
      self._write_locked()

  def _write_locked(self) -> None:
    fileio.write_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=False) + "\n")


def read_index(root: str) -> dict:
  """The sweep.json of `root` ({} when there is none).

  Raises:
    ValueError: a sweep.json that is not JSON (naming it).
  """
  path = os.path.join(root, SWEEP_FILE)
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from None


def check_same_grid(root: str, recorded: Mapping) -> None:
  """Refuses a grid other than the one `root/sweep.json` records (a sweep.json from before grids
  records its depths and seeds: `grid.legacy_record`).

  Raises:
    GridChanged: in one line naming both grids.
  """
  old = grid_lib.legacy_record(read_index(root))
  if old is not None and not grid_lib.same_grid(old, recorded):
    raise GridChanged(
        f"{os.path.join(root, SWEEP_FILE)} records the grid {grid_lib.describe(old)}, this "
        f"command asks for {grid_lib.describe(recorded)}: rerun with the recorded grid to "
        "resume, or give another --root")


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
    key, label = job["key"], job["label"]
    status = job["initial_status"]
    if self.stopping:  # the sweep was stopped before this job's turn
      return "pending" if status != "skipped" else status
    if status != "skipped":
      self.index.update(key, status="running", started=_now(), ended=None, returncode=None)
      print(f"[sweep] {label}: training -> {job['log']}", flush=True)
      rc = self._run(job["command"], os.path.join(self.root, job["log"]))
      step = latest_step(job["workdir_path"])
      status = ("finished" if rc == 0 else "preempted" if rc == EXIT_PREEMPTED else "failed")
      self.index.update(key, status=status, ended=_now(), returncode=rc, latest_step=step)
      print(f"[sweep] {label}: {status} (exit code {rc}, latest checkpoint {step})",
            flush=True)
    if status in ("finished", "skipped") and job["analyze_command"] and not self.stopping:
      self.index.update(key, analysis="running")
      rc = self._run(job["analyze_command"], os.path.join(self.root, job["analyze_log"]))
      if rc != 0 and self.stopping:
        # Stopped by the sweep's own signal (sg_jax.analyze exits 75; another command may die
        # of it): an interruption, redone by the rerun, not a failure.
        analysis, status = f"interrupted (exit code {rc}; rerun to redo)", "preempted"
      elif rc != 0:
        analysis, status = f"failed (exit code {rc})", "failed"
      else:
        analysis = "finished"
      self.index.update(key, analysis=analysis, analysis_ended=_now())
      print(f"[sweep] {label}: analysis {analysis} -> {job['analyze_log']}", flush=True)
    return status

  def run(self, jobs: list[dict]) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(self.parallel, 1)) as pool:
      return list(pool.map(self.run_job, jobs))


def grid_axes(config_arg: str, depths: Sequence[int], grid: Sequence[str],
              overrides: Sequence[str] = ()) -> list[tuple[str, tuple]]:
  """The sweep's axes [(field, values)]: `depths` (model.num_layers) first, then each `--grid`
  text; an int value of a float field becomes a float (`0` -> `0.0` for a weight decay).

  Raises:
    ValueError: no axis at all, a bad or repeated axis (`grid.parse_grid`), an unknown field
      (with the nearest known ones), or a field both on the grid and in `overrides`.
  """
  if not depths and not grid:
    raise ValueError("nothing to sweep: give --depths=D1,D2,... or --grid=section.field=v1,v2,...")
  axes = grid_lib.parse_grid(grid, depths)
  config = resolve_config(config_arg, None, 1)
  overridden = {parse_override(t)[0] for t in overrides}
  out = []
  for field, values in axes:
    if not configlib.has_field(config, field):
      raise ValueError(f"--grid: {configlib.unknown_field_message(config, field)}")
    if field in overridden:
      raise ValueError(f"{field} is both on the grid and in --override: give it in one place")
    old = per_seed.as_tuple(per_seed.get(config, field))
    floats = bool(old) and isinstance(old[0], float)
    out.append((field, tuple(float(v) if floats and isinstance(v, int)
                             and not isinstance(v, bool) else v for v in values)))
  return out


def _check_per_seed_counts(config, label: str) -> None:
  """Every per-seed field of a job's config holds one value or one per seed.

  Raises:
    ValueError: naming the job and the field (`per_seed.values`).
  """
  n = int(config.num_seeds)
  for field in grid_lib.seed_axis_fields():
    if configlib.has_field(config, field):
      try:
        per_seed.values(per_seed.get(config, field), n, field)
      except ValueError as e:
        raise ValueError(f"{label}: {e}") from None


def plan(config_arg: str, depths: Sequence[int], seeds: int, root: str,
         overrides: Sequence[str] = (), extra: Sequence[str] = (), analyze: bool = False,
         analyze_flags: Sequence[str] = (), grid: Sequence[str] = ()) -> list[dict]:
  """One job description per combination of the job axes (`sg_jax.sweeps.grid`): key, label,
  commands, workdir, log files, the seed-to-value map and whether it is finished.

  Args:
    depths: the `--depths` shorthand for a model.num_layers axis ([] for none).
    seeds: seeds per grid point.
    grid: `--grid` texts, 'section.field=v1,v2,...'.

  Raises:
    ValueError: bad depths/seeds/grid, a per-seed field whose value count is neither 1 nor the
      job's seeds, or a config that cannot be resolved.
  """
  if depths and any(not isinstance(d, int) or d < 1 for d in depths):
    raise ValueError(f"--depths must be positive integers, got {list(depths)}")
  if seeds < 1:
    raise ValueError(f"--seeds must be >= 1, got {seeds}")
  axes = grid_axes(config_arg, depths, grid, overrides)
  jobs = []
  for job in grid_lib.expand(axes, seeds):
    config = resolve_config(config_arg, job.job_values, job.num_seeds, overrides,
                            job.seed_values)
    only_depth = list(job.job_values) == [grid_lib.DEPTH_FIELD]
    label = f"depth {job.job_values[grid_lib.DEPTH_FIELD]}" if only_depth else f"job {job.name}"
    _check_per_seed_counts(config, label)
    workdir = os.path.join(root, job.name)
    finished = is_finished(workdir, config.train.num_steps)
    analyze_cmd = None
    if analyze:
      analyze_cmd = [sys.executable, "-m", "sg_jax.analyze", f"--workdir={workdir}",
                     *analyze_flags]
    first = int(config.get("first_seed", 0))
    jobs.append({"key": job.key, "label": label, "workdir": job.name, "workdir_path": workdir,
                 "num_steps": int(config.train.num_steps), "num_seeds": job.num_seeds,
                 "job_values": job.job_values,
                 "seed_map": {str(first + k): p for k, p in enumerate(job.points)},
                 "command": job_command(config_arg, job.job_values, job.num_seeds, workdir,
                                        overrides, extra, job.seed_values),
                 "analyze_command": analyze_cmd, "log": os.path.join("logs", f"{job.name}.log"),
                 "analyze_log": os.path.join("logs", f"{job.name}.analyze.log"),
                 "initial_status": "skipped" if finished else "pending"})
  return jobs


def run_sweep(config_arg: str, depths: Sequence[int], seeds: int, root: str, *,
              parallel: int = 1, overrides: Sequence[str] = (), extra: Sequence[str] = (),
              analyze: bool = False, analyze_flags: Sequence[str] = (),
              grid: Sequence[str] = ()) -> dict[str, str]:
  """Runs or resumes every job of the grid and writes `root/sweep.json`.

  Returns:
    {job key: final status} (key: the depth for a sweep over depths only, else the job's workdir
    name), status in finished | skipped | failed | preempted | pending (not started because the
    sweep was stopped).

  Raises:
    ValueError: as `plan`, or `parallel` < 1.
    GridChanged: `root/sweep.json` records another grid (or other seeds per grid point).
    workdir_lock.LockHeld: another sweep runs on `root` (`sg_jax.runtime.workdir_lock`).
  """
  if parallel < 1:
    raise ValueError(f"--parallel must be >= 1, got {parallel}")
  jobs = plan(config_arg, depths, seeds, root, overrides, extra, analyze, analyze_flags, grid)
  recorded = grid_lib.record(grid_axes(config_arg, depths, grid, overrides), seeds)
  os.makedirs(root, exist_ok=True)
  # One sweep per root (its sweep.json); each job's main and analyze lock their own workdir.
  with workdir_lock.locked(root, "sg_jax.sweep"):
    check_same_grid(root, recorded)
    os.makedirs(os.path.join(root, "logs"), exist_ok=True)
    header = {"config": config_arg, "grid": recorded, "seeds": seeds,
              "overrides": list(overrides), "extra_flags": list(extra), "parallel": parallel,
              "analyze": analyze, "analyze_flags": list(analyze_flags)}
    if [a["field"] for a in recorded["axes"]] == [grid_lib.DEPTH_FIELD]:
      header["depths"] = list(recorded["axes"][0]["values"])  # as sweeps over depths wrote
    return _run_jobs(jobs, root, header, parallel)


def _run_jobs(jobs, root, header, parallel) -> dict[str, str]:
  index = SweepIndex(root, header)
  for job in jobs:
    index.update(job["key"], workdir=job["workdir"], num_steps=job["num_steps"],
                 command=shlex.join(job["command"]), log=job["log"],
                 status=job["initial_status"])
    if job["job_values"] and list(job["job_values"]) != [grid_lib.DEPTH_FIELD]:
      index.update(job["key"], grid_values=job["job_values"])
    if any(job["seed_map"].values()):
      index.update(job["key"], seeds=job["seed_map"])
    if job["initial_status"] == "skipped":
      print(f"[sweep] {job['label']}: already finished at step {job['num_steps']}, "
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
      index.update(job["key"], status="pending")
  return {job["key"]: status for job, status in zip(jobs, statuses)}
