"""Speed of per-seed hyperparameters: every per-seed field with its own value per seed (the values
as data of the compiled step, `per_seed.as_data`) against one value each (compiled in).

Both runs train the same model on the same generated question-formation lines; after one warm-up
call each, they alternate `--pairs` times (the order flipping every pair), each call `--steps`
steps of all seeds, and the script prints each call's seed-steps/s and each pair's speed ratio
(per-seed / single). docs/usage.md "Per-seed hyperparameters and split seeds" quotes a result.

    python benchmarks/per_seed_hparams.py --pairs=12 --steps=50
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402  (after the path)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from sg_jax import configlib  # noqa: E402
from sg_jax.data import input_pipeline  # noqa: E402
from sg_jax.config import per_seed  # noqa: E402
from sg_jax import step as step_lib  # noqa: E402
from sg_jax import tasks  # noqa: E402
from sg_jax.training.state import seed_keys  # noqa: E402

# Four seeds, every per-seed field different (label smoothing on for two of them).
PER_SEED = {"optim.learning_rate": (1e-3, 2e-3, 1e-3, 3e-3),
            "optim.weight_decay": (0.0, 0.1, 0.3, 1.0),
            "optim.b1": (0.9, 0.85, 0.9, 0.8), "optim.b2": (0.999, 0.99, 0.999, 0.98),
            "optim.eps": (1e-7, 1e-8, 1e-7, 1e-6), "optim.grad_clip_norm": (1.0, 0.5, 0.0, 1.0),
            "optim.warmup_steps": (300, 100, 0, 300), "model.dropout": (0.1, 0.0, 0.2, 0.1),
            "model.init_scale": (1.0, 0.5, 2.0, 1.0),
            "train.label_smoothing": (0.0, 0.1, 0.0, 0.05)}


def _config(data_dir: str, num_train: int, per: bool):
  config = configlib.apply_config_string(configlib.base_config("question"), "quick",
                                         configlib.PRESETS)
  config.data.dir, config.data.num_train, config.train.packing = data_dir, num_train, True
  for field, value in (PER_SEED.items() if per else ()):
    configlib.set_field(config, field, value)
  return config


def main(argv=None) -> dict:
  """Runs the comparison; returns {'single': [s], 'per_seed': [s]} seconds per call."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", type=int, default=12)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--num_train", type=int, default=400)
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    tasks.get_task("question").generate(tmp, seed=0, num_train=args.num_train,
                                        sizes={"dev": 100, "test": 100, "gen": 100})
    runs = {}
    for name, per in (("single", False), ("per_seed", True)):
      config = _config(tmp, args.num_train, per)
      data_options = input_pipeline.DataOptions.from_config(config)
      _, vocab, splits = input_pipeline.load_data(data_options, tmp)
      host, capacities = input_pipeline.make_train_data(data_options, splits["train"], 4)
      fns = step_lib.train_fns_from_config(config, vocab.size, capacities)
      hp = per_seed.hparam_arrays(config)
      data = jax.tree_util.tree_map(jnp.asarray, host | {"hparams": hp})
      keys = seed_keys(list(range(4)))
      state = fns.init(keys, keys, hp["init_scale"])
      state = jax.block_until_ready(fns.chunk(state, data, jnp.asarray(0, jnp.int32),
                                              args.steps))  # compiles
      runs[name] = {"fns": fns, "data": data, "state": state, "times": []}
    for pair in range(args.pairs):
      for name in ("single", "per_seed") if pair % 2 == 0 else ("per_seed", "single"):
        run = runs[name]
        started = time.perf_counter()
        run["state"] = jax.block_until_ready(run["fns"].chunk(
            run["state"], run["data"], jnp.asarray((pair + 1) * args.steps, jnp.int32),
            args.steps))
        run["times"].append(time.perf_counter() - started)
  work = 4 * args.steps
  for name, run in runs.items():
    speeds = [work / t for t in run["times"]]
    print(f"{name}: seed-steps/s per call {np.round(speeds, 1).tolist()}, median "
          f"{work / np.median(run['times']):.1f}")
  ratio = np.asarray(runs["single"]["times"]) / np.asarray(runs["per_seed"]["times"])
  print(f"per-seed / single speed per pair: {np.round(ratio, 3).tolist()}; median "
        f"{np.median(ratio):.3f}, range {ratio.min():.3f}-{ratio.max():.3f}, "
        f"{int((ratio < 1).sum())} of {len(ratio)} below 1")
  return {name: run["times"] for name, run in runs.items()}


if __name__ == "__main__":
  main()
