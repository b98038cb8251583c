"""Creates a run's workdir and checks it can be written, before the run touches anything; after a
run that failed before writing any state of its own, removes what that check created.
"""

from __future__ import annotations

import os
import shutil

from sg_jax import checkpointing
from sg_jax.records import fileio


def check_writable(workdir: str) -> list[str]:
  """Creates `workdir` and checks a file can be written there.

  Returns:
    The directories this call created (`workdir` and its missing parents, deepest first; empty
    if `workdir` existed), for `remove_created`.

  Raises:
    checkpointing.WorkdirError: naming the workdir and the OS error.
  """
  created = []
  parent = os.path.abspath(workdir)
  while not os.path.exists(parent):
    created.append(parent)
    parent = os.path.dirname(parent)
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_probe.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise checkpointing.WorkdirError(f"workdir {workdir} is not writable: {e}") from e
  return created


def remove_created(created: list[str]) -> None:
  """Removes the directories `check_writable` created, with what this run wrote into them (e.g.
  data generated into WORKDIR/data), after a run failed before writing any state of its own.
  A workdir that existed before the run is never touched (`created` is then empty)."""
  if created:
    shutil.rmtree(created[0], ignore_errors=True)
  for parent in created[1:]:
    try:
      os.rmdir(parent)  # only if still empty
    except OSError:
      break


# config.json and vocab.json: a reader sees the old file or the whole new one.
write_json_atomic = fileio.write_atomic
