"""The device staging path's gathering of small tensors, exercised with CPU tensors (same code as CUDA).

Each case stages a state_dict twice: through the engine's fast path (contiguous CPU tensors) and
through ``stage_from_device`` with the gathering thresholds forced low, and compares the arenas.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from ckptbench import knobs
from ckptbench.checkpoint import gather
from ckptbench.checkpoint.plan import ROUTE_HOST, ROUTE_TORCH, plan_save
from ckptbench.checkpoint.stage import Arena, DeviceCopies, gather_runs, stage, stage_from_device


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
    stage_from_device(DeviceCopies.of(items[::-1]), flat)  # order must not matter
    assert bytes(memoryview(arena.buffer)[:plan.arena_bytes]) == expected


def test_non_contiguous_and_conjugate_views_are_staged_by_value():
    base = torch.randn(64, 48)
    z = torch.randn(10, dtype=torch.complex64)
    state = {"t": base.t(), "conj": z.conj(), "neg": torch.randn(5)._neg_view()}
    plan, tensors = plan_save(state, shard_size=2**20, shard_prefix="s")
    assert list(tensors.routes) == [ROUTE_TORCH] * 3
    arena = Arena()
    stage(plan, tensors, arena, threads=2)
    flat = arena.bytes_tensor()
    for e, t in zip(plan.entries, tensors, strict=True):
        off = plan.arena_offset(e)
        got = flat[off:off + e.nbytes].view(t.dtype).view(t.shape)
        assert torch.equal(got, t.resolve_conj().resolve_neg())


def test_plan_records_routes_addresses_and_placements():
    base = torch.randn(8, 8)
    state = {"a": base, "tied": base, "view": base.t(), "empty": torch.empty(0), "b": torch.arange(5)}
    plan, sources = plan_save(state, shard_size=2**20, shard_prefix="s")
    assert list(sources.routes) == [ROUTE_HOST, ROUTE_HOST, ROUTE_TORCH, ROUTE_HOST, ROUTE_HOST]
    assert list(sources.addresses) == [t.data_ptr() for t in sources]
    stored = [e for e in plan.entries if e.alias_of is None and e.nbytes]
    assert sorted(plan.placements.tolist(), key=lambda row: row[0]) == [
        [e.index, plan.arena_offset(e), e.nbytes] for e in stored]
    assert plan.placements[:, 1].tolist() == sorted(plan.placements[:, 1].tolist())  # by arena offset


def test_staging_from_a_plain_list_matches_staging_from_sources():
    state = _state()
    plan, sources = plan_save(state, shard_size=2**20, shard_prefix="s")
    assert _arena_bytes(plan, list(sources)) == _arena_bytes(plan, sources)


@pytest.mark.parametrize(("offsets", "nbytes", "max_gap", "run_bytes", "expected"), [
    ([], [], 64, 100, []),
    ([0], [10], 64, 100, [(0, 1)]),
    ([0, 64, 128], [64, 64, 64], 0, 1000, [(0, 3)]),  # back to back: one run
    ([0, 64, 1000], [64, 64, 64], 64, 1000, [(0, 2), (2, 3)]),  # a gap of 872 > 64 ends the run
    ([0, 64, 1000], [64, 64, 64], 872, 10**6, [(0, 3)]),  # ... unless the gap is allowed
    ([0, 64, 128, 192], [64, 64, 64, 64], 0, 128, [(0, 2), (2, 4)]),  # runs start every 128 bytes
    ([0, 4096, 4160], [4000, 64, 64], 100, 10**6, [(0, 3)]),
    ([0, 4096, 9000, 9064], [4000, 64, 64, 64], 100, 10**6, [(0, 2), (2, 4)]),  # the size split restarts per gap
])
def test_gather_runs(offsets, nbytes, max_gap, run_bytes, expected):
    got = gather_runs(np.array(offsets, np.int64), np.array(nbytes, np.int64), max_gap, run_bytes)
    assert got == expected
    positions = np.arange(len(offsets))
    assert gather_runs(np.array(offsets, np.int64), np.array(nbytes, np.int64), max_gap, run_bytes, positions) == got


def test_gather_runs_never_span_a_tensor_staged_another_way():
    offsets, nbytes = np.array([0, 128, 192], np.int64), np.array([64, 64, 64], np.int64)
    assert gather_runs(offsets, nbytes, 4096, 10**6, np.array([0, 2, 3])) == [(0, 1), (1, 3)]


@pytest.mark.parametrize("fake_kernel", [False, True])
def test_device_staging_keeps_the_bytes_of_a_tensor_between_its_runs(monkeypatch, fake_kernel):
    """A CPU tensor placed between two small GPU tensors is staged first, by the engine; the GPU run's
    zero padding must not overwrite it (it did: the run spanned the gap)."""
    a, foreign, c = torch.full((16,), 1.0), torch.full((16,), 2.0), torch.full((16,), 3.0)
    arena = Arena()
    arena.ensure(4096)
    flat = arena.bytes_tensor()
    flat[64:128].copy_(foreign.view(torch.uint8))
    copies = DeviceCopies([a, foreign, c], np.array([0, 2]), np.array([a.data_ptr(), c.data_ptr()], np.int64),
                          np.array([0, 128], np.int64), np.array([64, 64], np.int64), np.array([0, 2]))
    if fake_kernel:  # the kernel path's runs and table, with the CPU stand-in for the kernel
        runs = gather_runs(copies.offsets, copies.nbytes, knobs.STAGE_GATHER_MAX_GAP_BYTES,
                           knobs.STAGE_GATHER_RUN_BYTES, copies.positions)
        gather.gather_runs_to_host(_fake_kernel, torch.device("cpu"), None, copies.addresses, copies.offsets,
                                   copies.nbytes, runs, flat)
    else:
        stage_from_device(copies, flat)
    assert torch.equal(flat[:192].view(torch.float32), torch.cat([a, foreign, c]))


def _fake_kernel(grid, block, args, stream=None):
    """The gather kernel's contract, on CPU tensors: copy each (address, offset, nbytes) row into dst."""
    table, n, dst = args
    assert table.shape == (n, 3) and grid[0] >= 1 and stream is None
    for address, offset, nbytes in table.tolist():
        assert offset + nbytes <= dst.numel()
        ctypes.memmove(dst.data_ptr() + offset, address, nbytes)


