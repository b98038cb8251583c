r"""Seeds per chip and chip-hours planned from a few ahead-of-time compiles (issue 53 item 4).

  python benchmarks/seeds_per_chip.py --config=configs/tense.py:quick --targets=v5e,h100 \
      --seeds=1,4 --depths=2
  python benchmarks/seeds_per_chip.py --config=configs/tense.py --config.train.packing=False \
      --targets=v5e --seeds=1,2,4 --depths=2 --scale_depths=4,6,8,10 --grid \
      --save=plan.json --write=launch/seeds_per_chip.json
  python benchmarks/seeds_per_chip.py --config=configs/tense.py --depths=2 \
      --scale_depths=4,6,8,10 --grid --load=plan.json          # no compile

For each target (one chip: `v5e` = `v5e:1x1`, `h100` = one GPU) and depth, compiles the config's
training call and evaluation programs (`sg_jax.accelerators.programs`, as `python -m sg_jax.aot`)
at each seed count of `--seeds` on that chip, fits peak = constant + per_seed x seeds to each
program's resident peak (`planning.fit_memory`: the peak grows linearly with the seeds, so two or
three counts replace compiling every count; `compiled.memory_analysis()` gives the arguments,
outputs and temporaries on TPU and GPU alike) and prints the most seeds per chip that fit every
program, the training call's FLOPs and bytes per seed-step (at the largest count) and its
roofline bound on seed-steps/s per chip at the chip's published peaks.

Bytes per seed-step come from two sources, both printed: XLA's cost analysis (every memory
space; TPU only) and the HBM traffic estimated from the optimised HLO
(`sg_jax.accelerators.hlo_traffic`: a TPU's arrays outside the on-chip memory space S(1), a
GPU's every array; no cache modelled). A TPU's rate uses the cost analysis. The GPU compiler
gives no cost analysis, so a GPU's rate uses its own program's HLO traffic, with the FLOPs of a
TPU program of the same depth (compiled or loaded in the same command; the model's FLOPs do not
depend on the chip) or, without one, none (a memory-only bound: the step is memory-bound by far
on every chip). Each row says which. A GPU loaded from an older --save without HLO traffic
falls back on the TPU program's cost.

`--grid` adds the paper's grid in chip-hours per target (`planning.grid_chip_hours`: 3 tasks x
depths 2, 4, 6, 8, 10 x 10 seeds x 300k steps, Dyck 400k), with each depth's rate interpolated
linearly in depth between the compiled depths and every task at this config's per-step cost
(the tasks differ in vocabulary and line length; compile each task's config to refine it).
`--scale_depths` sizes depths not compiled from the first compiled one in proportion to the
parameters per seed; `--save` / `--load` keep the compiled peaks and costs in a JSON file and read them back
without compiling (`--load=a.json,b.json`: the saves of several sessions, e.g. one per target,
merged in order).
`--write=FILE` merges the most seeds per chip into the launchers' table (launch/seed_check.py).
Needs the optional compilers (requirements-accelerators.txt); compiles are CPU-heavy and take
minutes each at the reference size.
"""

import json
import os
import sys
import tempfile
import time

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from sg_jax.accelerators import planning
from sg_jax.accelerators import programs as programs_lib
from sg_jax.accelerators import roofline as roofline_lib
from sg_jax.accelerators import table
from sg_jax.accelerators import targets as targets_lib
from sg_jax.config.cli_options import parse_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file with a config string.",
                                          lock_config=False)
_TARGETS = flags.DEFINE_list("targets", ["v5e", "h100"], "Chips: v4, v5e, v5p, v6e, h100, "
                             "h200, a100 (one chip each).")
_SEEDS = flags.DEFINE_list("seeds", ["1", "2"], "Seed counts per chip to compile (two or more).")
_DEPTHS = flags.DEFINE_list("depths", [], "Depths (model.num_layers) to compile; default: the "
                            "config's.")
_SCALE_DEPTHS = flags.DEFINE_list(
    "scale_depths", [], "Depths not compiled, sized from the first compiled depth in proportion "
    "to the parameters per seed (a model's shapes only, no compile): its per-seed memory and its "
    "FLOPs and bytes per seed-step times P(depth) / P(compiled depth).")
_DEEP_SEEDS = flags.DEFINE_list("deep_seeds", [], "Seed counts per chip at the depths after the "
                                "first (default: --seeds). With one count, a program's memory "
                                "fit there takes its constant from the first depth's fit.")
_GRID = flags.DEFINE_bool("grid", False, "Print the paper's grid in chip-hours per target.")
_WRITE = flags.DEFINE_string("write", "", "JSON table of the most seeds per chip to merge into "
                             "(launch/seeds_per_chip.json).")
