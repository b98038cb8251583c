"""The package layout as the README and the docs describe it (issue 51 items 2 and 6): every
top-level module and package of sg_jax has a row in README's Layout table, each test file sits
in a folder of tests/, and every `sg_jax/...py` or `tests/...py` path the README and docs name
exists."""

from __future__ import annotations

import glob
import os
import re

from conftest import ROOT  # pylint: disable=wrong-import-order  (tests/ is on the path)

_PATH = re.compile(r"(?<![\w/.])((?:sg_jax|tests)/[\w/]+\.py)")


def _layout_section() -> str:
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  start = readme.index("## Layout")
  return readme[start:readme.index("\n## ", start + 1)]


def test_every_top_level_module_and_package_has_a_row():
  section = _layout_section()
  top = sorted(name[:-3] if name.endswith(".py") else name
               for name in os.listdir(os.path.join(ROOT, "sg_jax"))
               if name != "__init__.py" and (name.endswith(".py") or os.path.isfile(
                   os.path.join(ROOT, "sg_jax", name, "__init__.py"))))
  missing = [n for n in top if not re.search(rf"`(sg_jax/)?{n}(\.py|/)`", section)]
  assert not missing, f"README's Layout table has no row naming {missing}"


def test_test_files_sit_in_package_folders():
  loose = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tests", "test_*.py")))
  assert not loose, f"test files outside a package folder of tests/: {loose}"


def test_paths_named_in_readme_and_docs_exist():
  pages = [os.path.join(ROOT, "README.md")] + sorted(
      glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
  missing = []
  for page in pages:
    with open(page, encoding="utf-8") as f:
      for path in sorted(set(_PATH.findall(f.read()))):
        if not os.path.exists(os.path.join(ROOT, path)):
          missing.append(f"{os.path.relpath(page, ROOT)}: {path}")
  assert not missing, "paths that do not exist: " + "; ".join(missing)
