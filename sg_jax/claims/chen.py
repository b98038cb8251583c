"""Chen, Shwartz-Ziv, Cho, Leavitt & Saphra, "Sudden drops in the loss" (ICLR 2024, arXiv
2309.07311; docs/REFERENCE.md §3, docs/sas.md): three claims, read from runs whose seeds carry
SAS regulariser strengths (`sas.lambdas`, `sas.ends` per seed) and from every run that logged
UAS.
"""

from __future__ import annotations

import math

import numpy as np

from sg_jax import stats
from sg_jax.analysis import onset_detection
from sg_jax.analysis import onsets as onsets_lib
from sg_jax.claims import detect
from sg_jax.claims import onesample
from sg_jax.claims import registry
from sg_jax.claims import select
from sg_jax.claims.registry import Item, Outcome
from sg_jax.report import objectives as objectives_lib
from sg_jax.report.reading import GEN_ACC

UAS = "in_domain/uas"
UAS_OF_INTEREST = 0.05
ACCURACY_OF_INTEREST = 0.15
# "Most seeds": the fraction of seeds whose structure onset meets a loss drop, tested against
# one half.
PROPORTION_NULL = 0.5
PROPORTION_OF_INTEREST = 0.35


def _regimes(run) -> dict[str, list[int]] | None:
  """{'control' | 'suppressed' | 'promoted' | 'brief': seeds} of a run whose seeds carry SAS
  strengths (None: not such a run, or no control). brief = suppressed with a window end
  (`sas.ends` > 0); control = SAS strength 0 and every other loss term off too
  (`select.unregularised`)."""
  lambdas = select.per_seed_values(run, "sas.lambdas")
  if lambdas is None:
    return None
  out: dict[str, list[int]] = {}
  for seed, lam in lambdas.items():
    end = select.field_value(run, "sas.ends", seed) or 0
    lam = float(lam)
    kind = ("control" if lam == 0 else "brief" if lam > 0 and end > 0 else
            "suppressed" if lam > 0 else "promoted" if end == 0 else "promoted_brief")
    out.setdefault(kind, []).append(seed)
  if "control" in out:
    out["control"] = select.unregularised(run, out["control"])
  return out if out.get("control") else None


@registry.claim(
    id="chen.regulariser_moves_uas", source="Chen et al. 2024; docs/REFERENCE.md §3",
    statement="the SAS regulariser moves UAS: suppression lowers it, promotion raises it",
    needs="a run with per-seed sas.lambdas including 0: final in_domain/uas",
    test="permutation test of the difference of means (regime minus unregularised seeds)",
    rule="per run and regime run throughout (sas.ends 0): suppressed (lambda > 0) predicted "
         "lower, promoted (lambda < 0) higher; supported if the difference has the predicted "
         "sign with p < 0.05 (Holm over regimes), contradicted if the other sign, else not "
         "testable",
    effect_of_interest=UAS_OF_INTEREST)
def regulariser_moves_uas(runs) -> list[Outcome]:
  items, directions = [], []
  for run in runs:
    regimes = _regimes(run)
    if regimes is None or not run.series.get(UAS):
      continue
    control = np.array([select.final(run, UAS, s) for s in regimes["control"]])
    for kind, direction in (("suppressed", -1), ("promoted", +1)):
      if kind not in regimes:
        continue
      arm = np.array([select.final(run, UAS, s) for s in regimes[kind]])
      if not select.comparable(control, arm):
        continue
      items.append(Item(f"{run.name}: {kind} vs unregularised", (control.size, arm.size),
                        stats.compare_means(control, arm), detect.mean_difference(control, arm),
                        note=f"final UAS {np.nanmean(arm):.3f} vs {np.nanmean(control):.3f}"))
      directions.append(direction)
  return registry.family(items, directions, UAS_OF_INTEREST)


@registry.claim(
    id="chen.structure_with_loss_drop", source="Chen et al. 2024, §3 and fig. 1",
    statement="syntactic attention structure appears together with a drop in the loss",
    needs="runs logging in_domain/uas and train/loss at >= 9 points per seed (unregularised "
          "seeds)",
    test="exact binomial test of the fraction of seeds whose structure onset is tied with a loss "
         "drop at the onsets' resolution, against one half (Holm over runs)",
    rule="onsets by sg_jax.analysis.onsets: structure = the sharpest UAS rise; loss drops = the "
         "initial descent (loss_drop) and the largest drop after it (later_loss_drop); a seed "
         "coincides when `onset_detection.compare` ties its structure onset with either drop "
         "(closer than the coarser resolution). A seed whose structure onset lies within that "
         "resolution of the first evaluation is left out: every run starts with the initial "
         "descent, so such an onset ties with it whatever happens and the tie cannot fail; seeds "
         "without a structure onset are left out too. Supported if the fraction is above 0.5 "
         "with binomial p < 0.05 after Holm over runs, contradicted if below, else not "
         "testable; not testable when no seed is left (a denser evaluation grid is needed, not "
         "more seeds). Rule tightened on 2026-12-07: it counted the onsets at the start before",
    effect_of_interest=PROPORTION_OF_INTEREST)
