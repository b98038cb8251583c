"""Every module of sg_jax stays at most `MAX_LINES` lines (issue 51 item 5: a module a newcomer
reads in one sitting; split by concern rather than grow)."""

import pathlib

MAX_LINES = 450
ROOT = pathlib.Path(__file__).resolve().parents[2] / "sg_jax"


def test_every_module_is_at_most_max_lines():
  modules = sorted(ROOT.rglob("*.py"))
  assert len(modules) > 50  # the package is there
  too_long = {str(p.relative_to(ROOT.parent)): n for p in modules
              if (n := len(p.read_text().splitlines())) > MAX_LINES}
  assert not too_long, f"modules over {MAX_LINES} lines (split them by concern): {too_long}"
