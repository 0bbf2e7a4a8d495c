"""The checkpoint benchmark under a distributed launch: every rank saves and loads its share at once.

Run by every rank of a torchrun/srun launch (``ckptbench bench`` detects it). Order:

1. the ranks agree on the target and every option (a rank started differently is an error naming
   it); the whole checkpoint is planned from the model preset (``--scale``/``--size`` is the size of
   all ranks' shares together) and split by ``--dp/--tp/--pp/--zero`` (``bench.sharding``); every
   rank checks its own memory and free space and the verdicts are gathered (one rank short means
   every rank stops, naming it);
2. rank 0 names a scratch directory (or prefix) and every rank joins it; each rank builds its
   state_dict, outside every timed region;
3. ``warmup + repeat`` rounds of: barrier -> distributed save (each rank its shards, rank 0 the
   manifest after all are durable) -> barrier; drop the page cache; barrier -> distributed load
   (cold) -> barrier; then the same save async (stall = until the call returns, persist = until
   durable). Every rank times its own part from the barrier's exit, so no clocks are compared
   across machines.

Host memory: a rank holds its share about once (``SYNC_COPIES``) plus the staging ring. Sync saves
go through the bounded staging ring (``checkpoint/ring.py``); loads read through the ring straight
into the share's own tensors (``load(into=..., bounded_memory=True)``), every CRC-32C checked, and each
load is verified bit-exact by the CRC-32C of every tensor of the share, taken before the first save and
again after the load (untimed). An async save needs a snapshot of what it saves (the staging arena): on
a host whose memory (``knobs.BENCH_MEMORY_BYTES``, else what is available) cannot hold the share twice
per rank, the async saves save a part of each share (the largest that fits) and their times are
scaled to the share, which the report says (``async_part``). Every rank's peak RSS is in the report.

Aggregation as MLPerf Storage does it: a round's duration is the slowest rank's, throughput the
total bytes of all ranks over that duration. The per-rank spans are kept: the slowest and fastest
rank and the spread between them (stragglers are what a synchronous checkpoint waits for).
Coordination overhead = barrier-to-barrier time on rank 0 minus the slowest rank's own work (save:
planning, staging and writing its shards; load: reading and rebuilding its part): the agreement, the
save lock, the two-phase commit, the manifest broadcast, the barriers.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptbench import __version__, knobs
from ckptbench.bench.environment import collect_environment
from ckptbench.bench.progress import Progress
from ckptbench.bench.records import NOISY_SPREAD, BenchWarning, cache_warnings, document_header, setup_warnings
from ckptbench.bench.sharding import check_world, shard_workload, world_bytes
from ckptbench.bench.shootout import (
    LocalPlaces,
    ObjectPlaces,
    _reset_peak,
    _status_bytes,
    check_run,
    required_disk_bytes,
)
from ckptbench.bench.stats import relative_spread, summarize
from ckptbench.bench.timeline import (
    LatencyHistogram,
    Timeline,
    from_engine_calls,
    merge_histograms,
    merge_timelines,
    series_dict,
)
from ckptbench.bench.workloads import CheckpointWorkload, plan_workload
from ckptbench.checkpoint.api import Checkpointer
from ckptbench.checkpoint.distributed import World
from ckptbench.checkpoint.host_memory import available_memory_bytes
from ckptbench.checkpoint.ring import ring_bytes
from ckptbench.errors import InsufficientSpaceError, UsageError
from ckptbench.model.presets import load_model
from ckptbench.model.sizing import Parallelism
from ckptbench.storage.local_target import LocalDirectory
from ckptbench.storage.object_target import ObjectTarget
from ckptbench.storage.store import engine_calls
from ckptbench.units import format_size

log = logging.getLogger(__name__)

SCHEMA = "ckptbench.bench.distributed/1"
UNITS = {"*_s": "seconds", "*_bytes": "bytes", "*_gbps": "GB/s (1e9 bytes per second)"}
#: Seed of rank r's state_dict: a different one per rank, so no two ranks write the same bytes.
_RANK_SEED_STEP = 7919
OPS = ("save", "load", "async")
#: Host memory a rank holds for its share, in shares: the share's tensors, plus planning, manifest and
#: the allocator's slack (sync saves and loads go through the staging ring, counted apart).
SYNC_COPIES = 1.1
#: The smallest part of a share an async save may be measured on (a smaller one is refused).
ASYNC_PART_MIN_BYTES = 16 * 2**20


def async_part_bytes(share_bytes: int, local_ranks: int, memory_bytes: int | None) -> tuple[int, str | None]:
    """How much of its ``share_bytes`` each of ``local_ranks`` ranks saves async, given the host's
    ``memory_bytes`` (None: unknown, the whole share), and the problem when even the sync saves or the
    smallest async part do not fit. The whole share needs ``SYNC_COPIES`` + 1 shares and the ring per
    rank; with less, the largest part that fits (the async snapshot holds that part once more)."""
    if memory_bytes is None:
        return share_bytes, None
    per_rank = memory_bytes // max(1, local_ranks)
    sync = int(share_bytes * SYNC_COPIES) + ring_bytes()
    part = min(share_bytes, per_rank - sync)
    if part >= share_bytes:
        return share_bytes, None
    if part < min(share_bytes, ASYNC_PART_MIN_BYTES):
        return part, (f"{local_ranks} rank(s) on this host keep about {format_size(sync * local_ranks)} in memory "
                      f"(+ {format_size(min(share_bytes, ASYNC_PART_MIN_BYTES) * local_ranks)} for the async saves) "
                      f"but {format_size(memory_bytes)} is available")
    return part, None


@dataclass(frozen=True)
class DistributedBenchSpec:
    """The checkpoint benchmark of a launch: the model preset at ``scale`` (or ``size_bytes``) for all
    ranks together, split by ``parallelism`` (dp x tp x pp must be the launch's size)."""

    model: str = "llama3-8b"
    scale: float | None = None
    size_bytes: int | None = None
    parallelism: Parallelism = field(default_factory=Parallelism)
    repeat: int = 3
    warmup: int = 1
    threads: int | None = None
    #: "cpu", or "cuda": each rank's state_dict on its own GPU (cuda:LOCAL_RANK, wrapping around the GPUs the
    #: host has), saved with device-to-host staging and loaded back to it, as training does.
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_run(self.scale, self.size_bytes, self.repeat, self.warmup, self.threads)
        if self.device not in ("cpu", "cuda"):
            raise UsageError(f"device {self.device!r} must be cpu or cuda under a launch (each rank uses its own GPU)")

    def to_dict(self) -> dict[str, Any]:
        return {"workload": "checkpoint", "writer": "ckptbench", **asdict(self)}


@dataclass(frozen=True)
class RankSpan:
    """One rank's part of one operation, timed from the barrier before it on that rank's clock.
    ``io_s``: its own work, no waits for other ranks (save: plan + stage + shards durable; load:
    reading and rebuilding its part); ``end_s``: the call returned; ``barrier_s``: then waiting in
    the barrier after it (for slower ranks)."""

    rank: int
    host: str
    nbytes: int
    io_s: float
    end_s: float
    barrier_s: float
    stall_s: float | None = None  # async saves: until the call returned
    timeline: Timeline | None = None  # the engine's bytes per second on this rank, from the barrier
    histogram: LatencyHistogram | None = None  # this rank's engine operations
    #: Object storage: what this rank's S3 data requests met (``s3_pacing.Counts``: requests, throttled
    #: answers, retries, other failed attempts, the seconds retries cost); None when it sent none.
    requests: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "host": self.host, "bytes": self.nbytes, "io_s": self.io_s,
                               "end_s": self.end_s, "barrier_s": self.barrier_s}
        if self.stall_s is not None:
            out["stall_s"] = self.stall_s
        if self.timeline is not None:
            out["timeline"] = self.timeline.to_dict()
        if self.histogram is not None:
            out["latency_ms"] = {name: self.histogram.percentile_ns(q) / 1e6 if self.histogram.count else None
                                 for name, q in (("p50", 50), ("p99", 99))}
        if self.requests is not None:
            out["s3_requests"] = self.requests
        return out


