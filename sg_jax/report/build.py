r"""Report: the structural-grokking figures and summary tables of a sweep or a single run.

  python -m sg_jax.report --root=runs/qf              # a sweep root (sg_jax.sweep)
  python -m sg_jax.report --root=runs/quick           # a single workdir
  python -m sg_jax.report --root=runs/qf --out_dir=figures/qf --threshold=0.8

Reads `metrics.csv` (training and evaluation, `step,seed,name,value`) and, where present,
`analysis.csv` (`sg_jax.analyze`) of every run below `--root`: the root itself when it holds a
`metrics.csv`, else the workdirs listed in `root/sweep.json`, else every direct subfolder holding
a `metrics.csv`. Runs are grouped by depth (`model.num_layers` of each workdir's `config.json`).
Writes into `--out_dir` (default `<root>/report`; for runs exported into `results/` by
`sg_jax.results`, which it reads as workdirs, `runs/results_reports/<study>`:
`reading.default_out_dir`), one figure per PNG file (Murty et al., ACL 2023, figures 1-5 for
one's own runs):

  grokking_depth<D>.png      (a) in-domain and generalisation (out-of-domain) accuracy vs step,
                             one line per seed; a dotted line marks the first step where a seed's
                             in-domain accuracy reaches --saturation (default 0.99).
  early_stopping.png         (b) generalisation accuracy at the checkpoint chosen by early
                             stopping on in-domain accuracy (first best and last best) vs at the
                             end of training: bars = mean over seeds, dots = seeds.
  inverted_u.png             (c) fraction of seeds whose final generalisation accuracy exceeds
                             --threshold (default 0.8), per depth, with its 95% Clopper-Pearson
                             interval.
  trajectories_depth<D>.png  (a') where analysis.csv exists: one column per seed, accuracy (top)
                             with tscore / tparseval F1 (middle) and attention sparsity (bottom)
                             beside it on the same step axis, saturation step marked (rows:
                             `Dynamic.trajectory_row` of the registered quantities).
  rules_depth<D>.png         (a'') question formation, where metrics.csv has the rule agreements:
                             per seed, generalisation accuracy beside agreement with the
                             move-first and skip-relative rules on gen lines.
  dynamics_<metric>.png      (d) weight_norm, attention_sparsity_paper, tscore, tparseval_f1 (the
                             `Dynamic`s of `sg_jax.analysis.registry`) vs step: mean over seeds
                             per depth (thick) and each seed (thin). A metric with no data is
                             skipped and the skip noted in summary.md.
  constructions_depth<D>.png (i) where metrics.csv has per-construction rows: per seed, the gen
                             accuracy of each construction (what modifies the subject) vs step.
  losses_depth<D>.png        (h) training and validation (in-domain, out-of-domain) losses vs
                             step, one line per seed, log scale.
  seed_spread.png            (f) each seed's final generalisation accuracy per depth, the seed
                             mean with its 95% t-interval, Sarle's bimodality coefficient from
                             6 seeds (else the seeds per final rule), dots coloured by the rule
                             the seed ends on (`seed_stats`).
  tparseval_by_length.png    (g) where analysis.csv has tparseval per sentence length: the final
                             tparseval F1 against length per depth (mean, 95% t-interval),
                             beside the right-branching baseline. The dynamics figure of
                             tparseval_f1 draws the right-, left-branching and random-tree F1
                             as dashed levels; summary.md has them as columns.
  groups_<run>.png           (j) runs whose config gives some field one value per seed (seed
                             groups, `groups`: e.g. SAS regimes, data mixes): per group the
                             seed mean of UAS, training loss and the accuracies with a 95%
                             t-interval band, seeds' onsets marked; summary_groups.csv and a
                             "Seed groups" table in summary.md (final values with t-intervals,
                             time to generalise as a Kaplan-Meier median; per construction and
                             final rule counts in a second table); summary_group_tests.csv and
                             "Seed groups against the first group" (permutation, Fisher and
                             log-rank tests with their minimum detectable effect, Holm).
  dose_response_<run>.png    (k) the same runs, for each numeric per-seed field: final
                             generalisation (all gen lines and per construction) against the
                             field's value, seed mean with a 95% t-interval. --group_by=FIELD
                             groups (j) and draws (k) by the named per-seed fields only, the
                             others pooled (e.g. one axis of a grid sweep:
                             docs/sweeps_and_launch.md); a named field that differs between
                             the runs of one depth (a job axis) groups their seeds merged
                             into one run, `depth<D>_jobs` (`groups.job_axis_runs`).
  time_to_generalise_<run>.png (j') the same runs: per group the Kaplan-Meier fraction of
                             seeds whose generalisation has exceeded --threshold by each step
                             (seeds that never do censored), with the median first crossing.
  crossed_<run>.png          (j'') runs whose seeds cross `seeds.init` with `seeds.data`: final
                             generalisation per (initialisation, data order) cell with each
                             seed's final rule and the row and column means; the title gives
                             each factor's share of variance and permutation p (the section
                             "Initialisation x data order" of summary.md, `crossed_seeds`).
  pruning_accuracy_<run>.png (l) where the workdir has pruning.csv (`sg_jax.prune`): in-domain
                             vs out-of-domain accuracy of every subnetwork of the last pruned
                             step, one panel per sparsity level, colour = training seed, star =
                             the full model (`_step<N>` files for every step with
                             --pruning_all_steps); pruning_inclusion_<run>.png: inclusion
                             frequency heat maps (layer x head, MLP column) per training seed
                             and level; pruning_effective_size_<run>.png: effective size vs step
                             (three variants); pruning_core_ablation_<run>.png: with
                             pruning_core.csv (`sg_jax.prune_core`), core ablation against the
                             random-ablation baseline (`pruning_figures`). summary.md gains a
                             "Pruning" section, summary_pruning.csv / _seeds.csv its rows.
  phases_<run>.png           (m) where analysis.csv has the training-dynamics columns (CKA,
                             TVD, TwoNN; `sg_jax.analysis.training_dynamics`): the run's loss,
                             UAS, CKA to the final checkpoint, TVD between consecutive
                             checkpoints, intrinsic dimension, tscore and generalisation on one
                             step axis (seed mean with a 95% bootstrap band, each seed's onset
                             dashed); onset_order_<run>.png: the onsets sorted by their seed
                             mean with CIs; summary.md gains a "Phase transitions" section
                             (onsets per seed, order, lags with CIs), summary_phases.csv its
                             rows (`phases`).
  objectives.png             (n) where runs logged the minimal-pair preference: per objective
                             (lm, mlm, prefix_lm; seeds of its runs pooled, per depth in a
                             depth sweep) the out- and
                             in-domain preference, UAS and training loss over training with 95%
                             t-interval bands and the seeds' onsets; summary_objectives.csv and
                             an "Objectives" table in summary.md (`objectives`). A masked LM's
                             accuracy figures show its preference (noted in summary.md). A root
                             of several objectives gets one whole report per objective in
                             `<out_dir>/<objective>/` (seeds pooled within an objective only)
                             and, in `<out_dir>`, only this comparison with links to them.
  predictors_<moment>.png    (o) where analysis.csv has tscore, tparseval, weight norm or
                             attention sparsity: each against final generalisation, one dot per
                             seed coloured by depth, read at in-domain saturation and at the end;
                             predictors_by_depth.png: each per depth (mean, 95% t-interval);
                             summary_predictors.csv and a "Predictors of generalisation" table
                             in summary.md: across seeds, across depths (Jonckheere-Terpstra on
                             the seeds) and within depth (stratified permutation), each with p,
                             Holm-corrected p and minimum detectable effect (`predictors`;
                             Murty et al. 2023, §5);
                             summary_predictors_by_depth.csv and a "Predictors per depth" table:
                             each per depth and moment, seed mean with its CI.
  claims.csv                 (p) every registered claim (`sg_jax.claims`: Murty et al.,
                             Bhaskar et al., Chen et al., sg_jax's own) tested on the runs of
                             the root: claim | setting | seeds per arm | test | statistic | p or
                             interval | detectable effect | verdict (+ seeds needed, source,
                             rule, note); the "Claims" section of summary.md (docs/claims.md).
  summary_baselines.csv      (q) where the runs have UAS, tparseval or tscore rows: each
                             beside its trivial baselines on the same sentences (positional
                             heads; right-, left-branching and random trees), per run at each
                             seed's last step; the "Baselines" section of summary.md
                             (`baselines`; docs/analysis.md, "Baselines").
  summary.csv / summary.md   (e) one row per depth (final generalisation with a 95% t-interval
                             over seeds, bimodality from 6 seeds, seeds above the threshold with
                             a Clopper-Pearson interval and sustained, the Kaplan-Meier median
                             first crossing, mean rule switches; a trend test over depth;
                             docs/analysis.md, "Statistics"); summary_seeds.csv
                             one row per seed (oscillation, final rule, rule switches).

Early stopping (docs/REFERENCE.md §1): the checkpoint with the highest in-domain accuracy is
selected; ties (common: in-domain accuracy sits at 1.0 for most of training) are broken two
ways, both reported: "first best" takes the earliest tied evaluation, "last best" the latest.
Values within --tie_tolerance of the maximum count as tied. Steps where a seed's value is not
finite (a diverged seed logs NaN) are ignored. "Final" = a seed's last evaluated step.

Figures never hide data behind a legend (legends sit outside the axes), fractions are plotted on
[0, 1] plus a small margin, and the analysis figures (a', d) give in their title how many
sentences the analysis read (from `analysis.csv.options.json`, written by `sg_jax.analyze`).

Modules: `reading` (runs and their series), `tables` (summaries, summary.csv / .md), `figures`
(one depth's seeds over training), `depth_figures` (figures comparing depths), `groups` (seed
groups) with `group_stats` / `group_markdown` / `group_figures` (their statistics, summary.md
section and figures), `crossed_seeds` (seeds crossing `seeds.init` with `seeds.data`),
`phase_transitions`, `pruning_tables` / `pruning_figures`, `baselines`
(structure measures beside their trivial baselines), and `plotting` (the helpers they share);
`python -m sg_jax.report` runs `__main__`.
"""


