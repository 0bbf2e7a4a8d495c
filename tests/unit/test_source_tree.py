"""Importing ckptbench from a source tree whose engine is not built says so, and how to fix it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import ckptbench


def test_an_unbuilt_source_tree_says_what_to_run(tmp_path: Path):
    installed = Path(ckptbench.__file__).parent
    shutil.copytree(installed, tmp_path / "ckptbench", ignore=shutil.ignore_patterns("_native*.so", "__pycache__"))
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'ckptbench'\n")
    (tmp_path / "csrc").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "-c", "import ckptbench.native"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: ckptbench's native engine is not built in this source tree ({tmp_path.resolve()}); "
                    "run `pip install -e .` there (needs a C++17 compiler), or run from outside the source tree to "
                    "use an installed ckptbench")
