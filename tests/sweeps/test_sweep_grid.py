"""Grid sweeps over any config field (`sg_jax.sweeps.grid`, `sg_jax.sweep`; issue 52 item 3):
which fields become jobs and which go onto the seed axis, the seed-to-value map, the commands
and configs of the jobs, the refusals (an unknown field, a per-seed field with a wrong count, a
changed grid on an existing root), and the report's seed groups and dose response by one grid
axis. Fast: no training (the end-to-end sweep stopped by SIGINT and resumed is in
tests/sweeps/test_sweep.py)."""

from __future__ import annotations

import csv
import json
import os

import pytest

from sg_jax.report import build as report
from sg_jax.report import group_figures, group_stats, groups
from sg_jax.sweeps import driver as sweep
from sg_jax.sweeps import grid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "question.py") + ":tiny"


def test_seed_axis_fields_are_the_per_seed_ones():
  fields = grid.seed_axis_fields()
  for name in ("optim.weight_decay", "optim.learning_rate", "model.dropout", "seeds.init",
               "seeds.data", "sas.lambdas", "tree.lambdas", "data.num_disambiguating"):
    assert name in fields
  for name in ("model.num_layers", "model.d_model", "model.num_heads", "model.d_ff",
               "data.num_train", "train.num_steps"):
    assert name not in fields


def test_split_and_parse_an_axis():
  assert grid.split_top_level("0, (1,2) ,'a,b'") == ["0", "(1,2)", "'a,b'"]
  assert grid.parse_axis("--config.optim.weight_decay=0,0.1,1") == ("optim.weight_decay",
                                                                   (0, 0.1, 1))
  assert grid.parse_axis("data.subject_mix=pp,'rc,pp'") == ("data.subject_mix", ("pp", "rc,pp"))
  # --depths comes first, as the model.num_layers axis
  assert grid.parse_grid(["optim.b1=0.9"], [4, 6]) == [("model.num_layers", (4, 6)),
                                                        ("optim.b1", (0.9,))]


def test_expand_puts_per_seed_fields_on_the_seed_axis_and_others_into_jobs():
  axes = [("model.num_layers", (4, 6)), ("optim.weight_decay", (0.0, 0.1, 1.0)),
          ("model.d_model", (16, 32)), ("optim.learning_rate", (1e-3, 1e-4))]
  jobs = grid.expand(axes, seeds=2)
  # jobs: depth x width, row-major in grid order
  assert [j.job_values for j in jobs] == [
      {"model.num_layers": 4, "model.d_model": 16}, {"model.num_layers": 4, "model.d_model": 32},
      {"model.num_layers": 6, "model.d_model": 16}, {"model.num_layers": 6, "model.d_model": 32}]
  assert [j.name for j in jobs] == ["depth4-d_model16", "depth4-d_model32", "depth6-d_model16",
                                    "depth6-d_model32"]
  assert [j.key for j in jobs] == [j.name for j in jobs]
  # seed axis: 3 weight decays x 2 learning rates x 2 seeds = 12 seeds, the last field fastest,
  # the 2 seeds of a grid point contiguous
  job = jobs[0]
  assert job.num_seeds == 12
  assert job.seed_values == {
      "optim.weight_decay": (0.0,) * 4 + (0.1,) * 4 + (1.0,) * 4,
      "optim.learning_rate": (1e-3, 1e-3, 1e-4, 1e-4) * 3}
  assert job.points[5] == {"optim.weight_decay": 0.1, "optim.learning_rate": 1e-3}
  assert all(j.seed_values == job.seed_values for j in jobs)
  # depth alone: the key is the depth, as sweeps over --depths wrote; no axis: one job 'run'
  only_depth = grid.expand([("model.num_layers", (4,))], seeds=3)
  assert (only_depth[0].key, only_depth[0].name, only_depth[0].num_seeds) == ("4", "depth4", 3)
  assert only_depth[0].points == ({}, {}, {})
  (alone,) = grid.expand([("optim.weight_decay", (0.0, 0.5))], seeds=1)
  assert (alone.name, alone.job_values, alone.num_seeds) == ("run", {}, 2)


