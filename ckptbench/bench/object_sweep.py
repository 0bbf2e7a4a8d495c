"""The object-storage benchmark: an (object size x concurrency x part size) sweep of uploads and
ranged parallel downloads against ``s3://bucket/prefix``, through the same S3 store the checkpoint
writer uses.

Order of one run: allocate and fill one source object once (outside every timed region); for each
configuration, ``warmup + repeat`` times: upload ``size // object_size`` objects from it (timed:
every PUT / multipart upload completed, which S3 acknowledges only once stored durably), read them
back (timed: ranged GETs of ``part_size`` in parallel), delete them (untimed). The first upload is
read back and compared with the source. Everything lives under a scratch prefix deleted on exit,
Ctrl-C included (objects and open multipart uploads).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ckptbench import native
from ckptbench.bench.environment import collect_environment
from ckptbench.bench.progress import Progress
from ckptbench.bench.records import (
    UNITS,
    BenchWarning,
    PhaseResult,
    document_header,
    noisy_warnings,
    setup_warnings,
)
from ckptbench.bench.stats import leaders
from ckptbench.bench.timeline import LatencyHistogram, Timeline
from ckptbench.errors import StorageIOError, UsageError
from ckptbench.storage.object_target import ObjectTarget
from ckptbench.storage.s3_pacing import Counts, totals
from ckptbench.units import format_size

log = logging.getLogger(__name__)

SCHEMA = "ckptbench.bench.objects/1"
_SOURCE_SEED = 0x6F626A73
#: S3's limits on a multipart part (every part but the last).
MIN_PART_BYTES = 5 * 2**20
MAX_PART_BYTES = 5 * 2**30


@dataclass(frozen=True)
class ObjectBenchSpec:
    """One object sweep. Each run moves ``size_bytes // object_size`` objects (at least one)."""

    size_bytes: int
    object_sizes: tuple[int, ...] = (64 * 2**20,)
    concurrency: tuple[int, ...] = (1, 8, 32)
    part_sizes: tuple[int, ...] = (16 * 2**20,)
    read: bool = True
    repeat: int = 3
    warmup: int = 1
    sample_every_s: float = 1.0  # the bandwidth timeline's interval

    def __post_init__(self) -> None:
        if self.size_bytes <= 0:
            raise UsageError(f"size {self.size_bytes} must be positive")
        if not self.sample_every_s > 0:
            raise UsageError(f"sample interval {self.sample_every_s!r} s must be positive")
        for obj in self.object_sizes:
            if obj <= 0:
                raise UsageError(f"object size {obj} must be positive")
            if obj > self.size_bytes:
                raise UsageError(f"object size {format_size(obj)} is larger than --size {format_size(self.size_bytes)}",
                                 hint="raise --size or lower --object-size")
        for part in self.part_sizes:
            if not MIN_PART_BYTES <= part <= MAX_PART_BYTES:
                raise UsageError(f"part size {format_size(part)} is outside S3's limits "
                                 f"({format_size(MIN_PART_BYTES)} to {format_size(MAX_PART_BYTES)})")
        if not self.object_sizes or not self.concurrency or not self.part_sizes:
            raise UsageError("object sizes, concurrency and part sizes need a value each")
        if any(c < 1 for c in self.concurrency):
            raise UsageError("concurrency must be at least 1")
        if self.repeat < 1 or self.warmup < 0:
            raise UsageError("repeat must be at least 1 and warmup zero or more")

    def grid(self) -> list[tuple[int, int, int]]:
        """(object size, concurrency, part size) to measure. Part sizes at or above an object's size all
        mean one PUT per object, so only the smallest of them is kept."""
        out = []
        for obj in self.object_sizes:
            parts = sorted(p for p in set(self.part_sizes) if p < obj)
            whole = [p for p in sorted(set(self.part_sizes)) if p >= obj][:1]
            for conc in self.concurrency:
                out.extend((obj, conc, p) for p in parts + whole)
        return out

    def objects_per_run(self, object_size: int) -> int:
        return max(1, self.size_bytes // object_size)

    def to_dict(self) -> dict[str, Any]:
        return {"workload": "objects", **asdict(self), "object_sizes": list(self.object_sizes),
                "concurrency": list(self.concurrency), "part_sizes": list(self.part_sizes)}


@dataclass(frozen=True)
class ObjectConfigResult:
    object_size: int
    objects: int
    concurrency: int
    part_size: int
    write: PhaseResult
    read: PhaseResult | None
    #: What the measured runs' requests met, per phase ("write", "read"): throttled answers,
    #: retries and the seconds they cost (``s3_pacing.Counts``).
    requests: dict[str, Counts] = field(default_factory=dict)

    @property
    def parts_per_object(self) -> int:
        return 1 if self.part_size >= self.object_size else math.ceil(self.object_size / self.part_size)

    def label(self) -> str:
        part = "1 PUT" if self.parts_per_object == 1 else f"{format_size(self.part_size)} parts"
        return f"{format_size(self.object_size)} objects x {self.concurrency} in flight, {part}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": {"object_size_bytes": self.object_size, "objects": self.objects,
                       "concurrency": self.concurrency, "part_size_bytes": self.part_size,
                       "parts_per_object": self.parts_per_object},
            "write": self.write.to_dict(math.inf),
            "read": self.read.to_dict(math.inf) if self.read else None,
            "requests": {op: counts.to_dict() for op, counts in self.requests.items()},
        }


