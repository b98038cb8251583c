"""Pruning runs laid out over 4 (virtual CPU) devices give the numbers of one device: the
trained gates of `placement.train_runs_fn` against `run.train_runs`, and `sg_jax.prune`'s
pruning.csv with --num_devices=4 against 1."""

import os
import subprocess
import sys
import textwrap

import pytest

from sg_jax.pruning import placement

# Subprocesses / end-to-end runs (minutes on 2 cores): the full set only (pyproject.toml).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    sys.path.insert(0, "tests")
    import run_files
    from sg_jax.models import transformer as model_lib
    from sg_jax.pruning import driver as prune
    from sg_jax.pruning import means as means_lib, placement, run, table
    assert jax.device_count() == 4, jax.devices()

    config = model_lib.ModelConfig(vocab_size=12, num_layers=2, d_model=16, num_heads=4,
                                   d_ff=32, dropout=0.0)
    settings = run.Settings(num_steps=30, sparsity_warmup_steps=20, lr_warmup_steps=5)
    rng = np.random.default_rng(0)
    inputs = rng.integers(1, 12, (32, 9)).astype(np.int32)
    inputs[:, 6:] = 0
    targets = np.where(np.arange(9) < 5, np.roll(inputs, -1, 1), 0).astype(np.int32)
    data = {"inputs": jnp.asarray(means_lib.batch_lines(inputs, 8)),
            "targets": jnp.asarray(means_lib.batch_lines(targets, 8))}
    # (S, K) -> mesh: (2, 6) -> 2 x 2 (both axes split), (3, 2) -> 3 x 1 (3 of the 4 devices);
    # which mesh each count gets is test_mesh_shape_divides_seeds_then_runs's business.
    for seeds, grid, shape in (((4, 5), [(0.3, 0), (0.3, 1), (0.5, 0), (0.5, 1), (0.7, 0),
                                           (0.7, 1)], (2, 2)),
                               ((4, 5, 6), [(0.3, 0), (0.6, 0)], (3, 1))):
      params = [model_lib.init_params(config, jax.random.key(s)) for s in seeds]
      params_S = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *params)
      means_S = tuple(jnp.stack(m) for m in zip(*[
          means_lib.unit_means(p, data["inputs"], config=config) for p in params]))
      keys = jnp.stack([jnp.stack([run.run_key(s, lv, ps) for lv, ps in grid]) for s in seeds])
      tg = jnp.asarray([[lv for lv, _ in grid]] * len(seeds), jnp.float32)
      one, one_metrics = run.train_runs(run.init_runs(keys, config, settings), params_S,
                                        means_S, tg, data, num_steps=30, config=config,
                                        settings=settings)
      mesh = placement.run_mesh(len(seeds), len(grid))
      assert mesh.devices.shape == shape, (mesh.devices.shape, shape)
      p, (st, t), d = placement.place(mesh, params_S, (run.init_runs(keys, config, settings), tg),
                                      data)
      m = placement.place(mesh, means_S, None)[0]
      fn = placement.train_runs_fn(mesh)
      st, metrics = fn(st, p, m, t, d, num_steps=15, config=config, settings=settings)
      st, metrics2 = fn(st, p, m, t, d, num_steps=15, config=config, settings=settings)
      assert len(st.log_alpha["heads"].sharding.device_set) == shape[0] * shape[1]
      diff = 0.0
      for got, want in ((st.log_alpha["heads"], one.log_alpha["heads"]),
                        (st.log_alpha["mlp"], one.log_alpha["mlp"]), (st.lambdas, one.lambdas),
                        (np.concatenate([metrics["objective"], metrics2["objective"]]),
                         one_metrics["objective"])):
        got, want = np.asarray(got), np.asarray(want)
        diff = max(diff, float(np.abs(got - want).max()))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
      assert float(np.abs(np.asarray(one.lambdas)).max()) > 1e-3  # the multipliers moved
      print("train_runs", shape, "max_abs_diff", diff)

    workdir = run_files.random_checkpoint_workdir(sys.argv[1], (10,), [3, 5], eval_lines=8,
                                                  **{"eval.batch_size": 8})
    fast = dict(sparsities=[0.3, 0.6], pruning_seeds=2, num_steps=12, sparsity_warmup_steps=8,
                num_lines=16, batch_size=8, eval_lines=8, steps_per_call=5)
    out = {}
    for devices in (4, 1):
      name = f"pruning_d{devices}.csv"
      r = prune.prune(workdir, num_devices=devices, output=name, **fast)
      assert r["runs"] == 8, r
      out[devices] = table.read_rows(f"{workdir}/{name}")
    assert [row[:5] for row in out[4]] == [row[:5] for row in out[1]]
    values = lambda rows: np.asarray([row[5] for row in rows], np.float64)
    print("prune max_abs_diff", float(np.abs(values(out[4]) - values(out[1])).max()),
          "rows", len(out[4]))
    np.testing.assert_allclose(values(out[4]), values(out[1]), atol=1e-5, rtol=0)
    print("OK")
""")


@pytest.mark.parametrize("seeds,runs,devices,expected", [
    (8, 12, 4, (4, 1)), (1, 12, 4, (1, 4)), (2, 6, 4, (2, 2)), (3, 4, 4, (3, 1)),
    (5, 3, 4, (1, 3)), (4, 6, 8, (4, 2)), (7, 7, 1, (1, 1))])
def test_mesh_shape_divides_seeds_then_runs(seeds, runs, devices, expected):
  assert placement.mesh_shape(seeds, runs, devices) == expected


def test_mesh_shape_rejects_empty_counts():
  with pytest.raises(ValueError, match="counts >= 1"):
    placement.mesh_shape(0, 4, 4)


def test_runs_on_four_devices_equal_one_device(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  proc = subprocess.run(["nice", "-n", "10", sys.executable, "-c", SCRIPT, str(tmp_path)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "OK" in proc.stdout, proc.stdout[-3000:]
  print(proc.stdout)  # the measured differences (pytest -s)
