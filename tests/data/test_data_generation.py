"""Generation properties of question/tense/Dyck at small sizes, the CLI, and (marked `tfds`) the
TFDS builders. No reference data needed."""

import collections
import os
import subprocess
import sys

import numpy as np
import pytest

from sg_jax import tasks
from sg_jax.tasks import dyck, question, tense

SMALL = {"train": 600, "dev": 100, "test": 200, "gen": 150}


def _word_level_ambiguous(task_name, ex):
  """Transformed line on which the linear rule's output differs from the target."""
  if not ex.transformed:
    return False
  if task_name == "question":
    return question.linear_question(ex.source[:-1]) != ex.target
  return tense.linear_present(ex.source[:-1]) != ex.target


@pytest.mark.parametrize("name", ["question", "tense"])
@pytest.mark.parametrize("pair_variants", [False, True])
def test_mccoy_generation_design(name, pair_variants):
  task = tasks.get_task(name)
  data = task.generate_examples(seed=1, sizes=SMALL, pair_variants=pair_variants)
  assert {s: len(v) for s, v in data.items()} == SMALL
  sentences = {s: {ex.source[:-1] for ex in v} for s, v in data.items()}
  for a in sentences:
    for b in sentences:
      if a < b:
        assert not sentences[a] & sentences[b], (a, b)
  assert all(ex.transformed and task.is_ambiguous(ex) for ex in data["gen"])
  if name == "question":  # the two rules front different auxiliaries on every gen line
    assert all(question.linear_question(ex.source[:-1])[0] != ex.target[0] for ex in data["gen"])
  for split in ("train", "dev", "test"):
    assert not any(_word_level_ambiguous(name, ex) for ex in data[split])
    assert not any(task.is_ambiguous(ex) for ex in data[split] if ex.transformed)
  for split, exs in data.items():
    for ex in exs[:50]:  # trees cover the words; parse assigns the same trees
      assert task.assign_trees(ex.__class__(source=ex.source, target=ex.target,
                                            task_token=ex.task_token,
                                            transformed=ex.transformed)) == ex
  if not pair_variants:
    assert len(sentences["test"]) == SMALL["test"]


def test_generation_is_deterministic():
  task = tasks.get_task("question")
  a = task.generate_examples(seed=5, sizes=SMALL)
  b = task.generate_examples(seed=5, sizes=SMALL)
  c = task.generate_examples(seed=6, sizes=SMALL)
  assert a == b and a != c


def test_write_read_roundtrip_and_ensure_data(tmp_path):
  task = tasks.get_task("tense")
  paths = task.generate(tmp_path, seed=2, num_train=50, sizes={"dev": 20, "test": 20, "gen": 20})
  assert sorted(paths) == ["dev", "gen", "test", "train"]
  data = task.generate_examples(seed=2, sizes={"train": 50, "dev": 20, "test": 20, "gen": 20})
  assert task.read_split(tmp_path, "gen") == data["gen"]  # bracket file preferred: trees kept
  plain = task.read_split(paths["gen"])
  assert [e.words for e in plain] == [e.words for e in data["gen"]]
  assert all(e.source_tree is None for e in plain)
  assert task.read_split(paths["gen"], assign_trees=True) == data["gen"]
  mtime = paths["train"].stat().st_mtime_ns
  # ensure_data: meta matches (seed 2, train 50) -> files kept.
  assert task.ensure_data(tmp_path, seed=2, num_train=50) == paths
  assert paths["train"].stat().st_mtime_ns == mtime
  task.ensure_data(tmp_path, seed=3, num_train=40)  # mismatch -> regenerated
  assert len(task.read_split(tmp_path, "train")) == 40


def test_dyck_generation_properties():
  task = tasks.get_task("dyck")
  sizes = {"train": 3000, "val": 300, "test": 200}
  data = dyck.generate_ids(seed=0, sizes=sizes)
  assert {s: len(v) for s, v in data.items()} == sizes
  train_paths = set()
  for x in data["train"]:
    train_paths.update(dyck.paths(x))
  train_strings = {x.tobytes() for x in data["train"]}
  for split, xs in data.items():
    for x in xs:
      toks = dyck.ids_to_tokens(x)
      stack = []
      for t in toks:  # balanced, depth <= 10
        if t.startswith("("):
          stack.append(t[1])
          assert len(stack) <= 10
        else:
          assert stack.pop() == t[0]
      assert not stack and len(toks) >= 2
  assert all(all(p in train_paths for p in dyck.paths(x)) for x in data["val"])
  assert not any(x.tobytes() in train_strings for x in data["val"])
  assert not any(any(p in train_paths for p in dyck.paths(x)) for x in data["test"])
  ex = task.generate_examples(seed=0, sizes=sizes)
  assert ex["val"][0].source == dyck.ids_to_tokens(data["val"][0])
  capped = dyck.generate_ids(seed=0, sizes=sizes, max_length=30)
  assert max(len(x) for xs in capped.values() for x in xs) <= 30


