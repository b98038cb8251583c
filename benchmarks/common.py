"""Shared helpers of the benchmark scripts: machine description, tables, configs and layouts.

Imported by `benchmarks/train_throughput.py` and `benchmarks/memory.py` (run them as scripts:
`python benchmarks/NAME.py`, which puts this folder on `sys.path`).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sg_jax.runtime import host_devices  # noqa: E402

host_devices.configure_cpu_devices()  # as `python -m sg_jax.main` does, before JAX starts

import jax  # noqa: E402
import numpy as np  # noqa: E402

from sg_jax import configlib, train  # noqa: E402
from sg_jax.models import layers  # noqa: E402
from sg_jax import step as step_lib  # noqa: E402
from sg_jax.data import input_pipeline  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_QUICK_MODEL = {"model.d_model": 128, "model.num_heads": 4, "model.d_ff": 512}


def _git_state() -> str:
  try:
    rev = subprocess.run(["git", "-C", _REPO, "rev-parse", "--short", "HEAD"], check=True,
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", _REPO, "status", "--porcelain", "--", "sg_jax"],
                           check=True, capture_output=True, text=True).stdout.strip()
    return rev + (" + uncommitted changes in sg_jax/" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown (not a git checkout)"


def load_average() -> str:
  try:
    return "%.2f %.2f %.2f" % os.getloadavg()
  except OSError:
    return "n/a"


def machine_rows() -> list[tuple[str, str]]:
  """(name, value) rows describing the machine, the software and the time of the run."""
  device = jax.devices()[0]
  return [
      ("date", time.strftime("%Y-%m-%d %H:%M:%S %Z")),
      ("machine", f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs "
                  f"({platform.system()} {platform.release()})"),
      ("load average at start", f"{load_average()} (1/5/15 min; a shared machine gives noisy figures)"),
      ("jax version", jax.__version__),
      ("backend", f"{jax.default_backend()} ({device.device_kind})"),
      ("device count", str(jax.device_count())),
      ("sg_jax", _git_state()),
  ]


def print_rows(title: str, rows) -> None:
  width = max(len(k) for k, _ in rows)
  print(f"\n{title}")
  for k, v in rows:
    print(f"  {k:<{width}}  {v}")
  sys.stdout.flush()


def table_line(cells, widths) -> str:
  return "  " + "  ".join(f"{str(c):>{w}}" for c, w in zip(cells, widths))


def print_table(header: list[str], rows: list[list[str]], widths=None) -> None:
  """Right-aligned columns; `widths` default to the widest cell of each column."""
  widths = widths or [max(len(str(x)) for x in col) for col in zip(header, *rows)]
  print(table_line(header, widths))
  print("  " + "  ".join("-" * w for w in widths))
  for r in rows:
    print(table_line(r, widths))
  sys.stdout.flush()


# ----------------------------------------------------------------------------------------------
# Data, config and the sg_jax entry points.


def make_config(depth: int, num_seeds: int, args, packing: bool, layer_impl: str | None = None):
  """Question-formation config (= configs/question.py) at `depth` with the benchmark's fields:
  `args.dtype`, `args.matmul_precision` and `layer_impl` (default: the first of
  `args.layer_impls`) where the script has them."""
  config = configlib.apply_config_string(configlib.base_config("question"), f"depth={depth}",
                                         configlib.PRESETS)
  if args.quick:
    for field, value in _QUICK_MODEL.items():
      configlib.set_field(config, field, value)
  config.num_seeds = num_seeds
  config.data.num_train = args.num_train
  config.model.dtype = args.dtype
  config.train.steps_per_call = args.steps_per_call
  config.train.packing = packing
  config.model.matmul_precision = getattr(args, "matmul_precision", "default")
  config.model.layer_impl = layer_impl or (getattr(args, "layer_impls", None) or ["auto"])[0]
  return config


def layer_impls(text: str) -> list[str]:
  """`--layer_impl` (argparse type) -> the layer sets to time, resolved: 'both' -> [tuned,
  plain]; else a comma list of tuned, plain, auto (what `model.layer_impl=auto` picks on this
  backend). Raises argparse.ArgumentTypeError for another name."""
  names = ["tuned", "plain"] if text == "both" else [x.strip() for x in text.split(",")]
  try:
    return list(dict.fromkeys(layers.resolve_layer_impl(n) for n in names if n))
  except ValueError as e:
    raise argparse.ArgumentTypeError(f"{e}, or both") from None


def train_layout(config, split, seeds_per_device: int):
  """(host data dict, packing capacities or None) as `sg_jax.train` lays out the training set."""
  data_options = input_pipeline.DataOptions.from_config(config)
  return input_pipeline.make_train_data(data_options, split, seeds_per_device)


def train_fns(config, vocab_size: int, capacities, mesh=None):
  """`step_lib.make_train_fns` (per-device `shard_map` chunk when `mesh` is given)."""
  return step_lib.train_fns_from_config(config, vocab_size, capacities, mesh)


def _ints(text: str) -> list[int]:
  """'1,2,4' -> [1, 2, 4] (argparse type of the seed and depth lists)."""
  return [int(x) for x in text.split(",") if x.strip()]
