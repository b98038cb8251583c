"""`python -m sg_jax.report`: the command line of the report (module docstring of the package)."""

from __future__ import annotations

import logging as py_logging
import sys

from absl import app
from absl import flags
from absl import logging

from sg_jax.analysis import registry
from sg_jax.report import build_report, log
from sg_jax.report.tables import _fmt

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importing this module from a notebook
  or a test never clashes with other modules' flags)."""
  flags.DEFINE_string("root", None, "A sweep root (sg_jax.sweep) or a single workdir.")
  flags.DEFINE_string("out_dir", None, "Output folder (default <root>/report).")
  flags.DEFINE_float("threshold", 0.8, "Final generalisation accuracy above which a seed counts "
                     "as generalising (inverted-U figure).")
  flags.DEFINE_float("saturation", 0.99, "In-domain accuracy whose first step is marked on the "
                     "grokking curves.")
  flags.DEFINE_float("tie_tolerance", 0.0, "In-domain accuracies within this of the best count "
                     "as tied for early stopping.")
  flags.DEFINE_bool("pruning_all_steps", False, "Draw the pruned subnetworks' accuracies of "
                    "every pruned step too (pruning_accuracy_<run>_step<N>.png).")
  flags.DEFINE_list("modules", [], "Python modules to import first; each registers its own "
                    "analysis quantities, whose columns are then plotted too.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if FLAGS.root is None:
    raise app.UsageError("--root is required")
  logging.set_verbosity(logging.WARNING)
  handler = py_logging.StreamHandler(sys.stderr)
  handler.setFormatter(py_logging.Formatter("%(message)s"))
  log.addHandler(handler)
  log.setLevel(py_logging.INFO)
  log.propagate = False
  try:
    registry.load_modules(FLAGS.modules)
    result = build_report(FLAGS.root, FLAGS.out_dir, threshold=FLAGS.threshold,
                          saturation=FLAGS.saturation, tie_tolerance=FLAGS.tie_tolerance,
                          pruning_all_steps=FLAGS.pruning_all_steps)
  except ValueError as e:  # ReportError, or a --modules entry that cannot be imported
    sys.exit(f"error: {e}")
  print(f"report: {len(result['figures'])} figures, summary.md and summary.csv in "
        f"{result['out_dir']}")
  for row in result["depths"]:
    objective = f"{row['objective']}, " if "objective" in row else ""
    print(f"  {objective}depth {row['depth']}: {row['num_seeds']} seeds, final gen. acc. mean "
          f"{_fmt(row['final_generalisation_mean'])}, {row['seeds_above_threshold']} above "
          "threshold, early stop (first/last best) "
          f"{_fmt(row['early_stop_first_generalisation_mean'])}"
          f"/{_fmt(row['early_stop_last_generalisation_mean'])}")


if __name__ == "__main__":
  define_flags()
  app.run(main)

