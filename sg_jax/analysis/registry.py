"""The analysis quantities as a registry, and the seed axis they are computed over.

A quantity is one module (`weight_norm`, `attention_entropy`, `tree_projection`, or one of your
own) that calls `register_quantity` with a `Quantity`: the metric groups it offers to
`sg_jax.analyze --metrics` (`Group`: the columns it writes to `analysis.csv`, the inputs it
reads), a `compute` function that takes an `Inputs` and returns those columns for a batch of
seeds, and what `sg_jax.report` plots of it (`Dynamic`). `sg_jax.analyze` and `sg_jax.report`
loop over `quantities()`; nothing else needs an edit (docs/analysis.md, "Adding a quantity").

Every quantity is written for ONE seed's parameters and mapped over the leading seed axis with
`over_seeds` (jit of vmap); `in_seed_chunks` runs a computation a bounded number of seeds at a
time (`--seeds_per_call`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

PyTree = Any

# What `Inputs` can carry (besides params, seeds, groups, config): a group names the ones it reads.
INPUTS = ("meta", "entropy_inputs", "declaratives", "gold_trees", "dependency_lines", "lines",
          "references")
# Sentence inputs -> their key in `sentences_used` of `<analysis.csv>.options.json`, which says how
# many sentences the analysis read (the report names them in its figures).
SENTENCE_INPUTS = {"entropy_inputs": "attention_entropy", "declaratives": "tree_projection"}
# The quantities of sg_jax (each registered by the module `sg_jax.analysis.<name>`), loaded before
# any other and listed first, in this order: the order of their rows in analysis.csv.
BUILTIN = ("weight_norm", "attention_entropy", "tree_projection", "training_dynamics")


@dataclasses.dataclass(frozen=True)
class Group:
  """A metric group: what `--metrics=<name>` computes and the columns it writes.

  Attributes:
    name: the group's name in `--metrics` (unique over all quantities).
    columns: the names of the rows written to analysis.csv, in order; a part in braces varies
      (`attention_entropy_l{layer}_h{head}`). The first is written for every seed and marks a
      (step, seed) as done, so it names no varying part.
    inputs: what it reads besides the parameters, out of `INPUTS`: 'meta' (the checkpoint's
      metadata), 'entropy_inputs' (word ids of the attention-entropy inputs), 'declaratives'
      (word ids of the declarative parts), 'gold_trees' (their gold trees; the task must have
      them), 'dependency_lines' (whole lines with their gold arcs; the task must have them),
      'lines' (word ids of the whole LM lines), 'references' (the parameters of the previous
      and the final checkpoint, `References`).
  """

  name: str
  columns: tuple[str, ...]
  inputs: tuple[str, ...] = ()

  @property
  def marker(self) -> str:
    """The column whose row marks a (step, seed) as done."""
    return self.columns[0]

  def matches(self, column: str) -> bool:
    """Whether `column` is one of this group's columns (braced parts match any text)."""
    return any(re.fullmatch(_pattern(c), column) for c in self.columns)


@functools.lru_cache(maxsize=None)
def _pattern(column: str) -> str:
  return "".join(".+" if part.startswith("{") else re.escape(part)
                 for part in re.split(r"(\{[^}]*\})", column) if part)


@dataclasses.dataclass(frozen=True)
class Dynamic:
  """What the report plots of one analysis column over training.

  Attributes:
    column: the analysis.csv name (a column of one of the quantity's groups).
    axis: y-axis label with units of `dynamics_<column>.png`.
    title: title of that figure.
    label: short name for legends and `summary.md` (default: `column`).
    trajectory_row: row of `trajectories_depth<D>.png` the column is drawn in (1 = the row below
      the accuracies; columns with the same row share it), or None for no row there.
    trajectory_axis: y-axis label of that row (the first column of a row sets it).
    in_summary: a "<label> (final)" column in summary.md (summary.csv has every column).
    reference_for: another column this one is a baseline of (e.g. the right-branching F1 of
      `tparseval_f1`): drawn as a dashed level in that column's figure, with no figure of its own.
    logged_as: the metrics.csv name of the same quantity measured during training (e.g.
      `in_domain/uas`), drawn in `dynamics_<column>.png` for a run whose analysis.csv lacks the
      column, so a fresh run has the figure before `sg_jax.analyze` has run.
  """

  column: str
  axis: str
  title: str
  label: str = ""
  trajectory_row: int | None = None
  trajectory_axis: str = ""
  in_summary: bool = False
  reference_for: str = ""
  logged_as: str = ""

  @property
  def short(self) -> str:
    return self.label or self.column


@dataclasses.dataclass(frozen=True)
class Options:
  """The analysis options of `sg_jax.analyze` that quantities read (its flags of the same name)."""

  method: str = "greedy"
  normalisation: str = "random_split"
  rng_seed: int = 0
  batch_size: int = 8
  entropy_batch_size: int = 64
  seeds_per_call: int | None = None
  uas_min_count: int = 100
  dynamics_lines: int = 256


