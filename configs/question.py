r"""Question formation (McCoy et al. 2020) for structural grokking (Murty et al. 2023, §3).

Defaults = the released code (docs/REFERENCE.md §1): depth 6, d_model 512, 8 heads, feed-forward 2048,
10 seeds, 300k steps, evaluation and checkpoints every 3k steps.

Run (config string: comma-separated presets and key=value pairs):
  python -m sg_jax.main --config=configs/question.py:depth=8 --workdir=runs/question8
  python -m sg_jax.main --config=configs/question.py:quick --workdir=runs/quick   # CPU, minutes
  python -m sg_jax.main --config=configs/question.py:paper,seeds=20 --workdir=runs/q_paper
Presets: quick (small model, 4 seeds, 3k steps), paper (4 heads, tied embeddings, clip 10),
grok_cpu (structural grokking on a 2-core CPU in about 50 minutes for 4 seeds; docs/grok_cpu.md:
seed sets 0-3 and 4-7 end with mean generalisation 0.71 / 0.79 after 0.18 / 0.27 at saturation;
seeds 8-11 narrowly miss, 0.68 after 0.36).

grok_cpu differs from the paper's setup (docs/REFERENCE.md §1) as follows, and why:
* 6 layers (the paper's best depth for question formation), d_model 128, 4 heads, feed-forward
  512 (reference: 512 / 8 / 2048): about 16x fewer FLOPs per step, so 30k steps of 4 seeds fit in
  about 50 minutes on 2 cores. At 4 layers the same recipe ended with mean generalisation
  >= 0.70 in only 1 of 3 seed sets (0.64 / 0.78 / 0.58); at 6 layers in 2 of 3 (0.71 / 0.79 / 0.68).
* 30k steps (paper: 300k): in-domain accuracy saturates by ~2k steps at this size and the
  hierarchical rule arrives between ~5k and ~25k steps.
* AdamW lr 3e-4 (paper: 1e-4) with 2k warm-up: the smaller model tolerates a larger rate, which
  shortens the time to grok (lr 1e-3 at 4 layers: more swings, mean 0.69 on seeds 0-3).
* A linear cool-down to 0 over the last 10k steps (schedule "wsd"; paper: a slow linear decay
  that is still at 0.85e-4 at 300k): at a constant rate generalisation swings by up to +-0.4 between
  evaluations (+-0.2 at 4 layers); the swings shrink as the rate falls, so the final evaluation is
  less of a lottery.
* 100k training lines, the paper's size (a 10k-line run of seeds 0-3 ended at mean 0.65).
  Seeds that end near 0.65 have learnt a linear rule instead of the hierarchical one ("front
  the first auxiliary not directly after that/who"; right on every training question and on
  0.6495 of the gen lines); `out_of_domain/skip_relative_agreement` in metrics.csv shows which
  seeds follow it.
* Evaluation on 2,000 lines per split every 1k steps (paper: all lines every 3k steps).
"""

from sg_jax import configlib

GROK_CPU = configlib.GROK_CPU  # the recipe lives in sg_jax/presets, shared with configs/tense.py

# The shared presets and this task's own (tuned for question formation; tense has its own).
PRESETS = {**configlib.PRESETS, "grok_cpu": GROK_CPU}


def get_config(config_string: str | None = None):
  config = configlib.base_config("question")
  return configlib.apply_config_string(config, config_string, PRESETS)
