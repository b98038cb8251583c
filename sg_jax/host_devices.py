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

This module must not import JAX: the flag is read when JAX initialises its CPU backend.
"""

from __future__ import annotations

import os
import sys

FLAG = "--xla_force_host_platform_device_count"


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
  flags = os.environ.get("XLA_FLAGS", "")
  if FLAG in flags or "jax" in sys.modules:
    return False
  if num_devices <= 0:
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else (os.cpu_count() or 1))
    num_devices = 2 * cores
  os.environ["XLA_FLAGS"] = f"{flags} {FLAG}={num_devices}".strip()
  return True
