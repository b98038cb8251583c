"""Everything downstream of training for the `mlm` and `prefix_lm` objectives (issue 36): the
pruning lines are the objective's loss positions, `sg_jax.analyze`, `sg_jax.prune` and
`sg_jax.prune_core` run on their workdirs with the run's own model, onsets read a masked LM's
metrics, the SAS regulariser's per-seed lambdas under bidirectional attention, and a resumed
`mlm` run equals an uninterrupted one."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import checkpointing, objectives
from sg_jax import step as step_lib
from sg_jax import terms, train
from sg_jax.analysis import driver as analyze
from sg_jax.analysis import onsets, registry
from sg_jax.data import composition
from sg_jax.data import input_pipeline
from sg_jax.pruning import core_driver as prune_core
from sg_jax.pruning import driver as prune
from sg_jax.pruning import inputs as inputs_lib
from sg_jax.records import metric_logging
from sg_jax.runtime import stop_signal
from sg_jax.training.state import seed_keys
import run_files  # pylint: disable=wrong-import-order  (tests/ is on the path)

PRUNE_FAST = dict(num_steps=12, sparsity_warmup_steps=8, num_lines=16, batch_size=8,
                  eval_lines=8, steps_per_call=6)


def test_pruning_lines_are_the_objectives_loss_positions(tiny_config, tmp_path):
  """`mlm`: one fixed BERT masking (targets only where masked, [MASK] in the inputs); `prefix_lm`:
  the stored inputs, targets from the task token on; `lm`: the stored lines."""
  config = tiny_config()
  data_options = input_pipeline.DataOptions.from_config(config)
  task, vocab, splits = input_pipeline.load_data(data_options, str(tmp_path))
  train_split = splits["train"]
  stored_in, stored_t = np.asarray(train_split.inputs[:50]), np.asarray(train_split.targets[:50])
  lm_in, lm_t = inputs_lib.objective_lines(objectives.from_config(config), train_split, 50)
  np.testing.assert_array_equal(lm_in, stored_in)
  np.testing.assert_array_equal(lm_t, stored_t)
  mlm = objectives.from_config(tiny_config(objective="mlm"))
  m_in, m_t = inputs_lib.objective_lines(mlm, train_split, 50)
  again = inputs_lib.objective_lines(mlm, train_split, 50)
  np.testing.assert_array_equal(again[0], m_in)  # a fixed key: the same masking every time
  scored = m_t != 0
  assert 0.08 < scored.sum() / (stored_in[:, 1:] != 0).sum() < 0.25
  np.testing.assert_array_equal(m_t[scored], stored_in[scored])
  assert np.any(m_in == vocab.size) and not np.any(m_in[~scored] != stored_in[~scored])
  prefix = objectives.from_config(tiny_config(objective="prefix_lm"))
  p_in, p_t = inputs_lib.objective_lines(prefix, train_split, 50)
  np.testing.assert_array_equal(p_in, stored_in)
  task_pos = np.asarray(train_split.task_pos[:50])
  pos = np.arange(stored_in.shape[1])[None, :]
  np.testing.assert_array_equal(p_t, np.where(pos >= task_pos[:, None], stored_t, 0))
  del task


def test_onsets_read_a_masked_lms_capability_metrics():
  """A masked LM logs no `<split>/accuracy`: the capabilities onsets read its preference, else
  its masked-token accuracy."""
  steps = np.arange(0, 3000, 100)
  curve = lambda mid: 1 / (1 + np.exp(-(steps - mid) / 100))
  series = {"in_domain/masked_accuracy": {0: (steps, curve(800))},
            "out_of_domain/masked_accuracy": {0: (steps, curve(1900))},
            "out_of_domain/preference": {0: (steps, curve(1500))}}
  got = onsets.seed_onsets(series)[0]
  assert abs(got["in_domain"].step - 800) <= 100
  assert abs(got["out_of_domain"].step - 1500) <= 100  # the preference wins
  series["out_of_domain/accuracy"] = {0: (steps, curve(2500))}  # lm and prefix_lm runs
  assert abs(onsets.seed_onsets(series)[0]["out_of_domain"].step - 2500) <= 100


@pytest.mark.slow
def test_mlm_sas_seed_in_a_group_equals_the_seed_alone(tiny_config, tmp_path):
  """Per-seed SAS lambdas under bidirectional attention run through the one training body: a
  seed of a mixed group equals that seed trained alone, its penalty moves its parameters, and
  packed rows equal padded ones."""
  fields = {"objective": "mlm", "sas.variant": "max"}
  config = tiny_config(**fields, **{"sas.lambdas": (0.0, 0.5)})
  data_options = input_pipeline.DataOptions.from_config(config)
  task, vocab, splits = input_pipeline.load_data(data_options, str(tmp_path))

  def trained(config, seeds):
    data_options = input_pipeline.DataOptions.from_config(config)
    host, capacities = input_pipeline.make_train_data(data_options, splits["train"], len(seeds))
    host.update(terms.train_arrays(
        terms.active(config), terms.schedules_from_config(config), task,
        lambda: data_options.training_examples(str(tmp_path)), host["inputs"].shape[1],
        num_lines=host["inputs"].shape[0]))
    fns = step_lib.train_fns_from_config(config, vocab.size, capacities)
    state = fns.init(seed_keys(seeds))
    host = jax.tree_util.tree_map(jnp.asarray, host)
    state = fns.chunk(state, host, jnp.asarray(0, jnp.int32), 10)
    leaves = jax.tree_util.tree_leaves(jax.device_get(state.params))
    return np.concatenate([np.asarray(x).reshape(x.shape[0], -1) for x in leaves], axis=1)

  group = trained(config, [0, 1])
  alone = trained(tiny_config(**fields, **{"sas.lambdas": (0.5,), "num_seeds": 1,
                                           "first_seed": 1}), [1])
  plain = trained(tiny_config(objective="mlm"), [0, 1])
  np.testing.assert_allclose(group[1], alone[0], atol=1e-5)
  np.testing.assert_allclose(group[0], plain[0], atol=1e-6)  # lambda 0: no effect
  assert not np.allclose(group[1], plain[1], atol=1e-4)
  # packed rows read the arcs in the per-line layout alike (the mask from the stored lines)
  packed = trained(tiny_config(**fields, **{"sas.lambdas": (0.0, 0.5), "train.packing": True}),
                   [0, 1])
  np.testing.assert_allclose(packed, group, atol=2e-5)


@pytest.mark.slow
def test_mlm_run_resumed_after_sigterm_equals_the_uninterrupted_run(tiny_config, tmp_path):
  """Checkpoints of a masked LM with SAS and the training-time UAS: stopped by SIGTERM at step
  20 and resumed, its metrics.csv and parameters equal an uninterrupted run's; it logs
  masked_accuracy and both-direction UAS, no task accuracy."""
  config = tiny_config(objective="mlm", **{"sas.lambdas": (0.0, 0.3), "eval.uas_lines": 32})
  reference = str(tmp_path / "reference")
  train.train_and_evaluate(config, reference, tensorboard=False)

  workdir = str(tmp_path / "run")
  with pytest.raises(stop_signal.Preempted):
    train.train_and_evaluate(config, workdir, tensorboard=False,
                             state_hook=run_files.sigterm_at(20))
  assert checkpointing.all_steps(workdir)[-1] < 40
  train.train_and_evaluate(config, workdir, tensorboard=False)
  assert run_files.rows(workdir) == run_files.rows(reference)
  np.testing.assert_array_equal(run_files.params(workdir), run_files.params(reference))
  names = {r[2] for r in run_files.rows(workdir)}
  assert {"in_domain/masked_accuracy", "in_domain/uas", "train/sas_loss"} <= names
  assert "in_domain/accuracy" not in names
  table = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  assert all(0 <= r["value"] <= 1 for r in table if r["name"] == "in_domain/uas")


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm", "prefix_lm"])
def test_analyze_prune_and_prune_core_run_on_the_objectives_workdirs(objective, tmp_path,
                                                                      uas_quantity_registered):
  """Every analysis group (UAS included), pruning and the core analyses run on a workdir of the
  objective, with the run's own model (a masked LM has vocab.size + 1 rows)."""
  workdir = run_files.random_checkpoint_workdir(tmp_path / objective, (0,), [3, 5],
                                                eval_lines=8, objective=objective,
                                                **{"eval.batch_size": 8})
  rows = analyze.analyze(workdir, num_sentences=12, uas_min_count=1)["rows_written"]
  assert rows > 0
  got = {(r["seed"], r["name"]): r["value"]
         for r in metric_logging.read_table(os.path.join(workdir, "analysis.csv"))}
  for seed in (3, 5):
    assert 0 <= got[(seed, "uas")] <= 1 and np.isfinite(got[(seed, "tscore")])
    assert 0 <= got[(seed, "tparseval_f1")] <= 1
    assert got[(seed, "attention_sparsity_paper")] < 0
    # bidirectional attention is scored in both directions, prefix like causal in one
    assert ((seed, "uas_dir_head_to_dependent") in got) == (objective == "mlm")
  assert {g.name for q in registry.quantities() for g in q.groups} >= {"uas", "tscore"}
  out = prune.prune(workdir, sparsities=[0.5], pruning_seeds=1, **PRUNE_FAST)
  assert out["rows_written"] > 0
  names = {line.split(",")[4] for line in open(os.path.join(workdir, "pruning.csv"))}
  metric = "in_domain/masked_accuracy" if objective == "mlm" else "in_domain/accuracy"
  assert {metric, "kl", "in_domain/loss"} <= names
  assert ("in_domain/accuracy" in names) == (objective == "prefix_lm")
  core = prune_core.prune_core(workdir, num_draws=2)
  assert core["rows"] > 0
  core_names = {line.split(",")[3] for line in open(core["path"])}
  assert "effective_size/mean" in core_names  # from masked accuracy for a masked LM
