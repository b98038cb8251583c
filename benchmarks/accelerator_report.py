"""The Python parts of `benchmarks/accelerator_check.sh`: its environment report, the figures of
its training run, and its summary.md (docs/performance.md, "Accelerator check").

  python benchmarks/accelerator_report.py env
  python benchmarks/accelerator_report.py run WORKDIR LOG EXIT_CODE
  python benchmarks/accelerator_report.py summary OUT_DIR MODE

`env` prints the machine, the Python packages (and where each was imported from: the check's
carried wheels or the machine's own), JAX's backend and devices; `run` prints the seed-steps/s
and the training loss at the end of a `python -m sg_jax.main` run from its log and metrics.csv,
each measured figure beside the ahead-of-time projection of the same run (`aot_projection`:
its training call compiled for this machine's accelerator, the roofline bound on seed-steps/s
per chip from XLA's cost at the chip's published peaks, and the compiled peak memory per chip);
`summary` writes OUT_DIR/summary.md from the stage table `stages.tsv` the check writes and the
stages' output files.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import os
import platform
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Distributions reported by `env`: (distribution, import name).
PACKAGES = (("jax", "jax"), ("jaxlib", "jaxlib"), ("flax", "flax"), ("optax", "optax"),
            ("orbax-checkpoint", "orbax.checkpoint"), ("numpy", "numpy"),
            ("ml-collections", "ml_collections"), ("PyYAML", "yaml"), ("absl-py", "absl"),
            ("pytest", "pytest"), ("tqdm", "tqdm"), ("matplotlib", "matplotlib"))
# Never needed by the check: reported as importable or not, never imported.
ABSENT_OK = ("tensorflow", "clu", "tensorflow_datasets")
ENV_VARS = ("JAX_PLATFORMS", "XLA_FLAGS", "XLA_PYTHON_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_DEFAULT_MATMUL_PRECISION",
            "CUDA_VISIBLE_DEVICES", "SG_JAX_CARRIED")

# A training log line of `sg_jax.training.logs.log_train`, e.g.
# "12:00:01 step 200/300000  loss [3.1 3.0]  4.10 steps/s (65.6 seed-steps/s)  20:01:00 left".
LOG_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d) step (\d+)/(\d+)\s+loss .*?\s([0-9.]+) steps/s "
                      r"\(([0-9.]+) seed-steps/s\)")


def _origin(module: str) -> str:
  """Where `module` would be imported from ('carried' when under $SG_JAX_CARRIED), without
  importing it; 'not importable' if it cannot be found (or an import blocker refuses it)."""
  try:
    spec = importlib.util.find_spec(module)
  except (ImportError, ValueError):
    spec = None
  if spec is None:
    return "not importable"
  where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
  carried = os.environ.get("SG_JAX_CARRIED")
  if carried and os.path.realpath(where).startswith(os.path.realpath(carried) + os.sep):
    return "carried wheel"
  return "this machine"


def _version(dist: str) -> str:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return "-"


def env_report() -> list[tuple[str, str]]:
  """(name, value) rows: machine, packages, JAX's backend and devices. Imports JAX (after
  `host_devices.configure_cpu_devices`, as `python -m sg_jax.main` does)."""
  rows = [("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")),
          ("python", f"{platform.python_version()} ({sys.executable})"),
          ("machine", f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} "
                      f"{platform.release()}"),
          ("load average", "%.2f %.2f %.2f" % os.getloadavg())]
  for dist, module in PACKAGES:
    rows.append((dist, f"{_version(dist)} ({_origin(module)})"))
  for module in ABSENT_OK:
    rows.append((module, _origin(module) + " (not needed)"))
  for name in ENV_VARS:
    rows.append((name, os.environ.get(name, "(unset)")))
  from sg_jax.runtime import host_devices  # pylint: disable=import-outside-toplevel

  host_devices.configure_cpu_devices()
  import jax  # pylint: disable=import-outside-toplevel

  devices = jax.devices()
  rows += [("backend", jax.default_backend()),
           ("devices", f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform})"),
           ("process count", str(jax.process_count())),
           ("default matmul precision", str(jax.config.jax_default_matmul_precision)),
           ("XLA_FLAGS as training sees it", os.environ.get("XLA_FLAGS", "(unset)"))]
  for device in devices[:8]:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    limit = (stats or {}).get("bytes_limit")
    rows.append((f"device {device.id}", f"{device}" + (f", {limit / 1e9:.1f} GB usable by JAX"
                                                       if limit else "")))
  return rows


# ----------------------------------------------------------------------------------------------
# The training run.


def parse_log(text: str) -> list[tuple[int, int, float, float]]:
  """[(seconds since midnight, step, steps/s, seed-steps/s)] of the training log lines in
  `text`, in order; a clock that passes midnight keeps counting up."""
  out, offset, last = [], 0, -1
  for line in text.splitlines():
    m = LOG_LINE.match(line.strip())
    if not m:
      continue
    h, mi, s, step = (int(m.group(i)) for i in range(1, 5))
    t = 3600 * h + 60 * mi + s + offset
    if t < last:
      offset += 86400
      t += 86400
    last = t
    out.append((t, step, float(m.group(6)), float(m.group(7))))
  return out


def run_figures(metrics_rows, log_text: str) -> dict:
  """Seed-steps/s and the training loss of a run.

  Args:
    metrics_rows: [(step, seed, name, value)] of its metrics.csv (`long_csv.read_rows`).
    log_text: its stderr (the `sg_jax` progress lines).

  Returns:
    {'seeds': S, 'last_step', 'loss_last' [S] (train/loss at the last logged step),
     'first_step', 'loss_first' [S], 'rate_total' (seed-steps/s of the last log line: since
     training started, the first call's compilation included), 'rate_steady' (seed-steps/s
     between the first and the last log line: no compilation; None with fewer than two lines a
     second apart), 'steady_span' (steps, seconds)}. Raises ValueError if there is no
     train/loss row.
  """
  loss = {}
  for step, seed, name, value in metrics_rows:
    if name == "train/loss":
      loss.setdefault(step, {})[seed] = value
  if not loss:
    raise ValueError("metrics.csv has no train/loss row: the run stopped before its first log")
  seeds = sorted({s for per in loss.values() for s in per})
  first, last = min(loss), max(loss)
  lines = parse_log(log_text)
  out = {"seeds": len(seeds), "first_step": first, "last_step": last,
         "loss_first": [loss[first].get(s, float("nan")) for s in seeds],
         "loss_last": [loss[last].get(s, float("nan")) for s in seeds],
         "rate_total": lines[-1][3] if lines else None, "rate_steady": None,
         "steady_span": None}
  if len(lines) >= 2 and lines[-1][0] > lines[0][0]:
    steps, seconds = lines[-1][1] - lines[0][1], lines[-1][0] - lines[0][0]
    out["rate_steady"] = steps * len(seeds) / seconds
    out["steady_span"] = (lines[0][1], lines[-1][1], seconds)
  return out


# jax's device_kind of a chip -> the `sg_jax.accelerators.targets` generation of its figures.
DEVICE_KINDS = (("h100", "h100"), ("h200", "h200"), ("a100", "a100"), ("v6 lite", "v6e"),
                ("v6e", "v6e"), ("v5 lite", "v5e"), ("v5e", "v5e"), ("v5p", "v5p"), ("v5", "v5p"),
                ("v4", "v4"))


def chip_generation(device_kind: str) -> str | None:
  """'h100' for 'NVIDIA H100 80GB HBM3', 'v5e' for 'TPU v5 lite'; None for another device."""
  kind = device_kind.lower()
  return next((gen for key, gen in DEVICE_KINDS if key in kind), None)


def aot_projection(config_json: str) -> dict | None:
  """The run's training call compiled on this machine's devices, as the run laid it out: the
  roofline bound on seed-steps/s per chip (XLA's FLOPs and bytes per seed-step at the chip's
  published peaks, `sg_jax.accelerators`) and the compiled peak bytes per chip; None on a
  device without published figures (the CPU).

  Returns:
    {'chip', 'seed_steps_per_s' (per chip, None without a cost analysis), 'peak' (bytes per
     chip), 'seeds_per_chip', 'bound'}.
  """
  # Imported here: `env` and `summary` run without JAX (the check's first stages).
  import jax  # pylint: disable=import-outside-toplevel

  devices = jax.devices()
  generation = chip_generation(devices[0].device_kind)
  if generation is None:
    return None
  import json  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel
  from sg_jax.accelerators import programs  # pylint: disable=import-outside-toplevel
  from sg_jax.accelerators import roofline  # pylint: disable=import-outside-toplevel
  from sg_jax.accelerators import targets  # pylint: disable=import-outside-toplevel
  with open(config_json, encoding="utf-8") as f:
    config = ml_collections.ConfigDict(json.load(f))
  target = targets.Target(f"{generation} (this machine)", generation, (len(devices),))
  with tempfile.TemporaryDirectory(prefix="sg_jax_projection_") as tmp:
    config = programs.target_config(config)
    the_plan = programs._plan(config, target, tuple(devices), tmp,  # pylint: disable=protected-access
                              ("train",))
    result = programs.compile_program(the_plan.programs[0])
  out = {"chip": target.chip.name, "seeds_per_chip": the_plan.seeds_per_chip,
         "peak": result.peak, "seed_steps_per_s": None, "bound": ""}
  if result.flops and result.bytes_accessed:
    line = roofline.roofline(
        roofline.per_seed_step(result.flops, the_plan.seeds_per_chip),
        roofline.per_seed_step(result.bytes_accessed, the_plan.seeds_per_chip),
        target.chip.matmul_peak(config.model.dtype, config.model.matmul_precision),
        target.chip.hbm_bandwidth)
    out["seed_steps_per_s"], out["bound"] = line.seed_steps_per_s, line.bound
  return out


def format_projection(fig: dict, projection: dict | None) -> list[str]:
  """The measured seed-steps/s per chip (`run_figures`; the run's seeds over the chips they
  take, seeds / seeds per chip) beside the AOT projection (`aot_projection`)."""
  if projection is None:
    return ["AOT projection: none (no published figures for this device)"]
  lines = [f"AOT projection on {projection['chip']} ({projection['seeds_per_chip']} seeds per "
           f"chip): compiled peak {projection['peak'] / 1e9:.2f} GB per chip"]
  bound = projection["seed_steps_per_s"]
  chips = max(1, fig["seeds"] // projection["seeds_per_chip"])
  measured = fig["rate_steady"] / chips if fig["rate_steady"] is not None else None
  if bound is None:
    lines.append("seed-steps/s per chip: AOT bound - (no cost analysis on this device); "
                 f"measured {measured:.1f}" if measured is not None else
                 "seed-steps/s per chip: neither measured nor projected")
  else:
    got = (f"measured {measured:.1f} ({100 * measured / bound:.0f}% of the bound)"
           if measured is not None else "not measured")
    lines.append(f"seed-steps/s per chip: AOT roofline bound {bound:.1f} ({projection['bound']}-"
                 f"bound), {got}")
  return lines


def format_run(fig: dict, exit_code: int) -> list[str]:
  """Lines of the run's figures (`run_figures`)."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  how = {0: "finished", 75: "stopped by SIGTERM and checkpointed (exit 75, as planned)",
         124: "killed: it did not stop within its limit after SIGTERM"}.get(
             exit_code, f"exit code {exit_code}")
  last, first = np.asarray(fig["loss_last"]), np.asarray(fig["loss_first"])
  lines = [f"run: {fig['seeds']} seeds, last logged step {fig['last_step']}; {how}"]
  if fig["rate_steady"] is not None:
    a, b, seconds = fig["steady_span"]
    lines.append(f"seed-steps/s (steady, steps {a} -> {b} in {seconds} s of log time): "
                 f"{fig['rate_steady']:.1f}")
  else:
    lines.append("seed-steps/s (steady): not measured, fewer than two log lines a second apart")
  if fig["rate_total"] is not None:
    lines.append(f"seed-steps/s (since training started, first compile included): "
                 f"{fig['rate_total']:.1f}")
  lines.append(f"train/loss at step {fig['last_step']}: mean {np.nanmean(last):.4f} "
               f"(min {np.nanmin(last):.4f}, max {np.nanmax(last):.4f}) over {len(last)} seeds; "
               f"at step {fig['first_step']}: mean {np.nanmean(first):.4f}")
  return lines


