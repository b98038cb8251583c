"""The programs of a run, built as `sg_jax.main` and `sg_jax.analyze` build them, and compiled
for a target.

`plan` prepares what a run of `config` would compile on `target` (its data, the seed mesh over
the target's compile-only devices, the seed-vmapped functions of `step.make_train_fns`, every
enabled evaluator's built evaluation and the analysis quantities' jitted functions) without
running anything; `compile_all` lowers each program on abstract arguments
(`jax.ShapeDtypeStruct`s with the run's shardings), compiles it for the target and reads the
compiler's memory and cost analyses and the optimised HLO.

Programs (one `Program` each, named as the table's rows):
* `train`: the training call, `TrainFns.chunk` with `train.steps_per_call` steps (a `lax.scan`
  of the step under `jax.shard_map`: each chip trains its own seeds; the stacked state sharded
  over the seed mesh, `sharding.seed_sharding`, the data replicated, `sharding.replicated`);
* `eval <evaluator> <what>`: one call of each jitted function of every evaluator the config
  switches on (`sg_jax.evaluation.registry`: `task`, the loss and the task's metric, for a task
  that decodes with the greedy decoder and its key/value cache; `uas`, the UAS of attention;
  `preference`, the minimal-pair preference; any other registered evaluator), as the run
  builds them (`Evaluator.build` with the run's data; the functions they declare,
  `Evaluation.programs`), parameters seed-sharded and data replicated as in the run, partitioned
  by XLA over the seed mesh. An evaluator that declares no programs is listed in
  `Plan.skipped`;
* `analysis <quantity>`: one call of the jitted, seed-vmapped function of each analysis
  quantity of `sg_jax.analyze` (`analysis_programs`), on one chip with every seed, as
  `sg_jax.analyze` places them.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sg_jax import evaluation as evals
from sg_jax import terms as terms_lib
from sg_jax.accelerators import analysis_programs
from sg_jax.accelerators import hlo_checks
from sg_jax.accelerators import hlo_traffic
from sg_jax.accelerators import targets as targets_lib
from sg_jax.config import per_seed
from sg_jax.data.input_pipeline import DataOptions, load_data, make_train_data
from sg_jax.runtime import sharding
from sg_jax.step import StepOptions, make_train_fns
from sg_jax.tasks.io import run_data_dir
from sg_jax.training.state import seed_keys

KINDS = ("train", "eval", "analysis")


@dataclasses.dataclass
class Program:
  """One program to compile: `lower()` -> `jax.stages.Lowered` on abstract arguments."""

  name: str
  kind: str  # 'train' | 'eval' | 'analysis'
  lower: Callable[[], jax.stages.Lowered]
  seeds_per_chip: int  # seeds whose parameters the chip holds: the cost is divided by it
  note: str = ""  # how its cost is normalised
  # Bytes the process keeps on the chip besides the program's own arguments while it runs
  # (None: what a run keeps, `table.resident_peak`).
  resident: int | None = None


@dataclasses.dataclass
class Plan:
  """What a run of a config compiles on a target."""

  config: ml_collections.ConfigDict
  target: targets_lib.Target
  num_seeds: int
  chips_used: int
  seeds_per_chip: int
  num_params: int  # per seed
  state_bytes: int  # the training state of one chip's seeds (parameters, AdamW moments, ...)
  params_bytes: int  # the parameters of one chip's seeds
  train_data_bytes: int  # the training data (replicated: every chip holds it whole)
  eval_data_bytes: int  # every evaluator's batches (replicated)
  capacities: tuple | None  # packing buckets (None: padded batches)
  data_shape: tuple  # [num_lines, length] of the training arrays
  programs: list
  skipped: list = dataclasses.field(default_factory=list)  # 'what: why' not compiled
  # Bytes of each parameter array on one chip (its seeds' slice), for telling the state's
  # arrays from activations in a compiled program's traffic (`hlo_traffic.traffic(sizes=...)`).
  param_array_bytes: tuple = ()


@dataclasses.dataclass
class Compiled:
  """What the compiler said about one program (bytes per chip; cost of one call per chip)."""

  program: Program
  compile_s: float
  error: str = ""  # the compiler's refusal (e.g. out of memory), first line
  argument: int = 0
  output: int = 0
  alias: int = 0
  temp: int = 0
  code: int = 0
  flops: float | None = None
  bytes_accessed: float | None = None
  checks: dict | None = None
  # The HBM traffic of one call from the optimised HLO (`hlo_traffic.traffic`, hbm_only: a
  # TPU's arrays outside the on-chip memory space S(1), a GPU's every array), when asked for:
  # the GPU compiler gives no cost analysis, so on a GPU this is the only byte count.
  hbm_bytes: float | None = None

  @property
  def peak(self) -> int:
    """argument + output - alias + temporaries: the program's own live bytes at its peak."""
    return self.argument + self.output - self.alias + self.temp


