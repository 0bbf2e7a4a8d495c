"""The checkpoint benchmark's result schema: per-writer save/load timings, async numbers, memory, goals.

A JSON document (``schema`` ``ckptbench.bench.checkpoint/1``) has ``tool``, ``created``, ``target``,
``spec``, ``units``, ``workload`` (the synthetic state_dict), ``environment``, ``memcpy_gbps``,
``cache_drop`` (how reads were made cold), ``data_verified``, ``results`` (one record per writer:
save and load, raw samples kept), ``async`` (stall, persist, total, interference per async writer),
``probe`` (the compute probe), ``rss_method`` (how peak RSS was read), ``memory`` (peak extra RSS
and growth over repeated saves), ``goals`` (the performance goals as ratios, each with its
threshold) and ``warnings`` (each with a remedy). Shared pieces (``BenchWarning``,
``NOISY_SPREAD``, ``setup_warnings``) come from :mod:`ckptbench.bench.records`.
"""

from __future__ import annotations

import datetime as dt
import statistics
from dataclasses import dataclass, field
from typing import Any

from ckptbench import knobs
from ckptbench.bench.records import (
    NOISY_SPREAD,
    BenchWarning,
    Timings,
    cache_warnings,
    document_header,
    setup_warnings,
)
from ckptbench.bench.stats import relative_spread, summarize
from ckptbench.bench.timeline import LatencyHistogram, Timeline, series_dict
from ckptbench.units import format_rate, format_size

SCHEMA = "ckptbench.bench.checkpoint/1"

UNITS = {
    "gbps": "1e9 bytes per second (state_dict tensor bytes / seconds)",
    "_bytes": "bytes",
    "_s": "seconds",
    "interference": "fraction: probe step time while persisting / alone - 1",
    "ratio": "ckptbench / other (higher is better for rates, lower for stall/time/memory)",
}

#: RSS growth over the repeated saves, as a fraction of the checkpoint, still counted as "no growth".
RSS_GROWTH_TOLERANCE = 0.01


@dataclass(frozen=True)
class WriterResult:
    """One writer's durable saves and cold loads of the same state_dict.

    ``verified`` is True when every load matched the source bit for bit, None when the writer loads
    no state_dict (the fio reference). ``details`` holds writer-specific facts (O_DIRECT used, ...).
    """

    writer: str
    durable: str
    load_how: str
    save: Timings
    load: Timings
    verified: bool | None
    files: int
    disk_bytes: int
    save_peak_extra_rss_bytes: tuple[int, ...]
    details: dict[str, Any] = field(default_factory=dict)
    # op ("save", "load") -> (each measured run's timeline, the runs' latency histogram): the engine's
    # calls inside the timed save or load (none for a writer that does not use the engine)
    series: dict[str, tuple[tuple[Timeline, ...], LatencyHistogram | None]] = field(default_factory=dict)

    def to_dict(self, memcpy_bps: float) -> dict[str, Any]:
        no_series: tuple[tuple[Timeline, ...], None] = ((), None)
        return {
            "writer": self.writer,
            "durable": self.durable,
            "load_how": self.load_how,
            "save": {**self.save.to_dict(memcpy_bps), **series_dict(*self.series.get("save", no_series))},
            "load": {**self.load.to_dict(memcpy_bps), **series_dict(*self.series.get("load", no_series))},
            "verified": self.verified,
            "files": self.files,
            "disk_bytes": self.disk_bytes,
            "save_peak_extra_rss_bytes": list(self.save_peak_extra_rss_bytes),
            "details": self.details,
        }


@dataclass(frozen=True)
class WriterFailure:
    """A competitor that failed during the run (``during``: what it was doing, e.g. "save warm-up 1/1"):
    left out of the later rounds and of the results, the others measured on."""

    writer: str
    during: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"writer": self.writer, "during": self.during, "error": self.error}


