"""Tests of the heuristic-core pruning (`sg_jax.pruning`): hard-concrete gates against their
closed forms, the masked model, the means, the Lagrangian reaching its target, the per-group
binarisation, vmapped runs against one run alone, and the core aggregations."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax.models import transformer as model_lib
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.pruning import core, hard_concrete, means as means_lib, objective, run

LAYERS, HEADS, D_MODEL, VOCAB = 2, 4, 16, 12
CONFIG = model_lib.ModelConfig(vocab_size=VOCAB, num_layers=LAYERS, d_model=D_MODEL,
                               num_heads=HEADS, d_ff=32, dropout=0.0)


def _params(seed=0):
  return model_lib.init_params(CONFIG, jax.random.key(seed))


def _lines(seed=0, n=24, length=9):
  """Random lines with padding: inputs, and targets = inputs shifted left (pad 0)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, length + 1, n)
  inputs = np.where(np.arange(length)[None] < lengths[:, None],
                    rng.integers(1, VOCAB, (n, length)), 0).astype(np.int32)
  targets = np.where(np.arange(length)[None] < lengths[:, None] - 1, np.roll(inputs, -1, 1), 0)
  return inputs, targets.astype(np.int32)


def test_hard_concrete_sampling_matches_the_closed_forms():
  """P(z = 0) and P(z = 1) of 200k samples per gate within 5 standard errors of the closed
  forms, at log_alpha where both masses are far from 0 and 1."""
  n = 200_000
  log_alpha = jnp.asarray([-2.0, -0.5, 0.0, 1.0, 2.5], jnp.float32)
  z = jax.vmap(lambda k: hard_concrete.sample(k, log_alpha))(
      jax.random.split(jax.random.key(0), n))
  z = np.asarray(z)
  assert z.min() == 0.0 and z.max() == 1.0
  for got, want in ((np.mean(z == 0.0, 0), hard_concrete.prob_closed(log_alpha)),
                    (np.mean(z == 1.0, 0), hard_concrete.prob_open(log_alpha))):
    want = np.asarray(want)
    se = np.sqrt(want * (1 - want) / n)
    np.testing.assert_array_less(np.abs(got - want), 5 * se)
  # The closed form at the formula's constants: P(z=0) = sigmoid(T log(0.1/1.1) - log_alpha).
  np.testing.assert_allclose(hard_concrete.prob_closed(jnp.float32(0.3)),
                             1 / (1 + math.exp(-(2 / 3 * math.log(0.1 / 1.1) - 0.3))), rtol=1e-6)
  # Initialised at N(10, 0.01): every gate open with probability ~1.
  init = hard_concrete.init_log_alpha(jax.random.key(1), (1000,))
  assert abs(float(init.mean()) - 10.0) < 0.01 and 0.005 < float(init.std()) < 0.015


