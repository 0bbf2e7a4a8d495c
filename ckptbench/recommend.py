"""Pre-flight verdicts and recommendations (pure): a training job, what the real writer measured on the
target, and the model -> predictions, PASS/WARN/FAIL checks and settings, each with its reason.

How one node's numbers scale to the job (stated in every result's ``assumptions``):

- every rank writes its own share (``sizing.checkpoint_size``); the busiest node holds the busiest
  rank (data-parallel rank 0, with the replicated state) and ``ranks_per_node - 1`` others, so it
  moves ``node_bytes = per_rank_max_bytes + (ranks_per_node - 1) x per_rank_min_bytes``;
- each node gets the bandwidth measured here (true for node-local disks; shared storage must deliver
  ``nodes x`` that, so ``aggregate_bps`` caps it when given): ``checkpoint time = max(node_bytes /
  write, total_bytes / aggregate)``; the same for restore with the cold-read rate;
- asynchronous saves block for ``node_bytes / staging rate`` and persist at the write rate; the
  interference measured by the compute probe (a CPU matmul loop) is used unless given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ckptbench.errors import UsageError, reading_document
from ckptbench.model import interval as model
from ckptbench.model.failures import FailureModel
from ckptbench.model.sizing import CheckpointSize, checkpoint_size
from ckptbench.units import format_duration, format_rate, format_size

SCHEMA = "ckptbench.preflight/1"
PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
#: A measured rate above this fraction of memcpy bandwidth was served from memory, not the storage.
CACHED_FRACTION = 0.9
#: Pinned staging above these fractions of host memory warns / fails.
RAM_WARN_FRACTION, RAM_FAIL_FRACTION = 0.5, 0.9
#: The cheapest checkpoint the model takes (its stall must be positive): a lower bound on any measured one.
_INSTANT_CHECKPOINT = model.CheckpointCost.sync(math.ulp(0.0))


@dataclass(frozen=True)
class Job:
    """The training job being checked. ``interval_s`` None means: use the optimal interval."""

    size: CheckpointSize
    model_name: str
    ranks: int
    ranks_per_node: int
    failures: FailureModel
    restart_s: float = 0.0
    interval_s: float | None = None
    retain: int = 2
    max_overhead: float = 0.02
    max_ckpt_time_s: float = 10.0
    aggregate_bps: float | None = None
    interference: float | None = None
    gpu_hour_usd: float | None = None

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.ranks_per_node < 1:
            raise UsageError(f"ranks ({self.ranks}) and ranks per node ({self.ranks_per_node}) must be positive")
        if self.ranks % self.ranks_per_node and self.ranks > self.ranks_per_node:
            raise UsageError(f"--ranks {self.ranks} is not a multiple of --gpus-per-node {self.ranks_per_node}")
        if not 0 < self.max_overhead < 1:
            raise UsageError(f"--max-overhead {self.max_overhead:.3g} must be between 0 and 100 %")
        if not 0 < self.max_ckpt_time_s < math.inf:
            raise UsageError(f"--max-ckpt-time {self.max_ckpt_time_s!r} must be positive")
        if self.retain < 1:
            raise UsageError(f"--retain {self.retain} must be at least 1")
        # What the storage turns out to do only lengthens the restart (by the restore) and every interval's
        # segment (by the checkpoint): a job that could not complete even with instant checkpoints is
        # refused now, before anything is measured.
        model.check_completes(self.interval_s or 0.0, _INSTANT_CHECKPOINT, self.failures.mtbf_s, self.restart_s)

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.ranks / self.ranks_per_node))

    @property
    def node_bytes(self) -> int:
        """Bytes the busiest node writes per checkpoint: the busiest rank's plus every other rank's there."""
        others = min(self.ranks, self.ranks_per_node) - 1
        return self.size.per_rank_max_bytes + self.size.per_rank_min_bytes * others


@dataclass(frozen=True)
class Measurements:
    """What the real writer did on the target (``measured_bytes`` per save), and this host."""

    measured_bytes: int
    write_bps: float
    read_bps: float
    stall_s: float
    persist_s: float
    interference: float | None
    memcpy_bps: float
    shared_storage: bool
    free_bytes: int | None
    host_memory_bytes: int | None
    threads: int
    direct: bool

    @property
    def staging_bps(self) -> float:
        return self.measured_bytes / self.stall_s

    @property
    def persist_bps(self) -> float:
        return self.measured_bytes / self.persist_s


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    value: float | None
    threshold: float | None
    unit: str  # the key suffix of value and threshold: "_s", "_bytes", "_bps", "_fraction"
    message: str
    remedy: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Advice:
    """One recommended setting and the measurement that justifies it."""

    setting: str
    value: Any
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.setting, str):
            raise TypeError(f"setting {self.setting!r} is not a name")
        problem = _value_problem(self.setting, self.value)
        if problem is not None:
            raise ValueError(f"{self.setting} {self.value!r} is {problem}")


def _value_problem(setting: str, value: Any) -> str | None:
    """Why ``value`` cannot be the value of ``setting``, or None (a None value: not measured, left out)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if value is None:
        return None
    if setting in ("direct", "async"):
        return None if isinstance(value, bool) else "not true or false"
    if setting in ("threads", "max_concurrency") or setting.endswith("_bytes"):
        return None if number and isinstance(value, int) and 0 < value < 2**63 else "not a positive whole number"
    if setting.endswith("_s"):
        return None if number and 0 < value < math.inf else "not a positive number of seconds"
    return None


