"""Tables in docs/ generated from `results/`: each sits in a results page (docs/results/<study>.md,
where the docs keep their measurements; the how-to pages link to it) between two markers naming
its study and table,

    <!-- results: qf_depth/claims -->
    | claim | setting | ... |
    <!-- /results -->

and `python -m sg_jax.results render-docs` rewrites every such block from `results/<study>`
(markers inside fenced code blocks are examples and are left alone)
(`--check`: only report the blocks that differ, exit 1 if any). tests/results/test_results_docs.py runs
the check, so a doc whose table disagrees with its data fails the tests.

Tables (`TABLES`), each computed as the report computes it, from every run in the study folder:

  claims   the Claims table (`sg_jax.claims`; the claims with runs in the study only)
  depths   per depth: seeds, final generalisation (seed mean, Student-t 95% interval),
           median, seeds above 0.8, early stopping (first best / last best)
  seeds    per seed: run, depth, final in-domain and generalisation accuracy, final rule

and the tables of the report's summary.md sections, computed by the report's own functions:

  groups          "Seed groups": per group of seeds sharing a per-seed config value, final
                  values with t-intervals, Kaplan-Meier time to generalise, seed counts
  group-rules     "Seed groups by construction and rule"
  group-tests     "Seed groups against the first group" (permutation, Fisher, log-rank,
                  Jonckheere-Terpstra; Holm)
  crossed         per run crossing seeds.init with seeds.data: the grid of final
                  generalisation (`report.crossed_seeds`)
  crossed-shares  the share of variance of each factor with its restricted permutation test
  objectives      "Objectives"
  baselines       "Baselines" (every measure's table with its title)
  pruning         "Pruning" (per sparsity level), pruning-seeds (per seed: effective sizes)
  phases          "Phase transitions" of one run: each curve's onset step per seed, the seed
                  mean with its t-interval and the resolution (`report.phase_transitions`)
  phase-order     the same run's order of the mean onsets at their resolution and the lags

A block may name one run of a study, `<!-- results: objectives/lm/phases -->`, which the phase
tables need when the study holds several runs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Callable, Sequence

import numpy as np

from sg_jax import claims as claims_lib
from sg_jax import stats
from sg_jax.records import fileio
from sg_jax.report import baselines
from sg_jax.report import crossed_seeds
from sg_jax.report import group_markdown
from sg_jax.report import group_stats
from sg_jax.report import groups
from sg_jax.report import objectives
from sg_jax.report import phase_transitions
from sg_jax.report import pruning_tables
from sg_jax.report import reading
from sg_jax.report import tables

MARKER = re.compile(r"<!-- results: (?P<study>[\w.-]+(?:/[\w.-]+)*)/(?P<table>[\w-]+) -->\n"
                    r"(?P<body>.*?)<!-- /results -->", re.S)
THRESHOLD = 0.8  # generalising seed: final generalisation above this (the report's default)


class DocsError(ValueError):
  """A marker names a study or table that does not exist (named with file and line)."""


def _fmt(v, digits: int = 3) -> str:
  if v is None or (isinstance(v, float) and not math.isfinite(v)):
    return ""
  return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def claims_table(runs: Sequence[reading.Run]) -> list[str]:
  """The Claims table of `runs` (claims without runs left out)."""
  rows = [r for r in claims_lib.evaluate(runs) if r["verdict"] != claims_lib.NO_RUNS]
  return claims_lib.markdown_table(rows)


def depths_table(runs: Sequence[reading.Run]) -> list[str]:
  """Per depth: seeds, final generalisation (mean with Student-t 95% interval, median), seeds
  above `THRESHOLD`, mean generalisation at early stopping (first / last best)."""
  seed_rows = tables.seed_summary(runs, THRESHOLD, 0.99, 0.0)
  lines = ["| depth | seeds | final gen. mean [95% t-interval] | median | "
           f"seeds > {THRESHOLD:g} | early stop, first best | early stop, last best |",
           "|---|---|---|---|---|---|---|"]
  for depth in sorted({r["depth"] for r in seed_rows}, key=lambda d: (d is None, d)):
    rows = [r for r in seed_rows if r["depth"] == depth]
    finals = np.array([r["final_generalisation"] for r in rows], np.float64)
    finals = finals[np.isfinite(finals)]
    interval = stats.mean_interval(finals) if finals.size > 1 else None
    mean_cell = (f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}]"
                 if interval else _fmt(float(finals.mean())) if finals.size else "")
    first = np.nanmean([r["early_stop_first_generalisation"] for r in rows])
    last = np.nanmean([r["early_stop_last_generalisation"] for r in rows])
    above = sum(bool(r["generalises"]) for r in rows)
    lines.append(f"| {depth} | {len(rows)} | {mean_cell} | "
                 f"{_fmt(float(np.median(finals))) if finals.size else ''} | "
                 f"{above}/{len(rows)} | {first:.3f} | {last:.3f} |")
  return lines


def seeds_table(runs: Sequence[reading.Run]) -> list[str]:
  """Per seed: run, depth, seed, final in-domain and generalisation accuracy, final rule."""
  lines = ["| run | depth | seed | in-domain acc. (final) | gen. acc. (final) | final rule |",
           "|---|---|---|---|---|---|"]
  for r in tables.seed_summary(runs, THRESHOLD, 0.99, 0.0):
    lines.append(f"| {r['run']} | {r['depth']} | {r['seed']} | {_fmt(r['final_in_domain'])} | "
                 f"{_fmt(r['final_generalisation'])} | {r.get('final_rule') or ''} |")
  return lines


def section_table(lines: Sequence[str], heading: str, index: int = 0) -> list[str]:
  """The `index`-th markdown table (consecutive lines starting with "|") after the line
  `heading` of a report section and before the next heading; [] when there is none."""
  try:
    start = list(lines).index(heading) + 1
  except ValueError:
    return []
  tables_found, current = [], []
  for line in list(lines)[start:] + [""]:
    if line.startswith("#"):
      break
    if line.startswith("|"):
      current.append(line)
    elif current:
      tables_found.append(current)
      current = []
  if current:
    tables_found.append(current)
  return tables_found[index] if index < len(tables_found) else []


def _group_section(runs: Sequence[reading.Run]) -> list[str]:
  rows, tests = [], []
  for run, seed_sets in groups.runs_with_groups(runs):
    rows += group_stats.group_rows(run, seed_sets, threshold=THRESHOLD)
    tests += group_stats.comparison_rows(run, seed_sets, threshold=THRESHOLD)
  return group_markdown.markdown_lines(rows, tests)


def _pruning_section(runs: Sequence[reading.Run]) -> list[str]:
  levels, seeds = [], []
  for run in runs:
    data = pruning_tables.load_pruning(run.workdir, run.name)
    if data is not None:
      level_rows, seed_rows = pruning_tables.summary_rows(data)
      levels += level_rows
      seeds += seed_rows
  return pruning_tables.markdown_lines(levels, seeds)


def _phase_section(runs: Sequence[reading.Run]) -> tuple[str, list[str]]:
  """(run name, the "Phase transitions" lines) of the one run of `runs` with dynamics curves.

  Raises:
    DocsError: none or several runs have them (name one: `<study>/<run>/phases`).
  """
  found = [(run, phase_transitions.onsets(run)) for run in runs]
  found = [(run, f) for run, f in found if f is not None]
  if len(found) != 1:
    raise DocsError(f"the phase tables need exactly one run with dynamics curves, found "
                    f"{len(found)} ({', '.join(r.name for r, _ in found) or 'none'}); name "
                    "one run: <study>/<run>/phases")
  return found[0][0].name, phase_transitions.markdown_lines(found)


def phase_onsets_table(runs: Sequence[reading.Run]) -> list[str]:
  """Each curve's onset per seed, the seed mean [95% t CI] and the resolution (one run)."""
  name, lines = _phase_section(runs)
  return section_table(lines, f"### `{name}`")


