"""Export a run (or every run of a sweep root) as compact data for `results/<study>/<run>`.

An exported run holds what the report and the claims read, and nothing that cannot be committed:

  config.json, vocab.json           copied (absolute paths of the exporting machine replaced,
                                    `_scrub`)
  metrics.csv.gz, analysis.csv.gz   the long `step,seed,name,value` tables, gzip-compressed
                                    byte for byte (deterministic: no name, mtime 0)
  analysis.csv.options.json         copied
  pruning*.csv.gz                   every pruning / core table of the workdir (`sg_jax.prune`,
                                    `sg_jax.prune_core`), compressed, and its options file
                                    (`pruning*.csv.options.json`, copied)
  pruning/**/masks_step<N>.npz      the subnetwork masks, re-saved with `np.savez_compressed`
  run.json                          the manifest: the command that made the run, its last logged
                                    step against train.num_steps (`complete`), the commit of
                                    the code at export (and whether its tree was clean), the
                                    package versions, each file's size and sha256

No checkpoint, data or TensorBoard file is copied. `sg_jax.report.reading` and the pruning
readers fall back to `<table>.gz` when `<table>` is absent (`fileio.stored_path`), so an
exported folder reads exactly as the workdir it came from.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
from typing import Any

import numpy as np

from sg_jax.records import fileio
from sg_jax.records import long_csv
from sg_jax.report import reading
from sg_jax.runtime import environment

FORMAT = "sg_jax.results/1"
MANIFEST = reading.EXPORT_MANIFEST
COPIED = ("config.json", "vocab.json", "analysis.csv.options.json", environment.FILE)
COMPRESSED = ("metrics.csv", "analysis.csv")
# A study folder above this many bytes is reported as too large for the repository.
STUDY_BUDGET_BYTES = 5 * 2**20


class ExportError(ValueError):
  """The workdir cannot be exported (named in the message)."""


def git_commit(repo: str | None = None) -> dict[str, Any]:
  """{'commit': HEAD's sha, 'clean': whether tracked files are unmodified} of the git checkout
  holding `repo` (default: this package's); {'commit': 'unknown'} outside a checkout."""
  repo = repo or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                         check=True, timeout=30).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                           capture_output=True, text=True, check=True, timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return {"commit": "unknown"}
  return {"commit": sha, "clean": not dirty}


def _scrub(text: str, workdir: str) -> str:
  """`text` with this machine's paths made portable: the workdir's absolute path -> `WORKDIR`,
  the interpreter -> `python`, the current folder -> `.`, the home folder -> `~`; any other
  absolute path keeps its last component only (`.../name`)."""
  workdir = os.path.abspath(workdir)
  replacements = [(workdir, "WORKDIR"), (os.getcwd() + os.sep, ""),
                  (os.path.expanduser("~") + os.sep, "~/")]
  text = re.sub(r"(?<![\w/.])/\S*/python[0-9.]*(?=\s|$)", "python", text)
  for old, new in replacements:
    if old and old != os.sep:
      text = text.replace(old, new)
  return re.sub(r"(?<![\w.~])/(?:[^\s/\"',=]+/)+([^\s/\"',=]+)", r".../\1", text)


def _scrub_json(value, workdir: str):
  if isinstance(value, str):
    return _scrub(value, workdir) if os.sep in value else value
  if isinstance(value, list):
    return [_scrub_json(v, workdir) for v in value]
  if isinstance(value, dict):
    return {k: _scrub_json(v, workdir) for k, v in value.items()}
  return value


def gzip_bytes(data: bytes) -> bytes:
  """`data` gzip-compressed deterministically (no file name, mtime 0, level 9): the same input
  gives the same bytes, so a re-export of an unchanged run leaves git with nothing to commit."""
  buf = io.BytesIO()
  with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
    f.write(data)
  return buf.getvalue()


def _pruning_tables(workdir: str) -> list[str]:
  """Names of the pruning and core tables in `workdir` (`pruning*.csv`)."""
  return sorted(n for n in os.listdir(workdir)
                if n.startswith("pruning") and n.endswith(".csv")
                and os.path.isfile(os.path.join(workdir, n)))


def _mask_files(workdir: str) -> list[str]:
  """Paths (relative to `workdir`) of the masks files under `workdir/pruning/`."""
  out = []
  for folder, _, files in os.walk(os.path.join(workdir, "pruning")):
    out += [os.path.relpath(os.path.join(folder, n), workdir) for n in files
            if re.fullmatch(r"masks_step\d+\.npz", n)]
  return sorted(out)


def export_run(workdir: str, out: str, command: str = "", commit: str = "") -> dict:
  """Writes the compact copy of one run (module docstring) into `out`.

  Args:
    workdir: a run folder (holds metrics.csv; `reading.find_runs`).
    out: the folder to write (created; files of an earlier export are replaced).
    command: the command that produced the run (scrubbed of this machine's paths); default: the
      job's command in the sweep.json above `workdir` when there is one, else ''.
    commit: the commit of the code that trained the run, when known (the manifest always has
      the commit of the code at export).

  Returns:
    the manifest written to `out/run.json`.

  Raises:
    ExportError: `workdir` holds no metrics.csv, or `out` is inside `workdir`.
  """
  if not os.path.isfile(os.path.join(workdir, "metrics.csv")):
    raise ExportError(f"no metrics.csv in {workdir}: not a sg_jax workdir")
  if os.path.abspath(out).startswith(os.path.abspath(workdir) + os.sep):
    raise ExportError(f"--out {out} is inside the workdir {workdir}")
  command = command or _sweep_command(workdir)
  files: dict[str, bytes] = {}
  for name in COPIED + tuple(n + ".options.json" for n in _pruning_tables(workdir)):
    path = os.path.join(workdir, name)
    if os.path.isfile(path):
      with open(path) as f:
        data = json.load(f)
      files[name] = (json.dumps(_scrub_json(data, workdir), indent=1, sort_keys=False)
                     + "\n").encode()
  for name in COMPRESSED + tuple(_pruning_tables(workdir)):
    path = os.path.join(workdir, name)
    if os.path.isfile(path):
      with open(path, "rb") as f:
        files[name + fileio.GZIP_SUFFIX] = gzip_bytes(f.read())
  for rel in _mask_files(workdir):
    with np.load(os.path.join(workdir, rel)) as f:
      arrays = {k: f[k] for k in f.files}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    files[rel] = buf.getvalue()
  manifest = {"format": FORMAT, "name": os.path.basename(os.path.normpath(workdir)),
              "command": _scrub(command, workdir), **_progress(workdir),
              "trained_at_commit": commit or "unknown",
              "exported_at_commit": git_commit(), "versions": environment.package_versions(),
              "files": {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                        for name, data in sorted(files.items())}}
  if os.path.isdir(out):  # a re-export replaces the whole run, so no stale table survives
    shutil.rmtree(out)
  for name, data in files.items():
    fileio.write_atomic(os.path.join(out, name), data)
  fileio.write_atomic(os.path.join(out, MANIFEST), json.dumps(manifest, indent=1) + "\n")
  return manifest


def _progress(workdir: str) -> dict:
  """{'last_step': the last step metrics.csv logged, 'num_steps': config train.num_steps
  (None when unknown), 'complete': whether the run got there}: an export of a run still
  training says so."""
  steps = [row[0] for row in long_csv.read_rows(os.path.join(workdir, "metrics.csv"))]
  last = max(steps) if steps else None
  num_steps = None
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      num_steps = json.load(f).get("train", {}).get("num_steps")
  except (OSError, ValueError):
    pass
  complete = last is not None and num_steps is not None and last >= num_steps
  return {"last_step": last, "num_steps": num_steps, "complete": complete}


def _sweep_command(workdir: str) -> str:
  """The command of `workdir`'s job in the sweep.json of its parent folder ('' when none)."""
  sweep = os.path.join(os.path.dirname(os.path.abspath(workdir)), "sweep.json")
  if not os.path.isfile(sweep):
    return ""
  try:
    with open(sweep) as f:
      jobs = json.load(f).get("jobs", {})
  except (OSError, ValueError):
    return ""
  name = os.path.basename(os.path.normpath(workdir))
  for job in jobs.values():
    if os.path.basename(os.path.normpath(job.get("workdir", ""))) == name:
      return str(job.get("command", ""))
  return ""


def export(workdir: str, out: str, command: str = "", commit: str = "") -> list[dict]:
  """Exports a run, or every run below a sweep root, into `out`.

  A workdir holding metrics.csv is written to `out` itself (and, when it is a job of the
  sweep.json in its parent folder, that sweep.json to `out`'s parent: the study's design); a
  root of several runs (`reading.find_runs`) writes each to `out/<its path below the root>`
  and its sweep.json to `out`.

  Returns:
    the manifests written, one per run.

  Raises:
    ExportError: no run below `workdir` (or as `export_run`).
  """
  try:
    found = reading.find_runs(workdir)
  except reading.ReportError as e:
    raise ExportError(str(e)) from e
  found = [w for w in found if not reading.is_export(w)]
  if not found:
    raise ExportError(f"{workdir} holds only exported runs")
  if len(found) == 1 and os.path.abspath(found[0]) == os.path.abspath(workdir):
    manifest = export_run(workdir, out, command, commit)
    if _sweep_command(workdir):  # one job of a sweep: its design beside the exported run
      _export_sweep(os.path.dirname(os.path.abspath(workdir)),
                    os.path.dirname(os.path.abspath(out)))
    return [manifest]
  manifests = [export_run(w, os.path.join(out, os.path.relpath(w, workdir)), command, commit)
               for w in found]
  _export_sweep(workdir, out)
  return manifests


def _export_sweep(root: str, out: str) -> None:
  """Copies `root`'s sweep.json (the study's design: depths, seeds, analysis flags, each job's
  command and status), scrubbed of this machine's paths, to `out`/sweep.json; nothing when
  `root` has none."""
  sweep = os.path.join(root, "sweep.json")
  if os.path.isfile(sweep):
    with open(sweep) as f:
      data = _scrub_json(json.load(f), root)
    fileio.write_atomic(os.path.join(out, "sweep.json"), json.dumps(data, indent=1) + "\n")


def folder_bytes(folder: str) -> int:
  """Total size of the files below `folder`, in bytes."""
  return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder)
             for n in names)
