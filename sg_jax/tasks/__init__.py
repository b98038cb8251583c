"""Tasks of sg_jax: question formation, tense reinflection, Dyck-(20,10).

`get_task(name)` returns the task object (generation, reading, vocabulary, encoding); each
module's docstring gives its design and docs/REFERENCE.md §1 the task facts. Importing this package does not
import TensorFlow (the TFDS builders live in `sg_jax.tasks.tfds_builders`).
"""

from __future__ import annotations

from sg_jax.tasks.base import DataError, Example, declarative_tree
from sg_jax.tasks.vocab import EncodedSplit, Vocab, encode

TASK_NAMES = ("question", "tense", "dyck")


def get_task(name: str, **options):
  """The task object for `"question"`, `"tense"` or `"dyck"`.

  Args:
    name: task name.
    **options: constructor options of the task (Dyck: `max_length`, `num_types`, `max_depth`).

  Raises:
    ValueError: unknown task name (named in the message).
  """
  if name == "question":
    from sg_jax.tasks.question import QuestionTask  # pylint: disable=import-outside-toplevel
    return QuestionTask(**options)
  if name == "tense":
    from sg_jax.tasks.tense import TenseTask  # pylint: disable=import-outside-toplevel
    return TenseTask(**options)
  if name == "dyck":
    from sg_jax.tasks.dyck import DyckTask  # pylint: disable=import-outside-toplevel
    return DyckTask(**options)
  raise ValueError(f"unknown task {name!r}; expected one of {TASK_NAMES}")


__all__ = ["DataError", "EncodedSplit", "Example", "TASK_NAMES", "Vocab", "declarative_tree",
           "encode", "get_task"]
