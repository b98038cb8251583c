"""Readers and writers of the released data formats, and the optional download of released files.

Formats (McCoy et al. 2020, the README of the released data (McCoy et al. 2020)):
* `source<TAB>target` per line; the source ends in a task token (`decl`/`quest`, `PAST`/`PRESENT`).
* bracketed variant (`*_bracket.*`): `[ tree ] task<TAB>[ tree ] punct` (see `trees`).
* Dyck (structural-grokking repository): space-separated `(x` / `x)` tokens ending in `END`.

Every reader raises `DataError` naming the file and 1-based line for: an empty file, a missing tab,
an unknown task token, unbalanced brackets, an unknown token.

`download_released` fetches the released McCoy files from a base URL (default: the public GitHub
raw URL of tommccoy1/rnn-hierarchical-biases, `data/`), checks each against its SHA-256 (known
hashes below; files without a known hash, e.g. the `.train` splits, are recorded in
`sha256.json` beside the cache at first download and checked against that afterwards) and caches
them under a data directory. Nothing in sg_jax downloads implicitly.

`run_data_dir` names the folder of a run's split files (`data.dir`, or the workdir's `data/`).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import urllib.request
from typing import Iterable, Mapping, Optional, Sequence

from sg_jax.records import fileio
from sg_jax.tasks import trees
from sg_jax.tasks.examples import DataError, Example

DEFAULT_BASE_URL = ("https://raw.githubusercontent.com/tommccoy1/rnn-hierarchical-biases/master/"
                    "data/")
HASH_RECORD = "sha256.json"

# SHA-256 of the released files (from the README of the released data).
KNOWN_SHA256 = {
    "question.dev": "bfa06ca46316917089e97c3c3f653fa3d1e786c9a0fa51b52d491bb0f471fdcb",
    "question.gen": "037ae76f30c2df9779f02ff7245b6e798a79a264d456f9511839aafebc02e817",
    "question.test": "498cd58830b732b6f5f40ad32f67a8f0d84dd73ad59c5035ec7c78bde75f280e",
    "tense.dev": "c05259d7ca49f0e9745afede03c6edeb9c863b912a736d04cbadb8c6c5a1da95",
    "tense.gen": "8465478028531cbd66aebad54f40d2823c753e5c04be769b8cedc7aa0a95d39b",
    "tense.test": "26acb1e6bbc911b69040940ccaa018e3ef4efe781f6e4eb711c40f39b7651ac2",
    "question.gr": "e591d9687a02a554021fe4470f3ddd84ecca19bf509cc4aed770c27df671463b",
    "tense.gr": "f62347f8f75f8261d64b96a652e5d4425c7309f12337eaab8b65504479abf7b9",
}

RELEASED_FILES = tuple(f"{task}{kind}.{split}" for task in ("question", "tense")
                       for kind in ("", "_bracket") for split in ("train", "dev", "test", "gen"))

DYCK_END = "END"


def run_data_dir(data_config, workdir: os.PathLike | str) -> str:
  """The folder of a run's split files: `data.dir` when set, else `<workdir>/data` (where
  training generates them).

  Args:
    data_config: what holds the run's `dir` field ('' = unset): the `data` section of a run
      config, or the run's `input_pipeline.DataOptions`.
    workdir: the run directory.
  """
  return str(data_config.dir or os.path.join(workdir, "data"))


def text_line_of(path: os.PathLike | str, offset: int) -> int:
  """The 1-based line of byte `offset` of the file `path`."""
  with open(path, "rb") as f:
    return f.read(offset).count(b"\n") + 1


def _read_lines(path: os.PathLike | str) -> list[str]:
  path = pathlib.Path(path)
  try:
    text = path.read_text(encoding="utf-8")
  except FileNotFoundError:
    raise DataError(path, None, "file not found") from None
  except UnicodeDecodeError as e:  # one line naming the file and where, not a bare codec error
    line = text_line_of(path, e.start)
    raise DataError(path, line, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
  lines = text.splitlines()
  while lines and not lines[-1].strip():
    lines.pop()
  if not lines:
    raise DataError(path, None, "empty file")
  return lines


def parse_mccoy_line(line: str, task_tokens: Mapping[str, bool], *, bracketed: bool,
                     path: os.PathLike | str | None = None, lineno: int | None = None) -> Example:
  """Parses one `source<TAB>target` line (plain or bracketed).

  Args:
    line: the line without its newline.
    task_tokens: `{task token: transformed?}`, e.g. `{"decl": False, "quest": True}`.
    bracketed: the `*_bracket` format.
    path, lineno: where the line comes from (for error messages).

  Raises:
    DataError: missing tab, empty side, unknown task token, unbalanced brackets.
  """
  if "\t" not in line:
    raise DataError(path, lineno, "missing tab between source and target")
  src, tgt = line.split("\t", 1)
  if "\t" in tgt:
    raise DataError(path, lineno, "more than one tab")
  src_tok, tgt_tok = src.split(), tgt.split()
  if not src_tok or not tgt_tok:
    raise DataError(path, lineno, "empty source or target")
  task = src_tok[-1]
  if task not in task_tokens:
    raise DataError(path, lineno, f"unknown task token {task!r} (expected one of "
                    f"{sorted(task_tokens)})")
  source_tree = target_tree = None
  if bracketed:
    try:
      sf = trees.parse_forest(src_tok[:-1])
      tf = trees.parse_forest(tgt_tok)
    except trees.BracketError as err:
      raise DataError(path, lineno, f"unbalanced brackets: {err}") from None
    if len(sf) != 1:
      raise DataError(path, lineno, "source must be one bracketed tree before the task token")
    source_tree = sf[0]
    target_tree = tf if len(tf) > 1 else tf[0]
    source = trees.leaves(source_tree) + (task,)
    target = trees.leaves(target_tree)
  else:
    if "[" in src_tok or "]" in src_tok or "[" in tgt_tok or "]" in tgt_tok:
      raise DataError(path, lineno, "brackets in a plain (non-bracketed) file")
    source, target = tuple(src_tok), tuple(tgt_tok)
  return Example(source=source, target=target, source_tree=source_tree,
                 target_tree=target_tree, task_token=task, transformed=task_tokens[task])


def read_mccoy_file(path: os.PathLike | str, task_tokens: Mapping[str, bool], *,
                    bracketed: Optional[bool] = None) -> list[Example]:
  """Reads a released (or generated) question/tense file.

  Args:
    path: the file.
    task_tokens: `{task token: transformed?}`.
    bracketed: format; default: bracketed iff the first line starts with `[`.

  Returns:
    one Example per line.

  Raises:
    DataError: empty file or a malformed line (file and line number in the message).
  """
  lines = _read_lines(path)
  if bracketed is None:
    bracketed = lines[0].lstrip().startswith("[")
  return [parse_mccoy_line(l, task_tokens, bracketed=bracketed, path=path, lineno=i)
          for i, l in enumerate(lines, start=1)]


def _word_at(words: Sequence[str], i: int) -> str:
  return repr(words[i]) if i < len(words) else "the end of the line"


def read_mccoy_pair(plain_path: os.PathLike | str, bracket_path: os.PathLike | str,
                    task_tokens: Mapping[str, bool]) -> list[Example]:
  """Reads a split held in both formats: the bracketed file, checked against the plain one.

  The bracketed file is the one used (it has the trees). The plain file must hold the same lines,
  word for word, so that an edit to only one of the two is an error instead of being ignored.

  Args:
    plain_path: `{name}.{split}`.
    bracket_path: `{name}_bracket.{split}`.
    task_tokens: `{task token: transformed?}`.

  Returns:
    one Example per line of the bracketed file, with its trees.

  Raises:
    DataError: a malformed line in either file, different line counts, or a line whose words
      differ (naming both files, the line and the first differing word).
  """
  bracketed = read_mccoy_file(bracket_path, task_tokens)
  plain = read_mccoy_file(plain_path, task_tokens, bracketed=False)
  advice = (f"the two files of a split must hold the same lines, and "
            f"{pathlib.Path(bracket_path).name} is the one read: edit both, or delete it to use "
            f"{pathlib.Path(plain_path).name} alone")
  if len(plain) != len(bracketed):
    raise DataError(bracket_path, None, f"{len(bracketed)} lines, but {plain_path} has "
                    f"{len(plain)}; {advice}")
  for lineno, (p, b) in enumerate(zip(plain, bracketed), start=1):
    if p.words != b.words:
      at = next((i for i, (x, y) in enumerate(zip(p.words, b.words)) if x != y),
                min(len(p.words), len(b.words)))
      raise DataError(bracket_path, lineno, f"word {at + 1} is {_word_at(b.words, at)}, but "
                      f"{plain_path}:{lineno} has {_word_at(p.words, at)}; {advice}")
  return bracketed


def write_mccoy_file(path: os.PathLike | str, examples: Sequence[Example], *,
                     bracketed: bool = False) -> pathlib.Path:
  """Writes examples in the released format (atomically: temp file then rename).

  Raises:
    ValueError: `bracketed` and an example lacks its trees.
  """
  out = []
  for ex in examples:
    if bracketed:
      if ex.source_tree is None or ex.target_tree is None:
        raise ValueError("bracketed output needs source_tree and target_tree")
      tt = ex.target_tree
      out.append(f"{trees.format_tree(ex.source_tree)} {ex.task_token}\t"
                 f"{trees.format_forest(tt) if isinstance(tt, tuple) else tt}\n")
    else:
      out.append(" ".join(ex.source) + "\t" + " ".join(ex.target) + "\n")
  return write_text_atomic(path, "".join(out))


# Data files and the hash record: a reader sees the old file or the whole new one (the
# `pathlib.Path` written is returned).
write_text_atomic = fileio.write_atomic


def read_dyck_file(path: os.PathLike | str, *, num_types: Optional[int] = None,
                   max_depth: Optional[int] = None) -> list[Example]:
  """Reads a Dyck file: tokens `(x` / `x)`, each line ending in `END` (dropped on reading).

  Args:
    path: the file.
    num_types: if given, bracket letters must be among the first `num_types` of a..z.
    max_depth: if given, nesting deeper than this is an error.

  Raises:
    DataError: empty file, missing END, unknown token, unbalanced brackets (file and line).
  """
  letters = None if num_types is None else {chr(ord("a") + i) for i in range(num_types)}
  out = []
  for lineno, line in enumerate(_read_lines(path), start=1):
    toks = line.split()
    if not toks or toks[-1] != DYCK_END:
      raise DataError(path, lineno, f"line must end with {DYCK_END}")
    toks = toks[:-1]
    stack = []
    for t in toks:
      if len(t) == 2 and t[0] == "(":
        letter, opening = t[1], True
      elif len(t) == 2 and t[1] == ")":
        letter, opening = t[0], False
      else:
        raise DataError(path, lineno, f"unknown token {t!r}")
      if letters is not None and letter not in letters:
        raise DataError(path, lineno, f"bracket type {letter!r} outside the {num_types} types")
      if opening:
        stack.append(letter)
        if max_depth is not None and len(stack) > max_depth:
          raise DataError(path, lineno, f"nesting deeper than {max_depth}")
      elif not stack or stack.pop() != letter:
        raise DataError(path, lineno, f"unbalanced brackets: unexpected {t!r}")
    if stack:
      raise DataError(path, lineno, f"unbalanced brackets: {len(stack)} left open")
    out.append(Example(source=tuple(toks)))
  return out


# --- download ---------------------------------------------------------------------------------


def sha256_of(path: os.PathLike | str) -> str:
  """Hex SHA-256 of a file's bytes."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def download_released(data_dir: os.PathLike | str, names: Iterable[str] = RELEASED_FILES, *,
                      base_url: str = DEFAULT_BASE_URL,
                      known_sha256: Mapping[str, str] = KNOWN_SHA256,
                      timeout_s: float = 60.0) -> dict:
  """Downloads released McCoy et al. files into `data_dir`, verified by SHA-256.

  A file already cached with a matching hash is not downloaded again. A file without a known hash
  gets its hash recorded in `data_dir/sha256.json` at first download (trust on first use) and is
  checked against the record later.

  Args:
    data_dir: cache folder (created).
    names: file names under `base_url`, e.g. `"question.dev"`.
    base_url: URL prefix ending in `/` (tests use a local http.server).
    known_sha256: `{name: hex digest}` of expected hashes.
    timeout_s: per-request timeout in seconds.

  Returns:
    `{name: pathlib.Path}` of the cached files.

  Raises:
    DataError: a hash mismatch (the bad download is deleted) or a failed download; the message
      names the file.
  """
  data_dir = pathlib.Path(data_dir)
  data_dir.mkdir(parents=True, exist_ok=True)
  record_path = data_dir / HASH_RECORD
  recorded = json.loads(record_path.read_text()) if record_path.exists() else {}
  out = {}
  for name in names:
    if "/" in name or name.startswith("."):
      raise ValueError(f"bad file name {name!r}")
    dest = data_dir / name
    expected = known_sha256.get(name) or recorded.get(name)
    if dest.exists() and expected is not None and sha256_of(dest) == expected:
      out[name] = dest
      continue
    url = base_url + name
    try:
      # A failed download or a hash mismatch leaves `dest` as it was and no partial file.
      with fileio.open_atomic(dest, binary=True) as f, \
          urllib.request.urlopen(url, timeout=timeout_s) as resp:
        hasher = hashlib.sha256()
        for chunk in iter(lambda: resp.read(1 << 20), b""):
          f.write(chunk)
          hasher.update(chunk)
        digest = hasher.hexdigest()
        if expected is not None and digest != expected:
          raise DataError(dest, None, f"SHA-256 mismatch for {url}: got {digest}, "
                          f"expected {expected}")
    except OSError as err:
      raise DataError(dest, None, f"download of {url} failed: {err}") from err
    if expected is None:
      recorded[name] = digest
      write_text_atomic(record_path, json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    out[name] = dest
  return out
