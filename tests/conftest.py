"""Shared pytest configuration: the session's compilation cache, and what the training tests
start from.

A tiny run is the `tiny` preset of `sg_jax.configlib` (1 layer, d_model 32, 2 seeds, 40 steps,
evaluations and checkpoints every 20, 400 training lines) on `tiny_data`: question-formation
data with those 400 training lines (so it is never regenerated) and 100 lines in each other
split, generated once per session.
"""

import atexit
import importlib.util
import os
import shutil
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# JAX's persistent compilation cache of the session (set before JAX is imported): the tests'
# own compilations and every `sg_jax.main`/`sg_jax.analyze` they start share one folder, so a
# program is compiled once per session, and nothing is written into the user's cache
# (sg_jax.runtime.compile_cache.default_dir reads this variable first). The tests' programs are small
# (most compile in well under JAX's default 1 s minimum), so every program is written.
# With pytest-xdist the workers inherit the controller's environment, so they share its folder
# (a program one worker compiled, the other loads); the process that made it removes it at exit.
_OWNER = "SG_JAX_TEST_JAX_CACHE_OWNER"
if os.environ.get(_OWNER) and os.path.isdir(os.environ.get("JAX_COMPILATION_CACHE_DIR", "")):
  JAX_CACHE_DIR = os.environ["JAX_COMPILATION_CACHE_DIR"]
