"""Sharding the seed axis over devices (and hosts) with `jax.sharding`.

A one-dimensional mesh with axis name `seed` spans the devices used; every array with a leading
seed axis (the stacked `TrainState`, evaluation results) is sharded along it, so S seeds on D
devices hold S/D seeds per device, while the training and evaluation data are replicated. The
computation of a seed does not depend on which device holds it, so results do not change with the
device count (up to float reassociation; see tests/test_sharding.py for the tolerance).

Multi-host: call `initialize_distributed()` (it wraps `jax.distributed.initialize()`) before any
other JAX call; the mesh then spans the devices of all hosts, each host feeds its local devices
through `put_replicated`, and only process 0 writes metrics (orbax coordinates checkpoints).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

SEED_AXIS = "seed"


def initialize_distributed() -> None:
  """Initialises multi-host JAX (TPU pods, multi-node GPU); a no-op if already initialised."""
  try:
    jax.distributed.initialize()
  except RuntimeError as e:  # already initialised
    if "already" not in str(e):
      raise


def num_seed_devices(num_seeds: int, max_devices: int = 0) -> int:
  """Devices used for `num_seeds` seeds: the largest count <= available (and <= max_devices if
  set) that divides `num_seeds`, so every device holds the same number of seeds."""
  available = jax.device_count()
  if max_devices:
    available = min(available, max_devices)
  return max(d for d in range(1, available + 1) if num_seeds % d == 0)


def seed_mesh(num_seeds: int, max_devices: int = 0) -> Mesh:
  """A 1-D mesh with axis `seed` over `num_seed_devices(num_seeds, max_devices)` devices."""
  n = num_seed_devices(num_seeds, max_devices)
  return Mesh(np.asarray(jax.devices()[:n]), (SEED_AXIS,))


def seed_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of arrays whose leading axis is the seed axis."""
  return NamedSharding(mesh, PartitionSpec(SEED_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  """Sharding of arrays held whole by every device of the mesh (data, schedules)."""
  return NamedSharding(mesh, PartitionSpec())


def _put(tree: Any, sharding: NamedSharding) -> Any:
  """Host arrays -> global arrays with `sharding`; each process fills its local devices."""

  def put(x):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree_util.tree_map(put, tree)


def per_device(fn: Callable, mesh: Mesh, static_argnums: tuple[int, ...] = ()) -> Callable:
  """`fn` run by every device of `mesh` on its own block of seeds (`jax.shard_map`).

  The first argument of `fn` (and its result) carries a leading seed axis and is split over the
  mesh; every other non-static argument is replicated. `fn` must treat seeds independently (it
  sees only the local block [S / num_devices, ...]); nothing is communicated between devices.

  Args:
    fn: `(seed_stacked, *replicated_or_static) -> seed_stacked`.
    mesh: a `seed_mesh`.
    static_argnums: positions of arguments passed through unchanged (Python values; mark them
      static in the enclosing `jax.jit` too).
  """

  def wrapped(*args):
    dynamic = [i for i in range(len(args)) if i not in static_argnums]

    def local(*values):
      full = list(args)
      for i, v in zip(dynamic, values):
        full[i] = v
      return fn(*full)

    in_specs = tuple(PartitionSpec(SEED_AXIS) if i == 0 else PartitionSpec() for i in dynamic)
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs,
                         out_specs=PartitionSpec(SEED_AXIS))(*[args[i] for i in dynamic])

  return wrapped


def put_replicated(tree: Any, mesh: Mesh) -> Any:
  """Places host (numpy) arrays on every device of `mesh`; works multi-host (each process
  provides its local devices' copies from its own identical host data)."""
  return _put(tree, replicated(mesh))


def abstract_like(tree: Any, mesh: Mesh) -> Any:
  """ShapeDtypeStructs of a seed-stacked tree, carrying the seed sharding (orbax restore target)."""
  sharding = seed_sharding(mesh)
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def to_host(tree: Any) -> Any:
  """Fetches (possibly multi-host sharded) arrays to numpy on every process."""
  if jax.process_count() > 1:
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_get(tree)


def is_writer() -> bool:
  """True on the process that writes metrics and logs (process 0)."""
  return jax.process_index() == 0


def describe(mesh: Mesh, num_seeds: int) -> str:
  d = math.prod(mesh.devices.shape)
  return (f"{num_seeds} seeds on {d} device(s) ({num_seeds // d} per device), "
          f"{jax.process_count()} process(es), backend {jax.default_backend()}")
