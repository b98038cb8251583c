"""Cost of the tree regulariser (TreeReg, `sg_jax/terms/tree.py`): training-step time with and
without the term, in the same process, interleaved (docs/tree_regularisation.md, "Cost").

Plain script (prints tables; not a unit test):
  python benchmarks/tree_term_cost.py                        # grok_cpu size, 4 seeds, ~3 min
  python benchmarks/tree_term_cost.py --num_seeds=16 --rounds=4
  python benchmarks/tree_term_cost.py --with_sas             # also SAS alone and SAS + tree

Model and recipe: the `grok_cpu` preset of configs/question.py (6 layers, d_model 128, 4 heads,
feed-forward 512, batch 8 lines per seed and step, AdamW + clipping, packed rows as the preset
trains) with `--num_seeds` seeds; data: `--num_train` generated question-formation lines,
encoded and laid out as `sg_jax.train` does (`input_pipeline.make_train_data`, the term's gold
nodes from `terms.train_arrays`). Each variant is the production path:
`step.train_fns_from_config(config, ...).chunk` sharded over `sharding.seed_mesh`, one compiled
`lax.scan` of `--steps_per_call` steps per call. The variants differ only in the config's
`tree.lambdas` (`--lam`, 0 = the term is not built) and, with `--with_sas`, `sas.lambdas`.

Timing: each variant's first call (compilation) is excluded. Then `--rounds` rounds, each timing
one call of every variant, the order reversed every other round (ABBA), so a change in the
machine's load hits the variants alike. Reported per variant: the median seconds per step over
the rounds, the ratio of each variant's median to the plain one's, and the median and range of
the paired ratios (each round's call against the plain call of the same round).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import time

from common import load_average, machine_rows, print_rows, print_table, train_layout

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from sg_jax import configlib, tasks, terms  # noqa: E402
from sg_jax.runtime import sharding  # noqa: E402
from sg_jax import step as step_lib  # noqa: E402
from sg_jax.training.state import seed_keys  # noqa: E402


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def grok_cpu_config(num_seeds: int, num_train: int, steps_per_call: int):
  """The grok_cpu preset of configs/question.py with the benchmark's seeds, lines and call size."""
  spec = importlib.util.spec_from_file_location(
      "question_config", os.path.join(_REPO, "configs", "question.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("grok_cpu")
  config.num_seeds = num_seeds
  config.data.num_train = num_train
  config.train.steps_per_call = steps_per_call
  return config


def variants(base, args) -> dict:
  """{name: config} of the timed variants."""
  out = {"plain": base}
  tree_cfg = copy.deepcopy(base)
  configlib.set_field(tree_cfg, "tree.lambdas", (args.lam,))
  configlib.set_field(tree_cfg, "tree.layer", args.layer)
  configlib.set_field(tree_cfg, "tree.dims", args.dims)
  out["tree"] = tree_cfg
  if args.with_sas:
    sas_cfg = copy.deepcopy(base)
    configlib.set_field(sas_cfg, "sas.lambdas", (0.01,))
    both = copy.deepcopy(tree_cfg)
    configlib.set_field(both, "sas.lambdas", (0.01,))
    out.update({"sas": sas_cfg, "sas+tree": both})
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_seeds", type=int, default=4, help="seeds (grok_cpu: 4)")
  parser.add_argument("--num_train", type=int, default=5000, help="generated training lines")
  parser.add_argument("--steps_per_call", type=int, default=50, help="steps per compiled call")
  parser.add_argument("--rounds", type=int, default=6, help="timed calls per variant")
  parser.add_argument("--lam", type=float, default=0.1, help="tree.lambdas of the tree variant")
  parser.add_argument("--layer", type=int, default=-1, help="tree.layer")
  parser.add_argument("--dims", type=float, default=0.25, help="tree.dims")
  parser.add_argument("--with_sas", action="store_true", help="also time SAS and SAS + tree")
  args = parser.parse_args()

  base = grok_cpu_config(args.num_seeds, args.num_train, args.steps_per_call)
  configs = variants(base, args)
  print_rows("machine", machine_rows())
  task = tasks.get_task("question")
  vocab = task.vocab()
  examples = task.generate_examples(seed=0, sizes={"train": args.num_train, "dev": 10,
                                                   "test": 10, "gen": 10})["train"]
  split = task.encode(examples, vocab)
  mesh = sharding.seed_mesh(args.num_seeds, int(base.num_devices))
  per_device = args.num_seeds // mesh.devices.size
  host_data, capacities = train_layout(base, split, per_device)
  keys = seed_keys(list(range(args.num_seeds)))
  print_rows("setup", [
      ("model", f"{base.model.num_layers} layers, d_model {base.model.d_model}, "
                f"{base.model.num_heads} heads, d_ff {base.model.d_ff} (grok_cpu)"),
      ("seeds / devices", f"{args.num_seeds} / {mesh.devices.size}"),
      ("batch", f"{base.train.batch_size} lines per seed and step; packing "
                f"{'on, capacities ' + str(capacities) if capacities else 'off'}"),
      ("tree term", f"lambda {args.lam}, layer {args.layer}, dims {args.dims}"),
      ("steps per call / rounds", f"{args.steps_per_call} / {args.rounds}")])

  runs = {}
  for name, config in configs.items():
    data = dict(host_data)
    data.update(terms.train_arrays(terms.active(config), terms.schedules_from_config(config),
                                   task, examples, host_data["inputs"].shape[1],
                                   num_lines=host_data["inputs"].shape[0]))
    fns = step_lib.train_fns_from_config(config, vocab.size, capacities, mesh)
    dev_data = sharding.put_replicated(data, mesh)
    state = jax.jit(fns.init, out_shardings=sharding.seed_sharding(mesh))(
        sharding.put_replicated(np.asarray(keys), mesh))
    t0 = time.perf_counter()
    state = jax.block_until_ready(fns.chunk(state, dev_data, jnp.asarray(0, jnp.int32),
                                            args.steps_per_call))
    runs[name] = {"fns": fns, "data": dev_data, "state": state, "start": args.steps_per_call,
                  "first": time.perf_counter() - t0, "calls": []}

  names = list(runs)
  for r in range(args.rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      run = runs[name]
      t0 = time.perf_counter()
      run["state"] = jax.block_until_ready(run["fns"].chunk(
          run["state"], run["data"], jnp.asarray(run["start"], jnp.int32), args.steps_per_call))
      run["calls"].append((time.perf_counter() - t0) / args.steps_per_call)
      run["start"] += args.steps_per_call

  plain = np.asarray(runs["plain"]["calls"])
  rows = []
  for name, run in runs.items():
    per_step = np.asarray(run["calls"])
    ratios = per_step / plain
    rows.append([name, f"{run['first']:.1f}", f"{1e3 * np.median(per_step):.2f}",
                 f"{np.median(per_step) / np.median(plain):.3f}", f"{np.median(ratios):.3f}",
                 f"{ratios.min():.3f}-{ratios.max():.3f}"])
  print("\nstep time (all seeds together), median over the rounds")
  print_table(["variant", "1st call s", "ms/step", "ratio of medians", "median paired ratio",
               "paired ratios (range)"], rows)
  print(f"\nload average at the end: {load_average()} (1/5/15 min)")


if __name__ == "__main__":
  main()
