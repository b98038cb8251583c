"""Seed-group statistics of one run: per group rows and each group against the first.

Per group of `groups.seed_groups` (`group_rows`): the seed mean of each compared metric's final
value with its 95% t-interval over seeds (`seed_stats.seed_mean`), the median onset of its signal
(`sg_jax.analysis.onsets`), the time to generalise (`out_of_domain/accuracy` above the report's
threshold: the Kaplan-Meier median of the first crossing, seeds that never cross censored; the
seeds that stay above it at the end) and the rules the seeds end on. Each group against the
first (`comparison_rows`): permutation test of the final generalisation and of each
construction's, Fisher's exact test of the seeds above the threshold at the end, log-rank test of
the time to generalise; each with its minimum detectable effect, Holm-corrected over the table.
Metrics without an onset signal (the in-domain loss, tscore and tparseval from `sg_jax.analyze`,
the tree regulariser's penalty) get a final value only.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from sg_jax import stats
from sg_jax.analysis import onsets as onsets_lib
from sg_jax.report import seed_stats
from sg_jax.report import tables
from sg_jax.report.groups import grouping_fields
from sg_jax.report.reading import GEN_ACC, Run

# Metrics compared between groups (those a run logged), with their onset signal
# (`onsets_lib.SIGNALS`; None: no onset is located) and panel title.
COMPARED = (("in_domain/uas", "structure", "UAS of the best head (in-domain)"),
            ("train/loss", "loss_drop", "training loss (nats per token)"),
            ("in_domain/accuracy", "in_domain", "in-domain accuracy"),
            ("out_of_domain/accuracy", "out_of_domain", "generalisation accuracy"),
            ("in_domain/loss", None, "in-domain loss (nats per token)"),
            ("tscore", None, "tscore (sg_jax.analyze)"),
            ("tparseval_f1", None, "tparseval F1 (sg_jax.analyze)"),
            ("train/tree_loss", None, "tree regulariser's loss (nats)"))
# Per-construction generalisation (Task.constructions; docs/tasks.md).
CONSTRUCTION_PREFIX = GEN_ACC + "/"


def seed_final(run: Run, name: str, seed: int) -> float:
  """`seed`'s last finite logged value of metric `name` (NaN: no rows, or none finite)."""
  steps_values = run.series.get(name, {}).get(seed)
  if steps_values is None:
    return math.nan
  values = steps_values[1][np.isfinite(steps_values[1])]
  return float(values[-1]) if values.size else math.nan


def first_above(run: Run, name: str, seed: int, threshold: float) -> float:
  """The first logged step at which `seed`'s `name` exceeds `threshold` (NaN: never, or no
  rows)."""
  steps_values = run.series.get(name, {}).get(seed)
  step = None if steps_values is None else tables.first_above(*steps_values, threshold)
  return math.nan if step is None else float(step)


def construction_metrics(run: Run) -> list[str]:
  """The run's per-construction generalisation metrics (`out_of_domain/accuracy/<tag>`), sorted."""
  return sorted(n for n in run.series if n.startswith(CONSTRUCTION_PREFIX))


def crossings(run: Run, seeds: Sequence[int], threshold: float) -> tuple[list, list]:
  """(times, reached) of the seeds' first step above `threshold` (`first_above`), a seed that
  never crosses censored at its last evaluated step; seeds without rows left out."""
  times, reached = [], []
  for seed in seeds:
    curve = run.series.get(GEN_ACC, {}).get(seed)
    if curve is None or not np.isfinite(curve[1]).any():
      continue
    step = first_above(run, GEN_ACC, seed, threshold)
    times.append(step if math.isfinite(step) else float(curve[0][np.isfinite(curve[1])][-1]))
    reached.append(math.isfinite(step))
  return times, reached


def _sustained(run: Run, seed: int, threshold: float) -> bool | None:
  curve = run.series.get(GEN_ACC, {}).get(seed)
  if curve is None:
    return None
  return stats.sustained(curve[0], curve[1], threshold, tables.SUSTAINED_EVALUATIONS)


