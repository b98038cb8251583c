"""Atomic file writes: a reader sees the old file or the whole new one, never a part.

Every file sg_jax rewrites in place (config.json, vocab.json, sweep.json, generated data, the
download hash record, a rewritten metrics table) goes through `open_atomic` / `write_atomic`:
the content is written to a temporary file in the same folder (so the rename cannot cross file
systems), flushed and fsynced, then renamed over the target with `os.replace`. On any failure,
including a disk that fills up mid-write or an interrupt, the temporary file is removed and the
old file is left as it was.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import pathlib
import tempfile
from typing import IO, Iterator


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def _fsync_dir(folder: pathlib.Path) -> None:
  """Makes the rename itself durable; skipped where folders cannot be opened (Windows)."""
  try:
    fd = os.open(folder, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def _named_error(err: OSError, path: pathlib.Path) -> OSError:
  """`err` with a message naming `path` (the bare "[Errno 28] No space left on device" of a
  failed write does not say which file); same subclass and errno."""
  if err.errno is None:
    return type(err)(f"cannot write {path}: {err}")
  return type(err)(err.errno, f"cannot write {path}: {err.strerror or err}")


@contextlib.contextmanager
def open_atomic(path: os.PathLike | str, binary: bool = False) -> Iterator[IO]:
  """Opens a temporary file that replaces `path` when the `with` block ends without error.

  The folder of `path` is created if needed. The new file gets the permissions a plain `open`
  would give it (0o666 less the umask). If the block raises, `path` is left untouched, the
  temporary file is removed and the block's exception propagates unchanged.

  Args:
    path: the file to replace (or create).
    binary: yield a binary file (write bytes) instead of a UTF-8 text file.

  Yields:
    The open temporary file.

  Raises:
    OSError: the folder or temporary file cannot be created, or flushing, syncing or renaming
      it fails (e.g. the disk is full); the message names `path` and the cause, with the
      subclass and errno of the underlying error.
  """
  path = pathlib.Path(path)
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
  except OSError as err:
    raise _named_error(err, path) from err
  in_block = False
  try:
    with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})
                   ) as f:
      in_block = True
      yield f
      in_block = False
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
  except BaseException as err:
    if os.path.exists(tmp):
      os.unlink(tmp)
    if isinstance(err, OSError) and not in_block:  # the caller's own errors pass unchanged
      raise _named_error(err, path) from err
    raise
  _fsync_dir(path.parent)


def write_atomic(path: os.PathLike | str, data: str | bytes) -> pathlib.Path:
  """Replaces the whole content of `path` with `data` (str as UTF-8), atomically.

  See `open_atomic` for the guarantees (old file intact and no temporary file left on failure).

  Args:
    path: the file to replace (or create); its folder is created if needed.
    data: the new content.

  Returns:
    `path` as a `pathlib.Path`.

  Raises:
    OSError: as `open_atomic`, naming `path`.
  """
  with open_atomic(path, binary=isinstance(data, bytes)) as f:
    try:
      f.write(data)
    except OSError as err:
      raise _named_error(err, pathlib.Path(path)) from err
  return pathlib.Path(path)


# Suffix of a table kept gzip-compressed (a run exported by `python -m sg_jax.results export`).
GZIP_SUFFIX = ".gz"


def stored_path(path: os.PathLike | str) -> str | None:
  """`path` if it exists, else its compressed copy `path + '.gz'` if that exists, else None.

  Readers of a workdir's tables (`metrics.csv`, `analysis.csv`, `pruning.csv`, ...) go through
  this, so an exported run (`sg_jax.results`: the same tables gzip-compressed) reads exactly as
  the workdir it came from.
  """
  path = os.fspath(path)
  if os.path.exists(path):
    return path
  if os.path.exists(path + GZIP_SUFFIX):
    return path + GZIP_SUFFIX
  return None


def read_text(path: os.PathLike | str) -> str:
  """The UTF-8 text of `path`, or of `path + '.gz'` decompressed when `path` is absent
  (`stored_path`). Newlines are kept as stored (no universal-newline translation).

  Raises:
    FileNotFoundError: neither exists (naming `path`).
    OSError: the file cannot be read or is not valid gzip.
  """
  found = stored_path(path)
  if found is None:
    raise FileNotFoundError(f"no such file: {os.fspath(path)} (nor {os.fspath(path)}.gz)")
  if found.endswith(GZIP_SUFFIX) and found != os.fspath(path):
    with gzip.open(found, "rb") as f:
      return f.read().decode("utf-8")
  with open(found, newline="", encoding="utf-8") as f:
    return f.read()
