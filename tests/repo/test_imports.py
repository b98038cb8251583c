"""Imports run downhill (issue 51 item 2): no circle among sg_jax's modules, no import of sg_jax
inside a function to dodge one, and every module imports on its own in a fresh interpreter.

The graph is read from the source (module-level imports only): `import a.b` and `from a import b`
(b a module) point at a.b, `from a import x` (x a name) at a; importing a.b also runs a's
__init__ (an edge to a), except from a module inside a. So a package's own __init__ importing its
submodules is no circle, while a submodule importing the package's names is.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from conftest import ROOT  # pylint: disable=wrong-import-order  (tests/ is on the path)

# Function-level imports of sg_jax that are there for a reason other than a circle, with it.
FUNCTION_LEVEL_ALLOWED = {
    # An evaluator is declared without JAX (config files import the registry and read each
    # evaluator's options before JAX starts; tests/training/test_configs.py checks that a config
    # loads no JAX); the code of its evaluation, which needs JAX, loads when it is built.
    ("sg_jax.evaluation.preference", "build"): "declared without JAX, built with it",
    ("sg_jax.evaluation.task_metric", "build"): "declared without JAX, built with it",
    ("sg_jax.evaluation.uas", "build"): "declared without JAX, built with it",
    # The sweep driver runs no model itself (its jobs are subprocesses): orbax, which reading a
    # job's checkpoints needs, loads only when a workdir is checked.
    ("sg_jax.sweeps.driver", "latest_step"): "orbax only when a job's checkpoints are read",
}


def _modules() -> dict[str, str]:
  """{dotted name: path} of every module under sg_jax/."""
  found = {}
  for folder, dirs, names in os.walk(os.path.join(ROOT, "sg_jax")):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        found[mod[: -len(".__init__")] if mod.endswith(".__init__") else mod] = path
  return found


def _module_level(tree: ast.Module):
  """Import statements executed when the module is imported (not inside a def or class)."""
  stack = list(tree.body)
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node
    elif isinstance(node, (ast.If, ast.Try, ast.With)):
      for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, field, []):
          stack.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])


def _graph(modules: dict[str, str]) -> dict[str, set[str]]:
  edges = {}
  for mod, path in modules.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    out = set()
    for node in _module_level(tree):
      if isinstance(node, ast.Import):
        out.update(a.name for a in node.names if a.name in modules)
      elif node.module and node.level == 0 and node.module in modules:
        for a in node.names:
          sub = f"{node.module}.{a.name}"
          out.add(sub if sub in modules else node.module)
    # importing a.b.c first runs the __init__ of a and a.b, unless this module is inside them
    inside = {mod.rsplit(".", i)[0] for i in range(1, mod.count(".") + 1)}
    for target in list(out):
      parts = target.split(".")
      out.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                 if p in modules and p not in inside)
    edges[mod] = out - {mod}
  return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
  for v in sorted(edges):
    if v not in index:
      visit(v)
  return found


def test_cycle_finder_on_a_hand_built_graph():
  edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
  assert _cycles(edges) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def test_graph_reads_module_and_name_imports(tmp_path):
  pkg = tmp_path / "p"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("from p import a\n")
  (pkg / "a.py").write_text("import p.b\nfrom p.b import thing\n\ndef f():\n  from p import c\n")
  (pkg / "b.py").write_text("thing = 1\n")
  (pkg / "c.py").write_text("")
  (tmp_path / "q.py").write_text("from p.b import thing\n")
  modules = {"p": str(pkg / "__init__.py"), "p.a": str(pkg / "a.py"), "p.b": str(pkg / "b.py"),
             "p.c": str(pkg / "c.py"), "q": str(tmp_path / "q.py")}
  assert _graph(modules) == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": set(), "p.c": set(),
                             "q": {"p.b", "p"}}


def test_no_import_cycle():
  cycles = _cycles(_graph(_modules()))
  assert not cycles, "import cycles among sg_jax modules: " + "; ".join(
      " <-> ".join(c) for c in cycles)


def test_no_function_level_import_of_sg_jax():
  found = {}
  for mod, path in _modules().items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for fn in ast.walk(tree):
      if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in ast.walk(fn):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n == "sg_jax" or n.startswith("sg_jax.") for n in names):
          found[(mod, fn.name)] = f"{os.path.relpath(path, ROOT)}:{node.lineno}"
  unexplained = {k: v for k, v in found.items() if k not in FUNCTION_LEVEL_ALLOWED}
  assert not unexplained, f"imports of sg_jax inside functions: {unexplained}"
  stale = set(FUNCTION_LEVEL_ALLOWED) - set(found)
  assert not stale, f"FUNCTION_LEVEL_ALLOWED names imports that are gone: {stale}"


# Each module imported first, with no other sg_jax module loaded (JAX and the other third-party
# packages stay loaded between modules, so the whole check takes seconds). A command defines absl
# flags when imported, and commands share flag names, so each command gets a process of its own.
_FRESH_IMPORTS = r"""
import importlib, sys, traceback
failed = []
for name in sys.argv[1].split(","):
  for loaded in [m for m in sys.modules if m == "sg_jax" or m.startswith("sg_jax.")]:
    del sys.modules[loaded]
  try:
    importlib.import_module(name)
  except Exception:  # pylint: disable=broad-except
    failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.slow
def test_every_module_imports_first():
  modules = _modules()
  commands = sorted(m for m, p in modules.items()
                    if "flags.DEFINE_" in open(p, encoding="utf-8").read().split("\ndef ")[0])
  others = sorted(set(modules) - set(commands))
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  failed = []
  for group in [others] + [[c] for c in commands]:
    out = subprocess.run([sys.executable, "-c", _FRESH_IMPORTS, ",".join(group)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode:
      failed.append(out.stdout.strip() or out.stderr[-2000:])
  assert not failed, "modules that fail to import first:\n" + "\n".join(failed)
