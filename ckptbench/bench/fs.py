"""The filesystem benchmark: a (threads x block size) sweep of durable writes and cold reads.

Order of one run: allocate and fill the source buffer once (outside every timed region); for each
configuration, ``warmup + repeat`` times: write all files (timed: open, pwrite, per-file fdatasync,
close, directory fsync), read them back cold (timed; O_DIRECT, or fadvise DONTNEED after
fdatasync), delete them (untimed). Warm-up runs are discarded. The first read is checked against
the source bytes, so a number never comes from a broken read.

On a network or FUSE filesystem (``checkpoint.tuning.is_network``), where O_DIRECT can be a synchronous
round trip per request, a durable O_DIRECT run measures both durable modes, run by run interleaved:
O_DIRECT, and buffered + fdatasync (reads: O_DIRECT, and buffered after fadvise DONTNEED). Each row
then reports the faster mode beyond the noise (a tie keeps buffered + fdatasync, ``tuning.durable_default``),
and ``durable_modes`` holds both.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckptbench import knobs, native
from ckptbench.bench.environment import collect_environment
from ckptbench.bench.layout import layout_notes
from ckptbench.bench.progress import Progress
from ckptbench.bench.records import ConfigResult, FsBenchReport, MetadataResult, PhaseResult
from ckptbench.bench.timeline import LatencyHistogram, Timeline, merge_histograms, merge_timelines
from ckptbench.checkpoint import tuning
from ckptbench.config import FsBenchSpec
from ckptbench.errors import StorageIOError
from ckptbench.storage.local_target import LocalDirectory, MountInfo, mount_of
from ckptbench.units import format_size

log = logging.getLogger(__name__)

_SOURCE_SEED = 0x636B7074


def required_bytes(spec: FsBenchSpec) -> int:
    """Free space a run needs: its files at once, a margin, and the metadata files."""
    metadata = knobs.METADATA_FILES * max(knobs.METADATA_FILE_BYTES, 4096) if spec.metadata else 0
    return int(spec.size_bytes * (1 + knobs.FREE_SPACE_MARGIN)) + metadata


def _jobs(view: memoryview, paths: list[Path], sizes: list[int]) -> list[tuple[memoryview, str, int]]:
    """Each file is written from (or read into) the buffer, in buffer-sized pieces."""
    jobs = []
    for path, size in zip(paths, sizes, strict=True):
        for offset in range(0, size, len(view)):
            jobs.append((view[: min(len(view), size - offset)], str(path), offset))
    return jobs


@dataclass(frozen=True)
class _Run:
    """One timed run of a phase: one engine call, or the passes of a run by time one after another."""

    bytes: int
    seconds: float
    latencies_ns: np.ndarray
    histogram: LatencyHistogram
    timeline: Timeline
    spans: tuple[tuple[float, float, int], ...]  # (start_s, end_s, bytes) per thread and pass
    direct_used: bool
    sync: str
    fallback_reason: str


def _run_of(passes: list[native.IoResult]) -> _Run:
    """The passes of one run (one, unless it ran by time) as one run, from the first start to the last end."""
    first, last = passes[0], passes[-1]
    start = first.start_ns
    return _Run(
        bytes=sum(p.bytes for p in passes),
        seconds=(last.end_ns - start) / 1e9,
        latencies_ns=np.concatenate([np.asarray(p.latencies_ns) for p in passes]),
        histogram=merge_histograms(LatencyHistogram.from_counts(p.latency_histogram) for p in passes),
        timeline=merge_timelines([Timeline.from_engine(p) for p in passes],
                                 [(p.start_ns - start) / 1e9 for p in passes]),
        spans=tuple(((t.start_ns - start) / 1e9, (t.end_ns - start) / 1e9, t.bytes) for p in passes for t in p.threads),
        direct_used=first.direct_used,
        sync=first.sync,
        fallback_reason=first.fallback_reason,
    )


def _phase(op: str, runs: list[_Run], by_time: bool) -> PhaseResult:
    first = runs[0]
    return PhaseResult(
        op=op,
        bytes_per_run=first.bytes,
        runs_s=tuple(r.seconds for r in runs),
        latencies_ns=np.concatenate([r.latencies_ns for r in runs]),
        thread_spans=tuple(r.spans for r in runs),
        direct_used=first.direct_used,
        sync=first.sync,
        fallback_reason=first.fallback_reason,
        timelines=tuple(r.timeline for r in runs),
        histogram=merge_histograms(r.histogram for r in runs),
        runs_bytes=tuple(r.bytes for r in runs) if by_time else (),
    )


def _timed(what: str, call: Callable[..., native.IoResult], jobs: list, runtime_s: float | None,
           **kwargs: Any) -> _Run:
    """One run of ``call`` over ``jobs``: once, or with ``runtime_s`` pass after pass over the same files
    (overwriting them, as fio's time_based) until that much time has passed."""
    if runtime_s is None:
        return _run_of([_engine(what, call, jobs, **kwargs)])
    deadline = time.monotonic_ns() + int(runtime_s * 1e9)
    on_progress = kwargs.pop("on_progress", None)
    passes: list[native.IoResult] = []
    while True:
        done = sum(p.bytes for p in passes)  # progress counts the run's bytes, not each pass's
        result = _engine(what, call, jobs, deadline_ns=deadline,
                         on_progress=(lambda n, done=done: on_progress(done + n)) if on_progress else None,
                         **kwargs)
        passes.append(result)
        if result.deadline_reached or result.bytes == 0 or time.monotonic_ns() >= deadline:
            return _run_of(passes)


def _present(jobs: list[tuple[memoryview, str, int]]) -> list[tuple[memoryview, str, int]]:
    """The read jobs cut to the bytes the files have (a run by time may have stopped inside its first pass)."""
    out = []
    sizes: dict[str, int] = {}
    for view, path, offset in jobs:
        if path not in sizes:
            p = Path(path)
            sizes[path] = p.stat().st_size if p.exists() else 0
        length = min(len(view), max(sizes[path] - offset, 0))
        if length:
            out.append((view[:length], path, offset))
    return out


def _engine(what: str, call: Callable[..., native.IoResult], *args: Any, **kwargs: Any) -> native.IoResult:
    """``native.run_interruptible``; an OSError (an I/O error, a full disk) becomes StorageIOError naming ``what``."""
    try:
        return native.run_interruptible(call, *args, **kwargs)
    except OSError as exc:
        raise StorageIOError(f"{what} failed: {exc}") from exc


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def run_fs_bench(
    spec: FsBenchSpec,
    target: LocalDirectory,
    *,
    progress: Progress | None = None,
    memcpy_bps: float | None = None,
) -> FsBenchReport:
    """Run ``spec`` inside a scratch directory of ``target`` and return the report.

    With ``spec.runtime_s`` every run lasts that long: pass after pass over the same ``spec.size_bytes`` of
    files, the read passes over what the write left. The timeline's interval is ``spec.sample_every_s``.

    Raises InsufficientSpaceError before writing anything when the target lacks space, or after
    removing the scratch directory when the disk filled up during the run; StorageIOError when an
    I/O call fails or read-back data does not match what was written.
    """
    progress = progress or Progress()
    target.require_inodes(len(spec.file_sizes()) + (knobs.METADATA_FILES + 2 if spec.metadata else 0) + 2)
    target.require_free(required_bytes(spec))

    sizes = spec.file_sizes()
    buffer_bytes = spec.buffer_bytes
    # Source and sink are allocated once, filled, and also serve the memcpy probe: allocating and
    # freeing separate probe buffers just before timing slowed the following O_DIRECT reads here.
    probe_bytes = max(buffer_bytes, knobs.MEMCPY_PROBE_BYTES)
    log.info("buffers 2 x %s (allocated and filled before timing)", format_size(probe_bytes))
    source = native.AlignedBuffer(probe_bytes)
    native.fill_random(source, _SOURCE_SEED)
    sink = native.AlignedBuffer(probe_bytes)
    if memcpy_bps is None:
        memcpy_bps = native.copy_bandwidth(sink, source, 3)
        log.info("memcpy bandwidth %.2f GB/s", memcpy_bps / 1e9)
    source_view = memoryview(source)[:buffer_bytes]
    sink_view = memoryview(sink)[:buffer_bytes] if spec.read else None

    runs = spec.warmup + spec.repeat
    mount = mount_of(target.path)
    modes = [True, False] if spec.direct and spec.fsync and mount and tuning.is_network(mount.fstype) else [spec.direct]
    if len(modes) == 2:
        supported, why = native.probe_direct(str(target.path))
        if not supported:
            log.info("O_DIRECT not available on %s (%s): one durable mode to measure", target, why)
            modes = [True]
        else:
            log.info("%s is a %s mount: measuring both durable modes", target, mount.fstype)
    progress.begin(len(spec.grid()) * runs * spec.size_bytes * (2 if spec.read else 1) * len(modes))
    timeline = {"sample_interval_ns": max(int(spec.sample_every_s * 1e9), 1)}
    results: list[ConfigResult] = []
    metadata: list[MetadataResult] = []
    verified = False
    with target.scratch() as scratch, target.reporting_full_disk(required_bytes(spec)):
        paths = [scratch / f"shard-{i:05d}.bin" for i in range(len(sizes))]
        write_jobs = _jobs(source_view, paths, sizes)
        read_jobs = _jobs(sink_view, paths, sizes) if sink_view is not None else []
        sync = "fdatasync" if spec.fsync else "none"
        for threads, block_size, schedule in spec.grid():
            by_mode: dict[bool, tuple[list[_Run], list[_Run]]] = {m: ([], []) for m in modes}
            for run, direct in ((run, direct) for run in range(runs) for direct in modes):
                writes, reads = by_mode[direct]
                label = "warm-up" if run < spec.warmup else f"{run - spec.warmup + 1}/{spec.repeat}"
                name = f"{threads} thr x {format_size(block_size)}" + (
                    f" {schedule}" if len(spec.schedules) > 1 else "") + (
                    f" {'O_DIRECT' if direct else 'buffered'}" if len(modes) > 1 else "")
                progress.phase(f"{name}: write {label}")
                w = _timed(
                    f"{name}: write {label}", native.write, write_jobs, spec.runtime_s, threads=threads,
                    block_size=block_size, direct=direct, sync=sync, sync_dir=spec.fsync, schedule=schedule,
                    on_progress=progress.advance, **timeline,
                )
                progress.end_step(w.bytes)
                if sink_view is not None:
                    check = not verified
                    if check:
                        native.fill_random(sink_view, _SOURCE_SEED + 1)
                    progress.phase(f"{name}: read {label}")
                    jobs = _present(read_jobs) if spec.runtime_s is not None else read_jobs
                    r = _timed(
                        f"{name}: read {label}", native.read, jobs, spec.runtime_s, threads=threads,
                        block_size=block_size, direct=direct, drop_cache=True, schedule=schedule,
                        on_progress=progress.advance, **timeline,
                    )
                    progress.end_step(r.bytes)
                    if check:
                        covered = min(buffer_bytes, max(sizes), len(jobs[0][0]) if jobs else 0)
                        if sink_view[:covered] != source_view[:covered]:
                            raise StorageIOError(f"data read back from {scratch} differs from what was written")
                        verified = True
                    if run >= spec.warmup:
                        reads.append(r)
                if run >= spec.warmup:
                    writes.append(w)
                _remove(paths)
            results.append(_config_result(threads, block_size, schedule, by_mode, spec.runtime_s is not None,
                                          tuning.durable_default(mount.fstype if mount else None)))
        if spec.metadata:
            metadata = _metadata(spec, scratch, progress)
    return FsBenchReport(
        target=str(target),
        spec=spec,
        memcpy_bps=memcpy_bps,
        results=tuple(results),
        metadata=tuple(metadata),
        environment=_environment(target, mount, max(spec.threads)),
        data_verified=verified,
    )


def _environment(target: LocalDirectory, mount: MountInfo | None, streams: int) -> dict[str, Any]:
    """The run's environment, with the filesystem's layout and what it implies (Lustre, BeeGFS, NFS)."""
    environment = collect_environment(target.path)
    notes = layout_notes(target.path, mount.fstype, mount.options, streams) if mount else None
    return {**environment, "layout": notes} if notes else environment


def _config_result(threads: int, block_size: int, schedule: str,
                   by_mode: dict[bool, tuple[list[_Run], list[_Run]]], by_time: bool,
                   default: bool) -> ConfigResult:
    """One row: with both durable modes measured, the faster one's write and read (each beyond the noise,
    else ``default``: ``tuning.durable_default``), and both in ``durable_modes``."""
    phases = {m: (_phase("write", w, by_time), _phase("read", r, by_time) if r else None)
              for m, (w, r) in by_mode.items()}
    if len(phases) == 1:
        (write, read), = phases.values()
        return ConfigResult(threads, block_size, schedule, write, read)
    write_direct, write_why = tuning.faster_mode(phases[True][0].runs_gbps, phases[False][0].runs_gbps,
                                                 default=default)
    modes: dict[str, object] = {"write_direct": write_direct, "write_reason": write_why}
    for key, direct in (("direct", True), ("buffered", False)):
        write, read = phases[direct]
        modes[key] = {"write_gbps": write.gbps, "write_runs_gbps": write.runs_gbps,
                      "read_gbps": read.gbps if read else None, "read_runs_gbps": read.runs_gbps if read else None}
    read = phases[write_direct][1]
    if phases[True][1] is not None and phases[False][1] is not None:
        read_direct, read_why = tuning.faster_mode(phases[True][1].runs_gbps, phases[False][1].runs_gbps,
                                                   default=default, buffered=tuning.COLD_BUFFERED)
        modes.update(read_direct=read_direct, read_reason=read_why)
        read = phases[read_direct][1]
    return ConfigResult(threads, block_size, schedule, phases[write_direct][0], read, modes)


def _metadata(spec: FsBenchSpec, scratch: Path, progress: Progress) -> list[MetadataResult]:
    """Small-file create+write+fsync+close rate, once per distinct thread count."""
    out = []
    sync = "fsync" if spec.fsync else "none"
    for threads in sorted(set(spec.threads)):
        runs: list[native.IoResult] = []
        for run in range(spec.repeat):
            progress.phase(f"metadata: {knobs.METADATA_FILES} files, {threads} thr, run {run + 1}/{spec.repeat}")
            directory = scratch / f"metadata-{threads}-{run}"
            directory.mkdir()
            runs.append(_engine(
                f"metadata: {threads} thr", native.metadata_bench, str(directory), knobs.METADATA_FILES,
                knobs.METADATA_FILE_BYTES, threads=threads, sync=sync,
            ))
            shutil.rmtree(directory, ignore_errors=True)
        out.append(MetadataResult(
            threads=threads,
            files=knobs.METADATA_FILES,
            file_size_bytes=knobs.METADATA_FILE_BYTES,
            sync=sync,
            runs_s=tuple(r.seconds for r in runs),
            latencies_ns=np.concatenate([np.asarray(r.latencies_ns) for r in runs]),
        ))
    return out
