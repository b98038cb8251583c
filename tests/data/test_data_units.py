"""Unit tests of the data module with hand-written expected values (trees, grammar, tasks, io,
vocabulary and encoding, download, CLI). Fast; needs no reference data."""

import errno
import functools
import hashlib
import http.server
import json
import os
import re
import threading

import numpy as np
import pytest

from sg_jax import tasks
from sg_jax.tasks import dyck, io, mccoy, pcfg, question, tense, trees
from sg_jax.tasks.base import declarative_tree
from sg_jax.tasks.examples import DataError, Example


# --- trees -----------------------------------------------------------------------------------

def test_parse_and_format_forest():
  s = "[ [ the walrus ] [ doesn't move ] ] ."
  forest = trees.parse_forest(s)
  assert forest == ((("the", "walrus"), ("doesn't", "move")), ".")
  assert trees.format_forest(forest) == s
  assert trees.format_tree(forest) == "[ " + s + " ]"
  assert trees.leaves(forest) == ("the", "walrus", "doesn't", "move", ".")
  assert trees.spans(forest) == [(0, 4), (0, 3), (0, 1), (2, 3)]


@pytest.mark.parametrize("bad", ["[ a b", "a b ]", "[ ]", "[ a ] ] ["])
def test_bracket_errors(bad):
  with pytest.raises(trees.BracketError):
    trees.parse_forest(bad)


def test_binarize_and_strip():
  assert trees.binarize(("a", "b", "c")) == ("a", ("b", "c"))
  assert trees.binarize((("a",), "b")) == ("a", "b")
  assert trees.strip_leaves((("a", "b"), "."), {"."}) == ("a", "b")


# --- grammar ---------------------------------------------------------------------------------

def test_packaged_grammars_load():
  q = pcfg.load_grammar("question")
  assert len(q.terminals) == 65  # 64 words + "."
  assert q.probability("RC_S", ("Rel", "Aux_S", "V_intrans")) == pytest.approx(2 / 6)
  t = pcfg.load_grammar("tense")
  assert t.probability("VP_M_sg", ("V_intrans_sg",)) == pytest.approx(0.5)
  with pytest.raises(ValueError, match="nope"):
    pcfg.load_grammar("nope")


def test_grammar_text_errors():
  g = pcfg.grammar_from_text("1\tROOT\tS .\n\n2\tS\ta\n1\tS\tb\t\n")
  assert g.probability("S", ("a",)) == pytest.approx(2 / 3)
  with pytest.raises(pcfg.GrammarError, match=r"g:2"):
    pcfg.grammar_from_text("1\tROOT\tS\nROOT S\n", name="g")
  with pytest.raises(pcfg.GrammarError, match=r"g:1: weight"):
    pcfg.grammar_from_text("x\tROOT\tS\n", name="g")


def test_sampling_is_deterministic():
  g = pcfg.load_grammar("question")
  a = [pcfg.words_of(g.sample(np.random.default_rng(3))) for _ in range(2)]
  s1 = g.sample_stream(np.random.default_rng(7))
  s2 = g.sample_stream(np.random.default_rng(7))
  assert [next(s1) for _ in range(20)] == [next(s2) for _ in range(20)]
  assert a[0] == a[1]


def test_tree_convention_matches_released_examples():
  g = pcfg.load_grammar("question")
  cases = {
      "our tyrannosaurus doesn't comfort my yaks who some yak does high_five .":
          "[ [ [ our tyrannosaurus ] [ doesn't [ comfort [ [ my yaks ] [ who [ [ some yak ] "
          "[ does high_five ] ] ] ] ] ] ] . ]",
      "the walrus doesn't move .": "[ [ [ the walrus ] [ doesn't move ] ] . ]",
      "my raven that doesn't sleep does change .":
          "[ [ [ [ my raven ] [ that [ doesn't sleep ] ] ] [ does change ] ] . ]",
  }
  for words, expected in cases.items():
    assert trees.format_tree(pcfg.to_tree(g.parse(words.split()))) == expected
  with pytest.raises(pcfg.ParseError):
    g.parse("the walrus move .".split())


# --- question / tense ------------------------------------------------------------------------

def test_question_lines_and_ambiguity():
  task = tasks.get_task("question")
  d = task.grammar.parse("my raven that doesn't sleep does change .".split())
  ident, trans, ambiguous = task.lines_of(d)
  assert ambiguous
  assert " ".join(trans.target) == "does my raven that doesn't sleep change ?"
  assert trees.format_forest(trans.target_tree) == \
      "[ does [ [ [ my raven ] [ that [ doesn't sleep ] ] ] change ] ] ?"
  assert question.linear_question(ident.target) == \
      tuple("doesn't my raven that sleep does change ?".split())
  assert ident.target == ident.source[:-1] and ident.task_token == "decl"
  d2 = task.grammar.parse("the walrus doesn't move .".split())
  _, trans2, amb2 = task.lines_of(d2)
  assert not amb2 and trans2.target == tuple("doesn't the walrus move ?".split())
  assert mccoy.sentence_shape(d) == ("RC-intrans", "none")
  assert task.shape(Example(source=tuple("the walrus doesn't comfort my yaks who some yak does "
                                         "high_five . decl".split()), task_token="decl")) == \
      ("none", "obj:RC-obj")


