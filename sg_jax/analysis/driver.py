"""The analysis of a run's checkpoints behind `python -m sg_jax.analyze` (whose module docstring
describes the quantities and options; its flags and `main` stay there): which rows are still
missing, computed seed group by seed group and appended to the CSV.
"""

from __future__ import annotations

import json
import logging as py_logging
import os
import time
from typing import Sequence

import jax
import numpy as np

from sg_jax import checkpointing
from sg_jax import objectives
from sg_jax import tasks
from sg_jax.analysis import pipeline, references, registry
from sg_jax.analysis.pipeline import ENTROPY_INPUTS, SENTENCE_SETS
from sg_jax.config import cli_options
from sg_jax.models.model_config import ModelConfig
from sg_jax.records import fileio
from sg_jax.records import long_csv
from sg_jax.runtime import stop_signal
from sg_jax.runtime import workdir_lock
from sg_jax.tasks import vocab as vocab_lib


# options files written before an option existed used these values.
LEGACY_OPTIONS = {"sentence_set": "all", "entropy_input": "line",
                  "dynamics_lines": registry.Options.dynamics_lines}


log = py_logging.getLogger("sg_jax.analyze")


def parse_metrics(text: str) -> list[str]:
  """'tscore,tparseval' -> ['tscore', 'tparseval']. Raises ValueError for an unknown group."""
  groups = [m.strip() for m in text.split(",") if m.strip()]
  known = registry.group_names()
  unknown = [m for m in groups if m not in known]
  if unknown or not groups:
    raise ValueError(f"unknown metric group(s) {unknown} in --metrics; choose from {known}")
  return groups


def check_options(path: str, options: dict, legacy: dict | None = None,
                  hints: dict | None = None) -> None:
  """`cli_options.check_options` with the analysis's `LEGACY_OPTIONS` and `legacy` (an options
  file that predates an option is read with the value used before the option existed)."""
  cli_options.check_options(path, options, {**LEGACY_OPTIONS, **(legacy or {})}, hints=hints)


def record_sentences(path: str, data: dict) -> None:
  """Adds `sentences_used` (what the analysis read) to `<path>.options.json`, for the report.

  Writes {'sentences_used': {'attention_entropy': n, 'tree_projection': m, 'label': text}}, where
  `label` says which lines they are (e.g. "`quest` lines of train").
  """
  opt_path = path + ".options.json"
  with open(opt_path) as f:
    options = json.load(f)
  options["sentences_used"] = {**{key: len(data[kind])
                                  for kind, key in registry.SENTENCE_INPUTS.items()},
                               "label": data["label"]}
  with fileio.open_atomic(opt_path) as f:
    json.dump(options, f, indent=1)


def _select_seeds(restored_seeds: list[int], wanted: list[int] | None) -> list[int]:
  if wanted is None:
    return list(restored_seeds)
  missing = [s for s in wanted if s not in restored_seeds]
  if missing:
    raise ValueError(f"seeds {missing} are not in the run; seeds: {restored_seeds}")
  return wanted


def _check_groups(groups: Sequence[str] | None) -> list[registry.Group]:
  """The registered groups named by `groups` (None: all), in registry order."""
  known = {g.name: g for q in registry.quantities() for g in q.groups}
  if groups is None:
    return list(known.values())
  unknown = [g for g in groups if g not in known]
  if unknown or not groups:
    raise ValueError(f"unknown metric group(s) {unknown}; choose from {list(known)}")
  return [known[g] for g in groups]


# Inputs read from the sentence set (loaded once, with the first checkpoint analysed).
_SENTENCE_READS = frozenset(registry.SENTENCE_INPUTS) | {"gold_trees", "dependency_lines",
                                                          "lines"}


def _drop_unsupported(requested: list[registry.Group], pending: dict[str, list[int]],
                      needs: str, what: str, supported: bool, task: str,
                      strict: bool) -> list[registry.Group]:
  """`requested` without the groups that read `needs` (an input the task lacks: `supported`
  False), each dropped from `pending` with a warning.

  Raises:
    ValueError: `strict` (the groups were named by --metrics) and a group needs the input.
  """
  lacking = [g for g in requested if needs in g.inputs]
  if not lacking or supported:
    return requested
  if strict:
    raise ValueError(f"{lacking[0].name} needs {what}; the {task} task has none")
  for g in lacking:
    log.warning("%s has no %s: skipping %s", task, what, g.name)
    pending.pop(g.name, None)
  return [g for g in requested if g not in lacking]


