"""The registry of training-time evaluators (docs/evaluation.md "Adding an evaluator").

An evaluator is one module with a registered `Evaluator` subclass: a frozen dataclass whose
fields are its options, each with a default. Its config section `config.evals.<name>` is built
from those defaults (`sections`, called by `configlib.base_config`), so adding an evaluator
never edits the base config; `config.evals.<name>.enabled=False` switches one off. The training
loop (`sg_jax.train`) and the run's evaluation (`sg_jax.evaluation.evaluator.run_evaluations`) name no
evaluator: they build every enabled one (`enabled_from_config`) and merge what each returns.

The interface an evaluator sees (small on purpose, so that another model or objective plugs
in without editing the evaluators):

* `Evaluator.build(context) -> Evaluation | None`: builds its batches from the run's data and
  its compiled function; None when it has nothing to evaluate for this run (e.g. a task
  without gold dependencies).
* `Context`: the run's task, vocabulary, model, objective, held-out splits, data folder,
  shared options (`EvalOptions`) and `put` (host arrays -> arrays on the run's devices,
  replicated over the seed mesh).
* `Evaluation.evaluate(params [S, ...], progress) -> {split: {metric: float [S]}}`: called at
  every evaluation; each metric is logged as `<split>/<metric>` in metrics.csv.
  `Evaluation.programs` (optional) names the jitted functions it calls (`Program`), so that
  `sg_jax.aot` compiles them for an accelerator with no edit of its own.
* Through `Context`, evaluators use the model and the objective only as: `model.apply({'params':
  p}, tokens [B, L], deterministic=True) -> logits [B, L, V]`; `objective.lines` (inputs and
  targets as the objective lays them out), `objective.line_losses` (the objective's own loss, as
  per-line sums), `objective.sentence_scores` (log-probability of an output given its input),
  `objective.teacher_forced_metrics` / `metric_names`; and greedy decoding
  (`sg_jax.evaluation.decoding.greedy_decode`). A model or objective providing these is evaluated as is.

This module imports no JAX: config files build the `evals` sections from it before JAX starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, NamedTuple

import ml_collections


@dataclasses.dataclass(frozen=True)
class EvalOptions:
  """The options every evaluator shares (the run config's `eval` section).

  Attributes:
    batch_size: lines per evaluation batch (per seed).
    max_lines: lines evaluated per held-out split (0 = all).
    kv_cache: tasks that decode decode with the key/value cache (False: one full forward pass
      per decoded token, the same tokens).
  """

  batch_size: int = 250
  max_lines: int = 0
  kv_cache: bool = True

  @classmethod
  def from_config(cls, config) -> "EvalOptions":
    """The shared evaluation options of a run config (its `eval` section)."""
    e = config.eval
    return cls(batch_size=int(e.batch_size), max_lines=int(e.max_lines),
               kv_cache=bool(e.kv_cache))


@dataclasses.dataclass(frozen=True)
class Context:
  """What an evaluator builds from (one run; see the module docstring for how it is used).

  Attributes:
    task: the run's `tasks.Task`.
    vocab: the task's vocabulary (`tasks.vocab.Vocab`).
    model: the model (`model.TransformerLM`): `apply({'params': p}, tokens, deterministic=True)`.
    objective: the run's `objectives.Objective`.
    splits: {'in_domain': EncodedSplit, 'out_of_domain': EncodedSplit}, the held-out data.
    data_dir: the folder of the run's split files (`tasks.io.run_data_dir`).
    options: the shared options (`EvalOptions`).
    put: host arrays (a pytree) -> the same on the run's devices, replicated over the seeds'
      mesh (`sharding.put_replicated`).
  """

  task: Any
  vocab: Any
  model: Any
  objective: Any
  splits: dict
  data_dir: str
  options: EvalOptions
  put: Callable[[Any], Any]


class Program(NamedTuple):
  """One jitted function of an evaluation as `evaluate` calls it: what `sg_jax.aot` compiles
  for an accelerator without running it (docs/performance.md, "Compiling for TPU and GPU ahead
  of time").

  Attributes:
    name: what one call evaluates, e.g. 'in_domain (64 lines/batch)' (`sg_jax.aot` names the
      row 'eval <evaluator> <name>').
    fn: the jitted function, `fn(params [S, ...], *args, **static)`.
    args: the arguments after the parameters of one call: a tuple of pytrees whose leaves have
      `shape` and `dtype` (the arrays `Context.put` made, or `jax.ShapeDtypeStruct`s of a slice
      of them).
    static: its static keyword arguments (None: none).
    calls: calls of `fn` per evaluation (its batches).
  """

  name: str
  fn: Callable
  args: tuple
  static: dict | None = None
  calls: int = 1


class Evaluation(NamedTuple):
  """A built evaluation (`Evaluator.build`).

  Attributes:
    evaluate: `(params [S, ...], progress) -> {split: {metric: float [S]}}`; `progress` is the
      run's `evaluation.ProgressLog` (call `progress.update(lines, split)` after each batch of
      held-out lines counted in `lines`, or `progress.note(text)` before a long stage).
    lines: the lines `evaluate` reports to `progress.update` (0: none).
    describe: `(num_seeds, first) -> text` for the line logged before a long or first
      evaluation (`first`: the first evaluation of the run); None: nothing to say.
    programs: `() -> tuple[Program, ...]`, the jitted functions `evaluate` calls, one per
      distinct shape (called only by `sg_jax.aot`, so a run pays nothing for it); None: the
      evaluation declares none, and `sg_jax.aot` says it compiled nothing of it.
  """

  evaluate: Callable
  lines: int = 0
  describe: Callable[[int, bool], str] | None = None
  programs: Callable[[], tuple] | None = None


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """Base class of the training-time evaluators (a subclass is a frozen dataclass whose fields
  are its options, each with a default; `enabled` is every evaluator's).

  Class attributes:
    name: the config section `evals.<name>` that configures it.
    legacy_fields: {option: leaf of the `eval` section} for options that were once `eval.*`
      fields: the old name stays in the config, linked to `evals.<name>.<option>` (setting
      either sets both), so old command lines and configs keep working.
  """

  name: ClassVar[str] = ""
  legacy_fields: ClassVar[dict[str, str]] = {}

  enabled: bool = True

  def check(self) -> None:
    """Raises ValueError (one line, without the field prefix) on bad options; default none.
    Override with e.g. `if self.lines < 0: raise ValueError('lines must be >= 0')`."""

  def build(self, context: Context) -> Evaluation | None:
    """The evaluation of one run, or None when it has nothing to evaluate."""
    raise NotImplementedError(f"evaluator {self.name!r} does not define build()")


_REGISTRY: dict[str, type[Evaluator]] = {}


def register(cls: type[Evaluator]) -> type[Evaluator]:
  """Registers an evaluator class under `cls.name` (usable as a class decorator). Evaluators
  run, and their metrics are written, in registration order.

  Raises:
    ValueError: no name, an option without a default, or the name is taken by another class
      (a class of the same module and name, e.g. a module loaded again, replaces its earlier
      self).
  """
  if not cls.name:
    raise ValueError(f"evaluator class {cls.__name__} has no name")
  for field in dataclasses.fields(cls):
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
      raise ValueError(f"evaluator {cls.name!r}: option {field.name!r} has no default")
  old = _REGISTRY.get(cls.name, cls)
  if (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
    raise ValueError(f"evaluator {cls.name!r} is already registered ({old})")
  _REGISTRY[cls.name] = cls
  return cls


def unregister(name: str) -> None:
  """Removes a registered evaluator (tests that register a toy one clean up with it)."""
  _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
  """The registered evaluators' names, in registration order."""
  return tuple(_REGISTRY)


def sections(eval_section: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The `evals` config section: one sub-section per registered evaluator, from its declared
  defaults. An option with a legacy `eval.*` name is one field with two names: both hold the
  same `FieldReference`, created in `eval_section` when absent there.

  Args:
    eval_section: the config's `eval` section (receives the legacy names).
  """
  out = ml_collections.ConfigDict()
  for name, cls in _REGISTRY.items():
    section = ml_collections.ConfigDict()
    for field in dataclasses.fields(cls):
      default = (field.default if field.default is not dataclasses.MISSING
                 else field.default_factory())
      legacy = cls.legacy_fields.get(field.name)
      if legacy is None:
        section[field.name] = default
        continue
      if legacy not in eval_section:
        eval_section[legacy] = ml_collections.FieldReference(default)
      section[field.name] = eval_section.get_ref(legacy)
    out[name] = section
  return out


def from_config(config, name: str) -> Evaluator:
  """The evaluator `name` with the options of a run config (`config.evals.<name>`).

  Raises:
    ValueError: one line naming the bad field (`invalid config: evals.<name>...`).
  """
  cls = _REGISTRY[name]
  evals = config.get("evals", None)
  if evals is None or name not in evals:  # a config from before the evals sections
    options = {f: config.eval[leaf] for f, leaf in cls.legacy_fields.items()
               if "eval" in config and leaf in config.eval}
  else:
    section = evals[name]
    options = dict(section.items()) if hasattr(section, "items") else {}
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(options) - known)
  if unknown:
    raise ValueError(f"invalid config: evals.{name}.{unknown[0]} is not an option of evaluator "
                     f"{name!r} (its options: {', '.join(sorted(known))})")
  try:
    evaluator = cls(**options)
    evaluator.check()
  except (TypeError, ValueError) as e:
    raise ValueError(f"invalid config: evals.{name}: {e} (got {options})") from None
  return evaluator


def validate(config) -> None:
  """Checks the `evals` section of a run config: every sub-section names a registered
  evaluator and holds valid options.

  Raises:
    ValueError: one line naming the section (an unknown evaluator lists the registered ones).
  """
  evals = config.get("evals", None)
  for name in (evals or {}):
    if name not in _REGISTRY:
      raise ValueError(f"invalid config: evals.{name} is not a registered evaluator "
                       f"(registered: {', '.join(_REGISTRY)}; docs/evaluation.md says how to "
                       f"add one)")
  for name in _REGISTRY:
    from_config(config, name)


def enabled_from_config(config) -> list[Evaluator]:
  """The run's evaluators (registration order) that are switched on, each with its options
  (the evaluators' typed options, built once at the top of the loop).

  Raises:
    ValueError: as `validate`.
  """
  validate(config)
  return [e for e in (from_config(config, name) for name in _REGISTRY) if e.enabled]
