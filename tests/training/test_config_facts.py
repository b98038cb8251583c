"""Each config fact is stated once: the model config, the validation, the compiled-function cache
(keyed on the typed step options) and the presets of each task."""

import dataclasses
import os
import subprocess
import sys

import pytest

from sg_jax import configlib
from sg_jax import step as step_lib
from sg_jax.config import checks as config_checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("task", ["dyck"])
def test_a_task_preset_is_refused_by_the_other_tasks_config_files(task, tmp_path, load_config):
  assert load_config("question", "grok_cpu").optim.schedule == "wsd"
  with pytest.raises(ValueError, match=r"unknown preset 'grok_cpu'.*\['paper', 'quick', 'tiny'\]"):
    load_config(task, "grok_cpu")
  proc = subprocess.run([sys.executable, "-m", "sg_jax.main", f"--workdir={tmp_path}/w",
                         f"--config=configs/{task}.py:grok_cpu"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
  assert "unknown preset 'grok_cpu'" in lines[0], lines
  assert not os.path.exists(tmp_path / "w")
  assert load_config(task, "quick").model.num_layers == 2  # the shared presets still apply


def test_model_config_takes_every_field_of_the_model_section(load_config):
  from sg_jax.models import (transformer as model_lib)  # pylint: disable=import-outside-toplevel  (imports jax)
  c = load_config("question", "quick")
  c.model.layer_norm_eps = 1e-6  # a ModelConfig field the base config does not set
  cfg = model_lib.ModelConfig.from_config(c.model, vocab_size=17, max_len=99)
  for name, value in c.model.items():
    if name != "name":  # '' = the objective's model (objectives.model_config_from_config)
      assert getattr(cfg, name) == value, name
  assert cfg.name == "transformer_lm" and c.model.name == ""
  assert (cfg.vocab_size, cfg.max_len, cfg.layer_norm_eps) == (17, 99, 1e-6)
  defaults = {f.name: f.default for f in dataclasses.fields(model_lib.ModelConfig)}
  bare = model_lib.ModelConfig.from_config({"d_model": 64}, vocab_size=5)
  assert bare.num_layers == defaults["num_layers"] and bare.d_model == 64
  c.model.num_expert = 3
  with pytest.raises(ValueError, match="model.num_expert is not a model field"):
    model_lib.ModelConfig.from_config(c.model, vocab_size=17)


@pytest.mark.parametrize("arg,field", [("dropout=1.0", "model.dropout"),
                                       ("d_model=100,heads=8", "model.d_model"),
                                       ("model.d_ff=0", "model.d_ff")])
def test_validation_of_the_model_section_is_the_model_configs(arg, field, load_config):
  from sg_jax.models import (transformer as model_lib)  # pylint: disable=import-outside-toplevel  (imports jax)
  c = load_config("question", arg)
  with pytest.raises(ValueError) as from_validate:
    config_checks.validate(c)
  with pytest.raises(ValueError) as from_model:
    model_lib.ModelConfig.from_config(c.model, vocab_size=5)
  assert str(from_validate.value) == str(from_model.value)
  assert str(from_validate.value).startswith(f"invalid config: {field} "), from_validate.value


def test_compiled_functions_are_cached_on_the_step_options(load_config):
  from sg_jax import train  # pylint: disable=import-outside-toplevel  (imports jax)
  base = lambda: load_config("question", "quick,optim.decay_steps=5000")
  fns = step_lib.train_fns_from_config(base(), 20)
  # Fields the step does not read (a resumed run may change them; the data seed and the task
  # reach the step only as data and as the vocabulary size) share the functions.
  for field, value in (("train.log_every", 7), ("eval.every", 9), ("checkpoint.every", 11),
                       ("train.steps_per_call", 3), ("train.num_steps", 123), ("num_devices", 1),
                       ("data.seed", 5)):
    c = base()
    configlib.set_field(c, field, value)
    assert step_lib.train_fns_from_config(c, 20) is fns, field
  for field, value in (("optim.b1", 0.8), ("model.dropout", 0.2), ("train.batch_size", 4),
                       ("objective", "mlm"), ("sas.lambdas", (0.01,)),
                       ("train.label_smoothing", 0.1)):
    c = base()
    configlib.set_field(c, field, value)
    assert step_lib.train_fns_from_config(c, 20) is not fns, field
  assert step_lib.train_fns_from_config(base(), 21) is not fns  # the vocabulary size
  # Every option is part of the key, the per-seed arrays by value.
  options = step_lib.StepOptions.from_config(base(), 20)
  assert step_lib.make_train_fns(options) is fns
  assert step_lib.make_train_fns(dataclasses.replace(options, batch_size=5)) is not fns
  other = {**options.hparams, "label_smoothing": options.hparams["label_smoothing"] + 0.5}
  assert step_lib.make_train_fns(dataclasses.replace(options, hparams=other)) is not fns
  # The step count shapes the functions when the learning-rate schedule ends at it.
  c, d = (load_config("question", "quick,optim.decay_steps=0") for _ in range(2))
  d.train.num_steps = 999
  assert step_lib.train_fns_from_config(c, 20) is not step_lib.train_fns_from_config(d, 20)
