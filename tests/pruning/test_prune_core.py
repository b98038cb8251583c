"""Tests of the core-analysis CLI (`sg_jax.prune_core`) on a hand-built pruning table and masks
over a tiny two-seed, two-step workdir (2 layers x 2 heads: units l0_h0, l0_h1, l1_h0, l1_h1,
l0_mlp, l1_mlp): core sizes, inclusion frequencies, Jaccard overlaps and effective sizes against
hand-derived values, the core-ablation rows against the forced masks scored directly with
`evaluate.make_evaluator`, a rerun that changes nothing, and one-line errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from sg_jax import checkpointing
from sg_jax.pruning import core, core_table, evaluate, table
from sg_jax.pruning import core_driver as prune_core
from sg_jax.pruning import inputs as prune_inputs
import run_files  # pylint: disable=wrong-import-order  (tests/ is on the path)

SEEDS, STEPS, LEVELS = (3, 5), (0, 10), (0.25, 0.5)
NAMES = ["l0_h0", "l0_h1", "l1_h0", "l1_h1", "l0_mlp", "l1_mlp"]
ONES = "111111"
# (step, seed, level) -> the kept units of pruning seeds 0, 1, 2.
MASKS = {
    (0, 3, 0.5): ("110010", "111010", "110011"),    # core 110010
    (0, 3, 0.25): (ONES,) * 3,                      # core: every unit
    (0, 5, 0.5): ("100000", "010000", "001111"),    # core empty
    (0, 5, 0.25): (ONES,) * 3,
    (10, 3, 0.5): ("110110", "101110", "110101"),   # core 100100: l0_h0, l1_h1
    (10, 3, 0.25): ("111110", "110111", ONES),      # core 110110: 3 heads, l0_mlp
    (10, 5, 0.5): ("110011", "101100", "100110"),   # core 100000: l0_h0
    (10, 5, 0.25): (ONES,) * 3,
}
# Step 10, seed 3: accuracies [in_domain, out_of_domain] per level and pruning seed; full model
# (0.9, 0.5). Effective size per pruning seed (hand-derived, the first level from the top
# within 0.03 of the full model): in_domain 0.5, 0.75, 0.5; out_of_domain and mean 0.5, 0.75,
# 0.75.
ACC = {0.5: ((0.9, 0.5), (0.8, 0.1), (0.88, 0.3)), 0.25: ((0.9, 0.2), (0.9, 0.48), (0.9, 0.6))}
FULL = (0.9, 0.5)
NUM_LINES = 16


def _bits(text):
  return np.array([c == "1" for c in text])


def _write_tables(workdir):
  rows, by_step = [], {}
  for (step, seed, level), kept in MASKS.items():
    for ps, units in enumerate(kept):
      acc = ACC[level][ps] if (step, seed) == (10, 3) else (0.5, 0.25)
      rows += [(step, seed, level, ps, table.MARKER, 1 - _bits(units).mean()),
               (step, seed, level, ps, "in_domain/accuracy", acc[0]),
               (step, seed, level, ps, "out_of_domain/accuracy", acc[1])]
      by_step.setdefault(step, []).append((seed, level, ps, _bits(units)))
  for step in STEPS:
    for seed in SEEDS:
      rows += [(step, seed, 0.0, table.FULL_MODEL, "in_domain/accuracy", FULL[0]),
               (step, seed, 0.0, table.FULL_MODEL, "out_of_domain/accuracy", FULL[1])]
  table.PruningCsv(os.path.join(workdir, "pruning.csv")).append(rows)
  for step, runs in by_step.items():
    heads, mlp = core.split_units(np.stack([r[3] for r in runs]), 2, 2)
    table.save_masks(workdir, step, {
        "seed": np.array([r[0] for r in runs]), "sparsity": np.array([r[1] for r in runs]),
        "pruning_seed": np.array([r[2] for r in runs]), "head_mask": heads, "mlp_mask": mlp,
        "log_alpha_heads": np.zeros(heads.shape, np.float32),
        "log_alpha_mlp": np.zeros(mlp.shape, np.float32)})
  with open(os.path.join(workdir, "pruning.csv.options.json"), "w") as f:
    json.dump({"num_lines": NUM_LINES, "batch_size": 8, "ablation": "mean"}, f)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  root = run_files.random_checkpoint_workdir(
      tmp_path_factory.mktemp("prune_core"), STEPS, list(SEEDS), eval_lines=8,
      **{"eval.batch_size": 8, "model.num_layers": 2})
  _write_tables(root)
  return root


@pytest.fixture(scope="module")
def result(workdir):
  return prune_core.prune_core(workdir, num_draws=3)


def _values(workdir):
  return {(s, seed, None if math.isnan(lv) else lv, name): v
          for s, seed, lv, name, v in core_table.read_rows(
              os.path.join(workdir, "pruning_core.csv"))}


@pytest.mark.slow
def test_core_sizes_inclusion_and_jaccards_are_the_hand_derived_values(workdir, result):
  v = _values(workdir)
  with open(os.path.join(workdir, "pruning_core.csv")) as f:
    assert f.readline() == "step,seed,sparsity,name,value\n"
  assert len(result["groups"]) == 8
  expected = {  # (step, seed, level): (heads, mlps, jaccard_final, jaccard with the other seed)
      (10, 3, 0.5): (2, 0, 1.0, 0.5), (0, 3, 0.5): (2, 1, 0.25, 0.0),
      (10, 3, 0.25): (3, 1, 1.0, 4 / 6), (0, 3, 0.25): (4, 2, 4 / 6, 1.0),
      (10, 5, 0.5): (1, 0, 1.0, 0.5), (0, 5, 0.5): (0, 0, 0.0, 0.0),
      (10, 5, 0.25): (4, 2, 1.0, 4 / 6), (0, 5, 0.25): (4, 2, 1.0, 1.0)}
  for (step, seed, lv), (nh, nm, jf, js) in expected.items():
    other = 8 - seed
    assert v[(step, seed, lv, "core/num_heads")] == nh
    assert v[(step, seed, lv, "core/num_mlps")] == nm
    assert v[(step, seed, lv, "core/num_units")] == nh + nm
    assert v[(step, seed, lv, "core/jaccard_final")] == pytest.approx(jf, abs=1e-12)
    assert v[(step, seed, lv, f"core/jaccard_seed{other}")] == pytest.approx(js, abs=1e-12)
    assert (step, seed, lv, f"core/jaccard_seed{seed}") not in v
    kept = np.stack([_bits(m) for m in MASKS[(step, seed, lv)]])
    for u, name in enumerate(NAMES):
      assert v[(step, seed, lv, f"inclusion/{name}")] == pytest.approx(kept[:, u].mean())
      assert v[(step, seed, lv, f"in_core/{name}")] == float(kept[:, u].all())
  assert [v[(10, 3, 0.5, f"inclusion/{n}")] for n in NAMES] == pytest.approx(
      [1, 2 / 3, 1 / 3, 1, 2 / 3, 1 / 3])


def test_effective_size_rows_are_the_hand_derived_values(workdir, result):
  v = _values(workdir)
  t = 4.303  # t_{0.975, 2}
  for variant, sizes in (("in_domain", [0.5, 0.75, 0.5]), ("out_of_domain", [0.5, 0.75, 0.75]),
                         ("mean", [0.5, 0.75, 0.75])):
    mean, half = np.mean(sizes), t * np.std(sizes, ddof=1) / np.sqrt(3)
    assert v[(10, 3, None, f"effective_size/{variant}")] == pytest.approx(mean)
    # clipped to [0, 1]: 0.667 + 0.358 for out-of-domain and mean
    assert v[(10, 3, None, f"effective_size/{variant}/ci_low")] == pytest.approx(mean - half)
    assert v[(10, 3, None, f"effective_size/{variant}/ci_high")] == pytest.approx(
        min(mean + half, 1.0))
    # size 0.5 = 1 - 0.5, the highest level: those pruning seeds give only an upper bound
    assert v[(10, 3, None, f"effective_size/{variant}/at_highest_level")] == pytest.approx(
        np.mean(np.asarray(sizes) == 0.5))
  # Elsewhere every run has in-domain 0.5 < 0.87: no level qualifies, effective size 1.
  assert v[(0, 5, None, "effective_size/mean")] == 1.0
  rows, why = core_table.effective_size_rows(1, 2, {0.5: {0: {"in_domain/accuracy": 0.9,
                                                              "out_of_domain/accuracy": 0.5}}},
                                             {"in_domain/accuracy": 0.9,
                                              "out_of_domain/accuracy": 0.5})
  assert why is None and rows[0][3:] == ("effective_size/mean", 0.5)
  assert math.isnan(rows[1][4]) and math.isnan(rows[1][2])  # one pruning seed: no interval
  assert core_table.effective_size_rows(1, 2, {}, None) == (
      [], "no full-model accuracies in the pruning table")


def test_core_ablation_rows_equal_the_forced_masks_scored_directly(workdir, result):
  """Seed 3 and 5 at step 10, level 0.5: the full model, the core removed and the random draws
  (as many random non-core heads as the core has heads) scored with make_evaluator; seed 3 at
  0.25 has 3 core heads and 1 other head, so no random baseline; seed 5's step-0 core at 0.5
  is empty, so no ablation rows."""
  v = _values(workdir)
  assert (0, 5, 0.5, "core_ablation/in_domain/accuracy") not in v
  assert (10, 3, 0.25, "core_ablation/in_domain/loss") in v
  for group in ((10, 3, 0.25), (10, 5, 0.25)):  # too few heads outside the core: no random baseline
    assert group in result["evaluated"] and not [
        k for k in v if k[:3] == group and k[3].startswith("random_ablation/")]
  restored = checkpointing.restore(workdir, 10, params_only=True)
  data = prune_inputs.load_lines(restored, workdir, num_lines=NUM_LINES, batch_size=8, eval_lines=0)
  model_config, vocab, params_S, means_S = prune_inputs.seed_inputs(restored, [3, 5], data)
  evaluator = evaluate.make_evaluator(data["task"], model_config, vocab, data["eval"], "mean")
  cores = {3: _bits("100100"), 5: _bits("100000")}
  units = []
  for seed in (3, 5):
    _, draws = core.core_ablation_masks(cores[seed], 4, 3, core_table.draw_seed(10, seed, 0.5))
    for d in draws:  # every head but the core's count of random non-core heads; MLPs kept
      assert d[cores[seed]].all() and d[4:].all() and (~d[:4]).sum() == cores[seed][:4].sum()
    units.append(np.concatenate([np.ones((1, 6), bool), ~cores[seed][None], draws]))
  heads, mlp = core.split_units(np.stack(units), 2, 2)
  direct = evaluate.to_rows(evaluator(params_S, means_S, heads.astype(np.float32),
                                      mlp.astype(np.float32)))
  assert "out_of_domain/skip_relative_agreement" in direct
  for i, seed in enumerate((3, 5)):
    for metric, values in direct.items():
      got = [v[(10, seed, 0.5, f"full/{metric}")], v[(10, seed, 0.5, f"core_ablation/{metric}")]]
      got += [v[(10, seed, 0.5, f"random_ablation/{metric}/draw{k}")] for k in range(3)]
      assert got == pytest.approx(values[i], rel=1e-5, abs=1e-6), (seed, metric)
      assert v[(10, seed, 0.5, f"random_ablation/{metric}")] == pytest.approx(
          values[i, 2:].mean(), rel=1e-5, abs=1e-6)
    assert v[(10, seed, 0.5, "core_ablation/in_domain/loss")] != v[(10, seed, 0.5,
                                                                      "full/in_domain/loss")]


@pytest.mark.slow
def test_core_ablation_removes_the_core_heads_only_unless_all_units(workdir, result):
  """Step 0, seed 3, level 0.5, core 110010 (l0_h0, l0_h1 and l0_mlp): by default the core
  ablation removes the two heads and keeps l0_mlp; with ablate_units="all" (another output)
  it removes l0_mlp too; each equals its mask scored directly."""
  restored = checkpointing.restore(workdir, 0, params_only=True)
  data = prune_inputs.load_lines(restored, workdir, num_lines=NUM_LINES, batch_size=8, eval_lines=0)
  model_config, vocab, params_S, means_S = prune_inputs.seed_inputs(restored, [3], data)
  evaluator = evaluate.make_evaluator(data["task"], model_config, vocab, data["eval"], "mean")
  heads, mlp = core.split_units(np.stack([_bits("001111"), _bits("001101")])[None], 2, 2)
  direct = evaluate.to_rows(evaluator(params_S, means_S, heads.astype(np.float32),
                                      mlp.astype(np.float32)))
  all_units = prune_core.prune_core(workdir, output="core_all.csv", steps=[0], seeds=[3],
                                    sparsities=[0.5], num_draws=2, ablate_units="all")
  assert all_units["evaluated"] == [(0, 3, 0.5)]
  v = _values(workdir)
  w = {(s, seed, lv, n): x for s, seed, lv, n, x in core_table.read_rows(
      os.path.join(workdir, "core_all.csv"))}
  for metric, values in direct.items():
    assert v[(0, 3, 0.5, f"core_ablation/{metric}")] == pytest.approx(values[0, 0], rel=1e-5,
                                                                       abs=1e-6)
    assert w[(0, 3, 0.5, f"core_ablation/{metric}")] == pytest.approx(values[0, 1], rel=1e-5,
                                                                       abs=1e-6)
  assert (v[(0, 3, 0.5, "core_ablation/in_domain/loss")]
          != w[(0, 3, 0.5, "core_ablation/in_domain/loss")])
  with pytest.raises(ValueError, match="other options"):  # the file records ablate_units
    prune_core.prune_core(workdir, output="core_all.csv", steps=[0], seeds=[3],
                          sparsities=[0.5], num_draws=2)
  with pytest.raises(ValueError, match="--ablate_units"):
    prune_core.prune_core(workdir, output="core_bad.csv", ablate_units="mlps")


def test_compare_rows_are_the_hand_derived_head_overlaps(workdir, result):
  """Another table (as pruned with task:gen) with two subnetworks at step 10, seed 3, level
  0.5: heads 0111 and 1001 against this table's 1101, 1011, 1101 (core heads 1001)."""
  gen = "pruning_gen.csv"
  table.PruningCsv(os.path.join(workdir, gen)).append(
      [(10, 3, 0.5, ps, table.MARKER, 0.5) for ps in (0, 1)])
  heads, mlp = core.split_units(np.stack([_bits("011100"), _bits("100111")]), 2, 2)
  table.save_masks(workdir, 10, {
      "seed": np.array([3, 3]), "sparsity": np.array([0.5, 0.5]),
      "pruning_seed": np.array([0, 1]), "head_mask": heads, "mlp_mask": mlp,
      "log_alpha_heads": np.zeros(heads.shape, np.float32),
      "log_alpha_mlp": np.zeros(mlp.shape, np.float32)}, gen)
  out = prune_core.prune_core(workdir, output="core_cmp.csv", ablation=False, compare=[gen])
  assert len(out["groups"]) == 8
  v = {(s, seed, lv, n): x for s, seed, lv, n, x in core_table.read_rows(
      os.path.join(workdir, "core_cmp.csv"))}
  expected = {"num_subnetworks": 2, "jaccard_heads": 7 / 12, "jaccard_within_heads": 0.25,
              "core_heads_kept": 0.75, "jaccard_core_heads": 0.5}
  for name, value in expected.items():
    assert v[(10, 3, 0.5, f"compare/pruning_gen/{name}")] == pytest.approx(value), name
  assert not [k for k in v if k[3].startswith("compare/") and k[:3] != (10, 3, 0.5)]
  assert v[(10, 3, 0.5, "core/jaccard_within_heads")] == pytest.approx(2 / 3)
  assert math.isnan(core.mean_jaccard(np.ones((1, 4), bool)))  # one subnetwork: no pair
  assert math.isnan(core.core_kept(np.ones((2, 4), bool), np.zeros(4, bool)))  # empty core
  with pytest.raises(ValueError, match="--compare: no pruning table"):
    prune_core.prune_core(workdir, output="core_bad_compare.csv",
                          compare=["pruning_missing.csv"])
  assert not os.path.exists(os.path.join(workdir, "core_bad_compare.csv.options.json"))


