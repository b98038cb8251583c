"""Murty, Sharma, Andreas & Manning, "Grokking of hierarchical structure in vanilla transformers"
(ACL 2023, arXiv 2305.18741; docs/REFERENCE.md §1): five claims, read from depth sweeps (plain
`lm` runs, `select.depth_arms`; metrics.csv and, for the predictors, analysis.csv).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np

from sg_jax import stats
from sg_jax.claims import detect
from sg_jax.claims import onesample
from sg_jax.claims import registry
from sg_jax.claims import select
from sg_jax.claims.registry import Item, Outcome
from sg_jax.report.reading import GEN_ACC

# The smallest rise of generalisation after in-domain saturation that counts as grokking
# (accuracy, fixed before any run was read).
GROKKING_GAIN = 0.2
# docs/REFERENCE.md §1 (Murty et al. 2023): with early stopping, mean generalisation < 40%
# (question formation) and < 50% (tense) against > 80-90% after long training. The end must lie
# above this bound for the early-stopping comparison to say anything (docs/claims.md).
EARLY_STOP_BOUND = {"question": 0.40, "tense": 0.50}
DEFAULT_EARLY_STOP_BOUND = 0.5
# Correlations: the smallest within-depth Spearman rho that matters.
RHO_OF_INTEREST = 0.4
# Depth trends: the smallest Kendall-type tau (Jonckheere-Terpstra effect) that matters.
TAU_OF_INTEREST = 0.3
# Differences of seed means of generalisation accuracy that matter.
ACCURACY_OF_INTEREST = 0.15
PREDICTOR_COLUMNS = {"tscore": "tscore", "weight_norm_per_layer": "weight norm per layer",
                     "attention_sparsity_paper": "attention sparsity"}


def _finals(members) -> np.ndarray:
  return np.array([select.final(run, GEN_ACC, seed) for run, seed in members])


@registry.claim(
    id="murty.grokking", source="Murty et al. 2023; docs/REFERENCE.md §1",
    statement="generalisation rises long after in-domain accuracy saturates (structural "
              "grokking)",
    needs="plain lm runs: in_domain/accuracy and out_of_domain/accuracy over training",
    test="sign-flip permutation of the per-seed gain (final minus at saturation) against "
         f"{GROKKING_GAIN}",
    rule=f"per task and depth: gain = final generalisation - generalisation at the first "
         f"evaluation with in-domain accuracy >= {select.SATURATION} (seeds that never saturate "
         f"are left out); supported if the mean gain exceeds {GROKKING_GAIN} (p < 0.05, Holm "
         "over every task and depth), contradicted if it falls short of it, else not testable",
    effect_of_interest=0.2)
def grokking(runs) -> list[Outcome]:
  items = []
  for task, by_depth in select.depth_arms(runs).items():
    for depth, members in by_depth.items():
      final, at_sat, left_out, unlogged = [], [], 0, 0
      for run, seed in members:
        step = select.saturation(run, seed)
        if step is None:
          left_out += 1
          continue
        pair = (select.final(run, GEN_ACC, seed), select.value_at(run, GEN_ACC, seed, step))
        if not all(math.isfinite(v) for v in pair):
          unlogged += 1  # no generalisation logged at the end or at/after saturation
          continue
        final.append(pair[0])
        at_sat.append(pair[1])
      dropped = (f"{left_out} of {len(members)} seeds never reach in-domain accuracy "
                 f"{select.SATURATION}" if left_out else "")
      dropped += (("; " if dropped else "") + f"{unlogged} without generalisation logged at "
                  "saturation and at the end" if unlogged else "")
      if len(final) < 2:  # the runs are there, the quantity is not: say so
        items.append(registry.untestable(
            select.depth_setting(task, [depth]), (len(final),),
            "sign-flip permutation (paired mean)",
            f"{dropped}: fewer than 2 seeds to grok after saturation"))
        continue
      test = onesample.paired_test(final, at_sat, GROKKING_GAIN)
      note = (f"mean gain {np.mean(np.subtract(final, at_sat)):.3f}"
              + (f"; left out: {dropped}" if dropped else ""))
      items.append(Item(select.depth_setting(task, [depth]), (len(final),), test,
                        detect.paired(final, at_sat), note))
  return registry.family(items, +1, 0.2)


@dataclasses.dataclass
class _PerTask:
  """One task's outcome before the Holm adjustment over tasks (`_over_tasks`)."""
  fields: dict  # Outcome fields other than p_adjusted, verdict and seeds_needed
  p: float  # the task's decision p (nan: no test of the claim, kept out of the family)
  significant_verdict: str  # the verdict when the adjusted p < alpha in the claim's direction
  direction_ok: bool
  # tasks in the Holm family -> seeds per arm to test (`registry.seeds_needed`), reported when
  # the verdict is "not testable"; None: not computed
  seeds_needed: Callable[[int], int] | None