def target_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with `model.layer_impl='auto'` resolved to 'plain', as on a GPU/TPU (auto picks by
  `jax.default_backend()`, which is the CPU of the compiling machine)."""
  config = ml_collections.ConfigDict(config.to_dict())
  if config.model.layer_impl == "auto":
    config.model.layer_impl = "plain"
  return config


def abstract(tree, shard):
  """`tree` with every leaf (an array, a `jax.ShapeDtypeStruct`, a number) as a
  `jax.ShapeDtypeStruct` of its shape and dtype with sharding `shard`."""
  def one(x):
    shape = x.shape if hasattr(x, "shape") else np.shape(x)
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=shard)

  return jax.tree_util.tree_map(one, tree)


def nbytes(tree) -> int:
  """Bytes of every leaf of `tree` (arrays or `jax.ShapeDtypeStruct`s)."""
  return int(sum(np.prod(np.shape(x) if not hasattr(x, "shape") else x.shape)
                 * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def plan(config: ml_collections.ConfigDict, target: targets_lib.Target, data_workdir: str = "",
         kinds: tuple[str, ...] = ("train", "eval")) -> Plan:
  """Builds the run's programs for `target` (nothing is compiled yet).

  Args:
    config: the run config (`target_config` is applied).
    target: from `targets.parse_target`.
    data_workdir: the run directory whose data/ holds (or receives) the generated splits, as
      `sg_jax.main --workdir` (`data.dir` when set); '' = a temporary folder, removed after.
    kinds: which programs, out of `KINDS`: 'train', 'eval' (every enabled evaluator's),
      'analysis' (`sg_jax.analyze`'s quantities).

  Raises:
    targets.MissingInstall: the target's compiler is not installed.
    ValueError: a bad config or data (as `sg_jax.main`), or an unknown kind.
  """
  config = target_config(config)
  devices = targets_lib.compile_devices(target)
  if data_workdir:
    return _plan(config, target, devices, data_workdir, kinds)
  with tempfile.TemporaryDirectory(prefix="sg_jax_aot_") as tmp:
    return _plan(config, target, devices, tmp, kinds)


def _plan(config, target, devices, workdir: str, kinds) -> Plan:
  unknown = set(kinds) - set(KINDS)
  if unknown:
    raise ValueError(f"unknown program kinds {sorted(unknown)}; choose from {KINDS}")
  data_options = DataOptions.from_config(config)
  task, vocab, splits = load_data(data_options, workdir)
  host_data, capacities, chips, per_chip = _train_data(config, data_options, task, splits,
                                                       workdir, target)
  mesh = jax.sharding.Mesh(np.asarray(devices[:chips]), (sharding.SEED_AXIS,))
  pool_sizes = (tuple(sorted(set(host_data["pool_sizes"].tolist()))) if "pools" in host_data
                else None)
  fns = make_train_fns(StepOptions.from_config(config, vocab.size), capacities, mesh, pool_sizes)
  seeded, rep = sharding.seed_sharding(mesh), sharding.replicated(mesh)
  hparams = per_seed.hparam_arrays(config)
  state = jax.eval_shape(fns.init, np.asarray(seed_keys(per_seed.seed_ids(config, "data"))),
                         np.asarray(seed_keys(per_seed.seed_ids(config, "init"))),
                         hparams["init_scale"])
  state = abstract(state, seeded)
  train_data = host_data | {"hparams": hparams}
  abstract_data = abstract(train_data, rep)
  start = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
  steps = int(config.train.steps_per_call)
  params_per_seed = sum(int(np.prod(x.shape[1:]))
                        for x in jax.tree_util.tree_leaves(state.params))
  programs, skipped = [], []
  if "train" in kinds:
    programs.append(Program(
        f"train ({steps} steps/call)", "train",
        lambda: fns.chunk.lower(state, abstract_data, start, steps), per_chip,
        "lax.scan body counted once: cost / seeds per chip"))
  # Every enabled evaluator is built as the run builds it (`train._train_locked`), its data
  # kept on the host: what `put` receives is what the run keeps on the chips.
  put_trees = []
  context = evals.Context(
      task=task, vocab=vocab, model=fns.model, objective=fns.objective,
      splits={name: splits[name] for name in ("in_domain", "out_of_domain")},
      data_dir=run_data_dir(config.data, workdir), options=evals.EvalOptions.from_config(config),
      put=lambda tree: put_trees.append(tree) or tree)
  # Built whatever `kinds` says: the training call's row counts their data as resident.
  for evaluator in evals.enabled_from_config(config):
    built = evaluator.build(context)
    if "eval" not in kinds:
      continue
    if built is None:
      skipped.append(f"eval {evaluator.name}: nothing to evaluate for this run")
    elif built.programs is None:
      skipped.append(f"eval {evaluator.name}: declares no programs (Evaluation.programs)")
    else:
      programs += [_eval_program(f"eval {evaluator.name}", p, state.params, rep, per_chip)
                   for p in built.programs()]
  if "analysis" in kinds:
    built, why = analysis_programs.calls(config, task, vocab, workdir)
    skipped += [f"analysis {name}: {reason}" for name, reason in why]
    one_chip = jax.sharding.SingleDeviceSharding(devices[0])
    params = abstract(state.params, one_chip)
    programs += [Program(f"analysis {c.name}", "analysis",
                         lambda c=c: c.lower(params, abstract(c.args, one_chip)),
                         int(config.num_seeds), c.note, resident=c.resident) for c in built]
  return Plan(config=config, target=target, num_seeds=int(config.num_seeds), chips_used=chips,
              seeds_per_chip=per_chip, num_params=params_per_seed,
              state_bytes=nbytes(state) // chips, params_bytes=nbytes(state.params) // chips,
              train_data_bytes=nbytes(train_data), eval_data_bytes=nbytes(put_trees),
              capacities=capacities, data_shape=tuple(host_data["inputs"].shape),
              programs=programs, skipped=skipped,
              param_array_bytes=tuple(nbytes(x) // chips
                                      for x in jax.tree_util.tree_leaves(state.params)))


def _eval_program(prefix: str, p: evals.Program, params, rep, per_chip: int) -> Program:
  """The `Program` of one evaluator's jitted function: seed-sharded parameters, replicated
  data, as the run calls it."""
  args = abstract(p.args, rep)
  return Program(f"{prefix} {p.name}", "eval",
                 lambda: p.fn.lower(params, *args, **(p.static or {})), per_chip,
                 f"one call of {p.calls} per evaluation; a loop's body counted once: cost / "
                 f"seeds per chip")


def _train_data(config, data_options, task, splits, workdir: str, target):
  """(host training arrays, packing capacities, chips used, seeds per chip), as
  `train._train_locked` makes them."""
  num_seeds = int(config.num_seeds)
  chips = targets_lib.seed_devices(num_seeds, target.num_chips, int(config.num_devices))
  per_chip = num_seeds // chips
  host_data, capacities = make_train_data(data_options, splits["train"], per_chip)
  host_data.update(terms_lib.train_arrays(
      terms_lib.active(config), terms_lib.schedules_from_config(config), task,
      lambda: data_options.training_examples(workdir), host_data["inputs"].shape[1],
      num_lines=host_data["inputs"].shape[0]))
  return host_data, capacities, chips, per_chip


def compile_program(program: Program, hbm_traffic: bool = False) -> Compiled:
  """Lowers and compiles one program; a compiler refusal (out of memory, ...) is recorded in
  `Compiled.error`, not raised. `hbm_traffic`: also estimate its HBM traffic from the optimised
  HLO (`Compiled.hbm_bytes`; seconds of parsing for a large program)."""
  started = time.perf_counter()
  try:
    compiled = program.lower().compile()
  except Exception as e:  # pylint: disable=broad-except  (jaxlib's own runtime errors)
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    return Compiled(program, time.perf_counter() - started,
                    error=(lines[0] if lines else type(e).__name__)[:400])
  seconds = time.perf_counter() - started
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, (list, tuple)):  # older jaxlibs: one dict per partition
    cost = cost[0] if cost else {}
  text = compiled.as_text()
  return Compiled(program, seconds, argument=memory.argument_size_in_bytes,
                  output=memory.output_size_in_bytes, alias=memory.alias_size_in_bytes,
                  temp=memory.temp_size_in_bytes, code=memory.generated_code_size_in_bytes,
                  flops=cost.get("flops"), bytes_accessed=cost.get("bytes accessed"),
                  checks=hlo_checks.check(text),
                  hbm_bytes=(float(hlo_traffic.traffic(text, hbm_only=True)["total"])
                             if hbm_traffic else None))


def compile_all(the_plan: Plan, on_done: Callable[[Compiled], None] | None = None
                ) -> list[Compiled]:
  """Compiles every program of `the_plan` in turn; `on_done(result)` after each."""
  results = []
  for program in the_plan.programs:
    result = compile_program(program)
    results.append(result)
    if on_done is not None:
      on_done(result)
  return results