@dataclass(frozen=True)
class Verdict:
    job: Job
    measurements: Measurements
    predictions: dict[str, Any]
    checks: tuple[Check, ...]
    recommendation: tuple[Advice, ...]
    assumptions: tuple[str, ...] = field(default=())

    @property
    def verdict(self) -> str:
        statuses = {c.status for c in self.checks}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == FAIL else 0


def interference_fraction(slowdown: float | None) -> float | None:
    """The probe's slowdown (step time during / alone - 1) as the fraction of throughput lost."""
    if slowdown is None:
        return None
    slowdown = max(0.0, slowdown)
    return min(0.99, slowdown / (1.0 + slowdown))


def _nice_interval(seconds: float) -> float:
    """Round an interval down to a value people configure: whole minutes above 10 min, else 10 s steps."""
    if seconds >= 3600:
        return math.floor(seconds / 300) * 300
    if seconds >= 600:
        return math.floor(seconds / 60) * 60
    return max(10.0, math.floor(seconds / 10) * 10)


def evaluate(job: Job, m: Measurements) -> Verdict:
    """Predictions, checks and a recommendation for ``job`` from ``m`` (raises UsageError when the job
    cannot make progress at all, e.g. a checkpoint longer than the MTBF)."""
    node_bytes = job.node_bytes
    write_s = node_bytes / m.write_bps
    restore_s = node_bytes / m.read_bps
    if job.aggregate_bps is not None:
        write_s = max(write_s, job.size.total_bytes / job.aggregate_bps)
        restore_s = max(restore_s, job.size.total_bytes / job.aggregate_bps)
    stall_s = node_bytes / m.staging_bps
    persist_s = node_bytes / m.persist_bps
    if job.aggregate_bps is not None:
        persist_s = max(persist_s, job.size.total_bytes / job.aggregate_bps)
    interference = job.interference if job.interference is not None else (m.interference or 0.0)
    mtbf_s = job.failures.mtbf_s
    restart_s = job.restart_s + restore_s
    sync_cost = model.CheckpointCost.sync(write_s)
    async_cost = model.CheckpointCost(stall_s, persist_s, interference)
    sync = model.analyse(sync_cost, mtbf_s, restart_s)
    asyn = model.analyse(async_cost, mtbf_s, restart_s)
    use_async = asyn.waste_fraction < sync.waste_fraction
    cost, chosen = (async_cost, asyn) if use_async else (sync_cost, sync)
    interval_s = job.interval_s if job.interval_s is not None else chosen.optimal_interval_s
    at = model.analyse(cost, mtbf_s, restart_s, every_s=interval_s)
    waste = at.waste_fraction_at_interval
    overhead = at.overhead_fraction
    assert waste is not None and overhead is not None
    gpu_hours_per_day = job.ranks * 24.0
    predictions: dict[str, Any] = {
        "checkpoint_total_bytes": job.size.total_bytes,
        "checkpoint_per_rank_bytes": job.size.per_rank_max_bytes,
        "checkpoint_per_node_bytes": node_bytes,
        "nodes": job.nodes,
        "per_rank_write_bps": m.write_bps / min(job.ranks, job.ranks_per_node),
        "sync_checkpoint_s": write_s,
        "async_stall_s": stall_s,
        "async_persist_s": persist_s,
        "interference": interference,
        "restore_s": restore_s,
        "mtbf_s": mtbf_s,
        "failures_per_day": job.failures.faults_per_day,
        "restart_s": restart_s,
        "mode": "async" if use_async else "sync",
        "blocking_s": cost.blocking_s,
        "interval_s": interval_s,
        "interval_is_optimal": job.interval_s is None,
        "optimal_interval_s": chosen.optimal_interval_s,
        "optimal_interval_sync_s": sync.optimal_interval_s,
        "optimal_interval_async_s": asyn.optimal_interval_s,
        "overhead_fraction": overhead,
        "waste_fraction": waste,
        "waste_fraction_sync_optimum": sync.waste_fraction,
        "waste_fraction_async_optimum": asyn.waste_fraction,
        "goodput": 1.0 - waste,
        "wasted_gpu_hours_per_day": waste * gpu_hours_per_day,
        "wasted_usd_per_day": waste * gpu_hours_per_day * job.gpu_hour_usd if job.gpu_hour_usd else None,
        "curve": [{"interval_s": t, "waste_fraction": w} for t, w, _ in model.waste_curve(
            cost, mtbf_s, restart_s, _curve_points(max(cost.min_interval_s, chosen.optimal_interval_s / 20),
                                                   chosen.optimal_interval_s * 20))],
    }
    checks = _checks(job, m, predictions)
    return Verdict(job, m, predictions, tuple(checks), tuple(_advice(job, m, predictions)), _assumptions(job, m))