def _over_tasks(pending: list[_PerTask]) -> list[Outcome]:
  """Outcomes with each task's decision p Holm-adjusted over the tasks of the claim (one family
  per claim, as the rule texts say); a task without a finite decision p stays out of the
  family and is not testable."""
  ps = [t.p for t in pending]
  adjusted = stats.holm(ps) if ps else []
  family_size = max(1, sum(math.isfinite(p) for p in ps))
  out = []
  for task, q in zip(pending, adjusted):
    # no decision p: the outcome shows its own test's p (e.g. a comparison shown, not decisive)
    q = float(q) if math.isfinite(task.p) else task.fields["p"]
    significant = math.isfinite(task.p) and q < registry.ALPHA and task.direction_ok
    verdict = task.significant_verdict if significant else registry.NOT_TESTABLE
    needed = (None if significant or task.seeds_needed is None
              else task.seeds_needed(family_size))
    out.append(Outcome(**task.fields, p_adjusted=q, verdict=verdict, seeds_needed=needed))
  return out


def _needed(detectable_at, target: float, per_task: int, tasks: int) -> int:
  """`registry.seeds_needed` in a family of `tasks` tasks of `per_task` comparisons each."""
  return registry.seeds_needed(detectable_at, target, family_size=per_task * tasks)


def _worst(sides, tasks: int) -> int:
  """The seeds both sides of an inverted U need (-1: more than `registry.MAX_SEEDS`)."""
  needed = [side(tasks) for side in sides]
  return -1 if -1 in needed else max(needed)


def _trend(groups) -> stats.Test:
  return stats.ordered_trend([np.asarray(g, np.float64) for g in groups])


@registry.claim(
    id="murty.inverted_u", source="Murty et al. 2023; docs/REFERENCE.md §1",
    statement="final generalisation is an inverted U over depth",
    needs="plain lm runs at >= 3 depths: final out_of_domain/accuracy",
    test="Jonckheere-Terpstra on each side of the best depth",
    rule="best depth = the depth with the highest seed mean of final generalisation. Interior "
         "best depth: supported if generalisation rises up to it and falls after it (one "
         "Jonckheere-Terpstra test per side, Holm over the two, both p < 0.05; the larger "
         "adjusted p then Holm-adjusted over tasks), else not testable (the best depth is "
         "chosen from the data, so this is lenient towards the claim). Best depth at an end "
         "of the range: contradicted if the trend over all depths is significant (p < 0.05, "
         "Holm over tasks) towards that end (a monotone curve, no U within the range), else "
         "not testable",
    effect_of_interest=TAU_OF_INTEREST)
