"""UAS and the SAS penalty under the attention of each objective (sg_jax/analysis/uas.py,
sg_jax/terms/sas.py; docs/sas.md): a bidirectional model's arcs scored in both of the original's
directions (dependent -> head rows, the transposed head <- dependent columns), a prefix model's
in the later token's row with the candidates its mask allows; hand-built attention with known
scores, and the vectorised sums against naive loops over arcs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import tasks
from sg_jax.analysis import uas
from sg_jax.models.intermediates import apply_with_intermediates
from sg_jax.models.model_config import ModelConfig
from sg_jax.models.transformer import TransformerLM, init_params
from sg_jax.tasks import dependencies
from sg_jax.terms import sas

SPECIAL = np.array([0, 98, 99], np.int32)  # pad, EOS, SOS of the hand-built lines
REL = {r: i for i, r in enumerate(dependencies.RELATIONS)}
QUEST = 9
# "the walrus does move ." at positions 1..5 after SOS, one padding slot: det 1->2, nsubj 2->4,
# aux 3->4
LINE = np.array([[99, 1, 2, 3, 4, 5, 0]], np.int32)
ARCS = [(1, 2, "det"), (2, 4, "nsubj"), (3, 4, "aux")]


def _arcs(lines_arcs, length):
  a = dependencies.dependency_arrays(lines_arcs, length)
  return a["dep_head"], a["dep_relation"]


def _scores(att, inputs, arcs, attention, prefix_end_ids=()):
  heads, rels = _arcs(arcs, inputs.shape[1])
  stats = uas.attention_uas_stats(jnp.asarray(att, jnp.float32), inputs, heads, rels, SPECIAL,
                                  attention=attention, prefix_end_ids=prefix_end_ids)
  return stats, uas.finalize(jax.tree_util.tree_map(lambda x: np.asarray(x)[None], stats), 1)


def test_bidirectional_scores_both_directions_on_hand_built_attention():
  # head 0: every row puts all its mass on one token (the dependents on their heads; 'move'
  # on 'walrus', '.' on 'move'); head 1: uniform over the 6 real tokens.
  att = np.zeros((1, 1, 2, 7, 7), np.float32)
  for row, col in ((0, 0), (1, 2), (2, 4), (3, 4), (4, 2), (5, 4), (6, 0)):
    att[0, 0, 0, row, col] = 1.0
  att[0, 0, 1, :, :6] = 1 / 6
  stats, out = _scores(att, LINE, [ARCS], "bidirectional")
  assert stats["hits"].shape == (1, 2, 2, len(REL))
  # dependent -> head (rows): head 0 right on all 3 arcs; head 1 ties the 4 candidates (the
  # real words but the row itself: SOS and padding never count).
  # head <- dependent (columns): head 0, column 1 is all 0 among rows 2..5 (1/4 for row 2),
  # column 2 has 1.0 in rows 1 and 4 (1/2 for row 4), column 3 is all 0 (1/4 for row 4).
  np.testing.assert_allclose(out["uas_head_direction"][0], [[[1, 1 / 3], [1 / 4, 1 / 4]]],
                             rtol=1e-6)
  np.testing.assert_allclose(out["uas_direction"][0], [1, 1 / 3], rtol=1e-6)
  np.testing.assert_allclose(out["uas_head"][0], [[1, 1 / 4]], rtol=1e-6)
  assert out["uas"][0] == pytest.approx(1.0)
  # weights: A[dependent, head] and A[head, dependent] = A[2,1], A[4,2], A[4,3] = 0, 1, 0
  np.testing.assert_allclose(out["weight_head_direction"][0],
                             [[[1, 1 / 3], [1 / 6, 1 / 6]]], rtol=1e-6)
  np.testing.assert_allclose(out["uas_relation"][0, [REL["det"], REL["nsubj"], REL["aux"]]],
                             [1, 1, 1])
  # the transposed map alone: a head whose rows are the transpose of head 0's gold pattern
  trans = np.zeros((1, 1, 1, 7, 7), np.float32)
  for dep, head, _ in ARCS:
    trans[0, 0, 0, head, dep] = 1.0  # the head attends to its dependents only
  trans /= np.maximum(trans.sum(-1, keepdims=True), 1)
  _, out = _scores(trans, LINE, [ARCS], "bidirectional")
  # column 1: row 2 (its head) is the only nonzero; columns 2, 3: row 4 shares 1/2 with no one
  np.testing.assert_allclose(out["uas_direction"][0, 1], 1.0)
  np.testing.assert_allclose(out["weight_direction"][0, 1], (1 + 0.5 + 0.5) / 3, rtol=1e-6)


def test_prefix_scores_the_later_row_with_the_candidates_its_mask_allows():
  # SOS a b quest c d: arc (1 -> 2) inside the input part, arc (4 -> 3) in the output part
  inputs = np.array([[99, 1, 2, QUEST, 3, 4, 0]], np.int32)
  arcs = [[(1, 2, "det"), (4, 3, "obj")]]
  att = np.zeros((1, 1, 1, 7, 7), np.float32)
  att[0, 0, 0, 2, [0, 1, 3]] = [0.1, 0.3, 0.6]  # row 2 sees the whole input part (0..3)
  att[0, 0, 0, 4, [1, 2, 3]] = [0.2, 0.3, 0.5]  # row 4 sees 0..4
  stats, out = _scores(att, inputs, arcs, "prefix", (QUEST,))
  assert stats["hits"].shape[2] == 1  # one direction, as causal
  # row 2's candidates are 1 and 3 (the later quest counts): 3 wins, a miss; row 4's are 1..3
  np.testing.assert_allclose(out["uas"], [0.5])
  np.testing.assert_allclose(out["uas_weight"], [(0.3 + 0.5) / 2], rtol=1e-6)
  # the causal definition on the same numbers sees only the earlier columns: both hits
  _, causal = _scores(att, inputs, arcs, "causal")
  np.testing.assert_allclose(causal["uas"], [1.0])
  with pytest.raises(ValueError, match="attention must be one of"):
    uas.directions("sideways")


def _visible(inputs, attention):
  """Numpy mask [B, L, L] of each attention, written out from its definition."""
  b, length = inputs.shape
  real = inputs != 0
  if attention == "causal":
    return np.broadcast_to(np.tril(np.ones((length, length), bool)), (b, length, length))
  if attention == "bidirectional":
    return np.broadcast_to(real[:, None, :], (b, length, length))
  out = np.zeros((b, length, length), bool)
  for n in range(b):
    task = [p for p in range(length) if inputs[n, p] == QUEST]
    end = task[0] if task else length - 1
    for q in range(length):
      for k in range(length):
        out[n, q, k] = k <= q or (k <= end and real[n, k])
  return out


def naive_stats(att, inputs, heads, rels, attention, special):
  """The module docstring's definitions, one arc, direction and head at a time."""
  num_layers, _, num_heads, _, length = att.shape
  dirs = uas.directions(attention)
  vis = _visible(inputs, attention)
  hits = np.zeros((num_layers, num_heads, len(dirs), len(REL)))
  weight = np.zeros_like(hits)
  count = np.zeros(len(REL))
  for b in range(inputs.shape[0]):
    ok = lambda c, b=b: inputs[b, c] not in special
    for d in range(length):
      h = heads[b, d]
      if h < 0:
        continue
      count[rels[b, d]] += 1
      for k, name in enumerate(dirs):
        for layer in range(num_layers):
          for m in range(num_heads):
            a = att[layer, b, m]
            if name == "head_to_dependent":
              cands = [q for q in range(length) if vis[b, q, d] and q != d and ok(q)]
              values, gold, w = a[:, d], h, a[h, d]
            else:
              row, gold = (max(d, h), min(d, h)) if name == "later_to_earlier" else (d, h)
              cands = [c for c in range(length) if vis[b, row, c] and c != row and ok(c)]
              values, w = a[row], a[row, gold]
            top = max(values[c] for c in cands)
            winners = [c for c in cands if values[c] == top]
            hits[layer, m, k, rels[b, d]] += (gold in winners) / len(winners)
            weight[layer, m, k, rels[b, d]] += w
  return hits, weight, count


