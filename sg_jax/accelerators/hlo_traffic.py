"""Where a compiled program's memory traffic goes: bytes per top-level HLO instruction, by the
source function that emitted it (issue 53 item 3).

XLA's cost analysis (`compiled.cost_analysis()['bytes accessed']`) sums, over the instructions
of the program outside fusions, the bytes of each instruction's operands and output; it does not
say which part of the program they belong to, and the GPU compiler gives none. `traffic`
recomputes such a sum from the optimised HLO text (`compiled.as_text()`): every instruction of
the computations the program runs, from its ENTRY down through loops, conditionals and calls
(not fusion bodies or reducers; not parameters, constants, tuples, get-tuple-elements, bitcasts
or TPU `ConcatBitcast` custom calls, which move nothing), counts the bytes it writes plus the
bytes it reads, once, whatever the trip count of a loop around it (as the cost analysis counts a
loop body once). What a fusion reads and writes is read from its body, as XLA's cost analysis
does (`HloCostAnalysis::FusionParameterReadBytes`), simplified:

* an operand that the body only slices (`slice` or `dynamic-slice` of it, as the cost analysis
  counts; `gather` too, which it does not inside a fusion; through bitcasts) counts the bytes of
  the slices, not the whole array (at most the whole array);
* an operand that the body updates in place (operand 0 of a `dynamic-update-slice`) is not read,
  and an output that is such an update counts the update's bytes, not the whole buffer;
* any other use reads the whole operand once.

The same rules hold for a `slice`, `dynamic-slice`, `gather` or `dynamic-update-slice` outside a
fusion. On a GPU every array an instruction reads or writes lives in HBM, so this sum is the
program's HBM traffic as its instructions see it: an estimate from the compiled program, not a
measurement (caches, L2 on a GPU, are not modelled; a fusion reading an operand twice counts it
once).

Each instruction is attributed to

* its part: 'backward' when its JAX name stack (`op_name`) holds `transpose(`, else 'forward'
  when it holds `jvp(`, else 'other' (the optimiser, the data sampling, the loop's bookkeeping);
* the innermost sg_jax function of its stack frame (the HLO text's StackFrames table, which keeps
  only the caller's own files), e.g. 'apply_gradients', 'update', 'attention'; an instruction
  without one (the compiler's own copies and slices) by its opcode in parentheses, e.g.
  '(copy-start)'.

Control flow counts nothing itself: a loop counts its body and condition once, a call what it
calls, a conditional its branch that moves the most (as the cost analysis takes each branch's
maximum; e.g. the epoch's reshuffle, which runs once an epoch, counts in every step); an
asynchronous copy
counts at its start (its source read and its destination written), an asynchronous slice too
(the slice read and written): on TPU these are mostly the memory-space assignment's moves of
weights between HBM and on-chip memory, the memory space S(1) in the layouts. `hbm_only=True`
counts only the arrays in HBM, as a chip's HBM bandwidth sees them (XLA's cost analysis counts
every memory space). Approximate by construction; it is for comparing parts of one program and
versions of it, not for an exact total.
"""

from __future__ import annotations

import collections
import dataclasses
import re

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
                "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b(" + "|".join(sorted(_DTYPE_BYTES, key=len, reverse=True))
                    + r")\[([0-9,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s+([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
# Control flow: the instructions of the computations it runs are counted instead.
_CONTROL = {"while", "conditional", "call", "async-start", "async-update"}
_RUNS = re.compile(r"\b(?:body|condition|to_apply|calls|true_computation|false_computation)"
                   r"=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
         "partition-id", "replica-id", "iota", "opt-barrier"}
# TPU custom calls that move nothing: a concatenation of slices already adjacent in memory, read
# as one array; an assertion about gather indices.
_FREE_CUSTOM_CALLS = re.compile(
    r'custom_call_target="(?:ConcatBitcast|AssumeGatherIndicesInBound)"')
# Users that read only part of operand 0: the bytes of their output.
_SLICING = {"slice", "dynamic-slice", "gather"}


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


@dataclasses.dataclass
class _Instruction:
  name: str
  opcode: str
  out: list[tuple[int, bool]]  # [(bytes, in HBM)] of its output's arrays
  operands: list[str]
  line: str
  parameter: int | None = None  # a parameter's number


