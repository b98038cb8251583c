"""Statistics over training seeds: bootstrap confidence intervals, bimodality, oscillation, rules.

Seeds of one configuration end in very different places (structural grokking: Murty et al.,
ACL 2023; data composition: Qin et al., EMNLP 2025; Ahuja et al. 2024; `docs/REFERENCE.md`).
These helpers summarise that spread for the report; every seed-mean figure and table of
`sg_jax.report` takes its confidence interval from `bootstrap_ci`.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import scipy.stats

# The question-formation rules a seed can follow (docs/tasks.md): generalisation accuracy is the
# agreement with the hierarchical rule; the two linear rules have their own agreement metrics.
RULE_METRICS = {
    "hierarchical": "out_of_domain/accuracy",
    "move_first": "out_of_domain/move_first_agreement",
    "skip_relative": "out_of_domain/skip_relative_agreement",
}


def _finite(values: Sequence[float]) -> np.ndarray:
  v = np.asarray([x for x in values if x is not None], dtype=np.float64)
  return v[np.isfinite(v)]


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, num_resamples: int = 9999,
                 seed: int = 0) -> tuple[float, float, float]:
  """Seed mean with a nonparametric bootstrap confidence interval (seeds resampled).

  The percentile interval of the mean over `num_resamples` resamples of the seeds with
  replacement (`scipy.stats.bootstrap`, method 'percentile'; Efron & Tibshirani 1993, ch. 13).
  Non-finite values (seeds without the metric) are dropped first.

  Args:
    values: [S] one value per seed.
    confidence: coverage of the interval, in (0, 1).
    num_resamples: bootstrap resamples.
    seed: seed of the resampling, so that a report is reproducible.

  Returns:
    (mean, low, high). With one finite value the interval is (value, value); with none all
    three are nan.

  Raises:
    ValueError: `confidence` outside (0, 1) or `num_resamples` < 1.
  """
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
  if num_resamples < 1:
    raise ValueError(f"num_resamples must be >= 1, got {num_resamples!r}")
  v = _finite(values)
  if v.size == 0:
    return math.nan, math.nan, math.nan
  mean = float(v.mean())
  if v.size == 1 or np.all(v == v[0]):
    return mean, mean, mean
  res = scipy.stats.bootstrap((v,), np.mean, n_resamples=num_resamples,
                              confidence_level=confidence, method="percentile",
                              rng=np.random.default_rng(seed))
  return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)


def sarle_bimodality(values: Sequence[float]) -> float:
  """Sarle's bimodality coefficient b = (g^2 + 1) / (k + 3 (n-1)^2 / ((n-2)(n-3))).

  g is the sample skewness and k the sample excess kurtosis, both bias-corrected
  (SAS Institute 1990; Pfister et al. 2013, "Good things peak in pairs"). b > 5/9 (0.555, the
  value of a uniform distribution) suggests a bimodal distribution, e.g. seeds that generalise
  next to seeds stuck on a linear rule.

  Args:
    values: [S] one value per seed (non-finite dropped).

  Returns:
    b, unitless; nan with fewer than 4 finite values or when all values are equal.
  """
  v = _finite(values)
  n = v.size
  if n < 4 or np.all(v == v[0]):
    return math.nan
  g = scipy.stats.skew(v, bias=False)
  k = scipy.stats.kurtosis(v, fisher=True, bias=False)
  return float((g ** 2 + 1) / (k + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))))


def oscillation(values: Sequence[float], last: int = 5) -> float:
  """Standard deviation (population, ddof 0) of one seed's last `last` finite evaluations.

  Args:
    values: [T] a metric over evaluations, in step order.
    last: number of final evaluations (K).

  Returns:
    The standard deviation in the metric's unit; nan with fewer than 2 finite values.

  Raises:
    ValueError: `last` < 2.
  """
  if last < 2:
    raise ValueError(f"last must be >= 2, got {last!r}")
  v = _finite(values)[-last:]
  return float(v.std()) if v.size >= 2 else math.nan


def dominant_rules(agreements: Mapping[str, Sequence[float]], margin: float = 0.0) -> list:
  """The rule each evaluation agrees with most.

  Args:
    agreements: {rule name: [T] agreement (fraction) with that rule}, all over the same steps.
    margin: the leading rule must beat the runner-up by more than this (fraction); otherwise
      the evaluation has no dominant rule (None).

  Returns:
    [T] rule names (or None: a tie within `margin`, or a non-finite value).

  Raises:
    ValueError: no rules, or series of different lengths.
  """
  if not agreements:
    raise ValueError("no rule agreements given")
  names = list(agreements)
  series = [np.asarray(agreements[n], dtype=np.float64) for n in names]
  if len({s.shape for s in series}) != 1 or series[0].ndim != 1:
    raise ValueError("every rule's agreement series must have the same length, got "
                     + ", ".join(f"{n}: {s.shape}" for n, s in zip(names, series)))
  table = np.stack(series)
  out = []
  for column in table.T:
    if not np.all(np.isfinite(column)):
      out.append(None)
      continue
    order = np.argsort(-column, kind="stable")
    lead = column[order[0]] - (column[order[1]] if len(column) > 1 else -np.inf)
    out.append(names[order[0]] if lead > margin else None)
  return out


def rule_switches(rules: Sequence) -> int:
  """How often the dominant rule changes along training (evaluations without one are skipped).

  Args:
    rules: [T] `dominant_rules` output.

  Returns:
    The number of changes between consecutive evaluations that have a dominant rule.
  """
  known = [r for r in rules if r is not None]
  return sum(a != b for a, b in zip(known, known[1:]))