@dataclass(frozen=True)
class RoundResult:
    """Every rank's span of one operation in one round, and rank 0's barrier-to-barrier time."""

    op: str
    round: int
    spans: tuple[RankSpan, ...]
    barrier_to_barrier_s: float

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.spans)

    @property
    def duration_s(self) -> float:
        return max(s.end_s for s in self.spans)

    @property
    def gbps(self) -> float:
        return self.total_bytes / self.duration_s / 1e9 if self.duration_s > 0 else float("inf")

    @property
    def overhead_s(self) -> float:
        """Barrier to barrier minus the slowest rank's own work: what coordinating cost."""
        return max(0.0, self.barrier_to_barrier_s - max(s.io_s for s in self.spans))

    @property
    def stall_s(self) -> float:
        """Async saves: the longest any rank was blocked."""
        return max(s.stall_s or 0.0 for s in self.spans)

    @property
    def timeline(self) -> Timeline | None:
        """Every rank's timeline summed (they start at the same barrier); None when none recorded one."""
        timelines = [s.timeline for s in self.spans if s.timeline is not None]
        return merge_timelines(timelines) if timelines else None

    @property
    def requests(self) -> dict[str, Any] | None:
        """Every rank's S3 request counts summed (None when no rank sent any)."""
        return sum_requests([s.requests for s in self.spans])

    def slowest(self) -> RankSpan:
        return max(self.spans, key=lambda s: s.end_s)

    def fastest(self) -> RankSpan:
        return min(self.spans, key=lambda s: s.end_s)

    def to_dict(self) -> dict[str, Any]:
        ends = [s.end_s for s in self.spans]
        out = {
            "round": self.round, "duration_s": self.duration_s, "total_bytes": self.total_bytes, "gbps": self.gbps,
            "barrier_to_barrier_s": self.barrier_to_barrier_s, "overhead_s": self.overhead_s,
            "slowest_rank": self.slowest().rank, "fastest_rank": self.fastest().rank,
            "rank_spread": relative_spread(ends),
            "ranks": [s.to_dict() for s in self.spans],
        }
        if self.op == "async":
            out["stall_s"] = self.stall_s
        if self.requests is not None:
            out["s3_requests"] = self.requests
        return out