def _curve_points(low: float, high: float, n: int = 60) -> list[float]:
    low = max(low, 1e-3)
    return [low * (high / low) ** (i / (n - 1)) for i in range(n)]


def _checks(job: Job, m: Measurements, p: dict[str, Any]) -> list[Check]:
    out = []
    blocking = p["blocking_s"]
    mode = p["mode"]
    status = PASS if blocking <= job.max_ckpt_time_s else FAIL
    out.append(Check(
        "checkpoint-time", status, blocking, job.max_ckpt_time_s, "_s",
        f"training blocks {format_duration(blocking)} per checkpoint ({mode}; a sync save takes "
        f"{format_duration(p['sync_checkpoint_s'])}, async stalls {format_duration(p['async_stall_s'])})",
        None if status == PASS else _checkpoint_time_remedy(job, mode)))
    overhead = p["overhead_fraction"]
    status = PASS if overhead <= job.max_overhead else FAIL
    out.append(Check(
        "overhead", status, overhead, job.max_overhead, "_fraction",
        f"checkpoints cost {overhead:.2%} of compute at an interval of {format_duration(p['interval_s'])}",
        None if status == PASS else (f"checkpoint less often (at least every {format_duration(blocking / job.max_overhead)} "
                                     "for this threshold), or make checkpoints cheaper")))
    on_target = job.size.total_bytes if m.shared_storage else p["checkpoint_per_node_bytes"]
    needed = on_target * (job.retain + 1)  # the retained ones plus the one being written
    if m.free_bytes is None:
        out.append(Check("free-space", PASS, None, needed, "_bytes",
                         f"object storage: no free-space limit ({job.retain} retained checkpoints = "
                         f"{format_size(on_target * job.retain)})"))
    else:
        status = PASS if m.free_bytes >= needed else FAIL
        out.append(Check(
            "free-space", status, m.free_bytes, needed, "_bytes",
            f"{format_size(m.free_bytes)} free; {job.retain} retained checkpoints + 1 in flight need {format_size(needed)}",
            None if status == PASS else "free space, retain fewer checkpoints (--retain), or use a bigger target"))
    arena = p["checkpoint_per_node_bytes"]
    if m.host_memory_bytes:
        share = arena / m.host_memory_bytes
        status = PASS if share <= RAM_WARN_FRACTION else WARN if share <= RAM_FAIL_FRACTION else FAIL
        out.append(Check(
            "host-memory", status, share, RAM_WARN_FRACTION, "_fraction",
            f"pinned staging for the node's ranks needs {format_size(arena)}, {share:.0%} of this host's "
            f"{format_size(m.host_memory_bytes)}",
            None if status == PASS else _host_memory_remedy(job)))
    for what, rate in (("write", m.write_bps), ("read", m.read_bps)):
        cached = rate > CACHED_FRACTION * m.memcpy_bps
        out.append(Check(
            f"{what}-bandwidth-sanity", WARN if cached else PASS, rate, CACHED_FRACTION * m.memcpy_bps, "_bps",
            f"measured {what} {format_rate(rate)} vs this host's memcpy {format_rate(m.memcpy_bps)}"
            + (": served from memory, not storage" if cached else ""),
            "run as root so caches are dropped, or measure a larger --measure-size" if cached else None))
    restore_fraction = p["restart_s"] / p["mtbf_s"]
    status = PASS if restore_fraction <= job.max_overhead else WARN if restore_fraction <= 2 * job.max_overhead else FAIL
    out.append(Check(
        "restore", status, restore_fraction, job.max_overhead, "_fraction",
        f"a restart takes {format_duration(p['restart_s'])} (restore {format_duration(p['restore_s'])}) every "
        f"{format_duration(p['mtbf_s'])} on average: {restore_fraction:.2%} of the time",
        None if status == PASS else "faster reads (more threads, a faster tier for the latest checkpoint) or "
                                    "fewer failures (hot spares)"))
    return out


