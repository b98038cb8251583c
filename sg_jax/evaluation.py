"""Task metrics of the structural-grokking study, for one seed (vmapped over seeds by callers).

Each task states its metric (`tasks.base.Task.make_metrics`) from the primitives below;
`make_split_evaluator` / `make_evaluate_fn` add the loss, the decoding and the batching.

Definitions follow the released code (Murty et al., ACL 2023, §3; `docs/REFERENCE.md`
§1 "Tasks"):

* question formation: feed the line up to and including `quest`; among the four auxiliaries
  {do, does, don't, doesn't} take the one with the highest next-token score; correct when it is the
  question's first word. Computed on `quest` lines only. Beside the accuracy, the agreement of
  the ranked auxiliary with two non-hierarchical rules (`question_rule_auxiliaries`) tells
  which rule a model that misses a gen line follows.
* tense reinflection: greedy-decode after `PAST`/`PRESENT`; correct when the decoded sentence has
  the target's part-of-speech sequence and the target's main verb.
* Dyck: at every closing bracket (optionally only those whose opening bracket is at least
  `min_distance` tokens back), the argmax over closing-bracket tokens must be the correct type.

All functions take logits from a teacher-forced pass, except `greedy_decode` and
`greedy_decode_cached`, which run the model. Arrays are per seed: `[batch, length]` etc.;
`make_evaluate_fn` batches over lines with `lax.map`, `make_split_evaluator` leaves the loop over
batches to the caller (`train.make_eval_fn`, which logs progress with `ProgressLog`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array


def token_losses(logits_BxLxV: Array, targets_BxL: Array) -> tuple[Array, Array]:
  """Per-line summed cross-entropy (nats) and number of non-padding target tokens.

  Returns:
    (loss_sum [batch] float32, count [batch] float32); padding targets (id 0) are ignored.
  """
  ce = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL)
  mask = (targets_BxL != 0).astype(jnp.float32)
  return jnp.sum(ce * mask, axis=-1), jnp.sum(mask, axis=-1)


def question_prediction(logits_BxLxV: Array, task_pos_B: Array, aux_ids: Array) -> Array:
  """The auxiliary ranked first after `quest` (int32 [batch] vocabulary ids).

  Args:
    logits_BxLxV: next-token logits of the teacher-forced line.
    task_pos_B: index t of the `quest`/`decl` token in the inputs; logits[t] predict the first
      word of the target.
    aux_ids: int32 [4] vocabulary ids of do, does, don't, doesn't.
  """
  at_task = jnp.take_along_axis(logits_BxLxV, task_pos_B[:, None, None], axis=1)[:, 0]  # [B, V]
  return aux_ids[jnp.argmax(at_task[:, aux_ids], axis=-1)]


def question_target(targets_BxL: Array, task_pos_B: Array) -> Array:
  """The question's first word (int32 [batch] ids): targets[t] at t = task_pos."""
  return jnp.take_along_axis(targets_BxL, task_pos_B[:, None], axis=1)[:, 0]


def question_rule_auxiliaries(inputs_BxL: Array, task_pos_B: Array, aux_ids: Array,
                              rel_ids: Array) -> tuple[Array, Array]:
  """Auxiliaries fronted by two non-hierarchical rules (int32 [batch] ids each; -1 if none).

  * move-first (McCoy et al. 2020, the linear rule): the first auxiliary of the declarative
    (`tasks.question.linear_question`);
  * skip-relative: the first auxiliary not directly after a relative pronoun (`that`/`who`),
    i.e. move-first that skips the auxiliary of a subject relative clause
    (`tasks.question.skip_relative_auxiliary`). It agrees with the hierarchical rule on every
    training question and fails on gen lines whose subject carries an object-extracted relative
    clause; the `grok_cpu` seeds that plateau at generalisation 0.65 follow it (README).

  Args:
    inputs_BxL: `SOS w1 .. wn quest ...` input ids.
    task_pos_B: index of the task token in the inputs (the declarative is before it).
    aux_ids: int32 [4] ids of the auxiliaries.
    rel_ids: int32 [R] ids of the relative pronouns.
  """
  length = inputs_BxL.shape[1]
  in_source = jnp.arange(length)[None, :] < task_pos_B[:, None]
  is_aux = jnp.isin(inputs_BxL, aux_ids) & in_source
  after_rel = jnp.pad(jnp.isin(inputs_BxL, rel_ids)[:, :-1], ((0, 0), (1, 0)))

  def first_of(mask):
    i = jnp.argmax(mask, axis=1)
    word = jnp.take_along_axis(inputs_BxL, i[:, None], axis=1)[:, 0]
    return jnp.where(jnp.any(mask, axis=1), word, -1)

  return first_of(is_aux), first_of(is_aux & ~after_rel)


