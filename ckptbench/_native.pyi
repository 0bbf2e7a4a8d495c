"""ckptbench native I/O engine (C++17). Blocking calls release the GIL."""

from collections.abc import Sequence
import enum
from typing import Annotated, overload

import numpy
from numpy.typing import NDArray
from typing_extensions import Buffer


class SyncMode(enum.Enum):
    """What makes a written file durable before the call returns."""

    none = 0
    """Nothing: the data may still be in the page cache."""

    fdatasync = 1
    """fdatasync(2) once a file's last block is written."""

    fsync = 2
    """fsync(2) once a file's last block is written."""

class Schedule(enum.Enum):
    """How blocks meet threads."""

    shared = 0
    """One queue of blocks in file order; threads share each file."""

    per_file = 1
    """Each thread takes the next whole file and streams it."""

class AlignedBuffer:
    """
    Page-aligned host memory, touched once at construction; supports the buffer protocol.
    """

    def __init__(self, nbytes: int, alignment: int = 4096, prefault: bool = True) -> None: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def alignment(self) -> int: ...

    @property
    def address(self) -> int: ...

    def __len__(self) -> int: ...

    def __buffer__(self, flags: int, /) -> memoryview: ...

class Control:
    """Progress counter and cancellation flag shared with a running call."""

    def __init__(self) -> None: ...

    def cancel(self) -> None:
        """Ask the running call to stop between blocks."""

    @property
    def bytes_done(self) -> int: ...

    @property
    def cancel_requested(self) -> bool: ...

class ThreadStat:
    @property
    def start_ns(self) -> int: ...

    @property
    def end_ns(self) -> int: ...

    @property
    def bytes(self) -> int: ...

    @property
    def ops(self) -> int: ...

class IoResult:
    @property
    def bytes(self) -> int: ...

    @property
    def ops(self) -> int: ...

    @property
    def start_ns(self) -> int: ...

    @property
    def end_ns(self) -> int: ...

    @property
    def seconds(self) -> float: ...

    @property
    def threads(self) -> list[ThreadStat]: ...

    @property
    def files(self) -> int: ...

    @property
    def direct_requested(self) -> bool: ...

    @property
    def direct_used(self) -> bool: ...

    @property
    def fallback_reason(self) -> str: ...

    @property
    def sync(self) -> str: ...

    @property
    def cancelled(self) -> bool: ...

    @property
    def deadline_reached(self) -> bool: ...

    @property
    def interval_ns(self) -> int: ...

    @property
    def latencies_ns(self) -> Annotated[NDArray[numpy.uint64], dict(shape=(None,), writable=False)]: ...

    @property
    def timeline_bytes(self) -> Annotated[NDArray[numpy.uint64], dict(shape=(None,), writable=False)]:
        """Bytes completed in each interval_ns since start_ns."""

    @property
    def latency_histogram(self) -> Annotated[NDArray[numpy.uint64], dict(shape=(None,), writable=False)]:
        """
        Operations per latency bucket: one per nanosecond below 8 ns, then 8 equal buckets per power of two.
        """

def write(jobs: Sequence[tuple[Buffer, str, int]], threads: int = 1, block_size: int = 4194304, direct: bool = True, sync: SyncMode = SyncMode.fdatasync, sync_dir: bool = True, record_latency: bool = True, schedule: Schedule = Schedule.shared, control: Control | None = None, after: CowCopy | None = None, sample_interval_ns: int = 1000000000, deadline_ns: int = 0, preallocate: bool = False, fds: Sequence[int] = []) -> IoResult:
    """
    Write each (buffer, path, offset) job; durable per `sync` when it returns. `after`: a CowCopy still copying into the buffers; each block is written once its bytes are copied (if the CowCopy fails, they are written as they are: its finish() raises). `sample_interval_ns`: the timeline's interval. `deadline_ns` (CLOCK_MONOTONIC, 0: none): no block starts after it; the files written are still synced. `preallocate`: on ext4, each file's range of O_DIRECT blocks is reserved with fallocate first (sizing the file to its end), so blocks written side by side into one file do not take turns on its inode lock (ignored with a deadline). `fds`: one descriptor per file, open for writing, in the order the jobs first name each file; each file is written through a reopening of its descriptor (/proc/self/fd), not opened by its path, which then serves the O_DIRECT probe, the directory sync and messages.
    """

def write_gathered(files: Sequence[tuple[str, Annotated[NDArray[numpy.int64], dict(shape=(None, None), order='C', device='cpu', writable=False)], int]], ranges: Annotated[NDArray[numpy.int64], dict(shape=(None, None), order='C', device='cpu', writable=False)], threads: int = 1, block_size: int = 4194304, sync: SyncMode = SyncMode.fdatasync, sync_dir: bool = True, record_latency: bool = True, schedule: Schedule = Schedule.shared, control: Control | None = None, fds: Sequence[int] = []) -> tuple[IoResult, list[int]]:
    """
    Write each (path, segments, size) file from memory where its bytes already are, buffered (never O_DIRECT): `segments` is a C-contiguous int64 table of (source address, file offset, nbytes) rows, sorted by offset, not overlapping, inside `size`; the bytes between them are written as zeros. Each block_size piece of a file is one pwritev. `ranges`: an int64 table of (file index, offset, nbytes) rows, each inside one segment; their CRC-32C, computed by the thread writing those bytes just before it does, are returned with the IoResult. Durable per `sync` when it returns. The caller guarantees every source address stays valid and readable for nbytes during the call (e.g. a contiguous CPU tensor's data_ptr()). `fds`: none, or one descriptor per file (open for writing, without O_APPEND or O_DIRECT) written through instead of opening its path; the caller closes them, and the paths then name the files in errors and their directories for `sync_dir`.
    """

