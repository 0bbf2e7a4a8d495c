"""``ckptbench interval``: how often to checkpoint, given what a checkpoint costs and how often the job fails.

Also the home of the output helpers ``goodput`` shares (``emit``, ``UNITS``); the option groups both
share are in ``cli/options.py``. Nothing here imports torch; numpy is imported only by ``--simulate`` (through
:mod:`ckptbench.model.simulate`) and matplotlib only by ``--plot``, when they run.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ckptbench.cli import formats, params
from ckptbench.cli.formats import format_options
from ckptbench.cli.options import (
    FAILURE_RATE,
    async_options,
    failure_options,
    flags_override_config,
    from_result_option,
    is_set,
    measured_from,
    named,
    resolve_cost,
    resolve_failures,
    resolve_local_loss,
)
from ckptbench.errors import UsageError
from ckptbench.model import interval as model
from ckptbench.model import sizing
from ckptbench.model.failures import SECONDS_PER_DAY, FailureModel
from ckptbench.model.interference import ASSUMED
from ckptbench.units import format_duration, format_rate, format_size

if TYPE_CHECKING:
    from ckptbench.model.twolevel import TwoLevelAnalysis, TwoLevelCost

log = logging.getLogger(__name__)

#: What the key suffixes of every JSON document mean.
UNITS: dict[str, str] = {
    "_s": "seconds",
    "_bytes": "bytes",
    "_bytes_per_s": "bytes per second",
    "_hours": "hours",
    "_usd": "US dollars",
    "_fraction, waste_fraction*, goodput": "fraction of wall-clock time (0..1)",
    "overhead_fraction*": "checkpoint cost per unit of compute time",
    "first_order_waste": "wasted time per unit of useful compute, first-order formula",
    "wasted_fraction_of_plan": "wasted hours / planned hours",
    "interference": "fraction of training throughput lost while persisting",
    "failures_per_day, faults_per_day": "failures of the whole job per day",
    "local_loss": "fraction of failures that lose the failed node's local (level-1) copy",
    "every": "local checkpoints per checkpoint of that level (1 = each one)",
}

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

EXPLAIN = """\
How `ckptbench interval` computes (all times in seconds; M = MTBF of the whole job, R = restart,
tau = the interval = training compute between two checkpoints):

Failures are exponential (Poisson) in wall-clock time, independent of what the job is doing, and
may strike while computing, checkpointing or restarting. A failure loses everything since the
newest durable checkpoint; a failure during a restart starts the restart over.

Synchronous checkpoints (C = the blocking checkpoint time):
  Young (1974)       tau = sqrt(2 C M)                                   first order in C/M
  Daly (2006)        tau = sqrt(2CM) [1 + (1/3) sqrt(C/2M) + (1/9)(C/2M)] - C   (C < 2M; else M)
  exact optimum      minimises Daly's full model T_w = M e^(R/M) (e^((tau+C)/M) - 1) T_s / tau,
                     found numerically; it does not depend on R.

Asynchronous checkpoints (s = stall, P = persist, f = interference, at most one in flight):
  first order        waste(tau) = (s + fP)/tau + (tau/2 + s + P + R)/M,  optimum sqrt(2 (s + fP) M)
  exact              Daly's model with C = s + fP and R + (1 - f)P: a failure before the newest
                     snapshot is durable falls back to the previous one.
  constraint         the next checkpoint may not start before the previous one is durable:
                     tau + s + fP >= s + P, i.e. tau >= (1 - f) P. When the optimum is shorter, the
                     bound is the answer and the output says what it costs.
  Young and Daly rows use C = s + fP.

Reported:
  waste fraction     expected share of wall time that is not useful compute (exact model):
                     1 - tau / E[cycle],  E[cycle] = M e^((R + (1-f)P)/M) (e^((tau + s + fP)/M) - 1)
  overhead fraction  checkpoint cost per unit of compute: (s + fP) / tau  (C / tau when synchronous)
  lost per failure   (tau + s + fP)/2 + (1 - f)P of wall time, first order ((tau + C)/2 when synchronous)
  cluster MTBF       M = M_unit / N for N GPUs (or nodes), or 1 day / faults per day, or a published
                     run's days / interruptions scaled by GPU count.

The Monte Carlo simulator (ckptbench.model.simulate) reproduces the exact model within sampling
error; the first-order forms are off by terms of order (tau + C + R)/M. Real failures are burstier
than exponential (Weibull shape < 1); the simulator accepts Weibull shapes, the formulas do not.

Two levels (--remote-ckpt-time D, --local-loss q, --restart R1, --remote-restart R2):
  schedule           a local checkpoint every tau (cost c1 = s + fP, as above); every k-th, once
                     durable locally, is drained to the remote tier in the background in D (training
                     cost c2 = f2 D, f2 = the interference; the remote copy lags by (1 - f2) D). A drain
                     must end before the next starts: k (tau + c1) + c2 >= D.
  failures           rate 1/M; a share q loses the failed node's local copy and restarts from the
                     newest remote copy (R2), the rest from the newest local one (R1).
  exact model        a group of k segments of tau + c1 (the last + c2); a local failure costs
                     r1 = R1 + (1-f)P and its segment again, a loss failure r2 = R2 + (1-f)P + (1-f2)D
                     and the whole group again; restarts can fail. With L the Laplace transform of the
                     group's time under local failures alone, at q/M:
                     E[group] = (1/L - 1) (M/q + M (e^(r2/M) - 1)),  waste = 1 - k tau / E[group],
                     minimised numerically over tau and the integer k.
  first order        Benoit et al. (2017): H = (c1 + c2/k)/tau + (1-q)/M (tau/2 + r1) + q/M (k tau/2 + r2),
                     optimum tau = sqrt(2 c1 M/(1-q)), k tau = sqrt(2 c2 M/q), overhead
                     sqrt(2 c1 (1-q)/M) + sqrt(2 c2 q/M) + restarts: the k-level sum of sqrt(2 lambda_l C_l).
  single level       the best remote-only schedule: stall s, persist D (sync: D blocking), restart R2.
                     With q = 1 it wins (a local tier only costs); with q = 0 the answer is local-only.
  ties               intervals within 0.1 percentage point of the minimum waste form the plateau; values
                     of k whose best waste is that close are reported as tied. A two-level schedule is
                     recommended only when it beats remote-only by more than that.
  --peer-replica     each local copy also in a peer's memory (Gemini): a loss failure loses it only if
                     the peer also loses a node within R1; node losses independent and even over N nodes:
                     q' = q (1 - e^(-q R1 / (M N))).
  --local-loss llama3  283 of Llama 3's 419 unexpected interruptions took a node out (configs/failures).
