"""The "Seed groups" section of summary.md: `group_stats` rows written as markdown tables."""

from __future__ import annotations

import math
from typing import Sequence

from sg_jax import stats
from sg_jax.report import seed_stats
from sg_jax.report import tables
from sg_jax.report.group_stats import COMPARED, CONSTRUCTION_PREFIX


def _n(row: dict, name: str) -> int:
  return int(row.get(f"{name}_n", len(row["seeds"].split())))


def _with_ci(row: dict, name: str, fmt, show_n: bool = False) -> str:
  """`value [low, high]`, or `value (1 seed, no CI)` for a one-seed group; ` (n=3)` appended
  with `show_n` (groups of different seed counts)."""
  if _n(row, name) < 2:
    return f"{fmt(row.get(name))} (1 seed, no CI)"
  cell = (f"{fmt(row.get(name))} [{fmt(row.get(name + '_ci_low'))}, "
          f"{fmt(row.get(name + '_ci_high'))}]")
  return cell + (f" (n={_n(row, name)})" if show_n else "")


def _header(rows: Sequence[dict], name: str, what: str) -> tuple[str, bool]:
  """(the column header naming the t-interval and its n, whether cells must give n)."""
  ns = [_n(r, name) for r in rows if name in r and _n(r, name) >= 2]
  return seed_stats.interval_header(what, ns), len(set(ns)) > 1


def _step_interval(row: dict) -> str:
  median = row.get("gen_crossing_median", math.nan)
  if not isinstance(median, float) or math.isnan(median):
    return ""
  step = lambda v: "not reached" if math.isinf(v) else ("" if math.isnan(v) else f"{v:.0f}")
  low, high = row.get("gen_crossing_median_ci_low"), row.get("gen_crossing_median_ci_high")
  return step(median) + ("" if math.isnan(low) else f" [{step(low)}, {step(high)}]")


def markdown_lines(rows: Sequence[dict], comparisons: Sequence[dict] = ()) -> list[str]:
  """The "Seed groups" section of summary.md (`group_rows` of every run with groups, and their
  `comparison_rows`)."""
  if not rows:
    return []
  metrics = [(n, s) for n, s, _ in COMPARED if any(n in r for r in rows)]
  fmt = lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"
  above = next((r["gen_above_threshold"] for r in rows if "gen_above_threshold" in r), None)
  header, show = [], {}
  for n, s in metrics:
    text, show[n] = _header(rows, n, f"{n} (final)")
    header.append(text + ("" if s is None else f" | {s} onset (median)"))
  if above is not None:
    header.append(f"first step gen. > {above:g}: Kaplan-Meier median [95% CI] | seeds that "
                  f"cross | seeds > {above:g} at the end | seeds > {above:g} at each of the "
                  f"last {tables.SUSTAINED_EVALUATIONS} evaluations")
  lines = ["", "## Seed groups", "",
           "| run | group | seeds | " + " | ".join(header) + " |",
           "|" + "---|" * (3 + len(metrics) + sum(s is not None for _, s in metrics)
                           + (4 if above is not None else 0))]
  for r in rows:
    cells = [r["run"], r["group"], r["seeds"]]
    for name, signal in metrics:
      cells.append(_with_ci(r, name, fmt, show[name]) if name in r else "")
      if signal is not None:
        cells.append(fmt(r.get(f"{signal}_onset_median")))
    if above is not None:
      cells += [_step_interval(r), r.get("gen_above_seeds", ""),
                r.get("gen_final_above_seeds", ""), r.get("gen_sustained_seeds", "")]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "A group is the seeds given the same value of every per-seed config field (a "
            "list with one value per seed in config.json), or of the fields named by the "
            "report's --group_by, the others pooled. Intervals: the seed mean's 95% "
            "Student t interval over the group's seeds (n named in the header, or in the cell "
            "when groups differ); onsets: `sg_jax.analysis.onsets` (docs/sas.md, \"Onsets\"); "
            "first step gen. > threshold: the first evaluation whose out_of_domain/accuracy "
            "exceeds the report's --threshold, as the Kaplan-Meier median over the group's "
            "seeds with those that never cross censored at their last evaluation (\"not "
            "reached\": fewer than half cross), beside how many cross, end above it and stay "
            "above it (docs/analysis.md, \"Statistics\"). tscore and tparseval_f1 come from "
            "`sg_jax.analyze` (analysis.csv)."]
  tags = sorted({n for r in rows for n in r if n.startswith(CONSTRUCTION_PREFIX)
                 and not n.endswith(("_ci_low", "_ci_high", "_n"))})
  if tags or any("final_rules" in r for r in rows):
    heads = [_header(rows, t, f"{t[len(CONSTRUCTION_PREFIX):]} (final)") for t in tags]
    lines += ["", "### Seed groups by construction and rule", "",
              "| run | group | " + " | ".join(h for h, _ in heads)
              + " | final rule (seeds) | rule switches (mean per seed) |",
              "|" + "---|" * (4 + len(tags))]
    for r in rows:
      cells = [r["run"], r["group"]]
      cells += [_with_ci(r, t, fmt, varied) if t in r else "" for t, (_, varied) in
                zip(tags, heads)]
      cells += [r.get("final_rules", ""), fmt(r.get("rule_switches_mean"))]
      lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Final generalisation accuracy on each construction's gen lines "
              "(`out_of_domain/accuracy/<construction>`, docs/tasks.md); final rule: the rule "
              "each seed's last evaluation agrees with most, counted over the group's seeds "
              "(the Seeds table gives each seed's)."]
  if comparisons:
    lines += ["", "### Seed groups against the first group", "",
              "| run | group | against | quantity | test | seeds | effect | p | p (Holm) | "
              "minimum detectable effect |", "|" + "---|" * 10]
    for c in comparisons:
      detectable = (fmt(c["detectable"]) if c["testable"] else
                    f"not testable at this n (smallest p {c['min_p']:.2g})"
                    if c["min_p"] > stats.ALPHA else "none with power 0.8 at this n")
      lines.append("| " + " | ".join([c["run"], c["group"], c["reference"], c["quantity"],
                                       c["test"], c["n"], fmt(c["effect"]), fmt(c["p"]),
                                       fmt(c["p_holm"]), detectable]) + " |")
    lines += ["", "Each group against the first: final values by a permutation test of the "
              "difference of means (effect: group minus first), the seeds above the threshold "
              "at the end by Fisher's exact test (effect: difference of fractions), the first "
              "step above it by a log-rank test with censoring (effect: log hazard ratio, > 0: "
              "the group crosses sooner); a trend over a numeric per-seed field by the "
              "Jonckheere-Terpstra test on the seeds (effect: tau in [-1, 1]). p (Holm): "
              "corrected over every test of the run's rows. "
              "Minimum detectable effect: the smallest true effect each test finds with "
              "probability 0.8 at alpha 0.05 with these seeds "
              "(docs/analysis.md, \"Statistics\"); an observed effect below it is not "
              "evidence of no effect."]
  return lines
