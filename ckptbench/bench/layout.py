"""What a parallel filesystem's layout implies for a measurement: Lustre and BeeGFS stripe every file over
a number of storage targets, so one large shard written by several streams reaches only that many; NFS
spreads a mount's RPCs over ``nconnect`` connections. Read with the filesystem's own tool where it is on
PATH (``lfs getstripe``, ``beegfs-ctl --getentryinfo``); otherwise the note says it was skipped and why."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

#: Seconds a layout tool may take before its note is skipped.
TOOL_TIMEOUT_S = 10.0


def _run(argv: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None), or (None, why not) when the tool is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} not found on PATH: the layout is unknown"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{' '.join(argv)} failed: {exc}"
    if done.returncode != 0:
        return None, f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()[:200]}"
    return done.stdout, None


def _stripes_note(fs: str, count: int | None, streams: int, how: str) -> str:
    if count is None:
        return f"{fs}: stripe count not reported"
    targets = "every target" if count < 0 else f"{count} target{'s' if count != 1 else ''}"
    if count >= 0 and count < streams:
        return (f"{fs}: each file is striped over {targets}, fewer than the {streams} writer streams: a large shard "
                f"written by all of them reaches only {targets}; more shards than streams, or a wider stripe "
                f"({how}), lets the streams reach more targets")
    return f"{fs}: each file is striped over {targets}, as many or more than the {streams} writer streams"


def _nconnect_note(connections: int, streams: int) -> str:
    note = (f"NFS over {connections} connection{'s' if connections != 1 else ''}: O_DIRECT bypasses the client "
            "cache and sends each request synchronously; the bench measures both durable modes here")
    if connections < streams:
        note += f"; with {streams} writer streams, the mount option nconnect={min(streams, 16)} may add throughput"
    return note


def implication(layout: dict[str, Any] | None, streams: int) -> str | None:
    """What a layout :func:`layout_notes` read implies for ``streams`` writer streams (``recommend`` asks
    with the threads it recommends); None where nothing was read (no layout, or the tool was skipped)."""
    if not layout or "skipped" in layout:
        return None
    fs = layout.get("filesystem", "")
    count = layout.get("stripe_count")
    if fs == "lustre":
        return _stripes_note("Lustre", count, streams, f"lfs setstripe -c {max(streams, 1)} or -c -1 DIR")
    if fs == "beegfs":
        return _stripes_note("BeeGFS", count, streams, f"beegfs-ctl --setpattern --numtargets={streams} DIR")
    if str(fs).startswith("nfs") and isinstance(layout.get("nconnect"), int):
        return _nconnect_note(layout["nconnect"], streams)
    return layout.get("note")


def layout_notes(path: Path, fstype: str | None, options: str = "", streams: int = 1) -> dict[str, Any] | None:
    """The layout of ``path``'s filesystem and what it implies for ``streams`` writers; None for a
    filesystem without one (local disks, FUSE)."""
    fstype = fstype or ""
    if fstype == "lustre":
        out, why = _run(["lfs", "getstripe", "-d", str(path)])
        if out is None:
            return {"filesystem": "lustre", "skipped": why}
        found = re.search(r"stripe_count:\s*(-?\d+)", out)
        size = re.search(r"stripe_size:\s*(\d+)", out)
        layout = {"filesystem": "lustre", "stripe_count": int(found.group(1)) if found else None,
                  "stripe_size_bytes": int(size.group(1)) if size else None}
        return {**layout, "note": implication(layout, streams)}
    if fstype == "beegfs":
        out, why = _run(["beegfs-ctl", "--getentryinfo", str(path)])
        if out is None:
            return {"filesystem": "beegfs", "skipped": why}
        found = re.search(r"Number of storage targets:\s*desired:\s*(\d+)", out)
        chunk = re.search(r"Chunksize:\s*(\S+)", out)
        layout = {"filesystem": "beegfs", "stripe_count": int(found.group(1)) if found else None,
                  "chunk_size": chunk.group(1) if chunk else None}
        return {**layout, "note": implication(layout, streams)}
    if fstype.startswith("nfs"):
        found = re.search(r"(?:^|,)nconnect=(\d+)", options)
        layout = {"filesystem": fstype, "nconnect": int(found.group(1)) if found else 1}
        return {**layout, "note": implication(layout, streams)}
    return None
