"""Tree projections of a transformer LM: tscore and tparseval (Murty et al., ICLR 2023,
"Characterizing intrinsic compositionality in transformers with tree projections", §3-4, as used
by Murty et al., ACL 2023, §5; `docs/REFERENCE.md` §1 "Analysis quantities").

A sentence is the DECLARATIVE part of a line: the words before the task token with the final "."
removed, n words w_0 .. w_{n-1}; the model input is `SOS w_0 .. w_{n-1}`. Its SCI chart (how
close each span's context-free representation is to its contextual one: `sci_chart`) gives a
projected binary tree and its tscore (`projected_trees`); tparseval compares the projected trees
with gold trees (`parseval`). The host-side packing of the context-free passes is `packing`.
A causal model (`lm`) runs one pass per start position (`packed_sci_chart`); a bidirectional or
prefix model (`mlm`, `prefix_lm`) one pass per span, restricted to the span
(`span_sci_chart`), as the layout 'packed' chooses by the model's attention.

This module holds the batch statistics (sums over a batch of sentences for ONE seed, mapped over
seeds by `registry.over_seeds`), the driver over a whole sentence set for every seed
(`tree_projection_metrics`) and the `tscore` / `tparseval` metric groups of `sg_jax.analyze`.
The names of the modules above are importable from here as well.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sg_jax.analysis import span_packing, parseval, pipeline, registry
# The names of the chart, tree and packing modules, importable from here as before the split.
from sg_jax.analysis.span_packing import (SpanPasses, StartPasses, first_fit_decreasing,
                                          pack_segments, pack_span_passes, pack_start_passes,
                                          packed_mask, start_pass_words)  # noqa: F401
from sg_jax.analysis.projected_trees import (METHODS, NORMALISATIONS,  # noqa: F401
                                             _check_options, cky_splits, greedy_splits,
                                             nodes_to_tree, project_tree,
                                             random_tree_expectation, split_scores, tree_score)
from sg_jax.analysis.sci_chart import (last_hidden, naive_sci_chart,  # noqa: F401
                                       packed_sci_chart, packed_sci_chart_over_seeds, sci_chart,
                                       sci_chart_over_seeds, span_batch_sci_chart,
                                       span_sci_chart, valid_spans)
from sg_jax.models.model_config import ModelConfig

Array = jax.Array
PyTree = Any


def span_uniforms(key: Array, row_ids_B: Array, max_words: int) -> Array:
  """float32 [B, N, N] uniform [0, 1) draws for span (i, j) of sentence `row_ids_B[b]`.

  Each draw depends only on (key, sentence id, i, j), not on the batch it is computed in or on
  the padding, so random-split tscores do not depend on how sentences are batched.
  """
  r = jnp.arange(max_words)

  def one(row):
    k = jax.random.fold_in(key, row)
    draw = lambda i, j: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(k, i), j))
    return jax.vmap(lambda i: jax.vmap(lambda j: draw(i, j))(r))(r)

  return jax.vmap(one)(jnp.maximum(row_ids_B, 0).astype(jnp.uint32))


def chart_stats(chart_BxNxN: Array, num_words_B: Array, gold_spans_BxNxN: Array | None,
                key: Array, row_ids_B: Array | None = None, *, method: str = "greedy",
                normalisation: str = "random_split", details: bool = False) -> dict[str, Array]:
  """Tree-projection sums of a batch of SCI charts (pure, jit-able; options static).

  Args:
    chart_BxNxN: float32 [B, N, N] charts (`sci_chart`, `packed_sci_chart`).
    num_words_B: int32 [B] n per sentence; 0 marks batch-padding rows (ignored everywhere).
    gold_spans_BxNxN: bool [B, N, N] gold brackets (`parseval.gold_span_matrices`) or None.
    key: PRNG key for the random splits of 'random_split' (same draws for every seed when vmapped).
    row_ids_B: int [B] sentence ids that, with `key`, determine each sentence's random draws
      (`span_uniforms`); default 0..B-1.
    method / normalisation: see module docstring.
    details: also return 'chart' [B, N, N], 'nodes' [B, N - 1, 3] and per-sentence 'tscore' [B].

  Returns:
    dict of sums over the batch: 'tscore_sum', 'num_sentences' and, with gold spans,
    'bracket_matched', 'bracket_predicted', 'bracket_gold' (float32 scalars) and the same per
    sentence length ('bracket_*_by_length', [parseval.LENGTH_BINS]); see `finalize_stats`.

  Raises:
    ValueError: unknown method or normalisation.
  """
  _check_options(method, normalisation)
  chart = chart_BxNxN
  n_max = chart.shape[-1]
  nodes = jax.vmap(functools.partial(project_tree, method=method))(chart, num_words_B)
  if row_ids_B is None:
    row_ids_B = jnp.arange(chart.shape[0])
  uniform = span_uniforms(key, row_ids_B, n_max)
  score_B = jax.vmap(functools.partial(tree_score, normalisation=normalisation))(
      chart, num_words_B, nodes, uniform_NxN=uniform)
  real_B = num_words_B > 0
  out = {"tscore_sum": jnp.sum(jnp.where(real_B, score_B, 0.0)),
         "num_sentences": jnp.sum(real_B).astype(jnp.float32)}
  for name, baseline_B in baseline_tscores(chart, num_words_B, uniform,
                                           normalisation=normalisation).items():
    out[f"{name}_sum"] = jnp.sum(jnp.where(real_B, baseline_B, 0.0))
  if gold_spans_BxNxN is not None:
    pred = jax.vmap(lambda nd: parseval.node_span_matrix(nd, n_max))(nodes)
    gold = gold_spans_BxNxN & real_B[:, None, None]
    out.update(parseval.bracket_counts(pred, gold))
    out.update(parseval.bracket_counts_by_length(pred, gold, num_words_B))
  if details:
    out.update(chart=chart, nodes=nodes, tscore=score_B)
  return out


def branching_nodes(num_words: Array, n_max: int, *, right: bool) -> Array:
  """int32 [n_max - 1, 3] nodes (i, k, j) of the right-branching (w0 (w1 (w2 ...))) or
  left-branching (((w0 w1) w2) ...) tree over `num_words` words, pre-order, -1 padded."""
  t = jnp.arange(max(n_max - 1, 0))
  n = jnp.asarray(num_words, jnp.int32)
  last = n - 1
  nodes = (jnp.stack([t, t, jnp.broadcast_to(last, t.shape)], -1) if right else
           jnp.stack([jnp.zeros_like(t), last - 1 - t, last - t], -1))
  return jnp.where((t < last)[:, None], nodes, -1).astype(jnp.int32)


# The trees whose tscore is written beside the projected tree's (`baseline_tscores`).
TSCORE_BASELINES = ("tscore_random_tree", "tscore_right_branching", "tscore_left_branching")


def baseline_tscores(chart_BxNxN: Array, num_words_B: Array, uniform_BxNxN: Array, *,
                     normalisation: str = "random_split") -> dict[str, Array]:
  """tscore of trivial trees under the same chart, normalisation and random draws as the
  projected tree's (`tree_score`), per sentence (float32 [B] each; 0 for n <= 1).

  * 'tscore_random_tree': the exact expectation over random binary trees grown by uniform
    splits (`parseval.random_tree_span_probabilities`), E_T[SCI(T)] minus the expected
    normalisation at T's nodes. It is 0 by construction for 'split_mean' and 'random_tree'
    (the normalisation is that expectation: Murty et al., ICLR 2023, §3, define tscore as the
    projected tree's score relative to random trees), 0 in expectation over the draws for
    'random_split' (the given draws leave a small remainder), and E_T[SCI(T)] for 'none'.
  * 'tscore_right_branching', 'tscore_left_branching': the score of the right- / left-branching
    tree, the shape a causal LM's chart can favour without any constituency.
  """
  n_max = chart_BxNxN.shape[-1]
  prob = jnp.asarray(np.stack([np.pad(parseval.random_tree_span_probabilities(max(n, 1)),
                                      ((0, n_max - max(n, 1)), (0, n_max - max(n, 1))))
                               for n in range(n_max + 1)]), jnp.float32)  # [N + 1, N, N]

  def one(chart, n, uniform):
    scores, valid = split_scores(chart)
    mean = jnp.sum(jnp.where(valid, scores, 0.0), -1) / jnp.maximum(
        jnp.sum(valid, -1), 1).astype(jnp.float32)
    p = prob[jnp.clip(n, 0, n_max)]
    expected_sci = jnp.sum(p * mean)  # E_T[SCI(T)]: a node's split is uniform given the node
    if normalisation == "random_split":
      r = jnp.arange(n_max)
      i, j = r[:, None], r[None, :]
      kr = jnp.clip(i + jnp.floor(uniform * (j - i)).astype(jnp.int32), i, jnp.maximum(j - 1, i))
      drawn = jnp.take_along_axis(scores, kr[..., None], axis=-1)[..., 0]
      random_tree = expected_sci - jnp.sum(p * drawn)
    elif normalisation == "none":
      random_tree = expected_sci
    else:  # split_mean, random_tree: the normalisation is E_T[SCI(T)] itself
      random_tree = jnp.zeros((), jnp.float32)
    score = lambda right: tree_score(chart, n, branching_nodes(n, n_max, right=right),
                                     normalisation=normalisation, uniform_NxN=uniform)
    return {"tscore_random_tree": jnp.where(n >= 2, random_tree, 0.0),
            "tscore_right_branching": score(True), "tscore_left_branching": score(False)}

  return jax.vmap(one)(chart_BxNxN, num_words_B, uniform_BxNxN)


def tree_projection_stats(params: PyTree, tokens_BxL: Array, num_words_B: Array,
                          gold_spans_BxNxN: Array | None, key: Array,
                          row_ids_B: Array | None = None, *, config: ModelConfig,
                          method: str = "greedy", normalisation: str = "random_split",
                          details: bool = False) -> dict[str, Array]:
  """Tree-projection sums of one padded batch for ONE seed, masked layout (`sci_chart`).

  Args:
    params: ONE seed's parameters.
    tokens_BxL: int32 [B, L] `SOS w_0 .. w_{n-1}` + padding (declarative words).
    num_words_B, gold_spans_BxNxN, key, row_ids_B, method, normalisation, details: see
      `chart_stats` (N = L - 1).

  Returns:
    `chart_stats`'s dict.
  """
  _check_options(method, normalisation)
  chart = sci_chart(params, tokens_BxL, num_words_B, config=config)
  return chart_stats(chart, num_words_B, gold_spans_BxNxN, key, row_ids_B, method=method,
                     normalisation=normalisation, details=details)


def packed_tree_projection_stats(params: PyTree, passes: StartPasses | SpanPasses,
                                 gold_spans_BxNxN: Array | None, key: Array,
                                 row_ids_B: Array | None = None, *, config: ModelConfig,
                                 method: str = "greedy", normalisation: str = "random_split",
                                 details: bool = False) -> dict[str, Array]:
  """Tree-projection sums of one packed batch for ONE seed: start passes (`packed_sci_chart`,
  causal models) or span passes (`span_sci_chart`, any attention: the one for bidirectional and
  prefix models).

  Args:
    params: ONE seed's parameters.
    passes: from `pack_start_passes` or `pack_span_passes` (B sentences of at most N words;
      `passes.num_words`).
    gold_spans_BxNxN, key, row_ids_B, method, normalisation, details: see `chart_stats`.

  Returns:
    `chart_stats`'s dict.
  """
  _check_options(method, normalisation)
  chart_fn = span_sci_chart if isinstance(passes, SpanPasses) else packed_sci_chart
  chart = chart_fn(params, passes, config=config)
  return chart_stats(chart, jnp.asarray(passes.num_words), gold_spans_BxNxN, key, row_ids_B,
                     method=method, normalisation=normalisation, details=details)


# params [S, ...] -> every output with a leading [S] axis.
tree_projection_stats_over_seeds = registry.over_seeds(tree_projection_stats)
packed_tree_projection_stats_over_seeds = registry.over_seeds(packed_tree_projection_stats)


def finalize_stats(stats: dict[str, Array]) -> dict[str, Array]:
  """Summed stats (optionally with a seed axis) -> 'tscore' and, if present, 'tparseval_f1',
  'tparseval_precision', 'tparseval_recall' (corpus level), 'tparseval_f1_by_length'
  ([..., parseval.LENGTH_BINS]: the corpus F1 of the sentences of each length) and
  'tparseval_gold_by_length' (their gold bracket counts; 0 = no sentence of that length)."""
  out = {"tscore": stats["tscore_sum"] / jnp.maximum(stats["num_sentences"], 1.0)}
  for name in TSCORE_BASELINES:
    if f"{name}_sum" in stats:
      out[name] = stats[f"{name}_sum"] / jnp.maximum(stats["num_sentences"], 1.0)
  if "bracket_matched" in stats:
    p, r, f1 = parseval.precision_recall_f1(
        stats["bracket_matched"], stats["bracket_predicted"], stats["bracket_gold"])
    out.update(tparseval_f1=f1, tparseval_precision=p, tparseval_recall=r)
  if "bracket_matched_by_length" in stats:
    _, _, f1 = parseval.precision_recall_f1(stats["bracket_matched_by_length"],
                                            stats["bracket_predicted_by_length"],
                                            stats["bracket_gold_by_length"])
    out.update(tparseval_f1_by_length=f1, tparseval_gold_by_length=stats["bracket_gold_by_length"])
  return out


def _gold_span_batch(indices, gold, n_max: int):
  """[rows, n_max, n_max] bool device array of the gold spans of each row's sentence (`indices`:
  sentence index per row, -1 for a filler row left all False), or None without gold trees."""
  if gold is None:
    return None
  spans = np.zeros((len(indices), n_max, n_max), bool)
  for row, s in enumerate(indices):
    if s >= 0:
      spans[row] = parseval.span_matrix(gold[s], n_max)
  return jnp.asarray(spans)


@functools.lru_cache(maxsize=4)
def _tree_plan(sentences: tuple[tuple[int, ...], ...], sos_id: int, batch_size: int,
               gold: tuple | None, spans: bool = False) -> list[tuple[Any, tuple]]:
  """The packed batches of a sentence set with their device arrays (passes, row ids and gold
  span matrices), cached: an analysis of several checkpoints on the same sentences plans and
  transfers them once. `spans`: the span passes (`pipeline.make_span_pass_batches`) instead
  of the start passes."""
  out = []
  make = pipeline.make_span_pass_batches if spans else pipeline.make_start_pass_batches
  for batch in make(sentences, sos_id=sos_id, batch_size=batch_size):
    n_max = (batch.passes.span_segment if spans else batch.passes.gather).shape[-1]
    gold_spans = _gold_span_batch(batch.indices, gold, n_max)
    passes = type(batch.passes)(*(jnp.asarray(a) for a in batch.passes))
    out.append((batch, (passes, gold_spans, jnp.asarray(batch.indices, jnp.int32))))
  return out


# 'packed': the packed passes the model's attention allows (start passes for causal models, span
# passes otherwise); 'spans': the span passes whatever the attention (a reference for causal
# models); 'masked': the earlier full-length start passes (causal models only).
LAYOUTS = ("packed", "masked", "spans")


def tree_projection_metrics(params_S: PyTree, sentences: Sequence[Sequence[int]], *,
                            config: ModelConfig, sos_id: int, key: jax.Array,
                            gold_trees: Sequence[Any] | None = None, batch_size: int = 16,
                            method: str = "greedy", normalisation: str = "random_split",
                            seeds_per_call: int | None = None, details: bool = False,
                            progress: Any = None, layout: str = "packed") -> dict[str, Any]:
  """tscore and tparseval over a set of declarative sentences for every seed.

  Args:
    params_S: parameters with a leading seed axis [S, ...].
    sentences: word ids of each declarative part (`pipeline.declarative_words`), without SOS.
    config: model config.
    sos_id: SOS id.
    key: PRNG key for the random-split normalisation (shared by all seeds; each sentence's draws
      depend only on the key and its index, so results do not depend on `batch_size`).
    gold_trees: optional nested-tuple gold trees, one per sentence (leaf count must equal the
      sentence length); enables tparseval.
    batch_size: sentences per compiled call (on average with the packed layout, whose batches
      hold a fixed number of tokens: `make_start_pass_batches`), vmapped over seeds.
    method, normalisation: see `projected_trees`.
    seeds_per_call: process this many seeds per compiled call (None = all).
    details: also return per-sentence 'charts' (list of [S, n, n]), 'trees_nodes' (list of
      [S, n - 1, 3]) and 'tscore_per_sentence' [S, num_sentences], in input order.
    progress: optional callable(int) called with the number of sentences finished per batch.
    layout: 'packed' (the default: for a causal model the shortened start passes packed into
      rows, for a bidirectional or prefix model the span passes), 'spans' (the span passes for
      any model) or 'masked' (the earlier full-length masked start passes of a causal model,
      same values; kept as a reference).

  Returns:
    dict: 'tscore' [S] and with gold trees 'tparseval_f1', 'tparseval_precision',
    'tparseval_recall' [S] (numpy float32), plus the details.

  Raises:
    ValueError: a gold tree's leaf count differs from its sentence length, an unknown layout,
      'masked' for a model that is not causal, or an empty sentence.
  """
  if layout not in LAYOUTS:
    raise ValueError(f"unknown tree-projection layout {layout!r}; expected one of {LAYOUTS}")
  if layout == "masked" and config.attention != "causal":
    raise ValueError(f"the masked tree-projection layout needs a causal model; this one's "
                     f"attention is {config.attention!r}")
  gold_spans = None
  if gold_trees is not None:
    if len(gold_trees) != len(sentences):
      raise ValueError(f"{len(gold_trees)} gold trees for {len(sentences)} sentences")
    gold_spans = []
    for b, tree in enumerate(gold_trees):
      n_leaves = len(parseval.tree_leaves(tree))
      if n_leaves != len(sentences[b]):
        raise ValueError(f"gold tree {b} has {n_leaves} leaves but the sentence has "
                         f"{len(sentences[b])} words")
      gold_spans.append(parseval.tree_spans(tree))
  options = dict(config=config, method=method, normalisation=normalisation, details=details)
  if layout != "masked":
    spans_layout = layout == "spans" or config.attention != "causal"
    gold_key = None if gold_spans is None else tuple(tuple(sorted(g)) for g in gold_spans)
    planned = _tree_plan(tuple(tuple(int(w) for w in s) for s in sentences), int(sos_id),
                         int(batch_size), gold_key, spans_layout)
    stats_fn = packed_tree_projection_stats_over_seeds

    def calls(params):
      for batch, (passes, spans, row_ids) in planned:
        stats = stats_fn(params, passes, spans, key, row_ids, **options)
        yield batch, batch.passes.num_words, stats
  else:
    batches = pipeline.make_batches(sentences, sos_id=sos_id, batch_size=batch_size)

    def calls(params):
      for batch in batches:
        n_max = batch.tokens.shape[1] - 1
        spans = _gold_span_batch(batch.indices, gold_spans, n_max)
        yield batch, batch.num_words, tree_projection_stats_over_seeds(
            params, jnp.asarray(batch.tokens), jnp.asarray(batch.num_words), spans, key,
            jnp.asarray(batch.indices, jnp.int32), **options)

  def chunk(params):
    total, kept = None, []
    for batch, num_words, stats in calls(params):
      if details:  # fetched after the loop, so that the calls stay asynchronous
        kept.append((batch.indices, num_words,
                     {k: stats.pop(k) for k in ("chart", "nodes", "tscore")}))
      total = registry.accumulate(total, stats)
      if progress is not None:
        progress(int(np.sum(batch.indices >= 0)))
    out = dict(finalize_stats(total))
    if details:
      charts, nodes = [None] * len(sentences), [None] * len(sentences)
      scores = None
      for indices, num_words, held in kept:
        chart, nd, sc = (np.asarray(held[k]) for k in ("chart", "nodes", "tscore"))
        if scores is None:
          scores = np.zeros((sc.shape[0], len(sentences)), np.float32)
        for row, s in enumerate(indices):
          if s >= 0:
            n = int(num_words[row])
            charts[s] = chart[:, row, :n, :n]
            nodes[s] = nd[:, row, :max(n - 1, 0)]
            scores[:, s] = sc[:, row]
      out.update(charts=charts, trees_nodes=nodes, tscore_per_sentence=scores)
    return out

  return registry.in_seed_chunks(chunk, params_S, seeds_per_call)



def _compute(inputs: registry.Inputs) -> dict[str, Any]:
  """tscore with the tscore of random (expected), right- and left-branching trees under the same
  chart (`baseline_tscores`) and, when tparseval is asked for, tparseval_{f1,precision,recall}
  [S], the parse baselines' F1 on the same gold trees (`parseval.baseline_parseval`, the same
  for every seed)
  and tparseval F1 per sentence length (`tparseval_f1_length<n>`, n words)."""
  options = inputs.options
  out = tree_projection_metrics(
      inputs.params, inputs.declaratives, config=inputs.config, sos_id=inputs.sos_id,
      key=jax.random.PRNGKey(options.rng_seed), gold_trees=inputs.gold_trees,
      batch_size=options.batch_size, method=options.method,
      normalisation=options.normalisation, seeds_per_call=options.seeds_per_call)
  columns = {k: out[k] for k in ("tscore", *TSCORE_BASELINES, "tparseval_f1",
                                 "tparseval_precision", "tparseval_recall") if k in out}
  if "tparseval_f1" in out:
    num_seeds = len(columns["tparseval_f1"])
    baselines = parseval.baseline_parseval(inputs.gold_trees)
    for name in parseval.BASELINES:
      columns[f"tparseval_f1_{name}"] = np.full(num_seeds, baselines[name], np.float32)
    f1_by_length = np.asarray(out["tparseval_f1_by_length"])
    for n in np.nonzero(np.asarray(out["tparseval_gold_by_length"])[0] > 0)[0]:
      columns[f"tparseval_f1_length{n}"] = f1_by_length[:, n]
  return columns


registry.register_quantity(registry.Quantity(
    name="tree_projection",
    groups=(registry.Group("tscore", ("tscore", *TSCORE_BASELINES), inputs=("declaratives",)),
            registry.Group("tparseval", ("tparseval_f1", "tparseval_precision",
                                         "tparseval_recall", "tparseval_f1_right_branching",
                                         "tparseval_f1_left_branching", "tparseval_f1_random",
                                         "tparseval_f1_length{n}"),
                           inputs=("declaratives", "gold_trees"))),
    compute=_compute,
    dynamics=(
        registry.Dynamic("tscore", axis="tscore (tree-structuredness, unitless)",
                         title="Tree-structuredness (tscore)", label="tscore", trajectory_row=1,
                         trajectory_axis="tscore / tparseval F1", in_summary=True),
        # The tscore baselines change with the checkpoint (no constant level to draw): the
        # report's "Baselines" section quotes them (sg_jax/report/baselines.py).
        registry.Dynamic("tparseval_f1",
                         axis="tparseval (bracketing F1 vs gold trees, fraction)",
                         title="Projected trees vs gold trees (tparseval F1)",
                         label="tparseval F1", trajectory_row=1, in_summary=True)) + tuple(
        registry.Dynamic(f"tparseval_f1_{name}", axis="bracketing F1 vs gold trees (fraction)",
                         title=f"{name.replace('_', '-')} trees vs gold trees",
                         label=f"{name.replace('_', '-')} F1", in_summary=True,
                         reference_for="tparseval_f1")
        for name in parseval.BASELINES),
))
