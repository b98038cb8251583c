"""Training loop: many seeds of the structural-grokking LM at once (Murty et al., ACL 2023).

`train_and_evaluate` drives a run: it checks the workdir (`runtime`), loads the data
(`input_pipeline`), builds the seed-vmapped compiled functions (`step`, with `packing`), then
alternates compiled calls of `train.steps_per_call` steps with logging, evaluation and
checkpoints, resuming from the workdir's latest checkpoint.

The loop blocks on the result of every compiled call before dispatching the next one, so a stop
signal is acted on after the current call: calls are sized to take at most
`train.max_call_seconds` (`runtime.call_sizer`). Metrics reach the host only at logging,
evaluation and checkpoint intervals.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sg_jax import checkpointing
from sg_jax import evaluation as evals
from sg_jax import models
from sg_jax import objectives
from sg_jax import terms as terms_lib
from sg_jax.accelerators import profiling
from sg_jax.config import checks as config_checks
from sg_jax.config import per_seed
from sg_jax.data import composition
from sg_jax.data.input_pipeline import DataOptions, load_data, make_train_data
from sg_jax.data.packing import padding_fraction
from sg_jax.evaluation import scoring as evaluation
from sg_jax.evaluation.evaluator import run_evaluations
from sg_jax.models import layers
from sg_jax.models import transformer as model_lib
from sg_jax.optim.options import OptimOptions
from sg_jax.optim.schedules import learning_rates
from sg_jax.records import metric_logging
from sg_jax.runtime import compile_cache
from sg_jax.runtime import cost_check
from sg_jax.runtime import environment
from sg_jax.runtime import sharding
from sg_jax.runtime import stop_signal
from sg_jax.runtime import workdir_lock
from sg_jax.runtime import writability
from sg_jax.runtime.call_sizer import CallSizer
from sg_jax.runtime.resume_check import check_workdir_config
from sg_jax.runtime.stop_signal import Preempted, StopSignal
from sg_jax.runtime.writability import check_writable
from sg_jax.step import TrainFns, TrainState, make_train_fns, seed_keys
from sg_jax.tasks.io import run_data_dir

log = logging.getLogger("sg_jax")


# Rough training speed per device before anything is measured (FLOP/s of 6 x parameters x
# tokens per step): only the first call's size depends on it.
_GUESSED_FLOPS_PER_SECOND = {"cpu": 2e10}
_GUESSED_ACCELERATOR_FLOPS = 1e13


def _guess_seconds_per_step(num_params: int, config, host_data: dict, per_device: int) -> float:
  lengths = np.asarray(host_data["lengths"])
  tokens = config.train.batch_size * (float(lengths.mean()) if config.train.packing
                                      else host_data["inputs"].shape[1])
  speed = _GUESSED_FLOPS_PER_SECOND.get(jax.default_backend(), _GUESSED_ACCELERATOR_FLOPS)
  return 6.0 * num_params * tokens * per_device / speed


# ----------------------------------------------------------------------------------------------
# The main loop.


def _next_boundary(step: int, config, steps: int | None = None) -> int:
  """End of the next compiled call: at most `steps` (default train.steps_per_call), and never
  past a log/eval/checkpoint step."""
  end = min(step + (steps or config.train.steps_per_call), config.train.num_steps)
  for every in (config.train.log_every, config.eval.every, config.checkpoint.every):
    end = min(end, (step // every + 1) * every)
  return min(end, evaluation.next_eval_step(step, evaluation.EvalSchedule.from_config(config)))
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       allow_config_change: bool = False,
                       state_hook: Callable[[TrainState, int], TrainState] | None = None,
                       tensorboard: bool = True, signal_exit_seconds: float = 0.0,
                       memory_check: bool = True) -> dict:
  """Trains `config.num_seeds` seeds at once in `workdir`, resuming from its latest checkpoint.

  SIGTERM/SIGINT are handled from the first line: before the first compiled training call (data
  generation, compilation, the step-0 evaluation) and during a call that starts from the latest
  checkpoint they stop the run at once; otherwise the run checkpoints after the current call
  (at most about `train.max_call_seconds`) and stops. Either way `Preempted` is raised.

  Args:
    config: resolved config (see `configs/`); validated before any compute.
    workdir: run directory (created); receives config.json, vocab.json, data/ (generated),
      checkpoints/, metrics.csv and tensorboard/.
    allow_config_change: resume a workdir written with another value of a field in
      `CHANGEABLE_WITH_FLAG` (see `check_workdir_config`).
    state_hook: test hook `(state, step) -> state` called before every compiled call (e.g. to
      poison one seed's parameters).
    tensorboard: also write TensorBoard summaries (clu).
    signal_exit_seconds: the command line's bound on stopping at once (see `StopSignal`): after
      this many seconds the process exits with EXIT_PREEMPTED if the main thread is still inside
      a native call; 0 = never (in-process callers keep their interpreter).
    memory_check: refuse, before anything is allocated, a run whose estimated memory exceeds
      the machine's (`sg_jax.runtime.cost_check`).

  Returns:
    {'step': final step, 'seeds': seed ids [S], 'eval': the last evaluation as
    {'in_domain/accuracy': np [S], ...} (NaN for diverged seeds), 'state': the stacked
    TrainState, 'trained_steps': steps trained by this call (0 when the run was complete)}.

  Raises:
    ValueError: invalid config or data (message names the field / file / line), a workdir
      written with another config, or (`cost_check.MemoryEstimateError`) a run whose estimated
      memory exceeds the machine's.
    checkpointing.CheckpointMismatch: a checkpoint's shapes do not fit the config (nothing moved).
    checkpointing.WorkdirError: the workdir cannot be written (unwritable, disk full; a failed
      checkpoint save stops the run at once); the checkpoints before it are intact and
      metrics.csv ends at the last of them.
    Preempted: a SIGTERM/SIGINT arrived (`Preempted.step`: the checkpoint to resume from).
    workdir_lock.LockHeld: another command holds the workdir's lock (`sg_jax.runtime.workdir_lock`);
      nothing in the workdir was changed.
  """
  with StopSignal(exit_after=signal_exit_seconds) as stop:
    try:
      return _train_and_evaluate(config, workdir, stop, allow_config_change=allow_config_change,
                                 state_hook=state_hook, tensorboard=tensorboard,
                                 memory_check=memory_check)
    except stop_signal.StopNow as e:
      try:
        steps = checkpointing.all_steps(workdir)
      except Exception:  # pylint: disable=broad-except  (only for the message)
        steps = []
      latest = steps[-1] if steps else None
      resume = (f"the latest checkpoint is step {latest}" if latest is not None
                else "no checkpoint yet")
      raise Preempted(f"stopped by signal {e.signum} {e.where} ({resume})", latest) from None


@dataclasses.dataclass
class _Loop:
  """What the loop's logging, evaluation and saving share during one run."""

  config: ml_collections.ConfigDict
  seeds: list[int]
  evaluate: Callable  # params [S, ...] -> {split: {name: [S]}}
  table: metric_logging.MetricsTable
  summaries: metric_logging.SummaryWriter
  ckpt: checkpointing.CheckpointWriter
  meta: dict
  stop: StopSignal
  start_time: float = 0.0  # time.time() when training (re)started
  start_step: int = 0  # the step training (re)started from


def _log_eval(loop: _Loop, step: int, state: TrainState, write: bool = True,
              interruptible: bool = False) -> dict:
  """Evaluates every seed; writes the rows of `step` unless `write` is False.

  `interruptible`: a stop signal ends the evaluation between two of its batches by raising
  `stop_signal.StopNow` (before any row is written).

  Returns:
    {'in_domain/accuracy': np [S], ...}, NaN for diverged seeds.
  """
  with compile_cache.CompileWatch() as watch:
    if interruptible:
      with loop.stop.interrupting(f"during the evaluation of step {step}"):
        results = sharding.to_host(loop.evaluate(state.params))
    else:
      results = sharding.to_host(loop.evaluate(state.params))
  _log_compiled(watch, "evaluation")
  diverged = np.asarray(sharding.to_host(state.diverged))
  flat = {}
  for split, metrics in results.items():
    for name, values in metrics.items():
      flat[f"{split}/{name}"] = np.where(diverged, np.nan, np.asarray(values))
  if write:
    loop.table.write(step, loop.seeds, flat)
    loop.summaries.write(step, loop.seeds, flat)
  # The log line leaves out the per-construction metrics (`<split>/<metric>/<tag>`).
  log.info("step %d eval: %s", step,
           metric_logging.format_metrics({k: v for k, v in flat.items() if k.count("/") == 1}))
  return flat


def _log_compiled(watch: compile_cache.CompileWatch, what: str) -> None:
  """Logs what a call compiled or loaded from the persistent compilation cache (if any)."""
  line = watch.describe(what)
  if line:
    log.info("%s", line)


def _save(loop: _Loop, step: int, state: TrainState) -> None:
  # Not stopped at once inside orbax's save: a signal now is acted on right after it.
  immediate, loop.stop.immediate = loop.stop.immediate, False
  try:
    loop.ckpt.save(step, state, loop.meta)
  finally:
    loop.stop.immediate = immediate


def _train_and_evaluate(config, workdir, stop: StopSignal, *, allow_config_change, state_hook,
                        tensorboard, memory_check) -> dict:
  config_checks.validate(config)
  created = check_writable(workdir)
  # One writer per workdir (process 0 of a multi-process run holds it for all): a second run
  # is refused here, before anything in the workdir changes.
  lock = workdir_lock.lock_path(workdir)
  writer = sharding.is_writer()
  if writer:
    workdir_lock.acquire(lock, "sg_jax.main")
  try:
    return _train_locked(config, workdir, stop, created, allow_config_change=allow_config_change,
                         state_hook=state_hook, tensorboard=tensorboard,
                         memory_check=memory_check)
  finally:
    if writer:
      workdir_lock.release(lock)


def _train_locked(config, workdir, stop: StopSignal, created: list[str], *, allow_config_change,
                  state_hook, tensorboard, memory_check) -> dict:
  try:
    check_workdir_config(workdir, config, allow_config_change)
    # The typed options of the functions below (built once here; none of them reads `config`).
    data_options = DataOptions.from_config(config)
    loss_terms = terms_lib.active(config)
    schedules = terms_lib.schedules_from_config(config)
    task, vocab, splits = load_data(data_options, workdir)
    seeds = list(range(config.first_seed, config.first_seed + config.num_seeds))
    mesh = sharding.seed_mesh(len(seeds), config.num_devices)
    per_device = len(seeds) // mesh.devices.size
    host_data, capacities = make_train_data(data_options, splits["train"], per_device)
    host_data.update(terms_lib.train_arrays(  # {} without active loss terms
        loss_terms, schedules, task, lambda: data_options.training_examples(workdir),
        host_data["inputs"].shape[1], num_lines=host_data["inputs"].shape[0]))
  except Exception:
    # Bad data or config: a workdir this run created (with any data generated into it) is
    # removed, so that a failed first attempt leaves nothing behind.
    writability.remove_created(created)
    raise
  # Per-seed data composition: the distinct pool sizes shape the compiled sampler.
  pool_sizes = (tuple(sorted(set(host_data["pool_sizes"].tolist()))) if "pools" in host_data
                else None)
  fns = make_train_fns(config, vocab.size, capacities, mesh, pool_sizes)
  if memory_check:  # before any array is allocated or program compiled (sg_jax.runtime.cost_check)
    try:
      one_seed = jax.eval_shape(lambda key: models.init_params(fns.model.config, key),
                                jax.random.key(0))
      cost_check.check(cost_check.estimate(config, one_seed, host_data, mesh.devices.size,
                                           vocab.size), list(mesh.devices.flat))
    except cost_check.MemoryEstimateError:
      writability.remove_created(created)
      raise
  # The per-seed hyperparameters ride with the data (`step.make_chunk_fn`; with
  # `per_seed.as_data` one program serves any values: docs/usage.md "Per-seed hyperparameters
  # and split seeds").
  train_data = sharding.put_replicated(host_data | {"hparams": per_seed.hparam_arrays(config)},
                                       mesh)
  waste = padding_fraction(data_options.layout, host_data["lengths"], per_device,
                           host_data["inputs"].shape[1])
  log.info("training batches: %s; expected padding %.1f%% of computed token positions",
           f"packed rows, capacities {capacities}" if capacities else "padded", 100 * waste)
  log.info("persistent compilation cache: %s", jax.config.jax_compilation_cache_dir or "off")
  log.info("model layers: %s (model.layer_impl=%s, %s backend), matmul precision %s",
           layers.resolve_layer_impl(config.model.layer_impl), config.model.layer_impl,
           jax.default_backend(), config.model.matmul_precision)
  # Every enabled evaluator (`config.evals.<name>`, docs/evaluation.md) builds its batches and
  # compiled function; one that has nothing to evaluate for this run returns None.
  eval_context = evals.Context(
      task=task, vocab=vocab, model=fns.model, objective=fns.objective,
      splits={name: splits[name] for name in ("in_domain", "out_of_domain")},
      data_dir=run_data_dir(config.data, workdir), options=evals.EvalOptions.from_config(config),
      put=lambda tree: sharding.put_replicated(tree, mesh))
  evaluate = run_evaluations([e for e in (ev.build(eval_context) for ev in evals.enabled(config))
                              if e is not None])

  writer = sharding.is_writer()
  meta = checkpointing.make_meta(config, vocab.to_json(), seeds)
  # Each seed's data order, dropout and masking draw from seeds.data, its initialisation from
  # seeds.init (both the seed id by default: `per_seed.seed_ids`).
  state = jax.jit(fns.init, out_shardings=sharding.seed_sharding(mesh))(*sharding.put_replicated(
      (np.asarray(seed_keys(per_seed.seed_ids(config, "data"))),
       np.asarray(seed_keys(per_seed.seed_ids(config, "init"))),
       per_seed.hparam_arrays(config)["init_scale"]), mesh))
  ckpt = checkpointing.CheckpointWriter(workdir, max_to_keep=config.checkpoint.max_to_keep)
  summaries = None
  failed = False
  try:
    latest, restored = checkpointing.restore_latest_good(
        ckpt.manager, workdir, sharding.abstract_like(state, mesh), config=config)
    # The workdir's own files change only once its checkpoints are known to fit this config.
    writability.write_json_atomic(os.path.join(workdir, "config.json"), config.to_json(indent=2))
    writability.write_json_atomic(os.path.join(workdir, "vocab.json"), vocab.to_json())
    if writer and (latest or 0) < int(config.train.num_steps):  # a session that will train:
      environment.record(workdir, latest or 0, writability.write_json_atomic)  # its versions
    table = metric_logging.MetricsTable(os.path.join(workdir, "metrics.csv"), enabled=writer)
    summaries = metric_logging.SummaryWriter(os.path.join(workdir, "tensorboard"),
                                             tensorboard and writer)
    # Rows logged after the checkpoint we resume from (or by an attempt killed before its first
    # checkpoint) are dropped, so the table equals an uninterrupted run's.
    dropped = table.truncate_after(-1 if latest is None else latest)
    if latest is not None:
      state = restored
      log.info("resumed from checkpoint step %d (dropped %d later metric rows)", latest,
               dropped)
    step = int(latest or 0)
    log.info("%s", sharding.describe(mesh, len(seeds)))
    loop = _Loop(config=config, seeds=seeds, evaluate=evaluate, table=table,
                 summaries=summaries, ckpt=ckpt, meta=meta, stop=stop)

    last_eval = {}
    if latest is None:
      if pool_sizes is not None:  # each seed's data mix, beside its metrics
        table.write(0, seeds,
                    composition.metric_rows(data_options.mixes, host_data["pool_sizes"]))
      last_eval = _log_eval(loop, 0, state)
      _save(loop, 0, state)
    else:
      last_eval = _evaluate_if_missing(loop, latest, state, os.path.join(workdir, "metrics.csv"))

    num_params = model_lib.num_params(jax.tree_util.tree_map(lambda x: x[0], state.params))
    if step >= config.train.num_steps:
      log.info("the run in %s is complete: its checkpoint is at step %d and train.num_steps is "
               "%d, so there is nothing to train (pass a larger --config.train.num_steps to train "
               "longer)", workdir, step, config.train.num_steps)
    else:
      log.info("training %d seeds %s of %s (%d parameters each) from step %d to %d in %s",
               len(seeds), seeds, config.task, num_params, step, config.train.num_steps,
               workdir)
    sizer = CallSizer(config.train.steps_per_call, config.train.get("max_call_seconds", 0.0),
                      _guess_seconds_per_step(num_params, config, host_data, per_device))
    if step < config.train.num_steps:  # a complete run trains nothing: no call size to give
      sizer.log_first_size()
    loop.start_time, loop.start_step = time.time(), step
    state, step, last_eval = _run_calls(loop, fns, sizer, state, train_data, step, last_eval,
                                        state_hook)
    ckpt.wait()
  except checkpointing.CheckpointWriteError as e:
    failed = True
    ckpt.abandon()
    good = checkpointing.all_steps(workdir)
    last_good = good[-1] if good else None
    if writer:
      metric_logging.MetricsTable(os.path.join(workdir, "metrics.csv")).truncate_after(
          -1 if last_good is None else last_good)
    ends = (f"the last good checkpoint is step {last_good} and metrics.csv ends there"
            if last_good is not None else "there is no checkpoint and metrics.csv is empty")
    raise checkpointing.WorkdirError(f"{e}; the run stopped: {ends}") from e
  finally:
    if not failed:
      try:
        ckpt.close()
      except checkpointing.CheckpointWriteError:
        ckpt.abandon()  # only while another exception propagates: ckpt.wait() ran otherwise
    if summaries is not None:
      summaries.close()
  if not last_eval:  # the run had already finished: report its final evaluation again
    last_eval = metric_logging.logged_eval(table, step, seeds) or _log_eval(loop, step, state, write=False)
  return {"step": step, "seeds": seeds, "eval": last_eval, "state": state,
          "trained_steps": step - loop.start_step,
          "per_seed": terms_lib.lambdas_per_seed(schedules)}


def _run_calls(loop: _Loop, fns: TrainFns, sizer: CallSizer, state: TrainState,
               train_data: dict, step: int, last_eval: dict,
               state_hook: Callable | None) -> tuple[TrainState, int, dict]:
  """Compiled calls from `step` to train.num_steps, logging, evaluating and saving between them.

  Returns:
    (state, final step, the last evaluation or `last_eval` when none ran).

  Raises:
    Preempted: a stop signal arrived (after the checkpoint of the step reached).
  """
  config, stop, ckpt = loop.config, loop.stop, loop.ckpt
  # Several processes stop together: each acts on `_agreed_signal`, never on its own signal at
  # once, so that all of them checkpoint the same step (or they would wait for each other).
  alone = jax.process_count() == 1
  saved = step  # the state at `saved` is in a checkpoint (written or being written)
  schedule = evaluation.EvalSchedule.from_config(config)
  while step < config.train.num_steps:
    received = _agreed_signal(stop)
    if received is not None and step == saved:
      ckpt.wait()
      raise Preempted(f"signal {received}: checkpoint written at step {step}", step)
    end = _next_boundary(step, config, sizer.size_at(step))
    end = profiling.call_end(step, end)  # --profile_steps: cut at A and B, trace A..B
    if state_hook is not None:
      state = state_hook(state, step)
    # A call from the step just checkpointed loses nothing when a signal stops it at once.
    stop.set_immediate(step == saved and alone, f"at step {step}")
    started = time.perf_counter()
    with compile_cache.CompileWatch() as watch:
      state = fns.chunk(state, train_data, jnp.asarray(step, jnp.int32), end - step)
      jax.block_until_ready(state)  # the signal and the saves are checked after every call
    _log_compiled(watch, f"train step ({end - step} steps per call)")
    stop.set_immediate(False)
    sizer.observe(end - step, time.perf_counter() - started)
    step = end
    received = _agreed_signal(stop)
    # A failed save stops the run before any metric row of a later step is written: rows are
    # written at log/eval steps only, and there the pending save is waited for (it has
    # usually long finished); between them a failure is picked up as soon as it is known.
    if any(step % every == 0 for every in (config.train.log_every, config.checkpoint.every)) \
        or evaluation.is_eval_step(step, schedule):
      ckpt.wait()
    else:
      ckpt.check()
    if _is_log_step(step, config):
      state = _log_train(loop, step=step, state=state)
    if evaluation.is_eval_step(step, schedule) or step == config.train.num_steps:
      # A stop signal before or during the evaluation skips it: the step is checkpointed at
      # once, and the resumed run evaluates it first (`_evaluate_if_missing`).
      try:
        if received is not None:
          raise stop_signal.StopNow(received, "before the evaluation")
        last_eval = _log_eval(loop, step, state, interruptible=alone)
      except stop_signal.StopNow as e:
        _save(loop, step, state)
        ckpt.wait()
        raise Preempted(f"signal {e.signum}: checkpoint written at step {step} without its "
                        f"evaluation, which the resumed run does first", step) from None
    if (step % config.checkpoint.every == 0 or step == config.train.num_steps
        or received is not None):
      _save(loop, step, state)
      saved = step
    if received is not None and step < config.train.num_steps:
      ckpt.wait()
      raise Preempted(f"signal {received}: checkpoint written at step {step}", step)
  return state, step, last_eval


def _is_log_step(step: int, config) -> bool:
  """Training metrics are logged every `train.log_every` steps, at the last step, and at every
  evaluation step (so a dense evaluation schedule, `eval.dense_until`, densifies the loss curve
  too: an onset located on `train/loss` needs its points, `analysis.onsets`)."""
  return (step % config.train.log_every == 0 or step == config.train.num_steps
          or evaluation.is_eval_step(step, evaluation.EvalSchedule.from_config(config)))


def _agreed_signal(stop: StopSignal) -> int | None:
  """The stop signal received, the same on every process: with several processes the first
  any of them has received (a collective), so that all of them stop after the same call."""
  if jax.process_count() == 1:
    return stop.received
  return sharding.max_over_processes(stop.received or 0) or None


def _evaluate_if_missing(loop: _Loop, step: int, state: TrainState, path: str) -> dict:
  """Evaluates checkpoint `step` when it is an evaluation step whose rows are not in
  metrics.csv (a stop signal interrupted that evaluation), so the table equals an uninterrupted
  run's. Every process decides from the same file. Returns the evaluation, or {}."""
  config = loop.config
  if step == 0 or not (evaluation.is_eval_step(step, evaluation.EvalSchedule.from_config(config))
                       or step == config.train.num_steps):
    return {}
  if os.path.exists(path):
    names = {r["name"] for r in metric_logging.read_table(path)
             if r["step"] == step and r["name"].startswith(("in_domain/", "out_of_domain/"))}
    if names:
      return {}
  log.info("evaluating checkpoint step %d, whose evaluation was interrupted", step)
  return _log_eval(loop, step, state)


def _log_train(loop: _Loop, *, step: int, state: TrainState) -> TrainState:
  """Writes the training metrics of the steps since the last log; returns `state` with its
  running sums reset."""
  config, seeds = loop.config, loop.seeds
  sums = sharding.to_host(state.sums)
  diverged = np.asarray(sharding.to_host(state.diverged))
  diverged_step = np.asarray(sharding.to_host(state.diverged_step), np.float64)
  n = np.maximum(sums["steps"], 1.0)
  learning_rate = learning_rates(OptimOptions.from_config(config), step - 1)  # per seed
  metrics = {
      "train/loss": sums["loss"] / n,
      "train/grad_norm": sums["grad_norm"] / n,
      "train/learning_rate": np.asarray(learning_rate),
      "train/diverged": diverged.astype(np.float64),
      "train/diverged_step": diverged_step,
  }
  metrics["train/loss"] = np.where(diverged, np.nan, metrics["train/loss"])
  # Beside the loss, the log line shows each loss term's penalty and the objective's metrics.
  shown = []
  for term in terms_lib.active(config):  # each loss term's penalty (e.g. SAS, docs/sas.md)
    shown.append(f"train/{terms_lib.sum_name(term)}")
    metrics[shown[-1]] = sums[terms_lib.sum_name(term)] / n
  for name in objectives.from_config(config).metric_names:  # e.g. a masked LM's accuracy
    shown.append(f"train/{name}")
    metrics[shown[-1]] = sums[name] / n
  loop.table.write(step, seeds, metrics)
  loop.summaries.write(step, seeds, metrics)
  rate = (step - loop.start_step) / max(time.time() - loop.start_time, 1e-9)
  eta = (config.train.num_steps - step) / max(rate, 1e-9)
  # Two decimals: the reference size trains about 0.1 steps/s on a CPU.
  extra = "".join(f"  {name[len('train/'):]} {metric_logging.format_values(metrics[name])}"
                  for name in shown)
  log.info("step %d/%d  loss %s%s  %.2f steps/s (%.1f seed-steps/s)  %s left",
           step, config.train.num_steps, metric_logging.format_values(metrics["train/loss"]),
           extra, rate, rate * len(seeds), evaluation.format_duration(eta))
  zero = jax.tree_util.tree_map(jnp.zeros_like, state.sums)
  return state.replace(sums=zero)
