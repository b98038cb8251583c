"""TensorBoard summaries without TensorFlow (`metric_logging.SummaryWriter`), and a default
training run that never imports TensorFlow."""

import glob
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from sg_jax.records import metric_logging

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tensorboard_reads_the_scalars(tmp_path, monkeypatch):
  # TensorBoard's documented switch to its TensorFlow stub (//tensorboard/compat:no_tensorflow),
  # so that the reader below, like the writer, runs without TensorFlow.
  monkeypatch.setitem(sys.modules, "tensorboard.compat.notf",
                      types.ModuleType("tensorboard.compat.notf"))
  # pylint: disable=import-outside-toplevel
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.util import tensor_util

  writer = metric_logging.SummaryWriter(str(tmp_path))
  writer.write(10, [3, 5], {"in_domain/accuracy": np.array([0.5, 0.25])})
  writer.write(20, [3, 5], {"in_domain/accuracy": np.array([0.75, np.nan])})
  writer.close()
  acc = event_accumulator.EventAccumulator(str(tmp_path))
  acc.Reload()
  read = {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}
  assert read.keys() == {"in_domain/accuracy/seed_3", "in_domain/accuracy/seed_5",
                         "in_domain/accuracy/mean"}
  assert read["in_domain/accuracy/seed_3"] == [(10, 0.5), (20, 0.75)]
  assert read["in_domain/accuracy/seed_5"][0] == (10, 0.25)
  assert np.isnan(read["in_domain/accuracy/seed_5"][1][1])
  assert read["in_domain/accuracy/mean"] == [(10, 0.375), (20, 0.75)]  # over finite seeds
  assert acc.SummaryMetadata("in_domain/accuracy/mean").plugin_data.plugin_name == "scalars"


def test_disabled_writer_writes_nothing(tmp_path):
  writer = metric_logging.SummaryWriter(str(tmp_path / "tb"), enabled=False)
  writer.write(1, [0], {"a": np.array([1.0])})
  writer.close()
  assert not os.path.exists(tmp_path / "tb")


@pytest.mark.slow
def test_default_training_run_never_imports_tensorflow(tiny_data, tmp_path):
  workdir = str(tmp_path / "run")
  code = ("import runpy, sys; sys.argv = sys.argv[1:]\n"
          "try:\n  runpy.run_module('sg_jax.main', run_name='__main__')\n"
          "finally:\n  print('TF:', sorted(m for m in sys.modules if m.startswith('tensorflow'))"
          "[:3], file=sys.stderr)\n")
  proc = subprocess.run(
      [sys.executable, "-c", code, "sg_jax.main", "--config=configs/question.py:tiny",
       f"--workdir={workdir}", f"--config.data.dir={tiny_data}", "--config.train.num_steps=2"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "TF: []" in proc.stderr
  assert "oneDNN" not in proc.stderr and "absl::InitializeLog" not in proc.stderr
  assert len(glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))) == 1