def _reads(groups: Sequence[registry.Group]) -> set[str]:
  return {i for g in groups for i in g.inputs}


def _compute_rows(step: int, chosen: list[int], pending: dict[str, list[int]], params_of,
                  data: dict | None, meta: dict, *, config: ModelConfig, sos_id: int,
                  options: registry.Options, references_of=None, objective=None
                  ) -> list[tuple[int, int, str, float]]:
  """The rows of every registered quantity with a pending group at `step`, in registry order:
  per quantity, per seed, its columns in the order `compute` returns them. `references_of(ids)`
  gives the `registry.References` of the seeds `ids` (groups reading 'references'); `objective`
  is the run's (`registry.Inputs.objective`)."""
  rows = []
  for quantity in registry.quantities():
    wanted = [g for g in quantity.groups if pending.get(g.name)]
    if not wanted:
      continue
    ids = sorted({s for g in wanted for s in pending[g.name]}, key=chosen.index)
    reads = {i for g in wanted for i in g.inputs}
    sentences = {k: (data or {}).get(k) for k in ("entropy_inputs", "declaratives", "gold_trees",
                                                  "dependency_lines", "lines") if k in reads}
    if "references" in reads:
      sentences["references"] = references_of(ids)
    inputs = registry.Inputs(
        params=params_of(ids), seeds=tuple(ids), groups=frozenset(g.name for g in wanted),
        config=config, sos_id=sos_id, objective=objective, options=options,
        meta=meta if "meta" in reads else {}, **sentences)
    columns = quantity.compute(inputs)
    todo = {}
    for column, values in columns.items():
      if len(values) != len(ids):
        raise ValueError(f"quantity {quantity.name!r} returned {len(values)} values of "
                         f"{column!r} for {len(ids)} seeds")
      todo[column] = set(pending.get(quantity.group_of(column).name, ()))
    for n, s in enumerate(ids):
      rows += [(step, s, column, values[n]) for column, values in columns.items()
               if s in todo[column] and values[n] is not None]
  return rows


def _diverged_text(diverged: dict[int, int]) -> str:
  return ", ".join(f"seed {s} at step {at}" for s, at in sorted(diverged.items()))


def _final_checkpoint(workdir: str, available: list[int], unreadable: dict[int, str]):
  """The newest readable checkpoint (parameters only, `checkpointing.Restored`) and its diverged
  seeds ({seed: step}); (None, {}) when none is readable. The unreadable newer ones are added to
  `unreadable` (step -> why), with a warning each."""
  for step in reversed(available):
    try:
      restored = checkpointing.restore(workdir, step, params_only=True)
      return restored, checkpointing.diverged_seeds(workdir, step)
    except checkpointing.CheckpointError as e:
      log.warning("checkpoint step %d is unreadable: %s", step,
                  checkpointing.error_cause(e.__cause__ or e))
      unreadable[step] = checkpointing.error_cause(e.__cause__ or e)
  return None, {}


def _not_final(final, unreadable: dict[int, str]) -> str:
  """'' when `final` (the newest readable checkpoint) is the run's last (train.num_steps), else
  why not: quantities comparing with it would be provisional, and would block the complete
  analysis later (its options file records the step they compared with)."""
  if final is None:
    return "no checkpoint is readable"
  num_steps = int(final.config.train.num_steps)
  if final.step >= num_steps:
    return ""
  newer = sorted(s for s in unreadable if s > final.step)
  if newer:
    return (f"the newest readable checkpoint is step {final.step} (steps {newer} are unreadable) "
            f"and train.num_steps is {num_steps}")
  return (f"the run's latest checkpoint is step {final.step} and train.num_steps is {num_steps} "
          "(training unfinished or stopped)")