def read(jobs: Sequence[tuple[Buffer, str, int]], threads: int = 1, block_size: int = 4194304, direct: bool = True, drop_cache: bool = True, record_latency: bool = True, schedule: Schedule = Schedule.shared, control: Control | None = None, sample_interval_ns: int = 1000000000, deadline_ns: int = 0) -> IoResult:
    """
    Read each (writable buffer, path, offset) job, filling the buffer completely (or until `deadline_ns`, CLOCK_MONOTONIC, when not 0). `sample_interval_ns`: the timeline's interval.
    """

def metadata_bench(directory: str, files: int, file_size: int = 4096, threads: int = 1, sync: SyncMode = SyncMode.fsync, control: Control | None = None) -> IoResult:
    """Create, write, sync and close `files` small files in `directory`."""

def probe_direct(directory: str) -> tuple[bool, str]:
    """
    (supported, reason): whether `directory` accepts O_DIRECT writes (cached per directory).
    """

def memcpy_bandwidth(nbytes: int = 268435456, repeats: int = 5) -> float:
    """Best single-thread memcpy bandwidth, bytes/s."""

def copy_bandwidth(dst: Buffer, src: Buffer, repeats: int = 3) -> float:
    """
    Best memcpy bandwidth (bytes/s) copying src into dst (the shorter length), without allocating.
    """

def crc32c(buffer: Buffer, crc: int = 0) -> int:
    """CRC-32C of a buffer (continue from `crc` to checksum in pieces)."""

def crc32c_ranges(buffer: Buffer, ranges: Sequence[tuple[int, int]], threads: int = 1) -> list[int]:
    """One CRC-32C per (offset, nbytes) range of `buffer`, on N threads."""

def crc32c_hardware() -> bool:
    """Whether CRC-32C uses the CPU instruction (SSE4.2)."""

@overload
def copy_from_addresses(dst: Buffer, jobs: Annotated[NDArray[numpy.int64], dict(shape=(None, None), order='C', device='cpu', writable=False)], threads: int = 1) -> None: ...

@overload
def copy_from_addresses(dst: Buffer, jobs: Sequence[tuple[int, int, int]], threads: int = 1) -> None:
    """
    Copy (source address, destination offset, nbytes) jobs into `dst` on N threads. `jobs` is a sequence of tuples or a C-contiguous int64 table of such rows (e.g. a numpy array of shape (n, 3)); a fourth column zeroes that many bytes right after each copy (padding; the address may be 0 with nbytes 0). The caller guarantees each source address stays valid and readable for nbytes during the call (e.g. a contiguous CPU tensor's data_ptr()).
    """

def cow_unavailable() -> str:
    """
    Why copy-on-write copies (CowCopy) cannot be taken in this process; '' when they can.
    """

class CowCopy:
    """
    Copy-on-write staging: write-protects the sources of copy_from_addresses-style jobs and copies them into `dst` on background threads; a write to a page not yet copied waits until its chunk is copied. The caller may write to the sources as soon as it returns.
    """

    @overload
    def __init__(self, dst: Buffer, jobs: Annotated[NDArray[numpy.int64], dict(shape=(None, None), order='C', device='cpu', writable=False)], threads: int = 1, chunk_bytes: int = 1048576, min_region_bytes: int = 262144, max_regions: int = 4096) -> None: ...

    @overload
    def __init__(self, dst: Buffer, jobs: Sequence[tuple[int, int, int]], threads: int = 1, chunk_bytes: int = 1048576, min_region_bytes: int = 262144, max_regions: int = 4096) -> None:
        """
        Protect the jobs' sources and start copying; jobs as for copy_from_addresses. The sources' pages, merged where they touch, form regions: those under `min_region_bytes`, all but the `max_regions` largest, and any outside private anonymous memory are copied before it returns. Raises RuntimeError when copy-on-write copies are unavailable (see cow_unavailable()).
        """

    def finish(self) -> None:
        """
        Wait until every byte is copied and the protection is gone. Raises RuntimeError when the sources were freed, moved or unreadable meanwhile (the copy may be torn). Idempotent.
        """

    @property
    def done(self) -> bool: ...

    def stats(self) -> dict[str, int]:
        """
        Protected bytes, bytes copied before returning, chunks, regions, and writes that waited.
        """

def fill_random(buffer: Buffer, seed: int = 0) -> None:
    """
    Fill a writable buffer with incompressible bytes, deterministic in `seed`.
    """
