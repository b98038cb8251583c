"""The report's tables: early stopping, per-seed and per-depth summaries, summary.csv / .md."""

from __future__ import annotations

import collections
import csv
import math
import os
from typing import Sequence

import numpy as np

from sg_jax import stats
from sg_jax.analysis import registry
from sg_jax.records import fileio
from sg_jax.report import seed_stats
from sg_jax.report.reading import GEN_ACC, IN_ACC, Run, analysis_sentences

# Final evaluations whose spread is a seed's oscillation (`seed_stats.oscillation`).
OSCILLATION_EVALUATIONS = 5
# A seed generalises "sustained" when it is above the threshold at each of its last this many
# evaluations (`stats.sustained`), beside "first crossing" (the first evaluation above it).
SUSTAINED_EVALUATIONS = 3


def _finite(steps: np.ndarray, values: np.ndarray):
  ok = np.isfinite(values)
  return steps[ok], values[ok]


def first_reaching(steps: np.ndarray, values: np.ndarray, level: float) -> int | None:
  """First step whose value is >= `level` (None if never)."""
  hit = np.nonzero(np.isfinite(values) & (values >= level))[0]
  return int(steps[hit[0]]) if hit.size else None


def first_above(steps: np.ndarray, values: np.ndarray, level: float) -> int | None:
  """First step whose value exceeds `level` (None if never)."""
  hit = np.nonzero(np.isfinite(values) & (values > level))[0]
  return int(steps[hit[0]]) if hit.size else None


def saturation_step(run: "Run", seed: int, saturation: float) -> int | None:
  """First step where `seed`'s in-domain accuracy reaches `saturation` (None: never / no rows)."""
  if seed not in run.series.get(IN_ACC, {}):
    return None
  return first_reaching(*run.series[IN_ACC][seed], saturation)


def early_stopping(in_steps: np.ndarray, in_acc: np.ndarray, gen_steps: np.ndarray,
                   gen_acc: np.ndarray, tie: str, tolerance: float = 0.0):
  """Generalisation accuracy at the early-stopping checkpoint chosen on in-domain accuracy.

  Args:
    in_steps, in_acc: [T] evaluation steps and in-domain accuracy (fraction) of one seed.
    gen_steps, gen_acc: [T'] steps and generalisation accuracy of the same seed.
    tie: 'first' (earliest step with the best in-domain accuracy) or 'last' (latest).
    tolerance: values >= max - tolerance count as best.

  Returns:
    (selected step, generalisation accuracy there), or (None, nan) when there is no finite
    in-domain value at a step that also has a finite generalisation value.

  Raises:
    ValueError: unknown `tie`.
  """
  if tie not in ("first", "last"):
    raise ValueError(f"tie must be 'first' or 'last', got {tie!r}")
  gen = dict(zip(_finite(gen_steps, gen_acc)[0].tolist(), _finite(gen_steps, gen_acc)[1]))
  steps, acc = _finite(in_steps, in_acc)
  keep = np.array([s in gen for s in steps.tolist()], dtype=bool)
  steps, acc = steps[keep], acc[keep]
  if steps.size == 0:
    return None, math.nan
  best = np.nonzero(acc >= acc.max() - tolerance)[0]
  step = int(steps[best[0] if tie == "first" else best[-1]])
  return step, float(gen[step])


def final_value(steps: np.ndarray, values: np.ndarray) -> tuple[int | None, float]:
  """(last step with a finite value, that value); (None, nan) when there is none."""
  steps, values = _finite(steps, values)
  if steps.size == 0:
    return None, math.nan
  return int(steps[-1]), float(values[-1])


def rules_of_seed(run: Run, seed: int) -> tuple[str | None, int | None]:
  """(the rule `seed` ends on, how often its dominant rule changed) along its evaluations.

  The dominant rule of an evaluation is the rule the seed's outputs agree with most
  (`seed_stats.dominant_rules` over `seed_stats.RULE_METRICS`, at the steps where all three
  agreements were logged); (None, None) when the run did not log the agreements (tasks other
  than question formation, or runs made before the metrics existed).
  """
  series = {rule: run.series.get(metric, {}).get(seed) for rule, metric in
            seed_stats.RULE_METRICS.items()}
  if any(s is None for s in series.values()):
    return None, None
  steps = sorted(set.intersection(*(set(s[0].tolist()) for s in series.values())))
  if not steps:
    return None, None
  aligned = {rule: [dict(zip(s[0].tolist(), s[1]))[t] for t in steps]
             for rule, s in series.items()}
  rules = seed_stats.dominant_rules(aligned)
  return rules[-1], seed_stats.rule_switches(rules)


