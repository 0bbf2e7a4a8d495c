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
from ckptbench.checkpoint.plan import plan_save
from ckptbench.checkpoint.routing import ROUTE_HOST, ROUTE_TORCH
from ckptbench.checkpoint.stage import Arena, DeviceCopies, gather_runs, stage, stage_from_device


def _copies(plan, sources) -> DeviceCopies:
    """Every stored tensor of ``plan`` as one device's copies, with its padding."""
    index, offsets, nbytes = plan.placements.T
    return DeviceCopies(list(sources), index, np.frombuffer(sources.addresses, np.int64)[index], offsets, nbytes,
                        np.arange(len(index)), plan.padding)


def _fill_arena(plan, value: int) -> tuple[Arena, torch.Tensor]:
    arena = Arena()
    arena.ensure(plan.arena_bytes)
    flat = arena.bytes_tensor()
    flat.fill_(value)
    return arena, flat


def _between_shards(plan) -> np.ndarray:
    """Arena bytes in no shard file (alignment between shards): no staging path writes them."""
    outside = np.ones(plan.arena_bytes, bool)
    for shard in plan.shards:
        outside[shard.arena_offset:shard.arena_offset + shard.nbytes] = False
    return outside


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
    arena, flat = _fill_arena(plan, 0xAB)  # the padding must come out zero, as the engine leaves it
    copies = _copies(plan, tensors)
    items = [(copies.sources[i], o, n, z) for i, o, n, z in zip(copies.index.tolist(), copies.offsets.tolist(),
                                                               copies.nbytes.tolist(), copies.zero_after.tolist(),
                                                               strict=True)]
    stage_from_device(DeviceCopies.of(items[::-1]), flat)  # order must not matter
    got = np.frombuffer(bytes(memoryview(arena.buffer)[:plan.arena_bytes]), np.uint8)
    inside = ~_between_shards(plan)
    assert np.array_equal(got[inside], np.frombuffer(expected, np.uint8)[inside])


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
                          np.array([0, 128], np.int64), np.array([64, 64], np.int64), np.array([0, 2]),
                          np.array([0, 0], np.int64))
    if fake_kernel:  # the kernel path's runs and table, with the CPU stand-in for the kernel
        monkeypatch.setattr(gather, "kernel_for", lambda device: _fake_kernel)
    stage_from_device(copies, flat)
    assert torch.equal(flat[:192].view(torch.float32), torch.cat([a, foreign, c]))


def _fake_kernel(grid, block, args, stream=None):
    """The gather kernel's contract, on CPU tensors: copy each (address, offset, nbytes, zeros) row into
    dst, then that many zero bytes after it; rows are at most a piece long."""
    table, n, dst = args
    assert table.shape == (n, 4) and grid[0] >= 1 and stream is None
    for address, offset, nbytes, zeros in table.tolist():
        assert offset >= 0 and offset + nbytes + zeros <= dst.numel() and 0 < nbytes <= gather.PIECE_BYTES
        ctypes.memmove(dst.data_ptr() + offset, address, nbytes)
        ctypes.memset(dst.data_ptr() + offset + nbytes, 0, zeros)


def test_torch_release_parsing():
    assert gather._release("2.11.0+cu130") == (2, 11) and gather._release("2.9.1") == (2, 9)
    assert gather._release("2.13.0a0+git123") == (2, 13) and gather._release("3") == (3, 0)


@pytest.mark.parametrize(("run", "slots", "piece", "direct"), [
    (2**30, 3, 2**16, False), (1, 1, 2**16, False), (700, 2, 2**16, False), (900, 3, 96, False),
    (5000, 1, 100, False), (900, 3, 2**16, True), (900, 3, 100, True)])
