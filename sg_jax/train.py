"""Training loop: many seeds of the structural-grokking LM at once (Murty et al., ACL 2023).

`train_and_evaluate` drives a run: it checks the workdir (`runtime`), builds the typed options
of everything below it once (`DataOptions`, `step.StepOptions`, `training.options.LoopOptions`,
the loss terms and the enabled evaluators: nothing below reads the run config), loads the data
(`input_pipeline`), builds the seed-vmapped compiled functions (`step`, with `packing`), then
alternates compiled calls of `train.steps_per_call` steps with logging, evaluation and
checkpoints (`training.calls`, `training.logs`), resuming from the workdir's latest checkpoint.

The loop blocks on the result of every compiled call before dispatching the next one, so a stop
signal is acted on after the current call: calls are sized to take at most
`train.max_call_seconds` (`runtime.call_sizer`). Metrics reach the host only at logging,
evaluation and checkpoint intervals.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

import jax
import ml_collections
import numpy as np

from sg_jax import checkpointing
from sg_jax import evaluation as evals
from sg_jax import models
from sg_jax import terms as terms_lib
from sg_jax.config import checks as config_checks
from sg_jax.config import per_seed
from sg_jax.data import composition
from sg_jax.data.input_pipeline import DataOptions, load_data, make_train_data
from sg_jax.data.packing import padding_fraction
from sg_jax.evaluation.evaluator import run_evaluations
from sg_jax.models import layers
from sg_jax.models import transformer as model_lib
from sg_jax.records import metric_logging
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
from sg_jax.step import StepOptions, make_train_fns
from sg_jax.tasks.io import run_data_dir
from sg_jax.training.calls import guess_seconds_per_step, run_calls, save
from sg_jax.training.logs import Loop, evaluate_if_missing, log_eval
from sg_jax.training.options import LoopOptions
from sg_jax.training.state import TrainState, seed_keys

log = logging.getLogger("sg_jax")


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
    loop_options = LoopOptions.from_config(config)
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
  step_options = StepOptions.from_config(config, vocab.size)
  fns = make_train_fns(step_options, capacities, mesh, pool_sizes)
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
  built = (evaluator.build(eval_context) for evaluator in evals.enabled_from_config(config))
  evaluate = run_evaluations([e for e in built if e is not None])

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
    if writer and (latest or 0) < loop_options.num_steps:  # a session that will train:
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
    loop = Loop(options=loop_options, optimizer=step_options.optimizer, terms=step_options.terms,
                metric_names=step_options.objective.metric_names, seeds=seeds,
                evaluate=evaluate, table=table, summaries=summaries, ckpt=ckpt, meta=meta,
                stop=stop)

    last_eval = {}
    if latest is None:
      if pool_sizes is not None:  # each seed's data mix, beside its metrics
        table.write(0, seeds,
                    composition.metric_rows(data_options.mixes, host_data["pool_sizes"]))
      last_eval = log_eval(loop, 0, state)
      save(loop, 0, state)
    else:
      last_eval = evaluate_if_missing(loop, latest, state, os.path.join(workdir, "metrics.csv"))

    num_params = model_lib.num_params(jax.tree_util.tree_map(lambda x: x[0], state.params))
    if step >= loop_options.num_steps:
      log.info("the run in %s is complete: its checkpoint is at step %d and train.num_steps is "
               "%d, so there is nothing to train (pass a larger --config.train.num_steps to train "
               "longer)", workdir, step, loop_options.num_steps)
    else:
      log.info("training %d seeds %s of %s (%d parameters each) from step %d to %d in %s",
               len(seeds), seeds, config.task, num_params, step, loop_options.num_steps,
               workdir)
    sizer = CallSizer(loop_options.steps_per_call, loop_options.max_call_seconds,
                      guess_seconds_per_step(num_params, loop_options, host_data, per_device))
    if step < loop_options.num_steps:  # a complete run trains nothing: no call size to give
      sizer.log_first_size()
    loop.start_time, loop.start_step = time.time(), step
    state, step, last_eval = run_calls(loop, fns, sizer, state, train_data, step, last_eval,
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
    last_eval = (metric_logging.logged_eval(table, step, seeds)
                 or log_eval(loop, step, state, write=False))
  return {"step": step, "seeds": seeds, "eval": last_eval, "state": state,
          "trained_steps": step - loop.start_step,
          "per_seed": terms_lib.lambdas_per_seed(schedules)}
