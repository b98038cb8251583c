"""What pruning reads of a trained run: its lines (batched for the pruning steps, the means and
the evaluations) and its seeds' parameters and mean-ablation means, shared by `sg_jax.prune` and
`sg_jax.prune_core` (Bhaskar et al., ACL 2024; docs/pruning.md).

The lines are the run's objective's (`objectives.Objective.lines`, with the fixed key
`OBJECTIVE_SEED`): the KL, the task losses and the means read the inputs the model was trained
on and score its loss positions only: every position for `lm`, the output part for `prefix_lm`,
the masked positions of one fixed BERT masking for `mlm`. The model is the run's own
(`objectives.model_config_from_config`: its attention and its `[MASK]` row)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import models
from sg_jax import objectives
from sg_jax.data import input_pipeline
from sg_jax.pruning import means as means_lib
from sg_jax.pruning import run as run_lib
from sg_jax.tasks import io as tasks_io
from sg_jax.tasks import vocab as vocab_lib

# The key of the objective's randomness on the pruning lines (a masked LM's masking): fixed, so
# every pruning step, run and rerun reads the same masked positions.
OBJECTIVE_SEED = 20240102


def _encoded(task, config, workdir, vocab, split: str):
  """The encoded lines of `split` of the run's data folder.

  Raises:
    ValueError: the task has no such split file.
  """
  data_dir = tasks_io.run_data_dir(config.data, workdir)
  try:
    return task.encode(task.read_split(data_dir, split), vocab)
  except (FileNotFoundError, KeyError, ValueError) as e:
    raise ValueError(f"cannot read split {split!r} of {data_dir} for the objective: {e}"
                     ) from None


def objective_lines(objective, split, num_lines: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """The first `num_lines` (0 = all) lines of an `EncodedSplit` as the objective lays them out
  (`Objective.lines` with the key `OBJECTIVE_SEED`): (inputs, targets) int32 numpy [N, L],
  target 0 = not scored."""
  n = min(num_lines, len(split)) if num_lines else len(split)
  inputs, targets = objective.lines(
      jnp.asarray(np.asarray(split.inputs)[:n], jnp.int32),
      jnp.asarray(np.asarray(split.targets)[:n], jnp.int32),
      jnp.asarray(np.asarray(split.lengths)[:n], jnp.int32), jax.random.key(OBJECTIVE_SEED))
  return np.asarray(inputs, np.int32), np.asarray(targets, np.int32)


def _lines(objective, split, num_lines: int, batch_size: int, prefix: str = "") -> dict:
  inputs, targets = objective_lines(objective, split, num_lines)
  return {prefix + "inputs": jnp.asarray(means_lib.batch_lines(inputs, batch_size)),
          prefix + "targets": jnp.asarray(means_lib.batch_lines(targets, batch_size))}


def load_lines(restored, workdir: str, *, num_lines: int, batch_size: int, eval_lines: int,
               split: str | None = None) -> dict:
  """The lines that pruning and the core analyses use, read once per workdir.

  Args:
    restored: a `checkpointing.restore` result (its config and vocabulary).
    workdir: the run directory (its `data/` unless the config names another).
    num_lines: training lines for the means and the KL (0 = all).
    batch_size: lines per batch of 'train'.
    eval_lines: lines per evaluation split (0 = the run's `eval.max_lines`).
    split: also batch this split's lines as 'split_inputs' / 'split_targets' of 'train'
      (the `task:SPLIT` objectives).

  Returns:
    {'task', 'objective' (the run's `objectives.Objective`), 'train': {'inputs', 'targets':
    int32 [num_batches, batch_size, L]} (the objective's lines), 'eval': {'in_domain',
    'out_of_domain': `prepare_eval_batches`} (the stored lines: the evaluation applies the
    objective itself), 'means_inputs': int32 [N, L] (the objective's inputs)}.

  Raises:
    ValueError: the task has no file of `split`, or a bad objective in the run's config.
  """
  config = restored.config
  objective = objectives.from_config(config)
  data_options = input_pipeline.DataOptions.from_config(config)
  task, _, splits = input_pipeline.load_data(data_options, workdir)
  out = {"task": task, "objective": objective,
         "train": _lines(objective, splits["train"], num_lines, batch_size)}
  if split is not None:
    vocab = vocab_lib.Vocab.from_json(restored.vocab_json)
    out["train"].update(_lines(objective, _encoded(task, config, workdir, vocab, split),
                               num_lines, batch_size, "split_"))
  out["eval"] = {name: input_pipeline.prepare_eval_batches(
      splits[name], config.eval.batch_size, eval_lines or config.eval.max_lines,
      task.eval_fields) for name in ("in_domain", "out_of_domain")}
  out["means_inputs"] = objective_lines(objective, splits["train"], num_lines)[0]
  return out


def seed_inputs(restored, seeds: list[int], data: dict):
  """The model config, vocabulary, parameters [S, ...] and mean-ablation means of `seeds`.

  Args:
    restored: a `checkpointing.restore` result holding `seeds`.
    seeds: training seed ids, in the order of the returned leading axis.
    data: `load_lines`'s result (the means are over its 'means_inputs').

  Returns:
    (the run's ModelConfig (`objectives.model_config_from_config`) with max_len covering every line
    (`run.pruning_model_config`), Vocab,
    params [S, ...], (head means float32 [S, R_h, num_heads, head_dim], MLP means
    float32 [S, R_m, d_model]): `objective.unit_shapes`).
  """
  vocab = vocab_lib.Vocab.from_json(restored.vocab_json)
  longest = max(data["train"]["inputs"].shape[-1],
                *(b["inputs"].shape[-1] for b in data["eval"].values()))
  model_config = run_lib.pruning_model_config(objectives.model_config_from_config(
      restored.config, vocab.size, max_len=max(512, longest)))
  run_seeds = list(restored.seeds)
  idx = np.array([run_seeds.index(s) for s in seeds])
  params_S = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)[idx]),
                                    restored.state["params"])
  means_S = tuple(map(jnp.asarray, means_lib.seed_means(models.build(model_config), params_S,
                                                        data["means_inputs"])))
  return model_config, vocab, params_S, means_S
