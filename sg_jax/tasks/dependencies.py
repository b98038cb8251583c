"""Gold dependency arcs from the constituency trees of a line (docs/sas.md, "Gold dependencies").

The syntactic attention structure of Chen et al. (ICLR 2024; docs/REFERENCE.md §3) is scored
against dependency heads. sg_jax's question-formation and tense lines come with exact
constituency trees (the released `*_bracket` convention, `pcfg.to_tree`): unlabelled binary
trees over words whose coarse part of speech (`vocab.POS_CLASSES`) is known. A constituent's type
follows from the types of its two children, and one head rule per constituent type says which
child is the head and how the other child's head attaches (`HEAD_RULES`, content-head convention:
the main verb is the root; determiners depend on their noun, auxiliaries on their verb, the noun
of a prepositional phrase on the noun it modifies and the preposition on its own noun, a relative
clause's verb on the noun it modifies, the relative pronoun on that verb).

Punctuation (`.`, `?`) and task tokens get no arc and are no one's head. Arcs are
`(dependent, head, relation)` in *input positions* of the encoded line (`vocab.encode`: SOS at 0,
word k of `Example.words` at k + 1), one arc per word that is not the root, punctuation or a task
token.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from sg_jax.tasks import trees

# Relation types, in the order of their ids (`dependency_arrays`); UD names where UD has one.
RELATIONS = ("nsubj", "obj", "det", "aux", "case", "nmod", "relcl", "rel", "bracket")
RELATION_DESCRIPTIONS = {
    "nsubj": "subject noun -> its verb",
    "obj": "object noun -> its verb",
    "det": "determiner -> its noun",
    "aux": "auxiliary -> its verb (also when fronted in a question)",
    "case": "preposition -> the noun of its phrase",
    "nmod": "noun of a prepositional phrase -> the noun it modifies",
    "relcl": "verb of a relative clause -> the noun it modifies",
    "rel": "relative pronoun -> the verb of its clause",
    "bracket": "Dyck only: closing bracket -> its opening bracket",
}

# (left type, right type) -> (constituent type, head child "left"/"right", relation of the other
# child's head to the head child's head, None = no arc: punctuation). Leaf types are POS classes.
HEAD_RULES: dict[tuple[str, str], tuple[str, str, str | None]] = {
    ("Det", "N"): ("NP", "right", "det"),        # [ the walrus ]
    ("Prep", "NP"): ("PP", "right", "case"),     # [ near [ the yak ] ]
    ("NP", "PP"): ("NP", "left", "nmod"),        # [ [ the walrus ] [ near [ the yak ] ] ]
    ("NP", "RC"): ("NP", "left", "relcl"),       # [ [ the walrus ] [ who ... ] ]
    ("Aux", "V"): ("VP", "right", "aux"),        # [ doesn't move ]
    ("Aux", "VP"): ("VP", "right", "aux"),       # [ doesn't [ amuse [ the yak ] ] ]
    ("V", "NP"): ("VP", "left", "obj"),          # [ amuse [ the yak ] ]
    ("NP", "VP"): ("S", "right", "nsubj"),       # [ [ the walrus ] [ doesn't move ] ]
    ("NP", "V"): ("S", "right", "nsubj"),        # tense: [ [ the walrus ] moved ]
    ("Rel", "VP"): ("RC", "right", "rel"),       # [ who [ doesn't move ] ]
    ("Rel", "V"): ("RC", "right", "rel"),        # tense: [ who moved ]
    ("Rel", "S"): ("RC", "right", "rel"),        # [ who [ [ our yak ] [ doesn't amuse ] ] ]
    ("Aux", "S"): ("Q", "right", "aux"),         # question: [ doesn't [ [ the walrus ] move ] ]
    ("S", "punct"): ("ROOT", "left", None),      # [ S . ]
    ("Q", "punct"): ("ROOT", "left", None),      # [ Q ? ]
}


class DependencyError(ValueError):
  """A tree whose constituents no head rule covers (message names the pair and the words)."""


def tree_arcs(tree: trees.Tree, pos_of: Mapping[str, str]) -> tuple[list, int]:
  """Dependency arcs of one tree by the head rules.

  Args:
    tree: a binary (or unary-collapsed) tree over words.
    pos_of: `{word: POS class}` (`vocab.Vocab.pos` by word).

  Returns:
    (arcs `[(dependent, head, relation)]` in word indices of `trees.leaves(tree)`, index of the
    root word). Punctuation words get no arc.

  Raises:
    DependencyError: a word without a POS class, a node with more than two children or a pair
      of constituent types without a head rule.
  """
  arcs: list = []

  def walk(t, start: int) -> tuple[str, int, int]:  # (type, head index, next start)
    if isinstance(t, str):
      if t not in pos_of:
        raise DependencyError(f"word {t!r} has no part of speech")
      return pos_of[t], start, start + 1
    if len(t) != 2:
      raise DependencyError(f"head rules need binary trees, got {len(t)} children in "
                            f"{trees.format_tree(t)!r}")
    left_type, left_head, mid = walk(t[0], start)
    right_type, right_head, end = walk(t[1], mid)
    rule = HEAD_RULES.get((left_type, right_type))
    if rule is None:
      raise DependencyError(f"no head rule for ({left_type}, {right_type}) in "
                            f"{trees.format_tree(t)!r}")
    kind, side, relation = rule
    head, other = (left_head, right_head) if side == "left" else (right_head, left_head)
    if relation is not None:
      arcs.append((other, head, relation))
    return kind, head, end

  _, root, _ = walk(tree, 0)
  return sorted(arcs), root


def line_dependencies(source_tree: trees.Tree, target_tree: trees.Tree, num_source: int,
                      pos_of: Mapping[str, str]) -> list:
  """Arcs of a whole line `source + target` in input positions (module docstring).

  Args:
    source_tree: tree over the source words without the task token.
    target_tree: tree over all target words.
    num_source: number of source words, task token included (the target starts after it).
    pos_of: `{word: POS class}`.

  Returns:
    sorted `[(dependent, head, relation)]`; positions are word index + 1 (SOS at 0).
  """
  src, _ = tree_arcs(source_tree, pos_of)
  tgt, _ = tree_arcs(target_tree, pos_of)
  return sorted([(d + 1, h + 1, r) for d, h, r in src]
                + [(d + 1 + num_source, h + 1 + num_source, r) for d, h, r in tgt])


def bracket_arcs(tokens: Sequence[str], pos_of: Mapping[str, str]) -> list:
  """Dyck: each closing bracket -> its opening bracket (relation `bracket`), input positions.

  Raises:
    DependencyError: unbalanced brackets.
  """
  arcs, stack = [], []
  for i, tok in enumerate(tokens):
    if pos_of.get(tok) == "open":
      stack.append(i)
    elif pos_of.get(tok) == "close":
      if not stack:
        raise DependencyError(f"closing bracket {tok!r} at token {i} has no opening bracket")
      arcs.append((i + 1, stack.pop() + 1, "bracket"))
  return sorted(arcs)


def dependency_arrays(arcs_per_line: Sequence[Sequence[tuple]], length: int
                      ) -> dict[str, np.ndarray]:
  """The arcs of N lines as per-dependent arrays (every word has at most one head).

  Args:
    arcs_per_line: `[(dependent, head, relation)]` of each line, input positions.
    length: L, the padded length of the encoded lines.

  Returns:
    {'dep_head': int32 [N, L] head position of the word at each position, -1 = no arc (SOS,
    root, punctuation, task token, padding, an arc cut off by L);
    'dep_relation': int32 [N, L] index into `RELATIONS`, -1 = no arc}.

  Raises:
    DependencyError: a word with two heads or an unknown relation.
  """
  heads = np.full((len(arcs_per_line), length), -1, np.int32)
  rels = np.full((len(arcs_per_line), length), -1, np.int32)
  index = {r: i for i, r in enumerate(RELATIONS)}
  for n, arcs in enumerate(arcs_per_line):
    for d, h, r in arcs:
      if r not in index:
        raise DependencyError(f"line {n}: unknown relation {r!r}; expected one of {RELATIONS}")
      if d >= length or h >= length:
        continue
      if heads[n, d] >= 0:
        raise DependencyError(f"line {n}: the word at position {d} has two heads")
      heads[n, d], rels[n, d] = h, index[r]
  return {"dep_head": heads, "dep_relation": rels}