def test_recorded_grids_compare_by_fields_values_and_seeds():
  axes = [("model.num_layers", (1, 2)), ("optim.weight_decay", (0.0, 0.1))]
  recorded = grid.record(axes, 2)
  assert recorded == {"axes": [
      {"field": "model.num_layers", "values": [1, 2], "axis": "job"},
      {"field": "optim.weight_decay", "values": [0.0, 0.1], "axis": "seed"}],
      "seeds_per_point": 2}
  assert grid.same_grid(recorded, json.loads(json.dumps(recorded)))
  assert grid.same_grid(recorded, grid.record([("model.num_layers", (1.0, 2)),
                                               ("optim.weight_decay", (0, 0.1))], 2))
  assert not grid.same_grid(recorded, grid.record(axes, 3))
  assert not grid.same_grid(recorded, grid.record(axes[::-1], 2))
  assert not grid.same_grid(recorded, grid.record([axes[0], ("optim.weight_decay", (0.0,))], 2))
  # a sweep.json from before grids: its depths and seeds
  assert grid.same_grid(grid.legacy_record({"depths": [1, 2], "seeds": 4}),
                        grid.record([("model.num_layers", (1, 2))], 4))


def test_plan_lays_out_jobs_commands_configs_and_the_seed_map(tmp_path):
  jobs = sweep.plan(TINY, [1, 2], 2, str(tmp_path), overrides=["train.num_steps=30"],
                    grid=["optim.weight_decay=0,0.1", "model.d_model=16,32"])
  assert [j["workdir"] for j in jobs] == ["depth1-d_model16", "depth1-d_model32",
                                          "depth2-d_model16", "depth2-d_model32"]
  job = jobs[1]
  assert (job["key"], job["label"], job["num_seeds"]) == ("depth1-d_model32",
                                                          "job depth1-d_model32", 4)
  assert job["command"][3] == f"--config={TINY},depth=1,seeds=4"
  # overrides, then the job's other job-axis values, then the per-seed values (ints of a float
  # field made floats)
  assert job["command"][5:] == ["--config.train.num_steps=30", "--config.model.d_model=32",
                                "--config.optim.weight_decay=(0.0, 0.0, 0.1, 0.1)"]
  assert job["seed_map"] == {"0": {"optim.weight_decay": 0.0}, "1": {"optim.weight_decay": 0.0},
                             "2": {"optim.weight_decay": 0.1}, "3": {"optim.weight_decay": 0.1}}
  config = sweep.resolve_config(TINY, job["job_values"], 4, ["train.num_steps=30"],
                                {"optim.weight_decay": (0.0, 0.0, 0.1, 0.1)})
  assert (config.model.num_layers, config.model.d_model, config.num_seeds) == (1, 32, 4)
  assert tuple(config.optim.weight_decay) == (0.0, 0.0, 0.1, 0.1)
  # --depths alone: the jobs and commands of sweeps before grids
  (legacy,) = sweep.plan(TINY, [2], 3, str(tmp_path))
  assert (legacy["key"], legacy["workdir"], legacy["label"]) == ("2", "depth2", "depth 2")
  assert legacy["command"][3:5] == [f"--config={TINY},depth=2,seeds=3",
                                    f"--workdir={tmp_path / 'depth2'}"]
  assert len(legacy["command"]) == 5


@pytest.mark.parametrize("kwargs, message", [
    (dict(grid=["model.nope=1,2"]), "unknown config field 'model.nope'"),
    # 2 weight decays x 2 seeds = 4 seeds; b1 given 3 values
    (dict(grid=["optim.weight_decay=0,1"], overrides=["optim.b1=(0.9,0.8,0.7)"]),
     "optim.b1 needs one value or one per seed: got 3 values for 4 seeds"),
    (dict(grid=["optim.weight_decay=(0,1),2"]), "one value per grid point"),
    (dict(grid=["optim.weight_decay=0,1"], overrides=["optim.weight_decay=0.5"]),
     "both on the grid and in --override"),
    (dict(depths=[2], grid=["model.num_layers=4"]), "model.num_layers twice"),
    (dict(grid=["optim.weight_decay=0,,1"]), "an empty value"),
    (dict(grid=["optim.weight_decay"]), "section.field=v1,v2"),
    (dict(depths=[]), "nothing to sweep"),
])
def test_plan_refuses_bad_grids_in_one_line(tmp_path, kwargs, message):
  args = dict(config_arg=TINY, depths=[], seeds=2, root=str(tmp_path))
  args.update(kwargs)
  with pytest.raises(ValueError, match=message) as caught:
    sweep.plan(**args)
  assert "\n" not in str(caught.value)


