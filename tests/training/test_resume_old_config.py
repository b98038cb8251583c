"""A workdir written before a config field existed resumes as if it had the field's default."""

import json
import os

import pytest

from sg_jax import configlib
from sg_jax.runtime import config_changes, resume_check


def _write_old_config(path, config, drop):
  stored = json.loads(config.to_json())
  for dotted in drop:
    *parents, leaf = dotted.split(".")
    node = stored
    for p in parents:
      node = node[p]
    del node[leaf]
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(stored, f)


# Fields added to sg_jax after runs existed (each defaults to the behaviour before it).
ADDED = ("model.layer_impl", "model.matmul_precision", "sas", "data.num_disambiguating",
         "data.subject_mix", "eval.uas_lines", "tree")


def test_missing_fields_count_as_their_defaults(load_config, tmp_path):
  config = load_config("question", "tiny")
  _write_old_config(tmp_path, config, ADDED)
  resume_check.check_workdir_config(str(tmp_path), config, allow_config_change=False)  # no error


def test_a_new_value_of_a_missing_field_is_still_a_change(load_config, tmp_path):
  config = load_config("question", "tiny")
  _write_old_config(tmp_path, config, ADDED)
  configlib.set_field(config, "data.num_disambiguating", 100)
  with pytest.raises(ValueError, match=r"data.num_disambiguating \[0\] -> \[100\]"):
    resume_check.check_workdir_config(str(tmp_path), config, allow_config_change=True)
  config = load_config("question", "tiny")
  configlib.set_field(config, "sas.lambdas", (0.01,))
  with pytest.raises(ValueError, match="sas.lambdas"):
    resume_check.check_workdir_config(str(tmp_path), config, allow_config_change=True)


def test_with_new_fields_keeps_stored_values():
  old = {"model": {"num_layers": 3}, "task": "question"}
  defaults = {"model": {"num_layers": 6, "layer_impl": "auto"}, "task": "question",
              "sas": {"lambdas": [0.0]}}
  assert config_changes.with_new_fields(old, defaults) == {
      "model": {"num_layers": 3, "layer_impl": "auto"}, "task": "question",
      "sas": {"lambdas": [0.0]}}
