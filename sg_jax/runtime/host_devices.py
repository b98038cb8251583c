"""Several XLA CPU devices on a CPU-only machine, so the seed axis is sharded over them.

On a CPU, XLA runs the small matrix multiplies of these models on few threads, so one device
holding every seed leaves cores idle, and seeds vmapped on one device must share one packing
bucket per step. Splitting the host into several devices (the
`--xla_force_host_platform_device_count` flag; by default 2 x cores) lets `sg_jax.runtime.sharding`
place a share of the seeds on each; each device then runs its own seeds' steps independently
(`sharding.per_device`). Two devices per core was the fastest layout measured on a 2-core CPU:
8 seeds of the reference-size model on 4 devices trained 1.2-1.3x faster than on 8 (one each)
and 1.05-1.2x faster than on 2 (docs/performance.md). Results do not depend on the device count
(tests/runtime/test_sharding.py).

Several processes of one multi-process run on the same host (`python -m sg_jax.main
--multihost` with a loopback coordinator address) share its cores: `share_among_processes`
gives each of them its share of the devices (2 x cores / processes).

Only CPU-only hosts are split: where JAX will run on a GPU or TPU (`accelerator_expected`), the
seeds go to the accelerators and extra CPU devices would only cost host memory and threads.

This module must not import JAX at import time: the flag is read when JAX initialises its CPU
backend.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
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


# Device files of the accelerators JAX's plugins drive: NVIDIA GPUs, AMD GPUs (ROCm), TPU VMs
# (v2-v4 expose /dev/accel*, v5e and later /dev/vfio/<n>).
GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/kfd")
TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")


def _jax_plugins() -> list[str]:
  """Installed JAX PJRT plugins (the `jax_plugins` entry points JAX itself loads, e.g.
  `xla_cuda12` of the jax-cuda12-plugin wheel, and the `jax_plugins` namespace modules)."""
  names = [e.name for e in importlib.metadata.entry_points(group="jax_plugins")]
  spec = importlib.util.find_spec("jax_plugins")
  for path in (spec.submodule_search_locations or []) if spec else []:
    names += [n for n in os.listdir(path) if not n.startswith(("_", "."))]
  return names


def accelerator_expected() -> bool:
  """Whether JAX in this process will run on a GPU or TPU, decided without importing JAX.

  JAX_PLATFORMS (or the older JAX_PLATFORM_NAME), when set, decides: an accelerator is
  expected if it names any platform but `cpu`. Otherwise JAX uses an accelerator when both its
  plugin and the device are there: a PJRT plugin (`_jax_plugins`) and a GPU device file
  (`GPU_DEVICE_FILES`), or the libtpu package (or TPU_LIBRARY_PATH) and a TPU device file
  (`TPU_DEVICE_GLOBS`). A plugin without a device, or a device without a plugin, leaves JAX on
  the CPU, and so returns False.
  """
  platforms = os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME") or ""
  if platforms.strip():
    return any(p.strip().lower() not in ("", "cpu") for p in platforms.split(","))
  gpu = any(os.path.exists(f) for f in GPU_DEVICE_FILES) and bool(_jax_plugins())
  tpu_lib = bool(os.environ.get("TPU_LIBRARY_PATH")) or importlib.util.find_spec("libtpu")
  tpu = bool(tpu_lib) and any(glob.glob(g) for g in TPU_DEVICE_GLOBS)
  return gpu or tpu


def configure_cpu_devices(num_devices: int = 0) -> bool:
  """Adds `FLAG=<num_devices>` to the XLA_FLAGS environment variable before JAX starts.

  Does nothing when XLA_FLAGS already sets the flag (the user's choice wins), when JAX has
  already been imported (too late to take effect), or when JAX will run on a GPU or TPU
  (`accelerator_expected`): only CPU-only hosts are split.

  Args:
    num_devices: CPU devices to create; 0 = 2 x the cores this process may run on.

  Returns:
    True if the flag was added.
  """
  global _configured
  flags = os.environ.get("XLA_FLAGS", "")
  if FLAG in flags or "jax" in sys.modules or accelerator_expected():
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
