"""The syntactic-attention-structure (SAS) regulariser of training (Chen et al., ICLR 2024;
docs/REFERENCE.md §3; docs/sas.md "The regulariser").

`loss = LM loss + lambda_s(step) * penalty`, with, per gold arc (`Task.gold_dependencies`), the
attention A of the later token on the earlier one (a causal LM reads each arc in that direction
only; `analysis.uas`):

* `sum` variant: sum over layers and heads of A (with `sas.p` != 1: (sum of A^p)^(1/p), the
  original's p-norm form);
* `max` variant: the max over (layer, head) of A;
* `sas.direction`: 'both' (every arc), 'head' (only arcs whose head comes first: the dependent's
  row attending to its head) or 'children' (only arcs whose dependent comes first: the head's row
  attending to its child).

The penalty is the MEAN over the batch's arcs (the original sums over the batch without
normalising; sg_jax normalises per arc, so lambda does not scale with the batch size or the
sentence length). lambda > 0 suppresses SAS, lambda < 0 promotes it. Each seed has its own
lambda and its own step window [start, end) (`sas.lambdas`, `sas.starts`, `sas.ends`: one value
per seed or one for all; end 0 = until the end of training): outside its window a seed's lambda
is 0. The window changes only the loss, never the learning-rate schedule. With every lambda 0
(the default) the regulariser is not built at all, so the run is bit-identical to one without it.

`train/sas_loss` (metrics.csv) is the penalty (without lambda) averaged over the steps since the
last log; `train/loss` stays the LM loss. The attention probabilities are the model's sown ones
(`model.INTERMEDIATES`, before dropout); packed rows (`packing.pack_lines`) compute attention in
the per-line layout [batch, length], so the arcs (`dep_head` [num_lines, length] of the training
set) are gathered by line index alike in both layouts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax import evaluation
from sg_jax import model as model_lib
from sg_jax import sharding

Array = jax.Array
VARIANTS = ("sum", "max")
DIRECTIONS = ("both", "head", "children")
PER_SEED = ("lambdas", "starts", "ends")


@dataclasses.dataclass(frozen=True)
class SasOptions:
  """The static part of the regulariser (hashable: it shapes the compiled step)."""

  variant: str = "sum"
  p: float = 1.0
  direction: str = "both"


def options_from_config(config) -> SasOptions | None:
  """The regulariser's options, or None when every lambda is 0 (nothing is built)."""
  sas = config.get("sas")
  if sas is None or not any(float(x) != 0.0 for x in _as_tuple(sas.lambdas)):
    return None
  return SasOptions(variant=str(sas.variant), p=float(sas.p), direction=str(sas.direction))


def _as_tuple(value) -> tuple:
  return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def validate(config) -> None:
  """Raises ValueError naming the bad `sas.*` field (lengths, variant, direction, p, window)."""
  sas = config.get("sas")
  if sas is None:
    return
  n = int(config.num_seeds)
  for name in PER_SEED:
    values = _as_tuple(sas[name])
    if len(values) not in (1, n):
      raise ValueError(f"invalid config: sas.{name} needs one value or one per seed "
                       f"(num_seeds={n}), got {len(values)}: {values}")
  if sas.variant not in VARIANTS:
    raise ValueError(f"invalid config: sas.variant must be one of {VARIANTS}, got "
                     f"{sas.variant!r}")
  if sas.direction not in DIRECTIONS:
    raise ValueError(f"invalid config: sas.direction must be one of {DIRECTIONS}, got "
                     f"{sas.direction!r}")
  if not float(sas.p) > 0:
    raise ValueError(f"invalid config: sas.p must be > 0, got {sas.p}")
  starts, ends = _as_tuple(sas.starts), _as_tuple(sas.ends)
  if any(int(s) < 0 for s in starts) or any(int(e) < 0 for e in ends):
    raise ValueError("invalid config: sas.starts and sas.ends must be >= 0 (end 0 = no end)")


def per_seed_arrays(config) -> dict[str, np.ndarray]:
  """{'sas_lambda': float32 [S], 'sas_start', 'sas_end': int32 [S]} (end 0 -> no end)."""
  n = int(config.num_seeds)
  spread = lambda name: np.broadcast_to(np.asarray(_as_tuple(config.sas[name])), (n,))
  ends = spread("ends").astype(np.int64)
  ends = np.where(ends == 0, np.iinfo(np.int32).max, ends)
  return {"sas_lambda": spread("lambdas").astype(np.float32),
          "sas_start": spread("starts").astype(np.int32), "sas_end": ends.astype(np.int32)}


