"""Phase transitions (sg_jax/analysis/phase_onsets.py, the peak / change events of
sg_jax/analysis/onset_detection.py, sg_jax/report/phase_transitions.py) on synthetic curves with
known onsets:
every signal's onset found, consecutive quantities placed between their checkpoints, the lags
and their order with t CIs, the two figures and the summary section."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from sg_jax.analysis import onset_detection, phase_onsets
from sg_jax.report import phase_transitions as report_phases
from sg_jax.report.reading import Run

STEPS = np.arange(0, 10_001, 200)
# seed -> onset of each signal (steps); generalisation comes last.
TRUE = {0: {"loss": 1_000, "tvd": 1_600, "uas": 2_000, "cka_final": 4_000,
            "intrinsic_dimension": 3_000, "tscore": 5_000, "generalisation": 6_000},
        1: {"loss": 1_400, "tvd": 1_800, "uas": 2_400, "cka_final": 4_400,
            "intrinsic_dimension": 3_400, "tscore": 5_600, "generalisation": 7_000},
        2: {"loss": 1_200, "tvd": 2_000, "uas": 2_200, "cka_final": 4_200,
            "intrinsic_dimension": 3_200, "tscore": 5_400, "generalisation": 6_400}}


def sigmoid(t, t0, width=250.0, low=0.0, high=1.0):
  return low + (high - low) / (1.0 + np.exp(-(np.asarray(t, np.float64) - t0) / width))


def bump(t, t0, width=500.0):
  return 0.02 + np.exp(-0.5 * ((np.asarray(t, np.float64) - t0) / width) ** 2)


def synthetic_series(seed_noise=0.01):
  """{name: {seed: (steps, values)}} as a run's metrics.csv + analysis.csv give them."""
  rng = np.random.default_rng(0)
  noise = lambda: rng.normal(0, seed_noise, STEPS.size)
  series = {}
  for seed, t in TRUE.items():
    add = lambda name, steps, values: series.setdefault(name, {}).__setitem__(
        seed, (np.asarray(steps), np.asarray(values)))
    add("train/loss", STEPS, sigmoid(STEPS, t["loss"], low=3.0, high=0.5) + noise())
    add("in_domain/uas", STEPS, sigmoid(STEPS, t["uas"]) + noise())
    add("cka_final", STEPS, sigmoid(STEPS, t["cka_final"], low=0.3) + noise())
    add("tvd_final", STEPS, sigmoid(STEPS, t["cka_final"], low=0.5, high=0.0))
    # consecutive: the row of step s measures the change between s - 200 and s.
    add("tvd_previous", STEPS[1:], bump(STEPS[1:] - 100, t["tvd"]) + noise()[1:])
    add("twonn_dimension", STEPS,
        sigmoid(STEPS, t["intrinsic_dimension"], low=12.0, high=7.0) + 10 * noise())
    add("tscore", STEPS, sigmoid(STEPS, t["tscore"], low=0.2, high=0.8) + noise())
    add("out_of_domain/accuracy", STEPS, sigmoid(STEPS, t["generalisation"]) + noise())
  return series


def test_peak_and_change_events():
  steps = np.arange(0, 10_001, 100)
  got = onset_detection.onset(steps, bump(steps, 4_000), "peak")
  assert got.step == pytest.approx(4_000, abs=1e-6) and got.change > 0.9
  falling = sigmoid(steps, 6_000, low=12.0, high=7.0)
  assert onset_detection.onset(steps, falling, "change").step == pytest.approx(6_000, abs=1e-6)
  assert onset_detection.onset(steps, falling, "change").change < 0
  # a curve largest at its start peaks there (one side only).
  assert onset_detection.onset(steps, 1.0 / (1 + steps / 500.0), "peak").step == 0
  flat = 0.5 + np.random.default_rng(1).normal(0, 0.05, steps.size)
  assert math.isnan(onset_detection.onset(steps, flat, "peak").step)
  assert math.isnan(onset_detection.onset(steps, flat, "change").step)


