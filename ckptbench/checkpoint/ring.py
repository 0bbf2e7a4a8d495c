"""A bounded staging ring: a few aligned host buffers (slots) that a sync save's bytes pass through on
their way to the shard files, and an ``into=`` load's bytes on their way back, instead of one host
buffer the size of the checkpoint.

A save through the ring cuts every shard into slot-sized chunks (each starts at a multiple of the slot
size inside its file, so O_DIRECT offsets stay aligned), and pipelines them:

1. stage   - the engine copies the chunk's pieces of the tensors (and the zeros of its padding) into
             a free slot (``native.copy_from_addresses``, N threads, no GIL)
2. write   - the engine writes the slot at the chunk's offset in its shard file, no sync
             (``Store.pieces``); meanwhile the next chunk is staged into the next slot. Two chunks
             are written at once, each by half the threads (an even count), so the device is not
             left idle while one chunk's last blocks finish. The first chunk and the last two
             are staged and written in pieces of a block per writing thread: the first write starts
             once its piece is staged, and the last chunks' pieces go to whichever writer is free
3. check   - the CRC-32C of every checksum range's piece in the slot, beside the write; a range cut by
             a chunk boundary continues from its partial CRC (:class:`RunningCrcs`)

A slot is staged again only when both its write and its checksums are done. Once every chunk is
written, every shard is fdatasynced and the directory fsynced (``PieceWriter.finish``): durable as a
write from the whole arena is. The host memory it holds is ``slots x slot_bytes``
(``knobs.STAGE_RING_SLOTS`` x ``knobs.STAGE_RING_SLOT_BYTES``), whatever the checkpoint's size.

A load through the ring (``load(into=..., bounded_memory=True)``) reads each chunk of each shard into a
slot (the next one read while this one is checked), checks its CRC-32C pieces and copies its tensors'
pieces into the ``into=`` tensors.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from ckptbench import knobs, native
from ckptbench.checkpoint.host_memory import available_memory_bytes
from ckptbench.errors import InsufficientMemoryError
from ckptbench.interrupts import Workers
from ckptbench.units import format_size

log = logging.getLogger(__name__)


def ring_bytes() -> int:
    """The host memory of a ring: ``knobs.STAGE_RING_SLOTS x knobs.STAGE_RING_SLOT_BYTES``."""
    return max(1, knobs.STAGE_RING_SLOTS) * _slot_bytes()


def _slot_bytes() -> int:
    align = knobs.ALIGNMENT_BYTES
    return max(align, knobs.STAGE_RING_SLOT_BYTES // align * align)


class Ring:
    """The slots of a Checkpointer's ring, allocated (and touched) on first use and kept until closed.
    ``lock`` is held by the save or load passing through it."""

    def __init__(self) -> None:
        self._slots: list[native.AlignedBuffer] = []
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return sum(len(s) for s in self._slots)

    def slots(self) -> list[native.AlignedBuffer]:
        """The slots, allocated now if not yet (or if the knobs changed their size)."""
        count, size = max(1, knobs.STAGE_RING_SLOTS), _slot_bytes()
        if len(self._slots) == count and all(len(s) == size for s in self._slots):
            return self._slots
        self.close()
        available = available_memory_bytes()
        if available is not None and count * size > available:
            raise InsufficientMemoryError(
                f"the staging ring needs {format_size(count * size)} of host memory but only "
                f"{format_size(available)} is available",
                hint="free memory, or lower CKPTBENCH_STAGE_RING_SLOTS / CKPTBENCH_STAGE_RING_SLOT_BYTES")
        log.info("allocating a staging ring of %d x %s (touched once, reused)", count, format_size(size))
        self._slots = [native.AlignedBuffer(size) for _ in range(count)]
        return self._slots

    def close(self) -> None:
        self._slots = []


def chunks(extents: list[tuple[int, int]], slot_bytes: int) -> list[tuple[int, int, int]]:
    """(extent index, start inside the extent, length) of every slot-sized chunk of each (start, nbytes)
    extent (a shard), in order; every chunk but an extent's last is ``slot_bytes`` long."""
    out = []
    for index, (_, nbytes) in enumerate(extents):
        out.extend((index, start, min(slot_bytes, nbytes - start)) for start in range(0, nbytes, slot_bytes))
    return out


