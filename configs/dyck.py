r"""Dyck-(20,10) language modelling for structural grokking (Murty et al. 2023, §3).

Defaults = the released code (docs/REFERENCE.md §1): depth 6, d_model 512, 8 heads, feed-forward 2048,
10 seeds, 400k steps; accuracy of the closing-bracket prediction at every closing bracket
(`eval.dyck_min_distance=10` gives the paper's long-dependency variant).

Run:
  python -m sg_jax.main --config=configs/dyck.py:depth=6 --workdir=runs/dyck6
  python -m sg_jax.main --config=configs/dyck.py:quick --workdir=runs/dyck_quick
"""

from sg_jax import configlib


def get_config(config_string: str | None = None):
  config = configlib.base_config("dyck")
  config.train.num_steps = 400_000
  # The Dyck sampler has no length limit of its own (uncapped training strings reach ~1,000 tokens,
  # mean ~40); the released validation split's longest string has 77 tokens. Strings longer than
  # 100 tokens are resampled, which keeps padding affordable. data.max_length=0 removes the cap.
  config.data.max_length = 100
  return configlib.apply_config_string(config, config_string, configlib.PRESETS)
