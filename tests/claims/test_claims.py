"""`sg_jax.claims`: each decision rule on hand-made runs whose answer is known, the registry
(a claim registered from outside shows in the table) and the Claims table's columns."""

import json
import math
import os

import numpy as np
import pytest

from sg_jax import claims
from sg_jax import stats
from sg_jax.claims import onesample
from sg_jax.report import reading
from sg_jax.report.reading import Run

import results_fixtures  # pylint: disable=wrong-import-order  (tests/ is on the path)

STEPS = np.arange(0, 11000, 1000)


def _run(depth, finals, *, at_saturation=0.1, task="question", name=None, config=None,
         extra=None):
  """A plain lm run: in-domain saturates at step 2000, generalisation goes from
  `at_saturation` there linearly to each seed's final value; `extra` {name: per-seed final}
  adds flat analysis series."""
  series = {"in_domain/accuracy": {}, "out_of_domain/accuracy": {}}
  for s, f in enumerate(finals):
    series["in_domain/accuracy"][s] = (STEPS, np.minimum(1.0, STEPS / 2000))
    gen = np.where(STEPS < 2000, at_saturation * STEPS / 2000,
                   at_saturation + (f - at_saturation) * (STEPS - 2000) / 8000)
    series["out_of_domain/accuracy"][s] = (STEPS, gen)
  for column, values in (extra or {}).items():
    series[column] = {s: (STEPS, np.full(STEPS.size, v)) for s, v in enumerate(values)}
  cfg = {"task": task, "objective": "lm", "num_seeds": len(finals),
         "model": {"num_layers": depth}, **(config or {})}
  return Run(workdir="", name=name or f"depth{depth}", depth=depth, task=task,
             num_steps=10000, series=series, config=cfg)


def _verdicts(claim_id, runs):
  return [r["verdict"] for r in claims.evaluate(runs, ids=[claim_id])]


def _noise(n, scale, seed):
  return np.random.default_rng(seed).normal(0, scale, n)


def test_inverted_u_supported_contradicted_or_not_testable():
  u = {4: 0.3, 6: 0.6, 8: 0.9, 10: 0.5, 12: 0.2}
  runs = [_run(d, np.clip(m + _noise(8, 0.03, d), 0, 1)) for d, m in u.items()]
  assert _verdicts("murty.inverted_u", runs) == [claims.SUPPORTED]
  rising = [_run(d, np.clip(0.1 * d / 2 + _noise(8, 0.03, d), 0, 1)) for d in (4, 6, 8, 10)]
  assert _verdicts("murty.inverted_u", rising) == [claims.CONTRADICTED]
  falling = [_run(d, np.clip(1 - 0.1 * d / 2 + _noise(8, 0.03, d), 0, 1)) for d in (4, 6, 8)]
  assert _verdicts("murty.inverted_u", falling) == [claims.CONTRADICTED]
  flat = [_run(d, np.clip(0.6 + _noise(4, 0.2, d), 0, 1)) for d in (4, 6, 8, 10)]
  row, = claims.evaluate(flat, ids=["murty.inverted_u"])
  assert row["verdict"] == claims.NOT_TESTABLE
  assert row["seeds per arm"] == "4 / 4 / 4 / 4" and row["detectable effect"]
  assert _verdicts("murty.inverted_u", rising[:2]) == [claims.NO_RUNS]  # 2 depths: no U to test


