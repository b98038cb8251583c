"""The "Initialisation x data order" section of summary.md: runs whose seeds cross `seeds.init`
with `seeds.data` (issue 52; the PolyPythias design, van der Wal et al., ICLR 2025, Sec. 4).

For each such run: the grid of final generalisation (rows: initialisation, columns: data order;
`cells_lines`), and the share of the seeds' variance each factor explains with its restricted
permutation test (`sg_jax.stats.crossed`), for final generalisation and for the final rule
(`shares_lines`); `plot_cells` draws the grid as a heat map (`crossed_<run>.png`). The claims
`grokking.init_seed_decides` / `grokking.data_seed_decides` turn the same numbers into verdicts.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from sg_jax.report import group_stats
from sg_jax.report import groups as groups_lib
from sg_jax.report import tables
from sg_jax.report.plotting import pyplot, save_figure
from sg_jax.report.reading import GEN_ACC, Run
from sg_jax.stats import crossed

FACTORS = ("seeds.init", "seeds.data")


def crossed_levels(run: Run) -> tuple[list[int], list[int], list[int]] | None:
  """(seeds, initialisation level per seed, data-order level per seed) of a run whose config
  gives both `seeds.init` and `seeds.data` per seed with >= 2 levels each, else None. A level
  of -1 in config.json means "the seed's own id" (the default) and is resolved to it."""
  fields = groups_lib.per_seed_fields(run.config)
  if any(f not in fields for f in FACTORS):
    return None
  first = int(run.config.get("first_seed", 0))
  n = min(len(fields[f]) for f in FACTORS)
  seeds = [first + k for k in range(n)]
  levels = [[s if int(fields[f][k]) == -1 else int(fields[f][k]) for k, s in enumerate(seeds)]
            for f in FACTORS]
  if len(set(levels[0])) < 2 or len(set(levels[1])) < 2:
    return None
  return seeds, levels[0], levels[1]


def run_analysis(run: Run) -> dict | None:
  """{'seeds', 'init', 'data', 'final' ([n] final out-of-domain accuracy, 0-1), 'rule'
  ([n] final rule names, "none" where no rule logged), 'generalisation' and 'rule_result'
  (`crossed.CrossedResult`, or the one-line reason the design cannot be analysed)} of a
  crossed run with finite final generalisation on its seeds, else None."""
  found = crossed_levels(run)
  if found is None or not run.series.get(GEN_ACC):
    return None
  seeds, init, data = found
  finals = [group_stats.seed_final(run, GEN_ACC, s) for s in seeds]
  keep = [i for i, v in enumerate(finals) if math.isfinite(v)]
  pick = lambda xs: [xs[i] for i in keep]
  rules = [tables.rules_of_seed(run, s)[0] or "none" for s in pick(seeds)]
  out = {"seeds": pick(seeds), "init": pick(init), "data": pick(data), "final": pick(finals),
         "rule": rules}
  for key, values in (("generalisation", out["final"]), ("rule_result", rules)):
    try:
      out[key] = crossed.crossed_variance(values, out["init"], out["data"], FACTORS)
    except ValueError as e:
      out[key] = str(e)
  return out


def analyses(runs: Sequence[Run]) -> list[tuple[Run, dict]]:
  """[(run, `run_analysis(run)`)] of the crossed runs among `runs`: computed once, for the
  section, its tables and figures."""
  return [(run, got) for run in runs if (got := run_analysis(run)) is not None]


def cells_lines(runs: Sequence[Run]) -> list[str]:
  """A markdown table per crossed run: final generalisation of each seed at (initialisation
  row, data-order column) with its final rule's initial, row and column means."""
  return _cells(analyses(runs))


def _cells(analyses: Sequence[tuple[Run, dict]]) -> list[str]:
  lines = []
  for run, got in analyses:
    inits, datas = sorted(set(got["init"])), sorted(set(got["data"]))
    cell = {}
    for i, d, v, r in zip(got["init"], got["data"], got["final"], got["rule"]):
      cell.setdefault((i, d), []).append(f"{v:.3f} ({r[0] if r != 'none' else '-'})")
    lines += [f"| {run.name}: init \\ data | " + " | ".join(f"data {d}" for d in datas)
              + " | mean |", "|" + "---|" * (len(datas) + 2)]
    for i in inits:
      row = [v for (ii, _), v in zip(zip(got["init"], got["data"]), got["final"]) if ii == i]
      lines.append(f"| init {i} | " + " | ".join(", ".join(cell.get((i, d), [""]))
                                                 for d in datas) + f" | {np.mean(row):.3f} |")
    means = [np.mean([v for dd, v in zip(got["data"], got["final"]) if dd == d]) for d in datas]
    lines.append("| mean | " + " | ".join(f"{m:.3f}" for m in means)
                 + f" | {np.mean(got['final']):.3f} |")
  return lines


def shares_lines(runs: Sequence[Run]) -> list[str]:
  """A markdown table: per crossed run, outcome (final generalisation, final rule) and factor,
  the share of the seeds' variance (sum of squares over the total), the partial eta squared,
  the restricted permutation test's one-sided p (exact or drawn), its smallest possible p and
  the partial eta squared the design detects (power 0.8, alpha 0.05)."""
  return _shares(analyses(runs))


