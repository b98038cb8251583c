"""Time to an event over seeds (e.g. the first evaluation whose generalisation accuracy exceeds
a threshold) with the seeds that never get there kept as censored, not dropped.

* `kaplan_meier`: the Kaplan-Meier curve (Kaplan & Meier 1958; `scipy.stats.ecdf` of
  `scipy.stats.CensoredData`), its median time with the Brookmeyer-Crowley interval from the
  pointwise log-log band (each band's median read as the estimate's);
* `logrank`: two arms compared by the log-rank test (`scipy.stats.logrank`), with the Peto
  hazard ratio and Schoenfeld's minimum detectable log hazard ratio;
* `sustained`: whether a curve stays above a threshold at its last k evaluations (a single
  crossing of a curve that swings by +-0.4 is not generalisation).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Sequence

import numpy as np
import scipy.stats

from sg_jax.stats import power as power_lib
from sg_jax.stats.comparisons import Test
from sg_jax.stats.intervals import Interval, finite


@dataclasses.dataclass(frozen=True)
class KaplanMeier:
  """A Kaplan-Meier curve of the time to an event over seeds.

  Attributes:
    steps: [T] the distinct event times (training steps), ascending.
    survival: [T] the fraction of seeds that have not had the event just after each step.
    median: the median time (the first step where `survival` <= 0.5; inf: not reached) with its
      Brookmeyer-Crowley interval (log-log band; `high` inf where the band never falls to 0.5).
    n: seeds.
    events: seeds that had the event (the others are censored at their last step).
  """
  steps: np.ndarray
  survival: np.ndarray
  median: Interval
  n: int
  events: int

  def at(self, step: float) -> float:
    """The fraction of seeds without the event just after `step` (1 before the first event)."""
    k = np.searchsorted(self.steps, step, side="right")
    return 1.0 if k == 0 else float(self.survival[k - 1])


def _first_at_or_below(times: np.ndarray, curve: np.ndarray, level: float) -> float:
  below = np.flatnonzero(np.isfinite(curve) & (curve <= level + 1e-12))
  return float(times[below[0]]) if below.size else math.inf


def _as_arrays(times: Sequence[float], reached: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
  t = np.asarray(times, dtype=np.float64)
  r = np.asarray(reached, dtype=bool)
  if t.shape != r.shape or t.ndim != 1:
    raise ValueError(f"times and reached must be [S] arrays of one length, got shapes {t.shape} "
                     f"and {r.shape}")
  if not np.all(np.isfinite(t)):
    raise ValueError("every seed needs a finite time (its event step, or its last step when "
                     f"censored), got {t.tolist()}")
  return t, r


def kaplan_meier(times: Sequence[float], reached: Sequence[bool],
                 confidence: float = 0.95) -> KaplanMeier:
  """Kaplan-Meier curve and median of the time to an event; seeds that never reached it are
  censored at their time (their last evaluated step).

  Args:
    times: [S] per seed: the step of the event, or the last step for a seed that never had it.
    reached: [S] whether each seed had the event.
    confidence: coverage of the median's interval, in (0, 1).

  Returns:
    `KaplanMeier`. Without events the curve is empty and the median inf ("not reached").

  Raises:
    ValueError: shapes differ, a time is not finite, or `confidence` is outside (0, 1).
  """
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
  t, r = _as_arrays(times, reached)
  method = "Kaplan-Meier (Brookmeyer-Crowley, log-log)"
  if not r.any():
    median = Interval(math.inf if t.size else math.nan, math.nan, math.nan, int(t.size), method,
                      confidence)
    return KaplanMeier(np.zeros(0), np.zeros(0), median, int(t.size), 0)
  data = scipy.stats.CensoredData(uncensored=t[r], right=t[~r])
  sf = scipy.stats.ecdf(data).sf
  steps, survival = np.asarray(sf.quantiles), np.asarray(sf.probabilities)
  keep = np.isin(steps, t[r])  # scipy also lists the censoring times (no drop there)
  with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
    # "undefined at some observations": where S = 1 or 0 (handled below)
    warnings.simplefilter("ignore", RuntimeWarning)
    band = sf.confidence_interval(confidence, method="log-log")
    low_curve = band.low.evaluate(steps)
    high_curve = band.high.evaluate(steps)
  # S = 0 at the last event: the log-log band is undefined there; the curve has reached 0.
  low_curve = np.where(survival <= 0, 0.0, low_curve)
  high_curve = np.where(survival <= 0, 0.0, high_curve)
  median = Interval(_first_at_or_below(steps, survival, 0.5),
                    _first_at_or_below(steps, low_curve, 0.5),
                    _first_at_or_below(steps, high_curve, 0.5), int(t.size), method, confidence)
  return KaplanMeier(steps[keep], survival[keep], median, int(t.size), int(r.sum()))


def observed_expected(times1, reached1, times2, reached2) -> tuple[float, float, float, float]:
  """(O1, E1, O2, E2): events observed in each arm and expected under the null of equal hazards,
  summed over the distinct event times (the log-rank test's counts; Peto & Peto 1972)."""
  t1, r1 = _as_arrays(times1, reached1)
  t2, r2 = _as_arrays(times2, reached2)
  o1 = e1 = o2 = e2 = 0.0
  for time in np.unique(np.concatenate([t1[r1], t2[r2]])):
    at1, at2 = np.sum(t1 >= time), np.sum(t2 >= time)
    d1, d2 = np.sum((t1 == time) & r1), np.sum((t2 == time) & r2)
    o1, o2 = o1 + d1, o2 + d2
    e1 += (d1 + d2) * at1 / (at1 + at2)
    e2 += (d1 + d2) * at2 / (at1 + at2)
  return float(o1), float(e1), float(o2), float(e2)


def logrank(times1: Sequence[float], reached1: Sequence[bool], times2: Sequence[float],
            reached2: Sequence[bool], alternative: str = "two-sided") -> Test:
  """Log-rank test of two arms' times to an event (`scipy.stats.logrank`; censored seeds at
  their last step).

  Args:
    times1, reached1: [S1] the first (reference) arm, as for `kaplan_meier`.
    times2, reached2: [S2] the second arm.
    alternative: 'greater': the second arm has the event sooner (higher hazard); 'less': later.

  Returns:
    Test(name="log-rank", statistic=scipy's signed z of the second arm, effect=the log of the
    Peto hazard ratio (O2/E2) / (O1/E1) (positive: the second arm gets there sooner; +-inf when
    one arm has no event),
    detectable=Schoenfeld's log hazard ratio for the observed events, min_p=0: asymptotic).
    Without any event p and effect are nan and the test is not testable.

  Raises:
    ValueError: bad shapes or times, or an unknown alternative.
  """
  power_lib.check_alternative(alternative)
  t1, r1 = _as_arrays(times1, reached1)
  t2, r2 = _as_arrays(times2, reached2)
  n = (int(t1.size), int(t2.size))
  events = int(r1.sum() + r2.sum())
  if events == 0 or 0 in n:
    return Test("log-rank", math.nan, math.nan, n, math.nan, math.inf, alternative)
  result = scipy.stats.logrank(scipy.stats.CensoredData(uncensored=t2[r2], right=t2[~r2]),
                               scipy.stats.CensoredData(uncensored=t1[r1], right=t1[~r1]),
                               alternative=alternative)
  o1, e1, o2, e2 = observed_expected(t1, r1, t2, r2)
  with np.errstate(divide="ignore", invalid="ignore"):  # an arm without events: +-inf
    effect = float(np.log(np.float64(o2 * e1) / np.float64(e2 * o1)))
  detectable = power_lib.detectable_log_hazard_ratio(events, n[0] / sum(n),
                                                     alternative=alternative)
  return Test("log-rank", float(result.statistic), float(result.pvalue), n, effect, detectable,
              alternative, 0.0)


def sustained(steps: Sequence[float], values: Sequence[float], threshold: float,
              last_k: int = 1) -> bool:
  """Whether a seed's curve is above `threshold` at each of its last `last_k` finite evaluations.

  Args:
    steps: [T] evaluation steps (ascending; used to order only).
    values: [T] the metric at those steps (non-finite entries skipped).
    threshold: the level to stay above (strictly).
    last_k: how many final evaluations must all be above it.

  Returns:
    True iff the last `last_k` finite values all exceed `threshold`; False with fewer than
    `last_k` finite values.

  Raises:
    ValueError: `last_k` < 1 or steps and values of different lengths.
  """
  if last_k < 1:
    raise ValueError(f"last_k must be >= 1, got {last_k!r}")
  s, v = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
  if s.shape != v.shape:
    raise ValueError(f"steps and values differ in length: {s.shape} vs {v.shape}")
  order = np.argsort(s, kind="stable")
  v = finite(v[order])
  return bool(v.size >= last_k and np.all(v[-last_k:] > threshold))