@dataclass(frozen=True)
class AsyncResult:
    """Asynchronous saves of one writer: ``stall`` (the call blocks), ``persist`` (return -> durable),
    ``total``; then the same save with the compute probe running during persist (``interference``)."""

    writer: str
    how: str
    stall_s: tuple[float, ...]
    persist_s: tuple[float, ...]
    total_s: tuple[float, ...]
    probe_alone_step_s: tuple[float, ...]
    probe_during_step_s: tuple[float | None, ...]
    probe_steps_during: tuple[int, ...]
    persist_with_probe_s: tuple[float, ...]
    verified: bool

    @property
    def interference(self) -> list[float | None]:
        return [None if during is None else during / alone - 1
                for alone, during in zip(self.probe_alone_step_s, self.probe_during_step_s, strict=True)]

    @property
    def interference_median(self) -> float | None:
        values = [v for v in self.interference if v is not None]
        return statistics.median(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        measured = [v for v in self.interference if v is not None]
        return {
            "writer": self.writer,
            "how": self.how,
            "stall_s": statistics.median(self.stall_s),
            "persist_s": statistics.median(self.persist_s),
            "total_s": statistics.median(self.total_s),
            "runs_stall_s": list(self.stall_s),
            "runs_persist_s": list(self.persist_s),
            "runs_total_s": list(self.total_s),
            "summary_stall_s": summarize(self.stall_s),
            "summary_persist_s": summarize(self.persist_s),
            "summary_total_s": summarize(self.total_s),
            "interference": self.interference_median,
            "runs_interference": self.interference,
            "summary_interference": summarize(measured) if measured else None,
            "probe_alone_step_s": list(self.probe_alone_step_s),
            "probe_during_step_s": list(self.probe_during_step_s),
            "probe_steps_during": list(self.probe_steps_during),
            "runs_persist_with_probe_s": list(self.persist_with_probe_s),
            "verified": self.verified,
        }


@dataclass(frozen=True)
class MemoryResult:
    """RSS over ``saves`` repeated ckptbench saves to one path by one fresh Checkpointer.

    ``first_peak_extra_bytes``: peak RSS during the first save (its staging memory allocated: the arena,
    or the ring of a sync save) minus RSS before it; ``steady_peak_extra_bytes``: the same, worst of the
    later saves (staging memory reused);
    ``rss_after_bytes``: RSS after each save, whose spread is the growth.
    """

    saves: int
    method: str
    checkpoint_bytes: int
    rss_before_bytes: int
    first_peak_extra_bytes: int
    steady_peak_extra_bytes: int
    rss_after_bytes: tuple[int, ...]

    @property
    def growth_bytes(self) -> int:
        return self.rss_after_bytes[-1] - self.rss_after_bytes[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "saves": self.saves,
            "method": self.method,
            "checkpoint_bytes": self.checkpoint_bytes,
            "rss_before_bytes": self.rss_before_bytes,
            "first_peak_extra_bytes": self.first_peak_extra_bytes,
            "steady_peak_extra_bytes": self.steady_peak_extra_bytes,
            "rss_after_bytes": list(self.rss_after_bytes),
            "growth_bytes": self.growth_bytes,
        }


@dataclass(frozen=True)
class Goal:
    """A performance goal as a ratio (``value``) against a threshold (``goal``): ``>=`` or ``<=``.

    ``ceiling``: the same ratio for fio, the storage's own raw speed, where the run measured it (a
    goal of ``>=`` that fio itself does not reach cannot be met by any writer on this storage)."""

    name: str
    description: str
    value: float
    goal: float
    comparison: str
    ceiling: float | None = None

    @property
    def met(self) -> bool:
        return self.value >= self.goal if self.comparison == ">=" else self.value <= self.goal

    @property
    def reachable(self) -> bool:
        return self.ceiling is None or self.comparison != ">=" or self.ceiling >= self.goal

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "value": self.value, "goal": self.goal,
                "comparison": self.comparison, "met": self.met, "ceiling": self.ceiling,
                "reachable": self.reachable}


