"""Config files, the config-string parser and validation errors."""

import json
import os
import subprocess
import sys

import numpy as np

import pytest

from sg_jax import configlib
from sg_jax.config import checks as config_checks
from sg_jax.optim import schedules
from sg_jax.optim.options import OptimOptions
from sg_jax.records import metric_logging

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("task,steps", [("question", 300_000), ("tense", 300_000),
                                        ("dyck", 400_000)])
def test_defaults_reproduce_the_released_code(task, steps, load_config):
  c = load_config(task)
  config_checks.validate(c)
  assert c.task == task
  assert (c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_ff) == (6, 512, 8, 2048)
  assert c.model.tied_embeddings is False and c.optim.grad_clip_norm == 1.0
  assert (c.optim.learning_rate, c.optim.eps, c.optim.weight_decay) == (1e-4, 1e-7, 0.0)
  assert (c.optim.warmup_steps, c.optim.decay_steps) == (10_000, 2_000_000)
  assert c.train.batch_size == 8 and c.num_seeds == 10 and c.train.num_steps == steps
  assert c.checkpoint.every == 3_000 and c.checkpoint.max_to_keep == 0


def test_config_string_aliases_presets_and_types(load_config):
  c = load_config("tense", "depth=8,seeds=3,lr=3e-4,tied=True")
  assert c.model.num_layers == 8 and c.num_seeds == 3 and c.optim.learning_rate == 3e-4
  assert c.model.tied_embeddings is True
  c = load_config("question", "quick,depth=3")
  assert c.model.num_layers == 3 and c.model.d_model == 128 and c.num_seeds == 4
  c = load_config("question", "paper")
  assert (c.model.num_heads, c.model.tied_embeddings, c.optim.grad_clip_norm) == (4, True, 10.0)
  c = load_config("question", "model.d_model=256,clip=10")
  assert c.model.d_model == 256 and c.optim.grad_clip_norm == 10.0
  assert isinstance(c.optim.grad_clip_norm, float)


@pytest.mark.parametrize("task", ["question", "tense", "dyck"])
def test_tiny_preset_is_the_quick_one_shrunk_for_tests(task, load_config, tiny_data):
  tiny, quick = load_config(task, "tiny"), load_config(task, "quick")
  config_checks.validate(tiny)
  assert (tiny.model.num_layers, tiny.model.d_model, tiny.num_seeds) == (1, 32, 2)
  assert (tiny.train.num_steps, tiny.eval.every, tiny.checkpoint.every) == (40, 20, 20)
  differ = {name for name, _, _ in configlib.differences(quick.to_dict(), tiny.to_dict())}
  assert differ == set(configlib.TINY) - {k for k, v in configlib.QUICK.items()
                                           if configlib.TINY[k] == v}
  # The shared tiny data has the preset's training size, so a tiny run never regenerates it.
  with open(os.path.join(tiny_data, "question.meta.json")) as f:
    assert json.load(f)["sizes"]["train"] == tiny.data.num_train == 400


@pytest.mark.parametrize("arg,match", [
    ("depth=0", "model.num_layers"),
    ("seeds=0", "num_seeds"),
    ("d_model=100,heads=8", "model.d_model"),
    ("lr=0", "optim.learning_rate"),
    ("steps=0", "train.num_steps"),
    ("eval_every=0", "eval.every"),
    ("checkpoint_every=0", "checkpoint.every"),
    ("dtype=float16", "model.dtype"),
    ("optim.schedule=wsd,optim.cooldown_steps=0", "optim.cooldown_steps"),
    ("grok_cpu,optim.cooldown_steps=29000", "optim.cooldown_steps"),
])
def test_invalid_values_name_the_field(arg, match, load_config):
  c = load_config("question", arg)
  with pytest.raises(ValueError, match=match):
    config_checks.validate(c)


def test_parser_errors_name_the_key(load_config):
  with pytest.raises(ValueError, match="nonsense"):
    load_config("question", "nonsense=3")
  with pytest.raises(ValueError, match="unknown preset 'fast'"):
    load_config("question", "fast")
  with pytest.raises(ValueError, match="model.num_layers"):
    load_config("question", "depth=deep")
  with pytest.raises(ValueError, match="unknown task"):
    configlib.base_config("parsing")


def test_wsd_schedule_warms_up_holds_then_cools_down_to_zero(load_config):
  from sg_jax import train  # pylint: disable=import-outside-toplevel
  c = load_config("question", "optim.schedule=wsd,lr=1e-3,warmup=100,optim.decay_steps=1000,"
                       "optim.cooldown_steps=400")
  config_checks.validate(c)
  c.train.num_steps = 123  # unused: decay_steps is set
  lr = schedules.make_schedule(OptimOptions.from_config(c))
  expected = {0: 0.0, 50: 5e-4, 100: 1e-3, 400: 1e-3, 600: 1e-3, 800: 5e-4, 1000: 0.0,
              5000: 0.0}
  for step, value in expected.items():
    assert abs(float(lr(step)) - value) < 1e-9, (step, float(lr(step)))


def test_grok_cpu_preset_cools_down_at_its_last_step(load_config):
  from sg_jax import train  # pylint: disable=import-outside-toplevel
  c = load_config("question", "grok_cpu")
  config_checks.validate(c)
  assert c.optim.schedule == "wsd" and c.optim.decay_steps == 0  # = train.num_steps
  assert (c.model.num_layers, c.model.d_model, c.num_seeds) == (6, 128, 4)
  for steps in (30_000, 50_000):  # the cool-down follows a changed step count
    c.train.num_steps = steps
    lr = schedules.make_schedule(OptimOptions.from_config(c))
    assert float(lr(steps - 10_000)) == pytest.approx(3e-4)
    assert float(lr(steps - 5_000)) == pytest.approx(1.5e-4)
    assert float(lr(steps)) == 0.0


