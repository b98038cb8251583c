"""Onsets of a training run, per seed (Chen et al., ICLR 2024, docs/REFERENCE.md §3;
docs/sas.md, "Onsets").

Chen et al. see syntactic attention structure appear abruptly ("structure onset", the sharpest
rise of UAS) together with a sudden drop of the loss, and capabilities follow ("capabilities
onset"). `seed_onsets` finds, for every seed of a workdir:

* `structure`: the sharpest rise of `in_domain/uas` (metrics.csv; `uas` of analysis.csv when
  the run logged none);
* `loss_drop`: the steepest fall of `train/loss` (in practice the initial descent, which every
  run has; it cannot test whether structure arrives with a *later* drop);
* `later_loss_drop`: the largest drop of `train/loss` after the initial descent (`later_fall`,
  `onset_detection`), NaN when the loss only decelerates;
* `in_domain`, `out_of_domain`: the sharpest rise of `in_domain/accuracy` and of
  `out_of_domain/accuracy` (the capabilities onsets); a run without them (a masked LM, whose
  evaluation has no teacher-forced task metric) is read on its `<split>/preference`, else its
  `<split>/masked_accuracy`.

Each curve's onset is located by `onset_detection.onset` (a Gaussian-smoothed derivative with
a threshold relative to the noise; for `later_loss_drop` the steepest fall after the first
plateau), whose module docstring gives the algorithm and the resolution at which two onsets
are ordered (`onset_detection.compare`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Mapping, Sequence

import numpy as np

from sg_jax.analysis.onset_detection import MIN_POINTS, NO_ONSET, Onset, onset
from sg_jax.records import fileio
from sg_jax.records import long_csv

SIGNALS = {  # name -> (metric names, first present is used; direction)
    "structure": (("in_domain/uas", "uas"), "rise"),
    "loss_drop": (("train/loss",), "fall"),
    "later_loss_drop": (("train/loss",), "later_fall"),
    # a masked LM logs no teacher-forced accuracy: its minimal-pair preference, else its
    # masked-token accuracy, is its capability (docs/objectives.md)
    "in_domain": (("in_domain/accuracy", "in_domain/preference", "in_domain/masked_accuracy"),
                  "rise"),
    "out_of_domain": (("out_of_domain/accuracy", "out_of_domain/preference",
                       "out_of_domain/masked_accuracy"), "rise"),
}


def series_of(rows: Sequence[tuple]) -> dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]:
  """{name: {seed: (steps [T], values [T])}} of long-format rows (a repeated row keeps the
  last)."""
  acc: dict = {}
  for step, seed, name, value in rows:
    acc.setdefault(name, {}).setdefault(int(seed), {})[int(step)] = float(value)
  return {name: {seed: (np.array(sorted(d), np.float64),
                        np.array([d[k] for k in sorted(d)], np.float64))
                 for seed, d in by_seed.items()} for name, by_seed in acc.items()}


def seed_onsets(series: Mapping[str, Mapping[int, tuple]], *, sigma: float | None = None,
                min_snr: float = 3.0, strict: bool = False) -> dict[int, dict[str, Onset]]:
  """`SIGNALS` onsets of every seed.

  Args:
    series: `series_of` output (or `report.reading.Run.series`: metrics.csv and analysis.csv
      merged).
    sigma, min_snr: as `onset`.
    strict: refuse a signal the run logged at too few points (the CLI) instead of giving it no
      onset (the report, which draws what it can).

  Returns:
    {seed: {signal: Onset}}; a signal the run did not log is `NO_ONSET`, and so is one with
    fewer than `MIN_POINTS` finite points unless `strict`.

  Raises:
    ValueError (only if `strict`): a logged signal with fewer than `MIN_POINTS` finite points
      for some seed, naming the signal, its metric, the seeds and the count.
  """
  seeds = sorted({s for by_seed in series.values() for s in by_seed})
  out: dict[int, dict[str, Onset]] = {s: {} for s in seeds}
  for signal, (names, direction) in SIGNALS.items():
    name = next((n for n in names if n in series), None)
    sparse = {}
    for seed in seeds:
      curve = series.get(name, {}).get(seed) if name else None
      points = 0 if curve is None else int(np.sum(np.isfinite(curve[1])))
      if points < MIN_POINTS:
        if points:
          sparse[seed] = points
        out[seed][signal] = NO_ONSET
        continue
      out[seed][signal] = onset(curve[0], curve[1], direction, sigma=sigma, min_snr=min_snr)
    if strict and sparse:
      raise ValueError(
          f"{signal} onset: {name} has only {min(sparse.values())} logged points for seed(s) "
          f"{sorted(sparse)} and an onset needs at least {MIN_POINTS}; evaluate (and so log "
          "train/loss) more often, e.g. --config.eval.dense_until=1000 "
          "--config.eval.dense_every=100")
  return out


def workdir_onsets(workdir: str, **kwargs) -> dict[int, dict[str, Onset]]:
  """`seed_onsets` of WORKDIR/metrics.csv and WORKDIR/analysis.csv (when present).

  Raises:
    FileNotFoundError: no metrics.csv.
  """
  rows = long_csv.read_rows(os.path.join(workdir, "metrics.csv"))
  rows += long_csv.read_rows(os.path.join(workdir, "analysis.csv"), missing_ok=True)
  return seed_onsets(series_of(rows), **kwargs)


def write_onsets(path: str, onsets: Mapping[int, Mapping[str, Onset]]) -> None:
  """Writes `seed,signal,step,slope,change,noise,resolution` rows (atomically; NaN: no
  onset)."""
  lines = ["seed,signal,step,slope,change,noise,resolution\n"]
  for seed, by_signal in sorted(onsets.items()):
    for signal, o in by_signal.items():
      lines.append(f"{seed},{signal},{o.step!r},{o.slope!r},{o.change!r},{o.noise!r},"
                   f"{o.resolution!r}\n")
  fileio.write_atomic(path, "".join(lines))


def format_table(onsets: Mapping[int, Mapping[str, Onset]]) -> str:
  """A plain-text table: one line per seed, the onset step of each signal ('-' for none)."""
  signals = list(SIGNALS)
  lines = ["seed " + " ".join(f"{s:>13}" for s in signals)]
  for seed, by_signal in sorted(onsets.items()):
    cells = [("-" if math.isnan(by_signal[s].step) else f"{by_signal[s].step:.0f}")
             for s in signals]
    lines.append(f"{seed:>4} " + " ".join(f"{c:>13}" for c in cells))
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m sg_jax.analysis.onsets --workdir=W [--sigma=STEPS] [--min_snr=3]`: prints the
  onsets of every seed and writes them to W/onsets.csv. A signal logged at fewer than
  `MIN_POINTS` points is refused in one line."""
  parser = argparse.ArgumentParser(prog="python -m sg_jax.analysis.onsets",
                                   description=main.__doc__)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--sigma", type=float, default=None,
                      help="smoothing in steps (default: 2 x the median gap between steps)")
  parser.add_argument("--min_snr", type=float, default=3.0)
  args = parser.parse_args(argv)
  try:
    found = workdir_onsets(args.workdir, sigma=args.sigma, min_snr=args.min_snr, strict=True)
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"error: {e}")
  path = os.path.join(args.workdir, "onsets.csv")
  write_onsets(path, found)
  print(format_table(found))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
