"""sg_jax.accelerators.programs beyond the training call: every enabled evaluator's programs
(through the evaluation registry) and the analysis programs, compiled on abstract arguments.

The fast tests compile for this machine's CPU (the compile-only TPU/GPU devices need the
optional install, tests/accelerators/test_aot.py); the plan, names, shardings and data are the
same whatever the devices."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import evaluation as evals
from sg_jax import tasks
from sg_jax.accelerators import hlo_checks
from sg_jax.accelerators import programs
from sg_jax.accelerators import table
from sg_jax.accelerators import targets
from sg_jax.analysis import uas_eval
from sg_jax.data.input_pipeline import DataOptions, load_data, prepare_eval_batches
from sg_jax.evaluation import minimal_pairs

# What the compiled code is, so compiled as a user's run is (tests/conftest.py).
pytestmark = pytest.mark.optimized

LINES = 16  # evals.uas.lines and evals.preference.lines of the tests


def _cpu_plan(config, workdir, kinds):
  """The plan of `config` on this machine's CPU device (v5e's published figures for the table)."""
  return programs._plan(programs.target_config(config),  # pylint: disable=protected-access
                        targets.parse_target("v5e:1x1"), tuple(jax.devices("cpu")[:1]),
                        str(workdir), kinds)


def _uas_preference_config(tiny_config):
  return tiny_config(**{"eval.uas_lines": LINES, "eval.preference_lines": LINES})


def test_plan_lists_every_enabled_evaluator_and_analysis_quantity(tiny_config, tiny_data,
                                                                  tmp_path):
  config = _uas_preference_config(tiny_config)
  plan = _cpu_plan(config, tmp_path, ("eval", "analysis"))
  # What the run keeps on the chips for its evaluators: the task's split batches, the UAS
  # lines and the minimal pairs, each as the evaluator prepares it.
  task = tasks.from_config(config)
  _, vocab, splits = load_data(DataOptions.from_config(config), str(tmp_path))
  expected = [prepare_eval_batches(splits[s], config.eval.batch_size, config.eval.max_lines,
                                   task.eval_fields) for s in ("in_domain", "out_of_domain")]
  expected.append(uas_eval.eval_batches(LINES, config.eval.batch_size, task, vocab, tiny_data))
  expected.append(minimal_pairs.eval_batches(LINES, config.eval.batch_size, task, vocab,
                                             tiny_data))
  by_name = {p.name: p for p in plan.programs}
  batch = [b["inputs"].shape[1] for b in expected[:2]]
  assert list(by_name)[:5] == [
      f"eval task in_domain ({batch[0]} lines/batch)",
      f"eval task out_of_domain ({batch[1]} lines/batch)",
      f"eval uas in_domain ({LINES} lines/batch)",
      f"eval preference in_domain ({LINES} pairs/batch)",
      f"eval preference out_of_domain ({LINES} pairs/batch)"]
  analysis = [p for p in plan.programs if p.kind == "analysis"]
  assert [p.name.split(" ")[1] for p in analysis] == [
      "weight_norm", "attention_entropy", "tree_projection", "training_dynamics", "uas"]
  assert all(p.seeds_per_chip == config.num_seeds for p in analysis)  # one chip, every seed
  assert not plan.skipped
  assert plan.eval_data_bytes == programs.nbytes(expected)
  assert sum(plan.param_array_bytes) == plan.params_bytes  # one entry per parameter array

  uas_program = by_name[f"eval uas in_domain ({LINES} lines/batch)"]
  # Its arguments, as the evaluator calls it: the seeds' parameters [S, ...] and one batch of
  # 16 lines (inputs, heads, relations [16, L] int32) with the 3 special ids.
  (params, *args), _ = uas_program.lower().args_info
  length = expected[2]["inputs"].shape[2]
  assert [(a.shape, a.dtype) for a in args] == [((LINES, length), np.int32)] * 3 + [
      ((3,), np.int32)]
  assert {x.shape[0] for x in jax.tree_util.tree_leaves(params)} == {config.num_seeds}
  result = programs.compile_program(uas_program)
  assert not result.error
  assert result.checks == {"f64": 0, "host": {}, "collectives": {}}
  assert result.flops > 0 and result.bytes_accessed > 0
  row = table.row(plan, result, "float32", "default")
  assert row[0] == uas_program.name and row[3] == "yes" and row[-1] == "clean"
  assert row[-2] == "-"  # no seed-steps/s for an evaluation


def test_a_registered_evaluator_is_compiled_without_an_aot_edit(tiny_config, tmp_path):

  @dataclasses.dataclass(frozen=True)
  class Toy(evals.Evaluator):
    name = "toy_aot"

    def build(self, context):
      data = context.put({"x": np.ones((4, 3), np.float32)})
      fn = jax.jit(jax.vmap(lambda p, x: jnp.sum(x) * sum(jnp.sum(l) for l in
                                                        jax.tree_util.tree_leaves(p)),
                            in_axes=(0, None)))
      return evals.Evaluation(evaluate=lambda params, progress: {},
                              programs=lambda: (evals.Program("sums (4 lines)", fn,
                                                              (data["x"],), calls=3),))

  @dataclasses.dataclass(frozen=True)
  class Silent(evals.Evaluator):
    name = "silent_aot"

    def build(self, context):
      return evals.Evaluation(evaluate=lambda params, progress: {})

  evals.register(Toy)
  evals.register(Silent)
  try:
    config = tiny_config(**{"evals.task.enabled": False})
    plan = _cpu_plan(config, tmp_path, ("eval",))
  finally:
    evals.unregister("toy_aot")
    evals.unregister("silent_aot")
  assert [p.name for p in plan.programs] == ["eval toy_aot sums (4 lines)"]
  assert plan.skipped == ["eval uas: nothing to evaluate for this run",  # lines 0 (tests)
                          "eval preference: nothing to evaluate for this run",
                          "eval silent_aot: declares no programs (Evaluation.programs)"]
  assert plan.eval_data_bytes == 4 * 3 * 4
  [program] = plan.programs
  assert "one call of 3 per evaluation" in program.note
  result = programs.compile_program(program, hbm_traffic=True)
  assert not result.error
  assert result.argument == plan.params_bytes + 48  # the seeds' parameters and x
  # Its traffic from the optimised HLO (asked for: seeds_per_chip.py's GPU bytes) reads every
  # argument at least once.
  assert result.hbm_bytes >= result.argument
  assert programs.compile_program(program).hbm_bytes is None


def test_collectives_of_an_evaluation_are_listed_as_allowed():
  found = {"f64": 0, "host": {}, "collectives": {"all-gather": 2}}
  assert hlo_checks.summary(found) == "all-gather x2"
  assert hlo_checks.summary(found, False) == "clean; all-gather x2 (allowed)"
  found["f64"] = 1
  assert hlo_checks.summary(found, False) == "f64 x1; all-gather x2 (allowed)"
  assert hlo_checks.summary({"f64": 0, "host": {}, "collectives": {}}, False) == "clean"


def test_unknown_program_kind_is_refused(tiny_config, tmp_path):
  with pytest.raises(ValueError, match="unknown program kinds"):
    _cpu_plan(tiny_config(), tmp_path, ("train", "profile"))


@pytest.mark.slow
def test_tiny_evaluators_and_analysis_all_compile(tiny_config, tmp_path):
  config = _uas_preference_config(tiny_config)
  plan = _cpu_plan(config, tmp_path, ("eval", "analysis"))
  results = programs.compile_all(plan)
  assert len(results) == 10
  for result in results:
    assert not result.error, (result.program.name, result.error)
    assert result.checks == {"f64": 0, "host": {}, "collectives": {}}, result.program.name
    assert result.flops > 0 and result.bytes_accessed > 0
    row = table.row(plan, result, "float32", "default")
    assert row[3] == "yes", row
  # The analysis of cka and tvd compares three checkpoints: its arguments hold three
  # parameter sets of every seed.
  dynamics = next(r for r in results if "training_dynamics" in r.program.name)
  assert dynamics.argument >= 3 * plan.params_bytes


def test_splits_of_one_shape_share_a_preference_program(tiny_config, tmp_path, monkeypatch):
  own = minimal_pairs.eval_batches

  def same_pairs_twice(*args):  # out_of_domain gets the in_domain pairs: one shape
    pairs = own(*args)
    return {"in_domain": pairs["in_domain"], "out_of_domain": pairs["in_domain"]}

  monkeypatch.setattr(minimal_pairs, "eval_batches", same_pairs_twice)
  config = tiny_config(**{"evals.task.enabled": False, "eval.preference_lines": LINES})
  plan = _cpu_plan(config, tmp_path, ("eval",))
  [program] = plan.programs
  assert program.name == f"eval preference in_domain+out_of_domain ({LINES} pairs/batch)"
  assert "one call of 2 per evaluation" in program.note  # 16 lines: one batch per split
