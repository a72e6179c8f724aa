"""The documentation's links: every relative link between the README, the docs book, CONTRIBUTING
and the benchmarks' pages names a file that exists and, with `#anchor`, a heading (or an
`<a id>`) of that file, so that moving a section cannot leave a reader at a dead end. The book
itself is built by tests/run (`mdbook build docs`)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "tests" / "bench" / "README.md",
    REPO / "tests" / "bench" / "LOG.md",
    REPO / "deploy" / "engines" / "README.md",
]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and mdBook make it: lower case, punctuation dropped, spaces
    to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found = {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.*)$", text, re.M)}
    found.update(re.findall(r'<a id="([\w\-]+)"></a>', text))
    return found


def test_every_relative_link_reaches_its_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not file.exists():
                broken.append(f"{where}: no {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where}: no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_book_lists_every_page_of_docs() -> None:
    summary = (REPO / "docs" / "SUMMARY.md").read_text()
    listed = set(re.findall(r"\]\(([\w\-]+\.md)\)", summary))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"SUMMARY.md"}
    assert pages == listed, f"not in docs/SUMMARY.md: {sorted(pages - listed)}; listed but missing: {sorted(listed - pages)}"


def test_the_readme_stays_a_short_guide() -> None:
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines: the reference belongs in docs/"