_SAVE = flags.DEFINE_string("save", "", "JSON file to write the compiled peaks and costs into.")
_LOAD = flags.DEFINE_list("load", [], "JSON files of earlier --save runs (e.g. one per target), "
                         "merged in order (a later file's target and depth replace an "
                         "earlier's): no compile.")
_PRESET = flags.DEFINE_string("preset", "", "Name of the config's preset in the written table "
                              "(default: the config string's preset, else 'default').")
flags.mark_flags_as_required(["config"])

SINGLE = {"v4": "v4:1x1x1", "v5e": "v5e:1x1", "v5p": "v5p:1x1x1", "v6e": "v6e:1x1"}


def _target(name: str) -> targets_lib.Target:
  return targets_lib.parse_target(SINGLE.get(name, name))


def _compile(config, target, seeds: int, data_dir: str
             ) -> tuple[dict, dict | None, float | None]:
  """({'train' | 'eval ...': resident peak bytes}, the training call's {flops, bytes} per
  seed-step by the cost analysis or None, its HBM bytes per seed-step from the optimised HLO
  or None) of `seeds` seeds on one chip of `target`."""
  run = config.copy_and_resolve_references()
  run.num_seeds, run.num_devices = seeds, 1
  run.data.dir = run.data.dir or data_dir  # generated once, shared by every compile
  the_plan = programs_lib.plan(run, target, run.data.dir)
  peaks, cost, hbm = {}, None, None
  for program in the_plan.programs:
    result = programs_lib.compile_program(program, hbm_traffic=program.kind == "train")
    name = result.program.kind if result.program.kind == "train" else result.program.name
    if result.error:
      print(f"    {name} at {seeds} seeds: refused ({result.error})", flush=True)
      continue
    peaks[name] = table.resident_peak(the_plan, result)
    print(f"    {name} at {seeds} seeds/chip: peak {peaks[name] / 1e9:.3f} GB, compiled in "
          f"{result.compile_s:.0f} s", flush=True)
    if result.program.kind == "train" and result.flops and result.bytes_accessed:
      cost = {"flops": roofline_lib.per_seed_step(result.flops, seeds),
              "bytes": roofline_lib.per_seed_step(result.bytes_accessed, seeds)}
      print(f"    train cost per seed-step: {cost['flops'] / 1e9:.3f} GFLOP, "
            f"{cost['bytes'] / 1e9:.4f} GB", flush=True)
    if result.program.kind == "train" and result.hbm_bytes:
      hbm = roofline_lib.per_seed_step(result.hbm_bytes, seeds)
      print(f"    train HBM traffic per seed-step (HLO): {hbm / 1e9:.4f} GB", flush=True)
  return peaks, cost, hbm


def _preset_name(config_arg: str) -> str:
  if _PRESET.value:
    return _PRESET.value
  spec = config_arg.partition(":")[2]
  presets = [t for t in spec.split(",") if t and "=" not in t]
  return presets[0] if presets else "default"