def staging_rows(offsets: np.ndarray, nbytes: np.ndarray, zeros: np.ndarray, addresses: np.ndarray,
                 start: int, stop: int) -> np.ndarray:
    """The ``copy_from_addresses`` rows (source address, slot offset, nbytes, zeros after) that fill a
    slot with the bytes ``[start, stop)`` of the arena layout: the pieces of the tensors there (tensor k
    at ``offsets[k]``, ``nbytes[k]`` long, from ``addresses[k]``, sorted by offset) and of the padding
    after each (``zeros[k]`` bytes). Every byte of the range belongs to one tensor or its padding."""
    ends = offsets + nbytes
    first = int(np.searchsorted(ends + zeros, start, side="right"))
    last = int(np.searchsorted(offsets, stop, side="left"))
    off, end, pad, addr = offsets[first:last], ends[first:last], zeros[first:last], addresses[first:last]
    copy_from, copy_to = np.maximum(off, start), np.minimum(end, stop)
    n = np.maximum(copy_to - copy_from, 0)
    zero_from = np.maximum(end, start)
    z = np.maximum(np.minimum(end + pad, stop) - zero_from, 0)
    src = np.where(n > 0, addr + (copy_from - off), 0)
    dst = np.where(n > 0, copy_from, zero_from) - start
    return np.ascontiguousarray(np.column_stack((src, dst, n, z)), dtype=np.int64)


class RunningCrcs:
    """CRC-32C of byte ranges (offset, nbytes) of a layout whose bytes pass through a buffer chunk by
    chunk in order: :meth:`add` each chunk; a range cut by a chunk boundary continues from its partial
    CRC. :attr:`crcs` is one CRC per range, in the order given, once every chunk was added."""

    def __init__(self, offsets: np.ndarray, nbytes: np.ndarray) -> None:
        self._order = np.argsort(offsets, kind="stable")
        self._start = np.asarray(offsets, np.int64)[self._order]
        self._end = self._start + np.asarray(nbytes, np.int64)[self._order]
        self._crcs = np.zeros(len(self._order), np.int64)

    def add(self, buffer: Any, start: int, stop: int, threads: int) -> None:
        """The bytes ``[start, stop)`` of the layout, at ``buffer[0 : stop - start]``."""
        first = int(np.searchsorted(self._end, start, side="right"))
        last = int(np.searchsorted(self._start, stop, side="left"))
        if first >= last:
            return
        if self._start[first] < start:  # continues a range begun in an earlier chunk
            piece_end = int(min(self._end[first], stop))
            self._crcs[first] = native.crc32c(memoryview(buffer)[:piece_end - start], int(self._crcs[first]))
            first += 1
        if first < last:
            begin = self._start[first:last] - start
            length = np.minimum(self._end[first:last], stop) - self._start[first:last]
            self._crcs[first:last] = native.crc32c_ranges(buffer, list(zip(begin.tolist(), length.tolist(),
                                                                            strict=True)), threads)

    @property
    def crcs(self) -> list[int]:
        out = np.empty_like(self._crcs)
        out[self._order] = self._crcs
        return out.tolist()


