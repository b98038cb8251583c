"""Bhaskar, Friedman & Chen, "The heuristic core" (ACL 2024, arXiv 2403.03942; docs/REFERENCE.md
§2, docs/pruning.md): four claims, read from the pruning tables of a workdir (`pruning.csv`,
`pruning/masks_step<N>.npz`, `pruning_core.csv`; `report.pruning_tables.load_pruning`).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import scipy.stats

from sg_jax import stats
from sg_jax.claims import detect
from sg_jax.claims import onesample
from sg_jax.claims import registry
from sg_jax.claims import select
from sg_jax.claims.registry import Item, Outcome
from sg_jax.pruning import core
from sg_jax.report import pruning_tables

# docs/REFERENCE.md §2 (Bhaskar et al. 2024): subnetworks "within 3% of the full model's accuracy".
IN_DOMAIN_TOLERANCE = 0.03
# The smallest range of out-of-domain accuracy among such subnetworks that counts as differing.
RANGE_OF_INTEREST = 0.05
# Accuracy (core ablation) and Jaccard (core formation) differences that matter.
ACCURACY_OF_INTEREST = 0.1
JACCARD_OF_INTEREST = 0.2


def _pruned(runs):
  """[(run, Pruning)] of the runs with finished pruning runs."""
  out = []
  for run in runs:
    data = pruning_tables.load_pruning(run.workdir, run.name)
    if data is not None:
      out.append((run, data))
  return out


def _lines(run) -> int:
  """Out-of-domain lines behind one accuracy of `pruning.csv`: the `--eval_lines` that
  `sg_jax.prune` recorded in `pruning.csv.options.json`, or (0, or a table from before it was
  recorded) the run's `eval.max_lines` (2000 when absent)."""
  path = os.path.join(run.workdir, pruning_tables.PRUNING_CSV + ".options.json")
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      recorded = int(json.load(f).get("eval_lines", 0) or 0)
    if recorded > 0:
      return recorded
  return int(run.config.get("eval", {}).get("max_lines", 2000) or 2000)


@registry.claim(
    id="bhaskar.equal_in_domain_differ", source="Bhaskar et al. 2024; docs/REFERENCE.md §2",
    statement="subnetworks with the same in-domain accuracy differ widely out of domain",
    needs="pruning.csv: in- and out-of-domain accuracy of every subnetwork and of the full model",
    test="chi-square homogeneity of out-of-domain accuracy (lines correct) across the "
         "subnetworks of one training seed and level",
    rule=f"subnetworks within {IN_DOMAIN_TOLERANCE} of the full model's in-domain accuracy, last "
         "pruned step, per (training seed, level) with >= 2 of them; the unit is the evaluation "
         "line (the pruning's --eval_lines, else eval.max_lines, lines per accuracy). "
         f"Supported if the out-of-domain range is >= "
         f"{RANGE_OF_INTEREST} and homogeneity is rejected (p < 0.05, Holm over groups) in a "
         "majority of groups; contradicted if no group rejects and every group's detectable "
         f"difference is < {RANGE_OF_INTEREST}; else not testable",
    effect_of_interest=RANGE_OF_INTEREST)
def equal_in_domain_differ(runs) -> list[Outcome]:
  out = []
  for run, data in _pruned(runs):
    step = data.steps[-1]
    n_lines = _lines(run)
    groups = []
    for seed in data.seeds(step):
      full_in = data.full.get((step, seed), {}).get(pruning_tables.IN_ACC)
      if full_in is None:
        continue
      for level, by_ps in sorted(data.runs[(step, seed)].items()):
        ood = [v[pruning_tables.GEN_ACC] for v in by_ps.values()
               if v.get(pruning_tables.IN_ACC, -1) >= full_in - IN_DOMAIN_TOLERANCE
               and math.isfinite(v.get(pruning_tables.GEN_ACC, math.nan))]
        if len(ood) >= 2:
          groups.append((seed, level, np.array(ood)))
    if not groups:
      continue
    ps, ranges, detect = [], [], []
    for _, _, ood in groups:
      correct = np.round(ood * n_lines)
      table = np.stack([correct, n_lines - correct])
      if np.ptp(correct) == 0:
        ps.append(1.0)
      else:
        ps.append(float(scipy.stats.chi2_contingency(table, correction=False).pvalue))
      ranges.append(float(np.ptp(ood)))
      p_bar = float(np.clip(ood.mean(), 1 / n_lines, 1 - 1 / n_lines))
      z = scipy.stats.norm.ppf(0.975) + scipy.stats.norm.ppf(0.8)
      detect.append(float(z * math.sqrt(2 * p_bar * (1 - p_bar) / n_lines)))
    adjusted = [float(q) for q in stats.holm(ps)] if len(ps) > 1 else ps
    differ = sum(p < registry.ALPHA and r >= RANGE_OF_INTEREST
                 for p, r in zip(adjusted, ranges))
    if differ > len(groups) / 2:
      verdict = registry.SUPPORTED
    elif differ == 0 and all(p >= registry.ALPHA for p in adjusted) and max(detect) < \
        RANGE_OF_INTEREST:
      verdict = registry.CONTRADICTED
    else:
      verdict = registry.NOT_TESTABLE
    out.append(Outcome(
        setting=f"{run.name}, step {step}, {len(groups)} (training seed, level) groups",
        arms=tuple(len(g[2]) for g in groups), test="chi-square homogeneity (lines)",
        statistic=max(ranges), p=min(ps), p_adjusted=min(adjusted), verdict=verdict,
        effect=max(ranges), detectable=max(detect),
        note=f"{differ} of {len(groups)} groups differ (range >= {RANGE_OF_INTEREST}, Holm "
             f"p < 0.05); out-of-domain ranges " + ", ".join(f"{r:.3f}" for r in ranges)
             + f"; {n_lines} lines per accuracy"))
  return out


