"""Probabilistic context-free grammars in the McCoy et al. (2020) format: parsing, sampling, trees.

Grammar files have one rule per line, `weight<TAB>LHS<TAB>RHS` (RHS symbols separated by spaces);
weights are relative within one left-hand side; blank lines are ignored; a symbol is a nonterminal
iff it appears as some rule's LHS. The start symbol is `ROOT`. The two grammars of the released
data (`question.gr`, `tense.gr`, docs/REFERENCE.md §1 "Tasks") ship as package data in
`sg_jax/tasks/grammars/` and load with `load_grammar(name)`.

A *derivation* is `(lhs, rhs, children)` where `rhs` is the tuple of RHS symbols of the rule used
and `children` holds a derivation per nonterminal and the word itself per terminal. `to_tree`
turns a derivation into the unlabelled tree of the released `*_bracket` files (see its docstring
for the bracketing convention reverse-engineered from those files).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import importlib.resources
from typing import Callable, Iterator, Sequence

import numpy as np

from sg_jax.tasks import trees

START = "ROOT"
GRAMMAR_NAMES = ("question", "tense")

Derivation = tuple  # (lhs: str, rhs: tuple[str, ...], children: tuple[Derivation | str, ...])


class GrammarError(ValueError):
  """Malformed grammar text (message names the line)."""


class ParseError(ValueError):
  """A word sequence the grammar does not generate."""


@dataclasses.dataclass(frozen=True)
class Grammar:
  """A PCFG.

  Attributes:
    rules: `{lhs: ((rhs, weight), ...)}` in file order; `rhs` is a tuple of symbols.
    start: start symbol.
  """
  rules: dict
  start: str = START

  def __post_init__(self):
    if self.start not in self.rules:
      raise GrammarError(f"start symbol {self.start!r} has no rules")
    for lhs, alts in self.rules.items():
      if any(w <= 0 for _, w in alts):
        raise GrammarError(f"non-positive weight in a rule of {lhs!r}")
    # Sampling tables: cumulative probabilities per LHS (floats in (0, 1]).
    cum = {}
    for lhs, alts in self.rules.items():
      w = np.array([wt for _, wt in alts], dtype=np.float64)
      c = np.cumsum(w / w.sum())
      c[-1] = 1.0
      cum[lhs] = (c.tolist(), tuple(r for r, _ in alts))
    object.__setattr__(self, "_cum", cum)
    lex: dict[str, list[str]] = {}
    for lhs, alts in self.rules.items():
      for rhs, _ in alts:
        if len(rhs) == 1 and rhs[0] not in self.rules:
          lex.setdefault(rhs[0], []).append(lhs)
    object.__setattr__(self, "_lexicon", {w: tuple(v) for w, v in lex.items()})

  @property
  def terminals(self) -> tuple[str, ...]:
    """Every terminal symbol, sorted."""
    out = set()
    for alts in self.rules.values():
      for rhs, _ in alts:
        out.update(s for s in rhs if s not in self.rules)
    return tuple(sorted(out))

  def preterminal_words(self) -> dict[str, tuple[str, ...]]:
    """`{word: (preterminal labels that rewrite to it)}` for words of unary lexical rules."""
    return dict(self._lexicon)

  def probability(self, lhs: str, rhs: Sequence[str]) -> float:
    """Probability of the rule `lhs -> rhs` (0 if absent)."""
    alts = self.rules[lhs]
    total = sum(w for _, w in alts)
    return sum(w for r, w in alts if r == tuple(rhs)) / total

  def map_terminals(self, fn: Callable[[str, str], str]) -> "Grammar":
    """A grammar with every terminal `w` of a rule of `lhs` replaced by `fn(lhs, w)`."""
    rules = {lhs: tuple((tuple(s if s in self.rules else fn(lhs, s) for s in rhs), w)
                        for rhs, w in alts) for lhs, alts in self.rules.items()}
    return Grammar(rules=rules, start=self.start)

  # --- sampling ---------------------------------------------------------------------------------

  def sample(self, rng: np.random.Generator, symbol: str | None = None) -> Derivation:
    """Samples one derivation top-down.

    Args:
      rng: numpy Generator; the result is a deterministic function of its state.
      symbol: start symbol (default `self.start`).

    Returns:
      a derivation `(lhs, rhs, children)`.
    """
    return next(self.sample_stream(rng, symbol))

  def sample_stream(self, rng: np.random.Generator, symbol: str | None = None,
                    block: int = 8192) -> Iterator[Derivation]:
    """Endless iterator of independent derivations, drawing uniforms from `rng` in blocks.

    Deterministic given the Generator state; much faster than one `rng` call per rule choice.
    """
    symbol = symbol or self.start
    cum = self._cum
    buf: list[float] = []
    pos = 0

    def expand(sym):
      nonlocal buf, pos
      c, rhss = cum[sym]
      if pos == len(buf):
        buf, pos = rng.random(block).tolist(), 0
      u = buf[pos]
      pos += 1
      rhs = rhss[bisect.bisect_right(c, u)] if len(c) > 1 else rhss[0]
      return (sym, rhs, tuple(expand(s) if s in cum else s for s in rhs))

    while True:
      yield expand(symbol)

  # --- parsing ----------------------------------------------------------------------------------

  def parse_all(self, words: Sequence[str], symbol: str | None = None) -> list[Derivation]:
    """All derivations of `words` from `symbol` (memoised top-down search).

    Returns:
      list of derivations (empty if the grammar does not generate `words`). Works for grammars
      without epsilon rules and without left recursion (both McCoy grammars qualify).
    """
    words = tuple(words)
    n = len(words)
    rules = self.rules

    @functools.lru_cache(maxsize=None)
    def sym_at(sym: str, i: int) -> tuple:
      # -> tuple of (end, derivation-or-word)
      if sym not in rules:
        return ((i + 1, sym),) if i < n and words[i] == sym else ()
      out = []
      for rhs, _ in rules[sym]:
        if i + len(rhs) > n:
          continue
        for end, kids in seq_at(rhs, 0, i):
          out.append((end, (sym, rhs, kids)))
      return tuple(out)

    def seq_at(rhs: tuple, k: int, i: int) -> list:
      if k == len(rhs):
        return [(i, ())]
      out = []
      for mid, d in sym_at(rhs[k], i):
        for end, rest in seq_at(rhs, k + 1, mid):
          out.append((end, (d,) + rest))
      return out

    return [d for end, d in sym_at(symbol or self.start, 0) if end == n]

  def parse(self, words: Sequence[str], symbol: str | None = None) -> Derivation:
    """The derivation of `words`; when several exist they must give the same unlabelled tree.

    Raises:
      ParseError: `words` is not generated by the grammar, or its parses give different trees.
    """
    ds = self.parse_all(words, symbol)
    if not ds:
      raise ParseError(f"not generated by the grammar: {' '.join(words)!r}")
    if len(ds) > 1 and len({to_tree(d) for d in ds}) > 1:
      raise ParseError(f"structurally ambiguous: {' '.join(words)!r}")
    return ds[0]


def grammar_from_text(text: str, *, name: str = "<grammar>", start: str = START) -> Grammar:
  """Parses McCoy-format grammar text (`weight<TAB>LHS<TAB>RHS` per line).

  Raises:
    GrammarError: a line without three tab-separated fields or with a non-numeric weight
      (message names `name` and the 1-based line number).
  """
  rules: dict[str, list] = {}
  for lineno, line in enumerate(text.splitlines(), start=1):
    if not line.strip():
      continue
    parts = line.rstrip("\n").split("\t")
    parts = [p for p in parts if p.strip()] if len(parts) > 3 else parts
    if len(parts) != 3:
      raise GrammarError(f"{name}:{lineno}: expected 'weight<TAB>LHS<TAB>RHS', got {line!r}")
    try:
      weight = float(parts[0])
    except ValueError:
      raise GrammarError(f"{name}:{lineno}: weight {parts[0]!r} is not a number") from None
    lhs, rhs = parts[1].strip(), tuple(parts[2].split())
    if not lhs or not rhs:
      raise GrammarError(f"{name}:{lineno}: empty LHS or RHS")
    rules.setdefault(lhs, []).append((rhs, weight))
  if not rules:
    raise GrammarError(f"{name}: no rules")
  return Grammar(rules={k: tuple(v) for k, v in rules.items()}, start=start)


@functools.lru_cache(maxsize=None)
def load_grammar(name: str) -> Grammar:
  """Loads a packaged grammar, `"question"` or `"tense"` (McCoy et al. 2020 `cfgs/`).

  Raises:
    ValueError: unknown grammar name.
  """
  if name not in GRAMMAR_NAMES:
    raise ValueError(f"unknown grammar {name!r}; expected one of {GRAMMAR_NAMES}")
  text = (importlib.resources.files("sg_jax.tasks") / "grammars" / f"{name}.gr").read_text(
      encoding="utf-8")
  return grammar_from_text(text, name=f"{name}.gr")


def words_of(d: Derivation | str) -> tuple[str, ...]:
  """The word sequence (yield) of a derivation."""
  if isinstance(d, str):
    return (d,)
  out: list[str] = []
  stack = [d]
  while stack:
    x = stack.pop()
    if isinstance(x, str):
      out.append(x)
    else:
      stack.extend(reversed(x[2]))
  return tuple(out)


# Labels whose word forms one constituent with the following item (determiner + noun).
PAIR_WITH_NEXT = frozenset({"Det"})


def to_tree(d: Derivation | str) -> trees.Tree:
  """Unlabelled tree of a derivation in the released `*_bracket` convention.

  Reverse-engineered from the released files (McCoy et al. 2020 `*_bracket.*`): unary chains
  collapse (a preterminal is its word; `N -> N_S` is its child); inside each rule a determiner
  first forms a constituent with the item after it (`[ the walrus ]`); the resulting items are then
  bracketed right-branching (`Det N Prep Det N` -> `[ [ Det N ] [ Prep [ Det N ] ] ]`,
  `Aux V NP` -> `[ Aux [ V NP ] ]`, `Rel Det N Aux V` -> `[ Rel [ [ Det N ] [ Aux V ] ] ]`).
  The source side of a line is the tree of `ROOT -> S .`, i.e. `[ S . ]`.
  """
  if isinstance(d, str):
    return d
  _, _, kids = d
  items: list = []
  pending = None
  for k in kids:
    t = to_tree(k)
    if pending is not None:
      items.append((pending, t))
      pending = None
    elif not isinstance(k, str) and k[0] in PAIR_WITH_NEXT:
      pending = t
    else:
      items.append(t)
  if pending is not None:
    items.append(pending)
  if len(items) == 1:
    return items[0]
  out = items[-1]
  for x in reversed(items[:-1]):
    out = (x, out)
  return out
