"""Tests of the pruning CLI (`sg_jax.prune`) on a tiny two-seed workdir: the CSV's columns and
rows per run, the masks file, a rerun that adds nothing, a larger grid that trains and adds only
the new runs, a failed command that writes nothing, and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from sg_jax import checkpointing
from sg_jax.pruning import driver as prune
from sg_jax.pruning import table
import run_files  # pylint: disable=wrong-import-order  (tests/ is on the path)

# Subprocesses / end-to-end runs (minutes on 2 cores): the full set only (pyproject.toml).
pytestmark = pytest.mark.slow


SEEDS = [3, 5]
STEP = 10
FAST = dict(num_steps=12, sparsity_warmup_steps=8, num_lines=16, batch_size=8, eval_lines=8,
            steps_per_call=5)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """Checkpoints at steps 0 and 10 of two seeds (1 layer, 2 heads) on generated question data."""
  return run_files.random_checkpoint_workdir(tmp_path_factory.mktemp("prune_run"), (0, STEP),
                                             SEEDS, eval_lines=8, **{"eval.batch_size": 8})


def test_writes_every_run_and_resumes_without_duplicates(workdir):
  path = os.path.join(workdir, "pruning.csv")
  with open(path, "w"):
    pass  # an empty file gets its header too
  result = prune.prune(workdir, sparsities=[0.3, 0.6], pruning_seeds=2, **FAST)
  assert result["runs"] == 8 and result["steps"] == [STEP]
  with open(path) as f:
    assert f.readline() == "step,seed,sparsity,pruning_seed,name,value\n"
  rows = table.read_rows(path)
  runs = {(r[1], r[2], r[3]) for r in rows if r[4] == "achieved_sparsity"}
  assert runs == {(s, lv, p) for s in SEEDS for lv in (0.3, 0.6) for p in (0, 1)}
  names = {r[4] for r in rows if r[3] != table.FULL_MODEL}
  for name in ("achieved_sparsity", "achieved_sparsity_params", "expected_sparsity",
               "final_objective", "lambda1", "lambda2", "kl", "in_domain/accuracy",
               "out_of_domain/accuracy", "in_domain/move_first_agreement",
               "out_of_domain/skip_relative_agreement", "in_domain/loss"):
    assert name in names, name
  full = [r for r in rows if r[3] == table.FULL_MODEL]
  assert {(r[0], r[1], r[2]) for r in full} == {(STEP, s, 0.0) for s in SEEDS}
  for r in rows:  # 1 layer x 2 heads + 1 MLP: achieved sparsity in thirds, closed / 3 exactly
    if r[4] == "achieved_sparsity":
      assert r[5] in (0.0, 1 / 3, 2 / 3, 1.0), r
    if r[4] == "kl":
      assert r[5] >= -1e-6
  masks = table.load_masks(workdir, STEP)
  assert masks["head_mask"].shape == (8, 1, 2) and masks["mlp_mask"].shape == (8, 1)
  by_run = {(int(s), float(lv), int(p)): 1 - (h.sum() + m.sum()) / 3 for s, lv, p, h, m in zip(
      masks["seed"], masks["sparsity"], masks["pruning_seed"], masks["head_mask"],
      masks["mlp_mask"])}
  for r in rows:
    if r[4] == "achieved_sparsity":
      assert by_run[(r[1], r[2], r[3])] == pytest.approx(r[5])

  before = open(path).read()
  again = prune.prune(workdir, sparsities=[0.3, 0.6], pruning_seeds=2, **FAST)
  assert again["runs"] == 0 and open(path).read() == before
  more = prune.prune(workdir, sparsities=[0.3, 0.6], pruning_seeds=3, seeds=[5], **FAST)
  # pruning seed 2 of seed 5 at both levels, and only those are trained
  assert more["runs"] == more["runs_trained"] == 2
  rows = table.read_rows(path)
  keys = [(r[1], r[2], r[3]) for r in rows if r[4] == "achieved_sparsity"]
  assert len(keys) == len(set(keys)) == 10
  assert len(table.load_masks(workdir, STEP)["seed"]) == 10
  # Seed 3 lacks pruning seed 2 (seed 5 has it) and both lack level 0.45: 5 pairs trained for
  # both seeds, the 8 missing runs written, the masks file gains those 8.
  mixed = prune.prune(workdir, sparsities=[0.3, 0.45, 0.6], pruning_seeds=3, **FAST)
  assert (mixed["runs"], mixed["runs_trained"]) == (8, 10)
  keys = [(r[1], r[2], r[3]) for r in table.read_rows(path) if r[4] == "achieved_sparsity"]
  assert len(keys) == len(set(keys)) == 18
  assert set(keys) == {(s, lv, p) for s in SEEDS for lv in (0.3, 0.45, 0.6) for p in range(3)}
  masks = table.load_masks(workdir, STEP)
  assert len({(int(s), float(lv), int(p)) for s, lv, p in zip(
      masks["seed"], masks["sparsity"], masks["pruning_seed"])}) == len(masks["seed"]) == 18
  with pytest.raises(ValueError, match="other options.*--num_steps=12 for this table"):
    prune.prune(workdir, sparsities=[0.3], pruning_seeds=1, **{**FAST, "num_steps": 13})


def test_a_failed_command_leaves_no_table_behind(workdir):
  """An unknown seed is refused before anything is written, so the next command (with other
  options) is not blocked by an empty table and options file."""
  path = os.path.join(workdir, "pruning_failed.csv")
  with pytest.raises(ValueError, match=r"seeds \[7\] are not in the run"):
    prune.prune(workdir, sparsities=[0.5], seeds=[7], output="pruning_failed.csv", **FAST)
  assert not os.path.exists(path) and not os.path.exists(path + ".options.json")
  result = prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, output="pruning_failed.csv",
                       **{**FAST, "num_steps": 10})
  assert result["runs"] == 2 and os.path.exists(path + ".options.json")


def test_bad_inputs_give_one_line_errors(workdir, tmp_path):
  for text in ("0.3,1.0", "0", "abc", "0.5,0.5"):
    with pytest.raises(ValueError, match="--sparsities"):
      prune.parse_sparsities(text)
  with pytest.raises(checkpointing.CheckpointError, match="does not exist"):
    prune.prune(str(tmp_path / "missing"), sparsities=[0.5])
  with pytest.raises(checkpointing.CheckpointError, match="no checkpoint for steps"):
    prune.prune(workdir, sparsities=[0.5], steps=[7], last_only=False)
  with pytest.raises(ValueError, match="--objective"):
    prune.prune(workdir, sparsities=[0.5], objective="entropy")
  with pytest.raises(ValueError, match="^--pruning_seeds must be >= 1, got 0; --num_lines must "
                     "be >= 0, got -1$"):
    prune.prune(workdir, sparsities=[0.5], pruning_seeds=0, num_lines=-1)
  out = subprocess.run([sys.executable, "-m", "sg_jax.prune", f"--workdir={workdir}",
                        "--sparsities=0.5,1.5"], capture_output=True, text=True, check=False,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1] == (
      "error: --sparsities must be distinct numbers in (0, 1), got '0.5,1.5'")


def test_task_and_train_minus_gen_objectives_write_their_own_tables(workdir):
  """`task:gen` (the gen lines' LM loss) and `train_minus_gen` (training minus gen loss) prune
  every run into their own tables, with finite final objectives (task: a cross-entropy, > 0)
  and the objective recorded beside each table; an unknown split is a one-line error."""
  if table.load_masks(workdir, STEP) is None:  # run alone: the first test's masks are not there
    prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, **FAST)
  default_masks = table.load_masks(workdir, STEP)
  for objective, output in (("task:gen", "pruning_gen.csv"),
                            ("train_minus_gen", "pruning_tmg.csv")):
    result = prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, objective=objective,
                         output=output, **FAST)
    assert result["runs"] == 2
    own = table.load_masks(workdir, STEP, output)  # pruning/<table>/masks_step<N>.npz
    assert table.masks_path(workdir, STEP, output) == os.path.join(
        workdir, "pruning", output[:-4], f"masks_step{STEP}.npz")
    assert sorted(own["seed"].tolist()) == sorted(SEEDS) and set(own["sparsity"]) == {0.5}
    after = table.load_masks(workdir, STEP)  # the default table's masks are left as they were
    for k in table.MASK_FIELDS:
      np.testing.assert_array_equal(after[k], default_masks[k])
    rows = table.read_rows(os.path.join(workdir, output))
    final = [r[5] for r in rows if r[4] == "final_objective"]
    assert len(final) == 2 and all(np.isfinite(final))
    if objective.startswith("task"):
      assert min(final) > 0  # a cross-entropy
    with open(os.path.join(workdir, output + ".options.json")) as f:
      assert f'"objective": "{objective}"' in f.read()
  with pytest.raises(ValueError, match="cannot read split 'nope'"):
    prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, objective="task:nope",
                output="pruning_nope.csv", **FAST)


def test_step_selection_of_the_pruning_clis():
  """--steps: 'last', 'all' and a list map to prune()/prune_core()'s keyword arguments."""
  from sg_jax.config.cli_options import step_selection
  assert step_selection(" Last ") == {"steps": None, "last_only": True}
  assert step_selection("all") == {"steps": None, "last_only": False}
  assert step_selection("0,3000") == {"steps": [0, 3000], "last_only": False}
  with pytest.raises(ValueError, match="--steps must be 'all' or comma-separated integers"):
    step_selection("3k")


def test_lr_warmup_is_an_option_and_old_tables_read_as_200(workdir, caplog):
  """`lr_warmup_steps` is recorded beside the table; a table written before the option existed
  resumes as the original's 200 and refuses another value; a sparsity warm-up longer than
  `num_steps` warns that the runs stop short of their target."""
  import json  # pylint: disable=import-outside-toplevel
  output = "pruning_lr.csv"
  opt_path = os.path.join(workdir, output + ".options.json")
  prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, output=output, **FAST)
  with open(opt_path) as f:
    options = json.load(f)
  assert options["lr_warmup_steps"] == 200
  assert options["eval_lines"] == FAST["eval_lines"]  # the claims read the line count from it
  del options["lr_warmup_steps"]  # as a table from before the option
  with open(opt_path, "w") as f:
    json.dump(options, f)
  assert prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, output=output,
                     **FAST)["runs"] == 0
  with pytest.raises(ValueError, match="lr_warmup_steps"):
    prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, output=output, lr_warmup_steps=4,
                **FAST)
  with pytest.raises(ValueError, match="--lr_warmup_steps must be >= 0"):
    prune.prune(workdir, sparsities=[0.5], lr_warmup_steps=-1, output="pruning_x.csv", **FAST)
  with caplog.at_level("WARNING", logger="sg_jax.prune"):
    prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, output="pruning_short.csv",
                **{**FAST, "sparsity_warmup_steps": 24})
  assert any("longer than --num_steps (12): the runs end at 50% of their target" in r.message
             for r in caplog.records)
