"""The documentation as the tests read it: its pages, their fenced blocks and their anchors.

The site is built from `docs/` by MkDocs (`mkdocs.yml`); the README is its front door. The blocks
of a language in `CHECKED` are the ones `tests/unit/test_docs.py` runs, unless the line before
the fence says why it cannot: `<!-- not-run: <reason> -->`.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.paths import ROOT

README: Final = ROOT / "README.md"
DOCS: Final = ROOT / "docs"
# Shell and Python: what a reader copies and runs.
CHECKED: Final = frozenset({"sh", "shell", "bash", "console", "python"})
NOT_RUN: Final = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->")
# Before a block that shows what the Python block above it prints.
OUTPUT: Final = "<!-- output -->"

_FENCE: Final = re.compile(r"^(\s*)(`{3,})\s*([\w-]*)")
_HEADING: Final = re.compile(r"(#{1,6})\s+(.+?)\s*#*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: where it is, its language, its text (indentation removed) and the
    non-blank line before its fence."""

    path: Path
    line: int
    language: str
    text: str
    before: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """The reason given for not running it, or None when it is not marked."""
        match = NOT_RUN.fullmatch(self.before.strip())
        return match[1] if match else None


def pages() -> list[Path]:
    """The README, then every page of the site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence, language = opening.groups()
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [line.removeprefix(indent) for line in lines[index + 1 : end]]
        found.append(Block(path, index + 1, language, "\n".join(body) + "\n", before))
        index = end + 1
    return found


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's `toc` slugify): code marks and
    punctuation dropped, lower case, runs of spaces and hyphens to one hyphen."""
    text = unicodedata.normalize("NFKD", heading.replace("`", ""))
    text = re.sub(r"[^\w\s-]", "", text.encode("ascii", "ignore").decode()).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings, outside fenced blocks."""
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (heading := _HEADING.match(line)):
            found.add(slug(heading[2]))
    return found
