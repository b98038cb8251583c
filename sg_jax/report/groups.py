"""Seed groups of one run: seeds that differ by a per-seed config value, compared with CIs.

One vmapped run can hold several regimes side by side, e.g. the SAS regulariser's strength per
seed (Chen et al., ICLR 2024; docs/sas.md) or a training-data mix per seed (docs/data.md): a
config field whose value in `config.json` is a list with one entry per seed. Seeds with the same
entries of every such field form a group; `groups_depth<D>.png` draws, per group, the seed mean
of each compared metric with its 95% t-interval over seeds (`seed_stats.seed_mean`) and marks
each seed's onset (`sg_jax.analysis.onsets`), and summary.md gets a table of the final values
per group, the time to generalise (`out_of_domain/accuracy` above the report's threshold: the
Kaplan-Meier median of the first crossing, seeds that never cross censored; the seeds that stay
above it at the end) and the rules they end on, and a table comparing each group with the
first (`comparison_rows`: permutation test of the final generalisation and of each
construction's, Fisher's exact test of the seeds above the threshold at the end, log-rank test
of the time to generalise; each with its minimum detectable effect, Holm-corrected over the
table). Metrics without an onset signal (the in-domain loss, tscore and tparseval from
`sg_jax.analyze`, the tree regulariser's penalty) get a panel and a final value only.
"""

from __future__ import annotations

import collections
import math
from typing import Mapping, Sequence

import numpy as np

from sg_jax import stats
from sg_jax.analysis import onsets as onsets_lib
from sg_jax.report import seed_stats
from sg_jax.report import tables
from sg_jax.report.plotting import CONSTRUCTION_COLORS, legend_outside, mean_band, pyplot
from sg_jax.report.reading import Run

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
GEN_ACC = "out_of_domain/accuracy"
# Panel titles of a run whose accuracy series are borrowed (`Run.accuracy_from`, a masked LM).
BORROWED_TITLES = {"in_domain/accuracy": "in-domain {0} (minimal pairs)",
                   "out_of_domain/accuracy": "generalisation: out-of-domain {0} (minimal pairs)"}
PANELS_PER_ROW = 4
# Per-construction generalisation (Task.constructions; docs/tasks.md).
CONSTRUCTION_PREFIX = "out_of_domain/accuracy/"


def _flat(config: Mapping, prefix: str = "") -> dict:
  out = {}
  for key, value in config.items():
    if isinstance(value, Mapping):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def per_seed_fields(config: Mapping) -> dict[str, list]:
  """{dotted field: [value per seed]}: the config fields given one value per seed (a list as
  long as `num_seeds`, > 1 seed, with at least two distinct values)."""
  num_seeds = config.get("num_seeds")
  if not isinstance(num_seeds, int) or num_seeds < 2:
    return {}
  return {name: list(value) for name, value in _flat(config).items()
          if isinstance(value, (list, tuple)) and len(value) == num_seeds
          and len({repr(v) for v in value}) > 1}


def grouping_fields(config: Mapping, by: Sequence[str] | None = None) -> dict[str, list]:
  """{dotted field: [value per seed]} of the per-seed fields seeds are grouped by: every
  `per_seed_fields` entry when `by` is empty, else those `by` names, in `by`'s order (a name
  may be the field's last part, e.g. 'weight_decay' for 'optim.weight_decay'; a name that is no
  per-seed field of this run, e.g. one value for all its seeds, is left out)."""
  fields = per_seed_fields(config)
  if not by:
    return fields
  out = {}
  for name in by:
    match = [f for f in fields if f == name or f.split(".")[-1] == name]
    if len(match) > 1:
      raise ValueError(f"--group_by {name!r} names several per-seed fields: {match}")
    if match:
      out[match[0]] = fields[match[0]]
  return out


def seed_groups(run: Run, by: Sequence[str] | None = None) -> dict[str, list[int]]:
  """{label: seeds} of a run's seed groups, in first-seed order: seeds with the same value of
  every per-seed field (`per_seed_fields`), or of the fields named in `by` only, the others
  pooled (`grouping_fields`; e.g. a grid of weight decay x learning rate grouped by weight
  decay); {} when every seed has the same value of them. Labels read `field=value, ...` (the
  section name left out where the field name is unique).

  Raises:
    ValueError: a `by` name matching several per-seed fields.
  """
  fields = grouping_fields(run.config, by)
  if not fields:
    return {}
  first = int(run.config.get("first_seed", 0))
  groups: dict[str, list[int]] = collections.OrderedDict()
  last = collections.Counter(name.split(".")[-1] for name in fields)
  short = {name: name.split(".")[-1] if last[name.split(".")[-1]] == 1 else name
           for name in fields}  # e.g. "lambdas", but "sas.lambdas" beside "tree.lambdas"
  for k in range(int(run.config["num_seeds"])):
    label = ", ".join(f"{short[name]}={values[k]}" for name, values in fields.items())
    groups.setdefault(label, []).append(first + k)
  return dict(groups)


