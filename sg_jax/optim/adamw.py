"""Clipping + AdamW of one seed: optax's chain with one value of each field compiled in
(`make_optimizer`), and the same update with each seed's values as data (`PerSeedAdamW`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sg_jax.optim.options import OptimOptions
from sg_jax.optim.schedules import make_schedule, schedule_at


def make_optimizer(options: OptimOptions) -> optax.GradientTransformation:
  """Clipping at global norm `grad_clip_norm` (0 = off), then AdamW (docs/REFERENCE.md §1) with
  the learning rate of `make_schedule(options)`: optax's chain with one value of each field
  compiled in (the reference `PerSeedAdamW` is tested against; its state is the state of the
  training step's optimiser).

  Raises:
    ValueError: a field holds several values (one per seed: `PerSeedAdamW` takes them).
  """
  o = {name: options.single(name) for name in ("b1", "b2", "eps", "weight_decay",
                                               "grad_clip_norm")}
  adamw = optax.adamw(make_schedule(options), b1=o["b1"], b2=o["b2"], eps=o["eps"],
                      weight_decay=o["weight_decay"])
  if o["grad_clip_norm"] > 0:
    return optax.chain(optax.clip_by_global_norm(o["grad_clip_norm"]), adamw)
  return adamw


@dataclasses.dataclass(frozen=True)
class PerSeedAdamW:
  """`make_optimizer`'s clipping + AdamW for one seed whose hyperparameters are data.

  `update(grads, opt_state, params, hp)` takes this seed's values (`hp`: {name: []} from
  `per_seed.hparam_arrays`: learning_rate, warmup_steps, b1, one_minus_b1, b2, one_minus_b2,
  eps, weight_decay, grad_clip_norm), so one compiled step serves any values, and a seed in a
  group with other values trains as it would alone. The state has the structure of optax's
  chain (`make_optimizer`), so checkpoints of runs from before are restored as they were.
  Every operation is optax's (0.2.x: `clip_by_global_norm`, `scale_by_adam`,
  `add_decayed_weights`, `scale_by_learning_rate`) in the same order, with `1 - b` computed on
  the host in float64 as optax computes it from a Python float, and a division by a data step
  count done as XLA compiles optax's division by a constant: alone, the updates equal optax's
  bit for bit (tests/training/test_per_seed_hparams.py; `optax.inject_hyperparams` does not: it
  computes `1 - b1` in float32, optax#1532). Inside a whole training step XLA may still fuse
  the arguments otherwise than constants (a 40-step `tiny` run without clipping ended 1 ulp
  away), so runs whose fields hold one value each keep optax's chain with the values compiled
  in (`per_seed.as_data`).

  Attributes (static):
    schedule, decay_steps, cooldown_steps: `schedule_at`'s (decay_steps resolved).
    clip: whether any seed clips (`grad_clip_norm` > 0); a seed with 0 does not clip.
    weight_decay: whether any seed has weight decay; off = optax's skip of a zero decay.
    defaults: {name: float32/int32 [S]} the config's values, used when `update` gets no `hp`
      (the first seed's) and by `step.make_chunk_fn` when its data carries no 'hparams'.
    reference: `make_optimizer`'s chain, whose `init` gives the state.
  """

  schedule: str
  decay_steps: int
  cooldown_steps: int
  clip: bool
  weight_decay: bool
  defaults: Any
  reference: Any

  def init(self, params):
    """The optimiser state of one seed's `params` (optax's chain's)."""
    return self.reference.init(params)

  def update(self, grads, opt_state, params, hp: dict | None = None):
    """(updates, new state) of one seed; `hp` None: the first seed's configured values."""
    if hp is None:
      hp = {name: jnp.asarray(value[0]) for name, value in self.defaults.items()}
    if self.clip:
      clip_state, (adam, decay_state, sched) = opt_state
      g_norm = optax.tree.norm(grads)
      max_norm = hp["grad_clip_norm"]
      trigger = jnp.squeeze(g_norm < max_norm) | (max_norm <= 0)
      grads = jax.tree_util.tree_map(
          lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm), grads)
    else:
      adam, decay_state, sched = opt_state
    b1, b2 = hp["b1"], hp["b2"]
    mu = jax.tree_util.tree_map(lambda g, t: hp["one_minus_b1"] * (g ** 1) + b1 * t, grads,
                                adam.mu)
    nu = jax.tree_util.tree_map(lambda g, t: hp["one_minus_b2"] * (g ** 2) + b2 * t, grads,
                                adam.nu)
    count_inc = optax.safe_increment(adam.count)
    mu_hat = optax.tree.bias_correction(mu, b1, count_inc)
    nu_hat = optax.tree.bias_correction(nu, b2, count_inc)
    eps = hp["eps"]
    updates = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v + 0.0) + eps), mu_hat, nu_hat)
    if self.weight_decay:
      updates = jax.tree_util.tree_map(lambda g, p: g + hp["weight_decay"] * p, updates,
                                       params)
    lr = schedule_at(self.schedule, self.decay_steps, self.cooldown_steps, sched.count,
                     hp["learning_rate"], hp["warmup_steps"])
    step_size = -1 * lr
    updates = jax.tree_util.tree_map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
    inner = (type(adam)(count=count_inc, mu=mu, nu=nu), decay_state,
             type(sched)(count=optax.safe_increment(sched.count)))
    return updates, ((clip_state, inner) if self.clip else inner)


def make_per_seed_optimizer(options: OptimOptions, hparams: dict[str, np.ndarray]
                            ) -> PerSeedAdamW:
  """The training step's optimiser with each seed's hyperparameters as data (`PerSeedAdamW`).

  Args:
    options: the run's optimiser options.
    hparams: the per-seed hyperparameters {name: array [S]} (`per_seed.hparam_arrays`): the
      values `update` uses when it gets none.
  """
  clip = any(float(v) != 0.0 for v in options.grad_clip_norm)
  decay = any(float(v) != 0.0 for v in options.weight_decay)
  # The chain whose state the step keeps: clipping present when any seed clips; its values
  # are never used (the first seed's, for a structure only).
  first = {name: (hparams[name][0].item(),) for name in ("learning_rate", "b1", "b2", "eps",
                                                          "warmup_steps")}
  first |= {"grad_clip_norm": (1.0 if clip else 0.0,), "weight_decay": (0.0,)}
  return PerSeedAdamW(schedule=options.schedule, decay_steps=options.decay_steps,
                      cooldown_steps=options.cooldown_steps, clip=clip, weight_decay=decay,
                      defaults=hparams,
                      reference=make_optimizer(dataclasses.replace(options, **first)))
