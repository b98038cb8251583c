"""Generalisation by construction: each task's construction tags (what modifies the subject) and
the evaluation's per-construction metrics (`<split>/accuracy/<tag>`)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import tasks
from sg_jax.data import input_pipeline
from sg_jax.evaluation import scoring as evaluation, evaluator


def _lines(task, sentence):
  """The (identity, transformed) lines of a declarative (words and '.'), as the task makes them."""
  ident, trans, _ = task.lines_of(task.source_derivation(tuple(sentence.split())))
  return ident, trans


QUESTION = {
    "none": "your quails do confuse your yak .",
    "PP": "your quails below my xylophone do confuse your yak .",
    "RC-subj": "your quails that don't accept your walrus do confuse your yak .",
    "RC-obj": "your quails that your walrus doesn't accept do confuse your yak .",
    "RC-intrans": "your quails who don't swim do confuse your yak .",
}
TENSE = {
    "none": "her quails amused our peacock .",
    "PP": "her quails below my xylophone amused our peacock .",
    "RC-subj": "her quails that admired your yak amused our peacock .",
    "RC-obj": "her quails that your yak admired amused our peacock .",
    "RC-intrans": "her quails that giggled amused our peacock .",
}


@pytest.mark.parametrize("name,sentences", [("question", QUESTION), ("tense", TENSE)])
def test_construction_of_hand_built_lines(name, sentences):
  task = tasks.get_task(name)
  for tag, sentence in sentences.items():
    ident, trans = _lines(task, sentence)
    ids = task.construction_ids([ident, trans])
    # identity lines are not read by the metric: untagged
    assert ids[0] == -1 and task.constructions[ids[1]] == tag, (sentence, ids)


def test_dyck_declares_no_constructions():
  task = tasks.get_task("dyck")
  assert task.constructions == ()
  examples = task.generate_examples(seed=0, sizes={s: 4 for s in task.split_names})
  assert np.all(task.construction_ids(examples["train"]) == -1)


def test_construction_ids_are_cut_at_max_lines():
  task = tasks.get_task("question")
  lines = [_lines(task, QUESTION[t])[1] for t in ("PP", "RC-obj", "none")]
  np.testing.assert_array_equal(input_pipeline.construction_ids(task, lines, max_lines=2),
                                [1, 3, -1])


def test_per_construction_metrics_equal_the_metric_on_each_construction_alone():
  """The evaluation's `accuracy/<tag>` equals the accuracy of the same model on the lines of that
  tag evaluated alone, with a fixed random 'model' (logits from the inputs)."""
  task = tasks.get_task("question")
  vocab = task.vocab()
  order = ["RC-obj", "RC-subj", "RC-obj", "RC-intrans", "RC-subj", "RC-obj"]
  examples = [_lines(task, QUESTION[t])[1] for t in order]
  split = task.encode(examples, vocab)
  split.extras["construction"] = task.construction_ids(examples)
  table = jax.random.normal(jax.random.PRNGKey(0), (vocab.size, vocab.size))
  apply_fn = lambda params, tokens: params[tokens] + 0.3 * jnp.arange(tokens.shape[1])[:, None]
  batches = input_pipeline.prepare_eval_batches(split, 4, 0, task.eval_fields)
  present = evaluator.present_constructions(task, batches)
  assert present == {"RC-subj": 2, "RC-obj": 3, "RC-intrans": 4}
  split_eval = evaluation.make_split_evaluator(task, apply_fn, vocab, constructions=present)
  got = split_eval.summarize(jax.lax.map(lambda b: split_eval.batch_sums(table, b),
                                         jax.tree_util.tree_map(jnp.asarray, batches)))
  plain = evaluation.make_evaluate_fn(task, apply_fn, vocab)
  for tag in present:
    alone = task.encode([e for e, t in zip(examples, order) if t == tag], vocab)
    ref = plain(table, jax.tree_util.tree_map(
        jnp.asarray, input_pipeline.prepare_eval_batches(alone, 4, 0, task.eval_fields)))
    for metric in ("accuracy", "move_first_agreement", "skip_relative_agreement"):
      assert float(got[f"{metric}/{tag}"]) == pytest.approx(float(ref[metric]), abs=1e-6)
  assert float(got["accuracy"]) == pytest.approx(float(plain(table, jax.tree_util.tree_map(
      jnp.asarray, input_pipeline.prepare_eval_batches(split, 4, 0, task.eval_fields)))
      ["accuracy"]), abs=1e-6)


@pytest.mark.slow
def test_training_logs_out_of_domain_accuracy_per_construction(tiny_config, tmp_path):
  from sg_jax import train  # pylint: disable=import-outside-toplevel
  import run_files  # pylint: disable=import-outside-toplevel  (tests/ is on the path)
  config = tiny_config(**{"train.num_steps": 20, "eval.every": 20, "checkpoint.every": 20})
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir, tensorboard=False)
  rows = run_files.rows(workdir)
  names = {r[2] for r in rows}
  # gen lines of question formation: the three relative-clause types; dev quest lines: none/PP
  for tag in ("RC-subj", "RC-obj", "RC-intrans"):
    for metric in ("accuracy", "move_first_agreement", "skip_relative_agreement"):
      assert f"out_of_domain/{metric}/{tag}" in names
  assert "in_domain/accuracy/none" in names and "in_domain/accuracy/RC-obj" not in names
  # the split's accuracy is the line-weighted mean of its constructions' accuracies
  data = tasks.get_task("question").read_split(config.data.dir, "gen")[:config.eval.max_lines]
  counts = np.bincount(tasks.get_task("question").construction_ids(data) + 1, minlength=6)[1:]
  for seed in (0, 1):
    at = {r[2]: r[3] for r in rows if r[0] == 20 and r[1] == seed}
    mixed = sum(counts[k] * at[f"out_of_domain/accuracy/{t}"]
                for k, t in enumerate(tasks.get_task("question").constructions) if counts[k])
    assert at["out_of_domain/accuracy"] == pytest.approx(mixed / counts.sum(), abs=1e-6)
