"""Tests of the report (`sg_jax.report`) on hand-written sweep roots: every figure and table is
written, early stopping follows the stated first/last-best rule, missing analysis panels are
skipped with a note, a single workdir works, and a folder without metrics.csv is named."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from sg_jax.report import build as report
from sg_jax.report import group_figures, group_markdown, group_stats, groups, plotting

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = [0, 100, 200, 300, 400]
# depth -> seed -> (in-domain accuracy, generalisation accuracy) per step.
CURVES = {
    2: {0: ([0.2, 0.99, 1.0, 1.0, 1.0], [0.1, 0.05, 0.3, 0.6, 0.9]),
        1: ([0.2, 0.9, 1.0, 0.98, 1.0], [0.1, 0.2, 0.1, 0.4, 0.5])},
    4: {0: ([0.1, 0.5, 0.95, 1.0, 1.0], [0.0, 0.1, 0.2, 0.85, 0.95]),
        1: ([0.1, 0.6, 1.0, 1.0, float("nan")], [0.0, 0.1, 0.2, 0.3, float("nan")])},
}


def _write(path, rows):
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["step", "seed", "name", "value"])
    w.writerows(rows)


def _make_run(workdir, depth, analysis=True):
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"task": "question", "model": {"num_layers": depth},
               "train": {"num_steps": STEPS[-1]}}, f)
  rows = []
  for seed, (acc_in, acc_gen) in CURVES[depth].items():
    for t, step in enumerate(STEPS):
      rows += [(step, seed, "in_domain/accuracy", acc_in[t]),
               (step, seed, "out_of_domain/accuracy", acc_gen[t]),
               (step, seed, "train/loss", 3.0 - t * 0.5)]
      if analysis:  # depth 2 also logged the rule agreements, depth 4 did not
        rows += [(step, seed, "out_of_domain/move_first_agreement", 1.0 - acc_gen[t]),
                 (step, seed, "out_of_domain/skip_relative_agreement", 0.5),
                 (step, seed, "out_of_domain/accuracy/RC-obj", acc_gen[t] / 2),
                 (step, seed, "out_of_domain/accuracy/RC-subj", 1.0)]
  _write(os.path.join(workdir, "metrics.csv"), rows)
  if analysis:
    _write(os.path.join(workdir, "analysis.csv"),
           [(step, seed, name, value) for seed in CURVES[depth] for step in STEPS
            for name, value in (("weight_norm", 10 + step / 100), ("tscore", step / 1000),
                                ("tparseval_f1", step / 800),
                                ("tparseval_f1_right_branching", 0.6),
                                ("tparseval_f1_length4", step / 400),
                                ("tparseval_f1_length6", step / 1600))])


@pytest.fixture()
def sweep_root(tmp_path):
  root = tmp_path / "qf"
  _make_run(str(root / "depth2"), 2, analysis=True)
  _make_run(str(root / "depth4"), 4, analysis=False)
  with open(root / "sweep.json", "w") as f:
    json.dump({"jobs": {"2": {"workdir": "depth2"}, "4": {"workdir": "depth4"}}}, f)
  return str(root)


def test_early_stopping_tie_breaking():
  steps = np.array(STEPS)
  acc_in, acc_gen = map(np.array, CURVES[2][0])
  assert report.early_stopping(steps, acc_in, steps, acc_gen, "first") == (200, 0.3)
  assert report.early_stopping(steps, acc_in, steps, acc_gen, "last") == (400, 0.9)
  # Within a tolerance of 0.01, 0.99 at step 100 ties with 1.0.
  assert report.early_stopping(steps, acc_in, steps, acc_gen, "first", 0.01) == (100, 0.05)
  with pytest.raises(ValueError, match="first"):
    report.early_stopping(steps, acc_in, steps, acc_gen, "middle")
  assert report.first_reaching(steps, acc_in, 0.99) == 100


def test_sweep_report_writes_every_figure_and_table(sweep_root):
  result = report.build_report(sweep_root)
  out = os.path.join(sweep_root, "report")
  names = sorted(os.path.basename(p) for p in result["figures"])
  # trajectories only where analysis rows exist, rules only where the agreement rows exist
  # (both depth 2, not depth 4)
  assert names == ["constructions_depth2.png", "dynamics_tparseval_f1.png", "dynamics_tscore.png",
                   "dynamics_weight_norm.png", "early_stopping.png",
                   "grokking_depth2.png", "grokking_depth4.png", "inverted_u.png",
                   "losses_depth2.png", "losses_depth4.png", "predictors_by_depth.png",
                   "predictors_final.png", "predictors_saturation.png", "rules_depth2.png",
                   "seed_spread.png", "tparseval_by_length.png", "trajectories_depth2.png"]
  for path in result["figures"]:
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # attention sparsity and the training dynamics (CKA, TVD, TwoNN) have no rows; depth 4's seed
  # 1 logged NaN at step 400: diverged, it counts in no summary (docs/reliability.md)
  assert len(result["skipped"]) == 5
  assert result["skipped"][-1] == ("diverged seeds, left out of every figure, mean, interval, "
                                   "correlation and test: depth4: seed 1 at step 400")
  md = open(os.path.join(out, "summary.md")).read()
  assert "dynamics_attention_sparsity_paper.png skipped" in md and "first best" in md
  assert "right-branching F1 (final)" in md  # the parse baseline beside tparseval
  # the predictors (depth 2's analysis rows, 2 seeds: too few for a correlation, so NaN cells)
  assert "## Predictors of generalisation" in md
  with open(os.path.join(out, "summary_predictors.csv")) as f:
    predictors_csv = list(csv.DictReader(f))
  assert {(r["predictor"], r["moment"]) for r in predictors_csv} >= {("tscore", "final"),
                                                                     ("tscore", "saturation")}
  # ... and per depth: only depth 2 has analysis rows; its final tscore mean is 0.4.
  assert "## Predictors per depth" in md
  with open(os.path.join(out, "summary_predictors_by_depth.csv")) as f:
    by_depth = {(r["predictor"], r["moment"], r["depth"]): r for r in csv.DictReader(f)}
  assert {d for _, _, d in by_depth} == {"2"}
  assert float(by_depth[("tscore", "final", "2")]["mean"]) == pytest.approx(0.4)
  rows = {int(r["depth"]): r for r in csv.DictReader(open(os.path.join(out, "summary.csv")))}
  assert rows[2]["seeds_above_threshold"] == "1" and rows[4]["seeds_above_threshold"] == "1"
  assert float(rows[2]["final_generalisation_mean"]) == pytest.approx(0.7)
  # depth 2: first best -> steps 200 (0.3) and 200 (0.1); last best -> 400 (0.9), 400 (0.5).
  assert float(rows[2]["early_stop_first_generalisation_mean"]) == pytest.approx(0.2)
  assert float(rows[2]["early_stop_last_generalisation_mean"]) == pytest.approx(0.7)
  # depth 4 seed 1 diverged at the last step: it is in no row (its last finite value, 0.3, is
  # not a trained seed's final one); depth 4's mean is seed 0's alone.
  seeds = list(csv.DictReader(open(os.path.join(out, "summary_seeds.csv"))))
  assert [r["seed"] for r in seeds if r["depth"] == "4"] == ["0"]
  assert float(rows[4]["final_generalisation_mean"]) == pytest.approx(0.95)
  assert float(rows[2]["final_tscore_mean"]) == pytest.approx(0.4)
  # The main table's weight norm is the global one (10 + 400 / 100 at the last step), named so
  # beside the predictor tables' per-layer norm.
  assert float(rows[2]["final_weight_norm_mean"]) == pytest.approx(14.0)
  assert "global weight norm (final)" in md
  assert rows[4]["final_tscore_mean"] == ""
  assert float(rows[2]["final_tparseval_f1_right_branching_mean"]) == pytest.approx(0.6)
  # Depth 2's finals are 0.9 and 0.5: mean 0.7, s = 0.2828, t_{1, 0.975} = 12.706: the 95%
  # t-interval is 0.7 +- 2.541 (2 seeds say almost nothing; a bootstrap gave [0.5, 0.9]).
  assert (float(rows[2]["final_generalisation_ci_low"]),
          float(rows[2]["final_generalisation_ci_high"])) == (pytest.approx(-1.841, abs=1e-3),
                                                              pytest.approx(3.241, abs=1e-3))
  assert "gen. acc. (final): mean [95% t-CI, n=2]" in md and "| 0.7 [-1.84, 3.24] |" in md
  # 1 of 2 seeds above 0.8 at the end: Clopper-Pearson [0.0126, 0.9874]; seed 0 first crosses
  # at step 400, seed 1 never (censored at 400): Kaplan-Meier median 400; no seed is above 0.8
  # at each of its last 3 evaluations; Sarle's b is not shown below 6 seeds.
  assert (float(rows[2]["fraction_above_threshold_ci_low"]),
          float(rows[2]["fraction_above_threshold_ci_high"])) == (
              pytest.approx(0.01258, abs=1e-4), pytest.approx(0.9874, abs=1e-4))
  assert "| 1/2 [0.01, 0.99] |" in md
  assert (rows[2]["seeds_crossed"], rows[2]["generalisation_crossing_median"],
          rows[2]["seeds_sustained"]) == ("1", "400", "0")
  header = next(line for line in md.splitlines() if line.startswith("| depth | seeds |"))
  assert rows[2]["final_generalisation_bimodality"] == "" and "Sarle" not in header
  assert "| hierarchical 1 |" in md  # seeds per final rule instead
  # the trend over depth (2 and 1 or 2 seeds) cannot reach p <= 0.05: computed, not claimed
  assert "Trend of the final generalisation over depth" in md and "not testable at this n" in md
  # Depth 2 seed 0 agrees most with move-first (1 - gen) until gen passes 0.5 at step 300: one
  # switch, ending hierarchical. Seed 1 stays on move-first and ends in a three-way tie at 0.5.
  by_seed = {r["seed"]: r for r in seeds if r["depth"] == "2"}
  assert (by_seed["0"]["final_rule"], by_seed["0"]["rule_switches"]) == ("hierarchical", "1")
  assert (by_seed["1"]["final_rule"], by_seed["1"]["rule_switches"]) == ("", "0")
  assert float(by_seed["0"]["generalisation_oscillation"]) == pytest.approx(
      np.std([0.1, 0.05, 0.3, 0.6, 0.9]), rel=1e-3)
  depth4_seed0 = next(r for r in seeds if r["depth"] == "4")  # no rule agreement rows
  assert depth4_seed0["rule_switches"] == "" and rows[4]["rule_switches_mean"] == ""
  assert "## Seeds" in md


@pytest.mark.slow
def test_single_workdir_and_cli(sweep_root, tmp_path):
  workdir = os.path.join(sweep_root, "depth2")
  out = str(tmp_path / "figs")
  done = subprocess.run([sys.executable, "-m", "sg_jax.report", f"--root={workdir}",
                         f"--out_dir={out}", "--threshold=0.6"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert "depth 2: 2 seeds" in done.stdout
  assert os.path.exists(os.path.join(out, "grokking_depth2.png"))
  assert not os.path.exists(os.path.join(out, "grokking_depth4.png"))


def test_root_without_metrics_is_named(tmp_path):
  empty = tmp_path / "nothing_here"
  empty.mkdir()
  with pytest.raises(report.ReportError, match="nothing_here"):
    report.build_report(str(empty))
  done = subprocess.run([sys.executable, "-m", "sg_jax.report", f"--root={empty}"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode != 0 and "no metrics.csv in" in done.stderr
  assert "nothing_here" in done.stderr


def test_subfolders_without_sweep_json_are_found(sweep_root):
  os.remove(os.path.join(sweep_root, "sweep.json"))
  assert [os.path.basename(p) for p in report.find_runs(sweep_root)] == ["depth2", "depth4"]
  assert math.isnan(report.final_value(np.array([1, 2]), np.array([np.nan, np.nan]))[1])


def _texts(fig):
  """Every title, suptitle and annotation of a figure."""
  suptitle = fig._suptitle  # pylint: disable=protected-access
  out = [suptitle.get_text()] if suptitle is not None else []
  for ax in fig.axes:
    out += [ax.title.get_text()] + [t.get_text() for t in ax.texts]
  return out


def _renderer(fig):
  """An Agg renderer of a figure the report has closed (its layout as saved)."""
  from matplotlib.backends import backend_agg  # pylint: disable=import-outside-toplevel
  canvas = backend_agg.FigureCanvasAgg(fig)
  canvas.draw()
  return canvas.get_renderer()


def _legends_outside_axes(fig):
  """True iff the figure has a legend and no legend's box intersects any axes' box."""
  renderer = _renderer(fig)
  legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + fig.legends
  from matplotlib.transforms import Bbox  # pylint: disable=import-outside-toplevel
  for legend in legends:
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
      if Bbox.intersection(box, ax.get_window_extent(renderer)) is not None:
        return False
  return bool(legends)


@pytest.mark.slow
def test_figures_keep_legends_off_the_data_fractions_in_range_and_state_sentences(sweep_root,
                                                                                     tmp_path):
  with open(os.path.join(sweep_root, "depth2", "analysis.csv.options.json"), "w") as f:
    json.dump({"split": "train", "num_sentences": 1000, "sentences_used": {
        "attention_entropy": 1000, "tree_projection": 998, "label": "`quest` lines of train"}}, f)
  runs = [report.load_run(os.path.join(sweep_root, d)) for d in ("depth2", "depth4")]
  out = str(tmp_path)
  # rules: the move-first agreement peaks (0.95 at step 100) where an in-axes legend sat.
  fig = report.plot_rules(runs[:1], 2, os.path.join(out, "rules.png"), 0.99)
  assert _legends_outside_axes(fig)
  for make in (lambda p: report.plot_grokking(runs[:1], 2, p, 0.99),
               lambda p: report.plot_trajectories(runs[:1], 2, p, 0.99),
               lambda p: report.plot_dynamics({2: runs[:1], 4: runs[1:]}, "tscore", p, "")):
    assert _legends_outside_axes(make(os.path.join(out, "fig.png")))
  # inverted U: a fraction, so [0, 1] plus a small margin, and every count label inside.
  seed_rows = report.seed_summary(runs, 0.8, 0.99, 0.0)
  depth_rows = report.depth_summary(seed_rows)
  depth_rows[0] = {**depth_rows[0], "fraction_above_threshold": 1.0, "seeds_above_threshold": 2}
  fig = report.plot_inverted_u(depth_rows, os.path.join(out, "u.png"), 0.8, "")
  ax = fig.axes[0]
  low, high = ax.get_ylim()
  assert -0.1 <= low <= 0 and 1 <= high <= 1.1
  renderer = _renderer(fig)
  assert [t.get_text() for t in ax.texts] == ["2/2", "1/1"]  # depth 4's seed 1 diverged
  for text in ax.texts:
    box, frame = text.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert frame.y0 <= box.y0 and box.y1 <= frame.y1
  # analysis figures name the sentences the analysis read; weight_norm reads none.
  fig = report.plot_trajectories(runs[:1], 2, os.path.join(out, "t.png"), 0.99)
  assert any("998 'quest' lines of train" in t for t in _texts(fig)), _texts(fig)
  fig = report.plot_dynamics({2: runs[:1]}, "tscore", os.path.join(out, "d.png"), "")
  assert any("analysis on 998 'quest' lines of train" in t for t in _texts(fig)), _texts(fig)
  fig = report.plot_dynamics({2: runs[:1]}, "weight_norm", os.path.join(out, "w.png"), "")
  assert not any("lines of" in t for t in _texts(fig))
  # depth 2 has no entropy rows: the tree-projection count only; with entropy rows both.
  assert report.analysis_sentences(runs[:1], ["attention_sparsity_paper", "tscore"]) == \
      "analysis on 998 'quest' lines of train"
  both = report.Run(**{**runs[0].__dict__, "series": {
      **runs[0].series, "attention_sparsity_paper": runs[0].series["tscore"]}})
  assert report.analysis_sentences([both], ["attention_sparsity_paper", "tscore"]) == (
      "analysis on 1000 (entropy) / 998 (tree projections) 'quest' lines of train")
  report.build_report(sweep_root, out)
  with open(os.path.join(out, "summary.md")) as f:
    assert "`depth2`: analysis on 998 'quest' lines of train" in f.read()
  os.remove(os.path.join(sweep_root, "depth2", "analysis.csv.options.json"))
  runs[0] = report.load_run(os.path.join(sweep_root, "depth2"))
  assert report.analysis_sentences(runs[:1], ["tscore"]).startswith(
      "analysis on an unknown number of sentences")


def test_seed_groups_of_a_run_with_per_seed_config_values(tmp_path):
  """Seeds given different values of a per-seed config field form groups, compared with CIs."""
  from sg_jax.report import groups
  workdir = tmp_path / "regimes"
  os.makedirs(workdir)
  lambdas = [0.0, 0.0, 0.0, 0.01, 0.01, 0.01]
  with open(workdir / "config.json", "w") as f:
    json.dump({"task": "question", "num_seeds": 6, "first_seed": 10, "model": {"num_layers": 2},
               "sas": {"lambdas": lambdas, "window": [0, 0]}, "train": {"num_steps": 400}}, f)
  steps = np.arange(0, 2001, 50)
  rows = []
  for k, lam in enumerate(lambdas):
    onset = 600 if lam == 0 else 1400  # suppressed seeds rise later
    uas = 0.1 + 0.6 / (1 + np.exp(-(steps - onset) / 60.0))
    for step, u in zip(steps, uas):
      gen = 0.5 + 0.1 * k if step == 2000 else 0.2
      # The last seed of each group ends on skip-relative after leaving move-first at 1000.
      skip = 0.9 if (k % 3 == 2 and step == 2000) else 0.1
      rows += [(step, 10 + k, "in_domain/uas", u),
               (step, 10 + k, "out_of_domain/accuracy", gen),
               (step, 10 + k, "out_of_domain/accuracy/pp", 1.0 if step == 2000 else 0.0),
               (step, 10 + k, "out_of_domain/accuracy/rc_object", 0.1 * k),
               (step, 10 + k, "out_of_domain/move_first_agreement", 0.8 if step < 1000 else 0.0),
               (step, 10 + k, "out_of_domain/skip_relative_agreement", skip)]
  _write(workdir / "metrics.csv", rows)
  run = report.load_run(str(workdir))
  assert groups.per_seed_fields(run.config) == {"sas.lambdas": lambdas}
  found = groups.seed_groups(run)
  assert found == {"lambdas=0.0": [10, 11, 12], "lambdas=0.01": [13, 14, 15]}
  table = {r["group"]: r for r in group_stats.group_rows(run, found)}
  # finals 0.5, 0.6, 0.7 -> mean 0.6, s = 0.1, t_{2, 0.975} = 4.303: 0.6 +- 0.2484; onsets at
  # the midpoints
  assert table["lambdas=0.0"]["out_of_domain/accuracy"] == pytest.approx(0.6)
  assert (table["lambdas=0.0"]["out_of_domain/accuracy_ci_low"],
          table["lambdas=0.0"]["out_of_domain/accuracy_ci_high"]) == (
              pytest.approx(0.3516, abs=1e-4), pytest.approx(0.8484, abs=1e-4))
  # generalisation 0.2 until the last step (2000): finals 0.8, 0.9, 1.0 for lambdas=0.01, of
  # which 0.9 and 1.0 cross 0.8 (at 2000); none of lambdas=0.0 does (median not reached).
  assert table["lambdas=0.01"]["gen_above_seeds"] == "2/3"
  assert table["lambdas=0.01"]["gen_crossing_median"] == 2000
  assert table["lambdas=0.0"]["gen_crossing_median"] == math.inf
  # against the first group: 3 + 3 seeds, the most extreme split (p = 2/20 = 0.1) is the
  # smallest reachable p, so every test there is "not testable at this n"
  compared = group_stats.comparison_rows(run, found)
  tests = {r["quantity"]: r for r in compared if r["reference"]}
  final = tests["final generalisation"]
  assert (final["effect"], final["p"], final["min_p"], final["n"]) == (
      pytest.approx(0.3), pytest.approx(0.1), pytest.approx(0.1), "3 vs 3")
  assert not final["testable"] and not tests["seeds gen. > 0.8 at the end"]["testable"]
  assert tests["seeds gen. > 0.8 at the end"]["effect"] == pytest.approx(2 / 3)
  assert tests["first step gen. > 0.8"]["test"] == "log-rank"
  assert tests["final rc_object"]["effect"] == pytest.approx(0.3)
  # the trend over the one numeric per-seed field: 2 levels of 3 seeds, every seed of 0.01
  # above every seed of 0.0: tau = 1, p = 2/20, not testable either
  trend = compared[-1]
  assert (trend["group"], trend["test"], trend["n"]) == (
      "trend over lambdas (0, 0.01)", "Jonckheere-Terpstra", "3 / 3")
  assert (trend["effect"], trend["p"], trend["testable"]) == (1.0, pytest.approx(0.1), False)
  assert final["p_holm"] == pytest.approx(min(1.0, 0.1 * len(compared)))
  assert table["lambdas=0.0"]["structure_onset_median"] == pytest.approx(600, abs=60)
  assert table["lambdas=0.01"]["structure_onset_median"] == pytest.approx(1400, abs=60)
  # per construction: finals of rc_object are 0.1 k -> group means 0.1 and 0.4; pp all 1.0
  assert table["lambdas=0.0"]["out_of_domain/accuracy/rc_object"] == pytest.approx(0.1)
  assert table["lambdas=0.01"]["out_of_domain/accuracy/rc_object"] == pytest.approx(0.4)
  assert table["lambdas=0.01"]["out_of_domain/accuracy/pp_ci_low"] == pytest.approx(1.0)
  # rules: every seed follows move-first before step 1000, then the hierarchical rule (gen 0.2
  # against 0.1 and 0); at the last step seed 12 ends on skip-relative (0.9 > gen 0.7: 2
  # switches), seed 15 stays hierarchical (gen 1.0 > 0.9: 1 switch), the others hierarchical.
  assert table["lambdas=0.0"]["final_rules"] == "hierarchical 2, skip_relative 1"
  assert table["lambdas=0.0"]["rule_switches_mean"] == pytest.approx(4 / 3)
  assert table["lambdas=0.01"]["final_rules"] == "hierarchical 3"
  assert table["lambdas=0.01"]["rule_switches_mean"] == pytest.approx(1.0)
  result = report.build_report(str(workdir))
  assert any(p.endswith("groups_regimes.png") for p in result["figures"])
  assert any(p.endswith("dose_response_regimes.png") for p in result["figures"])
  md = open(os.path.join(result["out_dir"], "summary.md")).read()
  assert "## Seed groups" in md and "lambdas=0.01" in md
  assert "| rc_object (final): mean [95% t-CI, n=3] |" in md
  assert "hierarchical 2, skip_relative 1" in md
  assert "### Seed groups against the first group" in md
  assert ("| regimes | lambdas=0.01 | lambdas=0.0 | final generalisation | permutation "
          "(difference of means) | 3 vs 3 | 0.3 | 0.1 |") in md
  assert "not testable at this n (smallest p 0.1)" in md


def test_seed_group_table_and_band_with_few_values():
  """A one-seed group shows no interval; a band of fewer than 3 points is drawn with markers."""
  acc = "out_of_domain/accuracy"
  rows = [{"run": "r", "group": "a", "seeds": "3", acc: 0.5, f"{acc}_ci_low": 0.5,
           f"{acc}_ci_high": 0.5},
          {"run": "r", "group": "b", "seeds": "4 5", acc: 0.6, f"{acc}_ci_low": 0.4,
           f"{acc}_ci_high": 0.8}]
  md = "\n".join(group_markdown.markdown_lines(rows))
  assert "| r | a | 3 | 0.5 (1 seed, no CI) |" in md and "| r | b | 4 5 | 0.6 [0.4, 0.8] |" in md
  plt = plotting.pyplot()
  fig, ax = plt.subplots()
  plotting.mean_band(ax, np.array([400]), {400: [2.8, 2.9]}, "C0")
  plotting.mean_band(ax, np.array([0, 1, 2]), {0: [1.0], 1: [2.0], 2: [3.0]}, "C1")
  assert [line.get_marker() for line in ax.lines] == ["o", "None"]
  assert ax.lines[0].get_ydata()[0] == pytest.approx(2.85)
  plt.close(fig)


def test_uas_dynamics_of_a_fresh_run_read_its_logged_uas(tmp_path, uas_quantity_registered):
  """A run with `in_domain/uas` in metrics.csv and no analysis.csv (a fresh SAS run) gets
  dynamics_uas.png from the logged rows (`Dynamic.logged_as`); its title says so."""
  from sg_jax.report import depth_figures, reading
  workdir = str(tmp_path / "sas")
  _make_run(workdir, 2, analysis=False)
  with open(os.path.join(workdir, "metrics.csv"), "a", newline="") as f:
    csv.writer(f).writerows([(step, seed, "in_domain/uas", 0.2 + step / 1000)
                             for seed in CURVES[2] for step in STEPS])
  run = reading.load_run(workdir)
  path = str(tmp_path / "dynamics_uas.png")
  fig = depth_figures.plot_dynamics({2: [run]}, "uas", path, "")
  assert fig is not None and os.path.exists(path)
  ax = fig.axes[0]
  assert "in_domain/uas of metrics.csv" in ax.get_title()
  drawn = sorted({tuple(np.round(line.get_ydata(), 6)) for line in ax.get_lines()
                  if len(line.get_ydata()) == len(STEPS)})
  assert tuple(np.round([0.2 + s / 1000 for s in STEPS], 6)) in drawn
  # without the logged rows either, nothing is drawn
  run.series.pop("in_domain/uas")
  assert depth_figures.plot_dynamics({2: [run]}, "uas", path + "2", "") is None


def test_objectives_of_a_depth_sweep_are_not_pooled_across_depths(tmp_path):
  """The runs of one objective at depths 2 and 4: one row per depth, each its own seeds' final
  preference (0.9 and 0.5, not their pooled 0.7), and a depth column; one depth: no column."""
  from sg_jax.report import objectives, reading
  runs = []
  for depth, final in ((4, 0.5), (2, 0.9)):
    workdir = tmp_path / f"depth{depth}"
    os.makedirs(workdir)
    with open(workdir / "config.json", "w") as f:
      json.dump({"task": "question", "model": {"num_layers": depth}, "num_seeds": 2}, f)
    _write(str(workdir / "metrics.csv"),
           [(step, seed, name, value) for seed in (0, 1) for step in STEPS
            for name, value in (("out_of_domain/preference", final * step / STEPS[-1]),
                                ("in_domain/preference", 1.0))])
    runs.append(reading.load_run(str(workdir)))
  rows = objectives.objective_rows(runs)
  assert [(r["objective"], r["depth"], r["seeds"]) for r in rows] == [("lm", 2, 2), ("lm", 4, 2)]
  assert [r["out_of_domain/preference"] for r in rows] == [pytest.approx(0.9), pytest.approx(0.5)]
  lines = objectives.markdown_lines(rows)
  assert lines[3].startswith("| objective | depth | seeds |")
  assert any(l.startswith("| lm | 4 | 2 | 1.000") for l in lines)
  single = objectives.objective_rows(runs[:1])
  assert [(r["depth"], r["seeds"]) for r in single] == [(None, 2)]
  assert objectives.markdown_lines(single)[3].startswith("| objective | seeds |")
  fig = objectives.plot_objectives(runs, str(tmp_path / "o.png"))
  assert {t.get_text() for t in fig.axes[-1].get_legend().get_texts()} == {
      "lm, depth 2 (1 run(s))", "lm, depth 4 (1 run(s))"}


def test_objectives_side_by_side(tmp_path):
  """Two runs of different objectives: one row each with the seed mean of the final preference
  and its CI, the median onsets; a masked LM's accuracy series are its preference; a run's
  regularised seeds (SAS lambda != 0) are left out of its objective's row."""
  from sg_jax.report import groups, objectives, reading
  steps = np.arange(0, 2_001, 100)
  sigmoid = lambda t0: 1.0 / (1.0 + np.exp(-(steps - t0) / 60.0))
  for name, finals, onset in (("lm", (0.9, 0.7), 800), ("mlm", (0.6, 0.5, 0.0), 1200)):
    workdir = tmp_path / "root" / name
    os.makedirs(workdir)
    with open(workdir / "config.json", "w") as f:
      json.dump({"task": "question", "objective": name, "model": {"num_layers": 2},
                 "num_seeds": len(finals), "sas": {"lambdas": [0.0] * 2 + [0.5] * (len(finals) - 2)},
                 "tree": {"lambdas": [0.0]}}, f)
    rows = []
    for seed, final in enumerate(finals):
      rows += [(int(s), seed, "out_of_domain/preference", 0.3 + (final - 0.3) * v)
               for s, v in zip(steps, sigmoid(onset))]
      rows += [(int(s), seed, "in_domain/preference", 0.95) for s in steps]
      rows += [(int(s), seed, "in_domain/uas", 0.2 + 0.3 * v)
               for s, v in zip(steps, sigmoid(onset - 300))]
      rows += [(int(s), seed, "train/loss", 3.0 - 2.0 * v)
               for s, v in zip(steps, sigmoid(onset - 300))]
      if name == "lm":
        rows += [(int(s), seed, "out_of_domain/accuracy", 0.5) for s in steps]
    _write(str(workdir / "metrics.csv"), rows)
  runs = [reading.load_run(str(tmp_path / "root" / n)) for n in ("mlm", "lm")]
  assert runs[0].accuracy_from == "preference" and runs[1].accuracy_from == ""
  assert runs[0].series[report.GEN_ACC] is runs[0].series["out_of_domain/preference"]
  table = {r["objective"]: r for r in objectives.objective_rows(runs)}
  assert list(table) == ["lm", "mlm"]  # fixed order
  assert objectives.unregularised_seeds(runs[0]) == [0, 1] and table["mlm"]["seeds"] == 2
  assert table["lm"]["out_of_domain/preference"] == pytest.approx(0.8, abs=1e-3)
  assert table["mlm"]["out_of_domain/preference"] == pytest.approx(0.55, abs=1e-3)
  assert table["lm"]["out_of_domain/preference_ci_low"] <= 0.8 <= table["lm"][
      "out_of_domain/preference_ci_high"]
  assert table["lm"]["preference_onset_median"] == pytest.approx(800, abs=100)
  assert table["mlm"]["structure_onset_median"] == pytest.approx(900, abs=100)
  assert table["mlm"]["structure_with_loss_drop"] == 1.0  # UAS and loss move together
  assert (table["mlm"]["structure_past_start"], table["mlm"]["structure_at_start"]) == (2, 0)
  lines = objectives.markdown_lines(list(table.values()))
  assert lines[1] == "## Objectives" and any(l.startswith("| mlm | 2 | 0.950") for l in lines)
  result = report.build_report(str(tmp_path / "root"))
  assert os.path.join(result["out_dir"], "objectives.png") in result["figures"]
  assert any("show the minimal-pair preference" in note for note in result["skipped"])
  # One report per objective: a depth's seeds are never pooled across objectives (the mlm
  # row is its preference, 0.6 / 0.5 / 0.0 at the end; the lm row its accuracy, 0.5).
  for name in ("lm", "mlm"):
    assert os.path.exists(os.path.join(result["out_dir"], name, "summary.md"))
  finals = {r["objective"]: r["final_generalisation_mean"] for r in result["depths"]}
  assert finals["lm"] == pytest.approx(0.5) and finals["mlm"] == pytest.approx(1.1 / 3, abs=2e-3)
  with open(os.path.join(result["out_dir"], "summary.md")) as f:
    top = f.read()
  assert "## Objectives" in top and "[mlm/summary.md](mlm/summary.md)" in top
  # The mlm run's seed groups (SAS lambdas 0 / 0.5): its borrowed panels say what they show.
  fig = group_figures.plot_groups(runs[0], groups.seed_groups(runs[0]), str(tmp_path / "g.png"), "")
  titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
  assert "in-domain preference (minimal pairs)" in titles
  assert not any(t.endswith("accuracy") for t in titles)