@registry.claim(
    id="bhaskar.shared_core", source="Bhaskar et al. 2024, §5",
    statement="all subnetworks of a model share a core of heads",
    needs="pruning/masks_step<N>.npz of the last pruned step",
    test="exact test of the core's size against the intersection of random head sets of the "
         "same sizes (chained hypergeometric, `pruning.core.random_core_size_pmf`)",
    rule="per level, last pruned step: the heads in every pruning seed's subnetwork, summed over "
         "training seeds, against the distribution of that sum for uniformly random head sets "
         "of each subnetwork's size (the training seeds' exact distributions convolved); "
         "supported if larger than chance (two-sided p < 0.05, twice the smaller tail, Holm "
         "over levels), contradicted if smaller, else not testable. Detectable effect: the "
         "fewest heads above the random expectation that reach p < 0.05 (a critical value, "
         "not an effect detected with power 0.8)")
def shared_core(runs) -> list[Outcome]:
  out = []
  for run, data in _pruned(runs):
    step = data.steps[-1]
    masks = data.masks.get(step)
    if not masks or data.shape is None:
      continue
    num_heads = data.shape[0] * data.shape[1]
    by_level: dict = {}
    for (seed, level), subnetworks in sorted(masks.items()):
      heads = np.asarray(subnetworks, bool)[:, :num_heads]
      if heads.shape[0] >= 2:
        by_level.setdefault(level, []).append(heads)
    rows = []
    for level, sets in sorted(by_level.items()):
      observed = sum(int(h.all(axis=0).sum()) for h in sets)
      pmf = np.ones(1)
      for h in sets:  # the sum of independent cores: convolve their distributions
        pmf = np.convolve(pmf, core.random_core_size_pmf(num_heads, h.sum(axis=1).tolist()))
      k = np.arange(pmf.size)
      expected = float(np.sum(k * pmf))
      upper = np.cumsum(pmf[::-1])[::-1]  # P(total >= k)
      p_high = float(upper[observed]) if observed < pmf.size else 0.0
      p_low = float(np.sum(pmf[:observed + 1]))
      reach = np.flatnonzero(2.0 * upper < registry.ALPHA)
      detect_at = float(reach[0] - expected) if reach.size else math.inf
      rows.append((level, sets, observed, expected, min(1.0, p_high), min(1.0, p_low),
                   detect_at))
    if not rows:
      continue
    two_sided = [min(1.0, 2.0 * min(r[4], r[5])) for r in rows]  # two one-sided tails
    adjusted = stats.holm(two_sided) if len(rows) > 1 else two_sided
    for (level, sets, observed, expected, p_high, p_low, detect), q in zip(rows, adjusted):
      q = float(q)
      verdict = (registry.SUPPORTED if q < registry.ALPHA and p_high <= p_low else
                 registry.CONTRADICTED if q < registry.ALPHA else registry.NOT_TESTABLE)
      out.append(Outcome(
          setting=f"{run.name}, step {step}, sparsity {level:g}",
          arms=tuple(h.shape[0] for h in sets), test="exact, random head sets",
          statistic=float(observed), p=min(1.0, 2.0 * min(p_high, p_low)), p_adjusted=q,
          verdict=verdict,
          effect=observed - expected, detectable=detect,
          note=f"core heads {observed} over {len(sets)} training seeds, random expectation "
               f"{expected:.2f} (arms: pruning seeds per training seed)"))
  return out


