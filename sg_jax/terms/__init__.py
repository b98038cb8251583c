"""Loss terms added to the training objective, each with per-seed strengths and step windows
(`base.LossTerm`; docs/objectives.md "Loss terms: the fields every term has"). A new term is one
module with a registered `LossTerm` subclass and a config section of the same name."""

from sg_jax.terms import sas  # noqa: F401  (registers `sas`)
from sg_jax.terms import tree  # noqa: F401  (registers `tree`, added after `sas`)
from sg_jax.terms.base import (LossTerm, Schedule, active, lambdas_at,  # noqa: F401
                               lambdas_per_seed, names, register, schedules_from_config,
                               seed_arrays, sum_name, train_arrays, validate)
