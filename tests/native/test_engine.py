"""The C++ engine through its Python face: bytes on disk, O_DIRECT and its fallback, errors, the GIL."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ckptbench import native

MiB = 2**20


def filled(nbytes: int, seed: int = 7) -> native.AlignedBuffer:
    buf = native.AlignedBuffer(nbytes)
    native.fill_random(buf, seed)
    return buf


def test_aligned_buffer_is_aligned_and_exposes_its_memory():
    buf = native.AlignedBuffer(3 * 4096 + 5)
    assert buf.address % 4096 == 0
    assert len(buf) == buf.nbytes == 3 * 4096 + 5
    view = np.frombuffer(buf, dtype=np.uint8)
    assert view.size == len(buf) and not view.any()  # pre-faulted with zeros
    view[:4] = [1, 2, 3, 4]
    assert bytes(memoryview(buf)[:4]) == b"\x01\x02\x03\x04"  # same memory, no copy


def test_aligned_buffer_rejects_bad_arguments():
    with pytest.raises(ValueError):
        native.AlignedBuffer(0)
    with pytest.raises(ValueError):
        native.AlignedBuffer(4096, alignment=3000)


def test_fill_random_is_deterministic_and_seed_dependent():
    a, b, c = filled(MiB, 1), filled(MiB, 1), filled(MiB, 2)
    assert bytes(a) == bytes(b)
    assert bytes(a) != bytes(c)
    # incompressible enough: every byte value appears
    assert len(set(bytes(a)[:65536])) == 256


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("threads", [1, 3])
def test_write_then_read_round_trips(tmp_path: Path, direct: bool, threads: int):
    src = filled(5 * MiB + 4096)
    jobs = [(src, str(tmp_path / "a.bin"), 0), (memoryview(src)[:MiB], str(tmp_path / "b.bin"), 0)]
    w = native.write(jobs, threads=threads, block_size=MiB, direct=direct)
    assert w.bytes == 6 * MiB + 4096
    assert w.files == 2 and w.direct_used is direct and w.sync == "fdatasync"
    assert (tmp_path / "a.bin").read_bytes() == bytes(src)
    assert (tmp_path / "b.bin").read_bytes() == bytes(src)[:MiB]
    assert len(w.latencies_ns) == w.ops == 6 + 1  # 6 full blocks + the 4 KiB tail
    assert sum(t.bytes for t in w.threads) == w.bytes
    assert all(w.start_ns <= t.start_ns <= t.end_ns <= w.end_ns for t in w.threads)

    dst = native.AlignedBuffer(len(src))
    r = native.read([(dst, str(tmp_path / "a.bin"), 0)], threads=threads, block_size=MiB, direct=direct)
    assert r.bytes == len(src) and r.direct_used is direct
    assert bytes(dst) == bytes(src)


@pytest.mark.parametrize("op", ["write", "read"])
def test_per_file_schedule_gives_each_file_to_one_thread(tmp_path: Path, op: str):
    src = filled(4 * MiB)
    sizes = {"a": MiB, "b": 3 * MiB}
    jobs = [(memoryview(src)[:n], str(tmp_path / name), 0) for name, n in sizes.items()]
    result = native.write(jobs, threads=2, block_size=256 * 1024, schedule="per-file")
    if op == "read":
        dst = native.AlignedBuffer(4 * MiB)
        jobs = [(memoryview(dst)[:n], str(tmp_path / name), 0) for name, n in sizes.items()]
        result = native.read(jobs, threads=2, block_size=256 * 1024, schedule="per-file")
        assert bytes(dst)[:MiB] == bytes(src)[:MiB]
    assert result.bytes == 4 * MiB and result.ops == 16
    # a thread moved whole files only: 0, 1, 3 or 4 MiB
    assert {t.bytes for t in result.threads} <= {0, MiB, 3 * MiB, 4 * MiB}
    assert (tmp_path / "b").read_bytes() == bytes(src)[: 3 * MiB]
    with pytest.raises(ValueError, match="schedule"):
        native.write(jobs, schedule="random")


def test_unaligned_tail_and_offsets_with_direct(tmp_path: Path):
    """O_DIRECT needs alignment; an unaligned tail goes through a buffered descriptor."""
    src = filled(MiB + 123)
    path = str(tmp_path / "tail.bin")
    w = native.write([(src, path, 8192)], block_size=256 * 1024, direct=True)
    assert w.direct_used
    data = Path(path).read_bytes()
    assert data[:8192] == b"\0" * 8192 and data[8192:] == bytes(src)
    dst = native.AlignedBuffer(len(src))
    native.read([(dst, path, 8192)], direct=True)
    assert bytes(dst) == bytes(src)


def _ext4(path: Path) -> Path:
    from ckptbench.storage.local_target import mount_of

    mount = mount_of(path)
    if mount is None or mount.fstype != "ext4":
        pytest.skip(f"{path} is not on ext4 ({mount.fstype if mount else 'no mount found'})")
    return path


def test_preallocate_reserves_the_range_below_a_piece_on_ext4(tmp_path: Path):
    """A piece written beyond the file's end with ``preallocate``: the file is reserved from its old end
    to the piece's end (no hole below it for a neighbouring piece to allocate); without, only the piece."""
    where = _ext4(tmp_path)
    src = filled(2 * MiB)
    late = memoryview(src)[MiB:]
    for preallocate, allocated in ((True, 2 * MiB), (False, MiB)):
        path = where / f"piece-{preallocate}"
        w = native.write([(late, str(path), MiB)], threads=2, block_size=256 * 1024, direct=True, sync="none",
                         sync_dir=False, preallocate=preallocate)
        assert w.direct_used
        assert path.stat().st_size == 2 * MiB
        assert path.stat().st_blocks * 512 == allocated
    # The piece below is written into the reserved blocks; the file holds both pieces.
    path = where / "piece-True"
    native.write([(memoryview(src)[:MiB], str(path), 0)], threads=2, block_size=256 * 1024, direct=True,
                 preallocate=True)
    assert path.read_bytes() == bytes(src)


