"""Tests of the report's pruning figures and summary section (`sg_jax.report.pruning_figures`,
`pruning_tables`) on a hand-written workdir: pruning.csv, one masks file and pruning_core.csv
with known values; the figures are written with their names, the summary numbers equal the
hand-computed ones, and a workdir without pruning files gets no section and no error."""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pytest

from sg_jax.pruning import core_table
from sg_jax.pruning import table
from sg_jax.report import build as report
from sg_jax.report import pruning_tables

IN, GEN = "in_domain/accuracy", "out_of_domain/accuracy"
# (seed, level, pruning seed) -> (in-domain acc., out-of-domain acc., achieved sparsity, kl)
RUNS = {
    (0, 0.25, 0): (0.99, 0.5, 1 / 3, 0.1), (0, 0.25, 1): (0.95, 0.7, 1 / 6, 0.3),
    (0, 0.5, 0): (0.98, 0.2, 0.5, 0.4), (0, 0.5, 1): (0.90, 0.79, 0.5, 0.6),
    (1, 0.25, 0): (0.6, 0.6, 0.25, 0.2), (1, 0.25, 1): (0.7, 0.5, 0.25, 0.2),
    (1, 0.5, 0): (0.5, 0.4, 0.5, 0.5), (1, 0.5, 1): (0.4, 0.3, 0.5, 0.7),
}
FULL = {0: (1.0, 0.8), 1: (0.7, 0.6)}
# Masks of step 200 (2 layers x 2 heads): (seed, level, pruning seed) -> (head_mask, mlp_mask).
MASKS = {
    (0, 0.25, 0): ([[1, 1], [1, 0]], [1, 1]), (0, 0.25, 1): ([[1, 0], [1, 1]], [1, 1]),
    (0, 0.5, 0): ([[1, 0], [0, 1]], [1, 0]), (0, 0.5, 1): ([[1, 0], [1, 0]], [0, 1]),
    (1, 0.25, 0): ([[1, 1], [1, 1]], [0, 1]), (1, 0.25, 1): ([[1, 1], [0, 1]], [1, 1]),
    (1, 0.5, 0): ([[0, 1], [0, 1]], [1, 1]), (1, 0.5, 1): ([[0, 1], [1, 0]], [0, 1]),
}


