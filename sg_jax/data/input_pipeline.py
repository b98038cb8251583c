"""The data a run reads: the task's encoded splits, the training arrays and the evaluation batches.

`load_data` generates (if needed), reads, checks and encodes the task's splits; `make_train_data`
turns the training split into the host arrays the compiled step reads (and the packing buckets);
`prepare_eval_batches` lays out the held-out splits in evaluation batches (evaluated by
`evaluator.make_eval_fn`). The split files live in `tasks.io.run_data_dir(options, workdir)`.
They read a `DataOptions`, the typed form of the run config's data fields, built once at the top
of a run (`DataOptions.from_config`).
"""

from __future__ import annotations

import dataclasses
import logging
import os

import ml_collections
import numpy as np

from sg_jax import tasks
from sg_jax.data import composition
from sg_jax.data.packing import BatchLayout, packing_capacities
from sg_jax.evaluation import scoring as evaluation
from sg_jax.tasks import io as tasks_io

log = logging.getLogger("sg_jax")


@dataclasses.dataclass(frozen=True)
class DataOptions:
  """What the data of a run reads of its config.

  Attributes:
    task: the run's task with its options (`tasks.from_config`).
    dir: the folder of the split files ('' = generate them into WORKDIR/data); `data.dir`.
    seed: the data generator's seed (`data.seed`; also that of the disambiguating lines).
    num_train: generated training lines (0 = the task's default); `data.num_train`.
    mixes: each seed's data composition, S `composition.Mix` (S = `num_seeds`).
    first_seed: the id of the first seed (for messages).
    layout: the training batches' layout (`packing.BatchLayout`).
    eval_max_lines: lines evaluated per held-out split (0 = all); `eval.max_lines`.
  """

  task: tasks.Task
  dir: str
  seed: int
  num_train: int
  mixes: tuple[composition.Mix, ...]
  first_seed: int
  layout: BatchLayout
  eval_max_lines: int

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "DataOptions":
    """The data options of a resolved run config.

    Raises:
      ValueError: unknown task, or a bad composition field (`composition.mixes_from_config`).
    """
    return cls(task=tasks.from_config(config), dir=str(config.data.dir),
               seed=int(config.data.seed), num_train=int(config.data.num_train),
               mixes=composition.mixes_from_config(config), first_seed=int(config.first_seed),
               layout=BatchLayout.from_config(config), eval_max_lines=int(config.eval.max_lines))

  def data_dir(self, workdir: str) -> str:
    """The folder of the run's split files (`tasks.io.run_data_dir`)."""
    return tasks_io.run_data_dir(self, workdir)

  def training_examples(self, workdir: str) -> list:
    """The examples of the training set on device, row for row
    (`composition.training_examples`)."""
    return composition.training_examples(self.mixes, self.seed, self.task,
                                         self.data_dir(workdir))


def make_train_data(options: DataOptions, split, seeds_per_device: int
                    ) -> tuple[dict, tuple[int, ...] | None]:
  """Host arrays of the training split and the packing buckets (None when packing is off).

  Args:
    options: the run's data options (its layout; with composition its mixes).
    split: the training `EncodedSplit` (`load_data`).
    seeds_per_device: seeds that share one packing bucket per step (those of one device when
      `make_train_fns` gets the mesh; all seeds otherwise).

  Returns:
    ({'inputs', 'targets': int32 [N, L], 'lengths': int32 [N]}, capacities); with per-seed data
    composition (`composition`, the split then carries the line facts `load_data` added) the
    dict also holds 'pools' [S, P] and 'pool_sizes' [S] (`composition.pools_array`).

  Raises:
    ValueError: a seed's pool has fewer lines than `train.batch_size`.
  """
  data = {"inputs": np.asarray(split.inputs, np.int32),
          "targets": np.asarray(split.targets, np.int32),
          "lengths": np.asarray(split.lengths, np.int32)}
  if "disambiguating" in split.extras:
    data.update(seed_pools(options, split))
  capacities = None
  layout = options.layout
  if layout.packing:
    capacities = packing_capacities(data["lengths"], layout.batch_size, seeds_per_device,
                                    data["inputs"].shape[1], layout.packing_buckets)
  return data, capacities


def seed_pools(options: DataOptions, split) -> dict[str, np.ndarray]:
  """Each seed's training lines (`composition.pool`) from the line facts of `split`, logged as a
  summary per distinct mix.

  Raises:
    ValueError: a pool smaller than one batch.
  """
  constructions = options.task.constructions
  extras = split.extras
  facts = composition.LineFacts(
      identity=extras["identity"], construction=extras["subject"], shape=extras["shape"],
      shapes=(), num_split=int(np.sum(~extras["disambiguating"])))
  mixes, batch_size = options.mixes, options.layout.batch_size
  pools = [composition.pool(m, facts, constructions) for m in mixes]
  for k, p in enumerate(pools):
    if len(p) < batch_size:
      raise ValueError(f"invalid config: the data mix of seed {options.first_seed + k} keeps "
                       f"{len(p)} training lines, fewer than train.batch_size ({batch_size})")
  for line in composition.summary(mixes, pools, facts, constructions, options.first_seed):
    log.info("%s", line)
  return composition.pools_array(pools)


