"""JAX's persistent compilation cache for sg_jax's commands, and what a call compiled.

`python -m sg_jax.main` and `python -m sg_jax.analyze` keep the XLA executables they compile in
a folder (`enable`, default `default_dir()`), so that a resumed run, the depths of a sweep and
a rerun analysis load the programs an earlier process compiled instead of compiling them again
(the reference-size training step takes minutes to compile on a CPU). JAX computes the cache
key from the program, the devices and the compiler options, so a changed config or a new JAX
version simply compiles (and caches) anew. JAX writes only programs that took at least
`jax_persistent_cache_min_compile_time_secs` (1 s by default; env
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS) to compile.

`CompileWatch` records the compilations a block of code made, through JAX's public event
listeners (`jax.monitoring`), so the log says whether a step was compiled or loaded from the
cache.

The cache is trusted code: JAX runs the executables it finds there. Keep it in a folder only
you can write (the default is under your own cache directory).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

import jax

log = logging.getLogger("sg_jax")

# JAX's own variable for the cache folder; when set it is also sg_jax's default.
ENV_DIR = "JAX_COMPILATION_CACHE_DIR"
# Event names of jax.monitoring (jax/_src/compiler.py, jax/_src/dispatch.py).
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def default_dir() -> str:
  """The cache folder used when none is given: $JAX_COMPILATION_CACHE_DIR when set, else
  $XDG_CACHE_HOME/sg_jax/jax_cache (XDG_CACHE_HOME defaults to ~/.cache)."""
  if os.environ.get(ENV_DIR):
    return os.environ[ENV_DIR]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "sg_jax", "jax_cache")


def enable(path: str | None) -> str | None:
  """Points JAX's persistent compilation cache at `path` (None: `default_dir()`; '': off).

  Must run before the process compiles anything: JAX opens the cache at its first
  compilation. A folder that cannot be created is logged as a warning and the cache stays off
  (a run is never stopped by its cache).

  Returns:
    the folder used, or None when the cache is off.
  """
  path = default_dir() if path is None else path
  if not path:
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  path = os.path.abspath(os.path.expanduser(path))
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    log.warning("persistent compilation cache off: cannot create %s (%s)", path,
                e.strerror or e)
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  return path


@dataclasses.dataclass
class Compilation:
  """One XLA program a `CompileWatch` saw: its name (e.g. 'jit(chunk)'), the seconds spent
  getting it (compiling, or reading it from the cache) and, for a cache hit, the seconds its
  compilation took when it was cached."""

  name: str
  seconds: float
  cached: bool
  compile_seconds: float


class CompileWatch:
  """Records the XLA compilations made in this thread inside a `with` block.

    with CompileWatch() as watch:
      state = chunk(state, ...)
    watch.compilations  # [Compilation, ...], [] when every program was already in memory

  Programs found in the persistent cache count as `cached`; jit's in-memory cache hits are
  not compilations and are not listed.
  """

  _lock = threading.Lock()
  _active: list[CompileWatch] = []
  _registered = False
  _local = threading.local()

  def __init__(self):
    self.compilations: list[Compilation] = []
    self._thread = threading.get_ident()

  def __enter__(self) -> CompileWatch:
    with CompileWatch._lock:
      if not CompileWatch._registered:
        jax.monitoring.register_event_listener(CompileWatch._on_event)
        jax.monitoring.register_event_duration_secs_listener(CompileWatch._on_duration)
        CompileWatch._registered = True
      CompileWatch._active.append(self)
    return self

  def __exit__(self, *exc) -> None:
    with CompileWatch._lock:
      CompileWatch._active.remove(self)

  @staticmethod
  def _on_event(event: str, **kwargs) -> None:
    del kwargs
    if event == _HIT_EVENT:
      CompileWatch._local.hit = True

  @staticmethod
  def _on_duration(event: str, duration: float, **kwargs) -> None:
    local = CompileWatch._local
    if event == _SAVED_EVENT:
      local.saved = duration
    elif event == _COMPILE_EVENT:
      hit, saved = getattr(local, "hit", False), getattr(local, "saved", 0.0)
      local.hit, local.saved = False, 0.0
      record = Compilation(str(kwargs.get("fun_name", "?")), float(duration), hit,
                           float(saved + duration) if hit else float(duration))
      me = threading.get_ident()
      with CompileWatch._lock:
        for watch in CompileWatch._active:
          if watch._thread == me:
            watch.compilations.append(record)

  def describe(self, what: str) -> str | None:
    """One log line on what the block compiled (None when it compiled nothing), e.g.
    'train step (100 steps per call): loaded from the persistent compilation cache in 0.4 s
    (compiling it took 31.2 s)' or 'train step (100 steps per call): compiled in 31.2 s'."""
    if not self.compilations:
      return None
    cached = [c for c in self.compilations if c.cached]
    fresh = [c for c in self.compilations if not c.cached]
    parts = []
    if cached:
      parts.append(f"loaded from the persistent compilation cache in "
                   f"{sum(c.seconds for c in cached):.1f} s (compiling "
                   f"{'it' if len(cached) == 1 else f'these {len(cached)} programs'} took "
                   f"{sum(c.compile_seconds for c in cached):.1f} s)")
    if fresh:
      parts.append(f"compiled {'' if len(fresh) == 1 else f'{len(fresh)} programs '}in "
                   f"{sum(c.seconds for c in fresh):.1f} s")
    return f"{what}: {'; '.join(parts)}"
