"""`WORKDIR/pruning_core.csv`: the core analyses of the pruning runs as `step,seed,sparsity,name,
value` rows (written by `python -m sg_jax.prune_core`; the names are in docs/pruning.md).

Everything here is numpy on the host tables (`pruning.csv`, `pruning/masks_step<N>.npz`): the
per-(step, seed) effective size, the per-(step, seed, level) core, inclusion frequencies and
overlaps, the masks of the core-ablation rows and the rows they become. Per-(step, seed) rows
have sparsity nan. The table is rewritten whole and atomically (`fileio.write_atomic`), with
one group of rows (step, seed, level) replaced at a time (`merge`). Definitions: Bhaskar,
Friedman & Chen, ACL 2024, and `core`.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Iterable, Mapping

import numpy as np

from sg_jax.pruning import core
from sg_jax.pruning import table
from sg_jax.records import fileio

HEADER = "step,seed,sparsity,name,value\n"
Row = tuple[int, int, float, str, float]  # (step, seed, sparsity or nan, name, value)
Group = tuple[int, int, float | None]     # (step, seed, level key or None for nan)
ACCURACY = ("in_domain/accuracy", "out_of_domain/accuracy")
# A masked LM's evaluation has no teacher-forced task accuracy: its effective size reads the
# masked-token accuracy instead (`evaluation.make_split_evaluator`, docs/pruning.md).
MASKED_ACCURACY = ("in_domain/masked_accuracy", "out_of_domain/masked_accuracy")
ABLATION_PREFIXES = ("full/", "core_ablation/", "random_ablation/")


def group_of(row) -> Group:
  """(step, seed, level) of a row: the level key, or None for the per-(step, seed) rows."""
  level = row[2]
  return int(row[0]), int(row[1]), None if math.isnan(level) else table.level_key(level)


def read_rows(path: str) -> list[Row]:
  """Rows of a core CSV in file order ([] when it is missing); the header, malformed lines and
  an unterminated last line are skipped."""
  return table.read_parsed_rows(path, 5, lambda r: (int(r[0]), int(r[1]), float(r[2]), r[3],
                                                     float(r[4])))


def format_rows(rows: Iterable[Row]) -> str:
  """CSV lines of (step, seed, sparsity, name, value) rows, floats as `repr` (nan as 'nan')."""
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  for step, seed, sparsity, name, value in rows:
    level = float("nan") if math.isnan(sparsity) else table.level_key(sparsity)
    writer.writerow((int(step), int(seed), repr(level), name, repr(float(value))))
  return buf.getvalue()


def merge(old: list[Row], new: Mapping[Group, list[Row]]) -> list[Row]:
  """`old` with every group of `new` replaced by its rows, sorted by (step, seed, level; nan
  first), each group's rows in their order."""
  groups: dict[Group, list[Row]] = {}
  for row in old:
    groups.setdefault(group_of(row), []).append(row)
  groups.update(new)
  order = sorted(groups, key=lambda g: (g[0], g[1], -1.0 if g[2] is None else g[2]))
  return [row for g in order for row in groups[g]]


def write_rows(path: str, rows: Iterable[Row]) -> None:
  """Replaces `path` with the header and `rows`, atomically.

  Raises:
    OSError: the file cannot be written (the old one is left as it was).
  """
  fileio.write_atomic(path, HEADER + format_rows(rows))


def run_tables(pruning_rows: Iterable[table.Row]):
  """Index the rows of pruning.csv.

  Returns:
    (runs {(step, seed): {level: {pruning_seed: {name: value}}}} of the runs with their
    `achieved_sparsity` row, full {(step, seed): {name: value}} of the full models).
  """
  values: dict = {}
  for step, seed, sparsity, ps, name, value in pruning_rows:
    key = (step, seed) if ps == table.FULL_MODEL else (step, seed, table.level_key(sparsity), ps)
    values.setdefault(key, {})[name] = value
  runs, full = {}, {}
  for key, named in values.items():
    if len(key) == 2:
      full[key] = named
    elif table.MARKER in named:
      runs.setdefault(key[:2], {}).setdefault(key[2], {})[key[3]] = named
  return runs, full


