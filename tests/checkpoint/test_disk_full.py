"""Disk full (a guarantee in docs/guarantees.md): a save that runs out of space on a real (tiny tmpfs) filesystem
says how much it needed and how much is free, commits nothing, leaves none of its files behind, and
the checkpoint committed before it still loads bit-exact.

The free-space check before a save would refuse these saves up front, so the disk fills after it:
another process writes a file while the save stages (``fill_while_staging``), or the store cannot
tell its free space (object stores, some FUSE mounts).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench import native
from ckptbench.checkpoint import Checkpointer, saver
from ckptbench.errors import InsufficientSpaceError, StorageIOError
from ckptbench.storage.store import LocalStore
from ckptbench.units import format_size

MiB = 2**20


def weights(mib: float, seed: int) -> dict:
    """``mib`` MiB of float32 in 8 tensors (page-sized each, so the shards hold exactly these bytes)."""
    g = torch.Generator().manual_seed(seed)
    return {"layers": [torch.randn(int(mib * MiB) // 32, generator=g) for _ in range(8)], "step": seed}


def same(a: dict, b: dict) -> bool:
    return a["step"] == b["step"] and all(torch.equal(x, y) for x, y in zip(a["layers"], b["layers"], strict=True))


@pytest.fixture
def disk(mount_fs) -> Path:
    """A 6 MiB tmpfs holding a committed 1 MiB checkpoint at ``c``."""
    where = mount_fs("tmpfs", "size=6m")
    ckptbench.save(weights(1, seed=1), where / "c")
    return where


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def free_bytes(where: Path) -> int:
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize


@pytest.fixture
def fill_while_staging(monkeypatch):
    """``fill_while_staging(where, leave)``: once the next save has staged (its free-space check
    passed), fill ``where`` up to ``leave`` bytes free, as another process writing there would. Once."""

    def arm(where: Path, leave: int) -> None:
        real = saver.stage

        def staging_then_filling(*args, **kwargs):
            real(*args, **kwargs)
            monkeypatch.setattr(saver, "stage", real)
            with open(where / "filler", "wb") as f:
                f.write(b"\1" * (free_bytes(where) - leave))

        monkeypatch.setattr(saver, "stage", staging_then_filling)

    return arm


def test_a_save_bigger_than_the_free_space_is_refused_before_it_writes(disk, monkeypatch):
    before = listing(disk / "c")
    writes = []
    monkeypatch.setattr(native, "write", lambda jobs, **kwargs: writes.append(jobs))
    with pytest.raises(InsufficientSpaceError, match=rf"{disk / 'c'} has [\d.]+ MiB free but the checkpoint needs "
                                                     rf"{format_size(8 * MiB)}"):
        ckptbench.save(weights(8, seed=2), disk / "c", overwrite=True)
    assert writes == [] and listing(disk / "c") == before


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_a_save_filling_the_disk_says_what_it_needed_and_leaves_the_old_checkpoint(disk, fill_while_staging,
                                                                                   async_: bool):
    before = listing(disk / "c")
    fill_while_staging(disk, leave=MiB)  # room for some of the new shards, not all
    ckpt = Checkpointer(shard_size=MiB // 2, threads=2)  # 6 shards: some complete, some partial when it fails
    with pytest.raises(InsufficientSpaceError) as failure:
        handle = ckpt.save(weights(3, seed=2), disk / "c", overwrite=True, async_=async_)
        if async_:
            handle.result()
    message = str(failure.value)
    assert f"{disk / 'c'} ran out of space while writing the checkpoint" in message
    assert f"it needs {format_size(3 * MiB)}, " in message  # what the shards needed
    assert f"{format_size(MiB)} is free now" in message  # what the failed save's files left free (it removed them)
    assert "nothing was committed" in message
    assert listing(disk / "c") == before  # no new manifest, shards, temp or lock files; the old ones untouched
    assert same(ckptbench.load(disk / "c"), weights(1, seed=1))
    ckpt.close()


def test_with_the_free_space_unknown_the_save_fails_the_same_way(disk, monkeypatch):
    # Stores that cannot tell their free space skip the check before the save; the disk fills mid-write.
    monkeypatch.setattr(LocalStore, "free_bytes", lambda self: None)
    before = listing(disk / "c")
    with pytest.raises(InsufficientSpaceError, match=rf"ran out of space while writing the checkpoint: it needs "
                                                     rf"{format_size(8 * MiB)}, the free space is unknown"):
        Checkpointer(shard_size=MiB).save(weights(8, seed=2), disk / "c", overwrite=True)
    assert listing(disk / "c") == before
    assert same(ckptbench.load(disk / "c"), weights(1, seed=1))


def test_a_first_save_that_fills_the_disk_leaves_not_even_the_directories_it_made(disk, fill_while_staging):
    fill_while_staging(disk, leave=MiB // 2)
    with pytest.raises(InsufficientSpaceError, match="nothing was committed"):
        ckptbench.save(weights(2, seed=3), disk / "new" / "a" / "b")
    assert not (disk / "new").exists()


def test_the_space_is_free_again_and_the_next_save_commits(disk, fill_while_staging):
    fill_while_staging(disk, leave=MiB)
    with pytest.raises(InsufficientSpaceError):
        ckptbench.save(weights(3, seed=2), disk / "c", overwrite=True)
    (disk / "filler").unlink()
    ckptbench.save(weights(3, seed=2), disk / "c", overwrite=True)  # the failed save left nothing in its way
    assert same(ckptbench.load(disk / "c"), weights(3, seed=2))
    assert len(list((disk / "c").glob("shard-*"))) == 1  # the old checkpoint's shard was swept


def test_a_quota_is_named_as_such(tmp_path: Path, monkeypatch):
    ckptbench.save(weights(0.1, seed=1), tmp_path / "c")
    before = listing(tmp_path / "c")
    real = native.write

    def over_quota(jobs, **kwargs):
        real(jobs[:1], **{**kwargs, "fds": kwargs.get("fds", ())[:1]})  # one file written, then the quota bites
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), jobs[1][1])

    monkeypatch.setattr(native, "write", over_quota)
    with pytest.raises(InsufficientSpaceError, match=rf"{tmp_path / 'c'} exceeded its disk quota while writing the "
                                                     rf"checkpoint: it needs .* is free now"):
        Checkpointer(shard_size=2**16).save(weights(0.5, seed=2), tmp_path / "c", overwrite=True)
    assert listing(tmp_path / "c") == before


def test_other_write_errors_stay_io_errors(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(native, "write", lambda jobs, **kw: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(StorageIOError, match="writing the checkpoint to .* failed: .*I/O error"):
        ckptbench.save(weights(0.1, seed=1), tmp_path / "c")


def test_shards_that_fit_but_a_manifest_that_does_not_commit_nothing(disk, fill_while_staging):
    before = listing(disk / "c")
    fill_while_staging(disk, leave=3 * MiB)  # exactly the new shards (page-sized tensors): no page for the manifest
    with pytest.raises(InsufficientSpaceError, match=rf"{disk / 'c'} ran out of space while committing the "
                                                     r"checkpoint: the manifest needs [\d.]+ KiB, 0 B is free; "
                                                     r"nothing was committed"):
        Checkpointer(shard_size=MiB // 2).save(weights(3, seed=2), disk / "c", overwrite=True)
    assert listing(disk / "c") == before  # the shards that did fit were removed, no manifest temp file left
    assert same(ckptbench.load(disk / "c"), weights(1, seed=1))
