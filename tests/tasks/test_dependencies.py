"""Gold dependencies from the constituency trees (sg_jax/tasks/dependencies.py; docs/sas.md)."""

import pytest

from sg_jax import tasks
from sg_jax.tasks import dependencies, trees
from sg_jax.tasks.examples import Example


def named(example, arcs):
  """Arcs as (dependent word, head word, relation), positions checked against the line."""
  words = ("<sos>",) + example.words
  return [(words[d], words[h], r) for d, h, r in arcs]


def question_line(task, declarative, transformed):
  words = tuple(declarative.split())
  d = task.source_derivation(words)
  ident, trans, _ = task.lines_of(d)
  return trans if transformed else ident


def test_question_relative_clause_on_subject_fronted_auxiliary():
  task = tasks.get_task("question")
  ex = question_line(task, "my walrus who doesn't move does amuse the yak .", True)
  assert ex.target == tuple("does my walrus who doesn't move amuse the yak ?".split())
  arcs = task.gold_dependencies(ex)
  # Source half: positions 1..9 (the '.' at 10 and 'quest' at 11 get no arc).
  source = [(1, 2, "det"), (2, 7, "nsubj"), (3, 5, "rel"), (4, 5, "aux"), (5, 2, "relcl"),
            (6, 7, "aux"), (8, 9, "det"), (9, 7, "obj")]
  # Target half (offset 11): the fronted 'does' (12) depends on 'amuse' (18), 7 tokens later.
  target = [(12, 18, "aux"), (13, 14, "det"), (14, 18, "nsubj"), (15, 17, "rel"),
            (16, 17, "aux"), (17, 14, "relcl"), (19, 20, "det"), (20, 18, "obj")]
  assert arcs == sorted(source + target)
  assert named(ex, [a for a in arcs if a[0] == 12]) == [("does", "amuse", "aux")]
  # Root ('amuse'), punctuation and the task token are nobody's dependent.
  dependents = {d for d, _, _ in arcs}
  assert {7, 10, 11, 18, 21} & dependents == set()


def test_question_object_relative_clause_and_identity_line():
  task = tasks.get_task("question")
  ex = question_line(task, "the yak that our newts don't entertain does giggle .", False)
  arcs = task.gold_dependencies(ex)
  half = [(1, 2, "det"), (2, 9, "nsubj"), (3, 7, "rel"), (4, 5, "det"), (5, 7, "nsubj"),
          (6, 7, "aux"), (7, 2, "relcl"), (8, 9, "aux")]
  n = len(ex.source)  # identity line: the target repeats the source sentence
  assert arcs == sorted(half + [(d + n, h + n, r) for d, h, r in half])


def test_tense_pp_attractor():
  task = tasks.get_task("tense")
  words = tuple("the walrus near the yaks applauded the newt .".split())
  ident, trans, ambiguous = task.lines_of(task.source_derivation(words))
  assert trans.target == tuple("the walrus near the yaks applauds the newt .".split())
  assert ambiguous  # the linear rule agrees with 'yaks'
  arcs = task.gold_dependencies(trans)
  half = [(1, 2, "det"), (2, 6, "nsubj"), (3, 5, "case"), (4, 5, "det"), (5, 2, "nmod"),
          (7, 8, "det"), (8, 6, "obj")]
  n = len(trans.source)
  assert arcs == sorted(half + [(d + n, h + n, r) for d, h, r in half])
  # The subject's arc skips the attractor: walrus -> applauds, not yaks.
  assert ("walrus", "applauds", "nsubj") in named(trans, arcs)


def test_every_constituent_has_one_exiting_head():
  """On generated lines of both tasks, each internal node of each half's tree has exactly one
  word whose head lies outside its span (or is the root): the arcs follow the trees."""
  for name in ("question", "tense"):
    task = tasks.get_task(name)
    data = task.generate_examples(seed=1, sizes={"train": 40, "dev": 10, "test": 10, "gen": 40})
    for ex in data["train"] + data["gen"]:
      heads = {d: h for d, h, _ in task.gold_dependencies(ex)}
      for tree, offset in ((ex.source_tree, 1), (ex.target_tree, 1 + len(ex.source))):
        punct = {i for i, w in enumerate(trees.leaves(tree)) if w in (".", "?")}
        for i, j in trees.spans(tree):
          inside = set(range(i, j + 1)) - punct
          if not inside:
            continue
          exits = [k for k in inside if k + offset not in heads
                   or heads[k + offset] - offset not in range(i, j + 1)]
          assert len(exits) == 1, (ex, (i, j))
      words = len(ex.source) + len(ex.target)
      assert len(heads) == words - 2 - 2 - 1  # minus 2 roots, 2 punctuation, the task token


def test_lines_without_trees_are_parsed():
  task = tasks.get_task("question")
  ex = question_line(task, "the yak does giggle .", True)
  bare = Example(source=ex.source, target=ex.target, task_token="quest", transformed=True)
  assert task.gold_dependencies(bare) == task.gold_dependencies(ex)


def test_unknown_pair_is_a_clear_error():
  with pytest.raises(dependencies.DependencyError, match=r"no head rule for \(N, Det\)"):
    dependencies.tree_arcs(("walrus", "the"), {"walrus": "N", "the": "Det"})
  with pytest.raises(dependencies.DependencyError, match="no part of speech"):
    dependencies.tree_arcs(("the", "gnu"), {"the": "Det"})


def test_dyck_declares_none_unless_asked():
  plain = tasks.get_task("dyck")
  assert not plain.has_gold_dependencies
  ex = Example(source=("(a", "(b", "b)", "a)"))
  with pytest.raises(ValueError, match="declares no gold dependencies"):
    plain.gold_dependencies(ex)
  task = tasks.get_task("dyck", bracket_arcs=True)
  assert task.has_gold_dependencies
  assert task.gold_dependencies(ex) == [(3, 2, "bracket"), (4, 1, "bracket")]


def test_dependency_arrays():
  out = dependencies.dependency_arrays([[(1, 2, "det"), (2, 4, "nsubj")], []], 5)
  assert out["dep_head"].tolist() == [[-1, 2, 4, -1, -1], [-1] * 5]
  assert out["dep_relation"].tolist()[0] == [-1, 2, 0, -1, -1]
  with pytest.raises(dependencies.DependencyError, match="two heads"):
    dependencies.dependency_arrays([[(1, 2, "det"), (1, 3, "det")]], 5)
