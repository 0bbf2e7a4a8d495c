"""Writing past the write-back cache: how much to write for a rate to be the storage's sustained one,
that write with its timeline, and what a drop to the sustained rate does to a larger write.

Buffered writes land in the page cache until the dirty pages reach the kernel's limit
(``vm.dirty_bytes``, or ``vm.dirty_ratio`` percent of the memory the kernel can fill with dirty pages);
past it the writers are throttled to the storage's rate. A sample smaller than that limit measures the
cache. O_DIRECT bypasses the page cache; a device's own fast cache can still take a first part at a
burst rate, which a longer write shows too.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench import knobs, native
from ckptbench.bench.progress import Progress
from ckptbench.bench.timeline import SteadyState, Timeline, detect
from ckptbench.storage.local_target import LocalDirectory
from ckptbench.units import format_size

log = logging.getLogger(__name__)

#: The piece of memory the probe writes from, over and over at increasing offsets.
_SOURCE_BYTES = 64 << 20


@dataclass(frozen=True)
class DirtyLimits:
    """The kernel's write-back thresholds (``/proc/sys/vm/dirty_*``) and the memory they apply to."""

    dirty_bytes: int
    dirty_ratio: int
    background_bytes: int
    background_ratio: int
    available_bytes: int | None  # MemAvailable: close to what the kernel counts as dirtyable

    @property
    def threshold_bytes(self) -> int | None:
        """Dirty bytes at which writers are throttled to the storage (None when unknown)."""
        if self.dirty_bytes > 0:
            return self.dirty_bytes
        if self.available_bytes is None:
            return None
        return self.available_bytes * self.dirty_ratio // 100

    def to_dict(self) -> dict[str, Any]:
        return {"dirty_bytes": self.dirty_bytes, "dirty_ratio": self.dirty_ratio,
                "dirty_background_bytes": self.background_bytes, "dirty_background_ratio": self.background_ratio,
                "available_bytes": self.available_bytes, "threshold_bytes": self.threshold_bytes}


def read_dirty_limits(proc: Path = Path("/proc")) -> DirtyLimits | None:
    """This host's limits, or None where ``/proc`` does not have them (not Linux, a restricted container)."""

    def number(name: str) -> int:
        return int((proc / "sys" / "vm" / name).read_text().split()[0])

    try:
        limits = (number("dirty_bytes"), number("dirty_ratio"), number("dirty_background_bytes"),
                  number("dirty_background_ratio"))
    except (OSError, ValueError, IndexError):
        return None
    available = None
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return DirtyLimits(*limits, available_bytes=available)


def probe_bytes(limits: DirtyLimits | None, *, direct: bool, sample_bytes: int, rate_bps: float,
                free_bytes: int | None, cap_bytes: int | None = None) -> tuple[int, str]:
    """How much the sustained probe writes, and why: twice the dirty limit for buffered writes (the cache
    fills, then the rest goes at the storage's rate); under O_DIRECT (no page cache, only a device's cache)
    ``knobs.SUSTAINED_PROBE_DIRECT_S`` at the sample's ``rate_bps``, at least twice the sample. At least the
    sample, at most ``cap_bytes`` (``knobs.SUSTAINED_PROBE_MAX_BYTES``) and a share of the free space."""
    cap = knobs.SUSTAINED_PROBE_MAX_BYTES if cap_bytes is None else cap_bytes
    threshold = limits.threshold_bytes if limits is not None else None
    if direct:
        seconds = knobs.SUSTAINED_PROBE_DIRECT_S
        wanted = max(2 * sample_bytes, int(rate_bps * seconds))
        why = f"O_DIRECT bypasses the page cache: about {seconds:g} s at the sample's rate, for a device cache"
    elif threshold is None:
        wanted, why = cap, "the dirty-page limit is unknown here: the most the probe writes"
    else:
        wanted, why = 2 * threshold, f"twice the kernel's dirty-page limit ({format_size(threshold)})"
    bound = cap
    if free_bytes is not None:
        bound = min(bound, int(free_bytes * knobs.SUSTAINED_PROBE_FREE_FRACTION))
    size = max(min(wanted, bound), sample_bytes)
    if size < wanted:
        why += f", cut to {format_size(size)} (the probe's bound or the free space)"
    align = knobs.ALIGNMENT_BYTES
    return max(size // align * align, align), why


def interval_for(nbytes: int, rate_bps: float) -> float:
    """A timeline interval that cuts a write of ``nbytes`` at ``rate_bps`` into about 20 (0.1 s to 1 s)."""
    expected_s = nbytes / rate_bps if rate_bps > 0 else math.inf
    return min(1.0, max(0.1, round(expected_s / 20, 1)))


@dataclass(frozen=True)
class SustainedWrite:
    """One long durable write: its timeline and where its rate dropped from a burst to a sustained one."""

    bytes: int
    seconds: float
    timeline: Timeline
    steady: SteadyState
    reason: str
    direct_used: bool
    limits: DirtyLimits | None

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "seconds": self.seconds, "write_bps": self.bytes / self.seconds,
                "why_this_size": self.reason, "direct": self.direct_used,
                "dirty_limits": self.limits.to_dict() if self.limits else None,
                "timeline": self.timeline.to_dict(), "steady_state": self.steady.to_dict()}