def seed_summary(runs: Sequence[Run], threshold: float, saturation: float,
                 tie_tolerance: float) -> list[dict]:
  """One dict per (run, seed) with final / early-stopping accuracies, final analysis values,
  the first step whose generalisation exceeds `threshold` (`first_above`: the first crossing,
  None when never), whether it stays above it at each of its last `SUSTAINED_EVALUATIONS`
  evaluations (`generalisation_sustained`, `stats.sustained`), the generalisation oscillation
  (std over the last `OSCILLATION_EVALUATIONS` evaluations), the rule the seed ends on and its
  rule switches (`rules_of_seed`)."""
  out = []
  for run in runs:
    in_series = run.series.get(IN_ACC, {})
    gen_series = run.series.get(GEN_ACC, {})
    for seed in sorted(set(in_series) | set(gen_series)):
      in_s, in_v = in_series.get(seed, (np.zeros(0, int), np.zeros(0)))
      gen_s, gen_v = gen_series.get(seed, (np.zeros(0, int), np.zeros(0)))
      final_step, final_gen = final_value(gen_s, gen_v)
      _, final_in = final_value(in_s, in_v)
      first_step, first_gen = early_stopping(in_s, in_v, gen_s, gen_v, "first", tie_tolerance)
      last_step, last_gen = early_stopping(in_s, in_v, gen_s, gen_v, "last", tie_tolerance)
      row = {"run": run.name, "depth": run.depth, "seed": seed, "final_step": final_step,
             "final_in_domain": final_in, "final_generalisation": final_gen,
             "generalises": (bool(final_gen > threshold) if math.isfinite(final_gen) else None),
             "in_domain_saturation_step": first_reaching(in_s, in_v, saturation),
             "generalisation_above_threshold_step": first_above(gen_s, gen_v, threshold),
             "generalisation_sustained": stats.sustained(gen_s, gen_v, threshold,
                                                         SUSTAINED_EVALUATIONS),
             "early_stop_first_step": first_step, "early_stop_first_generalisation": first_gen,
             "early_stop_last_step": last_step, "early_stop_last_generalisation": last_gen,
             "generalisation_oscillation": seed_stats.oscillation(gen_v,
                                                                   OSCILLATION_EVALUATIONS),
             # the evaluations that std is over (fewer when the run has fewer)
             "generalisation_oscillation_evaluations": int(min(
                 OSCILLATION_EVALUATIONS, np.isfinite(np.asarray(gen_v, float)).sum()))}
      row["final_rule"], row["rule_switches"] = rules_of_seed(run, seed)
      for metric in registry.dynamics():
        if seed in run.series.get(metric, {}):
          row[f"final_{metric}"] = final_value(*run.series[metric][seed])[1]
      out.append(row)
  return out


def _mean(values) -> float:
  v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
  return float(v.mean()) if v.size else math.nan


def _median(values) -> float:
  v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
  return float(np.median(v)) if v.size else math.nan


def crossing_curve(seed_rows: Sequence[dict]) -> stats.KaplanMeier | None:
  """Kaplan-Meier curve of the first step above the threshold (`first_above`) over the seeds of
  `seed_rows`; a seed that never crossed is censored at its last evaluated step; seeds without
  evaluations are left out (None when none is left)."""
  times, reached = [], []
  for r in seed_rows:
    crossed = r.get("generalisation_above_threshold_step")
    if crossed is not None:
      times.append(crossed)
      reached.append(True)
    elif r.get("final_step") is not None:
      times.append(r["final_step"])
      reached.append(False)
  return stats.kaplan_meier(times, reached) if times else None