def _add_composition(options: DataOptions, data_dir: str, examples: list
                     ) -> tuple[list, dict]:
  """(training lines + the disambiguating lines, their facts as per-line arrays) of a run with
  per-seed data composition (`composition`)."""
  task = options.task
  extra = composition.extra_training_examples(options.mixes, options.seed, task, data_dir)
  if extra:
    log.info("data composition: %d disambiguating lines (transformed, relative clause on the "
             "subject) drawn outside the %s splits", len(extra),
             "/".join(s for s in task.split_names if s != "train"))
  facts = composition.line_facts(task, examples, extra)
  return examples + extra, {"identity": facts.identity, "subject": facts.construction,
                            "shape": facts.shape,
                            "disambiguating": np.arange(len(examples) + len(extra))
                            >= facts.num_split}


def load_data(options: DataOptions, workdir: str):
  """Generates (if needed) and encodes the task's splits.

  The task is `options.task`. Splits are read with `task.read_split` (question
  and tense: the bracketed files `question_bracket.train`, ..., that hold the trees, each checked
  against its plain twin `question.train` when both exist); the files read are logged.

  Returns:
    (task, vocab, {'train': EncodedSplit, 'in_domain': ..., 'out_of_domain': ...}).

  Raises:
    DataError: a malformed line, a plain file that differs from its bracketed twin, or a word
      outside the vocabulary (file and line in the message).
    ValueError: the batch is larger than the training split.
  """
  task = options.task
  data_dir = options.data_dir(workdir)
  task.ensure_data(data_dir, seed=options.seed, num_train=options.num_train or None)
  vocab = task.vocab()
  splits = {}
  for name, split in (("train", "train"), ("in_domain", task.in_domain_split),
                      ("out_of_domain", task.out_of_domain_split)):
    examples = task.read_split(data_dir, split)
    path = _split_file(data_dir, task, split)
    plain = os.path.join(data_dir, task.file_names(split)[0])
    checked = f" (checked against {plain})" if path != plain and os.path.exists(plain) else ""
    log.info("%s data: %d lines from %s%s", name, len(examples), path, checked)
    check_vocabulary(examples, vocab, path, task.name)
    facts = {}
    if name == "train" and composition.active(options.mixes):
      examples, facts = _add_composition(options, data_dir, examples)
    splits[name] = task.encode(examples, vocab)
    splits[name].extras.update(facts)
    if name != "train" and task.constructions:
      splits[name].extras["construction"] = construction_ids(task, examples,
                                                             options.eval_max_lines)
  batch_size = options.layout.batch_size
  if len(splits["train"]) < batch_size:
    raise ValueError(f"invalid config: train.batch_size ({batch_size}) exceeds the "
                     f"number of training lines ({len(splits['train'])})")
  return task, vocab, splits


def construction_ids(task, examples, max_lines: int = 0) -> np.ndarray:
  """int32 [N] construction tag of each line (`task.construction_ids`) for the first `max_lines`
  lines (0 = all; the evaluation reads no more), -1 for the rest."""
  n = len(examples) if not max_lines else min(max_lines, len(examples))
  ids = np.full(len(examples), -1, np.int32)
  ids[:n] = task.construction_ids(examples[:n])
  return ids


def _split_file(data_dir: str, task, split: str) -> str:
  """The file `task.read_split(data_dir, split)` returns the lines of: the bracketed variant
  when present (the plain one is then only checked against it), else the plain file."""
  names = [n for n in task.file_names(split) if n]
  for n in reversed(names):
    if os.path.exists(os.path.join(data_dir, n)):
      return os.path.join(data_dir, n)
  return os.path.join(data_dir, names[0])


def check_vocabulary(examples, vocab, path: str, task_name: str) -> None:
  """Raises DataError naming file, line and word if a line uses a word the model does not know."""
  known = set(vocab.words)
  for line, ex in enumerate(examples, start=1):
    for word in tuple(ex.source) + tuple(ex.target):
      if word not in known:
        raise tasks.DataError(path, line, f"word {word!r} is not in the {task_name} vocabulary "
                              f"({len(known)} words)")


# Fields every evaluation batch holds; a task adds its `eval_fields`.
CORE_EVAL_FIELDS = ("inputs", "targets", "lengths", "task_pos")


def prepare_eval_batches(split, batch_size: int, max_lines: int,
                         extra_fields: tuple | None = None) -> dict:
  """Host arrays [num_batches, batch, ...] of an encoded split (first `max_lines` lines).

  Args:
    split: an `EncodedSplit`.
    batch_size: lines per batch (the last batch is padded, `valid` False on padding lines).
    max_lines: lines taken from the start of the split (0 = all).
    extra_fields: the `split.extras` fields to include (the task's `eval_fields`, plus the
      `construction` tags when the split has them); None: all.
  """
  n = len(split) if not max_lines else min(max_lines, len(split))
  extras = tuple(split.extras) if extra_fields is None else tuple(extra_fields)
  if "construction" in split.extras and "construction" not in extras:
    extras += ("construction",)
  arrays = {f: np.asarray(getattr(split, f))[:n] for f in CORE_EVAL_FIELDS + extras}
  batch_size = min(batch_size, n)
  arrays, _ = evaluation.pad_to_multiple(arrays, batch_size)
  return {k: v.reshape((-1, batch_size) + v.shape[1:]) for k, v in arrays.items()}
