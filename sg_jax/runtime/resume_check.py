"""Refuses, in one line and before touching anything, to resume a workdir written with a config
it may not continue (the rules: `config_changes`).

The stored config is the workdir's config.json, else the newest checkpoint's metadata.
"""

from __future__ import annotations

import json
import logging
import os

import ml_collections

from sg_jax import checkpointing
from sg_jax import configlib
from sg_jax.runtime import config_changes

log = logging.getLogger("sg_jax")


def _stored_config(workdir: str) -> dict | None:
  """The config a workdir was written with: config.json, else the newest checkpoint's."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        return json.load(f)
    except ValueError as e:  # undecodable or not JSON: one line naming the file
      raise ValueError(f"{path} is not readable JSON ({e}); restore it (every checkpoint's "
                       "metadata holds the run's config) or use another --workdir") from None
  steps = checkpointing.all_steps(workdir)
  if not steps:
    return None
  manager = checkpointing.make_manager(workdir, create=False, asynchronous=False)
  try:
    return checkpointing.read_meta(manager, steps[-1])["config"]
  except Exception:  # pylint: disable=broad-except  (unreadable: restore_latest_good decides)
    return None
  finally:
    manager.close()


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict,
                         allow_config_change: bool) -> None:
  """Refuses to resume a workdir written with a different config, in one line naming the fields.

  Fields are classified by `config_changes.classify_config_change`: 'free' ones may differ;
  'flag' ones only with `allow_config_change`; 'never' ones are refused even then. Nothing in
  the workdir is touched.

  Raises:
    ValueError: naming the differing fields and what to do.
  """
  old = _stored_config(workdir)
  if old is None:
    return
  new = json.loads(config.to_json())
  defaults = json.loads(configlib.base_config(config.task).to_json())
  old = config_changes.with_new_fields(old, defaults)
  diffs = configlib.differences(old, new)
  kinds = {name: config_changes.classify_config_change(name, old, new) for name, _, _ in diffs}
  fmt = lambda wanted: ", ".join(f"{name} {a!r} -> {b!r}" for name, a, b in diffs
                                 if kinds[name] == wanted)
  if "never" in kinds.values():
    raise ValueError(
        f"workdir {workdir} was written with another config: {fmt('never')} (these change "
        f"parameter shapes or what a step is; --allow_config_change cannot change them); use "
        f"another --workdir")
  if "flag" in kinds.values() and not allow_config_change:
    # e.g. a workdir of the padded layout, the default before packing: train.packing=False.
    keep = " ".join(f"--config.{name}={a}" for name, a, _ in diffs if kinds[name] == "flag")
    raise ValueError(
        f"workdir {workdir} was written with another config: {fmt('flag')}; pass "
        f"--allow_config_change to resume with the new values, {keep} to keep the workdir's, "
        f"or use another --workdir")
  if "flag" in kinds.values():
    log.warning("resuming %s with changed config fields (--allow_config_change): %s", workdir,
                fmt("flag"))
