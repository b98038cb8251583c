"""Packing word segments into rows of one shape that each start with ONE SOS (host side).

The analysis runs many short sequences that share their first token, SOS: the context-free passes
of the tree projections (`pack_start_passes`: the segment `w_i .. w_{n-1}` of each start i of
each sentence, at its original positions) and the inputs of the attention entropies. SOS sees
only itself under the causal mask, so its states are the same in every sequence: each row holds
ONE SOS followed by segments packed first fit decreasing (`first_fit_decreasing`,
`pack_segments`), and the mask "same segment, or the row's SOS" (`packed_mask`, plus the causal
mask) lets every word see exactly what it sees in `SOS + segment`. Batches of one shape for a
whole sentence set are planned by `sg_jax.analysis.pipeline`.

That sharing needs causal attention. For bidirectional and prefix models (`objectives`: mlm,
prefix_lm) SOS sees the words after it and a word's state depends on the whole span, so the
context-free passes are one segment `SOS w_i .. w_j` per span, each with its own SOS
(`pack_span_passes`, `span_mask`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


class StartPasses(NamedTuple):
  """The context-free passes of a batch of sentences packed into rows (`pack_start_passes`).

  A pytree of arrays, so it can be passed to jitted functions. P rows of R tokens; each row is
  SOS then segments `w_i .. w_{n-1}`, one per (sentence, start i), that all attend to the row's
  SOS; B sentences of at most N words.

  Attributes:
    tokens: int32 [P, R] SOS, the segments, then `<pad>`=0.
    positions: int32 [P, R] original position of each token (SOS 0, word k at k + 1; padding 0).
    segments: int32 [P, R] segment id of each word, -1 for SOS and padding; a word attends to the
      words of its own segment (causally) and to the row's SOS.
    gather: int32 [N, B, N] flat index r * R + c of the token of word k in the pass with start i
      of sentence b, at [i, b, k]; 0 where k < i, k >= n or b is a padding row.
    num_words: int32 [B] n per sentence (0 for padding rows).
  """

  tokens: Any
  positions: Any
  segments: Any
  gather: Any
  num_words: Any


def start_pass_words(num_words: int) -> np.ndarray:
  """int [n] words of the pass with start i = 0..n-1 of an n-word sentence: n - i (SOS, shared
  within a packed row, not counted); n(n + 1) / 2 in all."""
  return np.arange(num_words, 0, -1)


def first_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int
                         ) -> tuple[np.ndarray, np.ndarray, int]:
  """Packs items of the given lengths into bins of `capacity` (first fit, longest first).

  Returns:
    (bin [M] and offset [M] of every item, number of bins used); items keep their input order.

  Raises:
    ValueError: an item longer than `capacity`.
  """
  lengths = np.asarray(lengths, np.int64)
  if lengths.size and int(lengths.max()) > capacity:
    raise ValueError(f"a segment of {int(lengths.max())} tokens does not fit in rows of "
                     f"{capacity}")
  bins = np.zeros(lengths.size, np.int64)
  offsets = np.zeros(lengths.size, np.int64)
  space = np.zeros(lengths.size, np.int64)
  used = 0
  for item in np.argsort(-lengths, kind="stable"):
    m = lengths[item]
    fits = np.flatnonzero(space[:used] >= m)
    if fits.size:
      row = int(fits[0])
    else:
      row, used = used, used + 1
      space[row] = capacity
    bins[item], offsets[item] = row, capacity - space[row]
    space[row] -= m
  return bins, offsets, used


def pack_segments(segments: Sequence[tuple[Sequence[int], int]], *, sos_id: int,
                  num_rows: int, row_length: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Packs word segments into rows that each start with ONE SOS (host side, numpy).

  A segment is a run of words at consecutive positions; packed after a row's SOS with
  `first_fit_decreasing`, it can be run with the mask "same segment, or the row's SOS" (plus the
  causal mask): each word then sees exactly what it sees in `SOS + segment` at those positions.

  Args:
    segments: (word ids [m >= 1], position of the first word) per segment.
    sos_id: id of SOS (column 0 of every row, position 0).
    num_rows: P.
    row_length: R (at least the longest segment + 1).

  Returns:
    (tokens int32 [P, R] (`<pad>`=0 after the segments), positions int32 [P, R] (0 for SOS and
    padding), segment ids int32 [P, R] (index into `segments`; -1 for SOS and padding), flat
    index r * R + c of each segment's first word int64 [M]).

  Raises:
    ValueError: an empty segment, a segment longer than `row_length - 1` or more rows needed
      than `num_rows`.
  """
  lens = np.array([len(w) for w, _ in segments], np.int64)
  if np.any(lens == 0):
    raise ValueError(f"empty segment at index {int(np.argmin(lens))}")
  if lens.size and int(lens.max()) + 1 > row_length:
    raise ValueError(f"rows of {row_length} tokens cannot hold SOS and a segment of "
                     f"{int(lens.max())} words")
  bins, offsets, used = first_fit_decreasing(lens, row_length - 1)  # after the row's SOS
  if used > num_rows:
    raise ValueError(f"{len(segments)} segments of {int(lens.sum())} words need {used} rows "
                     f"of {row_length} tokens; only {num_rows} given")
  tokens = np.zeros((num_rows, row_length), np.int32)
  tokens[:, 0] = sos_id
  positions = np.zeros((num_rows, row_length), np.int32)
  seg_ids = np.full((num_rows, row_length), -1, np.int32)
  first = bins * row_length + 1 + offsets
  for index, ((words, position), m) in enumerate(zip(segments, lens)):
    row, col = divmod(int(first[index]), row_length)
    tokens[row, col:col + m] = np.asarray(words, np.int32)
    positions[row, col:col + m] = np.arange(position, position + m)
    seg_ids[row, col:col + m] = index
  return tokens, positions, seg_ids, first


