"""The syntactic-attention-structure (SAS) loss term (Chen et al., ICLR 2024; docs/REFERENCE.md
§3; docs/sas.md "The regulariser"), registered as `sas` (config section `config.sas`).

`loss = objective loss + lambda_s(step) * penalty`, with, per gold arc (`Task.gold_dependencies`),
the attention on the arc in each direction the model's attention can read it (the original,
`run_mlm_reg_depparse.py`, adds the dependent's attention on its head and the head's attention
on the dependent; `analysis.uas` scores the same two directions):

* `sum` variant: per direction, the sum over layers and heads of A (with `sas.p` != 1: (sum of
  A^p)^(1/p), the original's p-norm form); the directions' values are added;
* `max` variant: per direction, the max over (layer, head) of A; the directions' values added;
* `sas.direction`: 'both' (both directions), 'head' (the dependent's row attending to its head)
  or 'children' (the head's row attending to its dependent); an arc counts when its selected
  direction can be attended at all.

Causal attention (`lm`) sees only the later token's row, so each arc has one direction: 'both'
is A[later, earlier], 'head' keeps the arcs whose head comes first and 'children' those whose
dependent comes first (this path is the term's code from before the objectives, unchanged).
Bidirectional attention (`mlm`) reads both directions of every arc: 'both' adds them. Prefix
attention (`prefix_lm`) reads both inside the input part and the later token's row in the output
part (`attention_masks.line_mask` of the stored lines says which).

The penalty is the MEAN over the batch's arcs (the original sums over the batch without
normalising; sg_jax normalises per arc, so lambda does not scale with the batch size or the
sentence length). lambda > 0 suppresses SAS, lambda < 0 promotes it. Each seed's lambda and step
window (`sas.lambdas`, `sas.starts`, `sas.ends`) are the generic fields of every loss term
(`terms.base`): one value per seed or one for all; with every lambda 0 (the default) the term is
not built at all, so the run is bit-identical to one without it.

`train/sas_loss` (metrics.csv) is the penalty (without lambda) averaged over the steps since the
last log; `train/loss` stays the objective's loss. The attention probabilities are the model's
sown ones (`model.INTERMEDIATES`, before dropout); packed rows (`packing.pack_lines`) compute
attention in the per-line layout [batch, length], so the arcs (`dep_head` [num_lines, length] of
the training set) are gathered by line index alike in both layouts.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sg_jax.models.attention_masks import line_mask
from sg_jax.tasks import dependencies
from sg_jax.terms import base

Array = jax.Array
VARIANTS = ("sum", "max")
DIRECTIONS = ("both", "head", "children")


@base.register
@dataclasses.dataclass(frozen=True)
class SasOptions(base.LossTerm):
  """The SAS term with its static options (hashable: they shape the compiled step).

  Attributes:
    variant: 'sum' or 'max' over (layer, head).
    p: the sum variant's p-norm exponent (1 = plain sum).
    direction: 'both', 'head' or 'children' (module docstring).
  """

  name = "sas"
  needs_intermediates = True
  variant: str = "sum"
  p: float = 1.0
  direction: str = "both"

  @classmethod
  def from_section(cls, section) -> "SasOptions":
    return cls(variant=str(section.variant), p=float(section.p),
               direction=str(section.direction))

  def check(self, config) -> None:
    """Raises ValueError naming a bad `sas.variant`, `sas.direction` or `sas.p`."""
    del config
    if self.variant not in VARIANTS:
      raise ValueError(f"invalid config: sas.variant must be one of {VARIANTS}, got "
                       f"{self.variant!r}")
    if self.direction not in DIRECTIONS:
      raise ValueError(f"invalid config: sas.direction must be one of {DIRECTIONS}, got "
                       f"{self.direction!r}")
    if not self.p > 0:
      raise ValueError(f"invalid config: sas.p must be > 0, got {self.p}")

  def train_arrays(self, task, examples: list, length: int) -> dict[str, np.ndarray]:
    """{'dep_head': int32 [num_lines, length]} the gold arcs of the training lines
    (`dependencies.dependency_arrays`).

    Raises:
      ValueError: the task declares no gold dependencies.
    """
    if not getattr(task, "has_gold_dependencies", False):
      raise ValueError(f"invalid config: sas.lambdas is nonzero but the {task.name} task "
                       "declares no gold dependencies")
    arcs = dependencies.dependency_arrays([task.gold_dependencies(ex) for ex in examples],
                                          length)
    return {"dep_head": arcs["dep_head"]}

  def penalty(self, params, sown, data: dict, idx_B: Array, model_config) -> Array:
    """`penalty` of the sown attention of every layer on the arcs of the lines `idx_B`, in
    the directions the model's attention (`model_config.attention`) reads them."""
    del params
    attention = jnp.stack([sown[f"layer_{i}"]["attention"]["attention"][0]
                           for i in range(model_config.num_layers)])
    visible = None
    if model_config.attention != "causal":  # the stored lines' mask (the per-line layout)
      inputs_BxL = data["inputs"][idx_B]
      visible = line_mask(model_config.attention, inputs_BxL, inputs_BxL != 0,
                          model_config.prefix_end_ids)[:, 0]
    return penalty(attention, data["dep_head"][idx_B], self, visible)[0]