def test_preallocated_pieces_written_side_by_side_land_whole(tmp_path: Path):
    """Two calls writing pieces of one file at once (the staging ring's two writers), reserved first."""
    where = _ext4(tmp_path)
    src = filled(8 * MiB, seed=11)
    path = str(where / "shard")
    halves = [(memoryview(src)[:4 * MiB], 0), (memoryview(src)[4 * MiB:], 4 * MiB)]
    failures: list[BaseException] = []

    def write(view: memoryview, offset: int) -> None:
        try:
            native.write([(view, path, offset)], threads=2, block_size=MiB, direct=True, sync="none",
                         sync_dir=False, preallocate=True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    workers = [threading.Thread(target=write, args=half) for half in reversed(halves)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not failures
    assert Path(path).read_bytes() == bytes(src)


def test_preallocate_is_skipped_with_a_deadline_and_off_ext4(tmp_path: Path, mount_fs):
    """A write stopped by its deadline leaves no reserved blocks past what it wrote; off ext4 nothing is
    reserved either."""
    where = _ext4(tmp_path)
    src = filled(2 * MiB)
    path = where / "stopped"
    w = native.write([(src, str(path), 0)], block_size=256 * 1024, direct=True, preallocate=True,
                     deadline_ns=time.monotonic_ns() - 1)
    assert w.deadline_reached and w.bytes == 0
    assert path.stat().st_size == 0 and path.stat().st_blocks == 0
    tmpfs = mount_fs("tmpfs", "size=8m")
    late = memoryview(src)[MiB:]
    w = native.write([(late, str(tmpfs / "piece"), MiB)], direct=True, sync="none", sync_dir=False,
                     preallocate=True)
    if not w.direct_used:
        pytest.skip(f"tmpfs has no O_DIRECT on this kernel ({w.fallback_reason})")
    assert (tmpfs / "piece").stat().st_blocks * 512 == MiB


def _crc32c_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


LANES = 3 * 8192  # the hardware path's three-lane stride (csrc/checksum.cpp)


@pytest.mark.parametrize("nbytes", [0, 1, 7, 8, LANES - 1, LANES, LANES + 1, 2 * LANES + 13, 5 * LANES + 4097])
def test_crc32c_matches_a_bitwise_reference_around_the_lane_stride(nbytes: int):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    assert native.crc32c(data) == _crc32c_bitwise(data)
    assert native.crc32c(b"123456789") == 0xE3069283  # the Castagnoli check value
    # continued from a CRC: the lanes start from a register that is not the initial one
    assert native.crc32c(data[13:], native.crc32c(data[:13])) == native.crc32c(data)


def test_crc32c_of_a_large_buffer_is_the_crc_of_its_small_pieces_chained():
    """Pieces shorter than the lane stride take the one-chain path: both paths agree on 8 MiB."""
    buf = filled(8 * MiB, seed=5)
    view, crc = memoryview(buf), 0
    for start in range(0, len(buf), 4000):
        crc = native.crc32c(view[start:start + 4000], crc)
    assert native.crc32c(buf) == crc


def test_sync_none_and_fsync_are_recorded(tmp_path: Path):
    src = filled(MiB)
    assert native.write([(src, str(tmp_path / "x"), 0)], direct=False, sync="none").sync == "none"
    assert native.write([(src, str(tmp_path / "y"), 0)], direct=False, sync="fsync").sync == "fsync"
    with pytest.raises(ValueError, match="sync must be"):
        native.write([(src, str(tmp_path / "z"), 0)], sync="sometimes")


@pytest.mark.parametrize("direct", [True, False])
def test_a_write_through_given_descriptors_reaches_their_files_whatever_the_names_now_name(tmp_path: Path,
                                                                                         direct: bool):
    """With ``fds`` the engine writes each file through a reopening of its descriptor: a file put under
    the name after the caller opened it (a hard link, a rename) is left alone."""
    src = [filled(MiB + 512, seed=1), filled(2 * MiB, seed=2)]  # an unaligned tail: O_DIRECT and buffered
    names = [tmp_path / "a", tmp_path / "b"]
    fds = [os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644) for name in names]
    try:
        for name in names:  # each name now names another file, and the opened ones have none
            os.rename(name, tmp_path / f"{name.name}.opened")
            name.write_bytes(b"other")
        jobs = [(src[0], str(names[0]), 0), (src[1], str(names[1]), 0)]
        native.write(jobs, block_size=256 * 1024, direct=direct, fds=fds)
    finally:
        for fd in fds:
            os.close(fd)
    for name, buf in zip(names, src, strict=True):
        assert name.read_bytes() == b"other"
        assert (tmp_path / f"{name.name}.opened").read_bytes() == bytes(buf)


def test_given_descriptors_must_be_one_per_file_and_writable(tmp_path: Path):
    src = filled(4096)
    path = tmp_path / "f"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="2 descriptors given for 1 files"):
            native.write([(src, str(path), 0), (src, str(path), 4096)], fds=[fd, fd])
        with pytest.raises(ValueError, match="must be open for writing"):
            native.write([(src, str(path), 0)], fds=[fd])
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x"