# ----------------------------------------------------------------------------------------------
# summary.md


def _tail_from(text: str, start: str) -> str:
  """The part of `text` from the last line that starts with `start` on ('' if none)."""
  lines = text.splitlines()
  idx = [i for i, line in enumerate(lines) if line.startswith(start)]
  return "\n".join(lines[idx[-1]:]) if idx else ""


def _read(path: str) -> str:
  try:
    with open(path, errors="replace") as f:
      return f.read()
  except OSError:
    return ""


def stage_highlight(name: str, text: str) -> str:
  """The part of a stage's output that summary.md shows (its closing table or line)."""
  if name == "env":
    keep = ("python ", "jax ", "jaxlib ", "backend ", "devices ", "default matmul", "ml-collections ")
    return "\n".join(l for l in text.splitlines() if l.strip().startswith(keep))
  if name == "tests":
    found = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
    return found[-1].strip() if found else "\n".join(text.splitlines()[-5:])
  if name.startswith("throughput"):
    return _tail_from(text, "summary")
  if name == "memory":
    return _tail_from(text, "summary")
  if name == "run_report":
    return text.strip()
  return ""


def failed_stage_tail(text: str, lines: int = 8) -> str:
  """The last `lines` lines of a failed stage's output, for summary.md (why it failed)."""
  return "\n".join(text.rstrip().splitlines()[-lines:])


