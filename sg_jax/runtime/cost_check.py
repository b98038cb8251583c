"""A memory check before a run starts: refuse, in one line, a run that cannot fit.

`estimate` adds up what a training run holds at its peak, from shapes alone (nothing is
allocated or compiled): the training state of every seed (its parameters, from `jax.eval_shape`
of one seed's initialisation, and AdamW's two moments: 3 x the parameters), once more for the
gradients and the new state of a step, the training data copied to every device, and a rough
estimate of the largest compiled program's live buffers: the activations a training step keeps
for its backward pass, or the largest intermediates of one evaluation batch, whichever is larger,
for every seed at once (the seeds are vmapped). `check` compares it with the memory of the
machine (host RAM available now, `/proc/meminfo` or `os.sysconf`, for the CPU backend; the
accelerators' own memory otherwise) and raises `MemoryEstimateError` when it cannot fit;
`sg_jax.main --skip_memory_check` (`train_and_evaluate(memory_check=False)`) runs anyway.

The activation term is an order-of-magnitude estimate (float32, every sublayer's output, the
attention scores and the output logits), not XLA's buffer assignment: it is meant to stop an
absurd size (10,000 seeds of `tiny` reached 22 GB before its first evaluation compiled) within a
second, not to predict a run that fits within 10%.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

FLOAT_BYTES = 4
GB = 1e9


class MemoryEstimateError(ValueError):
  """The run's estimated memory exceeds the machine's (the message says both and what to do)."""


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Bytes a run holds at its peak, by part (module docstring).

  Attributes:
    state: the stacked training state of every seed [seed, ...] (bytes).
    step: gradients and the new state during a step (as large as the state).
    data: the training arrays, one copy per device.
    activations: the largest compiled program's intermediates, every seed at once.
    num_seeds: seeds of the run.
  """

  state: int
  step: int
  data: int
  activations: int
  num_seeds: int

  @property
  def total(self) -> int:
    return self.state + self.step + self.data + self.activations

  def describe(self) -> str:
    return (f"about {self.total / GB:.1f} GB: training state {self.state / GB:.2f} GB for "
            f"{self.num_seeds} seeds, gradients and updates {self.step / GB:.2f} GB, data "
            f"{self.data / GB:.2f} GB, activations of the largest program about "
            f"{self.activations / GB:.1f} GB")


def tree_bytes(tree: Any) -> int:
  """Bytes of a pytree of arrays or `jax.ShapeDtypeStruct`s."""
  return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize
                 for x in jax.tree_util.tree_leaves(tree)))


def activation_bytes(model, *, batch_size: int, length: int, eval_batch_size: int,
                     vocab_size: int) -> int:
  """Rough bytes of one seed's largest program (module docstring): the training step's saved
  activations, num_layers x (10 d_model + 2 d_ff + 2 heads x length) per token plus 2 x vocab
  logits, against one evaluation batch's largest layer (3 x the widest of d_ff, heads x length
  and vocab per token); float32.

  Args:
    model: the config's `model` (num_layers, d_model, d_ff, num_heads).
    batch_size, length: the training batch [batch, length] of one seed.
    eval_batch_size: lines per evaluation batch.
    vocab_size: output classes.
  """
  per_token = model.num_layers * (10 * model.d_model + 2 * model.d_ff
                                  + 2 * model.num_heads * length) + 2 * vocab_size
  train = batch_size * length * per_token
  widest = max(model.d_ff, model.num_heads * length, vocab_size, model.d_model)
  evaluate = eval_batch_size * length * 3 * widest
  return int(max(train, evaluate) * FLOAT_BYTES)


# The training state per parameter: the parameter and AdamW's first and second moments.
STATE_COPIES = 3


def estimate(config, abstract_params: Any, host_data: dict, num_devices: int,
             vocab_size: int) -> Estimate:
  """The peak memory of a run (module docstring).

  Args:
    config: the run's config (model, train.batch_size, eval.batch_size, num_seeds).
    abstract_params: ONE seed's parameters as `jax.ShapeDtypeStruct`s (`jax.eval_shape`).
    host_data: the training arrays (numpy; `inputs` [lines, length]).
    num_devices: devices the data is copied to.
    vocab_size: the vocabulary's size.
  """
  state = STATE_COPIES * tree_bytes(abstract_params) * int(config.num_seeds)
  length = int(np.asarray(host_data["inputs"]).shape[1])
  per_seed = activation_bytes(config.model, batch_size=int(config.train.batch_size),
                              length=length, eval_batch_size=int(config.eval.batch_size),
                              vocab_size=vocab_size)
  data = tree_bytes(jax.tree_util.tree_map(np.asarray, host_data)) * max(1, num_devices)
  return Estimate(state=state, step=state, data=data, activations=per_seed * config.num_seeds,
                  num_seeds=int(config.num_seeds))


def available_bytes(devices) -> tuple[int | None, str]:
  """(bytes, what they are) of the memory the run's arrays live in: the sum of the devices'
  `bytes_limit` on an accelerator, the host's available RAM on CPU; (None, '') when unknown."""
  if devices and devices[0].platform != "cpu":
    limits = []
    for device in devices:
      stats = device.memory_stats() or {}
      if "bytes_limit" not in stats:
        return None, ""
      limits.append(int(stats["bytes_limit"]))
    return sum(limits), f"the memory of {len(devices)} {devices[0].platform} device(s)"
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024, "available on this machine"
  except OSError:
    pass
  try:
    return (os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
            "available on this machine")
  except (ValueError, OSError, AttributeError):
    return None, ""


def check(found: Estimate, devices) -> None:
  """Raises MemoryEstimateError when `found` exceeds the memory of `devices` (module docstring).

  Raises:
    MemoryEstimateError: one line with the estimate, the memory and the ways out.
  """
  limit, what = available_bytes(devices)
  if limit is None or found.total <= limit:
    return
  raise MemoryEstimateError(
      f"this run needs {found.describe()} (an estimate), more than the {limit / GB:.1f} GB "
      f"{what}; use fewer seeds (num_seeds), a smaller train.batch_size or eval.batch_size, or "
      "split the seeds over several runs (first_seed); --skip_memory_check runs it anyway")
