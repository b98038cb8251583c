"""What a finished sg_jax workdir holds, read the same way by the tests that compare runs."""
import os
import signal

import jax
import numpy as np

from sg_jax import checkpointing
from sg_jax.records import metric_logging


def rows(workdir):
  """Sorted (step, seed, name, value) rows of WORKDIR/metrics.csv."""
  table = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  return sorted((r["step"], r["seed"], r["name"], r["value"]) for r in table)


def params(workdir):
  """Every seed's parameters of the latest checkpoint as one flat float array."""
  p = checkpointing.restore(workdir).state["params"]
  return np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(p)])


def sigterm_at(stop_step):
  """A `train_and_evaluate` state hook that sends this process SIGTERM when the call starting at
  `stop_step` is dispatched (the run then checkpoints after that call: `stop_signal`)."""

  def hook(state, step):
    if step == stop_step:
      os.kill(os.getpid(), signal.SIGTERM)
    return state

  return hook


def random_checkpoint_workdir(root, steps, seeds, eval_lines=5, **config_fields):
  """A workdir of randomly initialised checkpoints (no training) for the analysis CLIs: generated
  question data (40 training lines, `eval_lines` per held-out split) and, at each of `steps`,
  the stacked parameters of `seeds` (1 layer, d_model 16, 2 heads, d_ff 32) drawn from
  PRNGKey(100 * step + seed). `config_fields`: dotted config fields set on top (e.g.
  `**{"eval.batch_size": 8}`, `objective="mlm"`: the model is the objective's,
  `objectives.model_config_from_config`). Returns `root` as a str."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from sg_jax import configlib, objectives, tasks  # pylint: disable=import-outside-toplevel
  from sg_jax.models.transformer import init_params  # pylint: disable=import-outside-toplevel

  task = tasks.get_task("question")
  data_dir = os.path.join(root, "data")
  task.generate(data_dir, seed=0, num_train=40,
                sizes={"dev": eval_lines, "test": eval_lines, "gen": eval_lines})
  config = configlib.base_config("question")
  config.data.dir, config.data.num_train = data_dir, 40
  config.model.num_layers, config.model.d_model = 1, 16
  config.model.num_heads, config.model.d_ff = 2, 32
  config.first_seed, config.num_seeds = seeds[0], len(seeds)
  config.train.num_steps = max(steps)  # a finished run: its last checkpoint is the final one
  for field, value in config_fields.items():
    configlib.set_field(config, field, value)
  vocab = task.vocab()
  model_config = objectives.model_config_from_config(config, vocab.size)
  manager = checkpointing.make_manager(str(root), asynchronous=False)
  for step in steps:
    stacked = [init_params(model_config, jax.random.PRNGKey(100 * step + s)) for s in seeds]
    checkpointing.save(manager, step,
                       {"params": jax.tree_util.tree_map(lambda *x: jnp.stack(x), *stacked)},
                       checkpointing.make_meta(config, vocab.to_json(), list(seeds)))
  manager.wait_until_finished()
  manager.close()
  return str(root)
