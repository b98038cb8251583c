"""sg_jax's own claims (docs/tree_regularisation.md, docs/data.md, docs/objectives.md): dose
responses over a per-seed config field, and the comparison of training objectives.
"""

from __future__ import annotations

import numpy as np

from sg_jax import stats
from sg_jax.claims import detect
from sg_jax.claims import registry
from sg_jax.claims import select
from sg_jax.claims.registry import Item, Outcome
from sg_jax.report import objectives as objectives_lib
from sg_jax.report.reading import GEN_ACC

TAU_OF_INTEREST = 0.3
PREFERENCE_OF_INTEREST = 0.15
PREFERENCE = "out_of_domain/preference"


def dose_items(runs, field: str, keep=lambda dose: True) -> list[Item]:
  """One Jonckheere-Terpstra item per run that varies `field` per seed: final generalisation
  of each dose's seeds, doses ascending (those `keep` accepts; >= 2 needed)."""
  items = []
  for run in runs:
    doses = select.per_seed_values(run, field)
    if doses is None or not run.series.get(GEN_ACC):
      continue
    by_dose: dict = {}
    for seed, dose in doses.items():
      if isinstance(dose, (int, float)) and not isinstance(dose, bool) and keep(dose):
        by_dose.setdefault(float(dose), []).append(select.final(run, GEN_ACC, seed))
    if len(by_dose) < 2:
      continue
    levels = sorted(by_dose)
    arms = [np.asarray(by_dose[d], np.float64) for d in levels]
    items.append(Item(f"{run.name}: {field} = " + " / ".join(f"{d:g}" for d in levels),
                      tuple(a.size for a in arms), stats.ordered_trend(arms),
                      detect.trend(len(arms)),
                      note="final generalisation means " + " / ".join(
                          f"{np.nanmean(a):.3f}" for a in arms)))
  return items


@registry.claim(
    id="sg_jax.tree_dose_response",
    source="docs/tree_regularisation.md (TreeReg as sg_jax's `tree` term)",
    statement="promoting tree structure (tree.lambdas >= 0) raises final generalisation with "
              "its strength",
    needs="a run with per-seed tree.lambdas: final out_of_domain/accuracy",
    test="Jonckheere-Terpstra over the non-negative strengths",
    rule="supported if generalisation increases with the strength (p < 0.05, Holm over runs), "
         "contradicted if it decreases, else not testable",
    effect_of_interest=TAU_OF_INTEREST)
def tree_dose_response(runs) -> list[Outcome]:
  return registry.family(dose_items(runs, "tree.lambdas", lambda d: d >= 0), +1,
                         TAU_OF_INTEREST)


@registry.claim(
    id="sg_jax.disambiguating_lines",
    source="docs/data.md (Ahuja et al. 2024 add disambiguating questions)",
    statement="adding disambiguating questions to training raises final generalisation with "
              "their number",
    needs="a run with per-seed data.num_disambiguating: final out_of_domain/accuracy",
    test="Jonckheere-Terpstra over the numbers of disambiguating lines",
    rule="supported if generalisation increases with the number (p < 0.05, Holm over runs), "
         "contradicted if it decreases, else not testable",
    effect_of_interest=TAU_OF_INTEREST)
def disambiguating_lines(runs) -> list[Outcome]:
  return registry.family(dose_items(runs, "data.num_disambiguating"), +1, TAU_OF_INTEREST)


@registry.claim(
    id="sg_jax.lm_generalises_best",
    source="docs/objectives.md (Ahuja et al. 2024: only the LM objective generalises "
           "hierarchically)",
    statement="the causal LM objective ends with a higher out-of-domain preference than "
              "prefix_lm and mlm",
    needs="runs of >= 2 objectives logging out_of_domain/preference (unregularised seeds)",
    test="permutation test of the difference of means (lm minus the other objective)",
    rule="per task and other objective (and depth; tasks never pooled): supported if lm is "
         "higher (p < 0.05, Holm over the comparisons), contradicted if lower, else not testable. The objectives may be read at "
         "different steps (each run's last evaluation), which the note gives",
    effect_of_interest=PREFERENCE_OF_INTEREST)
def lm_generalises_best(runs) -> list[Outcome]:
  items = []
  tasks = sorted({r.task or "" for r in runs})
  for task in tasks:  # never pool seeds of different tasks
    items += _lm_items([r for r in runs if (r.task or "") == task],
                       f"{task}: " if len(tasks) > 1 else "")
  return registry.family(items, +1, PREFERENCE_OF_INTEREST)


def _lm_items(runs, prefix: str) -> list[Item]:
  grouped = objectives_lib.by_objective(runs)
  items = []
  for (objective, depth), members in grouped.items():
    if objective == "lm" or ("lm", depth) not in grouped:
      continue
    arms = []
    steps = []
    for group in (members, grouped[("lm", depth)]):
      values = [select.final(r, PREFERENCE, s) for r in group
                for s in objectives_lib.unregularised_seeds(r)]
      arms.append(np.asarray(values, np.float64))
      steps.append(max(int(c[0][-1]) for r in group for c in r.series[PREFERENCE].values()
                       if len(c[0])))
    if not select.comparable(*arms):
      continue
    label = objectives_lib.group_label((objective, depth))
    items.append(Item(f"{prefix}lm vs {label}", tuple(a.size for a in arms),
                      stats.compare_means(*arms), detect.mean_difference(*arms),
                      note=f"final preference {np.nanmean(arms[1]):.3f} (lm, step {steps[1]}) "
                           f"vs {np.nanmean(arms[0]):.3f} ({objective}, step {steps[0]})"))
  return items