@pytest.mark.parametrize("attention", ["bidirectional", "prefix", "causal"])
def test_vectorised_equals_naive_loop_on_real_lines(attention):
  task = tasks.get_task("question")
  vocab = task.vocab()
  data = task.generate_examples(seed=5, sizes={"train": 5, "dev": 2, "test": 2, "gen": 3})
  lines = [(vocab.encode(ex.words), task.gold_dependencies(ex))
           for ex in data["train"] + data["gen"]]
  batch = uas.line_batches(lines, sos_id=vocab.sos_id, batch_size=len(lines))[0]
  inputs = batch["inputs"]
  global QUEST
  saved, QUEST = QUEST, vocab.encode(["quest"])[0]
  try:
    vis = _visible(inputs, attention)
    rng = np.random.default_rng(1)
    logits = np.where(vis[None, :, None], rng.normal(size=(2, len(lines), 2) + vis.shape[1:]) * 3,
                      -np.inf)
    att = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1))
    att = np.nan_to_num(att)  # padding rows of a causal mask are never read
    special = uas.special_ids_of(vocab)
    got = uas.attention_uas_stats(jnp.asarray(att), inputs, batch["dep_head"],
                                  batch["dep_relation"], special, attention=attention,
                                  prefix_end_ids=(QUEST,) if attention == "prefix" else ())
    hits, weight, count = naive_stats(att, inputs, batch["dep_head"], batch["dep_relation"],
                                      attention, special)
  finally:
    QUEST = saved
  assert count.sum() == sum(len(a) for _, a in lines) > 80
  np.testing.assert_allclose(np.asarray(got["count"]), count)
  np.testing.assert_allclose(np.asarray(got["hits"]), hits, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got["weight"]), weight, atol=1e-5)


