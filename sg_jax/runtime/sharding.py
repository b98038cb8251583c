"""Sharding the seed axis over devices (and hosts) with `jax.sharding`.

A one-dimensional mesh with axis name `seed` spans the devices used; every array with a leading
seed axis (the stacked `TrainState`, evaluation results) is sharded along it, so S seeds on D
devices hold S/D seeds per device, while the training and evaluation data are replicated. The
computation of a seed does not depend on which device holds it, so results do not change with the
device count (up to float reassociation; see tests/runtime/test_sharding.py for the tolerance).

Several processes (hosts, or processes on one host): call `initialize_distributed` (it wraps
`jax.distributed.initialize`) before any other JAX call; the mesh then spans the same number of
devices of every process, each process feeds its local devices through `put_replicated`, only
process 0 writes metrics and logs (`is_writer`), and every process takes part in orbax's
checkpoint saves, which orbax coordinates.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

SEED_AXIS = "seed"


# A process that stops sending heartbeats for this long is taken for dead by the coordinator,
# and the others then stop (`ProcessWatchdog`; JAX's default is 100 s). Heartbeats come from a
# background thread, so long compilations and compiled calls do not delay them.
HEARTBEAT_TIMEOUT_SECONDS = 30


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None, *,
                           heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_SECONDS,
                           initialization_timeout_seconds: int = 300) -> None:
  """Starts multi-process JAX (`jax.distributed.initialize`) before any other JAX call.

  Arguments left None come from JAX's environment variables (JAX_COORDINATOR_ADDRESS, ...) or
  its cluster detection (SLURM, Open MPI, Cloud TPU, ...). On CPU, cross-process collectives go
  through gloo (selected here: without a CPU collectives implementation every cross-process
  transfer fails). A no-op if JAX's distributed runtime is already initialised.

  Args:
    coordinator_address: 'host:port' of process 0, which runs the coordinator.
    num_processes: processes in the run.
    process_id: this process's index in [0, num_processes).
    heartbeat_timeout_seconds: a process silent this long is taken for dead (s).
    initialization_timeout_seconds: how long to wait for every process to connect (s).

  Raises:
    ValueError: some arguments are given and others missing, or process_id is out of range.
  """
  given = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if any(given) and not all(given):
    raise ValueError("multi-process: give --coordinator_address, --num_processes and "
                     "--process_id together (or none, to take them from the environment)")
  if num_processes is not None and not 0 <= process_id < num_processes:
    raise ValueError(f"multi-process: --process_id must be in [0, {num_processes}) for "
                     f"--num_processes={num_processes}, not {process_id}")
  if jax.distributed.is_initialized():
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # Without this the coordinator aborts every other process (a native crash with a stack trace)
  # once one of them misses its heartbeats; with it, the others see the loss as a Python error
  # (a failed collective or barrier) or through `ProcessWatchdog`, and stop with one line.
  jax.config.update("jax_enable_recoverability", True)
  jax.distributed.initialize(coordinator_address, num_processes, process_id,
                             initialization_timeout=initialization_timeout_seconds,
                             heartbeat_timeout_seconds=heartbeat_timeout_seconds)
  # Runs before JAX's own exit handler (registered earlier, so run later).
  atexit.register(leave, heartbeat_timeout_seconds)


_leaving = threading.Event()  # set by `leave`: peers disconnecting now are not lost


def leave(timeout_seconds: float = HEARTBEAT_TIMEOUT_SECONDS) -> None:
  """Disconnects this process from the run so that no process takes another's exit for a
  failure; called at exit (and before `os._exit`). A no-op for a single process.

  In recoverable mode JAX's shutdown does not wait for the other processes, and a process
  whose coordinator (hosted by process 0) goes away first aborts. So every other process
  disconnects first, and process 0 waits until they have (at most `timeout_seconds`: a
  process that died counts as gone once it misses its heartbeats) before it stops the
  coordinator.
  """
  if jax.process_count() == 1 or _distributed_client() is None:
    return
  _leaving.set()
  if jax.process_index() == 0:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
      try:
        if len(lost_processes()) == jax.process_count() - 1:
          break
      except RuntimeError:
        break
      time.sleep(0.05)
  jax.distributed.shutdown()


def _distributed_client():
  # JAX has no public accessor for its distributed runtime client; orbax uses the same one.
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  return distributed.global_state.client


def lost_processes() -> list[int]:
  """Processes of the run that the coordinator no longer hears from (missed heartbeats for
  the heartbeat timeout, or disconnected); [] in a single-process run.

  Raises:
    RuntimeError: the coordinator (process 0) cannot be reached (e.g. it died).
  """
  client = _distributed_client()
  if client is None or jax.process_count() == 1:
    return []
  everyone = list(range(jax.process_count()))
  try:
    live = client.get_live_nodes(everyone)
  except Exception as e:  # pylint: disable=broad-except  (jaxlib raises its own runtime error)
    raise RuntimeError(f"the coordinator (process 0) cannot be reached: "
                       f"{str(e).strip().splitlines()[0][:200]}") from e
  return [p for p in everyone if p not in live]


class ProcessWatchdog:
  """A daemon thread that calls `on_lost(message)` once when another process of the run is
  lost (`lost_processes`), so that a process waiting for a dead peer in a native call that
  would not return stops within about the heartbeat timeout instead of hanging.

  Use as a context manager (or `start`/`stop`); a no-op in a single-process run.
  `on_lost` runs on the watchdog thread and normally ends the process.
  """

  def __init__(self, on_lost: Callable[[str], None], interval_seconds: float = 1.0):
    self._on_lost = on_lost
    self._interval = interval_seconds
    self._stopped = threading.Event()
    self._thread: threading.Thread | None = None

  def check_now(self) -> None:
    """Calls `on_lost` now if a process is lost: a failure a lost process caused (e.g. a
    checkpoint save whose barrier never completed) is then reported as such."""
    if jax.process_count() == 1:
      return
    try:
      lost = lost_processes()
      message = (f"process(es) {', '.join(map(str, lost))} of {jax.process_count()} stopped "
                 f"(no heartbeat)") if lost else None
    except RuntimeError as e:
      message = str(e)
    if message and not (self._stopped.is_set() or _leaving.is_set()):
      self._on_lost(message)

  def _watch(self) -> None:
    while not self._stopped.wait(self._interval):
      self.check_now()

  def start(self) -> "ProcessWatchdog":
    if jax.process_count() > 1 and self._thread is None:
      self._thread = threading.Thread(target=self._watch, name="sg_jax-process-watchdog",
                                      daemon=True)
      self._thread.start()
    return self

  def stop(self) -> None:
    """Stops watching (before a normal exit, when the other processes disconnect too)."""
    self._stopped.set()

  def __enter__(self) -> "ProcessWatchdog":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def sync_processes(name: str) -> None:
  """Waits until every process of the run reaches `sync_processes(name)`; a no-op for one.

  Raises:
    jax.errors.JaxRuntimeError: another process is gone.
  """
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def max_over_processes(value: int) -> int:
  """The largest of every process's `value` (a collective: every process must call it).

  Raises:
    jax.errors.JaxRuntimeError: another process is gone.
  """
  if jax.process_count() == 1:
    return int(value)
  return int(np.max(multihost_utils.process_allgather(np.asarray(value, np.int32))))


def num_seed_devices(num_seeds: int, max_devices: int = 0) -> int:
  """Devices used for `num_seeds` seeds: the largest count <= available (and <= max_devices if
  set) that divides `num_seeds`, so every device holds the same number of seeds. With several
  processes the count is also a multiple of the process count, so that every process holds
  the same number of devices (and seeds).

  Raises:
    ValueError: several processes and no such count (num_seeds or max_devices not a multiple
      of the process count).
  """
  processes = jax.process_count()
  available = jax.device_count()
  if max_devices:
    available = min(available, max_devices)
  counts = [d for d in range(1, available + 1)
            if num_seeds % d == 0 and d % processes == 0
            and d // processes <= jax.local_device_count()]
  if not counts:
    raise ValueError(f"invalid config: num_seeds ({num_seeds}) and num_devices "
                     f"({max_devices or 'all'}) must be multiples of the number of processes "
                     f"({processes}), so that every process holds the same number of seeds")
  return max(counts)


def seed_mesh(num_seeds: int, max_devices: int = 0) -> Mesh:
  """A 1-D mesh with axis `seed` over `num_seed_devices(num_seeds, max_devices)` devices.

  The devices are the first of each process in process order (a single process: the first of
  `jax.devices()`), so seed i lies on the same mesh position whatever the process count.

  Raises:
    ValueError: as `num_seed_devices`.
  """
  n = num_seed_devices(num_seeds, max_devices)
  per_process = n // jax.process_count()
  devices = []
  for p in range(jax.process_count()):
    devices += sorted((d for d in jax.devices() if d.process_index == p),
                      key=lambda d: d.id)[:per_process]
  return Mesh(np.asarray(devices), (SEED_AXIS,))


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
  """Fetches (possibly multi-host sharded) arrays to numpy on every process.

  With several processes, a seed-sharded array is all-gathered along its seed axis, and a
  replicated one (e.g. a count that does not depend on the parameters) is read from a local
  copy, so that it keeps its shape instead of being tiled once per process.
  """
  if jax.process_count() <= 1:
    return jax.device_get(tree)

  def fetch(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return jax.device_get(x)
    if x.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    return multihost_utils.process_allgather(x, tiled=True)

  return jax.tree_util.tree_map(fetch, tree)


def is_writer() -> bool:
  """True on the process that writes metrics and logs (process 0)."""
  return jax.process_index() == 0


def describe(mesh: Mesh, num_seeds: int) -> str:
  d = math.prod(mesh.devices.shape)
  return (f"{num_seeds} seeds on {d} device(s) ({num_seeds // d} per device), "
          f"{jax.process_count()} process(es), backend {jax.default_backend()}")