from __future__ import annotations

import collections
import os
from typing import Sequence

from sg_jax import claims as claims_lib
from sg_jax.analysis import registry
from sg_jax.report import baselines as baselines_lib
from sg_jax.report import crossed_seeds
from sg_jax.report import group_figures
from sg_jax.report import group_markdown
from sg_jax.report import group_stats
from sg_jax.report import groups
from sg_jax.report import objectives as objectives_lib
from sg_jax.report import phase_transitions
from sg_jax.report import predictors
from sg_jax.report import pruning_figures
from sg_jax.report import pruning_tables
from sg_jax.report.depth_figures import (plot_dynamics, plot_early_stopping, plot_inverted_u,
                                         plot_seed_spread, plot_tparseval_by_length)
from sg_jax.report.figures import (RULE_SERIES, SKIP_RELATIVE, plot_constructions, plot_grokking,
                                   plot_losses, plot_rules, plot_trajectories, trajectory_rows)
from sg_jax.report.plotting import task_prefix
from sg_jax.report.reading import (GEN_ACC, IN_ACC, ReportError, Run, analysis_sentences,
                                   default_out_dir, diverged_seeds_text, find_runs, load_run,
                                   log)
from sg_jax.report.tables import (depth_summary, early_stopping, final_value, first_reaching,
                                  saturation_step, seed_summary, write_csv, write_markdown)