def depth_summary(seed_rows: Sequence[dict]) -> list[dict]:
  """One dict per depth aggregating `seed_summary` rows (means over seeds with finite values).

  Final generalisation also gets its 95% t-interval over seeds (`seed_stats.seed_mean`;
  `final_generalisation_ci_low`/`_high`, over `final_generalisation_n` seeds), Sarle's
  bimodality coefficient where it can signal (6 or more seeds, `seed_stats.shown_bimodality`;
  nan below) and the seeds per final rule (`final_rules`). The seeds above the threshold at the
  end get a 95% Clopper-Pearson interval of their fraction (`fraction_above_threshold_ci_low`/
  `_high`), beside the seeds above it at each of the last `SUSTAINED_EVALUATIONS` evaluations
  (`seeds_sustained`); the time to the first crossing is the Kaplan-Meier median with seeds that
  never crossed censored (`generalisation_crossing_median`, `..._ci_low`, `..._ci_high`, inf:
  not reached; `seeds_crossed`).
  """
  by_depth = collections.defaultdict(list)
  for r in seed_rows:
    by_depth[r["depth"]].append(r)
  out = []
  for depth in sorted(by_depth, key=lambda d: (d is None, d)):
    rows = by_depth[depth]
    counted = [r for r in rows if r["generalises"] is not None]
    finals = [r["final_generalisation"] for r in rows]
    interval = stats.mean_interval(finals)
    switches = [r["rule_switches"] for r in rows if r.get("rule_switches") is not None]
    above = sum(bool(r["generalises"]) for r in counted)
    fraction = stats.proportion_interval(above, len(counted))
    curve = crossing_curve(rows)
    row = {"depth": depth, "num_seeds": len(rows),
           "final_step": max((r["final_step"] or 0) for r in rows),
           "final_in_domain_mean": _mean(r["final_in_domain"] for r in rows),
           "final_generalisation_mean": _mean(r["final_generalisation"] for r in rows),
           "final_generalisation_median": _median(r["final_generalisation"] for r in rows),
           "final_generalisation_ci_low": interval.low,
           "final_generalisation_ci_high": interval.high,
           "final_generalisation_n": interval.n,
           "final_generalisation_bimodality": seed_stats.shown_bimodality(finals),
           "final_rules": seed_stats.rule_counts([r.get("final_rule") for r in rows]),
           "rule_switches_mean": _mean(switches) if switches else math.nan,
           "seeds_above_threshold": above,
           "fraction_above_threshold": fraction.estimate,
           "fraction_above_threshold_ci_low": fraction.low,
           "fraction_above_threshold_ci_high": fraction.high,
           "seeds_sustained": sum(bool(r.get("generalisation_sustained")) for r in counted),
           "seeds_crossed": 0 if curve is None else curve.events,
           "generalisation_crossing_median": math.nan if curve is None else curve.median.estimate,
           "generalisation_crossing_median_ci_low": math.nan if curve is None else curve.median.low,
           "generalisation_crossing_median_ci_high": (math.nan if curve is None
                                                      else curve.median.high),
           "early_stop_first_generalisation_mean": _mean(
               r["early_stop_first_generalisation"] for r in rows),
           "early_stop_last_generalisation_mean": _mean(
               r["early_stop_last_generalisation"] for r in rows),
           "in_domain_saturation_step_median": _median(
               r["in_domain_saturation_step"] for r in rows),
           "seeds_saturated": sum(r["in_domain_saturation_step"] is not None for r in rows)}
    for metric in registry.dynamics():
      row[f"final_{metric}_mean"] = _mean(r.get(f"final_{metric}") for r in rows)
    out.append(row)
  return out


def depth_trend(seed_rows: Sequence[dict]) -> stats.Test | None:
  """Jonckheere-Terpstra test of a trend of the seeds' final generalisation over depth (depths in
  increasing order, each seed one observation; `stats.ordered_trend`); None with fewer than two
  known depths."""
  depths = sorted({r["depth"] for r in seed_rows if r["depth"] is not None})
  if len(depths) < 2:
    return None
  return stats.ordered_trend([[r["final_generalisation"] for r in seed_rows if r["depth"] == d]
                              for d in depths])


def describe_test(test: stats.Test, what: str) -> str:
  """One sentence for a summary: the test, its n, effect, p and detectable effect, or "not
  testable at this n" (`Test.testable`) with the smallest p the test can reach there."""
  n = ", ".join(map(str, test.n))
  if not test.testable:
    return (f"{what}: {test.name}, n = ({n}): effect {_fmt(test.effect)}; not testable at this "
            f"n (smallest reachable p {test.min_p:.2g}, or no effect detectable with power 0.8).")
  return (f"{what}: {test.name}, n = ({n}): effect {_fmt(test.effect)}, p = {test.p:.2g} "
          f"(minimum detectable effect at alpha 0.05, power 0.8: {_fmt(test.detectable)}).")


def _fmt(v) -> str:
  if v is None:
    return ""
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, float):
    return "" if math.isnan(v) else f"{v:.4g}"
  return str(v)


