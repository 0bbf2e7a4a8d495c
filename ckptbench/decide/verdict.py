"""Pre-flight verdicts (pure): a training job, what the real writer measured on the
target, and the model -> predictions with ranges, PASS/WARN/FAIL/BORDERLINE checks and settings, each with
its reason.

How one node's numbers scale to the job (stated in every result's ``assumptions``):

- every rank writes its own share (``sizing.checkpoint_size``); the busiest node holds the busiest
  rank (data-parallel rank 0, with the replicated state) and ``ranks_per_node - 1`` others, so it
  moves ``node_bytes = per_rank_max_bytes + (ranks_per_node - 1) x per_rank_min_bytes``;
- each node gets the bandwidth measured here (true for node-local disks; shared storage must deliver
  ``nodes x`` that, so ``aggregate_bps`` caps it when given, and ``node_network_bps`` caps a node's
  traffic to shared storage): ``checkpoint time = max(node_bytes / write, total_bytes / aggregate)``;
  the same for restore with the cold-read rate;
- asynchronous saves block for ``node_bytes / staging rate`` and persist at the write rate; the
  interference is given, measured on the training device, or :data:`interference.ASSUMED`.

Every prediction has a range: the model evaluated at the optimistic and the pessimistic ends of what was
measured (the repeats' min and max, widened by ``knobs.SAMPLE_EXTRAPOLATION`` when a sample stood in for the
job's ranks, in quadrature: :func:`~ckptbench.decide.scaling.sample_allowance`, ``widen_end``)
and of the interference's range. A check is PASS or FAIL only when both ends agree; otherwise it is
BORDERLINE and says what measurement would settle it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ckptbench.decide.advice import Advice
from ckptbench.decide.scaling import fit_sizes, sample_allowance, widen_end
from ckptbench.errors import UsageError
from ckptbench.model import interval as model
from ckptbench.model.failures import FailureModel
from ckptbench.model.interference import ASSUMED, Interference, from_slowdown
from ckptbench.model.sizing import CheckpointSize, checkpoint_size
from ckptbench.units import format_duration, format_rate, format_size

SCHEMA = "ckptbench.preflight/1"
PASS, WARN, FAIL, BORDERLINE = "PASS", "WARN", "FAIL", "BORDERLINE"
#: Exit status of each verdict (2 is bad input).
EXIT_CODES = {PASS: 0, WARN: 0, FAIL: 1, BORDERLINE: 3}
#: A measured rate above this fraction of memcpy bandwidth was served from memory, not the storage.
CACHED_FRACTION = 0.9
#: Pinned staging above these fractions of host memory warns / fails.
RAM_WARN_FRACTION, RAM_FAIL_FRACTION = 0.5, 0.9
#: Repeats whose (max - min) / median exceeds this make "more repeats on a quiet machine" a way to settle a check.
NOISY_RUNS = 0.1
#: The cheapest checkpoint the model takes (its stall must be positive): a lower bound on any measured one.
_INSTANT_CHECKPOINT = model.CheckpointCost.sync(math.ulp(0.0))
#: Measurement shapes: every rank of the job at once, the job's ranks on a subset of its nodes, one process.
SHAPES = ("job", "nodes", "sample")
#: Predictions that carry a ``<name>_range``.
RANGED = ("sync_checkpoint_s", "async_stall_s", "async_persist_s", "restore_s", "restart_s", "blocking_s",
          "optimal_interval_s", "overhead_fraction", "waste_fraction", "goodput", "wasted_gpu_hours_per_day",
          "wasted_usd_per_day", "per_rank_write_bps", "interference")


@dataclass(frozen=True)
class Job:
    """The training job being checked. ``interval_s`` None means: use the optimal interval.
    ``node_memory_bytes``/``node_network_bps`` describe the training node when preflight runs elsewhere."""

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
    node_memory_bytes: int | None = None
    node_network_bps: float | None = None

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
        if self.node_memory_bytes is not None and self.node_memory_bytes <= 0:
            raise UsageError(f"--node-memory {self.node_memory_bytes!r} must be positive")
        if self.node_network_bps is not None and not 0 < self.node_network_bps < math.inf:
            raise UsageError(f"--node-network {self.node_network_bps!r} must be a positive rate")
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
    """What the real writer did on the target (``measured_bytes`` per save), and this host.

    Each ``*_range`` is ``(low, high)`` over the measured runs (None: the point alone). ``interference`` is
    the slowdown measured on the training device, or None; ``probe_interference`` the host CPU probe's
    figure, information only. ``shape``: one of :data:`SHAPES`.
    """

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
    direct: bool | None
    write_bps_range: tuple[float, float] | None = None
    read_bps_range: tuple[float, float] | None = None
    stall_s_range: tuple[float, float] | None = None
    persist_s_range: tuple[float, float] | None = None
    probe_interference: float | None = None
    shape: str = "sample"
    block_size_bytes: int | None = None
    launched_ranks: int = 1
    per_rank_bytes: int | None = None  # what each rank wrote (the busiest); None: measured_bytes, one process
    interference_range: tuple[float, float] | None = None  # over the runs of the measured interference
    device: str = "cpu"  # where the measured state_dict lived: cpu, or cuda:N (staged device-to-host)
    writers: int = 1  # processes that wrote at once in the measurement (a node's ranks are processes)
    sampled_bytes: int | None = None  # the largest size measured, when the times were fitted to measured_bytes
    bottleneck: dict[str, Any] | None = None  # bench.ceiling.bottleneck: writer- or storage-bound
    # the node's bytes over the time this host took to fault that much fresh memory in (bench.fresh_memory):
    # a restore allocates its tensors new, so it is no faster than this; None: not measured
    fresh_memory_bps: float | None = None
    hypervisor_reclaims: bool = False  # a VM that hands free memory back to its hypervisor
    # seconds after which the kernel pages out memory left unaccessed (DAMON), None: it does not
    proactive_reclaim_s: float | None = None

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r} is not one of {', '.join(SHAPES)}")

    def runs_spread(self) -> float:
        """The widest (max - min) / median of the measured quantities' runs."""
        pairs = ((self.write_bps_range, self.write_bps), (self.read_bps_range, self.read_bps),
                 (self.stall_s_range, self.stall_s), (self.persist_s_range, self.persist_s))
        return max(((r[1] - r[0]) / point for r, point in pairs if r is not None and point > 0), default=0.0)


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    value: float | None
    threshold: float | None
    unit: str  # the key suffix of value and threshold: "_s", "_bytes", "_bps", "_fraction"
    message: str
    remedy: str | None = None
    value_range: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["value_range"] = list(self.value_range) if self.value_range is not None else None
        return out


