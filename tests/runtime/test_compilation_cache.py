"""JAX's persistent compilation cache (sg_jax.runtime.compile_cache): a resumed run loads its train step
from the cache instead of compiling it, and says so in its log."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from conftest import JAX_CACHE_DIR, ROOT, TEST_SIZED_FLAGS
from sg_jax.runtime import compile_cache


def run_main(workdir, data_dir, cache, num_steps):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  cmd = [sys.executable, "-m", "sg_jax.main", "--config=configs/question.py:tiny",
         f"--workdir={workdir}", f"--config.data.dir={data_dir}",
         f"--config.train.num_steps={num_steps}", f"--compilation_cache_dir={cache}",
         "--notensorboard", *TEST_SIZED_FLAGS]
  done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stderr


@pytest.mark.slow
def test_resume_loads_train_step_from_cache(tmp_path, tiny_data):
  cache, workdir = tmp_path / "cache", tmp_path / "run"
  first = run_main(workdir, tiny_data, cache, num_steps=20)
  assert f"persistent compilation cache: {cache}" in first, first[-3000:]
  assert "train step (10 steps per call): compiled in" in first, first[-3000:]
  assert "train step (10 steps per call): loaded" not in first, first[-3000:]
  entries = set(os.listdir(cache))
  assert entries

  resumed = run_main(workdir, tiny_data, cache, num_steps=40)
  assert "resumed from checkpoint step 20" in resumed, resumed[-3000:]
  assert ("train step (10 steps per call): loaded from the persistent compilation cache in"
          in resumed), resumed[-3000:]
  assert "train step (10 steps per call): compiled" not in resumed, resumed[-3000:]
  assert entries <= set(os.listdir(cache))


def test_default_dir(monkeypatch):
  # The suite's own folder (conftest), never the user's cache.
  assert compile_cache.default_dir() == JAX_CACHE_DIR
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", "/cache_home")
  assert compile_cache.default_dir() == "/cache_home/sg_jax/jax_cache"
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", "/home_of_user")
  assert compile_cache.default_dir() == "/home_of_user/.cache/sg_jax/jax_cache"


def test_enable_off_and_unwritable(tmp_path, caplog):
  before = jax.config.jax_compilation_cache_dir
  try:
    assert compile_cache.enable("") is None
    assert jax.config.jax_compilation_cache_dir is None
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert compile_cache.enable(str(blocker / "cache")) is None
    assert "persistent compilation cache off: cannot create" in caplog.text
    assert compile_cache.enable(str(tmp_path / "c")) == str(tmp_path / "c")
    assert (tmp_path / "c").is_dir()
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def test_compile_watch_records_compilations_only():
  f = jax.jit(lambda x: jnp.sin(x) * 3.0)
  # Made outside the watch: its fill program is common, and the xdist workers share one
  # persistent cache, so it may be loaded from there (the watch would then say "loaded").
  x = jnp.ones(7)
  with compile_cache.CompileWatch() as watch:
    f(x).block_until_ready()
  mine = [c for c in watch.compilations if "<lambda>" in c.name]
  assert len(mine) == 1 and mine[0].seconds > 0
  with compile_cache.CompileWatch() as again:  # in jit's memory: nothing compiled
    f(x).block_until_ready()
  assert again.compilations == [] and again.describe("f") is None
  assert watch.describe("f").startswith("f: compiled")


def test_describe_cached_and_fresh():
  watch = compile_cache.CompileWatch()
  watch.compilations = [compile_cache.Compilation("jit(chunk)", 0.3, True, 30.0),
                        compile_cache.Compilation("jit(g)", 0.5, False, 0.5),
                        compile_cache.Compilation("jit(h)", 1.0, False, 1.0)]
  assert watch.describe("train step") == (
      "train step: loaded from the persistent compilation cache in 0.3 s (compiling it took "
      "30.0 s); compiled 2 programs in 1.5 s")


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