def test_midpoints_of_consecutive_rows():
  checkpoints = np.array([0, 100, 300, 700])
  np.testing.assert_array_equal(phase_onsets.midpoints([100, 300, 700], checkpoints), [50, 200, 500])
  np.testing.assert_array_equal(phase_onsets.midpoints([0], checkpoints), [0])


def test_every_signal_onset_is_found():
  found = phase_onsets.phase_onsets(synthetic_series())
  assert sorted(found) == sorted(TRUE)
  for seed, truth in TRUE.items():
    assert list(found[seed]) == list(phase_onsets.SIGNALS)
    for signal, step in truth.items():
      assert abs(found[seed][signal].step - step) <= 200, (seed, signal)
  curves = phase_onsets.curves(synthetic_series())
  assert curves["tvd"][0] == "tvd_previous"
  np.testing.assert_array_equal(curves["tvd"][1][0][0], STEPS[1:] - 100)  # midpoints
  # too few points: no onset, no error.
  short = {"train/loss": {0: (np.arange(5), np.linspace(3, 1, 5))}}
  assert math.isnan(phase_onsets.phase_onsets(short)[0]["loss"].step)


def _run(series):
  return Run(workdir="/nonexistent", name="synthetic", depth=6, task="question",
             num_steps=int(STEPS[-1]), series=series)


def test_order_lags_table_figures_and_summary(tmp_path):
  run = _run(synthetic_series())
  found = phase_onsets.phase_onsets(run.series)
  ranked = report_phases.order(found)
  # the sigmoid loss has no drop after its (only) descent: no later_loss_drop onset, last.
  assert [r[0] for r in ranked] == ["loss", "tvd", "uas", "intrinsic_dimension", "cka_final",
                                    "tscore", "generalisation", "later_loss_drop"]
  assert ranked[-1][4] == 0 and all(r[5] == 400 for r in ranked[:-1])  # 2 gaps of 200
  lag = report_phases.lag(found, "cka_final", "generalisation")
  want = np.mean([found[s]["cka_final"].step - found[s]["generalisation"].step for s in TRUE])
  assert lag["mean"] == pytest.approx(want) and lag["seeds"] == 3
  assert (lag["before"], lag["tied"], lag["after"]) == (3, 0, 0)
  assert lag["low"] <= lag["mean"] <= lag["high"] < 0
  rows = report_phases.table_rows(run, found)
  assert [r["signal"] for r in rows] == [r[0] for r in ranked]
  by_signal = {r["signal"]: r for r in rows}
  assert by_signal["cka_final"]["lag_to_generalisation"] == pytest.approx(want)
  assert by_signal["tvd"]["metric"] == "tvd_previous" and by_signal["tvd"]["event"] == "peak"
  assert by_signal["cka_final"]["before_generalisation"] == 3
  assert by_signal["cka_final"]["resolution"] == 400
  assert "lag_to_loss" not in by_signal["loss"]
  lines = "\n".join(report_phases.markdown_lines([(run, found)]))
  assert "## Phase transitions" in lines and "### `synthetic`" in lines
  assert "'≈' = tied at this resolution): loss (" in lines
  assert "| cka_final | rise | 3/3 | 400 |" in lines

  written = []

  def optional(name, plot):
    path = os.path.join(tmp_path, name)
    if plot(path) is not None:
      written.append(name)

  assert report_phases.draw(run, optional, "question: ") is not None
  assert written == ["phases_synthetic.png", "onset_order_synthetic.png"]
  assert all(os.path.getsize(os.path.join(tmp_path, n)) > 0 for n in written)
  fig = report_phases.plot_phases(run, found, str(tmp_path / "p.png"))
  # one panel per metric: the loss's two events share one.
  titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
  assert len(titles) == len(phase_onsets.SIGNALS) - 1
  assert "fall (--), resolution 400; later_fall: none found" in titles[0]  # no later drop
  # a run without the training-dynamics columns gets neither figure.
  plain = _run({k: v for k, v in run.series.items() if k in ("train/loss",
                                                             "out_of_domain/accuracy")})
  written.clear()
  assert report_phases.draw(plain, optional) is None and not written