def inverted_u(runs) -> list[Outcome]:
  pending = []
  for task, by_depth in select.depth_arms(runs).items():
    depths = list(by_depth)
    if len(depths) < 3:
      continue
    arms = [_finals(by_depth[d]) for d in depths]
    arms = [a[np.isfinite(a)] for a in arms]
    means = [a.mean() if a.size else -math.inf for a in arms]
    best = int(np.argmax(means))
    setting = select.depth_setting(task, depths)
    sizes = tuple(a.size for a in arms)
    if 0 < best < len(depths) - 1:
      rise, fall = _trend(arms[:best + 1]), _trend(arms[best:])
      p_rise, p_fall = (float(q) for q in stats.holm([rise.p, fall.p]))
      # each side is one of 2 comparisons (Holm over the sides) in each task of the family
      sides = [functools.partial(_needed, detect.trend(k), TAU_OF_INTEREST, 2)
               for k in (best + 1, len(depths) - best)]
      pending.append(_PerTask(
          fields=dict(setting=setting, arms=sizes, test=rise.name,
                      statistic=min(rise.effect, -fall.effect), p=max(rise.p, fall.p),
                      effect=min(rise.effect, -fall.effect),
                      detectable=max(rise.detectable, fall.detectable),
                      note=f"best depth {depths[best]}; rise tau {rise.effect:.2f} (p "
                           f"{rise.p:.3g}), fall tau {fall.effect:.2f} (p {fall.p:.3g}); seed "
                           "means " + " / ".join(f"{m:.3f}" for m in means)),
          p=max(p_rise, p_fall), significant_verdict=registry.SUPPORTED,
          direction_ok=rise.effect > 0 > fall.effect,
          seeds_needed=functools.partial(_worst, sides)))
      continue
    whole = _trend(arms)
    towards_end = 1 if best == len(depths) - 1 else -1
    pending.append(_PerTask(
        fields=dict(setting=setting, arms=sizes, test=whole.name, statistic=whole.statistic,
                    p=whole.p, effect=whole.effect, detectable=whole.detectable,
                    note=f"best depth {depths[best]} is at the "
                         f"{'deep' if towards_end > 0 else 'shallow'} end of the range; seed "
                         "means " + " / ".join(f"{m:.3f}" for m in means)),
        p=whole.p, significant_verdict=registry.CONTRADICTED,
        direction_ok=math.copysign(1, whole.effect) == towards_end,
        seeds_needed=functools.partial(_needed, detect.trend(len(arms)), TAU_OF_INTEREST, 1)))
  return _over_tasks(pending)


def _predictor_rows(runs, column: str):
  """{task: (x, y, strata)} of `column` at the end (last analysed value) against final
  generalisation, one entry per seed with both values, strata = depth."""
  out = {}
  for task, by_depth in select.depth_arms(runs).items():
    x, y, strata = [], [], []
    for depth, members in by_depth.items():
      for run, seed in members:
        a, b = select.final(run, column, seed), select.final(run, GEN_ACC, seed)
        if math.isfinite(a) and math.isfinite(b):
          x.append(a)
          y.append(b)
          strata.append(depth)
    if len(set(strata)) >= 1 and len(x) >= 3:
      out[task] = (np.array(x), np.array(y), np.array(strata))
  return out


def _association_items(runs, column: str) -> list[Item]:
  items = []
  for task, (x, y, strata) in _predictor_rows(runs, column).items():
    depths = sorted(set(strata.tolist()))
    test = stats.stratified_association(x, y, strata)
    # the arms, the detectable effect and the note count the depths the test uses
    used = list(stats.usable_strata(x, y, strata))
    unused = [d for d in depths if d not in used]
    arms = tuple(int((strata == d).sum()) for d in sorted(used))
    items.append(Item(select.depth_setting(task, depths) + " (within depth)", arms, test,
                      detect.stratified(max(len(used), 1)),
                      note=f"{PREDICTOR_COLUMNS[column]} at the end vs final generalisation, "
                           "Spearman within depth"
                           + (f"; depths {', '.join(map(str, unused))} left out (fewer than 3 "
                              "seeds, or a constant value)" if unused else "")))
  return items


