"""The inputs of the analysis: which lines and words it reads, and the batches they go in.

Which lines and which part of each line the quantities read (docs/REFERENCE.md §1):

* the sentence set (`select_lines`, `SENTENCE_SETS`): 'transformed' (default) keeps only the
  transformed lines, `quest` for question formation and `PRESENT` for tense reinflection, as the
  released analysis code does with `quest` lines (Dyck has no task token: every line); 'all'
  keeps every line of the split (identity lines included);
* the model input (`entropy_inputs`, `ENTROPY_INPUTS`): 'declarative' = SOS + the declarative
  words (`declarative_words`: the source words before the task token, final "." removed), the
  released input of the attention entropies and the only input of tree projections; 'line' =
  SOS + the whole LM line (source + target).

`load_sentences` reads them from a run's data for `sg_jax.analyze`.

Batches (fed to the drivers `attention_entropy.attention_entropy_metrics` and
`tree_projection.tree_projection_metrics`):

* Tree projections (`make_start_pass_batches`): the n shortened context-free passes of each
  sentence (`packing.pack_start_passes`: `SOS w_i .. w_{n-1}` at the original positions, one
  SOS per row shared by its passes) are packed, first fit decreasing, into batches of a fixed
  number of rows of a fixed length, a batch taking sentences in input order while they fit (and
  later ones that fill its last rows). Every batch of a sentence set has the same shapes, so the
  whole set compiles once, and about 2-3% of the computed tokens are padding. The earlier layout
  (full-length passes under a mask, `make_batches`) is kept as a reference. Models that are not
  causal (mlm, prefix_lm) need one pass per span (`make_span_pass_batches`: segments
  `SOS w_i .. w_j`, `packing.pack_span_passes`), packed the same way into batches of one shape.
* Attention entropies (`make_packed_line_batches`): the inputs `SOS + words` are packed the same
  way, one SOS per row shared by the inputs after it (`attention_entropy`, "Layouts"), into
  batches of one shape. The earlier layout (`make_batches`: inputs sorted by length, cut into
  batches of a fixed number of rows, each padded to a length rounded up to a multiple of
  `length_multiple`) is kept as a reference.
Short final batches are filled with empty rows that every statistic ignores.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from sg_jax import tasks
from sg_jax.analysis import span_packing
from sg_jax.tasks import io as tasks_io


def declarative_words(example: Any) -> tuple[str, ...]:
  """Words of the declarative part of a line: source words before the task token, final "." removed.

  Args:
    example: a `sg_jax.tasks` Example (its `.declarative`, else `.source` and `.task_token`), or a
      plain sequence of source words (then a trailing task token must already be absent).
  """
  if hasattr(example, "declarative"):
    return tuple(example.declarative)
  if hasattr(example, "source"):
    words = tuple(example.source)
    task = getattr(example, "task_token", None)
    if task is not None and task in words:
      words = words[:len(words) - 1 - words[::-1].index(task)]
  else:
    words = tuple(example)
  if words and words[-1] == ".":
    words = words[:-1]
  return words


SENTENCE_SETS = ("transformed", "all")
ENTROPY_INPUTS = ("declarative", "line")


def select_lines(examples: Sequence[Any], sentence_set: str) -> list[Any]:
  """The lines of a split an analysis reads, in file order (module docstring).

  Args:
    examples: `sg_jax.tasks` Examples of one split.
    sentence_set: 'transformed' (lines with `transformed=True`: `quest` / `PRESENT`; every line
      when no line has a task token, as in Dyck) or 'all'.

  Returns:
    the selected Examples (the caller takes the first N).

  Raises:
    ValueError: unknown sentence set.
  """
  if sentence_set not in SENTENCE_SETS:
    raise ValueError(f"unknown sentence set {sentence_set!r}; expected one of {SENTENCE_SETS}")
  if sentence_set == "all" or all(getattr(ex, "task_token", None) is None for ex in examples):
    return list(examples)
  return [ex for ex in examples if getattr(ex, "transformed", False)]


def entropy_inputs(examples: Sequence[Any], entropy_input: str) -> list[tuple[str, ...]]:
  """Words fed (after SOS) to the attention-entropy pass, one tuple per line.

  Args:
    examples: `sg_jax.tasks` Examples.
    entropy_input: 'declarative' (`declarative_words`; lines whose declarative part is empty are
      left out) or 'line' (`example.words`, source + target).

  Raises:
    ValueError: unknown input.
  """
  if entropy_input not in ENTROPY_INPUTS:
    raise ValueError(f"unknown entropy input {entropy_input!r}; expected one of "
                     f"{ENTROPY_INPUTS}")
  if entropy_input == "line":
    return [tuple(ex.words) for ex in examples]
  return [w for w in (declarative_words(ex) for ex in examples) if w]


def load_sentences(config: Any, workdir: str, split: str, num: int, need_trees: bool, vocab, *,
                   sentence_set: str = "transformed",
                   entropy_input: str = "declarative",
                   need_dependencies: bool = False) -> dict[str, Any]:
  """The analysis inputs of the first `num` lines of the sentence set of `split`.

  Args:
    config: the run's config (task and data options).
    workdir: run directory (its data/ folder unless config.data.dir is set).
    split: split name.
    num: lines to take, the first `num` of the sentence set in file order.
    need_trees: also return the gold trees of the declarative parts.
    vocab: the run's vocabulary.
    sentence_set: `SENTENCE_SETS` ('transformed': quest / PRESENT lines only).
    entropy_input: `ENTROPY_INPUTS` ('declarative' or 'line').
    need_dependencies: also return the whole lines with their gold arcs ('dependency_lines').

  Returns:
    dict with the `registry.Inputs` fields 'entropy_inputs' (word ids of the entropy inputs,
    without SOS), 'declaratives' (word ids of the non-empty declarative parts) and 'gold_trees'
    (their gold trees, or None when not needed), 'lines' (word ids of the whole LM lines,
    source + target, without SOS), and 'label' (which lines, e.g. "`quest` lines of train").

  Raises:
    ValueError: unknown split or option, no line in the sentence set, or gold trees needed but
      the data has none.
  """
  task = tasks.from_config(config)
  if split not in task.split_names:
    raise ValueError(f"unknown split {split!r} for task {task.name}; splits: {task.split_names}")
  data_dir = tasks_io.run_data_dir(config.data, workdir)
  task.ensure_data(data_dir, seed=config.data.seed, num_train=config.data.num_train or None)
  examples = task.read_split(data_dir, split)
  selected = select_lines(examples, sentence_set)[:num]
  token = getattr(task, "transformed_token", "")
  label = (f"`{token}` lines of {split}" if sentence_set == "transformed" and token
           else f"lines of {split}")
  if not selected:
    raise ValueError(f"split {split!r} of task {task.name} has no {label.split(' of ')[0]} "
                     f"(of {len(examples)} lines); pass --sentence_set=all or another --split")
  decl_words = [w for w in (declarative_words(ex) for ex in selected) if w]
  gold = None
  if need_trees:
    try:
      gold = [task.gold_tree(ex) for ex in selected if declarative_words(ex)]
    except ValueError as e:
      raise ValueError(f"tparseval needs gold trees, but split {split!r} of task {task.name} "
                       f"has none ({e})") from None
  lines = None
  if need_dependencies:
    lines = [(vocab.encode(ex.words), task.gold_dependencies(ex)) for ex in selected]
  return {"entropy_inputs": [vocab.encode(w)
                             for w in entropy_inputs(selected, entropy_input)],
          "declaratives": [vocab.encode(w) for w in decl_words], "gold_trees": gold,
          "dependency_lines": lines, "lines": [vocab.encode(ex.words) for ex in selected],
          "label": label}


@dataclasses.dataclass(frozen=True)
class PaddedBatch:
  """One padded batch of sentences.

  Attributes:
    indices: int [B] position of each row in the caller's sentence list, -1 for padding rows.
    tokens: int32 [B, L] `SOS w_1 .. w_n` then `<pad>`=0 (padding rows: SOS then pads).
    num_words: int32 [B] n (0 for padding rows).
    lengths: int32 [B] non-padding input positions n + 1 (0 for padding rows).
  """

  indices: np.ndarray
  tokens: np.ndarray
  num_words: np.ndarray
  lengths: np.ndarray


def make_batches(sentences: Sequence[Sequence[int]], *, sos_id: int, batch_size: int,
                 length_multiple: int = 4, sort: bool = True) -> list[PaddedBatch]:
  """Sorts word-id sequences by length and cuts them into padded batches of `batch_size` rows.

  Args:
    sentences: word ids per sentence, WITHOUT SOS (at least one word each).
    sos_id: id of SOS, prepended to every row.
    batch_size: rows per batch (last batch padded with empty rows).
    length_multiple: L = n_max + 1 rounded up to a multiple of this.
    sort: group similar lengths together (results do not depend on it).

  Raises:
    ValueError: for an empty sentence or batch_size < 1.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  lens = np.array([len(s) for s in sentences], np.int64)
  if np.any(lens == 0):
    raise ValueError(f"empty sentence at index {int(np.argmin(lens))}")
  order = np.argsort(lens, kind="stable") if sort else np.arange(len(sentences))
  batches = []
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    n_max = int(lens[idx].max())
    length = -(-(n_max + 1) // length_multiple) * length_multiple
    tokens = np.zeros((batch_size, length), np.int32)
    tokens[:, 0] = sos_id
    num_words = np.zeros(batch_size, np.int32)
    indices = np.full(batch_size, -1, np.int64)
    for row, s in enumerate(idx):
      words = np.asarray(sentences[s], np.int32)
      tokens[row, 1:1 + len(words)] = words
      num_words[row] = len(words)
      indices[row] = s
    lengths = np.where(num_words > 0, num_words + 1, 0).astype(np.int32)
    batches.append(PaddedBatch(indices, tokens, num_words, lengths))
  return batches


def _plan_rows(items: Sequence[np.ndarray], batch_size: int, words_per_row: int
               ) -> tuple[list[list[int]], int]:
  """Groups sequences into batches of one shape for `packing.pack_segments`.

  Args:
    items: per sequence, the word counts of its segments.
    batch_size: sequences per batch on average (the rows hold this many sequences of the mean
      number of words).
    words_per_row: tokens a row holds besides its shared SOS (row length - 1; the row length
      when every segment brings its own SOS).

  Returns:
    (sequence indices of each batch, rows per batch).
  """
  words = np.array([int(np.sum(x)) for x in items], np.int64)
  min_rows = span_packing.first_fit_decreasing(items[int(np.argmax(words))],
                                                  words_per_row)[2]
  num_rows = max(-(-int(round(batch_size * float(np.mean(words)))) // words_per_row), min_rows)
  return _fill_batches(items, words, num_rows, words_per_row), num_rows


def _fill_batches(items, words, num_rows: int, words_per_row: int) -> list[list[int]]:
  """Sequence indices of each batch of `num_rows` rows (see `_plan_rows`)."""
  rows_of = lambda idx: span_packing.first_fit_decreasing(
      np.concatenate([items[b] for b in idx]), words_per_row)[2]
  capacity = num_rows * words_per_row
  groups, queue = [], list(range(len(items)))
  while queue:
    # first fit over sequences: a batch also takes later sequences that still fit, so that
    # batches are full whatever the order of lengths.
    current, rest, filled = [], [], 0
    for b in queue:
      if filled + words[b] <= capacity:
        current.append(b)
        filled += int(words[b])
      else:
        rest.append(b)
    # first fit decreasing may leave a little space unused: hand the last sequences back until
    # the batch fits its rows.
    while len(current) > 1 and rows_of(current) > num_rows:
      rest.insert(0, current.pop())
    groups.append(current)
    queue = sorted(rest)
  return groups


@dataclasses.dataclass(frozen=True)
class PackedLines:
  """One packed batch of model inputs for the attention entropies.

  Attributes:
    indices: int [M] positions of the sequences in the caller's list.
    tokens, positions, segments: int32 [P, R] rows of `packing.pack_segments` (segment
      id = row of `indices`).
  """

  indices: np.ndarray
  tokens: np.ndarray
  positions: np.ndarray
  segments: np.ndarray


def make_packed_line_batches(sequences: Sequence[Sequence[int]], *, sos_id: int,
                             batch_size: int, row_length: int | None = None
                             ) -> list[PackedLines]:
  """Packs model inputs `SOS + words` into batches of one shape, one SOS per row.

  Args:
    sequences: word ids per input, WITHOUT SOS (at least one word each).
    sos_id: id of SOS.
    batch_size: inputs per batch on average.
    row_length: tokens per row (default: twice the longest input + 1, rounded up to a multiple
      of 8).

  Raises:
    ValueError: an empty input, no input, batch_size < 1 or rows shorter than the longest
      input + 1.
  """
  lens = _check_lengths(sequences, batch_size)
  row_length = _row_length(lens, row_length)
  groups, num_rows = _plan_rows([np.array([n]) for n in lens], batch_size, row_length - 1)
  out = []
  for group in groups:
    tokens, positions, seg_ids, _ = span_packing.pack_segments(
        [(sequences[b], 1) for b in group], sos_id=sos_id, num_rows=num_rows,
        row_length=row_length)
    out.append(PackedLines(np.asarray(group, np.int64), tokens, positions, seg_ids))
  return out


def _check_lengths(sequences, batch_size) -> np.ndarray:
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  lens = np.array([len(s) for s in sequences], np.int64)
  if lens.size == 0:
    raise ValueError("no sentences")
  if np.any(lens == 0):
    raise ValueError(f"empty sentence at index {int(np.argmin(lens))}")
  return lens


def _row_length(lens: np.ndarray, row_length: int | None) -> int:
  n_max = int(lens.max())
  row_length = row_length or _round_up(2 * (n_max + 1), 8)
  if row_length < n_max + 1:
    raise ValueError(f"row_length {row_length} is shorter than the longest sentence + 1 "
                     f"({n_max + 1} tokens)")
  return row_length


@dataclasses.dataclass(frozen=True)
class StartPassBatch:
  """One packed batch of tree-projection passes.

  Attributes:
    indices: int [B] position of each sentence row in the caller's list, -1 for padding rows.
    passes: the packed passes (`packing.StartPasses`, numpy arrays).
  """

  indices: np.ndarray
  passes: span_packing.StartPasses


def _round_up(x: int, multiple: int) -> int:
  return -(-int(x) // multiple) * multiple


def make_start_pass_batches(sentences: Sequence[Sequence[int]], *, sos_id: int,
                            batch_size: int, row_length: int | None = None
                            ) -> list[StartPassBatch]:
  """Packs the context-free passes of a sentence set into batches of one shape (module doc).

  Args:
    sentences: word ids of each declarative part, WITHOUT SOS (at least one word each).
    sos_id: id of SOS.
    batch_size: sentences per batch on average: the batches hold the tokens of this many
      sentences of the set's mean length (n(n + 1) / 2 words for n words, plus one SOS per
      row), so a batch of longer sentences holds fewer of them.
    row_length: tokens per packed row (default: twice the longest sentence + 1, rounded up to a
      multiple of 8).

  Returns:
    the batches (sentences in input order, except that a batch also takes later sentences that
    fill its last rows); all have the same P rows of R tokens, B sentence rows and N = the
    longest sentence's words.

  Raises:
    ValueError: an empty sentence, no sentence, batch_size < 1, or rows shorter than the
      longest sentence + 1.
  """
  lens = _check_lengths(sentences, batch_size)
  n_max = int(lens.max())
  row_length = _row_length(lens, row_length)
  items = [span_packing.start_pass_words(n) for n in lens]
  groups, num_rows = _plan_rows(items, batch_size, row_length - 1)
  batch_rows = max(len(g) for g in groups)
  out = []
  for group in groups:
    passes = span_packing.pack_start_passes(
        [sentences[b] for b in group], sos_id=sos_id, num_rows=num_rows, row_length=row_length,
        max_words=n_max, batch_rows=batch_rows)
    indices = np.full(batch_rows, -1, np.int64)
    indices[:len(group)] = group
    out.append(StartPassBatch(indices, passes))
  return out


@dataclasses.dataclass(frozen=True)
class SpanPassBatch:
  """One packed batch of the span passes of the tree projections (models that are not causal).

  Attributes:
    indices: int [B] position of each sentence row in the caller's list, -1 for padding rows.
    passes: the packed passes (`packing.SpanPasses`, numpy arrays).
  """

  indices: np.ndarray
  passes: span_packing.SpanPasses


def make_span_pass_batches(sentences: Sequence[Sequence[int]], *, sos_id: int,
                           batch_size: int, row_length: int | None = None
                           ) -> list[SpanPassBatch]:
  """Packs the span passes of a sentence set into batches of one shape (`packing.SpanPasses`).

  Args and Raises: as `make_start_pass_batches`; a sentence of n words has n (n + 1) / 2
  passes of j - i + 2 tokens (`packing.span_pass_tokens`, each with its own SOS), so a batch
  holds `batch_size` sentences of the set's mean length in tokens.

  Returns:
    the batches (sentences in input order, except that a batch also takes later sentences that
    fill its last rows); all have the same P rows of R tokens, B sentence rows and N = the
    longest sentence's words.
  """
  lens = _check_lengths(sentences, batch_size)
  n_max = int(lens.max())
  row_length = _row_length(lens, row_length)
  items = [span_packing.span_pass_tokens(n) for n in lens]
  groups, num_rows = _plan_rows(items, batch_size, row_length)  # no shared SOS per row
  batch_rows = max(len(g) for g in groups)
  out = []
  for group in groups:
    passes = span_packing.pack_span_passes(
        [sentences[b] for b in group], sos_id=sos_id, num_rows=num_rows, row_length=row_length,
        max_words=n_max, batch_rows=batch_rows)
    indices = np.full(batch_rows, -1, np.int64)
    indices[:len(group)] = group
    out.append(SpanPassBatch(indices, passes))
  return out
