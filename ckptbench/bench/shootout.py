"""The checkpoint benchmark: writers saving and loading the same synthetic state_dict, alternating.

Order of one run:

1. plan the workload (``workloads.plan_workload``), check memory and free space, build the
   state_dict once and measure memcpy bandwidth -- all outside every timed region;
2. ``warmup + repeat`` rounds; in each, the writers go in an order rotated every round, so the drift
   of a shared, noisy machine is spread over all of them. Per writer:
   save (timed until durable) -> drop the page cache -> load (timed, cold, every page in memory)
   -> verify bit-exact against the source (untimed) -> remove (untimed);
   then per async-capable writer (ckptbench, dcp): an async save (stall = until the call returns,
   persist = return -> durable), verified on the first measured round; then the same async save with
   the compute probe stepping until durable, the probe alone for about half a persist before and
   after it (interference = mean step time during / alone - 1);
3. memory (when ckptbench takes part): a fresh Checkpointer saves ``memory_saves`` times to one path,
   recording peak RSS during each save and RSS after each.

Cold reads: ``sync`` then ``echo 1 > /proc/sys/vm/drop_caches`` where permitted (root); otherwise
``posix_fadvise(DONTNEED)`` on the written files, and the report says so.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ckptbench import interrupts, knobs, native, safeio
from ckptbench.bench.environment import collect_environment
from ckptbench.bench.progress import Progress
from ckptbench.bench.records_ckpt import (
    AsyncResult,
    CheckpointBenchReport,
    MemoryResult,
    Timings,
    WriterFailure,
    WriterResult,
)
from ckptbench.bench.timeline import LatencyHistogram, Timeline, from_engine_calls, merge_histograms
from ckptbench.bench.workloads import CheckpointWorkload, build_state_dict, check_device, plan_workload, to_device
from ckptbench.bench.writers import (
    OBJECT_WRITERS,
    WRITERS,
    CkptbenchContender,
    ComputeProbe,
    Contender,
    make_writer,
    verify_state_dict,
)
from ckptbench.checkpoint.host_memory import available_memory_bytes
from ckptbench.errors import CkptbenchError, CompetitorFailedError, InsufficientSpaceError, StorageIOError, UsageError
from ckptbench.interrupts import QuietThread
from ckptbench.model.presets import load_model
from ckptbench.storage.local_target import LocalDirectory, space_failure
from ckptbench.storage.object_target import ObjectScratch, ObjectTarget
from ckptbench.storage.s3_pacing import Counts, totals
from ckptbench.storage.store import engine_calls
from ckptbench.units import format_size

log = logging.getLogger(__name__)

#: Saves of the memory measurement ("no growth across 10 repeated saves").
MEMORY_SAVES = 10
#: Copies of the checkpoint alive at once: the source, ckptbench's arena (its async saves; sync saves go
#: through the bounded staging ring), a loaded copy (or dcp's staging copy). The run under a launch holds
#: less (``shootout_launched.SYNC_COPIES``).
MEMORY_COPIES = 3.2
#: Checkpoints on disk at once: one, plus the previous one while an overwrite commits.
DISK_COPIES = 2
DROP_CACHES = "/proc/sys/vm/drop_caches"
#: Bounds of the probe's solo run before each probed save (about one persist long).
_PROBE_BASELINE_S = (0.25, 3.0)


def check_run(scale: float | None, size_bytes: int | None, repeat: int, warmup: int, threads: int | None) -> None:
    """What every checkpoint benchmark spec checks: one of scale (in (0, 1]) or size, the run counts, threads."""
    if (scale is None) == (size_bytes is None):
        raise UsageError("give --scale or --size, not both")
    if scale is not None and not 0 < scale <= 1:
        raise UsageError(f"scale {scale!r} must be in (0, 1] (a fraction of the model)")
    if size_bytes is not None and size_bytes <= 0:
        raise UsageError(f"size {size_bytes} must be positive")
    if repeat < 1:
        raise UsageError(f"repeat {repeat} must be at least 1")
    if warmup < 0:
        raise UsageError(f"warmup {warmup} must be zero or more")
    if threads is not None and threads < 1:
        raise UsageError(f"threads {threads} must be at least 1")


@dataclass(frozen=True)
class CheckpointBenchSpec:
    """One checkpoint benchmark: a model preset at ``scale`` (or ``size_bytes``), the writers compared,
    and how often. ``threads`` sets ckptbench's writer threads (and fio's jobs); None: its default."""

    model: str = "llama3-8b"
    scale: float | None = None
    size_bytes: int | None = None
    writers: tuple[str, ...] = ("ckptbench",)
    repeat: int = 3
    warmup: int = 1
    threads: int | None = None
    memory_saves: int = MEMORY_SAVES
    #: Where the state_dict lives while it is saved, and where loads put it: cpu, cuda or cuda:N.
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_run(self.scale, self.size_bytes, self.repeat, self.warmup, self.threads)
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise UsageError(f"device {self.device!r} must be cpu, cuda or cuda:N")
        unknown = [w for w in self.writers if w not in WRITERS]
        if not self.writers or unknown:
            raise UsageError(f"unknown writer {unknown[0] if unknown else ''!r}", hint=f"known: {', '.join(WRITERS)}")
        if len(set(self.writers)) != len(self.writers):
            raise UsageError(f"writers {list(self.writers)} name one twice")
        if self.memory_saves < 0:
            raise UsageError(f"memory saves {self.memory_saves} must be zero or more")

    def to_dict(self) -> dict[str, Any]:
        return {"workload": "checkpoint", **asdict(self), "writers": list(self.writers)}


class CacheDropper:
    """Makes the next read of a written checkpoint cold: the whole page cache where permitted, else the files'."""

    def __init__(self, drop_caches: str = DROP_CACHES) -> None:
        self._path = drop_caches
        try:
            self._drop_all()
            self.method, self.reason = "drop_caches", None
        except OSError as exc:
            self.method, self.reason = "fadvise", f"{drop_caches}: {exc.strerror or exc}"
            log.info("cannot drop the page cache (%s); using posix_fadvise(DONTNEED)", self.reason)

    def _drop_all(self) -> None:
        os.sync()
        with open(self._path, "w") as f:
            f.write("1")

    def drop(self, directory: Path) -> None:
        """Drop ``directory``'s files from the page cache; StorageIOError (one line) when that fails."""
        try:
            if self.method == "drop_caches":
                self._drop_all()
                return
            for path in directory.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    fd = safeio.open_regular(path)
                    try:
                        os.fdatasync(fd)  # DONTNEED drops clean pages only
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)
        except OSError as exc:
            where = exc.filename or directory
            raise StorageIOError(f"could not drop {where} from the page cache before the cold load: "
                                 f"{exc.strerror or exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        how = ("sync; echo 1 > /proc/sys/vm/drop_caches before every load" if self.method == "drop_caches"
               else "fdatasync + posix_fadvise(POSIX_FADV_DONTNEED) on every written file before every load")
        return {"method": self.method, "how": how, "reason": self.reason}


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


