"""Settings from measurements (pure): ``ckptbench recommend``'s advice from saved result files, each setting with
the measurement behind it, as a TOML snippet and as arguments; and the rates a result file measured, for
``--from``. The writer's settings always come from one measured configuration; among configurations tied
within the noise the cheapest is chosen."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ckptbench.bench.layout import implication
from ckptbench.errors import UsageError, reading_document
from ckptbench.model.failures import FailureModel
from ckptbench.units import format_duration, format_rate, format_size


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


#: Settings that describe one writer configuration: they always come from the same measurement.
WRITER_SETTINGS = ("threads", "block_size_bytes", "shard_size_bytes", "direct")


def advice_from_results(documents: list[tuple[str, dict[str, Any]]]) -> dict[str, Advice]:
    """Settings justified by saved results (``(file name, document)`` pairs, schemas checked first).
    A later document's advice on the same setting replaces an earlier one's; the writer's settings
    (:data:`WRITER_SETTINGS`) are replaced as a group, so they always describe one measured configuration.
    A document that lacks what its schema promises, or holds a value no setting can take, is a one-line
    UsageError naming it."""
    out: dict[str, Advice] = {}
    for where, doc in documents:
        name = check_schema(doc, where)
        with reading_document(where, doc["schema"]):
            advice = [a for a in _ADVISORS[name](doc, where) if a.value is not None]
        if any(a.setting in WRITER_SETTINGS for a in advice):
            for key in WRITER_SETTINGS:
                out.pop(key, None)
        out.update((a.setting, a) for a in advice)
    return out


def layout_notes(documents: list[tuple[str, dict[str, Any]]], advice: dict[str, Advice]) -> list[str]:
    """What each result's filesystem layout (``environment.layout``: Lustre/BeeGFS stripes, NFS connections)
    implies for the writer streams advised (``threads``, else the most the result measured with); a layout
    its tool could not read is named with the reason."""
    out = []
    for where, doc in documents:
        environment = doc.get("environment")
        layout = environment.get("layout") if isinstance(environment, dict) else None
        if not isinstance(layout, dict):
            continue
        if "skipped" in layout:
            name = {"lustre": "Lustre", "beegfs": "BeeGFS"}.get(layout.get("filesystem"), layout.get("filesystem"))
            out.append(f"{where}: {name}: {layout['skipped']}")
            continue
        streams = advice["threads"].value if advice.get("threads") is not None else max(
            (r["config"]["threads"] for r in doc.get("results", []) if isinstance(r.get("config"), dict)), default=1)
        note = implication(layout, int(streams))
        if note:
            out.append(f"{where}: {note}")
    return out


def async_rates(documents: list[tuple[str, dict[str, Any]]]) -> list[tuple[float, float, str]]:
    """``(staging bytes/s, persist bytes/s, file name)`` of every async save of one node the documents
    measured with ckptbench's writer (a checkpoint bench, or what preflight measured)."""
    out = []
    for where, doc in documents:
        name = check_schema(doc, where)
        with reading_document(where, doc["schema"]):
            if name == "ckptbench.bench.checkpoint":
                mine = next((a for a in doc.get("async") or [] if a["writer"] == "ckptbench"), None)
                if mine is not None:
                    total = doc["workload"]["total_bytes"]
                    out.append((total / _positive_seconds(mine["stall_s"]),
                                total / _positive_seconds(mine["persist_s"]), where))
            elif name == "ckptbench.preflight":
                m = doc["measurements"]
                total = m["measured_bytes"]
                out.append((total / _positive_seconds(m["async_stall_s"]),
                            total / _positive_seconds(m["async_persist_s"]), where))
    return out


