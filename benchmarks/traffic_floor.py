r"""Bytes moved per seed-step of the training call against its traffic floor (issue 53 item 3).

  python benchmarks/traffic_floor.py --config=configs/tense.py:quick --targets=v5e,cpu
  python benchmarks/traffic_floor.py --config=configs/tense.py:depth=8 --targets=v5e,v4

For each target (one chip: `v5e` = `v5e:1x1`; `cpu` = this machine's CPU backend, whose cost
analysis is XLA's too) compiles the config's training call (`python -m sg_jax.aot`'s program,
`--config.train.packing` as the config says) and prints XLA's bytes accessed per seed-step
(`compiled.cost_analysis()`, the `lax.scan` body counted once, divided by the seeds on the chip)
against the floor, the bytes a step of one seed must move however well it is fused:

    floor = P x (2 reads of the parameters: forward and backward pass
                 + 1 write and 1 read of the gradients
                 + 2 x (1 read + 1 write) of the AdamW moments mu and nu
                 + 1 read and 1 write of the parameters by the update)
          = 10 P bytes,

P = the bytes of one seed's float32 parameters. Not counted: activations, the data, the step's
scalars, and the gradient norm that clipping reads before any update (1 P more). The ratio
bytes / floor is what item 3 brings toward 1.5.

Beside the cost analysis, each target's HBM traffic as the optimised HLO gives it
(`sg_jax.accelerators.hlo_traffic` over `compiled.as_text()`, per seed-step): on a TPU only the
arrays in HBM (not those the program places in the on-chip memory space S(1), which the cost
analysis counts too); on a GPU every array an instruction reads or writes lives in HBM, so the
whole HLO traffic (the GPU compiler gives no cost analysis: this is its only figure). It is an
estimate from the compiled program, not a measurement: caches (a GPU's L2) are not modelled,
and a GPU compiled without a device is not autotuned, so its kernels' tiling may differ on a
device. Each target also prints how much of that traffic is arrays of a parameter's size (the
parameters, their gradients and AdamW moments, matched by size), the rest being activations and
data. A CPU row has no HBM figure.
"""

import os
import sys
import tempfile
import time

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
import jax
from absl import app
from absl import flags
from ml_collections import config_flags

from sg_jax.accelerators import hlo_traffic
from sg_jax.accelerators import programs as programs_lib
from sg_jax.accelerators import roofline as roofline_lib
from sg_jax.accelerators import table
from sg_jax.accelerators import targets as targets_lib
from sg_jax.config.cli_options import parse_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file with a config string.",
                                          lock_config=False)
_TARGETS = flags.DEFINE_list("targets", ["v5e", "cpu"], "Chips (one each): cpu, v4, v5e, v5p, "
                             "v6e, h100, h200, a100.")
_DUMP = flags.DEFINE_string("dump_hlo", "", "Write each target's optimised HLO to PREFIX.<target>.hlo.")
_OPTIONS = flags.DEFINE_multi_string(
    "compiler_option", [], "An XLA option for the compile, KEY=VALUE (repeatable), e.g. "
    "xla_disable_hlo_passes=dot-merger: what a compiler setting would change, not the step's "
    "own programs (which compile with the defaults).")
flags.mark_flags_as_required(["config"])

SINGLE = {"v4": "v4:1x1x1", "v5e": "v5e:1x1", "v5p": "v5p:1x1x1", "v6e": "v6e:1x1"}
FLOOR_COPIES = 10  # see the module docstring


def floor_bytes(params_bytes_per_seed: int) -> int:
  """The traffic floor of one seed-step (module docstring): 10 x the parameters' bytes."""
  return FLOOR_COPIES * int(params_bytes_per_seed)


def compiler_options() -> dict | None:
  """--compiler_option KEY=VALUE pairs as a dict (None: none given).

  Raises:
    app.UsageError: an option without '='.
  """
  options = {}
  for item in _OPTIONS.value:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise app.UsageError(f"--compiler_option needs KEY=VALUE, got {item!r}")
    options[key.strip()] = value.strip()
  return options or None