def test_torch_release_parsing():
    assert gather._release("2.11.0+cu130") == (2, 11) and gather._release("2.9.1") == (2, 9)
    assert gather._release("2.13.0a0+git123") == (2, 13) and gather._release("3") == (3, 0)


@pytest.mark.parametrize("scratch", [2**30, 1, 700])
def test_kernel_table_and_batches_match_direct_copies(monkeypatch, scratch):
    """The rows handed to the kernel and the scratch batching, checked with a CPU stand-in for the kernel."""
    g = torch.Generator().manual_seed(5)
    state = {f"t{i}": torch.randn(int(n), generator=g) for i, n in enumerate(torch.randint(1, 300, (200,)))}
    state["mid"] = torch.randn(5000, generator=g)
    plan, sources = plan_save(state, shard_size=8000, shard_prefix="s")  # several shards
    expected = _arena_bytes(plan, sources)

    monkeypatch.setattr(knobs, "STAGE_GATHER_RUN_BYTES", 900)
    monkeypatch.setattr(knobs, "STAGE_GATHER_SCRATCH_BYTES", scratch)
    monkeypatch.setattr(knobs, "STAGE_GATHER_BELOW_BYTES", 10_000)  # "mid" is copied directly
    monkeypatch.setattr(gather, "kernel_for", lambda device: _fake_kernel)
    copies = DeviceCopies.of([(t, plan.arena_offset(e), e.nbytes) for e, t in zip(plan.entries, sources, strict=True)
                              if e.alias_of is None and e.nbytes])
    small = np.flatnonzero(copies.nbytes < knobs.STAGE_GATHER_BELOW_BYTES)
    runs = gather_runs(copies.offsets[small], copies.nbytes[small], knobs.STAGE_GATHER_MAX_GAP_BYTES, 900)
    assert len(runs) > 3
    arena = Arena()
    arena.ensure(plan.arena_bytes)
    flat = arena.bytes_tensor()
    flat.fill_(0xAB)  # padding must come out zero, as the engine path leaves it
    gather.gather_runs_to_host(_fake_kernel, torch.device("cpu"), None, copies.addresses[small],
                               copies.offsets[small], copies.nbytes[small], runs, flat)
    for k in np.flatnonzero(copies.nbytes >= knobs.STAGE_GATHER_BELOW_BYTES).tolist():
        o, n = int(copies.offsets[k]), int(copies.nbytes[k])
        flat[o:o + n].copy_(copies.sources[k].view(-1).view(torch.uint8))
    got = bytes(memoryview(arena.buffer)[:plan.arena_bytes])
    # Bytes outside every run (between shards) were never gathered; compare the runs and tensors.
    covered = np.zeros(plan.arena_bytes, bool)
    for first, stop in runs:
        start = int(copies.offsets[small][first])
        covered[start:int(copies.offsets[small][stop - 1] + copies.nbytes[small][stop - 1])] = True
    for k in range(len(copies.offsets)):
        covered[int(copies.offsets[k]):int(copies.offsets[k] + copies.nbytes[k])] = True
    mask = np.flatnonzero(covered)
    assert np.array_equal(np.frombuffer(got, np.uint8)[mask], np.frombuffer(expected, np.uint8)[mask])
