"""The bounded staging ring (``checkpoint/ring.py``): sync saves staged, written and checksummed chunk
by chunk through a few small slots, and ``into=`` loads read back through them.

The slots are made tiny here, so every state_dict crosses many slot boundaries: tensors larger than a
slot, many small tensors packed inside one, padding cut by a boundary, both O_DIRECT and buffered. A save
through the ring must write the very bytes (and checksums) a save from the whole arena writes."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ckptbench import knobs, native  # noqa: E402
from ckptbench.checkpoint import Checkpointer  # noqa: E402
from ckptbench.checkpoint import manifest as mf  # noqa: E402
from ckptbench.checkpoint.ring import RunningCrcs, chunks, staging_rows  # noqa: E402
from ckptbench.errors import StorageIOError, UsageError  # noqa: E402
from ckptbench.storage.store import PieceWriter  # noqa: E402

SLOT = 16 * 1024


@pytest.fixture(autouse=True)
def tiny_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knobs, "STAGE_RING", 1)
    monkeypatch.setattr(knobs, "STAGE_RING_SLOTS", 3)
    monkeypatch.setattr(knobs, "STAGE_RING_SLOT_BYTES", SLOT)


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "big": torch.randn(50_000, generator=g),  # ~12 slots
        "odd": torch.randint(0, 256, (SLOT * 3 + 77,), dtype=torch.uint8, generator=g),  # ends mid-slot
        "bf16": torch.randn(333, 129, generator=g).to(torch.bfloat16),
        "small": [torch.randn(3, 5, generator=g) for _ in range(400)],  # many packed at 64-byte steps
        "ints": torch.arange(70_001, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "step": 12,
    }


def _zeros_like(state: dict) -> dict:
    out = {k: torch.zeros_like(v) for k, v in state.items() if isinstance(v, torch.Tensor)}
    out["small"] = [torch.zeros_like(t) for t in state["small"]]
    out["step"] = 0
    return out


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _assert_equal(got: dict, want: dict) -> None:
    for key, value in want.items():
        if key == "small":
            assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(got[key], value, strict=True))
        elif isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(_bytes(got[key]), _bytes(value)), key
        else:
            assert got[key] == value


def _shard_bytes(path: Path) -> list[bytes]:
    manifest = json.loads((path / mf.MANIFEST_NAME).read_text())
    return [(path / s["name"]).read_bytes() for s in manifest["shards"]]


def _crcs(path: Path) -> list:
    manifest = json.loads((path / mf.MANIFEST_NAME).read_text())
    return [(t["key"], t["crc32c"]) for t in manifest["tensors"]]


@pytest.mark.parametrize("direct", [True, False])
def test_a_sync_save_through_the_ring_writes_what_the_arena_writes(tmp_path: Path, direct: bool,
                                                                   monkeypatch: pytest.MonkeyPatch):
    state = _state()
    with Checkpointer(direct=direct, shard_size=100_000, threads=2) as ckpt:
        result = ckpt.save(state, tmp_path / "ring")
        assert result.staging == "ring" and ckpt._arena.nbytes == 0  # no copy of the checkpoint was held
        assert result.direct is direct
        _assert_equal(ckpt.load(tmp_path / "ring"), state)
    monkeypatch.setattr(knobs, "STAGE_RING", 0)
    with Checkpointer(direct=direct, shard_size=100_000, threads=2) as ckpt:
        assert ckpt.save(state, tmp_path / "arena").staging != "ring"
    # byte for byte the same shards (padding zeroed alike), and the same checksums
    assert _shard_bytes(tmp_path / "ring") == _shard_bytes(tmp_path / "arena")
    assert _crcs(tmp_path / "ring") == _crcs(tmp_path / "arena")


@pytest.mark.parametrize("direct", [True, False])
def test_the_first_and_last_chunks_are_written_in_pieces_of_a_block_per_writing_thread(
        tmp_path: Path, direct: bool, monkeypatch: pytest.MonkeyPatch):
    """4 threads = two writers of 2: pieces of 2 blocks. The first write waits for one piece, not a slot; the
    last chunks' pieces are shared by both writers; the shards are the arena's, byte for byte."""
    from ckptbench.storage.store import engine_calls

    state, block = _state(), 4096
    with Checkpointer(direct=direct, shard_size=100_000, threads=4, block_size=block) as ckpt, \
            engine_calls() as calls:
        result = ckpt.save(state, tmp_path / "ring")
    assert result.staging == "ring"
    written = sorted((c for c in calls if c.bytes), key=lambda c: c.start_ns)
    assert written[0].bytes == 2 * block < SLOT
    manifest = json.loads((tmp_path / "ring" / mf.MANIFEST_NAME).read_text())
    cut = chunks([(0, s["nbytes"]) for s in manifest["shards"]], SLOT)
    # the first chunk and the last two in pieces, every other chunk in one call
    pieces = sum(-(-n // (2 * block)) for n in (cut[0][2], cut[-2][2], cut[-1][2]))
    assert len(written) == pieces + len(cut) - 3
    monkeypatch.setattr(knobs, "STAGE_RING", 0)
    with Checkpointer(direct=direct, shard_size=100_000, threads=4, block_size=block) as ckpt:
        assert ckpt.save(state, tmp_path / "arena").staging != "ring"
    assert _shard_bytes(tmp_path / "ring") == _shard_bytes(tmp_path / "arena")
    assert _crcs(tmp_path / "ring") == _crcs(tmp_path / "arena")


@pytest.mark.parametrize("threads", [1, 3, 4])
def test_the_ring_round_trips_with_any_thread_count_and_reused_plans(tmp_path: Path, threads: int):
    with Checkpointer(threads=threads, shard_size=64 * 1024) as ckpt:
        for seed in range(2):  # the second save reuses the plan and the ring's slots
            state = _state(seed)
            result = ckpt.save(state, tmp_path / f"c{seed}")
            assert result.staging == "ring" and result.threads == threads
            _assert_equal(ckpt.load(tmp_path / f"c{seed}"), state)


def test_async_saves_and_unringable_state_dicts_use_the_arena(tmp_path: Path):
    state = _state()
    with Checkpointer() as ckpt:
        assert ckpt.save(state, tmp_path / "a", async_=True).result().staging != "ring"
        view = {"t": torch.randn(200, 300).t()}  # not contiguous: copied by torch, into the arena
        assert ckpt.save(view, tmp_path / "b").staging != "ring"
        _assert_equal(ckpt.load(tmp_path / "b"), view)
        small = {"t": torch.randn(100)}  # no larger than the ring: the arena is as small
        assert ckpt.save(small, tmp_path / "c").staging != "ring"


def test_a_write_failure_inside_the_ring_commits_nothing_and_leaves_no_shard(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    state = _state()
    with Checkpointer() as ckpt:
        ckpt.save(state, tmp_path / "ckpt")
        before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
        real = PieceWriter.write
        calls = []

        def failing(self, pieces, **kw):
            calls.append(1)
            if len(calls) == 5:
                raise OSError(errno.EIO, "Input/output error", "injected")
            return real(self, pieces, **kw)

        monkeypatch.setattr(PieceWriter, "write", failing)
        with pytest.raises(StorageIOError, match="Input/output error"):
            ckpt.save(_state(1), tmp_path / "ckpt", overwrite=True)
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == before  # no partial shard stays
        monkeypatch.setattr(PieceWriter, "write", real)
        _assert_equal(ckpt.load(tmp_path / "ckpt"), state)  # the committed one is intact


def test_a_bounded_load_reads_through_the_ring_into_the_live_tensors(tmp_path: Path):
    state = _state()
    with Checkpointer(shard_size=100_000) as ckpt:
        ckpt.save(state, tmp_path / "ckpt")
        into = _zeros_like(state)
        keep = {k: v.data_ptr() for k, v in into.items() if isinstance(v, torch.Tensor)}
        assert ckpt.load(tmp_path / "ckpt", into=into, bounded_memory=True) is into
        _assert_equal(into, state)
        assert {k: v.data_ptr() for k, v in into.items() if isinstance(v, torch.Tensor)} == keep
        assert ckpt._read_buffer.nbytes == 0  # no read buffer of the checkpoint's size


def test_the_module_level_load_takes_bounded_memory_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``ckptbench.load`` takes what ``Checkpointer.load`` takes, ``bounded_memory`` included, and hands it on."""
    import ckptbench

    seen = []
    real = Checkpointer.load

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("bounded_memory"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "load", spy)
    state = _state()
    ckptbench.save(state, tmp_path / "ckpt")
    into = _zeros_like(state)
    assert ckptbench.load(tmp_path / "ckpt", into=into, bounded_memory=True) is into
    _assert_equal(into, state)
    assert seen == [True]


