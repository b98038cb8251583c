"""Tests of the analysis registry (`sg_jax.analysis.registry`): a quantity registered from this
file is computed by `sg_jax.analyze` into analysis.csv and plotted by `sg_jax.report` with no
other edit; `over_seeds` equals a loop over seeds; seed chunks join to the whole; bad
registrations are refused."""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import checkpointing, configlib
from sg_jax.analysis import driver as analyze
from sg_jax.analysis import registry
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import init_params
from sg_jax.records import metric_logging
from sg_jax.report import build as report

tasks = pytest.importorskip("sg_jax.tasks")

STEPS = (0, 10)
SEEDS = [3, 5]
D_MODEL = 16


def _embedding_value(step, seed):
  return 0.5 + step / 10 + seed  # every entry of the hand-built embedding table


def _mean_embedding_norm(params):
  """Mean L2 norm of the rows of ONE seed's embedding table."""
  table = params["embedding"]["embedding"]
  return jnp.mean(jnp.sqrt(jnp.sum(jnp.square(table), axis=-1)))


def _compute(inputs):
  return {"embedding_norm": registry.over_seeds(_mean_embedding_norm)(inputs.params)}


EMBEDDING_NORM = registry.Quantity(
    name="embedding_norm_test",
    groups=(registry.Group("embedding_norm", ("embedding_norm",)),),
    compute=_compute,
    dynamics=(registry.Dynamic("embedding_norm", axis="mean embedding row norm (L2)",
                               title="Embedding norm", label="embedding norm", trajectory_row=3,
                               trajectory_axis="embedding norm (L2)", in_summary=True),))


@pytest.fixture()
def embedding_norm():
  registry.register_quantity(EMBEDDING_NORM)
  yield EMBEDDING_NORM
  registry.unregister_quantity(EMBEDDING_NORM.name)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """Two seeds, two checkpoints whose embedding tables hold one known value each, and the
  accuracies the report needs."""
  root = tmp_path_factory.mktemp("registry_run")
  task = tasks.get_task("question")
  data_dir = os.path.join(root, "data")
  task.generate(data_dir, seed=0, num_train=40, sizes={"dev": 5, "test": 5, "gen": 5})
  config = configlib.base_config("question")
  config.data.dir = data_dir
  config.data.num_train = 40
  config.model.num_layers, config.model.d_model = 1, D_MODEL
  config.model.num_heads, config.model.d_ff = 2, 32
  config.first_seed, config.num_seeds = SEEDS[0], len(SEEDS)
  vocab = task.vocab()
  model_config = ModelConfig.from_config(config.model, vocab.size)
  manager = checkpointing.make_manager(str(root), asynchronous=False)
  for step in STEPS:
    params = []
    for s in SEEDS:
      p = init_params(model_config, jax.random.PRNGKey(s))
      p["embedding"]["embedding"] = jnp.full_like(p["embedding"]["embedding"],
                                                  _embedding_value(step, s))
      params.append(p)
    state = {"params": jax.tree_util.tree_map(lambda *x: jnp.stack(x), *params)}
    checkpointing.save(manager, step, state,
                       checkpointing.make_meta(config, vocab.to_json(), SEEDS))
  manager.wait_until_finished()
  manager.close()
  table = metric_logging.MetricsTable(os.path.join(root, "metrics.csv"))
  for step in STEPS:
    table.write(step, SEEDS, {"in_domain/accuracy": [0.5, 1.0],
                              "out_of_domain/accuracy": [0.1, 0.2]})
  return str(root)


def _rows(path):
  with open(path, newline="") as f:
    return [r for r in csv.reader(f) if len(r) == 4][1:]


