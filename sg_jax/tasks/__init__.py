"""Tasks of sg_jax: question formation, tense reinflection, Dyck-(20,10), and any task registered.

A task is a class implementing `base.Task` (generation, reading, vocabulary, encoding, metrics,
gold trees), registered under its name with `@register_task(name)`; `get_task(name)` returns it
and `config.task` names it. Each module's docstring gives its design and docs/REFERENCE.md §1 the
task facts. Importing this package does not import TensorFlow (the TFDS builders live in
`sg_jax.tasks.tfds_builders`) nor JAX (the metrics import it when they are built).
"""

from __future__ import annotations

from sg_jax.tasks.base import REGISTRY, Task, declarative_tree, register_task
from sg_jax.tasks.examples import DataError, Example
from sg_jax.tasks.vocab import EncodedSplit, Vocab, encode

# The built-in tasks register themselves on import.
from sg_jax.tasks import question as _question  # pylint: disable=unused-import
from sg_jax.tasks import tense as _tense  # pylint: disable=unused-import
from sg_jax.tasks import dyck as _dyck  # pylint: disable=unused-import

# Names of the built-in tasks (`names()` also lists tasks registered later).
TASK_NAMES = tuple(REGISTRY)


def names() -> tuple:
  """Names of every registered task, in registration order."""
  return tuple(REGISTRY)


def task_class(name: str) -> type:
  """The registered class of task `name`.

  Raises:
    ValueError: unknown task name (named in the message, with the registered ones).
  """
  try:
    return REGISTRY[name]
  except (KeyError, TypeError):
    raise ValueError(f"unknown task {name!r}; expected one of {names()}") from None


def get_task(name: str, **options) -> Task:
  """The task object registered as `name`.

  Args:
    name: task name, e.g. `"question"`.
    **options: constructor options of the task (Dyck: `max_length`, `num_types`, `max_depth`,
      `min_distance`).

  Raises:
    ValueError: unknown task name (named in the message).
  """
  return task_class(name)(**options)


def from_config(config) -> Task:
  """The task `config.task` with the options the resolved config sets (`Task.from_config`).

  Raises:
    ValueError: unknown task name.
  """
  return task_class(config.task).from_config(config)


__all__ = ["DataError", "EncodedSplit", "Example", "REGISTRY", "TASK_NAMES", "Task", "Vocab",
           "declarative_tree", "encode", "from_config", "get_task", "names", "register_task",
           "task_class"]