def test_depth_claims_are_holm_adjusted_over_tasks():
  """inverted_u and tscore_best_depth: one family over tasks; a task's adjusted p together with
  another task is Holm over the tasks' own (alone) adjusted p-values."""
  from sg_jax.claims import murty  # pylint: disable=import-outside-toplevel
  u = {4: 0.4, 6: 0.6, 8: 0.8, 10: 0.55}
  score = {4: 0.2, 6: 0.9, 8: 0.5, 10: 0.1}  # tscore picks 6, depth 8 generalises best
  def sweep(task, spread, seed):
    return [_run(d, np.clip(m + _noise(6, spread, seed + d), 0, 1), task=task,
                 name=f"{task}{d}", extra={"tscore": [score[d]] * 6}) for d, m in u.items()]
  question, tense = sweep("question", 0.05, 0), sweep("tense", 0.2, 100)
  for claim in (murty.inverted_u, murty.tscore_best_depth):
    alone = [claim(question)[0], claim(tense)[0]]
    both = claim(question + tense)
    assert len(both) == 2
    expected = stats.holm([o.p_adjusted for o in alone])
    np.testing.assert_allclose([o.p_adjusted for o in both], expected)
    for o in both:  # the verdict reads the adjusted p
      assert (o.verdict != claims.NOT_TESTABLE) == (o.p_adjusted < 0.05), (claim, o)
  assert both[0].p_adjusted > alone[0].p_adjusted  # the family made a difference


def test_grokking_rule():
  big_gain = [_run(6, 0.9 + _noise(8, 0.02, 1))]
  assert _verdicts("murty.grokking", big_gain) == [claims.SUPPORTED]
  no_gain = [_run(6, 0.1 + _noise(8, 0.02, 2))]
  assert _verdicts("murty.grokking", no_gain) == [claims.CONTRADICTED]
  # 4 seeds: the sign-flip test's smallest p is 2/16 = 0.125, so no verdict either way
  row, = claims.evaluate([_run(6, 0.9 + _noise(4, 0.02, 3))], ids=["murty.grokking"])
  assert row["verdict"] == claims.NOT_TESTABLE and row["detectable effect"] == "none at this n"
  # the gain (~0.8) is far above 0.2 + its detectable effect, so the first n at which the
  # sign-flip test can reach 0.05 suffices: 2 / 2^6 = 0.031
  assert row["seeds needed"] == "6"


def test_grokking_without_saturation_is_not_testable_not_absent():
  run = _run(6, [0.5] * 4)
  for s in range(4):
    run.series["in_domain/accuracy"][s] = (STEPS, np.full(STEPS.size, 0.9))
  row, = claims.evaluate([run], ids=["murty.grokking"])
  assert row["verdict"] == claims.NOT_TESTABLE and "4 of 4 seeds never reach" in row["note"]


def test_early_stopping_needs_the_end_above_the_papers_bound():
  good_end = [_run(6, 0.9 + _noise(8, 0.02, 4), at_saturation=0.1)]
  assert _verdicts("murty.early_stopping", good_end) == [claims.SUPPORTED]
  vacuous = [_run(6, 0.3 + _noise(8, 0.02, 5), at_saturation=0.05)]  # end above early stop,
  row, = claims.evaluate(vacuous, ids=["murty.early_stopping"])      # but below 0.40
  assert row["verdict"] == claims.NOT_TESTABLE and "vacuous" in row["note"]
  worse_end = [_run(6, 0.05 + _noise(8, 0.01, 6) * 0, at_saturation=0.6)]
  assert _verdicts("murty.early_stopping", worse_end) == [claims.CONTRADICTED]


def test_predictors_within_depth():
  runs = []
  for d in (4, 6, 8):
    gen = np.linspace(0.2, 0.9, 8)
    runs.append(_run(d, gen, extra={"tscore": gen + _noise(8, 0.01, d),
                                    "weight_norm_per_layer": -gen + _noise(8, 0.01, d + 1)}))
  assert _verdicts("murty.tscore_within_depth", runs) == [claims.SUPPORTED]
  # weight norm tracking generalisation within depth contradicts "does not predict"
  assert _verdicts("murty.weight_norm_does_not_predict", runs) == [claims.CONTRADICTED]
  noise = [_run(d, np.linspace(0.2, 0.9, 4), extra={"tscore": _noise(4, 1, d)})
           for d in (4, 6)]
  assert _verdicts("murty.tscore_within_depth", noise) == [claims.NOT_TESTABLE]
  assert _verdicts("murty.sparsity_does_not_predict", noise) == [claims.NO_RUNS]
  # a depth with 2 seeds cannot enter the within-depth test: the row says so
  short = runs[:2] + [_run(8, [0.3, 0.6], extra={"tscore": [0.1, 0.2]})]
  row, = claims.evaluate(short, ids=["murty.tscore_within_depth"])
  assert row["seeds per arm"] == "8 / 8" and "depths 8 left out" in row["note"]