@registry.claim(
    id="bhaskar.core_forms_early", source="Bhaskar et al. 2024; docs/REFERENCE.md §2",
    statement="the core forms early in training",
    needs="pruning masks at an early step at or after in-domain saturation and at the last "
          "step",
    test="sign-flip permutation (paired by training seed) of the head-core Jaccard with the "
         "final core minus its random-set expectation",
    rule="early step = the first pruned step at or after the seed's in-domain saturation and "
         "before "
         "the last pruned step; per level: supported if the early core overlaps the final core "
         "more than random head sets of the same sizes do (exact hypergeometric expectation; "
         "p < 0.05, Holm over levels), contradicted if less, else not testable",
    effect_of_interest=JACCARD_OF_INTEREST)
def core_forms_early(runs) -> list[Outcome]:
  items = []
  for run, data in _pruned(runs):
    if data.shape is None or len(data.masks) < 2:
      continue
    last = max(data.masks)
    num_heads = data.shape[0] * data.shape[1]
    by_level: dict = {}
    unsaturated = 0
    for (seed, level), final_sets in data.masks[last].items():
      sat = select.saturation(run, seed)
      early = [s for s in sorted(data.masks) if s < last and sat is not None and s >= sat
               and (seed, level) in data.masks[s]]
      if not early:
        unsaturated += sat is None
        continue
      core_early = np.asarray(data.masks[early[0]][(seed, level)], bool)[:, :num_heads].all(0)
      core_final = np.asarray(final_sets, bool)[:, :num_heads].all(0)
      union = np.sum(core_early | core_final)
      jaccard = float(np.sum(core_early & core_final) / union) if union else 1.0
      chance = core.expected_random_jaccard(num_heads, int(core_early.sum()),
                                            int(core_final.sum()))
      by_level.setdefault(level, []).append((jaccard, chance, early[0]))
    if not any(len(v) >= 2 for v in by_level.values()):
      items.append(registry.untestable(
          f"{run.name}, pruned steps " + "/".join(map(str, sorted(data.masks))), (),
          "sign-flip permutation (paired mean)",
          f"fewer than 2 training seeds have a pruned step after in-domain saturation and "
          f"before step {last} ({unsaturated} (seed, level) groups never saturate)"))
    for level, values in sorted(by_level.items()):
      if len(values) < 2:
        continue
      j, c = np.array([v[0] for v in values]), np.array([v[1] for v in values])
      items.append(Item(f"{run.name}, sparsity {level:g}, steps "
                        + "/".join(sorted({str(v[2]) for v in values})) + f" vs {last}",
                        (len(values),), onesample.paired_test(j, c), detect.paired(j, c),
                        note=f"head-core Jaccard with the final core {j.mean():.2f}, chance "
                             f"{c.mean():.2f} (training seeds)"))
  return registry.family(items, +1, JACCARD_OF_INTEREST)


@registry.claim(
    id="bhaskar.core_ablation", source="Bhaskar et al. 2024, §5",
    statement="removing the core hurts generalisation more than removing as many random heads",
    needs="pruning_core.csv ablation rows (sg_jax.prune_core)",
    test="sign-flip permutation (paired by training seed) of out-of-domain accuracy with random "
         "heads removed minus with the core removed",
    rule="per level at the last step with ablation rows: supported if the difference is "
         "positive (p < 0.05, Holm over levels), contradicted if negative, else not testable",
    effect_of_interest=ACCURACY_OF_INTEREST)
def core_ablation(runs) -> list[Outcome]:
  items = []
  name = pruning_tables.GEN_ACC
  for run, data in _pruned(runs):
    steps = sorted({k[0] for k in data.core_rows
                    if f"core_ablation/{name}" in data.core_rows[k]})
    if not steps:
      continue
    step = steps[-1]
    by_level: dict = {}
    for (s, seed, level), values in sorted(data.core_rows.items(),
                                           key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
      if s != step or level is None:
        continue
      core_v = values.get(f"core_ablation/{name}", math.nan)
      rand_v = values.get(f"random_ablation/{name}", math.nan)
      if math.isfinite(core_v) and math.isfinite(rand_v):
        by_level.setdefault(level, []).append((rand_v, core_v))
    for level, pairs in sorted(by_level.items()):
      if len(pairs) < 2:
        continue
      rand_v, core_v = np.array(pairs).T
      items.append(Item(f"{run.name}, step {step}, sparsity {level:g}", (len(pairs),),
                        onesample.paired_test(rand_v, core_v), detect.paired(rand_v, core_v),
                        note=f"out-of-domain accuracy, core removed {core_v.mean():.3f}, random "
                             f"heads removed {rand_v.mean():.3f} (training seeds)"))
  return registry.family(items, +1, ACCURACY_OF_INTEREST)
