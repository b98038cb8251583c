"""Aggregations of pruning runs: effective size, the heuristic core, overlaps and ablation masks
(Bhaskar, Friedman & Chen, ACL 2024; docs/pruning.md states the definitions).

Units are flattened as `flat_units`: the R_h x num_heads heads in row order, then the R_m MLP
blocks (the rows of the model's masks, `models.interventions.unit_rows`: R_h = R_m = num_layers
for the decoder-only LM; 3 and 2 num_layers for the encoder-decoder). A mask is bool, True =
the unit is kept. Everything here is numpy on host tables; nothing is compiled.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from sg_jax.models import interventions

TOLERANCE = 0.03  # the original's: within 0.03 (absolute) of the full model's accuracy
VARIANTS = ("mean", "in_domain", "out_of_domain")

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (beyond: 1.96).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def flat_units(head_mask, mlp_mask) -> np.ndarray:
  """bool [..., R_h * num_heads + R_m]: heads (row-major), then MLP blocks."""
  heads = np.asarray(head_mask, bool)
  mlp = np.asarray(mlp_mask, bool)
  return np.concatenate([heads.reshape(heads.shape[:-2] + (-1,)), mlp], axis=-1)


def split_units(units, num_layers: int, num_heads: int) -> tuple[np.ndarray, np.ndarray]:
  """The inverse of `flat_units`: ([..., num_layers, num_heads], [..., R_m]), `num_layers` the
  head rows R_h (the MLP blocks are the units after the heads)."""
  units = np.asarray(units)
  heads = units[..., :num_layers * num_heads]
  return (heads.reshape(units.shape[:-1] + (num_layers, num_heads)),
          units[..., num_layers * num_heads:])


def unit_names(num_layers: int, num_heads: int, num_mlp_rows: int | None = None) -> list[str]:
  """'<row>_h<head>' for the heads, then '<row>_mlp', in `flat_units` order.

  The rows are `interventions.rows_of_shape(num_layers, num_mlp_rows)`: 'l<layer>' when both
  counts are num_layers (the decoder-only LM: `l0_h1`, `l0_mlp`); with 3n head rows and 2n MLP
  rows (the encoder-decoder) 'enc_l<i>', 'dec_l<i>', 'cross_l<i>' (`cross_l0_h1`,
  `dec_l1_mlp`). `num_mlp_rows` None = `num_layers`.

  Raises:
    ValueError: counts no model has.
  """
  head_rows, mlp_rows = interventions.rows_of_shape(
      num_layers, num_layers if num_mlp_rows is None else num_mlp_rows)
  return ([f"{row}_h{h}" for row in head_rows for h in range(num_heads)]
          + [f"{row}_mlp" for row in mlp_rows])


def effective_sparsity(accuracy_by_level: Mapping[float, float], full_accuracy: float,
                       tolerance: float = TOLERANCE) -> float:
  """The highest sparsity whose accuracy is >= full_accuracy - tolerance, scanning the levels
  from high to low and taking the first that qualifies (the original's rule); 0 (the full
  model) when none does."""
  for level in sorted(accuracy_by_level, reverse=True):
    if accuracy_by_level[level] >= full_accuracy - tolerance:
      return float(level)
  return 0.0


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
  """(mean, half-width of the two-sided 95% Student-t interval); half-width nan for one value.

  Raises:
    ValueError: no value.
  """
  values = np.asarray(values, np.float64)
  if values.size == 0:
    raise ValueError("mean_ci needs at least one value")
  if values.size == 1:
    return float(values[0]), float("nan")
  df = values.size - 1
  t = _T975[df - 1] if df <= len(_T975) else 1.96
  return float(values.mean()), float(t * values.std(ddof=1) / np.sqrt(values.size))


def effective_size(in_domain: Mapping[float, Sequence[float]],
                   out_of_domain: Mapping[float, Sequence[float]], full_in_domain: float,
                   full_out_of_domain: float, tolerance: float = TOLERANCE
                   ) -> dict[str, dict[str, float]]:
  """Effective size = 1 - effective sparsity, per pruning seed, as a mean and 95% CI.

  Args:
    in_domain, out_of_domain: {sparsity level: accuracy per pruning seed [P]} (the same levels
      and seed order in both).
    full_in_domain, full_out_of_domain: the full model's accuracies.
    tolerance: the allowed drop (absolute).

  Returns:
    {variant: {'mean', 'ci', 'per_seed' (list), 'at_highest' (the fraction of pruning seeds
    whose effective sparsity is the highest level tried: their size is an upper bound, as a
    sparser subnetwork might still be within the tolerance)}} for 'mean' (the in- and
    out-of-domain accuracies averaged, against the averaged full accuracy), 'in_domain' and
    'out_of_domain'.

  Raises:
    ValueError: the tables have different levels or numbers of seeds.
  """
  levels = sorted(in_domain)
  if sorted(out_of_domain) != levels or len({len(in_domain[l]) for l in levels}
                                            | {len(out_of_domain[l]) for l in levels}) != 1:
    raise ValueError("in_domain and out_of_domain need the same levels and pruning seeds")
  num_seeds = len(in_domain[levels[0]])
  tables = {
      "mean": ({l: [(a + b) / 2 for a, b in zip(in_domain[l], out_of_domain[l])]
                for l in levels}, (full_in_domain + full_out_of_domain) / 2),
      "in_domain": (in_domain, full_in_domain),
      "out_of_domain": (out_of_domain, full_out_of_domain),
  }
  out = {}
  for variant, (acc, full) in tables.items():
    sizes = [1.0 - effective_sparsity({l: acc[l][p] for l in levels}, full, tolerance)
             for p in range(num_seeds)]
    mean, ci = mean_ci(sizes)
    at_highest = float(np.mean([size == 1.0 - levels[-1] for size in sizes]))
    out[variant] = {"mean": mean, "ci": ci, "per_seed": sizes, "at_highest": at_highest}
  return out


def inclusion_frequency(masks) -> np.ndarray:
  """Fraction of subnetworks that keep each unit: float [U] from bool masks [P, U]."""
  return np.asarray(masks, bool).mean(axis=0)


def heuristic_core(masks) -> np.ndarray:
  """The units kept by EVERY subnetwork of `masks` (bool [P, U], e.g. the pruning seeds of one
  sparsity level of one checkpoint and training seed): bool [U].

  Raises:
    ValueError: no subnetwork.
  """
  masks = np.asarray(masks, bool)
  if masks.ndim != 2 or masks.shape[0] == 0:
    raise ValueError(f"heuristic_core needs masks [subnetworks >= 1, units], got {masks.shape}")
  return masks.all(axis=0)


def jaccard(a, b) -> float:
  """|a & b| / |a | b| of two bool unit sets (1 when both are empty)."""
  a, b = np.asarray(a, bool), np.asarray(b, bool)
  union = np.logical_or(a, b).sum()
  return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def mean_jaccard(a_sets, b_sets=None) -> float:
  """Mean Jaccard overlap of unit sets: over every pair (i < j) of `a_sets` (bool [N, U]) when
  `b_sets` is None, else over every pair of one set of `a_sets` and one of `b_sets` (bool
  [M, U]). nan when there is no pair (one set alone). Pass the head columns only
  (`[:, :num_layers * num_heads]`) to compare heads, as the paper's core does."""
  a = np.asarray(a_sets, bool)
  if b_sets is None:
    pairs = [(a[i], a[j]) for i in range(len(a)) for j in range(i + 1, len(a))]
  else:
    pairs = [(x, y) for x in a for y in np.asarray(b_sets, bool)]
  return float(np.mean([jaccard(x, y) for x, y in pairs])) if pairs else float("nan")


