"""The host's available memory, which staging arenas and read buffers are checked against before they
are allocated (a save or load, and the benchmarks sizing their checkpoints)."""

from __future__ import annotations


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes: what can be allocated without swapping; None
    where it cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
