"""Atomic writes (sg_jax.records.fileio): whole content replaced, or the old file left intact."""

import errno
import os

import pytest

from sg_jax.records import fileio


def test_write_atomic_replaces_the_whole_content(tmp_path):
  path = tmp_path / "sub" / "config.json"  # the folder is created
  assert fileio.write_atomic(path, "a long first version\n" * 100) == path
  fileio.write_atomic(path, "short\n")
  assert path.read_text() == "short\n"
  fileio.write_atomic(str(path), b"\x00bytes")
  assert path.read_bytes() == b"\x00bytes"
  assert os.listdir(path.parent) == ["config.json"]
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # as a plain open() gives


def test_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
  path = tmp_path / "sweep.json"
  path.write_text("old\n")
  with pytest.raises(RuntimeError, match="stopped"):
    with fileio.open_atomic(path) as f:
      f.write("half of the new ")
      f.flush()
      assert len(os.listdir(tmp_path)) == 2  # the temporary file sits beside the target
      raise RuntimeError("stopped")
  assert path.read_text() == "old\n"
  assert os.listdir(tmp_path) == ["sweep.json"]


def test_disk_full_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
  path = tmp_path / "vocab.json"
  path.write_text("old\n")

  def full(fd):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(OSError, match=f"cannot write {path}: No space left") as info:
    fileio.write_atomic(path, "new content\n")
  assert info.value.errno == errno.ENOSPC
  assert path.read_text() == "old\n"
  assert os.listdir(tmp_path) == ["vocab.json"]


def test_unwritable_folder_is_named(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  with pytest.raises(OSError, match=f"cannot write {blocker / 'x.json'}"):
    fileio.write_atomic(blocker / "x.json", "{}")
