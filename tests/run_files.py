"""What a finished sg_jax workdir holds, read the same way by the tests that compare runs."""
import os

import jax
import numpy as np

from sg_jax import checkpointing
from sg_jax import metric_logging


def rows(workdir):
  """Sorted (step, seed, name, value) rows of WORKDIR/metrics.csv."""
  table = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  return sorted((r["step"], r["seed"], r["name"], r["value"]) for r in table)


def params(workdir):
  """Every seed's parameters of the latest checkpoint as one flat float array."""
  p = checkpointing.restore(workdir).state["params"]
  return np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(p)])
