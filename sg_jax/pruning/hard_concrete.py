"""Hard-concrete gates (Louizos, Welling & Kingma, ICLR 2018, "Learning sparse neural networks
through L0 regularization", §4), as the heuristic-core pruning uses them (Bhaskar, Friedman &
Chen, ACL 2024; docs/REFERENCE.md §2, docs/pruning.md).

A gate z in [0, 1] is a stretched, clipped binary-concrete sample:

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log_alpha) / T),
    z = clip(s * (r - l) + l, 0, 1)

with temperature T = 2/3 and stretch interval (l, r) = (-0.1, 1.1), so z is exactly 0 or 1 with
positive probability. Everything here is elementwise over `log_alpha` of any shape (one gate per
attention head [R_h, num_heads], one per MLP block [R_m], leading run axes allowed; R_h = R_m =
num_layers for the LM, 3 and 2 num_layers for the encoder-decoder: `objective.unit_shapes`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

TEMPERATURE = 2.0 / 3.0      # the original's `temperature` (Louizos et al. use 2/3 too)
LIMIT_LOW, LIMIT_HIGH = -0.1, 1.1  # the stretch interval (l, r)
INIT_MEAN, INIT_STD = 10.0, 0.01   # log_alpha ~ N(10, 0.01): every gate starts open
DETERMINISTIC_FACTOR = 0.8   # the original's `sigmoid(log_alpha / T * 0.8)` ranking score
_EPS = 1e-6                  # u is drawn from [eps, 1 - eps] (the original's `epsilon`)


def init_log_alpha(key: Array, shape: tuple[int, ...]) -> Array:
  """log_alpha drawn from N(INIT_MEAN, INIT_STD) (float32 of `shape`)."""
  return INIT_MEAN + INIT_STD * jax.random.normal(key, shape, jnp.float32)


def sample(key: Array, log_alpha: Array, temperature: float = TEMPERATURE) -> Array:
  """One hard-concrete sample per gate (float32 in [0, 1], `log_alpha`'s shape).

  Differentiable in `log_alpha` (reparameterised through u), except where clipped.
  """
  u = jax.random.uniform(key, log_alpha.shape, jnp.float32, _EPS, 1.0 - _EPS)
  s = jax.nn.sigmoid((jnp.log(u) - jnp.log1p(-u) + log_alpha) / temperature)
  return jnp.clip(s * (LIMIT_HIGH - LIMIT_LOW) + LIMIT_LOW, 0.0, 1.0)


def prob_closed(log_alpha: Array, temperature: float = TEMPERATURE) -> Array:
  """P(z = 0) = sigmoid(T log(-l / r) - log_alpha), i.e. sigmoid(T log(0.1 / 1.1) - log_alpha)
  (the original's `cdf_qz(0)`), per gate."""
  return jax.nn.sigmoid(temperature * math.log(-LIMIT_LOW / LIMIT_HIGH) - log_alpha)


def prob_open(log_alpha: Array, temperature: float = TEMPERATURE) -> Array:
  """P(z = 1) = sigmoid(log_alpha - T log((1 - l) / (r - 1))), per gate (the mass clipped at 1)."""
  return jax.nn.sigmoid(log_alpha - temperature * math.log((1.0 - LIMIT_LOW)
                                                           / (LIMIT_HIGH - 1.0)))


def _scores(log_alpha: np.ndarray, temperature: float) -> np.ndarray:
  return 1.0 / (1.0 + np.exp(-np.asarray(log_alpha, np.float64) / temperature
                             * DETERMINISTIC_FACTOR))


def deterministic_mask(log_alpha, threshold: bool = False, temperature: float = TEMPERATURE
                       ) -> np.ndarray:
  """The original's final subnetwork of ONE gate group, binarised (bool [U], True = kept).

  In the group (one attention block's heads, or one MLP block) close round(sum of P(z = 0))
  units, those with the lowest `sigmoid(log_alpha / T * 0.8)` (ties: the lower index first);
  the rest stay open. The original keeps the rest at that soft value and thresholds it at 0.5
  when it evaluates: `threshold=True` does that too, which also closes every other unit with
  log_alpha <= 0.

  Args:
    log_alpha: float [U], the group's gates.
    threshold: also close the units whose soft value is <= 0.5.

  Returns:
    bool [U].
  """
  log_alpha = np.asarray(log_alpha, np.float64).reshape(-1)
  p_closed = 1.0 / (1.0 + np.exp(-(temperature * math.log(-LIMIT_LOW / LIMIT_HIGH) - log_alpha)))
  num_closed = int(np.round(p_closed.sum()))
  soft = _scores(log_alpha, temperature)
  keep = soft > 0.5 if threshold else np.ones(log_alpha.shape, bool)
  if num_closed > 0:
    keep[np.argsort(soft, kind="stable")[:num_closed]] = False
  return keep


def deterministic_masks(log_alpha_heads, log_alpha_mlp, threshold: bool = False,
                        temperature: float = TEMPERATURE) -> tuple[np.ndarray, np.ndarray]:
  """`deterministic_mask` per group: each row's heads (an attention block), each MLP block.

  Args:
    log_alpha_heads: [..., R_h, num_heads] (a group per row); log_alpha_mlp: [..., R_m] (leading
      run axes allowed).
    threshold: as `deterministic_mask`.

  Returns:
    (bool [..., R_h, num_heads], bool [..., R_m]).
  """
  heads = np.asarray(log_alpha_heads)
  mlp = np.asarray(log_alpha_mlp)
  head_keep = np.stack([deterministic_mask(row, threshold, temperature)
                        for row in heads.reshape(-1, heads.shape[-1])]).reshape(heads.shape)
  mlp_keep = np.array([deterministic_mask([a], threshold, temperature)[0]
                       for a in mlp.reshape(-1)], bool).reshape(mlp.shape)
  return head_keep, mlp_keep


def global_masks(log_alpha_heads, log_alpha_mlp, target: float
                 ) -> tuple[np.ndarray, np.ndarray]:
  """The global variant for ONE run: close exactly round(target x units) units, those with the
  lowest log_alpha over all heads and MLP blocks (ties: heads first, in layer order).

  Args:
    log_alpha_heads: [R_h, num_heads]; log_alpha_mlp: [R_m]; target in [0, 1].

  Returns:
    (bool [R_h, num_heads], bool [R_m]), True = kept.
  """
  heads = np.asarray(log_alpha_heads, np.float64)
  mlp = np.asarray(log_alpha_mlp, np.float64)
  flat = np.concatenate([heads.reshape(-1), mlp.reshape(-1)])
  keep = np.ones(flat.shape, bool)
  keep[np.argsort(flat, kind="stable")[:int(np.round(target * flat.size))]] = False
  return keep[:heads.size].reshape(heads.shape), keep[heads.size:].reshape(mlp.shape)