def test_a_changed_grid_on_an_existing_root_is_refused_before_any_job(tmp_path):
  root = str(tmp_path)
  recorded = grid.record([("model.num_layers", (1,)), ("optim.weight_decay", (0.0, 0.1))], 2)
  index = {"config": TINY, "grid": recorded, "jobs": {}}
  (tmp_path / "sweep.json").write_text(json.dumps(index))
  with pytest.raises(sweep.GridChanged, match=(
      r"records the grid model.num_layers=1 optim.weight_decay=0,0.1 x 2 seeds per grid point, "
      r"this command asks for model.num_layers=1 optim.weight_decay=0,0.2 x 2 seeds")):
    sweep.run_sweep(TINY, [1], 2, root, grid=["optim.weight_decay=0,0.2"])
  with pytest.raises(sweep.GridChanged, match="x 3 seeds per grid point: rerun with the"):
    sweep.run_sweep(TINY, [1], 3, root, grid=["optim.weight_decay=0,0.1"])
  assert json.loads((tmp_path / "sweep.json").read_text()) == index  # untouched
  assert not (tmp_path / "logs").exists()
  # a sweep.json of a sweep over --depths: the same depths and seeds resume, others are refused
  (tmp_path / "sweep.json").write_text(json.dumps({"depths": [4, 6], "seeds": 8, "jobs": {}}))
  sweep.check_same_grid(root, grid.record([("model.num_layers", (4, 6))], 8))
  with pytest.raises(sweep.GridChanged, match="model.num_layers=4,6 x 8 seeds"):
    sweep.check_same_grid(root, grid.record([("model.num_layers", (4, 6, 8))], 8))


