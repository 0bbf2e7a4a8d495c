"""The staging arena is allocated untouched: its pages are faulted in by the first copy into them, behind
the caller of an async save, not on the caller's thread inside the first save's stall."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench import knobs
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint.stage import Arena

MiB = 2**20


def resident_bytes(address: int, nbytes: int) -> int:
    """Bytes of ``[address, address + nbytes)`` in memory now (mincore(2))."""
    page = os.sysconf("SC_PAGE_SIZE")
    pages = -(-nbytes // page)
    vector = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(nbytes), vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vector) * page


@pytest.mark.parametrize("prefault", [0, 1])
def test_the_arena_is_touched_only_when_the_knob_says_so(monkeypatch, prefault: int):
    monkeypatch.setattr(knobs, "ARENA_PREFAULT", prefault)
    arena = Arena()
    try:
        arena.ensure(64 * MiB)  # above glibc's largest mmap threshold: fresh pages from the kernel
        resident = resident_bytes(arena.buffer.address, 64 * MiB)
    finally:
        arena.close()
    if prefault:
        assert resident == 64 * MiB
    else:
        assert resident < 4 * MiB


def test_a_first_async_save_into_an_untouched_arena_holds_the_tensors_as_they_were(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "ARENA_PREFAULT", 0)
    state = {"a": torch.arange(6 * MiB, dtype=torch.float32), "b": torch.full((3 * MiB + 5,), 7, dtype=torch.int16)}
    expected = {k: v.clone() for k, v in state.items()}
    with Checkpointer() as ckpt:
        handle = ckpt.save(state, tmp_path / "c", async_=True)
        state["a"].add_(1)  # after save() returned: not in the checkpoint
        handle.result()
        assert ckpt._arena.nbytes >= 6 * MiB * 4  # staged through the arena, not the ring
    loaded = ckptbench.load(tmp_path / "c")
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)
