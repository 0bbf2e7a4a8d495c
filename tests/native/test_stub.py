"""ckptbench/_native.pyi is nanobind's stubgen output for the installed engine, not a hand-kept copy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_checked_in_stub_is_what_stubgen_makes_of_the_engine(tmp_path: Path):
    pytest.importorskip("nanobind.stubgen", reason="nanobind is in the test extra: pip install '.[test]'")
    out = tmp_path / "_native.pyi"
    subprocess.run(
        [sys.executable, "-P", "-m", "nanobind.stubgen", "-q", "-m", "ckptbench._native",
         "-p", str(REPO / "csrc" / "stubgen.pat"), "-o", str(out)],
        check=True, cwd=tmp_path,
    )
    checked_in = (REPO / "ckptbench" / "_native.pyi").read_text()
    assert out.read_text() == checked_in, (
        "ckptbench/_native.pyi is stale: after `pip install .`, regenerate it with "
        "`python -P -m nanobind.stubgen -m ckptbench._native -p csrc/stubgen.pat -o ckptbench/_native.pyi`"
    )