def test_a_bounded_load_checks_every_checksum_and_the_fit_first(tmp_path: Path):
    state = _state()
    with Checkpointer() as ckpt:
        ckpt.save(state, tmp_path / "ckpt")
        misfit = _zeros_like(state)
        misfit["bf16"] = torch.zeros(333, 128, dtype=torch.bfloat16)
        with pytest.raises(UsageError, match="does not fit"):
            ckpt.load(tmp_path / "ckpt", into=misfit, bounded_memory=True)
        assert not misfit["big"].any()  # refused before anything was read into it
        manifest = json.loads((tmp_path / "ckpt" / mf.MANIFEST_NAME).read_text())
        entry = next(t for t in manifest["tensors"] if t["key"] == "odd")
        shard = tmp_path / "ckpt" / manifest["shards"][entry["shard"]]["name"]
        data = bytearray(shard.read_bytes())
        data[entry["offset"] + SLOT + 5] ^= 0xFF  # in the tensor's second slot-sized piece
        shard.write_bytes(bytes(data))
        with pytest.raises(mf.CorruptCheckpointError, match="checksum mismatch in tensor 'odd'"):
            ckpt.load(tmp_path / "ckpt", into=_zeros_like(state), bounded_memory=True)


def test_staging_rows_cover_every_byte_of_a_chunk_once():
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 5000, 60)
    offsets = np.cumsum(np.concatenate(([0], sizes[:-1] + 64 - sizes[:-1] % 64)))
    zeros = np.append(offsets[1:] - (offsets[:-1] + sizes[:-1]), 0)
    source = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    addresses = source.ctypes.data + starts
    layout = np.zeros(int(offsets[-1] + sizes[-1]), np.uint8)
    for o, n, s in zip(offsets, sizes, starts, strict=True):
        layout[o:o + n] = source[s:s + n]
    slot = native.AlignedBuffer(4096)
    for _, start, length in chunks([(0, len(layout))], 4096):
        np.frombuffer(slot, np.uint8)[:] = 0xAB  # what an earlier chunk left there
        native.copy_from_addresses(slot, staging_rows(offsets, sizes, zeros, addresses, start, start + length))
        assert bytes(memoryview(slot)[:length]) == layout[start:start + length].tobytes()


def test_running_crcs_continue_across_chunks():
    data = np.random.default_rng(2).integers(0, 256, 100_000, dtype=np.uint8)
    ranges = [(0, 10), (10, 40_000), (40_064, 4096), (50_000, 50_000)]
    crcs = RunningCrcs(np.array([o for o, _ in ranges]), np.array([n for _, n in ranges]))
    for start in range(0, len(data), 3000):
        stop = min(start + 3000, len(data))
        crcs.add(data[start:stop].copy(), start, stop, 2)
    assert crcs.crcs == [native.crc32c(data[o:o + n].tobytes()) for o, n in ranges]