def test_time_to_generalise_figure_draws_each_groups_kaplan_meier_curve(tmp_path):
  """Group a: seeds first above 0.8 at steps 100 and 200; group b: one seed at 300, one never
  (censored at its last step, 400): the curves are the fractions crossed, 0 -> 1/2 -> 1 and
  0 -> 1/2, with the censored seed's cross at (400, 1/2)."""
  steps = np.array([0, 100, 200, 300, 400])
  crossing = {0: 100, 1: 200, 2: 300, 3: None}
  gen = {s: (steps, np.where(steps >= (c if c is not None else 10**9), 0.9, 0.1))
         for s, c in crossing.items()}
  run = report.Run(workdir="/nonexistent", name="wd", depth=2, task="question", num_steps=400,
                   series={"out_of_domain/accuracy": gen})
  fig = group_figures.plot_time_to_generalise(run, {"a": [0, 1], "b": [2, 3]},
                                              str(tmp_path / "km.png"), "", 0.8)
  assert os.path.exists(tmp_path / "km.png")
  lines = fig.axes[0].get_lines()
  curves = [l for l in lines if l.get_drawstyle().startswith("steps")]
  assert [list(l.get_xdata()) for l in curves] == [[0, 100, 200], [0, 300]]
  np.testing.assert_allclose(curves[0].get_ydata(), [0, 0.5, 1.0])
  np.testing.assert_allclose(curves[1].get_ydata(), [0, 0.5])
  censored = [l for l in lines if l.get_marker() == "x" and len(l.get_xdata())]
  assert [(list(l.get_xdata()), list(l.get_ydata())) for l in censored] == [([400.0], [0.5])]
  labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert labels[0].startswith("a: 2/2 cross; median 100") and labels[1].startswith("b: 1/2 cross")
  assert group_figures.plot_time_to_generalise(run, {"a": [0, 1, 2, 3]}, str(tmp_path / "x.png"),
                                               "", 0.8) is None  # one group: nothing to compare


