"""``ckptbench goodput``: how much of a training run's time and money failures and checkpoints waste."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ckptbench.cli import params
from ckptbench.cli.formats import format_options
from ckptbench.cli.interval_cmd import UNITS, emit, pct, with_range
from ckptbench.cli.options import (
    FAILURE_RATE,
    GPU_COUNT,
    async_options,
    failure_options,
    flags_override_config,
    from_result_option,
    named,
    read_result,
    resolve_cost,
    resolve_failures,
)
from ckptbench.errors import UsageError, reading_document
from ckptbench.model import goodput as model
from ckptbench.model.failures import MAX_COUNT, FailureModel
from ckptbench.units import format_duration

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
#: Options without which nothing is computed (their names in code, see ``named``).
_REQUIRED = ("tokens", "gpus", "peak_tflops", "mfu", "detect_s", "replace_s", "resume_s")
#: --detect's default and where it comes from.
DETECT_DEFAULT_S = 600.0
DETECT_SOURCE = ("PyTorch's default NCCL collective timeout (torch.distributed.init_process_group: 10 minutes): a job "
                 "hung on a lost rank fails when it expires; a crashed process is noticed sooner")
#: Above this ``(interval + checkpoint + recovery) / MTBF`` the first-order accounting is flagged.
FIRST_ORDER_NOTE_RATIO = 0.3
#: GPUs per node where neither --gpus-per-node nor a --from preflight gives it.
DEFAULT_GPUS_PER_NODE = 8
#: A --params within this relative difference of a --from preflight's is the same job.
PARAMS_MATCH = 0.005
#: Hot spares are nodes: at most the job's node count, which is at most this.
SPARE_COUNT = params.Bounded(params.NONNEGATIVE_INT, MAX_COUNT, f"{MAX_COUNT:,} nodes")

EXPLAIN = """\
How `ckptbench goodput` computes:

  training compute   C = 6 N D FLOPs (N parameters, D tokens: the dense-transformer estimate)
  planned time       C / (GPUs x peak FLOP/s x MFU)      no failures, no checkpoints
  cost               $ per GPU-hour x GPUs (or $ per node-hour x nodes) x hours; the whole
                     cluster is paid for while it recovers
  failures           at rate 1/MTBF while the job runs (computing, checkpointing, redoing lost
                     work); a second fault during a recovery is fixed by that recovery
  per fault          detect + replace + resume (restart and restore)
                     + lost work since the newest durable checkpoint, (tau + s + fP)/2 + (1 - f)P
                       ((tau + C)/2 when synchronous; only with --ckpt-interval and a checkpoint cost)
  checkpoint stalls  (planned / tau) x (s + fP)          (C per checkpoint when synchronous)
  faults             (planned + stalls) / MTBF / (1 - lost / MTBF)
  wall time          planned + stalls + faults x per-fault cost
  goodput            planned / wall (productive share of wall time)
  wasted / plan      (wall - planned) / planned

