"""The thin Python face of the compiled engine (``ckptbench._native``).

Re-exports the engine and adds :func:`run_interruptible`: a blocking engine call runs on a worker
thread while the calling thread polls its progress and stays able to receive Ctrl-C, which cancels
the call between blocks instead of waiting for a multi-gigabyte write to finish.

:func:`write`, :func:`read` and :func:`metadata_bench` take ``sync`` and ``schedule`` by name
(``"fdatasync"``, ``"per-file"``) or as the engine's :class:`SyncMode` and :class:`Schedule`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ckptbench import interrupts, knobs
from ckptbench.interrupts import Deferred, QuietThread


def _not_built(exc: ImportError) -> str:
    """Why ``ckptbench._native`` did not import, and the fix: a source tree imported before (or instead
    of) the installed package, an install without the engine, or an engine that does not load."""
    import importlib.util
    from pathlib import Path

    package = Path(__file__).resolve().parent
    try:
        found = importlib.util.find_spec("ckptbench._native") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return f"ckptbench's native engine in {package} does not load ({exc}); reinstall ckptbench"
    root = package.parent
    if (root / "pyproject.toml").is_file() and (root / "csrc").is_dir():
        return (f"ckptbench's native engine is not built in this source tree ({root}); run `pip install -e .` "
                "there (needs a C++17 compiler), or run from outside the source tree to use an installed ckptbench")
    return f"ckptbench's native engine is missing from {package}; reinstall ckptbench (`pip install .` in its source tree)"


try:
    from ckptbench import _native
    from ckptbench._native import (
        AlignedBuffer,
        Control,
        CowCopy,
        IoResult,
        Schedule,
        SyncMode,
        copy_bandwidth,
        copy_from_addresses,
        cow_unavailable,
        crc32c,
        crc32c_hardware,
        crc32c_ranges,
        fill_random,
        memcpy_bandwidth,
        probe_direct,
    )
except ImportError as exc:  # pragma: no cover - only on a broken install or from an unbuilt source tree
    raise ImportError(_not_built(exc)) from exc

__all__ = [
    "AlignedBuffer",
    "Control",
    "IoResult",
    "Schedule",
    "CowCopy",
    "SyncMode",
    "copy_bandwidth",
    "copy_from_addresses",
    "crc32c",
    "crc32c_hardware",
    "crc32c_ranges",
    "fill_random",
    "memcpy_bandwidth",
    "metadata_bench",
    "probe_direct",
    "read",
    "run_interruptible",
    "cow_unavailable",
    "write",
    "write_gathered",
]

T = TypeVar("T")

#: The names ``sync`` and ``schedule`` take, and the engine's members they stand for.
_BY_NAME: dict[type, dict[str, Any]] = {
    SyncMode: {"none": SyncMode.none, "fdatasync": SyncMode.fdatasync, "fsync": SyncMode.fsync},
    Schedule: {"shared": Schedule.shared, "per-file": Schedule.per_file},
}


def _member(option: str, value: Any, kind: type) -> Any:
    """``value`` as a member of the engine's enum ``kind``: a member as it is, a name looked up."""
    if isinstance(value, kind):
        return value
    names = _BY_NAME[kind]
    if value not in names:
        *first, last = (repr(name) for name in names)
        raise ValueError(f"{option} must be {', '.join(first)} or {last}, not {value!r}")
    return names[value]