@dataclass(frozen=True)
class ObjectBenchReport:
    target: str
    spec: ObjectBenchSpec
    results: tuple[ObjectConfigResult, ...]
    environment: dict[str, Any]
    data_verified: bool
    created: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    @property
    def best_index(self) -> int:
        """The configuration with the highest median upload rate."""
        return self.leaders[0]

    @property
    def leaders(self) -> list[int]:
        """The configurations tied for the best upload rate (:func:`stats.leaders`), best median first."""
        return leaders([r.write.runs_gbps for r in self.results])

    def warnings(self) -> list[BenchWarning]:
        out = setup_warnings(self.target, self.environment, self.spec.repeat, "configuration")
        out += noisy_warnings(self.results, "a busy server or network, or a small --size",
                              "use a larger --size or more --repeat")
        endpoint = (self.environment.get("target") or {}).get("endpoint") or ""
        if "127.0.0.1" in endpoint or "localhost" in endpoint:
            out.append(BenchWarning(
                "loopback-endpoint", f"the endpoint {endpoint} is on this machine: no network in the numbers",
                "run against the object store your training job will use"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **document_header(SCHEMA, self.created),
            "target": self.target,
            "spec": self.spec.to_dict(),
            "units": UNITS,
            "data_verified": self.data_verified,
            "results": [r.to_dict() for r in self.results],
            "best": self.best_index,
            "leaders": self.leaders,
            "warnings": [w.to_dict() for w in self.warnings()],
            "environment": self.environment,
        }


class _Requests:
    """Per-request latencies and progress of one timed phase (called from the store's workers)."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self.bytes = 0
        self.latencies_ns: list[int] = []
        self.start = time.perf_counter()
        self.completions: list[tuple[float, int]] = []  # (seconds since start, bytes) per request

    def __call__(self, nbytes: int, seconds: float) -> None:
        done_at = time.perf_counter() - self.start
        with self._lock:
            self.bytes += nbytes
            self.latencies_ns.append(int(seconds * 1e9))
            self.completions.append((done_at, nbytes))
            done = self.bytes
        self._progress.advance(done)


def _timed_transfer(progress: Progress, store: Any, transfer: Any, names: list[str], view: memoryview,
                    concurrency: int, part: int, interval_s: float) -> tuple[float, list[int], Timeline]:
    """Upload (``store.write_files``) or download (``read_files``) every object from/into ``view``:
    (seconds, per-request latencies in ns, bytes per interval by request completion)."""
    requests = store.on_request = _Requests(progress)
    transfer([(n, view) for n in names], threads=concurrency, block_size=part, direct=False)
    elapsed = time.perf_counter() - requests.start
    store.on_request = None
    progress.end_step(len(names) * len(view))
    return elapsed, requests.latencies_ns, Timeline.from_events(requests.completions, interval_s, elapsed)


def _record(sample: tuple[list[float], list[list[int]], list[Timeline]], measured: bool,
            timing: tuple[float, list[int], Timeline]) -> None:
    if measured:
        for kept, value in zip(sample, timing, strict=True):
            kept.append(value)


def _counted(counts: dict[str, Counts], op: str, measured: bool, before: Counts) -> None:
    """Add what the requests of one timed transfer met (since ``before``) to ``op``'s counts."""
    if measured:
        counts[op] = counts.get(op, Counts()).plus(totals().minus(before))


def _phase(op: str, bytes_per_run: int, runs_s: list[float], latencies: list[list[int]],
           timelines: list[Timeline]) -> PhaseResult:
    every = [x for run in latencies for x in run]
    return PhaseResult(op=op, bytes_per_run=bytes_per_run, runs_s=tuple(runs_s),
                       latencies_ns=np.asarray(every, dtype=np.int64),
                       thread_spans=(), direct_used=False, sync="s3-complete" if op == "write" else "none",
                       fallback_reason="", timelines=tuple(timelines), histogram=LatencyHistogram.from_samples(every))


def run_object_bench(spec: ObjectBenchSpec, target: ObjectTarget, *, progress: Progress | None = None) -> ObjectBenchReport:
    """Run ``spec`` under a scratch prefix of ``target`` (checked first) and return the report."""
    progress = progress or Progress()
    if target.scheme not in ("s3", "s3a"):
        raise UsageError(f"the object sweep measures s3:// targets; {target.scheme}:// has no part size or "
                         "concurrency to sweep", hint="use --workload checkpoint for other storage URLs")
    target.prepare()
    grid = spec.grid()
    biggest = max(spec.object_sizes)
    source = native.AlignedBuffer(biggest)
    native.fill_random(source, _SOURCE_SEED)
    sink = native.AlignedBuffer(biggest) if spec.read else None
    runs = spec.warmup + spec.repeat
    progress.begin(sum(spec.objects_per_run(o) * o for o, _, _ in grid) * runs * (2 if spec.read else 1))
    results: list[ObjectConfigResult] = []
    verified = False
    with target.scratch() as scratch:
        for index, (obj, conc, part) in enumerate(grid):
            store: Any = scratch.store(f"c{index}", part_size=part, max_concurrency=conc)
            count = spec.objects_per_run(obj)
            names = [f"object-{i:05d}" for i in range(count)]
            source_view = memoryview(source)[:obj]
            sink_view = memoryview(sink)[:obj] if sink is not None else None
            samples: dict[str, tuple[list[float], list[list[int]], list[Timeline]]] = {
                "upload": ([], [], []), "download": ([], [], [])}
            counts: dict[str, Counts] = {}
            name = (f"{format_size(obj)} x {conc}" + (f", {format_size(part)} parts" if part < obj else ""))
            for run in range(runs):
                label = "warm-up" if run < spec.warmup else f"{run - spec.warmup + 1}/{spec.repeat}"
                measured = run >= spec.warmup
                progress.phase(f"{name}: upload {label}")
                before = totals()
                _record(samples["upload"], measured,
                        _timed_transfer(progress, store, store.write_files, names, source_view, conc, part,
                                        spec.sample_every_s))
                _counted(counts, "write", measured, before)
                if sink_view is not None:
                    if not verified:
                        native.fill_random(sink_view, _SOURCE_SEED + 1)
                        store.read_files([(names[0], sink_view)], threads=conc, block_size=part, direct=False)
                        if sink_view != source_view:
                            raise StorageIOError(f"{scratch.url}: data read back differs from what was uploaded")
                        verified = True
                    progress.phase(f"{name}: download {label}")
                    before = totals()
                    _record(samples["download"], measured,
                            _timed_transfer(progress, store, store.read_files, names, sink_view, conc, part,
                                            spec.sample_every_s))
                    _counted(counts, "read", measured, before)
                store.remove(names)
            (writes, write_lat, write_tl), (reads, read_lat, read_tl) = samples["upload"], samples["download"]
            results.append(ObjectConfigResult(
                obj, count, conc, part, _phase("write", count * obj, writes, write_lat, write_tl),
                _phase("read", count * obj, reads, read_lat, read_tl) if reads else None, counts))
            log.info("%s: write %.3f GB/s%s", name, results[-1].write.gbps,
                     f", read {results[-1].read.gbps:.3f} GB/s" if results[-1].read else "")
    environment = collect_environment()
    environment["target"] = target.describe()
    return ObjectBenchReport(target=str(target), spec=spec, results=tuple(results), environment=environment,
                             data_verified=verified)