def _four_evaluation_run(num_seeds=2):
  steps = np.array([0, 100, 200, 300])
  gen = {s: (steps, np.array([0.1, 0.3, 0.2, 0.4]) + 0.1 * s) for s in range(num_seeds)}
  ind = {s: (steps, np.array([0.2, 0.9, 1.0, 1.0])) for s in range(num_seeds)}
  # seed 1's tscore lies far above seed 0's: on separate y-scales the two would look alike
  tscore = {s: (steps, np.array([0.1, 0.12, 0.15, 0.2]) + 0.6 * s) for s in range(num_seeds)}
  return report.Run(workdir="/nonexistent", name="quick", depth=2, task="question",
                    num_steps=300, series={"out_of_domain/accuracy": gen,
                                           "in_domain/accuracy": ind, "tscore": tscore})


def test_seed_table_names_the_evaluations_its_std_is_over():
  from sg_jax.report import tables  # pylint: disable=import-outside-toplevel
  rows = report.seed_summary([_four_evaluation_run()], 0.8, 0.99, 0.0)
  assert [r["generalisation_oscillation_evaluations"] for r in rows] == [4, 4]
  assert rows[0]["generalisation_oscillation"] == pytest.approx(np.std([0.1, 0.3, 0.2, 0.4]))
  lines = tables._seed_lines(rows)  # pylint: disable=protected-access
  assert "| gen. acc. std, last 4 evaluations |" in lines[3]
  rows[1]["generalisation_oscillation_evaluations"] = 5
  assert "| gen. acc. std, last 5 evaluations (4 where a seed has fewer) |" in \
      tables._seed_lines(rows)[3]  # pylint: disable=protected-access


def test_trajectories_share_the_y_scale_of_a_row(tmp_path):
  fig = report.plot_trajectories([_four_evaluation_run()], 2, str(tmp_path / "t.png"), 0.99)
  axes = np.array(fig.axes).reshape(-1, 2)  # rows x seeds
  for row in axes:
    assert row[0].get_ylim() == row[1].get_ylim()
  low, high = axes[1, 0].get_ylim()
  assert low <= 0.1 and high >= 0.8  # both seeds' tscore inside the shared scale
