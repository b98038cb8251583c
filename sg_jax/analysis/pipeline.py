"""Drivers: run the analysis quantities over a whole set of sentences for every seed.

The per-batch functions in `attention_entropy` and `tree_projection` are pure, jitted and vmapped
over seeds; this module feeds them. Sentences are sorted by length and cut into batches of a fixed
number of rows, each padded to a length rounded up to a multiple of `length_multiple` (so only a
handful of shapes are ever compiled and little compute is spent on padding); short final batches
are filled with empty rows that every statistic ignores. Seeds are processed `seeds_per_call` at a
time (all at once by default) to bound memory: the tree-projection pass runs
seeds x batch x n_words sequences at once.

Also here: which lines and which part of each line the quantities read (docs/REFERENCE.md §1):

* the sentence set (`select_lines`, `SENTENCE_SETS`): 'transformed' (default) keeps only the
  transformed lines, `quest` for question formation and `PRESENT` for tense reinflection, as the
  released analysis code does with `quest` lines (Dyck has no task token: every line); 'all'
  keeps every line of the split (identity lines included);
* the model input (`entropy_inputs`, `ENTROPY_INPUTS`): 'declarative' = SOS + the declarative
  words (`declarative_words`: the source words before the task token, final "." removed), the
  released input of the attention entropies and the only input of tree projections; 'line' =
  SOS + the whole LM line (source + target).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import attention_entropy, parseval, tree_projection
from sg_jax.model import ModelConfig

PyTree = Any


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


def _seed_chunks(params_S: PyTree, seeds_per_call: int | None) -> Iterable[PyTree]:
  num_seeds = jax.tree_util.tree_leaves(params_S)[0].shape[0]
  step = num_seeds if not seeds_per_call else seeds_per_call
  for s in range(0, num_seeds, step):
    yield jax.tree_util.tree_map(lambda x: x[s:s + step], params_S)


def _sum_dicts(a, b):
  return b if a is None else {k: a[k] + b[k] for k in a}


def attention_entropy_metrics(params_S: PyTree, sentences: Sequence[Sequence[int]], *,
                              config: ModelConfig, sos_id: int, batch_size: int = 64,
                              seeds_per_call: int | None = None,
                              progress: Any = None) -> dict[str, np.ndarray]:
  """Attention entropies over a set of model inputs for every seed.

  Args:
    params_S: parameters with a leading seed axis [S, ...].
    sentences: word ids of each input without SOS (`entropy_inputs`: the declarative part, the
      released input, or the whole LM line); every quantity is computed on exactly these inputs.
    config: model config.
    sos_id: SOS id.
    batch_size: lines per batch.
    seeds_per_call: process this many seeds per compiled call (None = all).
    progress: optional callable(int) called with the number of lines finished per batch.

  Returns:
    numpy dict: 'head_entropy' [S, layers, heads], 'paper_sparsity' [S], 'reference_entropy' [S]
    (see `attention_entropy`).
  """
  batches = make_batches(sentences, sos_id=sos_id, batch_size=batch_size)
  per_chunk = []
  for params in _seed_chunks(params_S, seeds_per_call):
    total = None
    for batch in batches:
      stats = attention_entropy.attention_entropy_stats_over_seeds(
          params, jnp.asarray(batch.tokens), jnp.asarray(batch.lengths), config=config)
      total = _sum_dicts(total, stats)
      if progress is not None:
        progress(int(np.sum(batch.indices >= 0)))
    per_chunk.append(attention_entropy.finalize_stats(total))
  return {k: np.concatenate([np.asarray(c[k]) for c in per_chunk]) for k in per_chunk[0]}


def tree_projection_metrics(params_S: PyTree, sentences: Sequence[Sequence[int]], *,
                            config: ModelConfig, sos_id: int, key: jax.Array,
                            gold_trees: Sequence[Any] | None = None, batch_size: int = 16,
                            method: str = "greedy", normalisation: str = "random_split",
                            seeds_per_call: int | None = None, details: bool = False,
                            progress: Any = None) -> dict[str, Any]:
  """tscore and tparseval over a set of declarative sentences for every seed.

  Args:
    params_S: parameters with a leading seed axis [S, ...].
    sentences: word ids of each declarative part (`declarative_words`), without SOS.
    config: model config.
    sos_id: SOS id.
    key: PRNG key for the random-split normalisation (shared by all seeds; each sentence's draws
      depend only on the key and its index, so results do not depend on `batch_size`).
    gold_trees: optional nested-tuple gold trees, one per sentence (leaf count must equal the
      sentence length); enables tparseval.
    batch_size: sentences per batch (each runs n_max forward passes, vmapped over seeds).
    method, normalisation: see `tree_projection`.
    seeds_per_call: process this many seeds per compiled call (None = all).
    details: also return per-sentence 'charts' (list of [S, n, n]), 'trees_nodes' (list of
      [S, n - 1, 3]) and 'tscore_per_sentence' [S, num_sentences], in input order.
    progress: optional callable(int) called with the number of sentences finished per batch.

  Returns:
    dict: 'tscore' [S] and with gold trees 'tparseval_f1', 'tparseval_precision',
    'tparseval_recall' [S] (numpy float32), plus the details.

  Raises:
    ValueError: if a gold tree's leaf count differs from its sentence length.
  """
  if gold_trees is not None:
    if len(gold_trees) != len(sentences):
      raise ValueError(f"{len(gold_trees)} gold trees for {len(sentences)} sentences")
    gold_spans = []
    for b, tree in enumerate(gold_trees):
      n_leaves = len(parseval.tree_leaves(tree))
      if n_leaves != len(sentences[b]):
        raise ValueError(f"gold tree {b} has {n_leaves} leaves but the sentence has "
                         f"{len(sentences[b])} words")
      gold_spans.append(parseval.tree_spans(tree))
  batches = make_batches(sentences, sos_id=sos_id, batch_size=batch_size)
  per_chunk, charts, nodes, scores = [], [], [], []
  for params in _seed_chunks(params_S, seeds_per_call):
    total = None
    c_charts, c_nodes = [None] * len(sentences), [None] * len(sentences)
    c_scores = None
    for batch in batches:
      n_max = batch.tokens.shape[1] - 1
      gold = None
      if gold_trees is not None:
        gold = np.zeros((batch_size, n_max, n_max), bool)
        for row, s in enumerate(batch.indices):
          if s >= 0:
            gold[row] = parseval.span_matrix(gold_spans[s], n_max)
        gold = jnp.asarray(gold)
      stats = tree_projection.tree_projection_stats_over_seeds(
          params, jnp.asarray(batch.tokens), jnp.asarray(batch.num_words), gold, key,
          jnp.asarray(batch.indices, jnp.int32), config=config, method=method,
          normalisation=normalisation, details=details)
      if details:
        chart, nd, sc = (np.asarray(stats.pop(k)) for k in ("chart", "nodes", "tscore"))
        if c_scores is None:
          c_scores = np.zeros((sc.shape[0], len(sentences)), np.float32)
        for row, s in enumerate(batch.indices):
          if s >= 0:
            n = int(batch.num_words[row])
            c_charts[s] = chart[:, row, :n, :n]
            c_nodes[s] = nd[:, row, :max(n - 1, 0)]
            c_scores[:, s] = sc[:, row]
      total = _sum_dicts(total, stats)
      if progress is not None:
        progress(int(np.sum(batch.indices >= 0)))
    per_chunk.append(tree_projection.finalize_stats(total))
    if details:
      charts.append(c_charts)
      nodes.append(c_nodes)
      scores.append(c_scores)
  out: dict[str, Any] = {
      k: np.concatenate([np.asarray(c[k]) for c in per_chunk]) for k in per_chunk[0]}
  if details:
    out["charts"] = [np.concatenate([c[s] for c in charts]) for s in range(len(sentences))]
    out["trees_nodes"] = [np.concatenate([c[s] for c in nodes]) for s in range(len(sentences))]
    out["tscore_per_sentence"] = np.concatenate(scores)
  return out
