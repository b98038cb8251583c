"""Seed groups of one run: which seeds form a group.

One vmapped run can hold several regimes side by side, e.g. the SAS regulariser's strength per
seed (Chen et al., ICLR 2024; docs/sas.md) or a training-data mix per seed (docs/data.md): a
config field whose value in `config.json` is a list with one entry per seed. Seeds with the same
entries of every such field form a group (`seed_groups`); the runs of one depth of a grid sweep
are merged so that a job axis groups like a per-seed field (`job_axis_runs`).

What the report does with the groups lives beside this module: `group_stats` (per group final
values with intervals, onsets, time to generalise, rules; each group against the first),
`group_markdown` (the "Seed groups" section of summary.md) and `group_figures`
(`groups_<run>.png`, `time_to_generalise_<run>.png`, `dose_response_<run>.png`).
"""

from __future__ import annotations

import collections
from typing import Mapping, Sequence

from sg_jax.report.reading import Run


def _flat(config: Mapping, prefix: str = "") -> dict:
  out = {}
  for key, value in config.items():
    if isinstance(value, Mapping):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def per_seed_fields(config: Mapping) -> dict[str, list]:
  """{dotted field: [value per seed]}: the config fields given one value per seed (a list as
  long as `num_seeds`, > 1 seed, with at least two distinct values)."""
  num_seeds = config.get("num_seeds")
  if not isinstance(num_seeds, int) or num_seeds < 2:
    return {}
  return {name: list(value) for name, value in _flat(config).items()
          if isinstance(value, (list, tuple)) and len(value) == num_seeds
          and len({repr(v) for v in value}) > 1}


def grouping_fields(config: Mapping, by: Sequence[str] | None = None) -> dict[str, list]:
  """{dotted field: [value per seed]} of the per-seed fields seeds are grouped by: every
  `per_seed_fields` entry when `by` is empty, else those `by` names, in `by`'s order (a name
  may be the field's last part, e.g. 'weight_decay' for 'optim.weight_decay'; a name that is no
  per-seed field of this run, e.g. one value for all its seeds, is left out)."""
  fields = per_seed_fields(config)
  if not by:
    return fields
  out = {}
  for name in by:
    match = [f for f in fields if f == name or f.split(".")[-1] == name]
    if len(match) > 1:
      raise ValueError(f"--group_by {name!r} names several per-seed fields: {match}")
    if match:
      out[match[0]] = fields[match[0]]
  return out


def seed_groups(run: Run, by: Sequence[str] | None = None) -> dict[str, list[int]]:
  """{label: seeds} of a run's seed groups, in first-seed order: seeds with the same value of
  every per-seed field (`per_seed_fields`), or of the fields named in `by` only, the others
  pooled (`grouping_fields`; e.g. a grid of weight decay x learning rate grouped by weight
  decay); {} when every seed has the same value of them. Labels read `field=value, ...` (the
  section name left out where the field name is unique).

  Raises:
    ValueError: a `by` name matching several per-seed fields.
  """
  fields = grouping_fields(run.config, by)
  if not fields:
    return {}
  first = int(run.config.get("first_seed", 0))
  groups: dict[str, list[int]] = collections.OrderedDict()
  last = collections.Counter(name.split(".")[-1] for name in fields)
  short = {name: name.split(".")[-1] if last[name.split(".")[-1]] == 1 else name
           for name in fields}  # e.g. "lambdas", but "sas.lambdas" beside "tree.lambdas"
  for k in range(int(run.config["num_seeds"])):
    label = ", ".join(f"{short[name]}={values[k]}" for name, values in fields.items())
    groups.setdefault(label, []).append(first + k)
  return dict(groups)


def _unflat(flat: Mapping[str, object]) -> dict:
  out: dict = {}
  for dotted, value in flat.items():
    node = out
    *sections, leaf = dotted.split(".")
    for part in sections:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


def merge_runs(runs: Sequence[Run], name: str) -> Run:
  """One Run holding the seeds of `runs` (e.g. the jobs of one depth of a grid sweep), so that
  its seeds group by a field that differs between the runs (a job axis such as `model.d_model`)
  as by a per-seed field: the seeds are renumbered from 0 in run order (run i's seed
  `first_seed_i + k` becomes `n_0 + ... + n_{i-1} + k`), and every config field is given one
  value per merged seed (a run's per-seed list, else its one value repeated), so that
  `per_seed_fields` finds each field that differs between seeds of the merged run.

  Args:
    runs: runs with the same task and metrics (their `series` [steps] per seed).
    name: the merged run's name.

  Raises:
    ValueError: a run without `num_seeds` in its config.
  """
  flats, counts = [], []
  for run in runs:
    n = run.config.get("num_seeds")
    if not isinstance(n, int):
      raise ValueError(f"run {run.name} has no num_seeds in its config.json: cannot merge it")
    flats.append(_flat(run.config))
    counts.append(n)
  merged_flat: dict[str, list] = {}
  for field in dict.fromkeys(f for flat in flats for f in flat):
    values = []
    for flat, n in zip(flats, counts):
      value = flat.get(field)
      per = isinstance(value, (list, tuple)) and len(value) == n and n > 1
      values += list(value) if per else [value] * n
    merged_flat[field] = values
  merged_flat.update({"num_seeds": sum(counts), "first_seed": 0})
  series: dict = collections.defaultdict(dict)
  offset = 0
  for run, n in zip(runs, counts):
    first = int(run.config.get("first_seed", 0))
    for metric, by_seed in run.series.items():
      for seed, curve in by_seed.items():
        series[metric][offset + seed - first] = curve
    offset += n
  froms = {run.accuracy_from for run in runs}
  return Run(workdir=runs[0].workdir, name=name, depth=runs[0].depth, task=runs[0].task,
             num_steps=runs[0].num_steps, series=dict(series), config=_unflat(merged_flat),
             accuracy_from=froms.pop() if len(froms) == 1 else "")


def job_axis_runs(runs: Sequence[Run], by: Sequence[str]) -> list[Run]:
  """The runs of each depth merged into one (`merge_runs`, named `depth<D>_jobs`) where a field
  `by` names differs between them (a job axis of a grid sweep, e.g. `model.d_model`; the
  per-seed fields of the runs stay per seed), so that the report groups their seeds by it;
  [] without `by` or where no named field differs between runs of one depth."""
  if not by:
    return []
  by_depth = collections.defaultdict(list)
  for run in runs:
    by_depth[run.depth].append(run)
  out = []
  for depth, members in by_depth.items():
    if len(members) < 2 or not all(isinstance(r.config.get("num_seeds"), int) for r in members):
      continue
    merged = merge_runs(members, f"depth{depth}_jobs")
    fields = grouping_fields(merged.config, by)
    if any(not all(f in per_seed_fields(r.config) for r in members) for f in fields):
      out.append(merged)
  return out


def runs_with_groups(runs: Sequence[Run], by: Sequence[str] | None = None
                     ) -> list[tuple[Run, dict[str, list[int]]]]:
  """(run, its `seed_groups`) for every run of `runs` with seed groups, then for the merged
  runs of a job axis `by` names (`job_axis_runs`): the runs the report's "Seed groups" section
  and figures describe, in that order."""
  out = []
  for run in list(runs) + job_axis_runs(runs, by):
    seed_sets = seed_groups(run, by)
    if seed_sets:
      out.append((run, seed_sets))
  return out