def _checkpoint_time_remedy(job: Job, mode: str) -> str:
    """What would shorten the block, given what the job already does (async, its sharding)."""
    remedies = ["faster storage"]
    if mode == "sync":
        remedies.append("async saves")
    stronger = _stronger_sharding(job)
    if stronger:
        remedies.append(f"{_sharding_flag(stronger)} so every rank writes a smaller share")
    if _shards_bytes(job.size):
        remedies.append("more nodes (data-parallel ranks), each rank writing a smaller share")
    if len(remedies) == 1:
        remedies.append("a smaller checkpoint (fewer bytes per rank)")
    return _any_of(remedies)


def _host_memory_remedy(job: Job) -> str:
    """What would shrink the node's pinned staging, given the job's sharding and ranks per node."""
    remedies = []
    stronger = _stronger_sharding(job)
    if stronger:
        remedies.append(f"{_sharding_flag(stronger)} so every rank stages a smaller share")
    if min(job.ranks, job.ranks_per_node) > 1:
        remedies.append("fewer ranks per node (--gpus-per-node)")
    remedies.append("a host with more memory")
    return _any_of(remedies)


def _stronger_sharding(job: Job) -> list[str]:
    """The sharding schemes that would make the busiest node write fewer bytes than the job's does, the
    weakest first, one per size (none when the job already shards all it can, or has one data-parallel rank)."""
    size, out = job.size, []
    smallest = job.node_bytes
    for sharding in ("zero1", "zero2", "zero3"):
        sharded = checkpoint_size(size.params, size.recipe, replace(size.parallelism, sharding=sharding))
        node_bytes = replace(job, size=sharded).node_bytes
        if node_bytes < smallest:
            out.append(sharding)
            smallest = node_bytes
    return out


def _shards_bytes(size: CheckpointSize) -> bool:
    """Whether the job's sharding splits any bytes of its checkpoint over data-parallel ranks (given two or more)."""
    sharded = replace(size.parallelism, dp=max(2, size.parallelism.dp)).sharded_components()
    return any(size.component_bytes[name] for name in sharded)


def _sharding_flag(schemes: list[str]) -> str:
    return f"sharding more of the state (--sharding {'/'.join(schemes)})"


def _any_of(remedies: list[str]) -> str:
    return ", ".join(remedies[:-1]) + f", or {remedies[-1]}" if len(remedies) > 1 else remedies[0]


