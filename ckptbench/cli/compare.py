"""``ckptbench compare TARGET [TARGET ...]``: the same checkpoint workload on every tier in one run, side
by side, and what each would cost the training job (checkpoint and restore time, optimal interval,
overhead and waste at the job's failure rate, $ per run where the tier has prices)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import click

from ckptbench.cli import params
from ckptbench.cli.bench import CLIENT_OPTION, DEFAULT_MODEL, storage_options_from
from ckptbench.cli.formats import format_options
from ckptbench.cli.interval_cmd import pct, with_range
from ckptbench.cli.options import (
    checked_device,
    failure_options,
    resolve_failures,
    resolve_local_loss,
    two_level_options,
)
from ckptbench.cli.render import open_output, run_and_emit, stdout_console
from ckptbench.errors import UsageError
from ckptbench.model.interference import ASSUMED
from ckptbench.units import format_duration, format_size, runs_text

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
DEFAULT_SIZE = "256MiB"
DEFAULT_RUN_TIME = "30d"


@click.command(context_settings=_CONTEXT)
@click.argument("targets", nargs=-1, metavar="TARGET [TARGET ...]")
@click.option("--tier", multiple=True, metavar="NAME|FILE.toml",
              help="A tier from configs/tiers, or a tier file, to compare too (repeatable); a TARGET that is a "
                   "tier name or a .toml file is read the same way.")
@click.option("--from", "from_results", multiple=True, type=params.RESULT_FILE, metavar="RESULT.json",
              help="A tier measured earlier, from its result file (bench --workload checkpoint, compare, preflight), "
                   "set beside the ones measured now without measuring it again (repeatable).")
@click.option("--workload", type=click.Choice(["checkpoint"]), default="checkpoint", show_default=True,
              help="What runs on every tier: ckptbench's writer saving (durable, sync and async) and loading (cold) "
                   "a synthetic state_dict with the model's tensor shapes.")
@click.option("--model", metavar="PRESET", default=None,
              help=f"Model preset (configs/models): the workload's tensor shapes, and the job's size unless --params  "
                   f"[default: {DEFAULT_MODEL}].")
@click.option("--size", type=params.SIZE, default=DEFAULT_SIZE, show_default=True,
              help="Bytes of the measured workload (per save): 256MiB, 2GiB. Not with --scale.")
@click.option("--scale", type=params.FRACTION, default=None,
              help="The measured workload as a fraction of the full model's (0.05 or 5%), instead of --size.")
@click.option("--threads", type=params.THREADS, default=None,
              help="ckptbench's writer threads  [default: its own].")
@click.option("--repeat", type=params.RUNS, default=3, show_default=True, help="Measured runs per tier.")
@click.option("--warmup", type=params.WARMUP_RUNS, default=1, show_default=True,
              help="Discarded runs per tier before measuring.")
@click.option("--params", type=params.FINITE_COUNT, default=None,
              help="The job's parameter count (70B)  [default: the --model preset's].")
@click.option("--ranks", type=params.POSITIVE_INT, default=1, show_default=True,
              help="Ranks writing the job's checkpoint at once, each an equal share (fully sharded), each at the "
                   "rate measured here.")
@failure_options(with_count=True)
@click.option("--restart", type=params.BOUNDED_DURATION, default=None,
              help="Fixed cost of a failure (detect, replace, relaunch) before the restore: 10m  [default: 0].")
@click.option("--mode", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="Checkpoints the job takes: async (stall, then persist beside training) or sync (blocking).")
@click.option("--interference", type=params.FRACTION_OR_ZERO, default=None,
              help="Async: fraction of training throughput lost while a checkpoint persists (5%)  [default: "
                   "2 %, assumed; the CPU probe on this host is reported, not used].")
@click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda|cuda:N",
              help="Where the measured state_dict lives, as in training: cuda saves it with device-to-host staging, "
                   "loads it back to the GPU, and measures each tier's interference as a GPU compute loop's slowdown "
                   "while that tier's checkpoint persists (used instead of the assumed value).")
@click.option("--every", type=params.BOUNDED_DURATION, default=None,
              help="Also evaluate this interval (training time between checkpoints): 30m.")
@click.option("--run-time", type=params.BOUNDED_DURATION, default=DEFAULT_RUN_TIME, show_default=True,
              help="Compute time of the training run, for $ per run: 30d.")
@click.option("--keep", type=params.POSITIVE_INT, default=2, show_default=True,
              help="Checkpoints kept on the tier during the run, for $ per run.")
@click.option("--endpoint-url", default=None, metavar="URL",
              help="Object storage: the S3 endpoint of every s3:// target (Ceph RGW, MinIO, ...).")
@click.option("--storage-option", multiple=True, metavar="KEY=VALUE",
              help="Object storage: a storage option for every object-storage target, over a tier's own "
                   "(repeatable): part_size=32MiB, key=..., secret=... (never written to output).")
@CLIENT_OPTION
@two_level_options(local_help="Two levels: the fast local tier (a directory), with --remote: both tiers measured, "
                              "the drain from one to the other too, and single level or two levels recommended.",
                   remote_every_help="Two levels: with --every, evaluate a remote copy every this many local "
                                     "checkpoints.")
@format_options
@click.option("--plot", "plot_path", type=params.OUTPUT_FILE, default=None,
              help="Also draw the tiers side by side (GB/s, and overhead and waste or job times) to this PNG file; "
                   "with --local/--remote also both schedules' waste versus interval to NAME-two-level.png.")
@click.option("--output", "output_dir", type=params.OUTPUT_DIR, default=None,
              help="Directory to write the JSON result file into (created if missing).")
def compare(targets: tuple[str, ...], tier: tuple[str, ...], from_results: tuple[Path, ...], workload: str, model: str | None, size: int,
            scale: float | None, threads: int | None, repeat: int, warmup: int, params: float | None,
            ranks: int, mtbf: float | None, gpu_mtbf: float | None, node_mtbf: float | None,
            faults_per_day: float | None, failures: str | None, gpus: int | None, nodes: int | None,
            restart: float | None, mode: str, interference: float | None, device: str, every: float | None,
            run_time: float,
            keep: int, endpoint_url: str | None, storage_option: tuple[str, ...], client: str | None,
            local_dir: str | None,
            remote_url: str | None, local_loss: str | None, remote_every: int | None, output_format: str,
            plot_path: Path | None, output_dir: Path | None) -> None:
    """The same checkpoint workload on every tier, side by side, and what each costs the job.

    \b
    A TARGET is a directory (/mnt/nvme, /mnt/cephfs), a URL (s3://bucket/prefix), a tier name from
    configs/tiers (local-nvme, cephfs, s3-standard; write ./NAME for a directory called NAME), or a
    tier file (my-tier.toml: url, prices, notes). Every target is checked before anything is measured.

    \b
    Example:
      ckptbench compare /mnt/nvme /mnt/cephfs s3://ckpt/run1 --endpoint-url http://rgw:8080 \\
        --model llama3-70b --ranks 64 --failures llama3 --gpus 1024 --restart 10m --plot tiers.png

    \b
    Two levels (local every interval, every k-th drained to the remote tier in the background):
      ckptbench compare --local /mnt/nvme --remote s3://ckpt/run1 --endpoint-url http://rgw:8080 \\
        --failures llama3 --gpus 1024 --restart 10m
    """
    from ckptbench.bench.shootout import CheckpointBenchSpec, plan
    from ckptbench.bench.tier_comparison import JobSpec, check_targets, resolve_compare_target, run_compare, saved_tiers
    from ckptbench.cli.options import read_result
    from ckptbench.model import presets, sizing

    tier_args, param_count = tier, params  # (the flags' names, so --config TOML keys match them)
    ctx = click.get_current_context()
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
    two_levels = local_dir is not None or remote_url is not None
    if two_levels:
        _check_two_level_flags(local_dir, remote_url, targets, tier_args, from_results, every, remote_every)
    elif {"local_loss", "remote_every"} & given:
        raise UsageError(f"--{next(iter({'local_loss', 'remote_every'} & given)).replace('_', '-')} applies to two "
                         "levels: add --local DIR --remote URL")
    if not targets and not tier_args and not from_results and not two_levels:
        raise UsageError("give the tiers to compare: directories, s3:// URLs or tier names",
                         hint="e.g. ckptbench compare /mnt/nvme /mnt/cephfs s3://bucket/prefix")
    if {"scale", "size"} <= given:
        raise UsageError("give --scale or --size, not both")
    spec = CheckpointBenchSpec(model=DEFAULT_MODEL if model is None else model, scale=scale,
                               size_bytes=None if scale is not None else size, writers=("ckptbench",),
                               repeat=repeat, warmup=warmup, threads=threads, memory_saves=0, device=device)
    work = plan(spec)  # unknown model preset, size out of range: fail before touching any target
    checked_device(device, work.total_bytes, launched=False)
    failure_model = resolve_failures(mtbf_s=mtbf, gpu_mtbf_s=gpu_mtbf, node_mtbf_s=node_mtbf,
                                     faults_per_day=faults_per_day, failure_preset=failures, gpus=gpus, nodes=nodes,
                                     count_given=True)
    shape = presets.load_model(spec.model)
    size_info = sizing.checkpoint_size(param_count or shape.params, sizing.TrainingRecipe(),
                                       sizing.Parallelism(dp=ranks, sharding="fsdp" if ranks > 1 else "none"))
    job = JobSpec(size=size_info, model=None if param_count else shape.name, failures=failure_model,
                  restart_s=restart or 0.0, mode=mode, interference=(interference if interference is not None
                                                       else ASSUMED.point if mode == "async" else 0.0), every_s=every,
                  run_s=run_time, keep=keep,
                  interference_measured=device != "cpu" and interference is None and mode == "async")
    options = storage_options_from(endpoint_url, storage_option, client)
    if two_levels:
        assert local_dir is not None and remote_url is not None
        loss = resolve_local_loss(local_loss, failures)
        if failure_model is None:
            raise UsageError("--local/--remote need a failure rate (--mtbf, --failures, ...): the choice between one "
                             "and two levels is a choice of waste")
        targets = (local_dir, remote_url)
    resolved = [resolve_compare_target(t, options) for t in targets]
    resolved += [resolve_compare_target(t, options, as_tier=True) for t in tier_args]
    if options and not any(t.on_objects for t in resolved):
        raise UsageError("--storage-option, --endpoint-url and --client apply to object storage (s3://...), and no "
                         "target is")
    saved = [tier for path in from_results for tier in saved_tiers(str(path), read_result(path))]
    if len(resolved) + len(saved) < 1:
        raise UsageError("nothing to compare")
    if two_levels:
        from ckptbench.bench.two_levels import check_two_level_targets

        check_two_level_targets(resolved, work)

        def run_two(progress: Any) -> Any:
            from ckptbench.bench.two_levels import measure_two_levels
            from ckptbench.decide.twolevel_choice import decide

            measured = measure_two_levels(spec, job, resolved, workload=work, progress=progress)
            return _TwoLevelReport(measured.report, decide(job, measured.local, measured.remote, measured.drain,
                                                           local_loss=loss[0], local_loss_source=loss[1],
                                                           remote_every=remote_every))

        run_and_emit(run_two, output=open_output(output_dir, "compare"), plot_path=plot_path, output_format=output_format,
                     plot=_plot, print_tables=lambda report, document: _print_two_levels(document))
        return
    check_targets(resolved, work)
    run_and_emit(
        lambda progress: run_compare(spec, job, resolved, workload=work, progress=progress, saved=saved),
        output=open_output(output_dir, "compare"), plot_path=plot_path, output_format=output_format,
        plot=_plot, print_tables=lambda report, document: _print_tables(document),
    )


def _plot(document: dict[str, Any], path: Path) -> None:
    from ckptbench.report.compare_plot import plot_compare

    plot_compare(document, path)
    if document.get("two_level") is not None:
        from ckptbench.report.twolevel_plot import plot_measured_two_level

        plot_measured_two_level(document, two_level_plot_path(path))


def two_level_plot_path(path: Path) -> Path:
    """Where ``--plot NAME.png`` with --local/--remote draws both schedules: ``NAME-two-level.png``."""
    return path.with_name(f"{path.stem}-two-level.png")


# -- two levels ---------------------------------------------------------------------------------------


def _check_two_level_flags(local_dir: str | None, remote_url: str | None, targets: tuple[str, ...],
                           tier_args: tuple[str, ...], from_results: tuple[Path, ...], every: float | None,
                           remote_every: int | None) -> None:
    if local_dir is None or remote_url is None:
        raise UsageError(f"{'--local' if local_dir is not None else '--remote'} needs "
                         f"{'--remote URL' if local_dir is not None else '--local DIR'}: two levels are two tiers")
    if targets or tier_args or from_results:
        raise UsageError("--local/--remote compare exactly those two tiers; give other targets in another run")
    if remote_every is not None and every is None:
        raise UsageError("--remote-every applies with --every (the local interval it evaluates)")


class _TwoLevelReport:
    """A comparison of the two tiers with the drain measured and the decision added (``two_level``)."""

    def __init__(self, report: Any, decision: dict[str, Any]) -> None:
        self.report = report
        self.decision = decision

    def to_dict(self) -> dict[str, Any]:
        return {**self.report.to_dict(), "two_level": self.decision}


def _per_round(ratios: list[float]) -> str:
    """A ratio taken round by round (each pair measured minutes apart on a shared machine): its median and
    spread, which the medians of the two sides printed beside it need not divide into."""
    if len(ratios) < 2:
        return f"{ratios[0]:.2f}x" if ratios else "-"
    return f"{statistics.median(ratios):.2f}x, the median of {len(ratios)} rounds' {min(ratios):.2f}–{max(ratios):.2f}x"


def _print_two_levels(document: dict[str, Any]) -> None:
    from rich.table import Table

    _print_tables(document)
    console = stdout_console()
    two = document["two_level"]
    drain = two["drain"]
    console.print(
        f"[bold]drain[/] {two['local']} -> {two['remote']}: {drain['drain_gbps']:.2f} GB/s "
        f"[dim]{min(drain['runs_drain_gbps']):.2f}–{max(drain['runs_drain_gbps']):.2f}[/], "
        f"{drain['drain_vs_direct']:.2f}x a save straight to the remote tier ({drain['direct_save_gbps']:.2f} GB/s)"
        f"  ·  local save stall {format_duration(drain['stall_alone_s'])} alone, "
        f"{format_duration(drain['stall_during_s'])} during a drain ({_per_round(drain['stall_ratio_by_round'])})")
    from ckptbench.bench.drain_measure import server_here_note

    note = server_here_note(drain)
    if note:
        console.print(f"[dim]note: {note}[/]")
    table = Table(header_style="bold")
    for column in ("schedule", "local every", "remote every", "waste", "range"):
        table.add_column(column, justify="left" if column == "schedule" else "right")
    one, best = two["single_level"], two["two_level"]

    def waste_range(r: list[float] | None) -> str:
        return "-" if r is None else f"{pct(r[0], 2)}–{pct(r[1], 2)}"

    table.add_row(f"single level ({one['tier']})", "-", _seconds(one["interval_s"]),
                  "-" if one["waste_fraction"] is None else pct(one["waste_fraction"], 2),
                  waste_range(one["waste_fraction_range"]))
    local_level, remote_level = best["levels"]
    every = "-" if remote_level["every"] is None else (
        f"{_seconds(remote_level['interval_s'])} (k={remote_level['every']})")
    table.add_row(f"two levels ({two['local']} + {two['remote']})", _seconds(local_level["interval_s"]), every,
                  pct(best["waste_fraction"], 2), waste_range(best["waste_fraction_range"]))
    console.print(table)
    console.print(two_level_takeaway(two))


def two_level_takeaway(two: dict[str, Any]) -> str:
    """One sentence: the recommended schedule, its waste and range, and why."""
    best, one = two["two_level"], two["single_level"]
    local_level, remote_level = best["levels"]
    if two["recommendation"] == "two-level":
        drained = ("" if remote_level["every"] is None
                   else f" and drain every {remote_level['every']} to {two['remote']}")
        return (f"Two levels: checkpoint to {two['local']} every {format_duration(best['recommended_interval_s'])}"
                f"{drained}: about {_waste(best)} of wall time lost; {two['reason']}.")
    return (f"Single level: checkpoint to {two['remote']} every {format_duration(one['interval_s'])}: about "
            f"{_waste(one)} of wall time lost; {two['reason']}.")


def _waste(schedule: dict[str, Any]) -> str:
    """A schedule's waste and its range, as the table shows them (to 0.01 %)."""
    def shown(value: float) -> str:
        return pct(value, 2)

    return with_range(shown(schedule["waste_fraction"]), schedule["waste_fraction_range"], shown)


# -- the table ---------------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_duration(value)


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 0.995 or value == 0 else f"${value:.3g}"


#: Rows of the table: (label, where in the tier record, key, format); `where` "measured" or "model".
def _rows(document: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    job = document["job"]
    asynchronous = job["mode"] == "async"
    rows: list[tuple[str, str, str, Any]] = [
        ("checkpoint time (sync)", "model", "checkpoint_s", _seconds),
    ]
    if asynchronous:
        rows += [("stall per checkpoint", "model", "stall_s", _seconds),
                 ("persist per checkpoint", "model", "persist_s", _seconds)]
    rows.append(("restore", "model", "restore_s", _seconds))
    if job["mtbf_s"] is not None:
        rows += [("optimal interval", "model", "optimal_interval_s", _seconds),
                 ("overhead at optimum", "model", "overhead_fraction", lambda v: pct(v, 2)),
                 ("waste at optimum", "model", "waste_fraction", lambda v: pct(v, 2))]
    if job["every_s"] is not None:
        every = format_duration(job["every_s"])
        rows.append((f"overhead every {every}", "model", "overhead_fraction_at_interval", lambda v: pct(v, 2)))
        if job["mtbf_s"] is not None:
            rows.append((f"waste every {every}", "model", "waste_fraction_at_interval", lambda v: pct(v, 2)))
    return rows


def _print_tables(document: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    tiers, job, spec, workload = document["tiers"], document["job"], document["spec"], document["workload"]
    best, tied = document["best"], document.get("tied", {})
    shape = workload["shape"]
    console.print(
        f"[bold]workload on every tier[/]: {workload['model']} x{workload['scale']:.3g} ({shape['layers']} blocks, "
        f"hidden {shape['hidden']}), {format_size(workload['total_bytes'])} in {workload['tensors']} tensors  ·  "
        f"ckptbench writer  ·  {runs_text(spec['repeat'], spec['warmup'])} per tier  ·  saves durable, "
        f"loads cold")
    recipe = job["recipe"]["description"]
    who = (f"{job['ranks']} ranks write {format_size(job['rank_bytes'])} each" if job["ranks"] > 1
           else "1 rank writes it")
    failure = ("no failure rate" if job["mtbf_s"] is None else
               f"MTBF {format_duration(job['mtbf_s'])} ({job['failure_source']})")
    restart = f"restart {format_duration(job['restart_s'])} + restore" if job["restart_s"] else "restart = restore"
    mode = ("sync" if job["mode"] != "async" else "async (interference measured per tier on the training device)"
            if job.get("interference_measured") else f"async (interference {pct(job['interference'], 0)})")
    console.print(
        f"[bold]job[/]: {job['model'] + ' ' if job['model'] else ''}{job['params'] / 1e9:.4g}B params, {recipe}: "
        f"{format_size(job['checkpoint_bytes'])} per checkpoint, {who}  ·  {mode}  ·  {failure}  ·  "
        f"{restart}")

    table = Table(header_style="bold")
    table.add_column("", style="bold")
    for t in tiers:
        table.add_column(f"{t['label']}\n[dim]{t['filesystem'] or t['kind']}[/]", justify="right")

    def cell(key: str, text: str, label: str) -> str:  # green on a terminal, * everywhere (logs, pipes)
        if best.get(key) == label:
            return f"[bold green]*{text}[/]"
        return f"[green]={text}[/]" if label in tied.get(key, ()) else text

    for name, key in (("save GB/s (durable)", "save"), ("load GB/s (cold)", "load")):
        row = [f"{name}, measured"]
        for t in tiers:
            summary = t["bench"]["results"][0][key]["summary_gbps"]
            text = cell(f"{key}_gbps", f"{summary['median']:.2f}", t["label"])
            text += f" [dim]{summary['min']:.2f}–{summary['max']:.2f}[/]"
            if t["measured"][f"{key}_cached"]:
                text += " [yellow](cached!)[/]"
            if key == "save" and (t.get("bottleneck") or {}).get("limit") == "writer":
                text += " [yellow](writer-bound)[/]"
            row.append(text)
        table.add_row(*row)
    if job["mode"] == "async":
        for name, key in (("async stall, measured", "stall_s"), ("async persist, measured", "persist_s")):
            table.add_row(name, *[cell(f"measured_{key}", _seconds(t["measured"][key]), t["label"]) for t in tiers])
    table.add_section()
    for name, _, key, fmt in _rows(document):
        row = [f"{name}, job"]
        for t in tiers:
            m = t["model"]
            value = m[key]
            error = m["interval_error"] if key.endswith("_at_interval") else m["error"]
            if value is None and error and key not in ("checkpoint_s", "stall_s", "persist_s", "restore_s"):
                row.append("[red]cannot keep up[/]" if "cannot keep up" in error else "[red]infeasible[/]")
                continue
            text = fmt(value)
            if key == "optimal_interval_s" and m["constraint_binding"]:
                text += " [dim](bound)[/]"
            row.append(cell(key, text, t["label"]))
        table.add_row(*row)
    if any(t["model"]["bill"] for t in tiers):
        table.add_section()
        row = [f"$ per run ({format_duration(job['run_s'])}, keep {job['keep']})"]
        for t in tiers:
            bill = t["model"]["bill"]
            if bill is None:
                row.append("[dim]no prices[/]")
                continue
            text = cell("bill_total_usd", _usd(bill["total_usd"]), t["label"])
            parts = [f"{what} {_usd(bill[key])}" for what, key in (("storage", "storage_usd"), ("PUT", "put_usd"),
                                                                   ("GET", "get_usd")) if bill[key] is not None]
            if len(parts) > 1:
                text += f"\n[dim]{', '.join(parts)}[/]"
            row.append(text)
        table.add_row(*row)
    console.print(table)
    if len(tiers) > 1:
        console.print("[dim]*: best of the tiers on that row beyond the noise of the runs; =: tied for best (their "
                      "runs overlap); job rows scale the measured rates to the job (assumptions in --json)[/]")
    for t in tiers:
        tier = t["tier"]
        if tier and tier["notes"]:
            console.print(f"[dim]tier {tier['name']} ({tier['url']}): {tier['notes']}[/]")
    for note in document["notes"]:
        console.print(f"[dim]note: {note}[/]")
    console.print(takeaway(document))


def _and(labels: list[str]) -> str:
    return ", ".join(labels[:-1]) + f" and {labels[-1]}" if len(labels) > 1 else labels[0]


def takeaway(document: dict[str, Any]) -> str:
    """One sentence: which tier wastes least (or checkpoints fastest), and which is cheapest."""
    best, tied = document["best"], document.get("tied", {})
    by_label = {t["label"]: t for t in document["tiers"]}
    if len(by_label) < 2:
        (only,) = by_label.values()
        m = only["model"]
        if m["waste_fraction"] is not None:
            return (f"On {only['label']}: checkpoint every {format_duration(m['optimal_interval_s'])}, wasting about "
                    f"{pct(m['waste_fraction'])} of wall time.")
        return f"On {only['label']}: a checkpoint takes {format_duration(m['checkpoint_s'])}."
    if "waste_fraction" in best:
        m = by_label[best["waste_fraction"]]["model"]
        sentence = (f"Least waste: {best['waste_fraction']}, checkpointing every "
                    f"{format_duration(m['optimal_interval_s'])} ({pct(m['waste_fraction'])} of wall time)")
    elif "waste_fraction" in tied:
        sentence = (f"Least waste: tied between {_and(tied['waste_fraction'])} (their runs overlap: "
                    + ", ".join(f"{label} {pct(by_label[label]['model']['waste_fraction'])}"
                                for label in tied["waste_fraction"]) + ")")
    elif "checkpoint_s" in best:
        label = best["checkpoint_s"]
        sentence = (f"Fastest checkpoint: {label} ({format_duration(by_label[label]['model']['checkpoint_s'])} for "
                    "the job's checkpoint, sync)")
    else:
        sentence = f"Fastest checkpoint: tied between {_and(tied.get('checkpoint_s', list(by_label)))} (their runs overlap)"
    if "bill_total_usd" in best:
        label = best["bill_total_usd"]
        sentence += f"; cheapest: {label} ({_usd(by_label[label]['model']['bill']['total_usd'])} per run)"
    return sentence + "."
