"""Onset detection on synthetic curves with known onsets (sg_jax/analysis/onset_detection.py, and
per seed sg_jax/analysis/onsets.py)."""

import math
import os

import numpy as np
import pytest

from sg_jax.analysis import onset_detection, onsets
from sg_jax.records import long_csv


def sigmoid(t, t0, width, low=0.0, high=1.0):
  return low + (high - low) / (1.0 + np.exp(-(np.asarray(t, np.float64) - t0) / width))


def test_noise_free_sigmoid_onset_is_its_midpoint():
  steps = np.arange(0, 10_001, 50)
  got = onset_detection.onset(steps, sigmoid(steps, 3_000, 200), "rise")
  assert got.step == pytest.approx(3_000, abs=1e-6)
  # Smoothing (sigma = 2 gaps = 100 steps) lowers the peak slope 1/(4 w) a little; without it
  # the finite-difference slope is the sigmoid's.
  assert 0.9 / 800 < got.slope < 1 / 800
  assert got.noise == pytest.approx(0.0, abs=1e-3)
  raw = onset_detection.onset(steps, sigmoid(steps, 3_000, 200), "rise", sigma=0)
  central = (sigmoid(3_050, 3_000, 200) - sigmoid(2_950, 3_000, 200)) / 100
  assert raw.step == 3_000 and raw.slope == pytest.approx(central, rel=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_noisy_sigmoids_rise_and_fall(seed):
  rng = np.random.default_rng(seed)
  steps = np.arange(0, 10_001, 50)
  t0 = rng.uniform(2_000, 8_000)
  rise = sigmoid(steps, t0, 150) + rng.normal(0, 0.03, steps.size)
  rise[rng.integers(steps.size)] += 0.8  # an isolated spike: removed by the running median
  assert abs(onset_detection.onset(steps, rise, "rise").step - t0) <= 150
  loss = sigmoid(steps, t0, 150, low=3.0, high=1.0) + rng.normal(0, 0.05, steps.size)
  assert abs(onset_detection.onset(steps, loss, "fall").step - t0) <= 150


def test_dense_early_schedule_and_a_late_plateau():
  # every 100 steps up to 5k, then every 1000: the sparse tail does not fool the slope.
  steps = np.concatenate([np.arange(0, 5_000, 100), np.arange(5_000, 40_001, 1_000)])
  rng = np.random.default_rng(7)
  values = sigmoid(steps, 1_700, 120) + rng.normal(0, 0.02, steps.size)
  assert abs(onset_detection.onset(steps, values).step - 1_700) <= 120


def test_flat_noise_has_no_onset_and_bad_input_is_refused():
  rng = np.random.default_rng(0)
  steps = np.arange(0, 5_000, 50)
  got = onset_detection.onset(steps, 0.5 + rng.normal(0, 0.05, steps.size))
  assert math.isnan(got.step)
  with pytest.raises(ValueError, match=f"at least {onset_detection.MIN_POINTS} finite points"):
    onset_detection.onset(np.arange(onset_detection.MIN_POINTS),
                          np.r_[0.0, math.nan, np.ones(onset_detection.MIN_POINTS - 2)])
  with pytest.raises(ValueError, match="strictly increasing"):
    onset_detection.onset(np.r_[0, 2, 1, 3:12], np.linspace(0, 1, 12))
  with pytest.raises(ValueError, match="direction"):
    onset_detection.onset(np.arange(12), np.linspace(0, 1, 12), "up")


def test_workdir_onsets_per_seed(tmp_path):
  """metrics.csv with UAS, loss and accuracies of two seeds; analysis.csv unused (the run
  logged in_domain/uas); out_of_domain/accuracy flat for seed 1 (never generalises)."""
  steps = np.arange(0, 6_001, 100)
  truth = {0: {"structure": 1_000, "loss_drop": 1_000, "in_domain": 1_800,
               "out_of_domain": 3_500, "later_loss_drop": None},
           1: {"structure": 2_000, "loss_drop": 2_100, "in_domain": 2_600,
               "out_of_domain": None, "later_loss_drop": None}}
  rng = np.random.default_rng(1)
  rows = []
  for seed, t in truth.items():
    curves = {"in_domain/uas": sigmoid(steps, t["structure"], 100, 0.1, 0.6),
              "train/loss": sigmoid(steps, t["loss_drop"], 100, 2.5, 0.5),
              "in_domain/accuracy": sigmoid(steps, t["in_domain"], 150),
              "out_of_domain/accuracy": (sigmoid(steps, t["out_of_domain"], 200)
                                         if t["out_of_domain"] else np.full(steps.size, 0.3))}
    for name, values in curves.items():
      noisy = values + rng.normal(0, 0.01, steps.size)
      rows += [(int(s), seed, name, float(v)) for s, v in zip(steps, noisy)]
  with open(os.path.join(tmp_path, "metrics.csv"), "w") as f:
    f.write(long_csv.HEADER + long_csv.format_rows(rows))
  got = onsets.workdir_onsets(str(tmp_path))
  assert sorted(got) == [0, 1]
  for seed, t in truth.items():
    for signal, step in t.items():
      if step is None:
        assert math.isnan(got[seed][signal].step), signal
      else:
        assert abs(got[seed][signal].step - step) <= 100, (seed, signal)
  path = os.path.join(tmp_path, "onsets.csv")
  onsets.write_onsets(path, got)
  lines = open(path).read().splitlines()
  assert lines[0] == "seed,signal,step,slope,change,noise,resolution" and len(lines) == 1 + 10
  assert lines[1].startswith("0,structure,")


def test_cli_prints_and_writes(tmp_path, capsys):
  steps = np.arange(0, 3_001, 100)
  rows = [(int(s), 0, "train/loss", float(v)) for s, v in zip(steps, sigmoid(steps, 1_200, 80,
                                                                            2.0, 0.2))]
  with open(os.path.join(tmp_path, "metrics.csv"), "w") as f:
    f.write(long_csv.HEADER + long_csv.format_rows(rows))
  onsets.main([f"--workdir={tmp_path}"])
  out = capsys.readouterr().out.splitlines()
  assert out[1].split() == ["0", "-", "1200", "-", "-", "-"]
  assert out[-1] == f"wrote {os.path.join(tmp_path, 'onsets.csv')}"
  assert os.path.exists(os.path.join(tmp_path, "onsets.csv"))
  with pytest.raises(SystemExit, match="error: "):
    onsets.main([f"--workdir={tmp_path / 'missing'}"])


def test_cli_refuses_a_curve_of_too_few_points(tmp_path, capsys):
  """A loss logged every 500 steps of a 1,000-step run (3 points) gives no onset: refused in one
  line that says how to log more points; the report's reading gives NO_ONSET instead."""
  rows = [(s, 0, "train/loss", v) for s, v in ((0, 3.0), (500, 1.0), (1000, 0.9))]
  rows += [(s, 0, "in_domain/accuracy", float(v))
           for s, v in zip(range(0, 1001, 100), sigmoid(np.arange(0, 1001, 100), 400, 50))]
  with open(os.path.join(tmp_path, "metrics.csv"), "w") as f:
    f.write(long_csv.HEADER + long_csv.format_rows(rows))
  with pytest.raises(SystemExit) as e:
    onsets.main([f"--workdir={tmp_path}"])
  message = str(e.value.code)
  assert message.startswith("error: loss_drop onset: train/loss has only 3 logged points")
  assert "dense_until" in message and "\n" not in message
  assert not os.path.exists(os.path.join(tmp_path, "onsets.csv"))
  lenient = onsets.workdir_onsets(str(tmp_path))
  assert math.isnan(lenient[0]["loss_drop"].step)
  assert lenient[0]["in_domain"].step == pytest.approx(400, abs=100)


# --- the drop after the initial descent (`later_fall`) and the resolution of an onset ---

DENSE = np.arange(0, 3_001, 100)  # the dense measurement's grid: every 100 steps to 3k


def descent(t, tau=150.0):
  """An initial descent from 4.6 to a plateau at 1.6 (no later drop)."""
  return 1.6 + 3.0 * np.exp(-np.asarray(t, np.float64) / tau)


@pytest.mark.parametrize("seed", range(6))
def test_later_fall_finds_a_second_drop_after_the_plateau(seed):
  """An initial descent, a plateau and a second sigmoid drop (1.6 -> 1.0) at t2: the steepest
  fall is the initial descent, the later fall the second drop's midpoint (multiplicative noise
  of 2%)."""
  rng = np.random.default_rng(seed)
  t2 = rng.uniform(1_200, 2_500)
  loss = (descent(DENSE) - sigmoid(DENSE, t2, 80, 0.0, 0.6)) * np.exp(rng.normal(0, 0.02,
                                                                                DENSE.size))
  later = onset_detection.onset(DENSE, loss, "later_fall")
  assert abs(later.step - t2) <= 100
  assert later.change < -3 * later.noise and later.slope < 0
  assert later.resolution == 200  # sigma = 2 gaps of 100 steps
  assert onset_detection.onset(DENSE, loss, "fall").step <= 200


@pytest.mark.parametrize("seed", range(4))
def test_later_fall_is_none_when_the_loss_only_decelerates(seed):
  """Exponential, power-law and two-timescale decays and a descent onto a flat plateau: the
  steepness only falls (up to noise), so there is no later drop."""
  noise = np.exp(np.random.default_rng(seed).normal(0, 0.02, DENSE.size))
  t = DENSE.astype(np.float64)
  for name, loss in {"exponential": 1.0 + 3.0 * np.exp(-t / 300),
                     "power law": 5.0 * (t + 100) ** -0.5,
                     "two timescales": 0.3 + 4.0 * np.exp(-t / 150) + np.exp(-t / 1_500),
                     "plateau": descent(t)}.items():
    got = onset_detection.onset(DENSE, loss * noise, "later_fall")
    assert math.isnan(got.step), name
    # the initial descent
    assert onset_detection.onset(DENSE, loss * noise, "fall").step <= 300, name


def test_later_fall_takes_the_larger_of_two_later_drops_and_refuses_a_nonpositive_loss():
  t = DENSE.astype(np.float64)
  small_then_large = descent(t) - sigmoid(t, 1_200, 80, 0, 0.2) - sigmoid(t, 2_300, 80, 0, 0.5)
  assert onset_detection.onset(DENSE, small_then_large, "later_fall").step == 2_300
  large_then_small = descent(t) - sigmoid(t, 1_200, 80, 0, 0.5) - sigmoid(t, 2_300, 80, 0, 0.2)
  assert onset_detection.onset(DENSE, large_then_small, "later_fall").step == 1_200
  with pytest.raises(ValueError, match="must be > 0"):
    onset_detection.onset(DENSE, descent(t) - 1.7, "later_fall")


def test_resolution_is_the_local_gap_or_sigma():
  steps = np.array([0, 100, 200, 400, 800])
  assert onset_detection.resolution_at(steps, 200, 50) == 200  # gaps 100 before, 200 after
  assert onset_detection.resolution_at(steps, 300, 50) == 200  # inside the gap 200-400
  assert onset_detection.resolution_at(steps, 0, 50) == 100
  assert onset_detection.resolution_at(steps, 800, 0) == 400
  assert onset_detection.resolution_at(steps, 200, 500) == 500  # the smoothing is coarser
  assert math.isnan(onset_detection.resolution_at(steps, math.nan, 50))
  # in an onset: 2 gaps on an even grid, 1 without smoothing, the local gap of a sparse stretch.
  rise = sigmoid(DENSE, 1_500, 100)
  assert onset_detection.onset(DENSE, rise).resolution == 200
  assert onset_detection.onset(DENSE, rise, sigma=0).resolution == 100
  mixed = np.concatenate([np.arange(0, 2_000, 100), np.arange(2_000, 10_001, 1_000)])
  got = onset_detection.onset(mixed, sigmoid(mixed, 6_000, 300))  # median gap 100: sigma 200
  assert got.resolution == 1_000 and abs(got.step - 6_000) <= 1_000


def test_compare_orders_only_beyond_the_coarser_resolution():
  def at(step, res):
    return onset_detection.Onset(step, math.nan, math.nan, math.nan, res)

  loss, tscore = at(300, 200), at(1_000, 2_000)  # loss every 100 steps, tscore every 1k
  assert onset_detection.compare(loss, tscore) == 0 and onset_detection.compare(tscore, loss) == 0
  assert onset_detection.compare(loss, at(2_500, 2_000)) == -1  # 2,200 apart > 2,000
  assert onset_detection.compare(at(2_301, 2_000), loss) == 1
  assert onset_detection.compare(at(2_300, 2_000), loss) == 0  # exactly the resolution: tied
  assert onset_detection.compare(loss, at(501, 200)) == -1
  assert onset_detection.compare(loss, at(500, 200)) == 0
  assert onset_detection.compare(loss, onset_detection.NO_ONSET) is None