def test_direct_falls_back_on_ramfs_and_records_it(mount_fs):
    """ramfs has no O_DIRECT: the engine writes buffered + fdatasync and says why."""
    where = mount_fs("ramfs")
    supported, reason = native.probe_direct(str(where))
    assert not supported and "O_DIRECT" in reason
    src = filled(2 * MiB)
    w = native.write([(src, str(where / "f"), 0)], direct=True, sync="none")
    assert w.direct_requested and not w.direct_used
    assert w.sync == "fdatasync"  # durability kept although the caller asked for no sync
    assert "O_DIRECT" in w.fallback_reason and str(where) in w.fallback_reason
    dst = native.AlignedBuffer(len(src))
    r = native.read([(dst, str(where / "f"), 0)], direct=True)
    assert not r.direct_used and r.fallback_reason
    assert bytes(dst) == bytes(src)


def test_missing_directory_is_file_not_found(tmp_path: Path):
    missing = tmp_path / "nope" / "f.bin"
    with pytest.raises(FileNotFoundError) as info:
        native.write([(filled(4096), str(missing), 0)], direct=False)
    assert info.value.errno == errno.ENOENT
    assert str(tmp_path / "nope") in info.value.filename


def test_path_under_a_file_is_not_a_directory(tmp_path: Path):
    (tmp_path / "plain").write_bytes(b"x")
    with pytest.raises(NotADirectoryError) as info:
        native.write([(filled(4096), str(tmp_path / "plain" / "f"), 0)], direct=False)
    assert info.value.errno == errno.ENOTDIR