def main(argv):
  del argv
  config = _CONFIG.value
  seed_counts = sorted(int(s) for s in _SEEDS.value)
  depths = [int(d) for d in _DEPTHS.value] or [int(config.model.num_layers)]
  targets = [_target(t) for t in _TARGETS.value]
  rows, results = [], {}
  started = time.time()
  with tempfile.TemporaryDirectory(prefix="sg_jax_plan_") as data_dir:
    config.data.dir = config.data.dir or data_dir
    saved = {}
    if _LOAD.value:
      for path in _LOAD.value:
        with open(path, encoding="utf-8") as f:
          saved.update(json.load(f))
      targets = []
    for key, entry in saved.items():
      generation, depth = key.split("@")
      by_program = {n: {int(k): v for k, v in p.items()} for n, p in entry["peaks"].items()}
      fits = {n: planning.fit_memory(list(p), list(p.values()))
              for n, p in by_program.items() if len(p) >= 2}
      most = planning.max_seeds(list(fits.values()), targets_lib.CHIPS[generation].hbm_bytes)
      results[(generation, int(depth))] = {"fits": fits, "max": most, "cost": entry["cost"],
                                           "hbm": entry.get("hbm")}
    for target in targets:
      first_fits = {}
      for n_depth, depth in enumerate(depths):
        config.model.num_layers = depth
        print(f"{target.name}, depth {depth}:", flush=True)
        by_program, cost, hbm = {}, None, None
        counts = seed_counts if n_depth == 0 or not _DEEP_SEEDS.value else sorted(
            int(s) for s in _DEEP_SEEDS.value)
        for seeds in counts:
          peaks, got, got_hbm = _compile(config, target, seeds, data_dir)
          cost, hbm = got or cost, got_hbm or hbm  # the largest count's
          for name, peak in peaks.items():
            by_program.setdefault(name, {})[seeds] = peak
        fits = {name: planning.fit_memory(list(p), list(p.values()))
                for name, p in by_program.items() if len(p) >= 2}
        for name, p in by_program.items():
          if len(p) == 1 and name in first_fits:  # one count: the first depth's constant
            (seeds, peak), = p.items()
            base = first_fits[name].constant
            fits[name] = planning.MemoryFit(constant=base, per_seed=(peak - base) / seeds,
                                            seeds=(seeds,), peaks=(peak,))
        if n_depth == 0:
          first_fits = fits
        most = planning.max_seeds(list(fits.values()), target.chip.hbm_bytes) if fits else None
        results[(target.generation, depth)] = {"fits": fits, "max": most, "cost": cost,
                                               "hbm": hbm}
        saved[f"{target.generation}@{depth}"] = {"peaks": by_program, "cost": cost, "hbm": hbm}
        if _SAVE.value:
          with open(_SAVE.value, "w", encoding="utf-8") as f:
            json.dump(saved, f, indent=1)
  if _SCALE_DEPTHS.value:
    _scale(config, results, depths[0], [int(d) for d in _SCALE_DEPTHS.value if int(d) not in depths])
    depths = sorted(set(depths) | {int(d) for d in _SCALE_DEPTHS.value})
  tpu_costs = {d: r["cost"] for (g, d), r in results.items()
               if r["cost"] and targets_lib.CHIPS[g].platform == "tpu"}
  how = f"loaded from {', '.join(_LOAD.value)}" if _LOAD.value else f"{time.time() - started:.0f} s of compiles"
  print(f"\n{how}; config {config.task}, d_model "
        f"{config.model.d_model}, {config.model.dtype}, packing {config.train.packing}, seed "
        f"counts {seed_counts} (deeper: {_DEEP_SEEDS.value or seed_counts})\n")
  header = ("target", "depth", "train MB/seed (+const)", "eval MB/seed (+const)",
            "max seeds/chip", "GFLOP/seed-step", "GB/seed-step (cost analysis)",
            "GB/seed-step (HLO, HBM)", "seed-steps/s/chip")
  rates: dict[str, dict[int, float]] = {}
  for (generation, depth), r in results.items():
    chip = targets_lib.CHIPS[generation]
    train = r["fits"].get("train")
    evals = [f for n, f in r["fits"].items() if n != "train"]
    worst_eval = max(evals, key=lambda f: f.per_seed) if evals else None
    cost, hbm = r["cost"], r.get("hbm")
    flops, moved, source = _rate_inputs(cost, hbm, tpu_costs.get(depth))
    rate = "-"
    if moved:
      line = roofline_lib.roofline(flops or 0.0, moved,
                                   chip.matmul_peak(config.model.dtype,
                                                    config.model.matmul_precision),
                                   chip.hbm_bandwidth)
      rates.setdefault(generation, {})[depth] = line.seed_steps_per_s
      rate = f"{line.seed_steps_per_s:.0f} ({source})"
    fit_text = lambda f: (f"{f.per_seed / 1e6:.1f} (+{f.constant / 1e6:.0f})" if f else "-")
    rows.append([chip.name, str(depth), fit_text(train), fit_text(worst_eval),
                 str(r["max"]) if r["max"] is not None else "-",
                 f"{flops / 1e9:.2f}" if flops else "-",
                 f"{cost['bytes'] / 1e9:.3f}" if cost else "-",
                 f"{hbm / 1e9:.3f}" if hbm else "-", rate])
  # The chips not compiled, from a compiled chip of the same platform (the same XLA compiler:
  # issue 53 measured equal peaks on v4, v5e and v6e): its memory fits against their HBM, and
  # its cost per seed-step at their peaks (a TPU's cost analysis; a GPU's HLO traffic, else the
  # TPU program's cost).
  compiled = {g for g, _ in results}
  for generation, chip in targets_lib.CHIPS.items():
    if generation in compiled:
      continue
    source = next((g for g in compiled if targets_lib.CHIPS[g].platform == chip.platform), None)
    for depth in depths:
      r = results.get((source, depth)) if source else None
      fits = list(r["fits"].values()) if r else []
      most = planning.max_seeds(fits, chip.hbm_bytes) if fits else None
      flops, moved, how = _rate_inputs(r["cost"] if r else None, r.get("hbm") if r else None,
                                       tpu_costs.get(depth))
      rate = "-"
      if moved:
        line = roofline_lib.roofline(flops or 0.0, moved, chip.matmul_peak(
            config.model.dtype, config.model.matmul_precision), chip.hbm_bandwidth)
        rates.setdefault(generation, {})[depth] = line.seed_steps_per_s
        if r and (r["cost"] or r.get("hbm")):
          how += f" of {targets_lib.CHIPS[source].name}"
        rate = f"{line.seed_steps_per_s:.0f} ({how})"
      rows.append([f"{chip.name} (fits of {targets_lib.CHIPS[source].name})" if source
                   else chip.name, str(depth), "-", "-", str(most) if most is not None else "-",
                   "-", "-", "-", rate])
      if most is not None:
        results.setdefault((generation, depth), {"fits": {}, "max": most, "cost": None,
                                                 "hbm": None})
  print(table.format_table(header, rows))
  if _GRID.value:
    print("\nThe paper's grid (3 tasks x depths 2-10 x 10 seeds; 300k steps, Dyck 400k) at the "
          "roofline bound, every task at this config's cost per step:")
    grid_rows = []
    for generation, by_depth in rates.items():
      known = sorted(by_depth)
      if len(known) < 2 and len(depths) > 1:
        continue
      per_depth = {d: 1.0 / planning.interpolate(known, [1.0 / by_depth[k] for k in known], d)
                   for d in planning.GRID_DEPTHS}
      hours = {task: planning.grid_chip_hours(per_depth, steps)
               for task, steps in planning.GRID_STEPS.items()}
      grid_rows.append([targets_lib.CHIPS[generation].name]
                       + [f"{hours[t]:.0f}" for t in planning.GRID_STEPS]
                       + [f"{sum(hours.values()):.0f}"])
    print(table.format_table(("target",) + tuple(f"{t} chip-h" for t in planning.GRID_STEPS)
                             + ("total chip-h",), grid_rows))
  if _WRITE.value:
    _write(_WRITE.value, _preset_name(sys.argv and next(
        (a.partition("=")[2] for a in sys.argv if a.startswith("--config=")), "")), results)


