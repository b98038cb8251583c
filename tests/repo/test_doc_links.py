"""Every relative markdown link of README.md and docs/ (pages and figures) resolves: the file it
names exists, and an anchor into a markdown page names one of that page's headings (GitHub's
heading ids). Issue 51 item 5 moved measurements from docs/<topic>.md to docs/results/<study>.md;
a link copied with its text into the other folder, or into a section that moved, fails here."""

from __future__ import annotations

import glob
import os
import re

from conftest import ROOT  # pylint: disable=wrong-import-order  (tests/ is on the path)

# [text](target) and ![alt](target); the target ends at whitespace or ')' (no titles are used)
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[str]:
  """README.md and every markdown page below docs/."""
  return [os.path.join(ROOT, "README.md")] + sorted(
      glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))


def _without_code(text: str, spans: bool = True) -> str:
  """The text with fenced code blocks blanked, and inline code spans too with `spans` (the links
  inside them are examples)."""
  out, fenced = [], False
  for line in text.split("\n"):
    if line.lstrip().startswith("```"):
      fenced = not fenced
      out.append("")
      continue
    out.append("" if fenced else re.sub(r"`[^`]*`", "``", line) if spans else line)
  return "\n".join(out)


def slug(heading: str) -> str:
  """GitHub's id of a heading: lower case, markup and punctuation dropped (hyphens and
  underscores kept), spaces as hyphens."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
  text = re.sub(r"[`*]", "", text).strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
  """The heading ids of a markdown page (a repeated heading gets -1, -2, ... as on GitHub)."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  seen: dict[str, int] = {}
  out = set()
  for line in _without_code(text, spans=False).split("\n"):
    m = _HEADING.match(line)
    if not m:
      continue
    base = slug(m.group(2))
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f"{base}-{n}")
  return out


def broken_links(page: str) -> list[str]:
  """'page:line: target (why)' for each relative link of `page` that does not resolve."""
  with open(page, encoding="utf-8") as f:
    text = _without_code(f.read())
  out = []
  for m in _LINK.finditer(text):
    target = m.group(1)
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
      continue
    path, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    where = f"{os.path.relpath(page, ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {target}"
    if not os.path.exists(resolved):
      out.append(f"{where} (no such file)")
    elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
      out.append(f"{where} (no such heading)")
  return out


def test_slug_and_anchor_rules_follow_github():
  assert slug("Adding a quantity") == "adding-a-quantity"
  assert slug("`seq2seq`: an encoder-decoder") == "seq2seq-an-encoder-decoder"
  assert slug("Measured (2026-12-06): the dose response at 30k steps") == (
      "measured-2026-12-06-the-dose-response-at-30k-steps")
  assert slug("Defaults: the [released code](x.md), not the paper's text") == (
      "defaults-the-released-code-not-the-papers-text")


def test_broken_links_are_found(tmp_path):
  (tmp_path / "figures").mkdir()
  (tmp_path / "figures" / "a.png").write_bytes(b"")
  (tmp_path / "other.md").write_text("# Top\n\n## Twice\n\n## Twice\n\n### `code`: kept\n")
  page = tmp_path / "page.md"
  page.write_text("# Here\n[ok](other.md#twice-1) [code](other.md#code-kept) "
                  "![fig](figures/a.png) [self](#here)\n"
                  "[gone](missing.md) [bad anchor](other.md#nowhere) [web](https://x.org/a)\n"
                  "`[code](not/checked.md)`\n```\n[fenced](not/checked.md)\n```\n")
  got = broken_links(str(page))
  assert [g.split(": ", 1)[1] for g in got] == ["missing.md (no such file)",
                                                 "other.md#nowhere (no such heading)"]


def test_every_relative_link_of_readme_and_docs_resolves():
  broken = [b for page in pages() for b in broken_links(page)]
  assert not broken, "links that do not resolve:\n" + "\n".join(broken)
