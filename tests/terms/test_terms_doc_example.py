"""docs/objectives.md "Adding a loss term": the page's `l2` term and its config file, executed as
modules, give the section, the active term, the penalty and the one-line refusal the page
describes (so the page cannot go stale)."""

import os
import re
import sys
import types

import jax
import numpy as np
import pytest

from sg_jax import configlib, terms
from sg_jax.terms import base as terms_base

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "docs", "objectives.md")


def _blocks() -> tuple[str, str]:
  """The section's python blocks: the term's module, then its config file."""
  with open(DOC, encoding="utf-8") as f:
    text = f.read()
  section = text[text.index("## Adding a loss term"):]
  section = section[:section.index("\n## ", 1)]
  term, config_file = re.findall(r"```python\n(.*?)```", section, re.S)
  return term, config_file


@pytest.fixture
def doc_modules(monkeypatch):
  """(my_l2, my_l2_config) run from the page; the registry is restored afterwards."""
  # A copy without any `l2` registered before (tests/toy_training.py registers one of its own).
  registry = {k: v for k, v in terms_base._REGISTRY.items() if k != "l2"}  # pylint: disable=protected-access
  monkeypatch.setattr(terms_base, "_REGISTRY", registry)
  modules = []
  for name, source in zip(("my_l2", "my_l2_config"), _blocks()):
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(source, DOC, "exec"), module.__dict__)  # pylint: disable=exec-used
    modules.append(module)
  return modules


def test_the_docs_l2_term_section_activation_and_penalty(doc_modules):
  my_l2, my_l2_config = doc_modules
  assert terms.names()[-1] == "l2"
  config = my_l2_config.get_config("tiny")
  assert config.l2.to_dict() == {"lambdas": (0.0,), "starts": (0,), "ends": (0,), "scale": 1.0}
  assert terms.active(config) == ()  # lambda 0: not built
  configlib.set_field(config, "l2.lambdas", (0.0, 0.05))
  configlib.set_field(config, "l2.scale", 3.0)
  terms.validate(config)
  (term,) = terms.active(config)
  assert term == my_l2.L2(scale=3.0)
  params = {"a": np.arange(6.0, dtype=np.float32).reshape(2, 3), "b": {"c": np.float32([-2.0])}}
  penalty = jax.jit(lambda p: term.penalty(p, None, {}, np.zeros(1, np.int32), None))(params)
  np.testing.assert_allclose(penalty, 3.0 * (55.0 + 4.0), rtol=1e-6)


def test_without_the_section_the_flag_is_refused_as_the_docs_quote(doc_modules):
  del doc_modules
  config = configlib.apply_config_string(configlib.base_config("question"), "tiny",
                                         configlib.PRESETS)
  with open(DOC, encoding="utf-8") as f:
    quoted = re.sub(r"\s+", " ", f.read())
  message = configlib.unknown_field_message(config, "l2.lambdas")
  assert message == ("unknown config field 'l2.lambdas'; did you mean sas.lambdas or "
                     "tree.lambdas?")
  assert f"`{message} (--config.l2.lambdas)`" in quoted