def effective_size_rows(step: int, seed: int, runs: Mapping[float, Mapping[int, dict]],
                        full: Mapping[str, float] | None) -> tuple[list[Row], str | None]:
  """`effective_size/<variant>` and its `/ci_low`, `/ci_high` (mean -+ the 95% Student-t
  half-width, clipped to [0, 1]; nan for one pruning seed) and `/at_highest_level` (the
  fraction of pruning seeds whose effective sparsity is the highest level tried: for them the
  size is only an upper bound; `core.effective_size`) of one (step, seed), over every level of
  `runs` ({level: {pruning_seed: {name: value}}}) and the pruning seeds that every level has.

  The accuracies are `ACCURACY`, or for a masked LM (whose table has no task accuracy)
  `MASKED_ACCURACY`.

  Returns:
    (rows with sparsity nan, None), or ([], the reason) when the full model's accuracies or a
    pruning seed common to all levels are missing.
  """
  names = next((pair for pair in (ACCURACY, MASKED_ACCURACY)
                if full is not None and all(n in full for n in pair)), None)
  if names is None:
    return [], "no full-model accuracies in the pruning table"
  levels = sorted(lv for lv, by_ps in runs.items()
                  if any(all(n in v for n in names) for v in by_ps.values()))
  common = sorted(set.intersection(*[{ps for ps, v in runs[lv].items()
                                      if all(n in v for n in names)} for lv in levels])
                  ) if levels else []
  if not common:
    return [], "no pruning seed with accuracies at every level"
  acc = [{lv: [runs[lv][ps][n] for ps in common] for lv in levels} for n in names]
  sizes = core.effective_size(acc[0], acc[1], full[names[0]], full[names[1]])
  nan = float("nan")
  rows = []
  for variant in core.VARIANTS:
    mean, ci = sizes[variant]["mean"], sizes[variant]["ci"]
    # An effective size lies in [0, 1]; the t interval of few pruning seeds can leave it.
    low, high = (float(np.clip(b, 0.0, 1.0)) for b in (mean - ci, mean + ci))
    rows += [(step, seed, nan, f"effective_size/{variant}", mean),
             (step, seed, nan, f"effective_size/{variant}/ci_low", low),
             (step, seed, nan, f"effective_size/{variant}/ci_high", high),
             (step, seed, nan, f"effective_size/{variant}/at_highest_level",
              sizes[variant]["at_highest"])]
  return rows, None


def unit_masks(masks: Mapping[str, np.ndarray]) -> dict[tuple[int, float], np.ndarray]:
  """{(seed, level): bool [P, U]} of a masks file (`table.load_masks`), the subnetworks of each
  (training seed, level) in pruning-seed order, units as `core.flat_units`."""
  flat = core.flat_units(masks["head_mask"], masks["mlp_mask"])
  keys = [(int(s), table.level_key(lv), int(p))
          for s, lv, p in zip(masks["seed"], masks["sparsity"], masks["pruning_seed"])]
  out: dict[tuple[int, float], list] = {}
  for i in sorted(range(len(keys)), key=lambda i: keys[i]):
    out.setdefault(keys[i][:2], []).append(flat[i])
  return {k: np.stack(v) for k, v in out.items()}