@dataclass(frozen=True)
class MeasuredRates:
    """What one result file says about checkpoint speed on its target, for ``--from``: the durable write rate,
    and where measured the async staging and persist rates, the cold-read rate, and (preflight) the job's
    node bytes and interference."""

    source: str
    schema: str
    write_bps: float
    staging_bps: float | None = None
    persist_bps: float | None = None
    read_bps: float | None = None
    node_bytes: int | None = None
    interference: float | None = None
    #: The job a preflight result was run for; None for other schemas.
    job: PreflightJob | None = None

    def describe(self) -> str:
        parts = [f"write {format_rate(self.write_bps)}"]
        if self.staging_bps is not None and self.persist_bps is not None:
            parts.append(f"async staging {format_rate(self.staging_bps)}, persist {format_rate(self.persist_bps)}")
        return f"{self.source} ({self.schema}): " + ", ".join(parts)


@dataclass(frozen=True)
class PreflightJob:
    """The job a preflight result was run for, as ``--from`` carries it into ``interval`` and ``goodput``: its
    size, its failure rate, its restart (the job's own plus the restore preflight predicted) and the
    checkpoint interval preflight recommended (None where it recommended none)."""

    params: float
    model: str | None
    ranks: int
    ranks_per_node: int
    mtbf_s: float
    failure_source: str
    restart_s: float
    interval_s: float | None
    mode: str = "async"  # the checkpoint mode preflight chose: "sync" or "async"
    #: preflight's predicted ranges (low, high) of ``sync_checkpoint_s``, ``async_stall_s``, ``async_persist_s``,
    #: ``interference`` and ``restart_s``, those it gave (none in files older than the ranges)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)

    def failure_model(self, where: str) -> FailureModel:
        """The job's failures, their source naming the result file ``where`` they came from."""
        return FailureModel(self.mtbf_s, source=f"{self.failure_source} (the job of {where})")

    def cost_ends(self, interference: float | None = None) -> list[Any] | None:
        """The checkpoint's cost at the fast and the slow end of the predicted ranges, in the mode preflight
        chose (``interference``: as typed, else the range's ends); None where the file gives no ranges."""
        from ckptbench.model.interval import CheckpointCost

        r = self.ranges
        if self.mode == "sync":
            write = r.get("sync_checkpoint_s")
            return None if write is None else [CheckpointCost.sync(write[0]), CheckpointCost.sync(write[1])]
        stall, persist, share = r.get("async_stall_s"), r.get("async_persist_s"), r.get("interference")
        if stall is None or persist is None or (share is None and interference is None):
            return None
        shares = (interference, interference) if interference is not None else share
        return [CheckpointCost(stall[end], persist[end], shares[end]) for end in (0, 1)]

    def describe(self) -> str:
        size = self.model or f"{self.params / 1e9:.3g}B parameters"
        return f"{size} on {self.ranks} ranks ({self.ranks_per_node} per node)"


def preflight_job(doc: dict[str, Any]) -> PreflightJob:
    """The :class:`PreflightJob` of a preflight document (read inside ``reading_document``)."""
    job, p = doc["job"], doc["predictions"]
    interval = next((a["value"] for a in doc["recommendation"] if a["setting"] == "interval_s"), None)
    model = job["model"]
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model {model!r} is not a name")
    ranges = {}
    for name in ("sync_checkpoint_s", "async_stall_s", "async_persist_s", "interference", "restart_s"):
        span = p.get(f"{name}_range")
        if span is None:
            continue
        if not isinstance(span, list) or len(span) != 2:
            raise ValueError(f"{name}_range {span!r} is not a [low, high] pair")
        low, high = (as_fraction(v) if name == "interference" else _seconds(v) for v in span)
        if low > high:
            raise ValueError(f"{name}_range {span!r} runs from high to low")
        ranges[name] = (low, high)
    mode = p.get("mode", "async")
    if mode not in ("sync", "async"):
        raise ValueError(f"mode {mode!r} is neither sync nor async")
    return PreflightJob(_positive_count(job["checkpoint"]["params"], "params"), model,
                        int(_positive_count(job["ranks"], "ranks", whole=True)),
                        int(_positive_count(job["ranks_per_node"], "ranks_per_node", whole=True)),
                        _positive_seconds(p["mtbf_s"]), str(job["failures"]["source"]), _seconds(p["restart_s"]),
                        None if interval is None else _positive_seconds(interval), mode, ranges)


