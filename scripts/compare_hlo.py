"""Compares the optimised XLA programs that two runs compiled, ignoring source locations.

A restructuring that leaves every compiled program identical leaves speed unchanged by
construction, which a timing A/B on a shared machine cannot show within a few percent. Dump both
runs' programs with XLA's own flag, then compare:

  XLA_FLAGS=--xla_dump_to=runs/hlo_old python benchmarks/train_throughput.py --depths 6 \
      --seeds 4 --packing on --no_sequential --min_time 0 --min_calls 1   # in the old checkout
  XLA_FLAGS=--xla_dump_to=runs/hlo_new python benchmarks/train_throughput.py ...  # in the new one
  python scripts/compare_hlo.py runs/hlo_old runs/hlo_new

Prints one line per module name (`*after_optimizations.txt`, largest first) saying whether the
programs are identical once file names, line numbers, stack frames and op metadata are removed.
Exits 1 if any differs or a module is in one dump only.
"""
import argparse
import collections
import glob
import hashlib
import os
import re
import sys

_TABLES = re.compile(r"^(\d+ |FileNames|FunctionNames|FileLocations|StackFrames)")


def normalise(text: str) -> str:
  """The HLO text without its source-location tables, op metadata and module name."""
  text = "\n".join(line for line in text.split("\n") if not _TABLES.match(line))
  text = re.sub(r"HloModule \S+", "HloModule X", text)
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  return re.sub(r",? ?stack_frame_id=\d+", "", text)


def modules(folder: str) -> dict[str, list[tuple[int, str]]]:
  """{module name: [(normalised length, sha1)]} of a dump folder's optimised programs."""
  found = collections.defaultdict(list)
  for path in sorted(glob.glob(os.path.join(folder, "*after_optimizations.txt"))):
    name = re.sub(r"^module_\d+\.", "", os.path.basename(path))
    with open(path) as f:
      text = normalise(f.read())
    found[name].append((len(text), hashlib.sha1(text.encode()).hexdigest()))
  if not found:
    raise SystemExit(f"error: no *after_optimizations.txt in {folder} (run with "
                     "XLA_FLAGS=--xla_dump_to=FOLDER)")
  return found


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("old")
  parser.add_argument("new")
  args = parser.parse_args(argv)
  old, new = modules(args.old), modules(args.new)
  same = set(old) == set(new)
  for name in sorted(old, key=lambda k: -max(n for n, _ in old[k])):
    equal = sorted(h for _, h in old[name]) == sorted(h for _, h in new.get(name, []))
    same &= equal
    size = max(n for n, _ in old[name])
    print(f"{name:55s} {size:>10,d} chars  {'identical' if equal else 'DIFFERENT'}")
  for name in sorted(set(old) ^ set(new)):
    print(f"{name:55s} only in {'old' if name in old else 'new'}")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
