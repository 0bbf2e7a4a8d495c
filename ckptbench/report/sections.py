"""From result documents to a :class:`~ckptbench.report.document.Report`: one section renderer per schema.

A result document is a JSON object with a ``schema`` string ``NAME/VERSION`` (``ckptbench.bench.fs/1``).
:data:`SECTIONS` maps each schema this ckptbench understands to a *renderer*, a function
``document -> Section`` (title, prose lines, tables as formatted rows, figures as PNG bytes). A file of
any other schema is refused, naming the file and the schema, before anything is written: an unknown
name, or a known name at a version this code was not written for (fields may have changed meaning).

Every document also gets, whatever its schema, from the shared parts below (a renderer must not
repeat them): the environment summary (``environment``), the command (``argv``), the warnings with
their remedies (``warnings``), a ``verdict`` string (PASS/FAIL), a checks table from ``checks`` (a list
of ``{name, status, value, threshold, ...}``) and, from ``model``, its scalar values and the
waste-versus-interval curve of ``model.curve`` (a list of ``{interval_s, waste_fraction}``, with every
numeric ``model.*interval_s`` drawn as a marker).

Adding a schema (``ckptbench.preflight/1``, ``ckptbench.compare/1``...) is one function here::

    @section("ckptbench.preflight/1")
    def preflight(document: dict[str, Any]) -> Section:
        return Section(title=f"Pre-flight: {document['target']}", tables=(...,))

A new version of a schema gets its own function (or the same one registered twice, if every field
it reads kept its meaning). A renderer raises ``KeyError``/``TypeError``/``ValueError`` on a document
it cannot read; that becomes one line naming the file.
"""

from __future__ import annotations

import datetime as dt
import shlex
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ckptbench import __version__
from ckptbench.bench.records import read_result as read_result  # the reader of every command's result files
from ckptbench.errors import UsageError, reading_document
from ckptbench.report.document import (
    DocumentReport,
    Figure,
    Headline,
    Report,
    Section,
    Table,
    format_ranged,
    format_value,
)
from ckptbench.units import format_duration, format_size, percentiles_text, range_text, runs_text

Renderer = Callable[[dict[str, Any]], Section]

#: schema ("NAME/VERSION") -> the function that renders a document of it.
SECTIONS: dict[str, Renderer] = {}


def section(schema: str) -> Callable[[Renderer], Renderer]:
    """Register the decorated function as the renderer of ``schema`` documents."""
    name, slash, version = schema.rpartition("/")
    if not slash or not name or not version:
        raise ValueError(f"schema {schema!r} must be NAME/VERSION")

    def register(renderer: Renderer) -> Renderer:
        SECTIONS[schema] = renderer
        return renderer

    return register


# -- reading -----------------------------------------------------------------------------------------


def renderer_for(source: str, document: dict[str, Any]) -> Renderer:
    """The renderer of ``document``'s schema, or a one-line ``UsageError`` naming ``source`` and the schema."""
    schema = document.get("schema")
    if not isinstance(schema, str):
        raise UsageError(f"{source}: not a ckptbench result (no 'schema' string)",
                         hint=f"reports are made from {', '.join(sorted(SECTIONS))}")
    if schema in SECTIONS:
        return SECTIONS[schema]
    name = schema.rpartition("/")[0]
    versions = sorted(s for s in SECTIONS if s.rpartition("/")[0] == name)
    if versions:
        raise UsageError(f"{source}: schema {schema!r} is a version ckptbench {__version__} cannot read "
                         f"(it reads {', '.join(versions)})", hint="report it with the ckptbench that wrote it")
    raise UsageError(f"{source}: unknown schema {schema!r}", hint=f"reports are made from {', '.join(sorted(SECTIONS))}")


# -- assembling ---------------------------------------------------------------------------------------


def build_report(results: Sequence[tuple[str, dict[str, Any]]], *, title: str, created: str | None = None) -> Report:
    """Render every ``(source, document)`` (all figures drawn, in memory) and the comparison across them."""
    documents = tuple(render_document(source, document) for source, document in results)
    return Report(title=title, created=created or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                  tool_version=__version__, overview=tier_comparison(results, documents), documents=documents)


def render_document(source: str, document: dict[str, Any]) -> DocumentReport:
    renderer = renderer_for(source, document)
    schema = document["schema"]
    with reading_document(source, schema):
        sections = [renderer(document)]
        checks = checks_section(document)
        model = model_section(document)
        env = document.get("environment") or {}
        environment = environment_summary(env)
        warnings = tuple(_warning(w) for w in document.get("warnings") or ())
    argv = document.get("argv")
    verdict = document.get("verdict")
    return DocumentReport(
        source=source, schema=schema, title=sections[0].title, target=str(document.get("target", "")),
        created=str(document.get("created", "")),
        command=shlex.join(str(a) for a in argv) if isinstance(argv, list) and argv else None,
        environment=environment, verdict=verdict if isinstance(verdict, str) else None,
        sections=tuple(sections + [s for s in (checks, model) if s is not None]), warnings=warnings,
        where=storage_summary(env.get("target") or {}, short=True),
    )


