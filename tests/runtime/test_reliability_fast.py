"""Reliability without training (issue 50): diverged seeds out of every summary, a damaged
checkpoint named by the analysis while the readable ones are analysed, partial runs marked,
unreadable files named in one line. Hand-built workdirs; each test well under 2 s once JAX is
imported."""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from sg_jax import checkpointing
from sg_jax.analysis import driver as analyze_lib
from sg_jax.records import fileio
from sg_jax.records import long_csv
from sg_jax.report import build as report
from sg_jax.report import reading
from sg_jax.runtime import cost_check
from sg_jax.runtime import resume_check
from sg_jax.runtime import workdir_lock
from run_files import random_checkpoint_workdir  # pylint: disable=wrong-import-order

STEPS = [0, 100, 200, 300, 400]


def _write(path, rows):
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["step", "seed", "name", "value"])
    w.writerows(rows)


def _run(workdir, curves, num_steps=400, steps=STEPS, extra=()):
  """A workdir of metric rows: curves = {seed: (in-domain accuracy [T], gen accuracy [T])}."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"task": "question", "model": {"num_layers": 2},
               "train": {"num_steps": num_steps}}, f)
  rows = list(extra)
  for seed, (acc_in, acc_gen) in curves.items():
    for t, step in enumerate(steps):
      loss = 3.0 - 0.5 * t if np.isfinite(acc_in[t]) else float("nan")
      rows += [(step, seed, "in_domain/accuracy", acc_in[t]),
               (step, seed, "out_of_domain/accuracy", acc_gen[t]),
               (step, seed, "train/loss", loss)]
  _write(os.path.join(workdir, "metrics.csv"), rows)
  return workdir


NAN = float("nan")
# Seed 2 diverged at step 0 (the case): its only finite evaluation is the untrained one,
# which the report took as its final value and which made it look like the best seed.
CURVES = {0: ([0.2, 0.5, 0.9, 1.0, 1.0], [0.1, 0.1, 0.2, 0.3, 0.4]),
          1: ([0.2, 0.6, 1.0, 1.0, 1.0], [0.1, 0.2, 0.2, 0.2, 0.2]),
          2: ([0.45, NAN, NAN, NAN, NAN], [0.4545, NAN, NAN, NAN, NAN])}


def test_diverged_seeds_are_found_from_the_flag_or_the_first_non_finite_value():
  series = reading._to_series([  # pylint: disable=protected-access
      (0, 0, "train/loss", 3.0), (10, 0, "train/loss", 2.0),
      (0, 1, "train/loss", 3.0), (10, 1, "train/loss", NAN),
      (10, 1, "train/diverged_step", 7.0), (10, 0, "train/diverged_step", -1.0),
      (0, 2, "in_domain/accuracy", 0.1), (20, 2, "in_domain/accuracy", float("inf")),
      (0, 3, "out_of_domain/accuracy", 0.1)])
  assert reading.diverged_seeds(series) == {1: 7, 2: 20}


def test_a_diverged_seed_counts_in_no_mean_and_is_listed_with_its_step(tmp_path):
  workdir = _run(str(tmp_path / "quick"), CURVES, extra=[(100, 2, "train/diverged_step", 0.0)])
  run = report.load_run(workdir)
  assert run.diverged == {2: 0}
  assert all(2 not in by_seed for by_seed in run.series.values())
  seeds = report.seed_summary([run], 0.8, 0.99, 0.0)
  assert sorted(r["seed"] for r in seeds) == [0, 1]
  (depth,) = report.depth_summary(seeds)
  assert depth["num_seeds"] == 2
  # (0.4 + 0.2) / 2, not (0.4 + 0.2 + 0.4545) / 3 with seed 2's untrained step-0 value
  assert depth["final_generalisation_mean"] == pytest.approx(0.3)


def test_a_run_whose_every_seed_diverged_is_one_line(tmp_path):
  workdir = _run(str(tmp_path / "lr1e30"),
                 {s: ([0.1] + [NAN] * 4, [0.1] + [NAN] * 4) for s in (0, 1)})
  with pytest.raises(report.ReportError) as caught:
    report.build_report(workdir, str(tmp_path / "out"))
  assert str(caught.value) == (f"every seed under {workdir} diverged (lr1e30: seed 0 at step "
                               "100, seed 1 at step 100): nothing to report")


def test_a_run_in_progress_or_ending_early_is_marked(tmp_path):
  curves = {s: c for s, c in CURVES.items() if s != 2}
  short = _run(str(tmp_path / "short"), curves, num_steps=1000)
  assert report.load_run(short).in_progress == ("partial: its metrics end at step 400 of "
                                                "train.num_steps 1000")
  done = _run(str(tmp_path / "done"), curves)
  os.makedirs(os.path.join(done, "checkpoints", "500"))
  assert report.load_run(done).in_progress == ("partial: its metrics end at step 400, before "
                                               "its last checkpoint 500")
  shutil.rmtree(os.path.join(done, "checkpoints"))
  assert report.load_run(done).in_progress == ""
  with workdir_lock.locked(done, "sg_jax.main"):
    marked = report.load_run(done).in_progress
  assert marked.startswith(f"in progress: sg_jax.main (pid {os.getpid()} on host ")
  # summary.md lists the partial run and a diverged seed
  _run(short, CURVES, num_steps=1000, extra=[(100, 2, "train/diverged_step", 0.0)])
  report.build_report(short, str(tmp_path / "out"))
  md = open(tmp_path / "out" / "summary.md").read()
  assert ("run short is partial: its metrics end at step 400 of train.num_steps 1000: its "
          "results are provisional") in md
  assert ("diverged seeds, left out of every figure, mean, interval, correlation and test: "
          "short: seed 2 at step 0") in md


def test_undecodable_table_and_config_are_one_line_naming_the_file(tmp_path):
  workdir = _run(str(tmp_path / "run"), {0: CURVES[0]})
  metrics = os.path.join(workdir, "metrics.csv")
  with open(metrics, "ab") as f:
    f.write(b"400,0,train/loss,\xff\xfe\n")
  with pytest.raises(ValueError, match=f"^{metrics} is not a UTF-8 text table "):
    long_csv.read_rows(metrics)
  _run(workdir, {0: CURVES[0]})
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write('{"task": "question", ')
  with pytest.raises(report.ReportError,
                     match=f"^{os.path.join(workdir, 'config.json')} is not readable JSON"):
    report.load_run(workdir)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return random_checkpoint_workdir(tmp_path_factory.mktemp("ckpt") / "run", [0, 10, 20], [0, 1])


def test_analyze_names_an_emptied_latest_checkpoint_after_analysing_the_others(checkpoints,
                                                                               tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(checkpoints, workdir)
  latest = os.path.join(workdir, "checkpoints", "20")
  for name in os.listdir(latest):
    path = os.path.join(latest, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  with pytest.raises(checkpointing.CheckpointError) as caught:
    analyze_lib.analyze(workdir, groups=["weight_norm", "cka"], num_sentences=4)
  message = str(caught.value)
  assert message.startswith(f"unreadable checkpoint step(s) [20] in "
                            f"{checkpointing.checkpoint_dir(workdir)}")
  # 2 steps x 2 seeds x (weight_norm, weight_norm_per_layer)
  assert "the other checkpoints were analysed (8 new rows" in message
  rows = long_csv.read_rows(os.path.join(workdir, "analysis.csv"))
  assert sorted({(r[0], r[1]) for r in rows}) == [(0, 0), (0, 1), (10, 0), (10, 1)]
  assert {r[2] for r in rows} == {"weight_norm", "weight_norm_per_layer"}  # no cka: not final
  assert os.path.isdir(latest)  # a reader moves nothing
  options = json.load(open(os.path.join(workdir, "analysis.csv.options.json")))
  assert "reference_final_step" not in options  # a later complete analysis is not blocked


def test_quantities_comparing_with_the_final_checkpoint_refuse_on_an_unfinished_run(tmp_path):
  workdir = random_checkpoint_workdir(tmp_path / "run", [0, 10], [0],
                                      **{"train.num_steps": 1000})
  before = sorted(os.listdir(workdir))
  with pytest.raises(ValueError, match=r"^cka compare every checkpoint with the run's final one, "
                                       r"but the run's latest checkpoint is step 10 and "
                                       r"train.num_steps is 1000 \(training unfinished"):
    analyze_lib.analyze(workdir, groups=["cka"], num_sentences=4, strict_groups=True)
  assert sorted(os.listdir(workdir)) == before  # nothing written


def test_analyze_with_nothing_to_do_writes_nothing(checkpoints, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(checkpoints, workdir)
  analyze_lib.analyze(workdir, groups=["weight_norm"], num_sentences=4)
  options = os.path.join(workdir, "analysis.csv.options.json")
  stamp = os.stat(options).st_mtime_ns
  before = {n: open(os.path.join(workdir, n), "rb").read()
            for n in ("analysis.csv", "analysis.csv.options.json")}
  result = analyze_lib.analyze(workdir, groups=["weight_norm"], num_sentences=4)
  assert result == {"rows_written": 0, "checkpoints_analysed": 0}
  assert os.stat(options).st_mtime_ns == stamp
  assert before == {n: open(os.path.join(workdir, n), "rb").read() for n in before}


def test_memory_estimate_by_hand_and_a_refusal_in_one_line(monkeypatch):
  model = ml_collections.ConfigDict({"num_layers": 2, "d_model": 8, "d_ff": 16, "num_heads": 2})
  # training: 4 x 5 tokens x (2 x (80 + 32 + 20) + 2 x 11) = 5720 floats; evaluation: 3 x 5 x 3
  # x max(16, 10, 11, 8) = 720 floats
  assert cost_check.activation_bytes(model, batch_size=4, length=5, eval_batch_size=3,
                                     vocab_size=11) == 5720 * 4
  config = ml_collections.ConfigDict({"model": model, "num_seeds": 3,
                                      "train": {"batch_size": 4}, "eval": {"batch_size": 3}})
  params = {"w": jax.ShapeDtypeStruct((10, 8), np.float32),
            "b": jax.ShapeDtypeStruct((8,), np.float32)}  # 88 floats per seed
  found = cost_check.estimate(config, params, {"inputs": np.zeros((6, 5), np.int32)}, 2, 11)
  # 3 seeds x 88 x 4 bytes x 3 (parameters, two AdamW moments); data 6 x 5 x 4 bytes x 2 devices
  assert (found.state, found.step, found.data, found.activations) == (3168, 3168, 240, 3 * 22880)
  cpu = jax.devices("cpu")[:1]
  monkeypatch.setattr(cost_check, "available_bytes", lambda devices: (found.total, "free"))
  cost_check.check(found, cpu)  # fits exactly
  monkeypatch.setattr(cost_check, "available_bytes", lambda devices: (found.total - 1, "free"))
  with pytest.raises(cost_check.MemoryEstimateError) as caught:
    cost_check.check(found, cpu)
  message = str(caught.value)
  assert "\n" not in message and message.startswith("this run needs about 0.0 GB: training "
                                                    "state 0.00 GB for 3 seeds")
  assert "--skip_memory_check runs it anyway" in message


def test_the_hosts_available_memory_is_read():
  limit, what = cost_check.available_bytes(jax.devices("cpu"))
  assert what == "available on this machine" and 0 < limit <= (
      os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def test_an_undecodable_data_split_names_its_file_and_line(tmp_path):
  from sg_jax.tasks import examples, io  # pylint: disable=import-outside-toplevel
  path = tmp_path / "question.train"
  path.write_bytes(b"the cat sleeps . quest the cat sleeps ?\nthe dog \xff runs .\n")
  with pytest.raises(examples.DataError) as caught:
    io._read_lines(path)  # pylint: disable=protected-access
  assert str(caught.value) == f"{path}:2: not UTF-8 text (invalid start byte at byte 48)"


def test_a_finished_analysis_on_a_read_only_workdir_is_rechecked(checkpoints, tmp_path,
                                                                 monkeypatch):
  """Every write fails as on a read-only mount (the lock file, the options file, the table):
  with nothing to do the analysis still succeeds."""
  workdir = str(tmp_path / "run")
  shutil.copytree(checkpoints, workdir)
  analyze_lib.analyze(workdir, groups=["weight_norm"], num_sentences=4)

  def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")

  monkeypatch.setattr(workdir_lock, "acquire", read_only)
  monkeypatch.setattr(fileio, "open_atomic", read_only)
  monkeypatch.setattr(long_csv.LongCsv, "_append", read_only)
  assert analyze_lib.analyze(workdir, groups=["weight_norm"], num_sentences=4) == {
      "rows_written": 0, "checkpoints_analysed": 0}


def test_a_failed_report_leaves_the_previous_one_and_no_partial_folder(tmp_path, monkeypatch):
  from sg_jax.report import __main__ as report_cli  # pylint: disable=import-outside-toplevel
  workdir = _run(str(tmp_path / "run"), {0: CURVES[0], 1: CURVES[1]})
  out = os.path.join(workdir, "report")
  os.makedirs(out)
  with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("the previous report\n")

  def disk_full(root, out_dir, **options):
    os.makedirs(out_dir)
    with open(os.path.join(out_dir, "grokking_depth2.png"), "w") as f:
      f.write("half")
    raise OSError(errno.ENOSPC, "No space left on device", os.path.join(out_dir, "summary.csv"))

  monkeypatch.setattr(report_cli, "build_report", disk_full)
  with pytest.raises(OSError) as caught:
    report_cli.write_report(workdir)
  message = str(caught.value)
  assert message == (f"cannot write the report into {out} ({os.path.join(out, 'summary.csv')}): "
                     "No space left on device; the previous report is unchanged")
  assert sorted(os.listdir(workdir)) == ["config.json", "metrics.csv", "report"]  # no lock left
  assert os.listdir(out) == ["summary.md"]
  assert open(os.path.join(out, "summary.md")).read() == "the previous report\n"


def test_an_unparsable_config_json_on_resume_names_the_file(tmp_path, tiny_config):
  path = tmp_path / "config.json"
  path.write_bytes(b'{"task": "question", \xff')
  with pytest.raises(ValueError, match=f"^{path} is not readable JSON "):
    resume_check.check_workdir_config(str(tmp_path), tiny_config(data_dir=str(tmp_path)), False)


def test_a_report_does_not_take_its_own_lock_for_a_run_in_progress(tmp_path):
  """`sg_jax.report` holds the lock of the workdir it writes into; reading that run in the same
  process must not mark it 'in progress' (it did, naming the report itself); another command's
  hold still does."""
  done = _run(str(tmp_path / "done"), {s: c for s, c in CURVES.items() if s != 2})
  with workdir_lock.locked(done, "sg_jax.report"):
    assert report.load_run(done).in_progress == ""
  with workdir_lock.locked(done, "sg_jax.analyze"):
    assert report.load_run(done).in_progress.startswith("in progress: sg_jax.analyze")