class PeakRss:
    """Peak resident set size over a region: VmHWM reset through /proc/self/clear_refs, else sampled."""

    SAMPLE_S = 0.002

    def __init__(self) -> None:
        self.exact = _reset_peak()
        self.method = ("VmHWM after resetting it through /proc/self/clear_refs" if self.exact
                       else f"VmRSS sampled every {self.SAMPLE_S * 1e3:.0f} ms")

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, int]]:
        """Yields a dict that holds ``base_bytes``, ``peak_bytes`` and ``extra_bytes`` after the block."""
        out: dict[str, int] = {}
        base = _status_bytes("VmRSS")
        samples = [base]
        stop = threading.Event()
        sampler = None
        if self.exact:
            _reset_peak()
        else:
            def sample() -> None:
                while not stop.wait(self.SAMPLE_S):
                    samples.append(_status_bytes("VmRSS"))

            sampler = QuietThread(target=sample, name="ckptbench-rss", daemon=True)
            sampler.start()
        try:
            yield out
        finally:
            if sampler is not None:
                stop.set()
                interrupts.join(sampler)
            peak = _status_bytes("VmHWM") if self.exact else max(samples + [_status_bytes("VmRSS")])
            out.update(base_bytes=base, peak_bytes=peak, extra_bytes=max(0, peak - base))


