r"""Tense reinflection (McCoy et al. 2020) for structural grokking (Murty et al. 2023, §3).

Defaults = the released code (docs/REFERENCE.md §1): depth 6, d_model 512, 8 heads, feed-forward 2048,
10 seeds, 300k steps (the released tense curves use 4 layers: add depth=4). The metric greedily
decodes at most 2,000 lines per split after the PAST/PRESENT token.

Run:
  python -m sg_jax.main --config=configs/tense.py:depth=8 --workdir=runs/tense8
  python -m sg_jax.main --config=configs/tense.py:quick --workdir=runs/tense_quick
  python -m sg_jax.main --config=configs/tense.py:grok_cpu --workdir=runs/tense_grok_cpu

grok_cpu (tense's own preset; about 30 minutes for 4 seeds on a 2-core CPU; docs/grok_cpu.md,
"Tense reinflection"): in-domain accuracy saturates at 7k steps with generalisation at 0.19 (seed
mean), which then rises to 0.37 at 30k (peaks of 0.5-0.6 in between): grokking begins within 30k
steps but is far from the paper's 0.85 after 300k. It is question formation's grok_cpu recipe
(configs/question.py gives the differences from the paper and why) with these changes:
* 4 layers, the released tense curves' depth (the paper's best for tense).
* Evaluation on at most 1,000 lines per split (greedy decoding of the whole target: about 120
  lines/s for 4 seeds at 4 layers, 15-18 s per evaluation, against about 290 lines/s for
  question formation's next-token scoring).
Tried and not taken: AdamW lr 1e-3 (same schedule): generalisation ends about as high (mean
0.44), but in-domain accuracy swings between 0.95 and 0.99 until the cool-down, so every seed
reaches 0.99 only at 23k, with generalisation already at 0.50: no rise after saturation.
"""

from sg_jax import configlib

GROK_CPU = {
    # The start of structural grokking on tense at laptop scale (the module docstring gives the
    # measured figures and what was tried): a 4-layer post-LN LM with d_model 128 on 100k tense
    # lines; AdamW 3e-4, 2k warm-up, constant, then a linear cool-down to 0 over the last 10k of
    # 30k steps. Evaluated (1,000 lines per split) and checkpointed every 1k steps.
    "num_seeds": 4,
    "data.num_train": 100_000,
    "model.num_layers": 4,
    "model.d_model": 128,
    "model.num_heads": 4,
    "model.d_ff": 512,
    "optim.learning_rate": 3e-4,
    "optim.warmup_steps": 2_000,
    "optim.schedule": "wsd",
    "optim.decay_steps": 0,  # = train.num_steps: the cool-down always ends at the last step
    "optim.cooldown_steps": 10_000,
    "train.num_steps": 30_000,
    "train.log_every": 500,
    "eval.every": 1_000,
    "eval.max_lines": 1_000,
    "checkpoint.every": 1_000,
}

# The shared presets and this task's own (question formation's grok_cpu is another recipe).
PRESETS = {**configlib.PRESETS, "grok_cpu": GROK_CPU}


def get_config(config_string: str | None = None):
  config = configlib.base_config("tense")
  config.eval.max_lines = 2_000
  return configlib.apply_config_string(config, config_string, PRESETS)
