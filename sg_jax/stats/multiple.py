"""Multiple comparisons: Holm's step-down correction (Holm 1979) where one table tests several
constructions, predictors or groups at once.

The arithmetic is statsmodels' (`statsmodels.stats.multitest.multipletests(method="holm")`,
which tests/stats/test_stats.py checks it against); it is written out here because statsmodels' holm
branch calls `gc.collect()` on every call, about 0.7 s in a process that holds JAX, and the
report corrects many small tables.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def holm(pvalues: Sequence[float]) -> np.ndarray:
  """Holm-adjusted p-values: the k-th smallest of m is max over j <= k of (m - j + 1) p_(j),
  capped at 1; reject at level alpha where the adjusted p <= alpha (family-wise error <= alpha).

  Args:
    pvalues: [m] raw p-values of one family; nan entries (tests that could not be run) stay nan
      and do not count in m.

  Returns:
    [m] adjusted p-values, in the input order.

  Raises:
    ValueError: a finite p-value outside [0, 1].
  """
  p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
  out = np.full(p.shape, np.nan)
  ok = np.flatnonzero(np.isfinite(p))
  if np.any((p[ok] < 0) | (p[ok] > 1)):
    raise ValueError(f"p-values must lie in [0, 1], got {p[ok].tolist()}")
  order = ok[np.argsort(p[ok], kind="stable")]
  scaled = p[order] * np.arange(order.size, 0, -1)
  out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
  return out