def test_tense_grok_cpu_is_question_formations_recipe_at_4_layers_with_fewer_eval_lines(load_config):
  question, tense = load_config("question", "grok_cpu"), load_config("tense", "grok_cpu")
  config_checks.validate(tense)
  assert tense.task == "tense" and tense.model.num_layers == 4 and tense.eval.max_lines == 1_000
  assert load_config("tense").eval.max_lines == 2_000  # the preset, not the file, lowers it
  for section in ("optim", "train", "checkpoint", "data"):
    assert tense[section].to_dict() == question[section].to_dict(), section
  same_model = {k: v for k, v in tense.model.items() if k != "num_layers"}
  assert same_model == {k: v for k, v in question.model.items() if k != "num_layers"}
  assert load_config("tense", "grok_cpu,depth=6").model.num_layers == 6  # as the sweep sets it


def test_unknown_fields_name_the_nearest_valid_ones(load_config):
  c = load_config("question")
  assert configlib.nearest_fields(c, "train.eval_every")[0] == "eval.every"
  assert "model.d_model" in configlib.nearest_fields(c, "model.dmodel")
  with pytest.raises(ValueError, match=r"unknown config field 'depht'; did you mean depth\?"):
    load_config("question", "quick,depht=3")
  args = ["--config=configs/question.py:quick", "--workdir=w", "--config.train.eval_every=200"]
  with_root = [a.replace("configs/", os.path.join(ROOT, "configs") + "/") for a in args]
  message = configlib.check_command_line(with_root)
  assert "'train.eval_every'" in message and "eval.every" in message, message
  assert configlib.check_command_line(with_root[:2] + ["--config.eval.every=200"]) is None
  assert "not found" in configlib.check_command_line(["--config=configs/nope.py:quick"])


@pytest.mark.parametrize("args, wanted", [
    (["--config=configs/question.py:quick", "--config.train.eval_every=200"],
     ("'train.eval_every'", "eval.every")),
    (["--config=configs/nope.py:quick"], ("configs/nope.py", "not found")),
])
def test_bad_config_arguments_are_one_line_on_the_command_line(tmp_path, args, wanted):
  proc = subprocess.run([sys.executable, "-m", "sg_jax.main", f"--workdir={tmp_path}/w"] + args,
                        cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert all(w in lines[0] for w in wanted) and "config_config" not in lines[0], lines
  assert not os.path.exists(tmp_path / "w")


def test_final_summary_is_a_per_seed_table_with_next_commands():
  result = {"step": 300, "seeds": [3, 4], "trained_steps": 300,
            "eval": {"in_domain/accuracy": np.array([1.0, np.nan]),
                     "out_of_domain/accuracy": np.array([0.25, np.nan]),
                     "in_domain/loss": np.array([0.5, np.nan]),
                     "out_of_domain/loss": np.array([2.0, np.nan]),
                     "out_of_domain/move_first_agreement": np.array([0.5, np.nan])}}
  text = metric_logging.format_summary(result, "runs/my run")
  lines = text.splitlines()
  assert lines[0] == "finished at step 300; final evaluation per seed:"
  assert lines[1].split() == ["seed", "in_domain/accuracy", "out_of_domain/accuracy",
                              "in_domain/loss", "out_of_domain/loss"]
  assert lines[2].split() == ["3", "1.0000", "0.2500", "0.5000", "2.0000"]
  assert lines[3].split() == ["4", "nan", "nan", "nan", "nan"] and "diverged" in lines[4]
  assert "runs/my run/metrics.csv" in text
  assert "python -m sg_jax.analyze --workdir='runs/my run'" in text
  assert "python -m sg_jax.report --root='runs/my run'" in text
  assert len(text) < 800
  result["trained_steps"] = 0
  assert "already complete" in metric_logging.format_summary(result, "w").splitlines()[0]
  # A loss term's per-seed lambda comes first (the SAS regimes of a group, docs/sas.md).
  result["per_seed"] = {"sas.lambda": np.array([0.0, -0.01], np.float32)}
  lines = metric_logging.format_summary(result, "w").splitlines()
  assert lines[1].split()[:3] == ["seed", "sas.lambda", "in_domain/accuracy"]
  assert lines[2].split()[:3] == ["3", "0", "1.0000"]
  assert lines[3].split()[:3] == ["4", "-0.01", "nan"]
  # A masked LM's evaluation: its preference and masked-token accuracy are the columns.
  result = {"step": 6, "seeds": [0], "eval": {
      "in_domain/preference": np.array([0.75]), "out_of_domain/preference": np.array([0.25]),
      "in_domain/masked_accuracy": np.array([0.4]), "in_domain/loss": np.array([2.5])}}
  lines = metric_logging.format_summary(result, "w").splitlines()
  assert lines[1].split() == ["seed", "in_domain/preference", "out_of_domain/preference",
                              "in_domain/masked_accuracy", "in_domain/loss"]
  assert lines[2].split() == ["0", "0.7500", "0.2500", "0.4000", "2.5000"]


def test_configlib_and_the_tasks_import_no_jax():
  """Config files import configlib (and with it the tasks) before JAX starts: neither imports
  JAX, nor does config validation live there (`config_checks`, which does)."""
  code = ("import sys; import sg_jax.configlib, sg_jax.tasks; "
          "assert 'jax' not in sys.modules and 'flax' not in sys.modules, 'jax imported'; "
          "assert not hasattr(sg_jax.configlib, 'validate')")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