class Pipeline:
    """The ring's slots cycled: :meth:`slot` waits until slot ``k % slots`` is free (its earlier jobs
    done, raising their error), :meth:`submit` queues a chunk's job of a kind (on that kind's threads,
    ``threads[kind]`` or one: a kind on one thread runs its jobs in chunk order), :meth:`join` waits
    for all. Used as a context manager: leaving by an error waits for the jobs started (nothing
    touches a slot after that)."""

    def __init__(self, slots: list[Any], kinds: tuple[str, ...], threads: dict[str, int] | None = None) -> None:
        self.slots = slots
        self._workers = {kind: Workers((threads or {}).get(kind, 1), f"ckptbench-ring-{kind}") for kind in kinds}
        self._pending: dict[int, list[Future]] = {}

    def __enter__(self) -> Pipeline:
        for w in self._workers.values():
            w.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        failure: BaseException | None = None
        for w in self._workers.values():
            try:
                w.__exit__(*exc)
            except BaseException as err:  # noqa: BLE001 - every pool is joined before one error goes on
                failure = failure or err
        if failure is not None and exc[0] is None:
            raise failure

    def slot(self, k: int) -> Any:
        for future in self._pending.pop(k % len(self.slots), []):
            future.result()
        return self.slots[k % len(self.slots)]

    def submit(self, k: int, kind: str, fn: Callable[..., Any], *args: Any) -> None:
        self._pending.setdefault(k % len(self.slots), []).append(self._workers[kind].submit(fn, *args))

    def join(self) -> None:
        for w in self._workers.values():
            w.join()


def write_through_ring(plan: Any, sources: Any, store: Any, ring: Ring, *, threads: int, block_size: int,
                       direct: bool, checksum: bool) -> tuple[Any, list[int], float]:
    """Write ``plan``'s shards from its ``sources`` (contiguous CPU tensors, in entry order) through
    ``ring`` into ``store`` (``writes_pieces``): staged, written and checksummed chunk by chunk (see the
    module docstring); durable on return. Returns the store's WriteReport, the CRC-32C of each of
    ``plan.checksum_ranges()`` (none without ``checksum``), and the seconds spent staging."""
    import time

    placements = plan.placements
    offsets = np.ascontiguousarray(placements[:, 1])
    nbytes = np.ascontiguousarray(placements[:, 2])
    addresses = np.frombuffer(sources.addresses, np.int64)[placements[:, 0]]
    zeros = np.asarray(plan.padding, np.int64)
    ranges = plan.checksum_ranges() if checksum else []
    crcs = RunningCrcs(np.array([o for _, o, _ in ranges], np.int64), np.array([n for _, _, n in ranges], np.int64))
    crc_threads = max(1, threads // 2)
    shards = plan.shards
    # Two chunks written at once, each by half the threads: one's last blocks overlap the next one's
    # first, so the device is not left waiting at every chunk boundary (odd counts: one at a time).
    writers = 2 if threads % 2 == 0 else 1
    staging_s = 0.0

    # The first chunk and the last ones (one per writer: a save's last chunk can be a few bytes) go in
    # pieces of one block per writing thread: the device starts once the first piece is staged, not
    # the whole slot, and both writers share the last blocks instead of one writing a chunk alone
    # while the other has nothing left.
    align = knobs.ALIGNMENT_BYTES
    piece_bytes = -(-max(1, threads // writers) * block_size // align) * align  # O_DIRECT offsets stay aligned

    def write(writer: Any, name: str, offset: int, view: memoryview) -> None:
        writer.write([(name, offset, view)], threads=threads // writers, block_size=block_size, direct=direct)

    with ring.lock:
        slots = ring.slots()
        cut = chunks([(s.arena_offset, s.nbytes) for s in shards], len(slots[0]))
        with store.pieces([s.name for s in shards]) as writer, \
                Pipeline(slots, ("write", "crc"), {"write": writers}) as pipe:
            for k, (shard, start, length) in enumerate(cut):
                slot = memoryview(pipe.slot(k))
                begin = shards[shard].arena_offset + start
                step = piece_bytes if k == 0 or k >= len(cut) - writers else length
                for low in range(0, length, step):
                    high = min(low + step, length)
                    staged = time.perf_counter()
                    native.copy_from_addresses(slot[low:high], staging_rows(offsets, nbytes, zeros, addresses,
                                                                            begin + low, begin + high), threads)
                    staging_s += time.perf_counter() - staged
                    pipe.submit(k, "write", write, writer, shards[shard].name, start + low, slot[low:high])
                    if ranges:
                        pipe.submit(k, "crc", crcs.add, slot[low:high], begin + low, begin + high, crc_threads)
            pipe.join()
    return writer.report, crcs.crcs if ranges else [], staging_s
