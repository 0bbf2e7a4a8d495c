"""The result schema: frozen records of what was measured, their checks, and their JSON form.

A JSON document has ``schema``, ``tool``, ``created``, ``target``, ``spec``, ``units``,
``environment``, ``memcpy_gbps``, ``results`` (one record per configuration, raw samples kept),
``best`` (index into results), ``metadata`` and ``warnings`` (each with a remedy).

Every measured phase (a result's ``write``/``read`` here and in the object sweep, a writer's
``save``/``load`` in the shoot-out, each operation's ``summary`` under a launch) also carries, as
``bench.timeline.series_dict`` writes them (None where nothing was recorded):

- ``timeline``: ``interval_s`` and ``runs``, one per measured run: ``bytes`` (completed in each interval
  since the run's start), ``duration_s`` (the last interval may be partial) and that run's ``steady_state``;
- ``latency_histogram``: ``unit`` ("ns"), ``count``, ``buckets`` as ``[low_ns, high_ns, operations]`` (log-linear:
  8 buckets per power of two, only those with operations) and ``p50_ms``, ``p90_ms``, ``p99_ms``, ``p99_9_ms``;
- ``steady_state`` of the run of median length: ``state`` (``burst``, ``steady``, ``drifting``, ``too-short``),
  ``burst_gbps``, ``sustained_gbps``, ``burst_bytes`` and ``change_s`` (null unless ``burst``).

A filesystem sweep run by time (``spec.runtime_s``) adds ``runs_bytes``: what each run moved. Under a launch
every rank's span also has its own ``timeline`` and ``latency_ms`` (p50, p99).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckptbench import __version__, knobs, safeio
from ckptbench.bench.stats import latency_percentiles_ms, leaders, relative_spread, summarize
from ckptbench.bench.timeline import LatencyHistogram, Timeline, series_dict
from ckptbench.errors import UsageError
from ckptbench.units import format_rate, format_size

SCHEMA = "ckptbench.bench.fs/1"

UNITS = {
    "gbps": "1e9 bytes per second",
    "_bytes": "bytes",
    "_s": "seconds",
    "latency_ms": "milliseconds",
    "ops_per_s": "operations per second",
    "block_size": "bytes",
}

MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}

#: Repeats whose (max - min) / median exceeds this are called noisy.
NOISY_SPREAD = 0.3


@dataclass(frozen=True)
class BenchWarning:
    code: str
    message: str
    remedy: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "remedy": self.remedy}


def setup_warnings(target: str, environment: dict[str, Any], repeat: int, per: str) -> list[BenchWarning]:
    """Warnings about how a run was set up, shared by every benchmark: a RAM filesystem, too few repeats."""
    out = []
    fstype = (environment.get("target") or {}).get("filesystem")
    if fstype in MEMORY_FILESYSTEMS:
        out.append(BenchWarning(
            "memory-filesystem",
            f"{target} is on {fstype}, which lives in RAM: these numbers are memory, not storage",
            "give a directory on the disk or mount you want to measure",
        ))
    if repeat < 3:
        out.append(BenchWarning(
            "few-repeats", f"only {repeat} measured run{'s' if repeat != 1 else ''} per {per}: "
            + ("no spread to judge" if repeat < 2 else "too few for a median and a spread to mean much"),
            "use --repeat 3 or more",
        ))
    return out


def cache_warnings(cache_drop: dict[str, Any]) -> list[BenchWarning]:
    """A warning when loads could not be made cold by dropping the page cache (``CacheDropper.to_dict()``)."""
    if cache_drop["method"] != "fadvise":
        return []
    return [BenchWarning(
        "cache-not-dropped",
        f"the page cache could not be dropped ({cache_drop['reason']}); loads ran after "
        "posix_fadvise(DONTNEED) on the written files, which the kernel may ignore in part",
        "run as root (echo 1 > /proc/sys/vm/drop_caches needs it) for reliably cold loads")]


def noisy_warnings(results: Any, cause: str, remedy: str) -> list[BenchWarning]:
    """One warning per write/read phase of a sweep whose repeats spread more than NOISY_SPREAD."""
    out = []
    for r in results:
        for phase in (r.write, r.read):
            if phase is not None and relative_spread(phase.runs_gbps) > NOISY_SPREAD:
                out.append(BenchWarning(
                    f"noisy-{phase.op}",
                    f"{r.label()}: {phase.op} repeats differ by {relative_spread(phase.runs_gbps):.0%} of the median "
                    f"({cause})", remedy))
    return out


def document_header(schema: str, created: str) -> dict[str, Any]:
    """The fields every result document starts with."""
    return {"schema": schema, "tool": {"name": "ckptbench", "version": __version__}, "created": created}


@dataclass(frozen=True)
class Timings:
    """Repeated runs of one operation (a write, a read, a save, a load), each moving ``bytes_per_run`` bytes."""

    op: str
    bytes_per_run: int
    runs_s: tuple[float, ...]

    @property
    def runs_gbps(self) -> list[float]:
        return [self.bytes_per_run / s / 1e9 if s > 0 else float("inf") for s in self.runs_s]

    @property
    def gbps(self) -> float:
        return summarize(self.runs_gbps)["median"]

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)

    def is_cached(self, memcpy_bps: float) -> bool:
        return self.gbps * 1e9 > knobs.CACHED_FRACTION_OF_MEMCPY * memcpy_bps

    def to_dict(self, memcpy_bps: float) -> dict[str, Any]:
        return {
            "gbps": self.gbps,
            "runs_gbps": self.runs_gbps,
            "summary_gbps": summarize(self.runs_gbps),
            "runs_s": list(self.runs_s),
            "summary_s": summarize(self.runs_s),
            "bytes_per_run": self.bytes_per_run,
            "cached": self.is_cached(memcpy_bps),
        }


@dataclass(frozen=True)
class PhaseResult(Timings):
    """Repeated runs of one direction (write or read) for one configuration of the filesystem bench."""

    latencies_ns: np.ndarray = field(repr=False, compare=False)
    thread_spans: tuple[tuple[tuple[float, float, int], ...], ...]  # per run: (start_s, end_s, bytes) per thread
    direct_used: bool
    sync: str
    fallback_reason: str
    timelines: tuple[Timeline, ...] = ()  # per run: bytes per interval
    histogram: LatencyHistogram | None = None  # every measured run's operations
    runs_bytes: tuple[int, ...] = ()  # per run, when runs by time moved different amounts

    @property
    def runs_gbps(self) -> list[float]:
        if not self.runs_bytes:
            return super().runs_gbps
        return [n / s / 1e9 if s > 0 else float("inf") for n, s in zip(self.runs_bytes, self.runs_s, strict=True)]

    def to_dict(self, memcpy_bps: float) -> dict[str, Any]:
        return {
            **super().to_dict(memcpy_bps),
            **({"runs_bytes": list(self.runs_bytes)} if self.runs_bytes else {}),
            "latency_ms": latency_percentiles_ms(self.latencies_ns),
            **series_dict(self.timelines, self.histogram),
            "threads_per_run": [
                [{"start_s": a, "end_s": b, "bytes": n} for a, b, n in run] for run in self.thread_spans
            ],
            "direct": self.direct_used,
            "sync": self.sync,
        }


@dataclass(frozen=True)
class ConfigResult:
    threads: int
    block_size: int
    schedule: str
    write: PhaseResult
    read: PhaseResult | None
    #: Both durable modes where both were measured (a network or FUSE filesystem): each mode's rates,
    #: and which is faster for writes and for cold reads, with why (``bench.fs``).
    durable_modes: dict[str, Any] | None = None

    def label(self) -> str:
        return f"{self.threads} thr x {format_size(self.block_size)} ({self.schedule})"

    def to_dict(self, spec_dict: dict[str, Any], memcpy_bps: float) -> dict[str, Any]:
        config = {
            "threads": self.threads,
            "block_size": self.block_size,
            "schedule": self.schedule,
            "size_bytes": spec_dict["size_bytes"],
            "files": spec_dict["files"],
            "file_size_bytes": spec_dict["file_size_bytes"],
            "direct_requested": spec_dict["direct"],
            "direct": self.write.direct_used,
            "fsync": self.write.sync != "none",
            "sync": self.write.sync,
            "direct_fallback_reason": self.write.fallback_reason or None,
        }
        return {
            "config": config,
            "write": self.write.to_dict(memcpy_bps),
            "read": self.read.to_dict(memcpy_bps) if self.read else None,
            **({"durable_modes": self.durable_modes} if self.durable_modes else {}),
        }


@dataclass(frozen=True)
class MetadataResult:
    threads: int
    files: int
    file_size_bytes: int
    sync: str
    runs_s: tuple[float, ...]
    latencies_ns: np.ndarray = field(repr=False, compare=False)

    @property
    def runs_ops_per_s(self) -> list[float]:
        return [self.files / s for s in self.runs_s]

    def to_dict(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "files": self.files,
            "file_size_bytes": self.file_size_bytes,
            "sync": self.sync,
            "ops_per_s": summarize(self.runs_ops_per_s)["median"],
            "runs_ops_per_s": self.runs_ops_per_s,
            "summary_ops_per_s": summarize(self.runs_ops_per_s),
            "latency_ms": latency_percentiles_ms(self.latencies_ns),
        }


@dataclass(frozen=True)
class FsBenchReport:
    target: str
    spec: Any  # config.FsBenchSpec (kept loose to avoid a cycle in type-only imports)
    memcpy_bps: float
    results: tuple[ConfigResult, ...]
    metadata: tuple[MetadataResult, ...]
    environment: dict[str, Any]
    data_verified: bool
    created: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    @property
    def best_index(self) -> int:
        """The configuration with the highest median write rate."""
        return self.leaders[0]

    @property
    def leaders(self) -> list[int]:
        """The configurations tied for the best write rate (:func:`stats.leaders`), best median first."""
        return leaders([r.write.runs_gbps for r in self.results])

    def warnings(self) -> list[BenchWarning]:
        out: list[BenchWarning] = []
        ceiling = format_rate(self.memcpy_bps)
        for r in self.results:
            for phase in (r.write, r.read):
                if phase is None or not phase.is_cached(self.memcpy_bps):
                    continue
                remedy = (
                    "drop --no-fsync so writes are durable inside the timed region, or use --direct"
                    if phase.op == "write"
                    else "use --direct, or a --size larger than RAM, so reads come from the device"
                )
                out.append(BenchWarning(
                    f"cached-{phase.op}",
                    f"{r.label()}: {phase.op} {format_rate(phase.gbps * 1e9)} is above "
                    f"{knobs.CACHED_FRACTION_OF_MEMCPY:.0%} of this machine's memcpy bandwidth ({ceiling}): "
                    "it was served by the page cache, not the storage",
                    remedy,
                ))
        first = self.results[0].write
        if self.spec.direct and not first.direct_used and self.results[0].durable_modes is None:
            out.append(BenchWarning(
                "direct-fallback",
                f"O_DIRECT is not available here ({first.fallback_reason}); "
                f"measured buffered I/O with {first.sync} instead",
                "nothing to do if this is a FUSE/network filesystem; results stay durable",
            ))
        if not self.spec.fsync and not first.direct_used:
            out.append(BenchWarning(
                "not-durable",
                "buffered writes without fsync: the numbers include data still in the page cache",
                "drop --no-fsync (the default is durable)",
            ))
        out += setup_warnings(self.target, self.environment, self.spec.repeat, "configuration")
        out += noisy_warnings(self.results, "a busy machine or a small --size",
                              "use a larger --size or more --repeat, on a quiet machine")
        return out

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec.to_dict()
        return {
            **document_header(SCHEMA, self.created),
            "target": self.target,
            "spec": spec,
            "units": UNITS,
            "memcpy_gbps": self.memcpy_bps / 1e9,
            "data_verified": self.data_verified,
            "results": [r.to_dict(spec, self.memcpy_bps) for r in self.results],
            "best": self.best_index,
            "leaders": self.leaders,
            "metadata": [m.to_dict() for m in self.metadata],
            "warnings": [w.to_dict() for w in self.warnings()],
            "environment": self.environment,
        }


def read_result(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or a one-line ``UsageError`` naming the file and what is wrong."""
    try:
        text = safeio.read_text(path, safeio.MAX_RESULT_BYTES, "result file")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a result file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not JSON (not UTF-8 text)") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        document = json.loads(text, parse_constant=_non_finite)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # NaN/Infinity, or an integer too long to convert
        raise UsageError(f"{path}: not JSON ({exc})") from None
    except RecursionError:
        raise UsageError(f"{path}: not a ckptbench result (JSON nested too deeply to read)") from None
    if not isinstance(document, dict):
        raise UsageError(f"{path}: not a ckptbench result (a JSON {type(document).__name__}, not an object)")
    return document


def _non_finite(constant: str) -> float:
    """``parse_constant`` for :func:`json.loads`: Python accepts NaN and Infinity, JSON does not."""
    raise ValueError(f"{constant} is not a JSON number")