def packed_mask(segments_PxR: Array) -> Array:
  """bool [P, R, R] attention mask of rows from `pack_segments`: a token sees its own segment and
  the row's SOS in column 0 (the model adds the causal mask, so SOS sees itself only, as in every
  unpacked sequence)."""
  seg = jnp.asarray(segments_PxR)
  sos_key_R = jnp.arange(seg.shape[1]) == 0
  return (seg[:, :, None] == seg[:, None, :]) | sos_key_R[None, None, :]


def _chart_sizes(sentences, max_words, batch_rows) -> tuple[np.ndarray, int, int]:
  """(sentence lengths [B], chart words N, sentence rows B) of a batch of sentences; raises
  ValueError on an empty sentence, one over `max_words`, or more sentences than `batch_rows`."""
  lens = np.array([len(s) for s in sentences], np.int64)
  if np.any(lens == 0):
    raise ValueError(f"empty sentence at index {int(np.argmin(lens))}")
  n_max = int(lens.max(initial=0)) if max_words is None else int(max_words)
  batch = len(sentences) if batch_rows is None else int(batch_rows)
  if lens.size and int(lens.max()) > n_max:
    raise ValueError(f"a sentence of {int(lens.max())} words exceeds max_words={n_max}")
  if len(sentences) > batch:
    raise ValueError(f"{len(sentences)} sentences exceed batch_rows={batch}")
  return lens, n_max, batch


def pack_start_passes(sentences: Sequence[Sequence[int]], *, sos_id: int, num_rows: int,
                      row_length: int, max_words: int | None = None,
                      batch_rows: int | None = None) -> StartPasses:
  """Packs the n context-free passes of each sentence into `num_rows` rows (host side, numpy).

  The pass with start i is the segment `w_i .. w_{n-1}` at positions i + 1 .. n after the row's
  SOS (`pack_segments`).

  Args:
    sentences: word ids of each declarative part, WITHOUT SOS (at least one word each).
    sos_id: id of SOS.
    num_rows: P, rows of the packed batch.
    row_length: R, tokens per row: SOS, then segments (at least the longest sentence + 1).
    max_words: N, words of the chart axes (default: the longest sentence).
    batch_rows: B, sentence rows (default: len(sentences)); rows past the sentences are padding.

  Returns:
    a `StartPasses` of numpy arrays (`packed_sci_chart` takes it).

  Raises:
    ValueError: an empty sentence, a sentence longer than `max_words` or than `row_length - 1`
      words, more sentences than `batch_rows`, or passes that need more than `num_rows` rows.
  """
  lens, n_max, batch = _chart_sizes(sentences, max_words, batch_rows)
  segments = [(list(words)[i:], i + 1) for words in sentences for i in range(len(words))]
  tokens, positions, seg_ids, first = pack_segments(segments, sos_id=sos_id, num_rows=num_rows,
                                                    row_length=row_length)
  gather = np.zeros((n_max, batch, n_max), np.int32)
  seg = 0
  for b, n in enumerate(lens):
    for i in range(n):
      gather[i, b, i:n] = first[seg] + np.arange(n - i)
      seg += 1
  num_words = np.zeros(batch, np.int32)
  num_words[:len(sentences)] = lens
  return StartPasses(tokens, positions, seg_ids, gather, num_words)


# --------------------------------------------------------------------------------------------
# The span passes of models that are not causal
# --------------------------------------------------------------------------------------------


