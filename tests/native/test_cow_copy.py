"""The engine's copy-on-write CowCopy: the copy is what the sources held when it returned, whatever
is written to them afterwards, by any thread or by the kernel; memory freed under it is an error."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from ckptbench import native

pytestmark = pytest.mark.skipif(bool(native.cow_unavailable()),
                                reason=f"no copy-on-write copies here: {native.cow_unavailable()}")

MiB = 2**20
PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def jobs_for(arrays: list[np.ndarray], pad: int = 0) -> tuple[np.ndarray, int]:
    """(address, offset, nbytes, zeros after) rows placing ``arrays`` one after another, page-aligned."""
    rows, offset = [], 0
    for a in arrays:
        rows.append((a.ctypes.data, offset, a.nbytes, pad))
        offset = -(-(offset + a.nbytes + pad) // PAGE) * PAGE
    return np.array(rows, np.int64), offset


def copied(dst: native.AlignedBuffer, table: np.ndarray, index: int) -> bytes:
    _, offset, nbytes, _ = table[index].tolist()
    return bytes(memoryview(dst)[offset:offset + nbytes])


def raw_mapping(nbytes: int) -> int:
    """An anonymous private mapping of our own (munmap-able under the cow_copy), filled with a pattern."""
    address = libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert address not in (None, ctypes.c_void_p(-1).value)
    ctypes.memset(address, 0x5A, nbytes)
    return address


@pytest.mark.parametrize("threads", [1, 3])
def test_the_copy_is_the_sources_as_they_were_when_it_returned(threads: int):
    rng = np.random.default_rng(1)
    big = rng.integers(0, 255, 24 * MiB + 123, dtype=np.uint8)
    odd = rng.integers(0, 255, 7 * MiB, dtype=np.uint8)[5:-3]  # unaligned start and end
    small = [rng.integers(0, 255, n, dtype=np.uint8) for n in (1, 7, 100, 4095, 4096, 4097, 70_000)]
    untouched = np.ndarray(3 * MiB, np.uint8, buffer=mmap.mmap(-1, 3 * MiB, flags=mmap.MAP_PRIVATE))  # no page yet
    arrays = [big, odd, *small, untouched]
    before = [a.tobytes() for a in arrays]
    table, total = jobs_for(arrays)
    dst = native.AlignedBuffer(total)

    snap = native.CowCopy(dst, table, threads, chunk_bytes=64 * 1024, min_region_bytes=0)  # small ones too
    for a in arrays:  # right away, before the copiers get there: every write waits for its chunk
        a[:] = 0xEE
    snap.finish()

    for i, expected in enumerate(before):
        assert copied(dst, table, i) == expected, f"array {i}"
    assert all((a == 0xEE).all() for a in arrays)  # the writes went through
    stats = snap.stats()  # (whether the writes overtook the copiers is up to the scheduler: faults may be 0)
    assert stats["copied_at_start"] == 0
    assert stats["protected_bytes"] >= sum(a.nbytes for a in arrays)
    assert snap.done


def test_writes_from_many_threads_and_from_the_kernel_see_the_old_bytes_in_the_copy(tmp_path):
    rng = np.random.default_rng(2)
    src = rng.integers(0, 255, 32 * MiB, dtype=np.uint8)
    before = src.tobytes()
    incoming = tmp_path / "incoming"
    incoming.write_bytes(b"\xab" * MiB)
    table, total = jobs_for([src])
    dst = native.AlignedBuffer(total)

    snap = native.CowCopy(dst, table, 1, chunk_bytes=PAGE)

    def scribble(seed: int) -> None:
        r = np.random.default_rng(seed)
        for at in r.integers(0, src.size - MiB - 64, 500):  # the last MiB is read(2)'s
            src[at:at + 64] = seed

    writers = [threading.Thread(target=scribble, args=(s,)) for s in range(1, 5)]
    for w in writers:
        w.start()
    with open(incoming, "rb", buffering=0) as f:  # read(2) writes into protected pages inside the kernel
        assert f.readinto(memoryview(src)[-MiB:]) == MiB
    for w in writers:
        w.join()
    snap.finish()

    assert copied(dst, table, 0) == before
    assert src[-MiB:].tobytes() == b"\xab" * MiB
    assert snap.stats()["faults"] >= 1


def test_padding_after_each_copy_is_zeroed():
    a, b = np.full(5000, 3, np.uint8), np.full(100, 4, np.uint8)
    table, total = jobs_for([a, b], pad=300)
    dst = native.AlignedBuffer(total)
    np.frombuffer(dst, np.uint8)[:] = 0xFF
    native.CowCopy(dst, table, 2).finish()
    flat = np.frombuffer(dst, np.uint8)
    assert (flat[:5000] == 3).all() and not flat[5000:5300].any()
    offset = int(table[1, 1])
    assert (flat[offset:offset + 100] == 4).all() and not flat[offset + 100:offset + 400].any()


def test_memory_it_cannot_protect_is_copied_before_it_returns():
    shared = mmap.mmap(-1, 2 * MiB, flags=mmap.MAP_SHARED)  # shared memory: other processes could write it
    src = np.frombuffer(shared, np.uint8)
    src[:] = 9
    table, total = jobs_for([src])
    dst = native.AlignedBuffer(total)
    snap = native.CowCopy(dst, table, 2)
    assert snap.stats()["copied_at_start"] == 2 * MiB and snap.stats()["protected_bytes"] == 0
    src[:] = 1
    snap.finish()
    assert (np.frombuffer(dst, np.uint8)[:2 * MiB] == 9).all()
    del src
    shared.close()


@pytest.mark.parametrize("how", ["munmap", "madvise"])
def test_memory_freed_under_it_fails_finish_instead_of_a_torn_copy(how: str):
    nbytes = 256 * MiB  # one copier in 4 KiB chunks takes tens of ms: the free comes first
    address = raw_mapping(nbytes)
    table = np.array([(address, 0, nbytes, 0)], np.int64)
    dst = native.AlignedBuffer(nbytes)
    snap = native.CowCopy(dst, table, 1, chunk_bytes=PAGE)
    if how == "munmap":
        assert libc.munmap(address, nbytes) == 0
    else:
        assert libc.madvise(address, nbytes, 4) == 0  # MADV_DONTNEED
    with pytest.raises(RuntimeError, match="unmapped|released|could not read"):
        snap.finish()
    with pytest.raises(RuntimeError):  # stays failed
        snap.finish()
    if how == "madvise":
        libc.munmap(address, nbytes)


def test_memory_freed_after_it_was_copied_is_no_error():
    nbytes = 4 * MiB
    address = raw_mapping(nbytes)
    table = np.array([(address, 0, nbytes, 0)], np.int64)
    dst = native.AlignedBuffer(nbytes)
    snap = native.CowCopy(dst, table, 2)
    snap.finish()
    assert libc.munmap(address, nbytes) == 0
    snap.finish()
    assert bytes(memoryview(dst)[:16]) == b"\x5a" * 16


def test_the_sources_are_writable_and_unprotected_after_finish(tmp_path):
    src = np.zeros(8 * MiB, np.uint8)
    table, total = jobs_for([src])
    dst = native.AlignedBuffer(total)
    native.CowCopy(dst, table, 2).finish()
    # No protection left: the kernel writes into it without a fault thread (there is none now).
    path = tmp_path / "f"
    path.write_bytes(b"\x01" * MiB)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.readv(fd, [memoryview(src)[:MiB]]) == MiB
    finally:
        os.close(fd)
    assert (src[:MiB] == 1).all()
    # And it can be copied on write again (nothing left registered).
    native.CowCopy(dst, table, 1).finish()
    assert bytes(memoryview(dst)[:4]) == b"\x01" * 4


def test_bad_jobs_are_refused_before_anything_is_protected():
    src = np.zeros(100, np.uint8)
    with pytest.raises(IndexError, match="outside the destination"):
        native.CowCopy(bytearray(50), np.array([(src.ctypes.data, 0, 100, 0)], np.int64))
    with pytest.raises(ValueError, match="null"):
        native.CowCopy(bytearray(50), np.array([(0, 0, 10, 0)], np.int64))
    src[:] = 1  # not protected


def test_a_write_after_a_cow_copy_writes_each_block_once_it_is_copied(tmp_path):
    rng = np.random.default_rng(3)
    src = rng.integers(0, 255, 48 * MiB, dtype=np.uint8)
    before = src.tobytes()
    table, total = jobs_for([src])
    dst = native.AlignedBuffer(total)
    # One copier in 4 KiB chunks, a write into memory (tmpfs where there is one): the write would
    # overtake the copy if it did not wait for it.
    where = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    path = where / f"ckptbench-test-{os.getpid()}"
    snap = native.CowCopy(dst, table, 1, chunk_bytes=PAGE)  # dst is all zeros until copied
    try:
        native.write([(dst, str(path), 0)], threads=2, block_size=MiB, direct=False, sync="none", after=snap)
        snap.finish()
        assert path.read_bytes()[:src.nbytes] == before
    finally:
        path.unlink(missing_ok=True)


def test_a_forked_child_writes_freely_and_leaves_the_parents_cow_copy_alone():
    src = np.ones(16 * MiB, np.uint8)
    table, total = jobs_for([src])
    dst = native.AlignedBuffer(total)
    snap = native.CowCopy(dst, table, 1, chunk_bytes=PAGE)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            src[:] = 3  # no protection in the child, and no fault thread to wait for
            try:
                snap.finish()  # the cow_copy is the parent's: the child's copy of it is partial
            except RuntimeError as exc:
                code = 0 if "forked" in str(exc) and (src == 3).all() else 2
            del snap
        finally:
            os._exit(code)
    src[:] = 2
    _, status = os.waitpid(pid, 0)
    snap.finish()
    assert os.waitstatus_to_exitcode(status) == 0
    assert (np.frombuffer(dst, np.uint8)[:src.nbytes] == 1).all() and (src == 2).all()


def test_a_forked_child_leaves_alone_the_descriptors_a_finished_cow_copy_closed():
    src = np.ones(MiB, np.uint8)
    table, total = jobs_for([src])
    snap = native.CowCopy(native.AlignedBuffer(total), table, 1)
    snap.finish()  # closes its descriptors: the next ones opened take their numbers
    r, w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            code = 1
            try:
                del snap  # its copy of the cow_copy goes
                os.write(w, b"x")
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and os.read(r, 1) == b"x"
    finally:
        os.close(r)
        os.close(w)


def test_small_scattered_regions_are_copied_at_once_and_the_regions_are_capped():
    arr = np.random.default_rng(4).integers(0, 255, 20 * MiB, dtype=np.uint8)
    pieces = [arr[i * 2 * MiB:i * 2 * MiB + MiB] for i in range(10)]  # ten regions with gaps between them
    crumbs = [arr[i * 2 * MiB + MiB + 8192:i * 2 * MiB + MiB + 16384] for i in range(10)]  # 8 KiB each, apart
    table, total = jobs_for(pieces + crumbs)
    before = [a.tobytes() for a in pieces + crumbs]

    dst = native.AlignedBuffer(total)
    snap = native.CowCopy(dst, table, 2, max_regions=3)
    stats = snap.stats()
    assert stats["regions"] == 3 and 3 * MiB <= stats["protected_bytes"] <= 3 * (MiB + PAGE)  # 3 of the 1 MiB
    assert stats["copied_at_start"] == 7 * MiB + 10 * 8192  # the rest, and every crumb (< 256 KiB)
    arr[:] = 0
    snap.finish()
    assert [copied(dst, table, i) for i in range(20)] == before

    snap = native.CowCopy(dst, table, 2, min_region_bytes=0)
    assert snap.stats()["regions"] == 20 and snap.stats()["copied_at_start"] == 0
    snap.finish()
