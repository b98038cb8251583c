"""Tests of the analysis CLI (`sg_jax.analyze`) on a tiny two-seed workdir with two checkpoints:
all four metric groups written for every checkpoint and seed, nothing recomputed on a rerun,
option changes refused, crash-cut CSV lines tolerated."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import checkpointing, configlib
from sg_jax.analysis import driver as analyze
from sg_jax.analysis import weight_norm
from sg_jax.config import cli_options
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import init_params
from sg_jax.runtime import stop_signal
import run_files  # pylint: disable=wrong-import-order  (tests/ is on the path)

tasks = pytest.importorskip("sg_jax.tasks")
if not hasattr(tasks, "get_task"):
  pytest.skip("sg_jax.tasks (data module) not available yet", allow_module_level=True)

STEPS = (0, 10)
SEEDS = [3, 5]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return run_files.random_checkpoint_workdir(tmp_path_factory.mktemp("run"), STEPS, SEEDS)


def _rows(path):
  with open(path, newline="") as f:
    return [r for r in csv.reader(f) if len(r) == 4][1:]


@pytest.mark.slow
def test_writes_every_metric_then_nothing_new(workdir):
  result = analyze.analyze(workdir, num_sentences=12, batch_size=4)
  assert result["checkpoints_analysed"] == 2
  rows = _rows(os.path.join(workdir, "analysis.csv"))
  assert {r[2] for r in rows} >= {"attention_entropy_mean", "attention_entropy_l0_h0"}
  for name in ("weight_norm", "weight_norm_per_layer", "attention_sparsity_paper",
               "attention_entropy_reference", "attention_entropy_l0_h1", "tscore",
               "tparseval_f1", "tparseval_precision", "tparseval_recall",
               "tparseval_f1_right_branching", "tparseval_f1_left_branching",
               "tparseval_f1_random"):
    for step in STEPS:
      for seed in SEEDS:
        assert sum(r[:3] == [str(step), str(seed), name] for r in rows) == 1, (step, seed, name)
  assert len(rows) == result["rows_written"]
  # values: weight norm of seed 5 at step 10 equals a direct computation.
  restored = checkpointing.restore(workdir, 10, params_only=True)
  direct = float(weight_norm.weight_norm_over_seeds(restored.state["params"])[1])
  got = [float(r[3]) for r in rows if r[:3] == ["10", "5", "weight_norm"]]
  np.testing.assert_allclose(got, [direct], rtol=1e-6)
  f1 = [float(r[3]) for r in rows if r[2] == "tparseval_f1"]
  assert all(0 < v <= 1 for v in f1)
  # Per-length rows: one per length of the sentences read, for every (step, seed).
  by_length = {r[2] for r in rows if r[2].startswith("tparseval_f1_length")}
  assert by_length and all(sum(r[:3] == [str(step), str(seed), name] for r in rows) == 1
                           for name in by_length for step in STEPS for seed in SEEDS)

  # second run: nothing new; a line cut by a crash is tolerated.
  with open(os.path.join(workdir, "analysis.csv"), "a") as f:
    f.write("10,5,tsco")
  assert analyze.analyze(workdir, num_sentences=12, batch_size=4)["rows_written"] == 0
  assert analyze.analyze(workdir, num_sentences=12, steps=[10], seeds=[5],
                         groups=["tscore"])["rows_written"] == 0
  assert len(_rows(os.path.join(workdir, "analysis.csv"))) == len(rows)  # cut line ignored
  with open(os.path.join(workdir, "analysis.csv")) as f:
    text = f.read()  # the cut line is cut off, so later rows start on a line of their own
  assert not any(line == "10,5,tsco" for line in text.split("\n")) and text.endswith("\n")

  # the command line, same options: nothing new.
  out = subprocess.run(
      [sys.executable, "-m", "sg_jax.analyze", f"--workdir={workdir}", "--num_sentences=12",
       "--steps=0,10", "--seeds=all"], capture_output=True, text=True, timeout=120,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert out.returncode == 0, out.stderr
  assert "0 new rows" in out.stdout


def _signal_while_computing(monkeypatch, at_step, dropped=False):
  """Sends SIGINT to this process while `analyze` computes the rows of `at_step`; `dropped`: the
  handler's exception is swallowed, as when the signal lands in a callback (JAX's GC callback)."""
  original = analyze._compute_rows  # pylint: disable=protected-access

  def computing(step, *args, **kwargs):
    rows = original(step, *args, **kwargs)
    if step == at_step:
      try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the handler runs here
      except stop_signal.StopNow:
        if not dropped:
          raise
    return rows

  monkeypatch.setattr(analyze, "_compute_rows", computing)


@pytest.mark.parametrize("dropped", [False, True])
def test_a_stopped_analysis_keeps_the_checkpoints_before_and_the_rerun_completes_it(
    workdir, tmp_path, monkeypatch, dropped):
  """SIGINT at step 10 stops at once (step 0's rows are in the file, step 10's are not); one
  dropped in a callback at step 0 stops before step 10; either way the rerun's file equals an
  uninterrupted analysis's, row for row."""
  options = dict(num_sentences=12, groups=["weight_norm", "tscore"], batch_size=4)
  copy = shutil.copytree(workdir, str(tmp_path / "run"))
  straight = analyze.analyze(copy, output="straight.csv", **options)
  expected = _rows(os.path.join(copy, "straight.csv"))
  handler = signal.getsignal(signal.SIGINT)  # SIG_IGN when the suite runs as a background job
  _signal_while_computing(monkeypatch, at_step=0 if dropped else 10, dropped=dropped)
  with pytest.raises(stop_signal.Preempted, match=r"stopped by signal 2 at step 10 \("):
    analyze.analyze(copy, output="stopped.csv", **options)
  monkeypatch.undo()
  kept = _rows(os.path.join(copy, "stopped.csv"))
  assert kept and kept == [r for r in expected if r[0] == "0"]
  assert signal.getsignal(signal.SIGINT) is handler  # the analysis's handlers uninstalled
  rerun = analyze.analyze(copy, output="stopped.csv", **options)
  assert rerun["checkpoints_analysed"] == 1
  assert _rows(os.path.join(copy, "stopped.csv")) == expected
  assert len(expected) == straight["rows_written"]