def _unflat(flat: Mapping[str, object]) -> dict:
  out: dict = {}
  for dotted, value in flat.items():
    node = out
    *sections, leaf = dotted.split(".")
    for part in sections:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


def merge_runs(runs: Sequence[Run], name: str) -> Run:
  """One Run holding the seeds of `runs` (e.g. the jobs of one depth of a grid sweep), so that
  its seeds group by a field that differs between the runs (a job axis such as `model.d_model`)
  as by a per-seed field: the seeds are renumbered from 0 in run order (run i's seed
  `first_seed_i + k` becomes `n_0 + ... + n_{i-1} + k`), and every config field is given one
  value per merged seed (a run's per-seed list, else its one value repeated), so that
  `per_seed_fields` finds each field that differs between seeds of the merged run.

  Args:
    runs: runs with the same task and metrics (their `series` [steps] per seed).
    name: the merged run's name.

  Raises:
    ValueError: a run without `num_seeds` in its config.
  """
  flats, counts = [], []
  for run in runs:
    n = run.config.get("num_seeds")
    if not isinstance(n, int):
      raise ValueError(f"run {run.name} has no num_seeds in its config.json: cannot merge it")
    flats.append(_flat(run.config))
    counts.append(n)
  merged_flat: dict[str, list] = {}
  for field in dict.fromkeys(f for flat in flats for f in flat):
    values = []
    for flat, n in zip(flats, counts):
      value = flat.get(field)
      per = isinstance(value, (list, tuple)) and len(value) == n and n > 1
      values += list(value) if per else [value] * n
    merged_flat[field] = values
  merged_flat.update({"num_seeds": sum(counts), "first_seed": 0})
  series: dict = collections.defaultdict(dict)
  offset = 0
  for run, n in zip(runs, counts):
    first = int(run.config.get("first_seed", 0))
    for metric, by_seed in run.series.items():
      for seed, curve in by_seed.items():
        series[metric][offset + seed - first] = curve
    offset += n
  froms = {run.accuracy_from for run in runs}
  return Run(workdir=runs[0].workdir, name=name, depth=runs[0].depth, task=runs[0].task,
             num_steps=runs[0].num_steps, series=dict(series), config=_unflat(merged_flat),
             accuracy_from=froms.pop() if len(froms) == 1 else "")


def job_axis_runs(runs: Sequence[Run], by: Sequence[str]) -> list[Run]:
  """The runs of each depth merged into one (`merge_runs`, named `depth<D>_jobs`) where a field
  `by` names differs between them (a job axis of a grid sweep, e.g. `model.d_model`; the
  per-seed fields of the runs stay per seed), so that the report groups their seeds by it;
  [] without `by` or where no named field differs between runs of one depth."""
  if not by:
    return []
  by_depth = collections.defaultdict(list)
  for run in runs:
    by_depth[run.depth].append(run)
  out = []
  for depth, members in by_depth.items():
    if len(members) < 2 or not all(isinstance(r.config.get("num_seeds"), int) for r in members):
      continue
    merged = merge_runs(members, f"depth{depth}_jobs")
    fields = grouping_fields(merged.config, by)
    if any(not all(f in per_seed_fields(r.config) for r in members) for f in fields):
      out.append(merged)
  return out


def _final(run: Run, name: str, seed: int) -> float:
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


def _crossings(run: Run, seeds: Sequence[int], threshold: float) -> tuple[list, list]:
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
      _with_interval(row, name, [_final(run, name, s) for s in seeds])
      if signal is None:
        continue
      steps = [onsets[s][signal].step for s in seeds if s in onsets and signal in onsets[s]]
      finite = [x for x in steps if math.isfinite(x)]
      row[f"{signal}_onset_median"] = float(np.median(finite)) if finite else math.nan
    if run.series.get(GEN_ACC):
      times, reached = _crossings(run, seeds, threshold)
      crossed = [t for t, r in zip(times, reached) if r]
      curve = stats.kaplan_meier(times, reached) if times else None
      finals = [_final(run, GEN_ACC, s) for s in seeds]
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
      _with_interval(row, name, [_final(run, name, s) for s in seeds])
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
  test = stats.ordered_trend([[_final(run, GEN_ACC, first + k) for k, v in enumerate(values)
                               if v == level] for level in levels])
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
  finals = lambda name, seeds: [_final(run, name, s) for s in seeds]
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
    ref_times, grp_times = (_crossings(run, reference, threshold),
                            _crossings(run, seeds, threshold))
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


