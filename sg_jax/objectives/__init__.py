"""Training objectives: how a batch becomes inputs, targets and a loss, and which attention the
model uses (`base.Objective`). `config.objective` names one of the registered objectives; a new
one is one module with a registered `Objective` subclass (docs/objectives.md)."""

from sg_jax.objectives import lm  # noqa: F401  (registers `lm`)
from sg_jax.objectives import mlm  # noqa: F401  (registers `mlm`)
from sg_jax.objectives import prefix_lm  # noqa: F401  (registers `prefix_lm`)
from sg_jax.objectives import seq2seq  # noqa: F401  (registers `seq2seq`)
from sg_jax.objectives.base import (ATTENTIONS, Objective, from_config,  # noqa: F401
                                    masked_accuracy, mean_token_loss, model_config_from_config,
                                    model_name, names, register, smoothing_gap, token_losses)
