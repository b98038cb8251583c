"""Task metrics and KL of subnetworks (binarised gates), vmapped over training seeds x runs.

The metrics are the task's own (`evaluation.make_split_evaluator`: accuracy, loss and, for
question formation, the move-first / skip-relative agreements) with the model's head and MLP
masks applied, so a subnetwork is scored exactly as training scores the full model, under the
run's objective: its loss, and for a masked LM its masked-token accuracy instead of the
teacher-forced task metric (`Objective.teacher_forced_metrics`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.evaluation import scoring as evaluation
from sg_jax.models.model_config import ModelConfig
from sg_jax.pruning import objective as objective_lib
from sg_jax.pruning.run import apply_masked, full_logits

Array = jax.Array


def make_evaluator(task, config: ModelConfig, vocab, eval_data: dict, ablation: str = "mean",
                   objective=None):
  """`evaluate(params_S, means_S, head_mask_SxK, mlp_mask_SxK) -> {split: {metric: [S, K]}}`.

  Args:
    task: the `tasks.Task` (or its registered name).
    config: the model config.
    vocab: the task's vocabulary.
    eval_data: {split name: batches [num_batches, batch, ...]} (`prepare_eval_batches`).
    ablation: 'mean' (units replaced by their means) or 'zero'.
    objective: the run's `objectives.Objective` (None: `lm`), as training's evaluation takes it.

  The returned function takes parameters [S, ...], means ([S, R_h, H, P], [S, R_m, D]) and
  masks float [S, K, R_h, H] / [S, K, R_m] (`objective.unit_shapes`; 1 kept, 0 ablated; all
  ones = the full model); the metrics are those of `evaluation.make_evaluate_fn` (float32
  [S, K]).
  """
  def apply_fn(p, tokens):
    params, means, head_mask, mlp_mask = p
    return apply_masked(config, params, tokens, head_mask, mlp_mask,
                        means if ablation == "mean" else None)

  splits = {name: (evaluation.make_split_evaluator(
      task, apply_fn, vocab, decode_steps=evaluation.decode_steps(task, batches),
      objective=objective), batches) for name, batches in eval_data.items()}

  @jax.jit
  def evaluate(params_S, means_S, head_mask_SxK, mlp_mask_SxK):
    def one(params, means, head_mask, mlp_mask):
      out = {}
      for name, (split, batches) in splits.items():
        p = (params, means, head_mask, mlp_mask)
        out[name] = split.summarize(jax.lax.map(lambda b: split.batch_sums(p, b), batches))
      return out

    per_seed = lambda params, means, hm, mm: jax.vmap(
        functools.partial(one, params, means))(hm, mm)
    return jax.vmap(per_seed)(params_S, means_S, head_mask_SxK, mlp_mask_SxK)

  return evaluate


@functools.partial(jax.jit, static_argnames=("config", "ablation"))
def subnetwork_kl(params_S, means_S, head_mask_SxK: Array, mlp_mask_SxK: Array, data: dict, *,
                  config: ModelConfig, ablation: str = "mean") -> Array:
  """KL(full || subnetwork) over the real target positions of every batch of `data`
  ({'inputs', 'targets': int32 [num_batches, B, L]}: the objective's lines,
  `inputs.objective_lines`, so its loss positions only), float32 [S, K] (nats per position)."""

  def one(params, means, head_mask, mlp_mask):
    def sums(batch):
      full = full_logits(config, params, batch["inputs"])
      pruned = apply_masked(config, params, batch["inputs"], head_mask, mlp_mask,
                            means if ablation == "mean" else None)
      real = jnp.sum(batch["targets"] != 0).astype(jnp.float32)
      return objective_lib.kl_divergence(full, pruned, batch["targets"]) * real, real

    kl, count = jax.lax.map(sums, {"inputs": data["inputs"], "targets": data["targets"]})
    return jnp.sum(kl) / jnp.maximum(jnp.sum(count), 1.0)

  per_seed = lambda params, means, hm, mm: jax.vmap(functools.partial(one, params, means))(hm, mm)
  return jax.vmap(per_seed)(params_S, means_S, head_mask_SxK, mlp_mask_SxK)


def to_rows(results: dict) -> dict[str, np.ndarray]:
  """{split: {metric: [S, K]}} -> {'split/metric': float64 [S, K]} (metrics.csv's names)."""
  return {f"{split}/{name}": np.asarray(v, np.float64)
          for split, metrics in results.items() for name, v in sorted(metrics.items())}
