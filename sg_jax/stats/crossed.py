"""Which of two crossed factors decides a per-seed outcome: variance shares and a restricted
permutation test per factor.

The design is the one PolyPythias (van der Wal et al., ICLR 2025) use to separate a model's
initialisation seed from its data-order seed: every initialisation trained on every data order
(`seeds.init` x `seeds.data`, e.g. 4 x 4 = 16 seeds), one outcome per seed. The decomposition is
the balanced two-way analysis of variance (Fisher 1925; Montgomery, *Design and Analysis of
Experiments*, ch. 5): the total sum of squares around the grand mean splits into a sum for each
factor's level means, the interaction and the within-cell rest (the interaction is the rest when
each cell holds one seed). A categorical outcome (a seed's final rule) is coded as one indicator
column per category and the sums of squares add over the columns: Light & Margolin's (1971)
categorical analysis of variance, whose total is n times the Gini impurity.

Each factor is tested by permuting the outcomes within the levels of the other factor (the
restricted permutation of Anderson & ter Braak 2003 for a main effect in a two-way design): the
other factor's effect is kept, and the factor's sum of squares has the null distribution of "the
factor changes nothing". With one seed per cell, permuting the labels of one factor's levels
everywhere leaves its sum of squares unchanged, so enumeration fixes the first stratum: 4 x 4
seeds need (4!)^3 = 13,824 arrangements (exact); larger designs draw `NUM_RESAMPLES`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import numpy as np
import scipy.stats

from sg_jax.stats import power as power_lib
from sg_jax.stats.comparisons import EXACT_LIMIT, NUM_RESAMPLES

_GAMMA = 1e-12


@dataclasses.dataclass(frozen=True)
class FactorShare:
  """One factor of a crossed design.

  Attributes:
    name: the factor's name (e.g. "seeds.init").
    levels: its number of levels.
    share: its sum of squares over the total (0-1): the share of the seeds' variance the factor's
      level means explain.
    partial_eta2: its sum of squares over itself plus the residual (0-1; the residual is the
      within-cell rest, or the interaction when cells hold one seed).
    p: one-sided p-value of the restricted permutation test (a larger sum of squares than
      chance).
    min_p: the smallest p the test can give in this design.
    detectable: the partial eta squared the F-test of this design detects with power 0.8 at
      alpha 0.05 (noncentral F; an approximation to the permutation test's power; inf when
      `min_p` > 0.05).
    exact: whether `p` enumerates every arrangement (else seeded draws).
  """

  name: str
  levels: int
  share: float
  partial_eta2: float
  p: float
  min_p: float
  detectable: float
  exact: bool


@dataclasses.dataclass(frozen=True)
class CrossedResult:
  """`crossed_variance`'s result: one `FactorShare` per factor, the interaction's share (nan
  with one seed per cell, where it cannot be told from the residual), the residual's share, the
  seeds per cell and the total sum of squares."""

  factors: tuple[FactorShare, FactorShare]
  interaction_share: float
  residual_share: float
  per_cell: int
  total_ss: float


def _codes(labels: Sequence, name: str) -> tuple[np.ndarray, int]:
  uniques, codes = np.unique(np.asarray(list(labels), dtype=object).astype(str),
                             return_inverse=True)
  if uniques.size < 2:
    raise ValueError(f"factor {name!r} needs at least 2 levels, got {uniques.size}")
  return codes.astype(np.int64), int(uniques.size)


def _as_columns(values) -> np.ndarray:
  """Numeric values -> [n, 1]; categorical (strings) -> one-hot indicators [n, categories]."""
  array = np.asarray(list(values), dtype=object)
  if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
         for v in array):
    column = array.astype(np.float64)
    if not np.all(np.isfinite(column)):
      raise ValueError("crossed_variance needs a finite value for every seed")
    return column[:, None]
  labels = array.astype(str)
  return (labels[:, None] == np.unique(labels)[None, :]).astype(np.float64)


def _factor_ss(y: np.ndarray, codes: np.ndarray, levels: int) -> np.ndarray:
  """Sum of squares of the level means around the grand mean, summed over columns.
  y: [..., n, k]; codes: [n] -> [...]."""
  sums = np.stack([y[..., codes == l, :].sum(-2) for l in range(levels)], -2)  # [..., L, k]
  counts = np.bincount(codes, minlength=levels).astype(np.float64)[:, None]
  grand = y.sum(-2, keepdims=True) / y.shape[-2]
  return (counts * (sums / counts - grand) ** 2).sum((-2, -1))


def _cell_ss(y: np.ndarray, a: np.ndarray, b: np.ndarray, levels_b: int) -> float:
  return float(_factor_ss(y, a * levels_b + b, int(a.max() + 1) * levels_b))


def _detectable_partial_eta2(df_effect: int, df_resid: int, n: int) -> float:
  """Partial eta squared detected with power 0.8 at alpha 0.05 by the F-test with these degrees
  of freedom over n observations (noncentrality lambda = n f^2; eta^2 = f^2 / (1 + f^2))."""
  if df_resid < 1:
    return math.inf
  crit = scipy.stats.f.ppf(1 - power_lib.ALPHA, df_effect, df_resid)
  lo, hi = 0.0, 1.0
  while scipy.stats.ncf.sf(crit, df_effect, df_resid, hi) < power_lib.POWER:
    hi *= 2
    if hi > 1e7:
      return math.inf
  for _ in range(100):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if scipy.stats.ncf.sf(crit, df_effect, df_resid, mid) < power_lib.POWER \
        else (lo, mid)
  f2 = hi / n
  return f2 / (1 + f2)


def _strata_orders(strata: list[np.ndarray], exact: bool, fix_first: bool, num_resamples: int,
                   rng: np.random.Generator) -> np.ndarray:
  """Arrangements [m, n]: index arrays that permute positions within each stratum."""
  n = sum(s.size for s in strata)
  if exact:
    per_stratum = [np.asarray([s[list(p)] for p in itertools.permutations(range(s.size))])
                   for s in strata]
    if fix_first:
      per_stratum[0] = strata[0][None, :]
    grids = np.meshgrid(*[np.arange(p.shape[0]) for p in per_stratum], indexing="ij")
    choice = [g.ravel() for g in grids]
    out = np.empty((choice[0].size, n), np.int64)
    for s, pick, perms in zip(strata, choice, per_stratum):
      out[:, s] = perms[pick]
    return out
  out = np.empty((num_resamples, n), np.int64)
  for s in strata:
    out[:, s] = s[rng.permuted(np.broadcast_to(np.arange(s.size), (num_resamples, s.size)),
                               axis=1)]
  return out


def _test_factor(y, codes, levels, other, other_levels, per_cell, num_resamples, seed):
  strata = [np.flatnonzero(other == l) for l in range(other_levels)]
  fix_first = per_cell == 1
  count = math.prod(math.factorial(s.size) for s in strata)
  reduced = count // math.factorial(strata[0].size) if fix_first else count
  exact = reduced <= EXACT_LIMIT
  orders = _strata_orders(strata, exact, fix_first, num_resamples, np.random.default_rng(seed))
  null = _factor_ss(y[orders], codes, levels)
  observed = float(_factor_ss(y, codes, levels))
  hits = int(np.sum(null >= observed * (1 - _GAMMA) - _GAMMA))
  # Relabelling the levels in every stratum at once, and reordering the seeds within a cell,
  # leave the sum unchanged: at least levels! * (per_cell!)^cells arrangements reach the maximum.
  ties = math.factorial(levels) * math.factorial(per_cell) ** (levels * other_levels)
  min_p = ties / count
  if exact:
    return hits / null.size, min_p, True
  return (hits + 1) / (null.size + 1), max(min_p, 1 / (num_resamples + 1)), False


def crossed_variance(values: Sequence, factor_a: Sequence, factor_b: Sequence,
                     names: tuple[str, str] = ("a", "b"), num_resamples: int = NUM_RESAMPLES,
                     seed: int = 0) -> CrossedResult:
  """Variance shares and restricted permutation tests of two crossed factors (module docstring).

  Args:
    values: [n] one outcome per seed: numbers (e.g. final out-of-domain accuracy, 0-1), or
      category names (e.g. the final rule), coded as indicator columns.
    factor_a, factor_b: [n] each seed's level of each factor (e.g. its `seeds.init` and its
      `seeds.data`).
    names: the factors' names, for the result.
    num_resamples: draws when a design has more arrangements than `EXACT_LIMIT`.
    seed: the draws' seed (a report is reproducible).

  Returns:
    `CrossedResult` (shares of the total sum of squares; a total of 0 gives shares nan and
    p-values 1).

  Raises:
    ValueError: lengths differ, a factor has fewer than 2 levels, the design is not balanced and
      complete (every level pair the same number of seeds, at least one), or a value is not
      finite.
  """
  y = _as_columns(values)
  n = y.shape[0]
  if not len(factor_a) == len(factor_b) == n:
    raise ValueError(f"values, factor_a and factor_b need one entry per seed, got {n}, "
                     f"{len(factor_a)} and {len(factor_b)}")
  a, la = _codes(factor_a, names[0])
  b, lb = _codes(factor_b, names[1])
  cells = np.bincount(a * lb + b, minlength=la * lb)
  if cells.min() < 1 or cells.min() != cells.max():
    raise ValueError(f"crossed_variance needs every ({names[0]}, {names[1]}) pair equally often "
                     f"(a balanced, complete design); seeds per pair range {cells.min()}-"
                     f"{cells.max()}")
  r = int(cells[0])
  total = float(((y - y.mean(0)) ** 2).sum())
  ss_a, ss_b = float(_factor_ss(y, a, la)), float(_factor_ss(y, b, lb))
  if r > 1:
    ss_cells = _cell_ss(y, a, b, lb)
    ss_ab, ss_resid = ss_cells - ss_a - ss_b, total - ss_cells
    df_resid = la * lb * (r - 1)
  else:
    ss_ab, ss_resid = math.nan, total - ss_a - ss_b
    df_resid = (la - 1) * (lb - 1)
  factors = []
  for name, codes, levels, other, other_levels, ss, df in (
      (names[0], a, la, b, lb, ss_a, la - 1), (names[1], b, lb, a, la, ss_b, lb - 1)):
    if total <= 0:
      p, min_p, exact = 1.0, 1.0, True
    else:
      p, min_p, exact = _test_factor(y, codes, levels, other, other_levels, r, num_resamples,
                                     seed)
    detectable = (math.inf if min_p > power_lib.ALPHA
                  else _detectable_partial_eta2(df, df_resid, n))
    denominator = ss + max(ss_resid, 0.0)
    factors.append(FactorShare(
        name=name, levels=levels, share=ss / total if total > 0 else math.nan,
        partial_eta2=ss / denominator if denominator > 0 else math.nan, p=p, min_p=min_p,
        detectable=detectable, exact=exact))
  return CrossedResult(
      factors=tuple(factors),
      interaction_share=ss_ab / total if total > 0 and r > 1 else math.nan,
      residual_share=max(ss_resid, 0.0) / total if total > 0 else math.nan,
      per_cell=r, total_ss=total)
