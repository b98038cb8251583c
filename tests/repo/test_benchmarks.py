"""The benchmarks' own bookkeeping: listing and counting the matmuls of a step (README,
Performance). The timings themselves are not tested (benchmarks print them)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))
import train_throughput  # noqa: E402  (imports JAX-free `common` helpers; JAX already started)


def _mlp_loss(w1_IxH, w2_HxO, x_NxI):
  return jnp.sum(jax.jit(lambda h: jax.nn.relu(h))(x_NxI @ w1_IxH) @ w2_HxO)


def test_dot_generals_lists_forward_and_backward_matmuls_with_their_flops():
  """Gradient of a 2-layer MLP in (w1, w2) only: 2 forward matmuls, 3 backward (dw2, dh, dw1;
  no input gradient), 2 N I O FLOPs per [N, I] x [I, O] product."""
  n, i, h, o = 6, 4, 5, 3
  args = (jnp.ones((i, h)), jnp.ones((h, o)), jnp.ones((n, i)))
  jaxpr = jax.make_jaxpr(jax.jit(jax.grad(_mlp_loss, argnums=(0, 1))))(*args).jaxpr
  dots = train_throughput._dot_generals(jaxpr)
  assert len(dots) == 5
  forward = 2 * n * i * h + 2 * n * h * o
  backward = 2 * n * h * o + 2 * n * h * o + 2 * n * i * h  # dw2 = h^T g, dh = g w2^T, dw1
  assert sum(train_throughput._dot_flops(*d) for d in dots) == forward + backward
  # Each listed dot runs on operands of its recorded shapes.
  for avals, params in dots:
    out = jax.lax.dot_general(*(jnp.zeros(a.shape, a.dtype) for a in avals),
                              params["dimension_numbers"])
    assert out.size > 0


def test_dot_flops_of_a_batched_contraction():
  """[B, M, K] x [B, K, N] batched over B: 2 B M K N."""
  b, m, k, n = 2, 3, 4, 5
  jaxpr = jax.make_jaxpr(lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y))(
      jnp.ones((b, m, k)), jnp.ones((b, k, n))).jaxpr
  (dot,) = train_throughput._dot_generals(jaxpr)
  assert train_throughput._dot_flops(*dot) == 2 * b * m * k * n


def test_dot_generals_refuses_a_matmul_inside_a_loop_but_not_a_loop_without_one():
  w = jnp.ones((3, 3))
  with_dot = jax.make_jaxpr(lambda w: jax.lax.scan(lambda c, _: (c @ w, None), w, None,
                                                   length=4)[0])(w).jaxpr
  with pytest.raises(ValueError, match="scan"):
    train_throughput._dot_generals(with_dot)
  no_dot = jax.make_jaxpr(lambda w: jax.lax.scan(lambda c, _: (c + 1.0, None), w, None,
                                                 length=4)[0] @ w)(w).jaxpr
  assert len(train_throughput._dot_generals(no_dot)) == 1
  np.testing.assert_equal(train_throughput._dot_flops(*train_throughput._dot_generals(no_dot)[0]),
                          2 * 27)


def test_decode_benchmark_extrapolation_and_arguments():
  import decode_throughput  # pylint: disable=import-outside-toplevel
  # 2,000 lines in batches of 250 from a run in batches of 30: the first batch (12 s) as timed,
  # then 2,000 - 30 lines at 0.5 s; 1,100 lines pad to 5 batches of 250.
  assert decode_throughput.extrapolated_split_s(12.0, 0.5, 30, 2000, 250) == 12.0 + 0.5 * 1970
  assert decode_throughput.extrapolated_split_s(12.0, 0.5, 30, 1100, 250) == 12.0 + 0.5 * 1220
  # fewer lines than a batch: one batch of exactly those lines
  assert decode_throughput.extrapolated_split_s(1.0, 0.1, 10, 40, 250) == 1.0 + 0.1 * 30
  args = decode_throughput.parse_args(["--seeds=1,10", "--old_lines=60", "--old_batch=30"])
  assert args.seeds == [1, 10] and args.depth == 8
  for bad in (["--old_lines=30", "--old_batch=30"], ["--old_lines=70", "--old_batch=30"]):
    with pytest.raises(SystemExit):
      decode_throughput.parse_args(bad)
  config = decode_throughput.tense_config(8, quick=False)  # configs/tense.py:depth=8
  assert (config.model.num_layers, config.model.d_model, config.model.num_heads) == (8, 512, 8)
  assert config.num_seeds == 10 and config.eval.max_lines == 2000 and config.eval.kv_cache


# ---------------------------------------------------------------------- analysis_throughput.py

import analysis_throughput  # noqa: E402  (benchmarks/ is on sys.path above)


class _FirstSplit:
  """Stands in for `random.Random`: always draws the first split of a span."""

  def randrange(self, lo, hi):
    del hi
    return lo


def test_original_projection_is_the_greedy_tree_with_random_split_scores():
  from sg_jax.analysis import tree_projection  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  assert analysis_throughput.original_projection(np.ones((1, 1)), _FirstSplit()) == ((), 0.0)
  for n in (2, 5, 8):
    chart = np.triu(rng.uniform(-1, 1, size=(n, n))).astype(np.float32)
    nodes, score = analysis_throughput.original_projection(chart, _FirstSplit())
    expect = tree_projection.project_tree(jnp.asarray(chart), n)
    assert list(nodes) == [tuple(x) for x in np.asarray(expect).tolist() if x[0] >= 0]
    # each node: its best split's score minus the score of the split drawn (here the first).
    want = sum(chart[i, k] + chart[k + 1, j] - chart[i, i] - chart[i + 1, j] for i, k, j in nodes)
    np.testing.assert_allclose(score, want, rtol=1e-6, atol=1e-6)


def test_trajectory_workdir_is_read_by_the_analysis(tmp_path):
  """A tiny workdir of the --trajectory kind: checkpoints of the whole train state at the given
  steps, with parameters that differ between steps, that `sg_jax.analyze` analyses."""
  from sg_jax.analysis import driver as analyze  # pylint: disable=import-outside-toplevel
  from sg_jax import checkpointing  # pylint: disable=import-outside-toplevel
  built = analysis_throughput.build_trajectory_workdir(
      str(tmp_path), num_checkpoints=2, every=500, num_train=400, min_transformed=50,
      overrides={"model.num_layers": 1, "model.d_model": 32, "model.num_heads": 2,
                 "model.d_ff": 64, "num_seeds": 2})
  assert built["steps"] == [0, 500] and checkpointing.all_steps(str(tmp_path)) == [0, 500]
  first, last = (checkpointing.restore(str(tmp_path), s) for s in (0, 500))
  assert set(first.state) >= {"params", "opt_state", "step"} and first.seeds == [0, 1]
  assert np.asarray(last.state["step"]).tolist() == [500, 500]
  embed = lambda r: np.asarray(r.state["params"]["embedding"]["embedding"])
  assert not np.allclose(embed(first), embed(last))
  out = analyze.analyze(str(tmp_path), groups=("weight_norm", "tscore"), num_sentences=20)
  # per step and seed: weight_norm 2 rows; tscore 4 (tscore and its random-tree, right- and
  # left-branching baselines)
  assert out == {"rows_written": 2 * 2 * (2 + 4), "checkpoints_analysed": 2}
  with pytest.raises(ValueError, match="transformed lines"):
    analysis_throughput.build_trajectory_workdir(str(tmp_path / "small"), num_train=20,
                                                 num_checkpoints=1)


def test_profile_breakdown_reads_cumulative_times(tmp_path):
  import cProfile  # pylint: disable=import-outside-toplevel
  from sg_jax.analysis import pipeline  # pylint: disable=import-outside-toplevel
  path = str(tmp_path / "p.prof")
  cProfile.runctx("pipeline.make_start_pass_batches([[3, 4, 5]] * 50, sos_id=9, batch_size=4)",
                  globals(), {"pipeline": pipeline}, path)
  parts = analysis_throughput.profile_breakdown(path)
  assert parts["  of which packing the passes"] > 0
  assert parts["tscore + tparseval"] == 0 and parts["analyze"] == 0


# ------------------------------------------------------------------- layer sets and memory.py


def test_layer_impl_and_matmul_precision_options_reach_the_config():
  """`--layer_impl` (tuned, plain, a comma list, both; default auto's pick: tuned on CPU) and
  `--matmul_precision` set `model.layer_impl` / `model.matmul_precision` of every timed config."""
  import common  # pylint: disable=import-outside-toplevel
  args = train_throughput.parse_args(["--depths=6", "--seeds=1,4"])
  auto = "tuned" if jax.default_backend() == "cpu" else "plain"
  assert args.layer_impls == [auto] and args.matmul_precision == "default"
  args = train_throughput.parse_args(["--layer_impl=both", "--matmul_precision=highest"])
  assert args.layer_impls == ["tuned", "plain"]
  config = common.make_config(6, 4, args, True, "plain")
  assert (config.model.layer_impl, config.model.matmul_precision) == ("plain", "highest")
  assert common.make_config(6, 4, args, True).model.layer_impl == "tuned"  # the first one
  assert train_throughput.parse_args(["--layer_impl=tuned,auto"]).layer_impls == list(
      dict.fromkeys(["tuned", auto]))
  for bad in (["--layer_impl=fast"], ["--matmul_precision=max"]):
    with pytest.raises(SystemExit):
      train_throughput.parse_args(bad)


def test_memory_fit_and_seeds_per_accelerator_on_hand_built_sizes():
  import memory  # pylint: disable=import-outside-toplevel
  # 300 MB + 600 MB per seed: 16 GB holds (16000 - 300) // 600 = 26 seeds, 75% of it 19.
  const, slope = memory.fit([1, 2, 4, 8], [300e6 + 600e6 * n for n in (1, 2, 4, 8)])
  np.testing.assert_allclose((const, slope), (300e6, 600e6), rtol=1e-9)
  assert [memory.seeds_that_fit(g * memory.GB, const, slope) for g in memory.CAPACITIES_GB] == [
      26, 66, 132, 234]
  assert memory.seeds_that_fit(0.75 * 16 * memory.GB, const, slope) == 19
  assert memory.seeds_that_fit(0.2e9, const, slope) == 0  # not even the constant fits
  assert memory.fit([2], [1e9]) == (0.0, 5e8)  # one seed count: proportional
  args = memory.parse_args(["--layer_impl=both", "--depths=2,6,10"])
  assert args.layer_impls == ["tuned", "plain"] and args.depths == [2, 6, 10]


@pytest.mark.slow
def test_quick_mode_runs_end_to_end_with_its_sequential_baseline():
  """`train_throughput.py --quick` (shrunk further: 1 seed, 1 timed call, 1 sequential step)
  runs both layouts through the vmapped and the sequential paths and returns a positive rate for
  each. The packed sequential baseline once failed on the loss's extra return value (issue 53
  item 10), so both layouts are exercised."""
  results = train_throughput.main([
      "--quick", "--seeds=1", "--packing=both", "--min_time=0", "--min_calls=1",
      "--seq_steps=1", "--num_train=200", "--peak_size=32"])
  assert {key[2] for key in results} == {False, True}  # padded and packed
  for key, row in results.items():
    assert row["rate"] > 0 and row["seq"] > 0, (key, row)
