#!/usr/bin/env python3
"""Seeds per chip for the launchers (issue 53 item 4); Python's standard library only.

  python3 launch/seed_check.py --job=sweep --accelerator=v4-8 [--fill] -- ARGS for sg_jax.sweep
  python3 launch/seed_check.py --job=main --chips=4 --generation=h100 -- ARGS for sg_jax.main

Prints ARGS back, one per line, for the launcher to run. A single-process run puts its seeds on
the largest chip count that divides them, so a seed count that is not a multiple of the chips
leaves chips idle: then one line on stderr names the count to use instead (the next multiple of
the chips within the most seeds per chip that fit, from launch/seeds_per_chip.json, written by
benchmarks/seeds_per_chip.py; docs/results/performance.md), as does a count needing more seeds
per chip than fit. With --fill the launcher uses that count: ARGS come back with it appended
(`--seeds=N` for a sweep, `--config.num_seeds=N` for a run; the later flag wins). An
accelerator type it does not know is run unchecked (one line on stderr says so).

The seed count is read from ARGS: `--seeds=N` (sg_jax.sweep), `--config.num_seeds=N`, or
`seeds=N` in the config string; else the preset's default (quick 4, tiny 2, grok_cpu 4, the
design card 10). The depth (for the memory table): `depth=N` in the config string,
`--config.model.num_layers=N`, the largest of `--depths=` (sg_jax.sweep's default 2,4,6,8,10),
else 8 (the design card). Exit 0 (argparse's 2 for a bad option of its own).
"""

import argparse
import json
import math
import os
import re
import sys

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds_per_chip.json")
DEFAULT_SEEDS = {"default": 10, "paper": 10, "quick": 4, "tiny": 2, "grok_cpu": 4}
# Cloud TPU accelerator types name TensorCores for v4 and v5p (2 per chip) and chips for the
# others (v5litepod / v5e, v6e).
CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5litepod": 1, "v5e": 1, "v6e": 1}
GENERATION = {"v5litepod": "v5e"}


