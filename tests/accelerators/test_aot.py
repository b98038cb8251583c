"""sg_jax.accelerators: roofline arithmetic, HLO checks, targets, the profiler switch, and (slow,
with libtpu) a compile of the tiny preset for a TPU v5e 2x2 slice."""

import glob
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import train
from sg_jax.accelerators import hlo_checks
from sg_jax.accelerators import profiling
from sg_jax.accelerators import programs
from sg_jax.accelerators import roofline
from sg_jax.accelerators import targets

# What the compiled code is, so compiled as a user's run is (tests/conftest.py).
pytestmark = pytest.mark.optimized


def test_roofline_of_a_hand_made_memory_bound_cost():
  # A call of 16 seeds on one chip: 640 GFLOP and 32 GB -> 40 GFLOP and 2 GB per seed-step.
  flops = roofline.per_seed_step(640e9, 16)
  moved = roofline.per_seed_step(32e9, 16)
  assert (flops, moved) == (40e9, 2e9)
  r = roofline.roofline(flops, moved, peak_flops=200e12, bandwidth=800e9)
  assert r.intensity == pytest.approx(20.0)  # FLOP per byte
  assert r.ridge == pytest.approx(250.0)  # 200e12 / 800e9
  assert r.compute_s == pytest.approx(2e-4)  # 40e9 / 200e12
  assert r.memory_s == pytest.approx(2.5e-3)  # 2e9 / 800e9
  assert r.bound == "memory"
  assert r.times_over_ridge == pytest.approx(12.5)
  assert r.seed_steps_per_s == pytest.approx(400.0)  # 1 / 2.5 ms


def test_roofline_of_a_compute_bound_cost_and_bad_input():
  r = roofline.roofline(1e12, 1e9, peak_flops=100e12, bandwidth=1e12)  # 1000 FLOP/B > ridge 100
  assert r.bound == "compute"
  assert r.seed_steps_per_s == pytest.approx(100.0)  # 1 / (1e12 / 100e12)
  assert r.times_over_ridge == pytest.approx(0.1)
  with pytest.raises(ValueError, match="bandwidth"):
    roofline.roofline(1.0, 1.0, peak_flops=1.0, bandwidth=0.0)
  with pytest.raises(ValueError, match="seeds per chip"):
    roofline.per_seed_step(1.0, 0)


def test_cost_analysis_counts_a_scan_body_once():
  """What the per-seed-step figures rest on (roofline's docstring): a 2- and a 10-step
  `lax.scan` cost the same; a 1-step scan (no loop) differs only by the loop counter."""

  def run(x, steps):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ c), None), x, None, length=steps)[0]

  x = jax.ShapeDtypeStruct((32, 32), jnp.float32)
  flops = [jax.jit(run, static_argnums=1).lower(x, n).compile().cost_analysis()["flops"]
           for n in (1, 2, 10)]
  assert flops[0] >= 2 * 32 ** 3  # one matmul
  assert flops[1] == flops[2]
  assert abs(flops[0] - flops[1]) <= 2  # the loop counter's add and compare


_HLO = """HloModule m
ENTRY main {
  p = f32[4]{0} parameter(0)
  ar = f32[4]{0} all-reduce(p), replica_groups={}, to_apply=add
  ags = (f32[4]{0}, f32[8]{0}) all-gather-start(p), dimensions={0}
  wide = f64[4]{0} convert(p)
  tok = token[] after-all()
  s = (f32[4]{0}, u32[], token[]) send(p, tok), channel_id=1
  cb = f32[4]{0} custom-call(p), custom_call_target="xla_python_cpu_callback"
  mm = f32[4]{0} custom-call(p), custom_call_target="__cublas$gemm"
  ROOT r = f32[4]{0} add(p, p)
}
"""


def test_hlo_checks_find_f64_host_transfers_and_collectives():
  found = hlo_checks.check(_HLO)
  assert found["f64"] == 1
  assert found["host"] == {"send": 1, "custom-call:xla_python_cpu_callback": 1}
  assert found["collectives"] == {"all-reduce": 1, "all-gather": 1}
  assert hlo_checks.summary(found) == ("f64 x1; custom-call:xla_python_cpu_callback x1; send x1; "
                                       "all-gather x1; all-reduce x1")
  clean = "\n".join(l for l in _HLO.splitlines()
                    if not any(k in l for k in ("all-", "f64", "send", "callback")))
  assert hlo_checks.summary(hlo_checks.check(clean)) == "clean"


def test_hlo_checks_see_a_real_callback():
  def f(x):
    jax.debug.callback(lambda v: None, x)
    return x * 2

  text = jax.jit(f).lower(jnp.ones(3)).compile().as_text()
  assert hlo_checks.check(text)["host"]
  assert not hlo_checks.check(jax.jit(lambda x: x * 2).lower(jnp.ones(3)).compile().as_text()
                              )["host"]


