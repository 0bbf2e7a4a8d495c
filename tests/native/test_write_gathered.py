"""The engine's gathered write (``native.write_gathered``): files written from many places in memory, zeros
between them, CRC-32C of ranges on the way; and ``crc32c`` pieces combined (what the ranges rely on)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from ckptbench import native


def _data(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _layout(pool: np.ndarray, pieces: list[tuple[int, int, int]]) -> tuple[np.ndarray, bytes]:
    """Segments taking (start in ``pool``, offset in the file, nbytes), and the bytes the file must hold."""
    table = np.array([[pool.ctypes.data + start, offset, n] for start, offset, n in pieces], np.int64).reshape(-1, 3)
    size = max((offset + n for _, offset, n in pieces), default=0)
    expected = bytearray(size)
    for start, offset, n in pieces:
        expected[offset:offset + n] = pool[start:start + n].tobytes()
    return table, bytes(expected)


# Odd sizes and unaligned sources (pool starts 1, 3, 4099 ...), gaps of zeros, a piece at offset 0 and
# one that ends the file.
PIECES = [(1, 0, 5), (3, 64, 4097), (4099, 8192, 300_001), (310_000, 308_224, 17), (400_001, 308_300, 65_536)]


@pytest.mark.parametrize("block_size", [4096, 5000, 1 << 20])
@pytest.mark.parametrize("schedule", ["shared", "per-file"])
@pytest.mark.parametrize("threads", [1, 3])
def test_files_hold_the_segments_and_zeros_between_and_the_crcs_match(tmp_path: Path, block_size, schedule,
                                                                        threads):
    pool = _data(500_000, seed=1)
    table, expected = _layout(pool, PIECES)
    other_table, other_expected = _layout(pool, [(7, 100, 9000)])  # starts after a gap: zeros first
    # Ranges inside one segment each, cut by the blocks in several places: a whole segment, a part, one byte.
    ranges = np.array([[0, 8192, 300_001], [0, 8192 + 4000, 100_000], [0, 64, 4097], [1, 100, 9000],
                       [0, 308_240, 1], [0, 0, 5]], np.int64)
    result, crcs = native.write_gathered([(str(tmp_path / "a"), table, len(expected)),
                                          (str(tmp_path / "b"), other_table, len(other_expected))],
                                         ranges, threads=threads, block_size=block_size, schedule=schedule)
    assert (tmp_path / "a").read_bytes() == expected
    assert (tmp_path / "b").read_bytes() == other_expected
    files = [expected, other_expected]
    assert crcs == [native.crc32c(files[f][o:o + n]) for f, o, n in ranges.tolist()]
    assert result.bytes == len(expected) + len(other_expected) and result.files == 2
    assert result.sync == "fdatasync" and not result.direct_used


def test_a_gap_longer_than_the_zero_buffer_and_an_empty_file(tmp_path: Path):
    pool = _data(1000, seed=2)
    table, expected = _layout(pool, [(0, 0, 10), (10, 300_000, 990)])
    empty = np.zeros((0, 3), np.int64)
    _, crcs = native.write_gathered([(str(tmp_path / "gap"), table, len(expected)),
                                     (str(tmp_path / "empty"), empty, 0),
                                     (str(tmp_path / "zeros"), empty, 70_000)], empty, threads=2, block_size=1 << 20)
    assert (tmp_path / "gap").read_bytes() == expected
    assert (tmp_path / "empty").read_bytes() == b""
    assert (tmp_path / "zeros").read_bytes() == bytes(70_000)
    assert crcs == []


def test_more_segments_in_a_block_than_one_pwritev_takes(tmp_path: Path):
    pool = _data(3000 * 7, seed=3)
    pieces = [(7 * i, 64 * i, 7) for i in range(3000)]  # 3000 segments and 3000 gaps in one block
    table, expected = _layout(pool, pieces)
    ranges = np.array([[0, 64 * i, 7] for i in range(0, 3000, 97)], np.int64)
    _, crcs = native.write_gathered([(str(tmp_path / "many"), table, len(expected))], ranges, block_size=1 << 20)
    assert (tmp_path / "many").read_bytes() == expected
    assert crcs == [native.crc32c(expected[o:o + n]) for _, o, n in ranges.tolist()]


@pytest.mark.parametrize(("rows", "size", "match"), [
    ([(0, 100, 10), (0, 105, 10)], 200, "sorted by offset, not overlap"),
    ([(0, 100, 10), (0, 50, 10)], 200, "sorted by offset, not overlap"),
    ([(0, 195, 10)], 200, "inside the file"),
])
def test_segments_that_overlap_or_leave_the_file_are_refused(tmp_path: Path, rows, size, match):
    pool = _data(100, seed=4)
    table = np.array([[pool.ctypes.data + s, o, n] for s, o, n in rows], np.int64)
    with pytest.raises(ValueError, match=match):
        native.write_gathered([(str(tmp_path / "x"), table, size)], np.zeros((0, 3), np.int64))
    assert not (tmp_path / "x").exists()  # refused before anything was opened


@pytest.mark.parametrize(("ranges", "match"), [
    ([[0, 5, 20]], "does not lie inside one segment"),  # across the gap between two segments
    ([[0, 40, 1]], "does not lie inside one segment"),  # in the gap
    ([[1, 0, 1]], "names a file not written"),
])
def test_checksum_ranges_must_lie_inside_one_segment(tmp_path: Path, ranges, match):
    pool = _data(100, seed=5)
    table = np.array([[pool.ctypes.data, 0, 10], [pool.ctypes.data + 10, 64, 10]], np.int64)
    with pytest.raises(ValueError, match=match):
        native.write_gathered([(str(tmp_path / "x"), table, 74)], np.array(ranges, np.int64))


def test_bad_tables_and_a_null_source_are_refused(tmp_path: Path):
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        native.write_gathered([(str(tmp_path / "x"), np.zeros((1, 4), np.int64), 10)], np.zeros((0, 3), np.int64))
    with pytest.raises(ValueError, match="null"):
        native.write_gathered([(str(tmp_path / "x"), np.array([[0, 0, 10]], np.int64), 10)],
                              np.zeros((0, 3), np.int64))
    with pytest.raises(ValueError, match="twice"):
        native.write_gathered([(str(tmp_path / "x"), np.zeros((0, 3), np.int64), 0)] * 2, np.zeros((0, 3), np.int64))


@pytest.mark.parametrize("threads", [1, 2])
def test_files_are_written_through_the_descriptors_given_which_stay_open(tmp_path: Path, threads):
    # The paths name files that are never opened: the bytes land in the descriptors' files only.
    pool = _data(500_000, seed=9)
    table, expected = _layout(pool, PIECES[:3])
    other, other_expected = _layout(pool, [(7, 100, 9000)])
    held = [tmp_path / "held-a", tmp_path / "held-b"]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT, 0o644) for p in held]
    try:
        _, crcs = native.write_gathered([(str(tmp_path / "named-a"), table, len(expected)),
                                         (str(tmp_path / "named-b"), other, len(other_expected))],
                                        np.array([[0, 8192, 1000], [1, 100, 9000]], np.int64), threads=threads,
                                        block_size=64 << 10, fds=fds)
        for fd in fds:
            os.fstat(fd)  # still open: the caller closes them
    finally:
        for fd in fds:
            os.close(fd)
    assert held[0].read_bytes() == expected and held[1].read_bytes() == other_expected
    assert not (tmp_path / "named-a").exists() and not (tmp_path / "named-b").exists()
    assert crcs == [native.crc32c(expected[8192:9192]), native.crc32c(other_expected[100:9100])]


@pytest.mark.parametrize("flags", [os.O_RDONLY, os.O_WRONLY | os.O_APPEND])
def test_a_descriptor_that_cannot_take_the_writes_is_refused(tmp_path: Path, flags):
    pool = _data(10, seed=10)
    (tmp_path / "x").write_bytes(b"")
    fd = os.open(tmp_path / "x", flags)
    try:
        with pytest.raises(ValueError, match="must be open for writing"):
            native.write_gathered([(str(tmp_path / "x"), np.array([[pool.ctypes.data, 0, 10]], np.int64), 10)],
                                  np.zeros((0, 3), np.int64), fds=[fd])
        os.fstat(fd)
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="one descriptor per file"):
        native.write_gathered([(str(tmp_path / "x"), np.zeros((0, 3), np.int64), 0)], np.zeros((0, 3), np.int64),
                              fds=[1, 2])


def test_a_missing_directory_is_file_not_found(tmp_path: Path):
    pool = _data(10, seed=6)
    with pytest.raises(FileNotFoundError) as failure:
        native.write_gathered([(str(tmp_path / "no" / "x"), np.array([[pool.ctypes.data, 0, 10]], np.int64), 10)],
                              np.zeros((0, 3), np.int64))
    assert failure.value.errno == errno.ENOENT


def test_enospc_on_a_tiny_tmpfs(mount_fs):
    where = mount_fs("tmpfs", "size=1m")
    pool = _data(2 << 20, seed=7)
    with pytest.raises(OSError) as failure:
        native.write_gathered([(str(where / "big"), np.array([[pool.ctypes.data, 0, pool.nbytes]], np.int64),
                                pool.nbytes)], np.zeros((0, 3), np.int64))
    assert failure.value.errno == errno.ENOSPC


@pytest.mark.parametrize("cut", [0, 1, 7, 8, 4096, 99_999, 100_000])
def test_crc32c_of_pieces_is_the_crc_of_the_whole(tmp_path: Path, cut):
    # A range cut by blocks: its parts' CRCs are combined into the CRC of the whole range.
    pool = _data(100_000, seed=8)
    table = np.array([[pool.ctypes.data, 0, pool.nbytes]], np.int64)
    for block_size in ([cut] if cut else []) + [3, 4096 + 1]:
        _, crcs = native.write_gathered([(str(tmp_path / "x"), table, pool.nbytes)],
                                        np.array([[0, 0, pool.nbytes], [0, cut, pool.nbytes - cut]], np.int64),
                                        block_size=block_size)
        assert crcs == [native.crc32c(pool), native.crc32c(pool[cut:])]
        (tmp_path / "x").unlink()
