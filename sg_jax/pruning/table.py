"""`WORKDIR/pruning.csv`: `step,seed,sparsity,pruning_seed,name,value` rows, and the masks file.

Rows are appended with `long_csv.LongCsv`'s single-write append (a crash or a full disk never
leaves a torn line); a run is done when its `achieved_sparsity` row is there, so a rerun skips
it. The full model's rows (the reference of the subnetworks) have sparsity 0 and pruning_seed
`FULL_MODEL` (-1). The binarised masks of a checkpoint's runs are in
`WORKDIR/pruning/masks_step<N>.npz` (`save_masks`); a table of another name (prune's
`--output`, e.g. `pruning_gen.csv`) keeps its own, `WORKDIR/pruning/pruning_gen/masks_step<N>.npz`,
so pruning with another objective never replaces the masks of the default table.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Iterable

import numpy as np

from sg_jax.records import fileio
from sg_jax.records import long_csv

HEADER = "step,seed,sparsity,pruning_seed,name,value\n"
MARKER = "achieved_sparsity"  # the row that marks a run as done
FULL_MODEL = -1               # pruning_seed of the full model's rows
Row = tuple[int, int, float, int, str, float]
RunKey = tuple[int, int, float, int]  # (step, seed, sparsity, pruning_seed)


def level_key(sparsity: float) -> float:
  """The sparsity as it identifies a run (rounded to 6 decimals, as the CSV reads back)."""
  return round(float(sparsity), 6)


def read_parsed_rows(path: str, num_fields: int, parse) -> list:
  """`parse(fields)` of each row of a long CSV with `num_fields` columns, in file order ([] when
  the file is missing); the header, malformed lines (wrong width, `parse` raising ValueError)
  and an unterminated last line are skipped."""
  if fileio.stored_path(path) is None:  # `path`, or its exported copy `path.gz`
    return []
  lines = fileio.read_text(path).split("\n")
  lines.pop()  # "" after the last newline, else a cut line
  rows = []
  for r in csv.reader(lines):
    if len(r) != num_fields:
      continue
    try:
      rows.append(parse(r))
    except ValueError:
      continue
  return rows


def read_rows(path: str) -> list[Row]:
  """Rows of a pruning CSV in file order ([] when it is missing); the header, malformed lines
  and an unterminated last line are skipped."""
  return read_parsed_rows(path, 6, lambda r: (int(r[0]), int(r[1]), float(r[2]), int(r[3]),
                                              r[4], float(r[5])))


def done_runs(path: str) -> set[RunKey]:
  """(step, seed, sparsity, pruning_seed) of every run with its `achieved_sparsity` row."""
  return {(s, seed, level_key(sp), ps) for s, seed, sp, ps, name, _ in read_rows(path)
          if name == MARKER}


def done_full_models(path: str) -> set[tuple[int, int]]:
  """(step, seed) whose full-model rows are written."""
  return {(s, seed) for s, seed, _, ps, _, _ in read_rows(path) if ps == FULL_MODEL}


def format_rows(rows: Iterable[Row]) -> str:
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  for step, seed, sparsity, pruning_seed, name, value in rows:
    writer.writerow((int(step), int(seed), repr(level_key(sparsity)), int(pruning_seed), name,
                     repr(float(value))))
  return buf.getvalue()


class PruningCsv(long_csv.LongCsv):
  """The append-only pruning table (the atomic appends of `long_csv.LongCsv`, six columns)."""

  def __init__(self, path: str):
    """Opens `path`, creating it with its header when missing or empty.

    Raises:
      OSError: the file cannot be created or written.
    """
    if not os.path.exists(path) or os.path.getsize(path) == 0:
      self.path, self.enabled = path, True
      self._append(HEADER)
    super().__init__(path)

  def append(self, rows: Iterable[Row]) -> None:  # pylint: disable=arguments-renamed
    """Appends six-column rows in one write."""
    text = format_rows(rows)
    if text:
      self._append(text)


DEFAULT_TABLE = "pruning.csv"


def table_stem(table_name: str) -> str:
  """A table's name without `.csv` ('pruning_gen.csv' -> 'pruning_gen')."""
  return os.path.splitext(os.path.normpath(table_name))[0]


def masks_path(workdir: str, step: int, table_name: str = DEFAULT_TABLE) -> str:
  """The masks file of `step` of the table `table_name` (relative to `workdir`):
  `pruning/masks_step<N>.npz` for pruning.csv, `pruning/<table without .csv>/masks_step<N>.npz`
  for any other."""
  stem = table_stem(table_name)
  folder = os.path.join(workdir, "pruning", *(() if stem == "pruning" else (stem,)))
  return os.path.join(folder, f"masks_step{step}.npz")


def load_masks(workdir: str, step: int, table_name: str = DEFAULT_TABLE
               ) -> dict[str, np.ndarray] | None:
  """The masks file of `step` of the table `table_name` as arrays (see `save_masks`), or None
  when there is none."""
  path = masks_path(workdir, step, table_name)
  if not os.path.exists(path):
    return None
  with np.load(path) as f:
    return {k: f[k] for k in f.files}


MASK_FIELDS = ("seed", "sparsity", "pruning_seed", "head_mask", "mlp_mask", "log_alpha_heads",
               "log_alpha_mlp")


def save_masks(workdir: str, step: int, new: dict[str, np.ndarray],
               table_name: str = DEFAULT_TABLE) -> str:
  """Adds runs to the masks file of `step` of `table_name` (`masks_path`, atomically),
  replacing runs of the same key.

  Args:
    new: per run R: 'seed', 'pruning_seed' int [R], 'sparsity' float [R], 'head_mask' bool
      [R, R_h, num_heads], 'mlp_mask' bool [R, R_m] (`objective.unit_shapes`), 'log_alpha_heads',
      'log_alpha_mlp' float32 (the trained gates).

  Returns:
    the file's path.
  """
  old = load_masks(workdir, step, table_name)
  merged = {k: np.asarray(new[k]) for k in MASK_FIELDS}
  if old is not None:
    key = lambda d, i: (int(d["seed"][i]), level_key(d["sparsity"][i]), int(d["pruning_seed"][i]))
    new_keys = {key(merged, i) for i in range(len(merged["seed"]))}
    keep = [i for i in range(len(old["seed"])) if key(old, i) not in new_keys]
    merged = {k: np.concatenate([old[k][keep], merged[k]]) for k in MASK_FIELDS}
  path = masks_path(workdir, step, table_name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  buf = io.BytesIO()
  np.savez(buf, **merged)
  fileio.write_atomic(path, buf.getvalue())
  return path
