"""benchmarks/accelerator_check.sh --cpu_smoke, where this machine's TensorFlow, clu,
ml_collections, PyYAML and pytest cannot be imported (only the copies the check carries).

The accelerator machine has jax, flax, optax, orbax-checkpoint, absl-py, numpy, matplotlib,
tqdm and tensorboard, and nothing can be downloaded there (docs/performance.md, "Accelerator
check"). Here a `sitecustomize` on the check's PYTHONPATH refuses the blocked packages from this
interpreter's site-packages, so the check passes only if it carries what it needs. The carried
wheels come from `benchmarks/fetch_wheels.sh` for this interpreter's Python (about 3 MB from the
package index); offline, outside CI, they are rebuilt from the installed distributions.
"""

import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import accelerator_report  # noqa: E402  (benchmarks/ is on sys.path above)

from sg_jax.records import long_csv  # noqa: E402

# Not on the accelerator machine (or, for tensorflow and clu, never needed by the check).
BLOCKED = ("tensorflow", "tensorflow_datasets", "clu", "ml_collections", "yaml", "pytest",
           "_pytest", "pluggy", "iniconfig")

SITECUSTOMIZE = f'''"""Test-only import blocker (tests/repo/test_accelerator_check.py): the blocked packages
exist only where they are found outside this interpreter's site-packages (the carried copies);
elsewhere `import` fails and `importlib.util.find_spec` returns None, as when not installed."""
import importlib.machinery, os, site, sys

_SITE = tuple(os.path.realpath(p) + os.sep
              for p in site.getsitepackages() + [site.getusersitepackages()])
_PATH = [p for p in sys.path if not (os.path.realpath(p) + os.sep).startswith(_SITE)]
for _name in {sorted(BLOCKED)!r}:
  if importlib.machinery.PathFinder.find_spec(_name, _PATH) is None:
    sys.modules[_name] = None
'''

STAGES = ["install", "env", "tests", "throughput_float32", "throughput_bfloat16", "memory", "run",
          "run_report"]


def _closure(names):
  """Installed distributions `names` need (their requirements without extras or false markers)."""
  from packaging.requirements import Requirement  # pylint: disable=import-outside-toplevel

  seen, todo = {}, list(names)
  while todo:
    dist = importlib.metadata.distribution(todo.pop())
    key = dist.metadata["Name"].lower().replace("_", "-")
    if key in seen:
      continue
    seen[key] = dist
    for text in dist.requires or []:
      req = Requirement(text)
      if req.marker is None or req.marker.evaluate({"extra": ""}):
        todo.append(req.name)
  return list(seen.values())


def _wheel_from_installed(dist, dest):
  """Zips an installed distribution's files back into a wheel (offline fallback)."""
  tag = next(line.split(":", 1)[1].strip() for line in dist.read_text("WHEEL").splitlines()
             if line.startswith("Tag:"))
  name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
  with zipfile.ZipFile(os.path.join(dest, f"{name}-{dist.version}-{tag}.whl"), "w") as z:
    for f in dist.files:
      if not str(f).startswith("..") and f.locate().is_file():  # console scripts live in bin/
        z.write(f.locate(), str(f))


@pytest.fixture(scope="module")
def carried_wheels(tmp_path_factory):
  """A folder of wheels for this interpreter: fetched (in CI: must succeed), else rebuilt."""
  dest = str(tmp_path_factory.mktemp("wheels"))
  version = f"{sys.version_info.major}.{sys.version_info.minor}"
  fetched = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "fetch_wheels.sh"),
                            "--python_version", version, dest], capture_output=True, text=True,
                           timeout=180, env={**os.environ, "PYTHON": sys.executable})
  if fetched.returncode == 0:
    return dest
  if os.environ.get("CI"):
    pytest.fail(f"benchmarks/fetch_wheels.sh failed in CI:\n{fetched.stderr[-2000:]}")
  try:
    for dist in _closure(["ml-collections", "pytest"]):
      _wheel_from_installed(dist, dest)
  except importlib.metadata.PackageNotFoundError as e:
    pytest.skip(f"no package index (fetch_wheels.sh failed) and {e} is not installed to rebuild "
                "its wheel from")
  return dest


