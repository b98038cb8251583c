"""The report's "Baselines" section (sg_jax/report/baselines.py): structure measures beside their
trivial baselines on hand-made runs with known values, the metrics.csv fallback of UAS, and the
section in a whole report."""

import csv
import json
import math
import os

import numpy as np
import pytest

from sg_jax.report import baselines
from sg_jax.report import build as report
from sg_jax.report.reading import Run


def series(values_by_seed, steps=(100, 200)):
  return {seed: (np.array(steps), np.array(v, float)) for seed, v in values_by_seed.items()}


def hand_run():
  # Two seeds. UAS from analysis.csv: finals 0.5 and 0.3 against prev-token 0.44, next 0.2,
  # best offset 0.48 (constants): seed 0 is above all three, seed 1 is not.
  # tscore: seed 1's last finite step is 100 (NaN at 200); its baselines are read at 100.
  s = {"uas": series({0: [0.2, 0.5], 1: [0.2, 0.3]}),
       "uas_prev_token": series({0: [0.44, 0.44], 1: [0.44, 0.44]}),
       "uas_next_token": series({0: [0.2, 0.2], 1: [0.2, 0.2]}),
       "uas_best_offset": series({0: [0.48, 0.48], 1: [0.48, 0.48]}),
       "in_domain/uas": series({0: [0.9, 0.9], 1: [0.9, 0.9]}),  # not read: analysis wins
       "tscore": series({0: [0.4, 0.9], 1: [0.7, math.nan]}),
       "tscore_random_tree": series({0: [0.01, -0.01], 1: [0.02, 0.0]}),
       "tscore_right_branching": series({0: [0.5, 0.95], 1: [0.6, 0.1]}),
       "tscore_left_branching": series({0: [-0.1, -0.2], 1: [-0.3, -0.3]})}
  return Run(workdir="", name="hand", depth=4, task="question", num_steps=200, series=s)


def test_rows_of_a_hand_made_run():
  rows = {r["measure"]: r for r in baselines.baseline_rows([hand_run()])}
  assert set(rows) == {"uas", "tscore"}  # no tparseval rows in the run
  uas = rows["uas"]
  assert uas["column"] == "uas" and uas["seeds"] == 2 and uas["step"] == 200
  assert uas["value"] == pytest.approx(0.4)
  assert (uas["value_min"], uas["value_max"]) == (0.3, 0.5)
  assert (uas["uas_prev_token"], uas["uas_next_token"], uas["uas_best_offset"]) == (
      pytest.approx(0.44), pytest.approx(0.2), pytest.approx(0.48))
  assert uas["strongest_baseline"] == "uas_best_offset"
  assert uas["seeds_above_baselines"] == 1
  ts = rows["tscore"]
  # finals 0.9 (seed 0, step 200) and 0.7 (seed 1, step 100); right-branching at those steps
  # 0.95 and 0.6: seed 1 beats every baseline of its own, seed 0 does not
  assert ts["value"] == pytest.approx(0.8)
  assert ts["tscore_right_branching"] == pytest.approx((0.95 + 0.6) / 2)
  assert ts["tscore_random_tree"] == pytest.approx((-0.01 + 0.02) / 2)
  assert ts["seeds_above_baselines"] == 1 and ts["strongest_baseline"] == "tscore_right_branching"


def test_uas_falls_back_to_metrics_csv_and_missing_baselines_give_no_count():
  s = {"in_domain/uas": series({0: [0.1, 0.6]}),
       "in_domain/uas_prev_token": series({0: [0.4, 0.4]}),
       "tparseval_f1": series({0: [0.3, 0.7]}),
       "tparseval_f1_right_branching": series({0: [0.6, 0.6]}),
       "tparseval_f1_left_branching": series({0: [0.2, 0.2]}),
       "tparseval_f1_random": series({0: [0.35, 0.35]})}
  run = Run(workdir="", name="fresh", depth=None, task="question", num_steps=200, series=s)
  rows = {r["measure"]: r for r in baselines.baseline_rows([run])}
  uas = rows["uas"]
  assert uas["column"] == "in_domain/uas" and uas["uas_prev_token"] == pytest.approx(0.4)
  assert math.isnan(uas["uas_next_token"]) and math.isnan(uas["seeds_above_baselines"])
  assert rows["tparseval"]["seeds_above_baselines"] == 1
  lines = baselines.markdown_lines(list(rows.values()))
  assert lines[1] == "## Baselines"
  row = next(l for l in lines if l.startswith("| fresh |") and "tparseval" in l)
  assert [c.strip() for c in row.strip("|").split("|")] == [
      "fresh", "", "`tparseval_f1`", "200", "1", "0.7 [0.7, 0.7]", "0.6", "0.2", "0.35", "1/1"]
  uas_row = next(l for l in lines if l.startswith("| fresh |") and "in_domain/uas" in l)
  assert uas_row.rstrip().endswith("| 0.4 |  |  |  |")
  assert baselines.markdown_lines([]) == []


def test_section_in_a_whole_report(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(
      {"task": "question", "model": {"num_layers": 2}, "train": {"num_steps": 200}}))
  with open(workdir / "metrics.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["step", "seed", "name", "value"])
    for step in (100, 200):
      for seed in (0, 1):
        w.writerows([(step, seed, "in_domain/accuracy", 0.9),
                     (step, seed, "out_of_domain/accuracy", 0.5),
                     (step, seed, "in_domain/uas", 0.3 + seed * 0.2),
                     (step, seed, "in_domain/uas_prev_token", 0.44),
                     (step, seed, "in_domain/uas_next_token", 0.1),
                     (step, seed, "in_domain/uas_best_offset", 0.46)])
  out = report.build_report(str(workdir))
  with open(os.path.join(out["out_dir"], "summary.md")) as f:
    text = f.read()
  assert "## Baselines" in text
  assert "| run | 2 | `in_domain/uas` | 200 | 2 | 0.4 [0.3, 0.5] | 0.44 | 0.1 | 0.46 | 1/2 |" \
      in text
  with open(os.path.join(out["out_dir"], "summary_baselines.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["measure"] for r in rows] == ["uas"]
