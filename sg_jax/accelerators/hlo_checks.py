"""Checks on the optimised HLO text of a compiled program (`jax.stages.Compiled.as_text()`).

What a training call of sg_jax must not contain on an accelerator:
* float64 values (`f64[...]`): no accelerator computes them fast, and a TPU not at all;
* a host transfer or callback (`send`/`recv`, `infeed`/`outfeed`, a custom call to a Python
  callback or a host computation): the device would wait for the host inside every step;
* in a seed-sharded step, a collective (`all-reduce`, `all-gather`, `reduce-scatter`,
  `all-to-all`, `collective-permute`, `collective-broadcast`, and their async `-start` forms):
  each chip trains its own seeds (`sharding.per_device`), so chips never need to talk.
  An evaluation call is partitioned over the seed mesh by XLA itself (no `shard_map`); its
  collectives, if any, gather per-seed results, so they are listed as allowed, not errors
  (`summary(..., collectives_are_errors=False)`); the f64 and host checks apply to every
  program.
"""

from __future__ import annotations

import collections
import re

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")
HOST_OPS = ("send", "recv", "send-done", "recv-done", "infeed", "outfeed")

# `%name = f32[2]{0} all-reduce(...)` / `all-reduce-start(` / `ROOT x = ... send(`.
_OP = re.compile(r"=\s*[^=]*?\s(" + "|".join(re.escape(op) for op in COLLECTIVES + HOST_OPS)
                 + r")(?:-start)?\(")
_F64 = re.compile(r"\bf64\[")
_CUSTOM_CALL_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_HOST_TARGET = re.compile(r"callback|host", re.IGNORECASE)


def op_counts(hlo_text: str) -> dict[str, int]:
  """{op: instructions} of the collectives and host-transfer ops in `hlo_text`, with
  'custom-call:<target>' for custom calls whose target names a callback or the host."""
  counts = collections.Counter()
  for line in hlo_text.splitlines():
    m = _OP.search(line)
    if m:
      counts[m.group(1)] += 1
    for target in _CUSTOM_CALL_TARGET.findall(line):
      if _HOST_TARGET.search(target):
        counts[f"custom-call:{target}"] += 1
  return dict(counts)


def check(hlo_text: str) -> dict:
  """The checks of the module docstring on one program's HLO.

  Returns:
    {'f64': instructions with an f64 value, 'host': {op: count} of host transfers and callbacks,
     'collectives': {op: count}}: empty / zero when the program is clean.
  """
  counts = op_counts(hlo_text)
  return {
      "f64": sum(1 for line in hlo_text.splitlines() if _F64.search(line)),
      "host": {op: n for op, n in counts.items()
               if op in HOST_OPS or op.startswith("custom-call:")},
      "collectives": {op: n for op, n in counts.items() if op in COLLECTIVES},
  }


def summary(result: dict, collectives_are_errors: bool = True) -> str:
  """One cell: 'clean' or what was found, e.g. 'f64 x3; all-reduce x2'.

  Args:
    result: `check`'s.
    collectives_are_errors: False for a program XLA partitions over the seed mesh by itself
      (an evaluation call): its collectives are listed as 'all-gather x1 (allowed)', and the
      cell reads 'clean' before them when nothing else was found.
  """
  parts = []
  if result["f64"]:
    parts.append(f"f64 x{result['f64']}")
  parts += [f"{op} x{n}" for op, n in sorted(result["host"].items())]
  found = [f"{op} x{n}" for op, n in sorted(result["collectives"].items())]
  if collectives_are_errors:
    return "; ".join(parts + found) or "clean"
  return "; ".join((parts or ["clean"]) + [f"{c} (allowed)" for c in found])
