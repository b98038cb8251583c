"""Seeds per chip and chip-hours, planned from a few compiles (issue 53 item 4).

Memory: a program's peak on one chip grows linearly with the seeds on it (each seed has its own
parameters, moments, activations and decoder caches; the code, the data and the compiler's
scratch do not grow), so compiling each program at a few seed counts and fitting

    peak(seeds) = constant + per_seed x seeds          (least squares, `fit_memory`)

gives the most seeds that fit a chip (`max_seeds`) without compiling at every count. The peak
is the program's resident peak (`table.resident_peak`: its own buffers plus what the run keeps
on the chip meanwhile), and the training and evaluation programs are fitted apart: the chip
must hold the larger.

Speed: the roofline bound on seed-steps/s per chip of the training call (`roofline`) from its
compiled FLOPs and bytes per seed-step and the chip's published peaks. The cost per seed-step
hardly changes with the seed count, so it is read at one count per depth and interpolated
linearly in depth between the depths compiled (`interpolate`): parameters, and so the traffic,
grow linearly with the layers.

The paper's grid (Murty et al. 2023, arXiv 2305.18741: question formation, tense reinflection and
Dyck, depths 2-10 as this project's sweep runs them, `--depths=2,4,6,8,10`, 10 seeds each,
300k steps; Dyck 400k) in chip-hours: seed-steps / (seed-steps/s per chip) / 3600, a lower
bound (the roofline bound is an upper bound on speed; evaluation, checkpoints and compilation
are not counted).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

# The paper's grid (Murty et al. 2023, as issue 53 states it): steps per task, depths, seeds.
GRID_STEPS = {"question": 300_000, "tense": 300_000, "dyck": 400_000}
GRID_DEPTHS = (2, 4, 6, 8, 10)
GRID_SEEDS = 10


@dataclasses.dataclass(frozen=True)
class MemoryFit:
  """peak bytes on one chip = constant + per_seed x seeds (least squares over the compiles).

  constant, per_seed: bytes.
  seeds, peaks: the compiled seed counts and their peaks (bytes), for the record.
  """

  constant: float
  per_seed: float
  seeds: tuple[int, ...]
  peaks: tuple[float, ...]

  def peak(self, seeds: int) -> float:
    return self.constant + self.per_seed * seeds


def fit_memory(seeds: Sequence[int], peaks: Sequence[float]) -> MemoryFit:
  """Fits peak = constant + per_seed x seeds through the compiled (seeds, peak) points.

  Raises:
    ValueError: fewer than two distinct seed counts, or the lists differ in length.
  """
  if len(seeds) != len(peaks) or len(set(seeds)) < 2:
    raise ValueError(f"a memory fit needs peaks at two or more seed counts, got seeds {list(seeds)}"
                     f" and {len(peaks)} peaks")
  slope, intercept = np.polyfit(np.asarray(seeds, float), np.asarray(peaks, float), 1)
  return MemoryFit(constant=float(intercept), per_seed=float(slope),
                   seeds=tuple(int(s) for s in seeds), peaks=tuple(float(p) for p in peaks))


def max_seeds(fits: Sequence[MemoryFit], capacity: float) -> int:
  """The most seeds per chip whose peak fits `capacity` bytes in every program of `fits`
  (0 when not even one seed fits).

  Raises:
    ValueError: no fit, a non-positive capacity, or a fit whose peak does not grow with seeds.
  """
  if not fits or capacity <= 0:
    raise ValueError(f"need at least one memory fit and a capacity > 0, got {len(fits)} fits and "
                     f"{capacity} bytes")
  most = []
  for fit in fits:
    if fit.per_seed <= 0:
      raise ValueError(f"a peak that does not grow with the seeds ({fit.per_seed:.0f} bytes per "
                       f"seed over seeds {fit.seeds}) cannot size a chip")
    most.append(max(0, math.floor((capacity - fit.constant) / fit.per_seed)))
  return min(most)


def interpolate(depths: Sequence[int], values: Sequence[float], depth: int) -> float:
  """A per-seed-step cost at `depth`, linear in depth through the compiled depths (exact at a
  compiled depth; extrapolated along the end segments outside them).

  Raises:
    ValueError: no depth, or lists of different lengths.
  """
  if not depths or len(depths) != len(values):
    raise ValueError(f"need costs at one or more depths, got depths {list(depths)} and "
                     f"{len(values)} values")
  order = np.argsort(depths)
  d = np.asarray(depths, float)[order]
  v = np.asarray(values, float)[order]
  if len(d) == 1:
    return float(v[0] * depth / d[0])  # one depth: proportional to depth
  i = int(np.clip(np.searchsorted(d, depth) - 1, 0, len(d) - 2))
  return float(v[i] + (v[i + 1] - v[i]) * (depth - d[i]) / (d[i + 1] - d[i]))


def grid_chip_hours(seed_steps_per_s: dict[int, float], steps: int,
                    depths: Sequence[int] = GRID_DEPTHS, seeds: int = GRID_SEEDS) -> float:
  """Chip-hours of one task of the grid: sum over depths of seeds x steps / rate / 3600.

  Args:
    seed_steps_per_s: {depth: seed-steps/s per chip} (e.g. the roofline bound).
    steps: training steps of each run.
    depths: the grid's depths (each must be in `seed_steps_per_s`).
    seeds: seeds per depth.

  Raises:
    ValueError: a depth without a rate, or a rate <= 0.
  """
  total = 0.0
  for depth in depths:
    rate = seed_steps_per_s.get(depth)
    if rate is None or rate <= 0:
      raise ValueError(f"no positive seed-steps/s for depth {depth}: {seed_steps_per_s}")
    total += seeds * steps / rate / 3600.0
  return total


def seeds_to_use(num_seeds: int, chips: int, max_per_chip: int = 0) -> tuple[int, str]:
  """(seed count to use instead, why) when `num_seeds` would leave chips idle or overfill them;
  (num_seeds, '') when it is fine.

  A single-process run puts its seeds on the largest chip count that divides them
  (`sharding.num_seed_devices`), so a count that is not a multiple of `chips` leaves chips idle;
  the count to use is the next multiple of `chips` (within `max_per_chip` per chip when given,
  0 = unknown), else the previous one.

  Raises:
    ValueError: num_seeds or chips < 1.
  """
  if num_seeds < 1 or chips < 1:
    raise ValueError(f"seeds ({num_seeds}) and chips ({chips}) must be at least 1")
  per_chip = math.ceil(num_seeds / chips)
  if max_per_chip and per_chip > max_per_chip:
    return chips * max_per_chip, (f"{num_seeds} seeds need {per_chip} per chip on {chips} chips, "
                                  f"more than the {max_per_chip} that fit")
  if num_seeds % chips == 0:
    return num_seeds, ""
  used = max(d for d in range(1, chips + 1) if num_seeds % d == 0)
  return chips * per_chip, (f"{num_seeds} seeds use {used} of {chips} chips "
                            f"({chips - used} idle)")