def test_tscore_best_depth_rule():
  gen = {4: 0.3, 6: 0.9, 8: 0.5}
  score = {4: 0.5, 6: 0.8, 8: 0.6}  # tscore picks the best depth, an interior one
  runs = [_run(d, gen[d] + _noise(8, 0.02, d), extra={"tscore": [score[d]] * 8}) for d in gen]
  # an unrelated measure would pick the best of 3 depths 1 time in 3: no evidence, whatever n
  row, = claims.evaluate(runs, ids=["murty.tscore_best_depth"])
  assert row["verdict"] == claims.NOT_TESTABLE and row["seeds needed"] == ""
  assert "1 time in 3: more depths, not seeds" in claims.markdown_table([row])[2]
  wrong = {4: 0.9, 6: 0.8, 8: 0.5}  # tscore picks depth 6, depth 4 generalises best
  runs = [_run(d, wrong[d] + _noise(8, 0.02, d), extra={"tscore": [score[d]] * 8})
          for d in wrong]
  assert _verdicts("murty.tscore_best_depth", runs) == [claims.CONTRADICTED]
  monotone = [_run(d, 0.1 * d + _noise(8, 0.02, d), extra={"tscore": [d] * 8}) for d in (4, 6, 8)]
  row, = claims.evaluate(monotone, ids=["murty.tscore_best_depth"])
  assert row["verdict"] == claims.NOT_TESTABLE and "confounded with depth" in row["note"]
  assert row["seeds needed"] == ""  # more seeds cannot separate tscore from depth
  assert row["setting"].endswith(": depth 6 vs 8")  # the two depths compared
  table = claims.markdown_table([row])[2]
  assert table.endswith("| not testable at this n (best depth 8 is an end of the range, "
                        "confounded with depth: more seeds cannot help) |")


def _regime_run(uas, gen, lambdas, ends):
  n = len(lambdas)
  run = _run(4, gen, config={"num_seeds": n, "sas": {"lambdas": list(lambdas),
                                                     "ends": list(ends)}}, name="sas")
  run.series["in_domain/uas"] = {s: (STEPS, np.full(STEPS.size, u)) for s, u in enumerate(uas)}
  return run


def test_chen_regulariser_and_brief_suppression():
  k = 6  # seeds per regime
  lambdas = [0] * k + [0.3] * k + [-0.3] * k + [0.3] * k
  ends = [0] * 3 * k + [700] * k
  uas = np.r_[0.32 + _noise(k, 0.005, 1), 0.12 + _noise(k, 0.005, 2),
              0.43 + _noise(k, 0.005, 3), 0.33 + _noise(k, 0.005, 4)]
  gen = np.r_[0.3 + _noise(k, 0.01, 5), 0.3 + _noise(k, 0.01, 6), 0.2 + _noise(k, 0.01, 7),
              0.9 + _noise(k, 0.01, 8)]
  run = _regime_run(uas, gen, lambdas, ends)
  rows = claims.evaluate([run], ids=["chen.regulariser_moves_uas"])
  assert [r["setting"] for r in rows] == ["sas: suppressed vs unregularised",
                                          "sas: promoted vs unregularised"]
  assert [r["verdict"] for r in rows] == [claims.SUPPORTED, claims.SUPPORTED]
  assert _verdicts("chen.brief_suppression_helps", [run]) == [claims.SUPPORTED]
  order = np.r_[np.arange(3 * k, 4 * k), np.arange(k, 3 * k), np.arange(0, k)]
  reversed_run = _regime_run(uas, gen[order], lambdas, ends)
  assert _verdicts("chen.brief_suppression_helps", [reversed_run]) == [claims.CONTRADICTED]
  assert _verdicts("chen.brief_suppression_helps", [_run(4, gen)]) == [claims.NO_RUNS]
  # 4 seeds against 4: the smallest two-sided p is 2 / 70 = 0.029, and Holm over the two
  # regimes doubles it: the same separation is not testable at this n
  four = np.r_[0:4, k:k + 4, 2 * k:2 * k + 4]
  small = _regime_run(uas[four], gen[four], [lambdas[i] for i in four], [0] * 12)
  assert [r["verdict"] for r in claims.evaluate([small], ids=["chen.regulariser_moves_uas"])
          ] == [claims.NOT_TESTABLE] * 2
  # SAS-free seeds with the tree regulariser on are not controls: without a control, no test
  treed = _regime_run(uas, gen, lambdas, ends)
  treed.config["tree"] = {"lambdas": [0.5] * k + [0.0] * 3 * k}
  assert _verdicts("chen.regulariser_moves_uas", [treed]) == [claims.NO_RUNS]