def write_summary(out_dir: str, mode: str) -> str:
  """Writes OUT_DIR/summary.md from OUT_DIR/stages.tsv (name, exit code, seconds, limit, file
  per line; the last line of a stage counts) and the stages' files; returns its path."""
  latest = {}  # a stage rerun with --only: its last line, in the place of its first
  for line in _read(os.path.join(out_dir, "stages.tsv")).splitlines():
    parts = line.split("\t")
    if len(parts) == 5:
      latest[parts[0]] = parts
  stages = list(latest.values())
  md = [f"# Accelerator check ({mode})", "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; exit 124 = the "
        "stage ran past its limit (its file holds what it printed until then).", "",
        "| stage | exit | seconds | limit s | output |", "| --- | --- | --- | --- | --- |"]
  md += [f"| {n} | {rc} | {s} | {lim} | {f} |" for n, rc, s, lim, f in stages]
  for name, rc, _, _, fname in stages:
    raw = _read(os.path.join(out_dir, fname))
    text = stage_highlight(name, raw)
    if rc != "0" and raw.strip() and not text:  # a failed stage without a closing table
      text = failed_stage_tail(raw)
    if text:
      md += ["", f"## {name} (exit {rc})", "", "```", text, "```"]
  path = os.path.join(out_dir, "summary.md")
  with open(path, "w") as f:
    f.write("\n".join(md) + "\n")
  return path


def main(argv: list[str]) -> int:
  if len(argv) >= 1 and argv[0] == "env":
    rows = env_report()
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0
  if len(argv) == 4 and argv[0] == "run":
    from sg_jax.records import long_csv  # pylint: disable=import-outside-toplevel

    rows = long_csv.read_rows(os.path.join(argv[1], "metrics.csv"), missing_ok=True)
    try:
      fig = run_figures(rows, _read(argv[2]))
    except ValueError as e:
      print(f"error: {e}")
      return 1
    print("\n".join(format_run(fig, int(argv[3]))))
    config_json = os.path.join(argv[1], "config.json")
    if os.path.exists(config_json):
      try:
        projection = aot_projection(config_json)
      except Exception as e:  # pylint: disable=broad-except  (the measured figures stand)
        print(f"AOT projection: failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
      else:
        print("\n".join(format_projection(fig, projection)))
    return 0
  if len(argv) == 3 and argv[0] == "summary":
    print(write_summary(argv[1], argv[2]))
    return 0
  sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
  return 2


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