def _write_run(workdir, config, finals):
  """A run folder: `config` (config.json) and, per seed (first_seed + k), generalisation 0.05 at
  step 50 and finals[k] at step 100."""
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"task": "question", "train": {"num_steps": 100}, **config}, f)
  first = config.get("first_seed", 0)
  with open(os.path.join(workdir, "metrics.csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["step", "seed", "name", "value"])
    for k, final in enumerate(finals):
      writer.writerows([(50, first + k, "out_of_domain/accuracy", 0.05),
                        (100, first + k, "out_of_domain/accuracy", final),
                        (100, first + k, "in_domain/accuracy", 1.0)])
  return report.load_run(str(workdir))


def _grid_run(tmp_path):
  """A run of a weight decay x learning rate grid on the seed axis (2 seeds per point, first
  seed 10): final generalisation 0.1, 0.2, 0.3, 0.4 for weight decay 0 and 0.6, ..., 0.9 for
  0.1."""
  return _write_run(tmp_path / "depth2", {
      "num_seeds": 8, "first_seed": 10, "model": {"num_layers": 2},
      "optim": {"weight_decay": [0.0] * 4 + [0.1] * 4,
                "learning_rate": [1e-3, 1e-3, 1e-4, 1e-4] * 2}},
                    [0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9])


def test_report_groups_seeds_by_one_grid_axis_and_draws_its_dose_response(tmp_path):
  run = _grid_run(tmp_path)
  # every per-seed field: the 4 grid points
  assert groups.seed_groups(run) == {
      "weight_decay=0.0, learning_rate=0.001": [10, 11],
      "weight_decay=0.0, learning_rate=0.0001": [12, 13],
      "weight_decay=0.1, learning_rate=0.001": [14, 15],
      "weight_decay=0.1, learning_rate=0.0001": [16, 17]}
  # one axis, the other pooled (by its dotted name or its last part)
  by_wd = groups.seed_groups(run, ["optim.weight_decay"])
  assert by_wd == {"weight_decay=0.0": [10, 11, 12, 13], "weight_decay=0.1": [14, 15, 16, 17]}
  assert groups.seed_groups(run, ["learning_rate"]) == {
      "learning_rate=0.001": [10, 11, 14, 15], "learning_rate=0.0001": [12, 13, 16, 17]}
  assert groups.seed_groups(run, ["model.d_model"]) == {}  # not a per-seed field of the run
  rows = {r["group"]: r for r in group_stats.group_rows(run, by_wd)}
  assert rows["weight_decay=0.0"]["out_of_domain/accuracy"] == pytest.approx(0.25)
  assert rows["weight_decay=0.1"]["out_of_domain/accuracy"] == pytest.approx(0.75)
  # the trend over weight decay: every seed of 0.1 above every seed of 0 -> tau = 1; with both
  # fields and no axis named, no trend is tested (the levels of one pool the other's)
  trend = [r for r in group_stats.comparison_rows(run, by_wd, by=["weight_decay"])
           if r["test"] == "Jonckheere-Terpstra"]
  assert len(trend) == 1 and trend[0]["group"] == "trend over weight_decay (0, 0.1)"
  assert (trend[0]["effect"], trend[0]["n"]) == (pytest.approx(1.0), "4 / 4")
  assert not [r for r in group_stats.comparison_rows(run, groups.seed_groups(run))
              if r["test"] == "Jonckheere-Terpstra"]
  # dose response: one panel per numeric per-seed field, or only the named one
  fig = group_figures.plot_dose_response(run, str(tmp_path / "all.png"), "")
  assert [ax.get_xlabel() for ax in fig.axes] == ["optim.weight_decay", "optim.learning_rate"]
  fig = group_figures.plot_dose_response(run, str(tmp_path / "wd.png"), "", ["weight_decay"])
  (ax,) = fig.axes
  assert list(ax.containers[0].lines[0].get_ydata()) == pytest.approx([0.25, 0.75])
  assert os.path.exists(tmp_path / "wd.png")


def test_report_groups_seeds_across_the_jobs_of_a_job_axis(tmp_path):
  """Two jobs of depth 2 (d_model 16 and 32), weight decay 0 and 0.1 on each one's seed axis:
  grouped by d_model, the jobs' seeds are merged into one run, renumbered in job order."""
  runs = [_write_run(tmp_path / f"depth2-d_model{d}", {
      "num_seeds": 2, "first_seed": 5, "model": {"num_layers": 2, "d_model": d},
      "optim": {"weight_decay": [0.0, 0.1]}}, finals)
          for d, finals in ((16, [0.2, 0.4]), (32, [0.6, 1.0]))]
  assert groups.job_axis_runs(runs, []) == []
  assert groups.job_axis_runs(runs, ["weight_decay"]) == []  # per seed within each job
  (merged,) = groups.job_axis_runs(runs, ["d_model"])
  assert (merged.name, merged.depth, merged.config["num_seeds"]) == ("depth2_jobs", 2, 4)
  assert groups.per_seed_fields(merged.config) == {"model.d_model": [16, 16, 32, 32],
                                                   "optim.weight_decay": [0.0, 0.1, 0.0, 0.1]}
  # seed 5 of the second job is seed 2 of the merged run
  assert merged.series["out_of_domain/accuracy"][2][1].tolist() == [0.05, 0.6]
  by_width = groups.seed_groups(merged, ["d_model"])
  assert by_width == {"d_model=16": [0, 1], "d_model=32": [2, 3]}
  rows = {r["group"]: r for r in group_stats.group_rows(merged, by_width)}
  assert rows["d_model=16"]["out_of_domain/accuracy"] == pytest.approx(0.3)
  assert rows["d_model=32"]["out_of_domain/accuracy"] == pytest.approx(0.8)
  assert list(groups.seed_groups(merged, ["d_model", "weight_decay"])) == [
      "d_model=16, weight_decay=0.0", "d_model=16, weight_decay=0.1",
      "d_model=32, weight_decay=0.0", "d_model=32, weight_decay=0.1"]