def test_groups_needing_what_the_task_lacks_are_dropped_or_refused(caplog):
  from sg_jax.analysis import registry
  tscore = registry.Group("tscore", ("tscore",), inputs=("declaratives",))
  tparseval = registry.Group("tparseval", ("tparseval_f1",), inputs=("declaratives", "gold_trees"))
  pending = {"tscore": [0, 1], "tparseval": [0, 1]}
  drop = analyze._drop_unsupported  # pylint: disable=protected-access
  # the task has gold trees: nothing dropped
  assert drop([tscore, tparseval], pending, "gold_trees", "gold trees", True, "question",
              False) == [tscore, tparseval]
  assert list(pending) == ["tscore", "tparseval"]
  with pytest.raises(ValueError, match="tparseval needs gold trees; the dyck task has none"):
    drop([tscore, tparseval], pending, "gold_trees", "gold trees", False, "dyck", True)
  assert drop([tscore, tparseval], pending, "gold_trees", "gold trees", False, "dyck",
              False) == [tscore]
  assert list(pending) == ["tscore"] and "dyck has no gold trees: skipping tparseval" in caplog.text


def test_refuses_other_options_and_bad_arguments(workdir):
  # the file's options are recorded by a first (cheap) call; other options are then refused.
  analyze.analyze(workdir, num_sentences=12, steps=[0], seeds=[3], groups=["weight_norm"])
  with pytest.raises(ValueError, match="other options"):
    analyze.analyze(workdir, num_sentences=7)
  with pytest.raises(ValueError, match="not in the run"):
    analyze.analyze(workdir, num_sentences=12, seeds=[9])
  with pytest.raises(checkpointing.CheckpointError):
    analyze.analyze(workdir, num_sentences=12, steps=[99])
  with pytest.raises(ValueError):
    analyze.parse_metrics("tscore,bogus")
  assert cli_options.parse_list("all", "steps") is None
  assert cli_options.parse_list("3000,6000", "steps") == [3000, 6000]