def _blocked_env(tmp_path):
  blocker = tmp_path / "blocker"
  blocker.mkdir(exist_ok=True)
  (blocker / "sitecustomize.py").write_text(SITECUSTOMIZE)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  return {**env, "PYTHONPATH": str(blocker), "PYTHON": sys.executable}


def test_the_blocker_refuses_this_machines_ml_collections_and_pytest(tmp_path):
  """The premise of the smoke test: without the carried wheels these imports fail."""
  for module in ("ml_collections", "pytest", "yaml"):
    r = subprocess.run([sys.executable, "-c", f"import {module}"], env=_blocked_env(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"import of {module} halted; None in sys.modules" in r.stderr, (
        module, r.stderr)


@pytest.mark.slow
def test_cpu_smoke_runs_every_stage_with_only_the_carried_packages(tmp_path, carried_wheels):
  out = tmp_path / "out"
  r = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "accelerator_check.sh"),
                      "--cpu_smoke", "--wheels", carried_wheels, str(out)],
                     env=_blocked_env(tmp_path), capture_output=True, text=True, timeout=300)
  stages = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines()]
  assert [s[0] for s in stages] == STAGES, r.stdout + r.stderr
  assert all(s[1] == "0" for s in stages), (stages, r.stdout)
  assert r.returncode == 0

  files = {s[0]: (out / s[4]).read_text() for s in stages}
  env = files["env"]
  for dist in ("ml-collections", "PyYAML", "pytest"):
    assert re.search(rf"^{dist} +\S+ \(carried wheel\)$", env, re.M), (dist, env)
  for module in ("tensorflow", "clu"):
    assert re.search(rf"^{module} +not importable", env, re.M), (module, env)
  assert re.search(r"^backend +cpu$", env, re.M)

  passed = re.search(r"(\d+) passed", files["tests"])
  assert passed and int(passed.group(1)) >= 3 and "failed" not in files["tests"], files["tests"]
  for dtype in ("float32", "bfloat16"):
    text = files[f"throughput_{dtype}"]
    summary = text[text.rindex("\nsummary"):].splitlines()
    # cells are joined by two spaces; a header cell can hold one ("seq seed-steps/s")
    header = next(re.split(r"\s{2,}", l.strip()) for l in summary if "seed-steps/s" in l)
    rows = [dict(zip(header, l.split())) for l in summary if re.match(r"^\s+1\s+2\s", l)]
    assert rows and all(float(r["seed-steps/s"]) > 0 for r in rows), summary  # depth 1, 2 seeds
    layers = ["plain", "tuned"] if dtype == "float32" else ["tuned"]  # both / auto on a CPU
    assert sorted(r["layers"] for r in rows) == layers, summary
    assert f"{dtype}" in text
  assert "seeds that fit" in files["memory"]

  # The run was stopped by SIGTERM and checkpointed; its checkpoints did not come into OUT_DIR.
  assert (out / "run" / "exit_code").read_text().strip() == "75"
  assert not any("checkpoint" in name for _, dirs, _ in os.walk(out) for name in dirs)
  rows = long_csv.read_rows(str(out / "run" / "metrics.csv"))
  losses = {}
  for step, seed, name, value in rows:
    if name == "train/loss":
      losses.setdefault(step, []).append(value)
  last = max(losses)
  assert len(losses) >= 3 and len(losses[last]) == 2  # tiny preset: 2 seeds
  report = files["run_report"]
  assert f"train/loss at step {last}: mean {np.mean(losses[last]):.4f}" in report, report
  # The smoke's tiny run can log its lines within one second on a fast machine: then the report
  # says the steady rate was not measured.
  assert re.search(r"seed-steps/s \(steady, steps \d+ -> \d+ in \d+ s of log time\): [0-9.]+",
                   report) or "seed-steps/s (steady): not measured" in report, report
  summary_md = (out / "summary.md").read_text()
  assert "| run | 0 |" in summary_md and f"train/loss at step {last}" in summary_md


