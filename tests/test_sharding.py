"""Seed sharding over 8 (virtual CPU) devices gives the same parameters as 1 device."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from sg_jax import configlib, tasks, train
    assert jax.device_count() == 8, jax.devices()
    data_dir, workdir = sys.argv[1], sys.argv[2]
    tasks.get_task("question").generate(data_dir, seed=0, num_train=300,
                                        sizes={"dev": 64, "test": 64, "gen": 64})
    def config(devices):
      c = configlib.apply_config_string(configlib.base_config("question"), "quick",
                                        configlib.PRESETS)
      c.data.dir, c.num_seeds, c.num_devices = data_dir, 8, devices
      c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff = 1, 32, 2, 64
      c.train.num_steps, c.train.steps_per_call, c.train.log_every = 30, 10, 10
      c.eval.every, c.eval.max_lines, c.checkpoint.every = 30, 32, 30
      return c
    out = {}
    for devices in (8, 1):
      r = train.train_and_evaluate(config(devices), f"{workdir}/d{devices}", tensorboard=False)
      sh = r["state"].params["output"]["kernel"].sharding
      out[devices] = (r, len(sh.device_set))
    (r8, n8), (r1, n1) = out[8], out[1]
    assert (n8, n1) == (8, 1), (n8, n1)
    a = np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(r8["state"].params)])
    b = np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(r1["state"].params)])
    print("max_abs_diff", float(np.abs(a - b).max()))
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
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
