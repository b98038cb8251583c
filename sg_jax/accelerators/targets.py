"""Accelerator targets: what a chip holds and computes, and compile-only devices for it.

A target is named as on the command line of `sg_jax.aot`: a TPU generation and slice,
`v4:2x2x1`, `v5e:2x2`, `v5p:1x1x1`, `v6e:1x1` (chips along each axis of the slice, as Cloud TPU
names its topologies), or one NVIDIA GPU, `h100`, `h200`, `a100` (optionally `h100:4` for four
of them). `compile_devices` gives JAX devices of that target on any machine, that programs can
be compiled for but not run on (`jax.experimental.topologies.get_topology_desc`): TPU through
libtpu, GPU through the `jax-cuda12` plugin with XLA's own target description of the GPU
(`gpu_specs/`). Both are an optional install (requirements-accelerators.txt).

Published figures per chip (`Chip`): HBM in bytes, dense matmul peaks in FLOP/s, HBM bandwidth
in bytes/s, from Google Cloud's TPU system-architecture pages (v4, v5e, v5p, v6e) and NVIDIA's
H100 / H200 / A100 SXM datasheets (dense, without sparsity).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re

from jax.experimental import topologies

GIB = 2 ** 30
_SPECS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs")

INSTALL_HINT = ("install requirements-accelerators.txt into a separate environment "
                '(docs/performance.md, "Compiling for TPU and GPU ahead of time")')


class MissingInstall(RuntimeError):
  """The optional TPU/GPU compile-only piece for a target is not installed (one line: what to
  install)."""


@dataclasses.dataclass(frozen=True)
class Chip:
  """One chip of a target.

  hbm_bytes: device memory (bytes).
  bf16_flops: dense bfloat16 matmul peak (FLOP/s).
  f32_flops: dense float32 matmul peak at JAX's default precision (FLOP/s): on TPU one bfloat16
    pass (= bf16_flops), on NVIDIA GPUs since Ampere TF32 (docs/performance.md, "Matmul
    precision on GPU and TPU").
  f32_highest_flops: dense float32 peak at `precision=highest` (FLOP/s): TPU six bfloat16
    passes, GPU the non-tensor-core float32 peak.
  hbm_bandwidth: bytes/s.
  """

  name: str
  platform: str  # 'tpu' | 'cuda'
  hbm_bytes: float
  bf16_flops: float
  f32_flops: float
  f32_highest_flops: float
  hbm_bandwidth: float
  spec_file: str = ""  # GPU: the XLA target description in gpu_specs/

  def matmul_peak(self, dtype: str, precision: str = "default") -> float:
    """Dense matmul peak (FLOP/s) of a model computing in `dtype` ('float32' | 'bfloat16') at
    `model.matmul_precision` `precision` ('default' | 'high' | 'highest')."""
    if dtype == "bfloat16":
      return self.bf16_flops
    if precision == "highest":
      return self.f32_highest_flops
    if precision == "high" and self.platform == "tpu":
      return self.bf16_flops / 3.0  # three bfloat16 passes
    return self.f32_flops


CHIPS = {
    # Cloud TPU system architecture (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e).
    "v4": Chip("TPU v4", "tpu", 32 * GIB, 275e12, 275e12, 275e12 / 6, 1228e9),
    "v5e": Chip("TPU v5e", "tpu", 16 * GIB, 197e12, 197e12, 197e12 / 6, 819e9),
    "v5p": Chip("TPU v5p", "tpu", 95 * GIB, 459e12, 459e12, 459e12 / 6, 2765e9),
    "v6e": Chip("TPU v6e", "tpu", 32 * GIB, 918e12, 918e12, 918e12 / 6, 1640e9),
    # NVIDIA datasheets, SXM parts, dense (no sparsity); memory from XLA's target description.
    "h100": Chip("NVIDIA H100 SXM", "cuda", 84978434048, 989e12, 495e12, 67e12, 3.35e12,
                 "h100_sxm.txtpb"),
    "h200": Chip("NVIDIA H200 SXM", "cuda", 150754820096, 989e12, 495e12, 67e12, 4.8e12,
                 "h200_sxm.txtpb"),
    "a100": Chip("NVIDIA A100 SXM 80GB", "cuda", 85100068864, 312e12, 156e12, 19.5e12,
                 2.039e12, "a100_sxm_80.txtpb"),
}

TARGET_EXAMPLES = "v5e:2x2, v4:2x2x1, v5p:1x1x1, v6e:1x1, h100, h200, a100"


@dataclasses.dataclass(frozen=True)
class Target:
  """A parsed `--target`: the chip and the slice shape (chips along each axis)."""

  name: str  # as given, e.g. 'v5e:2x2'
  generation: str  # key of CHIPS
  shape: tuple[int, ...]

  @property
  def chip(self) -> Chip:
    return CHIPS[self.generation]

  @property
  def num_chips(self) -> int:
    return math.prod(self.shape)

  @property
  def platform(self) -> str:
    return self.chip.platform


def parse_target(name: str) -> Target:
  """`'v5e:2x2'` -> Target; a GPU without a count is one GPU (`'h100'` = `'h100:1'`).

  Raises:
    ValueError: an unknown generation or a malformed shape (one line with the accepted forms).
  """
  generation, _, shape = name.strip().lower().partition(":")
  if generation not in CHIPS:
    raise ValueError(f"unknown target {name!r}: give one of {', '.join(sorted(CHIPS))} with a "
                     f"slice shape for TPUs, e.g. {TARGET_EXAMPLES}")
  platform = CHIPS[generation].platform
  if platform == "cuda":
    if shape and not re.fullmatch(r"[1-9][0-9]*", shape):
      raise ValueError(f"bad target {name!r}: a GPU target is {generation} or {generation}:N "
                       f"(N GPUs)")
    return Target(name, generation, (int(shape or 1),))
  if not re.fullmatch(r"[1-9][0-9]*(x[1-9][0-9]*){1,2}", shape):
    raise ValueError(f"bad target {name!r}: a TPU target names its slice as chips along each "
                     f"axis, e.g. {generation}:2x2 or {generation}:2x2x1")
  return Target(name, generation, tuple(int(n) for n in shape.split("x")))


def spec_text(chip: Chip) -> str:
  """The XLA GPU target description (`GpuTargetConfigProto` text) of a GPU chip."""
  with open(os.path.join(_SPECS_DIR, chip.spec_file), encoding="utf-8") as f:
    return f.read()


@functools.lru_cache(maxsize=None)
def compile_devices(target: Target) -> tuple:
  """Compile-only JAX devices of `target` (`target.num_chips` of them), on any machine.

  Programs lowered with shardings over these devices compile for the target
  (`jax.stages.Lowered.compile`) but cannot run. TPU: libtpu's topology (a single chip needs
  `chips_per_host_bounds=[1,1,1]`); GPU: the `jax-cuda12` plugin with the target's description
  (`gpu_specs/`), with JAX_PLATFORMS=cpu so that no GPU is looked for.

  Raises:
    MissingInstall: libtpu or the jax-cuda12 plugin is not installed (the line says what to
      install).
    RuntimeError: the installed piece refused the topology (its message, first line).
  """
  if target.platform == "tpu":
    if not _installed("libtpu"):
      raise MissingInstall(f"compiling for {target.name} needs libtpu (the TPU compiler, "
                           f"compile-only on any machine): {INSTALL_HINT}")
    # Compile-only: no chip is opened, so several processes (a test beside a compile) may load
    # libtpu at once; without this the second stops at libtpu's lock file.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    shape = list(target.shape) + [1] * (3 - len(target.shape))
    kwargs = {}
    if target.num_chips == 1:
      kwargs["chips_per_host_bounds"] = [1, 1, 1]
    if target.generation == "v4":
      # One device per chip (its two TensorCores as one), as JAX runs a v4; libtpu's default
      # describes each TensorCore as a device.
      kwargs["chip_config_name"] = "megacore"
    topology_name = f"{target.generation}:{'x'.join(map(str, target.shape))}"
    try:
      devices = topologies.get_topology_desc(topology_name, "tpu", **kwargs).devices
    except Exception as e:  # pylint: disable=broad-except  (jaxlib's own runtime error)
      raise RuntimeError(f"libtpu refused the topology {topology_name} ({shape}): "
                         f"{_first_line(e)}") from None
  else:
    if not _installed("jax_plugins.xla_cuda12"):
      raise MissingInstall(f"compiling for {target.name} needs the jax-cuda12 plugin (with its "
                           f"CUDA compiler wheels): {INSTALL_HINT}")
    try:
      devices = topologies.get_topology_desc(
          "cuda", "cuda", target_config=spec_text(target.chip),
          topology=f"1x1x{target.num_chips}").devices
    except Exception as e:  # pylint: disable=broad-except  (jaxlib's own runtime error)
      raise RuntimeError(f"the jax-cuda12 plugin refused to describe {target.name}: "
                         f"{_first_line(e)} (is it the version jax pins? {INSTALL_HINT})"
                         ) from None
  if len(devices) != target.num_chips:
    raise RuntimeError(f"{target.name}: the compiler described {len(devices)} devices, not "
                       f"{target.num_chips}")
  return tuple(devices)


def _installed(module: str) -> bool:
  """Whether `module` can be imported (without importing it)."""
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # the parent package (jax_plugins) is absent
    return False


def _first_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
  return lines[0][:300] if lines else type(e).__name__


def seed_devices(num_seeds: int, num_chips: int, max_devices: int = 0) -> int:
  """Chips a run of `num_seeds` seeds uses on a slice of `num_chips`: the largest count <= the
  chips (and <= `max_devices`, config.num_devices, when set) that divides the seeds, as
  `sharding.num_seed_devices` picks for a single-process run."""
  available = min(num_chips, max_devices) if max_devices else num_chips
  return max(d for d in range(1, available + 1) if num_seeds % d == 0)