"""


def emit(doc: dict[str, Any], opts: dict[str, Any], print_human: Callable[[dict[str, Any]], None], explain: str,
         csv_rows: Callable[[dict[str, Any]], tuple[Any, Any]]) -> None:
    """The commands' common ending: the document in ``--format`` (json, csv), or the tables then, with
    ``--explain``, the formulas."""
    if opts["output_format"] != "table":
        formats.emit(doc, opts["output_format"], print_human, csv_rows)
        return
    print_human(doc)
    if opts["explain"]:
        click.echo()
        click.echo(explain, nl=False)


#: ``--format csv``: one row per interval (Young's, Daly's, the exact optimum, the round one recommended, yours).
CSV_COLUMNS = ("interval", "interval_s", "waste_fraction", "overhead_fraction")


def _overhead_at(doc: dict[str, Any], interval_s: float | None) -> float | None:
    """The checkpoint overhead at ``interval_s`` (at the shortest interval allowed when below it), as the
    table shows it."""
    if interval_s is None or doc.get("blocking_s") is None:
        return None
    return doc["blocking_s"] / max(interval_s, doc.get("min_interval_s") or 0.0)


def csv_rows(doc: dict[str, Any]) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    found = [
        {"interval": "young", "interval_s": doc["young_interval_s"], "waste_fraction": doc["waste_fraction_young"],
         "overhead_fraction": _overhead_at(doc, doc["young_interval_s"])},
        {"interval": "daly", "interval_s": doc["daly_interval_s"], "waste_fraction": doc["waste_fraction_daly"],
         "overhead_fraction": _overhead_at(doc, doc["daly_interval_s"])},
        {"interval": "optimum", "interval_s": doc["optimal_interval_s"], "waste_fraction": doc["waste_fraction"],
         "overhead_fraction": doc["overhead_fraction_at_optimum"]},
        {"interval": "recommended", "interval_s": doc["recommended_interval_s"]},
    ]
    if doc.get("interval_s") is not None:
        found.append({"interval": "yours", "interval_s": doc["interval_s"],
                      "waste_fraction": doc["waste_fraction_at_interval"],
                      "overhead_fraction": doc["overhead_fraction"]})
    return CSV_COLUMNS, [row for row in found if row["interval_s"] is not None]



def pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f} %"


# -- the command ---------------------------------------------------------------------------------

#: The options that each give the checkpoint cost (click names).
_COST = ("ckpt_time", "size", "params", "model")
#: Options that serve only others (for :func:`flags_override_config`).
_SERVING: dict[str, tuple[str, ...]] = {
    "gpus": ("gpu_mtbf", "failures"), "nodes": ("node_mtbf",), "bandwidth": ("size", "params", "model"),
    **dict.fromkeys(("dtype", "optimizer", "weights_only", "master_weights", "grads", "dp", "tp", "pp", "sharding"),
                    ("params", "model")),
}



@click.command(context_settings=_CONTEXT)
@click.option("--ckpt-time", type=params.BOUNDED_DURATION, default=None,
              help="Time to write one checkpoint: 140s (with --stall: the persist time).")
@click.option("--size", type=params.FINITE_SIZE, default=None,
              help="Checkpoint size (with --bandwidth): 140GB, 1.2TiB.")
@click.option("--params", type=params.FINITE_COUNT, default=None,
              help="Model parameters (with --bandwidth): 70B. Sized by the recipe flags below.")
@click.option("--model", metavar="PRESET", default=None,
              help="A model preset from configs/models instead of --params: llama3-70b.")
@click.option("--bandwidth", type=params.FINITE_RATE, default=None,
              help="Aggregate write bandwidth to storage: 1GB/s, 800MiB/s, 10Gbit/s.")
@from_result_option("the write rate, and async stall and persist where measured (a preflight result also "
                    "gives the node's checkpoint bytes and, unless typed, the job's failure rate and restart),")
@click.option("--dtype", type=click.Choice(sorted(sizing.DTYPE_BYTES)), default=None,
              help="Weights dtype  [default: bf16].")
@click.option("--optimizer", type=click.Choice(sorted(sizing.OPTIMIZER_BYTES)), default=None,
              help="Optimizer state saved: adam (m+v fp32, 8 B/param), sgd (4), none  [default: adam].")
@click.option("--weights-only", is_flag=True, default=False, help="Save the weights alone.")
@click.option("--master-weights/--no-master-weights", default=None,
              help="fp32 master weights (4 B/param)  [default: yes unless the weights are fp32].")
@click.option("--grads", is_flag=True, default=False, help="Also save fp32 gradients (4 B/param).")
@click.option("--dp", type=params.POSITIVE_INT, default=None, help="Data-parallel ranks (for bytes per rank).")
@click.option("--tp", type=params.POSITIVE_INT, default=None, help="Tensor-parallel ranks.")
@click.option("--pp", type=params.POSITIVE_INT, default=None, help="Pipeline-parallel ranks.")
@click.option("--sharding", type=click.Choice(sizing.SHARDING), default=None,
              help="Data-parallel sharding: zero1 (optimizer), zero2 (+grads), zero3/fsdp (+weights).")
@async_options
@failure_options(with_count=True)
@click.option("--restart", type=params.BOUNDED_DURATION_OR_ZERO, default=None,
              help="Cost of one failure before training resumes (detect, replace, reload): 10m  [default: 0].")
@click.option("--every", type=params.BOUNDED_DURATION, default=None,
              help="Evaluate this interval (training time between checkpoints): 30m.")
@click.option("--remote-ckpt-time", type=params.BOUNDED_DURATION, default=None,
              help="Two levels: time to drain one local checkpoint to the remote tier, in the background: 10m.")
@click.option("--remote-restart", type=params.BOUNDED_DURATION_OR_ZERO, default=None,
              help="Two levels: restart from the remote tier  [default: --restart + --remote-ckpt-time].")
@click.option("--local-loss", metavar="FRACTION|PRESET", default=None,
              help="Two levels: share of failures that lose the node's local copy: 30%, or a failure preset "
                   "that gives it (llama3)  [default: the --failures preset's].")
@click.option("--remote-every", type=params.POSITIVE_INT, default=None,
              help="Two levels: with --every, evaluate a remote copy every this many local checkpoints.")
@click.option("--peer-replica", is_flag=True, default=False,
              help="Two levels, what-if: each local copy also in a peer node's memory (needs --nodes).")
@click.option("--plot", type=params.OUTPUT_FILE, default=None,
              help="Write a PNG of waste versus interval, optimum and --every marked.")
@click.option("--simulate", type=params.POSITIVE_INT, default=None,
              help="Check the model with this many Monte Carlo runs (at the optimum and at --every): 10000.")
@click.option("--work", type=params.BOUNDED_DURATION, default=None,
              help="Simulated run: compute time to finish  [default: 30d].")
@click.option("--weibull-shape", type=params.FINITE_POSITIVE_NUMBER, default=None,
              help="Simulated failures: Weibull shape (1 = exponential; < 1 bursty)  [default: the preset's, or 1].")
@click.option("--seed", type=params.NONNEGATIVE_INT, default=None, help="Simulation RNG seed  [default: 0].")
@format_options
@click.option("--explain", is_flag=True, help="Print the formulas and their assumptions.")
def interval(**opts: Any) -> None:
    """The optimal checkpoint interval (Young, Daly, exact; sync or async) and the waste at yours.

    \b
    Checkpoint cost, one of:
      --ckpt-time 140s | --size 140GB --bandwidth 1GB/s | --params 70B --bandwidth 1GB/s
    Failure rate, one of (optional: without it only the checkpoint overhead is computed):
      --mtbf 3h | --gpus 16384 --gpu-mtbf 50000h | --failures llama3 | --faults-per-day 2
    Async checkpoints: --stall 1s --persist 60s [--interference 5%]
    Two levels (local every interval, every k-th also drained to remote):
      --remote-ckpt-time 10m --local-loss 30% [--remote-restart 20m] [--peer-replica --nodes 64]

    \b
    Example: ckptbench interval --size 140GB --bandwidth 1GB/s --mtbf 3h --restart 10m --every 1h
    """
    flags_override_config(opts, FAILURE_RATE, _COST, ("persist", *_COST), serving=_SERVING)
    opts = named(opts)
    cost_given = any(opts[k] is not None for k in ("ckpt_time_s", "size_bytes", "param_count", "model_preset",
                                                   "stall_s", "persist_s"))
    if opts["explain"] and not cost_given and opts["output_format"] == "table":
        click.echo(EXPLAIN, nl=False)
        return
    doc = compute(opts)
    if opts["plot_path"] is not None:
        _plot(doc, opts["plot_path"])
    emit(doc, opts, _print_human, EXPLAIN, csv_rows)


def compute(opts: dict[str, Any]) -> dict[str, Any]:
    """Everything the command reports, as the JSON document (raises ``UsageError`` on bad combinations)."""
    notes: list[str] = []
    measured = None
    if opts.get("from_result") is not None:
        measured = measured_from(opts["from_result"])
        for flag, key in (("--bandwidth", "bandwidth_bytes_per_s"), ("--ckpt-time", "ckpt_time_s")):
            if opts[key] is not None:
                raise UsageError(f"--from and {flag} both give the checkpoint speed", hint="give one of them")
        opts = {**opts, "bandwidth_bytes_per_s": measured.write_bps}
        if all(opts[k] is None for k in ("size_bytes", "param_count", "model_preset")):
            if measured.node_bytes is None:
                raise UsageError(f"--from {opts['from_result']} gives rates, not the checkpoint's bytes",
                                 hint="add --size (the bytes one node writes) or --params/--model")
            opts["size_bytes"] = measured.node_bytes
        notes.append(f"from {measured.describe()}")
    size_info = _checkpoint_bytes(opts)
    bandwidth = opts["bandwidth_bytes_per_s"]
    write_flag = "--ckpt-time"
    write_s = opts["ckpt_time_s"]
    if size_info is not None:
        write_flag = "--size" if opts["size_bytes"] is not None else "--params"
        write_s = size_info["checkpoint_bytes"] / bandwidth
        low, high = params.DURATION_RANGE_S
        if not low <= write_s <= high:
            raise UsageError(
                f"{write_flag} gives {size_info['checkpoint_bytes']:.3g} bytes, which at --bandwidth "
                f"{bandwidth:.3g} bytes/s take {write_s:.3g} s to write: outside the 1 ns to {high:.0e} s "
                "the model takes",
            )
    stall_s, persist_s, interference = opts["stall_s"], opts["persist_s"], opts["interference"]
    if (measured is not None and measured.staging_bps is not None and measured.persist_bps is not None
            and stall_s is None and persist_s is None and size_info is not None):
        stall_s = size_info["checkpoint_bytes"] / measured.staging_bps
        persist_s = size_info["checkpoint_bytes"] / measured.persist_bps
        write_s = None
        if interference is None:
            interference = measured.interference
    cost = resolve_cost(write_s, write_flag, stall_s=stall_s, persist_s=persist_s, interference=interference)
    if cost is None:
        raise UsageError(
            "give the checkpoint cost: --ckpt-time 140s, --size 140GB --bandwidth 1GB/s, "
            "or --params 70B --bandwidth 1GB/s",
        )
    peer_nodes = opts["nodes"] if opts.get("peer_replica") and opts["node_mtbf_s"] is None else None
    failures = resolve_failures(
        mtbf_s=opts["mtbf_s"], gpu_mtbf_s=opts["gpu_mtbf_s"], node_mtbf_s=opts["node_mtbf_s"],
        faults_per_day=opts["faults_per_day"], failure_preset=opts["failure_preset"],
        gpus=opts["gpus"], nodes=None if peer_nodes is not None else opts["nodes"], count_given=True,
    )
    restart_s = opts["restart_s"] or 0.0
    job = measured.job if measured is not None and size_info is not None and opts["size_bytes"] == measured.node_bytes \
        else None  # a preflight's job, where its own checkpoint is the one asked about
    if job is not None and failures is None:
        failures = job.failure_model(opts['from_result'])
    if job is not None and opts["restart_s"] is None and failures is not None:
        restart_s = job.restart_s
        notes.append(f"restart {format_duration(restart_s)} from {opts['from_result']}: the job's restart plus the "
                     "restore that preflight predicted")
    every_s = opts["every_s"]
    if opts["restart_s"] is None and failures is not None and not restart_s:
        notes.append("no --restart given: restarts assumed free, so the waste is a lower bound")
    if failures is not None and restart_s > failures.mtbf_s:
        notes.append(
            f"--restart {format_duration(restart_s)} is longer than the MTBF ({format_duration(failures.mtbf_s)}): "
            "most restarts are themselves interrupted and start over, so restarts dominate the waste; recover "
            "faster (hot spares, quicker detection and restore) before tuning the interval",
        )
    if every_s is not None and every_s < cost.blocking_s:
        notes.append(
            f"--every {format_duration(every_s)} is shorter than the checkpoint itself "
            f"({format_duration(cost.blocking_s)} of blocked training): checkpoints would cost "
            f"{pct(model.overhead_fraction(every_s, cost), 0)} of compute time; checkpoint less often",
        )
    doc: dict[str, Any] = {
        "command": "interval",
        "mode": "async" if cost.is_async else "sync",
        "checkpoint_bytes": size_info["checkpoint_bytes"] if size_info else None,
        "bandwidth_bytes_per_s": bandwidth,
        "sizing": size_info["sizing"] if size_info else None,
        "checkpoint_s": cost.persist_s if cost.is_async else cost.stall_s,
        "stall_s": cost.stall_s,
        "persist_s": cost.persist_s,
        "interference": cost.interference,
        "interference_source": None if not cost.is_async else (
            "given (--interference)" if opts["interference"] is not None else
            f"from {opts['from_result']}" if interference is not None else ASSUMED.source),
        "blocking_s": cost.blocking_s,
        "min_interval_s": cost.min_interval_s,
        "mtbf_s": None,
        "failures_per_day": None,
        "failure_source": None,
        "restart_s": restart_s,
        "ranges": None,
    }
    result_keys = [f.name for f in model.IntervalAnalysis.__dataclass_fields__.values()]
    if opts["simulate_runs"] is None:
        for flag, key in (("--work", "work_s"), ("--weibull-shape", "weibull_shape"), ("--seed", "seed")):
            if opts[key] is not None:
                raise UsageError(f"{flag} applies only with --simulate")
    elif opts["simulate_runs"] < 2:
        raise UsageError(f"--simulate {opts['simulate_runs']}: runs must be >= 2 (one run has no spread to report)")
    doc["simulation"] = None
    if failures is None:
        for flag, key in (("--plot", "plot_path"), ("--simulate", "simulate_runs")):
            if opts[key] is not None:
                raise UsageError(f"{flag} needs a failure rate (--mtbf, --gpus with --gpu-mtbf, or --failures)")
        doc |= {k: None for k in result_keys if k not in doc}
        doc |= {"optimal_interval_plateau_s": None, "recommended_interval_s": None}
        if every_s is not None:
            doc["interval_s"] = every_s
            doc["overhead_fraction"] = model.overhead_fraction(every_s, cost)
        notes.append(
            "no failure rate given: only the checkpoint overhead is computed; a failure rate (--mtbf, "
            "--gpus with --gpu-mtbf, --failures) adds the optimal interval, lost work and total waste",
        )
    else:
        if opts["plot_path"] is not None and not opts["plot_path"].name.lower().endswith(".png"):
            notes.append(f"--plot {opts['plot_path'].name}: written as PNG whatever the extension")
        analysis = model.analyse(cost, failures.mtbf_s, restart_s, every_s)
        doc |= analysis.as_dict()
        low, high = model.optimum_plateau(cost, failures.mtbf_s, restart_s)
        doc |= {"optimal_interval_plateau_s": [low, high],
                "recommended_interval_s": model.round_interval_s(low, high, analysis.optimal_interval_s)}
        doc |= {"failures_per_day": failures.faults_per_day, "failure_source": failures.source}
        doc["ranges"] = _predicted_ranges(opts, job, cost, failures, restart_s)
        if opts["simulate_runs"] is not None:
            doc["simulation"] = _simulate(opts, cost, failures, restart_s, analysis)
        if analysis.constraint_binding:
            notes.append(
                f"the one-in-flight bound binds: the optimum {format_duration(analysis.exact_interval_s)} is "
                f"shorter than (1 - f) P = {format_duration(cost.min_interval_s)}, which costs "
                f"{pct(analysis.constraint_cost_fraction, 2)} of wall time; a shorter persist (faster storage) lifts it",
            )
    doc["two_level"] = _two_level(opts, cost, failures, restart_s, notes)
    doc["notes"] = notes
    doc["assumptions"] = [line.strip() for line in EXPLAIN.splitlines() if line.strip()]
    doc["units"] = UNITS
    return doc


def _predicted_ranges(opts: dict[str, Any], job: Any, cost: model.CheckpointCost, failures: FailureModel,
                      restart_s: float) -> dict[str, list[float]] | None:
    """--from a preflight, about its own job: the optimum and its waste at the fast and the slow end of the
    checkpoint times (and the restart, where it came from the file) that preflight predicted as ranges; None
    otherwise. A typed --interference or --restart replaces that prediction: it has no range then."""
    if job is None or opts["stall_s"] is not None or opts["persist_s"] is not None:
        return None  # a typed stall or persist is another cost than the one preflight predicted
    ends = job.cost_ends(opts["interference"])
    if ends is None or ends[0].is_async != cost.is_async:
        return None
    restarts = job.ranges.get("restart_s") if opts["restart_s"] is None else None
    restarts = restarts or (restart_s, restart_s)
    found = [model.analyse(c, failures.mtbf_s, r, opts["every_s"]) for c, r in zip(ends, restarts, strict=True)]
    out = {"blocking_s": sorted(c.blocking_s for c in ends), "restart_s": sorted(restarts),
           "optimal_interval_s": sorted(a.optimal_interval_s for a in found),
           "waste_fraction": sorted(a.waste_fraction for a in found)}
    if opts["every_s"] is not None:
        out["waste_fraction_at_interval"] = sorted(a.waste_fraction_at_interval for a in found)
    return out


#: The two-level options (code names) and their flags: any of them asks for the two-level answer.
_TWO_LEVEL = (("--remote-ckpt-time", "remote_ckpt_time_s"), ("--remote-restart", "remote_restart_s"),
              ("--local-loss", "local_loss"), ("--remote-every", "remote_every"), ("--peer-replica", "peer_replica"))


def _two_level(
    opts: dict[str, Any], cost: model.CheckpointCost, failures: FailureModel | None, restart_s: float,
    notes: list[str],
) -> dict[str, Any] | None:
    """The two-level answer (``None`` without ``--remote-ckpt-time``); notes on its assumptions go to ``notes``."""
    from ckptbench.model import twolevel

    given = [flag for flag, key in _TWO_LEVEL if is_set(opts.get(key))]
    if opts.get("remote_ckpt_time_s") is None:
        if given:
            raise UsageError(f"{given[0]} applies only to two levels: add --remote-ckpt-time (the drain of one "
                             "local checkpoint to the remote tier)")
        return None
    if failures is None:
        raise UsageError("two levels need a failure rate (--mtbf, --gpus with --gpu-mtbf, --failures)")
    if opts.get("remote_every") is not None and opts["every_s"] is None:
        raise UsageError("--remote-every applies with --every (the local interval it evaluates)")
    q, q_source = resolve_local_loss(opts.get("local_loss"), opts["failure_preset"])
    drain_s = opts["remote_ckpt_time_s"]
    drain_f = cost.interference if cost.is_async else ASSUMED.point
    if not cost.is_async:
        notes.append(f"the drain to the remote tier runs in the background at an assumed interference of "
                     f"{drain_f:.0%} ({ASSUMED.source})")
    remote_restart = opts.get("remote_restart_s")
    if remote_restart is None:
        remote_restart = restart_s + drain_s
        notes.append(f"no --remote-restart given: assumed --restart + --remote-ckpt-time = "
                     f"{format_duration(remote_restart)} (reading the checkpoint back at the drain's rate)")
    peer: dict[str, Any] | None = None
    if opts.get("peer_replica"):
        if opts["nodes"] is None:
            raise UsageError("--peer-replica needs --nodes (the node count over which node losses spread)")
        q_peer = twolevel.peer_replica_loss(q, failures.mtbf_s, opts["nodes"], restart_s)
        peer = {"nodes": opts["nodes"], "local_loss_without_replica": q, "window_s": restart_s}
        notes.append(f"--peer-replica: a failure loses the checkpoint only if the peer holding its replica also "
                     f"loses a node within the local restart ({format_duration(restart_s)}): local loss "
                     f"{q:.3g} becomes {q_peer:.3g}; the replica's cost must be in the local stall and persist")
        q, q_source = q_peer, f"{q_source}, with a peer replica"
    notes.append("two levels: the top-level single-level fields describe the local checkpoint with every failure "
                 "restarting locally; two_level holds the answer with local losses")
    two = twolevel.TwoLevelCost(cost, drain_s, drain_f, restart_s, remote_restart, q)
    analysis = twolevel.analyse(two, failures.mtbf_s, opts["every_s"], opts.get("remote_every"))
    if analysis.every is not None and analysis.interval_s <= two.min_interval_s(analysis.every) * (1 + 1e-9) and (
            two.min_interval_s(analysis.every) > cost.min_interval_s):
        notes.append(f"the drain bound binds: a drain of {format_duration(drain_s)} every {analysis.every} local "
                     f"checkpoint(s) must end before the next starts, so the interval is at least "
                     f"{format_duration(analysis.interval_s)}; a faster remote tier lifts it")
    local = {"name": "local", "interval_s": analysis.interval_s, "every": 1}
    remote_level = {"name": "remote", "interval_s": None if analysis.every is None else analysis.every *
                    analysis.interval_s, "every": analysis.every}
    remote_only = [{"name": "remote", "interval_s": analysis.single_level_interval_s, "every": 1}]
    levels = remote_only if analysis.schedule == "remote-only" else [local, remote_level]
    if analysis.schedule == "local-only":
        notes.append("no failure loses the local copy (--local-loss 0): restarts never read the remote tier, so "
                     "its period is free (drain as often as durability beyond the job needs)")
    out: dict[str, Any] = {
        "schedule": analysis.schedule,
        "levels": levels,
        "waste_fraction": analysis.single_level_waste_fraction if analysis.schedule == "remote-only"
        else analysis.waste_fraction,
        "single_level_waste_fraction": analysis.single_level_waste_fraction,
        "two_level_schedule": {
            "levels": [local, remote_level], "waste_fraction": analysis.waste_fraction,
            "interval_plateau_s": list(analysis.interval_plateau_s),
            "recommended_interval_s": analysis.recommended_interval_s,
            "every_tied": list(analysis.every_tied) if analysis.every_tied else None,
            "first_order_overhead": analysis.first_order_overhead,
        },
        "remote_only_schedule": {
            "levels": remote_only, "waste_fraction": analysis.single_level_waste_fraction,
            "recommended_interval_s": analysis.single_level_recommended_interval_s,
            "stall_s": two.remote_only().stall_s, "persist_s": two.remote_only().persist_s,
            "restart_s": remote_restart,
        },
        "benoit": None if analysis.benoit is None else dataclasses.asdict(analysis.benoit),
        "local_loss": q,
        "local_loss_source": q_source,
        "peer_replica": peer,
        "remote_ckpt_s": drain_s,
        "drain_interference": drain_f,
        "local_restart_s": restart_s,
        "remote_restart_s": remote_restart,
        "at_interval": analysis.at_interval,
        "simulation": None,
    }
    if opts["simulate_runs"] is not None:
        out["simulation"] = _simulate_two_level(opts, two, failures, analysis)
    return out


def _simulate_two_level(
    opts: dict[str, Any], two: TwoLevelCost, failures: FailureModel, analysis: TwoLevelAnalysis,
) -> dict[str, Any] | None:
    """Monte Carlo runs of the best two-level schedule next to the exact model (``None`` when local-only)."""
    from ckptbench.model.simulate_twolevel import TwoLevelSimulationConfig, simulate

    if analysis.every is None:
        return None
    work_s = opts["work_s"] or 30 * SECONDS_PER_DAY
    shape = opts["weibull_shape"] if opts["weibull_shape"] is not None else failures.weibull_shape
    seed = opts["seed"] if opts["seed"] is not None else 0
    config = TwoLevelSimulationConfig(work_s, analysis.interval_s, analysis.every, two, failures.mtbf_s,
                                      weibull_shape=shape, runs=opts["simulate_runs"], seed=seed)
    result = simulate(config)
    expected = config.expected_wall_s()
    return {
        "runs": config.runs, "seed": seed, "work_s": config.simulated_work_s, "weibull_shape": shape,
        "interval_s": config.interval_s, "every": config.every,
        "waste_fraction": result.waste_fraction, "stderr_waste_fraction": result.stderr_waste_fraction,
        "mean_wall_s": result.mean_wall_s, "stderr_wall_s": result.stderr_wall_s,
        "model_waste_fraction": 1.0 - config.simulated_work_s / expected,
        # against the exponential model: meaningful only for exponential failures
        "z_score": result.z_score() if result.stderr_wall_s > 0 and shape == 1.0 else None,
        "failures_per_run": float(result.failures.mean()),
        "remote_restarts_per_run": float(result.remote_restarts.mean()),
    }


def _simulate(
    opts: dict[str, Any], cost: model.CheckpointCost, failures: FailureModel, restart_s: float,
    analysis: model.IntervalAnalysis,
) -> dict[str, Any]:
    """Monte Carlo runs at the optimum (and at --every) next to the exact model's expectation.

    Both configurations are validated (including their size) before either runs.
    """
    from ckptbench.model.simulate import SimulationConfig, simulate

    work_s = opts["work_s"] or 30 * SECONDS_PER_DAY
    shape = opts["weibull_shape"] if opts["weibull_shape"] is not None else failures.weibull_shape
    seed = opts["seed"] if opts["seed"] is not None else 0
    out: dict[str, Any] = {"runs": opts["simulate_runs"], "seed": seed, "work_s": work_s, "weibull_shape": shape}
    points = {"at_optimum": analysis.optimal_interval_s}
    if analysis.interval_s is not None:
        points["at_interval"] = analysis.interval_s
    configs = {
        name: SimulationConfig(work_s, tau, cost, failures.mtbf_s, restart_s, weibull_shape=shape,
                               runs=opts["simulate_runs"], seed=seed)
        for name, tau in points.items()
    }
    for name, config in configs.items():
        result = simulate(config)
        expected = config.expected_wall_s()
        out[name] = {
            "interval_s": config.used_interval_s,
            "mean_wall_s": result.mean_wall_s,
            "stderr_wall_s": result.stderr_wall_s,
            "waste_fraction": result.waste_fraction,
            "model_wall_s": expected,
            "model_waste_fraction": 1.0 - work_s / expected,
            "failures_per_run": float(result.failures.mean()),
            "breakdown_s": result.breakdown_s(),
        }
    return out


def _checkpoint_bytes(opts: dict[str, Any]) -> dict[str, Any] | None:
    """Bytes from --size or from --params/--model and the recipe; ``None`` for --ckpt-time (or nothing)."""
    from ckptbench.model import presets

    ways = [flag for flag, key in (("--ckpt-time", "ckpt_time_s"), ("--size", "size_bytes"),
                                   ("--params", "param_count"), ("--model", "model_preset")) if opts[key] is not None]
    if len(ways) > 1:
        raise UsageError(f"{ways[0]} and {ways[1]} both give the checkpoint cost", hint="give one of them")
    recipe_flags = [flag for flag, given in (
        ("--dtype", opts["dtype"] is not None), ("--optimizer", opts["optimizer"] is not None),
        ("--weights-only", opts["weights_only"]), ("--master-weights", opts["master_weights"] is not None),
        ("--grads", opts["grads"]), ("--dp", opts["dp"] is not None), ("--tp", opts["tp"] is not None),
        ("--pp", opts["pp"] is not None), ("--sharding", opts["sharding"] is not None),
    ) if given]
    sized_by_params = opts["param_count"] is not None or opts["model_preset"] is not None
    if recipe_flags and not sized_by_params:
        raise UsageError(f"{recipe_flags[0]} applies only with --params or --model")
    if opts["bandwidth_bytes_per_s"] is not None and not (sized_by_params or opts["size_bytes"] is not None):
        raise UsageError("--bandwidth needs --size or --params (the bytes it divides)")
    if not (sized_by_params or opts["size_bytes"] is not None):
        return None
    if opts["bandwidth_bytes_per_s"] is None:
        what = "--size" if opts["size_bytes"] is not None else ways[0]
        raise UsageError(f"{what} needs --bandwidth to turn bytes into a checkpoint time")
    if opts["size_bytes"] is not None:
        return {"checkpoint_bytes": opts["size_bytes"], "sizing": None}
    if opts["weights_only"]:
        for flag, given in (("--optimizer", opts["optimizer"] is not None), ("--grads", opts["grads"]),
                            ("--master-weights", bool(opts["master_weights"]))):
            if given:
                raise UsageError(f"--weights-only and {flag} contradict each other", hint="give one of them")
    shape = presets.load_model(opts["model_preset"]) if opts["model_preset"] is not None else None
    params_count = shape.params if shape is not None else opts["param_count"]
    recipe = sizing.TrainingRecipe(
        weights_dtype=opts["dtype"] or "bf16", optimizer=opts["optimizer"] or "adam",
        master_weights=opts["master_weights"], gradients=opts["grads"], weights_only=opts["weights_only"],
    )
    layout = sizing.Parallelism(dp=opts["dp"] or 1, tp=opts["tp"] or 1, pp=opts["pp"] or 1,
                                sharding=opts["sharding"] or "none")
    size = sizing.checkpoint_size(params_count, recipe, layout)
    info = size.as_dict() | {"model": shape.name if shape else None}
    return {"checkpoint_bytes": size.total_bytes, "sizing": info}


# -- output ----------------------------------------------------------------------------------------


def _cost(doc: dict[str, Any]) -> model.CheckpointCost:
    return model.CheckpointCost(doc["stall_s"], doc["persist_s"], doc["interference"])


def _plot(doc: dict[str, Any], path: Path) -> None:
    if doc["two_level"] is not None:
        from ckptbench.model import twolevel
        from ckptbench.report.twolevel_plot import plot_two_level_waste

        two = doc["two_level"]
        cost = twolevel.TwoLevelCost(_cost(doc), two["remote_ckpt_s"], two["drain_interference"],
                                     two["local_restart_s"], two["remote_restart_s"], two["local_loss"])
        plot_two_level_waste(path, cost, doc["mtbf_s"], two)
        return
    from ckptbench.report.waste_plot import plot_waste_curve

    plot_waste_curve(path, _cost(doc), doc["mtbf_s"], doc["restart_s"], doc)


def _print_human(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from ckptbench.cli.render import stdout_console

    console = stdout_console()
    asynchronous = doc["mode"] == "async"
    inputs = Table(title="Inputs", show_header=False, box=None, pad_edge=False)
    inputs.add_column(style="bold")
    inputs.add_column()
    if doc["checkpoint_bytes"] is not None:
        sized = doc["sizing"]
        what = format_size(doc["checkpoint_bytes"])
        if sized:
            what += f" ({sized['params'] / 1e9:.4g}B params, {sized['recipe']['description']})"
        inputs.add_row("checkpoint size", what)
        if sized and sized["ranks"] > 1:
            inputs.add_row("per rank", f"up to {format_size(sized['per_rank_max_bytes'])} "
                                       f"({sized['writer_ranks']} of {sized['ranks']} ranks write)")
        inputs.add_row("bandwidth", format_rate(doc["bandwidth_bytes_per_s"]))
    if asynchronous:
        inputs.add_row("async checkpoint", f"stall {format_duration(doc['stall_s'])}, persist "
                       f"{format_duration(doc['persist_s'])}, interference {pct(doc['interference'])}")
        inputs.add_row("blocking cost", f"{format_duration(doc['blocking_s'])} per checkpoint (s + fP)")
        inputs.add_row("shortest interval", f"{format_duration(doc['min_interval_s'])} (one checkpoint in flight)")
    else:
        inputs.add_row("checkpoint time", f"{format_duration(doc['checkpoint_s'])} (blocking)")
    if doc["mtbf_s"] is not None:
        inputs.add_row("job MTBF", f"{format_duration(doc['mtbf_s'])} ({doc['failures_per_day']:.3g} failures/day; "
                                   f"{doc['failure_source']})")
        inputs.add_row("restart", _restart_text(doc, doc["restart_s"]))
    console.print(inputs)
    console.print()

    if doc["two_level"] is not None:
        _print_two_level(console, doc)
    elif doc["mtbf_s"] is not None:
        table = Table(title="Checkpoint interval (compute time between checkpoints)")
        table.add_column("method")
        table.add_column("interval", justify="right")
        table.add_column("waste of wall time", justify="right")
        table.add_column("checkpoint overhead", justify="right")
        c_name = "(s + fP)" if asynchronous else "C"

        def clamped(interval_s: float) -> str:
            below = interval_s < doc["min_interval_s"]
            return format_duration(interval_s) + (" (< bound)" if below else "")

        def overhead(interval_s: float) -> str:  # at the interval used: the bound when below it
            return pct(_overhead_at(doc, interval_s), 2)

        table.add_row(f"Young  sqrt(2 {c_name} M)", clamped(doc["young_interval_s"]), pct(doc["waste_fraction_young"], 2),
                      overhead(doc["young_interval_s"]))
        table.add_row("Daly (2006)", clamped(doc["daly_interval_s"]), pct(doc["waste_fraction_daly"], 2),
                      overhead(doc["daly_interval_s"]))
        label = "optimum (exact model)" + (" [bound binds]" if doc["constraint_binding"] else "")
        ranges = doc.get("ranges") or {}
        optimum = with_range(format_duration(doc["optimal_interval_s"]), ranges.get("optimal_interval_s"), format_duration)
        waste = with_range(pct(doc["waste_fraction"], 2), ranges.get("waste_fraction"), lambda v: pct(v, 2))
        table.add_row(f"[bold]{label}[/bold]", f"[bold]{optimum}[/bold]", f"[bold]{waste}[/bold]",
                      pct(doc["overhead_fraction_at_optimum"], 2))
        if doc["interval_s"] is not None:
            table.add_row("yours (--every)", format_duration(doc["interval_s"]),
                          with_range(pct(doc["waste_fraction_at_interval"], 2), ranges.get("waste_fraction_at_interval"),
                                  lambda v: pct(v, 2)), pct(doc["overhead_fraction"], 2))
        console.print(table)
        if ranges:
            console.print("[dim](ranges: at the fast and the slow end of the checkpoint times and restart preflight "
                          "predicted)[/dim]")
        sim = doc["simulation"]
        if sim is not None:
            kind = "exponential" if sim["weibull_shape"] == 1 else f"Weibull k={sim['weibull_shape']:g}"
            console.print()
            console.print(f"Monte Carlo check: {sim['runs']:,} runs of {format_duration(sim['work_s'])} of compute, "
                          f"{kind} failures, seed {sim['seed']}")
            check = Table()
            check.add_column("interval", justify="right")
            check.add_column("model waste (exponential)", justify="right")
            check.add_column("simulated waste", justify="right")
            check.add_column("failures per run", justify="right")
            for name in ("at_optimum", "at_interval"):
                if name in sim:
                    row = sim[name]
                    spread = 100 * row["stderr_wall_s"] * sim["work_s"] / row["mean_wall_s"] ** 2
                    check.add_row(format_duration(row["interval_s"]), pct(row["model_waste_fraction"], 2),
                                  f"{pct(row['waste_fraction'], 2)} ± {spread:.2f}", f"{row['failures_per_run']:.1f}")
            console.print(check)
    elif doc["interval_s"] is not None:
        table = Table(title="Checkpoint overhead")
        table.add_column("interval", justify="right")
        table.add_column("checkpoint overhead", justify="right")
        table.add_row(format_duration(doc["interval_s"]), pct(doc["overhead_fraction"], 2))
        console.print(table)
    for note in doc["notes"]:
        console.print(f"[dim]note: {note}[/dim]")
    console.print()
    console.print(takeaway_two_level(doc["two_level"]) if doc["two_level"] is not None else takeaway(doc))


def with_range(text: str, span: list[float] | None, shown: Callable[[float], str]) -> str:
    """``text`` and the range ``span`` it spans, where it spans one that shows."""
    if not span or shown(span[0]) == shown(span[1]):
        return text
    return f"{text} ({shown(span[0])}–{shown(span[1])})"


def _restart_text(doc: dict[str, Any], seconds: float) -> str:
    """A restart's time as the inputs table shows it; a zero that was not given says so."""
    if seconds:
        return format_duration(seconds)
    return "0" if not any(note.startswith("no --restart given") for note in doc["notes"]) else "0 (not given)"


