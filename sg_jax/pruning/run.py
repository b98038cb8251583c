"""Pruning runs: the hard-concrete gates of ONE (training seed, sparsity, pruning seed) trained
against a frozen model, as a pure function, and every run of a checkpoint in one compiled program.

`run_step` is one optimisation step of one run. `train_alone` scans it over steps for one run;
`train_runs` scans, per step, a loop over training seeds (`lax.map`) of a vmap over that
seed's runs (sparsity levels x pruning seeds; on a CPU in groups of at most 8), so the frozen
model's forward pass on the batch is computed once per training seed and shared by its runs.
Both give the same numbers (tests). Optimisers (docs/pruning.md): AdamW on log_alpha (lr 0.1),
Adam ascent on the multipliers (lr 1.0), each with `lr_warmup_steps` linear warm-up then a
linear decay to 0 at `num_steps`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sg_jax import models
from sg_jax.models.model_config import ModelConfig
from sg_jax.pruning import hard_concrete
from sg_jax.pruning import objective as objective_lib

Array = jax.Array

# The original's schedule (Bhaskar et al.'s public code, docs/pruning.md), for a target of s %:
# sparsity warm-up 6,500 + 50 s steps, then 6 s steps at the target. sg_jax's models are small
# and its lines short, and a CPU is slow, so it takes a twentieth of each by default (STEP_SCALE;
# measured in docs/pruning.md).
ORIGINAL_WARMUP_BASE, ORIGINAL_WARMUP_PER_PERCENT, ORIGINAL_AFTER_PER_PERCENT = 6500, 50, 6
STEP_SCALE = 0.05


MIN_STEPS_AT_TARGET = 150  # sg_jax's floor on the steps at the target (see default_steps)


def default_steps(max_sparsity: float, scale: float = STEP_SCALE) -> tuple[int, int]:
  """(sparsity warm-up steps, total steps) for the highest target of a program.

  warm-up = scale (6500 + 50 s), total = warm-up + max(scale 6 s, MIN_STEPS_AT_TARGET),
  s = 100 max_sparsity (percent). The floor is sg_jax's: the 200 learning-rate warm-up steps
  are a large part of a scaled-down run, the gates lag the rising target meanwhile, and they
  need ~150 steps at the target to settle on it (docs/pruning.md). Every run of one program
  shares the schedule, so the highest level sets it.
  """
  s = 100.0 * max_sparsity
  warmup = int(round(scale * (ORIGINAL_WARMUP_BASE + ORIGINAL_WARMUP_PER_PERCENT * s)))
  after = max(int(round(scale * ORIGINAL_AFTER_PER_PERCENT * s)), MIN_STEPS_AT_TARGET)
  return warmup, warmup + after


@dataclasses.dataclass(frozen=True)
class Settings:
  """How a pruning run trains (static: hashable; docs/pruning.md lists the sources).

  Attributes:
    num_steps: optimisation steps in all.
    sparsity_warmup_steps: steps over which the target rises from 0 to its level.
    warmup_type: 'linear' or 'log' (`objective.target_sparsity`).
    learning_rate: AdamW learning rate of log_alpha (0.1).
    lambda_learning_rate: learning rate of the multipliers' gradient ascent (1.0).
    lr_warmup_steps: linear learning-rate warm-up of both (200), then linear decay to 0.
    weight_decay: AdamW weight decay of log_alpha (0.01, torch's AdamW default, which the
      original uses).
    sparsity_from: 'expected' (the closed form, sg_jax's default) or 'sampled' (the sampled
      gates, the original's). At log_alpha ~ 10 a sampled gate is clipped at 1 (zero gradient)
      with probability 1 - 2e-4, so in a tenth of the original's steps it hardly moves
      (docs/pruning.md).
    weight_by_params: weight each unit by its parameter count in the sparsity.
    objective: 'kl', 'task' or 'train_minus_gen' (`objective.PruningObjective.kind`).
    ablation: 'mean' or 'zero'.
  """

  num_steps: int
  sparsity_warmup_steps: int
  warmup_type: str = "linear"
  learning_rate: float = 0.1
  lambda_learning_rate: float = 1.0
  lr_warmup_steps: int = 200
  weight_decay: float = 0.01
  sparsity_from: str = "expected"
  weight_by_params: bool = False
  objective: str = "kl"
  ablation: str = "mean"

  def __post_init__(self):
    rules = ((self.num_steps >= 1, "num_steps must be >= 1"),
             (0 <= self.sparsity_warmup_steps, "sparsity_warmup_steps must be >= 0"),
             (self.warmup_type in ("linear", "log"), "warmup_type must be linear or log"),
             (self.sparsity_from in ("sampled", "expected"),
              "sparsity_from must be sampled or expected"),
             (self.objective in ("kl", "task", "train_minus_gen"),
              "objective must be kl, task or train_minus_gen"),
             (self.ablation in ("mean", "zero"), "ablation must be mean or zero"))
    for ok, message in rules:
      if not ok:
        raise ValueError(f"pruning settings: {message} (got {self})")


class RunState(NamedTuple):
  """One run's state (leading run axes when vmapped).

  log_alpha: {'heads': [R_h, num_heads], 'mlp': [R_m]} (`objective.unit_shapes`: R_h = R_m =
  num_layers for the LM, 3 and 2 num_layers for the encoder-decoder); lambdas: [2] = (l1, l2);
  alpha_opt, lambda_opt: the optimiser states; key: uint32 [2] key data; step: int32 [].
  """

  log_alpha: dict
  lambdas: Array
  alpha_opt: Any
  lambda_opt: Any
  key: Array
  step: Array


def _schedule(lr: float, settings: Settings) -> optax.Schedule:
  warm = min(settings.lr_warmup_steps, settings.num_steps)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, max(warm, 1)),
       optax.linear_schedule(lr, 0.0, max(settings.num_steps - warm, 1))], [warm])


def optimizers(settings: Settings) -> tuple[optax.GradientTransformation,
                                            optax.GradientTransformation]:
  """(AdamW of log_alpha, Adam of the multipliers), both with the warm-up + linear decay."""
  return (optax.adamw(_schedule(settings.learning_rate, settings),
                      weight_decay=settings.weight_decay),
          optax.adam(_schedule(settings.lambda_learning_rate, settings)))


def pruning_model_config(config: ModelConfig) -> ModelConfig:
  """The model config pruning runs with: `layer_impl` "auto" becomes "plain" (Flax's layers).

  The tuned CPU layers (`layers.py`: matmul and LayerNorm with hand-written VJPs) are built for
  training's seed vmap, whose weights are batched. Pruning vmaps runs that share one seed's
  frozen weights, and differentiates through the activations only; there the tuned layers'
  custom VJPs under vmap cost 1.4-2.7x the plain layers' time for the same FLOPs on CPU
  (benchmarks/prune_throughput.py, docs/pruning.md), while one run alone takes the same time
  with either. Both give the same values (tests/models/test_layer_impl.py); an explicit "tuned" or
  "plain" is kept.

  Raises:
    ValueError: a model whose family takes no head/MLP gates (`objective.unit_rows`; the
      decoder-only LM and the encoder-decoder of `objective=seq2seq` take them).
  """
  objective_lib.unit_rows(config)
  if config.layer_impl != "auto":
    return config
  return dataclasses.replace(config, layer_impl="plain")


def init_run(key_data: Array, config: ModelConfig, settings: Settings) -> RunState:
  """A run's initial state from its key data (uint32 [2]): log_alpha ~ N(10, 0.01), l1 = l2 = 0."""
  key = jax.random.wrap_key_data(key_data)
  k_heads, k_mlp = jax.random.split(jax.random.fold_in(key, 0))
  head_shape, mlp_shape = objective_lib.unit_shapes(config)
  log_alpha = {"heads": hard_concrete.init_log_alpha(k_heads, head_shape),
               "mlp": hard_concrete.init_log_alpha(k_mlp, mlp_shape)}
  lambdas = jnp.zeros((2,), jnp.float32)
  tx_alpha, tx_lambda = optimizers(settings)
  return RunState(log_alpha, lambdas, tx_alpha.init(log_alpha), tx_lambda.init(lambdas),
                  key_data, jnp.zeros((), jnp.int32))


def apply_masked(config: ModelConfig, params, tokens_BxL: Array, head_mask: Array,
                 mlp_mask: Array, means: tuple[Array, Array] | None) -> Array:
  """Logits [B, L, V] of one seed of the model of `config` (`models.build`) with gates
  (head_mask [R_h, H], mlp_mask [R_m]: `objective.unit_shapes`), deterministic; means None =
  zero ablation."""
  head_means, mlp_means = (None, None) if means is None else means
  return models.build(config).apply({"params": params}, tokens_BxL, deterministic=True,
                                     head_mask=head_mask, head_means=head_means,
                                     mlp_mask=mlp_mask, mlp_means=mlp_means)


def full_logits(config: ModelConfig, params, tokens_BxL: Array) -> Array:
  """The frozen full model's logits [B, L, V] (no dropout, no gradient)."""
  logits = models.build(config).apply({"params": params}, tokens_BxL, deterministic=True)
  return jax.lax.stop_gradient(logits)


def run_step(state: RunState, params, means: tuple[Array, Array], target: Array, batch: dict,
             full_logits_BxLxV: Array | None, *, config: ModelConfig, settings: Settings
             ) -> tuple[RunState, dict]:
  """One step of ONE run.

  Args:
    state: the run's state.
    params: its training seed's (frozen) parameters.
    means: (head_means [R_h, num_heads, head_dim], mlp_means [R_m, d_model]).
    target: float32 [] the run's sparsity level.
    batch: {'inputs', 'targets': int32 [B, L]} training lines, and for the 'task' and
      'train_minus_gen' objectives 'split_inputs', 'split_targets' [B', L'].
    full_logits_BxLxV: the frozen model's logits on batch['inputs'] ('kl'; else None).
    config, settings: static.

  Returns:
    (new state, {'objective', 'sparsity', 'expected_sparsity', 'target', 'lambda1',
    'lambda2'}: float32 [] of this step, before the update).
  """
  key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step + 1)
  k_heads, k_mlp = jax.random.split(key)
  weights = (tuple(map(jnp.asarray, objective_lib.unit_param_counts(config)))
             if settings.weight_by_params else None)
  t = objective_lib.target_sparsity(state.step, target, settings.sparsity_warmup_steps,
                                    settings.warmup_type)
  ablate_means = means if settings.ablation == "mean" else None

  def loss_fn(log_alpha, lambdas):
    z_heads = hard_concrete.sample(k_heads, log_alpha["heads"])
    z_mlp = hard_concrete.sample(k_mlp, log_alpha["mlp"])
    pruned = lambda tokens: apply_masked(config, params, tokens, z_heads, z_mlp, ablate_means)
    if settings.objective == "kl":
      value = objective_lib.kl_divergence(full_logits_BxLxV, pruned(batch["inputs"]),
                                          batch["targets"])
    elif settings.objective == "task":
      value = objective_lib.lm_loss(pruned(batch["split_inputs"]), batch["split_targets"])
    else:
      value = (objective_lib.lm_loss(pruned(batch["inputs"]), batch["targets"])
               - objective_lib.lm_loss(pruned(batch["split_inputs"]), batch["split_targets"]))
    expected = objective_lib.expected_sparsity(log_alpha["heads"], log_alpha["mlp"], weights)
    sampled = objective_lib.sparsity(z_heads, z_mlp, weights)
    s = sampled if settings.sparsity_from == "sampled" else expected
    loss = value + objective_lib.lagrangian(t, s, lambdas)
    return loss, {"objective": value, "sparsity": sampled, "expected_sparsity": expected}

  (_, aux), (g_alpha, g_lambda) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
      state.log_alpha, state.lambdas)
  tx_alpha, tx_lambda = optimizers(settings)
  updates, alpha_opt = tx_alpha.update(g_alpha, state.alpha_opt, state.log_alpha)
  log_alpha = optax.apply_updates(state.log_alpha, updates)
  # Gradient ascent on the multipliers: descend on the negated gradient.
  updates, lambda_opt = tx_lambda.update(jax.tree_util.tree_map(jnp.negative, g_lambda),
                                         state.lambda_opt, state.lambdas)
  lambdas = optax.apply_updates(state.lambdas, updates)
  metrics = {**aux, "target": t, "lambda1": state.lambdas[0], "lambda2": state.lambdas[1]}
  return RunState(log_alpha, lambdas, alpha_opt, lambda_opt, state.key, state.step + 1), metrics


