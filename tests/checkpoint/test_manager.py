"""``CheckpointManager``: a series of steps under one root (listing, latest, retention, leftovers, bad input).

On S3: tests/storage/test_manager_s3.py. This file is also the worker of the torchrun test:
``python test_manager.py ROOT``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import manifest
from ckptbench.checkpoint.api import CheckpointExistsError
from ckptbench.checkpoint.lock import acquire_save_lock
from ckptbench.errors import StepNotFoundError, UsageError
from ckptbench.storage.store import LocalStore

HERE = Path(__file__).resolve()


def state(step: int) -> dict:
    return {"model": {"w": torch.full((64, 64), float(step)), "b": torch.arange(8) + step}, "step": step}


def test_steps_latest_and_loads(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path / "run") as manager:
        assert manager.steps() == [] and manager.latest() is None
        for step in (10, 30, 20):
            manager.save(step, state(step))
        assert manager.steps() == [10, 20, 30]
        assert manager.latest() == 30
        latest = manager.load()
        assert latest["step"] == 30 and torch.equal(latest["model"]["w"], state(30)["model"]["w"])
        assert manager.load(10)["step"] == 10
        into = state(0)
        assert manager.load(20, into=into) is into and into["step"] == 20
        assert torch.equal(into["model"]["b"], state(20)["model"]["b"])
    # every step is an ordinary checkpoint
    assert ckptbench.load(tmp_path / "run" / "step-00000020")["step"] == 20
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step-00000010", "step-00000020",
                                                                     "step-00000030"]


def test_keep_last_removes_the_oldest_after_each_commit(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path, keep_last=2) as manager:
        for step in range(5):
            manager.save(step, state(step))
            assert manager.steps() == list(range(max(0, step - 1), step + 1))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]
        # a step below the newest ones is kept when it was just saved, then goes with the next save
        manager.save(1, state(1))
        assert manager.steps() == [1, 3, 4]
        manager.save(5, state(5))
        assert manager.steps() == [4, 5]


def test_a_failed_save_removes_nothing(tmp_path: Path, monkeypatch):
    with ckptbench.CheckpointManager(tmp_path, keep_last=1) as manager:
        manager.save(1, state(1))

        def fail(*args, **kwargs):
            raise OSError(5, "injected commit failure")

        monkeypatch.setattr(manifest, "commit", fail)
        with pytest.raises(OSError, match="injected"):
            manager.save(2, state(2))
        monkeypatch.undo()
        assert manager.steps() == [1]
        assert manager.load()["step"] == 1
        manager.save(3, state(3))  # the next save sweeps what the failed one left
        assert manager.steps() == [3]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003"]


def test_async_save_is_listed_once_committed_and_retention_follows(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path, keep_last=1) as manager:
        manager.save(1, state(1))
        sd = state(2)
        handle = manager.save(2, sd, async_=True)
        sd["model"]["w"].fill_(-1)  # staged: the caller may change its tensors
        result = handle.result()
        assert result.path.endswith("step-00000002")
        assert manager.steps() == [2]
        assert torch.equal(manager.load()["model"]["w"], state(2)["model"]["w"])
        # a save waits for the one in flight, and close() for the last one
        manager.save(3, state(3), async_=True)
        manager.save(4, state(4), async_=True)
    assert ckptbench.CheckpointManager(tmp_path).steps() == [4]


def test_interrupted_saves_are_not_listed_and_the_next_save_cleans_them(tmp_path: Path):
    # what a save killed before its commit leaves: shards, a temp manifest, no manifest
    leftover = tmp_path / "step-00000007"
    leftover.mkdir()
    (leftover / "shard-0123abcd-00000.bin").write_bytes(b"x" * 100)
    (leftover / ".manifest.json.tmp-0123abcd").write_bytes(b"{")
    # a step directory holding something else, and names that are no step
    foreign = tmp_path / "step-00000008"
    foreign.mkdir()
    (foreign / "shard-0123abcd-00000.bin").write_bytes(b"x")
    (foreign / "notes.txt").write_text("mine")
    (tmp_path / "step-9").mkdir()
    (tmp_path / "other").mkdir()
    manager = ckptbench.CheckpointManager(tmp_path)
    assert manager.steps() == []
    manager.save(3, state(3))
    assert manager.steps() == [3]
    assert not leftover.exists()
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]  # only what a save creates goes
    assert (tmp_path / "step-9").exists() and (tmp_path / "other").exists()
    manager.close()


def test_a_step_being_saved_elsewhere_is_not_cleaned(tmp_path: Path):
    busy = tmp_path / "step-00000009"
    busy.mkdir()
    (busy / "shard-0123abcd-00000.bin").write_bytes(b"x")
    lock = acquire_save_lock(LocalStore(busy))  # another save writing step 9
    try:
        with ckptbench.CheckpointManager(tmp_path) as manager:
            manager.save(1, state(1))
        assert (busy / "shard-0123abcd-00000.bin").exists()
    finally:
        lock.release()


def test_one_arena_serves_every_step(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path, keep_last=2) as manager:
        manager.save(1, state(1))
        arena = manager._checkpointer._arena.buffer
        for step in (2, 3):
            manager.save(step, state(step))
        assert manager._checkpointer._arena.buffer is arena
    assert manager._checkpointer._arena.buffer is None  # close() freed it


def test_overwrite_of_a_committed_step(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path) as manager:
        manager.save(5, state(5))
        with pytest.raises(CheckpointExistsError, match="step-00000005 already holds a checkpoint"):
            manager.save(5, state(6))
        manager.save(5, state(6), overwrite=True)
        assert manager.load(5)["step"] == 6


def test_delete(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path) as manager:
        manager.save(1, state(1))
        manager.save(2, state(2))
        manager.delete(1)
        assert manager.steps() == [2]
        assert not (tmp_path / "step-00000001").exists()
        with pytest.raises(StepNotFoundError, match=r"step 1 is not a committed checkpoint.*committed steps: 2$"):
            manager.delete(1)


def test_a_step_swapped_for_a_symlink_after_the_listing_removes_nothing_it_points_to(tmp_path: Path, monkeypatch):
    """Retention lists the steps, then removes the old ones: a step directory renamed away meanwhile and a
    symlink put in its place (by whoever else can write to the root) must not turn the removal onto the
    checkpoint the link points to."""
    from ckptbench.checkpoint import manager as manager_module

    important = tmp_path / "important"
    ckptbench.save(state(7), important)
    before = sorted(p.name for p in important.iterdir())
    root = tmp_path / "run"
    real_listing = manager_module._Tier.listing

    def listing_then_swap(tier):
        found = real_listing(tier)
        step = root / "step-00000001"
        if step.is_dir() and not step.is_symlink():
            step.rename(root / "moved-away")
            step.symlink_to(important)
        return found

    with ckptbench.CheckpointManager(root, keep_last=1) as manager:
        manager.save(1, state(1))
        monkeypatch.setattr(manager_module._Tier, "listing", listing_then_swap)
        manager.save(2, state(2))
    assert sorted(p.name for p in important.iterdir()) == before
    assert torch.equal(ckptbench.load(important)["model"]["w"], state(7)["model"]["w"])


@pytest.mark.parametrize("step, message", [
    (-1, "non-negative integer, got -1"),
    (1.5, r"non-negative integer, got 1.5 \(float\)"),
    ("3", r"non-negative integer, got '3' \(str\)"),
    (True, "non-negative integer, got True"),
])
def test_bad_steps_are_refused_naming_the_value(tmp_path: Path, step, message):
    with ckptbench.CheckpointManager(tmp_path) as manager:
        with pytest.raises(UsageError, match=message):
            manager.save(step, state(1))
        with pytest.raises(UsageError, match=message):
            manager.load(step)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("keep_last", [0, -2, 1.0, True])
def test_bad_keep_last_is_refused_naming_the_value(tmp_path: Path, keep_last):
    with pytest.raises(UsageError, match=f"keep_last must be a positive integer or None.*got {keep_last!r}"):
        ckptbench.CheckpointManager(tmp_path, keep_last=keep_last)


def test_loading_a_missing_step_lists_the_ones_there(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path) as manager:
        with pytest.raises(StepNotFoundError, match="no committed step under"):
            manager.load()
        with pytest.raises(StepNotFoundError, match="step 4 is not a committed checkpoint.*none is committed"):
            manager.load(4)
        for step in range(12):
            manager.save(step, state(step))
        with pytest.raises(StepNotFoundError, match=r"step 40 is not .*committed steps: \.\.\., 2, 3, .*, 11$"):
            manager.load(40)


def test_a_closed_manager_says_so(tmp_path: Path):
    manager = ckptbench.CheckpointManager(tmp_path)
    manager.close()
    manager.close()
    with pytest.raises(UsageError, match="is closed"):
        manager.save(1, state(1))


def test_a_file_as_root_is_refused(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    manager = ckptbench.CheckpointManager(tmp_path / "f")
    with pytest.raises(UsageError, match="is a file"):
        manager.steps()


# -- under torchrun ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_manager_under_torchrun(tmp_path: Path):
    """Two ranks save their own parts of three steps (one async), keep two, and resume the latest."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                          "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(HERE), str(tmp_path / "run")]
    done = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    # each rank writes its own file: two ranks printing to torchrun's one stdout can interleave their lines
    lines = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank-*.json"))]
    assert sorted(r["rank"] for r in lines) == [0, 1]
    for r in lines:
        assert r["steps"] == [2, 3] and r["latest"] == 3
        assert r["loaded_step"] == 3 and r["own_part"]
    manifest = json.loads((tmp_path / "run" / "step-00000003" / "manifest.json").read_text())
    assert manifest["world_size"] == 2


def _worker(root: str) -> None:
    rank = int(os.environ["RANK"])
    with ckptbench.CheckpointManager(root, keep_last=2) as manager:
        for step in (1, 2):
            manager.save(step, {"w": torch.full((1000,), float(rank * 100 + step)), "step": step})
        manager.save(3, {"w": torch.full((1000,), float(rank * 100 + 3)), "step": 3}, async_=True).result()
        loaded = manager.load()
        result = {"rank": rank, "steps": manager.steps(), "latest": manager.latest(), "loaded_step": loaded["step"],
                  "own_part": bool(torch.equal(loaded["w"], torch.full((1000,), float(rank * 100 + 3))))}
        (Path(root).parent / f"rank-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    _worker(sys.argv[1])
