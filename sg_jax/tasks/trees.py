"""Unlabelled constituency trees: bracket parsing/formatting, spans and binarisation.

A tree is a word (`str`) or a tuple of trees (its children, left to right). The released McCoy
et al. (2020) `*_bracket.*` files write a tree as `[ child child ... ]` with a space between every
token, e.g. `[ [ the walrus ] [ doesn't move ] ]`. A line side may hold several top-level items (a
*forest*): the target side of a bracketed line is written without the outermost bracket, e.g.
`[ [ the walrus ] [ doesn't move ] ] .` is the forest of the tree `((("the", "walrus"),
("doesn't", "move")), ".")`.

These trees are the gold trees of the structural-grokking tree-projection analysis
(docs/REFERENCE.md §1, "Tree projection": tparseval brackets = every internal node's span).
"""

from __future__ import annotations

from typing import Sequence, Union

Tree = Union[str, tuple]

OPEN = "["
CLOSE = "]"


class BracketError(ValueError):
  """Unbalanced or otherwise malformed bracket string (message says where)."""


def parse_forest(tokens: Sequence[str] | str) -> tuple:
  """Parses a bracket string into its top-level items.

  Args:
    tokens: whitespace-separated bracket string or its token list, e.g. `"[ a [ b c ] ] ."`.

  Returns:
    tuple of trees (top-level items), e.g. `(("a", ("b", "c")), ".")`.

  Raises:
    BracketError: a `]` without its `[`, a `[` never closed, or an empty `[ ]`.
  """
  if isinstance(tokens, str):
    tokens = tokens.split()
  stack: list[list] = [[]]
  for i, tok in enumerate(tokens):
    if tok == OPEN:
      stack.append([])
    elif tok == CLOSE:
      if len(stack) == 1:
        raise BracketError(f"unmatched ']' at token {i}")
      node = stack.pop()
      if not node:
        raise BracketError(f"empty brackets '[ ]' ending at token {i}")
      stack[-1].append(tuple(node))
    else:
      stack[-1].append(tok)
  if len(stack) != 1:
    raise BracketError(f"{len(stack) - 1} unclosed '[' at end of input")
  return tuple(stack[0])


def format_tree(tree: Tree) -> str:
  """Writes a tree in the released bracket convention: `[ a [ b c ] ]` (a word stays bare)."""
  if isinstance(tree, str):
    return tree
  return OPEN + " " + " ".join(format_tree(c) for c in tree) + " " + CLOSE


def format_forest(items: Sequence[Tree]) -> str:
  """Writes top-level items side by side without an enclosing bracket (target-side convention)."""
  return " ".join(format_tree(t) for t in items)


def leaves(tree: Tree) -> tuple[str, ...]:
  """Words of a tree, left to right."""
  if isinstance(tree, str):
    return (tree,)
  out: list[str] = []
  stack = [tree]
  while stack:
    t = stack.pop()
    if isinstance(t, str):
      out.append(t)
    else:
      stack.extend(reversed(t))
  return tuple(out)


def spans(tree: Tree, *, include_leaves: bool = False) -> list[tuple[int, int]]:
  """Word spans `(i, j)` (inclusive, 0-based) of every internal node, root included, pre-order.

  Args:
    tree: a tree.
    include_leaves: also list the single-word spans `(i, i)`.

  Returns:
    list of `(first_word, last_word)` pairs; this is the bracket set of parseval F1.
  """
  out: list[tuple[int, int]] = []

  def walk(t: Tree, start: int) -> int:
    if isinstance(t, str):
      if include_leaves:
        out.append((start, start))
      return start + 1
    idx = len(out)
    out.append((start, start))  # placeholder, fixed below
    end = start
    for c in t:
      end = walk(c, end)
    out[idx] = (start, end - 1)
    return end

  walk(tree, 0)
  return out


def binarize(tree: Tree) -> Tree:
  """Right-branching binarisation of every node with more than two children.

  A node with one child is replaced by that child. `(a, b, c)` becomes `(a, (b, c))`, the
  convention the released trees already follow inside every rule (so binarising them is a no-op).
  """
  if isinstance(tree, str):
    return tree
  kids = [binarize(c) for c in tree]
  if len(kids) == 1:
    return kids[0]
  out = kids[-1]
  for k in reversed(kids[:-1]):
    out = (k, out)
  return out


def strip_leaves(tree: Tree, drop: frozenset[str] | set[str]) -> Tree | None:
  """Removes the given words from a tree, collapsing nodes left with one child (None if empty)."""
  if isinstance(tree, str):
    return None if tree in drop else tree
  kids = [k for k in (strip_leaves(c, drop) for c in tree) if k is not None]
  if not kids:
    return None
  if len(kids) == 1:
    return kids[0]
  return tuple(kids)


def map_leaves(tree: Tree, fn) -> Tree:
  """Returns the tree with every word `w` replaced by `fn(w)` (same shape)."""
  if isinstance(tree, str):
    return fn(tree)
  return tuple(map_leaves(c, fn) for c in tree)


def split_nodes(tree: Tree) -> list[tuple[int, int, int]]:
  """Internal nodes `(i, k, j)` of a binary tree in pre-order (word indices, 0-based, inclusive):
  the node covers words i..j, its left child i..k and its right child k + 1..j (the node
  convention of `sg_jax.analysis.projected_trees`; [] for a single word).

  Raises:
    ValueError: a node without exactly two children (binarise first: `binarize`).
  """
  out: list[tuple[int, int, int]] = []

  def walk(t: Tree, start: int) -> int:
    if isinstance(t, str):
      return start + 1
    if len(t) != 2:
      raise ValueError(f"split_nodes needs a binary tree; a node has {len(t)} children: "
                       f"{format_tree(t)}")
    idx = len(out)
    out.append((start, start, start))  # placeholder, fixed below
    mid = walk(t[0], start)
    end = walk(t[1], mid)
    out[idx] = (start, mid - 1, end - 1)
    return end

  walk(tree, 0)
  return out
