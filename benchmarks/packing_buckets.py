"""Packing buckets: compile time against padding and speed, per bucket count (docs/performance.md).

Plain script (prints a table; not a unit test):
  python benchmarks/packing_buckets.py                       # quick size, depth 2, 4 seeds
  python benchmarks/packing_buckets.py --reference --depth=6 --seeds=4 --buckets=1,2,4,8

Each packed bucket compiles one more branch of the train step (`step_lib.make_chunk_fn`'s
`lax.switch`). For every bucket count k of `--buckets` the k capacities that compute the fewest
positions (`sg_jax.data.packing.optimal_capacities`, on the steps sampled by `sampled_needs`) are
timed with the production path (`step_lib.make_train_fns(...).chunk`, seeds sharded as
`sg_jax.main` shards them, `benchmarks/train_throughput.py`'s `time_vmapped`): the XLA compile
seconds of the first call (`sg_jax.runtime.compile_cache.CompileWatch`), the whole first call, and the
steady seed-steps/s (median call). The padded layout is timed first for comparison, and the
count `packing_capacities` picks with `train.packing_buckets` = the largest k is marked.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402,F401  (first: 2 x cores CPU devices before JAX starts)
import numpy as np  # noqa: E402

from common import _ints, load_average, machine_rows, make_config, print_rows, print_table  # noqa: E402
from sg_jax.runtime import compile_cache, sharding  # noqa: E402
from sg_jax.data import packing  # noqa: E402
from sg_jax import train  # noqa: E402
from sg_jax import step as step_lib  # noqa: E402
from sg_jax.data import input_pipeline  # noqa: E402
from sg_jax.training.state import seed_keys  # noqa: E402
from train_throughput import per_device, question_split, time_vmapped  # noqa: E402


def packed_padding(lengths: np.ndarray, capacities, batch: int, seeds_per_device: int,
                   num_steps: int = 2000) -> float:
  """Fraction of computed positions that are padding with `capacities` (as
  `packing.padding_fraction`: the seeds of one device share the bucket of the longest batch)."""
  rng = np.random.default_rng(1)
  totals = lengths[rng.integers(0, len(lengths), (num_steps, seeds_per_device, batch))].sum(-1)
  caps = np.asarray(capacities)
  chosen = caps[np.searchsorted(caps, totals.max(-1))]
  return float(1.0 - totals.sum() / (chosen.sum() * seeds_per_device))


def measure(config, vocab, split, capacities, num_seeds: int, args) -> dict:
  """Compile seconds, first-call seconds and steady seed-steps/s of one layout."""
  mesh = sharding.seed_mesh(num_seeds, 0)
  data_options = input_pipeline.DataOptions.from_config(config)
  host, _ = input_pipeline.make_train_data(data_options, split, per_device(num_seeds))
  fns = step_lib.train_fns_from_config(config, vocab.size, capacities, mesh)
  with compile_cache.CompileWatch() as watch:
    first, calls = time_vmapped(fns, host, seed_keys(list(range(num_seeds))), mesh,
                                args.steps_per_call, args.min_time, args.min_calls)
  return {"compile": sum(c.seconds for c in watch.compilations), "first": first,
          "rate": args.steps_per_call * num_seeds / float(np.median(calls))}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--reference", action="store_true",
                      help="reference size (d_model 512, 8 heads, d_ff 2048); default: the "
                           "quick preset's size (128, 4, 512)")
  parser.add_argument("--depth", type=int, default=2)
  parser.add_argument("--seeds", type=int, default=4)
  parser.add_argument("--buckets", type=_ints, default=[1, 2, 3, 4, 6, 8])
  parser.add_argument("--steps_per_call", type=int, default=10)
  parser.add_argument("--min_time", type=float, default=5.0)
  parser.add_argument("--min_calls", type=int, default=3)
  parser.add_argument("--num_train", type=int, default=5000)
  args = parser.parse_args(argv)
  args.quick, args.dtype = not args.reference, "float32"
  vocab, split = question_split(args.num_train)
  lengths, width = np.asarray(split.lengths), int(split.inputs.shape[1])
  batch = 8
  seeds_per_device = per_device(args.seeds)
  needs = packing.sampled_needs(lengths, batch, seeds_per_device)
  default = packing.packing_capacities(lengths, batch, seeds_per_device, width,
                                       max(args.buckets))
  print_rows("packing buckets: compile time against padding", machine_rows() + [
      ("model", f"depth {args.depth}, {'reference size' if args.reference else 'quick size'}"),
      ("run", f"{args.seeds} seeds ({seeds_per_device} per device), batch {batch}, "
              f"{args.steps_per_call} steps per call, >= {args.min_calls} calls and "
              f">= {args.min_time:g} s timed"),
      ("data", f"{len(lengths)} question-formation lines, mean length {lengths.mean():.2f}, "
               f"padded length {width}"),
      ("default", f"train.packing_buckets={max(args.buckets)} picks {len(default)} buckets "
                  f"{default} (tolerance {packing.BUCKET_TOLERANCE:.0%})"),
  ])
  header = ["layout", "buckets", "capacities", "pad %", "compile s", "1st call s",
            "seed-steps/s"]
  rows = []
  config = make_config(args.depth, args.seeds, args, False)
  r = measure(config, vocab, split, None, args.seeds, args)
  rows.append(["padded", "-", f"[{batch}, {width}]", f"{100 * (1 - lengths.mean() / width):.1f}",
               f"{r['compile']:.1f}", f"{r['first']:.1f}", f"{r['rate']:.2f}"])
  print("  " + "  ".join(rows[-1]))
  sys.stdout.flush()
  config = make_config(args.depth, args.seeds, args, True)
  for k in args.buckets:
    caps = packing.optimal_capacities(needs, default[-1], k)
    r = measure(config, vocab, split, caps, args.seeds, args)
    pad = packed_padding(lengths, caps, batch, seeds_per_device)
    rows.append(["packed", f"{len(caps)}{' *' if caps == default else ''}",
                 " ".join(map(str, caps)), f"{100 * pad:.1f}", f"{r['compile']:.1f}",
                 f"{r['first']:.1f}", f"{r['rate']:.2f}"])
    print("  " + "  ".join(rows[-1]))
    sys.stdout.flush()
  print_rows("summary", [("load average at end", load_average()),
                         ("pad %", "computed token positions that are padding (packed: "
                                   "the seeds of a device share a bucket)"),
                         ("compile s", "XLA compilation in the first calls (init and chunk)"),
                         ("*", "the buckets packing_capacities picks")])
  print_table(header, rows)


if __name__ == "__main__":
  t0 = time.perf_counter()
  main()
  print(f"  wall time {time.perf_counter() - t0:.0f} s")