def test_own_dose_responses():
  gen = np.r_[0.2 + _noise(4, 0.01, 1), 0.5 + _noise(4, 0.01, 2), 0.8 + _noise(4, 0.01, 3),
              0.9 + _noise(4, 0.01, 4)]
  run = _run(6, gen, config={"num_seeds": 16,
                             "tree": {"lambdas": [0] * 4 + [0.01] * 4 + [0.1] * 4 + [-0.01] * 4}})
  row, = claims.evaluate([run], ids=["sg_jax.tree_dose_response"])
  assert row["verdict"] == claims.SUPPORTED and row["setting"].endswith("= 0 / 0.01 / 0.1")
  assert row["seeds per arm"] == "4 / 4 / 4"  # the suppressed seeds are not a dose
  down = _run(4, gen[::-1], config={"num_seeds": 16,
                                    "data": {"num_disambiguating": [0] * 8 + [100] * 8}})
  assert _verdicts("sg_jax.disambiguating_lines", [down]) == [claims.CONTRADICTED]


def test_bhaskar_claims_on_hand_made_pruning_tables(tmp_path):
  work = str(tmp_path / "prune")
  results_fixtures.make_workdir(work, depth=4, finals=[0.6] * 8, pruning=False)
  results_fixtures.write_pruning(work, num_layers=4, num_seeds=8, num_heads=4)
  run = reading.load_run(work)
  rows = {r["claim"]: r for r in claims.evaluate(
      [run], ids=["bhaskar.equal_in_domain_differ", "bhaskar.shared_core",
                  "bhaskar.core_forms_early", "bhaskar.core_ablation"])}
  # out-of-domain 0.5 / 0.6 / 0.7 on 400 lines at equal in-domain accuracy: they differ
  assert rows["bhaskar.equal_in_domain_differ"]["verdict"] == claims.SUPPORTED
  # head 0 is in every subnetwork (core of 1 per seed, 8 in all) against 8 x 16 x (2/16)^3
  assert rows["bhaskar.shared_core"]["verdict"] == claims.SUPPORTED
  assert rows["bhaskar.shared_core"]["statistic"] == "8"
  # the step-500 core (after saturation at 200) equals the final one
  assert rows["bhaskar.core_forms_early"]["verdict"] == claims.SUPPORTED
  # random heads removed 0.55 + 0.01 s against the core removed 0.30 + 0.01 s
  assert rows["bhaskar.core_ablation"]["verdict"] == claims.SUPPORTED
  assert _verdicts("bhaskar.shared_core", [_run(4, [0.5] * 2)]) == [claims.NO_RUNS]
  # the line count is the pruning's own --eval_lines when it recorded one, not eval.max_lines
  assert rows["bhaskar.equal_in_domain_differ"]["note"].endswith("; 400 lines per accuracy")
  with open(os.path.join(work, "pruning.csv.options.json"), "w") as f:
    json.dump({"eval_lines": 20}, f)
  row, = claims.evaluate([reading.load_run(work)], ids=["bhaskar.equal_in_domain_differ"])
  assert row["note"].endswith("; 20 lines per accuracy")
  # 0.5 vs 0.7 on 20 lines each: chi-square p ~ 0.2, no group differs
  assert row["verdict"] == claims.NOT_TESTABLE