@pytest.mark.parametrize("lemma,past", [("high_five", "high_fived"), ("eat", "ate"),
                                        ("read", "read"), ("swim", "swam"), ("sleep", "slept"),
                                        ("comfort", "comforted"), ("amuse", "amused")])
def test_past_forms(lemma, past):
  assert tense.past_of(lemma) == past


def test_tense_lines_and_ambiguity():
  task = tasks.get_task("tense")
  past = "the yaks that some unicorn entertained applauded her salamanders below some walrus ."
  d = task.source_derivation(past.split())
  ident, trans, ambiguous = task.lines_of(d)
  assert ambiguous
  assert " ".join(trans.target) == ("the yaks that some unicorn entertains applaud her "
                                    "salamanders below some walrus .")
  assert " ".join(tense.linear_present(past.split())) == (
      "the yaks that some unicorn entertains applauds her salamanders below some walrus .")
  assert trees.format_tree(ident.source_tree) == (
      "[ [ [ [ the yaks ] [ that [ [ some unicorn ] entertained ] ] ] [ applauded [ [ her "
      "salamanders ] [ below [ some walrus ] ] ] ] ] . ]")
  _, t2, amb2 = task.lines_of(task.source_derivation("our zebra slept .".split()))
  assert not amb2 and t2.target == ("our", "zebra", "sleeps", ".")


def test_declarative_tree():
  ex = tasks.get_task("question").read_split  # noqa: F841  (API presence)
  (tree,) = trees.parse_forest("[ [ [ the walrus ] [ doesn't move ] ] . ]")
  e = Example(source=("the", "walrus", "doesn't", "move", ".", "decl"), source_tree=tree,
              task_token="decl")
  assert e.declarative == ("the", "walrus", "doesn't", "move")
  assert declarative_tree(e) == (("the", "walrus"), ("doesn't", "move"))


# --- vocabulary and encoding -----------------------------------------------------------------

def test_vocab_sizes_and_ids():
  qv = tasks.get_task("question").vocab()
  assert len(qv.words) == 68 and qv.size == 71
  assert qv.pad_id == 0 and qv.eos_id == 69 and qv.sos_id == 70
  assert list(qv.words) == sorted(qv.words)
  assert qv.decode(qv.encode(["the", "quest"])) == ["the", "quest"]
  assert tasks.Vocab.from_json(qv.to_json()) == qv
  with pytest.raises(DataError, match="'gorilla'"):
    qv.encode(["gorilla"])
  tv = tasks.get_task("tense").vocab()
  assert len(tv.words) == 98 and tv.size == 101
  dv = tasks.get_task("dyck").vocab()
  assert dv.size == 43 and dv.words[0] == "(a" and dv.words[20] == "a)"
  pt = qv.pos_table
  assert pt.shape == (71,) and pt[0] == 0
  from sg_jax.tasks import vocab as v
  assert v.POS_CLASSES[pt[qv.id_of("does")]] == "Aux"
  assert v.POS_CLASSES[tv.pos_table[tv.id_of("slept")]] == "V"


def test_encode_question_line():
  task = tasks.get_task("question")
  vocab = task.vocab()
  ex = io.parse_mccoy_line("the walrus doesn't move . quest\tdoesn't the walrus move ?",
                           task.task_tokens, bracketed=False)
  enc = task.encode([ex], vocab)
  words = "the walrus doesn't move . quest doesn't the walrus move ?".split()
  assert enc.inputs.shape == (1, 12) and enc.inputs.dtype == np.int32
  assert enc.inputs[0].tolist() == [vocab.sos_id] + vocab.encode(words)
  assert enc.targets[0].tolist() == vocab.encode(words) + [vocab.eos_id]
  assert enc.lengths.tolist() == [12]
  assert enc.task_pos.tolist() == [6] and enc.targets[0, 6] == vocab.id_of("doesn't")
  assert enc.main_verb_pos.tolist() == [9] and enc.targets[0, 9] == vocab.id_of("move")
  assert enc.transformed.tolist() == [True]
  enc2 = task.encode([ex, ex], vocab, max_len=15)
  assert enc2.inputs.shape == (2, 15) and enc2.inputs[0, 12:].tolist() == [0, 0, 0]
  assert len(enc2.take(np.array([1]))) == 1
  with pytest.raises(ValueError):
    task.encode([ex], vocab, max_len=5)