def write(
    jobs: Sequence[tuple[Any, str, int]],
    threads: int = 1,
    block_size: int = 4 << 20,
    direct: bool = True,
    sync: str | SyncMode = "fdatasync",
    sync_dir: bool = True,
    record_latency: bool = True,
    schedule: str | Schedule = "shared",
    control: Control | None = None,
    after: CowCopy | None = None,
    sample_interval_ns: int = 1_000_000_000,
    deadline_ns: int = 0,
    preallocate: bool = False,
    fds: Sequence[int] = (),
) -> IoResult:
    """Write each (buffer, path, offset) job; durable per ``sync`` when it returns (see ``_native.write``).

    ``fds``: one descriptor per file, opened (and closed) by the caller, in the order the jobs first name each
    file; every file is written through a reopening of its descriptor, never opened by its path again.

    ``deadline_ns`` is a ``time.monotonic_ns()`` time (the engine's clock) after which no block starts.
    ``preallocate``: on ext4, reserve each file's O_DIRECT range first (fallocate), so threads and side-by-side
    calls writing one file do not take turns on its inode lock; off for ``bench``, which measures the
    device as fio ``--fallocate=none`` does.
    """
    return _native.write(jobs, threads, block_size, direct, _member("sync", sync, SyncMode), sync_dir, record_latency,
                         _member("schedule", schedule, Schedule), control, after, sample_interval_ns, deadline_ns,
                         preallocate, list(fds))


def write_gathered(
    files: Sequence[tuple[str, Any, int]],
    ranges: Any,
    threads: int = 1,
    block_size: int = 4 << 20,
    sync: str | SyncMode = "fdatasync",
    sync_dir: bool = True,
    record_latency: bool = True,
    schedule: str | Schedule = "shared",
    control: Control | None = None,
    fds: Sequence[int] = (),
) -> tuple[IoResult, list[int]]:
    """Write each (path, segments, size) file from the memory its bytes are in, buffered, with the CRC-32C
    of each of ``ranges`` computed on the way (see ``_native.write_gathered``). ``fds``: one descriptor per
    file, opened (and closed) by the caller, written through instead of opening the paths again."""
    return _native.write_gathered(files, ranges, threads, block_size, _member("sync", sync, SyncMode), sync_dir,
                                  record_latency, _member("schedule", schedule, Schedule), control, list(fds))


def read(
    jobs: Sequence[tuple[Any, str, int]],
    threads: int = 1,
    block_size: int = 4 << 20,
    direct: bool = True,
    drop_cache: bool = True,
    record_latency: bool = True,
    schedule: str | Schedule = "shared",
    control: Control | None = None,
    sample_interval_ns: int = 1_000_000_000,
    deadline_ns: int = 0,
) -> IoResult:
    """Read each (writable buffer, path, offset) job, filling the buffer completely (see ``_native.read``)."""
    return _native.read(jobs, threads, block_size, direct, drop_cache, record_latency, _member("schedule", schedule, Schedule),
                        control, sample_interval_ns, deadline_ns)


def metadata_bench(
    directory: str,
    files: int,
    file_size: int = 4096,
    threads: int = 1,
    sync: str | SyncMode = "fsync",
    control: Control | None = None,
) -> IoResult:
    """Create, write, sync and close ``files`` small files in ``directory`` (see ``_native.metadata_bench``)."""
    return _native.metadata_bench(directory, files, file_size, threads, _member("sync", sync, SyncMode), control)


def run_interruptible(
    call: Callable[..., T],
    *args: Any,
    on_progress: Callable[[int], None] | None = None,
    **kwargs: Any,
) -> T:
    """Run ``call(*args, control=Control(), **kwargs)`` on a worker thread.

    ``on_progress(bytes_done)`` is called from this thread every ``knobs.PROGRESS_POLL_S``.
    On KeyboardInterrupt (or any exception, a SIGTERM's included, even one raised while the worker
    starts) the engine is told to cancel, the worker is joined (so no file is still open when the
    caller cleans up; a second Ctrl-C waits for that), and the exception is re-raised.
    """
    control = Control()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call(*args, control=control, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            outcome["error"] = exc

    worker = QuietThread(target=target, name="ckptbench-io", daemon=True)
    try:
        with Deferred() as signals:  # a Ctrl-C is raised between polls, never inside a join
            worker.start()
            while worker.is_alive():
                worker.join(knobs.PROGRESS_POLL_S)
                if on_progress is not None:
                    on_progress(control.bytes_done)
                signals.check()
    except BaseException:
        control.cancel()
        interrupts.join(worker)  # another Ctrl-C waits too (the CLI's exits instead): cleanup must not race the worker's files
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
