"""Task metrics on hand-built logits with known answers, the decoders, and the run's evaluator."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import objectives
from sg_jax import tasks
from sg_jax.data import input_pipeline
from sg_jax.evaluation import decoding
from sg_jax.evaluation import evaluator
from sg_jax.evaluation import scoring as evaluation
from sg_jax.models import transformer as model_lib
from sg_jax.tasks import dyck
from sg_jax.tasks import question
from sg_jax.tasks import tense
from sg_jax.tasks import vocab as vocab_lib
from sg_jax.tasks.examples import Example


def test_question_auxiliary_ranking():
  vocab = vocab_lib.Vocab.from_word_classes(
      {"do": "Aux", "does": "Aux", "doesn't": "Aux", "don't": "Aux", "newt": "N"})
  ids = {w: vocab.id_of(w) for w in vocab.words}
  logits = np.zeros((2, 4, vocab.size), np.float32)
  logits[0, 2, ids["does"]] = 5.0  # line 0 at task position 2: "does" wins among auxiliaries
  logits[0, 2, ids["newt"]] = 9.0  # a non-auxiliary scores higher but is not a candidate
  logits[1, 1, ids["don't"]] = 1.0  # line 1: "don't"
  targets = np.array([[ids["newt"], ids["newt"], ids["does"], 0],
                      [ids["newt"], ids["doesn't"], 0, 0]])
  batch = {"inputs": jnp.zeros((2, 4), jnp.int32), "targets": jnp.asarray(targets),
           "task_pos": jnp.asarray([2, 1]), "transformed": jnp.asarray([True, True]),
           "valid": jnp.asarray([True, True])}
  aux = jnp.asarray([ids[w] for w in ("do", "does", "don't", "doesn't")])
  ok = (question.question_prediction(jnp.asarray(logits), batch["task_pos"], aux)
        == question.question_target(batch["targets"], batch["task_pos"]))
  np.testing.assert_array_equal(np.asarray(ok), [True, False])
  # The task's metric (what the evaluation runs) counts the same lines.
  out = tasks.get_task("question").make_metrics(vocab)(batch, jnp.asarray(logits), None)
  assert (float(out["correct"]), float(out["total"])) == (1.0, 2.0)
  batch["transformed"] = jnp.asarray([False, True])  # identity lines are not scored
  out = tasks.get_task("question").make_metrics(vocab)(batch, jnp.asarray(logits), None)
  assert (float(out["correct"]), float(out["total"])) == (0.0, 1.0)


def test_dyck_closing_bracket_accuracy_and_min_distance():
  # ids: 1 "(a", 2 "(b", 3 "a)", 4 "b)"
  close_ids = jnp.asarray([3, 4])
  targets = np.array([[2, 1, 3, 4]])
  logits = np.zeros((1, 4, 5), np.float32)
  logits[0, 2, 3] = 1.0  # correct "a)"
  logits[0, 3, 3] = 1.0  # wrong: predicts "a)" where "b)" is due
  logits[0, 3, 1] = 5.0  # an opening bracket is not a candidate
  close_mask = np.array([[False, False, True, True]])
  distance = np.array([[0, 0, 1, 3]])
  c, n = dyck.dyck_correct(jnp.asarray(logits), jnp.asarray(targets),
                           jnp.asarray(close_mask), jnp.asarray(distance), close_ids)
  assert (float(c[0]), float(n[0])) == (1.0, 2.0)
  c, n = dyck.dyck_correct(jnp.asarray(logits), jnp.asarray(targets),
                           jnp.asarray(close_mask), jnp.asarray(distance), close_ids,
                           min_distance=2)
  assert (float(c[0]), float(n[0])) == (0.0, 1.0)


def test_greedy_decode_and_tense_metric():
  # A fake "model" that always predicts token (previous token + 1), EOS = 6.
  vocab = 8

  def apply_fn(tokens):
    nxt = jnp.minimum(tokens + 1, 6)
    return jnp.eye(vocab)[nxt] * 10.0

  inputs = jnp.asarray([[7, 1, 2, 3, 0, 0, 0]])  # SOS=7, task token at position 2
  decoded = decoding.greedy_decode(apply_fn, inputs, jnp.asarray([2]), num_steps=4)
  # after position 2 (token 2) the model emits 3, 4, 5, 6
  np.testing.assert_array_equal(np.asarray(decoded), [[0, 0, 3, 4, 5, 6, 0]])
  targets = jnp.asarray([[1, 2, 3, 4, 5, 6, 0]])
  pos_table = jnp.asarray([0, 1, 2, 3, 4, 5, 9, 9])
  ok = tense.tense_correct(decoded, targets, jnp.asarray([2]), jnp.asarray([6]),
                           jnp.asarray([3]), pos_table)
  assert bool(ok[0])
  # Same POS class but a different main verb -> wrong.
  pos_table2 = pos_table.at[4].set(7).at[2].set(7)
  targets2 = targets.at[0, 3].set(2)
  ok = tense.tense_correct(decoded, targets2, jnp.asarray([2]), jnp.asarray([6]),
                           jnp.asarray([3]), pos_table2)
  assert not bool(ok[0])
  # A target one word longer (EOS later) -> wrong POS sequence.
  targets3 = jnp.asarray([[1, 2, 3, 4, 5, 5, 6]])
  ok = tense.tense_correct(decoded, targets3, jnp.asarray([2]), jnp.asarray([7]),
                           jnp.asarray([3]), pos_table)
  assert not bool(ok[0])


def test_the_evaluation_loss_is_the_objectives_and_ignores_padding():
  """Per-line sums of the objective's loss: uniform logits over 4 ids cost log 4 per scored
  target, padding (0) none; their ratio is `Objective.loss` of the batch."""
  logits = jnp.zeros((1, 3, 4))
  targets = jnp.asarray([[1, 2, 0]])
  lm = objectives.from_config({})
  loss, count = evaluation.objective_line_losses(lm, logits, targets)
  assert float(count[0]) == 2.0
  np.testing.assert_allclose(float(loss[0]), 2 * np.log(4), rtol=1e-6)
  assert float(loss[0] / count[0]) == float(lm.loss(logits, targets))


def test_an_objective_with_its_own_loss_is_refused_by_the_evaluation():
  @dataclasses.dataclass(frozen=True)
  class Doubled(objectives.Objective):
    name = "doubled_for_test"

    def loss(self, logits_BxLxV, targets_BxL):
      return 2.0 * objectives.mean_token_loss(logits_BxLxV, targets_BxL)

  with pytest.raises(ValueError, match="'doubled_for_test' overrides Objective.loss"):
    evaluation.objective_line_losses(Doubled(), jnp.zeros((1, 2, 3)), jnp.ones((1, 2), int))


def test_pad_to_multiple_marks_valid_lines():
  arrays, n = evaluation.pad_to_multiple({"x": np.arange(5)}, 4)
  assert n == 5 and arrays["x"].shape == (8,)
  np.testing.assert_array_equal(arrays["valid"], [1, 1, 1, 1, 1, 0, 0, 0])


def test_question_rule_auxiliaries_hand_built():
  # ids: 1 do, 2 does, 3 don't, 4 doesn't, 5 that, 6 who, 7 noun, 8 verb, 9 ".", 10 quest, 11 SOS
  aux, rel = jnp.asarray([1, 2, 3, 4]), jnp.asarray([5, 6])
  inputs = np.array([
      # SOS noun that does verb noun don't verb . quest  (subject RC: skip "does")
      [11, 7, 5, 2, 8, 7, 3, 8, 9, 10, 0],
      # SOS noun who noun doesn't verb do verb . quest  (object RC: "doesn't" is not skipped)
      [11, 7, 6, 7, 4, 8, 1, 8, 9, 10, 0],
      # SOS noun that do verb . quest doesn't  (an auxiliary after the task token is ignored)
      [11, 7, 5, 1, 8, 9, 10, 4, 0, 0, 0],
  ])
  task_pos = jnp.asarray([9, 9, 6])
  move_first, skip_rel = question.question_rule_auxiliaries(jnp.asarray(inputs), task_pos,
                                                            aux, rel)
  np.testing.assert_array_equal(np.asarray(move_first), [2, 4, 1])
  np.testing.assert_array_equal(np.asarray(skip_rel), [3, 4, -1])


def test_question_rule_auxiliaries_equal_the_word_level_rules_on_generated_gen_lines():
  task = tasks.get_task("question")
  vocab = task.vocab()
  sizes = {"train": 50, "dev": 10, "test": 10, "gen": 200}
  gen = task.generate_examples(seed=3, sizes=sizes)["gen"]
  enc = vocab_lib.encode(gen, vocab)
  aux = jnp.asarray(vocab.encode(question.AUXILIARIES), jnp.int32)
  rel = jnp.asarray(vocab.encode(question.RELATIVE_PRONOUNS), jnp.int32)
  # make_evaluate_fn finds them by their POS class
  rel_class = vocab_lib.POS_CLASSES.index("Rel")
  assert sorted(np.flatnonzero(np.asarray(vocab.pos_table) == rel_class)) == sorted(rel.tolist())
  move_first, skip_rel = question.question_rule_auxiliaries(
      jnp.asarray(enc.inputs), jnp.asarray(enc.task_pos), aux, rel)
  want_first = vocab.encode([question.linear_question(ex.source[:-1])[0] for ex in gen])
  want_skip = vocab.encode([question.skip_relative_auxiliary(ex.source[:-1]) for ex in gen])
  np.testing.assert_array_equal(np.asarray(move_first), want_first)
  np.testing.assert_array_equal(np.asarray(skip_rel), want_skip)
  # On gen lines move-first is always wrong; skip-relative is right except on object RCs.
  gold = [ex.target[0] for ex in gen]
  skip_words = [question.skip_relative_auxiliary(ex.source[:-1]) for ex in gen]
  assert all(vocab.encode([g])[0] != f for g, f in zip(gold, want_first))
  assert 0 < np.mean([s == g for s, g in zip(skip_words, gold)]) < 1


def test_question_evaluate_reports_rule_agreement():
  # A "model" that always ranks "does" first: agreement = share of quest lines whose rule fronts
  # "does"; accuracy = share whose gold first word is "does". Non-quest lines are not counted.
  words = ("do", "does", "don't", "doesn't", "that", "who", "newt", "sees", ".", "quest", "decl",
           "?")
  pos = ("Aux",) * 4 + ("Rel", "Rel", "N", "V", "punct", "task", "task", "punct")
  vocab = vocab_lib.Vocab.from_word_classes(dict(zip(words, pos)))
  lines = [
      # move-first "does", skip-relative "don't", gold "don't"
      Example(source=tuple("newt that does sees don't sees . quest".split()),
              target=tuple("don't newt that does sees sees ?".split()),
              task_token="quest", transformed=True),
      # move-first "doesn't", skip-relative "doesn't", gold "does"
      Example(source=tuple("newt who newt doesn't sees does sees . quest".split()),
              target=tuple("does newt who newt doesn't sees sees ?".split()),
              task_token="quest", transformed=True),
      # an identity line: not scored
      Example(source=tuple("newt does sees . decl".split()),
              target=tuple("newt does sees .".split()), task_token="decl", transformed=False),
  ]
  enc = tasks.get_task("question").encode(lines, vocab)
  does = vocab.encode(["does"])[0]
  apply_fn = lambda params, tokens: jnp.zeros(tokens.shape + (vocab.size,)).at[..., does].set(1.0)
  evaluate = evaluation.make_evaluate_fn(tasks.get_task("question"), apply_fn, vocab)
  arrays = {k: v[None] for k, v in enc.as_dict().items()}
  arrays["valid"] = np.ones((1, len(lines)), bool)
  out = evaluate(None, {k: jnp.asarray(v) for k, v in arrays.items()})
  assert float(out["accuracy"]) == 0.5
  assert float(out["move_first_agreement"]) == 0.5
  assert float(out["skip_relative_agreement"]) == 0.0


def _tense_lines(num_lines: int, seed: int = 1):
  task = tasks.get_task("tense")
  sizes = {"train": 20, "dev": 10, "test": 10, "gen": num_lines}
  vocab = task.vocab()
  return vocab, task.encode(task.generate_examples(seed=seed, sizes=sizes)["gen"], vocab)


@pytest.mark.slow
def test_cached_greedy_decode_gives_the_full_forward_decoders_tokens_on_every_line():
  """Several seeds (vmapped) and depths, on generated tense lines whose task tokens sit at
  different positions; also with more steps than the lines leave room for (clamped positions)."""
  vocab, enc = _tense_lines(100)
  inputs, task_pos = jnp.asarray(enc.inputs), jnp.asarray(enc.task_pos)
  assert len(set(enc.task_pos.tolist())) > 3
  steps = int(np.max(enc.lengths - enc.task_pos))
  prefix = int(np.max(enc.task_pos)) + 1
  for depth in (1, 3):
    cfg = model_lib.ModelConfig(vocab_size=vocab.size, num_layers=depth, d_model=32, num_heads=4,
                                d_ff=64)
    model = model_lib.TransformerLM(cfg)
    params = jax.vmap(lambda k: model_lib.init_params(cfg, k))(
        jax.random.split(jax.random.key(depth), 3))
    cases = ((steps, prefix),) + (((enc.inputs.shape[1] + 2, 0),) if depth == 1 else ())
    for num_steps, prefix_length in cases:
      old = jax.jit(jax.vmap(lambda p: decoding.greedy_decode(
          lambda t: model.apply({"params": p}, t), inputs, task_pos, num_steps)))(params)
      new = jax.jit(jax.vmap(lambda p: decoding.greedy_decode_cached(
          lambda t, pos, c: decoding.apply_cached(model, p, t, pos, c),
          lambda b, n: decoding.init_cache(model, p, b, n), inputs, task_pos, num_steps,
          prefix_length)))(params)
      old, new = np.asarray(old), np.asarray(new)
      np.testing.assert_array_equal(new, old)
      # Decoded tokens vary across lines and seeds (the comparison is not between constants).
      assert len(np.unique(old[:, :, -1])) > 1 or len(np.unique(old)) > 3
      assert not np.array_equal(old[0], old[1])


@pytest.mark.slow
def test_evaluation_with_and_without_kv_cache_agrees_and_logs_progress(monkeypatch):
  """`evaluator.make_eval_fn` (seed-vmapped, one call per batch): the same tense metrics with
  both decoders, and one progress update per batch with its number of real lines."""
  vocab, in_domain = _tense_lines(40, seed=2)
  splits = {"in_domain": in_domain, "out_of_domain": _tense_lines(50, seed=3)[1]}
  cfg = model_lib.ModelConfig(vocab_size=vocab.size, num_layers=2, d_model=32, num_heads=4,
                              d_ff=64)
  model = model_lib.TransformerLM(cfg)
  params = jax.vmap(lambda k: model_lib.init_params(cfg, k))(
      jax.random.split(jax.random.key(0), 2))
  eval_data = {name: input_pipeline.prepare_eval_batches(split, 16, 0)
               for name, split in splits.items()}
  updates = []

  class Recorder(evaluation.ProgressLog):
    def update(self, lines, what=""):
      updates.append((what, lines))
      super().update(lines, what)

  monkeypatch.setattr(evaluation, "ProgressLog", Recorder)
  results = {}
  for kv_cache in (True, False):
    results[kv_cache] = jax.device_get(evaluator.make_eval_fn(
        tasks.get_task("tense"), model, vocab, eval_data, kv_cache=kv_cache)(params))
  for split in ("in_domain", "out_of_domain"):
    for name in ("accuracy", "loss"):
      assert results[True][split][name].shape == (2,)
      np.testing.assert_array_equal(results[True][split][name], results[False][split][name])
  # 40 and 50 lines in batches of 16: 16, 16, 8 and 16, 16, 16, 2 real lines, each evaluation.
  per_eval = ([("in_domain", n) for n in (16, 16, 8)]
              + [("out_of_domain", n) for n in (16, 16, 16, 2)])
  assert updates == per_eval * 2


def test_progress_log_states_lines_rate_and_time_left():
  now = [0.0]
  lines = []
  progress = evaluation.ProgressLog(1000, 10, first_after_s=5.0, every_s=30.0,
                                    clock=lambda: now[0], log_fn=lambda f, *a: lines.append(f % a))
  now[0] = 2.0
  progress.update(100, "in_domain")  # within the first 5 s: silent
  assert not lines
  now[0] = 10.0
  progress.update(150, "in_domain")  # 250 lines in 10 s: 25 lines/s, 750 left -> 30 s
  assert lines == ["evaluation (in_domain): 250/1000 lines x 10 seeds, 25.0 lines/s, 30 s left"]
  now[0] = 20.0
  progress.update(250, "out_of_domain")  # 10 s after the last line: silent
  assert len(lines) == 1
  now[0] = 40.0
  progress.update(250, "out_of_domain")  # 750 in 40 s: 18.75/s, 250 left -> 13 s
  assert lines[-1].endswith("750/1000 lines x 10 seeds, 18.8 lines/s, 13 s left")
  now[0] = 200.0
  progress.update(250, "out_of_domain")  # done: the closing line says it
  progress.note("scoring pairs")  # a later stage of a logged evaluation is named
  progress.close()
  assert lines[-2] == "evaluation: scoring pairs"
  assert lines[-1] == "evaluation: 1000 lines x 10 seeds in 3 min 20 s (5.0 lines/s)"
  assert len(lines) == 4
  quiet = []
  fast = evaluation.ProgressLog(10, 1, clock=lambda: 0.0, log_fn=lambda f, *a: quiet.append(f))
  fast.update(10)
  fast.note("scoring pairs")
  fast.close()
  assert not quiet


def test_evaluation_says_what_it_evaluates_before_the_first_batch(monkeypatch, caplog):
  """The first evaluation (it compiles) logs a line before its first batch; later fast ones log
  nothing; progress lines come at most every 15 s by default."""
  vocab, in_domain = _tense_lines(40, seed=2)
  splits = {"in_domain": in_domain, "out_of_domain": _tense_lines(50, seed=3)[1]}
  cfg = model_lib.ModelConfig(vocab_size=vocab.size, num_layers=1, d_model=32, num_heads=4,
                              d_ff=64)
  model = model_lib.TransformerLM(cfg)
  params = jax.vmap(lambda k: model_lib.init_params(cfg, k))(
      jax.random.split(jax.random.key(0), 3))
  eval_data = {name: input_pipeline.prepare_eval_batches(split, 16, 0)
               for name, split in splits.items()}
  opened_before_batches = []
  real = evaluation.ProgressLog

  class FrozenClock(real):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, clock=lambda: 0.0, **kwargs)  # every evaluation takes 0 s

    def update(self, lines, what=""):
      opened_before_batches.append(self.opened)
      super().update(lines, what)

  monkeypatch.setattr(evaluation, "ProgressLog", FrozenClock)
  monkeypatch.setattr(evaluator, "_COMPILED", set())  # as in a fresh process
  caplog.set_level(logging.INFO, logger="sg_jax")
  evaluate = evaluator.make_eval_fn(tasks.get_task("tense"), model, vocab, eval_data)
  evaluate(params)
  first = [r.getMessage() for r in caplog.records]
  assert first[0] == ("evaluation: in_domain (40 lines) and out_of_domain (50 lines) x 3 seeds, "
                      "16 lines per batch; compiling first (the first batch of each split "
                      "includes its compilation)"), first
  assert first[-1].startswith("evaluation: 90 lines x 3 seeds in 0 s"), first
  assert opened_before_batches and all(opened_before_batches)
  caplog.clear()
  evaluate(params)  # compiled, and the last one was fast: silent
  assert not caplog.records
  # Progress lines: the first after 5 s, then at most one per 15 s.
  now, lines = [0.0], []
  progress = real(1000, 3, clock=lambda: now[0], log_fn=lambda f, *a: lines.append(f % a))
  for t in (6.0, 20.0, 22.0):
    now[0] = t
    progress.update(100, "in_domain")
  assert [l.split(":")[1].split(" lines")[0] for l in lines] == [" 100/1000", " 300/1000"], lines


def test_durations_in_logs_count_days():
  """Time left at the reference size on a CPU is weeks: it must not wrap at 24 h."""
  assert evaluation.format_duration(42.4) == "42 s"
  assert evaluation.format_duration(185) == "3 min 05 s"
  assert evaluation.format_duration(2 * 3600 + 7 * 60) == "2 h 07 min"
  assert evaluation.format_duration(29 * 86400 + 3 * 3600 + 59) == "29 d 03 h"


@pytest.mark.slow
def test_a_second_evaluator_reuses_the_compiled_functions(monkeypatch, caplog):
  """A second run in one process (same model config, task options and shapes) gets the same
  jitted functions and compiles nothing; another task option or model builds new ones."""
  vocab, in_domain = _tense_lines(20, seed=4)
  eval_data = {"in_domain": input_pipeline.prepare_eval_batches(in_domain, 8, 0)}
  cfg = model_lib.ModelConfig(vocab_size=vocab.size, num_layers=1, d_model=16, num_heads=2,
                              d_ff=32)
  params = jax.vmap(lambda k: model_lib.init_params(cfg, k))(
      jax.random.split(jax.random.key(1), 2))
  monkeypatch.setattr(evaluator, "_SPLIT_FNS_CACHE", {})
  monkeypatch.setattr(evaluator, "_COMPILED", set())
  caplog.set_level(logging.INFO, logger="sg_jax")
  # Each run builds its own model and task objects, as `train` does.
  build = lambda: evaluator.make_eval_fn(tasks.get_task("tense"), model_lib.TransformerLM(
      dataclasses.replace(cfg)), vocab, eval_data)
  first = build()(params)
  _, one_batch, summarize = evaluator.split_fns(
      tasks.get_task("tense"), model_lib.TransformerLM(cfg), vocab, eval_data["in_domain"])
  assert one_batch._cache_size() == 1 and summarize._cache_size() == 1  # compiled once
  assert "compiling first" in caplog.records[0].getMessage()
  caplog.clear()
  second = build()(params)
  assert len(evaluator._SPLIT_FNS_CACHE) == 1
  assert evaluator.split_fns(tasks.get_task("tense"), model_lib.TransformerLM(cfg), vocab,
                             eval_data["in_domain"])[1] is one_batch
  assert one_batch._cache_size() == 1 and summarize._cache_size() == 1  # no new compilation
  assert "compiling first" not in caplog.records[0].getMessage()
  for name in ("accuracy", "loss"):
    np.testing.assert_array_equal(np.asarray(first["in_domain"][name]),
                                  np.asarray(second["in_domain"][name]))
  # Another model or another decoder: other functions.
  other = model_lib.TransformerLM(dataclasses.replace(cfg, num_layers=2))
  assert evaluator.split_fns(tasks.get_task("tense"), other, vocab,
                             eval_data["in_domain"])[1] is not one_batch
  assert evaluator.split_fns(tasks.get_task("tense"), model_lib.TransformerLM(cfg), vocab,
                             eval_data["in_domain"], kv_cache=False)[1] is not one_batch


def test_task_key_follows_the_task_options():
  assert evaluator.task_key(tasks.get_task("dyck")) == evaluator.task_key(tasks.get_task("dyck"))
  assert (evaluator.task_key(tasks.get_task("dyck", min_distance=2))
          != evaluator.task_key(tasks.get_task("dyck")))
  assert (evaluator.task_key(tasks.get_task("tense"))
          != evaluator.task_key(tasks.get_task("question")))
