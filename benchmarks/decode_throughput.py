"""Tense evaluation: the KV-cached greedy decoder against the full-forward one (README).

Plain script (prints tables; not a unit test):
  python benchmarks/decode_throughput.py                  # reference size, depth 8, 1 and 10 seeds
  python benchmarks/decode_throughput.py --quick          # small model, a couple of minutes
  python benchmarks/decode_throughput.py --seeds=10 --max_lines=500 --old_lines=60

Model: configs/tense.py at `--depth` (default 8: the design card's
`--config=configs/tense.py:depth=8`; d_model 512, 8 heads, feed-forward 2048, float32), with
each seed's parameters at initialisation (the decoders' cost does not depend on the values:
every line decodes the split's longest target whatever it emits). `--quick` shrinks the model
(d_model 128, 4 heads, d_ff 512; the output says so). Data: the tense dev (in_domain) and gen
(out_of_domain) splits generated in memory by `sg_jax.tasks` at their default sizes (1,000 and
10,000 lines, data seed 0) and encoded as training encodes them (padded to the split's longest
line).

Measured, per seed count and split, through the production path: `evaluator.make_eval_fn` (the
teacher-forced loss and the tense metric, seeds vmapped and sharded over `sharding.seed_mesh`
as in training, one jitted call per batch), with `eval.kv_cache` True (new) and False (old):
* new: the first `--max_lines` lines of the split (default: configs/tense.py's
  `eval.max_lines`, 2,000, so the dev split's 1,000 and 2,000 gen lines: exactly the
  evaluation the design-card command runs at step 0 and every `eval.every` steps), in batches
  of `eval.batch_size` (250);
* old: the first `--old_lines` lines in batches of `--old_batch` (the old decoder at 10 seeds
  on 2,000 lines takes hours on a 2-core CPU). Its time for `--max_lines` lines is
  EXTRAPOLATED from its per-line time.
Every batch is timed (`make_eval_fn`'s batch_callback, each batch waited for). The first batch of
a split includes compilation; the per-line time is that of the later batches (all seeds
together, per computed line: a last partial batch computes its padding lines too), so each
decoder needs at least two batches per split. The split's time = the measured wall time for the
new decoder, and for the old decoder its first batch + per-line time x the other lines the new
decoder computes. The ratio old/new compares per-line times measured in the same run.
`--check_tokens` (on by default) also decodes the old decoder's lines with both decoders for
seed 0 and reports whether every token agrees.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402,F401  (first: 2 x cores CPU devices before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from sg_jax.evaluation import decoding, evaluator  # noqa: E402
from sg_jax.data import input_pipeline  # noqa: E402
from sg_jax import objectives, tasks  # noqa: E402
from sg_jax.runtime import sharding  # noqa: E402
from sg_jax import train  # noqa: E402
from sg_jax.models import transformer as model_lib  # noqa: E402
from sg_jax import step as step_lib  # noqa: E402

from common import (_QUICK_MODEL, _REPO, _ints, load_average, machine_rows,  # noqa: E402
                    print_rows, print_table)

SPLITS = ("in_domain", "out_of_domain")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--depth", type=int, default=8, help="model depth (the design card: 8)")
  p.add_argument("--seeds", type=_ints, default=[1, 10], help="seed counts, e.g. 1,10")
  p.add_argument("--max_lines", type=int, default=0,
                 help="lines per split for the new decoder (0 = configs/tense.py's "
                      "eval.max_lines, 2,000)")
  p.add_argument("--old_lines", type=int, default=60,
                 help="lines per split for the old decoder (at least 2 x --old_batch)")
  p.add_argument("--old_batch", type=int, default=30, help="the old decoder's batch size")
  p.add_argument("--num_devices", type=int, default=0,
                 help="devices the seeds are sharded over (0 = as training picks)")
  p.add_argument("--no_check_tokens", dest="check_tokens", action="store_false",
                 help="skip the token-by-token comparison of the two decoders")
  p.add_argument("--quick", action="store_true",
                 help="d_model 128, 4 heads, d_ff 512 (smaller than the reference)")
  args = p.parse_args(argv)
  if args.old_lines < 2 * args.old_batch or args.old_lines % args.old_batch:
    p.error(f"--old_lines ({args.old_lines}) must be a multiple of --old_batch "
            f"({args.old_batch}), at least 2 x: the first batch compiles and is not used for "
            "the rate")
  return args


def tense_config(depth: int, quick: bool):
  """configs/tense.py:depth=DEPTH (the design card at depth 8), shrunk by `--quick`."""
  spec = importlib.util.spec_from_file_location("tense_config",
                                                os.path.join(_REPO, "configs", "tense.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(f"depth={depth}")
  if quick:
    for field, value in _QUICK_MODEL.items():
      common.configlib.set_field(config, field, value)
  return config


def tense_splits(seed: int):
  """(vocab, {'in_domain': dev, 'out_of_domain': gen EncodedSplit}) at the default sizes."""
  task = tasks.get_task("tense")
  sizes = {**task.default_sizes, "train": 10, "test": 10}
  examples = task.generate_examples(seed=seed, sizes=sizes)
  vocab = task.vocab()
  return vocab, {"in_domain": task.encode(examples[task.in_domain_split], vocab),
                 "out_of_domain": task.encode(examples[task.out_of_domain_split], vocab)}


def seed_params(config, vocab_size: int, num_seeds: int, mesh):
  """Initial parameters [S, ...] of seeds 0..S-1, sharded over the seed mesh."""
  cfg = objectives.model_config_from_config(config, vocab_size)  # the run's model (its objective's)
  keys = jax.random.split(jax.random.key(0), num_seeds)
  return jax.jit(jax.vmap(lambda k: model_lib.init_params(cfg, k)),
                 out_shardings=sharding.seed_sharding(mesh))(keys)


def time_split(config, fns, vocab, params, split: str, encoded, lines: int, batch: int, mesh):
  """Times `evaluator.make_eval_fn` on the first `lines` lines of one split.

  Returns:
    {'first_s': first batch (with compilation), 'per_line_s': later batches' seconds per
     computed line (padding lines of a last partial batch are computed too), 'wall_s',
     'lines' (real lines), 'batch', 'accuracy': [S]}.
  """
  data = sharding.put_replicated(
      {split: input_pipeline.prepare_eval_batches(encoded, batch, lines)}, mesh)
  marks = []
  mark = lambda split, index, n: marks.append((time.perf_counter(), n))
  evaluate = evaluator.make_eval_fn(tasks.from_config(config), fns.model, vocab, data,
                                    kv_cache=config.eval.kv_cache, batch_callback=mark)
  start = time.perf_counter()
  result = sharding.to_host(evaluate(params))
  wall = time.perf_counter() - start
  times = np.diff([start] + [t for t, _ in marks])
  computed = data[split]["inputs"].shape[1]  # a batch's lines, padding lines included
  per_line = float(times[1:].sum() / (computed * (len(times) - 1)))
  return {"first_s": float(times[0]), "per_line_s": per_line, "wall_s": wall,
          "lines": int(sum(n for _, n in marks)), "batch": computed,
          "accuracy": np.asarray(result[split]["accuracy"])}


def extrapolated_split_s(first_s: float, per_line_s: float, timed_batch: int, lines: int,
                         eval_batch: int) -> float:
  """Seconds for `lines` lines in batches of `eval_batch`, from a run in batches of
  `timed_batch`: its first batch (compilation included) as measured, then `per_line_s` for
  every other line computed (whole batches: `prepare_eval_batches` pads the last one)."""
  batch = min(eval_batch, lines)
  computed = -(-lines // batch) * batch
  return first_s + per_line_s * (computed - timed_batch)


def tokens_agree(fns, params, encoded, lines: int) -> tuple[bool, int]:
  """Decodes the first `lines` lines for seed 0 with both decoders: (every token equal, lines)."""
  model = fns.model
  p0 = jax.tree_util.tree_map(lambda x: jnp.asarray(sharding.to_host(x)[0]), params)
  inputs = jnp.asarray(encoded.inputs[:lines])
  task_pos = jnp.asarray(encoded.task_pos[:lines])
  steps = int(np.max(encoded.lengths[:lines] - encoded.task_pos[:lines]))
  old = jax.jit(lambda p: decoding.greedy_decode(
      lambda t: model.apply({"params": p}, t), inputs, task_pos, steps))(p0)
  apply_cached = lambda p, t, pos, c: decoding.apply_cached(model, p, t, pos, c)
  init_cache = lambda p, b, n: decoding.init_cache(model, p, b, n)

  def new_decoder(p):  # as make_eval_fn runs it: the teacher-forced pass fills the cache
    b, n = inputs.shape
    prefilled = apply_cached(p, inputs, jnp.broadcast_to(jnp.arange(n), (b, n)),
                             init_cache(p, b, n))
    return decoding.greedy_decode_cached(
        lambda t, pos, c: apply_cached(p, t, pos, c), lambda b, n: init_cache(p, b, n), inputs,
        task_pos, steps, prefilled=prefilled)

  new = jax.jit(new_decoder)(p0)
  return bool(np.array_equal(np.asarray(old), np.asarray(new))), lines


def _s(seconds: float) -> str:
  return f"{seconds:.1f}" if seconds < 100 else f"{seconds:.0f}"


def main(argv=None):
  args = parse_args(argv)
  t_start = time.perf_counter()
  config = tense_config(args.depth, args.quick)
  max_lines = args.max_lines or int(config.eval.max_lines)
  batch = int(config.eval.batch_size)
  vocab, splits = tense_splits(int(config.data.seed))
  m = config.model
  shapes = ", ".join(
      f"{name} {min(max_lines, len(s))} of {len(s)} lines, padded length {s.inputs.shape[1]}, "
      f"{int(np.max(s.lengths[:max_lines] - s.task_pos[:max_lines]))} decoded tokens"
      for name, s in splits.items())
  print_rows("tense evaluation: KV-cached greedy decoding against the full-forward decoder",
             machine_rows() + [
      ("model", f"depth {m.num_layers}, d_model {m.d_model}, {m.num_heads} heads, d_ff "
                f"{m.d_ff}, vocab {vocab.size}, {m.dtype}"
                + ("  [--quick: SMALLER than the reference 512/8/2048]" if args.quick
                   else " (reference size: configs/tense.py:depth=%d)" % args.depth)),
      ("data", shapes),
      ("new (eval.kv_cache=True)", f"first {max_lines} lines per split, batches of {batch}"),
      ("old (eval.kv_cache=False)", f"first {args.old_lines} lines per split, batches of "
                                    f"{args.old_batch}; its {max_lines}-line time is "
                                    "EXTRAPOLATED from its per-line time"),
      ("timed", "evaluator.make_eval_fn per batch (loss + tense metric, seeds vmapped and "
                "sharded as in training); per-line time from the batches after the first "
                "(which compiles), all seeds together"),
  ])
  if args.check_tokens:
    fns = step_lib.train_fns_from_config(config, vocab.size)
    mesh = sharding.seed_mesh(1, 1)
    params = seed_params(config, vocab.size, 1, mesh)
    for name, s in splits.items():
      same, n = tokens_agree(fns, params, s, args.old_lines)
      print(f"  tokens of both decoders, seed 0, first {n} {name} lines: "
            + ("identical" if same else "DIFFERENT"))

  header = ["seeds", "devices", "split", "decoder", "lines timed", "first batch s",
            "ms/line", "split s", "old/new"]
  widths = [max(len(h), 6) for h in header]
  widths[2], widths[7] = len("out_of_domain"), len("1234 (extrap.)")
  print()
  print_table(header, [], widths)
  rows, totals = [], {}
  for num_seeds in args.seeds:
    config.num_seeds = num_seeds
    mesh = sharding.seed_mesh(num_seeds, args.num_devices)
    devices = mesh.devices.size
    fns = step_lib.train_fns_from_config(config, vocab.size, None, mesh)
    params = seed_params(config, vocab.size, num_seeds, mesh)
    for name, s in splits.items():
      n = min(max_lines, len(s))
      results = {}
      for decoder, kv_cache, lines, b in (("new", True, max_lines, batch),
                                          ("old", False, args.old_lines, args.old_batch)):
        config.eval.kv_cache = kv_cache
        r = time_split(config, fns, vocab, params, name, s, lines, b, mesh)
        if decoder == "new":
          r["split_s"] = r["wall_s"]
        else:
          r["split_s"] = extrapolated_split_s(r["first_s"], r["per_line_s"], r["batch"], n,
                                              batch)
        results[decoder] = r
        totals[(num_seeds, decoder)] = totals.get((num_seeds, decoder), 0.0) + r["split_s"]
        ratio = (f"{results['old']['per_line_s'] / results['new']['per_line_s']:.1f}x"
                 if decoder == "old" else "")
        rows.append([num_seeds, devices, name, decoder, r["lines"], _s(r["first_s"]),
                     f"{1e3 * r['per_line_s']:.1f}",
                     _s(r["split_s"]) + (" (extrap.)" if decoder == "old" else ""), ratio])
        print(common.table_line(rows[-1], widths))
        sys.stdout.flush()
  print_rows("summary", [("load average at end", load_average()),
                         ("wall time", f"{time.perf_counter() - t_start:.0f} s")])
  print_table(header, rows)
  print(f"\n  one evaluation ({' + '.join(SPLITS)}, {max_lines} lines max per split), "
        "as the design-card command runs at step 0 and every eval.every steps:")
  for num_seeds in args.seeds:
    new, old = totals[(num_seeds, "new")], totals[(num_seeds, "old")]
    print(f"    {num_seeds} seed(s): new {new / 60:.1f} min (measured), old {old / 60:.1f} min "
          f"(extrapolated), {old / new:.1f}x")
  return rows


if __name__ == "__main__":
  main()