def test_a_claim_registered_from_outside_shows_in_the_table():
  @claims.claim(id="test.outside", source="this test", statement="final generalisation > 0.5",
                needs="any run", test="sign-flip permutation", rule="supported if p < 0.05")
  def outside(runs):
    x = [f for r in runs for f in r.series["out_of_domain/accuracy"] and
         [v[1][-1] for v in r.series["out_of_domain/accuracy"].values()]]
    test = onesample.paired_test(x, [0.5] * len(x))
    return [claims.Outcome(setting="all runs", arms=(len(x),), test=test.name,
                           statistic=test.statistic, p=test.p,
                           verdict=claims.decide(test, +1), detectable=test.detectable)]

  try:
    assert "test.outside" in claims.claims()
    rows = claims.evaluate([_run(6, [0.9] * 8)])
    mine = [r for r in rows if r["claim"] == "test.outside"]
    assert len(mine) == 1 and mine[0]["verdict"] == claims.SUPPORTED
    assert mine[0]["p or interval"] == "p = 0.00781"  # 2 / 2^8: every seed above 0.5
    assert any("| test.outside | all runs | 8 |" in line for line in
               claims.markdown_table(mine))
    with pytest.raises(ValueError, match="registered already"):
      claims.register(claims.claims()["test.outside"])
  finally:
    claims.unregister("test.outside")
  assert "test.outside" not in claims.claims()


def test_claims_table_columns_and_no_runs_rows():
  rows = claims.evaluate([])
  assert {r["verdict"] for r in rows} == {claims.NO_RUNS}
  assert len(rows) == len(claims.claims()) >= 16
  header = claims.markdown_table(rows)[0]
  assert header == ("| claim | setting | seeds per arm | test | statistic | p or interval | "
                    "detectable effect | verdict |")
  lines = claims.markdown_lines(rows)
  assert lines[1] == "## Claims" and "alpha 0.05" in lines[-1]
  assert lines[3] == "No runs here for: " + ", ".join(f"`{c}`" for c in claims.claims()) + "."
  for c in claims.claims().values():
    assert c.source and c.rule and c.test and c.needs and c.statement


def test_decide_and_the_null_rule():
  test = lambda p, effect, detectable: stats.Test("t", effect, p, (8,), effect, detectable)
  assert claims.decide(test(0.01, 0.3, 0.1), +1) == claims.SUPPORTED
  assert claims.decide(test(0.01, -0.3, 0.1), +1) == claims.CONTRADICTED
  assert claims.decide(test(0.2, 0.3, 0.5), +1) == claims.NOT_TESTABLE
  assert claims.decide(test(0.01, 0.3, 0.1), 0, effect_of_interest=0.4) == claims.CONTRADICTED
  assert claims.decide(test(0.5, 0.0, 0.3), 0, effect_of_interest=0.4) == claims.SUPPORTED
  assert claims.decide(test(0.5, 0.0, 0.6), 0, effect_of_interest=0.4) == claims.NOT_TESTABLE
  with pytest.raises(ValueError, match="effect_of_interest"):
    claims.decide(test(0.5, 0.0, 0.6), 0)


def test_paired_test_is_the_exact_sign_flip_enumeration():
  rng = np.random.default_rng(0)
  x, y = rng.normal(0, 1, 7), rng.normal(0.5, 1, 7)
  d = x - y
  flips = np.array(np.meshgrid(*[[-1, 1]] * 7)).reshape(7, -1).T
  means = (flips * np.abs(d)).mean(axis=1)
  naive = np.mean(np.abs(means) >= abs(d.mean()) - 1e-12)
  result = onesample.paired_test(x, y)
  assert result.p == pytest.approx(naive)
  assert result.min_p == pytest.approx(2 / 2**7)
  assert onesample.paired_test([1, 2, 3, 4], [0, 0, 0, 0]).detectable == math.inf