def dyck_correct(logits_BxLxV: Array, targets_BxL: Array, close_mask_BxL: Array,
                 close_distance_BxL: Array, close_ids: Array, min_distance: int = 0
                 ) -> tuple[Array, Array]:
  """Closing-bracket prediction: (correct count [batch], scored count [batch]), float32.

  At every target position that is a closing bracket (and whose matching opening bracket is at
  least `min_distance` tokens back), the argmax over the closing-bracket ids must equal the target.
  """
  best = close_ids[jnp.argmax(logits_BxLxV[..., close_ids], axis=-1)]  # [B, L]
  scored = close_mask_BxL & (close_distance_BxL >= min_distance)
  correct = (best == targets_BxL) & scored
  return jnp.sum(correct, -1).astype(jnp.float32), jnp.sum(scored, -1).astype(jnp.float32)


def greedy_decode(apply_fn: Callable[[Array], Array], inputs_BxL: Array, task_pos_B: Array,
                  num_steps: int) -> Array:
  """Greedy continuation after the task token.

  Args:
    apply_fn: tokens [batch, length+1] -> logits [batch, length+1, vocab] (deterministic).
    inputs_BxL: teacher-forced inputs; only positions <= task_pos are used.
    task_pos_B: index of the task token in each line.
    num_steps: tokens to decode (static), e.g. the longest target incl. EOS.

  Returns:
    decoded_BxL: int32 [batch, length]; decoded[t] is the token predicted after position t, for
    t >= task_pos (aligned with `targets`); 0 before task_pos.
  """
  batch, length = inputs_BxL.shape
  positions = jnp.arange(length + 1)[None]
  buf = jnp.pad(inputs_BxL, ((0, 0), (0, 1)))
  buf = jnp.where(positions <= task_pos_B[:, None], buf, 0)
  rows = jnp.arange(batch)

  def body(k, buf):
    logits = apply_fn(buf)
    p = jnp.minimum(task_pos_B + k, length - 1)
    nxt = jnp.argmax(logits[rows, p], axis=-1).astype(buf.dtype)
    return buf.at[rows, p + 1].set(nxt)

  buf = jax.lax.fori_loop(0, num_steps, body, buf)
  decoded = buf[:, 1:]
  return jnp.where(jnp.arange(length)[None] >= task_pos_B[:, None], decoded, 0)


def greedy_decode_cached(apply_cached: Callable, init_cache: Callable, inputs_BxL: Array,
                         task_pos_B: Array, num_steps: int, prefix_length: int = 0,
                         prefilled: tuple[Array, object] | None = None) -> Array:
  """`greedy_decode` with a key/value cache: the same tokens, for far less computation.

  The prefix (positions <= task_pos, the rest zeroed as `greedy_decode` does) is fed in one call
  (or taken from `prefilled`), then one token per line and call, each line at its own position,
  so lines with different prefix lengths in one batch decode exactly the tokens
  `greedy_decode` decodes (its positions are clamped to length - 1 in the same way); the logits
  agree with the full forward pass up to float rounding (`model.TransformerLM`, `decode`).

  Args:
    apply_cached: `(tokens [batch, T], positions [batch, T], cache) -> (logits [batch, T, vocab],
      cache)` (deterministic; `model.apply_cached`).
    init_cache: `(batch, slots) -> cache`, an empty cache (`model.init_cache`).
    inputs_BxL: teacher-forced inputs; only positions <= task_pos are used.
    task_pos_B: index of the task token in each line.
    num_steps: tokens to decode (static), e.g. the longest target incl. EOS.
    prefix_length: static number of leading positions fed in the first call, > every
      task_pos (0 = length): positions past it are never read before they are decoded.
    prefilled: optional `(logits [batch, T, vocab], cache)` returned by `apply_cached` on
      tokens that equal `inputs_BxL` at every position <= task_pos, at positions 0..T-1
      (T > every task_pos) into `init_cache(batch, length)`, e.g. the teacher-forced pass on
      the whole line: it replaces the prefix call (later positions are overwritten in the
      cache before any query reads them).

  Returns:
    decoded_BxL: int32 [batch, length], as `greedy_decode`.
  """
  batch, length = inputs_BxL.shape
  prefix_length = prefix_length or length
  positions = jnp.arange(length + 1)[None]
  buf = jnp.pad(inputs_BxL, ((0, 0), (0, 1)))
  buf = jnp.where(positions <= task_pos_B[:, None], buf, 0)
  rows = jnp.arange(batch)
  if num_steps > 0:
    if prefilled is None:
      prefix_positions = jnp.broadcast_to(jnp.arange(prefix_length, dtype=jnp.int32),
                                          (batch, prefix_length))
      prefilled = apply_cached(buf[:, :prefix_length], prefix_positions,
                               init_cache(batch, length))
    logits, cache = prefilled
    p = jnp.minimum(task_pos_B, length - 1)
    buf = buf.at[rows, p + 1].set(jnp.argmax(logits[rows, p], axis=-1).astype(buf.dtype))

    def body(k, carry):
      buf, cache = carry
      p = jnp.minimum(task_pos_B + k, length - 1)
      # The token at p: decoded by the previous call, or (once p is clamped) left unchanged.
      logits, cache = apply_cached(buf[rows, p][:, None], p[:, None].astype(jnp.int32), cache)
      nxt = jnp.argmax(logits[:, 0], axis=-1).astype(buf.dtype)
      return buf.at[rows, p + 1].set(nxt), cache

    buf, _ = jax.lax.fori_loop(1, num_steps, body, (buf, cache))
  decoded = buf[:, 1:]
  return jnp.where(jnp.arange(length)[None] >= task_pos_B[:, None], decoded, 0)


