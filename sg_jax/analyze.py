r"""Analysis CLI: weight norm, attention entropy, tree projections, CKA, TVD and TwoNN per step.

  python -m sg_jax.analyze --workdir=runs/question6
  python -m sg_jax.analyze --workdir=runs/question6 --steps=3000,6000 --seeds=0,3 \
      --metrics=tscore,tparseval --num_sentences=1000

Restores each checkpoint of `--workdir` (parameters only), computes the requested metric groups
for every selected seed (vmapped over seeds; Murty et al., ACL 2023, §5; definitions in
`sg_jax.analysis`) on the first `--num_sentences` lines of the sentence set (`--sentence_set`) of
`--split`, and appends rows `step,seed,name,value` to `WORKDIR/analysis.csv` (`--output`). What
the file already holds is skipped, so the command can be rerun after a crash or a stop
(SIGINT/SIGTERM: exit 75, one line; each checkpoint's rows are written whole). It holds the
workdir's lock (`sg_jax.runtime.workdir_lock`), so it is refused in one line while `sg_jax.main` or
another command writes into the workdir. A seed marked diverged in a checkpoint gets no rows
there; the groups comparing with the final checkpoint (cka, tvd) run only once the run has
reached train.num_steps; unreadable checkpoints are named after the readable ones are analysed
(docs/reliability.md). The options that change values (split,
sentence set, entropy input, number of sentences, projection method, normalisation, random seed)
are recorded in `<output>.options.json`, with the number of sentences actually used; rerunning
with other options into the same file is refused (choose another `--output`).

Sentences (defaults = the released code's): `--sentence_set=transformed` reads only the
transformed lines (`quest` for question formation, `PRESENT` for tense; Dyck: every line);
`--sentence_set=all` every line. The model input of the entropies is `--entropy_input=declarative`
(SOS + the words before the task token, final "." removed) or `line` (SOS + the whole LM line);
tree projections always read the declarative part.

Metric groups and the names they write:
  weight_norm        weight_norm (global L2 norm of the model sg_jax trains: no unused decoder),
                     weight_norm_per_layer (weight_norm / num_layers, the paper's normalisation),
                     and for checkpoints converted by sg_jax.checkpointing.convert_torch weight_norm_released
                     (the released code's global norm, its unused 6-layer decoder included)
  attention_entropy  on the --entropy_input of the sentence set: attention_entropy_reference
                     (released code's variant: per sentence, summed over positions),
                     attention_sparsity_paper (negative mean entropy), attention_entropy_mean and
                     attention_entropy_l{layer}_h{head} (mean entropy per head) - nats
  tscore             tscore (declarative parts of the sentence set)
  tparseval          tparseval_f1, tparseval_precision, tparseval_recall (same sentences; needs
                     gold trees)
  cka, tvd, twonn    on the first --dynamics_lines whole lines of the sentence set: minibatch
                     linear CKA of each layer with the final and the previous checkpoint
                     (cka_final, cka_previous, per layer _l{layer}), mean total variation
                     distance of the objective's predictive distributions to them (tvd_final,
                     tvd_previous),
                     TwoNN intrinsic dimension (twonn_dimension, _l{layer}); docs/dynamics.md
The reference computes these on 10k training sentences every 3k steps (`--num_sentences=10000`).
The groups are those of `sg_jax.analysis.registry`: a quantity registered there is computed and
written like these (docs/analysis.md, "Adding a quantity").
"""

from __future__ import annotations


from sg_jax.runtime import startup_signals

if __name__ == "__main__":
  startup_signals.install()  # a stop signal during the imports below: one line, exit 75

# pylint: disable=wrong-import-position
from absl import app
from absl import flags

from sg_jax.runtime import compile_cache
from sg_jax.records import metric_logging
from sg_jax.runtime.commands import command_errors
from sg_jax.runtime.exit_codes import STOP_EXIT_SECONDS
from sg_jax.analysis import registry
from sg_jax.analysis.pipeline import ENTROPY_INPUTS, SENTENCE_SETS
from sg_jax.analysis.tree_projection import METHODS, NORMALISATIONS
from sg_jax.config.cli_options import parse_list  # noqa: F401  (the CLI's --steps/--seeds parser)
from sg_jax.analysis.driver import analyze, parse_metrics