@dataclasses.dataclass
class _Computation:
  instructions: dict[str, _Instruction] = dataclasses.field(default_factory=dict)
  root: str = ""

  def users(self) -> dict[str, list[_Instruction]]:
    out = collections.defaultdict(list)
    for instruction in self.instructions.values():
      for operand in instruction.operands:
        out[operand].append(instruction)
    return out


def _parse(lines: list[str]) -> tuple[dict[str, _Computation], str]:
  """({name: computation}, the ENTRY computation's name) of an HLO module's text."""
  computations, current, entry = {}, None, ""
  for line in lines:
    head = _COMPUTATION.match(line)  # a computation's header: unindented, ends with '{'
    if head:
      current = computations.setdefault(head.group(1), _Computation())
      entry = head.group(1) if line.startswith("ENTRY") else entry
      continue
    m = _INSTRUCTION.match(line)
    if m is None or current is None:
      continue
    root, name, out_type, opcode, rest = m.groups()
    args = rest.split(")", 1)[0]
    number = re.match(r"\s*(\d+)", args) if opcode == "parameter" else None
    current.instructions[name] = _Instruction(
        name, opcode, _arrays(out_type), re.findall(r"%([\w.\-]+)", args), line,
        int(number.group(1)) if number else None)
    if root:
      current.root = name
  return computations, entry


def _reads(users: dict, name: str, whole: int) -> int:
  """Bytes that a fusion body reads of its instruction `name` (a parameter), `whole` its size;
  `users`: the body's `_Computation.users()`."""
  total, read_whole, pending, seen = 0, False, [name], set()
  while pending:
    current = pending.pop()
    for user in users.get(current, []):
      if user.name in seen:
        continue
      seen.add(user.name)
      first = user.operands[0] == current if user.operands else False
      if user.opcode == "bitcast":
        pending.append(user.name)
      elif user.opcode in _SLICING and (first or user.opcode == "slice"):
        total += sum(b for b, _ in user.out)
      elif user.opcode == "dynamic-update-slice" and first:
        continue  # updated in place: aliased with the output
      elif not read_whole:
        read_whole = True
        total += whole
  return min(total, whole)


def _writes(body: _Computation, name: str, out: list[tuple[int, bool]]) -> list[int]:
  """Bytes written per output array of `body`'s instruction `name` (its root): an in-place
  update of a parameter (`dynamic-update-slice` of it) writes the update only."""
  instruction = body.instructions.get(name)
  parts = ([body.instructions.get(o) for o in instruction.operands]
           if instruction is not None and instruction.opcode == "tuple" else [instruction])
  if len(parts) != len(out):
    return [b for b, _ in out]
  written = []
  for (b, _), part in zip(out, parts):
    if part is not None and part.opcode == "dynamic-update-slice" and len(part.operands) > 1:
      target = body.instructions.get(part.operands[0])
      update = body.instructions.get(part.operands[1])
      if target is not None and target.opcode == "parameter" and update is not None:
        b = sum(x for x, _ in update.out)
    written.append(b)
  return written


def _moved(instruction: _Instruction, operands: list[list[tuple[int, bool]]],
           computations: dict[str, _Computation], flagged_only: bool) -> int:
  """Bytes `instruction` (top level) reads and writes; `operands` its operands' arrays;
  `flagged_only`: only of the arrays whose flag is set (`_arrays`: in HBM)."""
  flat = [a for arrays in operands for a in arrays]
  out, opcode = instruction.out, instruction.opcode
  if opcode == "copy-start":  # (destination, source, context): read the source, write
    arrays = flat[:1] + out[:1]
  elif opcode.endswith("-start"):  # ((operands), result, ...): read and write the result
    result = out[len(flat):len(flat) + 1]
    source_in_hbm = all(h for _, h in flat)
    arrays = [(b, source_in_hbm) for b, _ in result] + result
  else:
    if opcode == "fusion":
      called = re.search(r"calls=%([\w.\-]+)", instruction.line)
      body = computations.get(called.group(1)) if called else None
    else:  # a lone instruction is a body of one instruction
      body = _Computation({instruction.name: instruction}, instruction.name)
      for i, (operand, arrays) in enumerate(zip(instruction.operands, operands)):
        body.instructions.setdefault(operand, _Instruction(operand, "parameter", arrays, [], "",
                                                           i))
    if body is None:
      arrays = out + flat
    else:
      parameters = {p.parameter: p.name for p in body.instructions.values()
                    if p.opcode == "parameter"}
      users = body.users()
      arrays = [(b, h) for b, (_, h) in zip(_writes(body, body.root, out), out)]
      for i, operand in enumerate(operands):
        if len(operand) == 1 and i in parameters:
          whole, in_hbm = operand[0]
          arrays.append((_reads(users, parameters[i], whole), in_hbm))
        else:
          arrays += operand
  return sum(b for b, flagged in arrays if flagged or not flagged_only)


