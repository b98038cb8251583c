"""Pruning throughput: every run vmapped in one program vs one run at a time (docs/pruning.md).

Plain script (prints tables; not a unit test):
  python benchmarks/prune_throughput.py                       # reference and grok_cpu, 1/8/32 runs
  python benchmarks/prune_throughput.py --models=grok_cpu --runs=1,8 --steps=5

Per model and number of runs R, on random-initialised parameters (the cost of a pruning step does
not depend on the weights) and random lines of `--length` tokens, B lines per step for each B of
`--batch_sizes` (16: `python -m sg_jax.prune`'s default; 8: the checkpoint-scan schedule):
* vmapped: `pruning.run.train_runs` (on one device; `python -m sg_jax.prune` runs the same
  program on each device's block of runs, `pruning.placement`): R runs as `--seeds` training
  seeds x R / seeds runs each, `--steps` steps in one `lax.scan` call;
* vmapped over devices: the same program on each device's block of runs
  (`pruning.placement.train_runs_fn`, what `python -m sg_jax.prune` runs; `--num_devices`, 0 =
  every local device; a CPU-only host is split into 2 x cores devices as for training);
* one at a time: the same per-run function jitted alone (`pruning.run.train_alone_jit`), called
  once per run, `--steps` steps per call.
Each compiles first (untimed); the figure is the best of `--repeats` timed calls, the three
variants called in turn, so that a slow spell of a shared machine falls on each alike.
Reported: run steps per second (runs x steps / seconds), the vmapped / one-at-a-time ratio at the
same R, and XLA's FLOP count per run step of each program (`cost_analysis` of a 1-step call; XLA
counts a loop body once, so the vmapped figure is of a one-seed program): the vmapped program
computes the frozen model's logits once per training seed instead of once per run, so its FLOP
ratio is the speed-up it would have at equal FLOP throughput; on a compute-bound CPU the measured
ratio stays near it.
Models: reference = docs/REFERENCE.md §1 (6 layers, d_model 512, 8 heads, d_ff 2048); grok_cpu
= configs/question.py's preset (6 layers, d_model 128, 4 heads, d_ff 512).
"""

from __future__ import annotations

import argparse
import time

import common  # noqa: F401  (puts the repository on sys.path; machine description)
import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM, init_params
from sg_jax.pruning import means as means_lib
from sg_jax.pruning import placement
from sg_jax.pruning import run

MODELS = {
    "reference": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048),
    "grok_cpu": dict(num_layers=6, d_model=128, num_heads=4, d_ff=512),
}
VOCAB = 60  # about the question-formation vocabulary


def _data(length: int, batch: int, num_batches: int = 4) -> dict:
  rng = np.random.default_rng(0)
  inputs = rng.integers(1, VOCAB, (batch * num_batches, length)).astype(np.int32)
  targets = np.roll(inputs, -1, 1)
  targets[:, -1] = 0
  return {"inputs": jnp.asarray(means_lib.batch_lines(inputs, batch)),
          "targets": jnp.asarray(means_lib.batch_lines(targets, batch))}


def _best_interleaved(fns: dict, repeats: int) -> dict:
  """Best of `repeats` timed calls of each function, called in turn (round-robin), so that a
  slow spell of a shared machine falls on every variant alike. Each is called once untimed
  first (compilation)."""
  for fn in fns.values():
    jax.block_until_ready(fn())
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - t0)
  return {name: min(t) for name, t in times.items()}


def _flops(lowered) -> float:
  """XLA's FLOP count of a lowered program (compiled here)."""
  cost = lowered.compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("flops", float("nan")))


