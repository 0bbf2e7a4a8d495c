"""The device staging path's gathering of small tensors, exercised with CPU tensors (same code as CUDA).

Each case stages a state_dict twice: through the engine's fast path (contiguous CPU tensors) and
through ``stage_from_device`` with the gathering thresholds forced low, and compares the arenas.
"""

from __future__ import annotations

import pytest
import torch

from ckptbench import knobs
from ckptbench.checkpoint.plan import plan_save
from ckptbench.checkpoint.stage import Arena, stage, stage_from_device


def _state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {
        "tiny": [torch.randn(n, generator=g) for n in (1, 3, 7, 100, 1000)],
        "bool": torch.rand(33, generator=g) > 0.5,
        "bf16": torch.randn(17, 5, generator=g).to(torch.bfloat16),
        "complex": torch.randn(9, dtype=torch.complex64, generator=g),
        "int8": torch.randint(-100, 100, (4097,), dtype=torch.int8, generator=g),
        "big": torch.randn(300_000, generator=g),  # 1.2 MB, 4 KiB-aligned
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
    }


def _arena_bytes(plan, tensors) -> bytes:
    arena = Arena()
    stage(plan, tensors, arena, threads=2)
    return bytes(memoryview(arena.buffer)[:plan.arena_bytes])


@pytest.mark.parametrize(("below", "run"), [(2 * 2**20, 64 * 2**20), (2 * 2**20, 300), (1, 64 * 2**20), (10**9, 1)])
def test_gathered_staging_matches_direct_copies(monkeypatch, below, run):
    state = _state()
    plan, tensors = plan_save(state, shard_size=256 * 2**20, shard_prefix="s")
    expected = _arena_bytes(plan, tensors)

    monkeypatch.setattr(knobs, "STAGE_GATHER_BELOW_BYTES", below)
    monkeypatch.setattr(knobs, "STAGE_GATHER_RUN_BYTES", run)
    arena = Arena()
    arena.ensure(plan.arena_bytes)
    flat = arena.bytes_tensor()
    flat.fill_(0)
    items = [(t, plan.arena_offset(e), e.nbytes) for e, t in zip(plan.entries, tensors, strict=True)
             if e.alias_of is None and e.nbytes]
    stage_from_device(items[::-1], flat)  # order must not matter
    assert bytes(memoryview(arena.buffer)[:plan.arena_bytes]) == expected


def test_non_contiguous_and_conjugate_views_are_staged_by_value():
    base = torch.randn(64, 48)
    z = torch.randn(10, dtype=torch.complex64)
    state = {"t": base.t(), "conj": z.conj(), "neg": torch.randn(5)._neg_view()}
    plan, tensors = plan_save(state, shard_size=2**20, shard_prefix="s")
    arena = Arena()
    arena.ensure(plan.arena_bytes)
    flat = arena.bytes_tensor()
    stage_from_device([(t, plan.arena_offset(e), e.nbytes) for e, t in zip(plan.entries, tensors, strict=True)],
                      flat)
    for e, t in zip(plan.entries, tensors, strict=True):
        off = plan.arena_offset(e)
        got = flat[off:off + e.nbytes].view(t.dtype).view(t.shape)
        assert torch.equal(got, t.resolve_conj().resolve_neg())
