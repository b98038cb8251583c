"""Each paper claim as code: a registry of claims with their tests and decision rules.

    from sg_jax import claims
    rows = claims.evaluate(runs)          # runs: [report.reading.Run]; one row per outcome
    claims.markdown_lines(rows)           # the "Claims" section of the report's summary.md

A claim (`Claim`) names its source, the runs and columns it needs, its test and its decision
rule, fixed before it sees a number, and computes a verdict on whatever runs it is given:
"supported", "contradicted" or "not testable at this n" (with the minimum detectable effect and
the seeds per arm that would make it testable); a claim with nothing to test reads "no runs".
The rules are in `registry`'s docstring and docs/claims.md.

Built in (registered on import): Murty et al. 2023 (`murty`: grokking, inverted U, tscore at
the best depth and within depth, weight norm and attention sparsity, early stopping), Bhaskar
et al. 2024 (`bhaskar`: subnetworks differ out of domain, shared core, core forms early, core
ablation), Chen et al. 2024 (`chen`: the regulariser moves UAS, structure with a loss drop,
brief suppression helps) and sg_jax's own (`own`: tree-regulariser and disambiguating-line
dose responses, objectives) and what decides grokking (`hyperparameters`: weight decay, the
initialisation against the data order). A new claim is one `register(Claim(...))` (or the `@claim(...)`
decorator) in any imported module.
"""

from sg_jax.claims.registry import (ALPHA, CONTRADICTED, ERROR, NO_RUNS, NOT_TESTABLE, SUPPORTED,
                                    VERDICTS, Claim, Item, Outcome, claim, claims, decide,
                                    evaluate, family, markdown_lines, markdown_table, register,
                                    seeds_needed, unregister)
from sg_jax.claims import murty  # pylint: disable=unused-import  (registers its claims)
from sg_jax.claims import bhaskar  # pylint: disable=unused-import
from sg_jax.claims import chen  # pylint: disable=unused-import
from sg_jax.claims import own  # pylint: disable=unused-import
from sg_jax.claims import hyperparameters  # pylint: disable=unused-import

__all__ = ["ALPHA", "CONTRADICTED", "Claim", "ERROR", "Item", "NOT_TESTABLE", "NO_RUNS",
           "Outcome", "SUPPORTED", "VERDICTS", "claim", "claims", "decide", "evaluate", "family",
           "markdown_lines", "markdown_table", "register", "seeds_needed", "unregister"]