def _with_interval(row: dict, name: str, values: Sequence[float]) -> None:
  got = stats.mean_interval(values)
  row.update({name: got.estimate, f"{name}_ci_low": got.low, f"{name}_ci_high": got.high,
              f"{name}_n": got.n})


def group_rows(run: Run, groups: Mapping[str, Sequence[int]], threshold: float = 0.8
               ) -> list[dict]:
  """One dict per group: seeds, and per compared metric and per construction
  (`construction_metrics`) the final value's seed mean with its 95% t-interval (`<metric>`,
  `<metric>_ci_low`, `<metric>_ci_high`, over `<metric>_n` seeds), the median onset step of each
  compared metric's signal over the group's seeds (`<signal>_onset_median`, NaN where none), and
  for generalisation above `threshold`: the Kaplan-Meier median of the first crossing with its
  95% interval, seeds that never cross censored at their last step (`gen_crossing_median`,
  `..._ci_low`, `..._ci_high`; inf: fewer than half cross), how many seeds cross
  (`gen_above_seeds`, e.g. "3/4"), end above it (`gen_final_above_seeds`) and stay above it at
  each of their last `tables.SUSTAINED_EVALUATIONS` evaluations (`gen_sustained_seeds`), and the
  mean first crossing of the seeds that cross (`gen_above_step`: conditional on crossing, so
  biased low when some never do; kept for comparison). Where the run logged the rule
  agreements: how many seeds end on each rule (`final_rules`, e.g. "hierarchical 2,
  skip_relative 2") and the mean number of rule switches per seed (`rule_switches_mean`;
  `tables.rules_of_seed`)."""
  onsets = onsets_lib.seed_onsets(run.series)
  rows = []
  for label, seeds in groups.items():
    row = {"run": run.name, "group": label, "seeds": " ".join(map(str, seeds))}
    for name, signal, _ in COMPARED:
      if not run.series.get(name):
        continue
      _with_interval(row, name, [seed_final(run, name, s) for s in seeds])
      if signal is None:
        continue
      steps = [onsets[s][signal].step for s in seeds if s in onsets and signal in onsets[s]]
      finite = [x for x in steps if math.isfinite(x)]
      row[f"{signal}_onset_median"] = float(np.median(finite)) if finite else math.nan
    if run.series.get(GEN_ACC):
      times, reached = crossings(run, seeds, threshold)
      crossed = [t for t, r in zip(times, reached) if r]
      curve = stats.kaplan_meier(times, reached) if times else None
      finals = [seed_final(run, GEN_ACC, s) for s in seeds]
      counted = [v for v in finals if math.isfinite(v)]
      kept = [_sustained(run, s, threshold) for s in seeds]
      row.update({"gen_above_threshold": threshold,
                  "gen_above_seeds": f"{len(crossed)}/{len(seeds)}",
                  "gen_final_above_seeds": f"{sum(v > threshold for v in counted)}/{len(counted)}",
                  "gen_sustained_seeds": f"{sum(bool(k) for k in kept)}/{len(counted)}",
                  "gen_above_step": float(np.mean(crossed)) if crossed else math.nan,
                  "gen_crossing_median": curve.median.estimate if curve else math.nan,
                  "gen_crossing_median_ci_low": curve.median.low if curve else math.nan,
                  "gen_crossing_median_ci_high": curve.median.high if curve else math.nan})
    for name in construction_metrics(run):
      _with_interval(row, name, [seed_final(run, name, s) for s in seeds])
    rules = [tables.rules_of_seed(run, s) for s in seeds]
    if any(rule is not None for rule, _ in rules):
      row["final_rules"] = seed_stats.rule_counts([rule for rule, _ in rules])
      row["rule_switches_mean"] = float(np.mean([n for _, n in rules if n is not None]))
    rows.append(row)
  return rows