def traffic(hlo_text: str, hbm_only: bool = False, sizes=None) -> dict:
  """Bytes moved by the program of `hlo_text` (`compiled.as_text()`), as the module docstring
  counts them; `hbm_only`: only reads and writes of arrays in HBM (not those in the on-chip
  memory space S(n), n >= 1, that TPU programs annotate); `sizes` (a set of byte counts): only
  reads and writes of arrays of one of these sizes (whole arrays; a slice of such an array
  counts as the array does), e.g. those of the parameter arrays, to tell the parameters, their
  gradients and moments from activations by size (an activation of the same size would count).

  Returns:
    {'total': bytes, 'by_part': {part: bytes}, 'by_function': {function: bytes},
     'instructions': number counted}.
  """
  lines = hlo_text.splitlines()
  frames = _tables(lines)
  computations, entry = _parse(lines)
  if sizes is not None:  # the flag says what is counted: in HBM (if asked) and of those sizes
    sizes = set(sizes)
    for computation in computations.values():
      for instruction in computation.instructions.values():
        instruction.out = [(b, (h or not hbm_only) and b in sizes) for b, h in instruction.out]
    hbm_only = True
  memo: dict[str, collections.Counter] = {}

  def count(name: str) -> collections.Counter:
    """{(part, function): bytes} and {'#': instructions} of one run of computation `name`."""
    if name in memo:
      return memo[name]
    memo[name] = got = collections.Counter()  # (a recursive call would see it empty)
    computation = computations.get(name, _Computation())
    for instruction in computation.instructions.values():
      opcode, line = instruction.opcode, instruction.line
      if opcode == "conditional":  # one branch runs: the largest, as XLA's cost analysis
        names = _RUNS.findall(line) + [b.strip().lstrip("%") for m in _BRANCHES.findall(line)
                                       for b in m.split(",")]
        branches = [count(b) for b in names]
        got.update(max(branches, key=lambda c: sum(v for k, v in c.items() if k != "#"),
                       default=collections.Counter()))
        continue
      if opcode in _CONTROL:  # while (body and condition, once), call, async-start
        for called in _RUNS.findall(line):
          got.update(count(called))
        continue
      if (opcode in _FREE or opcode.endswith("-done")
          or (opcode == "custom-call" and _FREE_CUSTOM_CALLS.search(line))):
        continue
      operands = [computation.instructions[o].out if o in computation.instructions else []
                  for o in instruction.operands]
      moved = _moved(instruction, operands, computations, hbm_only)
      op_name = re.search(r'op_name="([^"]*)"', line)
      stack = op_name.group(1) if op_name else ""
      part = ("backward" if "transpose(" in stack else "forward" if "jvp(" in stack
              else "other")
      frame = re.search(r"stack_frame_id=(\d+)", line)
      function = frames.get(int(frame.group(1)), "?") if frame else f"({opcode})"
      got[(part, function)] += moved
      got["#"] += 1
    return got

  total = count(entry)
  by_part, by_function = collections.Counter(), collections.Counter()
  for key, moved in total.items():
    if key != "#":
      by_part[key[0]] += moved
      by_function[key[1]] += moved
  return {"total": sum(by_part.values()), "by_part": dict(by_part),
          "by_function": dict(by_function), "instructions": total["#"]}