else:
  JAX_CACHE_DIR = tempfile.mkdtemp(prefix="sg_jax_test_jax_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = JAX_CACHE_DIR
  os.environ[_OWNER] = str(os.getpid())
  atexit.register(shutil.rmtree, JAX_CACHE_DIR, ignore_errors=True)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

# The tests' programs are tiny and each runs a few steps, so compiling them dominates the
# suite: XLA's CPU backend compiles them with LLVM's optimisation off (JAX's
# `jax_disable_most_optimizations`; HLO passes such as fusion still run), which cut the full set
# from 1036 s to 802 s and the default set from 257 s to about 205 s on two workers (2-core VM,
# 2026-12-07). The `sg_jax.main` / `sg_jax.analyze` processes the tests start inherit it. Tests
# of what the compiled code itself is (the golden training numbers, the accelerator programs'
# HLO, bit-identity across call sizes) are marked `optimized` and compile as a user's run does
# (`_compile_as_marked`). JAX_DISABLE_MOST_OPTIMIZATIONS=0 in the environment runs
# every test fully optimised.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

TINY_DATA = {"seed": 0, "num_train": 400,  # num_train as configlib.TINY
             "sizes": {"dev": 100, "test": 100, "gen": 100}}


def load_config_file(task, arg=None):
  """`get_config(arg)` of `configs/<task>.py`, loaded as `--config=configs/<task>.py:<arg>`
  loads it."""
  spec = importlib.util.spec_from_file_location(task, os.path.join(ROOT, "configs", f"{task}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.fixture
def load_config():
  """`load_config(task, arg=None)`: the config of `configs/<task>.py` with config string `arg`
  (see `load_config_file`)."""
  return load_config_file


# What a test-sized run leaves out unless the test asks for it (a field given to
# `make_tiny_config` wins): the padded layout instead of packing (one train-step branch to
# compile instead of one per row-capacity bucket) and no UAS evaluation (one evaluation program
# less), no minimal-pair preference. The tests of packing, UAS and preference set these fields
# themselves.
TEST_SIZED = {"train.packing": False, "eval.uas_lines": 0, "eval.preference_lines": 0}
# The same as `<field>=<value>` overrides (sg_jax.sweep's --override, a config string) and as
# `--config.<field>=<value>` flags of an `sg_jax.main` subprocess.
TEST_SIZED_OVERRIDES = [f"{k}={v}" for k, v in TEST_SIZED.items()]
TEST_SIZED_FLAGS = [f"--config.{o}" for o in TEST_SIZED_OVERRIDES]


def make_tiny_config(data_dir, task="question", **fields):
  """The `tiny` preset of `task` reading its data from `data_dir`, test-sized (`TEST_SIZED`).

  Args:
    data_dir: the data folder (`config.data.dir`).
    task: a registered task name.
    **fields: dotted config fields and their values, set last (e.g.
      `**{"train.num_steps": 10}`; `**{"train.packing": True}` packs).
  """
  from sg_jax import configlib  # pylint: disable=import-outside-toplevel  (collection stays light)

  config = configlib.apply_config_string(configlib.base_config(task), "tiny", configlib.PRESETS)
  config.data.dir = str(data_dir)
  for field, value in {**TEST_SIZED, **fields}.items():
    configlib.set_field(config, field, value)
  return config


@pytest.fixture(autouse=True)
def _compile_as_marked(request):
  """Tests marked `optimized` compile with XLA's full optimisation (as `sg_jax.main` does),
  whatever the suite's default (`JAX_DISABLE_MOST_OPTIMIZATIONS` above)."""
  if request.node.get_closest_marker("optimized") is None:
    yield
    return
  import jax  # pylint: disable=import-outside-toplevel  (collection stays light)
  before = jax.config.read("jax_disable_most_optimizations")
  # jit's in-memory caches do not key on the flag: drop the programs compiled so far, so that
  # the test compiles (or loads from the persistent cache, which does key on it) its own.
  jax.clear_caches()
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", before)
    jax.clear_caches()


# XLA:CPU (jaxlib 0.10.2) rarely segfaults while serialising a compiled program into the
# persistent compilation cache (`executable.serialize()` in jax's compilation_cache.py; seen
# about once per full run, since the suite caches every program). With pytest-xdist the dead
# worker is replaced, and the test it was running is run once more on a fresh worker: a second
# crash of the same test fails it as usual, so a test that really crashes still fails.
_CRASH_RERUNS = 1
_CRASHES = {}  # test id -> worker deaths while it ran (the xdist controller's count)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
  """pytest-xdist's hook for a test whose worker died: schedule it again once."""
  _CRASHES[crashitem] = _CRASHES.get(crashitem, 0) + 1
  if _CRASHES[crashitem] > _CRASH_RERUNS:
    return
  try:
    sched.mark_test_pending(crashitem)
  except NotImplementedError:  # a --dist mode that cannot reschedule: the crash fails the test
    return
  report.outcome = "rerun"


def pytest_report_teststatus(report):
  """A crashed test scheduled again is reported as 'rerun' (R), not as a failure."""
  if report.outcome == "rerun":
    return "rerun", "R", "RERUN"
  return None


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
  """The folder of the tiny question-formation data (`TINY_DATA`)."""
  from sg_jax import tasks  # pylint: disable=import-outside-toplevel

  path = str(tmp_path_factory.mktemp("tiny_question_data"))
  tasks.get_task("question").generate(path, **TINY_DATA)
  return path


@pytest.fixture
def tiny_config(request):
  """`make_config(data_dir=None, task="question", **fields)`: a tiny config (see
  `make_tiny_config`), on `tiny_data` (generated only then) unless another folder is given."""

  def make_config(data_dir=None, task="question", **fields):
    if data_dir is None:
      data_dir = request.getfixturevalue("tiny_data")
    return make_tiny_config(data_dir, task, **fields)

  return make_config


def snapshot_files(workdir):
  """{path relative to `workdir`: bytes} of every file under `workdir`."""
  files = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, workdir)] = f.read()
  return files


@pytest.fixture
def snapshot():
  """`snapshot(workdir)`: {relative path: bytes} of every file under a workdir, to check that
  a refused command changed nothing."""
  return snapshot_files


@pytest.fixture
def uas_quantity_registered():
  """The `uas` analysis quantity registered for one test (it registers when its module is
  imported, which happens once per process), unregistered after it."""
  import importlib  # pylint: disable=import-outside-toplevel
  from sg_jax.analysis import registry, uas_quantity  # pylint: disable=import-outside-toplevel
  if "uas" not in {q.name for q in registry.quantities()}:
    importlib.reload(uas_quantity)
  yield
  if "uas" in {q.name for q in registry.quantities()}:
    registry.unregister_quantity("uas")
