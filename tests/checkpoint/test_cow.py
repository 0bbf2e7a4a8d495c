"""Copy-on-write staging of async saves: the checkpoint holds the tensors as they were when save()
returned, the caller may write to them at once, and a tensor freed under it fails the save cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench import knobs, native
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint.stage import CowStagingError, cow_unavailable

needs_cow = pytest.mark.skipif(bool(native.cow_unavailable()),
                               reason=f"no copy-on-write copies here: {native.cow_unavailable()}")
MiB = 2**20


def _state() -> dict:
    g = torch.Generator().manual_seed(5)
    return {"model": {f"w{i}": torch.randn(256, 1024, generator=g) for i in range(12)},
            "half": torch.randn(3000, generator=g).bfloat16(),
            "small": [torch.full((1 + i,), float(i)) for i in range(300)],
            "view": torch.randn(64, 64, generator=g).t(),  # not contiguous: copied by value before save() returns
            "step": 7}


def _snapshot_of(sd: dict) -> dict:
    return {k: (v.clone() if torch.is_tensor(v) else _snapshot_of(v) if isinstance(v, dict)
                else [t.clone() for t in v] if isinstance(v, list) else v) for k, v in sd.items()}


def _assert_equal(got, expected) -> None:
    if torch.is_tensor(expected):
        assert torch.equal(got, expected)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for k in expected:
            _assert_equal(got[k], expected[k])
    elif isinstance(expected, list):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            _assert_equal(a, b)
    else:
        assert got == expected


def _write_all(sd: dict, value: float) -> None:
    for t in sd["model"].values():
        t.fill_(value)
    sd["half"].fill_(value)
    for t in sd["small"]:
        t.fill_(value)
    sd["view"].fill_(value)


@needs_cow
def test_an_async_save_holds_the_tensors_as_they_were_when_it_returned(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "STAGE_COW_CHUNK_BYTES", 4096)  # a slow copy: the writes come first
    sd = _state()
    with Checkpointer(threads=1) as ckpt:
        for step in range(3):  # a training loop: the plan and the arena are reused, the values change
            expected = _snapshot_of(sd)
            handle = ckpt.save(sd, tmp_path / "ckpt", async_=True, overwrite=True)
            _write_all(sd, float(step + 100))  # at once: the next step's update
            result = handle.result()
            assert result.staging == "copy-on-write"
            _assert_equal(ckptbench.load(tmp_path / "ckpt"), expected)
            assert sd["model"]["w0"][0, 0].item() == step + 100  # the writes went through
        assert result.plan_reused


@needs_cow
def test_writes_that_reach_a_page_before_its_copy_wait_for_it(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "STAGE_COW_CHUNK_BYTES", 4096)
    sd = {"big": torch.arange(16 * MiB, dtype=torch.int32)}  # 64 MiB in 4 KiB chunks: copies take a while
    with Checkpointer(threads=1) as ckpt:
        handle = ckpt.save(sd, tmp_path / "ckpt", async_=True)
        sd["big"][-1024:] = -1  # the last pages: the copier starts from the first
        result = handle.result()
    assert result.cow_faults >= 1
    assert torch.equal(ckptbench.load(tmp_path / "ckpt")["big"], torch.arange(16 * MiB, dtype=torch.int32))


@needs_cow
def test_a_sync_save_to_a_filesystem_writes_behind_the_copy_too(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "STAGE_COW_CHUNK_BYTES", 4096)  # a slow copy: the write waits for it
    sd = _state()
    expected = _snapshot_of(sd)
    with Checkpointer(threads=1) as ckpt:
        result = ckpt.save(sd, tmp_path / "sync")
    assert result.staging == "copy-on-write"
    _assert_equal(ckptbench.load(tmp_path / "sync"), expected)


def test_the_knob_copies_before_returning(tmp_path: Path, monkeypatch):
    sd = _state()
    with Checkpointer() as ckpt:
        monkeypatch.setattr(knobs, "STAGE_COW", 0)
        assert ckpt.save(sd, tmp_path / "sync").staging == "copy"
        assert cow_unavailable() == "CKPTBENCH_STAGE_COW=0"
        expected = _snapshot_of(sd)
        handle = ckpt.save(sd, tmp_path / "async", async_=True)
        _write_all(sd, -1.0)
        assert handle.result().staging == "copy"
    _assert_equal(ckptbench.load(tmp_path / "async"), expected)


@needs_cow
def test_a_tensor_freed_under_the_copy_fails_the_save_and_keeps_the_last_checkpoint(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "STAGE_COW_CHUNK_BYTES", 4096)
    big = torch.ones(64 * MiB, dtype=torch.int32)  # 256 MiB: its own mapping, unmapped when freed
    path = tmp_path / "ckpt"
    with Checkpointer(threads=1) as ckpt:
        ckpt.save({"big": big}, path)
        handle = ckpt.save({"big": big}, path, async_=True, overwrite=True)
        # The old memory freed at once, before the copy behind the caller can finish (resizing the tensor
        # instead would first copy the old bytes, long enough for the copy to finish first on a busy host).
        big.untyped_storage().resize_(0)
        big.resize_(2 * big.numel())  # a new storage for the next save
        with pytest.raises(CowStagingError, match="changed under the save's copy-on-write staging.*nothing was written"):
            handle.result()
        assert torch.equal(ckptbench.load(path)["big"], torch.ones(64 * MiB, dtype=torch.int32))
        manifest = json.loads((path / "manifest.json").read_text())
        assert sorted(p.name for p in path.iterdir() if p.name.startswith("shard")) == \
            sorted(s["name"] for s in manifest["shards"])  # the failed save's shards are gone
        # The Checkpointer goes on: the next save works.
        ckpt.save({"big": big}, path, async_=True, overwrite=True).result()
    assert ckptbench.load(path)["big"].numel() == 128 * MiB


@needs_cow
def test_a_failed_async_save_has_finished_its_copy_when_it_reports(tmp_path: Path, monkeypatch):
    """The next save reuses the arena: no copy of the failed one may still be writing into it."""
    import errno

    from ckptbench.checkpoint import stage as staging
    from ckptbench.storage.store import LocalStore

    monkeypatch.setattr(knobs, "STAGE_COW_CHUNK_BYTES", 4096)
    made: list[staging.CowStaging] = []
    real_init = staging.CowStaging.__init__

    def keep(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    def broken_write(self, files, **kwargs):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(staging.CowStaging, "__init__", keep)
    monkeypatch.setattr(LocalStore, "write_files", broken_write)
    with Checkpointer(threads=1, checksum=False) as ckpt:
        handle = ckpt.save({"t": torch.ones(32 * MiB, dtype=torch.int32)}, tmp_path / "ckpt", async_=True)
        with pytest.raises(Exception, match="injected"):
            handle.result()
        assert made and made[0].cow_copy.done


@needs_cow
def test_a_storage_swapped_after_an_async_save_is_no_error(tmp_path: Path, monkeypatch):
    """``param.data = ...`` (``model.half()``, FSDP) drops the tensor's storage: the save still holds it."""
    monkeypatch.setattr(knobs, "STAGE_COW_CHUNK_BYTES", 4096)
    param = torch.nn.Parameter(torch.full((64 * MiB,), 3, dtype=torch.int32), requires_grad=False)
    with Checkpointer(threads=1) as ckpt:
        handle = ckpt.save({"p": param}, tmp_path / "ckpt", async_=True)
        param.data = torch.zeros(8, dtype=torch.int32)  # the 256 MiB storage has no other owner now
        assert handle.result().staging == "copy-on-write"
    assert torch.equal(ckptbench.load(tmp_path / "ckpt")["p"], torch.full((64 * MiB,), 3, dtype=torch.int32))


@needs_cow
def test_pinned_rows_are_copied_before_the_cow_copy_takes_the_rest():
    """Memory a GPU or NIC writes by DMA cannot be write-protected: such rows are copied at once."""
    import numpy as np

    from ckptbench.checkpoint.stage import Arena, _copy_host

    a, b = np.full(MiB, 1, np.uint8), np.full(MiB, 2, np.uint8)
    rows = np.array([(a.ctypes.data, 0, MiB, 0), (b.ctypes.data, MiB, MiB, 0)], np.int64)
    arena = Arena()
    arena.ensure(2 * MiB)
    try:
        cow_copy = _copy_host(arena, rows, 1, True, lambda: np.array([True, False]))
        assert cow_copy is not None and MiB <= cow_copy.stats()["protected_bytes"] <= MiB + 4096  # b's pages only
        a[:] = 7  # already copied: no protection on it
        b[:] = 8
        cow_copy.finish()
        flat = np.frombuffer(arena.buffer, np.uint8)
        assert (flat[:MiB] == 1).all() and (flat[MiB:2 * MiB] == 2).all()
    finally:
        arena.close()