def random_core_size_pmf(num_units: int, sizes: Sequence[int]) -> np.ndarray:
  """float64 [num_units + 1]: the distribution of the size of the intersection ("core") of
  len(sizes) independent, uniformly random subsets of `num_units` units, subset p holding
  sizes[p] units.

  Exact: the intersection of the first p subsets holds x units; the next subset of m units
  keeps a hypergeometric number of them (population num_units, x marked, m drawn;
  `scipy.stats.hypergeom`), chained over the subsets.

  Raises:
    ValueError: no subset, or a size outside [0, num_units].
  """
  from scipy import stats  # pylint: disable=import-outside-toplevel
  sizes = [int(m) for m in sizes]
  if not sizes or any(not 0 <= m <= num_units for m in sizes):
    raise ValueError(f"need >= 1 subset sizes in [0, {num_units}], got {sizes}")
  pmf = np.zeros(num_units + 1)
  pmf[sizes[0]] = 1.0
  support = np.arange(num_units + 1)
  for m in sizes[1:]:
    nxt = np.zeros_like(pmf)
    for x in np.flatnonzero(pmf):
      nxt += pmf[x] * stats.hypergeom(num_units, x, m).pmf(support)
    pmf = nxt
  return pmf


def expected_random_jaccard(num_units: int, a: int, b: int) -> float:
  """E[|A & B| / |A | B|] of two independent uniformly random subsets of sizes a and b out of
  `num_units` units (1 when both are empty, as `jaccard`): |A & B| is hypergeometric.

  Raises:
    ValueError: a size outside [0, num_units].
  """
  from scipy import stats  # pylint: disable=import-outside-toplevel
  if not (0 <= a <= num_units and 0 <= b <= num_units):
    raise ValueError(f"subset sizes must lie in [0, {num_units}], got {a} and {b}")
  if a == 0 and b == 0:
    return 1.0
  x = np.arange(min(a, b) + 1)
  return float(np.sum(stats.hypergeom(num_units, a, b).pmf(x) * x / (a + b - x)))