def _shares(analyses: Sequence[tuple[Run, dict]]) -> list[str]:
  rows = []
  for run, got in analyses:
    for outcome, key in (("final generalisation", "generalisation"), ("final rule", "rule_result")):
      result = got[key]
      if isinstance(result, str):
        rows.append(f"| {run.name} | {outcome} | (not analysed: {result}) | | | | | | |")
        continue
      if result.total_ss == 0:
        rows.append(f"| {run.name} | {outcome} | (every seed the same: nothing to explain) "
                    "| | | | | | |")
        continue
      for f in result.factors:
        rows.append(f"| {run.name} | {outcome} | {f.name} ({f.levels} levels) | {f.share:.2f} | "
                    f"{f.partial_eta2:.2f} | {f.p:.3g} ({'exact' if f.exact else 'drawn'}) | "
                    f"{f.min_p:.2g} | {_fmt_detectable(f.detectable)} | "
                    f"{result.residual_share:.2f} |")
  if not rows:
    return []
  return ["| run | outcome | factor | share of variance | partial eta^2 | p (restricted "
          "permutation) | smallest p | detectable partial eta^2 | rest (interaction + within) |",
          "|" + "---|" * 9, *rows]


def cell_grid(got: dict) -> tuple[list[int], list[int], np.ndarray]:
  """(initialisation levels, data-order levels, [I, D] grid) of a `run_analysis` result: the
  mean final generalisation (0-1) of the seeds in each cell, NaN where a cell has none."""
  inits, datas = sorted(set(got["init"])), sorted(set(got["data"]))
  grid = np.full((len(inits), len(datas)), np.nan)
  for i, row in enumerate(inits):
    for j, col in enumerate(datas):
      cell = [v for a, b, v in zip(got["init"], got["data"], got["final"]) if a == row and b == col]
      if cell:
        grid[i, j] = float(np.mean(cell))
  return inits, datas, grid


def plot_cells(run: Run, got: dict | None, path: str, title_prefix: str):
  """Heat map of a crossed run's final generalisation accuracy (0-1): rows the initialisation
  seeds (`seeds.init`), columns the data orders (`seeds.data`), each cell the seed's value
  (the cell mean where several seeds share it) and the first letter of its final rule, with
  the row and column means beside the grid; the title gives each factor's share of variance
  and restricted-permutation p. `got`: `run_analysis(run)`.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when `got` is
    None (`run` is not a crossed run with generalisation rows).
  """
  if got is None:
    return None
  plt = pyplot()
  inits, datas, grid = cell_grid(got)
  letters = {}
  for a, b, r in zip(got["init"], got["data"], got["rule"]):
    letters.setdefault((a, b), []).append(r[0] if r != "none" else "-")
  fig, ax = plt.subplots(figsize=(1.0 * len(datas) + 3.5, 0.8 * len(inits) + 2))
  image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
  for i, a in enumerate(inits):
    for j, b in enumerate(datas):
      if np.isfinite(grid[i, j]):
        ax.text(j, i, f"{grid[i, j]:.2f}\n{''.join(letters[(a, b)])}", ha="center", va="center",
                fontsize=8, color="white" if grid[i, j] < 0.6 else "black")
  ax.set_xticks(range(len(datas)),
                [f"data {b}\n{np.nanmean(grid[:, j]):.2f}" for j, b in enumerate(datas)])
  ax.set_yticks(range(len(inits)),
                [f"init {a}  {np.nanmean(grid[i]):.2f}" for i, a in enumerate(inits)])
  ax.set_xlabel("data order (seeds.data), column mean")
  ax.set_ylabel("initialisation (seeds.init), row mean")
  fig.colorbar(image, ax=ax, label="final generalisation accuracy")
  result = got["generalisation"]
  said = ("; ".join(f"{f.name}: share {f.share:.2f}, p {f.p:.2g}" for f in result.factors)
          if not isinstance(result, str) else result)
  ax.set_title(f"{title_prefix}{run.name}: final generalisation (letter: final rule)\n{said} "
               f"(restricted permutation, n={len(got['final'])})", fontsize=9)
  return save_figure(fig, path)


def _fmt_detectable(v: float) -> str:
  return "none at this n" if not math.isfinite(v) else f"{v:.2f}"


def markdown_lines(runs: Sequence[Run],
                   found: Sequence[tuple[Run, dict]] | None = None) -> list[str]:
  """The "Initialisation x data order" section of summary.md ([] without a crossed run);
  `found`: `analyses(runs)` when already computed."""
  found = analyses(runs) if found is None else found
  if not found:
    return []
  return (["", "## Initialisation x data order", "", *_cells(found), "",
           "Final out-of-domain accuracy of each seed, at its initialisation seed (row) and data "
           "order (column), with the first letter of its final rule "
           "(`tables.rules_of_seed`). Below: the share of the seeds' variance each factor's "
           "level means explain (balanced two-way sums of squares; the final rule coded as "
           "one indicator per rule), tested by permuting the outcomes within the other "
           "factor's levels (`sg_jax.stats.crossed`, docs/analysis.md).", "",
           *_shares(found)])


__all__ = ["FACTORS", "analyses", "cell_grid", "cells_lines", "crossed_levels",
           "markdown_lines", "plot_cells", "run_analysis", "shares_lines"]
