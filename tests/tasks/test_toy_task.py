"""Adding a task: a toy reversal task registered from this file trains through the normal loop.

The task below is everything a new task needs (besides its config file): generation, files,
reading, vocabulary, an extra encoded field and its metric.
"""

import os
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from sg_jax import configlib
from sg_jax import tasks
from sg_jax import train
from sg_jax.records import metric_logging
from sg_jax.tasks import base
from sg_jax.tasks import io as io_lib
from sg_jax.tasks import vocab as vocab_lib

LETTERS = ("a", "b", "c", "d", "e")


@tasks.register_task("toy_reverse")
class ReverseTask(base.Task):
  """`x1 .. xn rev<TAB>xn .. x1`; dev lines have 2-4 letters, gen lines 5-6 (longer)."""
  split_names = ("train", "dev", "gen")
  in_domain_split = "dev"
  out_of_domain_split = "gen"
  default_sizes = {"train": 600, "dev": 64, "gen": 64}
  eval_fields = ("answer_mask",)

  def vocab(self):
    return vocab_lib.Vocab.from_word_classes({**{w: "N" for w in LETTERS}, "rev": "task"})

  def file_names(self, split):
    return f"{self.name}.{split}", None

  def generate_examples(self, *, seed=0, sizes=None, progress=False):
    del progress
    sizes = {**self.default_sizes, **(sizes or {})}
    rng = np.random.default_rng(seed)
    out = {}
    for split in self.split_names:
      low, high = (5, 7) if split == "gen" else (2, 5)
      lines = []
      for _ in range(sizes[split]):
        words = tuple(rng.choice(LETTERS, size=int(rng.integers(low, high))).tolist())
        lines.append(base.Example(source=words + ("rev",), target=words[::-1], task_token="rev"))
      out[split] = lines
    return out

  def generate(self, out_dir, *, seed=0, num_train=None, progress=False, sizes=None):
    sizes = {**self.default_sizes, **(sizes or {})}
    if num_train is not None:
      sizes["train"] = int(num_train)
    paths = {}
    for split, lines in self.generate_examples(seed=seed, sizes=sizes).items():
      text = "".join(" ".join(e.source) + "\t" + " ".join(e.target) + "\n" for e in lines)
      paths[split] = io_lib.write_text_atomic(
          pathlib.Path(out_dir) / self.file_names(split)[0], text)
    return paths

  def read_split(self, path_or_dir, split=None):
    path = pathlib.Path(path_or_dir)
    if path.is_dir():
      path = path / self.file_names(split)[0]
    out = []
    for line in path.read_text().splitlines():
      source, target = line.split("\t")
      out.append(base.Example(source=tuple(source.split()), target=tuple(target.split()),
                              task_token="rev"))
    return out

  def encode_extras(self, examples, vocab, split):
    # The answer: target positions from the task token to EOS.
    t = np.arange(split.targets.shape[1])[None]
    mask = (t >= split.task_pos[:, None]) & (t < split.lengths[:, None])
    return {"answer_mask": mask}

  def make_metrics(self, vocab):
    def metrics(batch, logits, decoded):
      del decoded
      scored = batch["answer_mask"] & batch["valid"][:, None]
      right = (jnp.argmax(logits, axis=-1) == batch["targets"]) & scored
      return {"correct": jnp.sum(right).astype(jnp.float32),
              "total": jnp.sum(scored).astype(jnp.float32)}

    return metrics


def toy_config(tiny_config, data_dir, num_steps):
  """The tiny preset on the toy task, with a larger learning rate so that 60 steps learn."""
  return tiny_config(data_dir, "toy_reverse", **{
      "optim.learning_rate": 3e-3, "optim.warmup_steps": 5, "train.batch_size": 32,
      "train.num_steps": num_steps, "eval.every": num_steps, "checkpoint.every": num_steps})


def test_toy_task_is_registered_everywhere():
  assert "toy_reverse" in tasks.names() and "toy_reverse" not in tasks.TASK_NAMES
  assert isinstance(tasks.get_task("toy_reverse"), ReverseTask)
  assert configlib.base_config("toy_reverse").task == "toy_reverse"
  with pytest.raises(ValueError, match="'toy_nope'.*toy_reverse"):
    configlib.base_config("toy_nope")
  task = tasks.get_task("toy_reverse")
  vocab = task.vocab()
  enc = task.encode([base.Example(source=("a", "b", "rev"), target=("b", "a"),
                                  task_token="rev")], vocab)
  assert enc.task_pos.tolist() == [3]
  # targets: a b rev b a EOS; the answer is "b a EOS".
  assert enc.answer_mask[0].tolist() == [False, False, False, True, True, True]


def test_toy_metric_counts_answer_tokens():
  task = tasks.get_task("toy_reverse")
  vocab = task.vocab()
  lines = task.generate_examples(seed=1, sizes={"dev": 5})["dev"]
  enc = task.encode(lines, vocab)
  rng = np.random.default_rng(0)
  logits = rng.normal(size=enc.inputs.shape + (vocab.size,)).astype(np.float32)
  batch = {k: jnp.asarray(v) for k, v in enc.as_dict().items()}
  batch["valid"] = jnp.asarray([True, True, True, True, False])
  out = task.make_metrics(vocab)(batch, jnp.asarray(logits), None)
  want_right = want_total = 0
  for k, ex in enumerate(lines[:4]):
    start = len(ex.source)
    for t in range(start, start + len(ex.target) + 1):
      want_total += 1
      want_right += int(np.argmax(logits[k, t]) == enc.targets[k, t])
  assert (float(out["correct"]), float(out["total"])) == (want_right, want_total)


@pytest.mark.slow
def test_toy_task_trains_through_the_normal_loop(tiny_config, tmp_path):
  data_dir = tmp_path / "data"
  tasks.get_task("toy_reverse").generate(data_dir, seed=0)
  workdir = str(tmp_path / "run")
  result = train.train_and_evaluate(toy_config(tiny_config, str(data_dir), 60), workdir,
                                    tensorboard=False)
  assert result["step"] == 60
  rows = metric_logging.read_table(os.path.join(workdir, "metrics.csv"))
  value = {(r["step"], r["seed"], r["name"]): r["value"] for r in rows}
  for seed in (0, 1):
    for split in ("in_domain", "out_of_domain"):
      first, last = value[(0, seed, f"{split}/loss")], value[(60, seed, f"{split}/loss")]
      assert last < first - 0.2, (split, first, last)
      assert 0.0 <= value[(60, seed, f"{split}/accuracy")] <= 1.0
    # 6 output tokens (5 letters and EOS): learning beats chance on the in-domain answers.
    assert value[(60, seed, "in_domain/accuracy")] > value[(0, seed, "in_domain/accuracy")]
  np.testing.assert_allclose(result["eval"]["in_domain/accuracy"],
                             [value[(60, s, "in_domain/accuracy")] for s in (0, 1)], rtol=1e-6)