def test_encode_tense_main_verb_after_relative_clause():
  task = tasks.get_task("tense")
  ex = io.parse_mccoy_line(
      "the yak that the zebras entertained slept . PRESENT\t"
      "the yak that the zebras entertain sleeps .", task.task_tokens, bracketed=False)
  enc = task.encode([ex], task.vocab())
  assert enc.task_pos.tolist() == [9]
  assert enc.main_verb_pos.tolist() == [15]
  assert task.vocab().decode([enc.targets[0, 15]]) == ["sleeps"]


def test_encode_dyck_close_fields():
  task = tasks.get_task("dyck")
  enc = task.encode([Example(source=("(a", "(b", "b)", "a)"))], task.vocab())
  assert enc.close_mask[0].tolist() == [False, False, True, True, False]
  assert enc.close_distance[0].tolist() == [0, 0, 1, 3, 0]
  assert enc.task_pos.tolist() == [-1] and set(enc.extras) == {"close_mask", "close_distance"}


def test_dyck_paths():
  ids = np.array([0, 1, 21, 20, 2, 22], np.int8)  # (a (b b) a) (c c)
  assert dyck.paths(ids) == (bytes([1, 1, 0, 0]), bytes([1, 0]))
  assert dyck.ids_to_tokens(ids) == ("(a", "(b", "b)", "a)", "(c", "c)")


# --- readers: malformed input ----------------------------------------------------------------

@pytest.mark.parametrize("content,line,reason", [
    ("a b . decl\ta b .\nno tab here\n", 2, "missing tab"),
    ("a b . decl\ta b .\na b . ask\ta b ?\n", 2, "unknown task token"),
    ("[ [ a b ] . decl\t[ a b ] .\n", 1, "unbalanced"),
])
def test_mccoy_reader_errors(tmp_path, content, line, reason):
  path = tmp_path / "question.dev"
  path.write_text(content)
  with pytest.raises(DataError, match=reason) as err:
    tasks.get_task("question").read_split(path)
  assert err.value.line == line and str(path) in str(err.value)
  assert f"question.dev:{line}:" in str(err.value)


def _generate_small(out_dir):
  task = tasks.get_task("question")
  task.generate(out_dir, seed=0, num_train=30, sizes={"dev": 10, "test": 10, "gen": 10})
  return task


def _edit_line(path, lineno, edit):
  lines = path.read_text().splitlines(True)
  lines[lineno - 1] = edit(lines[lineno - 1])
  path.write_text("".join(lines))


def test_plain_file_must_agree_with_the_bracketed_file_that_is_read(tmp_path):
  task = _generate_small(tmp_path)
  plain, bracket = tmp_path / "question.train", tmp_path / "question_bracket.train"
  read = task.read_split(tmp_path, "train")
  assert len(read) == 30 and all(ex.source_tree is not None for ex in read)  # the bracketed one
  first = read[1].source[0]
  _edit_line(plain, 2, lambda line: "zzz" + line[len(first):])
  with pytest.raises(DataError) as err:
    task.read_split(tmp_path, "train")
  assert str(err.value).startswith(f"{bracket}:2: word 1 is {first!r}, but {plain}:2 has 'zzz'")
  assert err.value.file == str(bracket) and err.value.line == 2
  bracket.unlink()  # without its bracketed twin, the plain file is read, edit included
  assert task.read_split(tmp_path, "train")[1].source[0] == "zzz"


def test_malformed_plain_file_is_an_error_beside_its_bracketed_twin(tmp_path):
  task = _generate_small(tmp_path)
  plain = tmp_path / "question.dev"
  _edit_line(plain, 3, lambda line: line.replace("\t", " "))
  with pytest.raises(DataError, match="missing tab") as err:
    task.read_split(tmp_path, "dev")
  assert err.value.file == str(plain) and err.value.line == 3
  _generate_small(tmp_path)
  plain.write_text("".join(plain.read_text().splitlines(True)[:-2]))
  with pytest.raises(DataError, match=re.escape(f"10 lines, but {plain} has 8")):
    task.read_split(tmp_path, "dev")


def test_training_data_checks_the_plain_file_too(tmp_path):
  from sg_jax import configlib  # pylint: disable=import-outside-toplevel  (jax)
  from sg_jax.data import input_pipeline  # pylint: disable=import-outside-toplevel  (jax)
  _generate_small(tmp_path)
  _edit_line(tmp_path / "question.train", 4, lambda line: line.replace(" ", " zzz ", 1))
  config = configlib.base_config("question")
  config.data.dir = str(tmp_path)
  config.data.num_train = 30
  data_options = input_pipeline.DataOptions.from_config(config)
  with pytest.raises(DataError, match=r"question_bracket.train:4: word 2 .* has 'zzz'"):
    input_pipeline.load_data(data_options, str(tmp_path / "run"))


