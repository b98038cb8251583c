r"""Question formation (McCoy et al. 2020) for structural grokking (Murty et al. 2023, §3).

Defaults = the released code (docs/REFERENCE.md §1): depth 6, d_model 512, 8 heads, feed-forward 2048,
10 seeds, 300k steps, evaluation and checkpoints every 3k steps.

Run (config string: comma-separated presets and key=value pairs):
  python -m sg_jax.main --config=configs/question.py:depth=8 --workdir=runs/question8
  python -m sg_jax.main --config=configs/question.py:quick --workdir=runs/quick   # CPU, minutes
  python -m sg_jax.main --config=configs/question.py:paper,seeds=20 --workdir=runs/q_paper
Presets: quick (small model, 4 seeds, 3k steps), paper (4 heads, tied embeddings, clip 10),
grok_cpu (4 layers, d_model 128, 18k steps: structural grokking on a CPU; being tuned).
"""

from sg_jax import configlib


def get_config(config_string: str | None = None):
  config = configlib.base_config("question")
  return configlib.apply_config_string(config, config_string, configlib.PRESETS)
