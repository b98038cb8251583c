"""The optimiser's options of a run: the `optim` section resolved once at the top of the loop."""

from __future__ import annotations

import dataclasses
from typing import Any

from sg_jax.config import per_seed

# The fields of the `optim` section that take one value or one per seed (`per_seed.HPARAM_FIELDS`).
PER_SEED_FIELDS = ("learning_rate", "warmup_steps", "b1", "b2", "eps", "weight_decay",
                   "grad_clip_norm")


@dataclasses.dataclass(frozen=True)
class OptimOptions:
  """Clipping, AdamW and the learning-rate schedule of a run (docs/REFERENCE.md §1).

  Every per-seed field holds one value per seed (a tuple of S values, as the config gave them:
  Python floats or ints, so a value compiled in is the config's value exactly).

  Attributes:
    schedule: 'linear', 'constant' or 'wsd' (`schedules.make_schedule`).
    learning_rate: [S] peak learning rate of each seed.
    warmup_steps: [S] linear warm-up length of each seed (steps).
    decay_steps: the step at which the decay ends, resolved: `optim.decay_steps`, or
      `train.num_steps` where that is 0.
    cooldown_steps: 'wsd' only: the length of the final linear cool-down (steps).
    b1, b2, eps: [S] AdamW's moment decays and epsilon.
    weight_decay: [S] AdamW's decoupled weight decay (0 = off).
    grad_clip_norm: [S] clipping at this global gradient norm (0 = off).
  """

  schedule: str
  learning_rate: tuple
  warmup_steps: tuple
  decay_steps: int
  cooldown_steps: int
  b1: tuple
  b2: tuple
  eps: tuple
  weight_decay: tuple
  grad_clip_norm: tuple

  @classmethod
  def from_config(cls, config: Any) -> "OptimOptions":
    """The optimiser options of a run config (its `optim` section, `train.num_steps` and
    `num_seeds`).

    Raises:
      ValueError: a per-seed field with neither one value nor one per seed (`per_seed.values`).
    """
    optim, n = config.optim, int(config.num_seeds)
    per = {name: tuple(per_seed.values(optim[name], n, f"optim.{name}"))
           for name in PER_SEED_FIELDS}
    return cls(schedule=optim.schedule,
               decay_steps=optim.decay_steps or int(config.train.num_steps),
               cooldown_steps=optim.cooldown_steps, **per)

  def single(self, name: str):
    """The one value of the per-seed field `name` (all seeds alike).

    Raises:
      ValueError: the seeds hold different values (a function compiling one value in cannot
        serve them: `schedules.schedule_at` and `adamw.PerSeedAdamW` take them as data).
    """
    values = getattr(self, name)
    if len(set(values)) != 1:
      raise ValueError(f"optim.{name} holds one value per seed {tuple(values)}: this needs one "
                       f"value (optim.schedules.schedule_at takes them per seed)")
    return values[0]

  def seed(self, index: int) -> "OptimOptions":
    """The options of seed `index` alone (every per-seed field a 1-tuple)."""
    return dataclasses.replace(self, **{name: (getattr(self, name)[index],)
                                        for name in PER_SEED_FIELDS})