_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding checkpoints/.")
_STEPS = flags.DEFINE_string("steps", "all", "'all' or comma-separated checkpoint steps.")
_SEEDS = flags.DEFINE_string("seeds", "all", "'all' or comma-separated seed ids.")
_METRICS = flags.DEFINE_string(
    "metrics", ",".join(registry.group_names()), "Comma-separated metric groups out of "
    f"{registry.group_names()} and those of --modules (default: all).")
_MODULES = flags.DEFINE_list("modules", [], "Python modules to import first; each registers "
                             "its own quantities (sg_jax.analysis.registry).")
_NUM_SENTENCES = flags.DEFINE_integer(
    "num_sentences", 1000, "Lines to analyse: the first N of the sentence set (reference: 10000).")
_SPLIT = flags.DEFINE_string("split", "train", "Data split the sentences come from.")
_UAS_MIN_COUNT = flags.DEFINE_integer(
    "uas_min_count", 100, "UAS (--modules=sg_jax.analysis.uas): relations with fewer arcs get "
    "no per-relation row (the original's 100).")
_SENTENCE_SET = flags.DEFINE_enum(
    "sentence_set", "transformed", SENTENCE_SETS, "Lines of the split: 'transformed' = quest / "
    "PRESENT lines only (released code; Dyck: every line), 'all' = every line.")
_ENTROPY_INPUT = flags.DEFINE_enum(
    "entropy_input", "declarative", ENTROPY_INPUTS, "Input of every attention-entropy variant: "
    "'declarative' = SOS + words before the task token, final '.' removed (released code); "
    "'line' = SOS + the whole LM line.")
_DYNAMICS_LINES = flags.DEFINE_integer(
    "dynamics_lines", registry.Options.dynamics_lines, "cka, tvd, twonn: the first N whole "
    "lines of the sentence set (the fixed evaluation set of every checkpoint).")
_OUTPUT = flags.DEFINE_string("output", "analysis.csv", "CSV file (relative to --workdir).")
_METHOD = flags.DEFINE_enum("method", "greedy", METHODS, "Tree projection: greedy (reference) "
                            "or cky (exact argmax).")
_NORMALISATION = flags.DEFINE_enum("normalisation", "random_split", NORMALISATIONS,
                                   "tscore normalisation (see sg_jax.analysis.tree_projection).")
_RNG_SEED = flags.DEFINE_integer("rng_seed", 0, "Seed of the random splits of the normalisation.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Sentences per tree-projection call.")
_ENTROPY_BATCH_SIZE = flags.DEFINE_integer("entropy_batch_size", 64, "Lines per entropy call.")
_SEEDS_PER_CALL = flags.DEFINE_integer("seeds_per_call", 0,
                                       "Seeds per compiled call (0 = all; lower to save memory).")
_COMPILATION_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir", None, "Folder of JAX's persistent compilation cache (as "
    "sg_jax.main's: unset = $JAX_COMPILATION_CACHE_DIR or ~/.cache/sg_jax/jax_cache; '' = off).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  metric_logging.setup_cli_logging()
  compile_cache.enable(_COMPILATION_CACHE_DIR.value)
  with command_errors():
    registry.load_modules(_MODULES.value)
    result = analyze(
        _WORKDIR.value, steps=parse_list(_STEPS.value, "steps"),
        seeds=parse_list(_SEEDS.value, "seeds"),
        groups=parse_metrics(_METRICS.value) if _METRICS.present else None,
        num_sentences=_NUM_SENTENCES.value, split=_SPLIT.value,
        sentence_set=_SENTENCE_SET.value, entropy_input=_ENTROPY_INPUT.value, output=_OUTPUT.value,
        method=_METHOD.value, normalisation=_NORMALISATION.value, rng_seed=_RNG_SEED.value,
        batch_size=_BATCH_SIZE.value, entropy_batch_size=_ENTROPY_BATCH_SIZE.value,
        seeds_per_call=_SEEDS_PER_CALL.value, strict_groups=_METRICS.present,
        uas_min_count=_UAS_MIN_COUNT.value, dynamics_lines=_DYNAMICS_LINES.value,
        signal_exit_seconds=STOP_EXIT_SECONDS)
  print(f"analysis: {result['rows_written']} new rows from {result['checkpoints_analysed']} "
        "checkpoints")


if __name__ == "__main__":
  app.run(main)
