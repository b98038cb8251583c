"""Run logging: command-line log setup, TensorBoard summaries and the closing summary.

The per-seed `step,seed,name,value` table (`WORKDIR/metrics.csv`) is `long_csv.LongCsv`, kept
here as `MetricsTable` (and `read_table`).
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import sys
import time
import traceback
from typing import Mapping, Sequence

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer import record_writer

from sg_jax.records import long_csv

# What TensorBoard's scalar dashboard looks for on each value (as tf.summary.scalar writes it).
_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name="", description="")


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
  reported (with a traceback each) when they are garbage-collected; a failed restore leaves its
  unread arrays' tasks the same way (their exceptions name orbax's OCDBT database). The
  failure is reported by sg_jax in one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if "exception was never retrieved" not in message:
      return True
    # A task names orbax's coroutine (its source path); a gathering future names only the failed
    # write, in a checkpoint's `.orbax-checkpoint-tmp` folder, and its traceback runs in orbax.
    tb = record.exc_info[2] if record.exc_info else None
    in_orbax = any(f"{os.sep}orbax{os.sep}" in frame.filename
                   for frame in traceback.extract_tb(tb)) if tb else False
    return not (in_orbax or f"{os.sep}orbax{os.sep}" in message
                or ".orbax-checkpoint-tmp" in message or "OCDBT database" in message)


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


# The `step,seed,name,value` table lives in `long_csv`; these names are kept for callers.
MetricsTable = long_csv.LongCsv
read_table = long_csv.read_table


class SummaryWriter:
  """TensorBoard event files (WORKDIR/tensorboard) of per-seed scalars, written without TensorFlow.

  Scalars are written as `name/seed_<id>` plus `name/mean` (over finite seeds), in the format
  TensorFlow 2's `tf.summary.scalar` writes (a float32 tensor summary tagged for TensorBoard's
  scalar plugin), with `tensorboard`'s own pure-Python record framing and protocol buffers: the
  training path never imports TensorFlow (clu's TensorBoard writer did, and with it TensorFlow's
  start-up notices). Each training session writes its own event file, named as TensorFlow names
  them; TensorBoard reads all of a folder's files together.
  """

  def __init__(self, logdir: str, enabled: bool = True):
    self._writer = None
    if enabled:
      os.makedirs(logdir, exist_ok=True)
      name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.sg_jax"
      self._writer = record_writer.RecordWriter(open(os.path.join(logdir, name), "wb"))
      self._write_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

  def _write_event(self, event) -> None:
    self._writer.write(event.SerializeToString())

  def write(self, step: int, seeds: Sequence[int], metrics: Mapping[str, np.ndarray]) -> None:
    """Writes `metrics` ({name: [S] values}, one per seed of `seeds`) at `step`."""
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
    summary = summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(
            tag=tag, metadata=_SCALAR_METADATA,
            tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[float(v)]))
        for tag, v in scalars.items()])
    self._write_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


# Columns of the final per-seed table (those the evaluation has: a masked LM has the
# preference and masked-token accuracy instead of the accuracy; docs/objectives.md).
SUMMARY_COLUMNS = ("in_domain/accuracy", "out_of_domain/accuracy", "in_domain/preference",
                   "out_of_domain/preference", "in_domain/masked_accuracy",
                   "out_of_domain/masked_accuracy", "in_domain/loss", "out_of_domain/loss")


def format_summary(result: dict, workdir: str) -> str:
  """The closing lines of a run: a per-seed table of the final evaluation, the path of
  metrics.csv and the next commands.

  Args:
    result: as returned by `train.train_and_evaluate` ('step', 'seeds', 'eval' {name: [S]},
      'trained_steps', and 'per_seed' {column: [S]}: options that differ by seed, such as a
      loss term's lambda, shown before the metrics).
    workdir: the run's --workdir.
  """
  options = result.get("per_seed", {})
  columns = list(options) + [c for c in SUMMARY_COLUMNS if c in result["eval"]]
  value_of = lambda c: options[c] if c in options else result["eval"][c]
  if result.get("trained_steps", 1) == 0:
    head = f"the run was already complete at step {result['step']}; final evaluation per seed:"
  else:
    head = f"finished at step {result['step']}; final evaluation per seed:"
  widths = [max(len(c), 8) for c in columns]
  lines = [head, "  seed  " + "  ".join(c.rjust(w) for c, w in zip(columns, widths))]
  for i, seed in enumerate(result["seeds"]):
    values = [float(np.asarray(value_of(c))[i]) for c in columns]
    cells = ["nan" if np.isnan(v) else f"{v:.4g}" if c in options else f"{v:.4f}"
             for c, v in zip(columns, values)]
    lines.append(f"  {seed:4d}  " + "  ".join(x.rjust(w) for x, w in zip(cells, widths)))
  if any(np.isnan(np.asarray(value_of(c), np.float64)).any() for c in columns):
    lines.append("  (nan: the seed diverged; see train/diverged_step in metrics.csv)")
  quoted = shlex.quote(workdir)
  lines += [f"metrics (every step, seed and metric): {os.path.join(workdir, 'metrics.csv')}",
            f"next: python -m sg_jax.analyze --workdir={quoted}",
            f"      python -m sg_jax.report --root={quoted}"]
  return "\n".join(lines)


def logged_eval(table: MetricsTable, step: int, seeds: list[int]) -> dict:
  """The evaluation rows of `step` already in `table` (metrics.csv), as {name: [S]} ({} if
  incomplete: some metric lacks a seed).

  Read by every process of a multi-process run (process 0 wrote it), so that all of them decide
  alike whether to evaluate again: an evaluation is a collective step."""
  if not os.path.exists(table.path):
    return {}
  values: dict = {}
  for row in table.rows():
    if row["step"] == step and row["name"].startswith(("in_domain/", "out_of_domain/")):
      values.setdefault(row["name"], {})[row["seed"]] = row["value"]
  if not values or any(set(v) != set(seeds) for v in values.values()):
    return {}
  return {name: np.asarray([v[s] for s in seeds]) for name, v in values.items()}


def format_values(values) -> str:
  """'[v0 v1 ...]' one value per seed, 3 decimals (log lines)."""
  return "[" + " ".join(f"{float(v):.3f}" for v in np.asarray(values).reshape(-1)) + "]"


def format_metrics(metrics: dict) -> str:
  """'name [v0 v1 ...]  name [...]' of {name: [S]} (log lines)."""
  return "  ".join(f"{k} {format_values(v)}" for k, v in metrics.items())
