"""Several XLA CPU devices on a CPU-only machine, so the seed axis is sharded over them.

On a CPU, XLA runs the small matrix multiplies of these models on few threads, so one device
holding every seed leaves cores idle, and seeds vmapped on one device must share one packing
bucket per step. Splitting the host into several devices (the
`--xla_force_host_platform_device_count` flag; by default 2 x cores) lets `sg_jax.sharding`
place a share of the seeds on each; each device then runs its own seeds' steps independently
(`sharding.per_device`). Two devices per core was the fastest layout measured on a 2-core CPU:
8 seeds of the reference-size model on 4 devices trained 1.2-1.3x faster than on 8 (one each)
and 1.05-1.2x faster than on 2 (docs/performance.md). Results do not depend on the device count
(tests/test_sharding.py).

Several processes of one multi-process run on the same host (`python -m sg_jax.main
--multihost` with a loopback coordinator address) share its cores: `share_among_processes`
gives each of them its share of the devices (2 x cores / processes).

This module must not import JAX at import time: the flag is read when JAX initialises its CPU
backend.
"""

from __future__ import annotations

import ipaddress
import os
import sys

FLAG = "--xla_force_host_platform_device_count"

# The device count `configure_cpu_devices` put into XLA_FLAGS (None: it added nothing).
_configured: int | None = None


def default_device_count() -> int:
  """2 x the cores this process may run on."""
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else (os.cpu_count() or 1))
  return 2 * cores


def configure_cpu_devices(num_devices: int = 0) -> bool:
  """Adds `FLAG=<num_devices>` to the XLA_FLAGS environment variable before JAX starts.

  Does nothing when XLA_FLAGS already sets the flag (the user's choice wins) or when JAX has
  already been imported (too late to take effect). GPU/TPU hosts are unaffected: JAX's default
  devices there are the accelerators, and the CPU devices stay unused.

  Args:
    num_devices: CPU devices to create; 0 = 2 x the cores this process may run on.

  Returns:
    True if the flag was added.
  """
  global _configured
  flags = os.environ.get("XLA_FLAGS", "")
  if FLAG in flags or "jax" in sys.modules:
    return False
  if num_devices <= 0:
    num_devices = default_device_count()
  os.environ["XLA_FLAGS"] = f"{flags} {FLAG}={num_devices}".strip()
  _configured = num_devices
  return True


def processes_on_this_host(coordinator_address: str | None, num_processes: int | None) -> int:
  """How many processes of a multi-process run share this host: all of them when the
  coordinator's address is a loopback one (127.0.0.1, localhost, ::1), else one (one process
  per host, the usual cluster layout; set XLA_FLAGS yourself for another)."""
  if not coordinator_address or not num_processes:
    return 1
  host = coordinator_address.rsplit(":", 1)[0].strip("[]")
  try:
    loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
  except ValueError:  # a host name
    loopback = False
  return int(num_processes) if loopback else 1


def share_among_processes(processes_on_host: int) -> int | None:
  """Gives this process 1/`processes_on_host` of the CPU devices `configure_cpu_devices` chose
  (at least one), so that the processes sharing a host split its cores between them.

  Call it after `configure_cpu_devices` and before JAX starts its backends (importing JAX is
  fine; it sets the `jax_num_cpu_devices` option, which takes precedence over XLA_FLAGS). Does
  nothing when the device count came from the user's XLA_FLAGS or for one process per host.

  Args:
    processes_on_host: processes of the run on this host (`processes_on_this_host`).

  Returns:
    The device count set, or None when nothing was changed.
  """
  if _configured is None or processes_on_host <= 1:
    return None
  import jax  # pylint: disable=import-outside-toplevel  (after configure_cpu_devices)

  count = max(1, _configured // processes_on_host)
  jax.config.update("jax_num_cpu_devices", count)
  return count