class SpanPasses(NamedTuple):
  """The context-free passes of every span of a batch of sentences packed into rows, one
  segment `SOS w_i .. w_j` per span (i, j) (`pack_span_passes`), for models whose attention is
  not causal: there a token's state depends on the words after it, so no pass serves several
  spans, and SOS, which sees the span, is each segment's own.

  A pytree of arrays. P rows of R tokens; B sentences of at most N words.

  Attributes:
    tokens: int32 [P, R] the segments (each SOS then the span's words), then `<pad>`=0.
    positions: int32 [P, R] original position of each token (SOS 0, word k at k + 1; padding 0).
    segments: int32 [P, R] segment id of each token, its SOS included (a token attends to its
      own segment only), -1 for padding.
    span_segment: int32 [B, N, N] segment id of span (i, j) of sentence b; B N (N + 1) / 2 (an
      id no segment has) where the span is invalid (i > j, j >= n or a padding row).
    full_words: int32 [B, N] flat index r * R + c of word k in sentence b's whole-sentence
      segment (span (0, n - 1), whose states are the contextual ones); 0 where k >= n.
    num_words: int32 [B] n per sentence (0 for padding rows).
  """

  tokens: Any
  positions: Any
  segments: Any
  span_segment: Any
  full_words: Any
  num_words: Any


def span_pass_tokens(num_words: int) -> np.ndarray:
  """int [n (n + 1) / 2] tokens of the span passes of an n-word sentence, SOS included:
  j - i + 2 for the spans (i, j), i <= j, in the order of `np.triu_indices(n)`."""
  lo, hi = np.triu_indices(num_words)
  return hi - lo + 2


def pack_span_passes(sentences: Sequence[Sequence[int]], *, sos_id: int, num_rows: int,
                     row_length: int, max_words: int | None = None,
                     batch_rows: int | None = None) -> SpanPasses:
  """Packs the n (n + 1) / 2 span passes of each sentence into `num_rows` rows (host, numpy).

  The pass of span (i, j) is the segment `SOS w_i .. w_j` at positions 0, i + 1 .. j + 1,
  packed first fit decreasing; with the mask "same segment" (`span_mask`) each token sees
  exactly what it sees in that sequence alone.

  Args:
    sentences: word ids of each declarative part, WITHOUT SOS (at least one word each).
    sos_id: id of SOS.
    num_rows: P, rows of the packed batch.
    row_length: R, tokens per row (at least the longest sentence + 1).
    max_words: N, words of the chart axes (default: the longest sentence).
    batch_rows: B, sentence rows (default: len(sentences)); rows past the sentences are padding.

  Returns:
    a `SpanPasses` of numpy arrays (`sci_chart.span_sci_chart` takes it).

  Raises:
    ValueError: an empty sentence, a sentence longer than `max_words` or than `row_length - 1`
      words, more sentences than `batch_rows`, or passes that need more than `num_rows` rows.
  """
  lens, n_max, batch = _chart_sizes(sentences, max_words, batch_rows)
  if lens.size and int(lens.max()) + 1 > row_length:
    raise ValueError(f"rows of {row_length} tokens cannot hold SOS and a sentence of "
                     f"{int(lens.max())} words")
  spans = [(b, i, j) for b, n in enumerate(lens) for i, j in zip(*np.triu_indices(n))]
  sizes = np.array([j - i + 2 for _, i, j in spans], np.int64)
  bins, offsets, used = first_fit_decreasing(sizes, row_length)
  if used > num_rows:
    raise ValueError(f"{len(spans)} span passes of {int(sizes.sum())} tokens need {used} rows "
                     f"of {row_length} tokens; only {num_rows} given")
  tokens = np.zeros((num_rows, row_length), np.int32)
  positions = np.zeros((num_rows, row_length), np.int32)
  seg_ids = np.full((num_rows, row_length), -1, np.int32)
  span_segment = np.full((batch, n_max, n_max), batch * n_max * (n_max + 1) // 2, np.int32)
  full_words = np.zeros((batch, n_max), np.int32)
  for index, ((b, i, j), row, col) in enumerate(zip(spans, bins, offsets)):
    m = j - i + 1
    tokens[row, col] = sos_id
    tokens[row, col + 1:col + 1 + m] = np.asarray(sentences[b], np.int32)[i:j + 1]
    positions[row, col + 1:col + 1 + m] = np.arange(i + 1, j + 2)
    seg_ids[row, col:col + 1 + m] = index
    span_segment[b, i, j] = index
    if i == 0 and j == lens[b] - 1:
      full_words[b, :m] = row * row_length + col + 1 + np.arange(m)
  num_words = np.zeros(batch, np.int32)
  num_words[:len(sentences)] = lens
  return SpanPasses(tokens, positions, seg_ids, span_segment, full_words, num_words)


def span_mask(segments_PxR: Array) -> Array:
  """bool [P, R, R] attention mask of rows from `pack_span_passes`: a token sees its own
  segment (its SOS included) only; the model ANDs its own mask (bidirectional, prefix)."""
  seg = jnp.asarray(segments_PxR)
  return (seg[:, :, None] == seg[:, None, :]) & (seg >= 0)[:, None, :]
