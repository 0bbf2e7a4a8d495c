"""Saves of many files under the open-file limit (RLIMIT_NOFILE).

The saver opens each shard (``safeio``) and the engine writes it through reopenings of that descriptor
(``/proc/self/fd``): one for the O_DIRECT head, one for a buffered tail, while the first stays open. The
soft limit is raised (up to the hard one) for all of them; where the hard limit is too low, the error
names the shard that could not be opened, not a descriptor number.

Each case runs in a child process, whose limits it lowers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FILES = 100

CHILD = r"""
import json, os, resource, sys
import torch
from ckptbench.checkpoint import Checkpointer

where, files, margin, keep_hard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
# 6000 bytes each, one per shard: an O_DIRECT head and a buffered tail in every file
state = {f"t{i:03d}": torch.full((1500,), float(i)) for i in range(files)}
with Checkpointer(shard_size=6000, direct=True, threads=2, block_size=1 << 20) as ckpt:
    ckpt.save({"w": torch.ones(1500)}, where + "-first", async_=True).result()  # the threads and imports there
    soft = len(os.listdir("/proc/self/fd")) + files + margin
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard if keep_hard else soft))
    try:
        ckpt.save(state, where, async_=True).result()
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        sys.exit(0)
print(json.dumps({"files": sorted(os.listdir(where))}))
"""


def _save_under_limit(where: Path, margin: int, keep_hard: bool) -> dict:
    env = {**os.environ, "CKPTBENCH_LOG_PROGRESS": "0"}  # the ckptbench children import: tests/conftest.py
    done = subprocess.run([sys.executable, "-c", CHILD, str(where), str(FILES), str(margin), "1" if keep_hard else "0"],
                          capture_output=True, text=True, env=env, timeout=300, check=False, cwd=where.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_a_save_of_more_files_than_the_soft_limit_leaves_room_for_the_engine_s_reopenings(tmp_path: Path):
    """The soft limit leaves room for the shards opened but not for the engine's reopenings of them: it is
    raised (the hard limit allows it) and the save commits every shard."""
    outcome = _save_under_limit(tmp_path / "ckpt", margin=40, keep_hard=True)
    assert "error" not in outcome, outcome
    assert len([name for name in outcome["files"] if name.startswith("shard-")]) == FILES
    assert "manifest.json" in outcome["files"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_a_save_past_the_hard_limit_names_the_shard_it_could_not_open(tmp_path: Path):
    """The hard limit leaves room for the shards but not for the engine's reopenings: the save fails
    naming a shard of the checkpoint (not ``ckpt/57``, the number of a descriptor) and leaves none."""
    where = tmp_path / "ckpt"
    outcome = _save_under_limit(where, margin=40, keep_hard=False)
    assert outcome.get("error") == "StorageIOError", outcome
    assert "Too many open files" in outcome["message"]
    assert f"{where}/shard-" in outcome["message"], outcome["message"]
    assert "/proc/" not in outcome["message"]
    assert not where.exists() or not [p.name for p in where.iterdir() if p.name.startswith("shard-")]
