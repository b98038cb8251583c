"""Training throughput: seed-vmapped compiled chunks vs a sequential per-step baseline (README).

Plain script (prints tables; not a unit test):
  python benchmarks/train_throughput.py                      # depths 2,6,10 x seeds 1,2,4,8,16
  python benchmarks/train_throughput.py --quick              # < 1 minute on a 2-core CPU
  python benchmarks/train_throughput.py --depths=6 --seeds=1,4,8 --breakdown
  python benchmarks/train_throughput.py --packing=off --no_sequential --dtype=bfloat16
  python benchmarks/train_throughput.py --depths=6 --seeds=1,4 --packing=on --layer_impl=both

Model: the reference-size TransformerLM (docs/REFERENCE.md §1: d_model 512, 8 heads, feed-forward 2048,
dropout 0.1, batch 8 lines per seed and step, AdamW + clipping) on question formation; `--quick`
shrinks it (depth 2, d_model 128, 4 heads, d_ff 512; the output says so). Data: question-formation
lines generated in memory by `sg_jax.tasks` (`--num_train`, default 5,000; only the train split
is used), encoded and laid out exactly as `sg_jax.train` does (`input_pipeline.make_train_data`, packed
rows when `config.train.packing` is on).

Measured, per depth, seed count, device count (`--num_devices`), layout (padded / packed) and
layer set (`--layer_impl`: `model.layer_impl` tuned / plain, default what "auto" picks here; all
at `--matmul_precision`, `model.matmul_precision`):
* vmapped: `step_lib.train_fns_from_config(config, vocab.size, capacities, mesh).chunk(state,
  data, start, steps_per_call)`, i.e. the production path: the seeds sharded over
  `sharding.seed_mesh` (on a
  CPU-only machine the host is split into 2 x cores devices by `sg_jax.runtime.host_devices`, as
  `python -m sg_jax.main` does; set XLA_FLAGS=--xla_force_host_platform_device_count=N to
  override), each device running its own seeds in one compiled `lax.scan` call (`shard_map`),
  packing buckets chosen per device. The first call (which compiles) is timed separately and
  excluded from the rate (printed: `1st call s`, and `compile s`, the XLA compilation it
  and the state's initialisation made, from `sg_jax.runtime.compile_cache.CompileWatch`; the benchmark
  uses no persistent compilation cache); then calls are timed (each waited for with `block_until_ready`) until at least
  `--min_time` seconds and `--min_calls` calls; the rate uses the median call.
* sequential: the same seeds trained one after another, one call per step of the loop's own
  body for ONE seed (`fns.chunk` of a one-seed config without a mesh, 1 step per call: batch
  sampling, the packing bucket switch, `loss_and_grads`, `apply_gradients`): only the per-step
  dispatch, the single seed and the single device differ.
  `--seq_steps` steps per seed, one untimed compile step before.
* with `--breakdown`, per depth (first `--layer_impl` only): the parts of one seed's step timed
  alone (forward, backward, optimiser, the whole step) and the step's matmuls alone (`step_matmuls`, `time_matmuls`:
  every dot_general of a packed step, on random operands of the same shapes, one after another,
  at each seed count),
  and the MFU ceilings these set (model FLOPs at the peak / time of the matmuls, with and
  without the optimiser's time added).
* the matmul peak of the machine, measured in the same run (before and after the grid, the
  larger is used): best of several `jnp.dot` of two `--peak_size`-square matrices in the model's
  dtype, at `--matmul_precision` (the same the model runs at).

Model FLOPs are counted on REAL (non-padding) tokens only, per seed and step (printed in the
output): 6 * N * T + 12 * depth * d_model * P, where N = non-embedding matmul parameters
(depth * (4 d_model^2 + 2 d_model d_ff) + d_model * vocab for the output layer; biases,
LayerNorms and the embedding lookup excluded), T = real tokens of the step (batch * mean line
length in target positions, i.e. words + EOS) and P = causal query-key pairs of the step's lines
(sum over lines of T_line (T_line + 1) / 2; QK^T and attention-times-V, forward and backward).
The padding fraction is the expected fraction of computed token positions that are padding
(`packing.padding_fraction` with the seeds of one device sharing a bucket).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402,F401  (first: 2 x cores CPU devices before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from sg_jax.runtime import compile_cache, sharding  # noqa: E402
from sg_jax import train  # noqa: E402
from sg_jax import step as step_lib  # noqa: E402

from common import (_ints, layer_impls, load_average, machine_rows,  # noqa: E402
                    make_config, print_rows, print_table, table_line, train_fns, train_layout)
from sg_jax.models import layers  # noqa: E402
from sg_jax.data import packing as packing_lib  # noqa: E402
from sg_jax.data import input_pipeline  # noqa: E402
from sg_jax.training.state import init_state, seed_keys  # noqa: E402


def question_split(num_train: int, seed: int = 0):
  """(vocab, EncodedSplit) of `num_train` generated question-formation training lines."""
  from sg_jax import tasks  # pylint: disable=import-outside-toplevel
  task = tasks.get_task("question")
  examples = task.generate_examples(seed=seed, sizes={"train": num_train, "dev": 10, "test": 10,
                                                      "gen": 10})
  vocab = task.vocab()
  return vocab, task.encode(examples["train"], vocab)


def per_device(num_seeds: int, max_devices: int = 0) -> int:
  """Seeds per device when `num_seeds` seeds are sharded as `sg_jax.train` shards them (at most
  `max_devices` devices if set: the config's `num_devices`)."""
  return num_seeds // sharding.num_seed_devices(num_seeds, max_devices)


def padding_fraction(config, lengths: np.ndarray, num_seeds: int, padded_length: int,
                     max_devices: int = 0) -> float:
  """Expected padding fraction of computed token positions (`packing.padding_fraction`; seeds of
  one device share a packing bucket)."""
  return packing_lib.padding_fraction(packing_lib.BatchLayout.from_config(config), lengths,
                                      per_device(num_seeds, max_devices), padded_length)


def padding_summary(args, split) -> str:
  """Padding fraction of each layout for every seed count of the grid (timed or not)."""
  lengths, width = np.asarray(split.lengths), int(split.inputs.shape[1])
  parts = []
  for packing in (False, True):
    values = []
    for num_seeds in args.seeds:
      config = make_config(args.depths[0], num_seeds, args, packing)
      values.append(f"{100 * padding_fraction(config, lengths, num_seeds, width):.1f}%")
    parts.append(f"{'packed' if packing else 'padded'} " + "/".join(values))
  seeds = "/".join(str(s) for s in args.seeds)
  devices = "/".join(str(sharding.num_seed_devices(s)) for s in args.seeds)
  return (f"{'; '.join(parts)} (at {seeds} seeds on {devices} devices; "
          f"packing.padding_fraction)")


# ----------------------------------------------------------------------------------------------
# FLOPs and the matmul peak.


def model_flops_per_seed_step(config, vocab_size: int, lengths: np.ndarray) -> dict:
  """Model FLOPs of one seed's training step on real tokens (module docstring formula)."""
  m = config.model
  depth, d, f = int(m.num_layers), int(m.d_model), int(m.d_ff)
  batch = int(config.train.batch_size)
  lengths = np.asarray(lengths, np.float64)
  matmul_params = depth * (4 * d * d + 2 * d * f) + d * vocab_size
  tokens = batch * lengths.mean()
  pairs = batch * np.mean(lengths * (lengths + 1) / 2)
  dense = 6.0 * matmul_params * tokens
  attention = 12.0 * depth * d * pairs
  return {"matmul_params": matmul_params, "tokens": tokens, "dense": dense,
          "attention": attention, "total": dense + attention}


def matmul_peak(size: int, dtype: str, trials: int = 5, precision: str = "default") -> float:
  """Best FLOP/s of `jnp.dot` of two [size, size] matrices (several back-to-back per trial) at
  `precision` (a `model.matmul_precision` value)."""
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (size, size), jnp.float32).astype(dtype)
  b = jax.random.normal(kb, (size, size), jnp.float32).astype(dtype)
  dot = jax.jit(lambda x, y: jnp.dot(x, y, precision=layers.matmul_precision(precision)))
  dot(a, b).block_until_ready()
  t0 = time.perf_counter()
  dot(a, b).block_until_ready()
  reps = max(1, int(0.2 / max(time.perf_counter() - t0, 1e-6)))
  best = float("inf")
  for _ in range(trials):
    t0 = time.perf_counter()
    outs = [dot(a, b) for _ in range(reps)]
    jax.block_until_ready(outs)
    best = min(best, (time.perf_counter() - t0) / reps)
  return 2.0 * size ** 3 / best


