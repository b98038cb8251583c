"""The benchmarks' own bookkeeping: listing and counting the matmuls of a step (README,
Performance). The timings themselves are not tested (benchmarks print them)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
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
