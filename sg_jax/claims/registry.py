"""The registry of claims, the decision rules and the Claims table.

A `Claim` states, before it sees a number, its source, what it needs, its test and its decision
rule; its `evaluate(runs)` returns one `Outcome` per setting it finds in the runs (a task and
depth range, a run's seed groups, ...), [] when the runs hold nothing it can test ("no runs").
Every verdict is one of `VERDICTS` and comes from `decide` (or a rule that says in its `rule`
text how it departs from it), at `ALPHA` = 0.05 two-sided:

* directional claims (`direction` +1 / -1): p < alpha with the effect in the claimed direction
  -> "supported"; p < alpha against it -> "contradicted"; otherwise "not testable at this n",
  with the minimum detectable effect (power 0.8) at this n and, where the claim names an
  `effect_of_interest`, the seeds per arm that would detect it (`seeds_needed`);
* claims of no effect (`direction` 0, "X does not predict Y"): p < alpha -> "contradicted";
  p >= alpha AND the detectable effect at this n <= the claim's `effect_of_interest` (the test
  had power 0.8 against every effect that matters and found none) -> "supported"; otherwise
  "not testable at this n". This is the power approach to accepting a null, weaker than an
  equivalence test (the rule text says so).

Several settings of one claim are one family (`family`): their p-values are Holm-adjusted
together (`stats.holm`) before the rule is applied; the table gives both.
"""

from __future__ import annotations

import dataclasses
import logging as py_logging
import math
from typing import Callable, Sequence

from sg_jax import stats

ALPHA = 0.05
SUPPORTED, CONTRADICTED, NOT_TESTABLE = "supported", "contradicted", "not testable at this n"
VERDICTS = (SUPPORTED, CONTRADICTED, NOT_TESTABLE)
NO_RUNS = "no runs"
ERROR = "error"

