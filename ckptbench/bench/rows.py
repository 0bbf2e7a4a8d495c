"""A result document as flat rows: one per configuration (sweeps), writer (shoot-outs, distributed runs) or
tier (compare), with the measured runs of each metric. The one reading of result files for ``--format csv``,
``compare-results`` and the report's overview.

Every row has the same columns, whatever the schema (:data:`COLUMNS`): what identifies it, then for each
metric of :data:`METRICS` its median, min, max and sample standard deviation over the measured runs.
A column that does not apply to a schema is empty. Column names are part of the interface: new ones are
only ever added at the end.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptbench.errors import UsageError
from ckptbench.units import format_size

#: metric -> whether higher is better; rates in 1e9 bytes per second, times in seconds.
METRICS: dict[str, bool] = {
    "write_gbps": True,
    "read_gbps": True,
    "save_gbps": True,
    "load_gbps": True,
    "stall_s": False,
    "persist_s": False,
    "interference": False,
}

#: What identifies a row (the configuration or writer or tier), in CSV order.
KEY_COLUMNS = ("schema", "source", "target", "configuration", "writer", "tier", "threads", "block_size_bytes",
               "schedule", "object_size_bytes", "concurrency", "part_size_bytes", "ranks", "bytes_per_run", "runs",
               "leader")
#: The per-metric columns: ``<metric>`` is the median of the runs.
STATISTICS = ("", "_min", "_max", "_stdev")
COLUMNS = KEY_COLUMNS + tuple(f"{metric}{suffix}" for metric in METRICS for suffix in STATISTICS)

#: The schemas read here (name without version -> the version read).
SCHEMAS = {
    "ckptbench.bench.fs": 1,
    "ckptbench.bench.objects": 1,
    "ckptbench.bench.checkpoint": 1,
    "ckptbench.bench.distributed": 1,
    "ckptbench.compare": 1,
    "ckptbench.preflight": 1,
}


@dataclass(frozen=True)
class Row:
    """One configuration, writer or tier of a result: ``key`` identifies it (:data:`KEY_COLUMNS`), ``runs``
    holds each metric's measured runs (one value where the result kept only its median)."""

    key: dict[str, Any]
    runs: dict[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def configuration(self) -> str:
        return str(self.key["configuration"])

    def columns(self) -> dict[str, Any]:
        """The row under :data:`COLUMNS` (None where a column does not apply)."""
        out: dict[str, Any] = dict.fromkeys(COLUMNS)
        out.update(self.key)
        for metric, samples in self.runs.items():
            out[metric] = statistics.median(samples)
            out[f"{metric}_min"] = min(samples)
            out[f"{metric}_max"] = max(samples)
            out[f"{metric}_stdev"] = statistics.stdev(samples) if len(samples) > 1 else None
        return out


def schema_of(document: dict[str, Any], where: str) -> str:
    """The schema name (without its version) of a result document this module reads, else a one-line
    ``UsageError`` naming ``where``."""
    schema = document.get("schema")
    name, _, version = str(schema).rpartition("/") if isinstance(schema, str) else ("", "", "")
    if name not in SCHEMAS or version != str(SCHEMAS[name]):
        known = ", ".join(f"{n}/{v}" for n, v in SCHEMAS.items())
        raise UsageError(f"{where}: not a ckptbench result this version reads (schema {schema!r}; reads {known})")
    return name


def rows(document: dict[str, Any], source: str = "") -> list[Row]:
    """Every row of a result document; a one-line ``UsageError`` naming ``source`` when its schema is not
    one of :data:`SCHEMAS` or its fields are not what that schema says."""
    name = schema_of(document, source or "the result")
    try:
        found = _READERS[name](document)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        raise UsageError(f"{source or 'the result'}: a {document['schema']} document with a missing or malformed "
                         f"field ({type(exc).__name__}: {exc})") from None
    schema, target = document["schema"], document.get("target")
    return [Row({"schema": schema, "source": source or None, "target": target, **key}, runs) for key, runs in found]


_Found = list[tuple[dict[str, Any], dict[str, tuple[float, ...]]]]


def _samples(values: Iterable[Any] | None) -> tuple[float, ...]:
    """The runs' numbers: finite ones only (JSON's ``1e400`` reads as infinity; no run measures that)."""
    return tuple(float(v) for v in values or ()
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def _phase_runs(phase: dict[str, Any] | None) -> tuple[float, ...]:
    if not phase:
        return ()
    return _samples(phase.get("runs_gbps")) or _samples([phase.get("gbps")])


def _leaders(document: dict[str, Any]) -> set[int]:
    leaders = document.get("leaders")
    if isinstance(leaders, list):
        return set(leaders)
    return {document["best"]} if isinstance(document.get("best"), int) else set()


def _drop_empty(runs: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
    return {metric: samples for metric, samples in runs.items() if samples}


def _sweep(document: dict[str, Any], describe: Any) -> _Found:
    """A sweep's rows: ``describe(config)`` gives a configuration's label and identifying columns."""
    leaders = _leaders(document)
    out: _Found = []
    for i, record in enumerate(document["results"]):
        runs = _drop_empty({"write_gbps": _phase_runs(record["write"]), "read_gbps": _phase_runs(record.get("read"))})
        label, key = describe(record["config"])
        out.append(({"configuration": label, **key, "bytes_per_run": record["write"].get("bytes_per_run"),
                     "runs": len(runs["write_gbps"]), "leader": i in leaders}, runs))
    return out


def _fs(document: dict[str, Any]) -> _Found:
    return _sweep(document, lambda c: (
        f"{c['threads']} thread{'' if c['threads'] == 1 else 's'} x {format_size(c['block_size'])} ({c['schedule']})",
        {"threads": c["threads"], "block_size_bytes": c["block_size"], "schedule": c["schedule"]}))


def _objects(document: dict[str, Any]) -> _Found:
    def describe(c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        part = "1 PUT" if c.get("parts_per_object") == 1 else f"{format_size(c['part_size_bytes'])} parts"
        return (f"{format_size(c['object_size_bytes'])} objects x {c['concurrency']} in flight, {part}",
                {key: c[key] for key in ("object_size_bytes", "concurrency", "part_size_bytes")})

    return _sweep(document, describe)


def _checkpoint(document: dict[str, Any]) -> _Found:
    asyncs = {a["writer"]: a for a in document.get("async") or ()}
    out: _Found = []
    for record in document["results"]:
        writer = record["writer"]
        a = asyncs.get(writer) or {}
        runs = _drop_empty({
            "save_gbps": _phase_runs(record["save"]), "load_gbps": _phase_runs(record.get("load")),
            "stall_s": _samples(a.get("runs_stall_s")), "persist_s": _samples(a.get("runs_persist_s")),
            "interference": _samples(a.get("runs_interference")),
        })
        threads = (record.get("details") or {}).get("threads")
        out.append(({"configuration": writer, "writer": writer, "threads": threads if isinstance(threads, int) else None,
                     "bytes_per_run": record["save"].get("bytes_per_run"), "runs": len(runs.get("save_gbps", ())),
                     "leader": None}, runs))
    return out


def _distributed(document: dict[str, Any]) -> _Found:
    rounds = document["rounds"]
    runs = _drop_empty({
        "save_gbps": _samples(r["gbps"] for r in rounds.get("save") or ()),
        "load_gbps": _samples(r["gbps"] for r in rounds.get("load") or ()),
        "stall_s": _samples(r.get("stall_s") for r in rounds.get("async") or ()),
    })
    ranks = document["launch"]["world_size"]
    first = (rounds.get("save") or [{}])[0]
    return [({"configuration": f"ckptbench, {ranks} ranks", "writer": "ckptbench", "ranks": ranks,
              "bytes_per_run": first.get("total_bytes"), "runs": len(runs.get("save_gbps", ())), "leader": None},
             runs)]


def _compare(document: dict[str, Any]) -> _Found:
    out: _Found = []
    for tier in document["tiers"]:
        bench = tier.get("bench")
        found = _checkpoint(bench) if isinstance(bench, dict) and bench.get("results") else []
        key, runs = next(((k, r) for k, r in found if k["writer"] == "ckptbench"), ({}, {}))
        measured = tier.get("measured") or {}
        for metric, field_name in (("save_gbps", "save_gbps"), ("load_gbps", "load_gbps"),
                                   ("stall_s", "stall_s"), ("persist_s", "persist_s"),
                                   ("interference", "interference")):
            if metric not in runs and isinstance(measured.get(field_name), (int, float)):
                runs[metric] = (float(measured[field_name]),)
        named = tier.get("tier")  # a tier file's settings, or None for a plain path or URL
        name = named.get("name") if isinstance(named, dict) else named
        out.append(({"configuration": tier["label"], "writer": "ckptbench", "tier": name or tier["label"],
                     "threads": key.get("threads"), "bytes_per_run": measured.get("workload_bytes"),
                     "runs": len(runs.get("save_gbps", ())), "leader": None}, runs))
    return out


def _preflight(document: dict[str, Any]) -> _Found:
    m = document["measurements"]
    bench = m.get("checkpoint_bench")
    found = _checkpoint(bench) if isinstance(bench, dict) and bench.get("results") else []
    key, runs = next(((k, r) for k, r in found if k["writer"] == "ckptbench"), ({}, {}))
    for metric, field_name, scale in (("save_gbps", "write_bps", 1e-9), ("load_gbps", "read_bps", 1e-9),
                                      ("stall_s", "async_stall_s", 1.0), ("persist_s", "async_persist_s", 1.0),
                                      ("interference", "interference", 1.0)):
        if metric not in runs and isinstance(m.get(field_name), (int, float)):
            runs[metric] = (float(m[field_name]) * scale,)
    return [({"configuration": "ckptbench (preflight sample)", "writer": "ckptbench", "threads": m.get("threads"),
              "bytes_per_run": m.get("measured_bytes"), "runs": len(runs.get("save_gbps", ())), "leader": None},
             runs)]


_READERS = {
    "ckptbench.bench.fs": _fs,
    "ckptbench.bench.objects": _objects,
    "ckptbench.bench.checkpoint": _checkpoint,
    "ckptbench.bench.distributed": _distributed,
    "ckptbench.compare": _compare,
    "ckptbench.preflight": _preflight,
}


def labelled(found: Sequence[Row]) -> dict[str, Row]:
    """Rows by configuration (the key ``compare-results`` matches on)."""
    return {row.configuration: row for row in found}
