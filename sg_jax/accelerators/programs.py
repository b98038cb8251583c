"""The programs of a run, built as `sg_jax.main` builds them and compiled for a target.

`plan` prepares what a run of `config` would compile on `target` (its data, the seed mesh over
the target's compile-only devices, the seed-vmapped functions of `step.make_train_fns` and the
evaluator's per-split functions, `evaluator.split_fns`) without running anything; `compile_all`
lowers each program on abstract arguments with the run's shardings (the stacked state sharded
over the seed mesh, data replicated: `sharding.seed_sharding`, `sharding.replicated`), compiles
it for the target and reads the compiler's memory and cost analyses and the optimised HLO.

Programs (one `Program` each):
* `train`: the training call, `TrainFns.chunk` with `train.steps_per_call` steps (a `lax.scan`
  of the step under `jax.shard_map`: each chip trains its own seeds);
* `eval <split>`: one seed-vmapped evaluation batch of the split (`eval.batch_size` lines: the
  loss and the task's metric; for a task that decodes, the greedy decoder with its key/value
  cache), partitioned by XLA over the seed mesh as the run's evaluator is. Splits of the same
  shapes share one program. The other evaluators (attention UAS, minimal-pair preference) and
  the analysis programs (`sg_jax.analyze`) are not compiled yet.
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

from sg_jax import terms as terms_lib
from sg_jax.accelerators import hlo_checks
from sg_jax.accelerators import targets as targets_lib
from sg_jax.config import per_seed
from sg_jax.data.input_pipeline import DataOptions, load_data, make_train_data, prepare_eval_batches
from sg_jax.evaluation import evaluator
from sg_jax.runtime import sharding
from sg_jax.step import StepOptions, make_train_fns
from sg_jax.training.state import seed_keys


@dataclasses.dataclass
class Program:
  """One program to compile: `lower()` -> `jax.stages.Lowered` on abstract arguments."""

  name: str
  kind: str  # 'train' | 'eval'
  lower: Callable[[], jax.stages.Lowered]
  seeds_per_chip: int
  note: str = ""  # how its cost is normalised


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
  eval_data_bytes: int  # every evaluation split's batches (replicated)
  capacities: tuple | None  # packing buckets (None: padded batches)
  data_shape: tuple  # [num_lines, length] of the training arrays
  programs: list


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


def _abstract(tree, shard):
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype")
                                     else np.asarray(x).dtype, sharding=shard), tree)


def _shapes(batches: dict) -> tuple:
  return tuple((k, tuple(np.shape(v)), str(np.asarray(v).dtype))
               for k, v in sorted(batches.items()))


def _nbytes(tree) -> int:
  return int(sum(np.prod(np.shape(x)) * np.dtype(x.dtype).itemsize
                 for x in jax.tree_util.tree_leaves(tree)))


def plan(config: ml_collections.ConfigDict, target: targets_lib.Target, data_workdir: str = "",
         kinds: tuple[str, ...] = ("train", "eval")) -> Plan:
  """Builds the run's programs for `target` (nothing is compiled yet).

  Args:
    config: the run config (`target_config` is applied).
    target: from `targets.parse_target`.
    data_workdir: the run directory whose data/ holds (or receives) the generated splits, as
      `sg_jax.main --workdir` (`data.dir` when set); '' = a temporary folder, removed after.
    kinds: which programs: 'train', 'eval'.

  Raises:
    targets.MissingInstall: the target's compiler is not installed.
    ValueError: a bad config or data (as `sg_jax.main`).
  """
  config = target_config(config)
  devices = targets_lib.compile_devices(target)
  if data_workdir:
    return _plan(config, target, devices, data_workdir, kinds)
  with tempfile.TemporaryDirectory(prefix="sg_jax_aot_") as tmp:
    return _plan(config, target, devices, tmp, kinds)


def _plan(config, target, devices, workdir: str, kinds) -> Plan:
  data_options = DataOptions.from_config(config)
  task, vocab, splits = load_data(data_options, workdir)
  eval_data = _eval_data(config, task, splits)
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
  state = _abstract(state, seeded)
  train_data = host_data | {"hparams": hparams}
  abstract_data = _abstract(train_data, rep)
  start = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
  steps = int(config.train.steps_per_call)
  params_per_seed = sum(int(np.prod(x.shape[1:]))
                        for x in jax.tree_util.tree_leaves(state.params))
  programs = []
  if "train" in kinds:
    programs.append(Program(
        f"train ({steps} steps/call)", "train",
        lambda: fns.chunk.lower(state, abstract_data, start, steps), per_chip,
        "lax.scan body counted once: cost / seeds per chip"))
  if "eval" in kinds:
    shared = {}
    for name, batches in eval_data.items():
      key, one_batch, _ = evaluator.split_fns(task, fns.model, vocab, batches,
                                              config.eval.kv_cache, fns.objective)
      shared.setdefault((key, _shapes(batches)), (one_batch, batches, []))[2].append(
          name)
    for one_batch, batches, names in shared.values():
      abstract_batches = _abstract(batches, rep)
      index = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
      lines = batches["inputs"].shape[1]
      programs.append(Program(
          f"eval {'+'.join(names)} ({lines} lines/batch)", "eval",
          lambda f=one_batch, b=abstract_batches, i=index: f.lower(state.params, b, i),
          per_chip, "one batch; a decoding loop's body counted once: cost / seeds per chip"))
  return Plan(config=config, target=target, num_seeds=int(config.num_seeds), chips_used=chips,
              seeds_per_chip=per_chip, num_params=params_per_seed,
              state_bytes=_nbytes(state) // chips, params_bytes=_nbytes(state.params) // chips,
              train_data_bytes=_nbytes(train_data),
              eval_data_bytes=sum(_nbytes(b) for b in eval_data.values()),
              capacities=capacities, data_shape=tuple(host_data["inputs"].shape),
              programs=programs)


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


def _eval_data(config, task, splits) -> dict:
  """{split: batches} of the held-out splits, as the task-metric evaluator makes them."""
  return {name: prepare_eval_batches(splits[name], config.eval.batch_size, config.eval.max_lines,
                                     task.eval_fields)
          for name in ("in_domain", "out_of_domain")}


def compile_program(program: Program) -> Compiled:
  """Lowers and compiles one program; a compiler refusal (out of memory, ...) is recorded in
  `Compiled.error`, not raised."""
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
  return Compiled(program, seconds, argument=memory.argument_size_in_bytes,
                  output=memory.output_size_in_bytes, alias=memory.alias_size_in_bytes,
                  temp=memory.temp_size_in_bytes, code=memory.generated_code_size_in_bytes,
                  flops=cost.get("flops"), bytes_accessed=cost.get("bytes accessed"),
                  checks=hlo_checks.check(compiled.as_text()))


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