def _dot_generals(jaxpr) -> list:
  """[(operand avals, dot_general params)] of every `dot_general` in `jaxpr`, in program order,
  including those inside nested jaxprs (jit, custom_vjp, remat). Raises ValueError if a loop
  (`scan`/`while`, whose body runs several times) or a branch (`cond`) holds a matmul."""
  from jax.extend import core as jex_core  # pylint: disable=import-outside-toplevel
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      out.append((tuple(v.aval for v in eqn.invars), dict(eqn.params)))
    inner = []
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, jex_core.ClosedJaxpr):
          inner += _dot_generals(sub.jaxpr)
        elif isinstance(sub, jex_core.Jaxpr):
          inner += _dot_generals(sub)
    if inner and eqn.primitive.name in ("scan", "while", "cond"):
      raise ValueError(f"a {eqn.primitive.name} of the step holds matmuls: they cannot be "
                       "listed once each")
    out += inner
  return out


def _dot_flops(avals, params) -> float:
  """2 x multiply-adds of one dot_general."""
  (_, rhs_contract), (_, rhs_batch) = params["dimension_numbers"]
  lhs, rhs = avals  # lhs holds the batch, contracted and its own free axes
  rhs_free = [n for i, n in enumerate(rhs.shape) if i not in rhs_contract + rhs_batch]
  return 2.0 * float(np.prod(lhs.shape)) * float(np.prod(rhs_free))