def _make_workdir(path, pruning=True, core_csv=True):
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"task": "question", "model": {"num_layers": 2}, "train": {"num_steps": 200}}, f)
  with open(os.path.join(path, "metrics.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["step", "seed", "name", "value"])
    for seed in (0, 1):
      for step in (100, 200):
        w.writerows([(step, seed, IN, 0.9), (step, seed, GEN, 0.5)])
  if not pruning:
    return
  rows = []
  for step in (100, 200):
    shift = 0.0 if step == 200 else -0.1  # step 100: every accuracy 0.1 lower
    for seed, (a, b) in FULL.items():
      rows += [(step, seed, 0.0, -1, IN, a + shift), (step, seed, 0.0, -1, GEN, b + shift)]
    for (seed, level, ps), (a, b, sp, kl) in RUNS.items():
      rows += [(step, seed, level, ps, IN, a + shift), (step, seed, level, ps, GEN, b + shift),
               (step, seed, level, ps, "kl", kl), (step, seed, level, ps, table.MARKER, sp)]
  table.PruningCsv(os.path.join(path, "pruning.csv")).append(rows)
  keys = sorted(MASKS)
  table.save_masks(path, 200, {
      "seed": np.array([k[0] for k in keys]), "sparsity": np.array([k[1] for k in keys]),
      "pruning_seed": np.array([k[2] for k in keys]),
      "head_mask": np.array([MASKS[k][0] for k in keys], bool),
      "mlp_mask": np.array([MASKS[k][1] for k in keys], bool),
      "log_alpha_heads": np.zeros((len(keys), 2, 2), np.float32),
      "log_alpha_mlp": np.zeros((len(keys), 2), np.float32)})
  if core_csv:
    named = {"core/num_heads": 2.0, "core/num_mlps": 2.0,
             "full/" + IN: 1.0, "full/" + GEN: 0.8, "core_ablation/" + IN: 0.3,
             "core_ablation/" + GEN: 0.1, "random_ablation/" + IN: 0.9,
             f"random_ablation/{IN}/draw0": 0.85, f"random_ablation/{IN}/draw1": 0.95,
             "random_ablation/" + GEN: 0.6, f"random_ablation/{GEN}/draw0": 0.5,
             f"random_ablation/{GEN}/draw1": 0.7}
    core_table.write_rows(os.path.join(path, "pruning_core.csv"),
                          [(200, 0, 0.25, n, v) for n, v in named.items()])


def _table_row(lines, prefix):
  found = [l for l in lines if l.startswith(prefix)]
  assert len(found) == 1, (prefix, found)
  return [c.strip() for c in found[0].strip("|").split("|")]


def test_figures_and_summary(tmp_path):
  workdir = str(tmp_path / "run")
  _make_workdir(workdir)
  result = report.build_report(workdir, pruning_all_steps=True)
  names = {os.path.basename(f) for f in result["figures"]}
  expected = {"pruning_accuracy_run.png", "pruning_accuracy_run_step100.png",
              "pruning_accuracy_run_step200.png", "pruning_inclusion_run.png",
              "pruning_effective_size_run.png", "pruning_core_ablation_run.png"}
  assert expected <= names
  for name in expected:
    assert os.path.getsize(os.path.join(result["out_dir"], name)) > 1000
  with open(os.path.join(result["out_dir"], "summary.md")) as f:
    lines = f.read().split("\n")
  assert "## Pruning" in lines
  # seed 0, level 0.25: achieved (1/3 + 1/6) / 2, KL (0.1 + 0.3) / 2, in-domain [0.95, 0.99],
  # gen [0.5, 0.7], core = units kept by both masks: heads l0_h0, l1_h0 and both MLPs.
  assert _table_row(lines, "| run | 200 | 0 | 0.25 | 2 | 0.25 |")[4:] == [
      "2", "0.25", "0.2", "[0.95, 0.99]", "[0.5, 0.7]", "2", "2", "1 / 0.3 / 0.9",
      "0.8 / 0.1 / 0.6"]
  # seed 0, level 0.5: core = l0_h0 only, no MLP; no ablation rows.
  assert _table_row(lines, "| run | 200 | 0 | 0.5 | 2 | 0.5 |")[4:] == [
      "2", "0.5", "0.5", "[0.9, 0.98]", "[0.2, 0.79]", "1", "0", "", ""]
  # seed 1, level 0.5: head l0_h1 and MLP l1 kept by both.
  assert _table_row(lines, "| run | 200 | 1 | 0.5 | 2 | 0.5 |")[9:11] == ["1", "1"]
  # Beside random masks (seed 0, level 0.25): two masks of 3 of the 4 heads share 2 or 3 heads
  # (hypergeometric: 3 with probability 1/4), so E[core] = 4 (3/4)^2 = 2.25, P(>= 2) = 1; the
  # observed head Jaccard {0,1,2} vs {0,2,3} is 2/4, the random one 1/4 * 1 + 3/4 * 2/4.
  assert _table_row(lines, "| run | 200 | 0 | 0.25 | 2 | 2.25")[4:] == [
      "2", "2.25 [2, 3]", "1", "0.5", "0.625 [0.5, 1]"]
  # Effective size of seed 0 at step 200 (tolerance 0.03): in-domain, pruning seed 0 keeps
  # 0.98 >= 0.97 at 0.5 (size 0.5), seed 1 none (size 1): mean 0.75, half-width
  # t(0.975, 1) * std([0.5, 1]) / sqrt(2) = 12.706 * 0.25; out-of-domain sizes 1 and 0.5;
  # averaged accuracies (full 0.9): 0.745, 0.59, 0.825, 0.845 all < 0.87, sizes 1 and 1.
  seed_row = _table_row(lines, "| run | 200 | 0 | 1 | 0.8 |")
  assert seed_row[5] == "1 [1, 1]"
  # The interval 0.75 -+ 3.18 is clipped to [0, 1], in summary.md and the CSV alike. One of
  # the two pruning seeds qualified at 0.5, the highest level tried: a bound, marked ≤.
  assert seed_row[6] == seed_row[7] == "≤0.75 [0, 1]"
  with open(os.path.join(result["out_dir"], "summary_pruning_seeds.csv")) as f:
    seed_csv = next(r for r in csv.DictReader(f) if r["step"] == "200" and r["seed"] == "0")
  for v in ("in_domain", "out_of_domain"):
    assert float(seed_csv[f"effective_size_{v}"]) == pytest.approx(0.75)
    assert (float(seed_csv[f"effective_size_{v}_ci_low"]),
            float(seed_csv[f"effective_size_{v}_ci_high"])) == (0.0, 1.0)
    assert float(seed_csv[f"effective_size_{v}_at_highest_level"]) == 0.5
  assert float(seed_csv["effective_size_mean_at_highest_level"]) == 0.0
  with open(os.path.join(result["out_dir"], "summary_pruning.csv")) as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 4
  assert float(rows[0]["achieved_sparsity_mean"]) == round(0.25, 4)


def test_effective_sizes_match_a_loop(tmp_path):
  workdir = str(tmp_path / "run")
  _make_workdir(workdir, core_csv=False)
  data = pruning_tables.load_pruning(workdir, "run")
  sizes = pruning_tables.effective_sizes(data)
  for seed in (0, 1):
    assert list(sizes[seed]["step"]) == [100, 200]
    for t, step in enumerate((100, 200)):
      shift = 0.0 if step == 200 else -0.1
      for k, variant in enumerate(("in_domain", "out_of_domain")):
        per_seed = []
        for ps in (0, 1):
          size = 1.0
          for level in (0.5, 0.25):  # high to low; the first within 0.03 decides
            if RUNS[(seed, level, ps)][k] + shift >= FULL[seed][k] + shift - 0.03:
              size = 1.0 - level
              break
          per_seed.append(size)
        assert math.isclose(sizes[seed][variant][t], np.mean(per_seed))
  level_rows, _ = pruning_tables.summary_rows(data)
  assert all(math.isnan(r["core_ablation_out_of_domain"]) for r in level_rows)
  assert pruning_tables.markdown_lines(level_rows, [])[1] == "## Pruning"


def test_no_pruning_files(tmp_path):
  workdir = str(tmp_path / "run")
  _make_workdir(workdir, pruning=False)
  result = report.build_report(workdir)
  assert not any("pruning" in os.path.basename(f) for f in result["figures"])
  assert not any(n.startswith("pruning") or "pruning" in n
                 for n in os.listdir(result["out_dir"]))
  with open(os.path.join(result["out_dir"], "summary.md")) as f:
    assert "## Pruning" not in f.read()
  assert pruning_tables.load_pruning(workdir, "run") is None


def test_ablation_cell_says_na_without_a_random_baseline():
  """A core with more heads than lie outside it has no random baseline: the cell says n/a."""
  from sg_jax.report import pruning_tables
  row = {"full_acc": 1.0, "core_ablation_acc": 0.336, "random_ablation_acc": float("nan")}
  assert pruning_tables._ablation(row, "acc") == "1 / 0.336 / n/a"  # pylint: disable=protected-access
  empty = {k: float("nan") for k in row}
  assert pruning_tables._ablation(empty, "acc") == ""  # pylint: disable=protected-access


def test_summary_lists_the_compare_rows_of_another_objective(tmp_path):
  """pruning_core.csv rows from `prune_core --compare=pruning_gen.csv` become a table of their
  own in summary.md, one line per (seed, level, other table), with the values as written."""
  workdir = str(tmp_path / "run")
  _make_workdir(workdir, core_csv=False)
  named = {"core/jaccard_within_heads": 0.8, "compare/pruning_gen/jaccard_heads": 0.45,
           "compare/pruning_gen/jaccard_within_heads": 0.6,
           "compare/pruning_gen/core_heads_kept": 0.75,
           "compare/pruning_gen/jaccard_core_heads": 0.25}
  core_table.write_rows(os.path.join(workdir, "pruning_core.csv"),
                        [(200, 1, 0.5, n, v) for n, v in named.items()])
  level_rows, seed_rows = pruning_tables.summary_rows(pruning_tables.load_pruning(workdir, "run"))
  lines = pruning_tables.markdown_lines(level_rows, seed_rows)
  assert _table_row(lines, "| run | 200 | 1 | 0.5 | pruning_gen |") == [
      "run", "200", "1", "0.5", "pruning_gen", "0.8", "0.6", "0.45", "0.75", "0.25"]
  assert not [l for l in lines if l.startswith("| run | 200 | 0 | 0.25 | pruning_gen")]
  row = next(r for r in level_rows if (r["seed"], r["sparsity"]) == (1, 0.5))
  assert row["compare_pruning_gen_core_heads_kept"] == 0.75  # flat keys, for the CSV
  no_compare = [{k: v for k, v in r.items() if not k.startswith("compare_")} for r in level_rows]
  assert not any("other table" in l for l in pruning_tables.markdown_lines(no_compare, []))


def test_summary_clips_effective_size_intervals_to_0_1():
  """Two pruning seeds give wide t intervals; summary.md shows them clipped to [0, 1], as the
  figure draws them, and the mean unchanged."""
  from sg_jax.pruning import core
  from sg_jax.report import pruning_tables
  row = {"run": "run", "step": 100, "seed": 0, "full_in_domain": 1.0, "full_out_of_domain": 0.5}
  for v in core.VARIANTS:
    row.update({f"effective_size_{v}": 0.6, f"effective_size_{v}_ci_low": -0.67,
                f"effective_size_{v}_ci_high": 1.87})
  lines = pruning_tables.markdown_lines([], [row])
  cells = _table_row(lines, "| run | 100 | 0 | 1 | 0.5 |")
  assert cells[5:] == ["0.6 [0, 1]"] * len(core.VARIANTS)


def test_accuracy_figure_zooms_draws_stars_beneath_and_offsets_seeds(tmp_path):
  """In-domain accuracies of the fixture lie in [0.4, 1.0]: the x-axis spans them (not 0-1),
  every full-model star is drawn beneath the subnetworks' dots, and the two seeds' points are
  offset by equal and opposite amounts around their values."""
  from sg_jax.report import pruning_figures
  workdir = str(tmp_path / "run")
  _make_workdir(workdir)
  data = pruning_tables.load_pruning(workdir, "run")
  fig = pruning_figures.plot_accuracy(data, 200, str(tmp_path / "acc.png"))
  ax = fig.axes[0]
  low, high = ax.get_xlim()
  assert 0.3 < low < 0.4 and high == pytest.approx(1.02)
  stars = [c for c in ax.collections if "full model" in c.get_label()]
  dots = [c for c in ax.collections if "subnetworks" in c.get_label()]
  assert len(stars) == len(dots) == 2
  assert max(c.get_zorder() for c in stars) < min(c.get_zorder() for c in dots)
  # level 0.25 panel: seed 0's in-domain accuracies 0.99, 0.95; seed 1's 0.6, 0.7.
  x0 = sorted(dots[0].get_offsets()[:, 0])
  x1 = sorted(dots[1].get_offsets()[:, 0])
  d0, d1 = x0[0] - 0.95, x1[0] - 0.6
  assert d0 == pytest.approx(-d1) and d0 < 0 and abs(d0) < 0.02
  assert x0[1] - 0.99 == pytest.approx(d0)
