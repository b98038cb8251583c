"""Per-seed hyperparameters (sg_jax.config.per_seed.HPARAM_FIELDS; docs/usage.md "Per-seed
hyperparameters and split seeds"): the optimiser with its values as data equals optax's with them compiled in,
bit for bit; a seed trained in a group with mixed values equals that seed trained alone; the
config syntax and its checks; two runs with different values compile once."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import ROOT, TEST_SIZED_FLAGS
from sg_jax import configlib
from sg_jax import step as step_lib
from sg_jax.config import checks as config_checks
from sg_jax.config import per_seed
from sg_jax.data import input_pipeline
from sg_jax.optim import adamw, schedules
from sg_jax.optim.options import OptimOptions
from sg_jax.training.state import seed_keys


def _config(**fields):
  config = configlib.apply_config_string(configlib.base_config("question"), "tiny",
                                         configlib.PRESETS)
  for field, value in fields.items():
    configlib.set_field(config, field, value)
  return config


def _params(key=0):
  k1, k2, k3 = jax.random.split(jax.random.key(key), 3)
  return {"w": jax.random.normal(k1, (5, 3)), "b": jax.random.normal(k2, (3,)),
          "e": jax.random.normal(k3, (4, 2))}


def _grads(step):
  scale = 3.0 if step % 3 == 0 else 0.05  # global norm above and below the clipping threshold
  return jax.tree_util.tree_map(lambda p: scale * jnp.sin(p * (step + 1.0)), _params(1))


OPTIM_CASES = {
    "linear warm-up and decay, clipping": {"optim.schedule": "linear", "optim.warmup_steps": 3,
                                           "optim.decay_steps": 12},
    "constant, no warm-up, weight decay": {"optim.warmup_steps": 0,
                                           "optim.weight_decay": 0.1},
    "wsd, no clipping, odd betas": {"optim.schedule": "wsd", "optim.warmup_steps": 2,
                                    "optim.decay_steps": 0, "optim.cooldown_steps": 4,
                                    "optim.grad_clip_norm": 0.0, "optim.b1": 0.85,
                                    "optim.b2": 0.98, "optim.eps": 3e-8,
                                    "optim.learning_rate": 3e-4, "train.num_steps": 12},
}


@pytest.mark.parametrize("case", list(OPTIM_CASES))
def test_per_seed_adamw_with_values_as_data_equals_optax_bit_for_bit(case):
  config = _config(**OPTIM_CASES[case])
  options = OptimOptions.from_config(config)
  reference = adamw.make_optimizer(options)
  mine = adamw.make_per_seed_optimizer(options, per_seed.hparam_arrays(config))
  hp = {k: jnp.asarray(v[0]) for k, v in per_seed.hparam_arrays(config).items()}

  # Everything enters as an argument, as in training: no step count or gradient a constant
  # that XLA could fold (its folding may round otherwise than the compiled operation).
  def steps(update):
    def body(carry, g):
      params, state = carry
      updates, state = update(g, state, params)
      return (optax.apply_updates(params, updates), state), None
    return lambda params, state, grads: jax.lax.scan(body, (params, state), grads)[0]

  run_reference = jax.jit(steps(reference.update))
  # The values are arguments: data of the program.
  run_mine = jax.jit(lambda params, state, grads, hp: steps(
      lambda g, s, p: mine.update(g, s, p, hp))(params, state, grads))

  grads = jax.tree_util.tree_map(lambda *g: jnp.stack(g), *[_grads(t) for t in range(14)])
  want = run_reference(_params(), reference.init(_params()), grads)
  got = run_mine(_params(), mine.init(_params()), grads, hp)
  assert jax.tree_util.tree_structure(want) == jax.tree_util.tree_structure(got)
  for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  moved = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: a - b, want[0],
                                                           _params()))
  assert max(float(jnp.abs(x).max()) for x in moved) > 1e-4  # the steps did something


@pytest.mark.parametrize("case", list(OPTIM_CASES))
def test_schedule_at_equals_make_schedule_bit_for_bit(case):
  config = _config(**OPTIM_CASES[case])
  num_steps = int(config.train.num_steps)
  schedule = schedules.make_schedule(OptimOptions.from_config(config))
  o = config.optim
  counts = jnp.arange(16, dtype=jnp.int32)
  want = jax.jit(jax.vmap(schedule))(counts)
  got = jax.jit(jax.vmap(lambda c, lr, w: schedules.schedule_at(
      o.schedule, o.decay_steps or num_steps, o.cooldown_steps, c, lr, w),
                         in_axes=(0, None, None)))(counts, jnp.float32(o.learning_rate),
                                                   jnp.int32(o.warmup_steps))
  np.testing.assert_array_equal(np.asarray(want, np.float32), np.asarray(got))


def test_learning_rates_per_seed_follow_each_seeds_schedule():
  config = _config(**{"num_seeds": 3, "optim.learning_rate": (1e-3, 2e-3, 1e-3),
                      "optim.warmup_steps": (10, 10, 0)})
  # constant schedule: warm-up from 0 (step 5 of 10: half the peak), then the peak
  np.testing.assert_allclose(schedules.learning_rates(OptimOptions.from_config(config), 5), [5e-4, 1e-3, 1e-3],
                             rtol=1e-6)


def test_config_takes_one_value_or_one_per_seed():
  config = _config(**{"optim.weight_decay": (0, 0, 0.1, 0.1), "num_seeds": 4})
  assert config.optim.weight_decay == (0.0, 0.0, 0.1, 0.1)  # ints given become floats
  assert json.loads(config.to_json())["optim"]["learning_rate"] == 1e-3  # one value stays one
  config_checks.validate(config)
  arrays = per_seed.hparam_arrays(config)
  np.testing.assert_array_equal(arrays["weight_decay"], np.float32([0, 0, 0.1, 0.1]))
  np.testing.assert_array_equal(arrays["learning_rate"], np.float32([1e-3] * 4))
  # 1 - b in float64, then float32 (as optax computes it from a Python float)
  assert arrays["one_minus_b1"][0] == np.float32(1 - 0.9) != np.float32(1) - np.float32(0.9)
  assert arrays["dropout_threshold"][0] == int(0.9 * 2 ** 32)
  assert per_seed.switches(config) == {"optim.weight_decay": True, "optim.grad_clip_norm": True,
                                       "model.dropout": True, "train.label_smoothing": False}
  with pytest.raises(ValueError, match=r"optim.weight_decay needs one value or one per seed: "
                                       r"got 3 values for 4 seeds"):
    config_checks.validate(_config(**{"optim.weight_decay": (0, 0.1, 0.2), "num_seeds": 4}))
  with pytest.raises(ValueError, match=r"invalid config: model.dropout must be in \[0, 1\)"):
    config_checks.validate(_config(**{"model.dropout": (0.0, 1.0)}))
  with pytest.raises(ValueError, match=r"invalid config: optim.b2 must be in \[0, 1\)"):
    config_checks.validate(_config(**{"optim.b2": (0.9, 1.0)}))


def test_command_line_parses_one_value_and_a_tuple_per_seed(monkeypatch):
  # ml_collections' config_flags: the per-seed fields are typed `object` (literal parser).
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=values)
  argv = ["prog", f"--config={ROOT}/configs/question.py:tiny",
          "--config.optim.weight_decay=(0,0.1)", "--config.optim.learning_rate=0.002",
          "--config.model.dropout=(0.0,0.2)"]
  monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from sys.argv
  values(argv)
  assert values.config.optim.weight_decay == (0, 0.1)
  assert values.config.optim.learning_rate == 0.002
  assert values.config.model.dropout == (0.0, 0.2)


def _run(config, split, vocab, steps):
  """Final params [S, ...] of `config`'s seeds trained together, with their values as data."""
  data_options = input_pipeline.DataOptions.from_config(config)
  host, capacities = input_pipeline.make_train_data(data_options, split, int(config.num_seeds))
  fns = step_lib.train_fns_from_config(config, vocab.size, capacities)
  hp = per_seed.hparam_arrays(config)
  state = fns.init(seed_keys(per_seed.seed_ids(config, "data")),
                   seed_keys(per_seed.seed_ids(config, "init")), hp["init_scale"])
  state = fns.chunk(state, jax.tree_util.tree_map(jnp.asarray, host | {"hparams": hp}),
                    jnp.asarray(0, jnp.int32), steps)
  return jax.device_get(state.params)


