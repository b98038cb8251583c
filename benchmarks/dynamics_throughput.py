"""Time of the training-dynamics analysis (CKA, TVD, TwoNN) of a whole trajectory.

Plain script:
  python benchmarks/dynamics_throughput.py --workdir=runs/grok_cpu     # a trained run
  python benchmarks/dynamics_throughput.py                             # a random grok_cpu workdir
  python benchmarks/dynamics_throughput.py --workdir=/tmp/tiny -- --dynamics_lines=64

Runs `python -m sg_jax.analyze --metrics=cka,tvd,twonn` on every checkpoint and seed of the
workdir into a fresh CSV of its own (`dynamics_benchmark_<pid>.csv` in the workdir, removed
afterwards unless `--keep`), with a fresh persistent compilation cache so that every compilation
is included, then locates the phase transitions of every seed (`sg_jax.analysis.phase_onsets`, on
metrics.csv and that CSV; what `sg_jax.report` draws) and prints the wall and CPU time of both,
the time per checkpoint and the onsets in the order of their seed means with 95% bootstrap CIs.
Flags after `--` go to `sg_jax.analyze`.

Without `--workdir` the workdir is made on the fly in a temporary folder, as
`benchmarks/analysis_throughput.py --trajectory` makes it: configs/question.py:grok_cpu (depth 6,
d_model 128, 4 seeds), 31 checkpoints (steps 0, 1000, .., 30000) of random parameters and 3,000
generated training lines; it has no metrics.csv, so only the analysis's curves get onsets (and
random parameters give few).

Target (issue 38): the full trajectory of one grok_cpu run (31 checkpoints, 4 seeds) analysed
with all three quantities in at most 10 minutes on the project's 2-core CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

from analysis_throughput import build_trajectory_workdir  # noqa: E402
from sg_jax.records import long_csv  # noqa: E402
from sg_jax.analysis import onsets, phase_onsets  # noqa: E402
from sg_jax.report import phase_transitions as report_phases  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STEP_LINE = re.compile(r"\[(\d+)/(\d+)\] step (\d+): .* in ([0-9.]+)s")
GROUPS = "cka,tvd,twonn"


def run_analysis(workdir: str, output: str, extra: list[str]) -> dict:
  """Runs `sg_jax.analyze` on every checkpoint (fresh compilation cache); its times."""
  cache = tempfile.TemporaryDirectory(prefix="sg_jax_dynamics_cache_")
  cmd = [sys.executable, "-m", "sg_jax.analyze", f"--workdir={workdir}", f"--output={output}",
         f"--metrics={GROUPS}", f"--compilation_cache_dir={cache.name}"] + extra
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [_REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  print("running: python -m sg_jax.analyze " + " ".join(cmd[3:]), flush=True)
  cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=_REPO, env=env, stderr=subprocess.STDOUT,
                          stdout=subprocess.PIPE, text=True)
  step_times, tail = [], []
  for line in proc.stdout:
    tail = (tail + [line.rstrip()])[-20:]
    match = _STEP_LINE.search(line)
    if match:
      step_times.append(float(match.group(4)))
      print("  | " + line.rstrip()[-150:], flush=True)
  rc = proc.wait()
  wall = time.perf_counter() - t0
  cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
  cache.cleanup()
  if rc:
    raise SystemExit("sg_jax.analyze failed:\n" + "\n".join(tail))
  return {"wall": wall, "cpu": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
          "step_times": step_times}


def onset_lines(workdir: str, output: str) -> tuple[list[str], float]:
  """The onsets of every seed (`phases.phase_onsets`), ordered, and the seconds they took."""
  t0 = time.perf_counter()
  rows = long_csv.read_rows(os.path.join(workdir, "metrics.csv"), missing_ok=True)
  rows += long_csv.read_rows(os.path.join(workdir, output))
  found = phase_onsets.phase_onsets(onsets.series_of(rows))
  seconds = time.perf_counter() - t0
  lines = []
  for signal, mean, low, high, n in report_phases.order(found):
    per_seed = " ".join("-" if math.isnan(by[signal].step) else f"{by[signal].step:.0f}"
                        for _, by in sorted(found.items()) if signal in by)
    lines.append(f"  {signal:<20} mean {mean:9.0f} [{low:.0f}, {high:.0f}] ({n} seeds with an "
                 f"onset; per seed: {per_seed})")
  return lines, seconds


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default=None,
                      help="run directory to analyse (default: a random grok_cpu-sized one)")
  parser.add_argument("--num_checkpoints", type=int, default=31,
                      help="checkpoints of the workdir made on the fly")
  parser.add_argument("--keep", action="store_true", help="keep the analysis CSV")
  parser.add_argument("analyze_flags", nargs="*",
                      help="extra sg_jax.analyze flags after --, e.g. -- --dynamics_lines=128")
  args = parser.parse_args(argv)
  tmp = None
  workdir = args.workdir
  if not workdir:
    tmp = tempfile.TemporaryDirectory(prefix="sg_jax_dynamics_")
    workdir = tmp.name
    print(f"building a grok_cpu-sized workdir of {args.num_checkpoints} checkpoints in "
          f"{workdir}", flush=True)
    built = build_trajectory_workdir(workdir, num_checkpoints=args.num_checkpoints)
    print(f"  built in {built['seconds']:.1f} s", flush=True)
  output = f"dynamics_benchmark_{os.getpid()}.csv"
  try:
    timing = run_analysis(workdir, output, list(args.analyze_flags))
    lines, onset_seconds = onset_lines(workdir, output)
  finally:
    if not args.keep:
      for name in (output, output + ".options.json"):
        if os.path.exists(os.path.join(workdir, name)):
          os.remove(os.path.join(workdir, name))
    if tmp is not None:
      tmp.cleanup()
  times = timing["step_times"]
  print(f"\nmachine: {platform.machine()} {os.cpu_count()} CPUs, load average "
        f"{'%.2f %.2f %.2f' % os.getloadavg()}, jax {jax.__version__}")
  print(f"workdir: {args.workdir or 'random grok_cpu-sized (made on the fly)'}")
  print(f"analysis ({GROUPS}) of {len(times)} checkpoints: wall {timing['wall']:.1f} s "
        f"({timing['wall'] / 60:.2f} min, start-up and compilation included), CPU "
        f"{timing['cpu']:.1f} s")
  if times:
    print(f"  per checkpoint: first {times[0]:.1f} s (with compilation), then median "
          f"{sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else 0:.1f} s")
  print(f"phase transitions (onsets of every curve and seed): {onset_seconds:.2f} s")
  print("onsets in the order of their seed means [95% bootstrap CI]:")
  print("\n".join(lines) if lines else "  (none)")
  if timing["wall"] > 600:
    print("WARNING: more than the 10-minute target of issue 38")
  if args.keep:
    print(f"rows kept in {os.path.join(workdir, output)}")


if __name__ == "__main__":
  main()
