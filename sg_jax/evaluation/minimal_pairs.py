"""Minimal-pair preference: one generalisation metric for every objective (issue 36).

For each transformed held-out line (`quest` / `PRESENT`) the grammar gives foils: the output a
non-hierarchical rule would give (`Task.foils`: question formation's move-first, skip-relative
and move-last questions; tense's attractor-agreeing and wrong-number main verb). The model
*prefers* the correct output over a foil when it scores it higher (strictly; a tie is not a
preference):

* `lm`, `prefix_lm`: the log-probability of the output given the input,
  `sum_{p = task_pos}^{length - 1} log P(targets[p] | inputs[:p + 1])` (the output's words and
  EOS; `conditional_log_probs`);
* `mlm`: the pseudo-log-likelihood of the output given the input (Salazar et al., ACL 2020, on
  the output's words only): each output word is masked in turn, the rest of the line visible,
  and the log-probabilities of the masked words are summed (`pseudo_log_likelihood`; one
  masked pass per word, batched). A cloze of the question's first word alone is NOT used: with
  the rest of the question visible, the missing auxiliary is the one absent from its
  declarative position, so the cloze is solved without any rule (docs/objectives.md).

Logged per split at every training evaluation by the `preference` evaluator
(`sg_jax.evaluation.preference`; `evals.preference.lines` transformed lines of each, formerly
`eval.preference_lines`, still accepted; 0 disables):
`preference` (the fraction of lines with a foil whose correct output beats every foil),
`preference_vs_<kind>` (the fraction of pairs with that foil won) and `preference/<tag>` per
construction (`Task.constructions`); a foil kind or tag the split's lines never have is not
logged, and a split without any foil logs `preference` NaN.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.runtime import sharding

Array = jax.Array

SPLITS = ("in_domain", "out_of_domain")


# --------------------------------------------------------------------------------------------
# The pairs (host)
# --------------------------------------------------------------------------------------------


def pair_lines(task, vocab, examples: Sequence, length: int | None = None) -> dict:
  """The transformed lines of `examples` with their foils, as arrays (N lines, K = 1 +
  len(task.foil_kinds) sentences each: the correct one first, then one per foil kind).

  Returns:
    {'inputs', 'targets': int32 [N, K, L] (`SOS source output` / `source output EOS`, the
    encoding of `tasks.vocab`), 'lengths': int32 [N, K], 'task_pos': int32 [N] (index of the
    task token in the inputs), 'pair_valid': bool [N, K] (False where the foil kind does not
    apply: the rule gives the correct output), 'construction': int32 [N]}.

  Raises:
    DataError: a word outside the vocabulary.
  """
  examples = [ex for ex in examples if ex.transformed]
  kinds = tuple(task.foil_kinds)
  rows = []
  for ex in examples:
    source = vocab.encode(ex.source)
    foils = task.foils(ex, vocab)
    outputs = [ex.target] + [foils.get(kind) for kind in kinds]
    rows.append((source, [None if o is None else vocab.encode(o) for o in outputs]))
  longest = max((len(s) + len(o) + 1 for s, outs in rows for o in outs if o is not None),
                default=1)
  length = length or longest
  n, k = len(rows), 1 + len(kinds)
  out = {"inputs": np.zeros((n, k, length), np.int32),
         "targets": np.zeros((n, k, length), np.int32),
         "lengths": np.zeros((n, k), np.int32), "task_pos": np.zeros(n, np.int32),
         "pair_valid": np.zeros((n, k), bool),
         "construction": task.construction_ids(examples).astype(np.int32)}
  for i, (source, outs) in enumerate(rows):
    out["task_pos"][i] = len(source)
    for j, output in enumerate(outs):
      if output is None:
        continue
      line = [vocab.sos_id] + source + output + [vocab.eos_id]
      size = min(len(line) - 1, length)
      out["inputs"][i, j, :size] = line[:size]
      out["targets"][i, j, :size] = line[1:size + 1]
      out["lengths"][i, j] = size
      out["pair_valid"][i, j] = True
  return out


def eval_batches(num_lines: int, batch_size: int, task, vocab, data_dir: str
                 ) -> dict[str, dict[str, np.ndarray]]:
  """{split: arrays [num_batches, batch, ...]} of the first `num_lines` transformed lines of
  the in-domain and out-of-domain splits (`pair_lines`, padded with invalid lines; batches of
  min(batch_size, 32) lines), or {} when `num_lines` is 0 or the task has no foils.

  Args:
    data_dir: the folder of the run's split files (`tasks.io.run_data_dir`).
  """
  num = int(num_lines)
  if num <= 0 or not task.foil_kinds:
    return {}
  out = {}
  for split, name in zip(SPLITS, (task.in_domain_split, task.out_of_domain_split)):
    examples = [ex for ex in task.read_split(data_dir, name) if ex.transformed][:num]
    if not examples:
      continue
    arrays = pair_lines(task, vocab, examples)
    batch = min(int(batch_size), 32, len(examples))
    total = -(-len(examples) // batch) * batch
    padded = {k: np.concatenate([v, np.zeros((total - len(v),) + v.shape[1:], v.dtype)])
              for k, v in arrays.items()}
    padded["valid"] = np.arange(total) < len(examples)
    out[split] = {k: v.reshape((-1, batch) + v.shape[1:])
                                for k, v in padded.items()}
  return out


# --------------------------------------------------------------------------------------------
# Scores of one seed (traced)
# --------------------------------------------------------------------------------------------


def conditional_log_probs(logits_NxLxV: Array, targets_NxL: Array, task_pos_N: Array,
                          lengths_N: Array) -> Array:
  """float32 [N]: log P(output | input) of teacher-forced lines (nats): the log-probabilities
  of `targets[p]` for task_pos <= p < length (the output's words and EOS)."""
  logp = jax.nn.log_softmax(logits_NxLxV.astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(logp, targets_NxL[..., None], axis=-1)[..., 0]
  pos = jnp.arange(targets_NxL.shape[1])[None, :]
  scored = (pos >= task_pos_N[:, None]) & (pos < lengths_N[:, None])
  return jnp.sum(jnp.where(scored, picked, 0.0), axis=-1)


def pseudo_log_likelihood(apply_fn: Callable[[Array], Array], inputs_NxL: Array,
                          task_pos_N: Array, lengths_N: Array, mask_id: int,
                          num_positions: int) -> Array:
  """float32 [N]: the pseudo-log-likelihood of each line's output words given the rest (nats):
  for o = 1..num_positions, the word at p = task_pos + o (p < length) is replaced by `mask_id`
  and log P(word | masked line) is read at p; one masked pass per o over all N lines (a
  `lax.map` over o), so the cost is num_positions forward passes of [N, L].

  Args:
    apply_fn: `tokens [N, L] -> logits [N, L, V]` (bidirectional, deterministic).
    num_positions: static; the longest output (words) of the lines.
  """
  pos = jnp.arange(inputs_NxL.shape[1])[None, :]

  def one(offset):
    p = task_pos_N + offset
    at = pos == p[:, None]
    logits = apply_fn(jnp.where(at, jnp.asarray(mask_id, inputs_NxL.dtype), inputs_NxL))
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    word = jnp.take_along_axis(logp, inputs_NxL[..., None], axis=-1)[..., 0]
    return jnp.where(p < lengths_N, jnp.sum(jnp.where(at, word, 0.0), axis=-1), 0.0)

  return jnp.sum(jax.lax.map(one, jnp.arange(1, num_positions + 1)), axis=0)


def preference_sums(scores_NxK: Array, pair_valid_NxK: Array, valid_N: Array,
                    construction_N: Array, kinds: tuple[str, ...], tags: tuple[str, ...]
                    ) -> dict[str, Array]:
  """float32 [] sums over the valid lines: `wins`/`lines` (lines with a foil whose correct
  sentence, column 0, scores strictly higher than every valid foil), `wins_<kind>`/
  `pairs_<kind>` per foil column, and `wins@<tag>`/`lines@<tag>` per construction tag (the
  tag's index in `tags` is its `construction` id)."""
  correct, foils = scores_NxK[:, :1], scores_NxK[:, 1:]
  foil_valid = pair_valid_NxK[:, 1:] & valid_N[:, None]
  has = jnp.any(foil_valid, axis=1)
  beats = jnp.all((correct > foils) | ~foil_valid, axis=1) & has
  f32 = lambda x: jnp.sum(x).astype(jnp.float32)
  out = {"wins": f32(beats), "lines": f32(has)}
  for k, kind in enumerate(kinds):
    out[f"wins_{kind}"] = f32(foil_valid[:, k] & (correct[:, 0] > foils[:, k]))
    out[f"pairs_{kind}"] = f32(foil_valid[:, k])
  for t, tag in enumerate(tags):
    at = construction_N == t
    out[f"wins@{tag}"], out[f"lines@{tag}"] = f32(beats & at), f32(has & at)
  return out


def summarize(sums: dict, kinds: tuple[str, ...], tags: tuple[str, ...]) -> dict:
  """{'preference', 'preference_vs_<kind>', 'preference/<tag>': value} of summed
  `preference_sums` (numpy, any leading seed axis; `preference` NaN where no line has a foil;
  kinds and tags without pairs left out)."""
  ratio = lambda a, b: np.where(np.asarray(b) > 0, np.asarray(a) / np.maximum(b, 1), np.nan)
  out = {"preference": ratio(sums["wins"], sums["lines"])}
  for kind in kinds:  # a kind no line of the split has (in-domain move-first) is left out
    if np.any(np.asarray(sums[f"pairs_{kind}"]) > 0):
      out[f"preference_vs_{kind}"] = ratio(sums[f"wins_{kind}"], sums[f"pairs_{kind}"])
  for tag in tags:
    if np.any(np.asarray(sums[f"lines@{tag}"]) > 0):
      out[f"preference/{tag}"] = ratio(sums[f"wins@{tag}"], sums[f"lines@{tag}"])
  return out


# --------------------------------------------------------------------------------------------
# The evaluation (seed-vmapped)
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _batch_fn(model, objective, kinds: tuple, tags: tuple, num_positions: int) -> Callable:
  """Jitted `(params [S, ...], batch) -> {sum: [S]}` of one batch of pairs (cached, so a second
  run in the process compiles nothing)."""

  def one(params, batch):
    n, k, length = batch["inputs"].shape
    flat = lambda x: x.reshape((n * k,) + x.shape[2:])
    apply_fn = lambda tokens: model.apply({"params": params}, tokens, deterministic=True)
    scores = objective.sentence_scores(apply_fn, flat(batch["inputs"]), flat(batch["targets"]),
                                       jnp.repeat(batch["task_pos"], k), flat(batch["lengths"]),
                                       num_positions)
    return preference_sums(scores.reshape(n, k), batch["pair_valid"], batch["valid"],
                           batch["construction"], kinds, tags)

  return jax.jit(jax.vmap(one, in_axes=(0, None)))


def _split_fn(model, objective, task, batches: dict) -> Callable:
  """The jitted `_batch_fn` of one split's batches (its static: the longest output)."""
  lengths, task_pos = np.asarray(batches["lengths"]), np.asarray(batches["task_pos"])
  num_positions = int(max(1, (lengths - task_pos[..., None]).max()))
  return _batch_fn(model, objective, tuple(task.foil_kinds), tuple(task.constructions),
                   num_positions)


def eval_programs(model, objective, task, splits: dict) -> list[tuple[str, Callable, tuple, int]]:
  """What `make_preference_eval(model, objective, task, splits)` compiles, for `sg_jax.aot`:
  per split, (split, its jitted function `(params [S, ...], batch) -> {sum: [S]}`, one call's
  arguments after the parameters as `jax.ShapeDtypeStruct`s, calls per evaluation)."""
  first = lambda b: jax.tree_util.tree_map(lambda x: x[0], b)
  return [(split, _split_fn(model, objective, task, batches),
           (jax.eval_shape(first, dict(batches)),), int(batches["inputs"].shape[0]))
          for split, batches in splits.items()]


def make_preference_eval(model, objective, task, splits: dict) -> Callable:
  """`params [S, ...] -> {split: {metric: [S]}}` over `splits` ({split: batches}, as
  `eval_batches` returns them); one seed-vmapped call per batch. The sentences are scored by
  `objective.sentence_scores` (`conditional_log_probs` or `pseudo_log_likelihood`)."""
  kinds, tags = tuple(task.foil_kinds), tuple(task.constructions)

  def evaluate(params):
    results = {}
    for split, batches in splits.items():
      fn = _split_fn(model, objective, task, batches)
      total = None
      for i in range(batches["inputs"].shape[0]):
        sums = fn(params, jax.tree_util.tree_map(lambda x, i=i: x[i], batches))
        total = sums if total is None else jax.tree_util.tree_map(jnp.add, total, sums)
      results[split] = summarize(sharding.to_host(total), kinds, tags)
    return results

  return evaluate
