"""Acceptance tests against the released McCoy et al. (2020) files and the released Dyck val split.

The folder comes from the environment variable SG_JAX_REFERENCE_DATA (CI: ../shared/data); the
tests skip when it is unset. Statistical tests: task-token mix within 2 percentage points, and a
chi-square test of homogeneity (scipy.stats.chi2_contingency) of the sentence-shape counts
(`mccoy.sentence_shape`: subject modifier none/PP/RC type x object none/modifier) between the
generated and the released dev+test lines, p > 0.01. Generated data: the real default sizes
(100k train, 1k dev, 10k test, 10k gen), seed 0.
"""

import collections
import os
import pathlib

import numpy as np
import pytest

from sg_jax import tasks
from sg_jax.tasks import dyck, io, mccoy, pcfg, trees

_REF = os.environ.get("SG_JAX_REFERENCE_DATA")
# Parsing every released file takes a minute or two: the full set only (pyproject.toml).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not _REF, reason="SG_JAX_REFERENCE_DATA is unset (set it to a folder holding the released "
    "McCoy et al. 2020 files under mccoy2020/ (question.gr, question_bracket.dev, ...) and a "
    "Dyck split under dyck/, to compare with them)")]


def _ref(*parts) -> pathlib.Path:
  return pathlib.Path(_REF).joinpath(*parts)


@pytest.fixture(scope="module", params=["question", "tense"])
def released(request):
  name = request.param
  task = tasks.get_task(name)
  splits = {s: task.read_split(_ref("mccoy2020", f"{name}_bracket.{s}"))
            for s in ("dev", "test", "gen")}
  plain = {s: task.read_split(_ref("mccoy2020", f"{name}.{s}")) for s in ("dev", "test", "gen")}
  generated = task.generate_examples(seed=0)  # default sizes
  return name, task, splits, plain, generated


def test_released_grammar_files_match_packaged():
  for name in ("question", "tense"):
    assert io.sha256_of(_ref("mccoy2020", f"{name}.gr")) == io.KNOWN_SHA256[f"{name}.gr"]
    packaged = pathlib.Path(pcfg.__file__).parent / "grammars" / f"{name}.gr"
    assert packaged.read_bytes() == _ref("mccoy2020", f"{name}.gr").read_bytes()
  for name, digest in io.KNOWN_SHA256.items():
    if not name.endswith(".gr"):
      assert io.sha256_of(_ref("mccoy2020", name)) == digest


def test_every_released_sentence_parses_with_identical_trees(released):
  _, task, splits, plain, _ = released
  for split in splits:
    assert [e.words for e in plain[split]] == [e.words for e in splits[split]]
    for ex in splits[split]:
      bare = tasks.Example(source=ex.source, target=ex.target, task_token=ex.task_token,
                           transformed=ex.transformed)
      assigned = task.assign_trees(bare)  # raises ParseError if the grammar rejects it
      assert assigned.source_tree == ex.source_tree, ex.source
      assert assigned.target_tree == ex.target_tree, ex.target


def test_gen_classification(released):
  name, task, splits, _, generated = released
  assert all(task.is_ambiguous(ex) and task.gen_eligible(ex) for ex in splits["gen"])
  # The generated gen lines are of the same kind (question: different auxiliaries fronted).
  assert all(task.is_ambiguous(ex) and task.gen_eligible(ex) for ex in generated["gen"][:2000])
  for split in ("dev", "test"):
    assert not any(task.is_ambiguous(ex) for ex in splits[split])
  # Our transformed line of a released source equals the released target.
  for ex in splits["gen"][:2000] + splits["test"][:2000]:
    ident, trans, _ = task.lines_of(task.source_derivation(ex.source[:-1]))
    assert (trans if ex.transformed else ident).target == ex.target
  # No generated train line is of the gen kind (word-level check of every train line).
  from sg_jax.tasks import question, tense  # pylint: disable=import-outside-toplevel
  linear = question.linear_question if name == "question" else tense.linear_present
  assert not any(ex.transformed and linear(ex.source[:-1]) != ex.target
                 for ex in generated["train"])
  assert len(generated["train"]) == 100_000


def test_task_token_mix(released):
  _, _, splits, _, generated = released
  mix = lambda exs: np.mean([e.transformed for e in exs])
  rel_test, rel_pool = mix(splits["test"]), mix(splits["dev"] + splits["test"])
  assert abs(mix(generated["test"]) - rel_test) < 0.02
  # The released dev (1,000 lines) is itself 2.5 pp off the released test for tense, so the
  # generated dev is compared with the released dev+test mix.
  assert abs(mix(generated["dev"]) - rel_pool) < 0.02
  assert abs(mix(generated["train"]) - rel_pool) < 0.02


def test_sentence_shape_chi_square(released):
  scipy_stats = pytest.importorskip("scipy.stats")
  _, task, splits, _, generated = released
  for kind, rel, gen in [("dev+test", splits["dev"] + splits["test"],
                          generated["dev"] + generated["test"]),
                         ("gen", splits["gen"], generated["gen"])]:
    a = collections.Counter(task.shape(e) for e in rel)
    b = collections.Counter(task.shape(e) for e in gen)
    keys = sorted(set(a) | set(b))
    table = np.array([[a[k] for k in keys], [b[k] for k in keys]])
    p = scipy_stats.chi2_contingency(table).pvalue
    print(f"{task.name} {kind}: chi-square p = {p:.3f} over {len(keys)} shapes")
    assert p > 0.01, (kind, p)


def test_released_dyck_val():
  task = tasks.get_task("dyck")
  val = task.read_split(_ref("dyck", "k-20_d-10_val.txt"))
  assert len(val) == 20_000
  letters = {t[1] for e in val for t in e.source if t.startswith("(")}
  assert letters == set("abcdefghijklmnopqrst")
  enc = task.encode(val[:500], task.vocab())
  assert enc.close_mask.sum() * 2 == (enc.lengths - 1).sum()
  # Our val split reproduces the released one's length statistics (mean 13.3 tokens).
  ours = dyck.generate_ids(seed=0, sizes={"train": 200_000, "val": 5_000, "test": 100})
  mean_ours = np.mean([len(x) for x in ours["val"]])
  mean_rel = np.mean([len(e.source) for e in val])
  assert abs(mean_ours - mean_rel) < 1.0
