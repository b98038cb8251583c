r"""bfloat16 against float32 on this machine (issue 53 item 6): the same run trained twice, with
`model.dtype=float32` and `model.dtype=bfloat16` (bfloat16 compute, float32 parameters and AdamW
state), and compared.

  python benchmarks/bf16_check.py                                  # the quick preset (2 x 3-8 min)
  python benchmarks/bf16_check.py --config=configs/question.py:tiny --loss_tol=0.2   # seconds

Prints, per seed, the final in-domain and out-of-domain accuracy of both runs; the seed-mean
training loss at every logged step of both, the largest absolute difference between them (over
the steps after the first `--skip_fraction` of training, where the loss falls fastest and a step
of delay reads as a large difference) and the loss at the end; the wall time of each run; and a
verdict against the stated tolerances: every seed's final in-domain accuracy within
`--acc_tol` of its float32 value and the seed-mean loss curve within `--loss_tol` (absolute,
nats per token) of float32's. Exit status 1 when a tolerance is broken.
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

import common  # noqa: E402  (benchmarks/common.py: machine description)
from sg_jax import train
from sg_jax.config.cli_options import parse_flags
from sg_jax.records import metric_logging

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/question.py:quick", "Config file with a config string.", lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", "", "Folder for the two runs (float32/, bfloat16/, "
                               "data/); '' = a temporary folder.")
_ACC_TOL = flags.DEFINE_float("acc_tol", 0.02, "Largest allowed |bf16 - f32| of a seed's final "
                              "in-domain accuracy.")
_LOSS_TOL = flags.DEFINE_float("loss_tol", 0.05, "Largest allowed |bf16 - f32| of the seed-mean "
                               "training loss at a logged step (nats per token).")
_SKIP = flags.DEFINE_float("skip_fraction", 0.1, "Leading fraction of training left out of the "
                           "loss comparison.")


def _curves(workdir: str) -> tuple[dict, dict]:
  """({step: seed-mean train/loss}, {(seed, name): final value of the accuracies})."""
  rows = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  losses: dict[int, list[float]] = {}
  for r in rows:
    if r["name"] == "train/loss":
      losses.setdefault(int(r["step"]), []).append(float(r["value"]))
  last = max(int(r["step"]) for r in rows)
  final = {(int(r["seed"]), r["name"]): float(r["value"]) for r in rows
           if int(r["step"]) == last and r["name"] in ("in_domain/accuracy",
                                                          "out_of_domain/accuracy")}
  return {s: float(np.mean(v)) for s, v in sorted(losses.items())}, final


def compare(root: str, config) -> bool:
  """Trains both runs under `root` and prints the comparison; True when within tolerance."""
  config.data.dir = config.data.dir or os.path.join(root, "data")
  results = {}
  for dtype in ("float32", "bfloat16"):
    run = config.copy_and_resolve_references()
    run.model.dtype = dtype
    started = time.perf_counter()
    train.train_and_evaluate(run, os.path.join(root, dtype), tensorboard=False)
    results[dtype] = (time.perf_counter() - started,) + _curves(os.path.join(root, dtype))
  (t32, loss32, final32), (t16, loss16, final16) = results["float32"], results["bfloat16"]
  print(f"config: {config.task}, {config.model.num_layers} layers, d_model "
        f"{config.model.d_model}, {config.num_seeds} seeds, {config.train.num_steps} steps")
  print(f"wall time (training, evaluations, compilation): float32 {t32:.0f} s, bfloat16 "
        f"{t16:.0f} s")
  print("seed | in_domain f32 | in_domain bf16 | out_of_domain f32 | out_of_domain bf16")
  worst_acc = 0.0
  for seed in sorted({s for s, _ in final32}):
    a32, a16 = final32[(seed, "in_domain/accuracy")], final16[(seed, "in_domain/accuracy")]
    o32, o16 = final32[(seed, "out_of_domain/accuracy")], final16[(seed, "out_of_domain/accuracy")]
    worst_acc = max(worst_acc, abs(a16 - a32))
    print(f"{seed} | {a32:.4f} | {a16:.4f} | {o32:.4f} | {o16:.4f}")
  first = _SKIP.value * config.train.num_steps
  steps = [s for s in loss32 if s in loss16 and s > first]
  diffs = np.array([loss16[s] - loss32[s] for s in steps])
  worst = int(np.argmax(np.abs(diffs)))
  print("step | loss f32 | loss bf16 (seed means)")
  for s in sorted(loss32):
    if s in loss16:
      print(f"{s} | {loss32[s]:.4f} | {loss16[s]:.4f}")
  print(f"loss curve after step {first:.0f}: largest |bf16 - f32| {abs(diffs[worst]):.4f} at step "
        f"{steps[worst]}, mean bf16 - f32 {diffs.mean():+.4f}; final loss f32 "
        f"{loss32[steps[-1]]:.4f}, bf16 {loss16[steps[-1]]:.4f}")
  ok = worst_acc <= _ACC_TOL.value and abs(diffs[worst]) <= _LOSS_TOL.value
  print(f"verdict: {'within' if ok else 'OUTSIDE'} tolerance (in-domain accuracy "
        f"{worst_acc:.4f} <= {_ACC_TOL.value}, loss {abs(diffs[worst]):.4f} <= "
        f"{_LOSS_TOL.value})")
  return ok


def main(argv):
  del argv
  for label, value in common.machine_rows():
    print(f"{label}: {value}")
  if _WORKDIR.value:
    ok = compare(_WORKDIR.value, _CONFIG.value)
  else:
    with tempfile.TemporaryDirectory(prefix="sg_jax_bf16_") as root:
      ok = compare(root, _CONFIG.value)
  sys.exit(0 if ok else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
