"""``ckptbench bench`` under a distributed launch (torchrun, srun): every rank runs the command, each
saves and loads its share of the checkpoint at once; rank 0 prints and writes the result.

    torchrun --nproc-per-node 8 --nnodes 4 --rdzv-endpoint node0:29500 \\
        -m ckptbench bench /mnt/lustre/ckpt --workload checkpoint --model llama3-70b --scale 0.1
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ckptbench.checkpoint.distributed import Launch, detect_launch
from ckptbench.cli.render import open_output, run_and_emit, stdout_console
from ckptbench.errors import UsageError
from ckptbench.units import format_size, range_text

#: Options that only mean something under a launch, by parameter name -> flag.
LAUNCH_ONLY = {"dp": "--dp", "tp": "--tp", "pp": "--pp", "zero": "--zero"}
SHARDING_CHOICES = ("none", "zero1", "zero2", "zero3", "fsdp")
DEFAULT_SHARDING = "fsdp"


def launch_from_environment() -> Launch | None:
    """The launch this process is part of (2+ ranks), else None."""
    launch = detect_launch()
    return launch if launch is not None and launch.distributed else None


def parallelism_for(world_size: int, dp: int | None, tp: int | None, pp: int | None, zero: str | None) -> Any:
    """``--dp/--tp/--pp/--zero`` completed for a launch of ``world_size`` ranks: dp takes what tp x pp leave."""
    from ckptbench.model.sizing import Parallelism

    tp, pp = tp or 1, pp or 1
    if dp is None:
        if world_size % (tp * pp):
            raise UsageError(f"--tp {tp} x --pp {pp} does not divide the launch's {world_size} ranks",
                             hint="pick tp and pp whose product divides the number of processes")
        dp = world_size // (tp * pp)
    return Parallelism(dp=dp, tp=tp, pp=pp, sharding=zero or DEFAULT_SHARDING)


def bench_under_launch(launch: Launch, target: str, given: set[str], *, size: int, threads: list[int], repeat: int,
                       warmup: int, output_format: str, plot_path: Path | None, output_dir: Path | None, model: str | None,
                       scale: float | None, writers: list[str] | None, storage_options: dict[str, str], force: bool,
                       dp: int | None, tp: int | None, pp: int | None, zero: str | None, default_model: str,
                       device: str = "cpu") -> None:
    """The checkpoint workload on every rank at once; rank 0 prints, writes --output and --plot."""
    # c10d logs its own view of every failure (socket timeouts, peers gone) in C++ on stderr; ours
    # names the rank and the fix in one line. Set TORCH_CPP_LOG_LEVEL to see theirs too.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from ckptbench.bench.shootout_launched import DistributedBenchSpec, plan, run_distributed_bench
    from ckptbench.checkpoint.distributed import current_world, leave_world
    from ckptbench.storage import resolve_target

    if writers and list(writers) != ["ckptbench"]:
        raise UsageError("under a distributed launch only the ckptbench writer runs (each rank writes its share "
                         "through the distributed save)", hint="drop --writers")
    if {"scale", "size"} <= given:
        raise UsageError("give --scale or --size, not both")
    if "threads" in given and len(threads) != 1:
        raise UsageError("--threads takes one value with --workload checkpoint (each rank's writer threads)")
    spec = DistributedBenchSpec(
        model=default_model if model is None else model, scale=scale, size_bytes=None if scale is not None else size,
        parallelism=parallelism_for(launch.world_size, dp, tp, pp, zero), repeat=repeat, warmup=warmup,
        threads=threads[0] if "threads" in given else None, device=device)
    storage = resolve_target(target, storage_options, force=force)
    plan(spec, launch.world_size)  # a bad layout or model fails here, before any rank waits for another
    world = current_world()
    if world is None:  # the environment said 2+ ranks; current_world agrees or raised
        raise UsageError("this launch has a single process")
    try:
        with world.step("the benchmark"):  # a rank that fails tells the others why before it leaves
            if not world.is_first:
                run_distributed_bench(spec, storage, world)
                return
            run_and_emit(
                lambda progress: run_distributed_bench(spec, storage, world, progress=progress),
                output=open_output(output_dir, "bench-distributed"), plot_path=plot_path, output_format=output_format,
                plot=plot_distributed_bench, print_tables=lambda report, doc: print_distributed_tables(doc))
    finally:
        leave_world()


def plot_distributed_bench(document: dict[str, Any], path: Path) -> None:
    """A distributed bench document's figure (``bench`` under a launch, ``bench --mlperf``) to ``path``."""
    from ckptbench.report.distributed_plot import plot_distributed

    plot_distributed(document, path)