def _advice(job: Job, m: Measurements, p: dict[str, Any]) -> list[Advice]:
    interval = _nice_interval(p["optimal_interval_s"])
    out = [
        Advice("interval_s", interval,
               f"the optimum for a {format_duration(p['blocking_s'])} {p['mode']} checkpoint and an MTBF of "
               f"{format_duration(p['mtbf_s'])} is {format_duration(p['optimal_interval_s'])} (exact model), "
               f"waste {p['waste_fraction']:.2%}"),
        Advice("async", p["mode"] == "async",
               f"waste at the optimum: async {p['waste_fraction_async_optimum']:.3%} vs sync "
               f"{p['waste_fraction_sync_optimum']:.3%} (stall {format_duration(p['async_stall_s'])}, interference "
               f"{p['interference']:.0%})"),
        Advice("threads", m.threads, f"measured {format_rate(m.write_bps)} durable writes with {m.threads} threads"),
        Advice("direct", m.direct, "O_DIRECT worked on this target" if m.direct else
               "O_DIRECT is not available here: buffered writes with fdatasync"),
        Advice("pinned_budget_bytes", p["checkpoint_per_node_bytes"],
               f"host memory per node: each rank keeps one reused staging arena of its share (busiest rank "
               f"{format_size(p['checkpoint_per_rank_bytes'])})"),
    ]
    return out


def _assumptions(job: Job, m: Measurements) -> tuple[str, ...]:
    out = [f"every node gets the measured bandwidth ({format_rate(m.write_bps)} write, {format_rate(m.read_bps)} "
           "cold read); each of its ranks a 1/ranks-per-node share",
           "the busiest rank (data-parallel rank 0, holding replicated state) sets the node's bytes",
           "failures are exponential at the job's MTBF; a restart also reloads the latest checkpoint"]
    if m.shared_storage and job.aggregate_bps is None and job.nodes > 1:
        out.append(f"shared storage is assumed to scale to {job.nodes} nodes x the measured rate; give "
                   "--aggregate-bandwidth to cap it")
    if job.interference is None:
        out.append("interference comes from a CPU matmul probe on this host; on GPU training it is usually "
                   "lower (override with --interference)")
    return tuple(out)


# -- settings from saved results (``ckptbench recommend``) ----------------------------------------

#: Result schemas ``recommend`` reads, by name; the version after the slash must be one it knows.
KNOWN_SCHEMAS = {"ckptbench.bench.fs": 1, "ckptbench.bench.objects": 1, "ckptbench.bench.checkpoint": 1,
                 "ckptbench.bench.distributed": 1, "ckptbench.preflight": 1}


def check_schema(document: Any, where: str) -> str:
    """The document's schema name; UsageError (one line) when it is not a result this version reads."""
    if not isinstance(document, dict) or not isinstance(document.get("schema"), str):
        raise UsageError(f"{where} is not a ckptbench result (no 'schema' field)")
    name, _, version = document["schema"].partition("/")
    if name not in KNOWN_SCHEMAS:
        raise UsageError(f"{where}: unknown result schema {document['schema']!r}",
                         hint=f"known: {', '.join(f'{k}/{v}' for k, v in KNOWN_SCHEMAS.items())}")
    if version != str(KNOWN_SCHEMAS[name]):
        raise UsageError(f"{where}: schema {document['schema']!r} is a version this ckptbench does not read "
                         f"(it reads {name}/{KNOWN_SCHEMAS[name]})", hint="upgrade ckptbench or re-run the measurement")
    return name


def advice_from_results(documents: list[tuple[str, dict[str, Any]]]) -> dict[str, Advice]:
    """Settings justified by saved results (``(file name, document)`` pairs, schemas checked first).
    A later document's advice on the same setting replaces an earlier one's. A document that lacks
    what its schema promises, or holds a value no setting can take, is a one-line UsageError naming it."""
    out: dict[str, Advice] = {}
    for where, doc in documents:
        name = check_schema(doc, where)
        with reading_document(where, doc["schema"]):
            for advice in _ADVISORS[name](doc, where):
                out[advice.setting] = advice
    return out


def write_rates(documents: list[tuple[str, dict[str, Any]]]) -> list[tuple[float, str]]:
    """``(bytes per second, file name)`` of every durable write rate of one node the documents measured: the
    best configuration of a sweep, ckptbench's save, all ranks' save over their hosts, what preflight measured."""
    out = []
    for where, doc in documents:
        name = check_schema(doc, where)
        with reading_document(where, doc["schema"]):
            out += [(_rate(gbps) * 1e9, where) for gbps in _WRITE_GBPS[name](doc)]
    return out


