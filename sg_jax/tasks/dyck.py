"""Dyck-(20,10): 20 bracket types, nesting depth <= 10 (docs/REFERENCE.md §1 "Tasks").

Sampler (a probabilistic automaton over the stack): at an empty stack the string ends or opens one
of the 20 types uniformly, ending having the same total weight as opening (P(end) = 1/2; the first
token always opens, so no string is empty); at full depth it must close; otherwise it closes the
top bracket with probability 1/2 or opens one of the 20 types (1/40 each). This reproduces the
released `k-20_d-10_val.txt` (mean 13 tokens; our val split: about 13) once that split's filter is
applied.

Splits (structural-grokking design):
* `train`: 200,000 sampled strings (duplicates allowed, as in the released files).
* `val` (in-distribution): sampled strings that are not in train and all of whose *stack-state
  paths* occur in train.
* `test` (out-of-distribution, "structurally unobserved"): sampled strings none of whose paths
  occurs in train.
The stack-state path of a block (the part of a string between two empty stacks) is its open/close
shape, e.g. `(a (b b) a)` -> `(())`; a string's paths are those of its blocks.

Tokens are `(x` / `x)` for types `a`, `b`, ...; files end each line with `END` (dropped on
reading).

The metric (`dyck_correct`, summed by `DyckTask.make_metrics`) is written in JAX, imported inside
those functions only (see `sg_jax.tasks.question`).
"""

from __future__ import annotations

import os
import pathlib
from typing import Optional, Sequence

import numpy as np

from sg_jax.tasks import base
from sg_jax.tasks import dependencies
from sg_jax.tasks import io as io_lib
from sg_jax.tasks import vocab as vocab_lib
from sg_jax.tasks.examples import Example

NUM_TYPES = 20
MAX_DEPTH = 10
DEFAULT_SIZES = {"train": 200_000, "val": 20_000, "test": 20_000}


def open_token(k: int) -> str:
  return "(" + chr(ord("a") + k)


def close_token(k: int) -> str:
  return chr(ord("a") + k) + ")"


def sample_ids(n: int, rng: np.random.Generator, *, num_types: int = NUM_TYPES,
               max_depth: int = MAX_DEPTH, p_end: float = 0.5) -> list:
  """Samples `n` strings from the automaton, vectorised over strings.

  Args:
    n: number of strings.
    rng: numpy Generator (deterministic given its state).
    num_types: bracket types k.
    max_depth: maximum nesting depth m.
    p_end: probability of ending at an empty stack (after the first block).

  Returns:
    list of n int8 arrays: token ids, `t` (0 <= t < k) opens type t, `k + t` closes it.
  """
  cap = 64
  out = np.zeros((n, cap), np.int8)
  lengths = np.zeros(n, np.int64)
  stack = np.zeros((n, max_depth + 1), np.int8)
  depth = np.zeros(n, np.int64)
  active = np.arange(n)
  t = 0
  while active.size:
    if t == cap:
      out = np.concatenate([out, np.zeros((n, cap), np.int8)], axis=1)
      cap *= 2
    d = depth[active]
    u = rng.random(active.size)
    k = rng.integers(num_types, size=active.size).astype(np.int8)
    at0 = d == 0
    end = at0 & (u < p_end) & (t > 0)
    opening = (at0 & ~end) | (~at0 & (d < max_depth) & (u >= 0.5))
    closing = ~at0 & ~opening
    tok = np.where(opening, k, num_types + stack[active, np.maximum(d - 1, 0)])
    live = ~end
    idx = active[live]
    out[idx, t] = tok[live]
    o, c = active[opening], active[closing]
    stack[o, depth[o]] = k[opening]
    depth[o] += 1
    depth[c] -= 1
    lengths[active[end]] = t
    active = idx
    t += 1
  return [out[i, :lengths[i]] for i in range(n)]


