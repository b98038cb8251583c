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
counted); an asynchronous copy counts at its start (its source read and its destination
written), an asynchronous slice too (the slice read and written): on TPU these are mostly the
memory-space assignment's moves of weights between HBM and on-chip memory, the memory space
S(1) in the layouts. `hbm_only=True` counts only the arrays in HBM, as a chip's HBM bandwidth
sees them (XLA's cost analysis counts every memory space). Approximate by construction: a fusion's operands are counted
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


_LAYOUT_ARRAY = re.compile(_ARRAY.pattern + r"(\{[^}]*\})?")
_ALT_MEMORY = re.compile(r"S\([1-9][0-9]*\)")


def _arrays(text: str) -> list[tuple[int, bool]]:
  """[(bytes, in HBM)] of every array shape in `text`, in order; an array whose layout names a
  memory space S(n), n >= 1 (on TPU the on-chip memory), is not in HBM."""
  out = []
  for dtype, dims, layout in _LAYOUT_ARRAY.findall(text):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    out.append((n * _DTYPE_BYTES[dtype], not _ALT_MEMORY.search(layout or "")))
  return out


def shape_bytes(text: str, hbm_only: bool = False) -> int:
  """Bytes of every array shape in `text` (a shape or a tuple of shapes), e.g.
  'f32[2,3]{1,0}' -> 24, '(s32[], bf16[4])' -> 12; `hbm_only`: only the arrays in HBM (not in
  a memory space S(n), n >= 1)."""
  return sum(b for b, in_hbm in _arrays(text) if in_hbm or not hbm_only)


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


def traffic(hlo_text: str, hbm_only: bool = False) -> dict:
  """Bytes moved by the program of `hlo_text` (`compiled.as_text()`), as the module docstring
  counts them; `hbm_only`: only reads and writes of arrays in HBM (not those in the on-chip
  memory space S(n), n >= 1, that TPU programs annotate).

  Returns:
    {'total': bytes, 'by_part': {part: bytes}, 'by_function': {function: bytes},
     'instructions': number counted}.
  """
  lines = hlo_text.splitlines()
  frames = _tables(lines)
  fused = set(re.findall(r"kind=k\w+, calls=%([\w.\-]+)", hlo_text))
  fused |= set(re.findall(r"\bfusion\(.*?calls=%([\w.\-]+)", hlo_text))
  by_part, by_function = collections.Counter(), collections.Counter()
  shapes: dict[str, list[tuple[int, bool]]] = {}
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
    out_arrays = _arrays(out_type)
    shapes[name] = out_arrays
    if current in fused or opcode in _FREE or opcode in _CONTROL or opcode.endswith("-done"):
      continue
    args = rest.split(")", 1)[0]
    operands = [a for o in re.findall(r"%([\w.\-]+)", args) for a in shapes.get(o, [])]
    if opcode == "copy-start":  # (destination, source, context): read the source, write
      arrays = operands[:1] + out_arrays[:1]
    elif opcode.endswith("-start"):  # ((operands), result, ...): read and write the result
      result = out_arrays[len(operands):len(operands) + 1]
      source_in_hbm = all(h for _, h in operands)
      arrays = [(b, source_in_hbm) for b, _ in result] + result
    else:
      arrays = out_arrays + operands
    moved = sum(b for b, in_hbm in arrays if in_hbm or not hbm_only)
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