def test_other_output_with_cky(workdir):
  result = analyze.analyze(workdir, num_sentences=6, output="cky.csv", method="cky",
                           normalisation="split_mean", groups=["tscore"], seeds=[5])
  rows = _rows(os.path.join(workdir, "cky.csv"))
  # tscore and its three baselines (tree_projection.TSCORE_BASELINES) at 2 steps
  names = {"tscore", "tscore_random_tree", "tscore_right_branching", "tscore_left_branching"}
  assert result["rows_written"] == 8 and {r[2] for r in rows} == names
  # split_mean subtracts the random-tree expectation itself: random trees score 0
  assert all(float(r[3]) == pytest.approx(0.0, abs=1e-5) for r in rows
             if r[2] == "tscore_random_tree")


# Hand-built question-formation lines with known declarative lengths (9, 12, 11 words; whole LM
# lines of 21, 27, 25 words). Only the two `quest` lines are in the released sentence set.
_KNOWN_LINES = (
    "my salamander above our quails does confuse our yaks . decl\t"
    "my salamander above our quails does confuse our yaks .",
    "our orangutan behind your vultures does entertain our newt behind some newt . quest\t"
    "does our orangutan behind your vultures entertain our newt behind some newt ?",
    "her peacock does amuse our xylophone that some peacock doesn't entertain . quest\t"
    "does her peacock amuse our xylophone that some peacock doesn't entertain ?",
)


@pytest.fixture(scope="module")
def known_workdir(tmp_path_factory):
  """One checkpoint of a model with zero query kernels (uniform causal attention: entropy log t
  at input position t - 1) and zero head-merge kernels (attention adds nothing, so every SCI
  chart entry is 1 and an unnormalised tscore is 2 (n - 1) for n words)."""
  root = tmp_path_factory.mktemp("known")
  data_dir = os.path.join(root, "data")
  os.makedirs(data_dir)
  task = tasks.get_task("question")
  for split in task.split_names:
    with open(os.path.join(data_dir, task.file_names(split)[0]), "w") as f:
      f.write("\n".join(_KNOWN_LINES) + "\n")
  config = configlib.base_config("question")
  config.data.dir = data_dir
  config.model.num_layers, config.model.d_model = 1, 16
  config.model.num_heads, config.model.d_ff = 2, 32
  config.first_seed, config.num_seeds = 0, 1
  vocab = task.vocab()
  params = init_params(ModelConfig.from_config(config.model, vocab.size), jax.random.PRNGKey(0))
  for layer in range(1):
    for name in ("query", "out"):
      kernel = params[f"layer_{layer}"]["attention"][name]["kernel"]
      params[f"layer_{layer}"]["attention"][name]["kernel"] = jnp.zeros_like(kernel)
  manager = checkpointing.make_manager(str(root), asynchronous=False)
  checkpointing.save(manager, 0, {"params": jax.tree_util.tree_map(lambda x: x[None], params)},
                     checkpointing.make_meta(config, vocab.to_json(), [0]))
  manager.wait_until_finished()
  manager.close()
  return str(root)


def _values(workdir, output):
  return {r[2]: float(r[3]) for r in _rows(os.path.join(workdir, output))}


def _log_factorial(n):
  return float(np.sum(np.log(np.arange(1, n + 1))))


