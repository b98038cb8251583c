"""What produced a run: package versions and JAX's PRNG settings, recorded in the workdir.

Every `sg_jax.main` start appends one entry to `WORKDIR/environment.json` (a resumed run keeps
the entries of its earlier sessions), so a result can be traced to the exact versions and to
the random-number settings that decide its bits (`jax_threefry_partitionable` changes every
random draw; the key implementation too). `sg_jax.results` copies it with a run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time

import jax

FILE = "environment.json"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy")


def package_versions() -> dict[str, str]:
  """{package: installed version} of `PACKAGES` ('not installed' where missing)."""
  out = {}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = "not installed"
  return out


def current(step: int) -> dict:
  """This process's environment as one `environment.json` entry, for a session starting at
  training step `step`."""
  return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from_step": int(step),
          "python": platform.python_version(), "versions": package_versions(),
          "jax_threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
          "jax_default_prng_impl": str(jax.config.jax_default_prng_impl),
          "jax_enable_x64": bool(jax.config.jax_enable_x64),
          "backend": jax.default_backend(), "device_count": jax.device_count()}


def read(workdir: str) -> list[dict]:
  """The entries of `workdir`'s environment.json, oldest first ([] when absent).

  Raises:
    ValueError: the file is not readable JSON (named in the message).
  """
  path = os.path.join(workdir, FILE)
  if not os.path.exists(path):
    return []
  try:
    with open(path, encoding="utf-8") as f:
      return list(json.load(f)["sessions"])
  except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path} is not readable JSON with a 'sessions' list ({e}); remove it "
                     f"to start it anew") from None


def record(workdir: str, step: int, write_json) -> dict:
  """Appends `current(step)` to `workdir`'s environment.json with `write_json(path, text)` (an
  atomic writer) and returns the entry."""
  entry = current(step)
  sessions = read(workdir) + [entry]
  write_json(os.path.join(workdir, FILE), json.dumps({"sessions": sessions}, indent=1))
  return entry
