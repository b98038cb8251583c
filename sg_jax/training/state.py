"""The state of one seed (`TrainState`), its initialisation and its random streams.

Every random quantity of seed `s` is drawn from its root key `jax.random.key(s)` (`seed_keys`)
folded with a purpose (`PARAMS_KEY`, `DROPOUT_KEY`, `DATA_KEY`, `OBJECTIVE_KEY`: one
independent stream each, `subkey`) and then with the step, so a resumed run equals an
uninterrupted one and a seed trained in a group equals the same seed trained alone.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from sg_jax import models
from sg_jax.models import transformer as model_lib

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  """State of one seed (stacked: every leaf gets a leading [seed] axis).

  Attributes:
    step: int32 [] optimisation steps taken.
    params: model parameters (float32).
    opt_state: optax state (AdamW moments, schedule count).
    key: uint32 [2] key data of the seed's root key `jax.random.key(seed)`.
    diverged: bool [] True once the loss or gradient norm was non-finite. The parameters then
      freeze at their last finite values; the optimiser state is not guarded (it takes the
      non-finite step and may hold NaN moments from then on: a diverged seed never trains again).
    diverged_step: int32 [] step at which it diverged (-1 if never).
    sums: running sums since the last log: loss, grad_norm (before clipping) and steps.
  """

  step: Array
  params: Any
  opt_state: Any
  key: Array
  diverged: Array
  diverged_step: Array
  sums: dict


def seed_keys(seeds: list[int]) -> Array:
  """uint32 [num_seeds, 2] key data of `jax.random.key(s)` for each seed id."""
  return jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds])


def subkey(key_data: Array, purpose: int) -> Array:
  """The typed key of one of a seed's streams (`purpose`: one of the `*_KEY` below) from its
  uint32 [2] key data."""
  return jax.random.fold_in(jax.random.wrap_key_data(key_data), purpose)


# Purposes folded into a seed's root key: one independent stream each.
PARAMS_KEY, DROPOUT_KEY, DATA_KEY, OBJECTIVE_KEY = 0, 1, 2, 3


def init_state(key_data: Array, model: model_lib.TransformerLM,
               tx, extra_sums: tuple[str, ...] = (), init_key: Array | None = None,
               init_scale: Array | None = None) -> TrainState:
  """Initial state of one seed.

  Args:
    key_data: uint32 [2] key data of the seed's data order, dropout and masking draws (kept
      in the state: `seeds.data`, `per_seed.seed_ids`).
    tx: the optimiser (`PerSeedAdamW` or an optax transformation).
    extra_sums: names of further running sums (the loss terms' penalties, `terms.sum_name`).
    init_key: uint32 [2] key data of the initialisation (`seeds.init`); None = `key_data`.
    init_scale: float32 [] factor on the initial weight matrices and embeddings (every
      parameter of 2 or more dimensions; LayerNorm gains and biases stay as drawn: Omnigrok's
      alpha, Liu et al., ICLR 2023 §3); None = 1 (nothing multiplied).
  """
  params = models.init_params(
      model.config, subkey(key_data if init_key is None else init_key, PARAMS_KEY))
  if init_scale is not None:
    params = jax.tree_util.tree_map(lambda p: p * init_scale if p.ndim >= 2 else p, params)
  zero = jnp.zeros((), jnp.float32)
  sums = {"loss": zero, "grad_norm": zero, "steps": zero} | {name: zero for name in extra_sums}
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    key=key_data, diverged=jnp.zeros((), bool),
                    diverged_step=jnp.full((), -1, jnp.int32), sums=sums)
