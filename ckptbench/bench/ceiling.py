"""The writer's own ceiling on this host: ckptbench's save of a workload into memory (tmpfs), where the storage
costs nothing, so what is left is the writer (planning, staging copies, checksums, the engine's writes).

A storage measurement close to this ceiling says more about the host's CPU and memory than about the
storage: the decision rules call such a rate writer-bound and never present it as storage bandwidth.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ckptbench.bench.workloads import CheckpointWorkload

log = logging.getLogger(__name__)

#: Where memory-backed files live on Linux.
TMPFS = Path("/dev/shm")
#: A storage rate at or above this fraction of the writer's ceiling is the writer's limit, not the storage's.
WRITER_BOUND_FRACTION = 0.8


def writer_ceiling_bps(workload: CheckpointWorkload, *, threads: int | None = None, repeat: int = 2,
                       where: Path = TMPFS) -> list[float] | None:
    """Durable-save rates (bytes/s) of ckptbench's writer into ``where`` (tmpfs), one per run after a warm-up;
    None when ``where`` is missing or cannot hold the workload twice over (it is measured in memory)."""
    from ckptbench.bench.workloads import build_state_dict
    from ckptbench.checkpoint.api import Checkpointer
    from ckptbench.errors import TargetError
    from ckptbench.storage.local_target import LocalDirectory

    try:
        if not where.is_dir() or shutil.disk_usage(where).free < 2 * workload.total_bytes:
            return None
    except OSError:
        return None
    rates = []
    with contextlib.ExitStack() as cleanup:
        try:  # private, and reached through its descriptor (safeio): /dev/shm is shared by every user
            scratch = cleanup.enter_context(LocalDirectory(where).scratch())
        except TargetError as exc:
            log.info("no writer ceiling: %s", exc)
            return None
        state_dict = build_state_dict(workload)
        ckpt = Checkpointer(threads=threads, direct=False)
        cleanup.callback(ckpt.close)
        for i in range(repeat + 1):
            location = scratch / f"save-{i}"
            start = time.perf_counter()
            ckpt.save(state_dict, location)
            seconds = time.perf_counter() - start
            if i:  # the first save allocates the staging arena: a warm-up
                rates.append(workload.total_bytes / seconds)
            shutil.rmtree(location, ignore_errors=True)
    log.info("writer ceiling into %s: %s", where, ", ".join(f"{r / 1e9:.2f} GB/s" for r in rates))
    return rates


def bottleneck(storage_bps: float, ceiling_bps: list[float] | None) -> dict[str, Any]:
    """Which side limits a measured save rate: ``writer`` when it reaches :data:`WRITER_BOUND_FRACTION` of the
    writer's best rate into memory, else ``storage``; ``unknown`` without a ceiling, or when the storage came out
    well above the ceiling (a busy host disturbed one of them)."""
    if not ceiling_bps:
        return {"limit": "unknown", "writer_ceiling_bps": None, "fraction_of_ceiling": None}
    ceiling = max(ceiling_bps)
    fraction = storage_bps / ceiling
    # Faster than the writer can go into memory: one of the two measurements was disturbed (a busy host).
    limit = "unknown" if fraction > 1 / WRITER_BOUND_FRACTION else "writer" if fraction >= WRITER_BOUND_FRACTION \
        else "storage"
    return {"limit": limit, "writer_ceiling_bps": ceiling,
            "runs_writer_ceiling_bps": list(ceiling_bps), "fraction_of_ceiling": fraction,
            "cpus": os.cpu_count()}
