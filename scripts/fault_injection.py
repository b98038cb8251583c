r"""Fault injection: random kill -9 / resume cycles on the tiny preset (3 seeds), compared with one
uninterrupted run.

  python scripts/fault_injection.py --cycles=20

Each cycle trains the same tiny multi-seed config in a fresh workdir and interrupts it at a
random moment, in one of three ways: SIGKILL after a random delay (anywhere in start-up,
compilation, training, evaluation or a checkpoint write); SIGKILL exactly while a randomly chosen
checkpoint is being written (`SG_JAX_FAULT_KILL_DURING_SAVE`); or a full disk from a randomly
chosen checkpoint on (`SG_JAX_FAULT_DISK_FULL_AT_SAVE`: the run must stop with exit code 1 and one
`error:` line, keeping the checkpoints before it). It then reruns the same command until the run
completes and checks that metrics.csv and the final parameters are identical (bit for bit) to the
uninterrupted run. Prints `cycles: N, identical: M` at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sg_jax import checkpointing  # pylint: disable=wrong-import-position
from sg_jax.records import metric_logging  # pylint: disable=wrong-import-position
from sg_jax import tasks  # pylint: disable=wrong-import-position


def command(data_dir: str, workdir: str, steps: int) -> list[str]:
  return [sys.executable, "-m", "sg_jax.main", "--config=configs/question.py:tiny,seeds=3",
          f"--workdir={workdir}", f"--config.data.dir={data_dir}",
          f"--config.train.num_steps={steps}", "--notensorboard"]


def fingerprint(workdir: str):
  rows = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  table = sorted((r["step"], r["seed"], r["name"], repr(r["value"])) for r in rows)
  params = checkpointing.restore(workdir).state["params"]
  flat = np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(params)])
  return table, flat


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cycles", type=int, default=20)
  parser.add_argument("--steps", type=int, default=120)
  parser.add_argument("--seed", type=int, default=0, help="seed of the random kill points")
  parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
  args = parser.parse_args()
  rng = random.Random(args.seed)
  tmp = tempfile.mkdtemp(prefix="sg_jax_faults_")
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_COMPILATION_CACHE_DIR=os.path.join(tmp, "cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  data_dir = os.path.join(tmp, "data")
  tasks.get_task("question").generate(data_dir, seed=0, num_train=400,
                                      sizes={"dev": 100, "test": 100, "gen": 100})
  reference = os.path.join(tmp, "reference")
  subprocess.run(command(data_dir, reference, args.steps), cwd=ROOT, env=env, check=True,
                 capture_output=True)
  # Time a second run with the compilation cache warm: the cycles' runs take about this long,
  # so random delays up to it interrupt them at any stage.
  t0 = time.time()
  subprocess.run(command(data_dir, os.path.join(tmp, "timing"), args.steps), cwd=ROOT, env=env,
                 check=True, capture_output=True)
  run_time = time.time() - t0
  print(f"uninterrupted run: {run_time:.1f}s", flush=True)
  ref_table, ref_params = fingerprint(reference)
  checkpoint_steps = list(range(20, args.steps, 20))
  identical = 0
  for cycle in range(args.cycles):
    workdir = os.path.join(tmp, f"cycle{cycle}")
    cmd = command(data_dir, workdir, args.steps)
    kind = rng.random()
    if kind < 0.4:
      step = rng.choice(checkpoint_steps)
      how = f"SIGKILL while writing checkpoint {step}"
      subprocess.run(cmd, cwd=ROOT, capture_output=True,
                     env=dict(env, **{checkpointing.KILL_DURING_SAVE_ENV: str(step)}))
    elif kind < 0.6:
      # Early checkpoints only: the injected limit (16 KiB per file) must stop the checkpoint's
      # files, not metrics.csv, which grows past it later in the run.
      step = rng.choice([s for s in checkpoint_steps if s <= 60])
      how = f"disk full at checkpoint {step}"
      proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                            env=dict(env, **{checkpointing.DISK_FULL_AT_SAVE_ENV: str(step)}))
      errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
      if proc.returncode != 1 or len(errors) != 1 or "Traceback" in proc.stderr:
        how += f" (UNEXPECTED: exit {proc.returncode}, {len(errors)} error lines)"
    else:
      delay = rng.uniform(0.2, 0.95) * run_time
      how = f"SIGKILL after {delay:.1f}s"
      proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
      try:
        proc.wait(timeout=delay)
      except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed_at = (checkpointing.all_steps(workdir) or [None])[-1]
    resumes = 0
    while (checkpointing.all_steps(workdir) or [0])[-1] < args.steps:
      subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
      resumes += 1
    table, params = fingerprint(workdir)
    same = (table == ref_table and np.array_equal(params, ref_params)
            and "UNEXPECTED" not in how)
    identical += same
    print(f"cycle {cycle + 1:2d}: {how:38s} last checkpoint {killed_at}, resumed {resumes}x: "
          f"{'identical' if same else 'DIFFERENT'}", flush=True)
  print(f"cycles: {args.cycles}, identical: {identical}")
  if not args.keep:
    import shutil  # pylint: disable=import-outside-toplevel
    shutil.rmtree(tmp, ignore_errors=True)
  return 0 if identical == args.cycles else 1


if __name__ == "__main__":
  sys.exit(main())