def test_targets_parse_and_seed_devices():
  t = targets.parse_target("v5e:2x2")
  assert (t.generation, t.shape, t.num_chips, t.platform) == ("v5e", (2, 2), 4, "tpu")
  assert targets.parse_target("h100").num_chips == 1
  assert targets.parse_target("v4:2x2x1").num_chips == 4
  for bad, match in (("v7:2x2", "unknown target"), ("v5e", "slice"), ("v5e:2x", "slice"),
                     ("h100:two", "GPU target")):
    with pytest.raises(ValueError, match=match):
      targets.parse_target(bad)
  # As sharding.num_seed_devices: the largest chip count that divides the seeds.
  assert targets.seed_devices(10, 4) == 2
  assert targets.seed_devices(10, 8) == 5
  assert targets.seed_devices(64, 4) == 4
  assert targets.seed_devices(64, 4, max_devices=2) == 2
  # Peaks: float32 at the default precision is TF32 on an H100, one bf16 pass on a TPU.
  assert targets.CHIPS["h100"].matmul_peak("float32") == 495e12
  assert targets.CHIPS["v5e"].matmul_peak("float32") == targets.CHIPS["v5e"].bf16_flops
  assert targets.CHIPS["h100"].matmul_peak("float32", "highest") == 67e12
  assert "device_memory_size: 84978434048" in targets.spec_text(targets.CHIPS["h100"])


def test_missing_install_is_one_line_naming_the_requirements_file(monkeypatch):
  monkeypatch.setattr(targets, "_installed", lambda module: False)
  for name in ("v5e:1x1", "h100"):
    with pytest.raises(targets.MissingInstall, match="requirements-accelerators.txt") as e:
      targets.compile_devices.__wrapped__(targets.parse_target(name))
    assert "\n" not in str(e.value)


def test_step_profiler_cuts_calls_at_its_window_and_traces_them(monkeypatch, tmp_path):
  calls = []
  monkeypatch.setattr(jax.profiler, "start_trace", lambda d: calls.append(("start", d)))
  monkeypatch.setattr(jax.profiler, "stop_trace", lambda: calls.append(("stop",)))
  with profiling.StepProfiler("5:25", str(tmp_path)):
    ends = []
    step = 0
    while step < 40:
      end = profiling.call_end(step, min(step + 10, 40))
      ends.append(end)
      calls.append(("call", step, end))
      step = end
  assert ends == [5, 15, 25, 35, 40]  # cut at A=5 and B=25
  log_dir = str(tmp_path / "profile")
  assert calls == [("call", 0, 5), ("start", log_dir), ("call", 5, 15), ("call", 15, 25),
                   ("stop",), ("call", 25, 35), ("call", 35, 40)]
  assert profiling.call_end(0, 10) == 10  # no profiler active
  for bad in ("5", "5:5", "a:b", "9:3"):
    with pytest.raises(ValueError, match="--profile_steps"):
      profiling.StepProfiler(bad, str(tmp_path))


def test_step_profiler_stops_at_the_end_of_a_run_inside_its_window(monkeypatch, tmp_path):
  calls = []
  monkeypatch.setattr(jax.profiler, "start_trace", lambda d: calls.append("start"))
  monkeypatch.setattr(jax.profiler, "stop_trace", lambda: calls.append("stop"))
  with profiling.StepProfiler("10:100", str(tmp_path)):
    assert profiling.call_end(10, 20) == 20
  assert calls == ["start", "stop"]


@pytest.mark.slow
def test_profile_steps_of_a_tiny_run_write_a_trace(tiny_config, tmp_path):
  workdir = str(tmp_path / "run")
  with profiling.StepProfiler("10:20", workdir) as profiler:
    result = train.train_and_evaluate(tiny_config(), workdir, tensorboard=False)
  assert result["step"] == 40
  assert profiler.traced == (10, 20)
  traces = glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*", "*.xplane.pb"))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0


def _libtpu_installed() -> bool:
  return importlib.util.find_spec("libtpu") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _libtpu_installed(),
                    reason="needs libtpu, the optional TPU compiler: "
                           "pip install -r requirements-accelerators.txt")
def test_tiny_compiles_for_a_v5e_slice_with_seeds_sharded(tiny_config, tmp_path):
  config = tiny_config(num_seeds=8)
  target = targets.parse_target("v5e:2x2")
  plan = programs.plan(config, target, str(tmp_path), kinds=("train",))
  assert (plan.chips_used, plan.seeds_per_chip) == (4, 2)
  assert plan.config.model.layer_impl == "plain"  # auto, compiled for an accelerator
  [result] = programs.compile_all(plan)
  assert not result.error
  assert 0 < result.peak <= target.chip.hbm_bytes
  assert result.argument >= plan.state_bytes  # the chip's two seeds' state is an argument
  assert result.checks == {"f64": 0, "host": {}, "collectives": {}}
  assert result.flops > 0 and result.bytes_accessed > 0
  # The chip's program holds 2 seeds: its cost is about twice one seed's parameters' traffic.
  assert result.bytes_accessed / plan.seeds_per_chip > 3 * plan.params_bytes / plan.seeds_per_chip
  assert np.isfinite(result.compile_s)


@pytest.mark.skipif(not _libtpu_installed(),
                    reason="needs libtpu, the optional TPU compiler: "
                           "pip install -r requirements-accelerators.txt")
def test_a_v4_chip_is_one_device_as_jax_runs_it():
  """libtpu describes each v4 TensorCore as a device by default; a v4 chip is one device (both
  cores, 'megacore') as JAX runs it, so v4:2x2x1 has 4."""
  for name, count in (("v4:1x1x1", 1), ("v4:2x2x1", 4)):
    assert len(targets.compile_devices(targets.parse_target(name))) == count