def test_rerun_replaces_nothing_and_reuses_the_ablation_rows(workdir, result):
  path = os.path.join(workdir, "pruning_core.csv")
  before = open(path).read()
  assert len(result["evaluated"]) == 7 and result["table"].count("\n") == 8
  again = prune_core.prune_core(workdir, num_draws=3)
  assert again["evaluated"] == [] and sorted(again["reused"]) == sorted(result["evaluated"])
  assert open(path).read() == before
  only = prune_core.prune_core(workdir, steps=[10], seeds=[3], sparsities=[0.5],
                               ablation=False)
  assert only["groups"] == [(10, 3, 0.5)] and open(path).read() == before
  with pytest.raises(ValueError, match="other options"):
    prune_core.prune_core(workdir, num_draws=4)
  # A stored core that differs from the masks' (as after more pruning seeds): that group's
  # ablation rows are recomputed, the rest reused, and the table is the same again.
  old_values = _values(workdir)
  with open(path, "w") as f:
    f.write(before.replace("10,3,0.5,in_core/l1_h1,1.0", "10,3,0.5,in_core/l1_h1,0.0"))
  changed = prune_core.prune_core(workdir, num_draws=3)
  assert changed["evaluated"] == [(10, 3, 0.5)] and len(changed["reused"]) == 6
  new_values = _values(workdir)  # equal up to float32 rounding (another batch of masks)
  assert new_values.keys() == old_values.keys()
  assert [new_values[k] for k in old_values] == pytest.approx(list(old_values.values()),
                                                               rel=1e-5)