def structure_with_loss_drop(runs) -> list[Outcome]:
  items = []
  for run in runs:
    if not run.series.get(UAS) or not run.series.get("train/loss"):
      continue
    logged = sorted(set(run.series[UAS]) & set(run.series["train/loss"]))
    seeds = select.unregularised(run, logged)
    onsets = onsets_lib.seed_onsets({UAS: run.series[UAS],
                                     "train/loss": run.series["train/loss"]})
    with_onset, at_start, hits, n, later = 0, 0, 0, 0, 0
    for s in seeds:
      structure = onsets[s]["structure"]
      if not math.isfinite(structure.step):
        continue
      with_onset += 1
      first = float(np.min(run.series[UAS][s][0]))
      resolution = max(np.nan_to_num(structure.resolution),
                       np.nan_to_num(onsets[s]["loss_drop"].resolution))
      if structure.step - first <= resolution:
        at_start += 1
        continue
      n += 1
      ties = [onset_detection.compare(structure, onsets[s][d]) == 0
              for d in ("loss_drop", "later_loss_drop")]
      hits += any(ties)
      later += ties[1]
    setting = f"{run.name} ({objectives_lib.objective_of(run)}, unregularised seeds)"
    if with_onset == 0:  # the runs are there, the structure is not
      items.append(registry.untestable(
          setting, (0,), "exact binomial", f"none of {len(seeds)} seeds has a structure onset",
          reason="no seed has a structure onset"))
      continue
    note = (f"{with_onset} of {len(seeds)} seeds have a structure onset; {at_start} of them "
            f"within one resolution of the start (left out); {hits} of the other {n} tied with "
            f"a loss drop ({later} with the later drop)")
    if n == 0:
      items.append(registry.untestable(
          setting, (0,), "exact binomial", note,
          reason=f"all {at_start} structure onsets within one resolution of the start of "
                 "training at this evaluation grid: a denser grid is needed, not more seeds"))
      continue
    interval = stats.proportion_interval(hits, n)
    items.append(Item(
        setting, (n,), onesample.proportion_test(hits, n, PROPORTION_NULL),
        detect.proportion(PROPORTION_NULL), note=note,
        interval=f"{interval.label()} ({interval.method}, n={interval.n})"))
  return registry.family(items, +1, PROPORTION_OF_INTEREST)


def _generalisation(run) -> str:
  return GEN_ACC if run.series.get(GEN_ACC) else "out_of_domain/preference"


@registry.claim(
    id="chen.brief_suppression_helps", source="Chen et al. 2024; docs/REFERENCE.md §3",
    statement="suppressing SAS briefly early in training improves the final model",
    needs="a run with per-seed sas.lambdas and sas.ends: unregularised seeds and seeds "
          "suppressed for a window from step 0",
    test="permutation test of the difference of means of final generalisation (brief minus "
         "unregularised)",
    rule="supported if brief suppression ends higher (p < 0.05), contradicted if lower, else "
         "not testable; generalisation = out_of_domain/accuracy (the preference for a masked LM)",
    effect_of_interest=ACCURACY_OF_INTEREST)
def brief_suppression_helps(runs) -> list[Outcome]:
  items = []
  for run in runs:
    regimes = _regimes(run)
    if regimes is None or "brief" not in regimes:
      continue
    name = _generalisation(run)
    control = np.array([select.final(run, name, s) for s in regimes["control"]])
    brief = np.array([select.final(run, name, s) for s in regimes["brief"]])
    if not select.comparable(control, brief):
      continue
    items.append(Item(f"{run.name}: brief suppression vs unregularised ({name})",
                      (control.size, brief.size), stats.compare_means(control, brief),
                      detect.mean_difference(control, brief),
                      note=f"final {np.nanmean(brief):.3f} vs {np.nanmean(control):.3f}"))
  return registry.family(items, +1, ACCURACY_OF_INTEREST)
