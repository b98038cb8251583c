"""Positional baselines of the best-head UAS (sg_jax/analysis/uas_positional.py; docs/sas.md,
"Baselines"; Clark et al. 2019 §4.2): the previous-token, next-token and best-fixed-offset heads on
hand-built lines with known scores and the vectorised sums against a naive loop over arcs (the
training evaluation and the analysis that log them: tests/analysis/test_uas.py, the tiny run)."""

import numpy as np
import pytest

from sg_jax.analysis import uas, uas_positional
from sg_jax.tasks import dependencies

SPECIAL = np.array([0, 98, 99], np.int32)  # pad, EOS, SOS of the hand-built lines
REL = {r: i for i, r in enumerate(dependencies.RELATIONS)}


def batches(lines, batch_size=None):
  """`line_batches` of (number of words, arcs) lines; word ids 1..n (never special)."""
  return uas.line_batches([(list(range(1, n + 1)), arcs) for n, arcs in lines], sos_id=99,
                          batch_size=batch_size or len(lines))


def baselines(lines, attention="causal", min_count=1):
  stats = uas_positional.positional_uas_stats(batches(lines), SPECIAL, attention=attention)
  return stats, uas_positional.positional_baselines(stats, min_count)


def test_previous_token_head_scores_one_on_a_chain_of_left_arcs():
  # word k's head is word k - 1 (positions 2..7 -> 1..6)
  line = (7, [(k, k - 1, "det") for k in range(2, 8)])
  _, out = baselines([line])
  assert out["prev_token"] == 1.0 and out["best_offset"] == 1.0
  assert out["best_offset_of_relation"][REL["det"]] == -1
  # A causal next-token head sees none of its targets: every row ties its candidates 1..r-1,
  # so it scores chance, the mean of 1/(r - 1) over the rows r = 2..7.
  assert out["next_token"] == pytest.approx(np.mean([1 / (r - 1) for r in range(2, 8)]))


def test_next_token_head_scores_one_on_a_chain_of_right_arcs():
  # word k's head is word k + 1; bidirectional: dependent -> head row k reads k + 1.
  line = (6, [(k, k + 1, "nsubj") for k in range(1, 6)])
  stats, out = baselines([line], "bidirectional")
  plus_one = int(np.flatnonzero(stats["offsets"] == 1)[0])
  dependent_to_head = uas.directions("bidirectional").index("dependent_to_head")
  assert stats["hits"][plus_one, dependent_to_head].sum() == 5  # Clark et al.'s offset +1
  assert out["next_token"] == 1.0
  # The transposed map reads the dependent's column: the previous-token head (row k + 1 on k)
  # predicts the same heads there, as the original's two modes would score a model head.
  assert out["prev_token"] == 1.0
  # Causal scoring puts every arc in its later token's row: a right chain is the previous
  # token there too.
  assert baselines([line])[1]["prev_token"] == 1.0


def test_best_offset_equals_the_hand_count_on_a_mix():
  # 8 words; det arcs at distances 1, 1, 2 (later rows 2, 4, 7), obj arcs at distance 3 (rows
  # 8, 6). Best det offset -1: 2 hits (offset -2 also gives 2: row 2 -> SOS ties its one
  # candidate, row 7 -> 5); best obj offset -3: 2 hits. Every other
  # offset gives at most 2 (det) / 2 (obj), so best_offset = 4 / 5.
  line = (8, [(1, 2, "det"), (3, 4, "det"), (5, 7, "det"), (8, 5, "obj"), (6, 3, "obj")])
  stats, out = baselines([line])
  assert out["best_offset"] == pytest.approx(4 / 5)
  # ties go to the nearest offset
  assert out["best_offset_of_relation"][[REL["det"], REL["obj"]]].tolist() == [-1, -3]
  np.testing.assert_allclose(out["best_offset_relation"][[REL["det"], REL["obj"]]], [2 / 3, 1])
  # previous token: det rows 2 and 4 right, row 7 -> 6 wrong, obj rows 8 -> 7, 6 -> 5 wrong
  assert out["prev_token"] == pytest.approx(2 / 5)
  # offset -7 for det: row 2 ties {1} (1), row 4 ties {1, 2, 3} (1/3), row 7 ties 1..6 (1/6)
  minus_seven = int(np.flatnonzero(stats["offsets"] == -7)[0])
  assert stats["hits"][minus_seven, 0, REL["det"]] == pytest.approx(1 + 1 / 3 + 1 / 6)
  # min_count drops the rare relation's own score, never its arcs from best_offset
  _, rare = baselines([line], min_count=3)
  assert np.isnan(rare["best_offset_relation"][REL["obj"]]) and rare["best_offset"] == \
      pytest.approx(4 / 5)


def naive_hits(lines, offsets, attention):
  """The definitions of `positional_uas_stats`, one arc and offset at a time: [O, D, R]."""
  names = uas.directions(attention)
  hits = np.zeros((len(offsets), len(names), len(REL)))
  for n, arcs in lines:
    real = range(1, n + 1)  # SOS (0) and padding are never candidates
    for dep, head, rel in arcs:
      for d, name in enumerate(names):
        if name == "later_to_earlier":
          row, gold = max(dep, head), min(dep, head)
          cands = [k for k in real if k < row]
        elif name == "dependent_to_head":
          row, gold = dep, head
          cands = [k for k in real if k != row]
        else:  # head_to_dependent: the dependent's column, the rows that attend to it
          row, gold = dep, head
          cands = [q for q in real if q != row]
        for o, off in enumerate(offsets):
          target = row - off if name == "head_to_dependent" else row + off
          if target in cands:
            hits[o, d, REL[rel]] += float(target == gold)
          elif gold in cands:
            hits[o, d, REL[rel]] += 1 / len(cands)
  return hits


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_vectorised_equals_naive_loop(attention):
  rng = np.random.default_rng(1)
  lines = []
  for n in (5, 9, 7, 3, 8):
    arcs = []
    for dep in rng.choice(np.arange(1, n + 1), size=n // 2 + 1, replace=False):
      head = int(rng.choice([h for h in range(1, n + 1) if h != dep]))
      arcs.append((int(dep), head, str(rng.choice(["det", "obj", "nsubj"]))))
    lines.append((n, sorted(arcs)))
  stats = uas_positional.positional_uas_stats(batches(lines, batch_size=2), SPECIAL,
                                              attention=attention)
  assert stats["offsets"].tolist() == [o for o in range(-9, 10) if o != 0]
  np.testing.assert_allclose(stats["hits"], naive_hits(lines, stats["offsets"], attention),
                             atol=1e-5)
  np.testing.assert_allclose(stats["count"].sum(), sum(len(a) for _, a in lines))
  out = uas_positional.positional_baselines(stats)
  per_rel = naive_hits(lines, stats["offsets"], attention).max(axis=(0, 1))
  assert out["best_offset"] == pytest.approx(per_rel.sum() / stats["count"].sum())
