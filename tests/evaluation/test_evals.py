"""The evaluator registry (`sg_jax.evaluation`, docs/evaluation.md): sections from declared options,
validation in one line, the old `eval.*` names, and a toy evaluator registered here whose metric
reaches metrics.csv."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from sg_jax import configlib, evaluation as evals, train
from sg_jax.config import checks as config_checks
from sg_jax.records import metric_logging


@dataclasses.dataclass(frozen=True)
class ParamSquares(evals.Evaluator):
  """A toy evaluator: `scale` x the sum of squares of every parameter of each seed."""

  name = "toy_param_squares"

  scale: float = 1.0

  def check(self):
    if self.scale <= 0:
      raise ValueError(f"scale must be > 0, got {self.scale}")

  def build(self, context):
    del context  # it needs no data

    def evaluate(params, progress):
      del progress
      squares = sum(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=tuple(range(1, x.ndim)))
                    for x in jax.tree_util.tree_leaves(params))
      return {"toy": {"param_squares": self.scale * squares}}

    return evals.Evaluation(evaluate=evaluate)


@pytest.fixture
def toy_registered():
  evals.register(ParamSquares)
  yield ParamSquares
  evals.unregister(ParamSquares.name)


def test_built_in_evaluators_run_in_order_with_sections_from_their_defaults():
  assert evals.names()[:3] == ("task", "uas", "preference")
  config = configlib.base_config("question")
  assert config.evals.to_dict() == {"task": {"enabled": True},
                                    "uas": {"enabled": True, "lines": 256},
                                    "preference": {"enabled": True, "lines": 256}}
  assert [e.name for e in evals.enabled_from_config(config)] == ["task", "uas", "preference"]


def test_a_registered_evaluator_gets_its_section_without_editing_the_base_config(
    toy_registered):
  config = configlib.base_config("question")
  assert config.evals.toy_param_squares.to_dict() == {"enabled": True, "scale": 1.0}
  config.evals.toy_param_squares.scale = 3.0
  assert evals.from_config(config, "toy_param_squares") == ParamSquares(scale=3.0)
  config.evals.toy_param_squares.enabled = False
  assert "toy_param_squares" not in [e.name for e in evals.enabled_from_config(config)]


def test_old_eval_names_set_the_evaluators_options():
  config = configlib.base_config("question")
  configlib.set_field(config, "eval.uas_lines", 7)
  assert config.evals.uas.lines == 7
  config.evals.preference.lines = 0
  assert config.eval.preference_lines == 0
  assert evals.from_config(config, "preference").lines == 0
  # A config.json from before the evals sections: the old fields give the options.
  old = json.loads(config.to_json())
  del old["evals"]
  old["eval"]["uas_lines"] = 5
  assert evals.from_config(ml_collections.ConfigDict(old), "uas").lines == 5


def test_an_unknown_evaluator_is_one_line_naming_the_registered_ones():
  config = configlib.base_config("question")
  config.evals.nope = ml_collections.ConfigDict({"enabled": True})
  with pytest.raises(ValueError) as e:
    evals.validate(config)
  assert str(e.value) == ("invalid config: evals.nope is not a registered evaluator "
                          "(registered: task, uas, preference; docs/evaluation.md says how to "
                          "add one)")


@pytest.mark.parametrize("section, field, value, message", [
    ("uas", "lines", -1, "invalid config: evals.uas: lines must be >= 0 (0 disables), got -1"),
    ("preference", "lines", -2, "invalid config: evals.preference: lines must be >= 0"),
    ("toy_param_squares", "scale", 0.0, "invalid config: evals.toy_param_squares: scale must "
     "be > 0, got 0.0"),
])
def test_bad_options_are_one_line_naming_the_section(toy_registered, section, field, value,
                                                     message):
  config = configlib.base_config("question")
  config.evals[section][field] = value
  with pytest.raises(ValueError) as e:
    config_checks.validate(config)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_an_option_the_evaluator_lacks_is_named():
  config = configlib.base_config("question")
  config.evals.uas.linez = 3
  with pytest.raises(ValueError, match=r"^invalid config: evals.uas.linez is not an option of "
                     r"evaluator 'uas' \(its options: enabled, lines\)$"):
    evals.validate(config)


def test_registering_needs_a_name_defaults_and_a_free_name():
  @dataclasses.dataclass(frozen=True)
  class NoDefault(evals.Evaluator):
    name = "toy_no_default"
    size: int = dataclasses.field(kw_only=True)  # keyword-only: may lack a default

  with pytest.raises(ValueError, match="option 'size' has no default"):
    evals.register(NoDefault)

  @dataclasses.dataclass(frozen=True)
  class Taken(evals.Evaluator):
    name = "uas"

  with pytest.raises(ValueError, match="evaluator 'uas' is already registered"):
    evals.register(Taken)
  assert evals.names()[:3] == ("task", "uas", "preference")


@pytest.mark.slow
def test_a_toy_evaluator_registered_in_a_test_module_logs_its_metric(toy_registered,
                                                                     tiny_config, tmp_path):
  """The training loop runs an evaluator it does not name: `toy/param_squares` is written at
  every evaluation, equal to 2 x the sum of squares of the parameters it evaluated."""
  config = tiny_config(**{"evals.toy_param_squares.scale": 2.0, "train.num_steps": 20})
  workdir = str(tmp_path / "run")
  result = train.train_and_evaluate(config, workdir, tensorboard=False)
  rows = [r for r in metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
          if r["name"] == "toy/param_squares"]
  seeds = result["seeds"]
  assert sorted({r["step"] for r in rows}) == [0, 20]  # eval.every is 20 in tiny
  params = jax.device_get(result["state"].params)
  want = [2.0 * sum(float(np.sum(np.square(np.asarray(x[s], np.float64))))
                    for x in jax.tree_util.tree_leaves(params)) for s in range(len(seeds))]
  got = {r["seed"]: r["value"] for r in rows if r["step"] == 20}
  np.testing.assert_allclose([got[s] for s in seeds], want, rtol=1e-5)
  assert got[seeds[0]] > 0
