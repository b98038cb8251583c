"""The `step,seed,name,value` tables (sg_jax.records.long_csv): append, read, truncate."""

import math
import os

import numpy as np

from sg_jax.records import long_csv
from sg_jax.records import metric_logging


def test_written_rows_read_back_exactly(tmp_path):
  path = str(tmp_path / "metrics.csv")
  table = long_csv.LongCsv(path)
  loss = np.array([0.1 + 0.2, np.nan])  # a value whose shortest repr has 17 digits
  table.write(10, [3, 7], {"train/loss": loss, "eval/acc": np.array([1.0, 0.25])})
  table.append([(20, 3, "odd,name", 2.0 / 3.0)])
  rows = long_csv.read_rows(path)
  assert rows[:4] == [(10, 3, "eval/acc", 1.0), (10, 7, "eval/acc", 0.25),
                      (10, 3, "train/loss", loss[0]), rows[3]]
  assert rows[3][:3] == (10, 7, "train/loss") and math.isnan(rows[3][3])
  assert rows[4] == (20, 3, "odd,name", 2.0 / 3.0)
  with open(path) as f:
    lines = f.read().splitlines()
  assert lines[0] == "step,seed,name,value" and lines[3] == f"10,3,train/loss,{float(loss[0])!r}"
  assert lines[4] == "10,7,train/loss,nan"
  for dicts in (table.rows(), long_csv.read_table(path)):
    assert [(d["step"], d["seed"], d["name"]) for d in dicts] == [r[:3] for r in rows]
    np.testing.assert_array_equal([d["value"] for d in dicts], [r[3] for r in rows])
  assert metric_logging.MetricsTable is long_csv.LongCsv  # the name the loop uses
  assert long_csv.read_keys(path) == {r[:3] for r in rows}
  before = open(path).read()
  long_csv.LongCsv(path)  # reopening a whole table changes nothing (no second header)
  assert open(path).read() == before


def test_readers_skip_header_malformed_and_cut_lines(tmp_path):
  path = tmp_path / "analysis.csv"
  path.write_text("step,seed,name,value\r\n5,0,a,1.5\r\nnot,a,row\n6,x,a,1\n7,1,b,2.5\n8,1,b,0.12")
  assert long_csv.read_rows(str(path)) == [(5, 0, "a", 1.5), (7, 1, "b", 2.5)]
  assert long_csv.read_keys(str(path)) == {(5, 0, "a"), (7, 1, "b")}
  assert long_csv.read_keys(str(tmp_path / "missing.csv")) == set()
  assert long_csv.read_rows(str(tmp_path / "missing.csv"), missing_ok=True) == []
  # Opening for appends cuts the unterminated last line, so new rows start on their own line.
  long_csv.LongCsv(str(path)).append([(8, 1, "b", 0.125)])
  assert long_csv.read_rows(str(path))[-1] == (8, 1, "b", 0.125)
  assert path.read_text().endswith("7,1,b,2.5\n8,1,b,0.125\n")


def test_truncate_after_cuts_in_place_or_rewrites(tmp_path):
  path = str(tmp_path / "metrics.csv")
  table = long_csv.LongCsv(path)
  for step in (10, 20, 30):
    table.write(step, [0, 1], {"m": np.array([step, -step], np.float64)})
  inode = os.stat(path).st_ino
  assert table.truncate_after(15) == 4
  assert os.stat(path).st_ino == inode  # cut in place, not rewritten
  assert [r[0] for r in long_csv.read_rows(path)] == [10, 10]
  assert table.truncate_after(15) == 0
  # Rows out of step order: rewritten through a temporary file, none left behind.
  table.write(40, [0], {"m": np.array([4.0])})
  table.write(12, [0], {"m": np.array([1.2])})
  assert table.truncate_after(12) == 1
  assert long_csv.read_rows(path) == [(10, 0, "m", 10.0), (10, 1, "m", -10.0),
                                      (12, 0, "m", 1.2)]
  assert os.listdir(tmp_path) == ["metrics.csv"]


def test_disabled_table_touches_nothing(tmp_path):
  path = str(tmp_path / "metrics.csv")
  table = long_csv.LongCsv(path, enabled=False)
  table.write(1, [0], {"m": np.array([1.0])})
  assert table.truncate_after(0) == 0 and not os.path.exists(path)