def test_curves_too_short_for_onsets_are_said_once_not_tabled(tmp_path):
  """A quick run: 4 evaluations and checkpoints (no onset can be located: 9 points needed),
  the loss logged densely (its onset is)."""
  full = synthetic_series()
  few_steps = STEPS[::len(STEPS) // 4][:4]
  series = {name: {s: (few_steps, np.interp(few_steps, *curve)) for s, curve in by.items()}
            for name, by in full.items()}
  run = _run(series)
  found = phase_onsets.phase_onsets(run.series)
  assert report_phases.curve_points(run)["uas"] == 4
  text = "\n".join(report_phases.markdown_lines([(run, found)]))
  assert "No onset table: too few evaluations for an onset: " in text
  assert "uas 4 points" in text and "at least 9" in text
  assert "| seed |" not in text and "0/3" not in text  # no table of '-' cells
  fig = report_phases.plot_phases(run, found, str(tmp_path / "few.png"))
  labels = [t.get_text() for ax in fig.axes for t in (ax.get_legend().get_texts()
                                                       if ax.get_legend() else [])]
  assert "seed 0" in labels and not any("onset" in label for label in labels if "seed" in label)
  assert all("none found (4 points, 9 needed)" in ax.get_title()
             for ax in fig.axes if ax.get_title())
  # the loss logged at every step (dense) keeps its row; the 4-point curves are named once
  series["train/loss"] = full["train/loss"]
  run = _run(series)
  found = phase_onsets.phase_onsets(run.series)
  text = "\n".join(report_phases.markdown_lines([(run, found)]))
  assert "Left out, too few evaluations for an onset: " in text
  assert "| seed | loss | later_loss_drop |" in text


def _hand_made(steps_by_signal, resolution_by_signal):
  """{seed: {signal: Onset}} with the given steps (per seed) and resolutions (per signal)."""
  seeds = range(len(next(iter(steps_by_signal.values()))))
  return {s: {sig: onset_detection.Onset(float(steps[s]), math.nan, math.nan, math.nan,
                                float(resolution_by_signal[sig]))
              for sig, steps in steps_by_signal.items()} for s in seeds}


def test_order_and_lags_at_the_resolution_of_hand_made_grids():
  """The loss and UAS every 100 steps (resolution 200 = sigma), tscore every 1,000 (2,000),
  generalisation every 100: UAS and tscore are tied at tscore's resolution though their means
  differ by 1,000 steps; the loss comes first and generalisation last."""
  found = _hand_made({"loss": [300, 300, 300], "uas": [1_000, 1_100, 900],
                      "tscore": [1_000, 2_000, 3_000], "generalisation": [4_000, 4_500, 3_800]},
                     {"loss": 200, "uas": 200, "tscore": 2_000, "generalisation": 200})
  ranked = report_phases.order(found)
  assert [(r[0], r[1], r[5]) for r in ranked] == [
      ("loss", 300, 200), ("uas", 1_000, 200), ("tscore", 2_000, 2_000),
      ("generalisation", 4_100, 200)]
  assert report_phases.relations(ranked) == ["<", "≈", "<"]
  assert report_phases.tie_groups(ranked) == [0, 1, 1, 2]
  # per seed: tscore - uas = 0, 900, 2,100 against a resolution of 2,000.
  got = report_phases.lag(found, "tscore", "uas")
  assert (got["before"], got["tied"], got["after"]) == (0, 2, 1) and got["mean"] == 1_000
  got = report_phases.lag(found, "uas", "loss")
  assert (got["before"], got["tied"], got["after"]) == (0, 0, 3)
  run = _run({})
  lines = "\n".join(report_phases.markdown_lines([(run, found)]))
  assert "loss (300) < uas (1000) ≈ tscore (2000) < generalisation (4100)." in lines
  assert "| resolution | 200 | 200 | 2000 | 200 |" in lines
  # tscore - loss = 700, 1,700, 2,700 steps: tied, tied, after at tscore's resolution.
  row = next(line for line in lines.splitlines() if line.startswith("| tscore |"))
  assert row.startswith("| tscore | rise | 3/3 | 2000 | 1700 [") and "| 0 / 2 / 1 |" in row
