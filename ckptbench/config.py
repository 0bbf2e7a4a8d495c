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

    def __post_init__(self) -> None:
        if self.size_bytes <= 0:
            raise UsageError(f"size {self.size_bytes} must be positive")
        if self.files < 1:
            raise UsageError(f"files {self.files} must be at least 1")
        if self.files > self.size_bytes:
            raise UsageError(
                f"{self.files} files of {format_size(self.size_bytes)} in all would be empty",
                hint="use fewer files or a larger --size",
            )
        if not self.threads or any(t < 1 for t in self.threads):
            raise UsageError(f"threads {list(self.threads)} must all be at least 1")
        if not self.block_sizes or any(b <= 0 for b in self.block_sizes):
            raise UsageError(f"block sizes {list(self.block_sizes)} must all be positive")
        if self.direct:
            bad = [b for b in self.block_sizes if b % knobs.ALIGNMENT_BYTES]
            if bad:
                raise UsageError(
                    f"block size {format_size(bad[0])} ({bad[0]} B) is not a multiple of "
                    f"{knobs.ALIGNMENT_BYTES // 1024} KiB, which O_DIRECT needs",
                    hint="use e.g. 1MiB or 4MiB, or pass --buffered",
                )
        unknown = [s for s in self.schedules if s not in SCHEDULES]
        if not self.schedules or unknown:
            raise UsageError(f"schedule {unknown[0] if unknown else ''!r} is not one of {', '.join(SCHEDULES)}")
        if self.repeat < 1:
            raise UsageError(f"repeat {self.repeat} must be at least 1")
        if self.warmup < 0:
            raise UsageError(f"warmup {self.warmup} must be zero or more")

    @property
    def file_size_bytes(self) -> int:
        """Size of every file but possibly the last."""
        return -(-self.size_bytes // self.files)

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
