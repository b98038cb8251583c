r"""Core-analysis CLI: the heuristic core of the pruning runs, over checkpoints and seeds.

  python -m sg_jax.prune_core --workdir=runs/quick
  python -m sg_jax.prune_core --workdir=runs/grok --sparsity=0.5 --num_draws=16 --seeds=0,1
  python -m sg_jax.prune_core --workdir=runs/grok --noablation   # tables only, no checkpoint
  python -m sg_jax.prune_core --workdir=runs/grok --compare=pruning_gen.csv,pruning_tmg.csv

It reads `WORKDIR/pruning.csv` (`--input`, written by `sg_jax.prune`) and the masks files
`WORKDIR/pruning/masks_step<N>.npz` (of another `--input` T.csv: `WORKDIR/pruning/T/`), and
writes `WORKDIR/pruning_core.csv` (`--output`), rows `step,seed,sparsity,name,value`:
* per (step, seed), sparsity nan: `effective_size/<variant>` with `/ci_low`, `/ci_high`, for
  the variants mean (in- and out-of-domain accuracy averaged), in_domain and out_of_domain,
  over every level of the pruning table;
* per (step, seed, level): `core/num_heads`, `core/num_mlps`, `core/num_units`,
  `core/jaccard_final` (against the same seed's core at its last pruned step),
  `core/jaccard_seed<b>` (against seed b's core), `core/jaccard_within_heads`,
  `inclusion/<unit>`, `in_core/<unit>`;
* per (step, seed, level) and `--compare` table T.csv with masks there: `compare/T/...`, the
  overlaps of T's subnetworks (e.g. pruned with another objective) with this table's
  subnetworks and core (`core_table.compare_rows`);
* unless `--noablation`, per (step, seed, level) whose core has a head (`--ablate_units=all`:
  any unit): `full/<metric>`, `core_ablation/<metric>` (the core's heads removed, every MLP
  block kept; `--ablate_units=all`: its MLP blocks removed too) and `random_ablation/<metric>`
  (as many random non-core heads removed, the MLP blocks as in the core ablation; mean of
  `--num_draws` draws) with `random_ablation/<metric>/draw<k>`. The checkpoint is restored,
  the means are computed as `sg_jax.prune` does (its `--num_lines` and `--ablation`, read from
  the pruning table's options file) and the masks are scored with
  `pruning.evaluate.make_evaluator`.

Reruns replace: every selected (step, seed, level) group is recomputed and replaces its rows,
the others stay, and the file is rewritten atomically after each step. Ablation rows are
reused, not recomputed, while the group's stored core equals the new one. Definitions are in
docs/pruning.md (Bhaskar, Friedman & Chen, ACL 2024).
"""

from __future__ import annotations


from absl import app
from absl import flags

from sg_jax.config.cli_options import parse_list, step_selection
from sg_jax.pruning import core
from sg_jax.pruning.core_driver import parse_levels, parse_names, prune_core
from sg_jax.records import metric_logging
from sg_jax.runtime.commands import command_errors


def define_flags() -> None:
  """Defines the CLI flags (only when run as a program, as `sg_jax.prune`)."""
  flags.DEFINE_string("workdir", None, "Run directory holding pruning.csv and pruning/.")
  flags.DEFINE_string("input", "pruning.csv", "Pruning table (relative to --workdir).")
  flags.DEFINE_string("output", "pruning_core.csv", "Core table (relative to --workdir).")
  flags.DEFINE_string("sparsity", "all", "'all' or comma-separated sparsity levels of the "
                      "pruning table.")
  flags.DEFINE_string("steps", "all", "'all', 'last' or comma-separated steps of the table.")
  flags.DEFINE_string("seeds", "all", "'all' or comma-separated training seed ids.")
  flags.DEFINE_integer("num_draws", 8, "Random-ablation draws per core.")
  flags.DEFINE_integer("eval_lines", 0, "Lines per evaluation split (0 = the run's "
                       "eval.max_lines).")
  flags.DEFINE_bool("ablation", True, "Core ablation in the full model (--noablation: the "
                    "tables only, no checkpoint is restored).")
  flags.DEFINE_enum("ablate_units", "heads", list(core.ABLATION_UNITS),
                    "Which core units the core ablation removes: its heads, every MLP block "
                    "kept (the paper's core is a set of heads), or all its units (heads and "
                    "MLP blocks; the random baseline then removes the core's MLP blocks too).")
  flags.DEFINE_string("compare", "", "Comma-separated other pruning tables (e.g. "
                      "pruning_gen.csv from --objective=task:gen) whose subnetworks are "
                      "compared with this table's subnetworks and core: compare/<table>/... "
                      "rows.")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  metric_logging.setup_cli_logging()
  f = flags.FLAGS
  with command_errors():
    result = prune_core(
        f.workdir, input_name=f.input, output=f.output,
        sparsities=parse_levels(f.sparsity),
        **step_selection(f.steps), seeds=parse_list(f.seeds, "seeds"),
        num_draws=f.num_draws, eval_lines=f.eval_lines, ablation=f.ablation,
        ablate_units=f.ablate_units, compare=parse_names(f.compare))
  print(result["table"])
  print(f"core analyses: {len(result['groups'])} groups, {len(result['evaluated'])} ablated, "
        f"{len(result['reused'])} reused; {result['rows']} rows in {result['path']}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
