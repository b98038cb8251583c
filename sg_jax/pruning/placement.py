"""Pruning runs laid out over devices: a 2-D mesh (training seed x run) of the local devices.

The runs of a checkpoint have leading axes [S training seeds, K runs per seed] (K = sparsity
levels x pruning seeds; `run.train_runs`). They are split over a mesh with axes `seed`
(`sharding.SEED_AXIS`, as training) and `run`: `d_seed` is the largest device count that
divides S, and `d_run` the largest that divides K within the devices left, so every device
holds the same [S / d_seed, K / d_run] block of runs, and a single seed's runs still spread
over the devices (1 seed x 12 runs on 4 devices: 3 runs each). Parameters and means [S, ...]
are split along `seed` only (a device holds the seeds of its block, so the frozen model's
forward pass is shared by its runs of one seed), and the lines are replicated. Each device runs
its own block with `jax.shard_map`; nothing is communicated between devices, and the results
equal those on one device up to float reassociation (tests/pruning/test_prune_sharding.py).

Pruning runs in one process: the mesh spans that process's devices (`jax.local_devices()`).
On a CPU-only host, `python -m sg_jax.prune` splits the host into 2 x cores XLA devices, as
training does (`sg_jax.runtime.host_devices`).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sg_jax.pruning import run as run_lib
from sg_jax.runtime import sharding

SEED = sharding.SEED_AXIS
RUN = "run"


def mesh_shape(num_seeds: int, runs_per_seed: int, num_devices: int) -> tuple[int, int]:
  """(d_seed, d_run): the largest d_seed <= num_devices dividing num_seeds, then the largest
  d_run <= num_devices // d_seed dividing runs_per_seed.

  Raises:
    ValueError: a count below 1.
  """
  if min(num_seeds, runs_per_seed, num_devices) < 1:
    raise ValueError(f"mesh_shape needs counts >= 1, got seeds {num_seeds}, runs "
                     f"{runs_per_seed}, devices {num_devices}")
  d_seed = max(d for d in range(1, num_devices + 1) if num_seeds % d == 0)
  d_run = max(d for d in range(1, num_devices // d_seed + 1) if runs_per_seed % d == 0)
  return d_seed, d_run


def run_mesh(num_seeds: int, runs_per_seed: int, max_devices: int = 0) -> Mesh:
  """A mesh of axes (`seed`, `run`) and shape `mesh_shape` over the first local devices.

  Args:
    num_seeds, runs_per_seed: S and K of the runs.
    max_devices: use at most this many devices (0 = every local device).
  """
  devices = sorted(jax.local_devices(), key=lambda d: d.id)
  if max_devices:
    devices = devices[:max_devices]
  d_seed, d_run = mesh_shape(num_seeds, runs_per_seed, len(devices))
  return Mesh(np.asarray(devices[:d_seed * d_run]).reshape(d_seed, d_run), (SEED, RUN))


def describe(mesh: Mesh, num_seeds: int, runs_per_seed: int) -> str:
  d_seed, d_run = mesh.devices.shape
  return (f"{num_seeds} seeds x {runs_per_seed} runs on {math.prod(mesh.devices.shape)} "
          f"device(s) (seeds split over {d_seed}, each seed's runs over {d_run}: "
          f"{num_seeds // d_seed} seed(s) x {runs_per_seed // d_run} runs per device), "
          f"backend {jax.default_backend()}")


def place(mesh: Mesh, per_seed, per_run, shared=None):
  """Puts trees on `mesh`: `per_seed` ([S, ...] leaves) split along `seed`, `per_run`
  ([S, K, ...]) along `seed` and `run`, `shared` replicated. Returns the three trees."""
  put = lambda tree, spec: jax.device_put(tree, NamedSharding(mesh, spec))
  return put(per_seed, P(SEED)), put(per_run, P(SEED, RUN)), put(shared, P())


@functools.lru_cache(maxsize=None)
def train_runs_fn(mesh: Mesh) -> Callable:
  """`run.train_runs` over `mesh`, compiled once per (mesh, num_steps, config, settings).

  Same arguments and results as `run.train_runs` (states donated); each device trains its
  block of runs. Inputs should be placed with `place` (others are moved there first).
  Varying-axis checks are off (`check_vma=False`): a run's gradient with respect to its
  gates meets the seed-only parameters inside the model's custom VJPs, which the check
  rejects although each device's block is independent.
  """

  def fn(states_SxK, params_S, means_S, targets_SxK, data, *, num_steps, config, settings):
    local = functools.partial(run_lib.train_runs_unjitted, num_steps=num_steps, config=config,
                              settings=settings)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(SEED, RUN), P(SEED), P(SEED),
                                                     P(SEED, RUN), P()),
                         out_specs=(P(SEED, RUN), P(None, SEED, RUN)), check_vma=False)(
                             states_SxK, params_S, means_S, targets_SxK, data)

  return jax.jit(fn, static_argnames=("num_steps", "config", "settings"), donate_argnums=(0,))


def over_runs(fn: Callable, mesh: Mesh, num_run_args: int, num_shared_args: int = 0
              ) -> Callable:
  """`fn(params_S, means_S, *run_args, *shared) -> tree of [S, K, ...]` run per device.

  Used for the subnetwork evaluations (`evaluate.make_evaluator`, `evaluate.subnetwork_kl`):
  params and means are split along `seed`, the `num_run_args` arrays [S, K, ...] (masks) along
  `seed` and `run`, the `num_shared_args` trailing ones (lines) replicated; `fn` must treat
  seeds and runs independently.
  """
  in_specs = (P(SEED), P(SEED)) + (P(SEED, RUN),) * num_run_args + (P(),) * num_shared_args
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=P(SEED, RUN),
                               check_vma=False))
