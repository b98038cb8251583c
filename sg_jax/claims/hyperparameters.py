"""Claims about what decides whether a seed groks (issue 52's two questions): weight decay
(Power et al. 2022; Liu et al. 2023, "Omnigrok") and the initialisation against the data order
(van der Wal et al. 2025, PolyPythias).

Both read runs that vary the field per seed (`--config.optim.weight_decay="(0,0,0.1,0.1,...)"`;
`--config.seeds.init=... --config.seeds.data=...`, docs/usage.md), written before any such run
was seen.
"""

from __future__ import annotations

import numpy as np

from sg_jax import stats
from sg_jax.claims import own
from sg_jax.claims import registry
from sg_jax.claims import select
from sg_jax.claims.registry import Item, Outcome
from sg_jax.report import crossed_seeds
from sg_jax.report import tables
from sg_jax.report.reading import GEN_ACC
from sg_jax.stats import crossed

WEIGHT_DECAY = "optim.weight_decay"
TAU_OF_INTEREST = own.TAU_OF_INTEREST
# "Generalises" = out-of-domain accuracy above this at an evaluation (the report's threshold).
THRESHOLD = 0.8
# A factor "decides" when it explains at least this partial eta squared of final generalisation.
ETA2_OF_INTEREST = 0.3


def _dose_arms(run, field: str) -> dict[float, list[int]] | None:
  """{dose: [seed]} of a run that varies numeric `field` per seed (>= 2 doses), else None."""
  doses = select.per_seed_values(run, field)
  if doses is None:
    return None
  arms: dict[float, list[int]] = {}
  for seed, dose in doses.items():
    if isinstance(dose, (int, float)) and not isinstance(dose, bool):
      arms.setdefault(float(dose), []).append(seed)
  return dict(sorted(arms.items())) if len(arms) >= 2 else None


def _crossing(run, seed: int) -> tuple[float, bool] | None:
  """(first step with out-of-domain accuracy > THRESHOLD, True), or (last evaluated step,
  False) for a seed that never got there (censored); None without evaluations."""
  curve = run.series.get(GEN_ACC, {}).get(seed)
  if curve is None or not np.isfinite(curve[1]).any():
    return None
  steps, values = curve
  keep = np.isfinite(values)
  above = tables.first_above(steps[keep], values[keep], THRESHOLD)
  if above is not None:
    return float(above), True
  return float(steps[keep][-1]), False


@registry.claim(
    id="grokking.weight_decay_reliable",
    source="Power et al. 2022 (Fig. 2, weight decay most effective); Liu et al. 2023 "
           "(Omnigrok, Sec. 3): weight decay drives grokking",
    statement="more weight decay makes hierarchical generalisation more reliable: final "
              "out-of-domain accuracy increases with the weight decay",
    needs="a run with per-seed optim.weight_decay: final out_of_domain/accuracy",
    test="Jonckheere-Terpstra over the weight-decay values",
    rule="supported if final generalisation increases with weight decay (p < 0.05, Holm over "
         "runs), contradicted if it decreases, else not testable",
    effect_of_interest=TAU_OF_INTEREST)
def weight_decay_reliable(runs) -> list[Outcome]:
  return registry.family(own.dose_items(runs, WEIGHT_DECAY), +1, TAU_OF_INTEREST)


@registry.claim(
    id="grokking.weight_decay_earlier",
    source="Power et al. 2022 (Fig. 2); Liu et al. 2023 (Omnigrok, Sec. 3): weight decay "
           "shortens the wait before generalisation",
    statement="with the largest weight decay seeds generalise sooner than without (the "
              "smallest value)",
    needs="a run with per-seed optim.weight_decay: out_of_domain/accuracy at every evaluation",
    test="log-rank test of the first step with out-of-domain accuracy > 0.8 (seeds that never "
         "get there censored at their last evaluation), largest against smallest weight decay",
    rule="supported if the largest weight decay crosses sooner (log hazard ratio > 0, p < "
         "0.05, Holm over runs), contradicted if later, else not testable")
