"""Roofline arithmetic on a compiled program's cost (Williams, Waterman & Patterson, "Roofline:
an insightful visual performance model for multicore architectures", CACM 2009).

A compiled call's cost (`jax.stages.Compiled.cost_analysis()`: 'flops' and 'bytes accessed' of
the program one chip runs) is turned into figures per seed-step: XLA's cost analysis counts the
body of a `while` loop once, whatever its trip count (tests/accelerators/test_aot.py checks it on a toy
`lax.scan`; the tiny preset's 1-, 2- and 10-step training calls cost the same to 8 bytes), so
the training call's cost is that of one step of the seeds on the chip, and

    FLOPs per seed-step = flops / seeds per chip
    bytes per seed-step = bytes accessed / seeds per chip.

A `lax.switch` over the packing buckets counts its most expensive branch (XLA takes the maximum
over a conditional's branches), so a packed step is costed at its largest bucket: an upper
bound on the average step.

The roofline: a step needs at least flops / peak seconds of compute and bytes / bandwidth
seconds of memory traffic; it is memory-bound when the second is larger, i.e. when its
arithmetic intensity (FLOP per byte) is below the chip's ridge point (peak / bandwidth). The
bound on seed-steps/s per chip is 1 / max(compute s, memory s) of one seed-step (the chip runs
its seeds' steps one after another in the same time): what a perfect overlap at the published
peaks would give; measured speeds are lower.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Roofline:
  """Per-seed-step figures of one compiled call on one chip.

  flops, bytes: per seed-step (FLOP, bytes).
  intensity: FLOP per byte moved.
  ridge: the chip's FLOP per byte at which compute and memory take equally long.
  compute_s, memory_s: seconds per seed-step at the peak FLOP/s and at the HBM bandwidth.
  bound: 'memory' or 'compute', whichever takes longer.
  times_over_ridge: ridge / intensity (how far below the ridge; < 1 when compute-bound).
  seed_steps_per_s: the roofline bound on seed-steps/s per chip.
  """

  flops: float
  bytes: float
  intensity: float
  ridge: float
  compute_s: float
  memory_s: float
  bound: str
  times_over_ridge: float
  seed_steps_per_s: float


def per_seed_step(total: float, seeds_per_chip: int, steps_counted: int = 1) -> float:
  """A call's cost per seed-step: `total` (for `steps_counted` steps of `seeds_per_chip` seeds:
  1 for a `lax.scan` loop, whose body the cost analysis counts once) / (seeds x steps).

  Raises:
    ValueError: a seed or step count below 1.
  """
  if seeds_per_chip < 1 or steps_counted < 1:
    raise ValueError(f"seeds per chip ({seeds_per_chip}) and steps counted ({steps_counted}) "
                     f"must be at least 1")
  return float(total) / (seeds_per_chip * steps_counted)


def roofline(flops: float, bytes_moved: float, peak_flops: float,
             bandwidth: float) -> Roofline:
  """The roofline of a seed-step that computes `flops` (FLOP) and moves `bytes_moved` (bytes)
  on a chip of `peak_flops` (FLOP/s) and `bandwidth` (bytes/s).

  Raises:
    ValueError: a non-positive peak, bandwidth or byte count, or negative FLOPs.
  """
  if peak_flops <= 0 or bandwidth <= 0:
    raise ValueError(f"peak ({peak_flops} FLOP/s) and bandwidth ({bandwidth} B/s) must be > 0")
  if bytes_moved <= 0 or flops < 0:
    raise ValueError(f"a step moves > 0 bytes ({bytes_moved}) and computes >= 0 FLOP ({flops})")
  compute_s = flops / peak_flops
  memory_s = bytes_moved / bandwidth
  intensity = flops / bytes_moved
  ridge = peak_flops / bandwidth
  return Roofline(flops=float(flops), bytes=float(bytes_moved), intensity=intensity,
                  ridge=ridge, compute_s=compute_s, memory_s=memory_s,
                  bound="memory" if memory_s > compute_s else "compute",
                  times_over_ridge=ridge / intensity if intensity > 0 else float("inf"),
                  seed_steps_per_s=1.0 / max(compute_s, memory_s))
