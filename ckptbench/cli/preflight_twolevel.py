"""``ckptbench preflight --local DIR --remote URL``: the pre-flight check of a two-level schedule.

The measurement is ``compare --local --remote``'s (:mod:`ckptbench.bench.two_levels`: both tiers with
the real writer, the drain and its interference with local saves); the job, its sizing and the verdict
rules are preflight's, applied to the two-level schedule (:mod:`ckptbench.decide.twolevel_verdict`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptbench.bench.records import document_header
from ckptbench.cli.render import open_output, run_and_emit, stdout_console
from ckptbench.errors import UsageError
from ckptbench.units import format_duration, format_rate, format_size

SCHEMA = "ckptbench.preflight.two-level/1"
#: The options that ask for two levels.
TWO_LEVEL_OPTIONS = ("local_dir", "remote_url", "local_loss", "remote_every")
_STYLE = {"PASS": "bold green", "WARN": "bold yellow", "FAIL": "bold red", "BORDERLINE": "bold magenta"}


def preflight_two_levels(job: Any, opts: dict[str, Any], *, target: str | None) -> int | None:
    """Run the two-level pre-flight when ``opts`` ask for it (None when they do not): check every input,
    then measure, evaluate and print. ``target``: the positional TARGET as given (None when absent).
    Returns the exit status of the verdict; bad input raises UsageError (one line, exit 2)."""
    given = [name for name in TWO_LEVEL_OPTIONS if opts.get(name) is not None]
    if not given:
        return None
    local_dir, remote_url = opts["local_dir"], opts["remote_url"]
    if local_dir is None and remote_url is None:
        raise UsageError(f"--{given[0].replace('_', '-')} applies to two levels: add --local DIR --remote URL")
    if local_dir is None or remote_url is None:
        raise UsageError(f"{'--local' if local_dir is not None else '--remote'} needs "
                         f"{'--remote URL' if local_dir is not None else '--local DIR'}: two levels are two tiers")
    if target is not None:
        raise UsageError(f"TARGET {target} and --local/--remote both say where to checkpoint",
                         hint="give TARGET for one tier, or --local DIR --remote URL for two levels")
    from ckptbench.cli.launch import launch_from_environment

    if launch_from_environment() is not None:
        raise UsageError("preflight --local/--remote measures both tiers and the drain from one process",
                         hint="run it without torchrun/srun")
    from ckptbench.bench.shootout import CheckpointBenchSpec, plan
    from ckptbench.bench.tier_comparison import resolve_compare_target
    from ckptbench.bench.two_levels import check_two_level_targets
    from ckptbench.cli.bench import storage_options_from
    from ckptbench.cli.options import resolve_local_loss
    from ckptbench.cli.preflight import DEFAULT_FAILURES, DEFAULT_MODEL

    rate_given = any(opts[k] is not None for k in ("mtbf", "gpu_mtbf", "node_mtbf", "faults_per_day"))
    preset = opts["failures"] if opts["failures"] is not None else (None if rate_given else DEFAULT_FAILURES)
    loss = resolve_local_loss(opts["local_loss"], preset)
    spec = CheckpointBenchSpec(model=opts["model"] or DEFAULT_MODEL, size_bytes=opts["measure_size"],
                               writers=("ckptbench",), repeat=opts["repeat"], warmup=1, memory_saves=0)
    workload = plan(spec, size_option="--measure-size")
    options = storage_options_from(opts["endpoint_url"], opts["storage_option"])
    targets = [resolve_compare_target(local_dir, options), resolve_compare_target(remote_url, options)]
    if options and not targets[1].on_objects:
        raise UsageError("--storage-option and --endpoint-url apply to object storage (s3://...), and neither tier is")
    check_two_level_targets(targets, workload)  # the remote tier reachable, before anything is written
    box: list[TwoLevelPreflight] = []

    def run(progress: Any) -> TwoLevelPreflight:
        report = measure_and_evaluate_two_levels(job, spec, targets, workload, progress, local_loss=loss,
                                                 remote_every=opts["remote_every"])
        box.append(report)
        return report

    run_and_emit(run, output=open_output(opts["output_dir"], "preflight"), plot_path=opts["plot_path"],
                 output_format=opts["output_format"], plot=_plot, print_tables=lambda report, doc: _print(doc))
    return box[0].verdict.exit_code


def _plot(document: dict[str, Any], path: Path) -> None:
    from ckptbench.report.twolevel_plot import plot_measured_two_level

    plot_measured_two_level(document, path)


def measure_and_evaluate_two_levels(job: Any, spec: Any, targets: list[Any], workload: Any, progress: Any, *,
                                    local_loss: tuple[float, str], remote_every: int | None) -> TwoLevelPreflight:
    """Measure both tiers and the drain (``compare``'s two-level measurement), then the verdict for ``job``."""
    from ckptbench.bench.two_levels import measure_two_levels
    from ckptbench.cli.preflight import SHARED_FILESYSTEMS
    from ckptbench.decide.twolevel_verdict import TierFacts, evaluate_two_levels, node_job

    measured = measure_two_levels(spec, node_job(job), targets, workload=workload, progress=progress)
    local, remote = measured.local, measured.remote
    remote_fs = remote.filesystem or ""
    facts = TierFacts(
        local_free_bytes=targets[0].storage.free_bytes(),
        remote_free_bytes=None if targets[1].on_objects else targets[1].storage.free_bytes(),
        host_memory_bytes=local.report.environment.get("memory_bytes"),
        remote_shared=targets[1].on_objects or remote_fs.startswith(SHARED_FILESYSTEMS))
    verdict = evaluate_two_levels(job, local, remote, measured.drain, facts, local_loss=local_loss[0],
                                  local_loss_source=local_loss[1], remote_every=remote_every,
                                  sampled_bytes=workload.total_bytes)
    return TwoLevelPreflight(local=targets[0].location, remote=targets[1].location, job=job, verdict=verdict,
                             compare=measured.report.to_dict())


@dataclass(frozen=True)
class TwoLevelPreflight:
    local: str
    remote: str
    job: Any  # decide.verdict.Job
    verdict: Any  # decide.twolevel_verdict.TwoLevelVerdict
    compare: dict[str, Any]  # compare's document of both tiers (the measurement)
    created: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    def to_dict(self) -> dict[str, Any]:
        from ckptbench.cli.preflight import UNITS

        v, job = self.verdict, self.job
        decision = v.decision
        return {
            **document_header(SCHEMA, self.created),
            "local": self.local,
            "remote": self.remote,
            "verdict": v.verdict,
            "checks": [c.to_dict() for c in v.checks],
            "recommendation": [{"setting": a.setting, "value": a.value, "reason": a.reason} for a in v.recommendation],
            "manager": _manager_snippet(self.local, self.remote, job.retain, decision),
            "predictions": v.predictions,
            "two_level": decision,
            "job": {
                "model": job.model_name, "ranks": job.ranks, "ranks_per_node": job.ranks_per_node, "nodes": job.nodes,
                "checkpoint": job.size.as_dict(), "checkpoint_per_node_bytes": job.node_bytes,
                "failures": {"mtbf_s": job.failures.mtbf_s, "source": job.failures.source},
                "restart_s": job.restart_s, "interval_s": job.interval_s, "retain": job.retain,
                "max_overhead": job.max_overhead, "max_ckpt_time_s": job.max_ckpt_time_s,
                "aggregate_bps": job.aggregate_bps, "interference": job.interference,
                "node_memory_bytes": job.node_memory_bytes, "node_network_bps": job.node_network_bps,
            },
            "tiers": self.compare["tiers"],
            "workload": self.compare["workload"],
            "assumptions": list(v.assumptions),
            "units": UNITS,
            "warnings": self.compare.get("warnings", []),
            "environment": self.compare["environment"],
        }


def _manager_snippet(local: str, remote: str, retain: int, decision: dict[str, Any]) -> str | None:
    """The ``CheckpointManager`` of the recommended two-level schedule, to paste (None for a single level)."""
    if decision["recommendation"] != "two-level":
        return None
    every = decision["two_level"]["levels"][1]["every"]
    return (f"ckptbench.CheckpointManager({local!r}, keep_last={retain}, remote={remote!r}, "
            f"remote_every={every or 1})")


def _print(doc: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    job, p, two = doc["job"], doc["predictions"], doc["two_level"]
    drain = two["drain"]
    console.print(
        f"[bold]two levels[/]: {doc['local']} drained to {doc['remote']}  ·  job: {job['model']}, {job['ranks']} ranks "
        f"on {job['nodes']} node(s), {format_size(job['checkpoint_per_node_bytes'])} per node  ·  MTBF "
        f"{format_duration(job['failures']['mtbf_s'])} ({job['failures']['source']}), "
        f"{two['local_loss']:.0%} of failures lose the local copy")
    for tier in doc["tiers"]:
        save, load = (tier["bench"]["results"][0][k]["summary_gbps"]["median"] for k in ("save", "load"))
        console.print(f"measured {tier['label']}: save {save:.2f} GB/s (durable), load {load:.2f} GB/s (cold), "
                      f"async stall {format_duration(tier['measured']['stall_s'])}")
    console.print(
        f"drain: {format_rate(drain['drain_gbps'] * 1e9)} ({drain['drain_vs_direct']:.2f}x a save straight to the "
        f"remote tier); local stall {drain['stall_ratio']:.2f}x during a drain")
    from ckptbench.bench.drain_measure import server_here_note

    note = server_here_note(drain)
    if note:
        console.print(f"[dim]note: {note}[/]")
    table = Table(header_style="bold", title="predicted for the node: point (range)", title_justify="left")
    for name in ("local stall", "drain", "restore local", "restore remote", "interval", "remote every", "overhead",
                 "waste"):
        table.add_column(name, justify="right")

    def ranged(key: str, shown: Any = format_duration) -> str:
        value, bounds = p[key], p.get(f"{key}_range")
        if value is None:
            return "-"
        if bounds is None or shown(bounds[0]) == shown(bounds[1]):
            return shown(value)
        return f"{shown(value)}\n({shown(bounds[0])}–{shown(bounds[1])})"

    def percent(value: float) -> str:
        return f"{value:.2%}"

    table.add_row(ranged("local_stall_s"), ranged("drain_s"), ranged("local_restore_s"), ranged("remote_restore_s"),
                  format_duration(p["interval_s"]) + (" (opt.)" if p["interval_is_optimal"] else ""),
                  "-" if p["remote_every"] is None else str(p["remote_every"]),
                  ranged("overhead_fraction", percent), ranged("waste_fraction", percent))
    console.print(table)
    console.print("[bold]checks[/] (the two-level schedule above):")
    width = max(len(c["name"]) for c in doc["checks"])
    for c in doc["checks"]:
        remedy = f" [dim]→ {c['remedy']}[/]" if c["remedy"] else ""
        console.print(f"  [{_STYLE[c['status']]}]{c['status']:<10}[/] {c['name']:<{width}}  {c['message']}{remedy}")
    advice = {a["setting"]: a for a in doc["recommendation"]}
    schedule = advice.pop("schedule")
    console.print(f"[bold]recommended[/]: {schedule['value']}  [dim]{schedule['reason']}[/]")
    for setting, a in advice.items():
        shown = format_duration(a["value"]) if setting.endswith("_s") else a["value"]
        console.print(f"  {setting} = {shown}  [dim]{a['reason']}[/]")
    if doc["manager"]:
        console.print(f"  [dim]{doc['manager']}[/]")
    console.print(f"verdict: [{_STYLE[doc['verdict']]}]{doc['verdict']}[/]")
