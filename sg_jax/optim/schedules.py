"""The learning rate per step: compiled in (`make_schedule`, optax's) or with each seed's peak
and warm-up as data (`schedule_at`, the same bits), and each seed's logged value
(`learning_rates`, `train/learning_rate`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sg_jax.optim.options import OptimOptions

Array = jax.Array


def make_schedule(options: OptimOptions) -> optax.Schedule:
  """Learning rate per step (a function of the 0-based step), one of `options.schedule`:

  * "linear" (reference, docs/REFERENCE.md §1): linear warm-up from 0 over `warmup_steps`, then
    linear decay to 0 at `decay_steps`;
  * "constant": warm-up, then `learning_rate` forever;
  * "wsd" (warm-up, stable, decay): warm-up, constant, then a linear cool-down to 0 over the
    last `cooldown_steps` steps before `decay_steps` (0 after it).

  `decay_steps` is resolved (`OptimOptions.from_config`: `optim.decay_steps` = 0 means the run's
  train.num_steps, so the decay ends at the last step). This is optax's schedule with the values
  compiled in: the schedule of one value of `learning_rate` and `warmup_steps` (`schedule_at`
  takes them per seed, as data).

  Raises:
    ValueError: `learning_rate` or `warmup_steps` holds several values (one per seed).
  """
  lr, warmup = (options.single(name) for name in ("learning_rate", "warmup_steps"))
  decay_steps = options.decay_steps
  if options.schedule == "constant":
    after = optax.constant_schedule(lr)
  elif options.schedule == "wsd":
    stable = decay_steps - options.cooldown_steps - warmup
    after = optax.join_schedules(
        [optax.constant_schedule(lr), optax.linear_schedule(lr, 0.0, options.cooldown_steps)],
        [stable])
  else:
    after = optax.linear_schedule(lr, 0.0, decay_steps - warmup)
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def learning_rates(options: OptimOptions, step: int) -> np.ndarray:
  """float64 [S]: each seed's learning rate at 0-based `step` (`make_schedule` of its own
  learning rate and warm-up; `train/learning_rate`)."""
  return np.asarray([float(make_schedule(options.seed(s))(step))
                     for s in range(len(options.learning_rate))])


def schedule_at(schedule: str, decay_steps: int, cooldown_steps: int, count: Array, lr: Array,
                warmup: Array) -> Array:
  """float32 []: `make_schedule`'s learning rate at `count` for one seed whose peak learning
  rate `lr` (float32 []) and warm-up length `warmup` (int32 []) are data, not constants.

  The arithmetic is optax's (`polynomial_schedule` with power 1, `join_schedules`) with the
  same operations in the same order, and a division by a step count that is data done as XLA
  compiles optax's division by a constant (times the float32 reciprocal), so that the value
  equals `make_schedule`'s bit for bit for the same lr and warm-up
  (tests/training/test_per_seed_hparams.py). A warm-up of 0 selects the
  after-warm-up schedule at every step, as `make_schedule` does.

  Args:
    schedule: 'linear', 'constant' or 'wsd' (static).
    decay_steps: the resolved end of the decay (`OptimOptions.decay_steps`; static).
    cooldown_steps: 'wsd' only (static).
    count: int32 [] the optimiser's step count.
  """
  def linear(init, end, steps, c):  # optax.polynomial_schedule(power=1, transition_begin=0)
    c = jnp.clip(c - 0, 0, steps)
    if isinstance(steps, int):
      frac = 1 - c / steps
    else:  # XLA compiles optax's division by a constant as a product with its reciprocal
      frac = 1 - c * (1 / steps.astype(jnp.float32))
    return (init - end) * (frac ** 1) + end

  def after(c):
    if schedule == "constant":
      return lr
    if schedule == "wsd":
      stable = decay_steps - cooldown_steps - warmup
      return jnp.where(c < stable, lr, linear(lr, 0.0, cooldown_steps, c - stable))
    return linear(lr, 0.0, decay_steps - warmup, c)

  # The warm-up branch is selected only when warmup > 0 (0/0 in the other branch is dropped).
  warm = linear(0.0, lr, jnp.maximum(warmup, 1), count)
  return jnp.where(count < warmup, warm, after(count - warmup))