def _print_two_level(console: Any, doc: dict[str, Any]) -> None:
    """The inputs the two levels add, the single-level versus two-level table and the Monte Carlo check."""
    from rich.table import Table

    two = doc["two_level"]
    inputs = Table(title="Two levels", show_header=False, box=None, pad_edge=False)
    inputs.add_column(style="bold")
    inputs.add_column()
    inputs.add_row("remote drain", f"{format_duration(two['remote_ckpt_s'])} per checkpoint, in the background "
                                   f"(interference {pct(two['drain_interference'])})")
    inputs.add_row("restarts", f"local {_restart_text(doc, two['local_restart_s'])}, remote "
                               f"{format_duration(two['remote_restart_s'])}")
    inputs.add_row("local loss", f"{pct(two['local_loss'], 2)} of failures restart from remote; {two['local_loss_source']}")
    console.print(inputs)
    console.print()
    table = Table(title="Single level versus two levels (exact model)")
    table.add_column("schedule")
    table.add_column("local every", justify="right")
    table.add_column("remote every", justify="right")
    table.add_column("waste of wall time", justify="right")
    remote_only = two["remote_only_schedule"]
    table.add_row("remote only (single level)", "-", format_duration(remote_only["levels"][0]["interval_s"]),
                  pct(remote_only["waste_fraction"], 2))
    best = two["two_level_schedule"]
    local, remote = best["levels"]
    label = "two levels (optimum)"
    if two["schedule"] == "two-level":
        label = f"[bold]{label}[/bold]"
    remote_text = "-" if remote["every"] is None else (
        f"{format_duration(remote['interval_s'])} ({remote['every']} local)")
    table.add_row(label, format_duration(local["interval_s"]), remote_text, pct(best["waste_fraction"], 2))
    benoit = two["benoit"]
    if benoit is not None:
        table.add_row("first order (Benoit et al.)", format_duration(benoit["interval_s"]),
                      f"{format_duration(benoit['every'] * benoit['interval_s'])} ({benoit['every']} local)",
                      f"{pct(benoit['waste_fraction_first_order'], 2)} (exact {pct(benoit['waste_fraction_exact'], 2)})")
    if two["at_interval"] is not None:
        at = two["at_interval"]
        every = "-" if at["every"] is None else f"{format_duration(at['every'] * at['interval_s'])} ({at['every']} local)"
        table.add_row("yours (--every)", format_duration(at["interval_s"]), every, pct(at["waste_fraction"], 2))
    console.print(table)
    sim = two["simulation"]
    if sim is not None:
        kind = "exponential" if sim["weibull_shape"] == 1 else f"Weibull k={sim['weibull_shape']:g}"
        console.print(f"Monte Carlo check of the two-level optimum: {sim['runs']:,} runs of "
                      f"{format_duration(sim['work_s'])} of compute, {kind} failures, seed {sim['seed']}: simulated "
                      f"waste {pct(sim['waste_fraction'], 2)} ± {100 * sim['stderr_waste_fraction']:.2f}, model "
                      f"(exponential) {pct(sim['model_waste_fraction'], 2)}")


