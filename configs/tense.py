r"""Tense reinflection (McCoy et al. 2020) for structural grokking (Murty et al. 2023, §3).

Defaults = the released code (docs/REFERENCE.md §1): depth 6, d_model 512, 8 heads, feed-forward 2048,
10 seeds, 300k steps (the released tense curves use 4 layers: add depth=4). The metric greedily
decodes at most 2,000 lines per split after the PAST/PRESENT token.

Run:
  python -m sg_jax.main --config=configs/tense.py:depth=8 --workdir=runs/tense8
  python -m sg_jax.main --config=configs/tense.py:quick --workdir=runs/tense_quick
"""

from sg_jax import configlib


def get_config(config_string: str | None = None):
  config = configlib.base_config("tense")
  config.eval.max_lines = 2_000
  return configlib.apply_config_string(config, config_string, configlib.PRESETS)
