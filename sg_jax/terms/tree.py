"""The tree-regularisation loss term (TreeReg: Nandi, Manning, Murty, NAACL 2025, "Sneaking syntax
into transformer language models with tree regularization"; docs/tree_regularisation.md),
registered as `tree` (config section `config.tree`).

`loss = objective loss + lambda_s(step) * L_TR`, with L_TR the TreeReg loss of the gold
constituency trees of the step's lines, read from the hidden states of ONE layer of the training
forward pass. Definitions (the paper's SCIN score and L_TR, as its released code computes them
with `--use_orthogonal --orth_single --orth_bidir --ce`: `regularizer/chart_computer.py`,
`OrthogonalChartComputer`; `regularizer/regularizer_main.py`, `Chart.get_penalty` and
`Chart.gold_recurse`, branch `ananjan/tree_regularization` of dcx/structural-grokking-330):

* the sentence is the DECLARATIVE part of a line (`Example.declarative`, the words before the
  task token without the final `.`), n words w_0 .. w_{n-1} at input positions 1 .. n (SOS at
  0); its gold tree is `Task.gold_tree` (the binarised tree tparseval scores against);
* h_k = the first `tree.dims` x d_model components of the output of layer `tree.layer` at word
  k (TreeReg's `--sci_heads`); o(a, c) = || h_c - (h_c . u_a) u_a ||, u_a = h_a / ||h_a||: the
  length of the part of h_c orthogonal to h_a (unnormalised h_c, as the released code; with
  `tree.normalise`, u_c in place of h_c: the sine of the angle, in [0, 1]);
* chart C[i, j] = o(i - 1, j) for 1 <= i <= j < n, and 0 for i = 0 (a span starting at the first
  word has no left context in a causal LM; the released code sets it to 0 the same way);
* SCIN(i, j) = C[i, j] + C[j + 1, j + 1]: the end of span (i, j) is independent of the words
  before it, and the word after it is independent of the span (the `orth_bidir` right term
  o(j, j + 1), 0 at the sentence end);
* split score of node (i, j) at k (i <= k < j): s(i, k, j) = SCIN(i, k) + SCIN(k + 1, j)
  = C[i, k] + C[k + 1, k + 1] + C[k + 1, j] + C[j + 1, j + 1]; the last addend is the same for
  every k, so it cancels in the softmax below and is left out;
* per gold node (i, k*, j) with at least 3 words: the cross-entropy -log softmax_k s(i, k, j)
  at the gold split k*; nodes of 2 words have a single split and are skipped, as the released
  code does;
* L_TR of a line = the mean over its nodes; of a batch = the mean over its lines with a node.

lambda > 0 promotes the gold trees (minimises L_TR); lambda < 0 penalises them (maximises L_TR).
With TreeReg's chart L_TR is unbounded above (a model that prefers wrong splits can widen the
margin by lengthening its states), so under lambda < 0 train/tree_loss keeps growing; with
`tree.normalise` every split score lies in [0, 3] and L_TR <= 3 + log(n - 1). Each seed's
lambda and step window (`tree.lambdas`, `tree.starts`, `tree.ends`) are the generic fields of
every loss term (`terms.base`); with every lambda 0 (the default) the term is not built, so the
run is bit-identical to one without it. `train/tree_loss` (metrics.csv) is L_TR (without lambda)
averaged over the steps since the last log. The docs page lists where sg_jax differs from
TreeReg (every step rather than every 10th, the training pass's hidden states, the default
layer, the declarative tree only, the optional normalised chart).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sg_jax import objectives
from sg_jax import tasks
from sg_jax.config import per_seed
from sg_jax.tasks import trees
from sg_jax.terms import base

Array = jax.Array
_TINY = 1e-12  # floor under squared lengths: finite gradients of ||x|| at x = 0
_MASKED = -1e30  # logit of a split that is not a candidate


@base.register
@dataclasses.dataclass(frozen=True)
class TreeOptions(base.LossTerm):
  """The TreeReg term with its static options (hashable: they shape the compiled step).

  Attributes:
    layer: whose output the hidden states are: 1 .. num_layers (after that many layers), or -1
      for the last layer (the one tree projections read).
    dims: fraction (0, 1] of the d_model components used, the first int(dims x d_model)
      (TreeReg's `--sci_heads`; its released runs use 0.25).
    normalise: chart of unit vectors (sines of angles) instead of TreeReg's unnormalised h_c:
      a bounded L_TR, blind to the states' lengths.
  """

  name = "tree"
  needs_intermediates = True
  layer: int = -1
  dims: float = 0.25
  normalise: bool = False

  @classmethod
  def from_section(cls, section) -> "TreeOptions":
    return cls(layer=int(section.layer), dims=float(section.dims),
               normalise=bool(section.get("normalise", False)))

  def check(self, config) -> None:
    """Raises ValueError naming a bad `tree.layer` or `tree.dims`, or `tree.lambdas` when a
    nonzero strength meets a task without gold trees or a non-causal objective."""
    num_layers, d_model = int(config.model.num_layers), int(config.model.d_model)
    if self.layer != -1 and not 1 <= self.layer <= num_layers:
      raise ValueError(f"invalid config: tree.layer must be -1 (last) or in 1..{num_layers} "
                       f"(model.num_layers), got {self.layer}")
    if not 0.0 < self.dims <= 1.0 or num_dims(self.dims, d_model) < 1:
      raise ValueError(f"invalid config: tree.dims must be in (0, 1] and keep at least one of "
                       f"the {d_model} components, got {self.dims}")
    lambdas = per_seed.as_tuple(config.tree.get("lambdas", (0.0,)))
    if not any(float(x) != 0.0 for x in lambdas):
      return
    if not tasks.task_class(config.task).has_gold_trees:
      raise ValueError(f"invalid config: tree.lambdas is nonzero but the {config.task} task "
                       "has no gold trees")
    attention = objectives.from_config(config).attention
    if attention != "causal":
      raise ValueError(f"invalid config: tree.lambdas is nonzero but objective "
                       f"{config.get('objective', 'lm')!r} uses {attention} attention; TreeReg's "
                       "chart assumes a causal LM")

  def train_arrays(self, task, examples: list, length: int) -> dict[str, np.ndarray]:
    """{'tree_nodes': int32 [num_lines, N - 1, 3]} the gold nodes of each training line's
    declarative tree (`gold_nodes`); N = the most declarative words of any line.

    Raises:
      ValueError: the task has no gold trees, or a line's tree is missing or does not cover
        its declarative words (naming the line).
    """
    if not getattr(task, "has_gold_trees", False):
      raise ValueError(f"invalid config: tree.lambdas is nonzero but the {task.name} task has "
                       "no gold trees")
    gold = []
    for row, ex in enumerate(examples):
      try:
        tree = task.gold_tree(ex)
      except ValueError as e:
        raise ValueError(f"tree.lambdas is nonzero but training line {row} has no gold tree: "
                         f"{e}") from None
      if trees.leaves(tree) != tuple(ex.declarative):
        raise ValueError(f"training line {row}: gold tree leaves {trees.leaves(tree)} differ "
                         f"from its declarative words {tuple(ex.declarative)}")
      gold.append(tree)
    nodes = gold_nodes(gold)
    if nodes.shape[1] + 2 > length:
      raise ValueError(f"declarative sentences of {nodes.shape[1] + 1} words do not fit the "
                       f"training arrays' length {length}")
    return {"tree_nodes": nodes}

  def penalty(self, params, sown, data: dict, idx_B: Array, model_config) -> Array:
    """L_TR (float32 [], nats) of ONE seed's lines `idx_B` (int32 [batch]) from the sown hidden
    states of layer `layer` (padded or packed layout, `line_states`); `step.make_chunk_fn`
    vmaps it over the seed axis."""
    del params
    nodes_BxMx3 = data["tree_nodes"][idx_B]
    n_max = nodes_BxMx3.shape[1] + 1
    layer = model_config.num_layers if self.layer == -1 else self.layer
    states_BxPxD = line_states(sown["hidden"][layer], data["lengths"][idx_B], n_max + 1)
    words_BxNxP = states_BxPxD[:, 1:, :num_dims(self.dims, model_config.d_model)]
    return treereg_loss(scin_chart(words_BxNxP, self.normalise), nodes_BxMx3)[0]


def num_dims(dims: float, d_model: int) -> int:
  """The components used: int(dims x d_model), as TreeReg's `int(sci_heads * D)`."""
  return int(dims * d_model)


def gold_nodes(gold_trees: list) -> np.ndarray:
  """int32 [lines, N - 1, 3]: each tree's internal nodes (i, k, j) in pre-order
  (`trees.split_nodes`), -1 padded; N = the most words of any tree (at least 2).

  Raises:
    ValueError: a tree that is not binary.
  """
  per_line = [trees.split_nodes(t) for t in gold_trees]
  n_max = max([2] + [len(trees.leaves(t)) for t in gold_trees])
  out = np.full((len(gold_trees), n_max - 1, 3), -1, np.int32)
  for row, nodes in enumerate(per_line):
    if nodes:
      out[row, :len(nodes)] = nodes
  return out


def line_states(hidden: Array, lengths_B: Array, num_positions: int) -> Array:
  """float32 [B, num_positions, d]: positions 0 .. num_positions - 1 of each line's states.

  Args:
    hidden: one layer's sown states, padded [B, L, d] or one packed row [1, C, d]
      (`packing.pack_lines`: line b starts at the sum of the lengths before it).
    lengths_B: int32 [B] tokens per line.
    num_positions: P; positions past a line (or the row) hold other tokens' states, which the
      loss never reads (every chart entry it reads lies inside the sentence).
  """
  batch = lengths_B.shape[0]
  if hidden.shape[0] == batch and batch > 1:
    return hidden[:, :num_positions].astype(jnp.float32)
  starts_B = jnp.cumsum(lengths_B) - lengths_B
  pos_BxP = jnp.minimum(starts_B[:, None] + jnp.arange(num_positions)[None, :],
                        hidden.shape[1] - 1)
  return hidden[0][pos_BxP].astype(jnp.float32)


def scin_chart(words_BxNxP: Array, normalise: bool = False) -> Array:
  """TreeReg's chart (module docstring) of a batch of sentences.

  Args:
    words_BxNxP: float [B, N, P] the word states h_0 .. h_{N-1} (any values past a sentence's
      last word: they only enter entries the loss does not read).
    normalise: use u_j = h_j / ||h_j|| in place of h_j (`TreeOptions.normalise`).

  Returns:
    float32 [B, N, N] C[b, i, j] = || h_j - (h_j . u_{i-1}) u_{i-1} || (units of the hidden
    states; unitless in [0, 1] with `normalise`) for 1 <= i <= j, 0 elsewhere (i = 0 or i > j).
  """
  w = words_BxNxP.astype(jnp.float32)
  unit = w / jnp.sqrt(jnp.maximum(jnp.sum(w * w, -1, keepdims=True), _TINY))
  if normalise:
    w = unit
  along_BxAxC = jnp.einsum("bap,bcp->bac", unit, w)  # h_c . u_a
  orth = w[:, None, :, :] - along_BxAxC[..., None] * unit[:, :, None, :]
  o_BxAxC = jnp.sqrt(jnp.maximum(jnp.sum(orth * orth, -1), _TINY))  # o(a, c)
  n = w.shape[1]
  chart = jnp.concatenate([jnp.zeros_like(o_BxAxC[:, :1]), o_BxAxC[:, :-1]], axis=1)
  r = jnp.arange(n)
  keep = (r[:, None] >= 1) & (r[:, None] <= r[None, :])
  return jnp.where(keep[None], chart, 0.0)


def split_logits(chart_BxNxN: Array, nodes_BxMx3: Array) -> tuple[Array, Array]:
  """Split scores of every node at every k (module docstring), without the constant C[j+1, j+1].

  Args:
    chart_BxNxN: `scin_chart`.
    nodes_BxMx3: int32 [B, M, 3] nodes (i, k*, j), -1 padded.

  Returns:
    (float32 [B, M, N] s[b, m, k] = C[i, k] + C[k + 1, k + 1] + C[k + 1, j], bool [B, M, N]
    True where i <= k < j).
  """
  n = chart_BxNxN.shape[-1]
  i = jnp.maximum(nodes_BxMx3[..., 0], 0)
  j = jnp.maximum(nodes_BxMx3[..., 2], 0)
  below = jnp.concatenate([chart_BxNxN[:, 1:], jnp.zeros_like(chart_BxNxN[:, :1])], axis=1)
  left = jnp.take_along_axis(chart_BxNxN, i[..., None], axis=1)  # C[i, k]
  right = jnp.take_along_axis(below.transpose(0, 2, 1), j[..., None], axis=1)  # C[k + 1, j]
  diag_next = jnp.diagonal(below, offset=1, axis1=1, axis2=2)  # C[k + 1, k + 1], k < N - 1
  diag_next = jnp.concatenate([diag_next, jnp.zeros_like(diag_next[:, :1])], axis=1)
  k = jnp.arange(n)[None, None, :]
  return left + diag_next[:, None, :] + right, (k >= i[..., None]) & (k < j[..., None])


def treereg_loss(chart_BxNxN: Array, nodes_BxMx3: Array) -> tuple[Array, Array]:
  """L_TR of a batch (module docstring).

  Args:
    chart_BxNxN: `scin_chart` (or any chart C).
    nodes_BxMx3: int32 [B, M, 3] the gold nodes (i, k*, j) of each line, -1 padded (M >= N - 1
      not needed: any number of nodes per line).

  Returns:
    (float32 [] the mean over lines with a node of the mean over their nodes of 3 words or more
    of -log softmax_k s(i, k, j) at k = k*, in nats; 0 without such nodes, float32 [] the
    number of such nodes).
  """
  logits, cand = split_logits(chart_BxNxN, nodes_BxMx3)
  logits = jnp.where(cand, logits, _MASKED)
  gold = jnp.maximum(nodes_BxMx3[..., 1], 0)
  ce_BxM = (jax.nn.logsumexp(logits, axis=-1)
            - jnp.take_along_axis(logits, gold[..., None], axis=-1)[..., 0])
  ok_BxM = (nodes_BxMx3[..., 0] >= 0) & (nodes_BxMx3[..., 2] - nodes_BxMx3[..., 0] >= 2)
  count_B = jnp.sum(ok_BxM, -1).astype(jnp.float32)
  per_line = jnp.sum(jnp.where(ok_BxM, ce_BxM, 0.0), -1) / jnp.maximum(count_B, 1.0)
  lines = jnp.sum(count_B > 0).astype(jnp.float32)
  return jnp.sum(per_line) / jnp.maximum(lines, 1.0), jnp.sum(count_B)