def run_sustained_write(target: LocalDirectory, nbytes: int, *, threads: int, block_size: int, direct: bool,
                        reason: str, interval_s: float = 1.0, progress: Progress | None = None,
                        limits: DirtyLimits | None = None) -> SustainedWrite:
    """Write ``nbytes`` durably (one file per thread, fdatasync each) in a scratch directory of ``target``,
    recording a timeline every ``interval_s``, for at most ``knobs.SUSTAINED_PROBE_MAX_S`` (a slow target stops
    early, the files written so far synced); the files are removed afterwards."""
    progress = progress or Progress()
    threads = max(threads, 1)
    source = native.AlignedBuffer(min(_SOURCE_BYTES, nbytes))
    native.fill_random(source, 0x73757374)
    view = memoryview(source)
    per_file = -(-nbytes // threads)
    with target.scratch() as scratch:
        jobs = []
        for i in range(threads):
            path, size = str(scratch / f"sustained-{i:03d}.bin"), min(per_file, nbytes - i * per_file)
            jobs += [(view[: min(len(view), size - off)], path, off) for off in range(0, max(size, 0), len(view))]
        progress.phase(f"sustained write: {format_size(nbytes)} ({reason})")
        result = native.run_interruptible(
            native.write, jobs, threads=threads, block_size=block_size, direct=direct, sync="fdatasync",
            schedule="per-file", sample_interval_ns=max(int(interval_s * 1e9), 1),
            deadline_ns=time.monotonic_ns() + int(knobs.SUSTAINED_PROBE_MAX_S * 1e9), on_progress=progress.advance)
        progress.end_step(result.bytes)
    timeline = Timeline.from_engine(result)
    steady = detect(timeline)
    log.info("sustained write: %s in %.2f s, %s", format_size(result.bytes), result.seconds, steady.state)
    return SustainedWrite(result.bytes, result.seconds, timeline, steady, reason, result.direct_used, limits)


def write_slowdown(steady: SteadyState, total_bytes: int, write_bps: float) -> float:
    """How many times longer writing ``total_bytes`` takes than at ``write_bps`` when the rate drops to
    ``steady.sustained_bps`` after ``steady.burst_bytes``: 1 without a burst, or when the write fits in it."""
    if not steady.burst or steady.sustained_bps is None or steady.burst_bytes is None or write_bps <= 0:
        return 1.0
    if total_bytes <= steady.burst_bytes:
        return 1.0
    slow = min(write_bps, steady.sustained_bps)
    seconds = steady.burst_bytes / write_bps + (total_bytes - steady.burst_bytes) / slow
    return seconds / (total_bytes / write_bps)