def test_paired_detectable_is_a_positive_number_falling_with_n():
  """statsmodels' power solver falls back to another root finder at some n (e.g. 73 at alpha
  0.05) and returns a 1-element array, sometimes the negative root: the detectable effect must
  still be a positive float, falling with n, at every n the seeds-needed scan tries."""
  for alpha in (0.05, 0.025, 0.05 / 3):
    values = [onesample.paired_detectable(n, 1.0, alpha) for n in range(8, 257)]
    assert all(isinstance(v, float) and 0 < v < math.inf for v in values), alpha
    assert all(b < a for a, b in zip(values, values[1:])), alpha


def test_proportion_detectable_is_exact():
  # n = 8 against 0.5: only 8/8 and 0/8 reach p < 0.05 (p = 0.0078), so power at q is q^8
  assert onesample.proportion_detectable(8) == pytest.approx(0.8 ** (1 / 8) - 0.5, abs=1e-6)
  assert onesample.proportion_detectable(4) == math.inf  # 4/4 gives p = 0.125
  result = onesample.proportion_test(8, 8)
  assert result.p == pytest.approx(2 / 256) and result.effect == 0.5


def test_seeds_needed_in_a_holm_family_is_computed_at_alpha_over_its_size():
  """A comparison in a Holm family of m is sure to pass only at p < alpha / m, so its seeds
  needed are those of the test at alpha / m: checked against a naive search, and on a claim
  tested in one run and in two."""
  from sg_jax.claims import detect, registry  # pylint: disable=import-outside-toplevel
  detectable = detect.proportion(0.5)
  def naive(alpha):
    return next(n for n in range(2, 200) if detectable(n, alpha=alpha) <= 0.35)
  assert registry.seeds_needed(detectable, 0.35) == naive(0.05)
  assert registry.seeds_needed(detectable, 0.35, family_size=2) == naive(0.025)
  assert registry.seeds_needed(detectable, 0.35, family_size=3) == naive(0.05 / 3)
  assert naive(0.05 / 3) > naive(0.05)  # the family costs seeds here
  with pytest.raises(ValueError, match="family_size"):
    registry.seeds_needed(detectable, 0.35, family_size=0)
  alone, = claims.evaluate([_two_drop_run(4, 6000, 6000)], ids=["chen.structure_with_loss_drop"])
  pair = claims.evaluate([_two_drop_run(4, 6000, 6000)] * 2, ids=["chen.structure_with_loss_drop"])
  assert int(alone["seeds needed"]) == naive(0.05)
  assert [int(r["seeds needed"]) for r in pair] == [naive(0.025)] * 2
  # over tasks (murty's family): the same rule, alpha over the number of tasks tested
  mean_difference = detect.mean_difference([0.1, 0.3, 0.2, 0.5], [0.4, 0.6, 0.5, 0.9])
  assert murty_needed(mean_difference, 2) == next(
      n for n in range(2, 300) if mean_difference(n, alpha=0.025) <= 0.1)


def murty_needed(detectable_at, tasks):
  from sg_jax.claims import murty  # pylint: disable=import-outside-toplevel
  return murty._needed(detectable_at, 0.1, 1, tasks)  # pylint: disable=protected-access


