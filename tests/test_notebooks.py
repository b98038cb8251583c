"""Executes the notebooks in notebooks/ top to bottom (nbclient) on a tiny config and checks what
they produce: the training plot, analysis.csv and the report figures, the tree-projection plots.

The parameter cells read SG_JAX_NOTEBOOK_* environment variables, set here to a 1-layer,
d_model 32, 40-step run on pre-generated tiny data. The three notebooks share one workdir and
run in order (train, analyse, inspect), so they form one test.
"""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


def _execute(name: str):
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
            f"data.dir={data_dir}")
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
  assert os.path.exists(os.path.join(workdir, "analysis.csv"))
  report_dir = os.path.join(workdir, "report")
  for name in ("summary.md", "summary.csv", "grokking_depth1.png", "early_stopping.png",
               "inverted_u.png", "dynamics_tscore.png", "dynamics_weight_norm.png"):
    assert os.path.exists(os.path.join(report_dir, name)), name
  assert len(_outputs(book, "png")) >= 7

  book = _execute("tree_projections.ipynb")
  text = "\n".join(_outputs(book, "text"))
  assert text.count("bracketing F1 =") == 3 and "projected:" in text
  assert len(_outputs(book, "png")) == 3