def weight_decay_earlier(runs) -> list[Outcome]:
  items = []
  for run in runs:
    arms_of = _dose_arms(run, WEIGHT_DECAY)
    if arms_of is None or not run.series.get(GEN_ACC):
      continue
    (low, low_seeds), (high, high_seeds) = list(arms_of.items())[0], list(arms_of.items())[-1]
    arms = []
    for seeds in (low_seeds, high_seeds):
      found = [c for c in (_crossing(run, s) for s in seeds) if c is not None]
      arms.append(([t for t, _ in found], [r for _, r in found]))
    if not (arms[0][0] and arms[1][0]):
      continue
    test = stats.logrank(*arms[0], *arms[1])
    items.append(Item(f"{run.name}: weight decay {high:g} vs {low:g}",
                      (len(arms[0][0]), len(arms[1][0])), test,
                      note=f"seeds above {THRESHOLD:g} at some evaluation: "
                           f"{sum(arms[0][1])}/{len(arms[0][1])} at {low:g}, "
                           f"{sum(arms[1][1])}/{len(arms[1][1])} at {high:g}"))
  return registry.family(items, +1)


def _factor_test(result: crossed.CrossedResult, k: int) -> stats.Test:
  f = result.factors[k]
  return stats.Test(f"restricted permutation (SS of {f.name} within {result.factors[1 - k].name})",
                    f.share, f.p, (f.levels,) * 2, f.partial_eta2, f.detectable,
                    alternative="greater", min_p=f.min_p)


def _crossed_claim(k: int):
  def evaluate(runs) -> list[Outcome]:
    items = []
    for run in runs:
      got = crossed_seeds.run_analysis(run)
      if got is None:
        continue
      result = got["generalisation"]
      if isinstance(result, str):
        items.append(registry.untestable(run.name, (len(got["seeds"]),),
                                         "restricted permutation", result))
        continue
      by_rule = got["rule_result"]
      rule_note = ""
      if not isinstance(by_rule, str) and by_rule.total_ss > 0:
        rule_note = (f"; final rule: share {by_rule.factors[k].share:.2f}, "
                     f"p = {by_rule.factors[k].p:.3g}")
      f = result.factors[k]
      items.append(Item(
          f"{run.name}: {result.factors[0].levels} initialisations x "
          f"{result.factors[1].levels} data orders, {result.per_cell} seed(s) each",
          (f.levels, result.factors[1 - k].levels), _factor_test(result, k),
          note=f"share of the variance of final generalisation: seeds.init "
               f"{result.factors[0].share:.2f}, seeds.data {result.factors[1].share:.2f}, "
               f"rest {result.residual_share:.2f}; partial eta^2 {f.partial_eta2:.2f}"
               + rule_note))
    return registry.family(items, +1, ETA2_OF_INTEREST)
  return evaluate


for _k, _what, _source in (
    (0, "init", "van der Wal et al. 2025 (PolyPythias, Sec. 4): the initialisation seed "
                "matters for a model's training dynamics"),
    (1, "data", "van der Wal et al. 2025 (PolyPythias, Sec. 4): the data-order seed matters "
                "for a model's training dynamics")):
  registry.register(registry.Claim(
      id=f"grokking.{_what}_seed_decides",
      source=_source,
      statement=f"the {'initialisation' if _what == 'init' else 'data order'} explains part of "
                f"which seeds generalise hierarchically (final out-of-domain accuracy)",
      needs="a run crossing per-seed seeds.init with seeds.data (balanced): final "
            "out_of_domain/accuracy and the final rule",
      test="share of variance (two-way sums of squares) with a permutation test within the "
           "other factor's levels (sg_jax.stats.crossed)",
      rule="supported if the factor's sum of squares exceeds chance (one-sided p < 0.05); "
           "otherwise not testable at this n, with the partial eta squared the design detects "
           f"(effect of interest {ETA2_OF_INTEREST:g})",
      evaluate=_crossed_claim(_k), effect_of_interest=ETA2_OF_INTEREST))
