"""Relative links in README.md and docs/**/*.md point at files that exist and, with ``#anchor``, at a heading of
that file (GitHub's anchors: the heading lower-cased, punctuation dropped, spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[(?:[^\]\n]|\][^(\n])*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]\n]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(line)
    return "\n".join(out)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())  # a linked heading: its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if not m:
            continue
        base = anchor(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """Every relative link (and image) of ``path`` whose file or anchor does not exist."""
    prose = _prose(path.read_text())
    out = []
    for target in LINK.findall(prose) + IMAGE.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {target} (no such file)")
        elif fragment and (dest.suffix != ".md" or fragment not in anchors(dest)):
            out.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {target} (no such heading)")
    return out


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_relative_link_in_the_readme_and_docs_resolves():
    pages = _pages()
    links = sum(len(LINK.findall(_prose(p.read_text()))) for p in pages)
    assert links > 20  # the README's tour links every command's page
    broken = [b for p in pages for b in broken_links(p)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_command_has_a_page_linked_from_the_readme():
    from ckptbench.cli import COMMANDS

    readme = (REPO / "README.md").read_text()
    assert len(COMMANDS) >= 8
    for name in COMMANDS:
        assert (REPO / "docs" / "commands" / f"{name}.md").is_file(), name
        assert f"(docs/commands/{name}.md)" in readme, name


def test_a_missing_file_or_heading_is_found(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other page\n\n## `ckptbench bench --mlperf MODEL` — MLPerf's\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md) [ok](other.md#ckptbench-bench---mlperf-model--mlperfs) [ok](#page)\n"
                    "[gone](missing.md) [gone](other.md#nothing) [gone](#nowhere)\n"
                    "```\n[in code](not-checked.md)\n```\n")
    assert sorted(broken_links(page)) == sorted([
        f"{page}: missing.md (no such file)", f"{page}: other.md#nothing (no such heading)",
        f"{page}: #nowhere (no such heading)"])