def _ordinal(n: int) -> str:
    if n == 1:
        return "one"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def takeaway_two_level(two: dict[str, Any]) -> str:
    """One sentence for two levels: what to run, and what it saves over remote-only checkpoints."""
    best = two["two_level_schedule"]
    remote_only = two["remote_only_schedule"]
    low, high = best["interval_plateau_s"]
    local, remote = best["levels"]
    plateau = (f"local every {format_duration(best['recommended_interval_s'])} (anything from {format_duration(low)} "
               f"to {format_duration(high)} is within {model.PLATEAU_TOLERANCE:.1%} of the optimum)")
    if two["schedule"] == "local-only":
        return (f"No failure loses the local copy, so checkpoint {plateau}: about {pct(best['waste_fraction'])} of wall "
                "time is lost; the remote tier never serves a restart, so drain to it only as often as durability "
                "beyond the job needs.")
    tied = best["every_tied"]
    ties = f" (every {tied[0]} to {tied[1]} are tied)" if tied and tied[0] != tied[1] else ""
    if two["schedule"] == "remote-only":
        return (f"Two levels do not pay here: checkpointing straight to the remote tier every "
                f"{format_duration(remote_only['recommended_interval_s'])} wastes {pct(remote_only['waste_fraction'])}"
                f" of wall time, and the best two-level schedule ({format_duration(local['interval_s'])} local, every "
                f"{_ordinal(remote['every'])} remote) {pct(best['waste_fraction'])}.")
    saved = remote_only["waste_fraction"] - best["waste_fraction"]
    return (f"Checkpoint {plateau} and drain every {_ordinal(remote['every'])} to the remote tier{ties}: about "
            f"{pct(best['waste_fraction'])} of wall time is lost, against {pct(remote_only['waste_fraction'])} "
            f"checkpointing straight to the remote tier ({100 * saved:.1f} points saved).")