def phase_order_lines(runs: Sequence[reading.Run]) -> list[str]:
  """The order of the mean onsets at their resolution, then the lag table (one run)."""
  name, lines = _phase_section(runs)
  order = next((line for line in lines if line.startswith("Order of the mean onsets")), "")
  return [order, ""] + section_table(lines, f"### `{name}`", 1)


def baselines_lines(runs: Sequence[reading.Run]) -> list[str]:
  """The "Baselines" section without its heading and opening paragraph: each measure's title
  and table."""
  lines = baselines.markdown_lines(baselines.baseline_rows(runs))
  first = next((k for k, line in enumerate(lines) if line.startswith("**")), len(lines))
  return lines[first:]


TABLES: dict[str, Callable[[Sequence[reading.Run]], list[str]]] = {
    "claims": claims_table, "depths": depths_table, "seeds": seeds_table,
    "groups": lambda runs: section_table(_group_section(runs), "## Seed groups"),
    "group-rules": lambda runs: section_table(_group_section(runs),
                                              "### Seed groups by construction and rule"),
    "group-tests": lambda runs: section_table(_group_section(runs),
                                              "### Seed groups against the first group"),
    "crossed": crossed_seeds.cells_lines,
    "crossed-shares": crossed_seeds.shares_lines,
    "objectives": lambda runs: section_table(
        objectives.markdown_lines(objectives.objective_rows(runs)), "## Objectives"),
    "baselines": baselines_lines,
    "pruning": lambda runs: section_table(_pruning_section(runs), "## Pruning"),
    "pruning-seeds": lambda runs: section_table(_pruning_section(runs), "## Pruning", 1),
    "phases": phase_onsets_table,
    "phase-order": phase_order_lines,
}