def _batch_at(data: dict, step: Array) -> dict:
  """The batch of `step`: batch step % num_batches of each [num_batches, B, L] array."""
  return {k: v[step % v.shape[0]] for k, v in data.items()}


def train_alone(state: RunState, params, means, target: Array, data: dict, num_steps: int, *,
                config: ModelConfig, settings: Settings) -> tuple[RunState, dict]:
  """`num_steps` steps of ONE run (lax.scan), the frozen model's logits computed per step.

  Args:
    data: {'inputs', 'targets' (, 'split_inputs', 'split_targets')}: int32
      [num_batches, B, L]; step n reads batch n % num_batches.

  Returns:
    (state, metrics of every step: float32 [num_steps] each).
  """

  def body(state, _):
    batch = _batch_at(data, state.step)
    full = (full_logits(config, params, batch["inputs"]) if settings.objective == "kl"
            else None)
    return run_step(state, params, means, target, batch, full, config=config,
                    settings=settings)

  return jax.lax.scan(body, state, None, length=num_steps)


@functools.partial(jax.jit, static_argnames=("num_steps", "config", "settings"))
def train_alone_jit(state, params, means, target, data, *, num_steps, config, settings):
  """`train_alone`, jitted (the one-run-at-a-time baseline of the benchmark and tests)."""
  return train_alone(state, params, means, target, data, num_steps, config=config,
                     settings=settings)


