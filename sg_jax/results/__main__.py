"""`python -m sg_jax.results export|render-docs`: the command line of `sg_jax.results`.

  export       --workdir=RUN_OR_SWEEP_ROOT --out=results/<study>[/<run>] [--command="..."]
               [--commit=SHA]: the compact copy of a run, or of every run below a sweep root.
  render-docs  [--docs=docs] [--results=results] [--check]: rewrite the generated tables of the
               docs from results/ (--check: list the stale ones and exit 1 if any).
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags

from sg_jax.results import docs as docs_lib
from sg_jax.results import export as export_lib

FLAGS = flags.FLAGS
COMMANDS = ("export", "render-docs")


def define_flags() -> None:
  """Defines the CLI flags (only when run as a program)."""
  flags.DEFINE_string("workdir", None, "export: a workdir, or a sweep root of several.")
  flags.DEFINE_string("out", None, "export: the folder to write, e.g. results/qf_depth.")
  flags.DEFINE_string("command", "", "export: the command that produced the run (default: the "
                      "job's command in the sweep.json above the workdir).")
  flags.DEFINE_string("commit", "", "export: the commit of the code that trained the run.")
  flags.DEFINE_string("docs", "docs", "render-docs: a markdown file or a folder of them.")
  flags.DEFINE_string("results", "results", "render-docs: the results folder.")
  flags.DEFINE_bool("check", False, "render-docs: do not write; exit 1 if a table is stale.")


def _export() -> None:
  if not FLAGS.workdir or not FLAGS.out:
    raise app.UsageError("export needs --workdir and --out")
  try:
    manifests = export_lib.export(FLAGS.workdir, FLAGS.out, FLAGS.command, FLAGS.commit)
  except (export_lib.ExportError, OSError) as e:
    sys.exit(f"error: {e}")
  size = export_lib.folder_bytes(FLAGS.out)
  for m in manifests:
    total = sum(f["bytes"] for f in m["files"].values())
    print(f"exported {m['name']}: {len(m['files'])} files, {total / 1024:.0f} KiB")
    if not m["complete"]:
      print(f"warning: {m['name']} ends at step {m['last_step']} of {m['num_steps']}: an "
            "unfinished run (export it again when it is done)", file=sys.stderr)
  print(f"{FLAGS.out}: {size / 2**20:.2f} MiB in all")
  if size > export_lib.STUDY_BUDGET_BYTES:
    print(f"warning: {FLAGS.out} is above {export_lib.STUDY_BUDGET_BYTES / 2**20:.0f} MiB; "
          "keep a study folder to a few MB", file=sys.stderr)


def _render_docs() -> None:
  try:
    if FLAGS.check:
      stale = docs_lib.stale_blocks(FLAGS.docs, FLAGS.results)
    else:
      stale = docs_lib.render_docs(FLAGS.docs, FLAGS.results)
  except (docs_lib.DocsError, OSError) as e:
    sys.exit(f"error: {e}")
  verb = "stale" if FLAGS.check else "rewritten"
  for b in stale:
    print(f"{b.doc}:{b.line}: {b.study}/{b.table} {verb}")
  if not stale:
    print(f"every generated table under {FLAGS.docs} matches {FLAGS.results}/")
  if FLAGS.check and stale:
    sys.exit(1)


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"give one command: {' or '.join(COMMANDS)}")
  if argv[1] == "export":
    _export()
  else:
    _render_docs()


if __name__ == "__main__":
  define_flags()
  app.run(main)
