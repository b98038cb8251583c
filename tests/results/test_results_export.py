"""`sg_jax.results.export`: a run's compact copy reads as the workdir it came from."""

import gzip
import json
import os

import numpy as np
import pytest

from sg_jax.records import fileio
from sg_jax.report import pruning_tables
from sg_jax.report import reading
from sg_jax.report import tables
from sg_jax.results import export
from sg_jax.runtime import environment

import results_fixtures  # pylint: disable=wrong-import-order  (tests/ is on the path)


def _same_series(a, b):
  assert sorted(a) == sorted(b)
  for name in a:
    assert sorted(a[name]) == sorted(b[name]), name
    for seed in a[name]:
      np.testing.assert_array_equal(a[name][seed][0], b[name][seed][0])
      np.testing.assert_array_equal(a[name][seed][1], b[name][seed][1])  # NaN == NaN here


def test_export_then_load_run_gives_identical_series(tmp_path):
  work = results_fixtures.make_workdir(str(tmp_path / "runs" / "tiny"))
  with open(os.path.join(work, "pruning.csv.options.json"), "w") as f:
    f.write('{"eval_lines": 300}')  # what sg_jax.prune recorded: copied as it is
  out = str(tmp_path / "results" / "study" / "tiny")
  manifest = export.export_run(work, out, command=f"python -m sg_jax.main --workdir={work}")
  original, exported = reading.load_run(work), reading.load_run(out)
  _same_series(original.series, exported.series)
  assert np.isnan(exported.series["out_of_domain/accuracy/RC-obj"][0][1][3])
  assert exported.depth == original.depth == 1 and exported.task == "question"
  assert exported.analysis_options == original.analysis_options
  assert sorted(os.listdir(out)) == ["analysis.csv.gz", "analysis.csv.options.json",
                                     "config.json", "metrics.csv.gz", "pruning",
                                     "pruning.csv.gz", "pruning.csv.options.json",
                                     "pruning_core.csv.gz", "run.json", "vocab.json"]
  with open(os.path.join(out, "pruning.csv.options.json")) as f:
    assert json.load(f) == {"eval_lines": 300}
  with gzip.open(os.path.join(out, "metrics.csv.gz"), "rb") as f, \
      open(os.path.join(work, "metrics.csv"), "rb") as g:
    assert f.read() == g.read()
  # no path of the exporting machine in what is committed
  assert manifest["command"] == "python -m sg_jax.main --workdir=WORKDIR"
  assert exported.config["data"]["dir"] == "WORKDIR/data"
  assert set(manifest["versions"]) == set(environment.PACKAGES)
  assert set(manifest["files"]) == {"analysis.csv.gz", "analysis.csv.options.json",
                                    "config.json", "metrics.csv.gz", "pruning.csv.gz",
                                    "pruning.csv.options.json", "pruning_core.csv.gz",
                                    "vocab.json",
                                    "pruning/masks_step500.npz", "pruning/masks_step1000.npz"}
  assert len(manifest["exported_at_commit"]["commit"]) in (40, 7)  # a sha, or 'unknown'
  assert (manifest["last_step"], manifest["num_steps"], manifest["complete"]) == (1000, 1000,
                                                                                  True)


def test_export_pruning_tables_read_the_same(tmp_path):
  work = results_fixtures.make_workdir(str(tmp_path / "w"), depth=2)
  out = str(tmp_path / "out")
  export.export_run(work, out)
  a, b = pruning_tables.load_pruning(work, "w"), pruning_tables.load_pruning(out, "w")
  assert a.runs == b.runs and a.full == b.full and a.core_rows == b.core_rows
  assert a.shape == b.shape == (2, 2)
  for step in a.masks:
    for key in a.masks[step]:
      np.testing.assert_array_equal(a.masks[step][key], b.masks[step][key])
  assert pruning_tables.summary_rows(a) == pruning_tables.summary_rows(b)