__all__ = ["GEN_ACC", "IN_ACC", "RULE_SERIES", "SKIP_RELATIVE", "ReportError", "Run",
           "analysis_sentences", "build_report", "depth_summary", "early_stopping",
           "final_value", "find_runs", "first_reaching", "load_run", "plot_constructions",
           "plot_dynamics", "plot_early_stopping", "plot_grokking", "plot_inverted_u",
           "plot_losses", "plot_rules", "plot_seed_spread", "plot_tparseval_by_length",
           "plot_trajectories", "saturation_step", "seed_summary", "trajectory_rows",
           "write_csv", "write_markdown"]


def build_report(root: str, out_dir: str | None = None, *, threshold: float = 0.8,
                 saturation: float = 0.99, tie_tolerance: float = 0.0,
                 pruning_all_steps: bool = False, objective: str | None = None,
                 group_by: Sequence[str] = ()) -> dict:
  """Writes every figure and table of the report (see module docstring).

  A root whose runs train different objectives (`config.objective`) gets one whole report per
  objective in `<out_dir>/<objective>/` (a depth's seeds are pooled only within one objective:
  a masked LM's accuracy series are its preference, which must not be averaged with decoding
  accuracy) and, in `out_dir`, the objectives side by side (`objectives.png`, a summary.md
  with the "Objectives" section and links to the per-objective reports).

  Args:
    root: a workdir or a sweep root.
    out_dir: output folder (created); default `<root>/report`, or outside `results/` for
      exported runs (`reading.default_out_dir`).
    threshold: final generalisation accuracy above which a seed "generalises" (c).
    saturation: in-domain accuracy level whose first step is marked in (a).
    tie_tolerance: in-domain accuracies within this of the best count as tied (b).
    pruning_all_steps: also draw the subnetworks' accuracies of every pruned step (l).
    objective: only the runs of this objective (None: all).
    group_by: per-seed fields the seed groups (j) and dose responses (k) use, the others
      pooled (`groups.seed_groups`; e.g. ['optim.weight_decay'] for a grid sweep's weight-decay
      axis), or fields that differ between the runs of one depth (`groups.job_axis_runs`);
      empty: every per-seed field of each run.

  Returns:
    {'out_dir': str, 'figures': [paths], 'skipped': [notes], 'depths': [summary rows]} (for a
    root of several objectives, every depth row carries its 'objective').

  Raises:
    ReportError: no run under `root` (of `objective`), or no accuracy metrics in any run.
  """
  out_dir = out_dir or default_out_dir(root)
  runs = [load_run(w) for w in find_runs(root)]
  if objective is not None:
    runs = [run for run in runs if objectives_lib.objective_of(run) == objective]
    if not runs:
      raise ReportError(f"no run of objective {objective!r} under {root}")
  present = sorted({objectives_lib.objective_of(run) for run in runs})
  if len(present) > 1:
    return _objectives_report(root, out_dir, runs, present, threshold=threshold,
                              saturation=saturation, tie_tolerance=tie_tolerance,
                              pruning_all_steps=pruning_all_steps, group_by=group_by)
  if not any(run.series.get(IN_ACC) or run.series.get(GEN_ACC) for run in runs):
    if any(run.diverged for run in runs):  # every seed diverged: nothing to summarise
      raise ReportError(f"every seed under {root} diverged ({diverged_seeds_text(runs)}): "
                        "nothing to report")
    raise ReportError(f"no {IN_ACC} or {GEN_ACC} rows in the metrics.csv files under {root}")
  os.makedirs(out_dir, exist_ok=True)
  by_depth = collections.defaultdict(list)
  for run in runs:
    by_depth[run.depth].append(run)
  prefix = task_prefix(runs)
  figures, skipped = [], []

  def optional(name: str, plot) -> None:
    """Writes an optional figure (`plot(path)` returns None when the runs lack its rows); a stale
    file of that name from an earlier report is removed then, as it would mislead."""
    path = os.path.join(out_dir, name)
    if plot(path) is not None:
      figures.append(path)
    elif os.path.exists(path):
      os.remove(path)

  for depth in sorted(by_depth, key=lambda d: (d is None, d)):
    runs_d, label = by_depth[depth], depth if depth is not None else "unknown"
    path = os.path.join(out_dir, f"grokking_depth{label}.png")
    plot_grokking(runs_d, depth, path, saturation)
    figures.append(path)
    optional(f"trajectories_depth{label}.png",
             lambda p: plot_trajectories(runs_d, depth, p, saturation))
    optional(f"constructions_depth{label}.png",
             lambda p: plot_constructions(runs_d, depth, p, saturation))
    optional(f"losses_depth{label}.png", lambda p: plot_losses(runs_d, depth, p))
    optional(f"rules_depth{label}.png", lambda p: plot_rules(runs_d, depth, p, saturation))

  seed_rows = seed_summary(runs, threshold, saturation, tie_tolerance)
  depth_rows = depth_summary(seed_rows)
  path = os.path.join(out_dir, "early_stopping.png")
  plot_early_stopping(seed_rows, path, prefix)
  figures.append(path)
  path = os.path.join(out_dir, "inverted_u.png")
  plot_inverted_u(depth_rows, path, threshold, prefix)
  figures.append(path)
  path = os.path.join(out_dir, "seed_spread.png")
  plot_seed_spread(seed_rows, path, threshold, prefix)
  figures.append(path)
  for metric, dynamic in registry.dynamics().items():
    if dynamic.reference_for:
      continue  # drawn in its reference's figure
    path = os.path.join(out_dir, f"dynamics_{metric}.png")
    if plot_dynamics(by_depth, metric, path, prefix) is not None:
      figures.append(path)
    else:
      if os.path.exists(path):
        os.remove(path)  # a stale figure from an earlier report would mislead
      skipped.append(f"dynamics_{metric}.png skipped: no `{metric}` rows in any analysis.csv "
                     f"(run `python -m sg_jax.analyze --workdir=<run>`)")

  optional("tparseval_by_length.png", lambda p: plot_tparseval_by_length(by_depth, p, prefix))

  group_table, group_tests = [], []
  # with --group_by naming a job axis of a grid sweep (e.g. model.d_model), the jobs of each
  # depth merged into one run whose seeds group by it
  for run, seed_sets in groups.runs_with_groups(runs, group_by):
    group_table += group_stats.group_rows(run, seed_sets, threshold=threshold)
    group_tests += group_stats.comparison_rows(run, seed_sets, threshold=threshold, by=group_by)
    optional(f"groups_{run.name}.png",
             lambda p: group_figures.plot_groups(run, seed_sets, p, prefix))
    optional(f"time_to_generalise_{run.name}.png",
             lambda p: group_figures.plot_time_to_generalise(run, seed_sets, p, prefix, threshold))
    optional(f"dose_response_{run.name}.png",
             lambda p: group_figures.plot_dose_response(run, p, prefix, group_by))
  if group_table:
    write_csv(os.path.join(out_dir, "summary_groups.csv"), group_table)
  if group_tests:
    write_csv(os.path.join(out_dir, "summary_group_tests.csv"), group_tests)

  crossed_found = crossed_seeds.analyses(runs)  # once: the figures and the summary section
  crossed = {id(run): got for run, got in crossed_found}
  for run in runs:
    optional(f"crossed_{run.name}.png",
             lambda p: crossed_seeds.plot_cells(run, crossed.get(id(run)), p, prefix))

  phase_results = [(run, found) for run in runs
                   if (found := phase_transitions.draw(run, optional, prefix)) is not None]
  if phase_results:
    write_csv(os.path.join(out_dir, "summary_phases.csv"),
              [row for run, found in phase_results for row in phase_transitions.table_rows(run, found)])

  pruning_levels, pruning_seeds = [], []
  for run in runs:
    data = pruning_figures.draw(run.workdir, run.name, out_dir, optional, prefix,
                                pruning_all_steps)
    if data is not None:
      level_rows, seed_rows_p = pruning_tables.summary_rows(data)
      pruning_levels += level_rows
      pruning_seeds += seed_rows_p
  if pruning_levels:
    write_csv(os.path.join(out_dir, "summary_pruning.csv"), pruning_levels)
    write_csv(os.path.join(out_dir, "summary_pruning_seeds.csv"), pruning_seeds)

  predictor_seeds = predictors.seed_table(runs, saturation)
  correlation_table = predictors.correlation_rows(predictor_seeds)
  for moment in predictors.MOMENTS:
    optional(f"predictors_{moment}.png",
             lambda p, m=moment: predictors.plot_predictors(predictor_seeds, p, prefix, m))
  predictor_depths = predictors.depth_rows(predictor_seeds)
  optional("predictors_by_depth.png",
           lambda p: predictors.plot_by_depth(predictor_seeds, p, prefix, table=predictor_depths))
  if correlation_table:
    write_csv(os.path.join(out_dir, "summary_predictors.csv"), correlation_table)
  if predictor_depths:
    write_csv(os.path.join(out_dir, "summary_predictors_by_depth.csv"), predictor_depths)

  objective_table = objectives_lib.objective_rows(runs)
  optional("objectives.png", lambda p: objectives_lib.plot_objectives(runs, p, prefix))
  if objective_table:
    write_csv(os.path.join(out_dir, "summary_objectives.csv"), objective_table)
  baseline_table = baselines_lib.baseline_rows(runs)  # structure measures beside baselines
  if baseline_table:
    write_csv(os.path.join(out_dir, "summary_baselines.csv"), baseline_table)
  if any(run.diverged for run in runs):  # left out of every summary (reading.load_run)
    skipped.append(f"diverged seeds, left out of every figure, mean, interval, correlation and "
                   f"test: {diverged_seeds_text(runs)}")
  skipped += [f"run {run.name} is {run.in_progress}: its results are provisional"
              for run in runs if run.in_progress]
  borrowed = [r.name for r in runs if r.accuracy_from]
  if borrowed:
    skipped.append(f"runs {borrowed} log no accuracy (a masked LM): their accuracy figures and "
                   "columns show the minimal-pair preference")

  claim_rows = claims_lib.evaluate(runs)
  write_csv(os.path.join(out_dir, "claims.csv"), claim_rows)
  write_csv(os.path.join(out_dir, "summary.csv"), depth_rows)
  write_csv(os.path.join(out_dir, "summary_seeds.csv"), seed_rows)
  write_markdown(os.path.join(out_dir, "summary.md"), root, runs, depth_rows, figures, skipped,
                 threshold, saturation, tie_tolerance, seed_rows=seed_rows,
                 extra_lines=group_markdown.markdown_lines(group_table, group_tests)
                 + crossed_seeds.markdown_lines(runs, crossed_found)
                 + phase_transitions.markdown_lines(phase_results)
                 + objectives_lib.markdown_lines(objective_table)
                 + predictors.markdown_lines(correlation_table)
                 + predictors.depth_markdown_lines(predictor_depths)
                 + baselines_lib.markdown_lines(baseline_table)
                 + pruning_tables.markdown_lines(pruning_levels, pruning_seeds)
                 + claims_lib.markdown_lines(claim_rows))
  for note in skipped:
    log.warning("%s", note)
  return {"out_dir": out_dir, "figures": figures, "skipped": skipped, "depths": depth_rows}


