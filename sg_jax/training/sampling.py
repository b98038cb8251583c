"""Which training lines each seed sees at each step: per-seed epoch permutations of the training
set (or of the seed's own pool of lines, `composition`), drawn from the seed's data stream."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sg_jax.runtime import sharding
from sg_jax.training.state import DATA_KEY, subkey

Array = jax.Array


def batch_indices(perm: Array, step: Array, batch_size: int, steps_per_epoch: int) -> Array:
  """Line indices [batch] of `step` within the epoch permutation `perm` [num_lines]."""
  return jax.lax.dynamic_slice(perm, ((step % steps_per_epoch) * batch_size,), (batch_size,))


def epoch_permutation(key_data: Array, step: Array, num_lines: int, steps_per_epoch: int
                      ) -> Array:
  """The seed's permutation [num_lines] of the epoch containing `step`.

  Each epoch of `num_lines // batch_size` steps visits a fresh permutation drawn from
  `fold_in(data_key(seed), epoch)`; the remainder lines of an epoch are skipped.
  """
  return jax.random.permutation(
      jax.random.fold_in(subkey(key_data, DATA_KEY), step // steps_per_epoch), num_lines)


def line_sampler(data: dict, keys_S: Array, batch_size: int,
                 pool_sizes: tuple[int, ...] | None = None, sharded: bool = False):
  """(first_perm(step), sample(perm, step) -> (perm, idx [S, batch])): the training lines of
  every seed at each step.

  Without pools every seed draws its epochs (`epoch_permutation`) over all `num_lines` lines
  and the epoch boundary is shared. With `data['pools']` (int32 [S_total, P], row s the lines
  seed s draws from, `composition.pools_array`) and `data['pool_sizes']` (int32 [S_total]),
  each seed permutes its own pool: its epochs are `pool_size // batch_size` steps, and its
  permutation is `epoch_permutation` over `pool_size` positions, as if its pool were the whole
  training set (so a seed in a mixed group draws the lines it draws alone, and a pool of all
  lines draws exactly the lines of the plain path).

  Args:
    keys_S: the seeds' key data [S, 2] (the local block under `shard_map`).
    pool_sizes: the distinct pool sizes (static), sorted; None without pools.
    sharded: True inside `sharding.per_device` (the local seeds are rows
      `axis_index * S .. + S` of the pools).
  """
  if "pools" not in data:
    n = data["inputs"].shape[0]
    spe = n // batch_size
    perms = lambda step: jax.vmap(lambda k: epoch_permutation(k, step, n, spe))(keys_S)

    def sample(perm, step):
      perm = jax.lax.cond(step % spe == 0, lambda: perms(step), lambda: perm)
      return perm, jax.vmap(lambda p: batch_indices(p, step, batch_size, spe))(perm)

    return perms, sample

  num_local = keys_S.shape[0]
  offset = jax.lax.axis_index(sharding.SEED_AXIS) * num_local if sharded else 0
  pools = jax.lax.dynamic_slice_in_dim(data["pools"], offset, num_local)
  sizes = jax.lax.dynamic_slice_in_dim(data["pool_sizes"], offset, num_local)
  spe = sizes // batch_size
  which = jnp.searchsorted(jnp.asarray(pool_sizes, jnp.int32), sizes)
  width = pools.shape[1]

  def perms(step):
    def one(key, spe_s, which_s):
      options = [jnp.pad(epoch_permutation(key, step, size, spe_s), (0, width - size))
                 for size in pool_sizes]
      return jnp.stack(options)[which_s]
    return jax.vmap(one)(keys_S, spe, which)

  def sample(perm, step):
    due = step % spe == 0
    perm = jax.lax.cond(jnp.any(due), lambda: jnp.where(due[:, None], perms(step), perm),
                        lambda: perm)
    pos = jax.vmap(lambda p, e: batch_indices(p, step, batch_size, e))(perm, spe)
    return perm, jnp.take_along_axis(pools, pos, axis=1)

  return perms, sample