def _best(doc: dict[str, Any]) -> dict[str, Any]:
    """The sweep's best configuration: ``results[best]``."""
    results, best = doc["results"], doc["best"]
    if isinstance(best, bool) or not isinstance(best, int) or not 0 <= best < len(results):
        raise IndexError(f"'best' {best!r} is not one of its {len(results)} results")
    return results[best]


def _rate(gbps: Any) -> float:
    """A measured rate in GB/s: a positive, finite number."""
    if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not 0 < gbps < math.inf:
        raise ValueError(f"rate {gbps!r} is not a positive number of GB/s")
    return float(gbps)


def _seconds(value: Any) -> float:
    """A measured duration: a number of seconds, zero or more."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"duration {value!r} is not a number of seconds")
    return float(value)


def _from_fs(doc: dict[str, Any], where: str) -> list[Advice]:
    best = _best(doc)
    c, w = best["config"], best["write"]
    size = format_size(c["block_size"])
    runs = len(doc["results"])
    why = (f"{where}: the best durable write of {runs} configurations, {_rate(w['gbps']):.2f} GB/s with "
           f"{c['threads']} thread(s) x {size} blocks ({c['schedule']})")
    out = [Advice("threads", c["threads"], why), Advice("block_size_bytes", c["block_size"], why),
           Advice("direct", bool(c["direct"]), f"{where}: O_DIRECT " + (
               "worked" if c["direct"] else f"unavailable ({c.get('direct_fallback_reason')})"))]
    return out


def _from_objects(doc: dict[str, Any], where: str) -> list[Advice]:
    best = _best(doc)
    c, w = best["config"], best["write"]
    why = (f"{where}: the best upload of {len(doc['results'])} configurations, {_rate(w['gbps']) * 1e3:.0f} MB/s "
           f"with {c['concurrency']} requests in flight and {format_size(c['part_size_bytes'])} parts "
           f"({format_size(c['object_size_bytes'])} objects)")
    return [Advice("max_concurrency", c["concurrency"], why), Advice("part_size_bytes", c["part_size_bytes"], why)]


def _from_checkpoint(doc: dict[str, Any], where: str) -> list[Advice]:
    ours = next((r for r in doc["results"] if r["writer"] == "ckptbench"), None)
    if ours is None:
        return []
    save_gbps = _rate(ours["save"]["gbps"])
    out = [Advice("threads", ours["details"].get("threads"),
                  f"{where}: ckptbench saved at {save_gbps:.2f} GB/s with these threads"),
           Advice("shard_size_bytes", ours["details"].get("shard_size_bytes"),
                  f"{where}: the shard size of that measurement")]
    mine = next((a for a in doc.get("async") or [] if a["writer"] == "ckptbench"), None)
    if mine is not None:
        sync_s = doc["workload"]["total_bytes"] / (save_gbps * 1e9)
        out.append(_async_advice(f"{where}: an async save", _seconds(mine["stall_s"]), sync_s))
    return out


def _from_distributed(doc: dict[str, Any], where: str) -> list[Advice]:
    """Every rank saving its share at once (the median round): the threads it ran with, and async or not."""
    summary, ranks = doc["summary"], doc["launch"]["world_size"]
    save_gbps = _rate(summary["save"]["gbps"]["median"])
    out = [Advice("threads", doc["spec"].get("threads"),
                  f"{where}: {ranks} ranks saved at {save_gbps:.2f} GB/s together with these threads")]
    if "async" in summary:
        sync_s = _seconds(summary["save"]["duration_s"]["median"])
        stall_s = _seconds(summary["async"]["stall_s"]["median"])
        out.append(_async_advice(f"{where}: an async save of {ranks} ranks", stall_s, sync_s))
    return out


def _async_advice(what: str, stall_s: float, sync_s: float) -> Advice:
    """Async when its stall is under half a sync save's time."""
    return Advice("async", stall_s < 0.5 * sync_s,
                  f"{what} blocked {format_duration(stall_s)} vs {format_duration(sync_s)} for a sync one")


