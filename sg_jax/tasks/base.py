"""Shared data types of the tasks: `Example`, `DataError` and the gold-tree helper.

An `Example` is one line of a split. For question formation and tense reinflection (McCoy et al.
2020; docs/REFERENCE.md §1 "Tasks") `source` ends with the task token and `target` is the output
sentence; the language model reads the line `source + target`. For Dyck, `source` holds the
bracket tokens (the released trailing `END` dropped) and `target` is empty.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from sg_jax.tasks import trees


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
    return task.generate(data_dir, seed=seed, num_train=num_train)
  return paths
