"""Per-seed metrics: a long-format CSV table plus clu (TensorBoard) summaries.

`WORKDIR/metrics.csv` has the columns `step,seed,name,value`, one row per seed and metric. Every
`write` appends its whole block of rows with a single `os.write` on a file opened with O_APPEND
and then fsyncs, so a crash never leaves a torn line. On resume, `truncate_after(step)` drops rows
logged after the checkpoint the run resumes from, so a resumed run's table equals an
uninterrupted run's: rows are appended in step order, so those rows are the end of the file and
are cut off in place (no space needed, so it works on a full disk); a table out of step order is
rewritten through a temporary file and `os.replace`.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import shlex
import sys
from typing import Mapping, Sequence

import numpy as np

HEADER = "step,seed,name,value\n"


class _DropOrbaxErrors(logging.Filter):
  """Drops orbax's own ERROR records (each with a traceback, several per failed save or
  restore): sg_jax raises every failed checkpoint operation as one line naming the step, the
  path and the cause, so these repeat it at great length."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.ERROR
                and f"{os.sep}orbax{os.sep}" in (record.pathname or ""))


class _DropOrbaxOrphanTasks(logging.Filter):
  """Drops asyncio's 'Task exception was never retrieved' reports of orbax's write tasks: after
  one array of a save fails, orbax stops waiting for the others, and those that fail too are
  reported (with a traceback each) when they are garbage-collected. The save's failure is
  reported by sg_jax in one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not ("exception was never retrieved" in message
                and f"{os.sep}orbax{os.sep}" in message)


def setup_cli_logging() -> logging.Logger:
  """Command-line logging: library chatter (orbax, absl) at WARNING, sg_jax's own progress
  lines (logger "sg_jax") at INFO with a timestamp, on stderr; orbax's error tracebacks are
  dropped (`_DropOrbaxErrors`, `_DropOrbaxOrphanTasks`). Returns the sg_jax logger."""
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel

  absl_logging.set_verbosity(absl_logging.WARNING)
  for name, quiet in (("absl", _DropOrbaxErrors), ("asyncio", _DropOrbaxOrphanTasks)):
    logger = logging.getLogger(name)
    if not any(isinstance(f, quiet) for f in logger.filters):
      logger.addFilter(quiet())
  sg_log = logging.getLogger("sg_jax")
  if not sg_log.handlers:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    sg_log.addHandler(handler)
  sg_log.setLevel(logging.INFO)
  sg_log.propagate = False
  return sg_log


class MetricsTable:
  """Append-only `step,seed,name,value` CSV table (see module docstring)."""

  def __init__(self, path: str, enabled: bool = True):
    """Opens (creating if needed) the table; `enabled=False` (non-writer hosts) makes writes
    no-ops."""
    self.path = path
    self.enabled = enabled
    if enabled and (not os.path.exists(path) or os.path.getsize(path) == 0):
      self._append(HEADER)

  def _append(self, text: str) -> None:
    """Appends `text` with one write; on any failure (e.g. disk full) the file is cut back to
    its previous size, so no torn line remains, and OSError is raised naming the file."""
    data = text.encode()
    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      size = os.fstat(fd).st_size
      try:
        written = os.write(fd, data)
        if written != len(data):
          raise OSError(f"short write ({written} of {len(data)} bytes)")
        os.fsync(fd)
      except OSError as e:
        os.ftruncate(fd, size)
        raise OSError(e.errno, f"cannot append to {self.path}: {e.strerror or e}") from e
    finally:
      os.close(fd)

  def write(self, step: int, seeds: Sequence[int], metrics: Mapping[str, np.ndarray]) -> None:
    """Appends one row per (seed, metric); each value array is [num_seeds]."""
    if not self.enabled:
      return
    buf = io.StringIO()
    for name in sorted(metrics):
      values = np.asarray(metrics[name], dtype=np.float64).reshape(-1)
      for seed, value in zip(seeds, values):
        buf.write(f"{int(step)},{int(seed)},{name},{_fmt(value)}\n")
    self._append(buf.getvalue())

  def rows(self) -> list[dict]:
    """All rows as dicts with int step/seed and float value."""
    return read_table(self.path)

  def truncate_after(self, step: int) -> int:
    """Drops rows with step > `step`; returns how many were dropped.

    When those rows are the end of the file (always, for a table this class wrote), the file is
    cut there in place: one `ftruncate`, which needs no free space. Otherwise it is rewritten
    atomically.
    """
    if not self.enabled or not os.path.exists(self.path):
      return 0
    with open(self.path, "rb") as f:
      data = f.read()
    lines = data.decode().splitlines(True)
    cut = _suffix_after(lines, step)
    if cut is not None:
      offset, dropped = cut
      if dropped:
        fd = os.open(self.path, os.O_WRONLY)
        try:
          os.ftruncate(fd, offset)
          os.fsync(fd)
        finally:
          os.close(fd)
      return dropped
    keep = [HEADER]
    dropped = 0
    for line in lines[1:]:
      if not line.endswith("\n"):
        dropped += 1  # a torn final line cannot happen with _append, but never keep one
        continue
      if int(line.split(",", 1)[0]) > step:
        dropped += 1
      else:
        keep.append(line)
    if dropped:
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
      os.replace(tmp, self.path)
    return dropped


def _suffix_after(lines: list[str], step: int) -> tuple[int, int] | None:
  """(byte offset, row count) of the rows with step > `step` when they form the end of the
  table and every line is whole; None otherwise."""
  offset = 0
  first_after = None
  for i, line in enumerate(lines):
    if i > 0:
      if not line.endswith("\n"):
        return None
      after = int(line.split(",", 1)[0]) > step
      if after and first_after is None:
        first_after = (offset, i)
      elif not after and first_after is not None:
        return None
    offset += len(line.encode())
  if first_after is None:
    return offset, 0
  return first_after[0], len(lines) - first_after[1]


def _fmt(value: float) -> str:
  if math.isnan(value):
    return "nan"
  return repr(float(value))


def read_table(path: str) -> list[dict]:
  """Reads a `step,seed,name,value` CSV into a list of dicts (values as float)."""
  with open(path, newline="") as f:
    return [{"step": int(r["step"]), "seed": int(r["seed"]), "name": r["name"],
             "value": float(r["value"])} for r in csv.DictReader(f)]


class SummaryWriter:
  """clu metric writer (TensorBoard event files under WORKDIR/tensorboard) for per-seed scalars.

  Scalars are written as `name/seed_<id>` plus `name/mean` (over finite seeds). If clu's
  TensorBoard writer cannot be created (TensorFlow missing), falls back to logging only.
  """

  def __init__(self, logdir: str, enabled: bool = True):
    self._writer = None
    if enabled:
      try:
        from clu import metric_writers  # imports TensorFlow
        self._writer = metric_writers.create_default_writer(logdir, asynchronous=True)
      except Exception as e:  # pragma: no cover - depends on the environment
        logging.warning("TensorBoard summaries disabled (%s)", e)

  def write(self, step: int, seeds: Sequence[int], metrics: Mapping[str, np.ndarray]) -> None:
    if self._writer is None:
      return
    scalars = {}
    for name, values in metrics.items():
      values = np.asarray(values, dtype=np.float64).reshape(-1)
      for seed, v in zip(seeds, values):
        scalars[f"{name}/seed_{seed}"] = v
      finite = values[np.isfinite(values)]
      if finite.size:
        scalars[f"{name}/mean"] = float(finite.mean())
    self._writer.write_scalars(int(step), scalars)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()


# Columns of the final per-seed table (those the task's evaluation has).
SUMMARY_COLUMNS = ("in_domain/accuracy", "out_of_domain/accuracy", "in_domain/loss",
                   "out_of_domain/loss")


def format_summary(result: dict, workdir: str) -> str:
  """The closing lines of a run: a per-seed table of the final evaluation, the path of
  metrics.csv and the next commands.

  Args:
    result: as returned by `train.train_and_evaluate` ('step', 'seeds', 'eval' {name: [S]},
      'trained_steps').
    workdir: the run's --workdir.
  """
  columns = [c for c in SUMMARY_COLUMNS if c in result["eval"]]
  if result.get("trained_steps", 1) == 0:
    head = f"the run was already complete at step {result['step']}; final evaluation per seed:"
  else:
    head = f"finished at step {result['step']}; final evaluation per seed:"
  widths = [max(len(c), 8) for c in columns]
  lines = [head, "  seed  " + "  ".join(c.rjust(w) for c, w in zip(columns, widths))]
  for i, seed in enumerate(result["seeds"]):
    values = [float(np.asarray(result["eval"][c])[i]) for c in columns]
    cells = ["nan" if np.isnan(v) else f"{v:.4f}" for v in values]
    lines.append(f"  {seed:4d}  " + "  ".join(x.rjust(w) for x, w in zip(cells, widths)))
  if any(np.isnan(np.asarray(result["eval"][c], np.float64)).any() for c in columns):
    lines.append("  (nan: the seed diverged; see train/diverged_step in metrics.csv)")
  quoted = shlex.quote(workdir)
  lines += [f"metrics (every step, seed and metric): {os.path.join(workdir, 'metrics.csv')}",
            f"next: python -m sg_jax.analyze --workdir={quoted}",
            f"      python -m sg_jax.report --root={quoted}"]
  return "\n".join(lines)
