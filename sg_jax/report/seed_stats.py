"""Statistics over training seeds for the report: seed means with their t-intervals, how an
interval is named in a table, bimodality, oscillation, rules.

Seeds of one configuration end in very different places (structural grokking: Murty et al.,
ACL 2023; data composition: Qin et al., EMNLP 2025; Ahuja et al. 2024; `docs/REFERENCE.md`).
These helpers summarise that spread for the report; every seed-mean figure and table of
`sg_jax.report` takes its confidence interval from `seed_mean` (Student's t, `sg_jax.stats`,
whose coverage holds at 4 seeds; docs/analysis.md, "Statistics") and names the method and n
in its header (`interval_header`). `bootstrap_ci` (percentile bootstrap) is kept for callers
that still use it; it covers about 78% at 4 seeds.
"""

from __future__ import annotations

import collections
import math
from typing import Mapping, Sequence

import numpy as np
import scipy.stats

from sg_jax import stats

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


def seed_mean(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
  """(mean, low, high): the seed mean with its Student t interval (`stats.mean_interval`; nan
  bounds from one seed, all nan from none).

  Args:
    values: [S] one value per seed (non-finite dropped).
  """
  got = stats.mean_interval(values, confidence)
  return got.estimate, got.low, got.high


def interval_header(what: str, ns: Sequence[int], confidence: float = 0.95,
                    method: str = "t") -> str:
  """A table header that names the interval's method and n: 'gen. acc. (final): mean [95% t-CI,
  n=4]', or '..., n per row]' when the rows' seed counts differ (the cells then give n).

  Args:
    what: the quantity.
    ns: the seed count behind each row's interval (0: no interval, ignored).
  """
  counts = sorted({int(n) for n in ns if n})
  n = f"n={counts[0]}" if len(counts) == 1 else "n per row"
  return f"{what}: mean [{confidence:.0%} {method}-CI, {n}]"


def interval_cell(mean: float, low: float, high: float, n: int | None = None,
                  digits: int = 3) -> str:
  """'0.65 [0.44, 0.86]' (`digits` significant digits), '0.65' without bounds (one seed), ''
  without a mean; ' (n=3)' appended when `n` is given (rows of different seed counts)."""
  fmt = lambda v: f"{v:.{digits}g}"
  if mean is None or not math.isfinite(mean):
    return ""
  cell = (fmt(mean) if low is None or not (math.isfinite(low) and math.isfinite(high))
          else f"{fmt(mean)} [{fmt(low)}, {fmt(high)}]")
  return cell + (f" (n={n})" if n is not None else "")


def rule_counts(rules: Sequence[str | None]) -> str:
  """'hierarchical 2, skip_relative 2': seeds per final rule (None: no rule), '' without any."""
  counts = collections.Counter(r for r in rules if r is not None)
  return ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items()))


def sarle_bimodality(values: Sequence[float]) -> float:
  """Sarle's bimodality coefficient of the finite values (`stats.sarle_bimodality`): nan with
  fewer than 4 or equal values. It can exceed 5/9 only from 6 seeds on (`stats.sarle_signals`);
  the report shows it only there."""
  return stats.sarle_bimodality(values)


def shown_bimodality(values: Sequence[float]) -> float:
  """`sarle_bimodality` where it can signal at this many finite values (`stats.sarle_signals`:
  6 or more), nan below (a table shows the seeds per final rule instead)."""
  n = stats.finite(values).size
  return sarle_bimodality(values) if stats.sarle_signals(n) else math.nan


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