def paths(ids: np.ndarray, num_types: int = NUM_TYPES) -> tuple:
  """Stack-state paths of a string: the open/close shape of each block between empty stacks.

  Args:
    ids: token ids as returned by `sample_ids`.

  Returns:
    tuple of bytes, one per block (`b"\\x01\\x01\\x00\\x00"` for `(())`, 1 = open).
  """
  opening = (ids < num_types).astype(np.int8)
  depth = np.cumsum(2 * opening.astype(np.int64) - 1)
  ends = np.flatnonzero(depth == 0) + 1
  raw = opening.tobytes()
  starts = np.concatenate([[0], ends[:-1]])
  return tuple(raw[s:e] for s, e in zip(starts.tolist(), ends.tolist()))


def ids_to_tokens(ids: Sequence[int], num_types: int = NUM_TYPES) -> tuple:
  """Token strings of ids (`(a`, ..., `a)`, ...)."""
  return tuple(open_token(i) if i < num_types else close_token(i - num_types)
               for i in (int(x) for x in ids))


def generate_ids(*, seed: int = 0, sizes: Optional[dict] = None, num_types: int = NUM_TYPES,
                 max_depth: int = MAX_DEPTH, max_length: Optional[int] = None,
                 progress: bool | str = False, chunk: int = 20_000) -> dict:
  """Generates the three splits as id arrays (see the module docstring).

  Args:
    seed: generation seed.
    sizes: `{split: strings}`; missing splits default to `DEFAULT_SIZES`.
    num_types, max_depth: the Dyck language.
    max_length: if set, strings longer than this many tokens are rejected (resampled) in every
      split; default None: no limit (the automaton's own distribution; train lengths then reach
      ~1,000 tokens, 99th percentile ~350).
    progress: True: a tqdm progress bar; "log": progress lines (`base.progress_bar`).
    chunk: strings sampled per vectorised batch.

  Returns:
    `{"train"|"val"|"test": list of int8 id arrays}`.

  Raises:
    ValueError: val/test could not be filled within 1,000 batches of candidates.
  """
  sizes = {**DEFAULT_SIZES, **(sizes or {})}
  rng = np.random.default_rng(np.random.SeedSequence(seed))
  total = sum(sizes.values())
  bar = base.progress_bar(total, "dyck strings", "string", progress)
  train: list = []
  while len(train) < sizes["train"]:
    batch = sample_ids(min(chunk, sizes["train"] - len(train)), rng, num_types=num_types,
                       max_depth=max_depth)
    if max_length is not None:
      batch = [x for x in batch if len(x) <= max_length]
    train.extend(batch)
    bar.update(len(batch))
  train_strings = {x.tobytes() for x in train}
  train_paths = set()
  for x in train:
    train_paths.update(paths(x, num_types))
  val, test = [], []
  for _ in range(1000):
    if len(val) >= sizes["val"] and len(test) >= sizes["test"]:
      break
    for x in sample_ids(chunk, rng, num_types=num_types, max_depth=max_depth):
      if max_length is not None and len(x) > max_length:
        continue
      ps = paths(x, num_types)
      seen = [p in train_paths for p in ps]
      if all(seen):
        if len(val) < sizes["val"] and x.tobytes() not in train_strings:
          val.append(x)
          bar.update(1)
      elif not any(seen):
        if len(test) < sizes["test"]:
          test.append(x)
          bar.update(1)
  bar.close()
  if len(val) < sizes["val"] or len(test) < sizes["test"]:
    raise ValueError(f"could not fill val/test ({len(val)}, {len(test)}) for sizes {sizes}")
  return {"train": train, "val": val, "test": test}