def _warning(w: Any) -> tuple[str, str]:
    if isinstance(w, dict):
        return str(w.get("message", w)), str(w.get("remedy") or "")
    return str(w), ""


def environment_summary(env: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """Host, CPU, memory, kernel, storage and tool, as (label, text) pairs, for what the document has."""
    out: list[tuple[str, str]] = []
    if env.get("host"):
        out.append(("host", str(env["host"])))
    cpu = [str(env["cpu_model"])] if env.get("cpu_model") else []
    if env.get("cpu_count"):
        cpu.append(f"{env['cpu_count']} CPUs")
    if cpu:
        out.append(("CPU", ", ".join(cpu)))
    if env.get("memory_bytes"):
        out.append(("memory", format_size(env["memory_bytes"])))
    if env.get("kernel"):
        out.append(("kernel", str(env["kernel"]) + (f" (Python {env['python']})" if env.get("python") else "")))
    storage = storage_summary(env.get("target") or {})
    if storage:
        out.append(("storage", storage))
    if env.get("tool_version"):
        sha = f" (git {str(env['git_sha'])[:10]})" if env.get("git_sha") else ""
        out.append(("measured with", f"ckptbench {env['tool_version']}{sha}"))
    return tuple(out)


def storage_summary(target: dict[str, Any], *, short: bool = False) -> str:
    """``ext4 at /var/tmp (/dev/vda mounted on /; ...)`` or ``s3 endpoint http://...``; short: the first part."""
    if not target:
        return ""
    if target.get("endpoint") or target.get("url"):
        endpoint = target.get("endpoint") or "the default endpoint"
        text = f"{target.get('filesystem') or 'object store'} at {endpoint}"
        if short:
            return text
        if target.get("endpoint_source"):
            text += f" (from {target['endpoint_source']})"
        if target.get("credential_source"):
            text += f"; credentials from {target['credential_source']}"
        if target.get("client"):
            text += f"; client {target['client']}"
        return text
    text = f"{target.get('filesystem') or 'unknown filesystem'}"
    if target.get("mount_device"):
        text += f" on {target['mount_device']}"
    if short:
        return text
    details = []
    device = target.get("device") or {}
    if device:
        what = device.get("model") or (f"vendor {device['vendor']}" if device.get("vendor") else None)
        kind = {1: "rotational", 0: "non-rotational"}.get(device.get("rotational"))
        scheduler = str(device.get("scheduler") or "")
        if "[" in scheduler:
            scheduler = scheduler.split("[", 1)[1].split("]", 1)[0]
        details.append(", ".join(x for x in (device.get("name"), what, kind,
                                             f"scheduler {scheduler}" if scheduler else None) if x))
    if target.get("mount_point"):
        details.append(f"mounted on {target['mount_point']}")
    if target.get("free_bytes") is not None and target.get("total_bytes"):
        details.append(f"{format_size(target['free_bytes'])} free of {format_size(target['total_bytes'])}")
    path = f" at {target['path']}" if target.get("path") else ""
    return text + path + (f" ({'; '.join(details)})" if details else "")


def checks_section(document: dict[str, Any]) -> Section | None:
    """A table of ``checks`` ({name, status, value, threshold, ...}); other keys become columns too."""
    checks = document.get("checks")
    if not isinstance(checks, list) or not checks:
        return None
    columns = ["name", "status", "value", "threshold"]
    for check in checks:
        columns += [k for k in check if k not in columns]
    if all(str(check.get("unit", "_")).startswith("_") for check in checks) and "unit" in columns:
        columns.remove("unit")  # a suffix unit is already in the formatted value and threshold
    rows = tuple(tuple(_check_cell(check, k) for k in columns) for check in checks)
    failed = frozenset(i for i, check in enumerate(checks) if str(check.get("status", "")).upper() in ("FAIL", "FAILED"))
    verdict = document.get("verdict")
    lines = (f"verdict: {verdict}",) if isinstance(verdict, str) else ()
    return Section(title="Checks", lines=lines, tables=(Table("checks", tuple(columns), rows, failed=failed),))


def _check_cell(check: dict[str, Any], key: str) -> str:
    """One cell of the checks table; ``value_range`` as "low–high" in the value's unit."""
    span = check.get(key)
    if key == "value_range" and isinstance(span, (list, tuple)) and len(span) == 2:
        low, high = (format_value(_unit_key(check, "value"), v) for v in span)
        return low if low == high else f"{low}–{high}"
    return format_value(_unit_key(check, key), span)


def _unit_key(check: dict[str, Any], key: str) -> str:
    """``value``/``threshold`` take the unit of the check's ``unit`` key (``_s``, ``_gbps``...) when it gives one."""
    unit = check.get("unit")
    if key in ("value", "threshold") and isinstance(unit, str) and unit.startswith("_"):
        return key + unit
    return key


def model_section(document: dict[str, Any]) -> Section | None:
    """``model``'s scalar values as a table and, from ``model.curve``, waste versus interval."""
    model = document.get("model")
    if not isinstance(model, dict):
        return None
    scalars = [(k, v) for k, v in model.items() if not isinstance(v, (list, dict))]
    tables = (Table("model", ("quantity", "value"), tuple((_label(k), format_value(k, v)) for k, v in scalars)),) \
        if scalars else ()
    figures: tuple[Figure, ...] = ()
    curve = model.get("curve")
    if isinstance(curve, list) and curve:
        from ckptbench.report.report_plots import plot_waste_points

        marks = {_label(k): float(v) for k, v in model.items()
                 if k.endswith("interval_s") and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}
        figures = (Figure("waste (share of wall time) versus checkpoint interval",
                          _png(lambda p: plot_waste_points(document, curve, marks, p))),)
    if not tables and not figures:
        return None
    return Section(title="Checkpoint interval model", tables=tables, figures=figures)


def tier_comparison(results: Sequence[tuple[str, dict[str, Any]]],
                    documents: Sequence[DocumentReport]) -> Section | None:
    """Like with like, one row per tier or configuration, across the result files (``bench.rows``).

    Checkpoint saves and loads (a shoot-out's ckptbench writer, every tier of a compare file, a preflight's
    sample, a distributed run) share one table; filesystem and object sweeps (each file's best configuration)
    another, as raw I/O is not a checkpoint. Of several files about the same place, the newest is shown."""
    from ckptbench.bench.rows import rows

    where = {d.source: d.where for d in documents}
    # (table, place, configuration) -> (created, source, (configuration, storage, row))
    newest: dict[tuple[str, str, str], tuple[str, str, Any]] = {}
    for source, document in results:
        try:
            found = rows(document, source)
        except UsageError:  # its own section shows what it has; the overview needs its measured runs
            continue
        sweep = document["schema"].rpartition("/")[0] in ("ckptbench.bench.fs", "ckptbench.bench.objects")
        if sweep:
            leaders = [r for r in found if r.key.get("leader")] or found
            picked = [max(leaders, key=lambda r: statistics.median(r.runs.get("write_gbps", (0.0,))))]
        else:
            picked = [r for r in found if r.key.get("writer") == "ckptbench"]
        tiers = {t.get("label"): t for t in document.get("tiers") or ()}  # a compare file's
        for row in picked:
            tier = tiers.get(row.configuration)
            place = str(row.key["tier"] if tier else row.key["target"])
            configuration = "ckptbench (compare tier)" if tier else row.configuration
            key = ("sweep" if sweep else "checkpoint", place, configuration)
            created = str(document.get("created", ""))
            if key not in newest or created >= newest[key][0]:
                storage = (tier.get("filesystem") or tier.get("kind")) if tier else where.get(source)
                newest[key] = (created, source, (configuration, storage or "-", row))
    if len(newest) < 2:
        return None
    left_out = len(results) - len({source for _, source, _ in newest.values()})
    tables, bars = [], []
    for table, title, metrics, note in (
            ("checkpoint", "checkpoint save and load, one row per tier (ckptbench writer)", ("save_gbps", "load_gbps"),
             "durable saves and cold loads of a model-shaped state_dict: shoot-outs, compare tiers, preflight samples "
             "and distributed runs (all ranks' bytes / the slowest rank's time)"),
            ("sweep", "raw I/O, each sweep's best configuration", ("write_gbps", "read_gbps"),
             "filesystem and object sweeps: the configuration with the highest median write")):
        chosen = sorted(((place, source, shown) for (kind, place, _), (_, source, shown) in newest.items()
                         if kind == table),
                        key=lambda item: -statistics.median(item[2][2].runs.get(metrics[0], (0.0,))))
        if not chosen:
            continue
        body = []
        for place, source, (configuration, storage, row) in chosen:
            cells = [place, storage, configuration]
            for metric in metrics:
                samples = row.runs.get(metric)
                cells += ["-", "-"] if not samples else [
                    f"{statistics.median(samples):.2f}",
                    range_text({"n": len(samples), "min": min(samples), "max": max(samples)})]
            cells += [_plural(len(row.runs.get(metrics[0], ())), "run"), source]
            body.append(tuple(cells))
            bars.append((f"{place}, {configuration}", *(
                statistics.median(row.runs[m]) if m in row.runs else None for m in metrics)))
        first, second = (m.removesuffix("_gbps") for m in metrics)
        tables.append(Table(title, ("place", "storage", "configuration", f"{first} GB/s", "min–max",
                                    f"{second} GB/s", "min–max", "runs", "file"), tuple(body),
                            highlight=frozenset({0}) if len(body) > 1 else frozenset(), note=note))
    from ckptbench.report.report_plots import plot_tiers

    footer = f"ckptbench {__version__} report"
    figure = Figure("median GB/s of every row above (checkpoint save/load, then raw write/read)",
                    _png(lambda p: plot_tiers(bars, footer, p)))
    lines = (f"{_plural(left_out, 'older result file')} about the same place left out of this overview "
             "(each has its own section below)",) if left_out else ()
    return Section(title="Tier comparison", lines=lines, tables=tuple(tables), figures=(figure,))


def _label(key: str) -> str:
    """``optimal_interval_s`` -> ``optimal interval`` (the unit shows in the formatted value)."""
    for suffix in ("_s", "_bytes", "_gbps", "_fraction"):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key.removesuffix(suffix)
            break
    return key.replace("_", " ")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _png(draw: Callable[[Path], Any]) -> bytes:
    """The bytes of the PNG that ``draw(path)`` writes (the plot functions write files)."""
    with tempfile.TemporaryDirectory(prefix="ckptbench-report-") as tmp:
        path = Path(tmp) / "figure.png"
        draw(path)
        return path.read_bytes()


def _summary(s: dict[str, Any]) -> str:
    return range_text(s)


def _rate_cells(phase: dict[str, Any] | None, scale: float = 1.0, digits: int = 2) -> list[str]:
    """median (cached flagged), min–max, p10/p90, p99 latency of one direction of a sweep record."""
    if phase is None:
        return ["-"] * 4
    s = phase["summary_gbps"]
    lat = phase.get("latency_ms") or {}
    return [f"{phase['gbps'] * scale:.{digits}f}" + (" (cached!)" if phase.get("cached") else ""),
            range_text(s, scale, digits), percentiles_text(s, scale, digits),
            f"{lat['p99']:.1f}" if "p99" in lat else "-"]


# -- the bench schemas ------------------------------------------------------------------------------------


def _steady_lines(result: dict[str, Any]) -> list[str]:
    """The burst/sustained lines of a sweep result's write and read (``report.timeseries_plot.steady_text``)."""
    from ckptbench.report.timeseries_plot import steady_text

    texts = [steady_text(op, (result.get(op) or {}).get("steady_state")) for op in ("write", "read")]
    return [t for t in texts if t]


def _writer_series_figures(document: dict[str, Any], result: dict[str, Any] | None) -> list[Figure]:
    """The ckptbench writer's save and load over time and their latency histograms, when recorded."""
    from ckptbench.report.timeseries_plot import has_series, plot_series

    phases = {"save": result.get("save"), "load": result.get("load")} if result else {}
    if not has_series(phases):
        return []
    return [Figure("ckptbench writer: bandwidth over time (median run) and per-block latency histogram",
                   _png(lambda p: plot_series(document, phases, "ckptbench writer over time", p)))]


def _distributed_series_figures(document: dict[str, Any]) -> list[Figure]:
    """All ranks' save and load bandwidth over time (summed) and their latency histogram, when recorded."""
    from ckptbench.report.timeseries_plot import has_series, plot_series

    summary = document.get("summary") or {}
    phases = {op: summary.get(op) for op in ("save", "load")}
    if not has_series(phases):
        return []
    return [Figure("all ranks together: bandwidth over time (median round) and per-block latency histogram",
                   _png(lambda p: plot_series(document, phases, "all ranks over time", p)))]


def _series_figures(document: dict[str, Any]) -> list[Figure]:
    """The best configuration's bandwidth over time and latency histogram, when the document has them."""
    from ckptbench.report.timeseries_plot import best_phases, has_series, plot_series

    phases = best_phases(document)
    if not has_series(phases):
        return []
    return [Figure("best configuration: bandwidth over time (median run) and per-operation latency histogram",
                   _png(lambda p: plot_series(document, phases, "best configuration over time", p)))]


@section("ckptbench.bench.fs/1")
def fs_sweep(document: dict[str, Any]) -> Section:
    """``ckptbench bench DIR``: threads x block size (x schedule), durable writes and cold reads."""
    from ckptbench.report.report_plots import fs_heat_panels, heat_cells, plot_heatmaps
    from ckptbench.report.sweep_plot import plot_fs_sweep

    spec, results, best = document["spec"], document["results"], document["best"]
    config = results[0]["config"]
    mode = ("O_DIRECT" if config["direct"] else "buffered") + (f" + {config['sync']}" if config["fsync"] else "")
    if config.get("direct_requested") and not config["direct"]:
        mode += f" (O_DIRECT unavailable: {config.get('direct_fallback_reason')})"
    lines = [f"{format_size(spec['size_bytes'])} in {spec['files']} files per run · {mode} · "
             f"{runs_text(spec['repeat'], spec['warmup'])} per configuration · "
             f"memcpy {document['memcpy_gbps']:.1f} GB/s · data verified: {'yes' if document.get('data_verified') else 'NO'}"]
    schedules = len({r["config"]["schedule"] for r in results}) > 1
    reads = results[0]["read"] is not None
    columns = ["threads", "block", *(["schedule"] if schedules else []),
               "write GB/s", "min–max", "p10/p90", "p99 op ms"]
    if reads:
        columns += ["read GB/s", "min–max", "p10/p90", "p99 op ms"]
    rows = []
    for r in results:
        c = r["config"]
        rows.append((str(c["threads"]), format_size(c["block_size"]), *([c["schedule"]] if schedules else []),
                     *_rate_cells(r["write"]), *(_rate_cells(r["read"]) if reads else [])))
    b = results[best]
    read_text = f", read {b['read']['gbps']:.2f} GB/s" if b["read"] else ""
    lines.append(f"best (highest median write): {_plural(b['config']['threads'], 'thread')} x "
                 f"{format_size(b['config']['block_size'])} blocks, {b['config']['schedule']}: "
                 f"write {b['write']['gbps']:.2f} GB/s{read_text}")
    lines += _steady_lines(b)
    tables = [Table("sweep (median of the runs, GB/s = 1e9 B/s)", tuple(columns), tuple(rows),
                    highlight=frozenset({best}) if len(results) > 1 else frozenset())]
    if document.get("metadata"):
        tables.append(Table("small files: create + write + fsync", (
            "threads", "files", "file size", "sync", "files/s", "min–max", "p50 ms", "p99 ms"), tuple(
            (str(m["threads"]), str(m["files"]), format_size(m["file_size_bytes"]), m["sync"], f"{m['ops_per_s']:.0f}",
             range_text(m['summary_ops_per_s'], digits=0),
             f"{m['latency_ms']['p50']:.2f}", f"{m['latency_ms']['p99']:.2f}") for m in document["metadata"])))
    figures = [Figure("write and read GB/s per configuration (median, min–max whiskers; best in bold)",
                      _png(lambda p: plot_fs_sweep(document, p)))]
    panels = fs_heat_panels(document)
    heat_title = (f"{document['target']} ({(document['environment'].get('target') or {}).get('filesystem')}): "
                  f"{format_size(spec['size_bytes'])} in {spec['files']} files, {mode}")
    if heat_cells(panels) > 1:
        figures.append(Figure("heat map: threads x block size, median GB/s (best write outlined)",
                              _png(lambda p: plot_heatmaps(document, panels, heat_title, p))))
    figures += _series_figures(document)
    headline = Headline("filesystem sweep", f"{b['config']['threads']} thr x {format_size(b['config']['block_size'])}",
                        b["write"]["gbps"], b["read"]["gbps"] if b["read"] else None)
    return Section(title=f"Filesystem sweep: {document['target']}", lines=tuple(lines), tables=tuple(tables),
                   figures=tuple(figures), headline=headline)


@section("ckptbench.bench.objects/1")
def object_sweep(document: dict[str, Any]) -> Section:
    """``ckptbench bench s3://...``: object size x requests in flight x part size, uploads and ranged GETs."""
    from ckptbench.report.report_plots import heat_cells, object_heat_panels, plot_heatmaps
    from ckptbench.report.sweep_plot import plot_object_sweep

    spec, results, best = document["spec"], document["results"], document["best"]
    lines = [f"{format_size(spec['size_bytes'])} per run · {runs_text(spec['repeat'], spec['warmup'])} per "
             f"configuration · uploads complete (durable), ranged parallel GETs · "
             f"data verified: {'yes' if document.get('data_verified') else 'NO'}"]
    reads = results[0]["read"] is not None
    columns = ["object", "objects", "in flight", "part", "write MB/s", "min–max", "p10/p90", "p99 req ms"]
    if reads:
        columns += ["read MB/s", "min–max", "p10/p90", "p99 req ms"]
    rows = []
    for r in results:
        c = r["config"]
        part = "1 PUT" if c["parts_per_object"] == 1 else format_size(c["part_size_bytes"])
        rows.append((format_size(c["object_size_bytes"]), str(c["objects"]), str(c["concurrency"]), part,
                     *_rate_cells(r["write"], 1e3, 0), *(_rate_cells(r["read"], 1e3, 0) if reads else [])))
    b = results[best]
    c = b["config"]
    label = (f"{format_size(c['object_size_bytes'])} objects x {c['concurrency']} in flight, "
             + ("1 PUT" if c["parts_per_object"] == 1 else f"{format_size(c['part_size_bytes'])} parts"))
    read_text = f", read {b['read']['gbps'] * 1e3:.0f} MB/s" if b["read"] else ""
    lines.append(f"best (highest median write): {label}: write {b['write']['gbps'] * 1e3:.0f} MB/s{read_text}")
    lines += _steady_lines(b)
    tables = (Table("sweep (median of the runs, MB/s = 1e6 B/s)", tuple(columns), tuple(rows),
                    highlight=frozenset({best}) if len(results) > 1 else frozenset()),)
    figures = [Figure("write and read GB/s per configuration (median, min–max whiskers; best in bold)",
                      _png(lambda p: plot_object_sweep(document, p)))]
    panels = object_heat_panels(document)
    endpoint = (document["environment"].get("target") or {}).get("endpoint")
    heat_title = (f"{document['target']}" + (f" at {endpoint}" if endpoint else "")
                  + f", {format_size(spec['size_bytes'])} per run")
    if heat_cells(panels) > 1:
        figures.append(Figure("heat map: requests in flight x object size, median GB/s (best write outlined)",
                              _png(lambda p: plot_heatmaps(document, panels, heat_title, p))))
    figures += _series_figures(document)
    headline = Headline("object sweep", f"{format_size(c['object_size_bytes'])} x{c['concurrency']}",
                        b["write"]["gbps"], b["read"]["gbps"] if b["read"] else None)
    return Section(title=f"Object-storage sweep: {document['target']}", lines=tuple(lines), tables=tables,
                   figures=tuple(figures), headline=headline)


@section("ckptbench.bench.checkpoint/1")
def checkpoint_shootout(document: dict[str, Any]) -> Section:
    """``ckptbench bench --workload checkpoint``: writers saving (durable) and loading (cold) one state_dict."""
    from ckptbench.report.shootout_plot import plot_shootout

    spec, workload, results = document["spec"], document["workload"], document["results"]
    shape = workload["shape"]
    by_dtype = ", ".join(f"{d} {n / workload['total_bytes']:.0%}" for d, n in workload["bytes_by_dtype"].items() if n)
    lines = [f"{workload['model']} x{workload['scale']:.3g}: {shape['layers']} blocks, hidden {shape['hidden']}, "
             f"{format_size(workload['total_bytes'])} in {workload['tensors']} tensors ({by_dtype}) · "
             f"state_dict on {spec.get('device', 'cpu')} · "
             f"{runs_text(spec['repeat'], spec['warmup'])}, writers alternating · "
             f"memcpy {document['memcpy_gbps']:.1f} GB/s",
             f"cold loads: {document['cache_drop'].get('how') or document['cache_drop']['method']} · "
             f"data verified: {'yes' if document.get('data_verified') else 'NO'}"]
    verified = {True: "yes", False: "NO", None: "n/a"}
    ours = next((i for i, r in enumerate(results) if r["writer"] == "ckptbench"), None)
    tables = [Table("durable save, cold load (median of the runs, GB/s of state_dict bytes)", (
        "writer", "save GB/s", "min–max", "load GB/s", "min–max", "files", "on disk", "verified"), tuple(
        (r["writer"], f"{r['save']['gbps']:.2f}" + (" (cached!)" if r["save"].get("cached") else ""),
         _summary(r["save"]["summary_gbps"]),
         f"{r['load']['gbps']:.2f}" + (" (cached!)" if r["load"].get("cached") else ""),
         _summary(r["load"]["summary_gbps"]), str(r["files"]), format_size(r["disk_bytes"]),
         verified[r["verified"]]) for r in results),
        highlight=frozenset({ours}) if ours is not None and len(results) > 1 else frozenset())]
    if document.get("async"):
        tables.append(Table("async saves (medians)", ("writer", "stall", "persist", "total", "interference"), tuple(
            (a["writer"], format_duration(a["stall_s"]), format_duration(a["persist_s"]),
             format_duration(a["total_s"]), "-" if a["interference"] is None else f"{a['interference']:+.0%}")
            for a in document["async"]),
            note=_probe_note(document.get("probe"))))
    memory = document.get("memory")
    if memory:
        tables.append(Table(f"memory ({memory['method']})", ("quantity", "value"), (
            ("checkpoint", format_size(memory["checkpoint_bytes"])),
            ("peak extra RSS, first save (arena included)",
             f"{format_size(memory['first_peak_extra_bytes'])} "
             f"({memory['first_peak_extra_bytes'] / memory['checkpoint_bytes']:.2f}x the checkpoint)"),
            ("peak extra RSS, later saves", format_size(memory["steady_peak_extra_bytes"])),
            (f"RSS growth over {memory['saves']} saves", format_size(memory["growth_bytes"])))))
    if document.get("goals"):  # the project's own targets stay in the JSON; readers get the ratios, as facts
        tables.append(Table("ratios", ("ratio", "value"), tuple(
            (g["description"], f"{g['value']:.2f}") for g in document["goals"])))
    tables.append(Table("how each writer saves and loads", ("writer", "durable", "load"),
                        tuple((r["writer"], r["durable"], r["load_how"]) for r in results)))
    figures = (Figure("save and load GB/s per writer (median, min–max whiskers); async stall and persist",
                      _png(lambda p: plot_shootout(document, p))),
               *_writer_series_figures(document, results[ours] if ours is not None else None))
    head = results[ours] if ours is not None else max(results, key=lambda r: r["save"]["gbps"])
    headline = Headline("checkpoint save/load", f"{head['writer']} writer, {format_size(workload['total_bytes'])}",
                        head["save"]["gbps"], head["load"]["gbps"])
    return Section(title=f"Checkpoint writers: {document['target']}", lines=tuple(lines), tables=tuple(tables),
                   figures=figures, headline=headline)


def _probe_note(probe: dict[str, Any] | None) -> str:
    if not probe:
        return ""
    matrix = "x".join(str(n) for n in probe.get("matrix", ()))
    return (f"interference: slowdown of a {probe.get('kind')} {matrix} loop ({probe.get('torch_threads')} threads) "
            "while persisting, against the same loop alone")


@section("ckptbench.preflight/1")
def preflight(document: dict[str, Any]) -> Section:
    """``ckptbench preflight``: the job, what the writer measured, the predictions and the recommendation
    (the checks table and the waste curve come from the shared parts)."""
    job, p, m = document["job"], document["predictions"], document["measurements"]
    ck = job["checkpoint"]
    lines = (
        f"job: {job['model']} on {job['ranks']} ranks ({job['nodes']} nodes), {ck['recipe']['description']}, "
        f"{ck['parallelism']['sharding']} sharding; MTBF {format_duration(job['failures']['mtbf_s'])} "
        f"({job['failures']['source']})",
        f"measured: {format_size(m['measured_bytes'])} saved at {m['write_bps'] / 1e9:.2f} GB/s (durable), loaded at "
        f"{m['read_bps'] / 1e9:.2f} GB/s (cold); async stall {format_duration(m['async_stall_s'])}, persist "
        f"{format_duration(m['async_persist_s'])}",
        *(f"assumption: {a}" for a in document.get("assumptions", [])),
    )
    keys = ("checkpoint_total_bytes", "checkpoint_per_rank_bytes", "checkpoint_per_node_bytes", "sync_checkpoint_s",
            "async_stall_s", "async_persist_s", "restore_s", "blocking_s", "interval_s", "optimal_interval_s",
            "overhead_fraction", "waste_fraction", "goodput", "wasted_gpu_hours_per_day", "wasted_usd_per_day")
    predicted = Table("predicted for the job: point (range)", ("quantity", "value"),
                      tuple((_label(k), format_ranged(k, p[k], p.get(f"{k}_range"))) for k in keys if k in p))
    advice = Table("recommendation", ("setting", "value", "why"),
                   tuple((a["setting"], format_value(a["setting"], a["value"]), a["reason"])
                         for a in document["recommendation"]))
    headline = Headline("preflight (checkpoint writer)", job["model"], m["write_bps"] / 1e9, m["read_bps"] / 1e9)
    lines, figures = (*lines, *_sustained_lines(m.get("sustained"))), _sustained_figures(document)
    return Section(title=f"Pre-flight: {document['target']}", lines=lines, tables=(predicted, advice),
                   figures=figures, headline=headline)


def _sustained_lines(sustained: dict[str, Any] | None) -> tuple[str, ...]:
    """What preflight's write past the write-back cache found, and whether the prediction used it."""
    from ckptbench.report.timeseries_plot import steady_text

    if not sustained:
        return ()
    text = steady_text(f"sustained write of {format_size(sustained['bytes'])}", sustained["steady_state"], "")
    used = (f"; the node's bytes past the burst are predicted at the sustained rate (save x{sustained['slowdown']:.2f})"
            if sustained["used"] else "")
    return (f"{text}{used}",) if text else ()


def _sustained_figures(document: dict[str, Any]) -> tuple[Figure, ...]:
    """The sustained write's bandwidth over time, when preflight made one."""
    from ckptbench.report.timeseries_plot import plot_series

    sustained = document["measurements"].get("sustained")
    if not sustained:
        return ()
    timeline = sustained["timeline"]
    phases = {"write": {"timeline": {"interval_s": timeline["interval_s"],
                                     "runs": [{**timeline, "steady_state": sustained["steady_state"]}]}}}
    return (Figure("the write past the write-back cache: bandwidth over time",
                   _png(lambda p: plot_series(document, phases, "sustained write", p))),)


@section("ckptbench.compare/1")
def compare(document: dict[str, Any]) -> Section:
    """``ckptbench compare``: the writer workload and the model's numbers per tier, side by side."""
    from ckptbench.report.compare_plot import plot_compare

    tiers = document["tiers"]
    rows_spec = (("save GB/s (durable)", "measured", "save_gbps"), ("load GB/s (cold)", "measured", "load_gbps"),
                 ("async stall, measured", "measured", "stall_s"), ("checkpoint time (sync), job", "model",
                                                                     "checkpoint_s"),
                 ("stall per checkpoint, job", "model", "stall_s"), ("restore, job", "model", "restore_s"),
                 ("optimal interval, job", "model", "optimal_interval_s"),
                 ("waste at optimum, job", "model", "waste_fraction"))
    columns = ("quantity", *(f"{t['label']} ({t['filesystem']})" for t in tiers))
    rows = tuple((label, *(format_ranged(key, (t.get(part) or {}).get(key),
                                         (t.get(f"{part}_range") or {}).get(key) if part == "model" else None)
                           for t in tiers))
                 for label, part, key in rows_spec)
    lines = tuple(f"assumption: {a}" for a in document.get("assumptions", []))
    figures = (Figure("tiers side by side", _png(lambda p: plot_compare(document, p))),)
    return Section(title=f"Tier comparison: {', '.join(t['label'] for t in tiers)}", lines=lines,
                   tables=(Table("per tier: point (range)", columns, rows),), figures=figures)


def _mlperf_lines(document: dict[str, Any]) -> tuple[str, ...]:
    """``bench --mlperf``: what ran and its figures in MLPerf's "GB/s" (GiB/s) and in GB/s."""
    m = document.get("mlperf")
    if not m:
        return ()
    p = m["procedure"]
    return (f"MLPerf Storage v2.0 checkpointing, {m['workload']['name']}: {m['what_ran']}; "
            f"{p['num_checkpoints_write']} writes, the page cache dropped once, {p['num_checkpoints_read']} reads"
            + ("" if m["comparable"] else f"; scaled to {m['scale']:g} (not comparable with a submission)"),
            *(f"MLPerf {op}: {m[op]['gib_per_s']:.2f} GB/s (GiB/s) = {m[op]['gbps']:.2f} GB/s (1e9 B/s), mean of "
              f"{len(m[op]['runs_duration_s'])} checkpoints, each the slowest rank's" for op in ("write", "read")))


@section("ckptbench.bench.distributed/1")
def distributed(document: dict[str, Any]) -> Section:
    """``ckptbench bench`` under torchrun/srun: aggregate per operation, every rank in the median save round."""
    from ckptbench.report.distributed_plot import median_round, plot_distributed, timeline_ranks

    workload, par, launch = document["workload"], document["spec"]["parallelism"], document["launch"]
    rank_bytes = document["rank_bytes"]
    lines = (f"{launch['world_size']} ranks on {len(set(document['hosts']))} host(s): {workload['model']} "
             f"x{workload['scale']:.3g}, {format_size(workload['total_bytes'])} in all, split dp {par['dp']} x "
             f"tp {par['tp']} x pp {par['pp']} ({par['sharding']}); per rank {format_size(min(rank_bytes))}–"
             f"{format_size(max(rank_bytes))}",
             f"aggregation: {document['aggregation']}",
             f"cold loads: {document['cache_drop'].get('how') or document['cache_drop']['method']} · "
             f"data verified: {'yes' if document.get('data_verified') else 'NO'}", *_mlperf_lines(document))
    names = {"save": "durable save", "load": "cold load", "async": "async save (stall + persist)"}
    summary = document["summary"]
    aggregate = Table("aggregate per operation (median of the rounds)",
                      ("operation", "GB/s", "min–max", "slowest rank's time", "rank spread", "overhead", "async stall"),
                      tuple((names[op], f"{s['gbps']['median']:.2f}", _summary(s["gbps"]),
                             format_duration(s["duration_s"]["median"]), f"{s['rank_spread']['median']:.0%}",
                             format_duration(s["overhead_s"]["median"]),
                             format_duration(s["stall_s"]["median"]) if "stall_s" in s else "")
                            for op, s in summary.items()))
    round_ = median_round(document["rounds"]["save"])
    ranks = Table(f"save round {round_['round']} (the median one), per rank, slowest first",
                  ("rank", "host", "bytes", "own work", "returned", "waited for others"),
                  tuple((str(s["rank"]), s["host"], format_size(s["bytes"]), format_duration(s["io_s"]),
                         format_duration(s["end_s"]), format_duration(s["barrier_s"]))
                        for s in timeline_ranks(round_["ranks"])),
                  failed=frozenset({0}) if round_["rank_spread"] > 0.2 else frozenset())
    figures = (Figure("aggregate GB/s per operation; every rank's save timeline from the barrier",
                      _png(lambda p: plot_distributed(document, p))), *_distributed_series_figures(document))
    headline = Headline("checkpoint save/load, all ranks", f"{launch['world_size']} ranks",
                        summary["save"]["gbps"]["median"], summary["load"]["gbps"]["median"])
    return Section(title=f"Distributed checkpoint, {launch['world_size']} ranks: {document['target']}", lines=lines,
                   tables=(aggregate, ranks), figures=figures, headline=headline)