def _dose_trend_rows(run: Run, by: Sequence[str] | None = None) -> list[dict]:
  """A trend of the final generalisation over the run's per-seed field when it has exactly one
  (or `by` names exactly one: `grouping_fields`) and it is numeric (a dose response: regulariser
  strength, weight decay, disambiguating lines): the Jonckheere-Terpstra test on the seeds,
  levels in increasing order (`stats.ordered_trend`). With several per-seed fields and no `by`
  the levels of one pool the others', so none is tested."""
  fields = grouping_fields(run.config, by)
  if len(fields) != 1:
    return []
  (field, values), = fields.items()
  if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
    return []
  first = int(run.config.get("first_seed", 0))
  levels = sorted(set(values))
  test = stats.ordered_trend([[seed_final(run, GEN_ACC, first + k)
                                for k, v in enumerate(values) if v == level]
                               for level in levels])
  return [{"run": run.name, "group": f"trend over {field.split('.')[-1]} "
           f"({', '.join(f'{v:g}' for v in levels)})", "reference": "", "quantity":
           "final generalisation", "test": test.name, "n": " / ".join(map(str, test.n)),
           "effect": test.effect, "p": test.p, "detectable": test.detectable,
           "min_p": test.min_p, "testable": test.testable}]


def comparison_rows(run: Run, groups: Mapping[str, Sequence[int]], threshold: float = 0.8,
                    by: Sequence[str] | None = None) -> list[dict]:
  """Each group after the first against the first (the reference), one dict per test:

  * the final generalisation (`out_of_domain/accuracy`) and each construction's: permutation
    test of the difference of means (`stats.compare_means`; effect: group minus reference);
  * the seeds above `threshold` at the end: Fisher's exact test (`stats.compare_proportions`;
    effect: difference of fractions);
  * the first step above `threshold`: log-rank test (`stats.logrank`, seeds that never cross
    censored; effect: log hazard ratio, > 0: the group crosses sooner);
  * where the run's only per-seed field (or the only one `by` names, as `seed_groups`) is
    numeric, the trend of the final generalisation over its levels (`stats.ordered_trend`,
    Jonckheere-Terpstra; effect: tau; `reference` empty).

  Every row has `test`, `n` ("4 vs 4"), `effect`, `p`, `p_holm` (Holm over all rows of the
  run: the table tests these at once), `detectable` (minimum detectable effect at alpha 0.05,
  power 0.8, in the effect's unit), `min_p` and `testable` (False: "not testable at this n").
  [] with fewer than two groups or without generalisation rows.
  """
  labels = list(groups)
  if len(labels) < 2 or not run.series.get(GEN_ACC):
    return []
  reference = groups[labels[0]]
  finals = lambda name, seeds: [seed_final(run, name, s) for s in seeds]
  above = lambda seeds: [v > threshold for v in finals(GEN_ACC, seeds) if math.isfinite(v)]
  rows = []
  for label in labels[1:]:
    seeds = groups[label]
    tests = [("final generalisation", stats.compare_means(finals(GEN_ACC, reference),
                                                          finals(GEN_ACC, seeds)))]
    ref_above, grp_above = above(reference), above(seeds)
    if ref_above and grp_above:
      tests.append((f"seeds gen. > {threshold:g} at the end", stats.compare_proportions(
          sum(ref_above), len(ref_above), sum(grp_above), len(grp_above))))
    ref_times, grp_times = (crossings(run, reference, threshold),
                            crossings(run, seeds, threshold))
    if ref_times[0] and grp_times[0]:
      tests.append((f"first step gen. > {threshold:g}",
                    stats.logrank(*ref_times, *grp_times)))
    for name in construction_metrics(run):
      tests.append((f"final {name[len(CONSTRUCTION_PREFIX):]}",
                    stats.compare_means(finals(name, reference), finals(name, seeds))))
    for what, test in tests:
      rows.append({"run": run.name, "group": label, "reference": labels[0], "quantity": what,
                   "test": test.name, "n": " vs ".join(map(str, test.n)),
                   "effect": test.effect, "p": test.p, "detectable": test.detectable,
                   "min_p": test.min_p, "testable": test.testable})
  rows += _dose_trend_rows(run, by)
  adjusted = stats.holm([r["p"] for r in rows])
  for r, p in zip(rows, adjusted):
    r["p_holm"] = float(p)
  return rows