def measure(name: str, num_runs: int, batch_size: int, args) -> tuple[float, float, float, float]:
  """(vmapped, one-at-a-time) run steps per second for `num_runs` runs of model `name`, then
  their FLOPs per run step."""
  config = run.pruning_model_config(ModelConfig(vocab_size=VOCAB, dropout=0.0,
                                                layer_impl=args.layer_impl, **MODELS[name]))
  seeds = min(args.seeds, num_runs)
  if num_runs % seeds:
    raise ValueError(f"--runs entries must be multiples of --seeds ({num_runs}, {seeds})")
  per_seed = num_runs // seeds
  params = [init_params(config, jax.random.key(s)) for s in range(seeds)]
  params_s = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *params)
  data = _data(args.length, batch_size)
  means = tuple(jnp.asarray(m) for m in means_lib.seed_means(
      TransformerLM(config), params_s, np.asarray(data["inputs"]).reshape(-1, args.length),
      batch_size))
  settings = run.Settings(num_steps=10 * args.steps, sparsity_warmup_steps=5 * args.steps,
                          lr_warmup_steps=args.steps)
  levels = np.linspace(0.2, 0.8, per_seed)
  keys = jnp.stack([jnp.stack([run.run_key(s, float(lv), 0) for lv in levels])
                    for s in range(seeds)])
  targets = jnp.asarray(np.tile(levels, (seeds, 1)), jnp.float32)
  states = run.init_runs(keys, config, settings)
  copy = lambda tree: jax.tree_util.tree_map(jnp.array, tree)  # train_runs donates its states

  def vmapped():
    return run.train_runs(copy(states), params_s, means, targets, data, num_steps=args.steps,
                          config=config, settings=settings)[0].lambdas

  alone_states = [[run.init_run(keys[s, k], config, settings) for k in range(per_seed)]
                  for s in range(seeds)]
  seed_means = [tuple(m[s] for m in means) for s in range(seeds)]

  def one_at_a_time():
    out = None
    for s in range(seeds):
      for k in range(per_seed):
        out = run.train_alone_jit(alone_states[s][k], params[s], seed_means[s],
                                  jnp.float32(levels[k]), data, num_steps=args.steps,
                                  config=config, settings=settings)[0].lambdas
        jax.block_until_ready(out)
    return out

  # XLA counts a loop body once (the loops over seeds and groups too): count one seed's program
  # with its runs in one group.
  one_seed = lambda tree: jax.tree_util.tree_map(lambda a: a[:1], tree)
  flops_vmapped = _flops(run.train_runs.lower(
      one_seed(states), one_seed(params_s), one_seed(means), targets[:1], data, num_steps=1,
      config=config, settings=settings, group=per_seed)) / per_seed
  flops_alone = _flops(run.train_alone_jit.lower(
      alone_states[0][0], params[0], seed_means[0], jnp.float32(levels[0]), data, num_steps=1,
      config=config, settings=settings))
  mesh = placement.run_mesh(seeds, per_seed, args.num_devices)
  p_params, (p_states, p_targets), p_data = placement.place(mesh, params_s, (states, targets),
                                                            data)
  p_means = placement.place(mesh, means, None)[0]
  sharded_fn = placement.train_runs_fn(mesh)

  def over_devices():
    return sharded_fn(copy(p_states), p_params, p_means, p_targets, p_data,
                      num_steps=args.steps, config=config, settings=settings)[0].lambdas

  t = _best_interleaved({"devices": over_devices, "vmapped": vmapped,
                         "alone": one_at_a_time}, args.repeats)
  t_devices, t_vmapped, t_alone = t["devices"], t["vmapped"], t["alone"]
  work = num_runs * args.steps
  return (work / t_vmapped, work / t_alone, flops_vmapped, flops_alone, work / t_devices,
          placement.describe(mesh, seeds, per_seed))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="reference,grok_cpu")
  parser.add_argument("--runs", type=common._ints, default=[1, 8, 32])  # pylint: disable=protected-access
  parser.add_argument("--seeds", type=int, default=4, help="training seeds of the vmapped runs")
  parser.add_argument("--steps", type=int, default=5, help="pruning steps per timed call")
  parser.add_argument("--length", type=int, default=24, help="tokens per line")
  parser.add_argument("--batch_sizes", type=common._ints, default=[16, 8],  # pylint: disable=protected-access
                      help="lines per pruning step")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--num_devices", type=int, default=0,
                      help="devices of the 'over devices' column (0: all local ones, as "
                      "sg_jax.prune; pruning.placement.run_mesh)")
  parser.add_argument("--layer_impl", default="auto", choices=["auto", "plain", "tuned"],
                      help="model.layer_impl of both programs (auto: what sg_jax.prune uses, "
                      "run.pruning_model_config)")
  args = parser.parse_args()
  common.print_rows("machine", common.machine_rows())
  rows = []
  for name in args.models.split(","):
    for batch_size in args.batch_sizes:
      for num_runs in args.runs:
        v, a, fv, fa, d, layout = measure(name, num_runs, batch_size, args)
        rows.append([name, str(batch_size), str(num_runs), f"{v:.1f}", f"{d:.1f}", f"{a:.1f}",
                     f"{v / a:.2f}", f"{d / a:.2f}", f"{fv / 1e9:.3f}", f"{fa / 1e9:.3f}",
                     f"{fa / fv:.2f}"])
        print(f"  {name}, {batch_size} lines x {num_runs} runs: vmapped {v:.1f} (one device), "
              f"{d:.1f} ({layout}), one at a time {a:.1f} run-steps/s; {fv / 1e9:.3f} / "
              f"{fa / 1e9:.3f} GFLOP per run step", flush=True)
  print()
  common.print_table(["model", "lines/step", "runs", "vmapped run-steps/s (1 device)",
                      "vmapped over devices", "one-at-a-time run-steps/s", "ratio (1 device)",
                      "ratio (devices)", "vmapped GFLOP/run-step",
                      "one-at-a-time GFLOP/run-step", "FLOP ratio"], rows)
  print(f"load average at the end: {common.load_average()}")


if __name__ == "__main__":
  main()
