"""User settings as frozen dataclasses, validated in ``__post_init__`` exactly like CLI flags.

A bad value raises :class:`~ckptbench.errors.UsageError` naming the value and what is accepted,
so ``--config FILE.toml``, flags and library callers all fail the same way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ckptbench import knobs
from ckptbench.errors import UsageError
from ckptbench.units import format_size

#: How the engine hands chunks to threads: one shared queue in file order, or whole files per thread.
SCHEDULES = ("shared", "per-file")

# Upper bounds of the benchmark settings, shared by the flags (cli/params.py) and the specs below: far
# beyond any real use, they keep a typo (1e20 runs, a block size past 2**63) from reaching the engine.
MAX_THREADS = 4096
MAX_RUNS = 10_000
MAX_BLOCK_BYTES = 2**40
#: Files per run and configurations per sweep: beyond these a run plans for minutes and grows its
#: memory before any I/O (a file list of tens of millions), or runs for days.
MAX_FILES = 100_000
MAX_CONFIGS = 1_000
#: A run by time lasts at most a week; the timeline's interval is at least a millisecond.
MAX_RUNTIME_S = 7 * 86400.0
MIN_SAMPLE_EVERY_S = 1e-3


@dataclass(frozen=True)
class FsBenchSpec:
    """One filesystem benchmark: a grid of (threads x block size x schedule) over the same file set.

    Each run writes ``size_bytes`` spread over ``files`` files (the last may be shorter), then
    optionally reads them back cold. ``direct`` requests O_DIRECT; ``fsync`` makes every file (and
    the directory) durable inside the timed region. Turning ``fsync`` off with buffered I/O measures
    the page cache, not the storage.
    """

    size_bytes: int
    files: int
    threads: tuple[int, ...]
    block_sizes: tuple[int, ...]
    direct: bool = True
    fsync: bool = True
    read: bool = True
    repeat: int = 3
    warmup: int = 1
    metadata: bool = False
    schedules: tuple[str, ...] = ("shared",)
    runtime_s: float | None = None  # each run lasts this long, over and over the same files (None: once)
    sample_every_s: float = 1.0  # the bandwidth timeline's interval

    def __post_init__(self) -> None:
        if self.runtime_s is not None and not 0 < self.runtime_s <= MAX_RUNTIME_S:
            raise UsageError(f"runtime {self.runtime_s!r} s must be positive and at most {MAX_RUNTIME_S:.0f} s")
        if not MIN_SAMPLE_EVERY_S <= self.sample_every_s <= MAX_RUNTIME_S:
            raise UsageError(f"sample interval {self.sample_every_s!r} s must lie between "
                             f"{MIN_SAMPLE_EVERY_S * 1e3:.0f} ms and {MAX_RUNTIME_S:.0f} s")
        if self.size_bytes <= 0:
            raise UsageError(f"size {self.size_bytes} must be positive")
        if self.files < 1:
            raise UsageError(f"files {self.files} must be at least 1")
        if self.files > MAX_FILES:
            raise UsageError(f"{self.files} files per run is more than {MAX_FILES}",
                             hint="use fewer files or a larger --file-size")
        if self.files > self.size_bytes:
            raise UsageError(
                f"{self.files} files of {format_size(self.size_bytes)} in all would be empty",
                hint="use fewer files or a larger --size",
            )
        if not self.threads or any(not 1 <= t <= MAX_THREADS for t in self.threads):
            raise UsageError(f"threads {list(self.threads)} must all lie between 1 and {MAX_THREADS}")
        if not self.block_sizes or any(not 0 < b <= MAX_BLOCK_BYTES for b in self.block_sizes):
            raise UsageError(f"block sizes {list(self.block_sizes)} must all be positive and at most "
                             f"{format_size(MAX_BLOCK_BYTES)}")
        if self.direct:
            bad = [b for b in self.block_sizes if b % knobs.ALIGNMENT_BYTES]
            if bad:
                raise UsageError(
                    f"block size {format_size(bad[0])} ({bad[0]} B) is not a multiple of "
                    f"{knobs.ALIGNMENT_BYTES // 1024} KiB, which O_DIRECT needs",
                    hint="use e.g. 1MiB or 4MiB, or pass --buffered",
                )
        configs = len(self.threads) * len(self.block_sizes) * len(self.schedules)
        if configs > MAX_CONFIGS:
            raise UsageError(f"the sweep has {configs} configurations (threads x block sizes x schedules), more "
                             f"than {MAX_CONFIGS}", hint="sweep fewer values")
        unknown = [s for s in self.schedules if s not in SCHEDULES]
        if not self.schedules or unknown:
            raise UsageError(f"schedule {unknown[0] if unknown else ''!r} is not one of {', '.join(SCHEDULES)}")
        if not 1 <= self.repeat <= MAX_RUNS:
            raise UsageError(f"repeat {self.repeat} must lie between 1 and {MAX_RUNS}")
        if not 0 <= self.warmup <= MAX_RUNS:
            raise UsageError(f"warmup {self.warmup} must lie between 0 and {MAX_RUNS}")

    @property
    def file_size_bytes(self) -> int:
        """Size of every file but possibly the last."""
        return -(-self.size_bytes // self.files)

    @property
    def buffer_bytes(self) -> int:
        """The source (and sink) buffer a run writes (reads) files from: a whole file, aligned for O_DIRECT,
        up to ``knobs.BENCH_BUFFER_MAX_BYTES``; bigger files are written from it in pieces."""
        align = knobs.ALIGNMENT_BYTES
        return -(-min(self.file_size_bytes, knobs.BENCH_BUFFER_MAX_BYTES) // align) * align

    @property
    def largest_block_bytes(self) -> int:
        """The largest single I/O a run can issue (a file, or a buffer-sized piece of one): the engine cuts
        no block longer than this, so a larger block size would measure this one."""
        return min(self.file_size_bytes, self.buffer_bytes)

    def file_sizes(self) -> list[int]:
        full = self.file_size_bytes
        sizes = [full] * (self.size_bytes // full)
        if self.size_bytes % full:
            sizes.append(self.size_bytes % full)
        return sizes

    def grid(self) -> list[tuple[int, int, str]]:
        """Every (threads, block_size, schedule) configuration, in sweep order."""
        return [(t, b, s) for t in self.threads for b in self.block_sizes for s in self.schedules]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["threads"] = list(self.threads)
        data["block_sizes"] = list(self.block_sizes)
        data["schedules"] = list(self.schedules)
        data["file_size_bytes"] = self.file_size_bytes
        return data