def test_kernel_table_and_batches_match_direct_copies(monkeypatch, run, slots, piece, direct):
    """The rows handed to the kernel, the pieces, the batches and their buffers, checked with a CPU
    stand-in for the kernel: the arena comes out as the engine stages it, padding zeroed."""
    g = torch.Generator().manual_seed(5)
    state = {f"t{i}": torch.randn(int(n), generator=g) for i, n in enumerate(torch.randint(1, 300, (200,)))}
    state["mid"] = torch.randn(5000, generator=g)
    state["odd"] = torch.randn(3000, generator=g)[1:]  # contiguous at an address that is not 16-byte aligned
    plan, sources = plan_save(state, shard_size=8000, shard_prefix="s")  # several shards
    expected = _arena_bytes(plan, sources)

    monkeypatch.setattr(knobs, "STAGE_GATHER_RUN_BYTES", run)
    monkeypatch.setattr(knobs, "STAGE_GATHER_SLOTS", slots)
    monkeypatch.setattr(knobs, "STAGE_GATHER_MAPPED", int(direct))
    monkeypatch.setattr(knobs, "STAGE_GATHER_BELOW_BYTES", 10_000)  # "mid" is copied directly
    monkeypatch.setattr(gather, "PIECE_BYTES", piece)
    monkeypatch.setattr(gather, "kernel_for", lambda device: _fake_kernel)
    launches, launch = [], gather._launch
    monkeypatch.setattr(gather, "_launch", lambda k, s, table, dst: launches.append(len(table))
                        or launch(k, s, table, dst))
    arena, flat = _fill_arena(plan, 0xAB)  # padding must come out zero, as the engine path leaves it
    copies = _copies(plan, sources)
    small = np.flatnonzero(copies.nbytes < knobs.STAGE_GATHER_BELOW_BYTES)
    runs = gather_runs(copies.offsets[small], copies.nbytes[small], knobs.STAGE_GATHER_MAX_GAP_BYTES, run,
                       copies.positions[small])
    assert len(runs) > 3 or run > 10**6
    stage_from_device(copies, flat, mapped=direct)
    got = np.frombuffer(bytes(memoryview(arena.buffer)[:plan.arena_bytes]), np.uint8)
    inside = ~_between_shards(plan)
    assert np.array_equal(got[inside], np.frombuffer(expected, np.uint8)[inside])
    if direct:  # one launch for all, straight into the arena
        assert len(launches) == 1 and launches[0] >= len(small)
        return
    # One launch per batch: a batch per run when runs are tiny, one for all when batches are huge.
    assert len(launches) >= len(runs) if run <= 1 else len(launches) >= 1
    assert (len(launches) == 1) == (run > 10**6)
    assert sum(launches) >= len(small) + (piece < 1000)  # long tensors were split