def plot_groups(run: Run, groups: Mapping[str, Sequence[int]], path: str, title_prefix: str):
  """Per compared metric the run logged: the seed mean of each group over training with its 95%
  t-interval band over seeds, and each seed's onset as a tick at the bottom of the panel.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run has
    fewer than two groups or none of `COMPARED`.
  """
  panels = [(n, sig, t) for n, sig, t in COMPARED if run.series.get(n)]
  if len(groups) < 2 or not panels:
    return None
  plt = pyplot()
  onsets = onsets_lib.seed_onsets(run.series)
  cols = min(len(panels), PANELS_PER_ROW)
  nrows = -(-len(panels) // cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols + 2.5, 4 * nrows), squeeze=False)
  for ax in axes.flat[len(panels):]:
    ax.set_visible(False)
  cmap = plt.get_cmap("tab10")
  for ax, (name, signal, title) in zip(axes.flat, panels):
    for g, (label, seeds) in enumerate(groups.items()):
      color = cmap(g % cmap.N)
      per_step = collections.defaultdict(list)
      for seed in seeds:
        if seed in run.series[name]:
          for step, value in zip(*run.series[name][seed]):
            if math.isfinite(value):
              per_step[int(step)].append(float(value))
      steps = np.array(sorted(per_step))
      if not steps.size:
        continue
      mean_band(ax, steps, per_step, color, alpha=0.2, lw=1.8,
                label=f"{label} ({len(seeds)} seeds)")
      marks = [onsets[s][signal].step for s in seeds if s in onsets and signal in onsets[s]]
      marks = [m for m in marks if math.isfinite(m)]
      ax.plot(marks, [0.02] * len(marks), "|", color=color, ms=12, mew=2,
              transform=ax.get_xaxis_transform())
    if name == "train/loss":
      ax.set_yscale("log")
    if run.accuracy_from and name in BORROWED_TITLES:
      title = BORROWED_TITLES[name].format(run.accuracy_from)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3)
  legend_outside(axes[0][cols - 1]).set_title("band: 95% t-interval over seeds;\n"
                                         "ticks: onsets of each seed", prop={"size": 8})
  fig.suptitle(f"{title_prefix}seed groups of {run.name}")
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig


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


def plot_dose_response(run: Run, path: str, title_prefix: str,
                       by: Sequence[str] | None = None):
  """Final generalisation against each numeric per-seed config field (e.g. the number of
  disambiguating questions, the weight decay of a grid sweep, `seeds.init`), or each of those
  `by` names (`grouping_fields`): per value, the seed mean of the final `out_of_domain/accuracy`
  and of each construction's (`out_of_domain/accuracy/<tag>`) with its 95% t-interval over the
  seeds of each value (n in the legend title), the seeds of the other per-seed fields' values
  pooled.

  Returns:
    the (closed) matplotlib Figure written to `path`, or None (nothing written) when the run has
    no numeric per-seed field or no generalisation rows.
  """
  fields = {n: v for n, v in grouping_fields(run.config, by).items()
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)}
  metrics = ["out_of_domain/accuracy"] + sorted(
      n for n in run.series if n.startswith("out_of_domain/accuracy/"))
  if not fields or not run.series.get(metrics[0]):
    return None
  plt = pyplot()
  first = int(run.config.get("first_seed", 0))
  fig, axes = plt.subplots(1, len(fields), figsize=(5 * len(fields) + 2.5, 4), squeeze=False)
  for ax, (field, values) in zip(axes[0], fields.items()):
    doses = sorted(set(values))
    for name in metrics:
      tag = name.split("/")[-1] if name.count("/") == 2 else ""
      got = np.array([seed_stats.seed_mean(
          [_final(run, name, first + k) for k, v in enumerate(values) if v == dose])
          for dose in doses])
      ax.errorbar(doses, got[:, 0], yerr=[got[:, 0] - got[:, 1], got[:, 2] - got[:, 0]],
                  fmt="o-" if not tag else "s--", capsize=3, lw=2.2 if not tag else 1.2,
                  color="black" if not tag else CONSTRUCTION_COLORS.get(tag),
                  label="all gen lines" if not tag else tag)
    ax.set_xticks(doses, [f"{d:g}" for d in doses], rotation=45 if len(doses) > 4 else 0)
    ax.set_xlabel(field)
    ax.set_ylabel("final generalisation accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  sizes = sorted({values.count(v) for values in fields.values() for v in set(values)})
  legend_outside(axes[0][-1]).set_title(
      f"seed mean, 95% t-interval (n={'/'.join(map(str, sizes))} seeds per value)",
      prop={"size": 8})
  fig.suptitle(f"{title_prefix}dose response of {run.name}")
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return fig