def _flat(tree, i):
  return np.concatenate([np.asarray(x[i]).reshape(-1) for x in jax.tree_util.tree_leaves(tree)])


MIXED = {"optim.learning_rate": (1e-3, 3e-3), "optim.weight_decay": (0.0, 0.3),
         "model.dropout": (0.0, 0.2), "model.init_scale": (1.0, 0.5),
         "train.label_smoothing": (0.1, 0.0), "optim.b1": (0.9, 0.8),
         "optim.grad_clip_norm": (1.0, 0.0), "optim.warmup_steps": (10, 4)}


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True])
def test_a_seed_with_its_values_in_a_mixed_group_equals_the_seed_alone(tiny_config, tmp_path,
                                                                       packing):
  config = tiny_config(**MIXED, first_seed=3, **{"train.packing": packing})
  data_options = input_pipeline.DataOptions.from_config(config)
  _, vocab, splits = input_pipeline.load_data(data_options, str(tmp_path))
  together = _run(config, splits["train"], vocab, 20)
  for i in range(2):
    alone = tiny_config(**{k: v[i] for k, v in MIXED.items()}, first_seed=3 + i,
                        num_seeds=1, **{"train.packing": packing})
    np.testing.assert_allclose(_flat(together, i), _flat(_run(alone, splits["train"], vocab, 20),
                                                         0), atol=1e-5, rtol=0)
  # The values matter: seed 3 trained with seed 4's values ends elsewhere.
  swapped = tiny_config(**{k: v[1] for k, v in MIXED.items()}, first_seed=3, num_seeds=1,
                        **{"train.packing": packing})
  assert np.abs(_flat(together, 0) - _flat(_run(swapped, splits["train"], vocab, 20), 0)
                ).max() > 1e-3