class Judged:
    """The verdict of a set of checks (``self.checks``) and its exit status."""

    checks: tuple[Check, ...]

    @property
    def verdict(self) -> str:
        """FAIL if any check fails; else BORDERLINE if any is undecided; else WARN if any warns; else PASS."""
        statuses = {c.status for c in self.checks}
        return next((s for s in (FAIL, BORDERLINE, WARN) if s in statuses), PASS)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


@dataclass(frozen=True)
class Verdict(Judged):
    job: Job
    measurements: Measurements
    predictions: dict[str, Any]
    checks: tuple[Check, ...]
    recommendation: tuple[Advice, ...]
    assumptions: tuple[str, ...] = field(default=())


#: The probe's slowdown (step time during / alone - 1) as the fraction of throughput lost.
interference_fraction = from_slowdown


def measurements_from_launch(bench: dict[str, Any], *, shape: str, memcpy_bps: float, shared_storage: bool,
                             free_bytes: int | None, host_memory_bytes: int | None, threads: int) -> Measurements:
    """A distributed benchmark (``ckptbench.bench.distributed/1``: every launched rank saved, loaded and
    async-saved its share at once) as one node's measurements: a node's bytes are all ranks' bytes over the
    launch's hosts, a round's time is its slowest rank's (MLPerf Storage), persist = durable - stall."""
    hosts = max(1, len(set(bench["hosts"])))
    node_bytes = sum(bench["rank_bytes"]) / hosts
    rounds = bench["rounds"]
    saves = [r["duration_s"] for r in rounds["save"]]
    loads = [r["duration_s"] for r in rounds["load"]]
    stalls = [r["stall_s"] for r in rounds["async"]]
    persists = [max(r["duration_s"] - r["stall_s"], 1e-9) for r in rounds["async"]]
    # The measurement is of the node's own bytes: each time is read as measured, its range the runs' and at
    # least the interval of the same runs made again.
    save, load, stall, persist = (fit_sizes([node_bytes], [runs], node_bytes) for runs in (saves, loads, stalls,
                                                                                             persists))
    # Async saves measured on a part of each share (a host without memory for two copies) and scaled:
    # their range widened as a sample's is.
    k = sample_allowance(bool(bench.get("async_part")))
    stall_range, persist_range = ((widen_end(fit.point_s, fit.low_s, k, up=False),
                                   widen_end(fit.point_s, fit.high_s, k, up=True)) for fit in (stall, persist))
    return Measurements(
        measured_bytes=round(node_bytes), write_bps=node_bytes / save.point_s, read_bps=node_bytes / load.point_s,
        stall_s=stall.point_s, persist_s=persist.point_s, interference=None, memcpy_bps=memcpy_bps,
        shared_storage=shared_storage, free_bytes=free_bytes, host_memory_bytes=host_memory_bytes, threads=threads,
        direct=None, write_bps_range=(node_bytes / save.high_s, node_bytes / save.low_s),
        read_bps_range=(node_bytes / load.high_s, node_bytes / load.low_s),
        stall_s_range=stall_range, persist_s_range=persist_range, shape=shape,
        launched_ranks=len(bench["rank_bytes"]), per_rank_bytes=max(bench["rank_bytes"]),
        writers=len(bench["rank_bytes"]) // hosts, device=(bench.get("spec") or {}).get("device", "cpu"))


def job_interference(job: Job, m: Measurements) -> Interference:
    """The interference the model uses: given, else measured on the training device, else assumed."""
    if job.interference is not None:
        return Interference.given(job.interference)
    if m.interference is not None:
        low, high = m.interference_range or (m.interference, m.interference)
        return Interference(m.interference, min(low, m.interference), max(high, m.interference),
                            f"measured on the training device ({m.device}): a compute loop's slowdown there while "
                            "the checkpoint persists")
    return ASSUMED


@dataclass(frozen=True)
class _Scenario:
    """One set of inputs to the model: the point, or one end of the ranges."""

    write_bps: float
    read_bps: float
    stall_s: float
    persist_s: float
    interference: float


def extrapolation_factor(m: Measurements) -> float:
    """How far the node's rates may lie beyond the repeats' spread (:func:`~ckptbench.decide.scaling.sample_allowance`):
    1 when the job's own ranks measured it."""
    return sample_allowance(m.shape == "sample")


def _scenarios(job: Job, m: Measurements, f: Interference) -> tuple[_Scenario, _Scenario, _Scenario]:
    """(point, optimistic, pessimistic)."""
    k = extrapolation_factor(m)

    def span(point: float, measured: tuple[float, float] | None) -> tuple[float, float]:
        return _span(point, measured, k)

    write, read = span(m.write_bps, m.write_bps_range), _read_span(m)
    stall, persist = span(m.stall_s, m.stall_s_range), span(m.persist_s, m.persist_s_range)
    point = _Scenario(m.write_bps, m.read_bps, m.stall_s, m.persist_s, f.point)
    best = _Scenario(write[1], read[1], stall[0], persist[0], f.low)
    worst = _Scenario(write[0], read[0], stall[1], persist[1], f.high)
    return point, best, worst


def _span(point: float, measured: tuple[float, float] | None, k: float) -> tuple[float, float]:
    """(low, high) of a measured quantity: the runs' extremes widened by the allowance ``k``."""
    low, high = measured if measured is not None else (point, point)
    return widen_end(point, min(low, point), k, up=False), widen_end(point, max(high, point), k, up=True)


def _read_span(m: Measurements) -> tuple[float, float]:
    """The cold reads' (low, high) rates; the low end no faster than this host faulted the restore's fresh
    memory in (its tensors are new)."""
    low, high = _span(m.read_bps, m.read_bps_range, extrapolation_factor(m))
    return (min(low, m.fresh_memory_bps) if m.fresh_memory_bps is not None else low), high


def memory_bound_restore(m: Measurements) -> bool:
    """Whether faulting the restore's fresh memory in is slower than the slowest cold reads, and so sets the
    slow end of the restore's range (:func:`_read_span`)."""
    return m.fresh_memory_bps is not None and m.fresh_memory_bps == _read_span(m)[0]


def evaluate(job: Job, m: Measurements) -> Verdict:
    """Predictions with ranges, checks and a recommendation for ``job`` from ``m`` (raises UsageError when
    the job cannot make progress at all, e.g. a checkpoint longer than the MTBF)."""
    f = job_interference(job, m)
    point, best, worst = _scenarios(job, m, f)
    p = _predict(job, m, point)
    ends = [_predict(job, m, s, mode=p["mode"], interval_s=p["interval_s"], quiet=True) for s in (best, worst)]
    for key in RANGED:
        values = [p[key], *(e[key] for e in ends if e is not None)]
        if any(v is None for v in values):
            p[f"{key}_range"] = None
            continue
        p[f"{key}_range"] = [min(values), max(values)] if all(e is not None for e in ends) else (
            [min(values), None] if key != "goodput" else [None, max(values)])
    p["interference_source"] = f.source
    p["extrapolation_factor"] = extrapolation_factor(m)
    p["restore_memory_bound"] = memory_bound_restore(m)
    cost = _cost(p["mode"], point, job, m)
    low, high = model.optimum_plateau(cost, job.failures.mtbf_s, p["restart_s"])
    p["optimal_interval_plateau_s"] = [low, high]
    p["recommended_interval_s"] = model.round_interval_s(low, high, p["optimal_interval_s"])
    checks = _combine(_checks(job, m, p), *(None if e is None else _checks(job, m, e) for e in ends),
                      settle=_settle(job, m, f))
    return Verdict(job, m, p, tuple(checks), tuple(_advice(job, m, p)), _assumptions(job, m, f))


def _node_seconds(job: Job, m: Measurements, rate_bps: float) -> float:
    """Time for the busiest node to move its bytes at ``rate_bps``, within the job's caps."""
    seconds = job.node_bytes / rate_bps
    if job.aggregate_bps is not None:
        seconds = max(seconds, job.size.total_bytes / job.aggregate_bps)
    if job.node_network_bps is not None and m.shared_storage:
        seconds = max(seconds, job.node_bytes / job.node_network_bps)
    return seconds


def _cost(mode: str, s: _Scenario, job: Job, m: Measurements) -> model.CheckpointCost:
    if mode == "sync":
        return model.CheckpointCost.sync(_node_seconds(job, m, s.write_bps))
    persist = _node_seconds(job, m, m.measured_bytes / s.persist_s)
    return model.CheckpointCost(job.node_bytes * s.stall_s / m.measured_bytes, persist, s.interference)


def _predict(job: Job, m: Measurements, s: _Scenario, *, mode: str | None = None, interval_s: float | None = None,
             quiet: bool = False) -> dict[str, Any] | None:
    """The model's predictions for one scenario. ``mode``/``interval_s`` fix what the point chose (the ends
    of a range describe the same schedule); ``quiet``: None instead of a UsageError when the job cannot work."""
    try:
        return _predict_or_raise(job, m, s, mode, interval_s)
    except UsageError:
        if quiet:
            return None
        raise


def _predict_or_raise(job: Job, m: Measurements, s: _Scenario, mode: str | None,
                      interval_s: float | None) -> dict[str, Any]:
    node_bytes = job.node_bytes
    write_s = _node_seconds(job, m, s.write_bps)
    restore_s = _node_seconds(job, m, s.read_bps)
    mtbf_s = job.failures.mtbf_s
    restart_s = job.restart_s + restore_s
    sync_cost, async_cost = _cost("sync", s, job, m), _cost("async", s, job, m)
    sync = model.analyse(sync_cost, mtbf_s, restart_s)
    asyn = model.analyse(async_cost, mtbf_s, restart_s)
    use_async = asyn.waste_fraction < sync.waste_fraction if mode is None else mode == "async"
    cost, chosen = (async_cost, asyn) if use_async else (sync_cost, sync)
    if interval_s is None:
        interval_s = job.interval_s if job.interval_s is not None else chosen.optimal_interval_s
    interval_s = max(interval_s, cost.min_interval_s)
    at = model.analyse(cost, mtbf_s, restart_s, every_s=interval_s)
    waste = at.waste_fraction_at_interval
    overhead = at.overhead_fraction
    assert waste is not None and overhead is not None
    gpu_hours_per_day = job.ranks * 24.0
    return {
        "checkpoint_total_bytes": job.size.total_bytes,
        "checkpoint_per_rank_bytes": job.size.per_rank_max_bytes,
        "checkpoint_per_node_bytes": node_bytes,
        "nodes": job.nodes,
        "per_rank_write_bps": s.write_bps / min(job.ranks, job.ranks_per_node),
        "sync_checkpoint_s": write_s,
        "async_stall_s": async_cost.stall_s,
        "async_persist_s": async_cost.persist_s,
        "interference": s.interference,
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


def _curve_points(low: float, high: float, n: int = 60) -> list[float]:
    low = max(low, 1e-3)
    return [low * (high / low) ** (i / (n - 1)) for i in range(n)]


def _settle(job: Job, m: Measurements, f: Interference) -> str:
    """What measurement would narrow the ranges of this verdict."""
    ways = []
    if m.shape != "job":
        ways.append("measure the job's real shape: run preflight under torchrun/srun on the training nodes")
    if m.runs_spread() > NOISY_RUNS:
        ways.append(f"more --repeat on a quiet machine (the runs differed by up to {m.runs_spread():.0%})")
    if f.low != f.high:
        ways.append("--interference measured on the training nodes")
    return _any_of(ways) if ways else "a tighter threshold decision: the ranges come from the runs' spread"


def _combine(point: list[Check], best: list[Check] | None, worst: list[Check] | None, *, settle: str) -> list[Check]:
    """The point's checks, BORDERLINE where the two ends of the ranges disagree on the status."""
    out = []
    for i, c in enumerate(point):
        ends = [e[i] if e is not None else None for e in (best, worst)]
        values = [c.value, *(e.value for e in ends if e is not None)]
        value_range = (min(values), max(values)) if c.value is not None and None not in values else None
        statuses = {c.status, *(e.status if e is not None else FAIL for e in ends)}
        if len(statuses) == 1:
            out.append(replace(c, value_range=value_range))
            continue
        shown = _format_unit(c.unit)
        where = (f"{shown(value_range[0])}–{shown(value_range[1])}" if value_range is not None
                 else f"{shown(c.value)} up to a job that cannot make progress")
        threshold = f" against {shown(c.threshold)}" if c.threshold is not None else ""
        out.append(replace(c, status=BORDERLINE, value_range=value_range,
                           message=f"{c.message}; the range {where}{threshold} spans "
                                   f"{' and '.join(sorted(statuses))}",
                           remedy=f"settle it: {settle}"))
    return out


def _format_unit(unit: str) -> Any:
    return {"_s": format_duration, "_bytes": format_size, "_bps": format_rate,
            "_fraction": lambda v: f"{v:.2%}"}.get(unit, lambda v: f"{v:.3g}")


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
    memory = host_memory_check(job, p["checkpoint_per_node_bytes"], m.host_memory_bytes)
    if memory is not None:
        out.append(memory)
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


def host_memory_check(job: Job, arena_bytes: int, host_memory_bytes: int | None) -> Check | None:
    """The node's pinned staging (``arena_bytes``) against the training node's memory (``--node-memory``), else
    this host's (None: neither known)."""
    memory, whose = ((job.node_memory_bytes, "the training node's (--node-memory)") if job.node_memory_bytes
                     else (host_memory_bytes, "this host's"))
    if not memory:
        return None
    share = arena_bytes / memory
    status = PASS if share <= RAM_WARN_FRACTION else WARN if share <= RAM_FAIL_FRACTION else FAIL
    return Check(
        "host-memory", status, share, RAM_WARN_FRACTION, "_fraction",
        f"pinned staging for the node's ranks needs {format_size(arena_bytes)}, {share:.0%} of {whose} "
        f"{format_size(memory)}",
        None if status == PASS else _host_memory_remedy(job))


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
    low, high = p["optimal_interval_plateau_s"]
    interval = p["recommended_interval_s"]
    lo_opt, hi_opt = p["optimal_interval_s_range"] or (p["optimal_interval_s"], p["optimal_interval_s"])
    why = (f"a round value within {format_duration(low)}–{format_duration(high)}, where the waste stays within "
           f"{model.PLATEAU_TOLERANCE:.1%} of the minimum {p['waste_fraction_async_optimum' if p['mode'] == 'async' else 'waste_fraction_sync_optimum']:.2%} "
           f"for a {format_duration(p['blocking_s'])} {p['mode']} checkpoint at an MTBF of "
           f"{format_duration(p['mtbf_s'])} (exact model; the optimum {format_duration(p['optimal_interval_s'])}"
           + ("" if hi_opt is None else f", {format_duration(lo_opt)}–{format_duration(hi_opt)} over the "
              "measurement's range") + ")")
    out = [
        Advice("interval_s", interval, why),
        Advice("async", p["mode"] == "async",
               f"waste at the optimum: async {p['waste_fraction_async_optimum']:.3%} vs sync "
               f"{p['waste_fraction_sync_optimum']:.3%} (stall {format_duration(p['async_stall_s'])}, interference "
               f"{p['interference']:.0%}: {p['interference_source']})"),
        Advice("threads", m.threads, f"measured {format_rate(m.write_bps)} durable writes with {m.threads} threads"),
        Advice("block_size_bytes", m.block_size_bytes, "the block size of that measurement"),
        Advice("direct", m.direct, "O_DIRECT worked on this target" if m.direct else
               "O_DIRECT is not available here: buffered writes with fdatasync"),
        Advice("pinned_budget_bytes", p["checkpoint_per_node_bytes"],
               f"host memory per node: each rank keeps one reused staging arena of its share (busiest rank "
               f"{format_size(p['checkpoint_per_rank_bytes'])})"),
    ]
    return [a for a in out if a.value is not None]


def _assumptions(job: Job, m: Measurements, f: Interference) -> tuple[str, ...]:
    out = [f"every node gets the measured bandwidth ({format_rate(m.write_bps)} write, {format_rate(m.read_bps)} "
           "cold read); each of its ranks a 1/ranks-per-node share",
           "the busiest rank (data-parallel rank 0, holding replicated state) sets the node's bytes",
           "failures are exponential at the job's MTBF; a restart also reloads the latest checkpoint",
           f"interference (training throughput lost while persisting): {f.source}"]
    k = extrapolation_factor(m)
    if m.shape in ("job", "nodes"):
        out.append(f"measured at the job's shape: {m.launched_ranks} ranks each wrote and read their share "
                   f"({format_size(m.per_rank_bytes or 0)} for the busiest) at once; a node's time is its slowest "
                   "rank's")
    if m.shape == "nodes" and job.aggregate_bps is None and m.shared_storage:
        out.append(f"a subset of the job's nodes was measured: shared storage is assumed to give each of the job's "
                   f"{job.nodes} nodes what these nodes got; give --aggregate-bandwidth to cap it")
    if m.shape == "sample":
        who = "one process" if m.writers == 1 else f"{m.writers} processes at once"
        fitted = ("; times fitted as a fixed part plus a per-byte part over two sizes and read at the node's "
                  "bytes" if m.sampled_bytes else "")
        out.append(f"sample: {who} saved {format_size(m.sampled_bytes or m.measured_bytes)}{fitted}; the node writes "
                   f"{format_size(job.node_bytes)} from {min(job.ranks, job.ranks_per_node)} rank(s)"
                   + (f"; ranges widen the runs' spread by up to x{k:.2g} either way (in quadrature): a sample "
                      "measured without the job's launcher, before it starts, is not the job's ranks "
                      "(CKPTBENCH_SAMPLE_EXTRAPOLATION)" if k > 1 else ""))
    if m.shared_storage and job.aggregate_bps is None and job.nodes > 1:
        out.append(f"shared storage is assumed to scale to {job.nodes} nodes x the measured rate; give "
                   "--aggregate-bandwidth to cap it")
    if job.node_memory_bytes is None:
        out.append("host checks used this host's memory; give --node-memory when the training node differs")
    if m.bottleneck and m.bottleneck["limit"] == "writer":
        out.append(f"writer-bound: one process saved at {m.bottleneck['fraction_of_ceiling']:.0%} of the writer's own "
                   f"rate into memory on this host ({format_rate(m.bottleneck['writer_ceiling_bps'])}): the rates "
                   "measured here are this host's CPU and memory limit; the storage may be faster")
    out.extend(_fresh_memory_assumptions(job, m))
    if m.probe_interference is not None:
        out.append(f"the CPU probe beside the persist on this host lost {m.probe_interference:.0%} of its throughput "
                   "(information only: a GPU training step does not run on these cores)")
    return tuple(out)


def _fresh_memory_assumptions(job: Job, m: Measurements) -> list[str]:
    """What faulting the restore's fresh memory in on this host says about the restore's range."""
    out = []
    if memory_bound_restore(m):
        out.append(f"restore: faulting the node's {format_size(job.node_bytes)} of fresh memory in took "
                   f"{format_duration(job.node_bytes / m.fresh_memory_bps)} on this host "
                   f"({format_rate(m.fresh_memory_bps)}), slower than the slowest cold reads: a restore allocates "
                   "its tensors new, so the restore's range reaches that far, whatever the storage")
    if m.hypervisor_reclaims:
        out.append("this host is a VM that hands its free memory back to the hypervisor (virtio balloon, free page "
                   "reporting): faulting memory in again costs what the hypervisor's state makes it, so loads and "
                   "large saves here vary more than the storage does; measure on the training nodes to settle it")
    if m.proactive_reclaim_s is not None:
        out.append(f"this host's kernel pages out memory left unaccessed for {format_duration(m.proactive_reclaim_s)} "
                   "(DAMON): page cache, and with swap idle process memory, leave memory on that timer, so times "
                   "here drift with what ran before them; measure on the training nodes to settle it")
    return out