def analyze(workdir: str, *, steps: list[int] | None = None, seeds: list[int] | None = None,
            groups: Sequence[str] | None = None, num_sentences: int = 1000, split: str = "train",
            sentence_set: str = "transformed", entropy_input: str = "declarative",
            output: str = "analysis.csv", method: str = "greedy",
            normalisation: str = "random_split", rng_seed: int = 0, batch_size: int = 8,
            entropy_batch_size: int = 64, seeds_per_call: int = 0,
            strict_groups: bool = False, uas_min_count: int = 100,
            dynamics_lines: int = registry.Options.dynamics_lines,
            signal_exit_seconds: float = 0.0) -> dict[str, int]:
  """Computes the missing metrics of every selected checkpoint and seed (see module docstring).

  Args: as the command-line flags; `groups` names metric groups of `registry.group_names()`
  (None: every registered group); `strict_groups` makes a group the task cannot compute
  (tparseval on dyck: no gold trees) an error instead of a warning (the CLI sets it when
  --metrics is given); `signal_exit_seconds`: the command line's bound on stopping at once
  (`stop_signal.StopSignal`).

  SIGTERM/SIGINT stop the analysis at once: the checkpoints before are in the file, each written
  whole (`long_csv.LongCsv`), and a rerun computes the rest. A signal whose exception Python
  dropped inside a callback (`stop_signal.quiet_stop_in_callbacks`) stops it before the next
  checkpoint.

  Returns:
    {'rows_written': n, 'checkpoints_analysed': m}.

  Raises:
    stop_signal.Preempted: a stop signal (exit 75 on the command line).
    checkpointing.CheckpointError: no checkpoints, a requested step is missing, or a checkpoint
      is unreadable (raised after the readable ones are analysed, naming the unreadable steps).
    ValueError: bad options, unknown groups or seeds, missing gold trees, options differing
      from the file.
    workdir_lock.LockHeld: another command holds the workdir (`runtime.workdir_lock`); nothing
      was written.
  """
  if num_sentences < 1 or dynamics_lines < 1:
    raise ValueError(f"--num_sentences and --dynamics_lines must be >= 1, got {num_sentences} "
                     f"and {dynamics_lines}")
  requested = _check_groups(groups)
  if not os.path.isdir(workdir):
    raise checkpointing.CheckpointError(
        f"no checkpoint in {checkpointing.checkpoint_dir(workdir)} (no such workdir)")
  # One writer per workdir: refused (nothing written) while another command holds it.
  with workdir_lock.locked(workdir, "sg_jax.analyze", read_only_ok=True):
    return _analyze(workdir, requested, steps=steps, seeds=seeds, num_sentences=num_sentences,
                    split=split, sentence_set=sentence_set, entropy_input=entropy_input,
                    output=output, method=method, normalisation=normalisation,
                    rng_seed=rng_seed, batch_size=batch_size,
                    entropy_batch_size=entropy_batch_size, seeds_per_call=seeds_per_call,
                    strict_groups=strict_groups, uas_min_count=uas_min_count,
                    dynamics_lines=dynamics_lines, signal_exit_seconds=signal_exit_seconds)