def takeaway(doc: dict[str, Any]) -> str:
    """One sentence a team lead can act on."""
    if doc["mtbf_s"] is None:
        if doc["interval_s"] is None:
            return (f"A checkpoint costs {format_duration(doc['blocking_s'])} of training time; add a failure rate "
                    "for the optimal interval, or --every for the overhead of yours.")
        return (f"Checkpointing every {format_duration(doc['interval_s'])} costs {pct(doc['overhead_fraction'])} of "
                "compute in checkpoint stalls; add a failure rate for the optimal interval and the total waste.")
    low, high = doc["optimal_interval_plateau_s"]
    sentence = (f"Checkpoint every {format_duration(doc['recommended_interval_s'])} (anything from "
                f"{format_duration(low)} to {format_duration(high)} wastes within {model.PLATEAU_TOLERANCE:.1%} of "
                f"the optimum {format_duration(doc['optimal_interval_s'])}): about {pct(doc['waste_fraction'])} "
                "of wall time then goes to checkpoints, lost work and restarts")
    if doc["interval_s"] is not None:
        extra = doc["waste_fraction_at_interval"] - doc["waste_fraction"]
        sentence += (f"; every {format_duration(doc['interval_s'])} wastes {pct(doc['waste_fraction_at_interval'])}"
                     f" ({100 * extra:+.1f} points)")
    if doc["constraint_binding"]:
        sentence += (f"; the persist time sets the floor, and faster storage would save "
                     f"{pct(doc['constraint_cost_fraction'])} more")
    return sentence + "."
