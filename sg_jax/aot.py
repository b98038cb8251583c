r"""Compiles a run's programs for a TPU or GPU on this machine (no accelerator needed) and prints
whether they fit, their FLOPs and bytes per seed-step, code size, compile time and HLO checks.

  python -m sg_jax.aot --config=configs/tense.py:depth=8 --target=v5e:2x2
  python -m sg_jax.aot --config=configs/question.py:tiny --target=h100 --programs=train
  python -m sg_jax.aot --config=configs/tense.py:depth=8,seeds=64 --target=v5p:2x2x1

Targets: v4:AxBxC, v5e:AxB, v5p:AxBxC, v6e:AxB (chips along each axis of the TPU slice), h100,
h200, a100 (one GPU; h100:N for N). Needs the optional compile-only pieces:
requirements-accelerators.txt (libtpu, the jax-cuda12 plugin), in a separate environment
(docs/performance.md: the CUDA plugin prints a traceback in every JAX process without a GPU). Compiles the
training call with the seed mesh the run would use (`model.layer_impl=auto` is compiled as
`plain`, what it picks on an accelerator), one call of each jitted function of every evaluator
the config switches on (task metric, attention UAS, minimal-pair preference, ...) and of each
analysis quantity of `sg_jax.analyze` (`--programs` picks: train, eval, analysis). What the
figures mean and what a compile does not prove: docs/performance.md ("Compiling for TPU and GPU
ahead of time"); the body is `sg_jax.accelerators`.
"""

import os
import sys

# No accelerator is looked for: the target's devices are compile-only (before JAX starts).
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

# pylint: disable=wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from sg_jax import configlib
from sg_jax.config.cli_options import parse_flags
from sg_jax.accelerators import programs as programs_lib
from sg_jax.accelerators import table
from sg_jax.accelerators import targets as targets_lib
from sg_jax.records import metric_logging

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file with an optional config string, e.g. configs/tense.py:depth=8.",
    lock_config=True)
_TARGET = flags.DEFINE_string("target", None, f"Accelerator: {targets_lib.TARGET_EXAMPLES}.")
_WORKDIR = flags.DEFINE_string(
    "workdir", "", "Run directory whose data/ holds (or receives) the generated splits, as "
                   "sg_jax.main's; unset: a temporary folder.")
_PROGRAMS = flags.DEFINE_list("programs", list(programs_lib.KINDS),
                              "Which programs: train, eval (every enabled evaluator's), analysis "
                              "(sg_jax.analyze's quantities).")
flags.mark_flags_as_required(["config", "target"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  metric_logging.setup_cli_logging()
  unknown = set(_PROGRAMS.value) - set(programs_lib.KINDS)
  if unknown:
    sys.exit(f"error: --programs takes {', '.join(programs_lib.KINDS)}, not "
             f"{','.join(sorted(unknown))}")
  try:
    target = targets_lib.parse_target(_TARGET.value)
    the_plan = programs_lib.plan(_CONFIG.value, target, _WORKDIR.value,
                                 tuple(_PROGRAMS.value))
  except (ValueError, OSError, RuntimeError) as e:  # MissingInstall is a RuntimeError
    sys.exit(f"error: {e}")
  for label, value in table.describe(the_plan):
    print(f"{label:>10}: {value}")
  config = the_plan.config
  rows = []

  def done(result):
    rows.append(table.row(the_plan, result, config.model.dtype, config.model.matmul_precision))
    print(f"  compiled {result.program.name} in {result.compile_s:.0f} s", flush=True)

  print(f"compiling {len(the_plan.programs)} programs for {target.name} (minutes each at the "
        f"reference size)", flush=True)
  programs_lib.compile_all(the_plan, done)
  print()
  print(table.format_table(table.HEADER, rows))
  for note in table.NOTES:
    print(f"  * {note}")
  for what in the_plan.skipped:
    print(f"  * not compiled: {what}")



if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