def test_one_value_each_keeps_optax_compiled_in_several_values_are_data():
  single = _config(**{"optim.weight_decay": 0.1, "model.dropout": 0.2})
  assert not per_seed.as_data(single)
  assert not isinstance(step_lib.train_fns_from_config(single, 20).tx, adamw.PerSeedAdamW)
  assert per_seed.as_data(_config(**{"optim.weight_decay": (0.0, 0.1)}))
  assert per_seed.as_data(_config(**{"train.hparams_as_data": True}))
  # Label smoothing and the initialisation scale are data whenever used: no switch needed.
  assert not per_seed.as_data(_config(**{"model.init_scale": (1.0, 2.0),
                                         "train.label_smoothing": (0.0, 0.1)}))
  mixed = step_lib.train_fns_from_config(_config(**{"optim.b2": (0.99, 0.999)}), 20)
  assert isinstance(mixed.tx, adamw.PerSeedAdamW)


def _run_main(workdir, data_dir, cache, *overrides, num_steps=10):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  cmd = [sys.executable, "-m", "sg_jax.main", "--config=configs/question.py:tiny",
         f"--workdir={workdir}", f"--config.data.dir={data_dir}",
         f"--config.train.num_steps={num_steps}", f"--compilation_cache_dir={cache}",
         "--notensorboard", *TEST_SIZED_FLAGS, *overrides]
  done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stderr


@pytest.mark.slow
def test_two_runs_with_other_values_compile_the_train_step_once(tmp_path, tiny_data):
  cache = tmp_path / "cache"
  first = _run_main(tmp_path / "a", tiny_data, cache, "--config.optim.weight_decay=(0,0.1)",
                    "--config.optim.learning_rate=(0.001,0.003)",
                    "--config.model.dropout=(0.1,0.2)", "--config.model.init_scale=(1.0,0.5)")
  assert "train step (10 steps per call): compiled in" in first, first[-3000:]
  second = _run_main(tmp_path / "b", tiny_data, cache, "--config.optim.weight_decay=(0.3,0.2)",
                     "--config.optim.learning_rate=0.002", "--config.model.dropout=(0.3,0.05)",
                     "--config.model.init_scale=2.0", "--config.optim.b1=(0.8,0.95)")
  assert ("train step (10 steps per call): loaded from the persistent compilation cache in"
          in second), second[-3000:]
  assert "train step (10 steps per call): compiled" not in second, second[-3000:]
  with open(tmp_path / "b" / "config.json") as f:
    stored = json.load(f)
  assert stored["optim"]["weight_decay"] == [0.3, 0.2] and stored["optim"]["b1"] == [0.8, 0.95]
  assert stored["optim"]["learning_rate"] == 0.002