def write_csv(path: str, rows: Sequence[dict]) -> None:
  """Writes dict rows (keys of the first row as header; missing values empty)."""
  keys = []
  for r in rows:
    keys += [k for k in r if k not in keys]
  with fileio.open_atomic(path) as f:
    w = csv.writer(f)
    w.writerow(keys)
    for r in rows:
      w.writerow([_fmt(r.get(k)) for k in keys])


def _cells_with_intervals(row: dict, key: str, varied: bool) -> str:
  """A depth row's interval cell of `key` (`final_generalisation`, `fraction_above_threshold`,
  `generalisation_crossing_median`)."""
  if key == "final_generalisation":
    return seed_stats.interval_cell(row.get("final_generalisation_mean"),
                                    row.get("final_generalisation_ci_low"),
                                    row.get("final_generalisation_ci_high"),
                                    row.get("final_generalisation_n") if varied else None)
  if key == "fraction_above_threshold":
    low, high = row.get("fraction_above_threshold_ci_low"), row.get(
        "fraction_above_threshold_ci_high")
    counted = f"{row['seeds_above_threshold']}/{row['num_seeds']}"
    return counted if low is None or not math.isfinite(low) else \
        f"{counted} [{low:.2f}, {high:.2f}]"
  median = row.get("generalisation_crossing_median", math.nan)
  crossed = f"({row.get('seeds_crossed', 0)}/{row['num_seeds']} crossed)"
  if median is None or math.isnan(median):
    return ""
  step = lambda v: "not reached" if math.isinf(v) else ("" if math.isnan(v) else f"{v:.0f}")
  low, high = (row.get("generalisation_crossing_median_ci_low", math.nan),
               row.get("generalisation_crossing_median_ci_high", math.nan))
  bounds = "" if math.isnan(low) else f" [{step(low)}, {step(high)}]"
  return f"{step(median)}{bounds} {crossed}"


def _seed_lines(seed_rows: Sequence[dict]) -> list[str]:
  """The "Seeds" section of summary.md: one row per seed, how it ends and how it got there."""
  counts = sorted({r.get("generalisation_oscillation_evaluations", OSCILLATION_EVALUATIONS)
                   for r in seed_rows})
  last = (f"last {counts[0]} evaluations" if len(counts) == 1 else
          f"last {counts[-1]} evaluations ({', '.join(map(str, counts[:-1]))} where a seed has "
          "fewer)")
  lines = ["", "## Seeds", "",
           "| run | depth | seed | in-domain acc. (final) | gen. acc. (final) | "
           f"gen. acc. std, {last} | final rule | rule switches |", "|" + "---|" * 8]
  for r in seed_rows:
    lines.append("| " + " | ".join(_fmt(v) for v in (
        r["run"], r["depth"], r["seed"], r["final_in_domain"], r["final_generalisation"],
        r.get("generalisation_oscillation"), r.get("final_rule"), r.get("rule_switches"))) + " |")
  lines += ["", "Final rule: the rule (hierarchical, move-first, skip-relative) the seed's last "
            "evaluation agrees with most; rule switches: how often that dominant rule changed "
            "between evaluations (ties skipped). Both need the rule agreements of question "
            "formation; empty otherwise."]
  return lines


