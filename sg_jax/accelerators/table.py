"""The table `sg_jax.aot` prints: one row per compiled program (units in the header)."""

from __future__ import annotations

from sg_jax.accelerators import hlo_checks
from sg_jax.accelerators import roofline as roofline_lib
from sg_jax.accelerators.programs import Compiled, Plan

GB = 1e9
MB = 1e6

HEADER = ("program", "seeds/chip", "compile s", "fits", "peak GB", "args GB", "temp GB",
          "code MB", "GFLOP/seed-step", "GB/seed-step", "FLOP/B", "bound", "seed-steps/s/chip",
          "HLO checks")


def resident_peak(the_plan: Plan, result: Compiled) -> int:
  """Bytes per chip while `result`'s program runs in a run: its own peak plus what else the run
  keeps on the chip meanwhile: for a training call every evaluator's data, for an evaluation
  call the training state besides the parameters, the training data and the evaluators' data
  besides the call's own arguments; for an analysis call (its own process, no training state)
  the quantity's other batches (`Program.resident`)."""
  if result.program.resident is not None:
    return result.peak + result.program.resident
  if result.program.kind == "train":
    return result.peak + the_plan.eval_data_bytes
  return (result.peak + the_plan.state_bytes - the_plan.params_bytes + the_plan.train_data_bytes
          + the_plan.eval_data_bytes - (result.argument - the_plan.params_bytes))


def row(the_plan: Plan, result: Compiled, dtype: str, precision: str) -> list[str]:
  """The table row of one compiled program."""
  p = result.program
  if result.error:
    return [p.name, str(p.seeds_per_chip), f"{result.compile_s:.0f}",
            f"refused: {result.error}"] + [""] * (len(HEADER) - 4)
  chip = the_plan.target.chip
  peak = resident_peak(the_plan, result)
  fits = "yes" if peak <= chip.hbm_bytes else f"NO (> {chip.hbm_bytes / GB:.1f})"
  cells = [p.name, str(p.seeds_per_chip), f"{result.compile_s:.0f}", fits, f"{peak / GB:.2f}",
           f"{result.argument / GB:.2f}", f"{result.temp / GB:.2f}",
           f"{result.code / MB:.0f}" if result.code else "-"]
  if result.flops and result.bytes_accessed:
    flops = roofline_lib.per_seed_step(result.flops, p.seeds_per_chip)
    moved = roofline_lib.per_seed_step(result.bytes_accessed, p.seeds_per_chip)
    line = roofline_lib.roofline(flops, moved, chip.matmul_peak(dtype, precision),
                                 chip.hbm_bandwidth)
    rate = f"{line.seed_steps_per_s:.0f}" if p.kind == "train" else "-"
    cells += [f"{flops / 1e9:.2f}", f"{moved / GB:.3f}", f"{line.intensity:.1f}",
              f"{line.bound} ({line.times_over_ridge:.0f}x)" if line.bound == "memory"
              else "compute", rate]
  else:
    cells += ["-", "-", "-", "-", "-"]  # no cost analysis (the GPU compiler gives none)
  cells.append(hlo_checks.summary(result.checks, collectives_are_errors=p.kind == "train"))
  return cells


def format_table(header, rows) -> str:
  """A Markdown table (pipes), columns padded to their widest cell."""
  widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
  fmt = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
  return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def describe(the_plan: Plan) -> list[tuple[str, str]]:
  """(label, value) lines printed above the table."""
  c, t = the_plan.config, the_plan.target
  idle = t.num_chips - the_plan.chips_used
  chips = (f"{the_plan.chips_used} of {t.num_chips} chips ({t.chip.name}), "
           f"{the_plan.seeds_per_chip} seed{'s' if the_plan.seeds_per_chip > 1 else ''} per chip")
  if idle:
    chips += (f"; {idle} chips idle: {the_plan.num_seeds} seeds use the largest chip count "
              f"that divides them (a multiple of {t.num_chips} seeds would use every chip)")
  layout = (f"packed rows, {len(the_plan.capacities)} buckets {the_plan.capacities}"
            if the_plan.capacities else "padded batches")
  return [
      ("target", f"{t.name}: {t.chip.name}, {t.chip.hbm_bytes / GB:.1f} GB HBM, "
                 f"{t.chip.hbm_bandwidth / 1e12:.2f} TB/s, matmul peak "
                 f"{t.chip.matmul_peak(c.model.dtype, c.model.matmul_precision) / 1e12:.0f} "
                 f"TFLOP/s ({c.model.dtype}, precision {c.model.matmul_precision})"),
      ("seeds", f"{the_plan.num_seeds} on {chips}"),
      ("model", f"{c.model.num_layers} layers, d_model {c.model.d_model}, {c.model.num_heads} "
                f"heads, d_ff {c.model.d_ff}, {the_plan.num_params:,} parameters per seed, "
                f"layer_impl {c.model.layer_impl}, {c.model.dtype}"),
      ("training", f"batch {c.train.batch_size} lines per seed, {layout}; data "
                   f"{the_plan.data_shape[0]} lines x {the_plan.data_shape[1]} tokens"),
      ("per chip", f"training state {the_plan.state_bytes / GB:.2f} GB, training data "
                   f"{the_plan.train_data_bytes / GB:.3f} GB, evaluation data "
                   f"{the_plan.eval_data_bytes / GB:.3f} GB"),
  ]


NOTES = (
    "peak = arguments + outputs - donated + temporaries of the program, per chip, plus what "
    "the run keeps resident meanwhile (every evaluator's data; for an eval row also the "
    "training state and data; for an analysis row the quantity's other batches); fits = peak "
    "<= the chip's HBM",
    "GFLOP and GB per seed-step = XLA's cost analysis of one call / seeds per chip: the cost "
    "analysis counts a loop body once, so a training call's cost is one step's (a packed step "
    "at its largest bucket); an eval row is one call (one batch) per seed, a decoding loop "
    "counted once; an analysis row one call (its largest batch) per seed, all seeds on one "
    "chip as sg_jax.analyze places them",
    "bound: memory-bound when FLOP/B is below the chip's ridge (peak / bandwidth; in "
    "parentheses how many times below); seed-steps/s/chip = the roofline bound at the "
    "published peaks, not a measurement",
    "HLO checks: f64 values, host transfers or callbacks (none allowed in any program), "
    "collectives (none allowed in the training call: each chip trains its own seeds; in an "
    "eval row, partitioned by XLA, listed as '(allowed)': they move results, not the state)",
)