def as_fraction(value: Any) -> float:
    """A fraction from a result file: a number in [0, 1); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{value!r} is not a fraction")
    return float(value)


def _positive_count(value: Any, what: str, *, whole: bool = False) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value < math.inf
            or (whole and value != int(value))):
        raise ValueError(f"{what} {value!r} is not a positive {'whole number' if whole else 'count'}")
    return float(value)


def device_interference(doc: Any) -> float | None:
    """The interference a shoot-out measured on the training device (its state_dict on a GPU: the compute
    probe's slowdown while ckptbench's async save persisted), as a fraction; None when it ran on the CPU
    (the CPU probe is information only) or no probe step finished during the persist."""
    from ckptbench.model.interference import from_slowdown

    if (doc.get("spec") or {}).get("device", "cpu") == "cpu":
        return None
    ours = next((a for a in doc.get("async") or [] if a.get("writer") == "ckptbench"), None)
    return from_slowdown(ours.get("interference")) if ours else None


def rates_from_result(where: str, doc: Any) -> MeasuredRates:
    """:class:`MeasuredRates` of one result document; a one-line UsageError for a file that is not one."""
    name = check_schema(doc, where)
    rates = write_rates([(where, doc)])
    if not rates:
        raise UsageError(f"{where} measured no durable write rate of ckptbench's writer")
    write_bps = max(r for r, _ in rates)
    measured = async_rates([(where, doc)])
    staging, persist = (measured[-1][0], measured[-1][1]) if measured else (None, None)
    read_bps = node_bytes = interference = job = None
    with reading_document(where, doc["schema"]):
        if name == "ckptbench.preflight":
            read_bps = _rate(doc["measurements"]["read_bps"] / 1e9) * 1e9
            node_bytes = int(doc["predictions"]["checkpoint_per_node_bytes"])
            interference = float(doc["predictions"]["interference"])
            job = preflight_job(doc)
        elif name == "ckptbench.bench.checkpoint":
            ours = next(r for r in doc["results"] if r["writer"] == "ckptbench")
            read_bps = _rate(ours["load"]["gbps"]) * 1e9
            interference = device_interference(doc)
        elif name == "ckptbench.bench.distributed":
            summary = doc["summary"]
            total = sum(doc["rank_bytes"])
            read_bps = _rate(summary["load"]["gbps"]["median"]) * 1e9 / len(set(doc["hosts"]))
            if "async" in summary:
                stall = _positive_seconds(summary["async"]["stall_s"]["median"])
                durable = _positive_seconds(summary["async"]["duration_s"]["median"])
                hosts = len(set(doc["hosts"]))
                staging, persist = total / hosts / stall, total / hosts / max(durable - stall, 1e-9)
    return MeasuredRates(where, doc["schema"], write_bps, staging, persist, read_bps, node_bytes, interference, job)


def _positive_seconds(value: Any) -> float:
    seconds = _seconds(value)
    if seconds <= 0:
        raise ValueError(f"duration {value!r} is not a positive number of seconds")
    return seconds


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


def _tied(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The results tied for best (``leaders``; documents written before the tie rule name one ``best``)."""
    results = doc["results"]
    indices = doc.get("leaders", [doc["best"]])
    if not isinstance(indices, list) or not indices:
        raise ValueError(f"'leaders' {indices!r} is not a list of result indices")
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(results):
            raise IndexError(f"leader {i!r} is not one of its {len(results)} results")
    return [results[i] for i in indices]


