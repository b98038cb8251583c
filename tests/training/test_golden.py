"""Golden values of training: 20 steps of the `tiny` preset on the CPU give these exact losses,
gradient norms and parameter checksums (issue 51 item 6).

The equivalence tests (a seed in a group equals that seed alone, packed equals padded, resumed
equals uninterrupted) compare two runs of the same code, so a change that moves every run alike
(an initialiser, the optimiser's order of operations, the data order, a dropout mask, the loss's
reduction) passes all of them. This test compares against numbers recorded from the code before
the issue-51 refactors (commit e934def, jax/jaxlib 0.10.2, flax 0.12.8, optax 0.2.8, a 2-core
x86-64 CPU), so such a change fails here.

Tolerance: the recorded code reproduces these values bit for bit on the same versions and CPU.
XLA:CPU compiles for the host's instruction set, and another vector width may sum a reduction
in another order; packing, which only reorders such sums, moves these values by at most 2e-7
relative. So the check is 1e-6 relative: far below what a real change of the step does (a
learning rate, an initialisation or a data order off by anything moves the losses by more
than 1e-3).

The run is the padded layout (packing compiles one branch per row-capacity bucket, several
times this test's cost; tests/training/test_train.py checks packed = padded) of seeds 0 and 1 on the
session's tiny question-formation data (`conftest.TINY_DATA`), trained through the compiled
chunk the training loop runs (`step.make_train_fns`), logged as the loop logs: the mean of each
10-step window.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import step as step_lib
from sg_jax.data import input_pipeline
from sg_jax.training.state import seed_keys

# What the compiled code is, so compiled as a user's run is (tests/conftest.py).
pytestmark = pytest.mark.optimized

# When a change moves these numbers ON PURPOSE (a new initialiser, a fixed bug in the step, a
# new data generator), say so in its commit message and record the new values: run this test,
# copy the `got` values of its failure message here, and name the commit below.
# Recorded from: commit e934def.
GOLDEN = {
    # Mean training loss of steps 1-10 and 11-20, per seed [seed 0, seed 1].
    "loss": [[4.547464370727539, 4.549117088317871], [4.357306480407715, 4.293781280517578]],
    # Mean global gradient norm (before clipping) of the same windows.
    "grad_norm": [[1.059938669204712, 1.1353806257247925],
                  [0.9712657928466797, 1.019266128540039]],
    # After step 20, per seed: the sum of |parameter| and the sum of parameters (float64 sums).
    "params_l1": [1787.5184079756118, 1805.339609682489],
    "params_sum": [63.01876406221436, 48.99518250236906],
}
RTOL = 1e-6
HOW_TO_UPDATE = ("training numbers changed: if the change is intended, record the new values in "
                 "tests/training/test_golden.py GOLDEN (from 'got' above) and say why in the commit; "
                 "otherwise a change to the step, the model, the optimiser or the data moved them")


def _train_20_steps(config, workdir):
  data_options = input_pipeline.DataOptions.from_config(config)
  _, vocab, splits = input_pipeline.load_data(data_options, workdir)  # reads config.data.dir
  host, capacities = input_pipeline.make_train_data(data_options, splits["train"], 2)
  fns = step_lib.train_fns_from_config(config, vocab.size, capacities)
  state = fns.init(seed_keys([0, 1]))
  data = jax.tree_util.tree_map(jnp.asarray, host)
  got = {"loss": [], "grad_norm": []}
  for start in (0, 10):
    state = fns.chunk(state, data, jnp.asarray(start, jnp.int32), 10)
    sums = jax.device_get(state.sums)
    for name in ("loss", "grad_norm"):
      got[name].append((np.asarray(sums[name]) / np.asarray(sums["steps"])).tolist())
    state = state.replace(sums=jax.tree_util.tree_map(jnp.zeros_like, state.sums))
  leaves = jax.tree_util.tree_leaves(jax.device_get(state.params))
  flat = [np.concatenate([np.asarray(x[s], np.float64).ravel() for x in leaves]) for s in (0, 1)]
  got["params_l1"] = [float(np.abs(f).sum()) for f in flat]
  got["params_sum"] = [float(f.sum()) for f in flat]
  return got


def test_twenty_tiny_training_steps_give_the_recorded_numbers(tiny_config, tmp_path):
  config = tiny_config(**{"train.num_steps": 20})  # padded, no UAS/preference (conftest)
  assert config.data.dir and config.model.d_model == 32 and config.model.dropout == 0.1
  got = _train_20_steps(config, str(tmp_path))
  for name, want in GOLDEN.items():
    np.testing.assert_allclose(
        got[name], want, rtol=RTOL, atol=0,
        err_msg=f"{name}: got {got[name]!r}, recorded {want!r}; {HOW_TO_UPDATE}")