def one_seed_state(config, vocab_size: int):
  """(`train_fns(config, vocab_size, None)`, one seed's initial TrainState) without a seed axis."""
  fns = train_fns(config, vocab_size, None)
  state = jax.jit(lambda k: init_state(k, fns.model, fns.tx))(seed_keys([0])[0])
  return fns, state


def step_matmuls(config, vocab_size: int, split) -> dict:
  """The matmuls of one seed's packed forward+backward (`step.loss_and_grads` on a row).

  One batch of `batch_size` lines is packed into a row of exactly its total length (no padding
  position): of 64 random batches (fixed seed), the one whose total length is closest to the
  average batch's. Its `dot_general`s (projections, feed-forward, output layer, attention scores
  and attention-times-values, and their gradients) are listed from the step's jaxpr.

  Returns:
    {'dots': [(operand avals, params)] (`_dot_generals`), 'dot_flops': their FLOPs,
     'tokens': the batch's tokens, 'model_flops': `model_flops_per_seed_step` of the batch}.
  """
  fns, state = one_seed_state(config, vocab_size)
  batch = int(config.train.batch_size)
  lengths = np.asarray(split.lengths)
  rng = np.random.default_rng(0)
  batches = [rng.choice(len(split), batch, replace=False) for _ in range(64)]
  idx = min(batches, key=lambda b: abs(lengths[b].sum() - batch * lengths.mean()))
  data = jax.device_put(train_layout(config, split, 1)[0])
  packed = lambda params, key: step_lib.loss_and_grads(
      params, key, data, jnp.asarray(idx, jnp.int32), jnp.asarray(3, jnp.int32), fns.model,
      fns.objective, capacity=int(lengths[idx].sum()))
  dots = _dot_generals(jax.make_jaxpr(packed)(state.params, state.key).jaxpr)
  return {"dots": dots, "dot_flops": sum(_dot_flops(*d) for d in dots),
          "tokens": int(lengths[idx].sum()),
          "model_flops": model_flops_per_seed_step(config, vocab_size, lengths[idx])["total"]}


def time_matmuls(dots, num_seeds: int, max_devices: int = 0, trials: int = 5) -> dict:
  """Times `dots` (`step_matmuls`) alone, one after another, for `num_seeds` seeds.

  Each dot runs on random operands of its shapes, dimension numbers and precision after the
  previous one has finished (`lax.optimization_barrier`: no two overlap, which the real step may
  allow), with a seed axis vmapped and sharded over `sharding.seed_mesh(num_seeds, max_devices)`
  (the jit of the vmap on seed-sharded operands; training uses `shard_map` on the same mesh).

  Returns:
    {'seconds': best call time / num_seeds (s per seed-step), 'devices': mesh size}.
  """
  mesh = sharding.seed_mesh(num_seeds, max_devices)
  keys = jax.random.split(jax.random.key(0), 2 * len(dots))
  operands = jax.device_put(
      [tuple(jax.random.normal(keys[2 * i + j], (num_seeds, *aval.shape)).astype(aval.dtype)
             for j, aval in enumerate(avals)) for i, (avals, _) in enumerate(dots)],
      sharding.seed_sharding(mesh))

  def chain(ops):  # one seed: each dot starts after the previous one has finished
    prev, outs = jnp.zeros(()), []
    for (a, b), (_, params) in zip(ops, dots):
      prev, a, b = jax.lax.optimization_barrier((prev, a, b))
      prev = jax.lax.dot_general(a, b, params["dimension_numbers"], params["precision"],
                                 preferred_element_type=params["preferred_element_type"])
      outs.append(prev)
    return outs

  run = jax.jit(jax.vmap(chain), out_shardings=sharding.seed_sharding(mesh))
  jax.block_until_ready(run(operands))
  best = float("inf")
  for _ in range(trials):
    t0 = time.perf_counter()
    jax.block_until_ready(run(operands))
    best = min(best, time.perf_counter() - t0)
  return {"seconds": best / num_seeds, "devices": int(mesh.devices.size)}


