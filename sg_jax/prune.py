r"""Pruning CLI: hard-concrete subnetworks of trained checkpoints (the heuristic core).

  python -m sg_jax.prune --workdir=runs/quick --sparsities=0.25,0.5 --pruning_seeds=2
  python -m sg_jax.prune --workdir=runs/grok --steps=all --seeds=0,1 --sparsities=0.3,0.5,0.7 \
      --pruning_seeds=4 --objective=task:gen

For each selected checkpoint (default: the last) it restores the seeds' parameters, computes the
mean head and MLP outputs over the real tokens of the first `--num_lines` training lines, and
trains one set of hard-concrete gates per (training seed x sparsity level x pruning seed) in ONE
compiled program (vmapped; `sg_jax.pruning.run`), `--steps_per_call` steps per call, laid
out over the local devices (a (seed, run) mesh, `sg_jax.pruning.placement`; `--num_devices`).
Each run's gates are then binarised (the original's per-group rule, or `--binarise=global`) and the
subnetwork is evaluated with the task's own metrics (in-domain and out-of-domain accuracy and
loss, and the rule agreements of question formation) and its KL to the full model on the pruning
lines. Rows `step,seed,sparsity,pruning_seed,name,value` are appended to `WORKDIR/pruning.csv`
(`--output`); the full model's rows have sparsity 0 and pruning_seed -1. The masks are saved to
`WORKDIR/pruning/masks_step<N>.npz` (another `--output` T.csv: `WORKDIR/pruning/T/`, so
another objective never replaces them). Runs already in the CSV are skipped, so the command can be
rerun after a crash or with more levels and seeds. The method, its defaults and their sources
are in docs/pruning.md (Bhaskar, Friedman & Chen, ACL 2024; docs/REFERENCE.md §2). The core
analyses of the tables (effective size, the core, overlaps, core ablation) are
`python -m sg_jax.prune_core`.

Per run it writes: achieved_sparsity (fraction of heads and MLP blocks off in the binarised
subnetwork), achieved_sparsity_params (weighted by parameter count), expected_sparsity (mean
P(z = 0) of the trained gates), final_objective (mean objective over the last 10% of steps, with
sampled gates), lambda1, lambda2, kl (binarised subnetwork vs the full model, nats per target
token) and `in_domain/...`, `out_of_domain/...` as metrics.csv names them.
"""

from __future__ import annotations


from sg_jax.runtime import host_devices
from sg_jax.runtime import startup_signals

if __name__ == "__main__":
  startup_signals.install()  # a stop signal during the imports below: one line, exit 75
  host_devices.configure_cpu_devices()  # before JAX starts: 2 x cores CPU devices, as training

# pylint: disable=wrong-import-position
from absl import app
from absl import flags

from sg_jax.config.cli_options import parse_list, step_selection
from sg_jax.pruning.driver import BINARISE, parse_sparsities, prune
from sg_jax.records import metric_logging
from sg_jax.runtime.commands import command_errors
from sg_jax.runtime.exit_codes import STOP_EXIT_SECONDS


def define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importing this module from a test
  or a notebook never clashes with other CLIs' flags, e.g. sg_jax.analyze's --workdir)."""
  flags.DEFINE_string("workdir", None, "Run directory holding checkpoints/.")
  flags.DEFINE_string("steps", "last", "'last', 'all' or comma-separated checkpoint steps.")
  flags.DEFINE_string("seeds", "all", "'all' or comma-separated training seed ids.")
  flags.DEFINE_string("sparsities", "0.3,0.5,0.7", "Target sparsity levels in (0, 1): "
                      "fraction of heads and MLP blocks removed.")
  flags.DEFINE_integer("pruning_seeds", 4, "Pruning runs per level and seed.")
  flags.DEFINE_integer("num_steps", 0, "Pruning steps (0 = the scaled original schedule of the "
                       "highest level, docs/pruning.md).")
  flags.DEFINE_integer("sparsity_warmup_steps", -1, "Steps of the target's rise (-1 = the "
                       "scaled original schedule).")
  flags.DEFINE_enum("warmup_type", "linear", ["linear", "log"], "Rise of the target sparsity.")
  flags.DEFINE_integer("lr_warmup_steps", 200, "Linear learning-rate warm-up steps of the gates "
                       "and multipliers (the original's 200), then a linear decay to 0.")
  flags.DEFINE_string("objective", "kl", "kl | task:SPLIT | train_minus_gen.")
  flags.DEFINE_enum("ablation", "mean", ["mean", "zero"], "What a pruned unit outputs.")
  flags.DEFINE_enum("sparsity_from", "expected", ["expected", "sampled"],
                    "Sparsity in the penalty: closed form or sampled gates.")
  flags.DEFINE_bool("weight_by_params", False, "Weight units by parameter count.")
  flags.DEFINE_enum("binarise", "group", list(BINARISE), "Final mask: the original's per-group "
                    "rule, the same with its 0.5 threshold, or the global top-k.")
  flags.DEFINE_integer("num_lines", 1000, "Training lines for the means and the KL (0 = all).")
  flags.DEFINE_integer("batch_size", 16, "Lines per pruning step.")
  flags.DEFINE_integer("eval_lines", 0, "Lines per evaluation split (0 = the run's "
                       "eval.max_lines).")
  flags.DEFINE_integer("steps_per_call", 100, "Pruning steps per compiled call.")
  flags.DEFINE_integer("num_devices", 0, "Devices to lay the runs over (0 = every local "
                       "device; docs/pruning.md).")
  flags.DEFINE_string("output", "pruning.csv", "CSV file (relative to --workdir).")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  metric_logging.setup_cli_logging()
  f = flags.FLAGS
  with command_errors():
    result = prune(
        f.workdir, sparsities=parse_sparsities(f.sparsities),
        **step_selection(f.steps), seeds=parse_list(f.seeds, "seeds"),
        pruning_seeds=f.pruning_seeds, num_steps=f.num_steps,
        sparsity_warmup_steps=f.sparsity_warmup_steps, warmup_type=f.warmup_type,
        lr_warmup_steps=f.lr_warmup_steps, objective=f.objective, ablation=f.ablation,
        sparsity_from=f.sparsity_from,
        weight_by_params=f.weight_by_params, binarise=f.binarise, num_lines=f.num_lines,
        batch_size=f.batch_size, eval_lines=f.eval_lines, steps_per_call=f.steps_per_call,
        num_devices=f.num_devices, output=f.output, signal_exit_seconds=STOP_EXIT_SECONDS)
  print(f"pruning: {result['runs']} runs, {result['rows_written']} new rows "
        f"({result['seconds']:.1f} s of pruning) in {f.output}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
