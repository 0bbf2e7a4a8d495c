"""How fast this host faults fresh memory in: what a restore pays before the first byte lands in it.

A cold load allocates its tensors new (a restarted job's process has nothing to reuse), so every page of
them is faulted in once. On bare metal that is the kernel zeroing pages, far faster than storage. In a VM
whose hypervisor takes free memory back (a virtio balloon's free page reporting, or a host that backs
less memory than the guest has), the first touch of such a page waits for the host to find and zero
memory of its own: a restore can then be bound by memory, not storage, and its time swings with the
host's state. The probe faults the restore's bytes in, in chunks, and reports the rate.
"""

from __future__ import annotations

import mmap
import statistics
import time
from dataclasses import dataclass
from typing import Any

from ckptbench import knobs
from ckptbench.checkpoint.host_memory import MADV_POPULATE_WRITE, available_memory_bytes, reports_free_memory

#: Bytes faulted in per timed call.
CHUNK_BYTES = 256 * 2**20
#: The chunks at the end whose median rate stands for the bytes the probe did not reach.
TAIL_CHUNKS = 4


@dataclass(frozen=True)
class FreshMemory:
    """``target_bytes`` to fault in; ``chunk_seconds``: the time of each chunk faulted (``chunk_bytes`` each,
    the last one possibly shorter), which may stop short of the target (memory, time)."""

    target_bytes: int
    chunk_bytes: int
    chunk_seconds: tuple[float, ...]
    faulted_bytes: int
    hypervisor_reclaims: bool

    @property
    def seconds(self) -> float:
        """Time to fault ``target_bytes`` in: the measured chunks, and the rest at the tail chunks' rate."""
        measured = sum(self.chunk_seconds)
        rest = self.target_bytes - self.faulted_bytes
        if rest <= 0 or not self.chunk_seconds:
            return measured
        tail = statistics.median(self.chunk_seconds[-TAIL_CHUNKS:])
        return measured + rest * tail / self.chunk_bytes

    @property
    def bps(self) -> float:
        return self.target_bytes / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        rates = [self.chunk_bytes / s for s in self.chunk_seconds if s > 0]
        return {"target_bytes": self.target_bytes, "faulted_bytes": self.faulted_bytes,
                "chunk_bytes": self.chunk_bytes, "chunk_seconds": list(self.chunk_seconds),
                "seconds": self.seconds, "bps": self.bps,
                "fastest_chunk_bps": max(rates, default=None), "slowest_chunk_bps": min(rates, default=None),
                "hypervisor_reclaims": self.hypervisor_reclaims}


def measure_fresh_memory(target_bytes: int, *, limit_bytes: int | None = None, budget_s: float | None = None,
                         chunk_bytes: int = CHUNK_BYTES) -> FreshMemory | None:
    """Fault ``target_bytes`` of fresh memory in (at most ``limit_bytes``, ``CKPTBENCH_FRESH_MEMORY_SHARE`` of the
    available memory, and ``budget_s`` seconds, by default ``CKPTBENCH_FRESH_MEMORY_MAX_S``; the rest is
    extrapolated from the last chunks), one chunk at a time; None where the share is 0 or the kernel cannot
    populate memory on request (not Linux, or before 5.14)."""
    available = available_memory_bytes()
    if available is None or target_bytes <= 0 or not knobs.FRESH_MEMORY_SHARE:
        return None
    budget_s = knobs.FRESH_MEMORY_MAX_S if budget_s is None else budget_s
    limit = min(target_bytes, int(available * knobs.FRESH_MEMORY_SHARE),
                *(() if limit_bytes is None else (limit_bytes,)))
    chunk_bytes = min(chunk_bytes, limit)
    if chunk_bytes < mmap.PAGESIZE:
        return None
    buffer = mmap.mmap(-1, limit, flags=mmap.MAP_PRIVATE)
    seconds: list[float] = []
    try:
        started = time.perf_counter()
        for start in range(0, limit, chunk_bytes):
            length = min(chunk_bytes, limit - start)
            if length < chunk_bytes and seconds:
                break  # a short last chunk would skew the tail's rate
            t = time.perf_counter()
            try:
                buffer.madvise(MADV_POPULATE_WRITE, start, length)
            except (OSError, AttributeError):
                return None
            seconds.append(time.perf_counter() - t)
            if time.perf_counter() - started > budget_s:
                break
    finally:
        buffer.close()
    return FreshMemory(target_bytes, chunk_bytes, tuple(seconds), len(seconds) * chunk_bytes, reports_free_memory())
