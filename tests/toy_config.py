"""`--config=tests/toy_config.py`: the tiny question-formation run trained with the toy
`prev_token` objective and the `l2` term of tests/toy_training.py (on the path: PYTHONPATH=tests),
seed 0 without the term and seed 1 with it. The config string sets the data folder:
`--config=tests/toy_config.py:DATA_DIR`."""

import toy_training  # noqa: F401  (registers prev_token and l2)

from sg_jax import configlib


def get_config(arg=None):
  config = configlib.apply_config_string(configlib.base_config("question"), "tiny",
                                         configlib.PRESETS)
  config.data.dir = arg or ""
  config.objective = "prev_token"
  config.l2 = toy_training.L2.default_section()
  config.l2.lambdas = (0.0, 0.05)
  config.eval.uas_lines = 0
  return config