@dataclasses.dataclass(frozen=True)
class References:
  """The checkpoints a checkpoint is compared with (the `references` input), same seeds.

  Attributes:
    final_step: the run's last checkpoint (when the analysis started).
    final: its parameters for `Inputs.seeds`, leading seed axis [S, ...].
    previous_step: the checkpoint just before the analysed one, or None at the first one.
    previous: its parameters [S, ...], or None at the first checkpoint.
  """

  final_step: int
  final: PyTree
  previous_step: int | None = None
  previous: PyTree | None = None


@dataclasses.dataclass(frozen=True)
class Inputs:
  """What a quantity's `compute` gets for one checkpoint.

  Attributes:
    params: the parameters of the seeds to compute, leading seed axis [S, ...].
    seeds: their seed ids [S].
    groups: names of the quantity's groups to compute (at least one seed misses them).
    config: the model config (`sg_jax.models.transformer.ModelConfig`; max_len covers every input).
    sos_id: id of SOS in the run's vocabulary.
    objective: the run's training objective (`sg_jax.objectives.Objective`: how its lines
      become inputs and scored targets), or None (a causal LM on the stored lines).
    options: the analysis options.
    meta: the checkpoint's metadata (`checkpointing.read_meta`).
    entropy_inputs: word ids (without SOS) of each attention-entropy input, or None when no
      requested group reads them.
    declaratives: word ids (without SOS) of each non-empty declarative part, or None.
    gold_trees: nested-tuple gold trees of the declarative parts, or None.
    dependency_lines: (word ids without SOS of the whole line, its gold arcs `[(dependent,
      head, relation)]` in input positions, `Task.gold_dependencies`) per line, or None.
    lines: word ids (without SOS) of each whole LM line (source + target), or None.
    references: the previous and the final checkpoint's parameters of the same seeds, or None.
  """

  params: PyTree
  seeds: tuple[int, ...]
  groups: frozenset[str]
  config: Any
  sos_id: int
  objective: Any = None
  options: Options = Options()
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  entropy_inputs: Sequence[Sequence[int]] | None = None
  declaratives: Sequence[Sequence[int]] | None = None
  gold_trees: Sequence[Any] | None = None
  dependency_lines: Sequence[tuple] | None = None
  lines: Sequence[Sequence[int]] | None = None
  references: References | None = None


# compute(inputs) -> {column: value per seed [S]}, columns in the order rows are written; a None
# value writes no row (the quantity is undefined for that seed).
Compute = Callable[[Inputs], Mapping[str, Sequence[Any]]]


@dataclasses.dataclass(frozen=True)
class Quantity:
  """One analysis quantity (module docstring).

  Attributes:
    name: unique name (e.g. the module's).
    groups: its metric groups; `compute` returns the columns of those in `Inputs.groups`.
    compute: `Inputs -> {column: [S] values}` for the seeds of `Inputs.params`.
    dynamics: what the report plots (columns of `groups`).
  """

  name: str
  groups: tuple[Group, ...]
  compute: Compute
  dynamics: tuple[Dynamic, ...] = ()

  def group_of(self, column: str) -> Group:
    """The group writing `column`.

    Raises:
      ValueError: no group of this quantity declares the column.
    """
    for group in self.groups:
      if group.matches(column):
        return group
    raise ValueError(f"column {column!r} of quantity {self.name!r} is declared by none of its "
                     f"groups ({[g.columns for g in self.groups]})")


_QUANTITIES: dict[str, Quantity] = {}
_builtins_loaded = False


def _load_builtins() -> None:
  global _builtins_loaded
  if not _builtins_loaded:
    _builtins_loaded = True  # first, as these modules call register_quantity
    for name in BUILTIN:
      importlib.import_module(f"sg_jax.analysis.{name}")


def register_quantity(quantity: Quantity) -> Quantity:
  """Adds a quantity to the registry (after sg_jax's own); returns it.

  Raises:
    ValueError: a name already registered (quantity, group or plotted column), a group without
      columns, an unknown input, or a dynamic of a column no group writes.
  """
  _load_builtins()
  if quantity.name in _QUANTITIES:
    raise ValueError(f"analysis quantity {quantity.name!r} is already registered")
  taken = {g.name for q in _QUANTITIES.values() for g in q.groups}
  plotted = {d.column for q in _QUANTITIES.values() for d in q.dynamics}
  for group in quantity.groups:
    if group.name in taken:
      raise ValueError(f"metric group {group.name!r} of {quantity.name!r} is already registered")
    if not group.columns or "{" in group.marker:
      raise ValueError(f"group {group.name!r} needs a first column without a varying part")
    unknown = set(group.inputs) - set(INPUTS)
    if unknown:
      raise ValueError(f"group {group.name!r} reads unknown inputs {sorted(unknown)}; "
                       f"choose from {INPUTS}")
    taken.add(group.name)
  for dynamic in quantity.dynamics:
    quantity.group_of(dynamic.column)
    if dynamic.column in plotted:
      raise ValueError(f"column {dynamic.column!r} is already plotted by another quantity")
  _QUANTITIES[quantity.name] = quantity
  return quantity