def test_no_effect_claims_are_not_supported_by_holm_alone():
  """Holm raises p-values; a claim of no effect must not become "supported" because of it: two
  settings rejecting at p = 0.03 and 0.04 (Holm 0.06 each) are not testable, not supported."""
  def item(p):
    return claims.Item("s", (8,), stats.Test("t", 0.5, p, (8,), 0.5, 0.3), None)
  outcomes = claims.family([item(0.03), item(0.04)], 0, effect_of_interest=0.4)
  assert [o.p_adjusted for o in outcomes] == pytest.approx([0.06, 0.06])
  assert [o.verdict for o in outcomes] == [claims.NOT_TESTABLE] * 2
  outcomes = claims.family([item(0.3), item(0.5)], 0, effect_of_interest=0.4)
  assert [o.verdict for o in outcomes] == [claims.SUPPORTED] * 2  # detectable 0.3 <= 0.4
  outcomes = claims.family([item(0.01), item(0.02)], 0, effect_of_interest=0.4)
  assert [o.verdict for o in outcomes] == [claims.CONTRADICTED] * 2  # Holm 0.02, 0.02


def _two_drop_run(num_seeds, structure_at, later_at, initial_at=750):
  """Loss: an initial descent at `initial_at`, a plateau, a later drop at `later_at` (None:
  none); UAS rises at `structure_at`."""
  steps = np.arange(0, 10001, 250)
  sigmoid = lambda t, at, w=150: 1 / (1 + np.exp(-(t - at) / w))
  run = _run(4, [0.5] * num_seeds, config={"num_seeds": num_seeds})
  run.series["in_domain/uas"] = {s: (steps, 0.1 + 0.3 * sigmoid(steps, structure_at))
                                 for s in range(num_seeds)}
  loss = 4.0 - 2.0 * sigmoid(steps, initial_at)
  if later_at is not None:
    loss = loss - 1.0 * sigmoid(steps, later_at)
  run.series["train/loss"] = {s: (steps, loss.copy()) for s in range(num_seeds)}
  return run


def test_structure_onset_with_loss_drop():
  # structure with the later drop (after a plateau), in every seed: supported, p = 2/2^8
  row, = claims.evaluate([_two_drop_run(8, 6000, 6000)], ids=["chen.structure_with_loss_drop"])
  assert row["verdict"] == claims.SUPPORTED
  assert row["p or interval"] == "p = 0.00781; 1.000 [0.631, 1.000] (Clopper-Pearson, n=8)"
  # structure long after the initial descent and long before the later drop: contradicted
  assert _verdicts("chen.structure_with_loss_drop", [_two_drop_run(8, 3500, 8000)]) == [
      claims.CONTRADICTED]
  # structure with the initial descent, resolved (onset 2000 steps after the start): counts
  assert _verdicts("chen.structure_with_loss_drop",
                   [_two_drop_run(8, 2000, 8000, initial_at=2000)]) == [claims.SUPPORTED]
  # structure at the start of training (within one resolution of step 0): the tie with the
  # initial descent cannot fail, so these seeds are left out: nothing left to test
  row, = claims.evaluate([_two_drop_run(8, 250, 8000, initial_at=250)],
                         ids=["chen.structure_with_loss_drop"])
  assert row["verdict"] == claims.NOT_TESTABLE and row["seeds needed"] == ""
  assert "within one resolution of the start of training" in claims.markdown_table([row])[2]
  assert row["note"].startswith("8 of 8 seeds have a structure onset; 8 of them within one "
                                "resolution of the start")
  row, = claims.evaluate([_two_drop_run(4, 6000, 6000)], ids=["chen.structure_with_loss_drop"])
  assert row["verdict"] == claims.NOT_TESTABLE and row["detectable effect"] == "none at this n"
  # seeds at which the exact binomial test detects 0.85 against 0.5 with power 0.8
  needed = int(row["seeds needed"])
  assert onesample.proportion_detectable(needed) <= 0.35 < onesample.proportion_detectable(8)
  # no seed with a structure onset (UAS flat): the run is there, so "not testable", not "no runs"
  flat = _two_drop_run(8, 6000, 6000)
  flat.series["in_domain/uas"] = {s: (c[0], np.full(c[0].size, 0.1))
                                  for s, c in flat.series["in_domain/uas"].items()}
  row, = claims.evaluate([flat], ids=["chen.structure_with_loss_drop"])
  assert row["verdict"] == claims.NOT_TESTABLE and "no seed has a structure onset" in \
      claims.markdown_table([row])[2]
  # two runs: Holm over them
  rows = claims.evaluate([_two_drop_run(8, 6000, 6000), _two_drop_run(8, 6000, 6000)],
                         ids=["chen.structure_with_loss_drop"])
  assert [r["p or interval"].split(";")[0] for r in rows] == ["p = 0.00781 (Holm 0.0156)"] * 2