Without --ckpt-interval/--ckpt-time the waste is exactly faults x (detect + replace + resume), the
simple model most articles use; lost work and stalls are then not counted.
Hot spares: K idle nodes paid for the whole wall time (at most the job's node count); a failed
node is swapped for a spare at once and repaired in the background (taking --replace). A fault
waits only when all K spares are out, with the Erlang-B probability B(K, replace / MTBF), and then
only until the first repair under way finishes (at most --replace; about replace / (K + 1) for
exponential repair times). Charging B(K, replace / MTBF) x replace is therefore an upper bound.
What-ifs change one thing each: halve the detection time; one more hot spare node (and none, when
you have some); checkpoint at the optimal interval (the exact optimum of `ckptbench interval`). A
what-if that cannot be computed (its run would never finish) is left out with a note.
A checkpoint that takes as long as the MTBF to become durable is refused, as `ckptbench interval`
refuses it: most checkpoints would never complete. So is a recovery (detect + replace, after hot
spares, + resume) as long as the MTBF: most recoveries would be struck by further faults, which this
model lets the recovery under way absorb for free.
The lost-work term is first order: against the exact model it is off by terms of order
((tau + C + recovery)/MTBF)^2 of the wall time; a note compares the two when that ratio passes 0.3.
"""


@click.command(context_settings=_CONTEXT)
@click.option("--params", type=params.FINITE_COUNT, default=None, help="Model parameters: 100B.")
@click.option("--model", metavar="PRESET", default=None,
              help="A model preset from configs/models instead of --params: llama3-405b.")
@click.option("--tokens", type=params.FINITE_COUNT, default=None,
              help="Training tokens: 20T  [default: the --model preset's published run: llama3-* 15T, 405b 15.6T].")
@click.option("--gpus", type=GPU_COUNT, default=None,
              help="GPUs in the job: 4000.  [required, unless --from gives it]")
@click.option("--gpu", metavar="NAME", default=None,
              help="The GPU, for its peak dense BF16 TFLOP/s from its datasheet (configs/gpus): h100, h200 (989), "
                   "a100 (312), b200 (2250), mi300x (1307.4)  [default: the --model preset's: llama3-* h100].")
@click.option("--peak-tflops", type=params.FINITE_POSITIVE_NUMBER, default=None,
              help="Peak dense TFLOP/s per GPU in the training dtype, instead of --gpu: 989 (H100 SXM bf16; 1979 is "
                   "the same GPU with 2:4 sparsity, which dense training does not use).")
@click.option("--mfu", type=params.FRACTION, default=None,
              help="Model FLOPs utilisation: 0.35 or 35%  [default: the --model preset's: llama3-* 41%, the Llama 3 "
                   "405B run's on 16,384 H100].")
@click.option("--gpus-per-node", type=GPU_COUNT, default=None,
              help="GPUs per node.  [default: 8, or the --from preflight's]")
@click.option("--node-hour-cost", type=params.FINITE_POSITIVE_NUMBER, default=None, help="$ per node-hour: 90.")
@click.option("--gpu-hour-cost", type=params.FINITE_POSITIVE_NUMBER, default=None, help="$ per GPU-hour: 11.25.")
@failure_options(with_count=False)
@click.option("--detect", type=params.BOUNDED_DURATION_OR_ZERO, default=None,
              help="Time to notice a failure: 60m  [default: 10m, PyTorch's NCCL collective timeout, after which a "
                   "job hung on a lost rank fails].")
@click.option("--replace", type=params.BOUNDED_DURATION_OR_ZERO, default=None,
              help="Time to replace the failed node: 60m (no default: it is your cluster's).  [required]")
@click.option("--resume", type=params.BOUNDED_DURATION_OR_ZERO, default=None,
              help="Time to restart the job and load the checkpoint: 30m (no default: your job's).  [required]")
@click.option("--ckpt-interval", type=params.BOUNDED_DURATION, default=None,
              help="Training time between checkpoints: 30m (adds lost work and stalls).")
@click.option("--ckpt-time", type=params.BOUNDED_DURATION, default=None,
              help="Time to write one checkpoint: 140s (with --stall: the persist time).")
@from_result_option("the checkpoint's cost (sync time, or async stall, persist and interference) as a preflight "
                    "of this job predicted it, and, unless typed, the job (model, GPUs, GPUs per node, failure "
                    "rate) and the interval it recommended,", sources="`ckptbench preflight --json`")
@async_options
@click.option("--hot-spares", type=SPARE_COUNT, default=0, show_default=True,
              help="Idle spare nodes kept ready to swap in (at most the job's node count).")
@format_options
@click.option("--explain", is_flag=True, help="Print the formulas and their assumptions.")
def goodput(**opts: Any) -> None:
    """Goodput, wasted hours and wasted dollars of a training run, with what-ifs.

    \b
    Example (H100 SXM: 989 TFLOP/s dense bf16; 1979 is its 2:4-sparsity figure):
      ckptbench goodput --params 100B --tokens 20T --gpus 4000 --peak-tflops 989 --mfu 0.35 \\
        --node-hour-cost 90 --faults-per-day 1 --detect 60m --replace 60m --resume 30m \\
        --ckpt-interval 30m --ckpt-time 140s
    """
    flags_override_config(opts, FAILURE_RATE, ("params", "model"), ("persist", "ckpt_time"))
    opts = named(opts)
    if opts["explain"] and opts["output_format"] == "table" and all(opts[k] is None for k in _REQUIRED):
        click.echo(EXPLAIN, nl=False)
        return
    emit(compute(opts), opts, _print_human, EXPLAIN, csv_rows)



#: ``--format csv``: the run as given, then one row per what-if.
CSV_COLUMNS = ("scenario", "description", "wall_hours", "wasted_hours", "goodput", "wasted_cost_usd",
               "saved_hours", "net_saving_usd")


def csv_rows(doc: dict[str, Any]) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    given = {"scenario": "as_given", "description": "the run as given", "wall_hours": doc["wall_hours"],
             "wasted_hours": doc["wasted_hours"], "goodput": doc["goodput"], "wasted_cost_usd": doc["wasted_cost_usd"]}
    return CSV_COLUMNS, [given, *({"scenario": w["name"], **w} for w in doc["what_if"])]


def _with_defaults(opts: dict[str, Any], job: Any = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``opts`` with every input the model preset, the GPU named, the ``--from`` preflight's job (``job``, a
    ``decide.advice.PreflightJob``) and the documented defaults give filled in, and the list of those taken
    (option, value, source). Every input still missing is named in one ``UsageError``, not one per rerun."""
    from ckptbench.model import presets

    if opts["param_count"] is not None and opts["model_preset"] is not None:
        raise UsageError("--params and --model both give the parameter count", hint="give one of them")
    if opts["gpu"] is not None and opts["peak_tflops"] is not None:
        raise UsageError("--gpu and --peak-tflops both give the peak compute", hint="give one of them")
    opts, defaults = dict(opts), []

    def take(key: str, option: str, value: Any, shown: str, source: str) -> None:
        opts[key] = value
        defaults.append({"option": option, "value": value, "shown": shown, "source": source})

    if job is not None:
        _take_job(opts, job, take)
    if opts["gpus_per_node"] is None:
        opts["gpus_per_node"] = DEFAULT_GPUS_PER_NODE
    preset = opts["model_preset"]
    training = presets.load_training(preset) if preset is not None else None
    if training is not None and opts["tokens"] is None and training.tokens is not None:
        take("tokens", "--tokens", training.tokens, f"{training.tokens / 1e12:g}T", f"{preset}: {training.source}")
    if training is not None and opts["mfu"] is None and training.mfu is not None:
        take("mfu", "--mfu", training.mfu, f"{training.mfu:.0%}", f"{preset}: {training.source}")
    gpu_name = opts["gpu"]
    if gpu_name is None and opts["peak_tflops"] is None and training is not None and training.gpu is not None:
        gpu_name = training.gpu
        defaults.append({"option": "--gpu", "value": gpu_name, "shown": gpu_name, "source": f"{preset}: {training.source}"})
    if gpu_name is not None:
        gpu = presets.load_gpu(gpu_name)
        take("peak_tflops", "--peak-tflops", float(gpu.peak_tflops), f"{gpu.peak_tflops:g}",
             f"{gpu.description}: {gpu.source}")
    if opts["detect_s"] is None:
        take("detect_s", "--detect", DETECT_DEFAULT_S, format_duration(DETECT_DEFAULT_S), DETECT_SOURCE)

    missing = []
    if opts["param_count"] is None and preset is None:
        missing.append("--params (or --model)")
    for key, flag in (("tokens", "--tokens"), ("gpus", "--gpus"), ("peak_tflops", "--peak-tflops (or --gpu)"),
                      ("mfu", "--mfu"), ("replace_s", "--replace"), ("resume_s", "--resume")):
        if opts[key] is None:
            missing.append(flag)
    if job is None and not _failure_rate_given(opts):
        missing.append("a failure rate (--faults-per-day 1, --mtbf 3h, --gpu-mtbf 50000h or --failures llama3)")
    if missing:
        given = f" (defaults taken: {', '.join(d['option'] for d in defaults)})" if defaults else ""
        raise UsageError(f"missing {', '.join(missing)}{given}", hint="see 'ckptbench goodput --help'")
    return opts, defaults


def _failure_rate_given(opts: dict[str, Any]) -> bool:
    return any(opts[k] is not None for k in ("mtbf_s", "gpu_mtbf_s", "node_mtbf_s", "faults_per_day", "failure_preset"))


def _take_job(opts: dict[str, Any], job: Any, take: Callable[..., None]) -> None:
    """Fill in what the ``--from`` preflight's job gives (its size, GPUs, GPUs per node and the checkpoint
    interval it recommended) where not typed; a typed value that describes another job is a UsageError,
    since the preflight's checkpoint cost holds only for the job it sized."""
    from ckptbench.model import presets

    where = f"the job of {opts['from_result']}"
    other = f"--from {opts['from_result']} predicted the checkpoint of {job.describe()}"
    hint = "its cost holds only for that job: give --ckpt-time (or --stall and --persist) instead of --from"
    if opts["param_count"] is None and opts["model_preset"] is None:
        if job.model in presets.preset_names("models"):
            take("model_preset", "--model", job.model, job.model, where)
        else:
            take("param_count", "--params", job.params, f"{job.params / 1e9:.3g}B", where)
    else:
        given = opts["param_count"] or presets.load_model(opts["model_preset"]).params
        if abs(given / job.params - 1) > PARAMS_MATCH:
            flag = f"--params {given / 1e9:.3g}B" if opts["param_count"] else f"--model {opts['model_preset']}"
            raise UsageError(f"{other}; {flag} is another job", hint=hint)
    for key, option, value in (("gpus", "--gpus", job.ranks), ("gpus_per_node", "--gpus-per-node", job.ranks_per_node)):
        if opts[key] is None:
            take(key, option, value, str(value), where)
        elif opts[key] != value:
            raise UsageError(f"{other}; {option} {opts[key]} is another job", hint=hint)
    if opts["ckpt_interval_s"] is None and job.interval_s is not None:
        take("ckpt_interval_s", "--ckpt-interval", job.interval_s, format_duration(job.interval_s),
             f"the interval {opts['from_result']} recommended")


def _preflight_from(opts: dict[str, Any]) -> tuple[dict[str, Any], Any] | None:
    """The ``--from`` preflight document and its job (``decide.advice.PreflightJob``); None without --from."""
    if opts.get("from_result") is None:
        return None
    from ckptbench.decide.advice import check_schema, preflight_job

    where = str(opts["from_result"])
    doc = read_result(opts["from_result"])
    if check_schema(doc, where) != "ckptbench.preflight":
        raise UsageError(f"--from {where} is a {doc['schema']} result; goodput needs the job's checkpoint, which "
                         "a preflight of the job predicts",
                         hint="run `ckptbench preflight --json --output DIR` for this job, or use "
                              "`ckptbench interval --from` with --size")
    with reading_document(where, doc["schema"]):
        return doc, preflight_job(doc)


def _cost_from(opts: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """--from a preflight result: the node's predicted checkpoint, in the mode that preflight chose."""
    given = [flag for flag, key in (("--ckpt-time", "ckpt_time_s"), ("--stall", "stall_s"), ("--persist", "persist_s"))
             if opts[key] is not None]
    if given:
        raise UsageError(f"--from and {given[0]} both give the checkpoint's cost", hint="give one of them")
    from ckptbench.decide.advice import as_fraction

    with reading_document(str(opts["from_result"]), doc["schema"]):
        p = doc["predictions"]
        if p["mode"] == "sync":
            return {"ckpt_time_s": _seconds(p["sync_checkpoint_s"])}
        interference = opts["interference"] if opts["interference"] is not None else as_fraction(p["interference"])
        return {"stall_s": _seconds(p["async_stall_s"]), "persist_s": _seconds(p["async_persist_s"]),
                "interference": interference}


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e12:
        raise ValueError(f"{value!r} is not a number of seconds")
    return float(value)


def compute(opts: dict[str, Any]) -> dict[str, Any]:
    """The JSON document (raises ``UsageError`` on missing or contradictory options)."""
    from ckptbench.model import presets
    from ckptbench.model.interval import CheckpointCost

    preflight = _preflight_from(opts)
    opts, defaults = _with_defaults(opts, preflight[1] if preflight else None)
    param_count = opts["param_count"] or presets.load_model(opts["model_preset"]).params
    run = model.TrainingRun(param_count, opts["tokens"], opts["gpus"], opts["peak_tflops"] * 1e12, opts["mfu"],
                            opts["gpus_per_node"])
    pricing = model.Pricing(gpu_hour_usd=opts["gpu_hour_cost"], node_hour_usd=opts["node_hour_cost"])
    failures = resolve_failures(
        mtbf_s=opts["mtbf_s"], gpu_mtbf_s=opts["gpu_mtbf_s"], node_mtbf_s=opts["node_mtbf_s"],
        faults_per_day=opts["faults_per_day"], failure_preset=opts["failure_preset"],
        gpus=run.gpus, nodes=run.nodes, count_given=False,
    )
    ends = None
    if preflight is not None:
        job = preflight[1]
        if failures is None:
            failures = job.failure_model(opts['from_result'])
        ends = job.cost_ends(opts["interference"])
        opts = {**opts, **_cost_from(opts, preflight[0])}
    assert failures is not None  # checked with the other missing inputs
    cost = resolve_cost(opts["ckpt_time_s"], "--ckpt-time", stall_s=opts["stall_s"], persist_s=opts["persist_s"],
                        interference=opts["interference"])
    if (cost is None) != (opts["ckpt_interval_s"] is None):
        if cost is None:
            raise UsageError("--ckpt-interval needs the checkpoint cost: --ckpt-time (or --stall with --persist)")
        raise UsageError("the checkpoint cost needs --ckpt-interval (how often you checkpoint)")
    checkpoint = None
    notes: list[str] = []
    if cost is not None:
        assert isinstance(cost, CheckpointCost)
        checkpoint = model.CheckpointPolicy(opts["ckpt_interval_s"], cost)
        notes.append("includes checkpoint stalls and the work lost since the last checkpoint at each fault")
    else:
        notes.append("waste = faults x (detect + replace + resume), the simple model: add --ckpt-interval and "
                     "--ckpt-time to count checkpoint stalls and the work lost since the last checkpoint")
    recovery = model.Recovery(opts["detect_s"], opts["replace_s"], opts["resume_s"])
    spares = opts["hot_spares"]
    result = model.estimate(run, failures, recovery, checkpoint=checkpoint, pricing=pricing, hot_spare_nodes=spares)
    scenarios, skipped = model.what_if(run, failures, recovery, checkpoint=checkpoint, pricing=pricing,
                                       hot_spare_nodes=spares)
    notes += [f"what-if '{s.description}' left out: {s.reason}" for s in skipped]
    if checkpoint is not None:
        note = _first_order_note(run, failures, recovery, checkpoint, spares, result.wall_hours)
        if note:
            notes.append(note)
    if not pricing.given:
        notes.append("no --gpu-hour-cost or --node-hour-cost: costs are not computed")
    out = result.as_dict()
    badput_hours = out.pop("badput_hours")
    ranges = None
    if ends is not None and checkpoint is not None:
        # preflight's predicted checkpoint times are ranges: the waste they cost, at both ends of them
        low, high = (model.estimate(run, failures, recovery, pricing=pricing, hot_spare_nodes=spares,
                                    checkpoint=model.CheckpointPolicy(checkpoint.interval_s, c)) for c in ends)
        ranges = {key: sorted((getattr(low, key), getattr(high, key)))
                  for key in ("wall_hours", "wasted_hours", "goodput", "wasted_fraction_of_plan")}
        ranges["badput"] = {f"{name}_hours": sorted((low.badput_hours[name], high.badput_hours[name]))
                            for name in badput_hours}
        if low.wasted_cost_usd is not None and high.wasted_cost_usd is not None:
            ranges["wasted_cost_usd"] = sorted((low.wasted_cost_usd, high.wasted_cost_usd))
    return {
        "command": "goodput",
        "params": run.params,
        "tokens": run.tokens,
        "compute_flops": run.compute_flops,
        "gpus": run.gpus,
        "gpus_per_node": run.gpus_per_node,
        "nodes": run.nodes,
        "peak_flops_per_gpu": run.peak_flops,
        "mfu": run.mfu,
        "gpu_hour_cost_usd": pricing.gpu_hour_usd,
        "node_hour_cost_usd": pricing.node_hour_usd,
        "cluster_hour_cost_usd": pricing.cluster_hour_usd(run),
        "mtbf_s": failures.mtbf_s,
        "failure_source": failures.source,
        "detect_s": recovery.detect_s,
        "replace_s": recovery.replace_s,
        "resume_s": recovery.resume_s,
        "checkpoint_s": (cost.persist_s if cost.is_async else cost.stall_s) if cost else None,
        "stall_s": cost.stall_s if cost else None,
        "persist_s": cost.persist_s if cost else None,
        "interference": cost.interference if cost else None,
        **out,
        "badput": {f"{name}_hours": hours for name, hours in badput_hours.items()},
        # --from a preflight: each quantity at both ends of the predicted checkpoint times' ranges
        "ranges": ranges,
        "what_if": [s.as_dict() for s in scenarios],
        "notes": notes,
        "defaults": defaults,
        "assumptions": [f"default {d['option']} {d['shown']}: {d['source']}" for d in defaults]
        + [line.strip() for line in EXPLAIN.splitlines() if line.strip()],
        "units": UNITS,
    }


def _first_order_note(
    run: model.TrainingRun, failures: FailureModel, recovery: model.Recovery, checkpoint: model.CheckpointPolicy,
    spares: int, wall_hours: float,
) -> str | None:
    """The exact model's wall time when the first-order accounting may be off, or ``None``.

    Said when ``(interval + checkpoint + recovery) / MTBF`` passes :data:`FIRST_ORDER_NOTE_RATIO` and the
    two differ by at least half a percent (a note that says "off by 0 %" only confuses). Its advice
    follows the exact optimum: checkpoint more often only when the optimum is shorter than yours.
    """
    ratio = model.first_order_ratio(run, failures, recovery, checkpoint, spares)
    if ratio <= FIRST_ORDER_NOTE_RATIO:
        return None
    exact_h = model.exact_wall_hours(run, failures, recovery, checkpoint, spares)
    gap_pct = 100 * (exact_h / wall_hours - 1)
    if abs(gap_pct) < 0.5:
        return None
    note = (f"(checkpoint interval + checkpoint + recovery) / MTBF = {ratio:.2f}, above {FIRST_ORDER_NOTE_RATIO:g}: "
            f"the first-order lost-work accounting is off here; the exact model gives {exact_h:,.0f} wall hours "
            f"({gap_pct:+.0f} % against {wall_hours:,.0f})")
    best_s = model.optimal_interval_s(checkpoint.cost, failures.mtbf_s)
    if abs(best_s / checkpoint.interval_s - 1) > 0.01:
        direction = "more" if best_s < checkpoint.interval_s else "less"
        note += f"; its optimum is to checkpoint {direction} often, every {format_duration(best_s)}"
    return note


# -- output ----------------------------------------------------------------------------------------

_LABELS = {
    "checkpoint_stall": "checkpoint stalls",
    "lost_progress": "lost progress (since last checkpoint)",
    "detection": "detection",
    "replacement": "replacement",
    "restart_restore": "restart and restore",
}


def usd(amount: float | None) -> str:
    """``$1.23M``, ``$456k``, ``$789``; ``-`` for ``None``."""
    if amount is None:
        return "-"
    sign = "-" if amount < 0 else ""
    amount = abs(amount)
    if amount >= 1e6:
        return f"{sign}${amount / 1e6:,.2f}M"
    if amount >= 1e3:
        return f"{sign}${amount / 1e3:,.0f}k"
    return f"{sign}${amount:,.0f}"


def _print_human(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from ckptbench.cli.render import stdout_console

    console = stdout_console()
    rate = doc["cluster_hour_cost_usd"]
    console.print(
        f"[bold]Run[/bold]: {doc['params'] / 1e9:.4g}B params x {doc['tokens'] / 1e12:.4g}T tokens = "
        f"{doc['compute_flops']:.3g} FLOPs on {doc['gpus']:,} GPUs ({doc['nodes']:,} nodes) at "
        f"{doc['peak_flops_per_gpu'] / 1e12:g} TFLOP/s x {pct(doc['mfu'], 0)} MFU",
    )
    console.print(
        f"[bold]Failures[/bold]: {doc['faults_per_day']:.3g} per day, MTBF {format_duration(doc['mtbf_s'])} "
        f"({doc['failure_source']}); each costs "
        f"detect {_duration(doc['detect_s'])} + replace {_duration(doc['replace_s'])} + resume "
        f"{_duration(doc['resume_s'])}"
        + (f" + lost work (checkpoint every {format_duration(doc['checkpoint_interval_s'])}, "
           f"{format_duration(doc['checkpoint_s'])} each)" if doc["includes_checkpointing"] else ""),
    )
    if doc["defaults"]:
        taken = ", ".join(f"{d['option']} {d['shown']}" for d in doc["defaults"])
        console.print(f"[bold]Defaults[/bold]: {taken} [dim](sources: --format json 'defaults')[/dim]")
    console.print()
    planned = doc["planned_hours"]
    table = Table(title="Where the time goes")
    table.add_column("")
    table.add_column("hours", justify="right")
    table.add_column("% of plan", justify="right")
    table.add_column("cost", justify="right")
    table.add_row("planned compute", f"{planned:,.0f}", "100.0 %", usd(doc["planned_cost_usd"]))
    ranges = doc.get("ranges") or {}  # over the predicted checkpoint times (--from a preflight)

    def one_decimal(hours: float) -> str:
        return f"{hours:,.1f}"

    for name, label in _LABELS.items():
        hours = doc["badput"][f"{name}_hours"]
        if hours or name not in ("checkpoint_stall", "lost_progress"):
            table.add_row(f"  {label}", with_range(one_decimal(hours), ranges.get("badput", {}).get(f"{name}_hours"),
                                                   one_decimal),
                          pct(hours / planned), usd(hours * rate if rate else None))
    if doc["hot_spare_nodes"]:
        table.add_row(f"  {doc['hot_spare_nodes']} hot spare node(s), idle", "", "", usd(doc["spare_cost_usd"]))
    wasted = with_range(one_decimal(doc["wasted_hours"]), ranges.get("wasted_hours"), one_decimal)
    table.add_row("[bold]wasted[/bold]", f"[bold]{wasted}[/bold]",
                  f"[bold]{pct(doc['wasted_fraction_of_plan'])}[/bold]", f"[bold]{usd(doc['wasted_cost_usd'])}[/bold]")
    table.add_row("wall time", with_range(f"{doc['wall_hours']:,.0f}", ranges.get("wall_hours"), lambda h: f"{h:,.0f}"),
                  pct(doc["wall_hours"] / planned), usd(doc["total_cost_usd"]))
    console.print(table)
    goodput = with_range(pct(doc["goodput"]), ranges.get("goodput"), pct)
    console.print(f"goodput {goodput} (productive / wall time); {doc['faults']:.0f} faults expected; "
                  f"{doc['wall_hours'] / 24:.1f} days instead of {planned / 24:.1f}")
    if ranges:
        console.print("[dim](ranges: the same run at both ends of the checkpoint times preflight predicted)[/dim]")
    console.print()

    whatif = Table(title="What if")
    whatif.add_column("scenario")
    whatif.add_column("wall hours", justify="right")
    whatif.add_column("saved hours", justify="right")
    whatif.add_column("extra cost", justify="right")
    whatif.add_column("net saving", justify="right")
    for s in doc["what_if"]:
        whatif.add_row(s["description"], f"{s['wall_hours']:,.0f}", f"{s['saved_hours']:,.1f}",
                       usd(s["extra_cost_usd"]), usd(s["net_saving_usd"]))
    console.print(whatif)
    for note in doc["notes"]:
        console.print(f"[dim]note: {note}[/dim]")
    console.print()
    console.print(takeaway(doc))


def _duration(seconds: float) -> str:
    """``format_duration``, but a cost of nothing reads ``0`` (not ``0 µs``)."""
    return format_duration(seconds) if seconds else "0"


def takeaway(doc: dict[str, Any]) -> str:
    """One sentence a manager can act on."""
    priced = doc["wasted_cost_usd"] is not None
    what = "failures and checkpoints" if doc["includes_checkpointing"] else "failures"
    sentence = (f"The run takes {doc['wall_hours'] / 24:.1f} days instead of {doc['planned_hours'] / 24:.1f}: "
                f"{what} waste {doc['wasted_hours']:,.0f} hours ({pct(doc['wasted_fraction_of_plan'])} of the plan"
                + (f", {usd(doc['wasted_cost_usd'])}" if priced else "") + ")")
    key = "net_saving_usd" if priced else "saved_hours"
    useful = [s for s in doc["what_if"] if (s[key] or 0) > 0]
    if not useful:
        return sentence + "; none of the what-ifs here would pay for itself."
    best = max(useful, key=lambda s: s[key])
    gain = f"{best['saved_hours']:,.0f} hours"
    if priced:
        gain += f" and {usd(best['net_saving_usd'])} net"
        if best["extra_cost_usd"] and best["extra_cost_usd"] > 0:
            gain += f" after {usd(best['extra_cost_usd'])} of idle spares"
    return sentence + f". Biggest lever: {best['description']}, which saves {gain}."