@dataclass(frozen=True)
class CheckpointBenchReport:
    target: str
    spec: Any  # bench.checkpoint.CheckpointBenchSpec
    workload: Any  # bench.workloads.CheckpointWorkload
    memcpy_bps: float
    results: tuple[WriterResult, ...]
    async_results: tuple[AsyncResult, ...]
    memory: MemoryResult | None
    cache_drop: dict[str, Any]
    probe: dict[str, Any] | None
    rss_method: str
    environment: dict[str, Any]
    failed: tuple[WriterFailure, ...] = ()
    created: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    def result(self, writer: str) -> WriterResult | None:
        return next((r for r in self.results if r.writer == writer), None)

    def async_result(self, writer: str) -> AsyncResult | None:
        return next((r for r in self.async_results if r.writer == writer), None)

    @property
    def data_verified(self) -> bool:
        checked = [r.verified for r in self.results if r.verified is not None]
        checked += [r.verified for r in self.async_results]
        return bool(checked) and all(checked)

    def goals(self) -> list[Goal]:
        """The performance goals this run can judge (those whose writers took part), medians throughout."""
        ours = self.result("ckptbench")
        if ours is None:
            return []
        goals: list[Goal] = []
        fio = self.result("fio")
        for other, op, goal in (("torch", "save", 1.5), ("dcp", "save", 1.0), ("fio", "save", 0.9),
                                ("torch", "load", 2.0), ("fio", "load", 0.9)):
            theirs = self.result(other)
            if theirs is None:
                continue
            ours_op, theirs_op = getattr(ours, op), getattr(theirs, op)
            what = "durable save" if op == "save" else "cold load"
            ceiling = getattr(fio, op).gbps / theirs_op.gbps if fio is not None and other != "fio" else None
            goals.append(Goal(f"{op}_vs_{other}", f"ckptbench {what} GB/s / {other} {what} GB/s",
                              ours_op.gbps / theirs_op.gbps, goal, ">=", ceiling))
        our_async, dcp_async = self.async_result("ckptbench"), self.async_result("dcp")
        if our_async is not None and dcp_async is not None:
            goals.append(Goal("async_stall_vs_dcp", "ckptbench async stall / dcp.async_save stall",
                              statistics.median(our_async.stall_s) / statistics.median(dcp_async.stall_s), 0.3, "<="))
        if our_async is not None:
            goals.append(Goal("async_total_vs_sync", "ckptbench async total (stall + persist) / ckptbench sync save",
                              statistics.median(our_async.total_s) / ours.save.median_s, 1.15, "<="))
        if self.memory is not None:
            m = self.memory
            goals.append(Goal("peak_extra_rss_vs_checkpoint",
                              "peak extra RSS during the first save (arena included) / checkpoint bytes",
                              m.first_peak_extra_bytes / m.checkpoint_bytes, 1.1, "<="))
            goals.append(Goal("rss_growth_vs_checkpoint",
                              f"RSS growth over {m.saves} repeated saves / checkpoint bytes",
                              m.growth_bytes / m.checkpoint_bytes, RSS_GROWTH_TOLERANCE, "<="))
        return goals

    def warnings(self) -> list[BenchWarning]:
        out: list[BenchWarning] = cache_warnings(self.cache_drop)
        ceiling = format_rate(self.memcpy_bps)
        for r in self.results:
            if r.load.is_cached(self.memcpy_bps):
                out.append(BenchWarning(
                    "cached-load",
                    f"{r.writer}: load {format_rate(r.load.gbps * 1e9)} is above "
                    f"{knobs.CACHED_FRACTION_OF_MEMCPY:.0%} of this machine's memcpy bandwidth ({ceiling}): "
                    "it was served from memory, not the storage",
                    "run as root so the page cache is dropped between runs, or use a larger --scale/--size",
                ))
        ours = self.result("ckptbench")
        on_objects = "url" in (self.environment.get("target") or {})  # (a filesystem target has a path)
        if (ours is not None and not on_objects and ours.details.get("direct_requested")
                and not ours.details.get("direct")):
            out.append(BenchWarning(
                "direct-fallback",
                f"ckptbench: O_DIRECT is not available here ({ours.details.get('direct_fallback_reason')}); "
                "it wrote buffered with fdatasync instead",
                "nothing to do if this is a FUSE/network filesystem; results stay durable",
            ))
        out += setup_warnings(self.target, self.environment, self.spec.repeat, "writer")
        for f in self.failed:
            out.append(BenchWarning(
                "writer-failed", f"{f.writer} failed during {f.during}, so it has no results: {f.error}",
                "see the error; the other writers' results are complete"))
        for r in self.results:
            for t in (r.save, r.load):
                spread = relative_spread(t.runs_gbps)
                if spread > NOISY_SPREAD:
                    out.append(BenchWarning(
                        f"noisy-{t.op}",
                        f"{r.writer}: {t.op} repeats differ by {spread:.0%} of the median "
                        "(a busy machine or a small checkpoint)",
                        "use a larger --scale/--size or more --repeat, on a quiet machine",
                    ))
        for a in self.async_results:
            spread = relative_spread(a.probe_alone_step_s)
            if spread > NOISY_SPREAD:
                out.append(BenchWarning(
                    "noisy-probe",
                    f"{a.writer}: the compute probe alone varied by {spread:.0%} between runs, so something else "
                    "competes for the CPUs; its interference figures are unreliable",
                    "measure on a quiet machine, with more --repeat",
                ))
            if any(v is None for v in a.interference):
                out.append(BenchWarning(
                    "interference-unmeasured",
                    f"{a.writer}: persist ended before one compute-probe step finished in some runs; "
                    "interference was not measured there",
                    "use a larger --scale/--size",
                ))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **document_header(SCHEMA, self.created),
            "target": self.target,
            "spec": self.spec.to_dict(),
            "units": UNITS,
            "workload": self.workload.to_dict(),
            "memcpy_gbps": self.memcpy_bps / 1e9,
            "cache_drop": self.cache_drop,
            "data_verified": self.data_verified,
            "results": [r.to_dict(self.memcpy_bps) for r in self.results],
            "async": [a.to_dict() for a in self.async_results],
            "failed_writers": [f.to_dict() for f in self.failed],
            "probe": self.probe,
            "rss_method": self.rss_method,
            "memory": self.memory.to_dict() if self.memory else None,
            "goals": [g.to_dict() for g in self.goals()],
            "warnings": [w.to_dict() for w in self.warnings()],
            "environment": self.environment,
        }


def describe_bytes(nbytes: int) -> str:
    """``"1.72 GiB (1.85 GB)"``: both units, as the tables print checkpoint sizes."""
    return f"{format_size(nbytes)} ({format_size(nbytes, binary=False)})"
