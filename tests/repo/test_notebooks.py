"""Executes the notebooks in notebooks/ top to bottom (nbclient) on a tiny config and checks what
they produce: the training plot, analysis.csv and the report figures, the tree-projection plots.

The parameter cells read SG_JAX_NOTEBOOK_* environment variables, set here to a 1-layer,
d_model 32, 40-step run on pre-generated tiny data. The three notebooks share one workdir and
run in order (train, analyse, analyse again with other options, inspect), so they form one test.

The install cell (the same in every notebook) is also run in its dry mode
(SG_JAX_NOTEBOOK_DRY_RUN=1: it prints the commands it would run) from a folder that is not a
checkout, as on Colab; its `install_commands` is checked with and without an installed jax.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import sys
from importlib import metadata

import pytest

from conftest import TEST_SIZED_OVERRIDES  # pylint: disable=wrong-import-order

# Subprocesses / end-to-end runs (minutes on 2 cores): the full set only (pyproject.toml).
pytestmark = pytest.mark.slow

nbformat = pytest.importorskip("nbformat")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
NAMES = ("train_and_watch.ipynb", "analysis_and_figures.ipynb", "tree_projections.ipynb")
PIP = [sys.executable, "-m", "pip", "install", "-q"]


def _install_cell(name):
  book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  return next(c.source for c in book.cells
              if c.cell_type == "code" and c.source.startswith("# Install / locate sg_jax"))


def _dry_install(tmp_path, monkeypatch, source):
  """Runs the install cell in dry mode from the empty folder tmp_path; (namespace, stdout)."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("SG_JAX_NOTEBOOK_DRY_RUN", "1")
  monkeypatch.setenv("SG_JAX_SOURCE", source)
  namespace, out = {}, io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(_install_cell(NAMES[0]), namespace)  # pylint: disable=exec-used
  assert os.listdir(tmp_path) == []  # nothing was run
  return namespace, [shlex.split(l[2:]) for l in out.getvalue().splitlines() if l.startswith("$ ")]


def test_install_cell_is_shared_and_has_no_placeholder():
  cells = {_install_cell(name) for name in NAMES}
  assert len(cells) == 1
  assert "YOUR_ORG" not in cells.pop()


def test_install_cell_dry_run_from_a_checkout_folder_keeps_the_installed_jax(tmp_path,
                                                                             monkeypatch):
  _, commands = _dry_install(tmp_path, monkeypatch, ROOT)
  requirements, editable = commands
  assert editable == PIP + ["--no-deps", "-e", ROOT]
  assert requirements[:len(PIP)] == PIP and "flax>=0.12" in requirements
  assert f"jax=={metadata.version('jax')}" in requirements
  assert not any(r.startswith("jax>") for r in requirements)


def test_install_cell_dry_run_clones_a_git_url(tmp_path, monkeypatch):
  url = "https://example.com/someone/sg_jax.git"
  _, commands = _dry_install(tmp_path, monkeypatch, url)
  checkout = str(tmp_path / "sg_jax")
  assert commands == [["git", "clone", "--depth=1", url, checkout],
                      PIP + ["--no-deps", "-e", checkout]]
  with pytest.raises(FileNotFoundError, match="upload"):
    _dry_install(tmp_path, monkeypatch, "sg_jax_src.tar.gz")


def test_install_commands_with_and_without_jax(tmp_path, monkeypatch):
  namespace, _ = _dry_install(tmp_path, monkeypatch, ROOT)
  install_commands = namespace["install_commands"]
  requirements = ["# stack", "jax>=0.10", "flax>=0.12  # nn", "", "tensorflow-cpu", "numpy"]
  editable = PIP + ["--no-deps", "-e", "/src"]
  present = {"jax": "0.10.2", "jaxlib": "0.10.1", "tensorflow": "2.19.0"}
  assert install_commands(requirements, present, "/src") == [
      PIP + ["jax==0.10.2", "jaxlib==0.10.1", "flax>=0.12", "numpy"], editable]
  assert install_commands(requirements, {}, "/src") == [
      PIP + ["jax>=0.10", "flax>=0.12", "tensorflow-cpu", "numpy"], editable]
  too_old = {"jax": "0.4.30", "jaxlib": "0.4.30", "jax-cuda12-plugin": "0.4.30"}
  assert install_commands(requirements, too_old, "/src")[0][len(PIP)] == "jax[cuda12]>=0.10"
  assert install_commands(requirements, {"jax": "0.4.30", "libtpu": "0.0.1"},
                          "/src")[0][len(PIP)] == "jax[tpu]>=0.10"