def load_modules(names: Sequence[str]) -> None:
  """Imports modules that register their own quantities (the `--modules` flag of
  `sg_jax.analyze` and `sg_jax.report`).

  Raises:
    ValueError: a module cannot be imported, naming it and the cause.
  """
  _load_builtins()
  for name in names:
    try:
      importlib.import_module(name)
    except ImportError as e:
      raise ValueError(f"cannot import --modules entry {name!r}: {e}") from None


def unregister_quantity(name: str) -> None:
  """Removes a registered quantity (for tests that register their own).

  Raises:
    KeyError: no quantity of that name.
  """
  _load_builtins()
  if name not in _QUANTITIES:
    raise KeyError(f"no analysis quantity {name!r}; registered: {list(_QUANTITIES)}")
  del _QUANTITIES[name]


def quantities() -> tuple[Quantity, ...]:
  """The registered quantities: sg_jax's own (`BUILTIN` order), then others as registered."""
  _load_builtins()
  rank = {name: i for i, name in enumerate(BUILTIN)}
  order = sorted(enumerate(_QUANTITIES), key=lambda x: (rank.get(x[1], len(rank)), x[0]))
  return tuple(_QUANTITIES[name] for _, name in order)


def group_names() -> tuple[str, ...]:
  """Every metric group, in registration order."""
  return tuple(g.name for q in quantities() for g in q.groups)


def dynamics() -> dict[str, Dynamic]:
  """{column: Dynamic} of every plotted column, in registration order."""
  return {d.column: d for q in quantities() for d in q.dynamics}


def group_inputs(column: str) -> tuple[str, ...]:
  """The inputs read by the group writing `column` (() for a column of no quantity)."""
  for q in quantities():
    for group in q.groups:
      if group.matches(column):
        return group.inputs
  return ()


# --------------------------------------------------------------------------------------------
# The seed axis
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def over_seeds(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` mapped over a leading seed axis of its first argument, jitted.

  `fn(params, *args, **kwargs)` is written for ONE seed's parameters. The returned function
  takes parameters with a leading seed axis [S, ...], gives every seed the same positional
  `args` (arrays or pytrees, None allowed), treats the keyword-only arguments of `fn` as static
  (hashable: configs, option strings) and returns `fn`'s outputs with a leading [S] axis. It is
  cached per `fn`, so every call site shares one compilation cache.

  Args:
    fn: the per-seed function.

  Returns:
    the jitted, seed-vmapped function.
  """
  static = tuple(name for name, p in inspect.signature(fn).parameters.items()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY)

  @functools.partial(jax.jit, static_argnames=static)
  def mapped(params_S, *args, **kwargs):
    one = functools.partial(fn, **kwargs)
    return jax.vmap(one, in_axes=(0,) + (None,) * len(args))(params_S, *args)

  mapped.__doc__ = f"`{fn.__name__}` over a leading seed axis (`registry.over_seeds`)."
  mapped.__name__ = f"{fn.__name__}_over_seeds"
  return mapped


def accumulate(total: Mapping[str, Any] | None, stats: Mapping[str, Any]) -> dict[str, Any]:
  """Adds a batch's sums to the running ones entry by entry (`total=None`: the first batch)."""
  if total is None:
    return dict(stats)
  return {k: total[k] + stats[k] for k in total}


def num_seeds(params_S: PyTree) -> int:
  """S, the leading axis of a parameter pytree.

  Raises:
    ValueError: the pytree has no leaves.
  """
  leaves = jax.tree_util.tree_leaves(params_S)
  if not leaves:
    raise ValueError("the parameter pytree has no leaves")
  return int(leaves[0].shape[0])


def in_seed_chunks(fn: Callable[[PyTree], Any], params_S: PyTree,
                   seeds_per_call: int | None = None) -> Any:
  """Runs `fn` on at most `seeds_per_call` seeds at a time and joins the results on the host.

  Bounds the memory of computations whose size grows with the number of seeds.

  Args:
    fn: params [s, ...] -> a dict / list / tuple of arrays with a leading [s] axis (nested).
    params_S: parameters with a leading seed axis [S, ...].
    seeds_per_call: seeds per call (None or 0 = all at once).

  Returns:
    `fn`'s structure with numpy arrays concatenated over the seed axis [S, ...].

  Raises:
    ValueError: seeds_per_call < 0.
  """
  if seeds_per_call is not None and seeds_per_call < 0:
    raise ValueError(f"seeds_per_call must be >= 0, got {seeds_per_call}")
  total = num_seeds(params_S)
  step = seeds_per_call or total
  outs = [fn(jax.tree_util.tree_map(lambda x: x[s:s + step], params_S))
          for s in range(0, total, step)]
  return _concatenate(outs)


def _concatenate(parts: list[Any]) -> Any:
  first = parts[0]
  if isinstance(first, dict):
    return {k: _concatenate([p[k] for p in parts]) for k in first}
  if isinstance(first, (list, tuple)):
    return type(first)(_concatenate([p[i] for p in parts]) for i in range(len(first)))
  return np.concatenate([np.asarray(p) for p in parts])