def test_read_only_filesystem(mount_fs):
    where = mount_fs("tmpfs", "size=4m,ro")
    with pytest.raises(OSError) as info:
        native.write([(filled(4096), str(where / "f"), 0)], direct=False)
    assert info.value.errno == errno.EROFS


def test_enospc_on_a_tiny_tmpfs(mount_fs):
    where = mount_fs("tmpfs", "size=1m")
    with pytest.raises(OSError) as info:
        native.write([(filled(4 * MiB), str(where / "big"), 0)], threads=2, block_size=256 * 1024)
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(where / "big")


def test_read_of_a_short_file_fails_cleanly(tmp_path: Path):
    path = tmp_path / "short"
    path.write_bytes(b"\1" * 4096)
    with pytest.raises(OSError) as info:
        native.read([(native.AlignedBuffer(8192), str(path), 0)], direct=False)
    assert info.value.errno == errno.ENODATA


def test_read_needs_a_writable_buffer(tmp_path: Path):
    path = tmp_path / "f"
    path.write_bytes(b"\1" * 4096)
    with pytest.raises(BufferError):
        native.read([(bytes(4096), str(path), 0)], direct=False)


def test_metadata_bench_creates_every_file(tmp_path: Path):
    r = native.metadata_bench(str(tmp_path), 50, file_size=4096, threads=2, sync="fsync")
    assert r.ops == 50 and r.bytes == 50 * 4096 and len(r.latencies_ns) == 50
    assert sorted(os.listdir(tmp_path)) == sorted(f"md-{i}" for i in range(50))
    with pytest.raises(FileExistsError):  # O_EXCL: never overwrites what is there
        native.metadata_bench(str(tmp_path), 1)


def test_memcpy_bandwidth_is_a_rate():
    assert native.memcpy_bandwidth(8 * MiB, 2) > 1e8


def test_copy_bandwidth_copies_between_caller_buffers():
    src, dst = filled(4 * MiB), native.AlignedBuffer(4 * MiB)
    assert native.copy_bandwidth(dst, src, 2) > 1e8
    assert bytes(dst) == bytes(src)
    with pytest.raises(BufferError):
        native.copy_bandwidth(bytes(16), src)


def test_control_cancels_before_any_work(tmp_path: Path):
    control = native.Control()
    control.cancel()
    r = native.write([(filled(4 * MiB), str(tmp_path / "f"), 0)], block_size=MiB, control=control)
    assert r.cancelled and r.bytes == 0 and control.bytes_done == 0


def test_control_reports_progress(tmp_path: Path):
    control = native.Control()
    r = native.write([(filled(4 * MiB), str(tmp_path / "f"), 0)], block_size=MiB, control=control)
    assert not r.cancelled and control.bytes_done == r.bytes == 4 * MiB


def test_gil_is_released_during_a_write(tmp_path: Path):
    """A Python thread keeps running while the engine writes: its ticks land inside the call's window."""
    src = filled(32 * MiB)
    ticks: list[int] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic_ns())  # CLOCK_MONOTONIC, the engine's clock

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        # Many small synced writes: long enough to span several GIL switch intervals.
        jobs = [(memoryview(src)[i * MiB:(i + 1) * MiB], str(tmp_path / f"f{i}"), 0) for i in range(32)]
        result = native.write(jobs, threads=1, block_size=64 * 1024, direct=False, sync="fsync")
    finally:
        stop.set()
        thread.join()
    inside = [t for t in ticks if result.start_ns < t < result.end_ns]
    assert len(inside) > 100, f"only {len(inside)} Python ticks during a {result.seconds:.3f} s write"


def test_run_interruptible_passes_results_and_errors(tmp_path: Path):
    seen: list[int] = []
    r = native.run_interruptible(
        native.write, [(filled(2 * MiB), str(tmp_path / "f"), 0)], block_size=MiB, on_progress=seen.append
    )
    assert r.bytes == 2 * MiB
    with pytest.raises(FileNotFoundError):
        native.run_interruptible(native.write, [(filled(4096), str(tmp_path / "no" / "f"), 0)], direct=False)