def _reduce(a_BxLxNxH: Array, options: SasOptions) -> Array:
  """The variant's value [B, L] of one direction's attention over (layer, head)."""
  a_BxLxK = a_BxLxNxH.reshape(a_BxLxNxH.shape[:2] + (-1,))
  if options.variant == "max":
    return jnp.max(a_BxLxK, axis=-1)
  if options.p == 1.0:
    return jnp.sum(a_BxLxK, axis=-1)
  term = jnp.sum(jnp.power(a_BxLxK, options.p), axis=-1)  # the floor keeps x^(1/p)' finite
  return jnp.power(jnp.maximum(term, 1e-30), 1.0 / options.p)


def penalty(attention_NxBxHxLxL: Array, dep_head_BxL: Array, options: SasOptions,
            visible_BxLxL: Array | None = None) -> tuple[Array, Array]:
  """The term's penalty of one seed's batch (module docstring).

  Args:
    attention_NxBxHxLxL: attention probabilities [layers, batch, heads, L, L].
    dep_head_BxL: int32 [batch, L] head position of each position's word, -1 = no arc.
    options: variant, p, direction.
    visible_BxLxL: bool [batch or 1, L, L], True where query q may attend to key k (the model's
      `attention_masks.line_mask`), or None for causal attention (each arc read from its later
      token only).

  Returns:
    (mean over the selected arcs of the per-arc term, float32 []; 0 without arcs), number of
    selected arcs (float32 []).
  """
  if visible_BxLxL is not None:
    return _penalty_both_ways(attention_NxBxHxLxL, dep_head_BxL, options, visible_BxLxL)
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


def _penalty_both_ways(attention_NxBxHxLxL: Array, dep_head_BxL: Array, options: SasOptions,
                       visible_BxLxL: Array) -> tuple[Array, Array]:
  """`penalty` when an arc may be read in both directions (arguments and result as there): per
  arc, the variant's value of the dependent's attention on its head (where the dependent may
  attend to it) plus that of the head's attention on the dependent (likewise)."""
  att = attention_NxBxHxLxL.astype(jnp.float32)
  batch, length = dep_head_BxL.shape
  dep_BxL = jnp.broadcast_to(jnp.arange(length)[None, :], (batch, length))
  has = dep_head_BxL >= 0
  head_BxL = jnp.where(has, dep_head_BxL, 0)
  b_idx = jnp.arange(batch)[:, None]
  visible = jnp.broadcast_to(visible_BxLxL, (batch, length, length))
  up = has & visible[b_idx, dep_BxL, head_BxL] & (options.direction != "children")
  down = has & visible[b_idx, head_BxL, dep_BxL] & (options.direction != "head")
  term = (jnp.where(up, _reduce(att[:, b_idx, :, dep_BxL, head_BxL], options), 0.0)
          + jnp.where(down, _reduce(att[:, b_idx, :, head_BxL, dep_BxL], options), 0.0))
  selected = up | down
  count = jnp.sum(selected).astype(jnp.float32)
  return jnp.sum(jnp.where(selected, term, 0.0)) / jnp.maximum(count, 1.0), count
