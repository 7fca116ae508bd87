"""The README and the pages under docs/: the README stays a short front page (issue 30: under
15 KB, the manual in docs/), and every relative link in them reaches a file and, with a
``#anchor``, a heading of that file, so moving a section cannot leave a link pointing nowhere."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_BYTES = 15_000
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _headings(text: str) -> list[str]:
    """The Markdown headings outside fenced code (a ``# comment`` in a bash block is not one)."""
    heads, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            heads.append(line.lstrip("#").strip())
    return heads


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_anchor_of_follows_github():
    assert anchor_of("Several nodes: job scripts") == "several-nodes-job-scripts"
    assert anchor_of("The CPU's allocator") == "the-cpus-allocator"
    assert anchor_of("Precision: `auto`, and what an explicit one means") == "precision-auto-and-what-an-explicit-one-means"


def test_readme_is_a_front_page():
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_MAX_BYTES, f"README.md is {size} bytes; move detail into a docs/ page"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not this repository's
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in map(anchor_of, _headings(file.read_text())):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
