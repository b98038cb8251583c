"""Validation of a resolved run config, before any compute (`validate`).

The rules of a feature live in the feature's module, and `validate` calls them: the task name
(`sg_jax.tasks`), the per-seed data composition (`composition.mixes_from_config`), the model
section (`model.ModelConfig`), the objective (`objectives.from_config`) and the loss terms
(`terms.validate`: SAS and any other registered term) and the evaluators (`evals.validate`);
the fields of the run itself (seeds, optimiser, training, evaluation schedule, checkpoints) are
checked here. This module imports JAX (through
the model); `sg_jax.configlib`, which config files import, does not.
"""

from __future__ import annotations

import ml_collections
import numpy as np

from sg_jax import evaluation as evals
from sg_jax import objectives
from sg_jax import tasks as tasks_lib
from sg_jax import terms
from sg_jax.config import per_seed
from sg_jax.data import composition
from sg_jax.models import transformer as model_lib


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks a resolved config before any compute.

  Raises:
    ValueError: one line naming the bad field ("invalid config: <field> ...").
  """

  def need(cond: bool, field: str, msg: str):
    if not cond:
      raise ValueError(f"invalid config: {field} {msg} (got {_get(config, field)!r})")

  need(config.task in tasks_lib.names(), "task", f"must be one of {tasks_lib.names()}")
  need(config.num_seeds >= 1, "num_seeds", "must be >= 1")
  need(config.first_seed >= 0, "first_seed", "must be >= 0")
  need(config.num_devices >= 0, "num_devices", "must be >= 0 (0 = all)")
  need(config.data.num_train >= 0, "data.num_train", "must be >= 0")
  need(config.data.max_length >= 0, "data.max_length", "must be >= 0 (0 = no cap)")
  composition.mixes_from_config(config)  # raises ValueError naming a bad composition field
  # The model section's rules live with the model (`ModelConfig.__post_init__`).
  model_lib.ModelConfig.from_config(config.model, vocab_size=1)
  o = config.optim
  n = config.num_seeds
  # Per-seed fields: every seed's value obeys the field's rule (`per_seed.HPARAM_FIELDS`).
  hp = per_seed.hparam_values(config)  # raises ValueError: neither one value nor one per seed
  each = lambda field, cond, msg: need(bool(np.all(cond(hp[field]))), field, msg)
  each("optim.learning_rate", lambda v: v > 0, "must be > 0")
  each("optim.eps", lambda v: v > 0, "must be > 0")
  each("optim.b1", lambda v: (v >= 0) & (v < 1), "must be in [0, 1)")
  each("optim.b2", lambda v: (v >= 0) & (v < 1), "must be in [0, 1)")
  each("optim.weight_decay", lambda v: v >= 0, "must be >= 0")
  need(o.schedule in ("linear", "constant", "wsd"), "optim.schedule",
       "must be linear, constant or wsd")
  need(all(float(w) == int(w) for w in per_seed.values(o.warmup_steps, n, "optim.warmup_steps")),
       "optim.warmup_steps", "must be whole numbers of steps")
  each("optim.warmup_steps", lambda v: v >= 0, "must be >= 0")
  need(o.decay_steps >= 0, "optim.decay_steps", "must be >= 0 (0 = train.num_steps)")
  decay_steps = o.decay_steps or config.train.num_steps
  warmup = int(hp["optim.warmup_steps"].max())  # the longest warm-up of any seed
  need(decay_steps > warmup or o.schedule == "constant", "optim.decay_steps",
       "(0 = train.num_steps) must exceed optim.warmup_steps (of every seed)")
  if o.schedule == "wsd":
    need(o.cooldown_steps >= 1, "optim.cooldown_steps", "must be >= 1 with schedule wsd")
    need(decay_steps - o.cooldown_steps >= warmup, "optim.cooldown_steps",
         f"must be <= decay_steps - warmup_steps = {decay_steps} - {warmup} with "
         f"schedule wsd (decay_steps 0 = train.num_steps; the longest warm-up of any seed)")
  each("optim.grad_clip_norm", lambda v: v >= 0, "must be >= 0 (0 disables clipping)")
  each("train.label_smoothing", lambda v: (v >= 0) & (v < 1), "must be in [0, 1)")
  for which in ("init", "data"):
    per_seed.seed_ids(config, which)  # raises ValueError naming seeds.<which>
  t = config.train
  need(t.num_steps >= 1, "train.num_steps", "must be >= 1")
  need(t.batch_size >= 1, "train.batch_size", "must be >= 1")
  need(t.steps_per_call >= 1, "train.steps_per_call", "must be >= 1")
  need(t.max_call_seconds >= 0, "train.max_call_seconds", "must be >= 0 (0 = no limit)")
  need(t.log_every >= 1, "train.log_every", "must be >= 1")
  need(t.packing_buckets >= 1, "train.packing_buckets", "must be >= 1")
  need(config.eval.every >= 1, "eval.every", "must be >= 1")
  need(config.eval.batch_size >= 1, "eval.batch_size", "must be >= 1")
  need(config.eval.max_lines >= 0, "eval.max_lines", "must be >= 0 (0 = all)")
  need(config.eval.dense_until >= 0, "eval.dense_until", "must be >= 0 (0 = off)")
  need(config.eval.dense_every >= 1, "eval.dense_every", "must be >= 1")
  need(config.checkpoint.every >= 1, "checkpoint.every", "must be >= 1")
  objectives.from_config(config)  # raises ValueError naming an unregistered objective
  terms.validate(config)  # every loss term's per-seed fields and options
  evals.validate(config)  # every evaluator's section (`evals.<name>`) and options
  need(config.checkpoint.max_to_keep >= 0, "checkpoint.max_to_keep", "must be >= 0 (0 = all)")
  need(config.checkpoint.keep_full >= 0, "checkpoint.keep_full",
       "must be >= 0 (0 = every checkpoint a full state)")
  need(config.checkpoint.params_every >= 0
       and config.checkpoint.params_every % config.checkpoint.every == 0,
       "checkpoint.params_every", "must be 0 or a multiple of checkpoint.every")


def _get(config, dotted):
  node = config
  for p in dotted.split("."):
    node = node[p]
  return node
