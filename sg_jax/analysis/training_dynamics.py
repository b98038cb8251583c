"""Training dynamics across checkpoints: representational similarity (CKA), functional change
(TVD) and intrinsic dimension (TwoNN) of every checkpoint (docs/dynamics.md).

Three metric groups of `sg_jax.analyze`, computed on one fixed evaluation set: the first
`--dynamics_lines` (default 256) whole LM lines (`SOS` + source + target words) of the analysis's
sentence set (`--split`, `--sentence_set`), the same for every checkpoint and seed, one line
per row of padded batches of `--entropy_batch_size` lines (the model masks the padding for any
attention). The token representations are the residual stream `hidden` of
`intermediates.apply_with_intermediates` at every word position of the plain lines (SOS, whose
representation is the same for every line, left out):
`embedding` = hidden[0] (token embedding + positions), layer l = hidden[l + 1] (the output of
the model's `layer_l`, 0-based as in `attention_entropy_l{layer}_h{head}`).

* `cka`: linear CKA, minibatch form with the unbiased HSIC estimator (`cka`; Kornblith et al.
  2019, Nguyen et al. 2021), of each layer's token representations between this checkpoint and
  the final one (`cka_final_l{layer}`, `cka_final_embedding`) and the previous one
  (`cka_previous_*`); `cka_final` / `cka_previous` = the mean over the layers (embedding not
  included). The tokens go into minibatches of `cka.MINIBATCH` (256) by a fixed permutation
  (seeded by `--rng_seed`), the last incomplete minibatch left out.
* `tvd`: the mean of the total variation distance TV(p, q) = 1/2 sum_v |p(v) - q(v)| between
  the predictive distributions (softmax of the logits over the vocabulary) of this checkpoint
  and the previous one (`tvd_previous`) or the final one (`tvd_final`), over the positions the
  run's objective scores, on the inputs it makes of the lines (`Objective.lines` with a key
  fixed by `--rng_seed`, `predictive_inputs`): every next-token prediction (SOS .. wn) for
  `lm`, the masked positions of the masked lines for `mlm`, the output part for `prefix_lm`.
* `twonn`: the TwoNN intrinsic dimension (`twonn`; Facco et al. 2017) of each layer's
  representations (`twonn_dimension_l{layer}`; the embedding layer, a table lookup with at most
  vocabulary x length distinct points, is left out) and their mean over layers
  (`twonn_dimension`), on at most `TWONN_POINTS` word positions with distinct contexts (the
  first ones in the permutation; a causal model gives two positions with the same prefix the
  same representation, which TwoNN cannot use; for other attentions the context is the line).

"Previous" is the checkpoint before this one in the workdir (none at the first checkpoint: no
`*_previous` rows there) and "final" the last one when the analysis started
(`registry.References`); rows of consecutive quantities sit at the later checkpoint.
`sg_jax.analysis.phase_onsets` locates the transitions of these curves. Everything is written for one
seed and mapped over the seed axis with `registry.over_seeds`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import cka, registry, twonn
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM

Array = jax.Array
PyTree = Any

# Word positions (distinct contexts) the TwoNN estimate reads per checkpoint and seed.
TWONN_POINTS = 3000
GROUPS = ("cka", "tvd", "twonn")


@dataclasses.dataclass(frozen=True)
class Plan:
  """The evaluation set in padded rows, and which of its tokens each quantity reads.

  Attributes:
    tokens: int32 [batches, B, L] inputs `SOS w1 .. wn`, then `<pad>` = 0 (empty rows fill the
      last batch).
    targets: int32 [batches, B, L] targets `w1 .. wn EOS`, then 0.
    lengths: int32 [batches, B] non-padding input positions n + 1 (0 for empty rows).
    words: int32 [T] flat index into batches x B x L of every word position, in row order.
    minibatches: int32 [k, n] CKA minibatches, indices into `words`.
    points: int32 [M] TwoNN points (distinct contexts), indices into `words`.
    word_lines: int [T] the line (index into the caller's lines) of each word position.
    word_positions: int [T] its position in the line (1 = the first word, after SOS).
  """

  tokens: np.ndarray
  targets: np.ndarray
  lengths: np.ndarray
  words: np.ndarray
  minibatches: np.ndarray
  points: np.ndarray
  word_lines: np.ndarray
  word_positions: np.ndarray


@functools.lru_cache(maxsize=2)
def make_plan(lines: tuple[tuple[int, ...], ...], sos_id: int, rng_seed: int, *,
              rows: int = 64, causal: bool = True) -> Plan:
  """The `Plan` of a set of lines (cached: every checkpoint reads the same set).

  Args:
    lines: word ids (without SOS) of each line, at least one word each.
    sos_id: id of SOS (EOS is `sos_id - 1`, `tasks.vocab.Vocab`).
    rng_seed: seed of the permutation of the word positions.
    rows: lines per batch.
    causal: the model attends causally, so the context of a word is the line up to it (else
      the whole line), which decides the TwoNN points' distinct contexts.

  Raises:
    ValueError: an empty line, rows < 1, or fewer than 4 word positions.
  """
  if rows < 1 or any(len(line) == 0 for line in lines):
    raise ValueError(f"the dynamics set needs rows >= 1 and no empty line, got rows={rows}")
  num_batches = -(-len(lines) // rows)
  length = -(-(max(len(line) for line in lines) + 1) // 8) * 8
  tokens = np.zeros((num_batches * rows, length), np.int32)
  targets = np.zeros_like(tokens)
  lengths = np.zeros(num_batches * rows, np.int32)
  for i, line in enumerate(lines):
    tokens[i, :len(line) + 1] = (sos_id, *line)
    targets[i, :len(line) + 1] = (*line, sos_id - 1)
    lengths[i] = len(line) + 1
  position = np.arange(length)[None, :]
  is_word = (position >= 1) & (position < lengths[:, None])
  words = np.flatnonzero(is_word)
  if words.size < 4:
    raise ValueError(f"the dynamics set has {words.size} word positions; CKA needs at least 4")
  line_of, position_of = np.divmod(words, length)
  order = np.random.default_rng(rng_seed).permutation(words.size)
  n = min(cka.MINIBATCH, words.size)
  minibatches = order[:words.size // n * n].reshape(-1, n)
  seen, points = set(), []
  for t in order:
    line = lines[line_of[t]]
    context = tuple(line[:position_of[t]]) if causal else (tuple(line), int(position_of[t]))
    if context not in seen:
      seen.add(context)
      points.append(t)
      if len(points) == TWONN_POINTS:
        break
  shape = (num_batches, rows, length)
  return Plan(tokens.reshape(shape), targets.reshape(shape), lengths.reshape(shape[:2]),
              words.astype(np.int32), minibatches.astype(np.int32),
              np.asarray(points, np.int32), line_of, position_of)


@functools.lru_cache(maxsize=2)
def predictive_inputs(plan_key: tuple, objective: Any, rng_seed: int
                      ) -> tuple[np.ndarray, np.ndarray]:
  """The inputs and scored positions of the TV distances: the run's objective applied to the
  plan's lines with a fixed key (`Objective.lines`; cached per plan and objective).

  Args:
    plan_key: the `make_plan` arguments (lines, sos_id, rng_seed, rows, causal).
    objective: the run's `objectives.Objective` (None: the stored inputs, every target scored,
      as a causal LM is trained).
    rng_seed: seed of the objective's randomness (e.g. the masked LM's masked positions).

  Returns:
    (inputs int32 [batches, B, L], scored bool [batches, B, L]): next-token distributions at
    every position for `lm`, the masked positions' distributions on the masked lines for
    `mlm`, the output part's for `prefix_lm`.
  """
  plan = make_plan(*plan_key[:3], rows=plan_key[3], causal=plan_key[4])
  if objective is None:
    return plan.tokens, plan.targets != 0
  key = jax.random.key(rng_seed)
  inputs, targets = [], []
  for b in range(plan.tokens.shape[0]):
    x, y = objective.lines(jnp.asarray(plan.tokens[b]), jnp.asarray(plan.targets[b]),
                           jnp.asarray(plan.lengths[b]), jax.random.fold_in(key, b))
    inputs.append(np.asarray(x))
    targets.append(np.asarray(y))
  return np.stack(inputs), np.stack(targets) != 0


def _forward(params: PyTree, tokens_NxBxL: Array, *, config: ModelConfig
             ) -> tuple[Array, Array]:
  """(hidden [num_layers + 1, N * B * L, d_model] float32, log-probabilities [N * B * L, V]
  float32) of one seed on padded batches (the model masks the padding for any attention)."""
  model = TransformerLM(config)
  hidden, logp = [], []
  for b in range(tokens_NxBxL.shape[0]):
    logits, inter = apply_with_intermediates(model, params, tokens_NxBxL[b], deterministic=True)
    hidden.append(inter["hidden"].reshape(inter["hidden"].shape[0], -1, config.d_model))
    logp.append(jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(-1, logits.shape[-1]))
  return (jnp.concatenate(hidden, axis=1).astype(jnp.float32),
          jnp.concatenate(logp, axis=0))


def total_variation(logp_TxV: Array, logq_TxV: Array, weights_T: Array | None = None) -> Array:
  """Mean over positions of TV(p, q) = 1/2 sum_v |p(v) - q(v)| (float32 scalar in [0, 1]).

  Args:
    logp_TxV, logq_TxV: float [T, V] log-probabilities of two models at the same positions.
    weights_T: optional bool / float [T]: which positions count (default all).
  """
  tv_T = 0.5 * jnp.sum(jnp.abs(jnp.exp(logp_TxV) - jnp.exp(logq_TxV)), axis=-1)
  if weights_T is None:
    return jnp.mean(tv_T)
  weights_T = weights_T.astype(jnp.float32)
  return jnp.sum(tv_T * weights_T) / jnp.maximum(jnp.sum(weights_T), 1.0)


def dynamics_stats(params: tuple[PyTree, ...], tokens_NxBxL: Array, tvd_tokens_NxBxL: Array,
                   scored_NxBxL: Array, words_T: Array, minibatches_KxN: Array,
                   points_M: Array, *, config: ModelConfig, groups: tuple[str, ...],
                   own_tvd_pass: bool = False) -> dict[str, Array]:
  """The quantities of `groups` for ONE seed (module docstring).

  Args:
    params: (this checkpoint's,) or, when `groups` has 'cka' or 'tvd', (this, previous, final)
      checkpoints' parameters of one seed.
    tokens_NxBxL, words_T, minibatches_KxN, points_M: the `Plan` arrays.
    tvd_tokens_NxBxL, scored_NxBxL: `predictive_inputs`: the inputs of the TV distances and the
      positions they average over.
    config: model config (static).
    groups: the groups to compute, out of `GROUPS` (static).
    own_tvd_pass: the TV distances read other inputs than the representations (a masked LM's
      masked lines; static).

  Returns:
    dict with, per group asked: 'cka_previous', 'cka_final' float32 [num_layers + 1] (index 0 =
    embedding); 'tvd_previous', 'tvd_final' float32 []; 'twonn_ratio' float32
    [num_layers, M] (`twonn.ratios` of each layer's output).
  """
  scored = scored_NxBxL.reshape(-1)

  def features(p):
    hidden, logp = _forward(p, tokens_NxBxL, config=config)
    if own_tvd_pass and "tvd" in groups:
      logp = _forward(p, tvd_tokens_NxBxL, config=config)[1]
    return hidden[:, words_T], logp

  hidden, logp = features(params[0])
  out = {}
  if "twonn" in groups:
    out["twonn_ratio"] = jax.lax.map(lambda h_TxD: twonn.ratios(h_TxD[points_M]), hidden[1:])
  if "cka" in groups or "tvd" in groups:
    for name, other in (("previous", params[1]), ("final", params[2])):
      hidden_o, logp_o = features(other)
      if "cka" in groups:
        out[f"cka_{name}"] = jax.vmap(cka.minibatch_cka)(hidden[:, minibatches_KxN],
                                                         hidden_o[:, minibatches_KxN])
      if "tvd" in groups:
        out[f"tvd_{name}"] = total_variation(logp, logp_o, scored)
  return out


# params [S, ...] (each of the tuple) -> every value with a leading [S] axis.
dynamics_stats_over_seeds = registry.over_seeds(dynamics_stats)


def dynamics_metrics(params_S: PyTree, lines: Sequence[Sequence[int]], *, config: ModelConfig,
                     sos_id: int, groups: Sequence[str],
                     references: registry.References | None = None, rng_seed: int = 0,
                     seeds_per_call: int | None = None, objective: Any = None,
                     rows: int = 64) -> dict[str, np.ndarray]:
  """`dynamics_stats` of every seed, with the TwoNN fit done (numpy).

  Args:
    params_S: this checkpoint's parameters, leading seed axis [S, ...].
    lines: word ids (without SOS) of the evaluation lines.
    config: model config.
    sos_id: id of SOS.
    groups: groups out of `GROUPS`.
    references: the previous and final checkpoints' parameters of the same seeds (needed for
      'cka' and 'tvd'; at the first checkpoint `previous` is None and the '*_previous'
      values come back NaN).
    rng_seed: seed of the token permutation (`make_plan`) and of the objective's randomness
      (`predictive_inputs`).
    seeds_per_call: seeds per compiled call (None = all).
    objective: the run's `objectives.Objective` (None: a causal LM's next-token distributions).
    rows: lines per forward pass.

  Returns:
    numpy dict: 'cka_previous', 'cka_final' [S, num_layers + 1]; 'tvd_previous', 'tvd_final'
    [S]; 'twonn_dimension' [S, num_layers]; per group asked.

  Raises:
    ValueError: an unknown group, 'cka' / 'tvd' without references, or as `make_plan`.
  """
  groups = tuple(sorted(set(groups)))
  unknown = set(groups) - set(GROUPS)
  if unknown:
    raise ValueError(f"unknown training-dynamics groups {sorted(unknown)}; expected {GROUPS}")
  compare = bool({"cka", "tvd"} & set(groups))
  if compare and references is None:
    raise ValueError("cka and tvd compare checkpoints and need Inputs.references")
  plan_key = (tuple(tuple(int(w) for w in s) for s in lines), int(sos_id), int(rng_seed),
              int(rows), config.attention == "causal")
  plan = make_plan(*plan_key[:3], rows=plan_key[3], causal=plan_key[4])
  tvd_tokens, scored = predictive_inputs(plan_key, objective, int(rng_seed))
  arrays = (plan.tokens, tvd_tokens, scored, plan.words, plan.minibatches, plan.points)
  own_pass = not np.array_equal(tvd_tokens, plan.tokens)
  params = (params_S,)
  if compare:
    previous = references.previous if references.previous is not None else params_S
    params = (params_S, previous, references.final)
  out = registry.in_seed_chunks(
      lambda p: dynamics_stats_over_seeds(p, *arrays, config=config, groups=groups,
                                          own_tvd_pass=own_pass),
      params, seeds_per_call)
  if compare and references.previous is None:
    out.update({k: np.full_like(v, np.nan) for k, v in out.items() if k.endswith("_previous")})
  if "twonn_ratio" in out:
    mu = out.pop("twonn_ratio")
    out["twonn_dimension"] = np.array([[twonn.dimension(m) for m in seed] for seed in mu])
  return out


def _compute(inputs: registry.Inputs) -> dict[str, Any]:
  """The columns of the asked groups [S] (module docstring); no `*_previous` rows at the first
  checkpoint."""
  out = dynamics_metrics(inputs.params, inputs.lines[:inputs.options.dynamics_lines],
                         config=inputs.config, sos_id=inputs.sos_id, groups=inputs.groups,
                         references=inputs.references, rng_seed=inputs.options.rng_seed,
                         seeds_per_call=inputs.options.seeds_per_call,
                         objective=inputs.objective, rows=inputs.options.entropy_batch_size)
  first = inputs.references is None or inputs.references.previous is None
  columns = {}
  for kind, name in (("cka", "final"), ("cka", "previous"), ("tvd", "final"),
                     ("tvd", "previous")):
    key = f"{kind}_{name}"
    if key not in out:
      continue
    if name == "previous" and first:
      columns[key] = [None] * len(inputs.seeds)
      continue
    values = out[key]
    if kind == "tvd":
      columns[key] = values
      continue
    columns[key] = np.mean(values[:, 1:], axis=1)
    columns[f"{key}_embedding"] = values[:, 0]
    for layer in range(values.shape[1] - 1):
      columns[f"{key}_l{layer}"] = values[:, layer + 1]
  if "twonn_dimension" in out:
    dims = out["twonn_dimension"]
    columns["twonn_dimension"] = np.mean(dims, axis=1)
    for layer in range(dims.shape[1]):
      columns[f"twonn_dimension_l{layer}"] = dims[:, layer]
  return columns


registry.register_quantity(registry.Quantity(
    name="training_dynamics",
    groups=(
        registry.Group("cka", ("cka_final", "cka_final_embedding", "cka_final_l{layer}",
                               "cka_previous", "cka_previous_embedding",
                               "cka_previous_l{layer}"), inputs=("lines", "references")),
        registry.Group("tvd", ("tvd_final", "tvd_previous"), inputs=("lines", "references")),
        registry.Group("twonn", ("twonn_dimension", "twonn_dimension_l{layer}"),
                       inputs=("lines",)),
    ),
    compute=_compute,
    dynamics=(
        registry.Dynamic("cka_final", axis="linear CKA with the final checkpoint (mean over "
                         "layers)", title="Representational similarity to the final checkpoint "
                         "(minibatch linear CKA)", label="CKA to final"),
        registry.Dynamic("tvd_previous", axis="mean TV distance of the predictive distributions",
                         title="Functional change between consecutive checkpoints (TVD)",
                         label="TVD to previous"),
        registry.Dynamic("twonn_dimension", axis="TwoNN intrinsic dimension (mean over layers)",
                         title="Intrinsic dimension of the token representations (TwoNN)",
                         label="intrinsic dimension"),
    ),
))
