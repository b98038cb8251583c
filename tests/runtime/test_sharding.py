"""Seed sharding over 8 (virtual CPU) devices gives the same parameters as 1 device."""

import os
import subprocess
import sys
import textwrap

import pytest

# Subprocesses / end-to-end runs (minutes on 2 cores): the full set only (pyproject.toml).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from sg_jax import configlib, tasks, train
    assert jax.device_count() == 8, jax.devices()
    data_dir, workdir = sys.argv[1], sys.argv[2]
    # The tiny preset's 400 training lines (so the data is used as generated).
    tasks.get_task("question").generate(data_dir, seed=0, num_train=400,
                                        sizes={"dev": 64, "test": 64, "gen": 64})
    def config(devices, packing=False):
      c = configlib.apply_config_string(configlib.base_config("question"), "tiny",
                                        configlib.PRESETS)
      c.data.dir, c.num_seeds, c.num_devices = data_dir, 8, devices
      c.optim.warmup_steps, c.train.num_steps = 300, 30
      c.eval.every, c.eval.max_lines, c.checkpoint.every = 30, 32, 30
      c.train.packing = packing
      return c
    out = {}
    # 8 devices (one seed each; packed: each device picks its own bucket) vs all on 1 device.
    for devices, packing in ((8, False), (8, True), (1, False)):
      r = train.train_and_evaluate(config(devices, packing), f"{workdir}/d{devices}{packing}",
                                   tensorboard=False)
      sh = r["state"].params["output"]["kernel"].sharding
      out[devices, packing] = (r, len(sh.device_set))
    r1, n1 = out[1, False]
    flat = lambda r: np.concatenate([np.asarray(x).ravel()
                                     for x in jax.tree_util.tree_leaves(r["state"].params)])
    for packing in (False, True):
      r8, n8 = out[8, packing]
      assert (n8, n1) == (8, 1), (n8, n1)
      a, b = flat(r8), flat(r1)
      print("packing", packing, "max_abs_diff", float(np.abs(a - b).max()))
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
      for k in r8["eval"]:
        np.testing.assert_allclose(r8["eval"][k], r1["eval"][k], atol=1e-5)
    print("OK")
""")


def test_eight_seeds_on_eight_devices_equal_one_device(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "data"),
                         str(tmp_path / "runs")], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "OK" in proc.stdout


DEVICES = "from sg_jax.runtime import host_devices; host_devices.configure_cpu_devices(); import jax; " \
          "print(jax.device_count())"


@pytest.mark.parametrize("xla_flags,expected", [
    ("", 2 * len(os.sched_getaffinity(0))),  # sg_jax's default on a CPU-only machine
    ("--xla_force_host_platform_device_count=3", 3),  # the user's own choice wins
])
def test_cpu_devices_default_and_user_override(xla_flags, expected):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags)
  proc = subprocess.run([sys.executable, "-c", DEVICES], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert int(proc.stdout.split()[-1]) == expected
