"""The accelerator check's AOT projection beside its measured figures (issue 53 item 9):
which chip a device is, and the measured rate set beside the roofline bound."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import accelerator_report  # noqa: E402  (benchmarks/ is on sys.path above)


def test_device_kinds_name_their_chip():
  cases = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200",
           "NVIDIA A100-SXM4-80GB": "a100", "TPU v5 lite": "v5e", "TPU v5p": "v5p",
           "TPU v4": "v4", "TPU v6 lite": "v6e", "cpu": None}
  assert {k: accelerator_report.chip_generation(k) for k in cases} == cases


def test_measured_rate_beside_the_bound():
  fig = {"rate_steady": 800.0, "seeds": 16}  # 16 seeds, 4 per chip: 4 chips, 200 per chip
  projection = {"chip": "TPU v5e", "seeds_per_chip": 4, "peak": 3.5e9,
                "seed_steps_per_s": 250.0, "bound": "memory"}
  lines = accelerator_report.format_projection(fig, projection)
  assert lines == ["AOT projection on TPU v5e (4 seeds per chip): compiled peak 3.50 GB per chip",
                   "seed-steps/s per chip: AOT roofline bound 250.0 (memory-bound), measured "
                   "200.0 (80% of the bound)"]
  assert accelerator_report.format_projection(fig, None) == [
      "AOT projection: none (no published figures for this device)"]
  no_cost = dict(projection, seed_steps_per_s=None)
  assert "measured 200.0" in accelerator_report.format_projection(fig, no_cost)[1]
