"""`python -m sg_jax.report`: the command line of the report (module docstring of the package)."""

from __future__ import annotations

import logging as py_logging
import os
import shutil
import sys

from absl import app
from absl import flags
from absl import logging

from sg_jax.analysis import registry
from sg_jax.report.build import build_report, find_runs, log
from sg_jax.report.reading import default_out_dir
from sg_jax.report.tables import _fmt
from sg_jax.runtime import workdir_lock
from sg_jax.runtime.commands import command_errors

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
  flags.DEFINE_list("group_by", [], "Config fields (e.g. optim.weight_decay, or its last part) "
                    "to group seeds by and draw the dose response of, the other per-seed fields "
                    "pooled; a field that differs between the runs of one depth (a grid sweep's "
                    "job axis) groups their seeds merged. Default: every per-seed field.")
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
  # ReportError, a --modules entry that cannot be imported, an unreadable file (named), a full
  # disk or read-only output folder, a workdir another command writes into: one line each
  with command_errors():
    registry.load_modules(FLAGS.modules)
    result = write_report(FLAGS.root, FLAGS.out_dir, threshold=FLAGS.threshold,
                          saturation=FLAGS.saturation, tie_tolerance=FLAGS.tie_tolerance,
                          pruning_all_steps=FLAGS.pruning_all_steps,
                          group_by=FLAGS.group_by)
  print(f"report: {len(result['figures'])} figures, summary.md and summary.csv in "
        f"{result['out_dir']}")
  for row in result["depths"]:
    objective = f"{row['objective']}, " if "objective" in row else ""
    print(f"  {objective}depth {row['depth']}: {row['num_seeds']} seeds, final gen. acc. mean "
          f"{_fmt(row['final_generalisation_mean'])}, {row['seeds_above_threshold']} above "
          "threshold, early stop (first/last best) "
          f"{_fmt(row['early_stop_first_generalisation_mean'])}"
          f"/{_fmt(row['early_stop_last_generalisation_mean'])}")


def _lock_file(root: str, out_dir: str) -> str:
  """The lock the report takes: that of the workdir `out_dir` lies in (a single run's
  `<root>/report`: one writer per workdir, `runtime.workdir_lock`), else `.<name>.lock` beside
  `out_dir` (two reports into one folder)."""
  target = os.path.realpath(out_dir)
  for workdir in find_runs(root):
    real = os.path.realpath(workdir)
    if target == real or target.startswith(real + os.sep):
      return workdir_lock.lock_path(workdir)
  parent, name = os.path.split(target)
  return os.path.join(parent, f".{name}.lock")


def write_report(root: str, out_dir: str | None = None, **options) -> dict:
  """`build_report` into a temporary folder beside `out_dir`, moved into place when complete:
  a failed report (a full disk, an unreadable table) leaves the previous report as it was and
  no partial folder. Holds the lock of the workdir it writes into (`_lock_file`).

  Returns:
    `build_report`'s result, its paths in `out_dir`.

  Raises:
    ReportError (a ValueError): no run, no accuracy rows, an unreadable file (named).
    OSError: `out_dir` cannot be written (named).
    workdir_lock.LockHeld: another command writes into the workdir `out_dir` lies in.
  """
  out_dir = os.path.normpath(out_dir or default_out_dir(root))
  lock = _lock_file(root, out_dir)
  parent, name = os.path.split(os.path.abspath(out_dir))
  try:
    os.makedirs(parent, exist_ok=True)
    workdir_lock.acquire(lock, "sg_jax.report")
  except workdir_lock.LockHeld as e:
    if os.path.basename(lock) != workdir_lock.LOCK_NAME:
      raise
    raise workdir_lock.LockHeld(f"{e}; or pass an --out_dir outside the workdir (a report "
                                "there marks the run in progress)") from None
  except OSError as e:
    raise OSError(f"cannot write the report into {out_dir}: {e.strerror or e}") from e
  temporary = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
  old = os.path.join(parent, f".{name}.old-{os.getpid()}")
  try:
    shutil.rmtree(temporary, ignore_errors=True)
    try:
      result = build_report(root, temporary, **options)
    except OSError as e:
      where = str(e.filename or temporary).replace(temporary, out_dir)  # the name it will have
      raise OSError(f"cannot write the report into {out_dir} ({where}): {e.strerror or e}; "
                    "the previous report is unchanged") from e
    if os.path.isdir(out_dir):
      os.replace(out_dir, old)
    os.replace(temporary, out_dir)
    shutil.rmtree(old, ignore_errors=True)
  finally:
    shutil.rmtree(temporary, ignore_errors=True)
    workdir_lock.release(lock)
  moved = lambda p: os.path.join(out_dir, os.path.relpath(p, temporary))
  result = dict(result, out_dir=out_dir, figures=[moved(p) for p in result["figures"]])
  return result


if __name__ == "__main__":
  define_flags()
  app.run(main)