@dataclass(frozen=True)
class DistributedBenchReport:
    target: str
    spec: DistributedBenchSpec
    workload: CheckpointWorkload
    rank_bytes: tuple[int, ...]
    hosts: tuple[str, ...]
    rounds: tuple[RoundResult, ...]  # measured rounds only
    cache_drop: dict[str, Any]
    environment: dict[str, Any]
    launch: dict[str, Any]
    #: Host memory per rank: share, peak RSS, the RSS before the share was built, how measured.
    memory: dict[str, Any] = field(default_factory=dict)
    #: Async saves measured on a part of each share (memory), scaled to the share; None: the whole share.
    async_part: dict[str, Any] | None = None
    created: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    def of(self, op: str) -> list[RoundResult]:
        return [r for r in self.rounds if r.op == op]

    def summary(self, op: str) -> dict[str, Any]:
        rounds = self.of(op)
        out = {
            "gbps": summarize([r.gbps for r in rounds]),
            "duration_s": summarize([r.duration_s for r in rounds]),
            "overhead_s": summarize([r.overhead_s for r in rounds]),
            "rank_spread": summarize([relative_spread([s.end_s for s in r.spans]) for r in rounds]),
            "slowest_rank": [r.slowest().rank for r in rounds],
        }
        if op == "async":
            out["stall_s"] = summarize([r.stall_s for r in rounds])
        requests = sum_requests([r.requests for r in rounds])
        if requests is not None:  # every rank's, every measured round's
            out["s3_requests"] = requests
        timelines = [t for r in rounds if (t := r.timeline) is not None]
        histograms = [s.histogram for r in rounds for s in r.spans if s.histogram is not None]
        out.update(series_dict(timelines, merge_histograms(histograms) if histograms else None))
        return out

    def warnings(self) -> list[BenchWarning]:
        out = setup_warnings(self.target, self.environment, self.spec.repeat, "operation")
        out += cache_warnings(self.cache_drop)
        for op in OPS:
            spread = relative_spread([r.gbps for r in self.of(op)])
            if spread > NOISY_SPREAD:
                out.append(BenchWarning(f"noisy-{op}", f"{op}: repeats differ by {spread:.0%} of the median",
                                        "use a larger --scale/--size or more --repeat, on a quiet machine"))
        if self.async_part is not None:
            part = self.async_part
            out.append(BenchWarning(
                "async-part", f"async saves were measured on {format_size(part['measured_bytes'])} of each rank's "
                f"{format_size(part['share_bytes'])} share (host memory) and their times scaled by "
                f"{part['scaled_by']:.2f}", "run on a host with about twice the ranks' shares of free memory "
                "to measure the whole share (a GPU host's arena is the only host copy)"))
        idle = [r for r, n in enumerate(self.rank_bytes) if n == 0]
        if idle:
            out.append(BenchWarning(
                "idle-ranks", f"rank{'s' if len(idle) > 1 else ''} {', '.join(map(str, idle[:8]))}"
                f"{' ...' if len(idle) > 8 else ''} write nothing with this layout "
                f"({self.spec.parallelism.sharding} across dp={self.spec.parallelism.dp})",
                "use --zero zero1/zero2/zero3 (or fsdp) to spread the state over data-parallel ranks"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **document_header(SCHEMA, self.created),
            "target": self.target,
            "spec": self.spec.to_dict(),
            "units": UNITS,
            "launch": self.launch,
            "workload": self.workload.to_dict(),
            "rank_bytes": list(self.rank_bytes),
            "hosts": list(self.hosts),
            "cache_drop": self.cache_drop,
            "aggregation": "MLPerf Storage: duration = slowest rank (from the barrier's exit), throughput = "
                           "bytes of all ranks / that duration; overhead = barrier-to-barrier on rank 0 minus "
                           "the slowest rank's own work (save: plan, stage, write; load: read, rebuild)",
            "summary": {op: self.summary(op) for op in OPS if self.of(op)},
            "rounds": {op: [r.to_dict() for r in self.of(op)] for op in OPS},
            "data_verified": True,
            "verified_how": "every load: CRC-32C of every tensor checked against the manifest while reading, and "
                            "the CRC-32C of every tensor of each rank's share after the load equal to before the "
                            "first save (bit-exact)",
            "memory": self.memory,
            "async_part": self.async_part,
            "warnings": [w.to_dict() for w in self.warnings()],
            "environment": self.environment,
            "tool_version": __version__,
        }


def plan(spec: DistributedBenchSpec, world_size: int) -> CheckpointWorkload:
    """The whole checkpoint ``spec`` asks for (pure); UsageError when the layout does not fit the launch."""
    check_world(spec.parallelism, world_size)
    return plan_workload(load_model(spec.model), scale=spec.scale, size_bytes=spec.size_bytes)


@contextlib.contextmanager
def _shared_places(target: LocalDirectory | ObjectTarget, world: World, needs_bytes: int) -> Iterator[Any]:
    """Rank 0 names a scratch directory (prefix); every rank joins it and removes it when done."""
    from ckptbench.storage.local_target import SCRATCH_PREFIX, scratch_name
    from ckptbench.storage.object_target import SCRATCH_PREFIX as OBJECT_PREFIX

    prefix = OBJECT_PREFIX if isinstance(target, ObjectTarget) else SCRATCH_PREFIX
    name = world.broadcast(scratch_name(prefix) if world.is_first else None, "naming the scratch directory")
    with target.scratch(shared_name=name) as scratch:
        if isinstance(target, ObjectTarget):
            yield ObjectPlaces(scratch)
            return
        with target.reporting_full_disk(needs_bytes):  # a disk that fills up: one line, saying so
            yield LocalPlaces(scratch)


def _refuse_if_short(world: World, problem: str | None) -> None:
    """Every rank's verdict gathered: one rank short of memory or space stops them all, named."""
    problems = world.all_gather(problem, "checking memory and space")
    bad = [(r, p) for r, p in enumerate(problems) if p]
    if bad:
        listing = "; ".join(f"rank {r}: {p}" for r, p in bad[:4])
        raise UsageError(f"not every rank can run this: {listing}", hint="lower --scale/--size")


def run_distributed_bench(spec: DistributedBenchSpec, target: LocalDirectory | ObjectTarget, world: World, *,
                          progress: Progress | None = None) -> DistributedBenchReport:
    """Run ``spec`` on every rank of ``world`` (each calls this); every rank returns the same report.

    Raises UsageError on every rank when the ranks disagree on the target or options, when the
    layout does not match the launch, or when a rank lacks memory or space; RankFailedError when
    another rank fails or dies (naming it)."""
    progress = progress or Progress()
    world.agree("the target and the benchmark options", (str(target), spec.to_dict()))
    workload = plan(spec, world.world_size)
    mine = shard_workload(workload, spec.parallelism, world.rank)
    per_rank = world_bytes(workload, spec.parallelism)
    hosts = tuple(world.all_gather(world.host, "collecting host names"))
    local_ranks = hosts.count(world.host)  # ranks sharing this host's memory (torchrun or srun alike)
    first_here = hosts.index(world.host) == world.rank  # cleans this host's disk (node-local targets)
    baseline_rss = _status_bytes("VmRSS")
    exact_peak = _reset_peak()
    memory_bytes = knobs.BENCH_MEMORY_BYTES or available_memory_bytes()
    if spec.device == "cuda":  # the share on the GPU: the host holds the arena and the loads' read buffer
        part_bytes, problem = mine.total_bytes, None
        need = 2 * mine.total_bytes * local_ranks + ring_bytes()
        if memory_bytes is not None and need > memory_bytes:
            problem = (f"{local_ranks} rank(s) on this host keep about {format_size(need)} in host memory but "
                       f"{format_size(memory_bytes)} is available")
    else:
        part_bytes, problem = async_part_bytes(mine.total_bytes, local_ranks, memory_bytes)
    if problem is None and isinstance(target, LocalDirectory):
        try:
            target.require_free(required_disk_bytes(workload))
        except InsufficientSpaceError as exc:
            problem = str(exc)
    device = "cpu"
    if problem is None and spec.device == "cuda":
        from ckptbench.bench.workloads import rank_device

        device, problem = rank_device(world.local_rank, mine.total_bytes)
    _refuse_if_short(world, problem)
    if isinstance(target, ObjectTarget) and world.is_first:
        target.prepare()

    rounds = spec.warmup + spec.repeat
    progress.begin(mine.total_bytes * rounds * 3)
    progress.phase(f"rank {world.rank}: building its share ({format_size(mine.total_bytes)}, "
                   f"{len(mine.tensors)} tensors)")
    from ckptbench.bench.workloads import _SEED, build_state_dict, fingerprint, part_of, to_device

    state_dict = to_device(build_state_dict(mine, seed=_SEED + world.rank * _RANK_SEED_STEP), device)
    crcs = fingerprint(state_dict)
    async_state, part_bytes = part_of(state_dict, part_bytes)
    ckpt = Checkpointer(threads=spec.threads)
    options = target.storage_options if isinstance(target, ObjectTarget) else None  # endpoint, credentials, client
    measured: list[RoundResult] = []
    try:
        with _shared_places(target, world, required_disk_bytes(workload)) as places:
            for round_ in range(rounds):
                label = (f"{round_ - spec.warmup + 1}/{spec.repeat}" if round_ >= spec.warmup
                         else f"warm-up {round_ + 1}/{spec.warmup}")
                location = places.location(f"round-{round_}")
                progress.phase(f"save {label} ({world.world_size} ranks)")
                save = _timed(world, "save", round_, _save, ckpt, state_dict, location, options)
                progress.end_step(mine.total_bytes)
                if world.local_rank == 0:
                    places.make_cold(location)
                world.barrier("dropping the page cache")
                progress.phase(f"load {label} (cold)")
                load = _timed(world, "load", round_, _load, ckpt, location, state_dict, options)
                progress.end_step(mine.total_bytes)
                progress.phase(f"verifying {label}")
                _verify(state_dict, crcs, f"rank {world.rank}")
                progress.phase(f"async save {label}")
                async_location = places.location(f"round-{round_}-async")
                async_ = _timed(world, "async", round_, _save_async, ckpt, async_state, async_location,
                                mine.total_bytes, options)
                progress.end_step(mine.total_bytes)
                if round_ == spec.warmup:  # the first measured round: the async save is verified too
                    progress.phase("verifying the async save")
                    ckpt.load(async_location, distributed=True, into=async_state, bounded_memory=True,
                              storage_options=options)
                    _verify(state_dict, crcs, f"rank {world.rank} (async)")
                world.barrier("removing the round's checkpoints")
                if first_here:  # one rank per host: node-local disks are emptied too
                    places.remove(location)
                    places.remove(async_location)
                if round_ >= spec.warmup:
                    measured += [save, load, async_]
            world.barrier("finishing")
            cache_drop = places.cache_drop
        peak_rss = _status_bytes("VmHWM") if exact_peak else _max_rss_bytes()
    finally:
        ckpt.close()
    ranks = world.all_gather({"rank": world.rank, "share_bytes": mine.total_bytes, "peak_rss_bytes": peak_rss,
                              "baseline_rss_bytes": baseline_rss, "async_bytes": part_bytes},
                             "collecting the memory")
    memory = {"method": ("VmHWM of /proc/self/status, reset through /proc/self/clear_refs once the rank started "
                         "(imports done)" if exact_peak else "getrusage(RUSAGE_SELF).ru_maxrss (since the process "
                                                             "started)"),
              "host_memory_bytes": memory_bytes, "ring_bytes": ring_bytes(), "sync_copies": SYNC_COPIES,
              "ranks": ranks}
    async_part = None
    if part_bytes < mine.total_bytes or any(r["async_bytes"] < r["share_bytes"] for r in ranks):
        async_part = {"measured_bytes": min(r["async_bytes"] for r in ranks),
                      "share_bytes": max(r["share_bytes"] for r in ranks),
                      "scaled_by": max(r["share_bytes"] / max(1, r["async_bytes"]) for r in ranks),
                      "why": "the host's memory cannot hold each rank's share twice (its tensors and the async "
                             "save's snapshot of them); stall, persist and io times are the part's, scaled by "
                             "share / part, and the rounds' bytes are the shares"}
    environment = collect_environment(target.path) if isinstance(target, LocalDirectory) else collect_environment()
    if isinstance(target, ObjectTarget):
        environment["target"] = target.describe()  # endpoint, credential source (never secrets), client
    launch = {"world_size": world.world_size, "source": "torch.distributed", "backend": "gloo (coordination only)",
              "local_world_size": local_ranks}
    return DistributedBenchReport(
        target=str(target), spec=spec, workload=workload, rank_bytes=tuple(per_rank), hosts=hosts,
        rounds=tuple(measured), cache_drop=cache_drop, environment=environment, launch=launch, memory=memory,
        async_part=async_part)


def sum_requests(counts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """S3 request counts (``s3_pacing.Counts.to_dict``) summed; None when there are none."""
    from ckptbench.storage.s3_pacing import Counts

    given = [c for c in counts if c is not None]
    if not given:
        return None
    total = Counts()
    for c in given:
        total = total.plus(Counts(**c))
    return total.to_dict()


def _save(ckpt: Checkpointer, state_dict: dict[str, Any], location: Any,
          options: dict[str, Any] | None) -> tuple[int, float, None]:
    result = ckpt.save(state_dict, location, distributed=True, storage_options=options)
    return result.bytes, result.stage_s + result.write_s, None  # type: ignore[union-attr]


def _save_async(ckpt: Checkpointer, state_dict: dict[str, Any], location: Any,
                share_bytes: int, options: dict[str, Any] | None) -> tuple[int, float, float, float]:
    """(bytes, own work s, stall s, scale) of an async save of ``state_dict``, a part of the share when it
    holds fewer than ``share_bytes``: the span scales its times by share / part and counts the share."""
    start = time.perf_counter()
    handle = ckpt.save(state_dict, location, async_=True, distributed=True, storage_options=options)
    stall_s = time.perf_counter() - start
    result = handle.result()  # type: ignore[union-attr]
    scale = share_bytes / result.bytes if 0 < result.bytes < share_bytes else 1.0
    return (share_bytes if scale != 1.0 else result.bytes), result.stage_s + result.write_s, stall_s, scale


def _load(ckpt: Checkpointer, location: Any, into: dict[str, Any],
          options: dict[str, Any] | None) -> tuple[int, float, None]:
    """A cold load into the share's own tensors (through the staging ring where they are on the CPU),
    every checksum checked."""
    from ckptbench.bench.workloads import state_dict_bytes

    ckpt.load(location, distributed=True, into=into, bounded_memory=True, storage_options=options)
    return state_dict_bytes(into), ckpt.last_load_s, None


def _verify(state_dict: dict[str, Any], before: dict[str, int], who: str) -> None:
    """StorageIOError unless every tensor holds the bytes it held before the first save (``before``: their
    CRC-32C then, ``workloads.fingerprint``)."""
    from ckptbench.bench.workloads import fingerprint
    from ckptbench.errors import StorageIOError

    now = fingerprint(state_dict)
    changed = [key for key, crc in before.items() if now.get(key) != crc]
    if changed:
        raise StorageIOError(f"{who}: {changed[0]!r} loaded with different bytes than were saved"
                             + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""))


def _max_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _timed(world: World, op: str, round_: int, run: Any, *args: Any) -> RoundResult:
    """barrier -> ``run(*args)`` -> barrier on every rank; every rank's span gathered."""
    from ckptbench.storage.s3_pacing import totals

    world.barrier(f"before the {op}")
    before = totals()
    with engine_calls() as calls:
        start_ns = time.monotonic_ns()
        start = time.perf_counter()
        nbytes, io_s, stall_s, *scaled = run(*args)
        end_s = time.perf_counter() - start
    counted = totals().minus(before)  # this process's S3 data requests (none on a filesystem)
    world.barrier(f"after the {op}")
    b2b_s = time.perf_counter() - start
    recorded = from_engine_calls(calls, start_ns, end_s)
    timeline, histogram = recorded if recorded is not None else (None, None)
    barrier_s = b2b_s - end_s
    scale = scaled[0] if scaled else 1.0
    if scale != 1.0:  # measured on a part of the share: its times (and bytes) scaled to the share
        io_s, end_s, stall_s = io_s * scale, end_s * scale, stall_s * scale
        b2b_s, timeline = end_s + barrier_s, None
    span = RankSpan(world.rank, world.host, nbytes, io_s, end_s, barrier_s, stall_s, timeline, histogram,
                    counted.to_dict() if counted.requests else None)
    spans = world.all_gather(span, f"collecting the {op} timings")
    log.info("%s round %d: rank %d %.3f s (io %.3f s)", op, round_, world.rank, end_s, io_s)
    return RoundResult(op, round_, tuple(spans), world.broadcast(b2b_s, "sharing the barrier time"))
