"""`sg_jax.analyze` with the training-dynamics groups (cka, tvd, twonn) on a tiny two-seed workdir
of three checkpoints: every checkpoint and seed computed, the consecutive quantities from the
second checkpoint on, the values equal to a direct computation from the restored checkpoints, a
rerun writes nothing, and a changed final checkpoint is refused."""

from __future__ import annotations

import csv
import json
import os

import pytest

from sg_jax import checkpointing
from sg_jax.analysis import driver as analyze
from sg_jax.analysis import pipeline, registry, training_dynamics
from sg_jax.models.model_config import ModelConfig
from sg_jax.tasks import vocab as vocab_lib
import run_files  # pylint: disable=wrong-import-order  (tests/ is on the path)

STEPS = (0, 10, 20)
SEEDS = [3, 5]
GROUPS = ["cka", "tvd", "twonn"]
DYNAMICS_LINES = 12


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return run_files.random_checkpoint_workdir(tmp_path_factory.mktemp("dyn"), STEPS, SEEDS)


def _rows(path):
  with open(path, newline="") as f:
    return {(int(r[0]), int(r[1]), r[2]): float(r[3]) for r in list(csv.reader(f))[1:]
            if len(r) == 4}


def _direct(workdir, step, previous):
  """dynamics_metrics of `step` against `previous` and the last step, from the checkpoints."""
  restored = {s: checkpointing.restore(workdir, s, params_only=True) for s in (step, previous,
                                                                              STEPS[-1])}
  config = restored[step].config
  vocab = vocab_lib.Vocab.from_json(restored[step].vocab_json)
  lines = pipeline.load_sentences(config, workdir, "train", 1000, False, vocab)["lines"]
  refs = registry.References(final_step=STEPS[-1], final=restored[STEPS[-1]].state["params"],
                             previous_step=previous, previous=restored[previous].state["params"])
  return training_dynamics.dynamics_metrics(
      restored[step].state["params"], lines[:DYNAMICS_LINES],
      config=ModelConfig.from_config(config.model, vocab.size), sos_id=vocab.sos_id,
      groups=GROUPS, references=refs)


def test_every_checkpoint_and_seed_then_nothing_new(workdir):
  out = analyze.analyze(workdir, groups=GROUPS, dynamics_lines=DYNAMICS_LINES, output="dyn.csv")
  assert out["checkpoints_analysed"] == len(STEPS)
  rows = _rows(os.path.join(workdir, "dyn.csv"))
  assert len(rows) == out["rows_written"]
  for step in STEPS:
    for seed in SEEDS:
      for name in ("cka_final", "cka_final_embedding", "cka_final_l0", "tvd_final",
                   "twonn_dimension", "twonn_dimension_l0"):
        assert (step, seed, name) in rows, (step, seed, name)
      for name in ("cka_previous", "cka_previous_l0", "tvd_previous"):
        assert ((step, seed, name) in rows) == (step != STEPS[0]), (step, seed, name)
  for seed in SEEDS:  # the final checkpoint against itself
    assert rows[(STEPS[-1], seed, "cka_final")] == pytest.approx(1.0, abs=1e-5)
    assert rows[(STEPS[-1], seed, "tvd_final")] == pytest.approx(0.0, abs=1e-6)
    assert rows[(STEPS[1], seed, "tvd_previous")] > 0
  direct = _direct(workdir, STEPS[1], STEPS[0])
  for k, seed in enumerate(SEEDS):
    assert rows[(STEPS[1], seed, "tvd_previous")] == pytest.approx(direct["tvd_previous"][k],
                                                                   rel=1e-5)
    assert rows[(STEPS[1], seed, "cka_final_l0")] == pytest.approx(direct["cka_final"][k, 1],
                                                                   rel=1e-5)
    assert rows[(STEPS[1], seed, "twonn_dimension")] == pytest.approx(
        direct["twonn_dimension"][k].mean(), rel=1e-5)
  options = json.load(open(os.path.join(workdir, "dyn.csv.options.json")))
  assert options["reference_final_step"] == STEPS[-1]
  assert options["dynamics_lines"] == DYNAMICS_LINES

  assert analyze.analyze(workdir, groups=GROUPS, dynamics_lines=DYNAMICS_LINES,
                         output="dyn.csv")["rows_written"] == 0
  # one step alone: its previous checkpoint is restored for it, same values.
  analyze.analyze(workdir, groups=["tvd"], steps=[STEPS[2]], dynamics_lines=DYNAMICS_LINES,
                  output="alone.csv")
  alone = _rows(os.path.join(workdir, "alone.csv"))
  for seed in SEEDS:
    assert alone[(STEPS[2], seed, "tvd_previous")] == pytest.approx(
        rows[(STEPS[2], seed, "tvd_previous")], rel=1e-6)


def test_a_changed_final_checkpoint_is_refused(workdir):
  analyze.analyze(workdir, groups=["tvd"], steps=[STEPS[0]], dynamics_lines=DYNAMICS_LINES,
                  output="final.csv")
  path = os.path.join(workdir, "final.csv.options.json")
  options = json.load(open(path))
  options["reference_final_step"] = 15  # as if training had ended at 15 when it was written
  json.dump(options, open(path, "w"))
  with pytest.raises(ValueError, match="reference_final_step.*without cka and tvd"):
    analyze.analyze(workdir, groups=["tvd"], dynamics_lines=DYNAMICS_LINES, output="final.csv")
  assert analyze.analyze(workdir, groups=["twonn"], steps=[STEPS[0]],
                         dynamics_lines=DYNAMICS_LINES, output="final.csv")["rows_written"] == 4
  with pytest.raises(ValueError, match="dynamics_lines"):
    analyze.analyze(workdir, groups=["twonn"], dynamics_lines=0, output="final.csv")


def test_the_quantities_are_builtin_groups():
  assert registry.group_names()[4:7] == ("cka", "tvd", "twonn")  # after sg_jax's other ones
  assert {"cka_final", "tvd_previous", "twonn_dimension"} <= set(registry.dynamics())