def test_registered_quantity_is_analysed_and_reported(workdir, embedding_norm, tmp_path):
  assert "embedding_norm" in registry.group_names()
  assert registry.group_names()[:4] == ("weight_norm", "attention_entropy", "tscore",
                                        "tparseval")
  out = analyze.analyze(workdir, groups=["embedding_norm", "weight_norm"],
                        output="registry.csv")
  assert out == {"rows_written": 2 * 2 * 3, "checkpoints_analysed": 2}
  rows = _rows(os.path.join(workdir, "registry.csv"))
  # sg_jax's quantities come first, then the registered one, for each step.
  assert [r[2] for r in rows[:6]] == ["weight_norm", "weight_norm_per_layer"] * 2 + [
      "embedding_norm"] * 2
  got = {(int(r[0]), int(r[1])): float(r[3]) for r in rows if r[2] == "embedding_norm"}
  want = {(step, s): _embedding_value(step, s) * math.sqrt(D_MODEL)
          for step in STEPS for s in SEEDS}
  assert got.keys() == want.keys()
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-6)
  assert analyze.analyze(workdir, groups=["embedding_norm"],
                         output="registry.csv")["rows_written"] == 0  # its marker marks it done

  # the report reads analysis.csv: the same rows under that name.
  os.replace(os.path.join(workdir, "registry.csv"), os.path.join(workdir, "analysis.csv"))
  os.replace(os.path.join(workdir, "registry.csv.options.json"),
             os.path.join(workdir, "analysis.csv.options.json"))
  result = report.build_report(workdir, str(tmp_path / "report"))
  names = {os.path.basename(p) for p in result["figures"]}
  assert {"dynamics_embedding_norm.png", "dynamics_weight_norm.png"} <= names
  assert "trajectories_depthunknown.png" in names  # no config.json: the depth is unknown
  seeds = {int(r["seed"]): r for r in csv.DictReader(open(tmp_path / "report" /
                                                          "summary_seeds.csv"))}
  for s in SEEDS:
    np.testing.assert_allclose(float(seeds[s]["final_embedding_norm"]),
                               _embedding_value(STEPS[-1], s) * math.sqrt(D_MODEL), rtol=1e-3)
  assert "embedding norm (final)" in open(tmp_path / "report" / "summary.md").read()
  # the trajectories figure has a fourth row for it, with its axis label.
  run = report.load_run(workdir)
  fig = report.plot_trajectories([run], None, str(tmp_path / "t.png"), 0.99)
  assert len(fig.axes) == 4 * len(SEEDS)
  assert fig.axes[3 * len(SEEDS)].get_ylabel() == "embedding norm (L2)"
  fig = report.plot_dynamics({None: [run]}, "embedding_norm", str(tmp_path / "d.png"), "")
  assert fig.axes[0].get_ylabel() == "mean embedding row norm (L2)"


def test_unregistered_quantity_is_gone(workdir):
  assert "embedding_norm" not in registry.group_names()
  assert "embedding_norm" not in registry.dynamics()
  with pytest.raises(ValueError, match="unknown metric group"):
    analyze.analyze(workdir, groups=["embedding_norm"], output="gone.csv")


_MODULE = textwrap.dedent('''
    """A quantity of one's own, registered when the module is imported."""
    import jax.numpy as jnp
    from sg_jax.analysis import registry

    def row_norm(params):
      table = params["embedding"]["embedding"]
      return jnp.mean(jnp.sqrt(jnp.sum(jnp.square(table), axis=-1)))

    registry.register_quantity(registry.Quantity(
        name="row_norm", groups=(registry.Group("row_norm", ("row_norm",)),),
        compute=lambda inputs: {"row_norm": registry.over_seeds(row_norm)(inputs.params)},
        dynamics=(registry.Dynamic("row_norm", axis="row norm", title="Row norm"),)))
    ''')