def test_report_tables_same_from_workdir_and_export(tmp_path):
  root = tmp_path / "runs"
  for depth, finals in ((1, (0.9, 0.3)), (2, (0.8, 0.7, 0.95))):
    results_fixtures.make_workdir(str(root / f"depth{depth}"), depth=depth, finals=finals)
  out = str(tmp_path / "results" / "sweep")
  manifests = export.export(str(root), out)
  assert [m["name"] for m in manifests] == ["depth1", "depth2"]
  from_work = [reading.load_run(w) for w in reading.find_runs(str(root))]
  from_export = [reading.load_run(w) for w in reading.find_runs(out)]
  seeds_a = tables.seed_summary(from_work, 0.8, 0.99, 0.0)
  seeds_b = tables.seed_summary(from_export, 0.8, 0.99, 0.0)
  nan_equal = lambda rows: json.dumps(rows, default=str, sort_keys=True)
  assert nan_equal(seeds_a) == nan_equal(seeds_b)
  assert nan_equal(tables.depth_summary(seeds_a)) == nan_equal(tables.depth_summary(seeds_b))
  assert [r["final_generalisation"] for r in seeds_b] == pytest.approx([0.9, 0.3, 0.8, 0.7,
                                                                        0.95])


def test_export_of_one_sweep_job_keeps_the_sweeps_design(tmp_path):
  root = tmp_path / "runs"
  work = results_fixtures.make_workdir(str(root / "depth2"), depth=2, pruning=False)
  (root / "sweep.json").write_text(json.dumps({
      "depths": [2, 4], "seeds": 2,
      "jobs": {"2": {"workdir": "depth2", "command": f"python -m sg_jax.main --workdir={work}"}}}))
  export.export(work, str(tmp_path / "results" / "study" / "depth2"))
  design = json.loads((tmp_path / "results" / "study" / "sweep.json").read_text())
  assert design["depths"] == [2, 4]
  assert design["jobs"]["2"]["command"] == "python -m sg_jax.main --workdir=WORKDIR/depth2"
  lone = results_fixtures.make_workdir(str(tmp_path / "alone" / "w"), pruning=False)
  export.export(lone, str(tmp_path / "results" / "other" / "w"))
  assert not (tmp_path / "results" / "other" / "sweep.json").exists()  # not a sweep's job


def test_export_is_deterministic_and_replaces_stale_files(tmp_path):
  work = results_fixtures.make_workdir(str(tmp_path / "w"), pruning=False,
                                       config_extra={"train": {"num_steps": 2000}})
  out = tmp_path / "out"
  manifest = export.export_run(work, str(out))
  assert not manifest["complete"]  # metrics end at 1000 of 2000 steps: still training
  first = (out / "metrics.csv.gz").read_bytes()
  (out / "stale.csv.gz").write_bytes(b"old")
  export.export_run(work, str(out))
  assert (out / "metrics.csv.gz").read_bytes() == first
  assert not (out / "stale.csv.gz").exists()


def test_export_refuses_a_folder_without_metrics(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(export.ExportError, match="no metrics.csv"):
    export.export_run(str(tmp_path / "empty"), str(tmp_path / "out"))
  work = results_fixtures.make_workdir(str(tmp_path / "w"), pruning=False, analysis=False)
  with pytest.raises(export.ExportError, match="inside the workdir"):
    export.export_run(work, os.path.join(work, "copy"))


def test_scrub_keeps_no_machine_path():
  text = export._scrub("/usr/local/bin/python3.11 -m sg_jax.main --workdir=/some/where/run "
                       "--config=configs/question.py:tiny --data=/mnt/disk/data/qf",
                       "/some/where/run")
  assert text == ("python -m sg_jax.main --workdir=WORKDIR --config=configs/question.py:tiny "
                  "--data=.../qf")


def test_gz_fallback_reads_only_when_plain_file_is_absent(tmp_path):
  plain = tmp_path / "t.csv"
  (tmp_path / "t.csv.gz").write_bytes(export.gzip_bytes(b"from gz\n"))
  assert fileio.read_text(plain) == "from gz\n"
  plain.write_text("plain\n")
  assert fileio.read_text(plain) == "plain\n"
  with pytest.raises(FileNotFoundError, match="nor"):
    fileio.read_text(tmp_path / "missing.csv")


def test_default_out_dir_keeps_reports_out_of_results(tmp_path):
  work = results_fixtures.make_workdir(str(tmp_path / "runs" / "w"), pruning=False)
  assert reading.default_out_dir(work) == os.path.join(work, "report")
  out = tmp_path / "repo" / "results" / "study"
  export.export(work, str(out / "w"))
  assert reading.default_out_dir(str(out)) == str(tmp_path / "repo" / "runs" /
                                                  "results_reports" / "study")
  elsewhere = tmp_path / "copy"
  export.export(work, str(elsewhere))
  assert reading.default_out_dir(str(elsewhere)) == str(elsewhere) + "_report"