# ----------------------------------------------------------------------------------------------
# The two ways of training.


def time_vmapped(fns, host_data, keys, mesh, steps_per_call: int, min_time: float,
                 min_calls: int):
  """(compile-call seconds, [seconds per timed call]) of `fns.chunk` on all seeds at once, the
  state sharded over `mesh` and the data replicated, as `train.train_and_evaluate` runs it."""
  data = sharding.put_replicated(host_data, mesh)
  state = jax.jit(fns.init, out_shardings=sharding.seed_sharding(mesh))(
      sharding.put_replicated(np.asarray(keys), mesh))
  jax.block_until_ready(state)
  start = 0
  t0 = time.perf_counter()
  state = fns.chunk(state, data, jnp.asarray(start, jnp.int32), steps_per_call)
  jax.block_until_ready(state)
  first = time.perf_counter() - t0
  calls = []
  while len(calls) < min_calls or sum(calls) < min_time:
    start += steps_per_call
    t0 = time.perf_counter()
    state = fns.chunk(state, data, jnp.asarray(start, jnp.int32), steps_per_call)
    jax.block_until_ready(state)
    calls.append(time.perf_counter() - t0)
  return first, calls


def time_sequential(config, vocab_size: int, split, keys, steps_per_seed: int):
  """(first-call seconds, total seconds) of training the seeds one after another: the loop's own
  body for ONE seed (`fns.chunk` of a one-seed config, no mesh: its batch sampling, packing
  bucket switch, `loss_and_grads` and `apply_gradients`), called once per step."""
  one = config.copy_and_resolve_references()
  one.num_seeds = 1
  host, capacities = train_layout(one, split, 1)
  fns = train_fns(one, vocab_size, capacities)
  data = jax.device_put(host)
  states = [fns.init(keys[s:s + 1]) for s in range(len(keys))]
  steps = [jnp.asarray(t, jnp.int32) for t in range(steps_per_seed + 1)]
  jax.block_until_ready((states, data, steps))
  t0 = time.perf_counter()
  states[0] = fns.chunk(states[0], data, steps[0], 1)
  jax.block_until_ready(states[0])
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  for s in range(len(keys)):  # seed after seed, one dispatch per step
    state = states[s]
    for t in range(1, steps_per_seed + 1):
      state = fns.chunk(state, data, steps[t], 1)
    jax.block_until_ready(state)
    states[s] = None
  return first, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# Where a step's time goes (one seed, padded batch).


# The whole step in the breakdown: the loop's own body, one seed, one step per call.
ONE_STEP = "fns.chunk, 1 seed, 1 step (the whole step)"