def _analyze(workdir: str, requested: list[registry.Group], *, steps, seeds, num_sentences,
             split, sentence_set, entropy_input, output, method, normalisation, rng_seed,
             batch_size, entropy_batch_size, seeds_per_call, strict_groups, uas_min_count,
             dynamics_lines, signal_exit_seconds) -> dict[str, int]:
  available = checkpointing.all_steps(workdir)
  if not available:
    raise checkpointing.CheckpointError(
        f"no checkpoint in {checkpointing.checkpoint_dir(workdir)}")
  if steps is not None:
    missing = sorted(set(steps) - set(available))
    if missing:
      raise checkpointing.CheckpointError(
          f"no checkpoint for steps {missing} in {workdir}; available: {available}")
  todo_steps = sorted(available if steps is None else steps)
  path = os.path.join(workdir, output)
  if sentence_set not in SENTENCE_SETS or entropy_input not in ENTROPY_INPUTS:
    raise ValueError(f"sentence_set must be one of {SENTENCE_SETS} and entropy_input one of "
                     f"{ENTROPY_INPUTS}, got {sentence_set!r} and {entropy_input!r}")
  recorded = {"split": split, "sentence_set": sentence_set, "entropy_input": entropy_input,
              "num_sentences": num_sentences, "method": method,
              "normalisation": normalisation, "rng_seed": rng_seed,
              "dynamics_lines": dynamics_lines}
  unreadable: dict[int, str] = {}  # step -> why: reported after the others are analysed
  compared = None  # the previous and final checkpoints, for groups that compare checkpoints
  final, final_diverged = _final_checkpoint(workdir, available, unreadable)
  everyone = None if final is None else set(final.seeds)
  if final is not None and final_diverged and set(final_diverged) >= everyone:
    raise ValueError(f"every seed of {workdir} diverged ({_diverged_text(final_diverged)}; "
                     "docs/reliability.md): nothing to analyse")
  compare_groups = [g for g in requested if "references" in g.inputs]
  if compare_groups:
    why = _not_final(final, unreadable)
    names = ", ".join(g.name for g in compare_groups)
    if why and strict_groups:
      raise ValueError(f"{names} compare every checkpoint with the run's final one, but {why}; "
                       "run them once training has finished")
    if why:
      log.warning("skipping %s: they compare every checkpoint with the run's final one, but %s "
                  "(rerun sg_jax.analyze once training has finished)", names, why)
      requested = [g for g in requested if g not in compare_groups]
    else:
      compared = references.ReferenceParams(
          workdir, [s for s in available if s <= final.step and s not in unreadable])
      compared.keep(final.step, final.seeds, final.state["params"])
      recorded["reference_final_step"] = compared.final_step  # what "final" meant for the rows
  if not requested:
    raise ValueError(f"nothing to compute in {workdir}: every requested group was skipped")
  check_options(path, recorded, {"reference_final_step": available[-1]},
                hints={"reference_final_step": "--metrics without cka and tvd, whose rows "
                                               "compare with step {old},"})
  options = registry.Options(method=method, normalisation=normalisation, rng_seed=rng_seed,
                             batch_size=batch_size, entropy_batch_size=entropy_batch_size,
                             seeds_per_call=seeds_per_call or None, uas_min_count=uas_min_count,
                             dynamics_lines=dynamics_lines)
  done = long_csv.read_keys(path)
  writer = long_csv.LongCsv(path)
  manager = checkpointing.make_manager(workdir, create=False, asynchronous=False)
  data = None
  rows_written = analysed = 0
  warned_diverged: set[int] = set()
  t_start = time.time()
  with stop_signal.StopSignal(exit_after=signal_exit_seconds) as stop:
    try:
      for n_step, step in enumerate(todo_steps):
        stop.set_immediate(True, f"at step {step} ({rows_written} new rows for the checkpoints "
                                 f"before it in {path}; the rerun computes the rest)")
        if stop.received:  # its StopNow was dropped in a callback: stop here
          raise stop_signal.StopNow(stop.received, stop.where)
        if step in unreadable:
          continue
        try:  # the metadata (seed ids) is cheap to read; parameters only when something is missing
          meta = checkpointing.read_meta(manager, step)
          run_seeds = [int(s) for s in meta["seeds"]]
        except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
          log.warning("skipping step %d: unreadable metadata: %s", step,
                      checkpointing.error_cause(e))
          unreadable[step] = f"unreadable metadata: {checkpointing.error_cause(e)}"
          continue
        chosen = _select_seeds(run_seeds, seeds)
        try:  # a diverged seed's parameters are frozen, not trained: no rows (docs/reliability.md)
          gone = checkpointing.diverged_seeds(workdir, step)
        except checkpointing.CheckpointError as e:
          log.warning("skipping step %d: %s", step, e)
          unreadable[step] = checkpointing.error_cause(e.__cause__ or e)
          continue
        new_gone = {s: at for s, at in gone.items() if s in chosen and s not in warned_diverged}
        if new_gone:
          log.warning("no rows for diverged seeds from step %d on: %s", step,
                      _diverged_text(new_gone))
          warned_diverged.update(new_gone)
        # seeds diverged by the final checkpoint are never compared with it
        comparing = {g.name for g in requested if "references" in g.inputs}
        pending = {g.name: [s for s in chosen if (step, s, g.marker) not in done
                            and s not in gone
                            and not (g.name in comparing and s in final_diverged)]
                   for g in requested}
        if not any(pending.values()):
          continue
        try:
          restored = checkpointing.restore(workdir, step, params_only=True)
        except checkpointing.CheckpointError as e:
          log.warning("skipping step %d: %s", step, e)
          unreadable[step] = checkpointing.error_cause(e.__cause__ or e)
          continue
        vocab = vocab_lib.Vocab.from_json(restored.vocab_json)
        config = restored.config
        if data is None and _reads(requested) & _SENTENCE_READS:
          requested = _drop_unsupported(
              requested, pending, "gold_trees", "gold trees",
              tasks.task_class(config.task).has_gold_trees, config.task, strict_groups)
          requested = _drop_unsupported(
              requested, pending, "dependency_lines", "gold dependencies",
              tasks.from_config(config).has_gold_dependencies, config.task, strict_groups)
          data = pipeline.load_sentences(config, workdir, split, num_sentences,
                                         "gold_trees" in _reads(requested), vocab,
                                         sentence_set=sentence_set,
                                         entropy_input=entropy_input,
                                         need_dependencies="dependency_lines" in _reads(requested))
          if not data["declaratives"] and "declaratives" in _reads(requested):
            raise ValueError(f"no sentence of {split} has a declarative part")
          record_sentences(path, data)
        longest = max((len(s) for s in data["entropy_inputs"] + (data.get("lines") or [])),
                      default=0) + 1 if data else 0
        # the run's model: its objective sets the attention and the extra rows ([MASK])
        model_config = objectives.model_config_from_config(config, vocab.size,
                                                           max_len=max(512, longest))
        params_all = restored.state["params"]
        index = {s: restored.seeds.index(s) for s in chosen}

        def params_of(seed_ids):
          idx = np.array([index[s] for s in seed_ids])
          return jax.tree_util.tree_map(lambda x: np.asarray(x)[idx], params_all)

        if compared is not None:
          compared.keep(step, restored.seeds, params_all)
        t0 = time.time()
        rows = _compute_rows(step, chosen, pending, params_of, data, meta, config=model_config,
                             sos_id=vocab.sos_id, options=options,
                             references_of=lambda ids: compared.references(step, ids),
                             objective=objectives.from_config(config))
        writer.append(rows)
        done.update((r[0], r[1], r[2]) for r in rows)
        rows_written += len(rows)
        analysed += 1
        markers = {g.marker for g in requested}
        summary = {r[2]: round(float(r[3]), 4) for r in rows if r[2] in markers}
        log.info("[%d/%d] step %d: %d seeds, %d rows%s in %.1fs (last seed: %s)", n_step + 1,
                 len(todo_steps), step, len(chosen), len(rows),
                 rows_note({r[2] for r in rows}, len(rows), len(chosen)), time.time() - t0,
                 summary)
    except stop_signal.StopNow as e:
      raise stop_signal.Preempted(f"stopped by signal {e.signum} {e.where}") from None
    finally:
      manager.close()
  log.info("done: %d rows for %d checkpoints in %.1fs -> %s", rows_written, analysed,
           time.time() - t_start, path)
  if unreadable:
    first = min(unreadable)
    raise checkpointing.CheckpointError(
        f"unreadable checkpoint step(s) {sorted(unreadable)} in "
        f"{checkpointing.checkpoint_dir(workdir)} ({unreadable[first]}); the other "
        f"checkpoints were analysed ({rows_written} new rows in {path})")
  return {"rows_written": rows_written, "checkpoints_analysed": analysed}


def rows_note(names: set[str], num_rows: int, num_seeds: int) -> str:
  """What the progress line says after a checkpoint's row count: the rows per seed and, when
  rows comparing with the previous checkpoint are missing (the first checkpoint analysed has
  none: `cka_previous*`, `tvd_previous`), how many and why, so that a first checkpoint's smaller
  count (e.g. 140 rows against 160 later) is explained.

  Args:
    names: the names of the checkpoint's rows.
    num_rows: how many rows it wrote; num_seeds: for how many seeds.
  """
  missing = {n.replace("_final", "_previous") for n in names if "_final" in n} - names
  why = (f"; without the {len(missing)} *_previous rows per seed: the first checkpoint analysed "
         "has no previous one to compare with" if missing else "")
  return f" ({num_rows // max(num_seeds, 1)} per seed{why})"
