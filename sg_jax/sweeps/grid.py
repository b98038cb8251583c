"""A grid over config fields, expanded into training jobs and per-seed values of each job.

`python -m sg_jax.sweep --grid=model.num_layers=4,6 --grid=optim.weight_decay=0,0.1,1 --seeds=4`
is the grid {num_layers: (4, 6)} x {weight_decay: (0, 0.1, 1)}. A field that can take one value
per seed (`seed_axis_fields`: the scalar hyperparameters of `per_seed.HPARAM_FIELDS`, the
initialisation and data seeds `per_seed.SEED_FIELDS`, the data composition
`composition.FIELDS`, every loss term's strengths and windows `terms.base.GENERIC_FIELDS`) goes
onto the seed axis of one job: each of its grid points gets `seeds` seeds, side by side in one
compiled program (docs/usage.md "Per-seed hyperparameters and split seeds"). Every other field
(the depth, width, heads, feed-forward width, training-set size, step counts, ...: anything that
may change array shapes or the compiled program) makes separate jobs, one per combination.

Seed layout of a job with seed-axis fields F_1..F_m of n_1..n_m values and `seeds` = R: seed
position k = c * R + r, where c indexes the combination of values (row-major over F_1..F_m in
the order the grid names them, the last field fastest) and r the replicate, so the R seeds of
one grid point are contiguous. Each F_i is then passed to its job as one value per seed (a tuple
of n_1 * ... * n_m * R values).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any, Mapping, Sequence

from sg_jax import configlib
from sg_jax import terms
from sg_jax.config import per_seed
from sg_jax.data import composition
from sg_jax.terms import base as terms_base

DEPTH_FIELD = "model.num_layers"


def seed_axis_fields() -> tuple[str, ...]:
  """The dotted config fields that take one value per seed, so that a grid over them goes onto
  the seed axis of one job (module docstring): `per_seed.HPARAM_FIELDS`,
  `per_seed.SEED_FIELDS`, `data.<composition.FIELDS>` and `<term>.<lambdas|starts|ends>` of
  every registered loss term (`terms.names()`)."""
  return (tuple(per_seed.HPARAM_FIELDS) + tuple(per_seed.SEED_FIELDS)
          + tuple(f"data.{name}" for name in composition.FIELDS)
          + tuple(f"{term}.{field}" for term in terms.names()
                  for field in terms_base.GENERIC_FIELDS))


def split_top_level(text: str) -> list[str]:
  """Splits `text` at the commas outside brackets and quotes: '0,(1,2),"a,b"' ->
  ['0', '(1,2)', '"a,b"'] (items stripped)."""
  items, depth, quote, start = [], 0, None, 0
  for i, ch in enumerate(text):
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      items.append(text[start:i].strip())
      start = i + 1
  items.append(text[start:].strip())
  return items


def parse_axis(text: str) -> tuple[str, tuple]:
  """'optim.weight_decay=0,0.1,1' -> ('optim.weight_decay', (0, 0.1, 1)): values as Python
  literals (`configlib._parse_value`: numbers, true/false, tuples; anything else a string).

  Raises:
    ValueError: no '=', an empty field name, an empty value, or a value named twice.
  """
  text = text.strip()
  if text.startswith("--config."):
    text = text[len("--config."):]
  field, sep, rest = text.partition("=")
  field = field.strip()
  if not sep or not field:
    raise ValueError(f"--grid must look like section.field=v1,v2,..., got {text!r}")
  raw = split_top_level(rest)
  if any(not r for r in raw):
    raise ValueError(f"--grid {field}: an empty value in {rest!r}")
  # pylint: disable-next=protected-access
  values = tuple(configlib._parse_value(r) for r in raw)
  if len({repr(v) for v in values}) != len(values):
    raise ValueError(f"--grid {field}: a value is named twice in {rest!r}")
  return field, values


def parse_grid(texts: Sequence[str], depths: Sequence[int] | None = None
               ) -> list[tuple[str, tuple]]:
  """The grid's axes [(field, values)] in the order given: `depths` (the `--depths` shorthand
  for `model.num_layers`) first, then each `--grid` text (`parse_axis`).

  Raises:
    ValueError: a bad text (`parse_axis`), a field named twice (`--depths` and a
      model.num_layers axis included), or a depth that is not a positive integer.
  """
  axes = [(DEPTH_FIELD, tuple(depths))] if depths else []
  axes += [parse_axis(t) for t in texts]
  seen = set()
  for field, values in axes:
    if len({repr(v) for v in values}) != len(values):
      raise ValueError(f"--grid {field}: a value is named twice in {list(values)}")
    if field in seen:
      raise ValueError(f"--grid names {field} twice" + (" (--depths is model.num_layers)"
                                                          if field == DEPTH_FIELD else ""))
    seen.add(field)
    if field == DEPTH_FIELD and not all(isinstance(v, int) and not isinstance(v, bool)
                                        and v >= 1 for v in values):
      raise ValueError(f"depths (model.num_layers) must be positive integers, got "
                       f"{list(values)}")
  return axes


@dataclasses.dataclass(frozen=True)
class Job:
  """One training job of a grid.

  Attributes:
    job_values: {job-axis field: its value}, in grid order.
    seed_values: {seed-axis field: tuple of one value per seed, [num_seeds]}, in grid order.
    points: per seed position k (0-based; the seed id is the config's first_seed + k), the
      {seed-axis field: value} of its grid point, [num_seeds].
    num_seeds: seeds of the job (replicates per grid point x seed-axis grid points).
  """

  job_values: dict
  seed_values: dict
  points: tuple
  num_seeds: int

  @property
  def name(self) -> str:
    """The job's workdir name (`job_name`)."""
    return job_name(self.job_values)

  @property
  def key(self) -> str:
    """The job's key in sweep.json: the depth (e.g. '4') when the depth is the only job axis
    (as sweeps over `--depths` always wrote), else the workdir name."""
    if list(self.job_values) == [DEPTH_FIELD]:
      return str(self.job_values[DEPTH_FIELD])
    return self.name


def _text(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


def job_name(job_values: Mapping[str, Any]) -> str:
  """The workdir name of a job: 'depth<D>' for model.num_layers, '<field><value>' for each other
  job axis (the field's last part, or the whole dotted name with '_' where two axes share it),
  joined by '-'; 'run' with no job axis. E.g. {model.num_layers: 4, model.d_model: 64} ->
  'depth4-d_model64'. Characters other than letters, digits and '._+-' become '_'."""
  if not job_values:
    return "run"
  last = [f.split(".")[-1] for f in job_values]
  parts = []
  for field, value in job_values.items():
    if field == DEPTH_FIELD:
      parts.append(f"depth{value}")
      continue
    short = field.split(".")[-1]
    label = short if last.count(short) == 1 else field.replace(".", "_")
    parts.append(f"{label}{_text(value)}")
  return re.sub(r"[^A-Za-z0-9._+=-]", "_", "-".join(parts))


def expand(axes: Sequence[tuple[str, Sequence[Any]]], seeds: int,
           seed_fields: Sequence[str] | None = None) -> list[Job]:
  """The jobs of a grid (module docstring): one per combination of the job axes' values (in
  row-major grid order), each with every combination of the seed axes' values `seeds` times on
  its seed axis.

  Args:
    axes: [(dotted field, values)] (`parse_grid`).
    seeds: R >= 1, seeds per grid point.
    seed_fields: the fields that go onto the seed axis (default `seed_axis_fields()`).

  Returns:
    the jobs; `num_seeds` = R x the product of the seed axes' value counts.

  Raises:
    ValueError: `seeds` < 1, an axis without values, or a seed-axis value that is a sequence
      (a grid point takes one value per seed: put the values on the grid instead).
  """
  if seeds < 1:
    raise ValueError(f"--seeds must be >= 1, got {seeds}")
  on_seeds = set(seed_axis_fields() if seed_fields is None else seed_fields)
  for field, values in axes:
    if not values:
      raise ValueError(f"--grid {field} has no values")
    if field in on_seeds and any(isinstance(v, (tuple, list)) for v in values):
      raise ValueError(f"--grid {field}: a per-seed field takes one value per grid point, got "
                       f"{[v for v in values if isinstance(v, (tuple, list))][0]!r}")
  job_axes = [(f, tuple(v)) for f, v in axes if f not in on_seeds]
  seed_axes = [(f, tuple(v)) for f, v in axes if f in on_seeds]
  combos = list(itertools.product(*[v for _, v in seed_axes]))
  points = tuple(dict(zip([f for f, _ in seed_axes], combo))
                 for combo in combos for _ in range(seeds))
  seed_values = {f: tuple(p[f] for p in points) for f, _ in seed_axes}
  return [Job(job_values=dict(zip([f for f, _ in job_axes], combo)), seed_values=seed_values,
              points=points, num_seeds=len(points))
          for combo in itertools.product(*[v for _, v in job_axes])]


def record(axes: Sequence[tuple[str, Sequence[Any]]], seeds: int,
           seed_fields: Sequence[str] | None = None) -> dict:
  """The grid as sweep.json records it: {'axes': [{'field', 'values', 'axis': 'job' | 'seed'}],
  'seeds_per_point': R} (compared on a rerun: `same_grid`)."""
  on_seeds = set(seed_axis_fields() if seed_fields is None else seed_fields)
  return {"axes": [{"field": f, "values": list(v), "axis": "seed" if f in on_seeds else "job"}
                   for f, v in axes], "seeds_per_point": seeds}


def _canonical(recorded: Mapping) -> tuple:
  return (tuple((a["field"], tuple(repr(float(v)) if isinstance(v, (int, float))
                                   and not isinstance(v, bool) else repr(v)
                                   for v in a["values"]))
                for a in recorded.get("axes", ())), recorded.get("seeds_per_point"))


def same_grid(old: Mapping, new: Mapping) -> bool:
  """Whether two recorded grids (`record`) name the same fields with the same values in the same
  order and the same seeds per point (1 and 1.0 count as equal; tuples and lists too)."""
  return _canonical(old) == _canonical(new)


def describe(recorded: Mapping) -> str:
  """One-line text of a recorded grid, e.g. 'model.num_layers=4,6 optim.weight_decay=0,0.1 x 2
  seeds per grid point'."""
  axes = " ".join(f"{a['field']}={','.join(_text(v) for v in a['values'])}"
                  for a in recorded.get("axes", ()))
  return f"{axes or '(no axis)'} x {recorded.get('seeds_per_point')} seeds per grid point"


def legacy_record(index: Mapping) -> dict | None:
  """The grid of a sweep.json written before grids existed (`depths` and `seeds`: the depth
  grid), None when it records neither."""
  if "grid" in index:
    return index["grid"]
  if "depths" not in index or "seeds" not in index:
    return None
  return {"axes": [{"field": DEPTH_FIELD, "values": list(index["depths"]), "axis": "job"}],
          "seeds_per_point": index["seeds"]}
