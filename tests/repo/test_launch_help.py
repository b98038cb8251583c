"""The launchers' --help, and the documentation pointers of launch/, notebooks/, sg_jax/ and
configs/: every README section or docs page named there exists."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHERS = ("tpu_vm.sh", "gpu_host.sh", "slurm.sh")


def _header(script):
  """The script's comment block after the #! line, without the '# '."""
  lines = []
  with open(os.path.join(ROOT, "launch", script)) as f:
    for line in f.read().splitlines()[1:]:
      if not line.startswith("#"):
        break
      lines.append(re.sub(r"^# ?", "", line))
  return lines


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", LAUNCHERS)
@pytest.mark.parametrize("args", [["--help"], ["-h"], ["help"], ["train", "--help"]])
def test_help_prints_the_usage_and_exits_0(script, args):
  done = subprocess.run(["bash", os.path.join(ROOT, "launch", script), *args],
                        capture_output=True, text=True, timeout=30, cwd=ROOT)
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines() == _header(script)
  assert any(l.startswith(f"Usage: launch/{script} ") for l in done.stdout.splitlines())
  assert done.stderr == ""


def _headings(path):
  with open(path) as f:
    return {line.lstrip("#").strip() for line in f if line.startswith("#")}


def _pointers():
  """(file, line number, target file, section or None) of every documentation pointer."""
  files = []
  for pattern in ("launch/*.sh", "notebooks/*.ipynb", "sg_jax/**/*.py", "configs/*.py"):
    files += glob.glob(os.path.join(ROOT, pattern), recursive=True)
  found = []
  for path in sorted(files):
    with open(path) as f:
      text = f.read()
    # A pointer may wrap onto the next comment or docstring line.
    flat = re.sub(r"\s*\n\s*(#\s*)?", " ", text)
    for m in re.finditer(r"README(?:\.md)?,? \"([^\"]+)\"|README(?:\.md)?, ([A-Z][a-z]+[^.;)]*)"
                         r"[.;)]", flat):
      found.append((path, "README.md", m.group(1) or m.group(2)))
    for m in re.finditer(r"(docs/[\w]+\.md)(?:,? \"([^\"]+)\")?", flat):
      found.append((path, m.group(1), m.group(2)))
  return found


def test_documentation_pointers_name_existing_pages_and_sections():
  pointers = _pointers()
  assert any(target.startswith("docs/") for _, target, _ in pointers)  # the search works
  stale = []
  for path, target, section in pointers:
    full = os.path.join(ROOT, target)
    if not os.path.exists(full) or (section and section not in _headings(full)):
      stale.append(f"{os.path.relpath(path, ROOT)}: {target} {section or ''}")
  assert not stale, stale