def test_write_error_names_the_file_being_written(tmp_path, monkeypatch):
  real_fdopen, calls = os.fdopen, []

  class FullDisk:
    """A file whose third opening fails to write, as on a full disk."""

    def __init__(self, f):
      self.f = f

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.f.close()

    def write(self, text):
      if len(calls) == 3:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return self.f.write(text)

    def __getattr__(self, name):  # flush, fileno: the real file's
      return getattr(self.f, name)

  def fdopen(fd, *args, **kwargs):
    calls.append(fd)
    return FullDisk(real_fdopen(fd, *args, **kwargs))

  monkeypatch.setattr(io.os, "fdopen", fdopen)
  with pytest.raises(OSError) as err:
    _generate_small(tmp_path)
  # Written in order: question.train, question_bracket.train, question.dev (the third).
  assert err.value.errno == errno.ENOSPC
  assert str(err.value) == (f"[Errno {errno.ENOSPC}] cannot write {tmp_path / 'question.dev'}: "
                            f"{os.strerror(errno.ENOSPC)}")
  assert sorted(os.listdir(tmp_path)) == ["question.train", "question_bracket.train"]


def test_empty_file_errors(tmp_path):
  (tmp_path / "question.dev").write_text("\n")
  with pytest.raises(DataError, match="empty file") as err:
    tasks.get_task("question").read_split(tmp_path, "dev")
  assert "question.dev" in str(err.value)
  (tmp_path / "dyck.val").write_text("")
  with pytest.raises(DataError, match="empty file"):
    tasks.get_task("dyck").read_split(tmp_path, "val")


@pytest.mark.parametrize("content,reason", [("(a a) (b END\n", "unbalanced"),
                                            ("(a b) END\n", "unbalanced"),
                                            ("(a a)\n", "END"), ("(z z) END\n", "bracket type"),
                                            ("(a a) xx END\n", "unknown token")])
def test_dyck_reader_errors(tmp_path, content, reason):
  path = tmp_path / "dyck.val"
  path.write_text("(a a) END\n" + content)
  with pytest.raises(DataError, match=reason) as err:
    tasks.get_task("dyck").read_split(path)
  assert err.value.line == 2 and "dyck.val:2:" in str(err.value)


def test_get_task_unknown():
  with pytest.raises(ValueError, match="'nope'"):
    tasks.get_task("nope")
  assert tasks.TASK_NAMES == ("question", "tense", "dyck")


# --- download (local http.server, no internet) -----------------------------------------------

@pytest.fixture
def http_dir(tmp_path):
  root = tmp_path / "srv"
  root.mkdir()
  handler = functools.partial(_QuietHandler, directory=str(root))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield root, f"http://127.0.0.1:{server.server_address[1]}/"
  server.shutdown()
  server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):
    pass


def test_download_verifies_and_caches(http_dir, tmp_path):
  root, url = http_dir
  good = b"a b . decl\ta b .\n"
  (root / "question.dev").write_bytes(good)
  (root / "question.train").write_bytes(good * 2)
  known = {"question.dev": hashlib.sha256(good).hexdigest()}
  cache = tmp_path / "cache"
  out = io.download_released(cache, ["question.dev", "question.train"], base_url=url,
                             known_sha256=known)
  assert out["question.dev"].read_bytes() == good
  record = json.loads((cache / "sha256.json").read_text())
  assert record == {"question.train": hashlib.sha256(good * 2).hexdigest()}
  # Cached: served file removed, still fine.
  (root / "question.dev").unlink()
  io.download_released(cache, ["question.dev"], base_url=url, known_sha256=known)
  # The recorded train hash is enforced at the next download.
  (cache / "question.train").unlink()
  (root / "question.train").write_bytes(b"tampered\n")
  with pytest.raises(DataError, match="SHA-256 mismatch") as err:
    io.download_released(cache, ["question.train"], base_url=url, known_sha256=known)
  assert "question.train" in str(err.value)
  assert not (cache / "question.train").exists()
  assert not list(cache.glob("*.part"))


def test_download_bad_hash_and_missing(http_dir, tmp_path):
  root, url = http_dir
  (root / "tense.dev").write_bytes(b"x\n")
  with pytest.raises(DataError, match="SHA-256 mismatch"):
    io.download_released(tmp_path / "c", ["tense.dev"], base_url=url)  # real hash table
  assert not (tmp_path / "c" / "tense.dev").exists()
  with pytest.raises(DataError, match="download of .* failed"):
    io.download_released(tmp_path / "c", ["tense.gen"], base_url=url)