def train_arrays(config, task, workdir: str, length: int,
                 num_lines: int | None = None) -> dict[str, np.ndarray]:
  """The training set's arcs and the per-seed values, to add to the training data (or {} when
  the regulariser is off).

  Returns:
    {'dep_head': int32 [num_lines, length] (`dependencies.dependency_arrays`), plus
    `per_seed_arrays`}.

  Args:
    num_lines: rows of the training set the arcs must cover (checked; None: not checked).

  Raises:
    ValueError: the task declares no gold dependencies, or the arcs do not cover `num_lines`.
  """
  from sg_jax.tasks import dependencies  # pylint: disable=import-outside-toplevel
  if options_from_config(config) is None:
    return {}
  if not getattr(task, "has_gold_dependencies", False):
    raise ValueError(f"invalid config: sas.lambdas is nonzero but the {task.name} task declares "
                     "no gold dependencies")
  from sg_jax import composition  # pylint: disable=import-outside-toplevel
  data_dir = config.data.dir or os.path.join(workdir, "data")
  examples = task.read_split(data_dir, "train")
  if composition.active(config):  # the training set also holds the disambiguating lines
    examples += composition.extra_training_examples(config, task, data_dir)
  if num_lines is not None and len(examples) != num_lines:
    raise ValueError(f"the SAS arcs cover {len(examples)} training lines but the training set "
                     f"has {num_lines}")
  arcs = dependencies.dependency_arrays([task.gold_dependencies(ex) for ex in examples], length)
  return {"dep_head": arcs["dep_head"], **per_seed_arrays(config)}


def penalty(attention_NxBxHxLxL: Array, dep_head_BxL: Array, options: SasOptions
            ) -> tuple[Array, Array]:
  """The regulariser's penalty of one seed's batch (module docstring).

  Args:
    attention_NxBxHxLxL: attention probabilities [layers, batch, heads, L, L].
    dep_head_BxL: int32 [batch, L] head position of each position's word, -1 = no arc.
    options: variant, p, direction.

  Returns:
    (mean over the selected arcs of the per-arc term, float32 []; 0 without arcs), number of
    selected arcs (float32 []).
  """
  att = attention_NxBxHxLxL.astype(jnp.float32)
  pos = jnp.arange(att.shape[-1])[None, :]
  has = dep_head_BxL >= 0
  if options.direction == "head":
    has = has & (dep_head_BxL < pos)
  elif options.direction == "children":
    has = has & (dep_head_BxL > pos)
  head = jnp.where(has, dep_head_BxL, 0)
  later, earlier = jnp.maximum(pos, head), jnp.minimum(pos, head)
  b_idx = jnp.arange(att.shape[1])[:, None]
  a_BxLxNxH = att[:, b_idx, :, later, earlier]
  a_BxLxK = a_BxLxNxH.reshape(a_BxLxNxH.shape[:2] + (-1,))
  if options.variant == "max":
    term = jnp.max(a_BxLxK, axis=-1)
  elif options.p == 1.0:
    term = jnp.sum(a_BxLxK, axis=-1)
  else:  # p-norm; the tiny floor keeps the gradient of x^(1/p) at 0 finite
    term = jnp.sum(jnp.power(a_BxLxK, options.p), axis=-1)
    term = jnp.power(jnp.maximum(term, 1e-30), 1.0 / options.p)
  count = jnp.sum(has).astype(jnp.float32)
  return jnp.sum(jnp.where(has, term, 0.0)) / jnp.maximum(count, 1.0), count