def _execute(name: str):
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  client = nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                                   resources={"metadata": {"path": NOTEBOOKS}})
  client.execute()
  return book


def _outputs(book, kind):
  """All outputs of code cells: 'text' (stdout + text/plain) or 'png' (image data)."""
  found = []
  for cell in book.cells:
    for out in cell.get("outputs", []):
      if kind == "text":
        found.append(out.get("text", "") + out.get("data", {}).get("text/plain", ""))
      elif "image/png" in out.get("data", {}):
        found.append(out["data"]["image/png"])
  return found


def test_notebooks_run_top_to_bottom(tmp_path, monkeypatch):
  tasks = pytest.importorskip("sg_jax.tasks")
  data_dir = str(tmp_path / "data")
  tasks.get_task("question").generate(data_dir, seed=0, num_train=60,
                                      sizes={"dev": 20, "test": 10, "gen": 20})
  workdir = str(tmp_path / "run")
  config = ("configs/question.py:quick,depth=1,d_model=32,heads=2,d_ff=64,seeds=2,steps=40,"
            "eval_every=20,checkpoint_every=20,warmup=5,num_train=60,train.log_every=20,"
            + ",".join([*TEST_SIZED_OVERRIDES, f"data.dir={data_dir}"]))
  monkeypatch.setenv("SG_JAX_NOTEBOOK_CONFIG", config)
  monkeypatch.setenv("SG_JAX_NOTEBOOK_WORKDIR", workdir)
  monkeypatch.setenv("SG_JAX_NOTEBOOK_ROOT", workdir)
  monkeypatch.setenv("SG_JAX_NOTEBOOK_REFRESH", "2")
  monkeypatch.setenv("SG_JAX_NOTEBOOK_NUM_SENTENCES", "8")

  book = _execute("train_and_watch.ipynb")
  assert os.path.exists(os.path.join(workdir, "metrics.csv"))
  assert os.path.exists(os.path.join(workdir, "notebook_metrics.png"))
  assert any("exit code 0" in t for t in _outputs(book, "text"))
  assert _outputs(book, "png")

  book = _execute("analysis_and_figures.ipynb")
  analysis = os.path.join(workdir, "analysis.csv")
  assert os.path.exists(analysis)
  report_dir = os.path.join(workdir, "report")
  figures = ("summary.md", "summary.csv", "grokking_depth1.png", "early_stopping.png",
             "inverted_u.png", "dynamics_tscore.png", "dynamics_weight_norm.png")
  for name in figures:
    assert os.path.exists(os.path.join(report_dir, name)), name
  assert len(_outputs(book, "png")) >= 7

  # Again with other options (as if analysed by the CLI with another --num_sentences) and
  # another report folder: the run's analysis.csv is extended with its own options.
  with open(analysis) as f:
    rows = f.read()
  monkeypatch.setenv("SG_JAX_NOTEBOOK_NUM_SENTENCES", "6")
  other_report = str(tmp_path / "report_other")
  monkeypatch.setenv("SG_JAX_NOTEBOOK_REPORT_DIR", other_report)
  book = _execute("analysis_and_figures.ipynb")
  text = "\n".join(_outputs(book, "text"))
  assert "'num_sentences': 8" in text and "extending it with those options" in text
  with open(analysis) as f:
    assert f.read() == rows  # every row was there already
  with open(analysis + ".options.json") as f:
    assert json.load(f)["num_sentences"] == 8
  for name in figures:
    assert os.path.exists(os.path.join(other_report, name)), name

  book = _execute("tree_projections.ipynb")
  text = "\n".join(_outputs(book, "text"))
  assert text.count("bracketing F1 =") == 3 and "projected:" in text
  assert len(_outputs(book, "png")) == 3