def measure(config, name: str, data_dir: str) -> dict:
  """{'bytes', 'flops' per seed-step or None, 'params_bytes' per seed, 'seeds', 'compile_s'}."""
  if name == "cpu":
    target = targets_lib.Target("cpu", "v5e", (1,))  # the CPU's own devices; v5e's figures unused
    devices = tuple(jax.devices("cpu")[:1])
  else:
    target = targets_lib.parse_target(SINGLE.get(name, name))
    devices = targets_lib.compile_devices(target)
  run = programs_lib.target_config(config) if name != "cpu" else config
  run.num_devices = 1
  the_plan = programs_lib._plan(run, target, devices, data_dir,  # pylint: disable=protected-access
                                ("train",))
  seeds = the_plan.seeds_per_chip
  started = time.perf_counter()
  try:
    compiled = the_plan.programs[0].lower().compile(compiler_options=compiler_options())
  except Exception as e:  # pylint: disable=broad-except  (the compiler's refusal)
    return {"seeds": seeds, "compile_s": time.perf_counter() - started, "error": str(e)[:200],
            "params_bytes": the_plan.params_bytes // seeds}
  out = {"seeds": seeds, "compile_s": time.perf_counter() - started, "error": "",
         "params_bytes": the_plan.params_bytes // seeds, "bytes": None, "flops": None,
         "temp": compiled.memory_analysis().temp_size_in_bytes}
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  if cost.get("bytes accessed"):
    out["bytes"] = roofline_lib.per_seed_step(cost["bytes accessed"], seeds)
    out["flops"] = roofline_lib.per_seed_step(cost.get("flops") or 0.0, seeds)
  text = compiled.as_text()
  if _DUMP.value:
    with open(f"{_DUMP.value}.{name}.hlo", "w", encoding="utf-8") as f:
      f.write(text)
  out["traffic"] = hlo_traffic.traffic(text)
  out["platform"] = "cpu" if name == "cpu" else target.chip.platform
  # The HBM traffic: a TPU's arrays outside S(1); a GPU's every array, none being in S(1)
  # (module docstring).
  out["hbm"] = None if name == "cpu" else hlo_traffic.traffic(text, hbm_only=True)
  out["hbm_params"] = None if name == "cpu" else hlo_traffic.traffic(
      text, hbm_only=True, sizes=the_plan.param_array_bytes)
  return out


def main(argv):
  del argv
  config = _CONFIG.value
  compiler_options()  # a malformed option fails here, before any compile
  rows = []
  with tempfile.TemporaryDirectory(prefix="sg_jax_floor_") as data_dir:
    config.data.dir = config.data.dir or data_dir
    for name in _TARGETS.value:
      got = measure(config, name, data_dir)
      floor = floor_bytes(got["params_bytes"])
      if got["error"]:
        rows.append([name, str(got["seeds"]), f"{got['compile_s']:.0f}",
                     f"refused: {got['error'][:80]}", "", "", "", "", "", ""])
        continue
      moved, seeds = got["bytes"], got["seeds"]
      hbm = got["hbm"]["total"] / seeds if got["hbm"] else None
      rows.append([name, str(seeds), f"{got['compile_s']:.0f}",
                   f"{got['params_bytes'] / 1e6:.2f}", f"{floor / 1e6:.1f}",
                   f"{moved / 1e6:.1f}" if moved else "- (no cost analysis)",
                   f"{moved / floor:.2f}" if moved else "-",
                   f"{hbm / 1e6:.1f}" if hbm else "-", f"{hbm / floor:.2f}" if hbm else "-",
                   f"{got['temp'] / 1e6:.1f}"])
      print(f"  {name}: compiled in {got['compile_s']:.0f} s", flush=True)
      t = got["traffic"]
      parts = ", ".join(f"{k} {v / seeds / 1e6:.1f}" for k, v in sorted(t["by_part"].items()))
      top = sorted(t["by_function"].items(), key=lambda kv: -kv[1])[:8]
      print(f"    HLO traffic by part, MB per seed-step (sg_jax.accelerators.hlo_traffic, total "
            f"{t['total'] / seeds / 1e6:.1f}): {parts}", flush=True)
      print("    by function: " + ", ".join(f"{k} {v / seeds / 1e6:.1f}" for k, v in top),
            flush=True)
      if got["hbm"]:
        what = ("arrays outside the on-chip memory space S(1)" if got["platform"] == "tpu"
                else "every array: all of a GPU's live in HBM; L2 not modelled")
        params, p = got["hbm_params"], got["params_bytes"]
        by_part = ", ".join(f"{k} {v / seeds / p:.2f} P"
                            for k, v in sorted(params["by_part"].items()))
        print(f"    HBM traffic ({what}; an estimate from the compiled program): "
              f"{hbm / 1e6:.1f} MB per seed-step, {hbm / floor:.2f} x the floor; of which "
              f"arrays of a parameter's size (parameters, gradients, moments) "
              f"{params['total'] / seeds / 1e6:.1f} MB = {params['total'] / seeds / p:.2f} P "
              f"({by_part}), the rest (activations, data) "
              f"{(got['hbm']['total'] - params['total']) / seeds / 1e6:.1f} MB", flush=True)
  print(f"config: {config.task}, {config.model.num_layers} layers, d_model {config.model.d_model},"
        f" {config.num_seeds} seeds, {config.model.dtype}, packing {config.train.packing}, "
        f"{config.train.steps_per_call} steps per call"
        + (f"; compiler options {compiler_options()}" if compiler_options() else ""))
  print(table.format_table(("target", "seeds/chip", "compile s", "params MB/seed",
                            "floor MB/seed-step", "moved MB/seed-step", "moved / floor",
                            "HBM MB/seed-step (HLO)", "HBM / floor", "temp MB/chip"), rows))
  print("optimiser floor = 7 x the parameters (gradients read, moments read and written, "
        "parameters read and written): compare with the update's HLO traffic above "
        "(apply_gradients and the <lambda> of its divergence guard, sg_jax/step.py)")
  print("floor = 10 x the float32 parameters per seed-step: forward and backward reads, the "
        "gradients written and read, both AdamW moments read and written, the parameters read "
        "and written by the update; activations, data and clipping's norm read not counted")
  print("moved = XLA's cost analysis (every memory space; none on GPU); HBM (HLO) = "
        "sg_jax.accelerators.hlo_traffic on the optimised HLO: TPU arrays outside S(1), every "
        "array on GPU (an estimate: caches not modelled, GPU kernels not autotuned)")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
