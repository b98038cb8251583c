"""`Example`, one line of a split, and `DataError`, the error of malformed data.

Both sit below every other task module (`base`, `vocab`, `io`, the tasks), which import them
from here.
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