def test_uas_of_an_mlm_model_reads_its_bidirectional_attention():
  """`uas_stats` of a bidirectional model = the stats of its sown attention in both
  directions; the same parameters read as a causal model give other attention and one
  direction."""
  task = tasks.get_task("question")
  vocab = task.vocab()
  data = task.generate_examples(seed=6, sizes={"train": 4, "dev": 2, "test": 2, "gen": 2})
  lines = [(vocab.encode(ex.words), task.gold_dependencies(ex)) for ex in data["train"]]
  batch = uas.line_batches(lines, sos_id=vocab.sos_id, batch_size=4)[0]
  config = ModelConfig(vocab_size=vocab.size + 1, num_layers=1, d_model=16, num_heads=2,
                       d_ff=32, max_len=64, attention="bidirectional")
  params = init_params(config, jax.random.PRNGKey(0))
  args = (batch["inputs"], batch["dep_head"], batch["dep_relation"],
          jnp.asarray(uas.special_ids_of(vocab)))
  stats = jax.jit(uas.uas_stats, static_argnames="config")
  got = stats(params, *args, config=config)
  assert got["hits"].shape == (1, 2, 2, len(REL))
  attention = jax.jit(lambda p, t: apply_with_intermediates(TransformerLM(config), p, t)[1][
      "attention"])(params, batch["inputs"])
  sown = uas.attention_uas_stats(attention, *args, attention="bidirectional")
  for k in got:
    np.testing.assert_allclose(np.asarray(got[k]), np.asarray(sown[k]), atol=1e-6)
  causal = stats(params, *args, config=dataclasses.replace(config, attention="causal"))
  assert causal["hits"].shape == (1, 2, 1, len(REL))
  out = uas.finalize(jax.tree_util.tree_map(lambda x: np.asarray(x)[None], got), 1)
  assert out["uas"][0] == pytest.approx(np.max(out["uas_direction"][0]))


# ------------------------------------------------------------------------ the SAS penalty


def test_sas_penalty_reads_both_directions_of_a_bidirectional_model():
  """Per arc: A[dependent, head] + A[head, dependent] ('both'), one of them ('head' /
  'children'), each summed over (layer, head) or maxed ('max'); mean over the arcs."""
  rng = np.random.default_rng(0)
  att = rng.uniform(size=(2, 1, 3, 7, 7)).astype(np.float32)
  heads, _ = _arcs([ARCS], 7)
  visible = jnp.asarray(LINE != 0)[:, None, :] & jnp.ones((1, 7, 1), bool)
  for direction in sas.DIRECTIONS:
    for variant in sas.VARIANTS:
      options = sas.SasOptions(variant=variant, direction=direction)
      got, count = sas.penalty(jnp.asarray(att), heads, options, visible)
      reduce = np.max if variant == "max" else np.sum
      want = []
      for d, h, _ in ARCS:
        up, down = reduce(att[:, 0, :, d, h]), reduce(att[:, 0, :, h, d])
        want.append({"both": up + down, "head": up, "children": down}[direction])
      assert float(count) == 3
      np.testing.assert_allclose(float(got), np.mean(want), rtol=1e-6)


def test_sas_penalty_with_a_causal_mask_equals_the_causal_term():
  """The both-ways penalty under a causal mask (its invisible direction holds 0) is the causal
  term: the later token's row only, 'head' / 'children' keeping the arcs that direction sees."""
  rng = np.random.default_rng(1)
  att = np.tril(rng.uniform(size=(2, 1, 3, 7, 7))).astype(np.float32)
  heads, _ = _arcs([ARCS + [(5, 4, "obj")]], 7)
  causal = jnp.tril(jnp.ones((1, 7, 7), bool))
  for direction in sas.DIRECTIONS:
    for variant in sas.VARIANTS:
      options = sas.SasOptions(variant=variant, direction=direction)
      want = sas.penalty(jnp.asarray(att), heads, options)
      got = sas.penalty(jnp.asarray(att), heads, options, causal)
      np.testing.assert_allclose([float(x) for x in got], [float(x) for x in want], rtol=1e-6)