def tense_correct(decoded_BxL: Array, targets_BxL: Array, task_pos_B: Array, lengths_B: Array,
                  main_verb_pos_B: Array, pos_table: Array) -> Array:
  """Tense metric per line (bool [batch]): same part-of-speech sequence and same main verb.

  The part-of-speech sequences are compared over the target half including EOS (positions
  task_pos .. length-1 of `targets`), so the decoded sentence must also end where the target ends.
  """
  span = (jnp.arange(targets_BxL.shape[1])[None] >= task_pos_B[:, None]) & (
      jnp.arange(targets_BxL.shape[1])[None] < lengths_B[:, None])
  same_pos = (pos_table[decoded_BxL] == pos_table[targets_BxL]) | ~span
  mv = jnp.maximum(main_verb_pos_B, 0)[:, None]
  same_verb = (jnp.take_along_axis(decoded_BxL, mv, 1) == jnp.take_along_axis(targets_BxL, mv, 1))
  return jnp.all(same_pos, axis=-1) & same_verb[:, 0] & (main_verb_pos_B >= 0)


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
  batches one by one (`train.make_eval_fn` logs progress between them).

  Attributes:
    batch_sums: `(params, batch) -> {name: float32 []}`, sums over the batch's valid lines
      (`batch`: one batch of the `batches` described in `make_evaluate_fn`).
    summarize: `{name: float32 [num_batches]} -> metrics`, the per-batch sums stacked.
  """

  batch_sums: Callable
  summarize: Callable


def _task(task):
  """`task`, or the registered task of that name."""
  if isinstance(task, str):
    from sg_jax import tasks  # pylint: disable=import-outside-toplevel
    return tasks.get_task(task)
  return task


def decode_steps(task, batches: dict) -> int:
  """Tokens to decode for a split: the longest target incl. EOS if `task.decodes`, else 0.

  Args:
    task: a `tasks.Task` (or its registered name).
    batches: host arrays with `lengths` and `task_pos` (any leading shape).
  """
  if not _task(task).decodes:
    return 0
  return int(np.max(np.asarray(batches["lengths"]) - np.asarray(batches["task_pos"])))


def make_split_evaluator(task, apply_fn: Callable, vocab, *, decode_steps: int = 0,
                         kv_cache_fns: tuple | None = None,
                         constructions: dict[str, int] | None = None) -> SplitEvaluator:
  """`make_evaluate_fn` in two parts (`SplitEvaluator`); arguments as there, and:

  constructions: {tag: index} of construction tags (`Task.constructions`) to report the task
    metric of separately: the batches then hold `construction` (int32 [batch], the line's
    index, -1 untagged), and each of the metric's sums is also computed on the lines of each
    tag, reported as `accuracy/<tag>` and `<sum>/<tag>` (divided by that tag's `total`).

  Raises:
    ValueError: unknown task name.
  """
  task = _task(task)
  metrics = task.make_metrics(vocab)
  use_cache = task.decodes and kv_cache_fns is not None

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
    decoded = greedy_decode_cached(lambda t, p, c: apply_cached(params, t, p, c),
                                   lambda b, n: init_cache(params, b, n), inputs,
                                   batch["task_pos"], decode_steps, prefilled=prefilled)
    return prefilled[0], decoded

  def batch_sums(params, batch):
    logits, decoded = forward(params, batch)
    valid = batch["valid"]
    loss_sum, count = token_losses(logits, batch["targets"])
    out = {"loss_sum": jnp.sum(jnp.where(valid, loss_sum, 0.0)),
           "tokens": jnp.sum(jnp.where(valid, count, 0.0))}
    if task.decodes and decoded is None:
      decoded = greedy_decode(lambda t: apply_fn(params, t), batch["inputs"],
                              batch["task_pos"], decode_steps)
    out.update(metrics(batch, logits, decoded))
    for tag, k in (constructions or {}).items():
      tagged = dict(batch, valid=batch["valid"] & (batch["construction"] == k))
      out.update({f"{name}@{tag}": value
                  for name, value in metrics(tagged, logits, decoded).items()})
    return out

  def summarize(per_batch):
    sums = jax.tree_util.tree_map(jnp.sum, per_batch)
    total = jnp.maximum(sums["total"], 1.0)
    out = {"loss": sums["loss_sum"] / jnp.maximum(sums["tokens"], 1.0),
           "accuracy": sums["correct"] / total}
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
    task: a `tasks.Task` (its `make_metrics` gives the metric), or a registered task name.
    apply_fn: `(params, tokens [B, L]) -> logits [B, L, V]`, deterministic.
    vocab: the task's `Vocab` (for the auxiliary / closing-bracket ids and the POS table).
    decode_steps: tasks that decode (`task.decodes`, tense): tokens to decode (longest target
      incl. EOS, `decode_steps`).
    kv_cache_fns: tasks that decode: `(apply_cached, init_cache)` with `apply_cached(params,
      tokens [B, T], positions [B, T], cache) -> (logits [B, T, V], cache)` and
      `init_cache(params, batch, slots) -> cache` (`model.apply_cached`, `model.init_cache`): the
      teacher-forced pass runs through `apply_cached` and fills the cache of each line's prefix,
      then `greedy_decode_cached` decodes (the same tokens, far faster); None: `greedy_decode`,
      one full forward pass per decoded token.

  The returned function takes `batches`, a dict of arrays shaped [num_batches, batch, ...]
  (the core fields of `EncodedSplit`, the task's `eval_fields` and `valid`, see
  `pad_to_multiple`), and returns float32 scalars: `loss` = mean token cross-entropy (nats) over
  every non-padding target position of the split, `accuracy` = the task metric (module
  docstring), and each further sum of the task's metric divided by its `total`: question
  formation adds `move_first_agreement` and `skip_relative_agreement`, the fraction of `quest`
  lines whose ranked auxiliary is the one the rule fronts (`question_rule_auxiliaries`).

  Raises:
    ValueError: unknown task name.
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

  def close(self) -> None:
    """Logs the closing line (total time), if the evaluation took longer than `first_after_s`
    or `open` was called."""
    elapsed = self.clock() - self.start
    if elapsed >= self.first_after_s or self.opened:
      self.log_fn("evaluation: %d lines x %d seeds in %s (%.1f lines/s)", self.done,
                  self.num_seeds, _duration(elapsed), self.done / max(elapsed, 1e-9))


def is_eval_step(step: int, config) -> bool:
  """Whether the loop evaluates after `step`: a multiple of `eval.every`, or, up to
  `eval.dense_until` (0 = off), of `eval.dense_every` (onsets happen early; docs/sas.md). The
  final step is evaluated too (the loop checks it itself)."""
  e = config.eval
  dense_until = int(e.get("dense_until", 0))
  return step % e.every == 0 or (0 < step <= dense_until and step % e.dense_every == 0)


def next_eval_step(step: int, config) -> int:
  """The first step after `step` that `is_eval_step` accepts."""
  e = config.eval
  nxt = (step // e.every + 1) * e.every
  dense_until = int(e.get("dense_until", 0))
  if step < dense_until:
    nxt = min(nxt, (step // e.dense_every + 1) * e.dense_every)
    nxt = nxt if nxt <= dense_until or nxt % e.every == 0 else (step // e.every + 1) * e.every
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
