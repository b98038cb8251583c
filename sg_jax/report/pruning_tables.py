"""The pruning runs of a workdir for the report: `pruning.csv`, the masks files and, where
present, `pruning_core.csv` (`sg_jax.prune`, `sg_jax.prune_core`; docs/pruning.md), and the
"Pruning" section of summary.md (Bhaskar, Friedman & Chen, ACL 2024).

Everything is numpy on the host tables. The effective size comes from `pruning.csv` itself
(`core_table.effective_size_rows`, i.e. `core.effective_size`), the core from the masks
(`core.heuristic_core`), the core ablation from `pruning_core.csv` only.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np

from sg_jax.pruning import core
from sg_jax.pruning import core_table
from sg_jax.pruning import table

IN_ACC, GEN_ACC = core_table.ACCURACY
PRUNING_CSV, CORE_CSV = "pruning.csv", "pruning_core.csv"
COMPARE = ("jaccard_heads", "jaccard_within_heads", "core_heads_kept", "jaccard_core_heads")


@dataclasses.dataclass
class Pruning:
  """The pruning tables of one workdir.

  Attributes:
    name: the run's label (folder name).
    runs: {(step, seed): {level: {pruning_seed: {name: value}}}} (`core_table.run_tables`).
    full: {(step, seed): {name: value}}, the full models' rows.
    masks: {step: {(seed, level): bool [P, U]}} (`core_table.unit_masks`; pruning-seed order).
    shape: (num_layers, num_heads) from the masks, None without masks.
    core_rows: {(step, seed, level or None): {name: value}} of pruning_core.csv ({} if absent).
  """

  name: str
  runs: dict
  full: dict
  masks: dict
  shape: tuple[int, int] | None
  core_rows: dict

  @property
  def steps(self) -> list[int]:
    """Steps with at least one finished run, sorted."""
    return sorted({step for step, _ in self.runs})

  def seeds(self, step: int) -> list[int]:
    return sorted(seed for s, seed in self.runs if s == step)


def load_pruning(workdir: str, name: str) -> Pruning | None:
  """Reads `workdir/pruning.csv`, `workdir/pruning/masks_step<N>.npz` and `pruning_core.csv`.

  Returns:
    the tables, or None when there is no pruning.csv or it holds no finished run.
  """
  runs, full = core_table.run_tables(table.read_rows(os.path.join(workdir, PRUNING_CSV)))
  if not runs:
    return None
  masks, shape = {}, None
  for step in sorted({s for s, _ in runs}):
    loaded = table.load_masks(workdir, step)
    if loaded is not None:
      masks[step] = core_table.unit_masks(loaded)
      shape = tuple(int(n) for n in loaded["head_mask"].shape[1:])
  core_rows: dict = {}
  for row in core_table.read_rows(os.path.join(workdir, CORE_CSV)):
    core_rows.setdefault(core_table.group_of(row), {})[row[3]] = row[4]
  return Pruning(name, runs, full, masks, shape, core_rows)


def effective_sizes(data: Pruning) -> dict[int, dict[str, np.ndarray]]:
  """Effective size over training, per training seed.

  Returns:
    {seed: {'step': int [T], '<variant>', '<variant>/ci_low', '<variant>/ci_high': float [T]}}
    for the variants of `core.VARIANTS` (mean -+ the 95% Student-t half-width over pruning
    seeds, clipped to [0, 1]; nan for one pruning seed); steps without the full model's
    accuracies are left out.
  """
  out: dict = {}
  for (step, seed), by_level in sorted(data.runs.items()):
    rows, _ = core_table.effective_size_rows(step, seed, by_level, data.full.get((step, seed)))
    if not rows:
      continue
    entry = out.setdefault(seed, {"step": []})
    entry["step"].append(step)
    for _, _, _, name, value in rows:
      entry.setdefault(name[len("effective_size/"):], []).append(value)
  return {seed: {k: np.asarray(v) for k, v in e.items()} for seed, e in out.items()}


def core_of(data: Pruning, step: int, seed: int, level: float) -> tuple[float, float]:
  """(heads, MLP blocks) in the core: from the masks, else pruning_core.csv; nan, nan if none."""
  subnetworks = data.masks.get(step, {}).get((seed, level))
  if subnetworks is not None and data.shape is not None:
    kernel = core.heuristic_core(subnetworks)
    heads = data.shape[0] * data.shape[1]
    return float(kernel[:heads].sum()), float(kernel[heads:].sum())
  named = data.core_rows.get((step, seed, level), {})
  return named.get("core/num_heads", math.nan), named.get("core/num_mlps", math.nan)


# summary row key -> pruning_core.csv name (`core_table.random_core_rows`)
RANDOM_KEYS = {"core_heads_random": "core_random/num_heads",
               "core_heads_random_q025": "core_random/num_heads/q025",
               "core_heads_random_q975": "core_random/num_heads/q975",
               "core_heads_random_p": "core_random/num_heads/p_value",
               "jaccard_within_heads_random": "core_random/jaccard_within_heads",
               "jaccard_within_heads_random_q025": "core_random/jaccard_within_heads/q025",
               "jaccard_within_heads_random_q975": "core_random/jaccard_within_heads/q975"}


def random_core_of(data: Pruning, step: int, seed: int, level: float) -> dict[str, float]:
  """The random-mask baseline of a core's heads (`core_table.random_core_rows`: as many
  uniformly random head masks as subnetworks, each as large as its subnetwork): from the
  masks, else from pruning_core.csv's `core_random/...` rows; nan where neither has it.

  Returns:
    {`RANDOM_KEYS` key: value} plus 'jaccard_within_heads' (the observed mean pairwise head
    Jaccard of the subnetworks, from the masks where pruning_core.csv lacks it).
  """
  subnetworks = data.masks.get(step, {}).get((seed, level))
  named = data.core_rows.get((step, seed, level), {})
  if subnetworks is not None and data.shape is not None:
    heads = data.shape[0] * data.shape[1]
    pairs = dict(core_table.random_core_rows(step, seed, level, subnetworks, heads))
    out = {key: pairs[name] for key, name in RANDOM_KEYS.items()}
    out["jaccard_within_heads"] = named.get("core/jaccard_within_heads",
                                            core.mean_jaccard(subnetworks[:, :heads]))
    return out
  out = {key: named.get(name, math.nan) for key, name in RANDOM_KEYS.items()}
  out["jaccard_within_heads"] = named.get("core/jaccard_within_heads", math.nan)
  return out


def _values(by_ps: dict, name: str) -> list[float]:
  return [v[name] for v in by_ps.values() if name in v and math.isfinite(v[name])]


def summary_rows(data: Pruning) -> tuple[list[dict], list[dict]]:
  """The pruning summary at the last pruned step.

  Returns:
    (one row per (training seed, level): pruning seeds, achieved sparsity and KL (means over
    pruning seeds), min and max of the in- and out-of-domain accuracies, core heads / MLPs, and
    from pruning_core.csv `full_`, `core_ablation_`, `random_ablation_` accuracies (nan when
    absent), `jaccard_within_heads`, the random-mask baseline (`random_core_of`: expected core
    heads with the 95% range of simulated cores and the exact P(random core >= observed),
    expected mean pairwise head Jaccard with its range) and `compare_<table>_<COMPARE name>`
    from pruning_core.csv's `compare/<table>/...` rows; one row per training seed: the full
    model's accuracies and the effective size of each variant with its 95% interval, clipped to [0, 1], and the
    fraction of pruning seeds at the highest level tried, `_at_highest_level`).
  """
  step = data.steps[-1]
  sizes = effective_sizes(data)
  level_rows, seed_rows = [], []
  for seed in data.seeds(step):
    for level, by_ps in sorted(data.runs[(step, seed)].items()):
      row = {"run": data.name, "step": step, "seed": seed, "sparsity": level,
             "pruning_seeds": len(by_ps)}
      for name, key in ((table.MARKER, "achieved_sparsity"), ("kl", "kl")):
        values = _values(by_ps, name)
        row[f"{key}_mean"] = float(np.mean(values)) if values else math.nan
      for name, key in ((IN_ACC, "in_domain"), (GEN_ACC, "out_of_domain")):
        values = _values(by_ps, name)
        row[f"{key}_min"] = min(values) if values else math.nan
        row[f"{key}_max"] = max(values) if values else math.nan
      row["core_heads"], row["core_mlps"] = core_of(data, step, seed, level)
      named = data.core_rows.get((step, seed, level), {})
      for prefix in core_table.ABLATION_PREFIXES:
        for name, key in ((IN_ACC, "in_domain"), (GEN_ACC, "out_of_domain")):
          row[f"{prefix[:-1]}_{key}"] = named.get(prefix + name, math.nan)
      row.update(random_core_of(data, step, seed, level))
      for other in sorted({n.split("/")[1] for n in named if n.startswith("compare/")}):
        for m in COMPARE:
          row[f"compare_{other}_{m}"] = named.get(f"compare/{other}/{m}", math.nan)
      level_rows.append(row)
    full = data.full.get((step, seed), {})
    row = {"run": data.name, "step": step, "seed": seed,
           "full_in_domain": full.get(IN_ACC, math.nan),
           "full_out_of_domain": full.get(GEN_ACC, math.nan)}
    entry = sizes.get(seed, {"step": np.array([], int)})
    at = np.flatnonzero(entry["step"] == step)
    for variant in core.VARIANTS:
      for suffix in ("", "/ci_low", "/ci_high", "/at_highest_level"):
        row[f"effective_size_{variant}{suffix.replace('/', '_')}"] = (
            float(entry[variant + suffix][at[0]]) if at.size and variant + suffix in entry
            else math.nan)
    seed_rows.append(row)
  return level_rows, seed_rows


def bound_mark(at_highest_level: float) -> str:
  """'≤' when some pruning seeds reached the highest level tried (their effective size is an
  upper bound: `core.effective_size`), else ''."""
  return "≤" if math.isfinite(at_highest_level) and at_highest_level > 0 else ""


def _f(v) -> str:
  return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def _range(row: dict, key: str) -> str:
  return f"[{_f(row[key + '_min'])}, {_f(row[key + '_max'])}]"


def _ablation(row: dict, key: str) -> str:
  values = [row[f"{p}_{key}"] for p in ("full", "core_ablation", "random_ablation")]
  # n/a: no value of its kind (e.g. no random baseline when the core holds more heads than lie
  # outside it; prune_core logs why).
  return "" if all(math.isnan(v) for v in values) else " / ".join(_f(v) or "n/a" for v in values)


def markdown_lines(level_rows: Sequence[dict], seed_rows: Sequence[dict]) -> list[str]:
  """The "Pruning" section of summary.md ([] without pruning rows)."""
  if not level_rows and not seed_rows:
    return []
  lines = ["", "## Pruning", "",
           "| run | step | seed | sparsity | pruning seeds | achieved sparsity (mean) | "
           "KL (mean) | in-domain acc. [min, max] | gen. acc. [min, max] | core heads | "
           "core MLPs | in-domain acc. full / core abl. / random abl. | "
           "gen. acc. full / core abl. / random abl. |", "|" + "---|" * 13]
  for r in level_rows:
    cells = [r["run"], str(r["step"]), str(r["seed"]), f"{r['sparsity']:g}",
             str(r["pruning_seeds"]), _f(r["achieved_sparsity_mean"]), _f(r["kl_mean"]),
             _range(r, "in_domain"), _range(r, "out_of_domain"), _f(r["core_heads"]),
             _f(r["core_mlps"]), _ablation(r, "in_domain"), _ablation(r, "out_of_domain")]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "| run | step | seed | full in-domain acc. | full gen. acc. | "
            + " | ".join(f"effective size ({v}) [95% CI]" for v in core.VARIANTS) + " |",
            "|" + "---|" * (5 + len(core.VARIANTS))]
  for r in seed_rows:
    cells = [r["run"], str(r["step"]), str(r["seed"]), _f(r["full_in_domain"]),
             _f(r["full_out_of_domain"])]
    for v in core.VARIANTS:
      low, high = r[f"effective_size_{v}_ci_low"], r[f"effective_size_{v}_ci_high"]
      # An effective size lies in [0, 1]; the t interval of few pruning seeds can leave it.
      ci = (f" [{_f(max(low, 0.0))}, {_f(min(high, 1.0))}]" if math.isfinite(low) else "")
      cells.append(bound_mark(r.get(f"effective_size_{v}_at_highest_level", math.nan))
                   + _f(r[f"effective_size_{v}"]) + ci)
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "At the last pruned step (`sg_jax.prune`, docs/pruning.md). Per training seed "
            "and sparsity level: the means and the accuracy ranges are over the pruning seeds' "
            "binarised subnetworks; the core is the units every one of them keeps "
            "(`core.heuristic_core`); the ablations (from `pruning_core.csv`, "
            "`sg_jax.prune_core`) are the full model, the full model without the core's heads "
            "(and its MLP blocks with `--ablate_units=all`), and without as many random "
            "non-core heads (mean over draws). Effective size: 1 - the "
            "highest level within 0.03 of the full model's accuracy, mean over pruning seeds "
            "with its 95% Student-t interval (mean: in- and out-of-domain accuracy averaged). "
            "≤ marks a bound, not a value: some pruning seeds' subnetworks were within the "
            "tolerance at the highest level tried, so their effective size is at most "
            "1 - that level (prune at higher levels to measure it)."]
  return lines + _random_lines(level_rows) + _compare_lines(level_rows)


def _random_lines(level_rows: Sequence[dict]) -> list[str]:
  """The table of the cores beside random masks of the same sparsity, [] without any."""
  rows = [r for r in level_rows if math.isfinite(r.get("core_heads_random", math.nan))]
  if not rows:
    return []
  lines = ["", "| run | step | seed | sparsity | core heads | random masks: core heads, "
           "expected [95% range] | P(random core >= core) | head Jaccard within | random "
           "masks: head Jaccard, expected [95% range] |", "|" + "---|" * 9]
  for r in rows:
    span = lambda key, r=r: (f"{_f(r[key])} [{_f(r[key + '_q025'])}, {_f(r[key + '_q975'])}]"
                             if math.isfinite(r[key]) else "")
    cells = [r["run"], str(r["step"]), str(r["seed"]), f"{r['sparsity']:g}",
             _f(r["core_heads"]), span("core_heads_random"), _f(r["core_heads_random_p"]),
             _f(r["jaccard_within_heads"]), span("jaccard_within_heads_random")]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "The core beside random masks of the same sparsity "
            "(docs/pruning.md, \"The random-mask baseline\"): as many uniformly random head "
            "masks as pruning seeds, each keeping as many heads as its subnetwork. Expected values are exact "
            "(hypergeometric); the 95% ranges are the 2.5% and 97.5% percentiles of "
            f"{core.RANDOM_MASK_DRAWS:,} seeded simulated sets of masks (where random cores "
            "lie, not an interval of a mean); P is the exact one-sided probability that random "
            "masks share at least as many heads as the core (one test per row, uncorrected)."]
  return lines


def _compare_lines(level_rows: Sequence[dict]) -> list[str]:
  """The table of `compare/<T>/` rows (`sg_jax.prune_core --compare`), [] without any."""
  suffix = "_" + COMPARE[0]
  rows = [(r, k[len("compare_"):-len(suffix)]) for r in level_rows for k in sorted(r)
          if k.startswith("compare_") and k.endswith(suffix)]
  if not rows:
    return []
  lines = ["", "| run | step | seed | sparsity | other table | head Jaccard within this table | "
           "within the other | between them | core heads the other keeps | "
           "Jaccard of the cores' heads |", "|" + "---|" * 10]
  for r, other in rows:
    m = lambda name, r=r, other=other: _f(r[f"compare_{other}_{name}"])
    cells = [r["run"], str(r["step"]), str(r["seed"]), f"{r['sparsity']:g}", other,
             _f(r["jaccard_within_heads"]), m("jaccard_within_heads"), m("jaccard_heads"),
             m("core_heads_kept"), m("jaccard_core_heads")]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "Subnetworks of another pruning objective (`sg_jax.prune_core --compare`, "
            "docs/pruning.md) against this table's: mean Jaccard of the head sets over pairs "
            "within each table and between the two; the mean fraction of this table's core "
            "heads that the other's subnetworks keep; the Jaccard of the two cores' heads."]
  return lines
