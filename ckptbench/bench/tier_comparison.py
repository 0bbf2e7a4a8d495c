"""Tiers side by side: one checkpoint workload measured on every tier, then scaled to the job and fed
to the model, so the tiers compare on what the training run would pay.

Order of a comparison:

1. every target resolved (:func:`resolve_compare_target`: a path, a URL, a tier name or a tier file)
   and checked (:func:`check_targets`: exists and is writable with room for the run, or the bucket is
   reachable) before anything is measured, so a typo in the last target fails in a second;
2. per tier, in the order given, :func:`ckptbench.bench.shootout.run_checkpoint_bench` with
   ckptbench's writer: durable sync saves, cold loads, async saves (stall, persist); each tier's
   scratch directory or prefix is removed when it ends, Ctrl-C included;
3. per tier, :func:`model_tier`: the measured rates applied to the job's checkpoint (sized from the
   parameter count, bf16 + fp32 master + Adam, split evenly over ``ranks``), the optimal interval and
   its overhead and waste at the job's failure rate, and the tier's bill for one run when it has prices.

Scaling, stated once (also in the JSON's ``assumptions``): every rank writes and reads its share at
the rate measured here from one client, so the tier is assumed to scale linearly with ranks (its
aggregate limit was not measured); stall scales with bytes (staging copies on this machine); the
restart after a failure is ``--restart`` plus reading the checkpoint back (restore).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptbench import knobs
from ckptbench.bench.ceiling import bottleneck, writer_ceiling_bps
from ckptbench.bench.environment import collect_environment
from ckptbench.bench.progress import Progress
from ckptbench.bench.records import BenchWarning, document_header
from ckptbench.bench.records_ckpt import CheckpointBenchReport
from ckptbench.bench.shootout import CheckpointBenchSpec, required_disk_bytes, run_checkpoint_bench
from ckptbench.bench.stats import leaders
from ckptbench.bench.workloads import CheckpointWorkload
from ckptbench.errors import CkptbenchError, TargetError, UsageError, reading_document
from ckptbench.model import interval
from ckptbench.model.failures import FailureModel
from ckptbench.model.interference import ASSUMED, from_slowdown
from ckptbench.model.sizing import CheckpointSize
from ckptbench.model.tiers import (
    RunUse,
    Tier,
    TierPrices,
    is_tier_file,
    load_tier,
    object_requests,
    run_bill,
    tier_names,
)
from ckptbench.storage import resolve_target, scheme_of
from ckptbench.storage.local_target import LocalDirectory
from ckptbench.units import format_size

SCHEMA = "ckptbench.compare/1"

UNITS = {
    "gbps": "1e9 bytes per second (state_dict tensor bytes / seconds)",
    "_bytes": "bytes",
    "_s": "seconds",
    "_usd": "US dollars",
    "_fraction": "fraction (0..1)",
    "overhead_fraction": "checkpoint cost per unit of compute time: (s + fP) / interval (C / interval when sync)",
    "waste_fraction": "expected share of wall time that is not useful compute (checkpoints, lost work, restarts)",
    "interference": "fraction of training throughput lost while persisting",
    "cost_per_gb_month_usd": "US dollars per 1e9 bytes kept for 730 hours",
    "cost_per_1000_put_usd, cost_per_1000_get_usd": "US dollars per 1000 requests",
}

ASSUMPTIONS = (
    "measured: one process on this machine saves the workload with ckptbench's writer (durable: O_DIRECT or "
    "fsync; object storage: completed uploads) and loads it cold; medians of the measured runs",
    "job checkpoint: parameters x bytes per parameter of the recipe (bf16 weights 2 + fp32 master 4 + Adam m, v 8 "
    "= 14 by default), split evenly over the ranks (fully sharded)",
    "every rank writes and reads its share at the rate measured here from one client at the same time: the tier "
    "is assumed to scale linearly with ranks (its aggregate limit was not measured)",
    "checkpoint time (sync) = bytes per rank / save rate; restore = bytes per rank / load rate",
    "async: stall = measured stall x (bytes per rank / workload bytes) (staging copies on this machine); "
    "persist = bytes per rank / (workload bytes / measured persist)",
    "restart after a failure = --restart (detect, replace, relaunch) + restore",
    "interval, overhead and waste: the exact model of `ckptbench interval` (exponential failures; async with "
    "at most one checkpoint in flight)",
    "run: --run-time of compute; wall time = run time / (1 - waste); checkpoints = run time / interval; "
    "restores = wall time / MTBF",
    "bill: --keep checkpoints stored for the whole wall time (months of 730 h), plus write requests per "
    "checkpoint and read requests per restore estimated from the writer's layout (shards of "
    f"{format_size(knobs.SAVE_SHARD_BYTES)} per rank, multipart parts of the tier's part_size); no GPU time, "
    "no data transfer",
)


# -- targets ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareTarget:
    """One column of the comparison: what the user gave, what serves it, and its tier config (if any)."""

    label: str
    given: str
    storage: Any  # LocalDirectory | storage.objects.ObjectTarget
    tier: Tier | None = None

    @property
    def on_objects(self) -> bool:
        return not isinstance(self.storage, LocalDirectory)

    @property
    def location(self) -> str:
        return str(self.storage)


def resolve_compare_target(given: str, storage_options: dict[str, Any], *, as_tier: bool = False) -> CompareTarget:
    """A TARGET as typed: a URL (``scheme://``), a tier file (``*.toml``), a tier name from
    ``configs/tiers`` (a word without ``/``; write ``./NAME`` for a directory of that name), or a path.

    ``storage_options`` (the command line's) apply to every object-storage target, over a tier's own.
    Raises a one-line UsageError/TargetError naming the target; nothing is written.
    """
    if as_tier or is_tier_file(given) or ("/" not in given and "://" not in given and given in tier_names()):
        tier = load_tier(given)
        options = {**tier.storage_options, **storage_options} if tier.is_url else {}
        try:
            storage = resolve_target(tier.url, options, forceable=False)
        except CkptbenchError as exc:
            raise type(exc)(f"tier {tier.name} ({tier.source}): {exc.args[0]}", hint=exc.hint) from None
        return CompareTarget(tier.name, given, storage, tier)
    if scheme_of(given) != "file":
        return CompareTarget(given, given, resolve_target(given, storage_options))
    if "/" not in given and not Path(given).expanduser().exists():
        raise TargetError(f"{given!r} is neither an existing directory, a URL, nor a tier",
                          hint=f"known tiers: {', '.join(tier_names()) or 'none'}; or a TIER.toml file")
    return CompareTarget(given, given, resolve_target(given, forceable=False))


def check_targets(targets: Sequence[CompareTarget], workload: CheckpointWorkload) -> None:
    """Everything that can fail before measuring: the same location twice, free space on every
    directory, every bucket reachable. Raises the first problem (one line, exit 2)."""
    seen: dict[str, str] = {}
    for t in targets:
        if t.location in seen:
            what = (f"{t.given!r} is given twice" if seen[t.location] == t.given
                    else f"{seen[t.location]!r} and {t.given!r} are the same location ({t.location})")
            raise UsageError(what, hint="give each tier once")
        seen[t.location] = t.given
    labels = [t.label for t in targets]
    if len(set(labels)) != len(labels):
        twice = next(label for label in labels if labels.count(label) > 1)
        raise UsageError(f"two targets are both called {twice!r}", hint="give each tier once")
    for t in targets:
        try:
            if t.on_objects:
                t.storage.prepare()
            else:
                t.storage.require_free(required_disk_bytes(workload))
        except CkptbenchError as exc:
            if t.label in exc.args[0]:
                raise
            raise type(exc)(f"{t.label}: {exc.args[0]}", hint=exc.hint) from None


# -- the job and its model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """The training job the measurements are scaled to.

    ``size``: its checkpoint (total and per rank); ``failures``: its failure rate (None: no interval);
    ``restart_s``: the fixed part of a restart (restore is added per tier); ``mode``: ``async`` (stall
    + persist) or ``sync``; ``interference``: async slowdown while persisting used by the model;
    ``every_s``: an interval to evaluate besides the optimum; ``run_s``: compute time of the run;
    ``keep``: checkpoints retained on the tier.
    """

    size: CheckpointSize
    model: str | None
    failures: FailureModel | None
    restart_s: float = 0.0
    mode: str = "async"
    interference: float = 0.0
    every_s: float | None = None
    run_s: float = 30 * 86400.0
    keep: int = 2
    #: Each tier's interference is its own, measured on the training device (``--device cuda``: the compute
    #: probe on the GPU while that tier's checkpoint persists), instead of ``interference``.
    interference_measured: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ("async", "sync"):
            raise UsageError(f"mode {self.mode!r} is not one of async, sync")
        if self.mode == "sync" and self.interference:
            raise UsageError("--interference describes asynchronous checkpoints; drop it or use --mode async")
        if not 0 <= self.interference < 1:
            raise UsageError(f"interference {self.interference!r} must lie in [0, 1)")
        if self.restart_s < 0 or not math.isfinite(self.restart_s):
            raise UsageError(f"restart {self.restart_s!r} must be zero or more seconds")
        if self.run_s <= 0 or not math.isfinite(self.run_s):
            raise UsageError(f"run time {self.run_s!r} must be positive")
        if self.keep < 1:
            raise UsageError(f"keep {self.keep} must be at least 1 checkpoint")

    @property
    def ranks(self) -> int:
        return self.size.parallelism.ranks

    @property
    def rank_bytes(self) -> int:
        return self.size.per_rank_max_bytes

    def to_dict(self) -> dict[str, Any]:
        f = self.failures
        return {
            "model": self.model,
            "params": self.size.params,
            "recipe": self.size.as_dict()["recipe"],
            "bytes_per_param": self.size.recipe.bytes_per_param(),
            "checkpoint_bytes": self.size.total_bytes,
            "ranks": self.ranks,
            "rank_bytes": self.rank_bytes,
            "mode": self.mode,
            "interference": self.interference,
            "interference_measured": self.interference_measured,
            "mtbf_s": f.mtbf_s if f else None,
            "failures_per_day": f.faults_per_day if f else None,
            "failure_source": f.source if f else None,
            "restart_s": self.restart_s,
            "every_s": self.every_s,
            "run_s": self.run_s,
            "keep": self.keep,
        }


@dataclass(frozen=True)
class Measured:
    """The medians the model takes from one tier's benchmark (ckptbench's writer), and the runs behind them."""

    workload_bytes: int
    save_gbps: float
    load_gbps: float
    stall_s: float | None
    persist_s: float | None
    interference: float | None
    save_cached: bool
    load_cached: bool
    files: int
    disk_bytes: int
    runs_save_gbps: tuple[float, ...] = ()
    runs_load_gbps: tuple[float, ...] = ()
    runs_stall_s: tuple[float, ...] = ()
    runs_persist_s: tuple[float, ...] = ()

    def ends(self) -> tuple[Measured, Measured]:
        """(optimistic, pessimistic): the best and the worst of the runs of every quantity."""
        def pick(runs: tuple[float, ...], point: float | None, better: Any) -> float | None:
            return better(runs) if runs and point is not None else point

        best = dataclasses.replace(self, save_gbps=pick(self.runs_save_gbps, self.save_gbps, max),
                                   load_gbps=pick(self.runs_load_gbps, self.load_gbps, max),
                                   stall_s=pick(self.runs_stall_s, self.stall_s, min),
                                   persist_s=pick(self.runs_persist_s, self.persist_s, min))
        worst = dataclasses.replace(self, save_gbps=pick(self.runs_save_gbps, self.save_gbps, min),
                                    load_gbps=pick(self.runs_load_gbps, self.load_gbps, min),
                                    stall_s=pick(self.runs_stall_s, self.stall_s, max),
                                    persist_s=pick(self.runs_persist_s, self.persist_s, max))
        return best, worst

    @classmethod
    def from_report(cls, report: CheckpointBenchReport) -> Measured:
        ours = report.result("ckptbench")
        if ours is None:
            raise UsageError("the comparison needs ckptbench's writer among the writers")
        run_async = report.async_result("ckptbench")
        return cls(
            workload_bytes=ours.save.bytes_per_run, save_gbps=ours.save.gbps, load_gbps=ours.load.gbps,
            stall_s=statistics.median(run_async.stall_s) if run_async else None,
            persist_s=statistics.median(run_async.persist_s) if run_async else None,
            interference=run_async.interference_median if run_async else None,
            save_cached=ours.save.is_cached(report.memcpy_bps), load_cached=ours.load.is_cached(report.memcpy_bps),
            files=ours.files, disk_bytes=ours.disk_bytes,
            runs_save_gbps=tuple(ours.save.runs_gbps), runs_load_gbps=tuple(ours.load.runs_gbps),
            runs_stall_s=tuple(run_async.stall_s) if run_async else (),
            runs_persist_s=tuple(run_async.persist_s) if run_async else (),
        )

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> Measured:
        """The same from a saved ``ckptbench.bench.checkpoint/1`` document (KeyError/TypeError when malformed)."""
        ours = next((r for r in doc["results"] if r["writer"] == "ckptbench"), None)
        if ours is None:
            raise UsageError("the comparison needs ckptbench's writer among the writers")
        mine = next((a for a in doc.get("async") or [] if a["writer"] == "ckptbench"), None)
        save, load = ours["save"], ours["load"]
        return cls(
            workload_bytes=int(save["bytes_per_run"]), save_gbps=float(save["gbps"]), load_gbps=float(load["gbps"]),
            stall_s=float(mine["stall_s"]) if mine else None, persist_s=float(mine["persist_s"]) if mine else None,
            interference=mine.get("interference") if mine else None, save_cached=bool(save["cached"]),
            load_cached=bool(load["cached"]), files=int(ours["files"]), disk_bytes=int(ours["disk_bytes"]),
            runs_save_gbps=tuple(float(v) for v in save["runs_gbps"]),
            runs_load_gbps=tuple(float(v) for v in load["runs_gbps"]),
            runs_stall_s=tuple(float(v) for v in mine["runs_stall_s"]) if mine else (),
            runs_persist_s=tuple(float(v) for v in mine["runs_persist_s"]) if mine else (),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SavedBench:
    """A tier measured earlier: its ``ckptbench.bench.checkpoint/1`` document read back, standing in for the
    report of a tier measured in this run (``to_dict``, ``warnings``, ``environment``)."""

    source: str
    document: dict[str, Any]

    @property
    def environment(self) -> dict[str, Any]:
        return self.document.get("environment") or {}

    def to_dict(self) -> dict[str, Any]:
        return self.document

    def warnings(self) -> list[BenchWarning]:
        return [BenchWarning(w["code"], w["message"], w["remedy"]) for w in self.document.get("warnings") or []]


def saved_tiers(where: str, doc: dict[str, Any]) -> list[tuple[str, SavedBench]]:
    """``(label, saved benchmark)`` of every tier a result file measured: a shoot-out (``bench --workload
    checkpoint``), each tier of a comparison, or the sample of a preflight. UsageError (one line) otherwise."""
    schema = str(doc.get("schema", "")) if isinstance(doc, dict) else ""
    name = schema.partition("/")[0]
    with reading_document(where, schema or "result"):
        if name == "ckptbench.bench.checkpoint":
            found = [(doc["target"], doc)]
        elif name == "ckptbench.compare":
            found = [(t["label"], t["bench"]) for t in doc["tiers"]]
        elif name == "ckptbench.preflight":
            found = [(doc["target"], doc["measurements"]["checkpoint_bench"])]
        else:
            raise UsageError(f"--from {where}: a {schema or 'non-ckptbench'} file holds no tier measured with the "
                             "writer", hint="give a result of `bench --workload checkpoint`, `compare` or `preflight`")
        out = []
        for label, bench in found:
            if str(bench.get("schema", "")).partition("/")[0] != "ckptbench.bench.checkpoint":
                raise UsageError(f"--from {where}: {label} was not measured in one process "
                                 f"({bench.get('schema')}), which compare cannot set beside its tiers")
            Measured.from_document(bench)  # malformed: fail now, naming the file
            out.append((f"{label} ({Path(where).name})", SavedBench(where, bench)))
    return out


@dataclass(frozen=True)
class TierModel:
    """The job on one tier: its checkpoint and restore times, the interval analysis, the bill.

    ``error`` says why no interval could be computed (a checkpoint slower than the MTBF); the times are
    still there. ``interval_error`` says why ``--every`` could not be evaluated (two checkpoints in flight).
    """

    checkpoint_s: float
    stall_s: float | None
    persist_s: float | None
    restore_s: float
    restart_s: float
    blocking_s: float | None
    optimal_interval_s: float | None = None
    overhead_fraction: float | None = None
    waste_fraction: float | None = None
    constraint_binding: bool | None = None
    interval_s: float | None = None
    overhead_fraction_at_interval: float | None = None
    waste_fraction_at_interval: float | None = None
    checkpoints_per_run: float | None = None
    wall_s: float | None = None
    failures_per_run: float | None = None
    bill: dict[str, Any] | None = None
    error: str | None = None
    interval_error: str | None = None
    interference: float = 0.0  # what the async model used on this tier (see tier_interference)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tier_interference(job: JobSpec, measured: Measured) -> float:
    """The interference the model uses on a tier: 0 for sync checkpoints; the tier's own, measured on the
    training device, when the job says so and the probe saw steps during the persist; else the job's."""
    if job.mode == "sync":
        return 0.0
    if job.interference_measured and measured.interference is not None:
        return from_slowdown(measured.interference) or 0.0
    return job.interference


def model_tier(job: JobSpec, measured: Measured, prices: TierPrices, *, part_bytes: int | None,
               shard_bytes: int = knobs.SAVE_SHARD_BYTES) -> TierModel:
    """Apply ``measured`` to ``job`` (the scaling rules are :data:`ASSUMPTIONS`). ``part_bytes``:
    the multipart part size on object storage (None on a filesystem: no requests billed)."""
    rank = job.rank_bytes
    checkpoint_s = rank / (measured.save_gbps * 1e9)
    restore_s = rank / (measured.load_gbps * 1e9)
    restart_s = job.restart_s + restore_s
    stall_s = persist_s = None
    if measured.stall_s is not None and measured.persist_s is not None:
        stall_s = measured.stall_s * rank / measured.workload_bytes
        persist_s = rank * measured.persist_s / measured.workload_bytes
    out: dict[str, Any] = {"checkpoint_s": checkpoint_s, "stall_s": stall_s, "persist_s": persist_s,
                           "restore_s": restore_s, "restart_s": restart_s, "blocking_s": None,
                           "interference": tier_interference(job, measured)}
    try:
        if job.mode == "sync":
            cost = interval.CheckpointCost.sync(checkpoint_s)
        elif stall_s is None or persist_s is None:
            raise UsageError("no async save was measured on this tier")
        else:
            cost = interval.CheckpointCost(stall_s, persist_s, out["interference"])
        out["blocking_s"] = cost.blocking_s
        if job.failures is not None:
            analysis = interval.analyse(cost, job.failures.mtbf_s, restart_s)
            out |= {"optimal_interval_s": analysis.optimal_interval_s,
                    "overhead_fraction": analysis.overhead_fraction_at_optimum,
                    "waste_fraction": analysis.waste_fraction, "constraint_binding": analysis.constraint_binding}
    except UsageError as exc:
        out["error"] = exc.args[0]
    if job.every_s is not None and out["blocking_s"] is not None and out.get("error") is None:
        try:
            if job.failures is not None:
                at = interval.analyse(cost, job.failures.mtbf_s, restart_s, job.every_s)
                out |= {"interval_s": job.every_s, "overhead_fraction_at_interval": at.overhead_fraction,
                        "waste_fraction_at_interval": at.waste_fraction_at_interval}
            else:
                out |= {"interval_s": job.every_s,
                        "overhead_fraction_at_interval": interval.overhead_fraction(job.every_s, cost)}
        except UsageError as exc:  # e.g. --every shorter than the persist: two checkpoints in flight
            out["interval_error"] = exc.args[0]
    tau = out.get("interval_s") or out.get("optimal_interval_s")
    waste = out.get("waste_fraction_at_interval") if out.get("interval_s") else out.get("waste_fraction")
    if waste is not None:
        wall_s = job.run_s / (1.0 - waste)
    elif tau is not None and out["blocking_s"] is not None:
        wall_s = job.run_s * (1.0 + out["blocking_s"] / tau)  # no failure rate: stalls only
    else:
        wall_s = job.run_s
    checkpoints = job.run_s / tau if tau else None
    failures = wall_s / job.failures.mtbf_s if job.failures is not None else 0.0
    requests = (object_requests(rank, job.ranks, shard_bytes, part_bytes) if part_bytes is not None else None)
    use = RunUse(retained_bytes=job.keep * job.size.total_bytes, wall_s=wall_s, checkpoints=checkpoints,
                 restores=failures, requests=requests)
    out |= {"checkpoints_per_run": checkpoints, "wall_s": wall_s,
            "failures_per_run": failures if job.failures is not None else None,
            "bill": run_bill(prices, use)}
    return TierModel(**out)


# -- the run ------------------------------------------------------------------------------------------


class _TierProgress(Progress):
    """One tier's benchmark reported into the comparison's single bar (every tier moves the same bytes)."""

    def __init__(self, outer: Progress, index: int, count: int, label: str) -> None:
        self._outer, self._index, self._count = outer, index, count
        self._prefix = f"{label} ({index + 1}/{count})"

    def begin(self, total_bytes: int) -> None:
        if self._index == 0:
            self._outer.begin(total_bytes * self._count)

    def phase(self, description: str) -> None:
        self._outer.phase(f"{self._prefix}: {description}")

    def advance(self, step_bytes: int) -> None:
        self._outer.advance(step_bytes)

    def end_step(self, step_bytes: int) -> None:
        self._outer.end_step(step_bytes)


@dataclass(frozen=True)
class TierResult:
    target: CompareTarget
    report: CheckpointBenchReport
    measured: Measured
    model: TierModel
    model_ends: tuple[TierModel, TierModel] | None = None  # the model at the (best, worst) ends of the runs
    bottleneck: dict[str, Any] | None = None  # bench.ceiling.bottleneck of its save rate
    saved_from: str | None = None  # the result file of a tier measured earlier (--from), not in this run

    @property
    def label(self) -> str:
        return self.target.label

    @property
    def filesystem(self) -> str | None:
        return (self.report.environment.get("target") or {}).get("filesystem")

    def model_range(self) -> dict[str, list[float] | None]:
        """``[low, high]`` of each job figure over the runs' spread (None where a figure is missing)."""
        if self.model_ends is None:
            return {}
        out: dict[str, list[float] | None] = {}
        for key, where, attr, _ in BEST_METRICS:
            if where != "model":
                continue
            values = [_model_value(m, attr) for m in (self.model, *self.model_ends)]
            out[key] = None if None in values else [min(values), max(values)]  # type: ignore[type-var]
        return out

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        env_kind = (self.report.environment.get("target") or {}).get("kind")
        return {
            "label": t.label,
            "given": t.given,
            "kind": ("object" if t.on_objects else "directory") if t.storage is not None else (
                "object" if env_kind == "s3" or str(self.report.to_dict().get("target", "")).startswith("s3://")
                else "directory"),
            "location": t.location if t.storage is not None else self.report.to_dict().get("target"),
            "filesystem": self.filesystem,
            "tier": t.tier.to_dict() if t.tier else None,
            "measured": self.measured.to_dict(),
            "model": self.model.to_dict(),
            "model_range": self.model_range(),
            "bottleneck": self.bottleneck,
            "saved_from": self.saved_from,
            "bench": self.report.to_dict(),
        }


def run_compare(spec: CheckpointBenchSpec, job: JobSpec, targets: Sequence[CompareTarget], *,
                workload: CheckpointWorkload, progress: Progress | None = None,
                saved: Sequence[tuple[str, SavedBench]] = ()) -> CompareReport:
    """Measure ``workload`` on every target in turn (checked beforehand by :func:`check_targets`) and
    model the job on each, and on every ``saved`` tier (measured earlier, read from a result file). Each
    tier's scratch is removed as it ends (Ctrl-C included)."""
    progress = progress or Progress()
    ceiling = None
    if targets:
        progress.phase("the writer's own rate into memory (tmpfs)")
        ceiling = writer_ceiling_bps(workload, threads=spec.threads)
    results = []
    for i, t in enumerate(targets):
        report = run_checkpoint_bench(spec, t.storage, progress=_TierProgress(progress, i, len(targets), t.label),
                                      workload=workload)
        measured = Measured.from_report(report)
        prices = t.tier.prices if t.tier else TierPrices()
        part = (report.environment.get("target") or {}).get("part_size_bytes") if t.on_objects else None
        ends = tuple(model_tier(job, end, prices, part_bytes=part) for end in measured.ends())
        results.append(TierResult(t, report, measured, model_tier(job, measured, prices, part_bytes=part),
                                  model_ends=ends, bottleneck=bottleneck(measured.save_gbps * 1e9, ceiling)))
    for label, bench in saved:
        measured = Measured.from_document(bench.document)
        part = (bench.environment.get("target") or {}).get("part_size_bytes")
        ends = tuple(model_tier(job, end, TierPrices(), part_bytes=part) for end in measured.ends())
        target = CompareTarget(label, bench.source, storage=None)
        results.append(TierResult(target, bench, measured, model_tier(job, measured, TierPrices(), part_bytes=part),
                                  model_ends=ends, saved_from=bench.source))
    return CompareReport(spec=spec, job=job, workload=workload, tiers=tuple(results),
                         environment=collect_environment())


#: Metrics marked best: (key in ``best``, record, attribute, higher is better).
BEST_METRICS: tuple[tuple[str, str, str, bool], ...] = (
    ("save_gbps", "measured", "save_gbps", True), ("load_gbps", "measured", "load_gbps", True),
    ("measured_stall_s", "measured", "stall_s", False), ("measured_persist_s", "measured", "persist_s", False),
    ("checkpoint_s", "model", "checkpoint_s", False), ("stall_s", "model", "stall_s", False),
    ("persist_s", "model", "persist_s", False), ("restore_s", "model", "restore_s", False),
    ("overhead_fraction", "model", "overhead_fraction", False), ("waste_fraction", "model", "waste_fraction", False),
    ("overhead_fraction_at_interval", "model", "overhead_fraction_at_interval", False),
    ("waste_fraction_at_interval", "model", "waste_fraction_at_interval", False),
    ("bill_total_usd", "model", "bill", False),
)


def _model_value(model: TierModel, attr: str) -> float | None:
    if attr == "bill":
        return model.bill["total_usd"] if model.bill and model.bill["complete"] else None
    return getattr(model, attr)


def _metric(result: TierResult, where: str, attr: str) -> float | None:
    if where == "measured":
        return getattr(result.measured, attr)
    return _model_value(result.model, attr)


_RUNS = {"save_gbps": "runs_save_gbps", "load_gbps": "runs_load_gbps", "stall_s": "runs_stall_s",
         "persist_s": "runs_persist_s"}


def _samples(result: TierResult, where: str, attr: str) -> list[float]:
    """What the tie rule compares: a measured quantity's runs, or a job figure at the point and at both ends
    of the runs (one value when the tier ran once: no spread to judge by)."""
    if where == "measured":
        return list(getattr(result.measured, _RUNS[attr]))
    values = [_model_value(result.model, attr)]
    if result.model_ends is not None and len(result.measured.runs_save_gbps) > 1:
        values += [_model_value(end, attr) for end in result.model_ends]
    return [v for v in values if v is not None]


@dataclass(frozen=True)
class CompareReport:
    spec: CheckpointBenchSpec
    job: JobSpec
    workload: CheckpointWorkload
    tiers: tuple[TierResult, ...]
    environment: dict[str, Any]
    created: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    def ranking(self) -> dict[str, list[str]]:
        """Metric -> labels of the tiers tied for best on it (:func:`stats.leaders` over their runs), best
        median first; one label is a winner beyond the noise. Only where two or more tiers have a value."""
        out = {}
        for key, where, attr, higher in BEST_METRICS:
            present = [r for r in self.tiers if _metric(r, where, attr) is not None]
            if len(present) >= 2:
                samples = [_samples(r, where, attr) or [_metric(r, where, attr)] for r in present]
                out[key] = [present[i].label for i in leaders(samples, higher_is_better=higher)]
        return out

    def best(self) -> dict[str, str]:
        """Metric -> label of the tier that beats every other on it beyond the noise."""
        return {key: labels[0] for key, labels in self.ranking().items() if len(labels) == 1}

    def tied(self) -> dict[str, list[str]]:
        """Metric -> labels of the tiers the noise cannot tell apart at the top."""
        return {key: labels for key, labels in self.ranking().items() if len(labels) > 1}

    def notes(self) -> list[str]:
        out = []
        job = self.job
        if job.failures is None:
            out.append("no failure rate given (--mtbf, --failures, ...): no optimal interval, waste or restores")
        if job.ranks > 1:
            out.append(f"{job.ranks} ranks each write {format_size(job.rank_bytes)} at the rate "
                       "measured here from one client: a tier that cannot serve them all at once will be slower")
        if job.mode == "async" and job.interference_measured:
            shown = ", ".join(f"{r.label} {r.model.interference:.1%}" for r in self.tiers)
            out.append(f"the model uses each tier's interference measured on the training device: {shown} (a GPU "
                       "compute loop's slowdown while that tier's checkpoint persists; a tier where no step finished "
                       f"during the persist uses {job.interference:.0%})")
        elif job.mode == "async":
            measured = [(r.label, r.measured.interference) for r in self.tiers if r.measured.interference is not None]
            if measured:
                shown = ", ".join(f"{label} {from_slowdown(value):.0%}" for label, value in measured)
                out.append(f"the model uses interference {job.interference:.0%} (--interference; without it, "
                           f"{ASSUMED.source}); the CPU probe beside the persist lost {shown} of its throughput, "
                           "information only: a GPU training step does not run on those cores")
        saved = [r for r in self.tiers if r.saved_from]
        if saved:
            out.append("measured earlier, not in this run: " + "; ".join(
                f"{r.label} ({r.report.to_dict().get('created', 'unknown date')})" for r in saved)
                + ": another day or machine may differ beyond the runs' spread")
        bound = [r.label for r in self.tiers if r.bottleneck and r.bottleneck["limit"] == "writer"]
        if bound:
            ceiling = next(r.bottleneck["writer_ceiling_bps"] for r in self.tiers if r.label == bound[0])
            out.append(f"writer-bound: {', '.join(bound)} saved at 80 % or more of the writer's own rate into memory on "
                       f"this host ({ceiling / 1e9:.2f} GB/s): there the host's CPU and memory limit, not the storage, "
                       "and such tiers compare as the writer, not as storage")
        if any(r.model.bill and not r.model.bill["complete"] for r in self.tiers):
            out.append("request costs need an interval (a failure rate or --every); the $ shown omit them")
        return out

    def warnings(self) -> list[BenchWarning]:
        """Each tier's benchmark warnings (merged where tiers share one), then the comparison's own."""
        merged: dict[tuple[str, str, str], list[str]] = {}
        for r in self.tiers:
            for w in r.report.warnings():
                merged.setdefault((w.code, w.message.removeprefix(f"{r.target.location} "), w.remedy), []).append(
                    r.label)
        out = [BenchWarning(code, f"{', '.join(labels)}: {message}", remedy)
               for (code, message, remedy), labels in merged.items()]
        devices: dict[str, list[str]] = {}
        for r in self.tiers:
            env = r.report.environment.get("target") or {}
            if not r.target.on_objects and env.get("mount_device"):
                devices.setdefault(f"{env['mount_device']} on {env['mount_point']}", []).append(r.label)
        for device, labels in devices.items():
            if len(labels) > 1:
                out.append(BenchWarning(
                    "same-filesystem", f"{' and '.join(labels)} are on the same filesystem ({device}): the "
                    "comparison measured the same storage more than once",
                    "give directories on the tiers you mean to compare"))
        for r in self.tiers:
            if r.model.error:
                out.append(BenchWarning(
                    "model-infeasible", f"{r.label}: no interval for this job: {r.model.error}",
                    "a faster tier, more ranks writing in parallel, async checkpoints, or a lower failure rate"))
            if r.model.interval_error:
                out.append(BenchWarning(
                    "interval-infeasible", f"{r.label}: --every cannot be evaluated: {r.model.interval_error}",
                    "checkpoint less often on this tier"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **document_header(SCHEMA, self.created),
            "spec": self.spec.to_dict(),
            "workload": self.workload.to_dict(),
            "job": self.job.to_dict(),
            "units": UNITS,
            "tiers": [r.to_dict() for r in self.tiers],
            "best": self.best(),
            "tied": self.tied(),
            "notes": self.notes(),
            "assumptions": list(ASSUMPTIONS),
            "warnings": [w.to_dict() for w in self.warnings()],
            "environment": self.environment,
        }