@registry.claim(
    id="murty.tscore_within_depth", source="Murty et al. 2023, §5",
    statement="tscore predicts generalisation (tested with depth held fixed: across depths "
              "every depth-monotone quantity orders a monotone depth curve, issue 49)",
    needs="plain lm runs with analysis.csv tscore: final tscore and out_of_domain/accuracy",
    test="stratified permutation test of Spearman's rho (y permuted within depth)",
    rule="supported if the mean within-depth rho is positive with p < 0.05 (Holm over tasks), "
         "contradicted if negative with p < 0.05, else not testable",
    effect_of_interest=RHO_OF_INTEREST)
def tscore_within_depth(runs) -> list[Outcome]:
  return registry.family(_association_items(runs, "tscore"), +1, RHO_OF_INTEREST)


@registry.claim(
    id="murty.tscore_best_depth", source="Murty et al. 2023, §5",
    statement="the depth with the highest tscore is the depth that generalises best",
    needs="plain lm runs at >= 2 depths with analysis.csv tscore",
    test="permutation test of the difference of means (generalisation, two depths)",
    rule="pick = the depth with the highest mean final tscore, best = the depth with the "
         "highest mean final generalisation. Pick != best: contradicted if best generalises "
         "better than pick (p < 0.05, Holm over tasks), else not testable. Pick == best: not "
         "testable, with the "
         "reason: at an interior depth a measure unrelated to generalisation matches the best "
         "of k depths 1 time in k (p >= 1/k whatever the seeds; tightened on 2026-12-07 after "
         "a review, it was 'supported' when the best beat the runner-up), at the shallowest or "
         "deepest depth it is confounded with depth (any quantity monotone in depth picks it "
         "too)",
    effect_of_interest=ACCURACY_OF_INTEREST)
def tscore_best_depth(runs) -> list[Outcome]:
  pending = []
  for task, by_depth in select.depth_arms(runs).items():
    depths = list(by_depth)
    if len(depths) < 2:
      continue
    gen = {d: _finals(m) for d, m in by_depth.items()}
    score = {d: np.array([select.final(r, "tscore", s) for r, s in m]) for d, m in
             by_depth.items()}
    if not any(np.isfinite(v).any() for v in score.values()):
      continue
    gen_mean = {d: np.nanmean(v) for d, v in gen.items()}
    score_mean = {d: np.nanmean(v) if np.isfinite(v).any() else -math.inf
                  for d, v in score.items()}
    pick, best = max(depths, key=score_mean.get), max(depths, key=gen_mean.get)
    setting = select.depth_setting(task, depths)
    note = f"tscore picks depth {pick}, generalisation is best at depth {best}"
    if not select.comparable(*gen.values()):
      continue
    confounded = False
    if pick != best:  # the one comparison that can decide: contradicted if best beats pick
      data = (gen[pick], gen[best])
      test = stats.compare_means(*data)
      needed = functools.partial(_needed, detect.mean_difference(*data), ACCURACY_OF_INTEREST,
                                 1)
      decision_p, reason = test.p, ""
    else:  # shown, never decisive: kept out of the Holm family over tasks
      runner_up = max((d for d in depths if d != best), key=gen_mean.get)
      data = (gen[runner_up], gen[best])
      test = stats.compare_means(*data)
      confounded = best in (depths[0], depths[-1])
      note += f"; runner-up depth {runner_up}"
      if confounded:  # more seeds do not help: only a depth range with an interior best does
        note += " (an end of the depth range: confounded with depth)"
        reason = (f"best depth {best} is an end of the range, confounded with depth: more "
                  "seeds cannot help")
      else:  # an unrelated measure picks the best of k depths 1 time in k: never p < 0.05
        reason = (f"tscore picks the best depth, which a measure unrelated to generalisation "
                  f"does 1 time in {len(depths)}: more depths, not seeds")
      needed, decision_p = None, math.nan
    compared = (pick if pick != best else runner_up, best)
    pending.append(_PerTask(
        fields=dict(setting=f"{setting}: depth {compared[0]} vs {compared[1]}",
                    arms=tuple(len(a) for a in data), test=test.name,
                    statistic=test.statistic, p=test.p, effect=test.effect,
                    detectable=test.detectable, note=note, reason=reason),
        p=decision_p, significant_verdict=registry.CONTRADICTED,
        direction_ok=test.effect > 0,
        seeds_needed=needed))
  return _over_tasks(pending)


