"""Shared machinery of the two McCoy et al. (2020) tasks: split generation, files, shapes.

Generation (docs/REFERENCE.md §1 "Tasks"; the README of the released data, McCoy et al. 2020):
distinct sentences are sampled from the packaged grammar. Each sentence has two candidate lines, the identity line (`decl`/`PAST`)
and the transformed line (`quest`/`PRESENT`). A transformed line where the two candidate rules
(linear vs hierarchical) give different outputs is *ambiguous*: it never goes to train/dev/test,
only to `gen`. By default (`pair_variants=False`, as in the released dev/test files, which never
hold both variants of one sentence) a fair coin picks the variant of each sentence, and a sentence
whose coin picks an ambiguous transformed line is dropped; `pair_variants=True` emits both variants
of every sentence (only the identity line when the transformed one is ambiguous). Both give the
same expected task-token mix (question: 40% `quest`; tense: 13/31 = 41.9% `PRESENT`).

Splits are filled from one stream of fresh sentences in the order test, train, dev (dev last
reproduces the released tense dev, which lacks the few short sentences that train exhausts), then
`gen` takes the transformed lines of fresh ambiguous sentences. A sentence belongs to exactly one
split, so no source sentence is shared between train and any evaluation split. Lines are shuffled
within each split.

Sentence shapes (`sentence_shape`) are drawn from the distribution measured on the released files
(`shapes="released"`, default) and the words from the PCFG given the shape: the released data do
not follow the grammar's own rule weights (e.g. only 13% of question sentences have an intransitive
main verb, against 50% under `question.gr`; gen holds no relative clause on the object).
`shapes="grammar"` samples the plain PCFG instead.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Optional, Sequence

import numpy as np

from sg_jax.tasks import dependencies
from sg_jax.tasks import io as io_lib
from sg_jax.tasks import pcfg
from sg_jax.tasks import trees
from sg_jax.tasks import vocab as vocab_lib
from sg_jax.tasks import base
from sg_jax.tasks.examples import DataError, Example
# Re-exported: callers use them as `mccoy.<name>`.
from sg_jax.tasks.shapes import (ShapeSampler, modifier, pos_of_label,  # noqa: F401
                                 sentence_shape)

DEFAULT_SIZES = {"train": 100_000, "dev": 1_000, "test": 10_000, "gen": 10_000}
META_SUFFIX = base.META_SUFFIX


class McCoyTask(base.Task):
  """Base class of question formation and tense reinflection (see the module docstring).

  Subclasses are registered (`base.register_task`), set `grammar_name`, `identity_token`,
  `transformed_token`, `eval_fields` and implement `lines_of(derivation)`,
  `source_derivation(declarative_words)` and `make_metrics(vocab)`.
  """
  grammar_name: str = ""
  identity_token: str = ""
  transformed_token: str = ""
  split_names = ("train", "dev", "test", "gen")
  in_domain_split = "dev"
  out_of_domain_split = "gen"
  default_sizes = DEFAULT_SIZES
  has_gold_trees = True
  has_gold_dependencies = True
  # What modifies the subject (`shapes.modifier` of the subject NP): nothing, a prepositional
  # phrase, or a relative clause (subject-extracted, object-extracted, intransitive). For
  # question formation the subject modifier is the construction that separates the rules (gen:
  # the RC types); for tense reinflection it holds the agreement attractor (PP vs RC).
  constructions = ("none", "PP", "RC-subj", "RC-obj", "RC-intrans")

  # --- grammar and vocabulary ---------------------------------------------------------------

  @property
  def grammar(self) -> pcfg.Grammar:
    """The packaged grammar sentences are sampled from."""
    return pcfg.load_grammar(self.grammar_name)

  @property
  def task_tokens(self) -> dict:
    """`{task token: transformed?}`."""
    return {self.identity_token: False, self.transformed_token: True}

  def extra_words(self) -> dict:
    """`{word: POS class}` of words that are not grammar terminals (subclasses extend)."""
    return {self.identity_token: "task", self.transformed_token: "task"}

  def vocab(self) -> vocab_lib.Vocab:
    """Vocabulary from the packaged grammar (independent of any data)."""
    word_pos = {}
    for word, labels in self.grammar.preterminal_words().items():
      word_pos[word] = pos_of_label(labels[0])
    for t in self.grammar.terminals:
      word_pos.setdefault(t, "punct")  # the final "."
    word_pos.update(self.extra_words())
    return vocab_lib.Vocab.from_word_classes(word_pos)

  # --- per-sentence logic (subclasses) ------------------------------------------------------

  def lines_of(self, d: pcfg.Derivation) -> tuple[Example, Example, bool]:
    """(identity line, transformed line, ambiguous?) of a sampled sentence derivation."""
    raise NotImplementedError

  def source_derivation(self, words: Sequence[str]) -> pcfg.Derivation:
    """Grammar derivation of a source sentence (words before the task token, `.` included).

    Raises:
      pcfg.ParseError: the sentence is not generated by the packaged grammar.
    """
    raise NotImplementedError

  def assign_trees(self, example: Example) -> Example:
    """The example with the trees the project assigns (by parsing its source sentence).

    Raises:
      pcfg.ParseError: the source sentence does not parse.
    """
    d = self.source_derivation(example.source[:-1])
    ident, trans, _ = self.lines_of(d)
    ref = trans if example.transformed else ident
    return Example(source=example.source, target=example.target, source_tree=ref.source_tree,
                   target_tree=ref.target_tree, task_token=example.task_token,
                   transformed=example.transformed)

  def gen_eligible(self, transformed: Example) -> bool:
    """Whether an ambiguous transformed line is informative enough for `gen` (default: all).

    Question formation overrides it: the two rules must front different auxiliaries.
    """
    del transformed
    return True

  def is_ambiguous(self, example: Example) -> bool:
    """True iff `example` is a transformed line on which the linear and hierarchical rules
    disagree (the kind of line that goes only to `gen`).

    Raises:
      pcfg.ParseError: the source sentence does not parse.
    """
    if not example.transformed:
      return False
    return self.lines_of(self.source_derivation(example.source[:-1]))[2]

  def shape(self, example: Example) -> tuple:
    """`sentence_shape` of the example's source sentence (parsed with the grammar)."""
    return sentence_shape(self.source_derivation(example.source[:-1]))

  def construction_ids(self, examples: Sequence[Example]) -> np.ndarray:
    """int32 [N]: the index in `constructions` of each transformed line's subject modifier
    (`shape`); -1 for identity lines, which the metrics do not read.

    Raises:
      pcfg.ParseError: a source sentence does not parse with the task's grammar.
    """
    index = {name: k for k, name in enumerate(self.constructions)}
    return np.asarray([index[self.shape(ex)[0]] if ex.transformed else -1 for ex in examples],
                      np.int32)

  # --- generation ---------------------------------------------------------------------------

  # Shape distributions estimated from the released files (subclasses set them).
  in_domain_shape_counts: dict = {}
  gen_shape_counts: dict = {}

  def generate_examples(self, *, seed: int = 0, sizes: Optional[dict] = None,
                        pair_variants: bool = False, shapes: str = "released",
                        progress: bool | str = False) -> dict:
    """Generates all splits in memory (see the module docstring for the design).

    Args:
      seed: seed of the numpy Generators (the output is a deterministic function of it).
      sizes: `{split: number of lines}`, missing splits default to `DEFAULT_SIZES`.
      pair_variants: both variants of every sentence (issue design) or one per sentence
        (released dev/test files).
      shapes: `"released"`: sentence shapes drawn from the distributions measured on the released
        files (`in_domain_shape_counts` for train/dev/test, `gen_shape_counts` for gen), words
        from the PCFG given the shape; `"grammar"`: plain PCFG samples for every split.
      progress: True: a tqdm progress bar; "log": progress lines (`base.progress_bar`).

    Returns:
      `{split: list[Example]}` for train, dev, test, gen.

    Raises:
      ValueError: the grammar cannot supply enough distinct sentences.
    """
    sizes = {**self.default_sizes, **(sizes or {})}
    unknown = set(sizes) - set(self.split_names)
    if unknown:
      raise ValueError(f"unknown splits {sorted(unknown)}")
    sent_seq, choice_seq, gen_seq = np.random.SeedSequence(seed).spawn(3)
    choice = np.random.default_rng(choice_seq)
    if shapes == "released":
      sample_in = ShapeSampler(self.grammar, self.in_domain_shape_counts,
                               np.random.default_rng(sent_seq)).sample_with_shape
      sample_gen = ShapeSampler(self.grammar, self.gen_shape_counts,
                                np.random.default_rng(gen_seq)).sample_with_shape
    elif shapes == "grammar":
      stream = self.grammar.sample_stream(np.random.default_rng(sent_seq))
      sample_in = sample_gen = lambda shape: (next(stream), None)
    else:
      raise ValueError(f"shapes must be 'released' or 'grammar', got {shapes!r}")
    seen: set = set()
    out = {s: [] for s in self.split_names}
    total = sum(sizes.values())
    bar = base.progress_bar(total, f"{self.name} lines", "line", progress)
    max_draws = 50 * total + 10_000
    draws = 0

    def fresh(sampler, shape=None):
      # A duplicate is redrawn with the same shape (up to 100 times), so that deduplication does
      # not shift the shape distribution away from shapes with few distinct sentences.
      nonlocal draws
      tries = 0
      while True:
        draws += 1
        if draws > max_draws:
          raise ValueError(f"could not sample enough distinct sentences for sizes {sizes}")
        d, shape = sampler(shape if tries < 100 else None)
        key = pcfg.words_of(d)
        if key not in seen:
          seen.add(key)
          return d, shape
        tries += 1

    for split in ("test", "train", "dev"):
      need = sizes[split]
      lines = out[split]
      while len(lines) < need:
        ident, trans, ambiguous = self.lines_of(fresh(sample_in)[0])
        if pair_variants:
          new = [ident] if ambiguous else [ident, trans]
        else:
          pick = int(choice.integers(2))
          if pick == 1 and ambiguous:
            continue
          new = [(ident, trans)[pick]]
        if len(new) > need - len(lines):
          new = [new[int(choice.integers(len(new)))]]
        lines.extend(new)
        bar.update(len(new))
    while len(out["gen"]) < sizes["gen"]:
      # A sentence whose transformed line is not a gen line is redrawn with the same shape (up to
      # 100 times), so that the filter does not shift the gen shape distribution.
      d, shape = fresh(sample_gen)
      for _ in range(100):
        _, trans, ambiguous = self.lines_of(d)
        if ambiguous and self.gen_eligible(trans):
          out["gen"].append(trans)
          bar.update(1)
          break
        d, shape = fresh(sample_gen, shape)
    bar.close()
    for split, lines in out.items():
      perm = choice.permutation(len(lines))
      out[split] = [lines[i] for i in perm]
    return out

  def file_names(self, split: str) -> tuple[str, str]:
    """(plain, bracketed) file names of a split, e.g. `question.dev`, `question_bracket.dev`."""
    return f"{self.name}.{split}", f"{self.name}_bracket.{split}"

  def generate(self, out_dir: os.PathLike | str, *, seed: int = 0,
               num_train: Optional[int] = None, progress: bool | str = False,
               sizes: Optional[dict] = None, pair_variants: bool = False,
               shapes: str = "released") -> dict:
    """Generates the splits and writes them in the released formats.

    Writes `{name}.{split}` and `{name}_bracket.{split}` for every split, plus
    `{name}.meta.json` (seed and sizes) into `out_dir`.

    Args:
      out_dir: output folder (created).
      seed: generation seed.
      num_train: train lines (default 100,000); overrides `sizes["train"]`.
      progress: see `generate_examples`.
      sizes: other split sizes (default dev 1,000, test 10,000, gen 10,000).
      pair_variants, shapes: see `generate_examples`.

    Returns:
      `{split: path of the plain file}`.
    """
    sizes = {**self.default_sizes, **(sizes or {})}
    if num_train is not None:
      sizes["train"] = int(num_train)
    data = self.generate_examples(seed=seed, sizes=sizes, pair_variants=pair_variants,
                                  shapes=shapes, progress=progress)
    out_dir = pathlib.Path(out_dir)
    paths = {}
    for split, examples in data.items():
      plain, bracket = self.file_names(split)
      paths[split] = io_lib.write_mccoy_file(out_dir / plain, examples)
      io_lib.write_mccoy_file(out_dir / bracket, examples, bracketed=True)
    meta = {"task": self.name, "seed": seed, "sizes": sizes, "pair_variants": pair_variants,
            "shapes": shapes}
    io_lib.write_text_atomic(out_dir / (self.name + META_SUFFIX), json.dumps(meta, indent=1))
    return paths

  # --- reading and encoding -----------------------------------------------------------------

  def read_split(self, path_or_dir: os.PathLike | str, split: Optional[str] = None, *,
                 assign_trees: bool = False) -> list:
    """Reads a split.

    From a folder, the bracketed file `{name}_bracket.{split}` is read when it exists (it has
    the trees), after checking that `{name}.{split}`, when present too, holds the same lines
    (`io.read_mccoy_pair`); otherwise the plain file is read.

    Args:
      path_or_dir: a file, or a folder holding `{name}_bracket.{split}` and/or `{name}.{split}`.
      split: split name (needed when `path_or_dir` is a folder).
      assign_trees: fill missing trees by parsing each source with the grammar.

    Returns:
      list of Example.

    Raises:
      DataError: missing file, empty file or malformed line (file and line in the message); the
        plain and bracketed files of the split disagree; with `assign_trees`, a sentence the
        grammar does not generate.
    """
    path = pathlib.Path(path_or_dir)
    if path.is_dir():
      if split is None:
        raise ValueError("split is required when reading from a folder")
      plain, bracket = (path / n for n in self.file_names(split))
      path = bracket if bracket.exists() else plain
      if path == bracket and plain.exists():
        examples = io_lib.read_mccoy_pair(plain, bracket, self.task_tokens)
      else:
        examples = io_lib.read_mccoy_file(path, self.task_tokens)
    else:
      examples = io_lib.read_mccoy_file(path, self.task_tokens)
    if assign_trees:
      out = []
      for i, ex in enumerate(examples, start=1):
        if ex.source_tree is None:
          try:
            ex = self.assign_trees(ex)
          except pcfg.ParseError as err:
            raise DataError(path, i, str(err)) from None
        out.append(ex)
      examples = out
    return examples

  def encode_extras(self, examples: Sequence[Example], vocab: vocab_lib.Vocab,
                    split: vocab_lib.EncodedSplit) -> dict:
    """`transformed` (bool [N], `quest`/`PRESENT` line) and `main_verb_pos` (int32 [N], index
    into `targets` of the target sentence's main verb: the second verb when the subject carries a
    relative clause, else the first; docs/REFERENCE.md §1 tense metric; -1 if none or cut off)."""
    length = split.inputs.shape[1]
    transformed = np.array([ex.transformed for ex in examples], bool)
    main_verb = np.full(len(examples), -1, np.int32)
    for k, ex in enumerate(examples):
      if ex.task_token is not None:
        t = len(ex.source)
        mv = vocab_lib.main_verb_index(ex.target, vocab)
        if mv >= 0 and t + mv < length:
          main_verb[k] = t + mv
    return {"transformed": transformed, "main_verb_pos": main_verb}

  def gold_dependencies(self, example: Example) -> list:
    """Arcs of both halves of the line by the head rules (`dependencies.line_dependencies`);
    a line without trees gets them from the grammar first (`assign_trees`). See
    `base.Task.gold_dependencies`.

    Raises:
      ValueError: a sentence the grammar does not generate or a tree no head rule covers.
    """
    if example.source_tree is None or example.target_tree is None:
      example = self.assign_trees(example)
    if self._pos_of is None:
      vocab = self.vocab()
      self._pos_of = dict(zip(vocab.words, vocab.pos))
    return dependencies.line_dependencies(example.source_tree, example.target_tree,
                                          len(example.source), self._pos_of)

  _pos_of = None  # {word: POS class}, built on first use

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r})"


def tree_with_leaves(tree: trees.Tree, words: Sequence[str]) -> trees.Tree:
  """`tree` with its leaves replaced, left to right, by `words` (same number of words)."""
  it = iter(words)
  out = trees.map_leaves(tree, lambda _: next(it))
  return out
