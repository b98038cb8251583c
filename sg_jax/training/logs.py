"""What the training loop writes between its compiled calls: the evaluation of every seed
(`log_eval`), the training metrics since the last log (`log_train`), what a call compiled
(`log_compiled`), and the evaluation a stop signal interrupted (`evaluate_if_missing`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import checkpointing
from sg_jax import terms as terms_lib
from sg_jax.evaluation import scoring as evaluation
from sg_jax.optim.options import OptimOptions
from sg_jax.optim.schedules import learning_rates
from sg_jax.records import metric_logging
from sg_jax.runtime import compile_cache
from sg_jax.runtime import sharding
from sg_jax.runtime.stop_signal import StopSignal
from sg_jax.training.options import LoopOptions
from sg_jax.training.state import TrainState

log = logging.getLogger("sg_jax")


@dataclasses.dataclass
class Loop:
  """What the loop's logging, evaluation and saving share during one run.

  Attributes:
    options: when the loop logs, evaluates and checkpoints (`LoopOptions`).
    optimizer: the optimiser's options, for the logged learning rate (`optim.OptimOptions`).
    terms: the active loss terms (`terms.active`): each term's penalty is logged.
    metric_names: the objective's training metrics (`Objective.metric_names`), logged too.
  """

  options: LoopOptions
  optimizer: OptimOptions
  terms: tuple
  metric_names: tuple[str, ...]
  seeds: list[int]
  evaluate: Callable  # params [S, ...] -> {split: {name: [S]}}
  table: metric_logging.MetricsTable
  summaries: metric_logging.SummaryWriter
  ckpt: checkpointing.CheckpointWriter
  meta: dict
  stop: StopSignal
  start_time: float = 0.0  # time.time() when training (re)started
  start_step: int = 0  # the step training (re)started from


def log_eval(loop: Loop, step: int, state: TrainState, write: bool = True,
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
  log_compiled(watch, "evaluation")
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


def log_compiled(watch: compile_cache.CompileWatch, what: str) -> None:
  """Logs what a call compiled or loaded from the persistent compilation cache (if any)."""
  line = watch.describe(what)
  if line:
    log.info("%s", line)


def evaluate_if_missing(loop: Loop, step: int, state: TrainState, path: str) -> dict:
  """Evaluates checkpoint `step` when it is an evaluation step whose rows are not in
  metrics.csv (a stop signal interrupted that evaluation), so the table equals an uninterrupted
  run's. Every process decides from the same file. Returns the evaluation, or {}."""
  if step == 0 or not loop.options.is_eval_step(step):
    return {}
  if os.path.exists(path):
    names = {r["name"] for r in metric_logging.read_table(path)
             if r["step"] == step and r["name"].startswith(("in_domain/", "out_of_domain/"))}
    if names:
      return {}
  log.info("evaluating checkpoint step %d, whose evaluation was interrupted", step)
  return log_eval(loop, step, state)


def log_train(loop: Loop, *, step: int, state: TrainState) -> TrainState:
  """Writes the training metrics of the steps since the last log; returns `state` with its
  running sums reset."""
  seeds, num_steps = loop.seeds, loop.options.num_steps
  sums = sharding.to_host(state.sums)
  diverged = np.asarray(sharding.to_host(state.diverged))
  diverged_step = np.asarray(sharding.to_host(state.diverged_step), np.float64)
  n = np.maximum(sums["steps"], 1.0)
  learning_rate = learning_rates(loop.optimizer, step - 1)  # one per seed
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
  for term in loop.terms:  # each loss term's penalty (e.g. SAS, docs/sas.md)
    shown.append(f"train/{terms_lib.sum_name(term)}")
    metrics[shown[-1]] = sums[terms_lib.sum_name(term)] / n
  for name in loop.metric_names:  # e.g. a masked LM's accuracy
    shown.append(f"train/{name}")
    metrics[shown[-1]] = sums[name] / n
  loop.table.write(step, seeds, metrics)
  loop.summaries.write(step, seeds, metrics)
  rate = (step - loop.start_step) / max(time.time() - loop.start_time, 1e-9)
  eta = (num_steps - step) / max(rate, 1e-9)
  # Two decimals: the reference size trains about 0.1 steps/s on a CPU.
  extra = "".join(f"  {name[len('train/'):]} {metric_logging.format_values(metrics[name])}"
                  for name in shown)
  log.info("step %d/%d  loss %s%s  %.2f steps/s (%.1f seed-steps/s)  %s left",
           step, num_steps, metric_logging.format_values(metrics["train/loss"]),
           extra, rate, rate * len(seeds), evaluation.format_duration(eta))
  zero = jax.tree_util.tree_map(jnp.zeros_like, state.sums)
  return state.replace(sums=zero)