def core_rows(step: int, seed: int, level: float, subnetworks, names: list[str], num_heads: int,
              final_core, other_cores: Mapping[int, np.ndarray]) -> list[Row]:
  """The core rows of one (step, seed, level).

  Args:
    subnetworks: bool [P, U], the pruning seeds' masks (`unit_masks`).
    names: the U unit names (`core.unit_names`).
    num_heads: how many of the U units are heads (R_h * num_heads).
    final_core: bool [U], the same seed's core at the last step (same level).
    other_cores: {seed b: bool [U]}, the other training seeds' cores (same step and level).

  Returns:
    `core/num_heads`, `core/num_mlps`, `core/num_units`, `core/jaccard_final`,
    `core/jaccard_seed<b>`, `core/jaccard_within_heads` (mean head-set Jaccard of the pairs of
    subnetworks; nan for one), the random-mask baseline `core_random/...`
    (`random_core_rows`), then `inclusion/<unit>` and `in_core/<unit>` (0/1) per unit.
  """
  kernel = core.heuristic_core(subnetworks)
  inclusion = core.inclusion_frequency(subnetworks)
  rows = [("core/num_heads", kernel[:num_heads].sum()), ("core/num_mlps",
                                                         kernel[num_heads:].sum()),
          ("core/num_units", kernel.sum()), ("core/jaccard_final", core.jaccard(kernel,
                                                                                 final_core))]
  rows += [(f"core/jaccard_seed{b}", core.jaccard(kernel, c))
           for b, c in sorted(other_cores.items()) if b != seed]
  rows.append(("core/jaccard_within_heads", core.mean_jaccard(subnetworks[:, :num_heads])))
  rows += random_core_rows(step, seed, level, subnetworks, num_heads)
  rows += [(f"inclusion/{n}", f) for n, f in zip(names, inclusion)]
  rows += [(f"in_core/{n}", float(k)) for n, k in zip(names, kernel)]
  return [(step, seed, level, name, float(value)) for name, value in rows]


RANDOM_CORE = ("num_heads", "num_heads/q025", "num_heads/q975", "num_heads/p_value",
               "jaccard_within_heads", "jaccard_within_heads/q025",
               "jaccard_within_heads/q975")


def random_core_rows(step: int, seed: int, level: float, subnetworks, num_heads: int
                     ) -> list[tuple[str, float]]:
  """The random-mask baseline of one (step, seed, level)'s core heads (`core.random_mask_
  baseline`): as many random masks as subnetworks, each keeping as many heads as its
  subnetwork, drawn uniformly from the num_heads heads.

  Returns:
    (name, value) pairs `core_random/<RANDOM_CORE name>`: the exact expected core size in heads,
    the 2.5% / 97.5% percentiles of 10,000 simulated cores (numpy seed `draw_seed(step, seed,
    level)`), the exact P(random core >= the observed core's heads), the exact expected mean
    pairwise head Jaccard and its simulated percentiles.
  """
  heads = np.asarray(subnetworks, bool)[:, :num_heads]
  base = core.random_mask_baseline(num_heads, heads.sum(-1).tolist(),
                                   observed_core=int(core.heuristic_core(heads).sum()),
                                   seed=draw_seed(step, seed, level))
  keys = ("core_mean", "core_q025", "core_q975", "core_p_value", "jaccard_mean",
          "jaccard_q025", "jaccard_q975")
  return [(f"core_random/{name}", base[k]) for name, k in zip(RANDOM_CORE, keys)]


def compare_rows(step: int, seed: int, level: float, subnetworks, others, name: str,
                 num_heads: int) -> list[Row]:
  """Overlaps of another table's subnetworks (e.g. pruned with `task:gen`) with this table's
  subnetworks and core, of one (step, seed, level), on the heads (the paper's core is a set of
  heads; MLP blocks are rarely pruned at these sizes, so they would inflate every overlap).

  Args:
    subnetworks: bool [P, U], this table's masks (`unit_masks`).
    others: bool [M, U], the other table's masks of the same (step, seed, level).
    name: the other table's name without `.csv`, used in the row names.
    num_heads: how many of the U units are heads (R_h * num_heads).

  Returns:
    `compare/<name>/num_subnetworks` (M), `compare/<name>/jaccard_heads` (mean Jaccard of every
    (other, this) pair), `compare/<name>/jaccard_within_heads` (mean over the other table's own
    pairs; nan for M = 1), `compare/<name>/core_heads_kept` (mean fraction of this core's heads
    that the other subnetworks keep; nan for a core without heads) and
    `compare/<name>/jaccard_core_heads` (the two cores' heads).
  """
  sub_h = np.asarray(subnetworks, bool)[:, :num_heads]
  oth_h = np.asarray(others, bool)[:, :num_heads]
  kernel_h = core.heuristic_core(sub_h)
  rows = [("num_subnetworks", len(oth_h)), ("jaccard_heads", core.mean_jaccard(oth_h, sub_h)),
          ("jaccard_within_heads", core.mean_jaccard(oth_h)),
          ("core_heads_kept", core.core_kept(oth_h, kernel_h)),
          ("jaccard_core_heads", core.jaccard(core.heuristic_core(oth_h), kernel_h))]
  return [(step, seed, level, f"compare/{name}/{n}", float(v)) for n, v in rows]