def render(results: str, study: str, table: str) -> str:
  """The markdown of `table` for `results/<study>` (lines joined, ending in a newline).

  Raises:
    DocsError: no such study folder (or no run in it), or no such table.
  """
  if table not in TABLES:
    raise DocsError(f"no table {table!r} (known: {', '.join(TABLES)})")
  folder = os.path.join(results, study)
  try:
    runs = [reading.load_run(w) for w in reading.find_runs(folder)]
  except reading.ReportError as e:
    raise DocsError(f"results/{study}: {e}") from e
  return "\n".join(TABLES[table](runs)) + "\n"


@dataclasses.dataclass(frozen=True)
class Block:
  """A generated block of a doc: where it is, what it holds and what its data give."""

  doc: str
  line: int
  study: str
  table: str
  current: str
  expected: str


def _fenced(text: str) -> list[tuple[int, int]]:
  """(start, end) offsets of the fenced code blocks of a markdown text."""
  spans, start, offset = [], None, 0
  for line in text.splitlines(keepends=True):
    if line.lstrip().startswith("```"):
      if start is None:
        start = offset
      else:
        spans.append((start, offset + len(line)))
        start = None
    offset += len(line)
  return spans


def _markers(text: str) -> list[re.Match]:
  """The generated blocks of a markdown text, leaving out examples inside code fences."""
  fences = _fenced(text)
  return [m for m in MARKER.finditer(text) if not any(a <= m.start() < b for a, b in fences)]


def blocks(doc: str, results: str) -> list[Block]:
  """The generated blocks of one markdown file, each with its freshly rendered table.

  Raises:
    DocsError: a block names a missing study or an unknown table (with the doc and line).
  """
  text = fileio.read_text(doc)
  out = []
  for m in _markers(text):
    line = text.count("\n", 0, m.start()) + 1
    try:
      expected = render(results, m["study"], m["table"])
    except DocsError as e:
      raise DocsError(f"{doc}:{line}: {e}") from e
    out.append(Block(doc, line, m["study"], m["table"], m["body"], expected))
  return out


def markdown_files(docs: str) -> list[str]:
  """The .md files below `docs` (a folder) or [docs] (a file), sorted."""
  if os.path.isfile(docs):
    return [docs]
  return sorted(os.path.join(d, n) for d, _, names in os.walk(docs) for n in names
                if n.endswith(".md"))


def stale_blocks(docs: str, results: str) -> list[Block]:
  """The generated blocks under `docs` whose text differs from what `results` gives."""
  return [b for path in markdown_files(docs) for b in blocks(path, results)
          if b.current != b.expected]


def render_docs(docs: str, results: str) -> list[Block]:
  """Rewrites every stale generated block under `docs` in place; returns those rewritten."""
  stale = stale_blocks(docs, results)
  for path in sorted({b.doc for b in stale}):
    text = fileio.read_text(path)
    pieces, last = [], 0
    for m in _markers(text):
      pieces += [text[last:m.start()], f"<!-- results: {m['study']}/{m['table']} -->\n",
                 render(results, m["study"], m["table"]), "<!-- /results -->"]
      last = m.end()
    fileio.write_atomic(path, "".join(pieces) + text[last:])
  return stale


def studies(results: str) -> list[str]:
  """The study folders directly below `results` ([] when it does not exist)."""
  if not os.path.isdir(results):
    return []
  return sorted(n for n in os.listdir(results) if os.path.isdir(os.path.join(results, n)))
