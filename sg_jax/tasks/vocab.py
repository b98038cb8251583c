"""Vocabulary and encoding of lines into padded int32 arrays for the language model.

Ids follow the reference TransformerLM (docs/REFERENCE.md §1 "Model", "Vocabulary"): `<pad>`=0, the
sorted word types 1..n, then EOS=n+1 and SOS=n+2 (question formation: 68 word types, size 71).
A line `w1 … wn` becomes inputs `SOS w1 … wn` and targets `w1 … wn EOS`, padded with 0.
`EncodedSplit` also carries the task-token position of each line and, in `extras`, the per-line
fields a task's metrics need (declared by the task: `Task.encode_extras`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Optional, Sequence

import numpy as np

from sg_jax.tasks.examples import DataError, Example

PAD = "<pad>"
EOS = "<eos>"
SOS = "<sos>"

# Coarse part-of-speech classes (values of `Vocab.pos_table`); the tense metric compares them.
POS_CLASSES = ("special", "Det", "N", "V", "Aux", "Prep", "Rel", "punct", "task", "open", "close")
POS_SPECIAL, POS_DET, POS_N, POS_V, POS_AUX, POS_PREP, POS_REL, POS_PUNCT, POS_TASK, POS_OPEN, \
    POS_CLOSE = range(len(POS_CLASSES))


@dataclasses.dataclass(frozen=True)
class Vocab:
  """Word <-> id mapping.

  Attributes:
    words: the word types, sorted (ids 1..len(words)).
    pos: coarse class name (one of `POS_CLASSES`) of each word, parallel to `words`.
  """
  words: tuple
  pos: tuple

  def __post_init__(self):
    if list(self.words) != sorted(set(self.words)):
      raise ValueError("vocabulary words must be sorted and unique")
    if len(self.pos) != len(self.words):
      raise ValueError("pos must be parallel to words")
    bad = [p for p in self.pos if p not in POS_CLASSES]
    if bad:
      raise ValueError(f"unknown POS classes {sorted(set(bad))}")
    object.__setattr__(self, "_index", {w: i for i, w in enumerate(self.words, start=1)})

  @classmethod
  def from_word_classes(cls, word_pos: dict) -> "Vocab":
    """Builds a vocabulary from `{word: pos class}` (sorted by word)."""
    words = tuple(sorted(word_pos))
    return cls(words=words, pos=tuple(word_pos[w] for w in words))

  @property
  def size(self) -> int:
    """Number of ids (embedding rows): n words + pad + EOS + SOS."""
    return len(self.words) + 3

  @property
  def pad_id(self) -> int:
    return 0

  @property
  def eos_id(self) -> int:
    return len(self.words) + 1

  @property
  def sos_id(self) -> int:
    return len(self.words) + 2

  def id_of(self, word: str) -> int:
    """Id of one word. Raises DataError naming the word if unknown."""
    try:
      return self._index[word]
    except KeyError:
      raise DataError(None, None, f"word {word!r} is not in the vocabulary") from None

  def encode(self, tokens: Iterable[str]) -> list:
    """Ids of `tokens` (no SOS/EOS added). Raises DataError naming an unknown word."""
    return [self.id_of(t) for t in tokens]

  def decode(self, ids: Iterable[int]) -> list:
    """Tokens of `ids`; pad/EOS/SOS decode to `<pad>`/`<eos>`/`<sos>`.

    Raises:
      ValueError: an id outside [0, size).
    """
    out = []
    for i in ids:
      i = int(i)
      if i == 0:
        out.append(PAD)
      elif 1 <= i <= len(self.words):
        out.append(self.words[i - 1])
      elif i == self.eos_id:
        out.append(EOS)
      elif i == self.sos_id:
        out.append(SOS)
      else:
        raise ValueError(f"id {i} outside the vocabulary (size {self.size})")
    return out

  @property
  def pos_table(self) -> np.ndarray:
    """int32 [size]: index into `POS_CLASSES` of each id (pad/EOS/SOS: `special`)."""
    table = np.full(self.size, POS_SPECIAL, dtype=np.int32)
    table[1:len(self.words) + 1] = [POS_CLASSES.index(p) for p in self.pos]
    return table

  def to_json(self) -> str:
    return json.dumps({"words": list(self.words), "pos": list(self.pos)})

  @classmethod
  def from_json(cls, s: str | dict) -> "Vocab":
    d = json.loads(s) if isinstance(s, str) else s
    return cls(words=tuple(d["words"]), pos=tuple(d["pos"]))


@dataclasses.dataclass
class EncodedSplit:
  """A split as padded arrays. N lines, L = longest line + 1 (or `max_len`).

  Attributes:
    inputs: int32 [N, L] `SOS w1 … wn` then 0.
    targets: int32 [N, L] `w1 … wn EOS` then 0.
    lengths: int32 [N] n + 1 = number of non-pad target positions.
    task_pos: int32 [N] index t with `inputs[t]` = the task token, so `logits[t]` predict the
      target's first word `targets[t]`; -1 for a line without a task token (Dyck).
    extras: `{field: array [N, ...]}` the task adds (`Task.encode_extras`), e.g. question and
      tense: `transformed`, `main_verb_pos`; Dyck: `close_mask`, `close_distance`. They are
      also readable as attributes (`split.close_mask`).
  """
  inputs: np.ndarray
  targets: np.ndarray
  lengths: np.ndarray
  task_pos: np.ndarray
  extras: dict = dataclasses.field(default_factory=dict)

  def __getattr__(self, name: str):
    # Only called for names that are not fields: the task's extra arrays.
    extras = self.__dict__.get("extras")
    if extras is not None and name in extras:
      return extras[name]
    raise AttributeError(f"EncodedSplit has no field {name!r} (fields: inputs, targets, "
                         f"lengths, task_pos{''.join(', ' + k for k in (extras or {}))})")

  def __len__(self) -> int:
    return int(self.inputs.shape[0])

  def take(self, indices) -> "EncodedSplit":
    """The lines at `indices` (any numpy index: int array, slice, bool mask)."""
    return EncodedSplit(inputs=self.inputs[indices], targets=self.targets[indices],
                        lengths=self.lengths[indices], task_pos=self.task_pos[indices],
                        extras={k: v[indices] for k, v in self.extras.items()})

  def as_dict(self) -> dict:
    """`{field: array}` of the core fields and the extras."""
    return {"inputs": self.inputs, "targets": self.targets, "lengths": self.lengths,
            "task_pos": self.task_pos, **self.extras}


def main_verb_index(words: Sequence[str], vocab: Vocab) -> int:
  """Index in `words` of the main verb: the second verb if a relative pronoun precedes the first
  verb (the subject carries a relative clause), else the first verb; -1 without verbs."""
  pos = vocab.pos
  index = vocab._index  # pylint: disable=protected-access
  verbs = []
  first_rel = None
  for i, w in enumerate(words):
    j = index.get(w)
    if j is None:
      continue
    p = pos[j - 1]
    if p == "V":
      verbs.append(i)
      if len(verbs) == 2:
        break
    elif p == "Rel" and first_rel is None:
      first_rel = i
  if not verbs:
    return -1
  if first_rel is not None and first_rel < verbs[0]:
    return verbs[1] if len(verbs) > 1 else -1
  return verbs[0]


def encode(examples: Sequence[Example], vocab: Vocab, max_len: Optional[int] = None, *,
           truncate: bool = False) -> EncodedSplit:
  """Encodes lines for the LM (input `SOS w1..wn`, target `w1..wn EOS`): the core fields.

  A task's `encode` adds its extra fields (`Task.encode_extras`).

  Args:
    examples: the lines.
    vocab: vocabulary.
    max_len: L, the padded length (>= longest line + 1); default: longest line + 1.
    truncate: cut lines longer than `max_len - 1` words instead of raising.

  Returns:
    EncodedSplit with N = len(examples) and no extras.

  Raises:
    DataError: an unknown word (message names the line index and word).
    ValueError: a line longer than `max_len - 1` words and `truncate` is False.
  """
  n = len(examples)
  longest = max((len(e.source) + len(e.target) for e in examples), default=0) + 1
  length = longest if max_len is None else int(max_len)
  if max_len is not None and longest > length and not truncate:
    raise ValueError(f"a line needs {longest} positions but max_len={length}")
  inputs = np.zeros((n, length), np.int32)
  targets = np.zeros((n, length), np.int32)
  lengths = np.zeros(n, np.int32)
  task_pos = np.full(n, -1, np.int32)
  sos, eos = vocab.sos_id, vocab.eos_id
  for k, ex in enumerate(examples):
    words = ex.source + ex.target
    try:
      ids = vocab.encode(words)
    except DataError as err:
      raise DataError(None, None, f"line index {k}: {err.reason}") from None
    ids = ids[:length - 1] if truncate else ids
    m = len(ids)
    inputs[k, 0] = sos
    inputs[k, 1:m + 1] = ids
    targets[k, :m] = ids
    if m < length:
      targets[k, m] = eos
    lengths[k] = min(m + 1, length)
    if ex.task_token is not None:
      t = len(ex.source)  # inputs[t] = source[-1] = task token
      if t < length:
        task_pos[k] = t
  return EncodedSplit(inputs=inputs, targets=targets, lengths=lengths, task_pos=task_pos)
