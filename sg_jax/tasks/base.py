"""What a task is: the `Task` protocol, the task registry, `Example`, `DataError`, gold trees.

A task is one module that defines a class implementing `Task` (generation, reading, vocabulary,
encoding, evaluation metrics, gold trees) and registers it with `@register_task(name)`; the
config file `configs/<name>.py` selects it with `config.task = name` (docs/tasks.md).

An `Example` is one line of a split. For question formation and tense reinflection (McCoy et al.
2020; docs/REFERENCE.md §1 "Tasks") `source` ends with the task token and `target` is the output
sentence; the language model reads the line `source + target`. For Dyck, `source` holds the
bracket tokens (the released trailing `END` dropped) and `target` is empty.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable, ClassVar, Optional, Protocol, Sequence

import numpy as np
import tqdm

from sg_jax.tasks import trees

log = logging.getLogger("sg_jax")
# Least seconds between two progress lines of a generation logged with progress="log".
LOG_PROGRESS_EVERY_S = 15.0


class DataError(ValueError):
  """Malformed data. `str(err)` is `"<file>:<line>: <reason>"` when the file/line are known.

  Attributes:
    file: path (or name) of the offending file, or None.
    line: 1-based line number, or None.
    reason: what is wrong.
  """

  def __init__(self, file: Optional[os.PathLike | str], line: Optional[int], reason: str):
    self.file = None if file is None else str(file)
    self.line = line
    self.reason = reason
    where = ""
    if self.file is not None:
      where = f"{self.file}:{line}: " if line is not None else f"{self.file}: "
    elif line is not None:
      where = f"line {line}: "
    super().__init__(where + reason)


@dataclasses.dataclass(frozen=True)
class Example:
  """One line of a split.

  Attributes:
    source: words of the source side; question/tense: ends with the task token; Dyck: bracket
      tokens without `END`.
    target: words of the target side (empty for Dyck).
    source_tree: tree over `source` minus the task token (the `[ S . ]` tree of the released
      bracket files), or None when unknown.
    target_tree: tree over all of `target` (root = `(S', final punctuation)`; the released files
      write it without its outermost bracket), or None.
    task_token: `decl`/`quest`/`PAST`/`PRESENT`, or None (Dyck).
    transformed: True for `quest`/`PRESENT` lines.
  """
  source: tuple
  target: tuple = ()
  source_tree: Optional[trees.Tree] = None
  target_tree: Optional[trees.Tree] = None
  task_token: Optional[str] = None
  transformed: bool = False

  @property
  def words(self) -> tuple:
    """The language-model line: `source + target`."""
    return self.source + self.target

  @property
  def declarative(self) -> tuple:
    """Words before the task token with the final `.` removed (the tree-projection input)."""
    words = self.source[:-1] if self.task_token is not None else self.source
    return words[:-1] if words and words[-1] == "." else words


def declarative_tree(example: Example) -> trees.Tree:
  """Gold binarised tree over `example.declarative` for tree projections (docs/REFERENCE.md §1).

  The source tree `[ S . ]` without the final `.`, binarised right-branching (the McCoy trees
  are already binary, so this is the `S` subtree).

  Raises:
    ValueError: the example has no source tree.
  """
  if example.source_tree is None:
    raise ValueError("example has no source tree (read the *_bracket files or generate data)")
  tree = example.source_tree
  words = example.declarative
  if trees.leaves(tree)[-1:] == (".",) and len(trees.leaves(tree)) == len(words) + 1:
    tree = tree[0] if (isinstance(tree, tuple) and len(tree) == 2 and tree[1] == ".") else \
        trees.strip_leaves(tree, {"."})
  return trees.binarize(tree)


META_SUFFIX = ".meta.json"

# Name -> task class, filled by `register_task`.
REGISTRY: dict[str, type] = {}


def register_task(name: str) -> Callable[[type], type]:
  """Class decorator: makes the task class available as `get_task(name)` and `config.task`.

  Sets `cls.name = name`. Registering a class again under its name (e.g. a module imported
  twice) replaces the entry.

  Raises:
    ValueError: `name` is already taken by a class defined elsewhere.
  """

  def register(cls: type) -> type:
    old = REGISTRY.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__,
                                                                   cls.__qualname__):
      raise ValueError(f"task name {name!r} is already registered by "
                       f"{old.__module__}.{old.__qualname__}")
    cls.name = name
    REGISTRY[name] = cls
    return cls

  return register


class Task(Protocol):
  """Everything the training loop, the evaluation and the analysis ask of a task.

  Task classes subclass `Task` explicitly: they inherit the defaults below (`from_config`,
  `ensure_data`, `encode`, `gold_tree`) and implement the rest.

  Attributes:
    name: registry name (= `config.task`), set by `register_task`.
    split_names: the splits `generate` writes, e.g. `("train", "dev", "test", "gen")`.
    in_domain_split: split evaluated as `in_domain` (e.g. `dev`).
    out_of_domain_split: split evaluated as `out_of_domain` (e.g. `gen`).
    default_sizes: `{split: lines}` generated by default.
    eval_fields: `EncodedSplit.extras` fields the metrics read (beside the core fields).
    decodes: True if the metrics read a greedy continuation after the task token (`decoded`
      of `make_metrics`; the evaluation then decodes, with the key/value cache when enabled).
    has_gold_trees: True if `gold_tree` gives a tree (tree projections, tparseval).
    has_gold_dependencies: True if `gold_dependencies` gives arcs (UAS of attention, docs/sas.md);
      False: the task declares none and nothing reads them.
    constructions: the construction tags `construction_ids` can give a line (the evaluation logs
      each split's metrics per tag, `<split>/accuracy/<tag>`); () = none.
  """
  name: ClassVar[str]
  split_names: ClassVar[tuple]
  in_domain_split: ClassVar[str]
  out_of_domain_split: ClassVar[str]
  default_sizes: ClassVar[dict]
  eval_fields: ClassVar[tuple] = ()
  decodes: ClassVar[bool] = False
  has_gold_trees: ClassVar[bool] = False
  has_gold_dependencies: ClassVar[bool] = False
  constructions: ClassVar[tuple] = ()

  @classmethod
  def from_config(cls, config) -> "Task":
    """The task a resolved config trains on (default: no options)."""
    del config
    return cls()

  def vocab(self):
    """The `vocab.Vocab` of the task, independent of any data."""
    ...

  def file_names(self, split: str) -> tuple:
    """(plain file name, bracketed file name or None) of a split."""
    ...

  def generate_examples(self, *, seed: int = 0, sizes: Optional[dict] = None,
                        progress: bool | str = False) -> dict:
    """`{split: list[Example]}`, a deterministic function of `seed` (`progress`: see
    `progress_bar`)."""
    ...

  def generate(self, out_dir: os.PathLike | str, *, seed: int = 0,
               num_train: Optional[int] = None, progress: bool | str = False,
               sizes: Optional[dict] = None) -> dict:
    """Writes every split (and `{name}.meta.json`) to `out_dir`; returns `{split: path}`.

    `progress`: see `progress_bar` (training passes "log").
    """
    ...

  def ensure_data(self, data_dir: os.PathLike | str, *, seed: int = 0,
                  num_train: Optional[int] = None) -> dict:
    """The split files in `data_dir`, generated unless present (`ensure_generated`)."""
    return ensure_generated(self, data_dir, seed=seed, num_train=num_train)

  def read_split(self, path_or_dir: os.PathLike | str, split: Optional[str] = None) -> list:
    """The `Example`s of a split file (or of `split` in a folder).

    Raises:
      DataError: missing, empty or malformed file (file and line in the message).
    """
    ...

  def encode_extras(self, examples: Sequence[Example], vocab, split) -> dict:
    """`{field: array [N, ...]}` the task adds to an encoded split (default: none).

    Args:
      examples: the N lines.
      vocab: the task's vocabulary.
      split: the `EncodedSplit` of the core fields (its padded length L = inputs.shape[1]).
    """
    del examples, vocab, split
    return {}

  def encode(self, examples: Sequence[Example], vocab, max_len: Optional[int] = None,
             **kwargs):
    """`vocab.encode` of the lines plus `encode_extras` (an `EncodedSplit`)."""
    from sg_jax.tasks import vocab as vocab_lib  # pylint: disable=import-outside-toplevel
    split = vocab_lib.encode(examples, vocab, max_len, **kwargs)
    split.extras.update(self.encode_extras(examples, vocab, split))
    return split

  def make_metrics(self, vocab) -> Callable[[dict, Any, Any], dict]:
    """The task metric of one batch, for ONE seed (traced inside the seed-vmapped evaluation).

    Returns:
      `metrics(batch, logits, decoded) -> {name: float32 []}`: `batch` holds the core fields,
      `eval_fields` and `valid` (bool [batch], padding lines False), each [batch, ...];
      `logits` [batch, length, vocab] are teacher-forced; `decoded` int32 [batch, length] is
      the greedy continuation (`evaluation.greedy_decode`) when `decodes`, else None. The result
      holds `correct` and `total` (sums over the valid lines; accuracy = correct / total) and
      optionally further sums, each reported divided by `total`.
    """
    ...

  def construction_ids(self, examples: Sequence[Example]) -> np.ndarray:
    """int32 [N]: each line's index into `constructions` (-1: no tag; the default for all).

    Raises:
      DataError / ValueError: a line the task cannot analyse (e.g. a sentence that does not
        parse with the task's grammar).
    """
    return np.full(len(examples), -1, np.int32)

  def gold_tree(self, example: Example):
    """Gold binarised tree over `example.declarative` (default: `declarative_tree`).

    Raises:
      ValueError: the example has no tree.
    """
    return declarative_tree(example)

  def gold_dependencies(self, example: Example) -> list:
    """Gold dependency arcs of a whole line (`sg_jax.tasks.dependencies`; Chen et al. 2024,
    docs/REFERENCE.md §3).

    Returns:
      sorted `[(dependent, head, relation)]` in input positions of the encoded line (SOS at 0,
      word k of `example.words` at k + 1); relations from `dependencies.RELATIONS`.

    Raises:
      ValueError: the task has no gold dependencies (`has_gold_dependencies` False, the default).
    """
    raise ValueError(f"task {getattr(self, 'name', type(self).__name__)!r} has no gold "
                     "dependencies")


def ensure_generated(task, data_dir: os.PathLike | str, *, seed: int = 0,
                     num_train: Optional[int] = None) -> dict:
  """Shared `Task.ensure_data`: the plain split files in `data_dir`, generated unless present.

  Files are (re)generated when a split file is missing, or when the folder holds a
  `{task.name}.meta.json` written by `task.generate` with another seed or train size. Files
  without a meta record (e.g. released files copied in) are used as they are.

  Returns:
    `{split: pathlib.Path}`.
  """
  import json  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel
  data_dir = pathlib.Path(data_dir)
  paths = {s: data_dir / task.file_names(s)[0] for s in task.split_names}
  meta_path = data_dir / (task.name + META_SUFFIX)
  regenerate = not all(p.exists() for p in paths.values())
  if not regenerate and meta_path.exists():
    meta = json.loads(meta_path.read_text())
    want_train = task.default_sizes["train"] if num_train is None else int(num_train)
    regenerate = meta.get("seed") != seed or meta.get("sizes", {}).get("train") != want_train
  if regenerate:
    sizes = dict(task.default_sizes)
    if num_train is not None:
      sizes["train"] = int(num_train)
    # Generation takes minutes at the default sizes (about 1 min for 121k tense lines on a
    # 2-core CPU, then as long again to read them back): say what is being done.
    log.info("generating %s data (seed %d) into %s: %s lines", task.name, seed, data_dir,
             ", ".join(f"{split} {n:,}" for split, n in sizes.items()))
    start = time.monotonic()
    paths = task.generate(data_dir, seed=seed, num_train=num_train, progress="log")
    log.info("generated %s data in %.0f s", task.name, time.monotonic() - start)
  return paths


class _LogLines:
  """A file for tqdm that logs each status it writes as one line (no carriage returns)."""

  def __init__(self, log_fn: Callable[[str], None]):
    self.log_fn = log_fn

  def write(self, text: str) -> None:
    text = text.strip("\r\n ")
    if text:
      self.log_fn(text)

  def flush(self) -> None:
    pass


def progress_bar(total: int, desc: str, unit: str, progress: bool | str) -> tqdm.tqdm:
  """The tqdm bar of a generation.

  Args:
    total: items to generate.
    desc, unit: tqdm's label and unit (e.g. "tense lines", "line").
    progress: False: none; True: a bar on stderr (refreshed every 0.5 s); "log": lines on the
      `sg_jax` logger at most every `LOG_PROGRESS_EVERY_S` seconds (items done, rate, time
      left; none for a generation that ends sooner), for runs whose output goes to a log file.

  Raises:
    ValueError: another value of `progress`.
  """
  if progress == "log":
    return tqdm.tqdm(total=total, desc=desc, unit=unit, file=_LogLines(log.info),
                     # miniters=1: the time is checked on every update, so tqdm's monitor
                     # thread never forces a second line at the same moment.
                     mininterval=LOG_PROGRESS_EVERY_S, miniters=1, delay=LOG_PROGRESS_EVERY_S,
                     bar_format="{desc}: {n_fmt}/{total_fmt} {unit}s, {rate_fmt}, "
                                "{elapsed} elapsed, {remaining} left")
  if progress not in (True, False):
    raise ValueError(f"progress must be True, False or 'log', got {progress!r}")
  return tqdm.tqdm(total=total, desc=desc, unit=unit, disable=not progress, mininterval=0.5)
