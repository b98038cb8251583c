"""Training-time evaluators (docs/evaluation.md): one module per evaluation, each a registered
`registry.Evaluator` with its options in `config.evals.<name>`. The training loop builds every
enabled one (`enabled_from_config`) and names none. Built in, in the order they run and log:
`task` (the objective's loss and the task's metric), `uas` (UAS of attention), `preference`
(minimal-pair preference). Importing this package imports no JAX (config files build their
sections)."""

from sg_jax.evaluation import task_metric  # noqa: F401  (registers `task`)
from sg_jax.evaluation import uas  # noqa: F401  (registers `uas`)
from sg_jax.evaluation import preference  # noqa: F401  (registers `preference`)
from sg_jax.evaluation.registry import (Context, EvalOptions, Evaluation, Evaluator,  # noqa: F401
                                        Program, enabled_from_config, from_config, names,
                                        register, sections, unregister, validate)