def _from_preflight(doc: dict[str, Any], where: str) -> list[Advice]:
    out = []
    for a in doc["recommendation"]:
        if not isinstance(a["reason"], str):
            raise TypeError(f"the reason for {a['setting']!r} is {a['reason']!r}, not text")
        out.append(Advice(a["setting"], a["value"], f"{where}: {a['reason']}"))
    return out


_ADVISORS = {"ckptbench.bench.fs": _from_fs, "ckptbench.bench.objects": _from_objects,
             "ckptbench.bench.checkpoint": _from_checkpoint, "ckptbench.bench.distributed": _from_distributed,
             "ckptbench.preflight": _from_preflight}

#: schema name -> the durable write rates (GB/s) a document of it measured.
_WRITE_GBPS = {
    "ckptbench.bench.fs": lambda doc: [_best(doc)["write"]["gbps"]],
    "ckptbench.bench.objects": lambda doc: [_best(doc)["write"]["gbps"]],
    "ckptbench.bench.checkpoint": lambda doc: [r["save"]["gbps"] for r in doc["results"] if r["writer"] == "ckptbench"],
    "ckptbench.bench.distributed": lambda doc: [doc["summary"]["save"]["gbps"]["median"] / len(set(doc["hosts"]))],
    "ckptbench.preflight": lambda doc: [doc["measurements"]["write_bps"] / 1e9],
}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def as_toml(advice: dict[str, Advice]) -> str:
    """The settings as a TOML snippet (sizes and durations spelled as the CLI takes them), reasons as comments."""
    sections = {"checkpoint": ("threads", "block_size_bytes", "shard_size_bytes", "direct", "async",
                               "pinned_budget_bytes"),
                "s3": ("part_size_bytes", "max_concurrency"), "schedule": ("interval_s",)}
    lines = []
    for section, keys in sections.items():
        chosen = [advice[k] for k in keys if k in advice and advice[k].value is not None]
        if not chosen:
            continue
        lines.append(f"[{section}]")
        for a in chosen:
            key, value = a.setting, a.value
            if key.endswith("_bytes"):
                key, value = key.removesuffix("_bytes"), format_size(value).replace(" ", "")
            elif key.endswith("_s"):
                key, value = key.removesuffix("_s"), format_duration(value).replace(" ", "")
            lines.append(f"{key} = {_toml_value(value)}  # {a.reason}")
        lines.append("")
    return "\n".join(lines)


def as_code(advice: dict[str, Advice]) -> list[str]:
    """The same settings as arguments: ``Checkpointer``/``save``, DCP's writers, and environment knobs."""
    def get(key: str) -> Any:
        return advice[key].value if key in advice else None

    kwargs = [f"{k}={v!r}" for k, v in (("threads", get("threads")), ("shard_size", get("shard_size_bytes")),
                                        ("block_size", get("block_size_bytes")), ("direct", get("direct")))
              if v is not None]
    s3 = {k: v for k, v in (("part_size", get("part_size_bytes")), ("max_concurrency", get("max_concurrency")))
          if v is not None}
    out = [f"ckptbench.Checkpointer({', '.join(kwargs)})"]
    save = [*(kw for kw in kwargs if not kw.startswith("block_size")), *(["async_=True"] if get("async") else [])]
    if s3:
        save.append(f"storage_options={s3!r}")
    out.append(f"ckptbench.save(state_dict, path, {', '.join(save)})" if save else "ckptbench.save(state_dict, path)")
    dcp = [f"{k}={v!r}" for k, v in (("threads", get("threads")), ("block_size", get("block_size_bytes")),
                                     ("direct", get("direct"))) if v is not None]
    out.append(f"ckptbench.integrations.dcp.Writer(path{''.join(', ' + a for a in dcp)})")
    if get("threads") is not None:
        out.append(f"torch.distributed.checkpoint.FileSystemWriter(path, thread_count={get('threads')}, "
                   "sync_files=True)")
    env = [f"CKPTBENCH_{k}={v}" for k, v in (("SAVE_THREADS", get("threads")), ("SAVE_SHARD_BYTES", get("shard_size_bytes")),
                                            ("SAVE_BLOCK_BYTES", get("block_size_bytes"))) if v is not None]
    if env:
        out.append("export " + " ".join(env))
    return out