@pytest.mark.parametrize(("nbytes", "piece", "expected"), [
    ([10, 20], 64, [(0, 0, 10, 3), (1, 100, 20, 4)]),
    ([64, 65], 64, [(0, 0, 64, 3), (1, 100, 64, 0), (65, 164, 1, 4)]),
    ([150], 64, [(0, 0, 64, 0), (64, 64, 64, 0), (128, 128, 22, 3)]),
])
def test_kernel_table_splits_long_copies_into_pieces(nbytes, piece, expected):
    n = len(nbytes)
    addresses, offsets = np.array([0, 1][:n], np.int64), np.array([0, 100][:n], np.int64)
    table, starts = gather.kernel_table(addresses, offsets, np.array(nbytes, np.int64), np.array([3, 4][:n]), piece)
    assert [tuple(row) for row in table.tolist()] == expected
    assert starts.tolist() == [0, *np.cumsum([-(-b // piece) for b in nbytes]).tolist()]


@pytest.mark.parametrize(("spans", "limit", "expected"), [
    ([], 10, []), ([5], 1, [(0, 1)]), ([4, 4, 4], 8, [(0, 2), (2, 3)]), ([9, 1, 1], 8, [(0, 1), (1, 3)]),
    ([1, 1, 1], 100, [(0, 3)]),
])
def test_batches_group_runs_up_to_a_size(spans, limit, expected):
    assert gather.batches(np.array(spans, np.int64), limit) == expected


@pytest.mark.parametrize("direct", [False, True])
def test_prepared_work_is_reused_only_for_the_same_copies(monkeypatch, direct):
    """The arena keeps the kernel's prepared table for the next staging: the same copies again take no
    preparation or upload; another address, size or knob is prepared anew, and every staging is exact."""
    g = torch.Generator().manual_seed(9)
    state = {f"t{i}": torch.randn(int(n), generator=g) for i, n in enumerate(torch.randint(1, 3000, (120,)))}
    plan, sources = plan_save(state, shard_size=64 * 1024, shard_prefix="s")
    monkeypatch.setattr(gather, "kernel_for", lambda device: _fake_kernel)
    monkeypatch.setattr(knobs, "STAGE_GATHER_MAPPED", int(direct))
    monkeypatch.setattr(knobs, "STAGE_GATHER_RUN_BYTES", 20_000)
    uploads, upload = [], gather.upload
    monkeypatch.setattr(gather, "upload", lambda table, *rest: uploads.append(len(table)) or upload(table, *rest))
    prepared = gather.Prepared()
    arena, flat = _fill_arena(plan, 0xAB)
    inside = ~_between_shards(plan)

    def staged(copies) -> np.ndarray:
        flat.fill_(0xAB)
        stage_from_device(copies, flat, mapped=direct, prepared=prepared)
        return np.frombuffer(bytes(memoryview(arena.buffer)[:plan.arena_bytes]), np.uint8)[inside]

    def expected() -> np.ndarray:
        return np.frombuffer(_arena_bytes(plan, sources), np.uint8)[inside]

    assert np.array_equal(staged(_copies(plan, sources)), expected()) and uploads
    uploads.clear()
    for t in state.values():
        t.add_(1)  # new values at the same addresses: the same copies
    assert np.array_equal(staged(_copies(plan, sources)), expected()) and uploads == []
    state["t5"] = torch.randn(state["t5"].shape, generator=g)  # another tensor (address) at that place
    plan, sources = plan_save(state, shard_size=64 * 1024, shard_prefix="s")
    assert np.array_equal(staged(_copies(plan, sources)), expected()) and uploads
    uploads.clear()
    monkeypatch.setattr(knobs, "STAGE_GATHER_RUN_BYTES", 30_000)
    assert np.array_equal(staged(_copies(plan, sources)), expected()) and (uploads != []) != direct


class _Driver:
    """A CPU stand-in for the CUDA driver's ``cuLaunchKernel``: reads the launch's parameters back from
    the memory the launcher points it at and does what the kernel would."""

    def __init__(self, error: int = 0) -> None:
        self.error, self.calls = error, []

    def cuLaunchKernel(self, func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
        self.calls.append((func.value, (gx, gy, gz), (bx, by, bz), shared, stream, extra))
        if self.error:
            return self.error
        table_at = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_void_p))[0]
        rows = ctypes.cast(params[1], ctypes.POINTER(ctypes.c_int))[0]
        dst = ctypes.cast(params[2], ctypes.POINTER(ctypes.c_void_p))[0]
        table = np.ctypeslib.as_array(ctypes.cast(table_at, ctypes.POINTER(ctypes.c_int64)), (rows, 4))
        for address, offset, nbytes, zeros in table.tolist():
            ctypes.memmove(dst + offset, address, nbytes)
            ctypes.memset(dst + offset + nbytes, 0, zeros)
        return 0

    def cuGetErrorString(self, err, text):  # noqa: N802
        ctypes.cast(text, ctypes.POINTER(ctypes.c_char_p))[0] = b"CUDA_ERROR_INVALID_VALUE"
        return 0


class _Kernel:
    func = ctypes.c_void_p(0xF00)


class _Stream:
    cuda_stream = 0x5EED


@pytest.mark.parametrize("count", [3, gather.MAX_BLOCKS + 5])
def test_launch_gives_the_driver_the_table_its_rows_and_the_destination(monkeypatch, count):
    """The launcher's one driver call: the kernel's function on the given stream, a block per row up to
    MAX_BLOCKS, and parameters pointing at (table address, row count, destination address)."""
    driver = _Driver()
    monkeypatch.setattr(gather, "_driver", lambda: driver)
    sources = [torch.full((1 + k % 7,), float(k)) for k in range(count)]
    nbytes = np.array([4 * t.numel() for t in sources], np.int64)
    offsets = np.zeros(count, np.int64)
    offsets[1:] = np.cumsum(nbytes + 4)[:-1]
    table, _ = gather.kernel_table(np.array([t.data_ptr() for t in sources], np.int64), offsets, nbytes,
                                   np.full(count, 4, np.int64))
    dst = torch.full((int(offsets[-1] + nbytes[-1] + 4),), 0xAB, dtype=torch.uint8)
    gather._launch(_Kernel(), _Stream(), torch.from_numpy(table), dst)
    assert driver.calls == [(0xF00, (min(count, gather.MAX_BLOCKS), 1, 1), (gather.THREADS_PER_BLOCK, 1, 1), 0,
                             0x5EED, None)]
    expected = torch.cat([torch.cat([t.view(torch.uint8), torch.zeros(4, dtype=torch.uint8)]) for t in sources])
    assert torch.equal(dst, expected)


def test_launch_failure_names_the_driver_error(monkeypatch):
    monkeypatch.setattr(gather, "_driver", lambda: _Driver(error=1))
    with pytest.raises(RuntimeError, match="CUDA error 1 .CUDA_ERROR_INVALID_VALUE"):
        gather._launch(_Kernel(), _Stream(), torch.zeros((1, 4), dtype=torch.int64), torch.zeros(8, dtype=torch.uint8))


def test_staging_the_same_plan_arrays_again_issues_the_remembered_work(monkeypatch):
    """stage() of the very plan and sources staged last time (a Checkpointer's reused plan) issues the
    staging the arena remembered, without working it out again; other arrays, other knobs or a closed
    arena work it out anew, and every staging writes the tensors' current bytes, padding zeroed."""
    from array import array

    from ckptbench.checkpoint import stage as staging

    g = torch.Generator().manual_seed(4)
    state = {f"t{i}": torch.randn(int(n), generator=g) for i, n in enumerate(torch.randint(1, 3000, (60,)))}
    state["big"] = torch.randn(12_001, generator=g)  # padding after it, in its shard
    plan, sources = plan_save(state, shard_size=64 * 1024, shard_prefix="s")
    sources.routes = array("h", [0] * len(sources))  # as CUDA tensors of one device: the direct path
    monkeypatch.setattr(gather, "kernel_for", lambda device: _fake_kernel)
    monkeypatch.setattr(knobs, "STAGE_GATHER_BELOW_BYTES", 40_000)  # "big" goes by the copy engine
    worked_out = []
    monkeypatch.setattr(staging.MappedStaging, "of", classmethod(
        lambda cls, *args, of=staging.MappedStaging.of.__func__: worked_out.append(1) or of(cls, *args)))
    arena, flat = _fill_arena(plan, 0xAB)
    arena._registered = True  # mapped, as cudaHostRegister leaves it
    inside = ~_between_shards(plan)

    def staged(sources) -> np.ndarray:
        flat.fill_(0xAB)
        stage(plan, sources, arena, threads=2)
        got = np.frombuffer(bytes(memoryview(arena.buffer)[:plan.arena_bytes]), np.uint8)[inside]
        expected_arena = Arena()
        stage(plan, list(sources), expected_arena, threads=2)  # the engine's copies of the same tensors
        expected = np.frombuffer(bytes(memoryview(expected_arena.buffer)[:plan.arena_bytes]), np.uint8)[inside]
        assert np.array_equal(got, expected)
        return got

    staged(sources)
    assert len(worked_out) == 1
    for t in state.values():
        t.add_(1)
    staged(sources)
    assert len(worked_out) == 1  # remembered
    copy = type(sources).of_columns(list(sources), array("q", sources.addresses), sources.routes)
    staged(copy)  # equal arrays, but not the same ones: worked out anew, remembered for those
    assert len(worked_out) == 2
    staged(copy)
    assert len(worked_out) == 2
    monkeypatch.setattr(knobs, "STAGE_GATHER_BELOW_BYTES", 10**9)
    staged(copy)
    assert len(worked_out) == 3
    arena._registered = False  # (never registered: nothing to unregister)
    arena.close()
    arena.ensure(plan.arena_bytes)
    arena._registered = True
    flat = arena.bytes_tensor()
    staged(copy)
    assert len(worked_out) == 4
    arena._registered = False


def test_launch_without_a_driver_library_goes_through_the_kernels_own_launcher(monkeypatch):
    """A ROCm build (no libcuda to call): the compiled kernel is launched the way torch launches it."""
    calls = []

    class Kernel:
        func = ctypes.c_void_p(0xF00)

        def __call__(self, grid, block, args, stream=None):
            calls.append((grid, block, args[1], stream))

    monkeypatch.setattr(gather, "_driver", lambda: None)
    stream = _Stream()
    gather._launch(Kernel(), stream, torch.zeros((3, 4), dtype=torch.int64), torch.zeros(8, dtype=torch.uint8))
    assert calls == [((3, 1, 1), (gather.THREADS_PER_BLOCK, 1, 1), 3, stream)]


def test_waiting_waits_for_every_stream_and_raises_the_first_failure():
    """A failing wait (a CUDA error) must not leave other streams' copies running into the arena."""
    waited = []

    class Stream:
        def __init__(self, name: str, error: Exception | None = None) -> None:
            self.name, self.error = name, error

        def synchronize(self) -> None:
            waited.append(self.name)
            if self.error is not None:
                raise self.error

    keep = [object()]
    queued = gather.Queued((Stream("a", RuntimeError("first")), None, Stream("b", ValueError("second")),
                            Stream("c")), keep)
    with pytest.raises(RuntimeError, match="first"):
        queued.wait()
    assert waited == ["a", "b", "c"] and keep == []