def _objectives_report(root: str, out_dir: str, runs: list, present: list, **options) -> dict:
  """`build_report` of a root of several objectives: one report per objective in
  `<out_dir>/<objective>/`, the objectives side by side in `out_dir`."""
  os.makedirs(out_dir, exist_ok=True)
  figures, skipped, depth_rows, links = [], [], [], []
  for name in present:
    try:
      sub = build_report(root, os.path.join(out_dir, name), objective=name, **options)
    except ReportError as e:  # e.g. no accuracy and no preference rows: the others still report
      skipped.append(f"{name}: no report of its own: {e}")
      continue
    figures += sub["figures"]
    skipped += [f"{name}: {note}" for note in sub["skipped"]]
    depth_rows += [{"objective": name, **row} for row in sub["depths"]]
    names = sorted(r.name for r in runs if objectives_lib.objective_of(r) == name)
    links.append(f"* `{name}` ({', '.join(names)}): [{name}/summary.md]({name}/summary.md)")
  path = os.path.join(out_dir, "objectives.png")
  if objectives_lib.plot_objectives(runs, path, task_prefix(runs)) is not None:
    figures.append(path)
  table = objectives_lib.objective_rows(runs)
  if table:
    write_csv(os.path.join(out_dir, "summary_objectives.csv"), table)
  claim_rows = claims_lib.evaluate(runs)  # over every objective (one claim compares them)
  write_csv(os.path.join(out_dir, "claims.csv"), claim_rows)
  lines = [f"# Report for `{os.path.basename(os.path.normpath(root))}`: {len(present)} objectives",
           "", "Each objective's runs have a whole report of their own (seeds are pooled only "
           "within an objective):", "", *links, *objectives_lib.markdown_lines(table),
           *claims_lib.markdown_lines(claim_rows)]
  with open(os.path.join(out_dir, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  return {"out_dir": out_dir, "figures": figures, "skipped": skipped, "depths": depth_rows}