@pytest.mark.parametrize("threads", [1, 3])
def test_copy_from_addresses_is_exact_at_any_alignment_and_size(threads: int):
    """Small copies (memcpy), large ones (streaming stores, across 8 MiB pieces), every misalignment of
    source and destination, odd tails: the destination holds exactly the source bytes, nothing else moves."""
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, size=40 * 2**20, dtype=np.uint8)
    dst = native.AlignedBuffer(40 * 2**20)
    view = np.frombuffer(dst, dtype=np.uint8)
    view[:] = 0xAB
    jobs, cursor = [], 0
    for size in (1, 63, 4096, 256 * 1024 - 1, 256 * 1024, 256 * 1024 + 17, 3 * 2**20 + 5, 9 * 2**20 + 3):
        for misalign in (0, 1, 7, 15):
            if cursor + misalign + size > len(view):
                break
            src_offset = (cursor * 3 + misalign * 5) % (len(src) - size)
            jobs.append((src.ctypes.data + src_offset, cursor + misalign, size, src_offset))
            cursor += misalign + size + 3
    assert cursor < len(view)
    native.copy_from_addresses(dst, [(a, o, n) for a, o, n, _ in jobs], threads)
    expected = np.full(len(view), 0xAB, dtype=np.uint8)
    for _, offset, size, src_offset in jobs:
        expected[offset:offset + size] = src[src_offset:src_offset + size]
    assert np.array_equal(view, expected)


def test_copy_from_addresses_takes_an_int64_table():
    src = native.AlignedBuffer(4096)
    native.fill_random(src, 7)
    dst = bytearray(100)
    base = src.address
    table = np.array([[base + 10, 0, 30], [base, 50, 50], [base + 99, 30, 0]], np.int64)
    native.copy_from_addresses(dst, table, 2)
    raw = bytes(memoryview(src)[:100])
    assert dst[:30] == raw[10:40] and dst[50:] == raw[:50] and dst[30:50] == bytes(20)
    with pytest.raises(IndexError, match="outside the destination"):
        native.copy_from_addresses(dst, np.array([[base, 90, 20]], np.int64))
    for bad in (np.array([[1, 2, 3]], np.int32), np.array([[1.0, 2.0, 3.0]]), np.array([[1, 2, 3]], np.uint64),
                np.array([[1, 2, 3]], ">i8"), np.zeros((3, 2), np.int64), np.zeros((3, 5), np.int64), np.zeros(6, np.int64)):
        with pytest.raises(ValueError, match="int64"):
            native.copy_from_addresses(dst, bad)
    with pytest.raises(ValueError, match="negative"):
        native.copy_from_addresses(dst, np.array([[base, -1, 2]], np.int64))


@pytest.mark.parametrize("threads", [1, 3])
def test_copy_from_addresses_zeroes_after_each_copy_when_asked(threads: int):
    """A fourth column zeroes that many bytes right after the copy (also with no copy at all, address 0),
    across the 8 MiB pieces of a large copy and among thousands of tiny ones batched together."""
    rng = np.random.default_rng(3)
    src = rng.integers(1, 256, size=12 * 2**20, dtype=np.uint8)  # no zero bytes
    dst = native.AlignedBuffer(32 * 2**20)
    view = np.frombuffer(dst, dtype=np.uint8)
    view[:] = 0xAB
    rows, cursor = [], 0
    for i in range(3000):
        size, zeros = int(rng.integers(1, 200)), int(rng.integers(0, 64))
        rows.append((src.ctypes.data + i, cursor, size, zeros))
        cursor += size + zeros + int(rng.integers(0, 3))
    rows.append((src.ctypes.data, cursor, 9 * 2**20 + 5, 4095))
    cursor += 9 * 2**20 + 5 + 4095 + 1
    rows.append((0, cursor, 0, 100))
    cursor += 100
    assert cursor < len(view)
    native.copy_from_addresses(dst, np.array(rows, np.int64), threads)
    expected = np.full(len(view), 0xAB, dtype=np.uint8)
    for address, offset, size, zeros in rows:
        start = address - src.ctypes.data if address else 0
        expected[offset:offset + size] = src[start:start + size]
        expected[offset + size:offset + size + zeros] = 0
    assert np.array_equal(view, expected)
    with pytest.raises(IndexError, match="zeros"):
        native.copy_from_addresses(bytearray(100), np.array([[0, 90, 0, 20]], np.int64))
    with pytest.raises(ValueError, match="negative"):
        native.copy_from_addresses(bytearray(100), np.array([[0, 0, 0, -1]], np.int64))
