"""The evaluation of one seed (vmapped over seeds by callers): the loss plus the task's metric.

Each task states its metric (`tasks.base.Task.make_metrics`, next to the task: e.g.
`tasks.question.question_prediction`, `tasks.tense.tense_correct`, `tasks.dyck.dyck_correct`;
definitions of the released code, Murty et al., ACL 2023, §3, `docs/REFERENCE.md` §1 "Tasks");
this module adds the loss (the objective's own: `objective_line_losses`), the greedy decoding
of tasks that decode
(`decoding.greedy_decode`, `decoding.greedy_decode_cached`) and the batching, for any task object.
`make_evaluate_fn` batches over lines with `lax.map`; `make_split_evaluator` leaves the loop over
batches to the caller (`evaluator.task_evaluation`, the `task` evaluator's seed-vmapped
evaluation, which logs progress with `ProgressLog`). Arrays are per seed: `[batch, length]` etc.

Also here: when the training loop evaluates (`EvalSchedule`, `is_eval_step`, `next_eval_step`)
and `format_duration` for its log lines.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import objectives
from sg_jax.evaluation import decoding

Array = jax.Array


def objective_line_losses(objective, logits_BxLxV: Array, targets_BxL: Array
                          ) -> tuple[Array, Array]:
  """The objective's own loss as per-line sums, so that batches add up exactly: the summed
  cross-entropy (nats) and the number of scored targets of each line (`objectives.token_losses`,
  which `Objective.loss` reduces to its mean, `objectives.mean_token_loss`: the split's loss is
  sum(loss_sum) / sum(count) over all its lines, the objective's loss of the whole split).

  Args:
    objective: an `objectives.Objective` that keeps the default `loss`.
    logits_BxLxV: float logits [batch, length, vocab]; targets_BxL: int32 [batch, length],
      0 = not scored.

  Returns:
    (loss_sum [batch] float32, count [batch] float32).

  Raises:
    ValueError: the objective overrides `Objective.loss`, whose per-line sums the evaluation
      cannot know.
  """
  if type(objective).loss is not objectives.Objective.loss:
    raise ValueError(f"objective {objective.name!r} overrides Objective.loss: the evaluation "
                     "adds the loss up over batches as per-line sums (objectives.token_losses),"
                     " which only the default loss is the mean of")
  return objectives.token_losses(logits_BxLxV, targets_BxL)


def pad_to_multiple(arrays: dict[str, np.ndarray], multiple: int) -> tuple[dict, int]:
  """Pads every [N, ...] array along axis 0 to a multiple of `multiple`; returns (arrays, N).

  Padded lines are all-zero (`lengths` 0) and are excluded by the `valid` field added here.
  """
  n = next(iter(arrays.values())).shape[0]
  total = -(-n // multiple) * multiple
  out = {k: np.concatenate([v, np.zeros((total - n,) + v.shape[1:], v.dtype)])
         for k, v in arrays.items()}
  out["valid"] = np.arange(total) < n
  return out, n


class SplitEvaluator(NamedTuple):
  """The evaluation of one split for ONE seed, in two parts, so that a caller can drive the
  batches one by one (`evaluator.task_evaluation` logs progress between them).

  Attributes:
    batch_sums: `(params, batch) -> {name: float32 []}`, sums over the batch's valid lines
      (`batch`: one batch of the `batches` described in `make_evaluate_fn`).
    summarize: `{name: float32 [num_batches]} -> metrics`, the per-batch sums stacked.
  """

  batch_sums: Callable
  summarize: Callable


def decode_steps(task, batches: dict) -> int:
  """Tokens to decode for a split: the longest target incl. EOS if `task.decodes`, else 0.

  Args:
    task: a `tasks.Task`.
    batches: host arrays with `lengths` and `task_pos` (any leading shape).
  """
  if not task.decodes:
    return 0
  return int(np.max(np.asarray(batches["lengths"]) - np.asarray(batches["task_pos"])))


# The evaluation's key for an objective's own randomness (a masked LM's masking of the held-out
# lines): fixed, so every evaluation of a run scores the same masked positions.
EVAL_OBJECTIVE_SEED = 20240101


def make_split_evaluator(task, apply_fn: Callable, vocab, *, decode_steps: int = 0,
                         kv_cache_fns: tuple | None = None,
                         constructions: dict[str, int] | None = None,
                         objective=None) -> SplitEvaluator:
  """`make_evaluate_fn` in two parts (`SplitEvaluator`); arguments as there, and:

  constructions: {tag: index} of construction tags (`Task.constructions`) to report the task
    metric of separately: the batches then hold `construction` (int32 [batch], the line's
    index, -1 untagged), and each of the metric's sums is also computed on the lines of each
    tag, reported as `accuracy/<tag>` and `<sum>/<tag>` (divided by that tag's `total`).
  objective: the run's `objectives.Objective` (None: `lm`). `loss` is its loss on the lines as
    it lays them out (`Objective.lines`, with a fixed key, `EVAL_OBJECTIVE_SEED`: a masked LM
    masks the same positions at every evaluation; `objective_line_losses`), plus its
    `metric_names` (e.g. `masked_accuracy`); the task's metric (`accuracy`, ...) only where it
    means something for the objective (`Objective.teacher_forced_metrics`: not for a masked LM).

  Raises:
    ValueError: the objective overrides `Objective.loss` (`objective_line_losses`).
  """
  metrics = task.make_metrics(vocab)
  use_cache = task.decodes and kv_cache_fns is not None
  if objective is None:
    objective = objectives.from_config({})  # lm: the stored inputs and targets
  task_metrics = objective.teacher_forced_metrics
  token_losses = lambda logits, targets: objective_line_losses(objective, logits, targets)

  def objective_sums(params, batch):
    """(logits, targets) of the objective's own inputs and targets (`Objective.lines`)."""
    key = jax.random.key(EVAL_OBJECTIVE_SEED)
    inputs, targets = objective.lines(batch["inputs"], batch["targets"], batch["lengths"], key)
    logits = apply_fn(params, inputs)
    return logits, targets

  def forward(params, batch):
    """Teacher-forced logits, and with the cache the decoding (else None)."""
    if not use_cache:
      return apply_fn(params, batch["inputs"]), None
    apply_cached, init_cache = kv_cache_fns
    inputs = batch["inputs"]
    b, n = inputs.shape
    # The teacher-forced pass runs in decoding mode: it fills the cache of the line's prefix.
    prefilled = apply_cached(params, inputs, jnp.broadcast_to(jnp.arange(n), (b, n)),
                             init_cache(params, b, n))
    decoded = decoding.greedy_decode_cached(lambda t, p, c: apply_cached(params, t, p, c),
                                   lambda b, n: init_cache(params, b, n), inputs,
                                   batch["task_pos"], decode_steps, prefilled=prefilled)
    return prefilled[0], decoded

  def batch_sums(params, batch):
    valid = batch["valid"]
    if not task_metrics:  # the objective's loss and metrics only (a masked LM)
      logits, targets = objective_sums(params, batch)
      targets = jnp.where(valid[:, None], targets, 0)
      loss_sum, count = token_losses(logits, targets)
      scored = targets != 0
      return {"loss_sum": jnp.sum(loss_sum), "tokens": jnp.sum(count),
              "predicted": jnp.sum((jnp.argmax(logits, -1) == targets) & scored
                                   ).astype(jnp.float32)}
    logits, decoded = forward(params, batch)
    # The objective's targets (prefix_lm: the output only; lm: the stored ones).
    targets = objective.lines(batch["inputs"], batch["targets"], batch["lengths"],
                              jax.random.key(EVAL_OBJECTIVE_SEED))[1]
    loss_sum, count = token_losses(logits, targets)
    out = {"loss_sum": jnp.sum(jnp.where(valid, loss_sum, 0.0)),
           "tokens": jnp.sum(jnp.where(valid, count, 0.0))}
    if task.decodes and decoded is None:
      decoded = decoding.greedy_decode(lambda t: apply_fn(params, t), batch["inputs"],
                              batch["task_pos"], decode_steps)
    out.update(metrics(batch, logits, decoded))
    for tag, k in (constructions or {}).items():
      tagged = dict(batch, valid=batch["valid"] & (batch["construction"] == k))
      out.update({f"{name}@{tag}": value
                  for name, value in metrics(tagged, logits, decoded).items()})
    return out

  def summarize(per_batch):
    sums = jax.tree_util.tree_map(jnp.sum, per_batch)
    out = {"loss": sums["loss_sum"] / jnp.maximum(sums["tokens"], 1.0)}
    if not task_metrics:
      return out | {"masked_accuracy": sums["predicted"] / jnp.maximum(sums["tokens"], 1.0)}
    total = jnp.maximum(sums["total"], 1.0)
    out["accuracy"] = sums["correct"] / total
    for name in sums:
      if name not in ("loss_sum", "tokens", "correct", "total") and "@" not in name:
        out[name] = sums[name] / total
    for tag in constructions or {}:
      tag_total = jnp.maximum(sums[f"total@{tag}"], 1.0)
      out[f"accuracy/{tag}"] = sums[f"correct@{tag}"] / tag_total
      for name in sums:
        base, _, of = name.partition("@")
        if of == tag and base not in ("correct", "total"):
          out[f"{base}/{tag}"] = sums[name] / tag_total
    return out

  return SplitEvaluator(batch_sums=batch_sums, summarize=summarize)


def make_evaluate_fn(task, apply_fn: Callable, vocab, *, decode_steps: int = 0,
                     kv_cache_fns: tuple | None = None) -> Callable:
  """Builds `evaluate(params, batches) -> {'loss', 'accuracy', ...}` for ONE seed.

  Args:
    task: a `tasks.Task` (its `make_metrics` gives the metric).
    apply_fn: `(params, tokens [B, L]) -> logits [B, L, V]`, deterministic.
    vocab: the task's `Vocab` (for the auxiliary / closing-bracket ids and the POS table).
    decode_steps: tasks that decode (`task.decodes`, tense): tokens to decode (longest target
      incl. EOS, `decode_steps`).
    kv_cache_fns: tasks that decode: `(apply_cached, init_cache)` with `apply_cached(params,
      tokens [B, T], positions [B, T], cache) -> (logits [B, T, V], cache)` and
      `init_cache(params, batch, slots) -> cache` (`decoding.apply_cached`,
      `decoding.init_cache`): the teacher-forced pass runs through `apply_cached` and fills the
      cache of each line's prefix, then `decoding.greedy_decode_cached` decodes (the same tokens,
      far faster); None: `decoding.greedy_decode`, one full forward pass per decoded token.

  The returned function takes `batches`, a dict of arrays shaped [num_batches, batch, ...]
  (the core fields of `EncodedSplit`, the task's `eval_fields` and `valid`, see
  `pad_to_multiple`), and returns float32 scalars: `loss` = mean token cross-entropy (nats) over
  every non-padding target position of the split, `accuracy` = the task metric (module
  docstring), and each further sum of the task's metric divided by its `total`: question
  formation adds `move_first_agreement` and `skip_relative_agreement`, the fraction of `quest`
  lines whose ranked auxiliary is the one the rule fronts
  (`tasks.question.question_rule_auxiliaries`).
  """
  split = make_split_evaluator(task, apply_fn, vocab, decode_steps=decode_steps,
                               kv_cache_fns=kv_cache_fns)

  def evaluate(params, batches):
    return split.summarize(jax.lax.map(lambda b: split.batch_sums(params, b), batches))

  return evaluate


class ProgressLog:
  """Logs the progress of a long evaluation: lines done, lines/s and the time left.

  `open` logs a line before the first batch (the caller does so when the evaluation compiles or
  is known to be long). Otherwise nothing is logged for an evaluation that ends within
  `first_after_s` seconds; after that, one line per `update` (per batch) at most every `every_s`
  seconds, and a closing line.

  Args:
    total_lines: lines to evaluate (all splits; each line is evaluated for every seed).
    num_seeds: seeds evaluated at once (stated in the lines).
    first_after_s: seconds before the first line.
    every_s: least seconds between two lines.
    clock: `() -> seconds` (tests pass a fake clock).
    log_fn: `(format, *args)` logging function (default: the `sg_jax` logger at INFO).
  """

  def __init__(self, total_lines: int, num_seeds: int, *, first_after_s: float = 5.0,
               every_s: float = 15.0, clock: Callable[[], float] = time.monotonic,
               log_fn: Callable | None = None):
    self.total, self.num_seeds = int(total_lines), int(num_seeds)
    self.first_after_s, self.every_s = first_after_s, every_s
    self.clock = clock
    self.log_fn = log_fn or logging.getLogger("sg_jax").info
    self.start = clock()
    self.done = 0
    self.last_logged = None
    self.opened = False

  def open(self, what: str) -> None:
    """Logs `evaluation: {what}` before the first batch (then the closing line always comes)."""
    self.log_fn("evaluation: %s", what)
    self.opened = True

  def update(self, lines: int, what: str = "") -> None:
    """Records `lines` more lines done (`what`: e.g. the split, named in the line)."""
    self.done += int(lines)
    now = self.clock()
    elapsed = now - self.start
    if elapsed < self.first_after_s or self.done >= self.total:
      return
    if self.last_logged is not None and now - self.last_logged < self.every_s:
      return
    self.last_logged = now
    rate = self.done / max(elapsed, 1e-9)
    self.log_fn("evaluation%s: %d/%d lines x %d seeds, %.1f lines/s, %s left",
                f" ({what})" if what else "", self.done, self.total, self.num_seeds, rate,
                _duration((self.total - self.done) / max(rate, 1e-9)))

  def note(self, what: str) -> None:
    """Logs `evaluation: {what}` (a stage after the lines, such as scoring the minimal pairs)
    when this evaluation is being logged: `open` was called or it has run `first_after_s`."""
    if self.opened or self.clock() - self.start >= self.first_after_s:
      self.log_fn("evaluation: %s", what)

  def close(self) -> None:
    """Logs the closing line (total time), if the evaluation took longer than `first_after_s`
    or `open` was called."""
    elapsed = self.clock() - self.start
    if elapsed >= self.first_after_s or self.opened:
      self.log_fn("evaluation: %d lines x %d seeds in %s (%.1f lines/s)", self.done,
                  self.num_seeds, _duration(elapsed), self.done / max(elapsed, 1e-9))


@dataclasses.dataclass(frozen=True)
class EvalSchedule:
  """When the training loop evaluates (the run config's `eval.every`, `eval.dense_until`,
  `eval.dense_every`; steps).

  Attributes:
    every: evaluate every this many steps (>= 1).
    dense_until: also evaluate every `dense_every` steps up to this step (0 = off).
    dense_every: the dense interval (>= 1).
  """

  every: int
  dense_until: int = 0
  dense_every: int = 100

  @classmethod
  def from_config(cls, config) -> "EvalSchedule":
    """The schedule of a run config (its `eval` section; `dense_until` 0 when absent)."""
    e = config.eval
    return cls(every=int(e.every), dense_until=int(e.get("dense_until", 0)),
               dense_every=int(e.get("dense_every", 100)))


def is_eval_step(step: int, schedule: EvalSchedule) -> bool:
  """Whether the loop evaluates after `step`: a multiple of `schedule.every`, or, up to
  `dense_until` (0 = off), of `dense_every` (onsets happen early; docs/sas.md). The final step
  is evaluated too (the loop checks it itself)."""
  s = schedule
  return step % s.every == 0 or (0 < step <= s.dense_until and step % s.dense_every == 0)


def next_eval_step(step: int, schedule: EvalSchedule) -> int:
  """The first step after `step` that `is_eval_step` accepts."""
  s = schedule
  nxt = (step // s.every + 1) * s.every
  if step < s.dense_until:
    nxt = min(nxt, (step // s.dense_every + 1) * s.dense_every)
    nxt = nxt if nxt <= s.dense_until or nxt % s.every == 0 else (step // s.every + 1) * s.every
  return nxt


def format_duration(seconds: float) -> str:
  """'42 s', '3 min 05 s', '2 h 07 min' or '29 d 03 h' (for logs: time taken, time left)."""
  seconds = int(round(seconds))
  if seconds < 60:
    return f"{seconds} s"
  if seconds < 3600:
    return f"{seconds // 60} min {seconds % 60:02d} s"
  if seconds < 86400:
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
  return f"{seconds // 86400} d {seconds % 86400 // 3600:02d} h"


_duration = format_duration
