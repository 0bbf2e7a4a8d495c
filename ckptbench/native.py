"""The thin Python face of the compiled engine (``ckptbench._native``).

Re-exports the engine and adds :func:`run_interruptible`: a blocking engine call runs on a worker
thread while the calling thread polls its progress and stays able to receive Ctrl-C, which cancels
the call between blocks instead of waiting for a multi-gigabyte write to finish.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ckptbench import interrupts, knobs
from ckptbench.interrupts import Deferred, QuietThread

try:
    from ckptbench._native import (
        AlignedBuffer,
        Control,
        IoResult,
        Snapshot,
        copy_bandwidth,
        copy_from_addresses,
        crc32c,
        crc32c_hardware,
        crc32c_ranges,
        fill_random,
        memcpy_bandwidth,
        metadata_bench,
        probe_direct,
        read,
        snapshot_unavailable,
        write,
    )
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "ckptbench's native engine is not built; reinstall with `pip install .` (needs a C++17 compiler)"
    ) from exc

__all__ = [
    "AlignedBuffer",
    "Control",
    "IoResult",
    "Snapshot",
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
    "snapshot_unavailable",
    "write",
]

T = TypeVar("T")


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
