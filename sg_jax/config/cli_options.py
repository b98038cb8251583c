"""Option handling shared by the CLIs that append to a workdir's tables (`sg_jax.analyze`,
`sg_jax.prune`): step/seed lists, and the value-changing options recorded beside a CSV."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import Mapping

from absl import flags

from sg_jax import configlib
from sg_jax.records import fileio

log = logging.getLogger("sg_jax")


def parse_list(text: str, what: str) -> list[int] | None:
  """'all' -> None; '3000,6000' -> [3000, 6000]. Raises ValueError naming `what`."""
  if text.strip().lower() == "all":
    return None
  try:
    return [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise ValueError(f"--{what} must be 'all' or comma-separated integers, got {text!r}") from None


def step_selection(text: str) -> dict:
  """`--steps` of the pruning CLIs as keyword arguments: 'last' -> {'steps': None, 'last_only':
  True}; 'all' or '0,3000' -> {'steps': parse_list(...), 'last_only': False}."""
  if text.strip().lower() == "last":
    return {"steps": None, "last_only": True}
  return {"steps": parse_list(text, "steps"), "last_only": False}


def check_options(path: str, options: dict, legacy: Mapping[str, object] | None = None, *,
                  record: bool = True, hints: Mapping[str, str] | None = None) -> None:
  """Records the value-changing options beside the CSV (`<path>.options.json`); refuses
  different ones.

  An options file that predates an option is read with its `legacy` value (None when not
  given). Other entries of the file (e.g. `sentences_used`) are kept. With `record` False the
  options are only checked (nothing is written). `hints` maps an option to a text added to the
  refusal when that option differs (`{old}` becomes the recorded value, e.g.
  "--num_steps={old}").

  Raises:
    ValueError: the CSV was written with other options.
  """
  legacy, hints = legacy or {}, hints or {}
  opt_path = path + ".options.json"
  old = {}
  if os.path.exists(opt_path):
    try:
      with open(opt_path, encoding="utf-8") as f:
        old = json.load(f)
    except ValueError as e:  # undecodable or not JSON: one line naming the file
      raise ValueError(f"{opt_path} is not readable JSON ({e}); restore it, or remove it "
                       f"together with {path}") from None
    was = lambda k: old.get(k, legacy.get(k))
    diff = {k: (was(k), v) for k, v in options.items() if was(k) != v}
    if diff:
      advice = " ".join(hints[k].format(old=diff[k][0]) for k in diff if k in hints)
      raise ValueError(f"{path} was written with other options ({diff}, as (old, new)); pass "
                       "another --output or the same options"
                       + (f" ({advice} for this table)" if advice else ""))
  elif os.path.exists(path) and os.path.getsize(path) > 0:
    log.warning("%s exists without %s; assuming it used the current options", path, opt_path)
  if record and (not os.path.exists(opt_path) or {**old, **options} != old):
    # rewritten only when it changes: a command with nothing to do writes nothing (a finished
    # workdir on a read-only mount can be re-checked)
    with fileio.open_atomic(opt_path) as f:
      json.dump({**old, **options}, f, indent=1)


def parse_flags(argv):
  """absl flag parsing for the commands that take --config (`sg_jax.main`, `sg_jax.aot`): a bad
  --config (a missing file, an unknown key in the config string, an unknown --config.<field>)
  exits with one line instead of a traceback."""
  problem = configlib.check_command_line(argv[1:])
  if problem:
    sys.exit(f"error: {problem}")
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, ValueError) as e:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    # The last line of a traceback config_flags embeds reads "SomeError: message".
    last = re.sub(r"^[A-Za-z_.]*(Error|Exception): ", "", lines[-1]) if lines else str(e)
    sys.exit(f"error: {last}")
