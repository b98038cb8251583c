"""Training objectives: how a batch becomes inputs, targets and a loss, and which attention the
model uses (`base.Objective`). `config.objective` names one of the registered objectives; a new
one is one module with a registered `Objective` subclass (docs/objectives.md)."""

from sg_jax.objectives import lm  # noqa: F401  (registers `lm`)
from sg_jax.objectives.base import (ATTENTIONS, Objective, from_config, mean_token_loss,  # noqa: F401
                                    model_config,
                                    names, register, token_losses)
