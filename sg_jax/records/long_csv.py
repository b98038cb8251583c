"""The long-format `step,seed,name,value` CSV tables: read, append and truncate.

`WORKDIR/metrics.csv` (training and evaluation) and `WORKDIR/analysis.csv` (`sg_jax.analyze`)
hold one row per step, seed and metric. `LongCsv` appends each block of rows with a single
`os.write` on a file opened with O_APPEND and then fsyncs, cutting the file back to its previous
size if the write fails, so a crash or a full disk never leaves a torn line. On resume,
`truncate_after(step)` drops the rows logged after the checkpoint the run resumes from, so a
resumed run's table equals an uninterrupted run's: rows are appended in step order, so those rows
are the end of the file and are cut off in place (no space needed, so it works on a full disk);
a table out of step order is rewritten atomically (`fileio.write_atomic`).

Readers skip what a crash or an older writer may have left: the header, lines without four
fields or with a non-numeric step, seed or value, and an unterminated last line.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from sg_jax.records import fileio

HEADER = "step,seed,name,value\n"
Row = tuple[int, int, str, float]  # (step, seed, name, value)


def _parse(lines: Iterable[str]) -> list[Row]:
  rows = []
  for r in csv.reader(lines):
    if len(r) != 4:
      continue
    try:
      rows.append((int(r[0]), int(r[1]), r[2], float(r[3])))
    except ValueError:  # the header, or a malformed line
      continue
  return rows


def read_rows(path: str, missing_ok: bool = False) -> list[Row]:
  """The rows of a `step,seed,name,value` CSV in file order (see the module docstring for what
  is skipped).

  Args:
    path: the CSV file.
    missing_ok: return [] when `path` does not exist instead of raising.

  Returns:
    [(step, seed, name, value)], step and seed as int, value as float (nan kept).

  Raises:
    FileNotFoundError: neither `path` nor `path.gz` (an exported run's copy, read the same)
      exists, and not `missing_ok`.
    ValueError: the file is not UTF-8 text (naming it).
  """
  if missing_ok and fileio.stored_path(path) is None:
    return []
  try:
    text = fileio.read_text(path)  # `path`, or its exported copy `path.gz`
  except UnicodeDecodeError as e:  # one line naming the file, not a bare codec error
    raise ValueError(f"{path} is not a UTF-8 text table ({e.reason} at byte {e.start}); "
                     "restore it or remove it to recompute it") from None
  lines = text.split("\n")
  lines.pop()  # "" after the last newline, else a line cut by a crash (its value may be cut)
  return _parse(lines)


def read_keys(path: str) -> set[tuple[int, int, str]]:
  """(step, seed, name) of every row of a `step,seed,name,value` CSV; empty when it is missing.

  Raises:
    OSError: `path` exists but cannot be read.
  """
  return {(step, seed, name) for step, seed, name, _ in read_rows(path, missing_ok=True)}


def read_table(path: str) -> list[dict]:
  """The rows of a `step,seed,name,value` CSV as dicts.

  Returns:
    [{'step': int, 'seed': int, 'name': str, 'value': float}] in file order.

  Raises:
    FileNotFoundError: `path` does not exist.
  """
  return [{"step": step, "seed": seed, "name": name, "value": value}
          for step, seed, name, value in read_rows(path)]


def format_rows(rows: Iterable[Row]) -> str:
  """CSV lines (each ending in "\\n") of (step, seed, name, value) rows; values as `repr`, so
  they read back bit-identical (nan as `nan`)."""
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  for step, seed, name, value in rows:
    writer.writerow((int(step), int(seed), name, repr(float(value))))
  return buf.getvalue()


class LongCsv:
  """An append-only `step,seed,name,value` table on disk (see the module docstring)."""

  def __init__(self, path: str, enabled: bool = True):
    """Opens the table, creating it with its header if it is missing or empty.

    An unterminated last line (left by a crash of an older writer) is cut off, so the next
    rows start on a line of their own.

    Args:
      path: the CSV file.
      enabled: False (non-writer hosts of a multi-host run) makes every write a no-op.

    Raises:
      OSError: the file cannot be created or written, naming it.
    """
    self.path = path
    self.enabled = enabled
    if not enabled:
      return
    if not os.path.exists(path) or os.path.getsize(path) == 0:
      self._append(HEADER)
      return
    with open(path, "rb") as f:
      data = f.read()
    if not data.endswith(b"\n"):
      fd = os.open(path, os.O_WRONLY)
      try:
        os.ftruncate(fd, data.rfind(b"\n") + 1)
        os.fsync(fd)
      finally:
        os.close(fd)
      if os.path.getsize(path) == 0:
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

  def append(self, rows: Iterable[Row]) -> None:
    """Appends (step, seed, name, value) rows in one write.

    Raises:
      OSError: as `_append` (the table is left as it was).
    """
    if self.enabled:
      text = format_rows(rows)
      if text:
        self._append(text)

  def write(self, step: int, seeds: Sequence[int], metrics: Mapping[str, np.ndarray]) -> None:
    """Appends one row per (seed, metric), metrics in name order, in one write.

    Args:
      step: the training step.
      seeds: seed ids, [num_seeds].
      metrics: {name: values [num_seeds]}.

    Raises:
      OSError: as `append`.
    """
    if not self.enabled:
      return
    self.append((step, seed, name, value) for name in sorted(metrics)
                for seed, value in zip(seeds, np.asarray(metrics[name],
                                                         dtype=np.float64).reshape(-1)))

  def rows(self) -> list[dict]:
    """All rows as dicts with int step/seed and float value (`read_table`)."""
    return read_table(self.path)

  def truncate_after(self, step: int) -> int:
    """Drops rows with step > `step`; returns how many were dropped.

    When those rows are the end of the file (always, for a table this class wrote), the file is
    cut there in place: one `ftruncate`, which needs no free space. Otherwise it is rewritten
    atomically.

    Raises:
      OSError: the file cannot be cut or rewritten (the old table is left as it was).
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
      fileio.write_atomic(self.path, "".join(keep))
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