def required_memory_bytes(workload: CheckpointWorkload) -> int:
    return int(workload.total_bytes * MEMORY_COPIES)


def required_disk_bytes(workload: CheckpointWorkload) -> int:
    return int(workload.total_bytes * DISK_COPIES * (1 + knobs.FREE_SPACE_MARGIN)) + 64 * 2**20


def plan(spec: CheckpointBenchSpec, *, size_option: str = "--size") -> CheckpointWorkload:
    """The workload ``spec`` asks for (pure: raises UsageError/ConfigError for a bad model or size,
    naming ``size_option``)."""
    return plan_workload(load_model(spec.model), scale=spec.scale, size_bytes=spec.size_bytes, size_option=size_option)


class LocalPlaces:
    """Where the runs' checkpoints go on a filesystem: directories in the scratch directory; cold
    loads by dropping the page cache."""

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch
        self._dropper = CacheDropper()
        self.cache_drop = self._dropper.to_dict()

    def location(self, name: str) -> Path:
        return self._scratch / name

    def files(self, location: Path) -> tuple[int, int]:
        files = [p for p in location.rglob("*") if p.is_file()]
        return len(files), sum(p.stat().st_size for p in files)

    def make_cold(self, location: Path) -> None:
        self._dropper.drop(location)

    def remove(self, location: Path) -> None:
        shutil.rmtree(location, ignore_errors=True)

    def out_of_space(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by a writer here, is the filesystem running out of space or inodes."""
        return space_failure(exc, self._scratch) is not None


class ObjectPlaces:
    """Where the runs' checkpoints go on object storage: prefixes under the scratch prefix. Every
    load goes over the network; the server's own cache is out of reach, and the report says so."""

    cache_drop = {"method": "none", "reason": None,
                  "how": "object storage: every load reads over the network; the server may serve it from its cache"}

    def __init__(self, scratch: ObjectScratch) -> None:
        self._scratch = scratch

    def location(self, name: str) -> str:
        return self._scratch.location(name)

    def files(self, location: str) -> tuple[int, int]:
        return self._scratch.files(location)

    def make_cold(self, location: str) -> None:
        """Nothing to drop on this machine."""

    def remove(self, location: str) -> None:
        self._scratch.remove(location)

    def out_of_space(self, exc: BaseException) -> bool:
        """An object store does not fill up."""
        return False


@contextlib.contextmanager
def _places(target: LocalDirectory | ObjectTarget,
            workload: CheckpointWorkload) -> Iterator[LocalPlaces | ObjectPlaces]:
    if isinstance(target, LocalDirectory):  # a disk that fills up mid-run: one error saying so
        with target.scratch() as scratch, target.reporting_full_disk(required_disk_bytes(workload),
                                                                              size_hint=workload.size_hint):
            yield LocalPlaces(scratch)
    else:
        with target.scratch() as object_scratch:
            yield ObjectPlaces(object_scratch)


@dataclass
class _Samples:
    """What the measured rounds of one writer collected (sync saves and loads)."""

    save_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    peak_extra: list[int] = field(default_factory=list)
    files: int = 0
    disk_bytes: int = 0
    verified: bool | None = None
    details: dict[str, Any] | None = None
    # per op ("save", "load"): each measured run's timeline and latency histogram, where the writer went
    # through the engine (the ckptbench writer on a directory)
    series: dict[str, list[tuple[Timeline, LatencyHistogram]]] = field(
        default_factory=lambda: {"save": [], "load": []})
    # per op: what the measured runs' S3 requests met (the ckptbench writer on s3://; ``s3_pacing``)
    requests: dict[str, Counts] = field(default_factory=dict)


@dataclass
class _AsyncSamples:
    """What the measured rounds of one async writer collected."""

    stall_s: list[float] = field(default_factory=list)
    persist_s: list[float] = field(default_factory=list)
    alone: list[float] = field(default_factory=list)
    during: list[float | None] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    persist_with_probe_s: list[float] = field(default_factory=list)
    verified: bool = False
    details: dict[str, Any] = field(default_factory=dict)


def run_checkpoint_bench(
    spec: CheckpointBenchSpec,
    target: LocalDirectory | ObjectTarget,
    *,
    progress: Progress | None = None,
    workload: CheckpointWorkload | None = None,
) -> CheckpointBenchReport:
    """Run ``spec`` inside a scratch directory of ``target`` and return the report.

    Raises UsageError (before allocating or writing anything) for a bad model or size, a writer
    that cannot run here, or too little memory or space; StorageIOError when a load does not match
    what was saved.
    """
    progress = progress or Progress()
    workload = workload or plan(spec)
    nbytes = workload.total_bytes
    available = available_memory_bytes()
    if available is not None and required_memory_bytes(workload) > available:
        raise UsageError(
            f"the run keeps about {MEMORY_COPIES:g} copies of the {format_size(nbytes)} checkpoint in memory "
            f"({format_size(required_memory_bytes(workload))}) but only {format_size(available)} is available",
            hint=workload.size_hint)
    check_device(spec.device, nbytes)
    on_objects = isinstance(target, ObjectTarget)
    if on_objects:
        local_only = [w for w in spec.writers if w not in OBJECT_WRITERS]
        if local_only:
            raise UsageError(f"writer {local_only[0]!r} writes local files only; on {target.scheme}:// only "
                             f"{', '.join(OBJECT_WRITERS)} runs", hint="drop it from --writers")
        target.prepare()
    else:
        try:
            target.require_free(required_disk_bytes(workload))
        except InsufficientSpaceError as exc:
            exc.hint = f"free space, or {workload.size_hint}"  # the option of the command that sized it
            raise
    writers: list[Contender] = []
    try:
        for name in spec.writers:
            writers.append(make_writer(name, threads=spec.threads,
                                       storage_options=target.storage_options if on_objects else None,
                                       device=spec.device, objects=on_objects))
        return _run(spec, target, workload, writers, progress)
    finally:
        for w in writers:
            w.close()


def _run(spec: CheckpointBenchSpec, target: LocalDirectory | ObjectTarget, workload: CheckpointWorkload, writers: list[Contender],
         progress: Progress) -> CheckpointBenchReport:
    nbytes = workload.total_bytes
    async_writers = [w for w in writers if w.supports_async]
    rounds = spec.warmup + spec.repeat
    memory_saves = spec.memory_saves if any(isinstance(w, CkptbenchContender) for w in writers) else 0
    progress.begin(nbytes * (rounds * (2 * len(writers) + 2 * len(async_writers)) + memory_saves))

    progress.phase(f"building the state_dict ({format_size(nbytes)}, {len(workload.tensors)} tensors)")
    log.info("workload %s", workload.describe())
    state_dict = to_device(build_state_dict(workload), spec.device)
    for w in writers:
        w.prepare(state_dict)
    memcpy_bps = native.memcpy_bandwidth(knobs.MEMCPY_PROBE_BYTES, 3)
    rss = PeakRss()
    probe = ComputeProbe(device=spec.device) if async_writers else None
    samples = {w.name: _Samples() for w in writers}
    async_samples = {w.name: _AsyncSamples() for w in async_writers}
    memory = None
    failed: list[WriterFailure] = []
    with _places(target, workload) as places:
        for round_ in range(rounds):
            measured = round_ >= spec.warmup
            label = f"{round_ - spec.warmup + 1}/{spec.repeat}" if measured else f"warm-up {round_ + 1}/{spec.warmup}"
            for w in _rotated(_running(writers, failed), round_):
                name = f"{w.name}-{round_}"
                with _competitor(w, f"its save/load round {label}", places, failed, [name]):
                    _sync_round(w, state_dict, places, name, samples[w.name], measured, label, rss, progress, nbytes)
            for w in _rotated(_running(async_writers, failed), round_):
                name = f"{w.name}-async-{round_}"
                with _competitor(w, f"its async round {label}", places, failed, [name, f"{name}-probe"]):
                    _async_round(w, state_dict, places, name, async_samples[w.name],
                                 measured, label, probe, progress, nbytes)  # type: ignore[arg-type]
        if not _running(writers, failed):  # nothing to report: the failures are the outcome
            raise StorageIOError("; ".join(f"{f.writer}: {f.error}" for f in failed))
        ours = next((w for w in writers if isinstance(w, CkptbenchContender)), None)
        if ours is not None and memory_saves:
            ours.close()  # its arena goes; the memory measurement starts from a fresh Checkpointer
            memory = _memory(ours, state_dict, places, memory_saves, rss, progress, nbytes)
    writers, async_writers = _running(writers, failed), _running(async_writers, failed)
    results = []
    for w in writers:
        s = samples[w.name]
        run_bytes = w.bytes or nbytes
        results.append(WriterResult(
            writer=w.name, durable=w.durable, load_how=w.load_how,
            save=Timings("save", run_bytes, tuple(s.save_s)), load=Timings("load", run_bytes, tuple(s.load_s)),
            verified=s.verified, files=s.files, disk_bytes=s.disk_bytes,
            save_peak_extra_rss_bytes=tuple(s.peak_extra),
            details={**(s.details or {}), **(async_samples[w.name].details if w.name in async_samples else {}),
                     **({"s3_requests": {op: c.to_dict() for op, c in s.requests.items()}} if s.requests else {})},
            series={op: (tuple(t for t, _ in runs), merge_histograms(h for _, h in runs) if runs else None)
                    for op, runs in s.series.items()},
        ))
    async_results = tuple(
        AsyncResult(writer=w.name, how=w.async_how, stall_s=tuple(a.stall_s), persist_s=tuple(a.persist_s),
                    total_s=tuple(x + y for x, y in zip(a.stall_s, a.persist_s, strict=True)),
                    probe_alone_step_s=tuple(a.alone),
                    probe_during_step_s=tuple(a.during), probe_steps_during=tuple(a.steps),
                    persist_with_probe_s=tuple(a.persist_with_probe_s), verified=a.verified)
        for w in async_writers for a in [async_samples[w.name]])
    return CheckpointBenchReport(
        target=str(target), spec=spec, workload=workload, memcpy_bps=memcpy_bps, results=tuple(results),
        async_results=async_results, memory=memory, cache_drop=places.cache_drop,
        probe=probe.describe() if probe else None, rss_method=rss.method,
        environment=_environment(target), failed=tuple(failed),
    )


def _running(writers: list[Contender], failed: list[WriterFailure]) -> list[Contender]:
    """``writers`` less those that failed."""
    out = {f.writer for f in failed}
    return [w for w in writers if w.name not in out]


@contextlib.contextmanager
def _competitor(w: Contender, during: str, places: LocalPlaces | ObjectPlaces, failed: list[WriterFailure],
                names: list[str]) -> Iterator[None]:
    """A competitor's round: its failure (a ``CompetitorFailedError``: its save or load raised, or what it
    loaded did not match) is recorded in ``failed`` and its files removed, and the run goes on without it;
    a server quirk or a missing feature of one writer does not take the others' results with it.
    ckptbench's own failures (also in what it does around a competitor's calls: counting its files, making
    its reads cold, removing it), and a disk that filled up (every writer needs the space), end the run;
    ckptbench's writer raises no ``CompetitorFailedError`` (``writer_failures``, ``_verify``)."""
    try:
        yield
    except CompetitorFailedError as exc:
        if places.out_of_space(exc):
            raise
        message = str(exc).removeprefix(f"{w.name}: ")
        hint = _known_failure(message)
        failed.append(WriterFailure(w.name, during, f"{message}{f' ({hint})' if hint else ''}"))
        log.warning("%s failed during %s; the run goes on without it: %s", w.name, during, failed[-1].error)
        for name in names:
            with contextlib.suppress(Exception):
                places.remove(places.location(name))


#: Failures of competitors whose cause is known, and what it means (matched in the error's text).
_KNOWN_FAILURES = (
    ('Header "ETag" not found',
     "the server answered a multipart upload's completion without an ETag, as Ceph RGW 16 does; "
     "the AWS CRT client that s3torchconnector uses needs one"),
)


def _known_failure(message: str) -> str:
    return next((meaning for text, meaning in _KNOWN_FAILURES if text in message), "")


def _environment(target: LocalDirectory | ObjectTarget) -> dict[str, Any]:
    if isinstance(target, LocalDirectory):
        return collect_environment(target.path)
    environment = collect_environment()
    environment["target"] = target.describe()
    return environment


def _rotated(items: list[Contender], round_: int) -> list[Contender]:
    if not items:
        return []
    k = round_ % len(items)
    return items[k:] + items[:k]


def _sync_round(w: Contender, state_dict: dict[str, Any], places: Any, name: str, s: _Samples, measured: bool,
                label: str, rss: PeakRss, progress: Progress, nbytes: int) -> None:
    directory = places.location(name)
    progress.phase(f"{w.name}: save {label}")
    counted = isinstance(places, ObjectPlaces) and isinstance(w, CkptbenchContender)
    before = totals()
    with rss.measure() as peak, writer_failures(w, "save", directory), engine_calls() as saves:
        save_start = time.monotonic_ns()
        save_s = w.save(state_dict, directory)
    saved = totals().minus(before)
    progress.end_step(nbytes)
    s.files, s.disk_bytes = places.files(directory)
    s.details = w.details()
    places.make_cold(directory)
    progress.phase(f"{w.name}: load {label} (cold)")
    before = totals()
    with writer_failures(w, "load", directory), engine_calls() as loads:
        load_start = time.monotonic_ns()
        load_s, loaded = w.load(directory)
    read = totals().minus(before)
    progress.end_step(nbytes)
    if loaded is not None:
        progress.phase(f"{w.name}: verifying")
        _verify(w, state_dict, loaded, w.name)
        s.verified = True
    del loaded
    places.remove(directory)
    if measured:
        s.save_s.append(save_s)
        s.load_s.append(load_s)
        s.peak_extra.append(peak["extra_bytes"])
        if counted:
            for op, counts in (("save", saved), ("load", read)):
                s.requests[op] = s.requests.get(op, Counts()).plus(counts)
        for op, calls, start, seconds in (("save", saves, save_start, save_s), ("load", loads, load_start, load_s)):
            recorded = from_engine_calls(calls, start, seconds)
            if recorded is not None:
                s.series[op].append(recorded)
    log.info("%s %s: save %.3f s, load %.3f s", w.name, label, save_s, load_s)


def _async_save(w: Contender, state_dict: dict[str, Any], directory: Path | str,
                probe: ComputeProbe | None = None) -> tuple[float, float, list[float]]:
    """(stall_s, persist_s, probe step times while persisting) of one async save."""
    with writer_failures(w, "async save", directory):
        start = time.perf_counter()
        pending = w.save_async(state_dict, directory)
        staged = time.perf_counter()
        try:
            steps = probe.run_while(lambda: not pending.done()) if probe is not None else []
            pending.wait()
        except BaseException:
            # Ctrl-C or a failure: let the background save finish before the scratch directory is
            # removed, so it cannot write (or recreate directories) there afterwards.
            with contextlib.suppress(Exception):
                pending.wait()
            raise
    return staged - start, time.perf_counter() - staged, steps


@contextlib.contextmanager
def writer_failures(w: Contender, action: str, where: Path | str) -> Iterator[None]:
    """A competitor's failure (an OSError, torch's stream errors, dcp's CheckpointException) as one
    StorageIOError naming the writer and what it did; the original stays chained (``-v`` shows it,
    and a full disk is still recognised from it). A failure in a thread the writer started counts too:
    dcp's FileSystemWriter writes from threads of its own and does not report theirs."""
    if isinstance(w, CkptbenchContender):  # ours says what failed itself; anything else is a bug: show it
        yield
        return
    with _thread_failures() as in_threads:
        try:
            yield
        except (UsageError, KeyboardInterrupt, SystemExit, GeneratorExit):
            raise  # a missing package, a bad option, a full disk: the run's, not this writer's
        except StorageIOError as exc:  # the adapter's own check of the writer (fio's exit status)
            raise CompetitorFailedError(str(exc)) from exc
        except CkptbenchError:
            raise
        except BaseException as exc:  # dcp's CheckpointException is a BaseException
            cause = in_threads[0] if in_threads else exc
            raise CompetitorFailedError(f"{w.name}: {action} at {where} failed: {_first_failure(cause)}") from cause
    if in_threads:
        raise CompetitorFailedError(f"{w.name}: {action} at {where} failed: {_first_failure(in_threads[0])}") \
            from in_threads[0]


def _verify(w: Contender, source: dict[str, Any], loaded: dict[str, Any], label: str) -> None:
    """:func:`verify_state_dict`; a competitor's mismatch as a ``CompetitorFailedError``."""
    try:
        verify_state_dict(source, loaded, label)
    except StorageIOError as exc:
        if isinstance(w, CkptbenchContender):
            raise
        raise CompetitorFailedError(str(exc)) from exc


@contextlib.contextmanager
def _thread_failures() -> Iterator[list[BaseException]]:
    """The exceptions that end threads started inside the block, kept instead of printed as tracebacks."""
    before = set(threading.enumerate())
    failures: list[BaseException] = []
    previous = threading.excepthook

    def keep(args: threading.ExceptHookArgs) -> None:
        if args.thread is not None and args.thread not in before and isinstance(args.exc_value, BaseException):
            failures.append(args.exc_value)
        else:
            previous(args)

    threading.excepthook = keep
    try:
        yield failures
    finally:
        threading.excepthook = previous


def _first_failure(exc: BaseException) -> str:
    """One line for ``exc``: for dcp's CheckpointException, the first rank's own error."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        exc = first[0] if isinstance(first, tuple) and first and isinstance(first[0], BaseException) else exc
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def _async_round(w: Contender, state_dict: dict[str, Any], places: Any, name: str, a: _AsyncSamples, measured: bool,
                 label: str, probe: ComputeProbe, progress: Progress, nbytes: int) -> None:
    directory = places.location(name)
    progress.phase(f"{w.name}: async save {label}")
    stall_s, persist_s, _ = _async_save(w, state_dict, directory)
    a.details = w.async_details()
    progress.end_step(nbytes)
    if measured and not a.verified:
        progress.phase(f"{w.name}: verifying the async save")
        with writer_failures(w, "load", directory):
            _, loaded = w.load(directory)
        _verify(w, state_dict, loaded, f"{w.name} (async)")  # type: ignore[arg-type]
        a.verified = True
        del loaded
    places.remove(directory)

    progress.phase(f"{w.name}: async save {label} with the compute probe")
    # The probe alone right before and right after the probed save: a neighbour's load that drifts
    # during the measurement biases both sides alike.
    low, high = _PROBE_BASELINE_S
    window_s = min(high, max(low, persist_s)) / 2
    alone = probe.run_for(window_s)
    with_probe = places.location(name + "-probe")
    _, persist_probe_s, during = _async_save(w, state_dict, with_probe, probe)
    alone += probe.run_for(window_s)
    progress.end_step(nbytes)
    places.remove(with_probe)
    if measured:
        a.stall_s.append(stall_s)
        a.persist_s.append(persist_s)
        a.alone.append(statistics.fmean(alone))
        # The persist ended before one step finished: too short to see interference.
        a.during.append(statistics.fmean(during) if during else None)
        a.steps.append(len(during))
        a.persist_with_probe_s.append(persist_probe_s)
    log.info("%s async %s: stall %.3f s, persist %.3f s, probe %d steps", w.name, label, stall_s, persist_s,
             len(during))


def _memory(writer: CkptbenchContender, state_dict: dict[str, Any], places: Any, saves: int, rss: PeakRss,
            progress: Progress, nbytes: int) -> MemoryResult:
    directory = places.location("memory")
    gc.collect()
    ckpt = writer.fresh()
    rss_before = _status_bytes("VmRSS")
    peaks: list[int] = []
    after: list[int] = []
    try:
        for i in range(saves):
            progress.phase(f"memory: save {i + 1}/{saves}")
            with rss.measure() as peak:
                ckpt.save(state_dict, directory, overwrite=True, storage_options=writer.storage_options)
            progress.end_step(nbytes)
            peaks.append(peak["peak_bytes"])
            after.append(_status_bytes("VmRSS"))
    finally:
        ckpt.close()
    places.remove(directory)
    return MemoryResult(
        saves=saves, method=rss.method, checkpoint_bytes=nbytes, rss_before_bytes=rss_before,
        first_peak_extra_bytes=max(0, peaks[0] - rss_before),
        steady_peak_extra_bytes=max((max(0, p - a) for p, a in zip(peaks[1:], after[:-1], strict=True)), default=0),
        rss_after_bytes=tuple(after),
    )