def _no_prediction(column: str):
  def evaluate(runs) -> list[Outcome]:
    return registry.family(_association_items(runs, column), 0, RHO_OF_INTEREST)
  return evaluate


for _column, _name in (("weight_norm_per_layer", "weight_norm"),
                       ("attention_sparsity_paper", "sparsity")):
  registry.register(registry.Claim(
      id=f"murty.{_name}_does_not_predict", source="Murty et al. 2023, §5",
      statement=f"{PREDICTOR_COLUMNS[_column]} does not predict generalisation (depth held "
                "fixed)",
      needs=f"plain lm runs with analysis.csv {_column}: final value and out_of_domain/accuracy",
      test="stratified permutation test of Spearman's rho (y permuted within depth)",
      rule=f"a claim of no effect: contradicted if the within-depth rho differs from 0 "
           f"(p < 0.05, Holm over tasks); supported only if p >= 0.05 and the detectable rho "
           f"at this n (power 0.8) is <= {RHO_OF_INTEREST} (power approach, weaker than an "
           "equivalence test); else not testable",
      evaluate=_no_prediction(_column), effect_of_interest=RHO_OF_INTEREST))


@registry.claim(
    id="murty.early_stopping", source="Murty et al. 2023; docs/REFERENCE.md §1",
    statement="early stopping on in-domain accuracy underestimates generalisation",
    needs="plain lm runs: in_domain/accuracy and out_of_domain/accuracy over training",
    test="sign-flip permutation of final minus early-stop generalisation (paired by seed), and "
         "the final mean's Student-t interval",
    rule="per task and depth, early stop = the first evaluation with the best in-domain "
         "accuracy. Supported if final > early stop (p < 0.05, Holm over every task and "
         "depth) AND the final mean's 95% t-interval lies above the paper's early-stopping "
         "bound (0.40 question formation, 0.50 tense; 0.50 for a task the paper gives none, "
         "e.g. Dyck): the end is where the paper says early stopping does not get. "
         "Contradicted if final < early stop (p < 0.05). Otherwise not testable (an end below "
         "the bound makes the comparison vacuous)",
    effect_of_interest=ACCURACY_OF_INTEREST)
def early_stopping(runs) -> list[Outcome]:
  items, bounds = [], []
  for task, by_depth in select.depth_arms(runs).items():
    bound = EARLY_STOP_BOUND.get(task, DEFAULT_EARLY_STOP_BOUND)
    for depth, members in by_depth.items():
      final = _finals(members)
      early = np.array([select.early_stop(r, s) for r, s in members])
      if np.sum(np.isfinite(final) & np.isfinite(early)) < 2:
        continue
      interval = stats.mean_interval(final[np.isfinite(final)])
      items.append(Item(
          select.depth_setting(task, [depth]), (int(np.isfinite(final).sum()),),
          onesample.paired_test(final, early), detect.paired(final, early),
          note=f"early stop {np.nanmean(early):.3f}, end {np.nanmean(final):.3f}; bound "
               f"{bound:g}", interval=""))
      bounds.append((bound, interval))
  out = registry.family(items, +1, ACCURACY_OF_INTEREST)
  for k, (o, (bound, interval)) in enumerate(zip(out, bounds)):
    label = f"end {interval.label()} ({interval.method}, n={interval.n})"
    if o.verdict == registry.SUPPORTED and not interval.low > bound:
      o = dataclasses.replace(o, verdict=registry.NOT_TESTABLE,
                              note=o.note + f"; the end's interval is not above {bound:g}: "
                                   "vacuous")
    out[k] = dataclasses.replace(o, interval=label)
  return out
