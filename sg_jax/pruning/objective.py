"""The pruning objective: what the gates minimise (Bhaskar et al., ACL 2024; docs/pruning.md).

    loss = objective(z) + l1 (t - s) + l2 (t - s)^2

`objective` is the KL from the frozen full model to the pruned one on the real target positions
of training lines (`kl`, the original's), the LM loss on a chosen split (`task:SPLIT`) or the
training loss minus the generalisation loss (`train_minus_gen`); s is the sparsity of the sampled
gates (the original's) or the expected sparsity from the closed form; t is the current target;
the multipliers l1, l2 are maximised (gradient ascent), the gates' log_alpha minimised.
All functions are for ONE run (vmapped by `run.py`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import models
from sg_jax import objectives
from sg_jax.models import interventions
from sg_jax.models.model_config import ModelConfig
from sg_jax.pruning import hard_concrete

Array = jax.Array

OBJECTIVES = ("kl", "task:SPLIT", "train_minus_gen")
GEN_SPLIT = "gen"  # the generalisation split `train_minus_gen` subtracts


@dataclasses.dataclass(frozen=True)
class PruningObjective:
  """A parsed `--objective`.

  Attributes:
    kind: 'kl', 'task' or 'train_minus_gen'.
    split: the split whose lines the objective reads besides training lines ('task': the
      split it is computed on; 'train_minus_gen': `GEN_SPLIT`; 'kl': None).
  """

  kind: str
  split: str | None = None

  def __str__(self):
    return {"kl": "kl", "task": f"task:{self.split}",
            "train_minus_gen": "train_minus_gen"}[self.kind]


def parse_objective(text: str) -> PruningObjective:
  """'kl' | 'task:SPLIT' | 'train_minus_gen' -> PruningObjective.

  Raises:
    ValueError: any other text, or 'task:' without a split.
  """
  text = text.strip()
  if text == "kl":
    return PruningObjective("kl")
  if text == "train_minus_gen":
    return PruningObjective("train_minus_gen", GEN_SPLIT)
  if text.startswith("task:") and text[len("task:"):].strip():
    return PruningObjective("task", text[len("task:"):].strip())
  raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)} (e.g. task:gen), got "
                   f"{text!r}")


def unit_rows(config: ModelConfig) -> tuple[list[str], list[str]]:
  """(head-mask row names [R_h], MLP-mask row names [R_m]) of the model of `config`
  (`interventions.unit_rows`): `l<i>` for the decoder-only LM; `enc_l<i>`, `dec_l<i>`,
  `cross_l<i>` (heads) and `enc_l<i>`, `dec_l<i>` (MLP blocks) for the encoder-decoder.

  Raises:
    ValueError: an unregistered model, or one whose family takes no interventions.
  """
  return interventions.unit_rows(models.family(config.name), config.num_layers)


def unit_shapes(config: ModelConfig) -> tuple[tuple[int, int], tuple[int]]:
  """((R_h, num_heads), (R_m,)): the shapes of one run's head and MLP gates (`unit_rows`)."""
  heads, mlp = unit_rows(config)
  return (len(heads), config.num_heads), (len(mlp),)


def unit_param_counts(config: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
  """Parameters each gated unit owns: float32 ([R_h, num_heads], [R_m]) (`unit_shapes`).

  A head (self- or cross-attention): its query, key and value columns and its rows of the merge
  projection, 4 d_model head_dim (the projections are bias-free). An MLP block: both layers
  with biases, 2 d_model d_ff + d_ff + d_model.
  """
  head = 4 * config.d_model * config.head_dim
  mlp = 2 * config.d_model * config.d_ff + config.d_ff + config.d_model
  head_shape, mlp_shape = unit_shapes(config)
  return np.full(head_shape, head, np.float32), np.full(mlp_shape, mlp, np.float32)


def sparsity(z_heads: Array, z_mlp: Array, weights: tuple[Array, Array] | None = None) -> Array:
  """Fraction of the gated units that are off, 1 - (weighted) mean z (float32 scalar).

  Args:
    z_heads: gates [R_h, num_heads]; z_mlp: [R_m] (soft values allowed; `unit_shapes`).
    weights: optional per-unit weights of the same shapes (parameter counts).
  """
  if weights is None:
    w_heads, w_mlp = jnp.ones_like(z_heads), jnp.ones_like(z_mlp)
  else:
    w_heads, w_mlp = weights
  kept = jnp.sum(z_heads * w_heads) + jnp.sum(z_mlp * w_mlp)
  return 1.0 - kept / (jnp.sum(w_heads) + jnp.sum(w_mlp))


def expected_sparsity(log_alpha_heads: Array, log_alpha_mlp: Array,
                      weights: tuple[Array, Array] | None = None) -> Array:
  """1 - expected L0 / units: the (weighted) mean of P(z = 0) (float32 scalar)."""
  return sparsity(1.0 - hard_concrete.prob_closed(log_alpha_heads),
                  1.0 - hard_concrete.prob_closed(log_alpha_mlp), weights)


def kl_divergence(full_logits_BxLxV: Array, pruned_logits_BxLxV: Array, targets_BxL: Array
                  ) -> Array:
  """Mean over real target positions (targets != 0) of KL(p_full || p_pruned) in nats.

  Returns:
    float32 scalar (0 when there is no real position).
  """
  log_p = jax.nn.log_softmax(full_logits_BxLxV.astype(jnp.float32), axis=-1)
  log_q = jax.nn.log_softmax(pruned_logits_BxLxV.astype(jnp.float32), axis=-1)
  kl_BxL = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
  real = (targets_BxL != 0).astype(jnp.float32)
  return jnp.sum(kl_BxL * real) / jnp.maximum(jnp.sum(real), 1.0)


def lm_loss(logits_BxLxV: Array, targets_BxL: Array) -> Array:
  """Mean token cross-entropy (nats) over the real target positions (`objectives.token_losses`)."""
  loss_sum, count = objectives.token_losses(logits_BxLxV, targets_BxL)
  return jnp.sum(loss_sum) / jnp.maximum(jnp.sum(count), 1.0)


def lagrangian(target: Array, current: Array, lambdas: Array) -> Array:
  """l1 (t - s) + l2 (t - s)^2 with lambdas = [l1, l2] (float32 scalar)."""
  gap = target - current
  return lambdas[0] * gap + lambdas[1] * gap ** 2


def target_sparsity(step: Array, target: Array, warmup_steps: int, warmup_type: str = "linear"
                    ) -> Array:
  """The target t at `step`: rises from 0 to `target` over `warmup_steps`, then stays.

  'linear': t = target min(1, step / warmup); 'log' (the original's `logarithmic`
  `warmup_type`): log(1 - t) rises linearly from 0 to log(1 - target), i.e.
  t = 1 - (1 - target)^min(1, step / warmup), which rises slower than linear at first.

  Raises:
    ValueError: an unknown warmup_type.
  """
  step = jnp.asarray(step, jnp.float32)
  target = jnp.asarray(target, jnp.float32)
  frac = jnp.clip(step / max(warmup_steps, 1), 0.0, 1.0) if warmup_steps > 0 else 1.0
  if warmup_type == "linear":
    return target * frac
  if warmup_type == "log":
    return 1.0 - jnp.power(1.0 - target, frac)
  raise ValueError(f"warmup_type must be 'linear' or 'log', got {warmup_type!r}")