def test_bad_inputs_give_one_line_errors(workdir, tmp_path):
  with pytest.raises(ValueError, match="no pruning table"):
    prune_core.prune_core(str(tmp_path))
  for kwargs, match in ((dict(seeds=[9]), r"seeds \[9\] are not in the pruning table"),
                        (dict(steps=[7]), r"steps \[7\] are not"),
                        (dict(sparsities=[0.7]), r"sparsity levels \[0.7\] are not")):
    with pytest.raises(ValueError, match=match):
      prune_core.prune_core(workdir, ablation=False, output="other.csv", **kwargs)
  with pytest.raises(ValueError, match="--sparsity must be"):
    prune_core.parse_levels("0.5,2")
  bare = tmp_path / "bare"
  bare.mkdir()
  table.PruningCsv(str(bare / "pruning.csv")).append([(20, 0, 0.5, 0, table.MARKER, 0.5)])
  with pytest.raises(ValueError, match="step 20 has runs in the pruning table but no masks"):
    prune_core.prune_core(str(bare), ablation=False)
  out = subprocess.run([sys.executable, "-m", "sg_jax.prune_core", f"--workdir={tmp_path}"],
                       capture_output=True, text=True, check=False,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1] == (
      f"error: no pruning table {tmp_path}/pruning.csv; run python -m sg_jax.prune first")