def print_distributed_tables(document: dict[str, Any]) -> None:
    """Aggregate per operation, then every rank's save in the median round (slowest first)."""
    from rich.table import Table

    from ckptbench.report.distributed_plot import median_round, timeline_ranks
    from ckptbench.storage.s3_pacing import Counts, summary_text

    console = stdout_console()
    workload, spec, launch = document["workload"], document["spec"], document["launch"]
    par = spec["parallelism"]
    console.print(f"[bold]{launch['world_size']} ranks[/bold] on {len(set(document['hosts']))} host(s) -> "
                  f"{document['target']}: {workload['model']} x{workload['scale']:.3g}, "
                  f"{format_size(workload['total_bytes'])} in all, split dp {par['dp']} x tp {par['tp']} x "
                  f"pp {par['pp']} ({par['sharding']}); per rank {format_size(min(document['rank_bytes']))}"
                  f"–{format_size(max(document['rank_bytes']))}")
    table = Table(title="aggregate (MLPerf Storage: all ranks' bytes / slowest rank's time)")
    for column in ("operation", "GB/s median", "min–max", "slowest rank time", "rank spread", "overhead",
                   "async stall"):
        table.add_column(column, justify="left" if column == "operation" else "right")
    names = {"save": "durable save", "load": "cold load", "async": "async save"}
    for op, s in document["summary"].items():
        stall = f"{s['stall_s']['median'] * 1e3:.1f} ms" if "stall_s" in s else ""
        table.add_row(names[op], f"{s['gbps']['median']:.2f}", range_text(s["gbps"]),
                      f"{s['duration_s']['median']:.3f} s", f"{s['rank_spread']['median']:.0%}",
                      f"{s['overhead_s']['median'] * 1e3:.1f} ms", stall)
    console.print(table)
    for op, s in document["summary"].items():
        if s.get("s3_requests"):  # every rank's S3 requests, every measured round
            click.echo(f"{names[op]}, all ranks: {summary_text(Counts(**s['s3_requests']))}")
    round_ = median_round(document["rounds"]["save"])
    ranks = Table(title=f"save round {round_['round']} (the median one), per rank")
    for column in ("rank", "host", "bytes", "own work", "returned", "waited for others"):
        ranks.add_column(column, justify="right" if column not in ("host",) else "left")
    for span in timeline_ranks(round_["ranks"]):
        ranks.add_row(str(span["rank"]), span["host"], format_size(span["bytes"]), f"{span['io_s']:.3f} s",
                      f"{span['end_s']:.3f} s", f"{span['barrier_s'] * 1e3:.1f} ms")
    console.print(ranks)
    click.echo("overhead = barrier-to-barrier on rank 0 minus the slowest rank's own work (plan, stage, write / "
               "read): the agreement, lock, commit and barriers")
    ranks_memory = (document.get("memory") or {}).get("ranks") or []
    if ranks_memory:
        worst = max(ranks_memory, key=lambda r: (r["peak_rss_bytes"] - r["baseline_rss_bytes"]) / max(1, r["share_bytes"]))
        click.echo(f"host memory: peak RSS {format_size(worst['peak_rss_bytes'])} on rank {worst['rank']} for its "
                   f"{format_size(worst['share_bytes'])} share, "
                   f"{(worst['peak_rss_bytes'] - worst['baseline_rss_bytes']) / max(1, worst['share_bytes']):.2f} "
                   f"shares above the {format_size(worst['baseline_rss_bytes'])} it held before")