log = py_logging.getLogger("sg_jax.claims")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One claim's test in one setting.

  Attributes:
    setting: what was compared, e.g. "question formation, depths 4/6/8/10".
    arms: seeds (or other units, named in `test`) per arm, e.g. (8, 8, 8, 8).
    test: the test's name (`stats.Test.name`).
    statistic: its statistic (units in `note` or the claim's `rule`).
    p: two-sided p-value (NaN for an interval rule).
    interval: an interval the rule also reads or reports, e.g. "0.62 [0.41, 0.80]
      (Clopper-Pearson, n=8)"; '' when the rule decides on `p` alone. The Claims table shows
      the p and this interval side by side.
    effect: the observed effect (the units of `detectable`).
    detectable: minimum detectable effect at alpha 0.05, power 0.8, at these arms (inf: this n
      can never reach alpha).
    verdict: one of `VERDICTS`.
    seeds_needed: seeds per arm that would make a "not testable" verdict testable for the
      claim's effect of interest (None: not computed or not needed; -1: more than searched).
    note: what the verdict rests on, in a few words.
    p_adjusted: `p` after Holm over the claim's settings (= p for one setting).
    reason: for a "not testable" verdict that more seeds cannot change, why (e.g. "the best
      depth is an end of the range"); shown beside the verdict in the Claims table.
  """

  setting: str
  arms: tuple[int, ...]
  test: str
  statistic: float
  p: float
  verdict: str
  effect: float = math.nan
  detectable: float = math.nan
  interval: str = ""
  seeds_needed: int | None = None
  note: str = ""
  p_adjusted: float = math.nan
  reason: str = ""


@dataclasses.dataclass(frozen=True)
class Claim:
  """A paper's claim as code (module docstring).

  Attributes:
    id: unique key, e.g. "murty.inverted_u".
    source: paper and section or figure.
    statement: the claim in one sentence.
    needs: the runs and columns it reads.
    test: the test used.
    rule: the decision rule in words (what `evaluate` does).
    evaluate: runs (`report.reading.Run`) -> [Outcome], [] when nothing applies.
    effect_of_interest: the smallest effect that matters, in the test's effect units (None: no
      seeds-needed search).
  """

  id: str
  source: str
  statement: str
  needs: str
  test: str
  rule: str
  evaluate: Callable[[Sequence], list[Outcome]]
  effect_of_interest: float | None = None


_REGISTRY: dict[str, Claim] = {}


def register(claim: Claim, *, replace: bool = False) -> Claim:
  """Adds `claim` to the registry (the Claims table lists every registered claim).

  Raises:
    ValueError: a claim with that id is registered already (and not `replace`), or the id is
      empty.
  """
  if not claim.id:
    raise ValueError("a claim needs a non-empty id")
  if claim.id in _REGISTRY and not replace:
    raise ValueError(f"claim {claim.id!r} is registered already")
  _REGISTRY[claim.id] = claim
  return claim


# pylint: disable-next=redefined-builtin
def claim(*, id: str, source: str, statement: str, needs: str, test: str, rule: str,
          effect_of_interest: float | None = None, replace: bool = False):
  """Decorator form of `register`: the decorated function is the claim's `evaluate`."""

  def wrap(fn):
    register(Claim(id=id, source=source, statement=statement, needs=needs, test=test, rule=rule,
                   evaluate=fn, effect_of_interest=effect_of_interest), replace=replace)
    return fn

  return wrap


def unregister(claim_id: str) -> None:
  """Removes a claim (tests that register their own).

  Raises:
    KeyError: no claim with that id.
  """
  del _REGISTRY[claim_id]


def claims() -> dict[str, Claim]:
  """{id: Claim} of every registered claim, in registration order."""
  return dict(_REGISTRY)


def decide(test: stats.Test, direction: int, *, p: float | None = None,
           effect_of_interest: float | None = None, alpha: float = ALPHA) -> str:
  """The verdict of one test under the module docstring's rule.

  Args:
    test: the test (its effect and detectable in the same units).
    direction: +1 / -1: the claim predicts a positive / negative effect; 0: no effect.
    p: the p-value to decide on (default `test.p`; a Holm-adjusted one for a family). For
      direction 0 it decides "contradicted"; "supported" also needs `test.p` >= alpha.
    effect_of_interest: for direction 0, the largest effect that would not matter.
    alpha: the level.

  Raises:
    ValueError: direction not in (-1, 0, 1), or direction 0 without `effect_of_interest`.
  """
  if direction not in (-1, 0, 1):
    raise ValueError(f"direction must be -1, 0 or 1, got {direction}")
  p = test.p if p is None else p
  significant = math.isfinite(p) and p < alpha
  if direction == 0:
    if effect_of_interest is None:
      raise ValueError("a claim of no effect needs its effect_of_interest")
    if significant:
      return CONTRADICTED
    # supported only where the test's own p does not reject either: an adjusted (Holm) p is
    # larger, and would make "no effect" easier to support than its detectable effect, computed
    # at alpha, allows
    return (SUPPORTED if test.p >= alpha and test.detectable <= effect_of_interest
            else NOT_TESTABLE)
  if not significant or test.effect == 0:
    return NOT_TESTABLE
  return SUPPORTED if math.copysign(1, test.effect) == direction else CONTRADICTED


# The most seeds per arm the seeds-needed search tries.
MAX_SEEDS = 256


def seeds_needed(detectable_at: Callable[..., float], target: float,
                 family_size: int = 1) -> int:
  """Seeds per arm at which a test would detect an effect of size `target`
  (`stats.seeds_per_arm` over `detectable_at`, (n, alpha) -> minimum detectable effect with
  power 0.8, from `claims.detect`: the observed spread with the test's power formula, so a
  projection).

  In a Holm family of m comparisons a comparison is sure to be rejected, whatever the others
  give, only when its own p is below alpha / m (Holm's first step, Holm 1979), so the power is
  computed at alpha / `family_size`: the seeds that make the comparison testable as the claim
  tests it, not as it would be tested alone. A `detectable_at` with `saw_tooth = True` (an exact
  test with discrete outcomes, `claims.detect.proportion`) is searched n by n for the fewest.

  Args:
    detectable_at: (n, alpha) -> minimum detectable effect with n seeds per arm.
    target: the effect to detect (the claim's effect of interest), in the same unit.
    family_size: comparisons in the claim's Holm family (1: none).

  Returns:
    n, or -1 when more than `MAX_SEEDS` would be needed.

  Raises:
    ValueError: `family_size` < 1.
  """
  if family_size < 1:
    raise ValueError(f"family_size must be >= 1, got {family_size}")
  alpha = ALPHA / family_size
  needed = stats.seeds_per_arm(target, lambda n: detectable_at(n, alpha=alpha),
                               max_n=MAX_SEEDS,
                               saw_tooth=getattr(detectable_at, "saw_tooth", False))
  return -1 if needed is None else int(needed)


@dataclasses.dataclass(frozen=True)
class Item:
  """One setting's test, before the family's Holm adjustment and the verdict (`family`).

  Attributes:
    setting, arms, note, interval, reason: as `Outcome`.
    test: the test.
    detectable_at: (seeds per arm n, alpha) -> the test's minimum detectable effect with n
      seeds per arm at level alpha (`claims.detect`), for the seeds-needed column; None: not
      computed.
  """

  setting: str
  arms: tuple[int, ...]
  test: stats.Test
  detectable_at: Callable[..., float] | None = None
  note: str = ""
  interval: str = ""
  reason: str = ""


def untestable(setting: str, arms: tuple[int, ...], test_name: str, note: str,
               reason: str = "") -> Item:
  """An item for a setting whose runs are there but lack what the test reads (e.g. no seed
  saturates): "not testable at this n" with the reason in `note` (and in `reason`, shown in
  the Claims table, when more seeds would not help), never "no runs"."""
  return Item(setting, arms, stats.Test(test_name, math.nan, math.nan, arms, math.nan,
                                        math.inf, min_p=1.0), note=note, reason=reason)


def family(items: Sequence[Item], direction: int | Sequence[int],
           effect_of_interest: float | None = None) -> list[Outcome]:
  """Outcomes of a claim tested in several settings: p-values Holm-adjusted over `items`
  (`stats.holm`), each verdict from `decide` on its adjusted p (a claim of no effect, direction
  0, is contradicted on the adjusted p but supported only where the unadjusted p is >= alpha,
  as its detectable effect is computed at alpha), and for a "not testable"
  verdict the seeds per arm that would detect `effect_of_interest` (`seeds_needed`, at alpha
  over the family's size for a directional claim, as Holm tests it; for a claim of no effect,
  the seeds at which its detectable effect, at alpha, falls to it).

  Args:
    items: one per setting.
    direction: as `decide`, one for all items or one per item.
    effect_of_interest: as `Claim.effect_of_interest`.
  """
  if not items:
    return []
  directions = [direction] * len(items) if isinstance(direction, int) else list(direction)
  ps = [i.test.p for i in items]
  finite = [k for k, p in enumerate(ps) if math.isfinite(p)]
  adjusted = list(ps)
  if len(finite) > 1:
    for k, q in zip(finite, stats.holm([ps[k] for k in finite])):
      adjusted[k] = float(q)
  out = []
  for item, p, sign in zip(items, adjusted, directions):
    verdict = decide(item.test, sign, p=p, effect_of_interest=effect_of_interest)
    needed = None
    if verdict == NOT_TESTABLE and effect_of_interest is not None and item.detectable_at:
      needed = seeds_needed(item.detectable_at, effect_of_interest,
                            family_size=max(1, len(finite)) if sign else 1)
    out.append(Outcome(setting=item.setting, arms=item.arms, test=item.test.name,
                       statistic=item.test.statistic, p=item.test.p, p_adjusted=p,
                       verdict=verdict, effect=item.test.effect,
                       detectable=item.test.detectable, interval=item.interval,
                       seeds_needed=needed, note=item.note, reason=item.reason))
  return out


def evaluate(runs: Sequence, ids: Sequence[str] | None = None) -> list[dict]:
  """Every registered claim (or those of `ids`) on `runs`: one row per outcome, and one row
  with verdict "no runs" for a claim the runs cannot test. A claim whose evaluation raises gets
  one row with verdict "error" (the exception in its note, and logged), so one broken claim
  does not hide the others.

  Returns:
    [{'claim', 'setting', 'seeds per arm', 'test', 'statistic', 'p or interval',
      'detectable effect', 'verdict', 'seeds needed', 'source', 'statement', 'note', 'rule',
      'reason'}] (the Claims table's columns first, in its order: `COLUMNS`).

  Raises:
    KeyError: an id in `ids` is not registered.
  """
  chosen = [_REGISTRY[i] for i in ids] if ids is not None else list(_REGISTRY.values())
  rows = []
  for c in chosen:
    try:
      outcomes = c.evaluate(runs)
    except Exception as e:  # pylint: disable=broad-except
      log.warning("claim %s failed: %s: %s", c.id, type(e).__name__, e)
      rows.append(_row(c, Outcome(setting="", arms=(), test=c.test, statistic=math.nan,
                                  p=math.nan, verdict=ERROR, note=f"{type(e).__name__}: {e}")))
      continue
    if not outcomes:
      rows.append(_row(c, Outcome(setting="", arms=(), test=c.test, statistic=math.nan,
                                  p=math.nan, verdict=NO_RUNS)))
      continue
    rows += [_row(c, o) for o in outcomes]
  return rows


def _num(v: float, digits: int = 3) -> str:
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return ""
  if isinstance(v, float) and math.isinf(v):
    return "none at this n"
  return f"{v:.{digits}g}"


def p_text(p: float, p_adjusted: float = math.nan) -> str:
  """'p = 0.0312', with ' (Holm 0.0625)' when the adjusted p differs; '' for a NaN p."""
  if not math.isfinite(p):
    return ""
  text = f"p = {p:.3g}"
  if math.isfinite(p_adjusted) and p_adjusted != p:
    text += f" (Holm {p_adjusted:.3g})"
  return text


def _p_cell(o: Outcome) -> str:
  """The p (with Holm's) and the interval the rule reads, whichever the outcome has."""
  return "; ".join(t for t in (p_text(o.p, o.p_adjusted), o.interval) if t)


def _row(c: Claim, o: Outcome) -> dict:
  needed = ("" if o.seeds_needed is None else f"more than {MAX_SEEDS}" if o.seeds_needed == -1
            else str(o.seeds_needed))
  return {"claim": c.id, "setting": o.setting, "seeds per arm": " / ".join(map(str, o.arms)),
          "test": o.test, "statistic": _num(o.statistic), "p or interval": _p_cell(o),
          "detectable effect": _num(o.detectable), "verdict": o.verdict,
          "seeds needed": needed, "source": c.source, "statement": c.statement,
          "note": o.note, "rule": c.rule, "reason": o.reason}


COLUMNS = ("claim", "setting", "seeds per arm", "test", "statistic", "p or interval",
           "detectable effect", "verdict")


def markdown_table(rows: Sequence[dict]) -> list[str]:
  """The Claims table as markdown lines (`COLUMNS`; the reason, else the seeds needed, folded
  into the verdict of a "not testable" row), no heading."""
  lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  for r in rows:
    cells = [str(r[k]).replace("|", "/") for k in COLUMNS]
    if r["verdict"] == NOT_TESTABLE and r.get("reason"):
      cells[-1] += f" ({r['reason']})"
    elif r["verdict"] == NOT_TESTABLE and r["seeds needed"]:
      cells[-1] += f" (seeds per arm to test: {r['seeds needed']})"
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def markdown_lines(rows: Sequence[dict]) -> list[str]:
  """The "Claims" section of summary.md ([] without rows)."""
  if not rows:
    return []
  tested = [r for r in rows if r["verdict"] != NO_RUNS]
  absent = [r["claim"] for r in rows if r["verdict"] == NO_RUNS]
  lines = ["", "## Claims", ""]
  lines += [*markdown_table(tested), ""] if tested else []
  if absent:
    lines += ["No runs here for: " + ", ".join(f"`{c}`" for c in absent) + ".", ""]
  lines += [
           "Each row is a registered claim (`sg_jax.claims`, docs/claims.md) tested on the runs "
           "of this root (claims.csv lists the others as \"no runs\"). Verdicts at "
           "alpha 0.05 (two-sided; Holm over a claim's settings): supported / contradicted when "
           "the test rejects with / against the claimed direction; \"not testable at this n\" "
           "otherwise, with the smallest effect the test detects with power 0.8 at these seeds "
           "(\"none at this n\": no outcome can reach alpha) and the seeds per arm that would "
           "detect the claim's effect of interest. claims.csv has each claim's source, rule and "
           "note."]
  notes = [f"* `{r['claim']}` ({r['setting'] or 'no runs'}): {r['note']}" for r in rows
           if r["note"]]
  if notes:
    lines += ["", "Notes:", "", *notes]
  return lines