def test_all_ones_gates_equal_the_unpruned_model():
  params = _params()
  inputs, _ = _lines()
  k_heads, k_mlp = jax.random.split(jax.random.key(7))
  heads = jax.random.normal(k_heads, (LAYERS, HEADS, D_MODEL // HEADS))
  mlp = jax.random.normal(k_mlp, (LAYERS, D_MODEL))
  plain = model_lib.TransformerLM(CONFIG).apply({"params": params}, inputs, deterministic=True)
  ones = run.apply_masked(CONFIG, params, inputs, jnp.ones((LAYERS, HEADS)),
                          jnp.ones((LAYERS,)), (heads, mlp))
  np.testing.assert_allclose(ones, plain, atol=2e-5, rtol=0)
  assert float(jnp.max(jnp.abs(plain))) > 0.1


@pytest.mark.slow
def test_means_are_over_real_tokens_and_a_pruned_head_outputs_its_mean():
  """The means equal a loop over the real tokens of each line alone (no padding in the sum),
  whatever the batch size; a closed head then outputs exactly that mean at every position, and
  the other units are the plain model's."""
  params = _params(1)
  inputs, _ = _lines(1, n=10)
  inputs[:, 5:] = np.where(np.arange(10)[:, None] % 2 == 0, 0, inputs[:, 5:])  # lengths 5 or 9
  inputs[1::2, 5:] = np.where(inputs[1::2, 5:] == 0, 3, inputs[1::2, 5:])
  inputs[:, :5] = np.where(inputs[:, :5] == 0, 4, inputs[:, :5])
  model = model_lib.TransformerLM(CONFIG)
  got = [means_lib.unit_means(params, jnp.asarray(means_lib.batch_lines(inputs, b)),
                              config=CONFIG) for b in (1, 4, 10)]
  head_sum, mlp_sum, count = 0.0, 0.0, 0
  forward = jax.jit(lambda tokens: apply_with_intermediates(model, params, tokens)[1])
  assert sorted({int((line != 0).sum()) for line in inputs}) == [5, 9]  # two compilations
  for line in inputs:
    real = line[line != 0][None]
    inter = forward(jnp.asarray(real))
    head_sum = head_sum + np.asarray(inter["heads"])[:, 0].sum(1)
    mlp_sum = mlp_sum + np.asarray(inter["mlp"])[:, 0].sum(1)
    count += real.shape[1]
  for heads, mlp in got:
    np.testing.assert_allclose(heads, head_sum / count, atol=2e-5, rtol=0)
    np.testing.assert_allclose(mlp, mlp_sum / count, atol=2e-5, rtol=0)
  heads, mlp = got[0]
  z = jnp.ones((LAYERS, HEADS)).at[1, 2].set(0.0)
  _, plain = apply_with_intermediates(model, params, jnp.asarray(inputs))
  _, pruned = apply_with_intermediates(model, params, jnp.asarray(inputs), head_mask=z,
                                       head_means=heads, mlp_mask=jnp.ones((LAYERS,)),
                                       mlp_means=mlp)
  np.testing.assert_allclose(pruned["heads"][1][:, :, 2],
                             np.broadcast_to(heads[1, 2], pruned["heads"][1][:, :, 2].shape),
                             atol=1e-6, rtol=0)
  np.testing.assert_allclose(pruned["heads"][0], plain["heads"][0], atol=2e-5, rtol=0)
  np.testing.assert_allclose(pruned["heads"][1][:, :, :2], plain["heads"][1][:, :, :2],
                             atol=2e-5, rtol=0)
  assert float(jnp.max(jnp.abs(pruned["hidden"][2] - plain["hidden"][2]))) > 1e-3


def test_kl_and_target_schedule_by_hand():
  rng = np.random.default_rng(2)
  p, q = rng.normal(size=(2, 3, 5)), rng.normal(size=(2, 3, 5))
  targets = np.array([[1, 2, 0], [3, 0, 0]])
  lp = p - np.log(np.exp(p).sum(-1, keepdims=True))
  lq = q - np.log(np.exp(q).sum(-1, keepdims=True))
  kl = (np.exp(lp) * (lp - lq)).sum(-1)
  want = (kl[0, 0] + kl[0, 1] + kl[1, 0]) / 3
  np.testing.assert_allclose(objective.kl_divergence(p, q, targets), want, rtol=1e-5)
  t = lambda s, kind: float(objective.target_sparsity(s, 0.5, 100, kind))
  assert t(0, "linear") == 0 and t(50, "linear") == pytest.approx(0.25) and t(300, "linear") == 0.5
  assert t(50, "log") == pytest.approx(1 - math.sqrt(0.5), rel=1e-6) and t(100, "log") == 0.5
  with pytest.raises(ValueError, match="warmup_type"):
    objective.target_sparsity(0, 0.5, 10, "cosine")


def _train_data(seed=0):
  inputs, targets = _lines(seed, n=32)
  return {"inputs": jnp.asarray(means_lib.batch_lines(inputs, 8)),
          "targets": jnp.asarray(means_lib.batch_lines(targets, 8))}


@pytest.mark.slow
def test_expected_sparsity_meets_the_target_at_the_end_of_pruning():
  """Two levels in one program (600 steps, the target rising over 400): the expected sparsity
  of the trained gates within 0.02 of each target, from every gate open."""
  params = _params(3)
  data = _train_data(3)
  means = means_lib.unit_means(params, data["inputs"], config=CONFIG)
  settings = run.Settings(num_steps=600, sparsity_warmup_steps=400, lr_warmup_steps=20)
  levels = (0.3, 0.6)
  keys = jnp.stack([jnp.stack([run.run_key(0, lv, 0) for lv in levels])])
  states, metrics = run.train_runs(
      run.init_runs(keys, CONFIG, settings), jax.tree_util.tree_map(lambda a: a[None], params),
      tuple(m[None] for m in means), jnp.asarray([levels], jnp.float32), data, num_steps=600,
      config=CONFIG, settings=settings)
  for k, target in enumerate(levels):
    expected = float(objective.expected_sparsity(states.log_alpha["heads"][0, k],
                                                 states.log_alpha["mlp"][0, k]))
    assert abs(expected - target) < 0.02, (target, expected)
    assert float(metrics["target"][-1, 0, k]) == pytest.approx(target)
    assert float(metrics["expected_sparsity"][0, 0, k]) < 1e-3  # started with every gate open


def test_binarised_masks_follow_the_per_group_rule():
  # Layer 0: P(z=0) ~ (0.001, 0.80, 0.03, 0.87), sum 1.70 -> close the 2 lowest log_alpha.
  # Layer 1: P(z=0) ~ (0.25, 0.23, 0, 0), sum 0.48 -> close none; units 0, 1 have soft value
  # sigmoid(log_alpha / T * 0.8) < 0.5, which only the thresholded variant closes.
  la_heads = np.array([[5.0, -3.0, 2.0, -3.5], [-0.5, -0.4, 6.0, 6.0]])
  la_mlp = np.array([-1.0, -2.0])  # P(z=0) 0.35 -> kept, 0.60 -> closed
  p = np.asarray(hard_concrete.prob_closed(jnp.asarray(la_heads)))
  np.testing.assert_allclose(p.sum(1), [1.70, 0.48], atol=0.01)
  heads, mlp = hard_concrete.deterministic_masks(la_heads, la_mlp)
  np.testing.assert_array_equal(heads, [[True, False, True, False], [True, True, True, True]])
  np.testing.assert_array_equal(mlp, [True, False])
  heads, mlp = hard_concrete.deterministic_masks(la_heads, la_mlp, threshold=True)
  np.testing.assert_array_equal(heads, [[True, False, True, False], [False, False, True, True]])
  np.testing.assert_array_equal(mlp, [False, False])
  # Leading run axes: each run binarised alone.
  stacked = hard_concrete.deterministic_masks(np.stack([la_heads, -la_heads]),
                                              np.stack([la_mlp, -la_mlp]))
  np.testing.assert_array_equal(stacked[0][0], [[True, False, True, False], [True] * 4])
  np.testing.assert_array_equal(stacked[0][1], hard_concrete.deterministic_masks(
      -la_heads, -la_mlp)[0])
  # Global: round(0.4 x 10) = 4 lowest log_alpha closed: -3.5, -3, -2 (MLP 1), -1 (MLP 0).
  heads, mlp = hard_concrete.global_masks(la_heads, la_mlp, 0.4)
  np.testing.assert_array_equal(heads, [[True, False, True, False], [True, True, True, True]])
  np.testing.assert_array_equal(mlp, [False, False])


@pytest.mark.slow
@pytest.mark.parametrize("group", [None, 1])
def test_one_run_in_the_vmapped_batch_equals_the_run_alone(group):
  """2 training seeds x 3 runs (levels, pruning seeds), one program (the 3 runs vmapped
  together, or one after another), against each run alone: log_alpha, multipliers and per-step
  metrics within 1e-5."""
  params = [_params(s) for s in (4, 5)]
  params_s = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *params)
  data = _train_data(4)
  means = [means_lib.unit_means(p, data["inputs"], config=CONFIG) for p in params]
  means_s = tuple(jnp.stack(m) for m in zip(*means))
  grid = [(0.3, 0), (0.3, 1), (0.7, 0)]
  settings = run.Settings(num_steps=60, sparsity_warmup_steps=40, lr_warmup_steps=10)
  keys = jnp.stack([jnp.stack([run.run_key(s, lv, ps) for lv, ps in grid]) for s in (4, 5)])
  targets = jnp.asarray([[lv for lv, _ in grid]] * 2, jnp.float32)
  states, metrics = run.train_runs(run.init_runs(keys, CONFIG, settings), params_s, means_s,
                                   targets, data, num_steps=60, config=CONFIG, settings=settings,
                                   group=group)
  for i in range(2):
    for k, (lv, _) in enumerate(grid):
      alone, alone_metrics = run.train_alone_jit(
          run.init_run(keys[i, k], CONFIG, settings), params[i], means[i], jnp.float32(lv),
          data, num_steps=60, config=CONFIG, settings=settings)
      for got, want in ((states.log_alpha["heads"][i, k], alone.log_alpha["heads"]),
                        (states.log_alpha["mlp"][i, k], alone.log_alpha["mlp"]),
                        (states.lambdas[i, k], alone.lambdas)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
      for name in ("objective", "expected_sparsity", "sparsity"):
        np.testing.assert_allclose(metrics[name][:, i, k], alone_metrics[name], atol=1e-5,
                                   rtol=1e-5)
  assert float(jnp.max(jnp.abs(states.log_alpha["heads"][0, 0] - states.log_alpha["heads"][0, 1]
                               ))) > 1e-3  # the pruning seeds differ


def test_runs_per_group_divides_the_runs_of_a_seed():
  assert [run.runs_per_group(k, "cpu") for k in (1, 3, 8, 12, 32, 7, 11)] == [1, 3, 8, 6, 8, 7, 1]
  assert run.runs_per_group(32, "gpu") == 32
  with pytest.raises(ValueError, match="group of 2 runs does not divide the 3 runs"):
    run.train_runs_unjitted(None, None, None, jnp.zeros((1, 3)), {}, num_steps=1, config=CONFIG,
                            settings=run.Settings(num_steps=1, sparsity_warmup_steps=0), group=2)


def test_effective_size_on_a_hand_built_table():
  # 2 pruning seeds; full model in-domain 0.90, out-of-domain 0.60.
  in_domain = {0.3: [0.90, 0.89], 0.5: [0.88, 0.70], 0.7: [0.86, 0.60]}
  out_of_domain = {0.3: [0.58, 0.40], 0.5: [0.50, 0.59], 0.7: [0.20, 0.58]}
  got = core.effective_size(in_domain, out_of_domain, 0.90, 0.60)
  # in-domain: seed 0 -> 0.7 (0.86 < 0.87 fails, 0.88 ok at 0.5)... by hand:
  # seed 0: 0.7 has 0.86 < 0.87 -> 0.5 has 0.88 >= 0.87 -> sparsity 0.5 -> size 0.5
  # seed 1: 0.7 0.60, 0.5 0.70 fail, 0.3 0.89 ok -> size 0.7
  assert got["in_domain"]["per_seed"] == pytest.approx([0.5, 0.7])
  # out-of-domain (>= 0.57): seed 0: 0.3 (0.58) -> 0.7; seed 1: 0.7 (0.58) -> 0.3
  assert got["out_of_domain"]["per_seed"] == pytest.approx([0.7, 0.3])
  # mean of the two (>= 0.72): seed 0: 0.53, 0.69, 0.74 -> 0.3 -> 0.7; seed 1: 0.59, 0.645,
  # 0.645 -> none -> the full model, size 1.0
  assert got["mean"]["per_seed"] == pytest.approx([0.7, 1.0])
  # pruning seed 1's out-of-domain size 0.3 is at the highest level (0.7): an upper bound
  assert [got[v]["at_highest"] for v in ("in_domain", "out_of_domain", "mean")] == [0, 0.5, 0]
  assert got["in_domain"]["mean"] == pytest.approx(0.6)
  scipy_stats = pytest.importorskip("scipy.stats")
  half = scipy_stats.t.ppf(0.975, 1) * np.std([0.5, 0.7], ddof=1) / np.sqrt(2)
  assert got["in_domain"]["ci"] == pytest.approx(half, rel=1e-3)
  for n in (3, 7, 31):
    vals = np.arange(n) * 0.1
    assert core.mean_ci(vals)[1] == pytest.approx(
        scipy_stats.t.ppf(0.975, n - 1) * vals.std(ddof=1) / np.sqrt(n), rel=2e-3)
  with pytest.raises(ValueError, match="same levels"):
    core.effective_size({0.3: [1.0]}, {0.5: [1.0]}, 1.0, 1.0)


def test_core_frequencies_overlaps_forcing_and_ablation_masks():
  masks = np.array([[1, 1, 0, 1, 0, 1],
                    [1, 0, 0, 1, 1, 1],
                    [1, 1, 0, 1, 0, 0]], bool)  # 3 subnetworks over 4 heads + 2 MLPs
  np.testing.assert_array_equal(core.heuristic_core(masks), [1, 0, 0, 1, 0, 0])
  np.testing.assert_allclose(core.inclusion_frequency(masks), [1, 2 / 3, 0, 1, 1 / 3, 2 / 3])
  assert core.jaccard(masks[0], masks[1]) == pytest.approx(3 / 5)
  assert core.jaccard(masks[0], masks[0]) == 1.0
  assert core.jaccard(masks[0], masks[2]) == pytest.approx(3 / 4)
  assert core.jaccard(masks[1], masks[2]) == pytest.approx(2 / 5)
  assert core.mean_jaccard(masks) == pytest.approx((3 / 5 + 3 / 4 + 2 / 5) / 3)  # pairs i < j
  forced = core.force_units(masks[0], keep=[2], remove=[0])
  np.testing.assert_array_equal(forced, [0, 1, 1, 1, 0, 1])
  with pytest.raises(ValueError, match="both in and out"):
    core.force_units(masks[0], keep=[1], remove=[1])
  one_at_a_time = core.remove_one_at_a_time(masks[0], [0, 3])
  np.testing.assert_array_equal(one_at_a_time, [[0, 1, 0, 1, 0, 1], [1, 1, 0, 0, 0, 1]])
  heads, mlp = core.split_units(masks, 2, 2)
  np.testing.assert_array_equal(core.flat_units(heads, mlp), masks)
  assert core.unit_names(2, 2) == ["l0_h0", "l0_h1", "l1_h0", "l1_h1", "l0_mlp", "l1_mlp"]
  kernel = np.array([1, 0, 0, 1, 0, 1], bool)  # heads 0, 3 and the second MLP block
  ablate, draws = core.core_ablation_masks(kernel, 4, 5, units="all")
  np.testing.assert_array_equal(ablate, [0, 1, 1, 0, 1, 0])
  for d in draws:  # two non-core heads (of 1, 2) removed, core heads kept, core MLP removed
    np.testing.assert_array_equal(d, [1, 0, 0, 1, 1, 0])
  ablate, draws = core.core_ablation_masks(kernel, 4, 5)  # default: heads only, MLPs kept
  np.testing.assert_array_equal(ablate, [0, 1, 1, 0, 1, 1])
  for d in draws:
    np.testing.assert_array_equal(d, [1, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(core.without_core(kernel, 4), ablate)
  with pytest.raises(ValueError, match="core ablation units"):
    core.core_ablation_masks(kernel, 4, 5, units="mlps")
  with pytest.raises(ValueError, match="outside it"):
    core.core_ablation_masks(np.array([1, 1, 1, 0, 0, 0], bool), 4, 2)


def test_pruning_model_config_uses_plain_layers_for_auto():
  """Pruning runs Flax's plain layers unless a layer_impl was chosen explicitly."""
  from sg_jax.models.model_config import ModelConfig
  assert run.pruning_model_config(ModelConfig(vocab_size=10)).layer_impl == "plain"
  for impl in ("tuned", "plain"):
    assert run.pruning_model_config(ModelConfig(vocab_size=10, layer_impl=impl)).layer_impl == impl