def _from_fs(doc: dict[str, Any], where: str) -> list[Advice]:
    _best(doc)
    tied = _tied(doc)
    # Among configurations the noise cannot tell apart, the one that costs least: fewest threads, smallest blocks.
    chosen = min(tied, key=lambda r: (r["config"]["threads"], r["config"]["block_size"]))
    c, w = chosen["config"], chosen["write"]
    size = format_size(c["block_size"])
    runs = len(doc["results"])
    if len(tied) == 1:
        why = (f"{where}: the best durable write of {runs} configurations, {_rate(w['gbps']):.2f} GB/s with "
               f"{c['threads']} thread(s) x {size} blocks ({c['schedule']}), beyond the noise of the others")
    else:
        why = (f"{where}: {len(tied)} of {runs} configurations tie for the best durable write (their runs overlap); "
               f"the one with the fewest threads and smallest blocks, {_rate(w['gbps']):.2f} GB/s with "
               f"{c['threads']} thread(s) x {size} blocks ({c['schedule']})")
    modes = chosen.get("durable_modes")  # both measured (a network or FUSE mount): the faster one, and why
    direct_why = f"{where}: " + (modes["write_reason"] if modes else "O_DIRECT " + (
        "worked" if c["direct"] else f"unavailable ({c.get('direct_fallback_reason')})"))
    out = [Advice("threads", c["threads"], why), Advice("block_size_bytes", c["block_size"], why),
           Advice("direct", bool(c["direct"]), direct_why)]
    return out


def _from_objects(doc: dict[str, Any], where: str) -> list[Advice]:
    _best(doc)
    tied = _tied(doc)
    chosen = min(tied, key=lambda r: (r["config"]["concurrency"], r["config"]["part_size_bytes"]))
    c, w = chosen["config"], chosen["write"]
    what = (f"the best upload of {len(doc['results'])} configurations" if len(tied) == 1 else
            f"of {len(tied)} configurations tied for the best upload, the one with the fewest requests in flight")
    why = (f"{where}: {what}, {_rate(w['gbps']) * 1e3:.0f} MB/s "
           f"with {c['concurrency']} requests in flight and {format_size(c['part_size_bytes'])} parts "
           f"({format_size(c['object_size_bytes'])} objects)")
    out = [Advice("max_concurrency", c["concurrency"], why), Advice("part_size_bytes", c["part_size_bytes"], why)]
    client = ((doc.get("environment") or {}).get("target") or {}).get("client")
    if client:  # the S3 client that moved the data in these runs (compare clients with bench --client)
        out.append(Advice("client", client, f"{where}: measured with the {client} client, {_rate(w['gbps']) * 1e3:.0f} "
                                            f"MB/s upload at the settings above"))
    return out


def _from_checkpoint(doc: dict[str, Any], where: str) -> list[Advice]:
    ours = next((r for r in doc["results"] if r["writer"] == "ckptbench"), None)
    if ours is None:
        return []
    save_gbps = _rate(ours["save"]["gbps"])
    details = ours["details"]
    why = f"{where}: ckptbench saved at {save_gbps:.2f} GB/s with this configuration"
    # O_DIRECT and the block size are a filesystem's settings (on object storage the unit is the part)
    on_files = "url" not in ((doc.get("environment") or {}).get("target") or {})
    out = [Advice("threads", details.get("threads"), why),
           Advice("block_size_bytes", details.get("block_size_bytes") if on_files else None, why),
           Advice("shard_size_bytes", details.get("shard_size_bytes"), why)]
    if on_files and isinstance(details.get("direct"), bool):
        out.append(Advice("direct", details["direct"], why))
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
                "s3": ("client", "part_size_bytes", "max_concurrency"), "schedule": ("interval_s",)}
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
    s3 = {k: v for k, v in (("client", get("client")), ("part_size", get("part_size_bytes")),
                            ("max_concurrency", get("max_concurrency"))) if v is not None}
    call = [*(["async_=True"] if get("async") else []), *([f"storage_options={s3!r}"] if s3 else [])]
    out = [f"ckptbench.Checkpointer({', '.join(kwargs)}).save(state_dict, path{''.join(', ' + a for a in call)})"]
    if get("block_size_bytes") is None:  # save() takes every other setting: the same in one call
        save = [*kwargs, *call]
        out.append(f"ckptbench.save(state_dict, path{''.join(', ' + a for a in save)})")
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
