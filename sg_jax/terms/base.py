"""Loss terms added to the training objective: `loss = objective loss + sum_t lambda_t(step) *
penalty_t` (docs/objectives.md "Loss terms: the fields every term has").

A term is a small frozen (hashable) object registered under a name; its config section
`config.<name>` holds the generic per-seed fields every term has, read here once for all terms:

* `lambdas`: the strength, one value for all seeds or one per seed (`per_seed.values`);
* `starts`, `ends`: each seed's step window [start, end) (end 0 = until the end of training);
  outside its window a seed's lambda is 0. The window changes only the loss, never the
  learning-rate schedule.

plus the term's own options (read by its `from_section`). A term whose lambdas are all 0 is not
built at all, so such a run is bit-identical to a run without the term. Each active term adds
`train/<name>_loss` to metrics.csv: its penalty (without lambda) averaged over the steps since
the last log. Several terms may be active at once; they run through the one training body.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sg_jax.config import per_seed
from sg_jax.runtime import sharding

Array = jax.Array

GENERIC_FIELDS = ("lambdas", "starts", "ends")
NO_END = np.iinfo(np.int32).max


@dataclasses.dataclass(frozen=True)
class LossTerm:
  """Base class of the loss terms (a subclass is a frozen dataclass of its static options).

  Class attributes:
    name: the config section (`config.<name>`) and the metric `train/<name>_loss`.
    needs_intermediates: the penalty reads the forward pass's sown intermediates (attention
      probabilities, ...: `model.INTERMEDIATES`); the step then runs the model with that
      collection mutable.
  """

  name: ClassVar[str] = ""
  needs_intermediates: ClassVar[bool] = True

  @classmethod
  def default_section(cls) -> ml_collections.ConfigDict:
    """The term's config section with lambda 0 (off): the generic fields, then its options
    with the defaults its dataclass fields declare (in declaration order).

    Raises:
      TypeError: an option without a default.
    """
    section = ml_collections.ConfigDict({"lambdas": (0.0,), "starts": (0,), "ends": (0,)})
    for field in dataclasses.fields(cls):
      if field.default is dataclasses.MISSING:
        raise TypeError(f"loss term {cls.name!r}: option {field.name!r} declares no default "
                        "(its config section needs one)")
      section[field.name] = field.default
    return section

  @classmethod
  def from_section(cls, section: ml_collections.ConfigDict) -> "LossTerm":
    """The term's static options from its config section (override to read them)."""
    del section
    return cls()

  def check(self, config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming a bad field of the term's options or the run (override)."""
    del config

  def train_arrays(self, task, examples: list, length: int) -> dict[str, np.ndarray]:
    """Per-line arrays the penalty reads, added to the training data (default: none).

    Args:
      task: the run's `tasks.base.Task`.
      examples: the training set's examples, row i of the training arrays = examples[i].
      length: the training arrays' padded length L.

    Returns:
      {name: array [num_lines, ...]}; names must not clash with other terms'.
    """
    del task, examples, length
    return {}

  def penalty(self, params: Any, sown: Any, data: dict, idx_B: Array, model_config) -> Array:
    """The penalty of one seed's batch (float32 []), without lambda.

    Args:
      params: the seed's parameters (differentiated through).
      sown: the forward pass's `model.INTERMEDIATES` collection (None unless
        `needs_intermediates`).
      data: the training data on device (with this term's `train_arrays`).
      idx_B: int32 [batch] the lines of this step (rows of `data`).
      model_config: the `model.ModelConfig` of the run.
    """
    raise NotImplementedError


_REGISTRY: dict[str, type[LossTerm]] = {}


def register(cls: type[LossTerm]) -> type[LossTerm]:
  """Registers a loss-term class under `cls.name` (usable as a class decorator).

  Raises:
    ValueError: no name, or the name is taken by another class (a class of the same module
      and name, e.g. a config file loaded again, replaces its earlier self).
  """
  if not cls.name:
    raise ValueError(f"loss term class {cls.__name__} has no name")
  old = _REGISTRY.get(cls.name, cls)
  if (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
    raise ValueError(f"loss term {cls.name!r} is already registered ({_REGISTRY[cls.name]})")
  _REGISTRY[cls.name] = cls
  return cls


def names() -> tuple[str, ...]:
  """The registered terms' names, in registration order (the order terms are added in)."""
  return tuple(_REGISTRY)


def _lambdas(section) -> tuple:
  return per_seed.as_tuple(section.get("lambdas", (0.0,)))


def active(config: ml_collections.ConfigDict) -> tuple[LossTerm, ...]:
  """The terms of a run: those registered whose config section has a nonzero lambda, in
  registration order."""
  out = []
  for name, cls in _REGISTRY.items():
    section = config.get(name)
    if section is not None and any(float(x) != 0.0 for x in _lambdas(section)):
      out.append(cls.from_section(section))
  return tuple(out)


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks every registered term's section present in `config`: the generic per-seed fields
  (one value or one per seed; windows >= 0), then the term's own `check`.

  Raises:
    ValueError: naming the bad `<term>.<field>`.
  """
  n = int(config.num_seeds)
  for name, cls in _REGISTRY.items():
    section = config.get(name)
    if section is None:
      continue
    for field in GENERIC_FIELDS:
      per_seed.values(section.get(field, (0,)), n, f"{name}.{field}")
    windows = per_seed.as_tuple(section.get("starts", (0,))) + per_seed.as_tuple(
        section.get("ends", (0,)))
    if any(int(x) < 0 for x in windows):
      raise ValueError(f"invalid config: {name}.starts and {name}.ends must be >= 0 (end 0 = "
                       "no end)")
    cls.from_section(section).check(config)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """One term's per-seed strengths and step windows: its section's generic fields, resolved
  for S seeds (`schedules_from_config`).

  Attributes:
    lambdas: float32 [S] the strengths.
    starts: int32 [S] each seed's first step.
    ends: int32 [S] each seed's end (exclusive), `NO_END` for the section's 0.
  """

  lambdas: np.ndarray
  starts: np.ndarray
  ends: np.ndarray


def schedules_from_config(config: ml_collections.ConfigDict) -> dict[str, Schedule]:
  """{name: Schedule} of every active term (`active`) of a resolved run config, built once at
  the top of a run.

  Raises:
    ValueError: a field with a wrong number of values (naming `<term>.<field>`).
  """
  out = {}
  for term in active(config):
    n, section = int(config.num_seeds), config[term.name]
    ends = per_seed.array(section.get("ends", (0,)), n, f"{term.name}.ends", np.int64)
    out[term.name] = Schedule(
        lambdas=per_seed.array(_lambdas(section), n, f"{term.name}.lambdas", np.float32),
        starts=per_seed.array(section.get("starts", (0,)), n, f"{term.name}.starts", np.int32),
        ends=np.where(ends == 0, NO_END, ends).astype(np.int32))
  return out


def seed_arrays(term: LossTerm, schedule: Schedule) -> dict[str, np.ndarray]:
  """{'<name>_lambda': float32 [S], '<name>_start', '<name>_end': int32 [S]}: one term's
  `schedule` as the training data carries it (`lambdas_at` reads it)."""
  return {f"{term.name}_lambda": schedule.lambdas, f"{term.name}_start": schedule.starts,
          f"{term.name}_end": schedule.ends}


def train_arrays(terms: tuple[LossTerm, ...], schedules: dict[str, Schedule], task,
                 examples: list | Callable[[], list], length: int,
                 num_lines: int | None = None) -> dict[str, np.ndarray]:
  """Everything the active terms add to the training data: each term's per-line arrays and its
  per-seed strengths and windows ({} without active terms).

  Args:
    terms: the run's active terms (`active`).
    schedules: their per-seed strengths and windows (`schedules_from_config`).
    task: the run's task.
    examples: the training set's examples (`composition.training_examples`), row for row, or
      a function returning them (called only when a term is active).
    length: the training arrays' padded length.
    num_lines: the training arrays' rows, checked against `examples` (None: not checked).

  Raises:
    ValueError: the examples do not cover `num_lines` rows, or a term's own refusal (e.g. SAS
      on a task without gold dependencies).
  """
  if not terms:
    return {}
  if callable(examples):
    examples = examples()
  if num_lines is not None and len(examples) != num_lines:
    raise ValueError(f"the loss terms' arrays cover {len(examples)} training lines but the "
                     f"training set has {num_lines}")
  out = {}
  for term in terms:
    out.update(term.train_arrays(task, examples, length))
    out.update(seed_arrays(term, schedules[term.name]))
  return out


def lambdas_per_seed(schedules: dict[str, Schedule]) -> dict[str, np.ndarray]:
  """{'<term>.lambda': float32 [S]} each active term's strength per seed (`schedules`; the
  closing table of a run, `metric_logging.format_summary`)."""
  return {f"{name}.lambda": schedule.lambdas for name, schedule in schedules.items()}


def lambdas_at(data: dict, term: LossTerm, num_local: int, step: Array) -> Array:
  """float32 [num_local]: each local seed's lambda of `term` at `step` (0 outside its window).

  Under `sharding.per_device` a device holds a block of seeds while the per-seed arrays of
  `data` hold every seed, so the block's offset comes from the device's index on the seed axis.
  """
  lam, start, end = (data[f"{term.name}_{k}"] for k in ("lambda", "start", "end"))
  offset = 0
  if lam.shape[0] != num_local:
    offset = jax.lax.axis_index(sharding.SEED_AXIS) * num_local
  idx = offset + jnp.arange(num_local)
  lam, start, end = lam[idx], start[idx], end[idx]
  return jnp.where((step >= start) & (step < end), lam, 0.0)


def sum_name(term: LossTerm) -> str:
  """The key of the term's running penalty sum in `TrainState.sums` ('<name>_loss')."""
  return f"{term.name}_loss"