def write_markdown(path, root, runs, depth_rows, figures, skipped, threshold, saturation,
                   tie_tolerance, seed_rows: Sequence[dict] = (),
                   extra_lines: Sequence[str] = ()) -> None:
  """Writes summary.md: the runs, the per-depth table, the rules used, the per-seed table, any
  `extra_lines` (e.g. the seed groups' table), the figures and notes."""
  ns = [r.get("final_generalisation_n", 0) for r in depth_rows
        if r.get("final_generalisation_n", 0) >= 2]  # rows with an interval
  varied = len({n for n in ns if n}) > 1
  shown_b = any(math.isfinite(r.get("final_generalisation_bimodality", math.nan))
                for r in depth_rows)
  columns = [
      ("depth", "depth"), ("num_seeds", "seeds"), ("final_step", "last step"),
      ("final_in_domain_mean", "in-domain acc. (final, mean)"),
      ("final_generalisation", seed_stats.interval_header("gen. acc. (final)", ns)),
      ("final_generalisation_median", "gen. acc. (final, median)")] + (
      [("final_generalisation_bimodality", "bimodality (Sarle's b; from 6 seeds)")]
      if shown_b else []) + (
      [("final_rules", "final rule (seeds)")] if any(r.get("final_rules") for r in depth_rows)
      else []) + [
      ("fraction_above_threshold",
       f"seeds gen. > {threshold:g} at the end [95% Clopper-Pearson CI]"),
      ("seeds_sustained", f"seeds gen. > {threshold:g} at each of the last "
                          f"{SUSTAINED_EVALUATIONS} evaluations"),
      ("generalisation_crossing_median",
       f"first step gen. > {threshold:g}: Kaplan-Meier median [95% CI]"),
      ("early_stop_first_generalisation_mean", "gen. acc. early stop (first best)"),
      ("early_stop_last_generalisation_mean", "gen. acc. early stop (last best)"),
      ("in_domain_saturation_step_median", f"median step in-domain >= {saturation:g}")] + [
      (f"final_{column}_mean", f"{d.short} (final)")
      for column, d in registry.dynamics().items() if d.in_summary]
  trend = depth_trend(seed_rows)
  trend_lines = [] if trend is None else [
      "", describe_test(trend, "Trend of the final generalisation over depth (each seed one "
                        "observation; effect: Kendall-type tau)")]
  run_list = ", ".join(f"`{r.name}` (depth {r.depth}, {r.task or 'task ?'})" for r in runs)
  analysed = [f"`{r.name}`: {note}" for r in runs
              if (note := analysis_sentences([r], list(registry.dynamics())))]
  lines = [f"# Report for `{os.path.basename(os.path.normpath(root))}`", "",
           f"Runs: {run_list}."]
  if analysed:
    lines += ["", "Sentences the analysis read (tscore, tparseval, attention entropy): "
              f"{'; '.join(analysed)}."]
  lines += ["", "| " + " | ".join(c[1] for c in columns) + " |", "|" + "---|" * len(columns)]
  for row in depth_rows:
    cells = []
    for key, _ in columns:
      if key in ("final_generalisation", "fraction_above_threshold",
                 "generalisation_crossing_median"):
        cells.append(_cells_with_intervals(row, key, varied))
      elif key == "seeds_sustained":
        cells.append(f"{row[key]}/{row['num_seeds']}")
      else:
        cells.append(_fmt(row.get(key)))
    lines.append("| " + " | ".join(cells) + " |")
  ties = ("exact ties" if tie_tolerance == 0 else
          f"values within {tie_tolerance:g} of the best count as tied")
  incomplete = [r for r in runs if r.num_steps and r.series.get(GEN_ACC) and
                max(int(s[0][-1]) for s in r.series[GEN_ACC].values() if len(s[0])) < r.num_steps]
  lines += [
      "", "Means are over seeds with a finite value; accuracies are fractions of lines correct. "
      "Intervals (docs/analysis.md, \"Statistics\"): the seed mean's 95% Student t interval "
      "(n = the seeds with a value; it holds its coverage at 4 seeds, where a bootstrap covers "
      "about 78%); the fraction of seeds above the threshold at the end with its 95% "
      "Clopper-Pearson interval; the first step above the threshold as the Kaplan-Meier median "
      "over seeds, seeds that never crossed censored at their last evaluation (\"not reached\": "
      "fewer than half crossed; the interval is Brookmeyer-Crowley's), beside the seeds that stay "
      f"above it at each of their last {SUSTAINED_EVALUATIONS} evaluations. Sarle's bimodality "
      "coefficient can exceed 5/9 only from 6 seeds on (at most 2/7 at 4 seeds), so it is shown "
      "only there; the final rule column counts the seeds per rule they end on.",
      *trend_lines,
      "", "**Early stopping rule.** For each seed the evaluation with the highest in-domain "
      f"accuracy is selected ({ties}). Because "
      "in-domain accuracy usually sits at its maximum for most of training, the tie-breaking "
      "rule decides the result: *first best* takes the earliest tied evaluation (what early "
      "stopping with patience does), *last best* the latest (close to the end of training). "
      "Both are reported (docs/REFERENCE.md §1: on the released question-formation curves first "
      "best gives ~7% generalisation, last best the final value).",
      "", f"**Generalising seed**: final generalisation accuracy > {threshold:g} (final = the "
      "seed's last evaluated step)."]
  lines += _seed_lines(seed_rows) if seed_rows else []
  lines += list(extra_lines)
  lines += ["", "## Figures", ""]
  lines += [f"* `{os.path.basename(f)}`" for f in figures]
  if skipped or incomplete:
    lines += ["", "## Notes", ""]
    lines += [f"* {note}" for note in skipped]
    lines += [f"* `{r.name}` is unfinished: last evaluation before train.num_steps={r.num_steps}"
              for r in incomplete]
  fileio.write_atomic(path, "\n".join(lines) + "\n")