@pytest.mark.slow
def test_command_lines_import_modules_that_register_quantities(workdir, tmp_path):
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  for name in ("analysis.csv", "analysis.csv.options.json"):
    if os.path.exists(os.path.join(run, name)):
      os.remove(os.path.join(run, name))
  (tmp_path / "my_quantity.py").write_text(_MODULE)
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root]),
         "JAX_PLATFORMS": "cpu"}
  call = lambda *args: subprocess.run([sys.executable, "-m", *args], capture_output=True,
                                      text=True, timeout=300, cwd=root, env=env)
  done = call("sg_jax.analyze", f"--workdir={run}", "--modules=my_quantity",
              "--metrics=row_norm")
  assert done.returncode == 0, done.stderr[-2000:]
  got = {(int(r[0]), int(r[1])): float(r[3]) for r in _rows(os.path.join(run, "analysis.csv"))}
  assert got.keys() == {(step, s) for step in STEPS for s in SEEDS}
  for (step, s), value in got.items():
    np.testing.assert_allclose(value, _embedding_value(step, s) * math.sqrt(D_MODEL), rtol=1e-6)
  done = call("sg_jax.report", f"--root={run}", "--modules=my_quantity")
  assert done.returncode == 0, done.stderr[-2000:]
  assert os.path.exists(os.path.join(run, "report", "dynamics_row_norm.png"))
  done = call("sg_jax.analyze", f"--workdir={run}", "--modules=no_such_module_here")
  assert done.returncode != 0 and "no_such_module_here" in done.stderr.splitlines()[-1]


def _per_seed(params, shift, *, scale):
  return {"sum": scale * jnp.sum(params["w"]) + shift, "rows": params["w"] * scale}


def test_over_seeds_equals_a_loop_and_chunks_join_to_the_whole():
  rng = np.random.default_rng(0)
  params_S = {"w": jnp.asarray(rng.normal(size=(5, 3, 2)), jnp.float32)}
  mapped = registry.over_seeds(_per_seed)
  assert registry.over_seeds(_per_seed) is mapped  # one compilation cache per function
  out = mapped(params_S, jnp.float32(1.5), scale=2.0)
  for s in range(5):
    one = _per_seed({"w": params_S["w"][s]}, 1.5, scale=2.0)
    np.testing.assert_allclose(out["sum"][s], one["sum"], rtol=1e-6)
    np.testing.assert_allclose(out["rows"][s], one["rows"], rtol=1e-6)
  whole = registry.in_seed_chunks(lambda p: [mapped(p, 1.5, scale=2.0)], params_S)
  chunked = registry.in_seed_chunks(lambda p: [mapped(p, 1.5, scale=2.0)], params_S, 2)
  assert isinstance(chunked, list) and sorted(chunked[0]) == ["rows", "sum"]
  for k in ("sum", "rows"):
    assert chunked[0][k].shape == out[k].shape
    np.testing.assert_array_equal(chunked[0][k], whole[0][k])
  with pytest.raises(ValueError, match="seeds_per_call"):
    registry.in_seed_chunks(lambda p: p, params_S, -1)


def test_bad_registrations_are_refused():
  group = registry.Group("g_test", ("a_test", "b_test_{i}"))
  assert group.matches("b_test_12") and not group.matches("b_testx")
  with pytest.raises(ValueError, match="already registered"):
    registry.register_quantity(registry.Quantity(
        "dup_test", (registry.Group("tscore", ("x_test",)),), compute=lambda i: {}))
  with pytest.raises(ValueError, match="unknown inputs"):
    registry.register_quantity(registry.Quantity(
        "inputs_test", (registry.Group("g_test", ("a_test",), inputs=("tokens",)),),
        compute=lambda i: {}))
  with pytest.raises(ValueError, match="none of its groups"):
    registry.register_quantity(registry.Quantity(
        "dyn_test", (group,), compute=lambda i: {},
        dynamics=(registry.Dynamic("c_test", axis="", title=""),)))
  with pytest.raises(ValueError, match="varying part"):
    registry.register_quantity(registry.Quantity(
        "marker_test", (registry.Group("m_test", ("m_{i}",)),), compute=lambda i: {}))
  assert not {"dup_test", "inputs_test", "dyn_test", "marker_test"} & {
      q.name for q in registry.quantities()}