def test_fetch_wheels_gets_the_accelerator_pythons_wheels(tmp_path):
  """The default fetch: CPython 3.12 manylinux wheels (the accelerator machine's), small."""
  r = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "fetch_wheels.sh"), str(tmp_path)],
                     capture_output=True, text=True, timeout=180,
                     env={**os.environ, "PYTHON": sys.executable})
  if r.returncode != 0 and not os.environ.get("CI"):
    pytest.skip(f"no package index here (fetch_wheels.sh: {r.stderr.strip()[-300:]})")
  assert r.returncode == 0, r.stderr
  names = sorted(os.listdir(tmp_path))
  dists = {n.split("-")[0].lower() for n in names}
  assert {"ml_collections", "pyyaml", "pytest", "pluggy", "iniconfig"} <= dists, names
  assert any(re.match(r"pyyaml-.*-cp312-cp312-.*manylinux.*x86_64.*\.whl$", n) for n in names)
  assert all(n.endswith("-py3-none-any.whl") for n in names if not n.startswith("pyyaml"))
  assert sum(os.path.getsize(tmp_path / n) for n in names) < 16 * 2 ** 20
  if sys.version_info[:2] != (3, 12):
    # Wheels for another Python: the install stage says which to fetch, and summary.md shows it.
    out = tmp_path / "out"
    r = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "accelerator_check.sh"),
                        "--cpu_smoke", "--wheels", str(tmp_path), "--only", "env", str(out)],
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    summary = (out / "summary.md").read_text()
    assert "| install | 1 |" in summary, summary
    want = "%d.%d" % sys.version_info[:2]
    assert (f"are for cp312 but this Python is cp{want.replace('.', '')}" in summary
            and f"fetch_wheels.sh --python_version {want} DIR" in summary), summary


def test_run_figures_from_a_hand_built_log_and_table():
  log = "\n".join([
      "23:59:50 step 0/100 ...",  # not a training line
      "23:59:58 step 10/100  loss [3.000 2.000]  0.50 steps/s (1.0 seed-steps/s)  0:03:00 left",
      "00:00:08 step 30/100  loss [2.000 1.000]  1.00 steps/s (2.0 seed-steps/s)  0:01:10 left",
  ])
  rows = [(10, 0, "train/loss", 3.0), (10, 1, "train/loss", 2.0), (30, 0, "train/loss", 2.0),
          (30, 1, "train/loss", 1.0), (30, 0, "train/grad_norm", 9.0)]
  fig = accelerator_report.run_figures(rows, log)
  # 20 steps x 2 seeds in 10 s across midnight
  assert fig["rate_steady"] == pytest.approx(4.0) and fig["steady_span"] == (10, 30, 10)
  assert fig["rate_total"] == 2.0 and fig["seeds"] == 2
  assert fig["loss_last"] == [2.0, 1.0] and fig["loss_first"] == [3.0, 2.0]
  lines = accelerator_report.format_run(fig, 75)
  assert "stopped by SIGTERM" in lines[0] and "mean 1.5000 (min 1.0000, max 2.0000)" in lines[-1]
  # two log lines within the same second: no steady rate, and the report says so
  same_second = "\n".join(log.splitlines()[:2] + [log.splitlines()[1].replace("step 10", "step 30")])
  fig = accelerator_report.run_figures(rows, same_second)
  assert fig["rate_steady"] is None
  assert "seed-steps/s (steady): not measured" in "\n".join(accelerator_report.format_run(fig, 75))
  with pytest.raises(ValueError, match="no train/loss row"):
    accelerator_report.run_figures(rows[-1:], log)


def test_summary_keeps_the_last_try_of_each_stage_and_its_closing_lines(tmp_path):
  (tmp_path / "stages.tsv").write_text(
      "tests\t1\t50\t55\t03_tests.txt\nmemory\t124\t35\t35\t06_memory.txt\n"
      "tests\t0\t40\t55\t03_tests.txt\n")  # tests rerun with --only
  (tmp_path / "03_tests.txt").write_text("a PASSED\n===== 12 passed in 30.0s =====\n")
  (tmp_path / "06_memory.txt").write_text("compiling\nsummary\n  wall time  3 s\n")
  text = open(accelerator_report.write_summary(str(tmp_path), "accelerator")).read()
  assert "| tests | 0 | 40 | 55 | 03_tests.txt |\n| memory | 124 | 35 | 35 | 06_memory.txt |" in text
  assert "| tests | 1 |" not in text
  assert "## tests (exit 0)\n\n```\n===== 12 passed in 30.0s =====\n```" in text
  assert "## memory (exit 124)\n\n```\nsummary\n  wall time  3 s\n```" in text
