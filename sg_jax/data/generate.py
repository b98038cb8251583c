"""Command line: generate a task's data splits in the released formats.

  python -m sg_jax.data --task=question --out_dir=runs/data_q [--seed=0] [--num_train=100000]
  python -m sg_jax.data --task=tense --out_dir=runs/data_t
  python -m sg_jax.data --task=dyck --out_dir=runs/data_d [--num_eval=20000]

Writes `question.{train,dev,test,gen}` and `question_bracket.*` (tense likewise) or
`dyck.{train,val,test}`, shows a progress bar, and prints a summary table (lines per split,
task-token mix, mean length). With `--download`, fetches the released McCoy et al. files into
`--out_dir` instead (SHA-256 checked, see `sg_jax.tasks.io.download_released`). A file that
cannot be written (e.g. a full disk) or a bad download ends the command with one line naming the
file and a nonzero exit.
"""

from __future__ import annotations

import collections
import pathlib
import time

from absl import app
from absl import flags

from sg_jax import tasks
from sg_jax.runtime.commands import command_errors
from sg_jax.tasks import io as io_lib

_TASK = flags.DEFINE_enum("task", None, list(tasks.names()), "Task to generate.")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Output folder (created).")
_SEED = flags.DEFINE_integer("seed", 0, "Generation seed.")
_NUM_TRAIN = flags.DEFINE_integer("num_train", None,
                                  "Train lines (default: 100,000 question/tense, 200,000 Dyck).")
_NUM_EVAL = flags.DEFINE_integer(
    "num_eval", None, "Size of every evaluation split (default: dev 1,000 / test 10,000 / gen "
    "10,000 for question and tense; val 20,000 / test 20,000 for Dyck).")
_DYCK_MAX_LENGTH = flags.DEFINE_integer(
    "dyck_max_length", None,
    "Tasks with a length limit (Dyck): reject strings longer than this (tokens).")
_DOWNLOAD = flags.DEFINE_boolean("download", False,
                                 "Download the released McCoy files instead of generating.")
_BASE_URL = flags.DEFINE_string("base_url", io_lib.DEFAULT_BASE_URL,
                                "Base URL for --download.")
flags.mark_flags_as_required(["out_dir"])


def summary_table(task, out_dir: pathlib.Path) -> str:
  """Text table: split, lines, task-token mix, mean length (words or tokens) of each split."""
  rows = [("split", "lines", "task tokens", "mean length")]
  for split in task.split_names:
    examples = task.read_split(out_dir / task.file_names(split)[0])
    counts = collections.Counter(e.task_token for e in examples if e.task_token)
    n = len(examples)
    mix = ", ".join(f"{t} {c / n:.1%}" for t, c in sorted(counts.items())) or "-"
    mean_len = sum(len(e.source) + len(e.target) for e in examples) / max(n, 1)
    rows.append((split, f"{n:,}", mix, f"{mean_len:.2f}"))
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def main(argv):
  with command_errors():  # DataError is a ValueError
    _main(argv)


def _main(argv):
  del argv
  out_dir = pathlib.Path(_OUT_DIR.value)
  if _DOWNLOAD.value:
    names = [n for n in io_lib.RELEASED_FILES
             if _TASK.value in (None, n.split("_")[0].split(".")[0])]
    paths = io_lib.download_released(out_dir, names, base_url=_BASE_URL.value)
    for name, path in paths.items():
      print(f"{name}\t{path}")
    return
  if _TASK.value is None:
    raise app.UsageError("--task is required")
  task = tasks.get_task(_TASK.value)
  if _DYCK_MAX_LENGTH.value is not None and hasattr(task, "max_length"):
    task.max_length = _DYCK_MAX_LENGTH.value
  sizes = None
  if _NUM_EVAL.value is not None:
    sizes = {s: _NUM_EVAL.value for s in task.split_names if s != "train"}
  start = time.perf_counter()
  task.generate(out_dir, seed=_SEED.value, num_train=_NUM_TRAIN.value, progress=True,
                sizes=sizes)
  elapsed = time.perf_counter() - start
  print(summary_table(task, out_dir))
  print(f"wrote {task.name} splits to {out_dir} in {elapsed:.1f} s")


if __name__ == "__main__":
  app.run(main)