def breakdown(config, vocab_size: int, split, repeats: int = 3) -> list[tuple[str, float]]:
  """[(part, seconds)] of one seed's step: forward with/without dropout, backward, optimizer, and
  the loop's own body (`fns.chunk` for one seed: vmap + scan) for one step and per step of a
  4-step call."""
  import optax  # pylint: disable=import-outside-toplevel
  fns, state = one_seed_state(config, vocab_size)
  model, tx = fns.model, fns.tx
  idx = np.random.default_rng(0).choice(len(split), int(config.train.batch_size), replace=False)
  x, y = jnp.asarray(split.inputs[idx]), jnp.asarray(split.targets[idx])
  key = jax.random.key(1)
  lm_loss = lambda p, k: step_lib.total_loss(p, model, fns.objective, (), (), x, y, k)[0]
  grads = jax.jit(jax.grad(lm_loss))(state.params, None)
  parts = [
      ("forward, no dropout", lambda p: model.apply({"params": p}, x, deterministic=True),
       (state.params,)),
      ("forward, dropout", lambda p: model.apply({"params": p}, x, deterministic=False,
                                                 rngs={"dropout": key}), (state.params,)),
      ("forward+backward, no dropout",
       lambda p: jax.value_and_grad(lm_loss)(p, None), (state.params,)),
      ("forward+backward, dropout",
       lambda p: jax.value_and_grad(lm_loss)(p, key), (state.params,)),
      ("optimizer (clip + AdamW)",
       lambda g, o, p: optax.apply_updates(p, tx.update(g, o, p)[0]),
       (grads, state.opt_state, state.params)),
  ]
  scan_steps = 4
  host, _ = train_layout(config, split, 1)
  data = jax.device_put(host)
  stacked = lambda: fns.init(seed_keys([0]))  # each part its own: chunk donates it
  parts += [
      (ONE_STEP, lambda s: fns.chunk(s, data, jnp.asarray(3, jnp.int32), 1), (stacked(),)),
      ("fns.chunk, 1 seed (vmap + scan), per step of 4",
       lambda s: fns.chunk(s, data, jnp.asarray(0, jnp.int32), scan_steps), (stacked(),)),
  ]
  out = []
  for name, fn, fn_args in parts:
    per_call = scan_steps if "per step" in name else 1
    fn = fn if name.startswith("fns.chunk") else jax.jit(fn)
    if name.startswith("fns.chunk"):  # donates its state: feed the output back in
      holder = list(fn_args)
      run = lambda: holder.__setitem__(0, fn(*holder)) or holder[0]
    else:
      run = lambda: fn(*fn_args)
    jax.block_until_ready(run())
    best = float("inf")
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(run())
      best = min(best, (time.perf_counter() - t0) / per_call)
    out.append((name, best))
  return out


# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="small run (< 1 minute on a 2-core CPU): depth 2, seeds 1,2, "
                           "d_model 128 / 4 heads / d_ff 512, few steps")
  parser.add_argument("--depths", type=_ints, default=None, help="default 2,6,10 (quick: 2)")
  parser.add_argument("--seeds", type=_ints, default=None,
                      help="seed counts, default 1,2,4,8,16 (quick: 1,2)")
  parser.add_argument("--packing", choices=("auto", "off", "on", "both"), default="auto",
                      help="layouts to time; auto = both (quick: on, the default layout; "
                           "the padded padding fraction is printed anyway)")
  parser.add_argument("--steps_per_call", type=int, default=None,
                      help="steps per compiled call (default: the config's 100 on accelerators; "
                           "16 on CPU, where one depth-6 step of 8 seeds takes over a second; "
                           "quick: 5). Fewer steps per call measure slower per step: each call "
                           "page-faults its temporary buffers afresh")
  parser.add_argument("--min_time", type=float, default=None,
                      help="timed seconds per measurement, after the compile call (default 10 "
                           "on accelerators, 20 on CPU; quick: 1)")
  parser.add_argument("--min_calls", type=int, default=None,
                      help="timed calls per measurement (default 3; quick: 2)")
  parser.add_argument("--seq_steps", type=int, default=None,
                      help="timed steps per seed of the sequential baseline (default: "
                           "steps_per_call)")
  parser.add_argument("--num_devices", type=_ints, default=[0],
                      help="device counts to shard the seeds over, as the config's num_devices "
                           "(0 = all, the default; each is rounded down to a divisor of the "
                           "seed count), e.g. 2,4 on a 2-core CPU (4 host devices by default; "
                           "XLA_FLAGS=--xla_force_host_platform_device_count=8 for more)")
  parser.add_argument("--no_sequential", action="store_true", help="skip the sequential baseline")
  parser.add_argument("--num_train", type=int, default=None,
                      help="generated training lines (default 5000; quick: 2000)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                      help="model compute dtype (and of the matmul-peak measurement)")
  parser.add_argument("--layer_impl", type=layer_impls, default=None, dest="layer_impls",
                      help="layer sets to time (model.layer_impl): tuned, plain, a comma list "
                           "or both; default what auto picks on this backend (CPU: tuned)")
  parser.add_argument("--matmul_precision", choices=tuple(layers.MATMUL_PRECISIONS),
                      default="default", help="model.matmul_precision of every matmul (and of "
                                              "the peak measurement)")
  parser.add_argument("--peak_size", type=int, default=None,
                      help="matrix size of the peak measurement (default 8192 on GPU/TPU, "
                           "2048 on CPU; quick: 1024)")
  parser.add_argument("--breakdown", action="store_true",
                      help="also time the parts of one seed's step (forward, dropout, backward, "
                           "optimizer) and the step's matmuls alone (at each seed count) at "
                           "each depth, and print the MFU ceilings that these times set")
  args = parser.parse_args(argv)
  cpu = jax.default_backend() == "cpu"
  if args.depths is None:
    args.depths = [2] if args.quick else [2, 6, 10]
  if args.seeds is None:
    args.seeds = [1, 2] if args.quick else [1, 2, 4, 8, 16]
  if args.layer_impls is None:
    args.layer_impls = layer_impls("auto")
  if args.steps_per_call is None:
    args.steps_per_call = 5 if args.quick else (16 if cpu else 100)
  if args.min_time is None:
    args.min_time = 1.0 if args.quick else (20.0 if cpu else 10.0)
  if args.min_calls is None:
    args.min_calls = 2 if args.quick else 3
  if args.seq_steps is None:
    args.seq_steps = args.steps_per_call
  if args.num_train is None:
    args.num_train = 2000 if args.quick else 5000
  if args.peak_size is None:
    args.peak_size = 1024 if args.quick else (2048 if cpu else 8192)
  if args.packing == "auto":
    layouts = [True] if args.quick else [False, True]
  else:
    layouts = {"off": [False], "on": [True], "both": [False, True]}[args.packing]
  args.layouts = layouts
  return args


def main(argv=None):
  args = parse_args(argv)
  t_start = time.perf_counter()
  vocab, split = question_split(args.num_train)
  lengths, padded_length = np.asarray(split.lengths), int(split.inputs.shape[1])
  base = make_config(args.depths[0], 1, args, False)
  m = base.model
  model_desc = (f"d_model {m.d_model}, {m.num_heads} heads, d_ff {m.d_ff}, dropout "
                f"{m.dropout}, vocab {vocab.size}, {args.dtype}, matmul precision "
                f"{args.matmul_precision}, layers {'/'.join(args.layer_impls)}"
                + ("  [--quick: SMALLER than the reference 512/8/2048]" if args.quick else
                   " (reference size)"))
  print_rows("training throughput", machine_rows() + [
      ("model", model_desc),
      ("training", f"batch {base.train.batch_size} lines per seed and step, AdamW + clip "
                   f"{base.optim.grad_clip_norm}; {args.steps_per_call} steps per compiled "
                   f"call; compile call excluded, >= {args.min_calls} calls and "
                   f">= {args.min_time:g} s timed, median call"),
      ("data", f"{len(split)} generated question-formation train lines, length (words + EOS) "
               f"mean {lengths.mean():.2f}, min {lengths.min()}, max {lengths.max()}; padded "
               f"length {padded_length}"),
      ("layouts", ", ".join("packed" if p else "padded" for p in args.layouts)),
      ("padding fraction", padding_summary(args, split)),
      ("FLOPs formula", "per seed-step on REAL tokens: 6*N*T + 12*depth*d_model*P; N = "
                        "depth*(4*d^2 + 2*d*d_ff) + d*vocab (matmul weights, no embedding "
                        "lookup/bias/LN), T = batch*mean(length), P = batch*mean(len*(len+1)/2) "
                        "causal query-key pairs"),
  ])

  peak_before = matmul_peak(args.peak_size, args.dtype, precision=args.matmul_precision)
  print(f"  matmul peak (start)  {peak_before / 1e9:.1f} GFLOP/s ({args.peak_size}^2 "
        f"{args.dtype} jnp.dot, best of 5)")

  optimizer_s = {}  # depth -> one seed's optimiser time (--breakdown)
  alone = {}  # (depth, seeds) -> step_matmuls(...) | time_matmuls(...) (--breakdown)
  if args.breakdown:
    for depth in args.depths:
      config = make_config(depth, 1, args, False)
      parts = breakdown(config, vocab.size, split)
      total = dict(parts)[ONE_STEP]
      print(f"\n  where one seed's step goes (depth {depth}, padded batch, best of 3, jit each):")
      print_table(["part", "ms", "% of one step"],
                  [[n, f"{s * 1e3:.1f}", f"{100 * s / total:.0f}"] for n, s in parts])
      optimizer_s[depth] = dict(parts)["optimizer (clip + AdamW)"]
      listed = step_matmuls(make_config(depth, 1, args, True), vocab.size, split)
      for num_seeds in args.seeds:
        alone[(depth, num_seeds)] = {**listed, **time_matmuls(listed["dots"], num_seeds,
                                                              args.num_devices[0])}
      print(f"\n  the matmuls of a packed step alone (depth {depth}; one batch of "
            f"{base.train.batch_size} lines, {listed['tokens']} tokens, packed without "
            "padding; every dot_general of forward+backward, one after another, seeds vmapped "
            "and sharded over the training mesh; best of 5):")
      print_table(["seeds", "dev", "dots", "GFLOP", "ms per seed-step", "GFLOP/s"],
                  [[n, a["devices"], len(a["dots"]), f"{a['dot_flops'] / 1e9:.2f}",
                    f"{a['seconds'] * 1e3:.1f}", f"{a['dot_flops'] / a['seconds'] / 1e9:.0f}"]
                   for (d, n), a in alone.items() if d == depth])

  header = ["depth", "seeds", "dev", "layout", "layers", "pad %", "compile s", "1st call s",
            "seed-steps/s", "tokens/s", "GFLOP/s", "MFU %", "spread %", "seq seed-steps/s",
            "seq MFU %", "vmap/seq"]
  print("\n  per configuration (tokens = real tokens; MFU = model FLOPs on real tokens / start "
        "peak, the summary uses the larger of start and end peaks; "
        "spread = (max-min)/median call time; seq = per-step jit, seeds one after another)")
  live_widths = [max(len(h), 6) for h in header]
  print_table(header, [], live_widths)
  rows, results = [], {}
  for depth in args.depths:
    flops = model_flops_per_seed_step(make_config(depth, 1, args, False), vocab.size, lengths)
    print(f"  depth {depth}: {flops['matmul_params'] / 1e6:.2f} M matmul params, "
          f"{flops['tokens']:.1f} real tokens and {flops['total'] / 1e9:.3f} GFLOP "
          f"({flops['attention'] / flops['total']:.1%} attention) per seed-step")
    for num_seeds in args.seeds:
      keys = seed_keys(list(range(num_seeds)))
      for packing, impl in [(p, i) for p in args.layouts for i in args.layer_impls]:
        config = make_config(depth, num_seeds, args, packing, impl)
        seq, device_counts = None, []
        for max_devices in args.num_devices:
          mesh = sharding.seed_mesh(num_seeds, max_devices)
          if mesh.devices.size in device_counts:  # same layout as an earlier entry
            continue
          device_counts.append(mesh.devices.size)
          host, caps = train_layout(config, split, per_device(num_seeds, max_devices))
          fns = train_fns(config, vocab.size, caps, mesh)
          pad = padding_fraction(config, lengths, num_seeds, padded_length, max_devices)
          with compile_cache.CompileWatch() as watch:  # XLA compile seconds of the first calls
            first, calls = time_vmapped(fns, host, keys, mesh, args.steps_per_call,
                                        args.min_time, args.min_calls)
          compile_s = sum(c.seconds for c in watch.compilations)
          med = float(np.median(calls))
          rate = args.steps_per_call * num_seeds / med
          gflops = rate * flops["total"] / 1e9
          if seq is None and not args.no_sequential:  # once per layout: it uses one device
            _, seq_total = time_sequential(config, vocab.size, split, keys, args.seq_steps)
            seq = args.seq_steps * num_seeds / seq_total
          results[(depth, num_seeds, packing, mesh.devices.size, impl)] = {
              "rate": rate, "seq": seq, "pad": pad, "gflops": gflops}
          row = [depth, num_seeds, mesh.devices.size, "packed" if packing else "padded", impl,
                 f"{100 * pad:.1f}", f"{compile_s:.1f}", f"{first:.1f}", f"{rate:.3f}",
                 f"{rate * flops['tokens']:.0f}", f"{gflops:.1f}",
                 f"{100 * gflops * 1e9 / peak_before:.1f}",
                 f"{100 * (max(calls) - min(calls)) / med:.0f}",
                 "-" if seq is None else f"{seq:.3f}",
                 "-" if seq is None else f"{100 * seq * flops['total'] / peak_before:.1f}",
                 "-" if seq is None else f"{rate / seq:.2f}"]
          rows.append((row, gflops, seq, flops))
          print(table_line(row, live_widths))
          sys.stdout.flush()
          del fns

  peak_after = matmul_peak(args.peak_size, args.dtype, precision=args.matmul_precision)
  peak = max(peak_before, peak_after)
  final = []
  for row, gflops, seq, flops in rows:
    row = list(row)
    row[header.index("MFU %")] = f"{100 * gflops * 1e9 / peak:.1f}"
    if seq is not None:
      row[header.index("seq MFU %")] = f"{100 * seq * flops['total'] / peak:.1f}"
    final.append(row)
  print_rows("summary", [
      ("matmul peak", f"{peak / 1e9:.1f} GFLOP/s (start {peak_before / 1e9:.1f}, end "
                      f"{peak_after / 1e9:.1f}; MFU below uses the larger)"),
      ("load average at end", load_average()),
      ("wall time", f"{time.perf_counter() - t_start:.0f} s"),
  ])
  print_table(header, final)
  for depth, opt in optimizer_s.items():
    ideal = model_flops_per_seed_step(make_config(depth, 1, args, False), vocab.size,
                                      lengths)["total"] / peak
    print(f"  MFU ceiling set by the optimiser at depth {depth}: a seed-step's model FLOPs take "
          f"{ideal * 1e3:.1f} ms at the matmul peak; with the optimiser's {opt * 1e3:.1f} ms on "
          f"top, MFU <= {100 * ideal / (ideal + opt):.0f}% even if every matmul ran at the peak "
          f"and nothing else (padding, dropout, LayerNorm, softmax, loss) took time")
    for (d, num_seeds), a in alone.items():
      if d != depth:
        continue
      at_peak = a["model_flops"] / peak
      print(f"  MFU ceiling set by the matmuls themselves, depth {depth}, {num_seeds} seed(s) on "
            f"{a['devices']} device(s): the model FLOPs of the batch of {a['tokens']} tokens "
            f"take {at_peak * 1e3:.1f} ms at "
            f"the peak, its matmuls alone {a['seconds'] * 1e3:.1f} ms ("
            f"{100 * a['dot_flops'] / a['seconds'] / peak:.0f}% of the peak) -> MFU <= "
            f"{100 * at_peak / a['seconds']:.0f}% with nothing else in the step, <= "
            f"{100 * at_peak / (a['seconds'] + opt):.0f}% with the optimiser")
  print_targets(args, results, peak)
  return results


def print_targets(args, results, peak: float) -> None:
  """Prints the performance targets this run's grid covers (MFU at depth 6, vmapped against
  sequential seeds, scaling from 1 to 16 seeds, padding left by packing), each marked ok or
  MISSED."""
  lines = []
  best_layout = lambda d, s: max((r for (dd, ss, *_), r in results.items() if (dd, ss) == (d, s)),
                                 key=lambda r: r["rate"], default=None)
  for (d, s, packing, devices, impl), r in sorted(results.items()):
    if d == 6 and s in (4, 8):
      mfu = r["gflops"] * 1e9 / peak
      lines.append((f"depth 6, {s} seeds on {devices} device(s), "
                    f"{'packed' if packing else 'padded'}, {impl} layers: MFU >= 75%",
                    f"{100 * mfu:.1f}% {'ok' if mfu >= 0.75 else 'MISSED'}"))
  for d in args.depths:
    r = best_layout(d, 8)
    # Fastest vmapped layout against the fastest sequential layout: on CPU the sequential
    # baseline is faster padded than packed, so comparing within one layout would flatter vmap.
    seq = max((q["seq"] or 0.0 for (dd, ss, *_), q in results.items() if (dd, ss) == (d, 8)),
              default=0.0)
    if r is not None and seq:
      need, ratio = (1.15 if d == 2 else 1.0), r["rate"] / seq
      lines.append((f"depth {d}, 8 seeds: fastest vmapped / fastest sequential >= {need}",
                    f"{ratio:.2f} {'ok' if ratio >= need else 'MISSED'}"))
    r1, r16 = best_layout(d, 1), best_layout(d, 16)
    if r1 and r16:
      lines.append((f"depth {d}: seed-steps/s at 16 seeds / at 1 (GPU target >= 10)",
                    f"{r16['rate'] / r1['rate']:.1f}"))
  pads = [r["pad"] for (_, _, p, *_), r in results.items() if p]
  if pads:
    lines.append(("padding with packing <= 10%", f"max {100 * max(pads):.1f}% "
                                                 f"{'ok' if max(pads) <= 0.10 else 'MISSED'}"))
  if lines:
    print_rows("performance targets covered by this run (docs/performance.md)", lines)
  else:
    print("\n  performance targets: none covered by this grid (they need depth 6 with 4/8 seeds, "
          "8 seeds at depth 2 or 6, or a packed layout; --quick covers none)")


if __name__ == "__main__":
  main()
