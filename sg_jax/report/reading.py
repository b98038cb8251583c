"""The runs of a report: the workdirs below a root, their metric series, what their analysis read.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging as py_logging
import os
import socket
from typing import Iterable, Sequence

import numpy as np

from sg_jax.analysis import registry
from sg_jax.records import fileio
from sg_jax.records import long_csv
from sg_jax.runtime import workdir_lock

IN_ACC = "in_domain/accuracy"
GEN_ACC = "out_of_domain/accuracy"

log = py_logging.getLogger("sg_jax.report")


class ReportError(ValueError):
  """No usable runs or metrics under the given root."""


@dataclasses.dataclass
class Run:
  """One workdir: its depth and metric series.

  Attributes:
    workdir: path of the run directory.
    name: short label (folder name).
    depth: model.num_layers from config.json (None when unknown).
    task: task name from config.json ('' when unknown).
    num_steps: requested train.num_steps (None when unknown).
    series: {name: {seed: (steps int [T], values float [T])}} sorted by step, metrics.csv and
      analysis.csv merged.
    analysis_options: contents of `analysis.csv.options.json` (`sg_jax.analyze`: split, sentence
      set, `sentences_used`, ...), {} when absent.
    config: the resolved config (`config.json`), {} when absent.
    accuracy_from: '' normally; 'preference' for a run that logged no accuracy but the
      minimal-pair preference (a masked LM, `report.objectives`): its `in_domain/accuracy` and
      `out_of_domain/accuracy` series are then the preference's.
    diverged: {seed: first step with a non-finite loss or accuracy, or its logged
      `train/diverged_step`} of the seeds that diverged; their series are left out of `series`
      (so out of every mean, interval, correlation and test of the report) and listed in
      summary.md (`diverged_seeds`).
    in_progress: '' for a finished run, else why its results are partial (a command holds its
      workdir's lock, its metrics end before train.num_steps or before its last checkpoint).
  """

  workdir: str
  name: str
  depth: int | None
  task: str
  num_steps: int | None
  series: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]
  analysis_options: dict = dataclasses.field(default_factory=dict)
  config: dict = dataclasses.field(default_factory=dict)
  accuracy_from: str = ""
  diverged: dict[int, int] = dataclasses.field(default_factory=dict)
  in_progress: str = ""


def _to_series(rows: Iterable[tuple[int, int, str, float]]):
  acc = collections.defaultdict(lambda: collections.defaultdict(dict))
  for step, seed, name, value in rows:
    acc[name][seed][step] = value  # a repeated (step, seed, name) keeps the last row
  out = {}
  for name, by_seed in acc.items():
    out[name] = {}
    for seed, by_step in by_seed.items():
      steps = np.array(sorted(by_step), dtype=np.int64)
      out[name][seed] = (steps, np.array([by_step[s] for s in steps], dtype=np.float64))
  return out


def load_run(workdir: str) -> Run:
  """Reads one workdir's metrics.csv, analysis.csv (optional) and config.json (optional).

  A run exported by `python -m sg_jax.results export` (the tables as `metrics.csv.gz`,
  `analysis.csv.gz`, beside config.json and run.json) reads exactly as its workdir.

  Raises:
    ReportError: no metrics.csv (nor metrics.csv.gz) in `workdir`.
  """
  path = os.path.join(workdir, "metrics.csv")
  if fileio.stored_path(path) is None:
    raise ReportError(f"no metrics.csv (or metrics.csv.gz) in {workdir}")
  rows = long_csv.read_rows(path)
  analysis = os.path.join(workdir, "analysis.csv")
  analysis_options = {}
  if fileio.stored_path(analysis) is not None:
    rows += long_csv.read_rows(analysis)
    if os.path.exists(analysis + ".options.json"):
      try:
        with open(analysis + ".options.json") as f:
          analysis_options = json.load(f)
      except (OSError, ValueError) as e:
        log.warning("ignoring unreadable %s.options.json: %s", analysis, e)
  depth = task = num_steps = None
  config = {}
  config_path = os.path.join(workdir, "config.json")
  if os.path.exists(config_path):
    try:
      with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    except (OSError, ValueError) as e:  # undecodable or not JSON: name the file
      raise ReportError(f"{config_path} is not readable JSON ({e}); restore it (every "
                        "checkpoint's metadata holds the config)") from None
    depth = config.get("model", {}).get("num_layers")
    task = config.get("task")
    num_steps = config.get("train", {}).get("num_steps")
  name = os.path.basename(os.path.normpath(workdir))
  if depth is None and name.startswith("depth") and name[5:].isdigit():
    depth = int(name[5:])
  series = _to_series(rows)
  diverged = diverged_seeds(series)
  for by_seed in series.values():  # a diverged seed counts nowhere (docs/reliability.md)
    for seed in diverged:
      by_seed.pop(seed, None)
  accuracy_from = ""
  if IN_ACC not in series and GEN_ACC not in series and "out_of_domain/preference" in series:
    series[IN_ACC] = series.get("in_domain/preference", {})
    series[GEN_ACC] = series["out_of_domain/preference"]
    accuracy_from = "preference"
  return Run(workdir=workdir, name=name, depth=depth, task=task or "", num_steps=num_steps,
             series=series, analysis_options=analysis_options, config=config,
             accuracy_from=accuracy_from, diverged=diverged,
             in_progress=_in_progress(workdir, series, num_steps))


# Series whose non-finite value marks a diverged seed (training sets them to NaN from the step a
# seed's loss or gradient norm became non-finite: sg_jax.train).
_DIVERGENCE_SERIES = ("train/loss", IN_ACC, GEN_ACC, "in_domain/preference",
                      "out_of_domain/preference")


def diverged_seeds(series: dict) -> dict[int, int]:
  """{seed: step} of the seeds that diverged: the earliest of their logged `train/diverged_step`
  (>= 0) and the first step where a `_DIVERGENCE_SERIES` value is not finite.

  Args:
    series: {name: {seed: (steps int [T], values float [T])}} (`Run.series` before the drop).
  """
  out: dict[int, int] = {}
  for seed, (_, values) in series.get("train/diverged_step", {}).items():
    marked = values[np.isfinite(values) & (values >= 0)]
    if marked.size:
      out[int(seed)] = int(marked.min())
  for name in _DIVERGENCE_SERIES:
    for seed, (steps, values) in series.get(name, {}).items():
      bad = ~np.isfinite(values)
      if bad.any():
        out[int(seed)] = min(out.get(int(seed), int(steps[bad][0])), int(steps[bad][0]))
  return dict(sorted(out.items()))


def diverged_seeds_text(runs: Sequence[Run]) -> str:
  """'quick: seed 2 at step 0, seed 5 at step 1200; ...' for the runs with diverged seeds."""
  return "; ".join(f"{run.name}: " + ", ".join(f"seed {seed} at step {step}"
                                               for seed, step in run.diverged.items())
                   for run in runs if run.diverged)


def _in_progress(workdir: str, series: dict, num_steps: int | None) -> str:
  """Why a run's results are partial ('' when they are not): see `Run.in_progress`."""
  held = workdir_lock.holder(workdir)
  own = (held is not None and held.get("command") == "sg_jax.report"
         and held.get("host") == socket.gethostname() and held.get("pid") == os.getpid())
  if held is not None and not own:  # a report writing into the run it reads holds its lock
    return f"in progress: {workdir_lock.describe(held)} holds the workdir"
  last = max((int(steps[-1]) for by_seed in series.get(IN_ACC, {}).values()
              for steps, _ in [by_seed] if steps.size), default=None)
  if last is None:
    return ""
  if num_steps is not None and last < num_steps:
    return f"partial: its metrics end at step {last} of train.num_steps {num_steps}"
  folder = os.path.join(workdir, "checkpoints")
  saved = [int(n) for n in (os.listdir(folder) if os.path.isdir(folder) else ()) if n.isdigit()]
  if saved and max(saved) > last:
    return f"partial: its metrics end at step {last}, before its last checkpoint {max(saved)}"
  return ""


def _has_metrics(folder: str) -> bool:
  """Whether `folder` holds a run: metrics.csv, or metrics.csv.gz (an exported run)."""
  return fileio.stored_path(os.path.join(folder, "metrics.csv")) is not None


# The manifest `python -m sg_jax.results export` writes into every exported run.
EXPORT_MANIFEST = "run.json"
# Where a report of exported runs goes by default, relative to the folder above `results/`.
EXPORT_REPORTS = os.path.join("runs", "results_reports")


def is_export(folder: str) -> bool:
  """Whether `folder` is a run exported by `sg_jax.results` (it holds `run.json`)."""
  return os.path.exists(os.path.join(folder, EXPORT_MANIFEST))


def default_out_dir(root: str) -> str:
  """The report's output folder when none is given.

  `<root>/report` for workdirs. A root of exported runs (`is_export`) is committed data, so
  nothing is written into it: under a folder named `results` the report goes to
  `<folder above results>/runs/results_reports/<path below results>` (`runs/` is not tracked),
  elsewhere to the sibling `<root>_report`.

  Raises:
    ReportError: as `find_runs`.
  """
  if not any(is_export(w) for w in find_runs(root)):
    return os.path.join(root, "report")
  parts = os.path.normpath(os.path.abspath(root)).split(os.sep)
  if "results" in parts:
    k = len(parts) - 1 - parts[::-1].index("results")
    above = os.sep.join(parts[:k]) or os.sep
    out = os.path.join(above, EXPORT_REPORTS, *parts[k + 1:])
    return os.path.relpath(out) if not os.path.isabs(root) else out
  return os.path.normpath(root) + "_report"


def find_runs(root: str) -> list[str]:
  """Workdirs to report on (see module docstring), sorted. A run folder holds `metrics.csv`
  or, exported by `sg_jax.results`, `metrics.csv.gz`.

  Raises:
    ReportError: `root` does not exist or holds no metrics.csv (naming the folder).
  """
  if not os.path.isdir(root):
    raise ReportError(f"--root {root} is not a folder")
  if _has_metrics(root):
    return [root]
  sweep = os.path.join(root, "sweep.json")
  found = []
  if os.path.exists(sweep):
    with open(sweep) as f:
      jobs = json.load(f).get("jobs", {})
    for job in jobs.values():
      workdir = os.path.join(root, job.get("workdir", ""))
      if _has_metrics(workdir):
        found.append(workdir)
  if not found:
    for entry in sorted(os.listdir(root)):
      workdir = os.path.join(root, entry)
      if os.path.isdir(workdir) and _has_metrics(workdir):
        found.append(workdir)
  if not found:
    raise ReportError(f"no metrics.csv in {root} or its subfolders (expected a sg_jax workdir "
                      "or a sweep root)")
  return sorted(set(found))


# `sentences_used` entry (`registry.SENTENCE_INPUTS`) -> how a figure title names it.
_SENTENCE_KIND_LABEL = {"attention_entropy": "entropy", "tree_projection": "tree projections"}


def sentence_kinds(column: str) -> list[str]:
  """The `sentences_used` entries of the sentences read by the group writing `column`."""
  return [registry.SENTENCE_INPUTS[i] for i in registry.group_inputs(column)
          if i in registry.SENTENCE_INPUTS]


def analysis_sentences(runs: Sequence[Run], metrics: Sequence[str]) -> str:
  """How many sentences the analysis behind `metrics` read, for a figure title.

  Read from each run's `analysis.csv.options.json` (`sentences_used`, written by
  `sg_jax.analyze`); older files give the requested number ("at most N lines of SPLIT").

  Args:
    runs: the runs shown in the figure.
    metrics: analysis metric names shown (weight_norm reads no sentences).

  Returns:
    e.g. "analysis on 1000 'quest' lines of train" (runs that differ are joined with "; ",
    entropy and tree-projection counts that differ are both given); "" when no shown metric
    reads sentences.
  """
  notes = []
  for run in runs:
    kinds = sorted({kind for m in metrics if run.series.get(m) for kind in sentence_kinds(m)})
    if not kinds:
      continue
    options = run.analysis_options
    used = options.get("sentences_used") or {}
    if all(k in used for k in kinds):
      counts = {k: int(used[k]) for k in kinds}
      if len(set(counts.values())) == 1:
        number = str(counts[kinds[0]])
      else:
        number = " / ".join(f"{counts[k]} ({_SENTENCE_KIND_LABEL[k]})" for k in kinds)
      notes.append(f"{number} {used.get('label', 'lines')}".replace("`", "'"))
    elif "num_sentences" in options:
      notes.append(f"at most {options['num_sentences']} lines of {options.get('split', '?')}")
    else:
      notes.append("an unknown number of sentences (no analysis.csv.options.json)")
  notes = list(dict.fromkeys(notes))
  return f"analysis on {'; '.join(notes)}" if notes else ""