@base.register_task("dyck")
class DyckTask(base.Task):
  """Dyck-(20,10) language modelling (docs/REFERENCE.md §1).

  Args:
    num_types, max_depth: the Dyck language.
    max_length: generation rejects longer strings (tokens); None: no limit.
    min_distance: the metric scores only closing brackets whose opening bracket is at least this
      many tokens back.
    bracket_arcs: offer each closing bracket -> its opening bracket as the gold dependencies
      (`gold_dependencies`, relation `bracket`; `eval.dyck_bracket_arcs`). Off by default: Dyck
      has no trees, declares no dependencies and its evaluation logs no UAS.
  """
  split_names = ("train", "val", "test")
  in_domain_split = "val"
  out_of_domain_split = "test"
  default_sizes = DEFAULT_SIZES
  eval_fields = ("close_mask", "close_distance")

  def __init__(self, num_types: int = NUM_TYPES, max_depth: int = MAX_DEPTH,
               max_length: Optional[int] = None, min_distance: int = 0,
               bracket_arcs: bool = False):
    self.has_gold_dependencies = bool(bracket_arcs)
    self.num_types = num_types
    self.max_depth = max_depth
    self.max_length = max_length
    self.min_distance = min_distance

  # This task's fields of the run config (`Task.config_fields`): `data.max_length`, the longest
  # generated string in tokens (0 = no cap; configs/dyck.py sets 100); `eval.dyck_min_distance`,
  # count only closing brackets whose opening bracket is at least this many tokens back (10 =
  # the paper's long-dependency variant); `eval.dyck_bracket_arcs`, offer closing -> opening
  # bracket arcs as gold dependencies (then UAS is logged too).
  config_fields = {"data.max_length": 0, "eval.dyck_min_distance": 0,
                   "eval.dyck_bracket_arcs": False}

  @classmethod
  def from_config(cls, config) -> "DyckTask":
    """`data.max_length` (0 = no limit), `eval.dyck_min_distance` and `eval.dyck_bracket_arcs`
    of a resolved config."""
    return cls(max_length=config.data.max_length or None,
               min_distance=int(config.eval.dyck_min_distance),
               bracket_arcs=bool(config.eval.get("dyck_bracket_arcs", False)))

  def gold_dependencies(self, example: Example) -> list:
    """With `bracket_arcs`: closing bracket -> opening bracket arcs (`dependencies.bracket_arcs`,
    input positions); see `base.Task.gold_dependencies`.

    Raises:
      ValueError: the task was made without `bracket_arcs`, or unbalanced brackets.
    """
    if not self.has_gold_dependencies:
      raise ValueError("the dyck task declares no gold dependencies; bracket arcs are an option "
                       "(--config.eval.dyck_bracket_arcs=True)")
    vocab = self.vocab()
    return dependencies.bracket_arcs(example.words, dict(zip(vocab.words, vocab.pos)))

  def vocab(self) -> vocab_lib.Vocab:
    """The 2k bracket tokens (sorted: all `(x` before all `x)`)."""
    word_pos = {open_token(k): "open" for k in range(self.num_types)}
    word_pos.update({close_token(k): "close" for k in range(self.num_types)})
    return vocab_lib.Vocab.from_word_classes(word_pos)

  def file_names(self, split: str) -> tuple:
    """(file name, None): Dyck files have no bracketed variant."""
    return f"{self.name}.{split}", None

  def generate_examples(self, *, seed: int = 0, sizes: Optional[dict] = None,
                        progress: bool | str = False) -> dict:
    """`{split: list[Example]}` (see `generate_ids`)."""
    data = generate_ids(seed=seed, sizes=sizes, num_types=self.num_types,
                        max_depth=self.max_depth, max_length=self.max_length,
                        progress=progress)
    return {s: [Example(source=ids_to_tokens(x, self.num_types)) for x in xs]
            for s, xs in data.items()}

  def generate(self, out_dir: os.PathLike | str, *, seed: int = 0,
               num_train: Optional[int] = None, progress: bool | str = False,
               sizes: Optional[dict] = None) -> dict:
    """Generates and writes `dyck.train`, `dyck.val`, `dyck.test` (+ `dyck.meta.json`).

    Returns:
      `{split: pathlib.Path}`.
    """
    import json  # pylint: disable=import-outside-toplevel
    sizes = {**self.default_sizes, **(sizes or {})}
    if num_train is not None:
      sizes["train"] = int(num_train)
    data = generate_ids(seed=seed, sizes=sizes, num_types=self.num_types,
                        max_depth=self.max_depth, max_length=self.max_length,
                        progress=progress)
    out_dir = pathlib.Path(out_dir)
    table = np.array([open_token(k) for k in range(self.num_types)] +
                     [close_token(k) for k in range(self.num_types)], dtype=object)
    paths_out = {}
    for split, xs in data.items():
      text = "".join(" ".join(table[x].tolist()) + f" {io_lib.DYCK_END}\n" for x in xs)
      paths_out[split] = io_lib.write_text_atomic(out_dir / self.file_names(split)[0], text)
    meta = {"task": self.name, "seed": seed, "sizes": sizes, "num_types": self.num_types,
            "max_depth": self.max_depth, "max_length": self.max_length}
    io_lib.write_text_atomic(out_dir / (self.name + base.META_SUFFIX), json.dumps(meta, indent=1))
    return paths_out

  def read_split(self, path_or_dir: os.PathLike | str, split: Optional[str] = None) -> list:
    """Reads `dyck.{split}` from a folder, or a file (released `k-20_d-10_val.txt` works too).

    Raises:
      DataError: missing/empty file or malformed line (file and line in the message).
    """
    path = pathlib.Path(path_or_dir)
    if path.is_dir():
      if split is None:
        raise ValueError("split is required when reading from a folder")
      path = path / self.file_names(split)[0]
    return io_lib.read_dyck_file(path, num_types=self.num_types, max_depth=self.max_depth)

  def encode_extras(self, examples: Sequence[Example], vocab: vocab_lib.Vocab,
                    split: vocab_lib.EncodedSplit) -> dict:
    """`close_mask` (bool [N, L]: `targets[t]` is a closing bracket) and `close_distance`
    (int32 [N, L]: t minus the target index of the matching opening bracket, 0 elsewhere)."""
    del examples
    close_mask = np.zeros(split.targets.shape, bool)
    close_dist = np.zeros(split.targets.shape, np.int32)
    pos = vocab.pos
    for k in range(len(split)):
      stack = []
      for t, i in enumerate(split.targets[k, :split.lengths[k] - 1].tolist()):
        p = pos[i - 1]
        if p == "open":
          stack.append(t)
        elif p == "close":
          close_mask[k, t] = True
          if stack:
            close_dist[k, t] = t - stack.pop()
    return {"close_mask": close_mask, "close_distance": close_dist}

  def make_metrics(self, vocab: vocab_lib.Vocab):
    """Closing-bracket accuracy (`dyck_correct`, with `min_distance`); see
    `base.Task.make_metrics`."""
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (module docstring)
    close_ids = jnp.asarray(
        np.flatnonzero(np.asarray(vocab.pos_table) == vocab_lib.POS_CLOSE), jnp.int32)

    def metrics(batch, logits, decoded):
      del decoded
      valid = batch["valid"]
      correct, scored = dyck_correct(logits, batch["targets"], batch["close_mask"],
                                     batch["close_distance"], close_ids, self.min_distance)
      return {"correct": jnp.sum(jnp.where(valid, correct, 0.0)),
              "total": jnp.sum(jnp.where(valid, scored, 0.0))}

    return metrics

  def gold_tree(self, example: Example):
    """Dyck strings have no gold trees.

    Raises:
      ValueError: always.
    """
    del example
    raise ValueError("the dyck task has no gold trees")

  def __repr__(self) -> str:
    return f"DyckTask(num_types={self.num_types}, max_depth={self.max_depth})"


def dyck_correct(logits_BxLxV, targets_BxL, close_mask_BxL, close_distance_BxL, close_ids,
                 min_distance: int = 0):
  """Closing-bracket prediction: (correct count [batch], scored count [batch]), float32.

  At every target position that is a closing bracket (`close_mask_BxL`) and whose matching
  opening bracket is at least `min_distance` tokens back (`close_distance_BxL`), the argmax over
  the closing-bracket ids (`close_ids`, int32 [types]) must equal the target.
  """
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (module docstring)
  best = close_ids[jnp.argmax(logits_BxLxV[..., close_ids], axis=-1)]  # [B, L]
  scored = close_mask_BxL & (close_distance_BxL >= min_distance)
  correct = (best == targets_BxL) & scored
  return jnp.sum(correct, -1).astype(jnp.float32), jnp.sum(scored, -1).astype(jnp.float32)
