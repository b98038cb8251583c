"""Where a compiled program's memory traffic goes: bytes per top-level HLO instruction, by the
source function that emitted it (issue 53 item 3).

XLA's cost analysis (`compiled.cost_analysis()['bytes accessed']`) sums, over the instructions
of the program outside fusions, the bytes of each instruction's operands and output; it does not
say which part of the program they belong to. `traffic` recomputes that sum from the optimised
HLO text (`compiled.as_text()`): every instruction of a computation that is not a fusion's body
(and not a parameter, constant, tuple, get-tuple-element or bitcast, which move nothing) counts
its output's bytes plus its operands' bytes, once, whatever the trip count of a loop around it
(as the cost analysis counts a loop body once). Each instruction is attributed to

* its part: 'backward' when its JAX name stack (`op_name`) holds `transpose(`, else 'forward'
  when it holds `jvp(`, else 'other' (the optimiser, the data sampling, the loop's bookkeeping);
* the innermost sg_jax function of its stack frame (the HLO text's StackFrames table, which keeps
  only the caller's own files), e.g. 'apply_gradients', 'update', 'attention'; an instruction
  without one (the compiler's own copies and slices) by its opcode in parentheses, e.g.
  '(copy-start)'.

Control flow (while, conditional, call) counts nothing itself (its bodies' instructions are
counted); an asynchronous copy or slice counts at its start (its operand read and its result
written: on TPU these are mostly the memory-space assignment's moves of weights between HBM and
on-chip memory), not at its done. Approximate by construction: a fusion's operands are counted
whole even when it reads a slice, and in-place (aliased) outputs are counted like any other
output; it is for comparing parts of one program and versions of it, not for an exact total.
"""

from __future__ import annotations

import collections
import re

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
                "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b(" + "|".join(sorted(_DTYPE_BYTES, key=len, reverse=True))
                    + r")\[([0-9,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s+([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
# Control flow: its bodies' instructions are counted instead.
_CONTROL = {"while", "conditional", "call", "async-start", "async-update"}
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
         "partition-id", "replica-id", "iota", "opt-barrier"}


def shape_bytes(text: str) -> int:
  """Bytes of every array shape in `text` (a shape or a tuple of shapes), e.g.
  'f32[2,3]{1,0}' -> 24, '(s32[], bf16[4])' -> 12."""
  total = 0
  for dtype, dims in _ARRAY.findall(text):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * _DTYPE_BYTES[dtype]
  return total


def _first_array(text: str) -> int:
  """Bytes of the first array shape in `text` (an async op's result within its tuple)."""
  match = _ARRAY.search(text.split(")", 1)[-1] if text.startswith("((") else text)
  return shape_bytes(match.group(0)) if match else 0


def _tables(lines: list[str]) -> dict[int, str]:
  """{stack_frame_id: innermost function name} from the HLO text's trailing tables."""
  section, functions, locations, frames = None, {}, {}, {}
  for line in lines:
    stripped = line.strip()
    if stripped in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = stripped
      continue
    if not stripped or section is None:
      continue
    key, _, value = stripped.partition(" ")
    if not key.isdigit():
      section = None
      continue
    if section == "FunctionNames":
      functions[int(key)] = value.strip('"').split(".")[-1]
    elif section == "FileLocations":
      m = re.search(r"function_name_id=(\d+)", value)
      locations[int(key)] = int(m.group(1)) if m else 0
    elif section == "StackFrames":
      m = re.search(r"file_location_id=(\d+)", value)
      frames[int(key)] = functions.get(locations.get(int(m.group(1)) if m else 0, 0), "?")
  return frames


def traffic(hlo_text: str) -> dict:
  """Bytes moved by the program of `hlo_text` (`compiled.as_text()`), as the module docstring
  counts them.

  Returns:
    {'total': bytes, 'by_part': {part: bytes}, 'by_function': {function: bytes},
     'instructions': number counted}.
  """
  lines = hlo_text.splitlines()
  frames = _tables(lines)
  fused = set(re.findall(r"kind=k\w+, calls=%([\w.\-]+)", hlo_text))
  fused |= set(re.findall(r"\bfusion\(.*?calls=%([\w.\-]+)", hlo_text))
  by_part, by_function = collections.Counter(), collections.Counter()
  shapes: dict[str, int] = {}
  current, counted = None, 0
  for line in lines:
    head = _COMPUTATION.match(line)  # a computation's header: unindented, ends with '{'
    if head:
      current, shapes = head.group(1), {}
      continue
    m = _INSTRUCTION.match(line)
    if m is None or current is None:
      continue
    name, out_type, opcode, rest = m.groups()
    size = shape_bytes(out_type)
    shapes[name] = size
    if current in fused or opcode in _FREE or opcode in _CONTROL or opcode.endswith("-done"):
      continue
    args = rest.split(")", 1)[0]
    operands = sum(shapes.get(a, 0) for a in re.findall(r"%([\w.\-]+)", args))
    if opcode.endswith("-start"):  # an async copy or slice: read its operand, write the result
      moved = 2 * operands if opcode == "copy-start" else operands + _first_array(out_type)
    else:
      moved = size + operands
    op_name = re.search(r'op_name="([^"]*)"', line)
    stack = op_name.group(1) if op_name else ""
    part = ("backward" if "transpose(" in stack else "forward" if "jvp(" in stack
            else "other")
    frame = re.search(r"stack_frame_id=(\d+)", line)
    function = frames.get(int(frame.group(1)), "?") if frame else f"({opcode})"
    by_part[part] += moved
    by_function[function] += moved
    counted += 1
  return {"total": sum(by_part.values()), "by_part": dict(by_part),
          "by_function": dict(by_function), "instructions": counted}
