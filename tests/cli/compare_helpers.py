"""What every refused ``ckptbench compare`` must do, shared by the single- and two-level tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def assert_refused_before_measuring(cli: Any, two_dirs: tuple[Path, Path], args: list[str], needle: str) -> None:
    """``compare`` with ``args`` (``{a}``/``{b}``: the two directories) fails with one line naming ``needle``,
    exit 2, and nothing in either directory changed: it was refused before any tier was measured."""
    a, b = two_dirs
    result = cli("compare", *[arg.format(a=a, b=b) for arg in args])
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error:"), result.stderr
    assert needle in lines[0]
    assert sorted(p.name for p in a.iterdir()) == ["keep.bin"] and list(b.iterdir()) == []
