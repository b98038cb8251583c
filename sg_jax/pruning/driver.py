"""The pruning runs behind `python -m sg_jax.prune` (whose module docstring describes the options;
its flags and `main` stay there): which runs are missing, trained checkpoint by checkpoint,
evaluated and appended to the pruning table.
"""

from __future__ import annotations

import logging as py_logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import checkpointing
from sg_jax.config.cli_options import check_options
from sg_jax.pruning import evaluate as evaluate_lib
from sg_jax.pruning import hard_concrete
from sg_jax.pruning import inputs as inputs_lib
from sg_jax.pruning import objective as objective_lib
from sg_jax.pruning import partial as partial_lib
from sg_jax.pruning import placement
from sg_jax.pruning import run as run_lib
from sg_jax.pruning import table
from sg_jax.runtime import sharding
from sg_jax.runtime import stop_signal
from sg_jax.runtime import workdir_lock


log = py_logging.getLogger("sg_jax.prune")


# Final masks: the original's per-group rule (the rest open), the same with the original's 0.5
# threshold of the rest's soft values, or the global top-k (`hard_concrete`).
BINARISE = ("group", "group_threshold", "global")


def parse_sparsities(text: str) -> list[float]:
  """'0.3,0.5' -> [0.3, 0.5]. Raises ValueError unless every level is a number in (0, 1)."""
  try:
    levels = [float(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise ValueError(f"--sparsities must be comma-separated numbers in (0, 1), got {text!r}"
                     ) from None
  bad = [x for x in levels if not 0.0 < x < 1.0]
  if bad or not levels or len(set(map(table.level_key, levels))) != len(levels):
    raise ValueError(f"--sparsities must be distinct numbers in (0, 1), got {text!r}")
  return levels


def _select_steps(workdir: str, steps: list[int] | None, last_only: bool) -> list[int]:
  if not os.path.isdir(workdir):
    raise checkpointing.CheckpointError(f"workdir {workdir} does not exist")
  available = checkpointing.all_steps(workdir)
  if not available:
    raise checkpointing.CheckpointError(
        f"no checkpoint in {checkpointing.checkpoint_dir(workdir)}")
  if last_only:
    return [available[-1]]
  if steps is None:
    return available
  missing = sorted(set(steps) - set(available))
  if missing:
    raise checkpointing.CheckpointError(
        f"no checkpoint for steps {missing} in {workdir}; available: {available}")
  return sorted(steps)


def _evaluate(mesh, task, model_config, vocab, eval_data, data, ablation, params_S, means_S,
              head_keep, mlp_keep, num_devices, objective=None):
  """(subnetwork metrics {name: [S, K]}, full model's {name: [S, 1]}, KL [S, K]) on the host,
  each run per device (`placement.over_runs`; the full model's over a seed-only mesh)."""
  evaluator = evaluate_lib.make_evaluator(task, model_config, vocab, eval_data, ablation,
                                          objective)
  h_mask, m_mask = placement.place(mesh, None, (np.asarray(head_keep, np.float32),
                                                np.asarray(mlp_keep, np.float32)))[1]
  results = evaluate_lib.to_rows(sharding.to_host(placement.over_runs(evaluator, mesh, 2)(
      params_S, means_S, h_mask, m_mask)))
  seed_mesh = placement.run_mesh(h_mask.shape[0], 1, num_devices)
  ones = [np.ones(m.shape[:1] + (1,) + m.shape[2:], np.float32) for m in (h_mask, m_mask)]
  seed_args, ones = placement.place(seed_mesh, (params_S, means_S), ones)[:2]
  full = evaluate_lib.to_rows(sharding.to_host(placement.over_runs(evaluator, seed_mesh, 2)(
      *seed_args, *ones)))
  kl_fn = lambda p, m, hm, mm, d: evaluate_lib.subnetwork_kl(p, m, hm, mm, d, config=model_config,
                                                             ablation=ablation)
  kl = sharding.to_host(placement.over_runs(kl_fn, mesh, 2, 1)(params_S, means_S, h_mask,
                                                                m_mask, data))
  return results, full, np.asarray(kl)


# Options files written before an option existed read as the value used then.
LEGACY_OPTIONS = {"lr_warmup_steps": 200, "eval_lines": 0}


# A table's schedule is set by the highest level of the command that created it: adding levels
# or pruning seeds to it needs the same schedule (docs/pruning.md, "Adding runs to a table").
SCHEDULE_HINTS = {"num_steps": "--num_steps={old}",
                  "sparsity_warmup_steps": "--sparsity_warmup_steps={old}"}


def prune(workdir: str, *, sparsities: list[float], steps: list[int] | None = None,
          last_only: bool = True, seeds: list[int] | None = None, pruning_seeds: int = 4,
          num_steps: int = 0, sparsity_warmup_steps: int = -1, warmup_type: str = "linear",
          lr_warmup_steps: int = 200,
          objective: str = "kl", ablation: str = "mean", sparsity_from: str = "expected",
          weight_by_params: bool = False, binarise: str = "group", num_lines: int = 1000,
          batch_size: int = 16, eval_lines: int = 0, steps_per_call: int = 100,
          num_devices: int = 0, output: str = "pruning.csv",
          signal_exit_seconds: float = 0.0) -> dict[str, object]:
  """Prunes the selected checkpoints (module docstring); returns a summary.

  Args: as the flags. `last_only` (the default `--steps=last`) takes the last checkpoint;
  otherwise `steps` (None = all). `num_steps` 0 and `sparsity_warmup_steps` -1 take
  `run.default_steps` of the highest level; `eval_lines` 0 takes the run's `eval.max_lines`;
  `num_devices` 0 lays the runs over every local device (`placement.run_mesh`).
  `signal_exit_seconds`: the command line's bound on stopping at once (`stop_signal.StopSignal`).

  Returns:
    {'rows_written': n, 'runs': runs written, 'runs_trained': runs pruned (a seed's runs that
    are in the table already are trained again when another seed lacks the same (level,
    pruning seed), but not written), 'seconds': wall time of the pruning programs, 'steps':
    [...]}.

  Raises:
    checkpointing.CheckpointError: missing workdir, no checkpoint, a requested step missing, or
      unreadable steps (raised after the readable ones are pruned, naming them).
    ValueError: bad options, unknown seeds, options differing from the CSV's, every seed of the
      run diverged (diverged seeds are skipped with a warning, docs/reliability.md).
    workdir_lock.LockHeld: another command holds the workdir (`runtime.workdir_lock`); nothing
      was written.
    stop_signal.Preempted: a SIGTERM/SIGINT stopped the command: the rows of every checkpoint step
      finished before it are written, and the runs it was training are saved
      (`pruning.partial`) for a rerun to resume.
  """
  counts = {"pruning_seeds": (pruning_seeds, 1), "batch_size": (batch_size, 1),
            "steps_per_call": (steps_per_call, 1), "num_lines": (num_lines, 0),
            "num_devices": (num_devices, 0)}
  bad = [f"--{name} must be >= {low}, got {value}" for name, (value, low) in counts.items()
         if value < low]
  if bad:
    raise ValueError("; ".join(bad))
  if binarise not in BINARISE:
    raise ValueError(f"--binarise must be one of {BINARISE}, got {binarise!r}")
  goal = objective_lib.parse_objective(objective)
  warmup, total = run_lib.default_steps(max(sparsities))
  num_steps = num_steps or total
  sparsity_warmup_steps = warmup if sparsity_warmup_steps < 0 else sparsity_warmup_steps
  if lr_warmup_steps < 0:
    raise ValueError(f"--lr_warmup_steps must be >= 0, got {lr_warmup_steps}")
  if sparsity_warmup_steps > num_steps:
    log.warning("the sparsity warm-up (%d steps) is longer than --num_steps (%d): the runs end "
                "at %.0f%% of their target; pass --sparsity_warmup_steps", sparsity_warmup_steps,
                num_steps, 100.0 * num_steps / sparsity_warmup_steps)
  settings = run_lib.Settings(
      num_steps=num_steps, sparsity_warmup_steps=sparsity_warmup_steps,
      warmup_type=warmup_type, lr_warmup_steps=lr_warmup_steps, sparsity_from=sparsity_from,
      weight_by_params=weight_by_params, objective=goal.kind, ablation=ablation)
  todo_steps = _select_steps(workdir, steps, last_only)
  # One writer per workdir: refused (nothing written) while another command holds it.
  with workdir_lock.locked(workdir, "sg_jax.prune", read_only_ok=True):
    return _prune(workdir, todo_steps, sparsities=sparsities, seeds=seeds,
                  pruning_seeds=pruning_seeds, goal=goal, settings=settings,
                  warmup_type=warmup_type, lr_warmup_steps=lr_warmup_steps, ablation=ablation,
                  sparsity_from=sparsity_from, weight_by_params=weight_by_params,
                  binarise=binarise, num_lines=num_lines, batch_size=batch_size,
                  eval_lines=eval_lines, steps_per_call=steps_per_call,
                  num_devices=num_devices, output=output,
                  signal_exit_seconds=signal_exit_seconds)


def _prune(workdir, todo_steps, *, sparsities, seeds, pruning_seeds, goal, settings, warmup_type,
           lr_warmup_steps, ablation, sparsity_from, weight_by_params, binarise, num_lines,
           batch_size, eval_lines, steps_per_call, num_devices, output,
           signal_exit_seconds) -> dict[str, object]:
  path = os.path.join(workdir, output)
  options = {"objective": str(goal), "ablation": ablation, "num_steps": settings.num_steps,
             "sparsity_warmup_steps": settings.sparsity_warmup_steps, "warmup_type": warmup_type,
             "lr_warmup_steps": lr_warmup_steps, "sparsity_from": sparsity_from,
             "weight_by_params": weight_by_params, "binarise": binarise, "num_lines": num_lines,
             "batch_size": batch_size, "eval_lines": eval_lines}
  # Refuse other options before any work, but write nothing until the first rows: a command
  # that fails (an unknown seed or split) leaves no table behind to block the next one.
  check_options(path, options, LEGACY_OPTIONS, record=False, hints=SCHEDULE_HINTS)
  done, full_done = table.done_runs(path), table.done_full_models(path)
  writer = None
  levels = [table.level_key(s) for s in sparsities]
  grid = [(lv, ps) for lv in levels for ps in range(pruning_seeds)]
  data_cache = {}
  unreadable: dict[int, str] = {}  # step -> why: named after the readable steps are pruned
  rows_written = runs_done = runs_trained = 0
  seconds = 0.0
  # SIGTERM/SIGINT: before a step's runs start, stop at once (its earlier steps are written);
  # while they train, save them after the current call (`pruning.partial`) and stop; a second
  # signal stops at once. Either way `stop_signal.Preempted` (exit 75 on the command line).
  with stop_signal.StopSignal(exit_after=signal_exit_seconds) as stop:
    try:
      for step in todo_steps:
        if stop.received:
          raise stop_signal.Preempted(
              f"stopped by signal {stop.received} after the runs of the checkpoints before step "
              f"{step} ({rows_written} new rows in {path})")
        stop.set_immediate(True, f"before pruning step {step} (its runs not started; "
                                 f"{rows_written} new rows in {path})")
        try:
          restored = checkpointing.restore(workdir, step, params_only=True)
          gone = checkpointing.diverged_seeds(workdir, step)
        except checkpointing.CheckpointError as e:
          log.warning("skipping step %d: %s", step, e)
          unreadable[step] = checkpointing.error_cause(e.__cause__ or e)
          continue
        run_seeds = list(restored.seeds)
        if seeds is not None and sorted(set(seeds) - set(run_seeds)):
          raise ValueError(f"seeds {sorted(set(seeds) - set(run_seeds))} are not in the run; "
                           f"seeds: {run_seeds}")
        if gone and set(gone) >= set(run_seeds):
          raise ValueError(f"every seed of {workdir} diverged by step {step} ("
                           + ", ".join(f"seed {s} at step {at}" for s, at in sorted(gone.items()))
                           + "; docs/reliability.md): nothing to prune")
        skipped = sorted(s for s in (seeds if seeds is not None else run_seeds) if s in gone)
        if skipped:  # frozen at their last finite parameters: not trained seeds
          log.warning("step %d: not pruning diverged seeds %s", step,
                      ", ".join(f"{s} (diverged at step {gone[s]})" for s in skipped))
        chosen = [s for s in (seeds if seeds is not None else run_seeds)
                  if s not in gone and any((step, s, lv, ps) not in done for lv, ps in grid)]
        if not chosen:
          log.info("step %d: every run is in %s already", step, path)
          continue
        # The (level, pruning seed) pairs some chosen seed still lacks: a rerun that adds pruning
        # seeds or levels trains only those (a run depends on its own key only, `run.run_key`).
        pairs = [(lv, ps) for lv, ps in grid if any((step, s, lv, ps) not in done for s in chosen)]
        if not data_cache:
          data_cache.update(inputs_lib.load_lines(restored, workdir, num_lines=num_lines,
                                                  batch_size=batch_size, eval_lines=eval_lines,
                                                  split=goal.split))
        task, data = data_cache["task"], data_cache["train"]
        model_config, vocab, params_S, means_S = inputs_lib.seed_inputs(restored, chosen,
                                                                         data_cache)
        keys = jnp.stack([jnp.stack([run_lib.run_key(s, lv, ps) for lv, ps in pairs])
                          for s in chosen])
        targets = jnp.asarray([[lv for lv, _ in pairs]] * len(chosen), jnp.float32)
        mesh = placement.run_mesh(len(chosen), len(pairs), num_devices)
        states = run_lib.init_runs(keys, model_config, settings)
        saved_path = partial_lib.partial_path(workdir, step, output)
        saved_key = partial_lib.identity(step, chosen, pairs, options)
        history = []
        resumed = partial_lib.load(saved_path, sharding.to_host(states), saved_key)
        if resumed is not None:
          states, saved_history = resumed
          history.append(saved_history)
          log.info("step %d: resuming the %d runs stopped at pruning step %d/%d (%s)", step,
                   len(chosen) * len(pairs), len(saved_history), settings.num_steps, saved_path)
        params_S, (states, targets), data = placement.place(mesh, params_S, (states, targets), data)
        means_S = placement.place(mesh, means_S, None)[0]
        train_runs = placement.train_runs_fn(mesh)
        log.info("step %d: pruning %d runs (%d seeds x %d of the %d (level, pruning seed) pairs), "
                 "%d steps, objective %s; %s", step, len(chosen) * len(pairs), len(chosen),
                 len(pairs), len(grid), settings.num_steps, goal,
                 placement.describe(mesh, len(chosen), len(pairs)))
        t0 = time.time()
        tail = max(1, settings.num_steps // 10)
        trained = sum(len(h) for h in history)
        stop.set_immediate(False)  # from here a signal saves the runs after the current call
        for n in run_lib.num_calls(settings.num_steps - trained, steps_per_call):
          states, metrics = train_runs(states, params_S, means_S, targets, data, num_steps=n,
                                       config=model_config, settings=settings)
          metrics = sharding.to_host(metrics)
          history.append(metrics["objective"])
          trained += n
          log.info("step %d: pruning step %d/%d, objective %.4f, expected sparsity per (level, "
                   "pruning seed), mean over seeds, %s (%.0f s)", step, trained, settings.num_steps,
                   float(np.mean(history[-1][-1])),
                   np.round(metrics["expected_sparsity"][-1].mean(0), 3), time.time() - t0)
          if stop.received and trained < settings.num_steps:
            partial_lib.save(saved_path, sharding.to_host(states), np.concatenate(history),
                             saved_key)
            raise stop_signal.Preempted(
                f"stopped by signal {stop.received} at pruning step {trained}/{settings.num_steps} "
                f"of checkpoint step {step}: its {len(chosen) * len(pairs)} runs are saved in "
                f"{saved_path} ({rows_written} new rows of finished runs in {path})")
        pruning_seconds = time.time() - t0
        seconds += pruning_seconds
        runs_trained += len(chosen) * len(pairs)
        final_objective = np.concatenate(history)[-tail:].mean(0)  # [S, K]
        states = sharding.to_host(states)
        la_heads, la_mlp = states.log_alpha["heads"], states.log_alpha["mlp"]
        if binarise in ("group", "group_threshold"):
          head_keep, mlp_keep = hard_concrete.deterministic_masks(la_heads, la_mlp,
                                                                  binarise == "group_threshold")
        else:
          masks = [[hard_concrete.global_masks(la_heads[i, k], la_mlp[i, k], pairs[k][0])
                    for k in range(len(pairs))] for i in range(len(chosen))]
          head_keep = np.asarray([[m[0] for m in row] for row in masks])
          mlp_keep = np.asarray([[m[1] for m in row] for row in masks])
        results, full, kl = _evaluate(mesh, task, model_config, vocab, data_cache["eval"], data,
                                      ablation, params_S, means_S, head_keep, mlp_keep,
                                      num_devices, data_cache["objective"])
        weights = objective_lib.unit_param_counts(model_config)
        expected = np.asarray(jax.vmap(jax.vmap(lambda h, m: objective_lib.expected_sparsity(
            h, m, (jnp.asarray(weights[0]), jnp.asarray(weights[1])) if weight_by_params else None
        )))(states.log_alpha["heads"], states.log_alpha["mlp"]))
        # Achieved sparsity [S, K] as closed / total, not 1 - kept / total: 3 of 15 units is 0.2,
        # not 0.19999999999999996.
        head_off, mlp_off = ~np.asarray(head_keep, bool), ~np.asarray(mlp_keep, bool)
        achieved = ((head_off.sum((-2, -1)) + mlp_off.sum(-1))
                    / (head_off[0, 0].size + mlp_off[0, 0].size))
        achieved_params = (((weights[0] * head_off).sum((-2, -1)) + (weights[1] * mlp_off).sum(-1))
                           / (weights[0].sum() + weights[1].sum()))
        rows = []
        for i, s in enumerate(chosen):
          if (step, s) not in full_done:
            rows += [(step, s, 0.0, table.FULL_MODEL, name, v[i, 0]) for name, v in full.items()]
          for k, (lv, ps) in enumerate(pairs):
            if (step, s, lv, ps) in done:
              continue
            per_run = {table.MARKER: achieved[i, k],
                       "achieved_sparsity_params": achieved_params[i, k],
                       "expected_sparsity": expected[i, k],
                       "final_objective": final_objective[i, k],
                       "lambda1": states.lambdas[i, k, 0], "lambda2": states.lambdas[i, k, 1],
                       "kl": kl[i, k], **{name: v[i, k] for name, v in results.items()}}
            rows += [(step, s, lv, ps, name, float(v)) for name, v in per_run.items()]
            runs_done += 1
        if writer is None:  # the first rows: record the options and create the table
          check_options(path, options, LEGACY_OPTIONS)
          writer = table.PruningCsv(path)
        writer.append(rows)
        rows_written += len(rows)
        new = np.asarray([[(step, s, lv, ps) not in done for lv, ps in pairs] for s in chosen])
        # [S, K, ...] -> the new runs' [R, ...] (the done ones kept as saved)
        flat = lambda a: a[new]
        table.save_masks(workdir, step, {
            "seed": flat(np.repeat(np.asarray(chosen)[:, None], len(pairs), 1)),
            "sparsity": flat(np.tile([g[0] for g in pairs], (len(chosen), 1))),
            "pruning_seed": flat(np.tile([g[1] for g in pairs], (len(chosen), 1))),
            "head_mask": flat(head_keep), "mlp_mask": flat(mlp_keep),
            "log_alpha_heads": flat(la_heads), "log_alpha_mlp": flat(la_mlp)}, output)
        partial_lib.remove(saved_path)
        by_level = {lv: [round(float(achieved[i, k]), 3) for i in range(len(chosen))
                         for k in range(len(pairs)) if pairs[k][0] == lv]
                    for lv in dict.fromkeys(lv for lv, _ in pairs)}
        elapsed = time.time() - t0
        log.info("step %d: %d runs in %.1f s (%.1f s pruning, %.1f s evaluating and writing); "
                 "achieved sparsity per level %s; -> %s", step, len(chosen) * len(pairs), elapsed,
                 pruning_seconds, elapsed - pruning_seconds, by_level, path)
      if unreadable:
        first = min(unreadable)
        raise checkpointing.CheckpointError(
            f"unreadable checkpoint step(s) {sorted(unreadable)} in "
            f"{checkpointing.checkpoint_dir(workdir)} ({unreadable[first]}); the other steps "
            f"were pruned ({rows_written} new rows in {path})")
      return {"rows_written": rows_written, "runs": runs_done, "runs_trained": runs_trained,
              "seconds": seconds, "steps": todo_steps}
    except stop_signal.StopNow as e:
      raise stop_signal.Preempted(f"stopped by signal {e.signum} {e.where}") from None