def test_dyck_sampler_statistics():
  """At an empty stack P(end) = 1/2 after the first block; inside, P(close) = 1/2."""
  xs = dyck.sample_ids(20000, np.random.default_rng(0))
  blocks = collections.Counter(len(dyck.paths(x)) for x in xs)
  assert blocks[1] / len(xs) == pytest.approx(0.5, abs=0.02)
  first_close = np.mean([x[1] >= 20 for x in xs])
  assert first_close == pytest.approx(0.5, abs=0.02)


def test_dyck_files_roundtrip(tmp_path):
  task = tasks.get_task("dyck")
  paths = task.generate(tmp_path, num_train=500, sizes={"val": 50, "test": 20})
  assert paths["val"].read_text().splitlines()[0].endswith(" END")
  data = task.generate_examples(sizes={"train": 500, "val": 50, "test": 20})
  assert task.read_split(tmp_path, "test") == data["test"]
  enc = task.encode(task.read_split(tmp_path, "val"), task.vocab())
  assert enc.close_mask.sum() * 2 == (enc.lengths - 1).sum()


def test_cli_small(tmp_path):
  out = subprocess.run([sys.executable, "-m", "sg_jax.data", "--task=question",
                        f"--out_dir={tmp_path}", "--num_train=200", "--num_eval=50"],
                       capture_output=True, text=True, check=True, timeout=120)
  assert "train  200" in out.stdout and "quest 100.0%" in out.stdout
  assert (tmp_path / "question_bracket.gen").exists()


def test_cli_disk_full_is_one_line_naming_the_file(tmp_path):
  # Every write fails as on a full disk (injected: os.fdopen returns such a file).
  code = f"""
import errno, os
real = os.fdopen
class Full:
  def __init__(self, f): self.f = f
  def __enter__(self): return self
  def __exit__(self, *exc): self.f.close()
  def write(self, text): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
os.fdopen = lambda fd, *a, **k: Full(real(fd, *a, **k))
from absl import app
from sg_jax.data import generate as data
app.run(data.main, argv=["sg_jax.data", "--task=question", "--out_dir={tmp_path}",
                         "--num_train=40", "--num_eval=10"])
"""
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 1 and "Traceback" not in done.stderr
  assert done.stderr.strip().splitlines()[-1] == (  # after the progress bar
      f"error: [Errno 28] cannot write {tmp_path / 'question.train'}: No space left on device")
  assert os.listdir(tmp_path) == []  # no temporary file left


def test_training_path_does_not_import_tensorflow():
  code = ("import sys, sg_jax.tasks as t, sg_jax.data; "
          "[t.get_task(n).vocab() for n in t.TASK_NAMES]; "
          "assert 'tensorflow' not in sys.modules and 'tensorflow_datasets' not in sys.modules")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.tfds
def test_tfds_builders(tmp_path):
  """TFDS builders (slow-ish: imports tensorflow_datasets): tiny sizes, all splits, data_source."""
  tb = pytest.importorskip("sg_jax.tasks.tfds_builders")
  for cls, splits in [(tb.QuestionFormation, ("train", "dev", "test", "gen")),
                      (tb.TenseReinflection, ("train", "dev", "test", "gen")),
                      (tb.Dyck2010, ("train", "val", "test"))]:
    builder = cls(config=cls.make_config(num_train=30, num_eval=8), data_dir=str(tmp_path))
    builder.download_and_prepare()
    ds = builder.as_data_source()
    assert {s: len(ds[s]) for s in splits} == {s: 30 if s == "train" else 8 for s in splits}
    task = tasks.get_task(cls.TASK)
    expected = task.generate_examples(sizes={s: 30 if s == "train" else 8 for s in splits})
    got = sorted(ds[splits[-1]][i]["source"].decode() for i in range(8))
    assert got == sorted(" ".join(e.source) for e in expected[splits[-1]])
    if cls.HAS_TREES:
      rec = ds["gen"][0]
      assert rec["source_tree"].decode().startswith("[ ")