def test_lm_generalises_best_over_objectives():
  def objective_run(objective, prefs):
    run = _run(6, [0.5] * len(prefs), name=objective, config={"objective": objective})
    run.series["out_of_domain/preference"] = {s: (STEPS, np.full(STEPS.size, p))
                                              for s, p in enumerate(prefs)}
    return run

  lm = objective_run("lm", 0.7 + _noise(6, 0.01, 1))
  prefix = objective_run("prefix_lm", 0.05 + _noise(6, 0.01, 2))
  rows = claims.evaluate([lm, prefix], ids=["sg_jax.lm_generalises_best"])
  assert [(r["setting"], r["verdict"]) for r in rows] == [("lm vs prefix_lm", claims.SUPPORTED)]
  better = objective_run("prefix_lm", 0.95 + _noise(6, 0.01, 3))
  assert _verdicts("sg_jax.lm_generalises_best", [lm, better]) == [claims.CONTRADICTED]
  assert _verdicts("sg_jax.lm_generalises_best", [lm]) == [claims.NO_RUNS]
  # an lm run of another task is never pooled with this task's lm seeds
  tense_lm = objective_run("lm", 0.05 + _noise(6, 0.01, 4))
  tense_lm.task = tense_lm.config["task"] = "tense"
  rows = claims.evaluate([lm, prefix, tense_lm], ids=["sg_jax.lm_generalises_best"])
  assert [(r["setting"], r["seeds per arm"]) for r in rows] == [("question: lm vs prefix_lm",
                                                                 "6 / 6")]


def test_no_prediction_is_supported_only_with_power():
  rng = np.random.default_rng(7)
  runs = [_run(d, rng.uniform(0.2, 0.9, 40), extra={"attention_sparsity_paper":
                                                    rng.normal(0, 1, 40)}) for d in (4, 6, 8)]
  row, = claims.evaluate(runs, ids=["murty.sparsity_does_not_predict"])
  # 40 seeds in each of 3 depths: no association, and rho 0.4 would be found with power 0.8
  assert float(row["p or interval"].split("= ")[1]) >= 0.05
  assert float(row["detectable effect"]) < 0.4
  assert row["verdict"] == claims.SUPPORTED
  few = [_run(d, rng.uniform(0.2, 0.9, 5), extra={"attention_sparsity_paper":
                                                   rng.normal(0, 1, 5)}) for d in (4, 6, 8)]
  row, = claims.evaluate(few, ids=["murty.sparsity_does_not_predict"])
  assert row["verdict"] == claims.NOT_TESTABLE and row["seeds needed"]


def test_a_run_stopped_soon_after_saturation_is_not_a_depth_claims_run():
  """Murty et al.'s claims are about training long after saturation: a run that ends at 1.5x
  its saturation step (a dense onset run: 3k steps, saturated at 2k) is left out of them
  (`select.LONG_TRAINING`), while the same seeds trained to 5x count."""
  run = _run(6, 0.1 + _noise(8, 0.02, 2))
  short = Run(workdir="", name="short", depth=6, task="question", num_steps=3000,
              series={name: {s: (steps[steps <= 3000], values[steps <= 3000])
                             for s, (steps, values) in by_seed.items()}
                      for name, by_seed in run.series.items()}, config=run.config)
  assert _verdicts("murty.grokking", [short]) == [claims.NO_RUNS]
  assert _verdicts("murty.early_stopping", [short]) == [claims.NO_RUNS]
  assert _verdicts("murty.grokking", [run]) == [claims.CONTRADICTED]