RANDOM_MASK_DRAWS = 10_000  # simulated sets of random masks behind the intervals


def random_mask_baseline(num_units: int, sizes: Sequence[int], observed_core: int | None = None,
                         num_draws: int = RANDOM_MASK_DRAWS, seed: int = 0
                         ) -> dict[str, float]:
  """What random masks of the same sparsity give: the baseline of the heuristic core and of the
  overlap of subnetworks (Bhaskar et al. 2024 §5 compare the core with random heads in the
  ablation only; this is the baseline of its size).

  Random masks: len(sizes) independent, uniformly random subsets of the `num_units` units
  (pass the heads: `num_units` = num_layers * num_heads and each observed mask's head count),
  mask p keeping sizes[p] of them.

  Args:
    num_units: how many units a mask chooses from (U).
    sizes: int [P] units kept by each observed mask.
    observed_core: the observed core's size, for 'core_p_value' (None: no p-value).
    num_draws: simulated sets of P random masks for the intervals.
    seed: numpy seed of the simulation.

  Returns:
    'core_mean': E[core size], exact (U * prod_p sizes[p] / U; `random_core_size_pmf`);
    'core_q025', 'core_q975': the 2.5% and 97.5% percentiles of the simulated core sizes (a
    95% range of random cores, not an interval of a mean); 'core_p_value': the exact one-sided
    P(random core size >= observed_core) (nan without it); 'jaccard_mean': the exact expected
    mean pairwise Jaccard of the P masks (nan for P = 1; `expected_random_jaccard`);
    'jaccard_q025', 'jaccard_q975': its simulated 2.5% / 97.5% percentiles; 'num_draws'.

  Raises:
    ValueError: as `random_core_size_pmf`, or num_draws < 1.
  """
  if num_draws < 1:
    raise ValueError(f"num_draws must be >= 1, got {num_draws}")
  sizes = [int(m) for m in sizes]
  pmf = random_core_size_pmf(num_units, sizes)
  out = {"core_mean": float(np.dot(np.arange(num_units + 1), pmf)), "num_draws": num_draws,
         "core_p_value": (float(pmf[int(observed_core):].sum()) if observed_core is not None
                          else float("nan"))}
  pairs = [(p, q) for p in range(len(sizes)) for q in range(p + 1, len(sizes))]
  out["jaccard_mean"] = (float(np.mean([expected_random_jaccard(num_units, sizes[p], sizes[q])
                                        for p, q in pairs])) if pairs else float("nan"))
  rng = np.random.default_rng(seed)
  u = rng.random((num_draws, len(sizes), num_units))
  kept = np.asarray(sizes)
  # mask p keeps its sizes[p] units with the smallest draws: [D, P, U]
  threshold = np.take_along_axis(np.sort(u, -1), np.maximum(kept - 1, 0)[None, :, None], -1)
  masks = (u <= threshold) & (kept > 0)[None, :, None]
  cores = masks.all(axis=1).sum(-1)
  out["core_q025"], out["core_q975"] = (float(q) for q in np.percentile(cores, [2.5, 97.5]))
  if pairs:
    as_float = masks.astype(np.float32)
    inter = np.rint(as_float @ np.swapaxes(as_float, 1, 2))  # [D, P, P] shared units
    union = kept[:, None] + kept[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
      jac = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
    p_idx, q_idx = np.triu_indices(len(sizes), 1)
    means = jac[:, p_idx, q_idx].mean(-1)
    out["jaccard_q025"], out["jaccard_q975"] = (float(q) for q in
                                                np.percentile(means, [2.5, 97.5]))
  else:
    out["jaccard_q025"] = out["jaccard_q975"] = float("nan")
  return out


def core_kept(subnetworks, kernel) -> float:
  """Mean over the subnetworks (bool [P, U]) of the fraction of the core's units (bool [U])
  they keep; nan when the core is empty."""
  kernel = np.asarray(kernel, bool)
  if not kernel.any():
    return float("nan")
  return float(np.asarray(subnetworks, bool)[:, kernel].mean())


def force_units(mask, keep: Sequence[int] = (), remove: Sequence[int] = ()) -> np.ndarray:
  """A copy of `mask` (bool [..., U]) with the units `keep` forced in and `remove` forced out.

  Raises:
    ValueError: a unit both kept and removed, or out of range.
  """
  mask = np.array(mask, bool)
  both = set(keep) & set(remove)
  bad = [u for u in list(keep) + list(remove) if not 0 <= u < mask.shape[-1]]
  if both or bad:
    raise ValueError(f"units forced both in and out {sorted(both)} or out of range {bad} "
                     f"(units: {mask.shape[-1]})")
  mask[..., list(keep)] = True
  mask[..., list(remove)] = False
  return mask


def remove_one_at_a_time(mask, units: Sequence[int]) -> np.ndarray:
  """bool [len(units), U]: `mask` (bool [U]) with each of `units` removed in turn."""
  return np.stack([force_units(mask, remove=[u]) for u in units])


ABLATION_UNITS = ("heads", "all")


def without_core(core, num_heads_total: int, units: str = "heads") -> np.ndarray:
  """bool [U]: the full model without the core's heads ("heads": every MLP block kept) or
  without every core unit ("all"); `core` bool [U] in `flat_units` order.

  Raises:
    ValueError: an unknown `units`.
  """
  if units not in ABLATION_UNITS:
    raise ValueError(f"core ablation units must be one of {ABLATION_UNITS}, got {units!r}")
  kept = ~np.asarray(core, bool)
  if units == "heads":
    kept[num_heads_total:] = True
  return kept


def core_ablation_masks(core, num_heads_total: int, num_draws: int, seed: int = 0,
                        units: str = "heads") -> tuple[np.ndarray, np.ndarray]:
  """Full-model masks for core ablation and its random baseline.

  Args:
    core: bool [U] (`flat_units` order), the core.
    num_heads_total: how many of the U units are heads (num_layers * num_heads); the baseline
      draws only heads, as many as the core has heads, outside the core.
    num_draws: random draws.
    seed: numpy seed of the draws.
    units: "heads" (the paper's core is a set of heads, Bhaskar et al. 2024 §5): the core's
      heads are removed and every MLP block is kept, in the core ablation and in the draws;
      "all": the core's MLP blocks are removed too, in both.

  Returns:
    (bool [U]: the full model without the core's heads (and MLP blocks for "all"); bool
    [num_draws, U]: the full model without as many random non-core heads as the core has
    heads (and the core's MLP blocks for "all")).

  Raises:
    ValueError: fewer non-core heads than core heads, or an unknown `units`.
  """
  core = np.asarray(core, bool)
  ablate_core = without_core(core, num_heads_total, units)
  core_heads = np.flatnonzero(core[:num_heads_total])
  others = np.flatnonzero(~core[:num_heads_total])
  if len(others) < len(core_heads):
    raise ValueError(f"the core has {len(core_heads)} heads but only {len(others)} heads are "
                     "outside it: no random baseline of the same size")
  rng = np.random.default_rng(seed)
  draws = np.ones((num_draws, core.size), bool)
  draws[:, num_heads_total:] = ablate_core[num_heads_total:]
  for d in range(num_draws):
    draws[d, rng.choice(others, size=len(core_heads), replace=False)] = False
  return ablate_core, draws