@pytest.mark.slow
def test_per_seed_values_resume_and_shard_like_an_uninterrupted_run_on_one_device(tmp_path,
                                                                                    tiny_data):
  from sg_jax.records import long_csv  # pylint: disable=import-outside-toplevel
  cache = tmp_path / "cache"
  values = ("--config.optim.weight_decay=(0.0,0.3)", "--config.optim.learning_rate=(0.001,0.003)",
            "--config.model.dropout=(0.0,0.2)", "--config.seeds.init=(5,5)")
  one = _run_main(tmp_path / "one", tiny_data, cache, *values, "--config.num_devices=1",
                  num_steps=40)
  assert "2 seeds on 1 device(s)" in one, one[-3000:]
  part = _run_main(tmp_path / "two", tiny_data, cache, *values, num_steps=20)
  assert "2 seeds on 2 device(s)" in part, part[-3000:]
  resumed = _run_main(tmp_path / "two", tiny_data, cache, *values, num_steps=40)
  assert "resumed from checkpoint step 20" in resumed, resumed[-3000:]
  rows = {name: {(r["step"], r["seed"], r["name"]): r["value"]
                 for r in long_csv.read_table(str(tmp_path / name / "metrics.csv"))}
          for name in ("one", "two")}
  final = {k: v for k, v in rows["one"].items() if k[0] == 40 and k[2].startswith(
      ("train/loss", "in_domain/loss", "train/learning_rate"))}
  assert len(final) >= 6
  for key, value in final.items():
    assert abs(rows["two"][key] - value) <= 1e-5, key
  lr = {k[1]: v for k, v in final.items() if k[2] == "train/learning_rate"}
  assert lr == {0: pytest.approx(1e-3), 1: pytest.approx(3e-3)}


def test_report_groups_seeds_by_per_seed_hyperparameters_and_seeds():
  from sg_jax.report import groups  # pylint: disable=import-outside-toplevel
  config = _config(num_seeds=4, **{"optim.weight_decay": (0, 0, 0.1, 0.1),
                                   "seeds.init": (0, 1, 0, 1), "model.dropout": 0.2})
  assert groups.per_seed_fields(json.loads(config.to_json())) == {
      "seeds.init": [0, 1, 0, 1], "optim.weight_decay": [0.0, 0.0, 0.1, 0.1]}


def test_label_smoothing_gap_gives_optax_smoothed_cross_entropy():
  from sg_jax import objectives  # pylint: disable=import-outside-toplevel
  logits = jax.random.normal(jax.random.key(3), (2, 5, 7))
  targets = jnp.asarray([[1, 4, 6, 0, 0], [2, 2, 3, 5, 0]])  # 0 = not scored
  e = 0.1
  ce = objectives.mean_token_loss(logits, targets)
  smoothed = optax.softmax_cross_entropy(logits, optax.smooth_labels(
      jax.nn.one_hot(targets, 7), e))  # (1 - e) one-hot + e / 7
  mask = targets != 0
  want = float(jnp.sum(smoothed * mask) / jnp.sum(mask))
  assert float(ce + e * objectives.smoothing_gap(logits, targets)) == pytest.approx(want,
                                                                                   rel=1e-6)
  # By hand, V = 2: p = (0.75, 0.25), target id 1: CE = -log 0.25, U = -(log 0.75 + log 0.25)/2;
  # the second token (target 0) is not scored.
  two = jnp.log(jnp.asarray([[[3.0, 1.0], [1.0, 1.0]]]))
  gap = objectives.smoothing_gap(two, jnp.asarray([[1, 0]]))
  assert float(gap) == pytest.approx(-(np.log(0.75) + np.log(0.25)) / 2 + np.log(0.25),
                                     rel=1e-6)
