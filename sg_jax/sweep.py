r"""Sweep driver: a grid over config fields, one training job per combination of its job axes,
run or resumed one after another (or N at once).

  python -m sg_jax.sweep --config=configs/question.py --depths=2,4,6,8,10 --seeds=10 \
      --root=runs/qf
  python -m sg_jax.sweep --config=configs/question.py:grok_cpu --grid=model.num_layers=4,6 \
      --grid=optim.weight_decay=0,0.1,1 --seeds=4 --root=runs/wd
  python -m sg_jax.sweep --config=configs/question.py:quick --depths=1,2 --seeds=4 \
      --root=runs/qf_quick --override=model.d_model=64 --override=train.num_steps=600 --analyze
  python -m sg_jax.sweep ... -- --allow_config_change     # flags after `--` go to sg_jax.main

`--grid=section.field=v1,v2,...` (repeatable) is one axis of the grid; `--depths=D1,D2` is
`--grid=model.num_layers=D1,D2` (its default, 2,4,6,8,10, applies only without --grid). A field
that takes one value per seed (`sg_jax.sweeps.grid.seed_axis_fields`: learning rate, weight
decay and the other scalar hyperparameters, `seeds.init` / `seeds.data`, the data composition,
the loss terms' strengths and windows) goes onto the seed axis of each job: `--seeds` seeds per
value (per combination of such fields), laid out value by value. Every other field (depth,
width, heads, feed-forward width, training-set size, ...) makes separate jobs. The job of depth
D and other job-axis values runs as the subprocess

  python -m sg_jax.main --config=<file>:<config string>,depth=D,seeds=S \
      --workdir=<root>/<job name> [--config.<override> ...] [--config.<job field>=<value> ...] \
      [--config.<seed field>=(<one value per seed>) ...] [flags after --]

(`<job name>`: `depth<D>` for a grid over depth alone, else e.g. `depth4-d_model64`; `run`
without job axes), so every job is an ordinary `sg_jax.main` run: rerunning the sweep resumes
each unfinished job from its latest checkpoint, and a job whose latest checkpoint step equals the
requested `train.num_steps` (read with `sg_jax.checkpointing.all_steps` and the workdir's
`config.json`) is skipped. Jobs are queued on this machine (`--parallel=1`, the default, runs
one at a time: each job already uses every local device through its seed axis); `--parallel=N`
runs N at once. `--analyze` runs `python -m sg_jax.analyze --workdir=<root>/<job name>` after
each finished job (extra analysis flags through `--analyze_flag`).

The sweep index `root/sweep.json` records the config, the grid (`grid`: each axis's field,
values and whether it is a job or a seed axis, and the seeds per grid point), seeds, overrides,
analysis flags and, per job (keyed by its depth for a grid over depth alone, as before grids,
else by its name), the workdir (relative to the root), its other job-axis values
(`grid_values`), the seed-to-value map (`seeds`: seed id -> {field: value}), the exact command,
its status (pending, running, finished, skipped, failed, preempted), return code, latest
checkpoint step, log file, analysis status (finished, failed, interrupted) and UTC timestamps.
It is rewritten atomically after every change, so it can be read while the sweep runs. A rerun
on a root whose sweep.json records another grid (other fields, values, order or seeds per grid
point; a sweep.json from before grids records its depths and seeds) is refused in one line.
Each job's output goes to `root/logs/<job name>.log` (`.analyze.log` for the analysis).

Exit code: 0 when every job finished, 75 (like `sg_jax.main`) when the sweep was interrupted by
SIGTERM/SIGINT (rerun the same command to resume; an analysis stopped midway is redone), 1 when a
job failed or the command was refused.
"""

from __future__ import annotations

import os
import shlex
import sys

from absl import app
from absl import flags
from absl import logging

from sg_jax.runtime.commands import command_errors
from sg_jax.runtime.exit_codes import EXIT_PREEMPTED  # a job stopped by a signal: rerun resumes
from sg_jax.sweeps.driver import SWEEP_FILE, plan, run_sweep


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the CLI flags (only when run as a program, so importing this module never clashes
  with the flags of sg_jax.main or sg_jax.analyze)."""
  flags.DEFINE_string(
      "config", None, "Config file with an optional config string, e.g. configs/question.py or "
      "configs/question.py:quick,heads=4. depth=D,seeds=S are appended per job.")
  flags.DEFINE_list("depths", "2,4,6,8,10", "Comma-separated depths (num_layers): shorthand "
                    "for --grid=model.num_layers=...; the default applies only without --grid.")
  flags.DEFINE_multi_string(
      "grid", [], "A grid axis section.field=v1,v2,... (repeatable): a per-seed field goes onto "
      "each job's seed axis (--seeds seeds per value), any other field makes separate jobs.")
  flags.DEFINE_integer("seeds", 10, "Seeds per grid point (a job's num_seeds is this times the "
                       "number of its seed-axis grid points).")
  flags.DEFINE_string("root", None, "Sweep folder; each job trains in <root>/<job name> (depth "
                      "D alone: <root>/depth<D>).")
  flags.DEFINE_integer("parallel", 1, "Jobs run at once on this machine.")
  flags.DEFINE_multi_string(
      "override", [], "Config override section.field=value, passed as --config.section.field=value "
      "to every job (repeatable).")
  flags.DEFINE_bool("analyze", False, "Run sg_jax.analyze after each finished job.")
  flags.DEFINE_multi_string(
      "analyze_flag", [], "Extra flag for sg_jax.analyze, e.g. --analyze_flag=--num_sentences=200.")
  flags.DEFINE_bool("dry_run", False, "Print the job commands and exit.")
  flags.mark_flags_as_required(["config", "root"])


def main(argv):
  logging.set_verbosity(logging.WARNING)  # orbax chatter when reading checkpoint steps
  extra = list(argv[1:])
  depths = FLAGS.depths if (FLAGS["depths"].present or not FLAGS.grid) else []
  try:
    depths = [int(d) for d in depths]
  except ValueError:
    sys.exit(f"error: --depths must be comma-separated integers, got {FLAGS.depths}")
  # Bad input (flags, grid, config), a changed grid, a held lock: one line and exit code 1.
  with command_errors():
    if FLAGS.dry_run:
      for job in plan(FLAGS.config, depths, FLAGS.seeds, FLAGS.root, FLAGS.override, extra,
                      FLAGS.analyze, FLAGS.analyze_flag, FLAGS.grid):
        state = "finished, would skip" if job["initial_status"] == "skipped" else "would run"
        print(f"# {job['label']} ({state}, {job['num_seeds']} seeds)")
        print(shlex.join(job["command"]))
        if job["analyze_command"]:
          print(shlex.join(job["analyze_command"]))
      return
    statuses = run_sweep(FLAGS.config, depths, FLAGS.seeds, FLAGS.root,
                         parallel=FLAGS.parallel, overrides=FLAGS.override, extra=extra,
                         analyze=FLAGS.analyze, analyze_flags=FLAGS.analyze_flag,
                         grid=FLAGS.grid)
  print(f"[sweep] done: {statuses}; index: {os.path.join(FLAGS.root, SWEEP_FILE)}")
  values = set(statuses.values())
  if "failed" in values:
    sys.exit(1)
  if values - {"finished", "skipped"}:
    sys.exit(EXIT_PREEMPTED)


if __name__ == "__main__":
  define_flags()
  app.run(main)