# Runs per vmapped group on a CPU: a group's activations (8 runs x 16 lines x 24 tokens x d_ff
# 512 floats: 6 MB) stay in cache; 32 runs in one vmap were 1.2x slower per run on the 2-core CPU
# VM (docs/pruning.md, Throughput). Accelerators vmap every run of a seed at once.
CPU_RUNS_PER_GROUP = 8


def runs_per_group(runs_per_seed: int, backend: str | None = None) -> int:
  """Runs vmapped together: on a CPU the largest divisor of `runs_per_seed` that is at most
  `CPU_RUNS_PER_GROUP`, elsewhere `runs_per_seed` (`backend`: default `jax.default_backend()`)."""
  if (backend or jax.default_backend()) != "cpu":
    return runs_per_seed
  return max(g for g in range(1, min(runs_per_seed, CPU_RUNS_PER_GROUP) + 1)
             if runs_per_seed % g == 0)


def train_runs_unjitted(states_SxK: RunState, params_S, means_S, targets_SxK: Array,
                        data: dict, *, num_steps: int, config: ModelConfig, settings: Settings,
                        group: int | None = None) -> tuple[RunState, dict]:
  """`num_steps` steps of every run of a checkpoint (traced; `train_runs` jits it, and
  `placement.train_runs_fn` runs it per device on a block of seeds and runs).

  Per step, the seeds are taken one after another (`lax.map`), and a seed's runs in groups of
  `group` (default `runs_per_group(K)`), one group after another, each group vmapped: a
  group's runs share the seed's weights, so each matmul is one plain [group B L, d] x [d, d']
  product. Vmapping the seeds too makes batched products with per-seed weights, 1.25x slower
  on CPU (docs/pruning.md, Throughput). The frozen model's logits are computed once per seed
  and step and shared by all its runs.

  Args:
    states_SxK: run states with leading axes [S training seeds, K runs per seed].
    params_S: the seeds' parameters [S, ...]; means_S: ([S, n, H, P], [S, n, D]).
    targets_SxK: float32 [S, K] sparsity levels.
    data: as `train_alone` (shared by every run).
    group: runs per vmapped group, a divisor of K.

  Returns:
    (states [S, K, ...], metrics float32 [num_steps, S, K] each).

  Raises:
    ValueError: `group` does not divide K.
  """
  k = targets_SxK.shape[1]
  group = group or runs_per_group(k)
  if k % group:
    raise ValueError(f"pruning runs: a group of {group} runs does not divide the {k} runs per "
                     "seed")
  to_groups = lambda tree: jax.tree_util.tree_map(
      lambda a: a.reshape((k // group, group) + a.shape[1:]), tree)
  from_groups = lambda tree: jax.tree_util.tree_map(
      lambda a: a.reshape((k,) + a.shape[2:]), tree)

  def per_seed(batch, seed_args):
    states_K, params, means, targets_K = seed_args
    full = (full_logits(config, params, batch["inputs"]) if settings.objective == "kl"
            else None)
    one = lambda st, tg: run_step(st, params, means, tg, batch, full, config=config,
                                  settings=settings)
    return from_groups(jax.lax.map(lambda g: jax.vmap(one)(*g),
                                   (to_groups(states_K), to_groups(targets_K))))

  def body(states, _):
    batch = _batch_at(data, states.step[0, 0])
    return jax.lax.map(functools.partial(per_seed, batch),
                       (states, params_S, means_S, targets_SxK))

  return jax.lax.scan(body, states_SxK, None, length=num_steps)


@functools.partial(jax.jit, static_argnames=("num_steps", "config", "settings", "group"),
                   donate_argnums=(0,))
def train_runs(states_SxK: RunState, params_S, means_S, targets_SxK: Array, data: dict, *,
               num_steps: int, config: ModelConfig, settings: Settings, group: int | None = None
               ) -> tuple[RunState, dict]:
  """`train_runs_unjitted` in one compiled program on one device (the states are donated)."""
  return train_runs_unjitted(states_SxK, params_S, means_S, targets_SxK, data,
                             num_steps=num_steps, config=config, settings=settings, group=group)


def init_runs(key_data_SxKx2: Array, config: ModelConfig, settings: Settings) -> RunState:
  """`init_run` over leading [S, K] axes of key data (uint32 [S, K, 2])."""
  return jax.jit(jax.vmap(jax.vmap(functools.partial(init_run, config=config,
                                                     settings=settings))))(key_data_SxKx2)


def run_key(training_seed: int, sparsity: float, pruning_seed: int) -> jax.Array:
  """uint32 [2] key data of a run: depends on its pruning seed, training seed and level only."""
  key = jax.random.key(pruning_seed)
  key = jax.random.fold_in(key, training_seed)
  key = jax.random.fold_in(key, int(round(sparsity * 1_000_000)))
  return jax.random.key_data(key)


def num_calls(num_steps: int, steps_per_call: int) -> list[int]:
  """Steps of each compiled call: `steps_per_call` each, the last one shorter."""
  per = max(1, steps_per_call)
  return [per] * (num_steps // per) + ([num_steps % per] if num_steps % per else [])