def test_default_sentences_and_entropy_input_are_the_released_ones(known_workdir):
  common = dict(groups=["attention_entropy", "tscore"], normalisation="none")
  analyze.analyze(known_workdir, **common)
  got = _values(known_workdir, "analysis.csv")
  # released: SOS + declarative words of the quest lines only: 13 and 12 input positions.
  np.testing.assert_allclose(got["attention_entropy_reference"],
                             (_log_factorial(13) + _log_factorial(12)) / 2, rtol=1e-5)
  np.testing.assert_allclose(got["attention_sparsity_paper"],
                             -(_log_factorial(13) + _log_factorial(12)) / 25, rtol=1e-5)
  np.testing.assert_allclose(got["tscore"], (2 * 11 + 2 * 10) / 2, rtol=1e-5)
  # every tree scores 2 (n - 1) on an all-ones chart: so do the baselines' trees
  for name in ("tscore_random_tree", "tscore_right_branching", "tscore_left_branching"):
    np.testing.assert_allclose(got[name], (2 * 11 + 2 * 10) / 2, rtol=1e-5)
  with open(os.path.join(known_workdir, "analysis.csv.options.json")) as f:
    used = json.load(f)["sentences_used"]
  assert used == {"attention_entropy": 2, "tree_projection": 2,
                  "label": "`quest` lines of train"}

  # the former inputs, named: every line, and whole LM lines (SOS + 21 / 27 / 25 words).
  analyze.analyze(known_workdir, sentence_set="all", entropy_input="line", output="lines.csv",
                  **common)
  got = _values(known_workdir, "lines.csv")
  lines = (_log_factorial(22), _log_factorial(28), _log_factorial(26))
  np.testing.assert_allclose(got["attention_entropy_reference"], np.mean(lines), rtol=1e-5)
  np.testing.assert_allclose(got["attention_sparsity_paper"], -sum(lines) / 76, rtol=1e-5)
  np.testing.assert_allclose(got["tscore"], (2 * 8 + 2 * 11 + 2 * 10) / 3, rtol=1e-5)
  # an analysis file from before these options existed used every whole line: it continues
  # with those options and refuses the new defaults.
  opt = os.path.join(known_workdir, "lines.csv.options.json")
  with open(opt) as f:
    options = json.load(f)
  del options["sentence_set"], options["entropy_input"]
  with open(opt, "w") as f:
    json.dump(options, f)
  assert analyze.analyze(known_workdir, sentence_set="all", entropy_input="line",
                         output="lines.csv", **common)["rows_written"] == 0
  with pytest.raises(ValueError, match="sentence_set.*'all', 'transformed'"):
    analyze.analyze(known_workdir, output="lines.csv", **common)


def test_unreadable_requested_step_is_a_nonzero_exit_naming_it(workdir, tmp_path):
  broken = str(tmp_path / "run")
  shutil.copytree(workdir, broken)
  for root, _, names in os.walk(os.path.join(broken, "checkpoints", "10", "state")):
    for name in names:
      path = os.path.join(root, name)
      if os.path.getsize(path) > 200 and "ocdbt" in root:
        with open(path, "r+b") as f:
          f.truncate(100)
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"unreadable checkpoint step\(s\) \[10\]"):
    analyze.analyze(broken, steps=[10], groups=["weight_norm"], output="fresh.csv")
  out = subprocess.run(
      [sys.executable, "-m", "sg_jax.analyze", f"--workdir={broken}", "--steps=10",
       "--metrics=weight_norm", "--output=cli.csv"], capture_output=True, text=True, timeout=120,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert out.returncode != 0 and "new rows" not in out.stdout, (out.stdout, out.stderr[-2000:])
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "[10]" in errors[0], out.stderr[-2000:]
  assert "Traceback" not in out.stderr and "Event loop is closed" not in out.stderr, out.stderr


def test_progress_line_says_why_the_first_checkpoint_has_fewer_rows():
  later = {"cka_final", "cka_final_l0", "cka_previous", "cka_previous_l0", "tvd_final",
           "tvd_previous", "twonn_dimension"}
  first = {n for n in later if "_previous" not in n}
  # 4 seeds: 7 rows per seed later, 4 at the first checkpoint (no previous checkpoint there)
  assert analyze.rows_note(later, 28, 4) == " (7 per seed)"
  assert analyze.rows_note(first, 16, 4) == (
      " (4 per seed; without the 3 *_previous rows per seed: the first checkpoint analysed has "
      "no previous one to compare with)")
  assert analyze.rows_note({"weight_norm", "tscore"}, 8, 4) == " (2 per seed)"
