"""Sentence shapes of the McCoy et al. (2020) grammars and the shape-conditioned sampler.

The shape of a sentence is `(subject modifier, object)` (`sentence_shape`); `ShapeSampler` draws
shapes from a given distribution (measured on the released files) and the words from the PCFG
given the shape (see `sg_jax.tasks.mccoy`).
"""

from __future__ import annotations

import bisect

import numpy as np

from sg_jax.tasks import pcfg

# Coarse POS class of each preterminal prefix of the two grammars.
_POS_OF_LABEL = (("Det", "Det"), ("N", "N"), ("V_", "V"), ("Aux", "Aux"), ("Prep", "Prep"),
                 ("Rel", "Rel"))


def pos_of_label(label: str) -> str:
  """Coarse POS class (`vocab.POS_CLASSES`) of a preterminal label, e.g. `N_S` -> `N`."""
  for prefix, cls in _POS_OF_LABEL:
    if label.startswith(prefix):
      return cls
  if label == "ROOT":
    return "punct"
  raise ValueError(f"no POS class for label {label!r}")


def modifier(np_deriv: pcfg.Derivation) -> str:
  """Modifier of a noun-phrase derivation: `none`, `PP`, or `RC-intrans`/`RC-obj`/`RC-subj`.

  RC types: `intrans` = `Rel (Aux) V_intrans`; `obj` = object-extracted `Rel Det N (Aux) V_trans`;
  `subj` = subject-extracted `Rel (Aux) V_trans Det N`.
  """
  rhs = np_deriv[1]
  if "Prep" in rhs:
    return "PP"
  for kid in np_deriv[2]:
    if not isinstance(kid, str) and kid[0].startswith("RC"):
      rc = kid[1]
      if rc[1] == "Det":
        return "RC-obj"
      if rc[-1].startswith("V_intrans"):
        return "RC-intrans"
      return "RC-subj"
  return "none"


def sentence_shape(d: pcfg.Derivation) -> tuple:
  """Shape of a sentence derivation (ROOT): `(subject modifier, object)`.

  `object` is `"none"` for an intransitive main verb, else `"obj:" + modifier`. The number of
  auxiliaries (question grammar) is 1 + the number of relative clauses, so it follows from the
  shape. Used for the chi-square comparison with the released files.
  """
  s = d[2][0]
  subj, vp = s[2][0], s[2][1]
  obj = [k for k in vp[2] if not isinstance(k, str) and k[0].startswith("NP_O")]
  return (modifier(subj), "obj:" + modifier(obj[0]) if obj else "none")


def _np_category(rhs: tuple) -> str:
  if "Prep" in rhs:
    return "PP"
  return "RC" if any(x.startswith("RC") for x in rhs) else "none"


def _rc_type(rhs: tuple) -> str:
  if rhs[1] == "Det":
    return "RC-obj"
  return "RC-intrans" if rhs[-1].startswith("V_intrans") else "RC-subj"


class ShapeSampler:
  """Samples sentences whose shape follows a given distribution, words from the PCFG given the
  shape (the PCFG's rule choices at the shape-defining nodes are renormalised to the allowed ones,
  which is exactly the PCFG conditioned on the shape).

  Args:
    grammar: the PCFG.
    shape_counts: `{shape: weight}` (shapes as `sentence_shape` returns them).
    rng: numpy Generator (uniforms are drawn in blocks; deterministic given its state).
  """

  def __init__(self, grammar: pcfg.Grammar, shape_counts: dict, rng: np.random.Generator,
               block: int = 8192):
    self.grammar = grammar
    self.shapes = sorted(shape_counts)
    w = np.array([shape_counts[k] for k in self.shapes], np.float64)
    c = np.cumsum(w / w.sum())
    c[-1] = 1.0
    self._shape_cum = c.tolist()
    self._rng = rng
    self._block = block
    self._buf: list = []
    self._pos = 0
    self._tables: dict = {}

  def _u(self) -> float:
    if self._pos == len(self._buf):
      self._buf, self._pos = self._rng.random(self._block).tolist(), 0
    u = self._buf[self._pos]
    self._pos += 1
    return u

  def _table(self, shape: tuple, lhs: str, parent: str):
    key = (shape, lhs, parent)
    tab = self._tables.get(key)
    if tab is None:
      subj, obj = shape
      obj_mod = None if obj == "none" else obj[4:]
      alts = self.grammar.rules[lhs]
      def ok(rhs):
        if lhs.startswith("NP_M"):
          return _np_category(rhs) == (subj if not subj.startswith("RC") else "RC")
        if lhs.startswith("NP_O"):
          return _np_category(rhs) == (obj_mod if not obj_mod.startswith("RC") else "RC")
        if lhs.startswith("VP_M"):
          return any(x.startswith("NP_O") for x in rhs) == (obj_mod is not None)
        if lhs.startswith("RC"):
          return _rc_type(rhs) == (subj if parent.startswith("NP_M") else obj_mod)
        return True
      kept = [(rhs, wt) for rhs, wt in alts if ok(rhs)]
      if not kept:
        raise ValueError(f"shape {shape} impossible at {lhs}")
      w = np.array([wt for _, wt in kept], np.float64)
      c = np.cumsum(w / w.sum())
      c[-1] = 1.0
      tab = (c.tolist(), [r for r, _ in kept])
      self._tables[key] = tab
    return tab

  def sample_with_shape(self, shape: tuple | None = None) -> tuple:
    """(derivation, its shape); the shape is drawn from the distribution unless given."""
    if shape is None:
      shape = self.shapes[bisect.bisect_right(self._shape_cum, self._u())]
    rules = self.grammar.rules

    def expand(sym, parent):
      c, rhss = self._table(shape, sym, parent)
      rhs = rhss[bisect.bisect_right(c, self._u())] if len(c) > 1 else rhss[0]
      return (sym, rhs, tuple(expand(x, sym) if x in rules else x for x in rhs))

    return expand(self.grammar.start, ""), shape