def regularised_loss(params, model: model_lib.TransformerLM, inputs_BxL: Array,
                     targets_BxL: Array, dep_head_BxL: Array, lam: Array,
                     dropout_key: Array | None, options: SasOptions, **model_kwargs
                     ) -> tuple[Array, tuple[Array, Array]]:
  """(LM loss + lam * penalty, (LM loss, penalty)) of one seed's batch (`step.lm_loss` plus the
  penalty of the sown attention; `model_kwargs` describe packed rows)."""
  logits, state = model.apply(
      {"params": params}, inputs_BxL, deterministic=dropout_key is None,
      rngs=None if dropout_key is None else {"dropout": dropout_key},
      mutable=[model_lib.INTERMEDIATES], **model_kwargs)
  sown = state[model_lib.INTERMEDIATES]
  attention = jnp.stack([sown[f"layer_{i}"]["attention"]["attention"][0]
                         for i in range(model.config.num_layers)])
  loss_sum, count = evaluation.token_losses(logits, targets_BxL)
  lm = jnp.sum(loss_sum) / jnp.maximum(jnp.sum(count), 1.0)
  pen, _ = penalty(attention, dep_head_BxL, options)
  return lm + lam * pen, (lm, pen)


def seed_lambdas(data: dict, num_local: int, step: Array) -> Array:
  """float32 [num_local]: each local seed's lambda at `step` (0 outside its window).

  Under `sharding.per_device` a device holds a block of seeds; the per-seed arrays of `data`
  hold every seed, so the block's offset comes from the device's index on the seed axis.
  """
  lam, start, end = data["sas_lambda"], data["sas_start"], data["sas_end"]
  offset = 0
  if lam.shape[0] != num_local:
    offset = jax.lax.axis_index(sharding.SEED_AXIS) * num_local
  idx = offset + jnp.arange(num_local)
  lam, start, end = lam[idx], start[idx], end[idx]
  return jnp.where((step >= start) & (step < end), lam, 0.0)


def with_sas_sums(state: Any) -> Any:
  """A TrainState whose running sums also hold 'sas_loss' (the logged `train/sas_loss`)."""
  return state.replace(sums={**state.sums, "sas_loss": jnp.zeros((), jnp.float32)})


def regularised_body(state, perm, idx_SxB: Array, step: Array, data: dict, model, tx,
                     capacities, options: SasOptions, apply_gradients) -> tuple:
  """One step of `step.make_chunk_fn`'s scan with the regulariser, for the local seeds.

  The same batches, dropout keys and layouts (padded, or the packing bucket `switch`) as the
  unregularised step; the gradients are those of `regularised_loss` with each seed's lambda,
  `apply_gradients` gets the LM loss (so `train/loss` stays the LM loss) and the penalty is added
  to `sums['sas_loss']`.

  Returns:
    (state, perm): the scan carry.
  """
  from sg_jax import step as step_lib  # pylint: disable=import-outside-toplevel  (cycle)
  from sg_jax.packing import pack_lines  # pylint: disable=import-outside-toplevel

  lam_S = seed_lambdas(data, state.step.shape[0], step)
  grad_fn = jax.value_and_grad(regularised_loss, has_aux=True)

  def one(p, k, idx, lam, capacity):
    dropout_key = jax.random.fold_in(step_lib._subkey(k, step_lib.DROPOUT_KEY), step)  # pylint: disable=protected-access
    dep_head = data["dep_head"][idx]
    if capacity is None:
      (_, (lm, pen)), grads = grad_fn(p, model, data["inputs"][idx], data["targets"][idx],
                                      dep_head, lam, dropout_key, options)
    else:
      rows = pack_lines(data["inputs"], data["targets"], data["lengths"], idx, capacity)
      inputs, targets = rows.pop("inputs"), rows.pop("targets")
      (_, (lm, pen)), grads = grad_fn(p, model, inputs, targets, dep_head, lam, dropout_key,
                                      options, **rows)
    return lm, pen, grads

  def run(capacity):
    return lambda params, keys, idx, lams: jax.vmap(
        lambda p, k, i, l: one(p, k, i, l, capacity))(params, keys, idx, lams)

  if capacities is None:
    lm, pen, grads = run(None)(state.params, state.key, idx_SxB, lam_S)
  else:
    need = jnp.max(jnp.sum(data["lengths"][idx_SxB], axis=-1))
    bucket = jnp.searchsorted(jnp.asarray(capacities), need)
    lm, pen, grads = jax.lax.switch(bucket, [run(c) for c in capacities], state.params,
                                    state.key, idx_SxB, lam_S)
  sas_sum = state.sums["sas_loss"] + pen  # apply_gradients keeps only its own sums
  state = jax.vmap(lambda s, l, g: apply_gradients(s, l, g, step, tx))(state, lm, grads)
  return state.replace(sums={**state.sums, "sas_loss": sas_sum}), perm
