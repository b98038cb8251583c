"""What the claims read from runs (`report.reading.Run`): arms of seeds and per-seed values.

Per-seed values are read as the report reads them (`report.tables`): "final" = the seed's last
finite value; saturation = the first evaluation with in-domain accuracy >= `SATURATION`.
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

import numpy as np

from sg_jax.report import groups as groups_lib
from sg_jax.report import objectives as objectives_lib
from sg_jax.report import tables
from sg_jax.report.reading import GEN_ACC, IN_ACC, Run

SATURATION = 0.99
TASK_LABELS = {"question": "question formation", "tense": "tense reinflection", "dyck": "Dyck"}


def finite(values) -> np.ndarray:
  """The finite entries of `values` as float64 [n]."""
  v = np.asarray(values, np.float64).ravel()
  return v[np.isfinite(v)]


def comparable(*arms) -> bool:
  """Whether every arm has at least 2 finite values (a two-sample test needs them)."""
  return all(finite(a).size >= 2 for a in arms)


def task_label(task: str) -> str:
  return TASK_LABELS.get(task, task or "unknown task")


def final(run: Run, name: str, seed: int) -> float:
  """The last finite value of `seed`'s `name` series (NaN: none)."""
  curve = run.series.get(name, {}).get(seed)
  return math.nan if curve is None else tables.final_value(*curve)[1]


def value_at(run: Run, name: str, seed: int, step: int | None) -> float:
  """`seed`'s `name` at the first logged step >= `step` with a finite value (NaN: none)."""
  curve = run.series.get(name, {}).get(seed)
  if curve is None or step is None:
    return math.nan
  steps, values = curve
  keep = np.isfinite(values) & (steps >= step)
  return float(values[keep][0]) if keep.any() else math.nan


def saturation(run: Run, seed: int) -> int | None:
  """First step of `seed` with in-domain accuracy >= `SATURATION` (None: never)."""
  return tables.saturation_step(run, seed, SATURATION)


def early_stop(run: Run, seed: int) -> float:
  """Generalisation at the first-best in-domain checkpoint (`tables.early_stopping`, exact
  ties; NaN without both series)."""
  in_curve = run.series.get(IN_ACC, {}).get(seed)
  gen_curve = run.series.get(GEN_ACC, {}).get(seed)
  if in_curve is None or gen_curve is None:
    return math.nan
  return tables.early_stopping(*in_curve, *gen_curve, "first")[1]


def is_plain(run: Run) -> bool:
  """A run of the default objective whose seeds all share one config (no seed groups) and no
  loss term is switched on: a depth sweep's run."""
  if groups_lib.per_seed_fields(run.config) or objectives_lib.objective_of(run) != "lm":
    return False
  return all(float(x) == 0.0 for section in run.config.values()
             if isinstance(section, dict) and "lambdas" in section
             for x in np.atleast_1d(section["lambdas"]))


# Murty et al.'s claims are about long training: 300k steps against in-domain saturation within
# the first ~10k (docs/REFERENCE.md §1); grok_cpu trains 15x its saturation step. A run that stops
# soon after saturation (a dense onset run of 3k steps) says nothing about them.
LONG_TRAINING = 5


def long_enough(run: Run) -> bool:
  """Whether `run` trained at least `LONG_TRAINING` times its median saturation step (over the
  seeds that saturated; a run where none saturated counts: its seeds never generalised in
  domain, which the claims' own rules handle)."""
  sat = [s for s in (saturation(run, seed) for seed in run.series.get(IN_ACC, {}))
         if s is not None]
  if not sat:
    return True
  last = max(int(steps[-1]) for steps, _ in run.series[IN_ACC].values() if steps.size)
  return last >= LONG_TRAINING * max(float(np.median(sat)), 1.0)


def depth_arms(runs: Sequence[Run]) -> dict[str, dict[int, list[tuple[Run, int]]]]:
  """{task: {depth: [(run, seed)]}} of the plain runs (`is_plain`) that logged generalisation
  and trained long after saturation (`long_enough`), depths sorted; runs of unknown depth left
  out."""
  out: dict = collections.defaultdict(lambda: collections.defaultdict(list))
  for run in runs:
    if (run.depth is None or not is_plain(run) or not run.series.get(GEN_ACC)
        or not long_enough(run)):
      continue
    for seed in sorted(run.series[GEN_ACC]):
      out[run.task][int(run.depth)].append((run, seed))
  return {task: dict(sorted(by_depth.items())) for task, by_depth in sorted(out.items())}


def depth_setting(task: str, depths: Sequence[int]) -> str:
  return f"{task_label(task)}, depth{'s' if len(depths) > 1 else ''} " + "/".join(
      map(str, depths))


def per_seed_values(run: Run, field: str) -> dict[int, object] | None:
  """{seed: value} of a per-seed config field (dotted, e.g. "sas.lambdas"), None when the run
  does not vary it per seed."""
  fields = groups_lib.per_seed_fields(run.config)
  if field not in fields:
    return None
  first = int(run.config.get("first_seed", 0))
  return {first + k: v for k, v in enumerate(fields[field])}


def field_value(run: Run, field: str, seed: int):
  """The value of a config field (dotted) for `seed`: its per-seed entry, or the one value."""
  per_seed = per_seed_values(run, field)
  if per_seed is not None:
    return per_seed.get(seed)
  value = run.config
  for key in field.split("."):
    value = value.get(key, {}) if isinstance(value, dict) else {}
  if isinstance(value, (list, tuple)):
    return value[0] if value else None
  return value if value != {} else None


def unregularised(run: Run, seeds) -> list[int]:
  """The `seeds` of `run` whose every loss term (each config section with `lambdas`: `sas`,
  `tree`, ...) has strength 0, given once or per seed."""
  sections = [name for name, section in run.config.items()
              if isinstance(section, dict) and "lambdas" in section]
  return [s for s in seeds
          if all(float(field_value(run, f"{name}.lambdas", s) or 0.0) == 0.0
                 for name in sections)]