def chips_of(accelerator: str) -> tuple[str, int]:
  """('v4', 4) for 'v4-8' (generation, chips).

  Raises:
    ValueError: an accelerator type it does not know.
  """
  match = re.fullmatch(r"(v4|v5p|v5litepod|v5e|v6e)-([0-9]+)", accelerator)
  if not match:
    raise ValueError(f"unknown TPU accelerator type {accelerator!r} (v4-N, v5p-N, "
                     f"v5litepod-N, v6e-N)")
  name, cores = match.group(1), int(match.group(2))
  return GENERATION.get(name, name), max(1, cores // CORES_PER_CHIP[name])


GPU_GENERATIONS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"))


def gpu_generation(name: str) -> str:
  """The table's generation of a GPU named as `nvidia-smi --query-gpu=name` prints it ('h100'
  for 'NVIDIA H100 80GB HBM3'), or 'gpu' for a GPU the table does not know (checked for idle
  chips only)."""
  upper = name.upper()
  return next((gen for key, gen in GPU_GENERATIONS if key in upper), "gpu")


def read_job(args: list[str]) -> dict:
  """{'seeds': N or None, 'where': how given, 'preset': name, 'depth': N} from job ARGS."""
  job = {"seeds": None, "where": None, "preset": "default", "depth": None}
  for a in args:
    if a.startswith("--config="):
      spec = a.partition("=")[2].partition(":")[2]
      for token in filter(None, spec.split(",")):
        key, eq, value = token.partition("=")
        if not eq:
          job["preset"] = key
        elif key in ("seeds", "num_seeds") and value.isdigit():
          job["seeds"], job["where"] = int(value), "config"
        elif key == "depth" and value.isdigit():
          job["depth"] = int(value)
    elif a.startswith("--seeds=") and a.partition("=")[2].isdigit():
      job["seeds"], job["where"] = int(a.partition("=")[2]), "sweep"
    elif a.startswith("--config.num_seeds=") and a.partition("=")[2].isdigit():
      job["seeds"], job["where"] = int(a.partition("=")[2]), "flag"
    elif a.startswith("--config.model.num_layers=") and a.partition("=")[2].isdigit():
      job["depth"] = int(a.partition("=")[2])
    elif a.startswith("--depths="):
      depths = [int(d) for d in a.partition("=")[2].split(",") if d.isdigit()]
      job["depth"] = max(depths) if depths else None
  return job


def max_per_chip(table: dict, generation: str, preset: str, depth: int) -> int:
  """The most seeds per chip that fit (0 = not in the table): at the smallest tabled depth >=
  `depth`, else 0 (not known)."""
  by_depth = table.get("max_seeds_per_chip", {}).get(generation, {}).get(preset, {})
  known = sorted(int(d) for d in by_depth)
  deeper = [d for d in known if d >= depth]
  return int(by_depth[str(deeper[0])]) if deeper else 0


def plan(num_seeds: int, chips: int, most: int) -> tuple[int, str]:
  """(count to use, why) as `sg_jax.accelerators.planning.seeds_to_use`."""
  per_chip = math.ceil(num_seeds / chips)
  if most and per_chip > most:
    return chips * most, (f"{num_seeds} seeds need {per_chip} per chip on {chips} chips, more "
                          f"than the {most} that fit")
  if num_seeds % chips == 0:
    return num_seeds, ""
  used = max(d for d in range(1, chips + 1) if num_seeds % d == 0)
  return chips * per_chip, f"{num_seeds} seeds use {used} of {chips} chips ({chips - used} idle)"


def main(argv: list[str]) -> int:
  if "--" in argv:
    cut = argv.index("--")
    own, job_args = argv[:cut], argv[cut + 1:]
  else:
    own, job_args = argv, []
  parser = argparse.ArgumentParser(prog="launch/seed_check.py", add_help=True)
  parser.add_argument("--accelerator", default="")
  parser.add_argument("--chips", type=int, default=0)
  parser.add_argument("--generation", default="")
  parser.add_argument("--gpu_name", default="", help="a GPU's name as nvidia-smi prints it: "
                      "sets --generation (gpu_generation)")
  parser.add_argument("--fill", action="store_true")
  parser.add_argument("--job", choices=("main", "sweep"), default="main")
  parser.add_argument("--table", default=TABLE)
  opts = parser.parse_args(own)
  if opts.gpu_name and not opts.generation:
    opts.generation = gpu_generation(opts.gpu_name)
  try:
    generation, chips = (chips_of(opts.accelerator) if opts.accelerator
                         else (opts.generation, opts.chips))
  except ValueError as e:  # a type this table does not know: the job runs unchecked
    print(f"launch: {e}: seeds per chip not checked", file=sys.stderr)
    generation, chips = "", 0
  for a in job_args:
    print(a)
  if chips < 1:
    return 0  # unknown chip count: nothing to check
  job = read_job(job_args)
  table = {}
  if os.path.exists(opts.table):
    with open(opts.table, encoding="utf-8") as f:
      table = json.load(f)
  num_seeds = job["seeds"] or DEFAULT_SEEDS.get(job["preset"], 10)
  most = max_per_chip(table, generation, job["preset"], job["depth"] or 8)
  use, why = plan(num_seeds, chips, most)
  if not why:
    return 0
  flag = "--seeds" if opts.job == "sweep" else "--config.num_seeds"
  fit = (f"; at most {most} per chip fit ({generation}, {job['preset']}, depth "
         f"{job['depth'] or 8})" if most else "")
  action = "using" if opts.fill else "use"
  print(f"launch: {why} on {opts.accelerator or 'this host'}: {action} {flag}={use} "
        f"({use // chips} per chip{fit})", file=sys.stderr)
  if opts.fill:
    # Printed after ARGS: a later flag wins in absl (and in the sweep's flags).
    print(f"{flag}={use}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
