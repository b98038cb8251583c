"""The launchers' seed check (issue 53 item 4, launch/seed_check.py): a seed count that leaves
chips idle is named in one line with the count to use; --fill_chips uses it; the table of seeds
per chip caps it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from sg_jax.accelerators import planning

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "launch"))
import seed_check  # noqa: E402  (launch/seed_check.py: standard library only)

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
SWEEP = ["--config=configs/question.py", "--depths=2,4", "--seeds=10", "--root=runs/qf"]


def _launch(*args):
  return subprocess.run(["bash", os.path.join(ROOT, "launch", args[0]), *args[1:]],
                        capture_output=True, text=True, timeout=30, cwd=ROOT)


@pytest.mark.parametrize("accelerator, generation, chips", [
    ("v4-8", "v4", 4), ("v4-32", "v4", 16), ("v5p-8", "v5p", 4), ("v5litepod-8", "v5e", 8),
    ("v6e-4", "v6e", 4)])
def test_accelerator_types_name_their_chips(accelerator, generation, chips):
  assert seed_check.chips_of(accelerator) == (generation, chips)


def test_idle_chips_are_named_in_one_line_with_the_count_to_use():
  done = _launch("tpu_vm.sh", "sweep", "--name=x", "--dry_run", "--", *SWEEP)
  assert done.returncode == 0
  with open(seed_check.TABLE) as f:  # the launchers' table (benchmarks/seeds_per_chip.py)
    most = seed_check.max_per_chip(json.load(f), "v4", "default", 4)
  fit = f"; at most {most} per chip fit (v4, default, depth 4)" if most else ""
  assert done.stderr.splitlines() == [
      f"launch: 10 seeds use 2 of 4 chips (2 idle) on v4-8: use --seeds=12 (3 per chip{fit})"]
  assert "--seeds=10 --root=runs/qf >" in done.stdout  # the job itself is unchanged
  full = _launch("tpu_vm.sh", "sweep", "--name=x", "--dry_run", "--", *SWEEP[:2], "--seeds=12")
  assert full.returncode == 0 and full.stderr == ""


def test_fill_chips_uses_the_count_and_a_run_gets_num_seeds():
  done = _launch("tpu_vm.sh", "train", "--name=x", "--accelerator=v5litepod-8", "--fill_chips",
                 "--dry_run", "--", "--config=configs/question.py:quick", "--workdir=runs/q")
  assert done.returncode == 0, done.stderr
  # quick: 4 seeds on 8 chips use 4: 8 seeds, one per chip
  assert "--workdir=runs/q --config.num_seeds=8 >" in done.stdout
  assert "using --config.num_seeds=8 (1 per chip)" in done.stderr
  gpus = _launch("gpu_host.sh", "sweep", "--gpus=0,1,2", "--fill_chips", "--dry_run", "--",
                 *SWEEP)
  assert "--root=runs/qf --seeds=12 >" in gpus.stdout and len(gpus.stderr.splitlines()) == 1


def test_the_table_caps_seeds_per_chip(tmp_path):
  table = tmp_path / "t.json"
  table.write_text(json.dumps({"max_seeds_per_chip": {"v5e": {"default": {"2": 9, "10": 3}}}}))
  job = seed_check.read_job(["--config=configs/tense.py:depth=6", "--config.num_seeds=40"])
  assert job == {"seeds": 40, "where": "flag", "preset": "default", "depth": 6}
  assert seed_check.max_per_chip(json.loads(table.read_text()), "v5e", "default", 6) == 3
  assert seed_check.max_per_chip(json.loads(table.read_text()), "v5e", "default", 12) == 0
  out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "seed_check.py"),
                        "--accelerator=v5litepod-4", f"--table={table}", "--fill", "--",
                        "--config=configs/tense.py:depth=6", "--config.num_seeds=40"],
                       capture_output=True, text=True, timeout=30)
  assert out.stdout.splitlines()[-1] == "--config.num_seeds=12"
  assert "10 per chip on 4 chips, more than the 3 that fit" in out.stderr


def test_an_unknown_accelerator_runs_unchecked():
  done = _launch("tpu_vm.sh", "train", "--name=x", "--accelerator=v3-8", "--dry_run", "--",
                 "--config=configs/question.py")
  assert done.returncode == 0 and "not checked" in done.stderr


def test_the_launchers_copy_of_the_plan_equals_the_librarys():
  """launch/seed_check.py runs before sg_jax is installed (standard library only), so it keeps
  its own copy of `planning.seeds_to_use`: equal on every count, chip count and cap tried."""
  for num_seeds in range(1, 41):
    for chips in (1, 2, 3, 4, 8, 16):
      for most in (0, 1, 3, 6, 31):
        assert seed_check.plan(num_seeds, chips, most) == planning.seeds_to_use(
            num_seeds, chips, most), (num_seeds, chips, most)


@pytest.mark.parametrize("name, generation", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla V100-SXM2-16GB", "gpu"), ("gpu", "gpu")])
def test_gpu_names_map_to_the_tables_generations(name, generation):
  assert seed_check.gpu_generation(name) == generation


def test_gpu_host_caps_seeds_per_gpu_by_its_type():
  with open(seed_check.TABLE) as f:
    most = seed_check.max_per_chip(json.load(f), "h100", "default", 10)
  assert most > 0  # the table has the H100 (benchmarks/seeds_per_chip.py --write)
  too_many = str(2 * (most + 1))  # 2 GPUs, one seed more per GPU than fit at depth 10
  done = _launch("gpu_host.sh", "train", "--gpus=0,1", "--gpu_type=h100", "--dry_run", "--",
                 "--config=configs/tense.py:depth=10", f"--config.num_seeds={too_many}")
  assert done.returncode == 0, done.stderr
  assert f"more than the {most} that fit" in done.stderr and "(h100, default, depth 10)" in done.stderr
  bad = _launch("gpu_host.sh", "train", "--gpus=0", "--gpu_type=v100", "--dry_run", "--",
                "--config=configs/tense.py")
  assert bad.returncode != 0 and "--gpu_type must be h100, h200 or a100" in bad.stderr