def stored_core(rows: Iterable[Row], names: list[str]) -> np.ndarray | None:
  """bool [U] from a group's `in_core/<unit>` rows, or None when a unit has none."""
  found = {r[3][len("in_core/"):]: r[4] for r in rows if r[3].startswith("in_core/")}
  if any(n not in found for n in names):
    return None
  return np.array([found[n] > 0.5 for n in names])


def draw_seed(step: int, seed: int, level: float) -> int:
  """The numpy seed of the random-ablation draws of one (step, seed, level)."""
  return int(np.random.SeedSequence([int(step), int(seed), int(round(level * 1e6))]
                                    ).generate_state(1)[0])


def ablation_masks(kernel, num_layers: int, num_heads: int, num_draws: int, seed: int,
                   units: str = "heads"):
  """Kept-unit masks of the full model, the core ablated, and the random baseline.

  Args:
    kernel: bool [U], the core (`core.flat_units` order).
    num_layers, num_heads: the head masks' shape (R_h rows: `core.unit_names`); the MLP
      masks take the units after the heads.
    num_draws: random draws.
    seed: their numpy seed (`draw_seed`).
    units: "heads" or "all", which of the core's units are ablated (`core.core_ablation_masks`).

  Returns:
    (head masks bool [2 + num_draws, num_layers, num_heads], MLP masks bool
    [2 + num_draws, R_m], the reason there is no random baseline or None): row 0 the
    full model, 1 the core removed, 2.. the draws of `core.core_ablation_masks` (all ones,
    and the reason, when the core has more heads than lie outside it).

  Raises:
    ValueError: an unknown `units`.
  """
  kernel = np.asarray(kernel, bool)
  num_heads_total = num_layers * num_heads
  masks = np.ones((2 + num_draws, kernel.size), bool)
  masks[1] = core.without_core(kernel, num_heads_total, units)
  reason = None
  try:
    _, draws = core.core_ablation_masks(kernel, num_heads_total, num_draws, seed, units)
    masks[2:] = draws
  except ValueError as e:
    reason = str(e)
  heads, mlp = core.split_units(masks, num_layers, num_heads)
  return heads, mlp, reason


def ablation_rows(step: int, seed: int, level: float, metrics: Mapping[str, np.ndarray],
                  random_baseline: bool = True) -> list[Row]:
  """`full/<m>`, `core_ablation/<m>`, `random_ablation/<m>` (mean over draws) and
  `random_ablation/<m>/draw<k>` from the evaluator's {metric: float [2 + num_draws]} (the rows
  of `ablation_masks`); no random rows unless `random_baseline`."""
  rows = []
  for name in sorted(metrics):
    v = np.asarray(metrics[name], np.float64)
    rows += [("full/" + name, v[0]), ("core_ablation/" + name, v[1])]
    if random_baseline and v.size > 2:
      rows.append(("random_ablation/" + name, v[2:].mean()))
      rows += [(f"random_ablation/{name}/draw{k}", x) for k, x in enumerate(v[2:])]
  return [(step, seed, level, name, float(value)) for name, value in rows]