def _rate_inputs(cost: dict | None, hbm: float | None, tpu_cost: dict | None
                 ) -> tuple[float | None, float | None, str]:
  """(FLOPs, bytes per seed-step, where they come from) for a row's roofline bound: the cost
  analysis where the chip's compiler gives one (TPU); else the HLO's HBM traffic (GPU) with
  the FLOPs of the TPU program of the same depth, or none; else the TPU program's cost."""
  if cost:
    return cost["flops"], cost["bytes"], "cost analysis"
  if hbm:
    if tpu_cost:
      return tpu_cost["flops"], hbm, "HLO bytes, TPU program's FLOPs"
    return None, hbm, "HLO bytes only"
  if tpu_cost:
    return tpu_cost["flops"], tpu_cost["bytes"], "TPU program's cost"
  return None, None, ""


def _params(config, depth: int, target) -> int:
  """Parameters per seed at `depth` (the run's own shapes: `programs.plan` without programs)."""
  run = config.copy_and_resolve_references()
  run.model.num_layers, run.num_seeds, run.num_devices = depth, 1, 1
  return programs_lib.plan(run, target, run.data.dir, ()).num_params


def _scale(config, results: dict, base: int, depths: list[int]) -> None:
  """Adds to `results` the depths not compiled, from depth `base` scaled by parameters (memory
  per seed, the cost analysis and the HLO traffic alike)."""
  for generation in sorted({g for g, d in results if d == base}):
    target = _target(generation)
    ref = _params(config, base, target)
    r = results[(generation, base)]
    for depth in depths:
      ratio = _params(config, depth, target) / ref
      print(f"  {generation} depth {depth}: {ratio:.3f} x the parameters of depth {base}")
      fits = {n: planning.MemoryFit(constant=f.constant, per_seed=f.per_seed * ratio,
                                    seeds=f.seeds, peaks=f.peaks) for n, f in r["fits"].items()}
      cost = ({k: v * ratio for k, v in r["cost"].items()} if r["cost"] else None)
      hbm = r["hbm"] * ratio if r.get("hbm") else None
      most = (planning.max_seeds(list(fits.values()), target.chip.hbm_bytes)
              if fits else None)
      results[(generation, depth)] = {"fits": fits, "max": most, "cost": cost, "hbm": hbm}


def _write(path: str, preset: str, results: dict) -> None:
  """Merges {generation: {preset: {depth: max seeds per chip}}} into the JSON table at `path`."""
  data = {}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  plans = data.setdefault("max_seeds_per_chip", {})
  for (generation, depth), r in results.items():
    if r["max"] is not None:
      plans.setdefault(generation, {}).setdefault(preset, {})[str(depth)] = int(r["max"])
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1, sort_keys=True)
    f.write("\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
