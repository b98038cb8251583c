"""The shared presets of the config string (`configlib.apply_config_string`): each maps dotted
config fields to values. `quick`, `paper` and `tiny` are accepted by every task's config file
(`PRESETS`); a task's own presets live in its config file (configs/question.py and
configs/tense.py: grok_cpu, whose recipe is `GROK_CPU`). `sg_jax.configlib` re-exports them.
This module imports nothing (config files import it before JAX starts).
"""

QUICK = {
    # Small enough to show learning on a 2-core CPU in a couple of minutes.
    "num_seeds": 4,
    "data.num_train": 10_000,
    "model.num_layers": 2,
    "model.d_model": 128,
    "model.num_heads": 4,
    "model.d_ff": 512,
    "optim.learning_rate": 1e-3,
    "optim.warmup_steps": 300,
    "optim.schedule": "constant",
    "train.num_steps": 3_000,
    "train.log_every": 500,
    "eval.every": 1_000,
    "eval.max_lines": 1_000,
    "checkpoint.every": 1_000,
}

PAPER = {
    # The paper's stated variant (docs/REFERENCE.md table): 4 heads, tied embeddings, clipping 10.
    "model.num_heads": 4,
    "model.tied_embeddings": True,
    "optim.grad_clip_norm": 10.0,
}

TINY = {
    # The quick preset shrunk until a whole run (training, evaluations, checkpoints, resume)
    # takes seconds: what tests and scripts use to exercise the loop, not to learn anything.
    **QUICK,
    "num_seeds": 2,
    "data.num_train": 400,
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.d_ff": 64,
    "optim.warmup_steps": 10,
    "train.num_steps": 40,
    "train.steps_per_call": 10,
    "train.log_every": 10,
    "eval.every": 20,
    "eval.max_lines": 64,
    "checkpoint.every": 20,
}

GROK_CPU = {
    # Question formation's grok_cpu preset (configs/question.py; its docstring gives the
    # differences from the paper and why; configs/tense.py derives tense's from it). Not a shared
    # preset: each task's config file offers its own.
    # Structural grokking at laptop scale: a 6-layer post-LN LM (the paper's best depth for question
    # formation) with d_model 128 on 100k question-formation lines; AdamW 3e-4, 2k warm-up,
    # constant, then a linear cool-down to 0 over the last 10k of 30k steps. Evaluated and
    # checkpointed every 1k steps (2,000 lines per split). About 50 minutes for 4 seeds on 2 cores.
    "num_seeds": 4,
    "data.num_train": 100_000,
    "model.num_layers": 6,
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
    "eval.max_lines": 2_000,
    "checkpoint.every": 1_000,
}


# Presets every task's config file accepts; a task's own presets live in its config file
# (configs/question.py and configs/tense.py: grok_cpu).
PRESETS = {"quick": QUICK, "paper": PAPER, "tiny": TINY}
