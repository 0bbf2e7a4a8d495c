"""``ckptbench bench --mlperf MODEL``: MLPerf Storage v2.0's checkpointing workload (``bench.mlperf``) run with
its procedure (``bench.mlperf_launched``): every write, the page cache dropped once, every read.

Under torchrun/srun every launched rank is one of MLPerf's ranks and writes that rank's share: a launch of the
table's rank count is MLPerf's ``default`` mode, a smaller one its ``subset`` mode (the first ranks of the
layout), a larger one is refused. Without a launcher, ``--ranks`` processes started here run the subset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ckptbench.cli.launch import print_distributed_tables
from ckptbench.cli.render import open_output, run_and_emit, stdout_console
from ckptbench.errors import UsageError
from ckptbench.units import format_duration, format_size

#: Processes of the subset by default: MLPerf's node-local mode runs a host's GPUs, 8 on the usual node.
DEFAULT_RANKS = 8
#: A run of the real sizes can take hours: the ranks are waited for this long at most.
RANKS_TIMEOUT_S = 7 * 86400.0


class _Result:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def to_dict(self) -> dict[str, Any]:
        return self.document


def bench_mlperf(name: str, target: str, *, launch: Any, ranks: int | None, scale: float | None, writes: int,
                 reads: int, output_format: str, plot_path: Path | None, output_dir: Path | None,
                 storage_options: dict[str, str], force: bool) -> None:
    """Validate, then run the procedure on this launch's ranks, or on ``ranks`` processes started here."""
    from ckptbench.bench.mlperf import WORKLOADS, MlperfProcedure, rank_workload, run_shape

    workload = WORKLOADS[name]
    procedure = MlperfProcedure(writes=writes, reads=reads)
    if scale is not None and not 0 < scale <= 1:
        raise UsageError(f"--scale {scale:g} must be in (0, 1]: the fraction of every rank's MLPerf bytes")
    if launch is not None:
        if ranks is not None:
            raise UsageError(f"--ranks {ranks}: under a launch every launched rank runs (this one has "
                             f"{launch.world_size})", hint="drop --ranks, or launch that many ranks")
        ranks = launch.world_size
    else:
        ranks = min(DEFAULT_RANKS, workload.ranks) if ranks is None else ranks
        if not 2 <= ranks <= workload.ranks:
            raise UsageError(f"--ranks {ranks}: {name} has {workload.ranks} ranks; this host runs 2 to "
                             f"{workload.ranks} of them")
    run_shape(workload, ranks)  # more ranks than the workload's: refused here, before any rank waits
    if any(not rank_workload(workload, r, scale or 1.0).tensors for r in range(ranks)):
        raise UsageError(f"--scale {scale:g} leaves a rank nothing to write", hint="use a larger --scale")
    if launch is not None:
        _under_launch(workload, target, scale or 1.0, procedure, output_format=output_format, plot_path=plot_path,
                      output_dir=output_dir, storage_options=storage_options, force=force)
        return
    output = open_output(output_dir, "bench-mlperf")
    args = ["bench", target, "--mlperf", name, "--scale", repr(scale or 1.0), "--num-checkpoints-write",
            str(writes), "--num-checkpoints-read", str(reads), "--json"]
    args += [a for key, value in storage_options.items() for a in ("--storage-option", f"{key}={value}")]
    args += ["--force"] if force else []

    def run(progress: Any) -> _Result:
        from ckptbench.bench.local_ranks import run_ranks_here

        progress.phase(f"MLPerf {name}: {ranks} ranks here, {writes} writes, then {reads} cold reads")
        return _Result(run_ranks_here(args, target=target, ranks=ranks, timeout_s=RANKS_TIMEOUT_S))

    from ckptbench.cli.launch import plot_distributed_bench

    run_and_emit(run, output=output, plot_path=plot_path, output_format=output_format, plot=plot_distributed_bench,
                 print_tables=lambda report, doc: _print(doc))


def _under_launch(workload: Any, target: str, scale: float, procedure: Any, *, output_format: str,
                  plot_path: Path | None, output_dir: Path | None, storage_options: dict[str, str],
                  force: bool) -> None:
    """Every launched rank runs the procedure; rank 0 adds the MLPerf figures, prints and writes the files."""
    import os

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # one line per failure: ours (cli/launch.py)
    from ckptbench.bench.mlperf import figures
    from ckptbench.bench.mlperf_launched import run_mlperf
    from ckptbench.checkpoint.distributed import current_world, leave_world
    from ckptbench.cli.launch import plot_distributed_bench
    from ckptbench.storage import resolve_target

    storage = resolve_target(target, storage_options, force=force)
    world = current_world()
    if world is None:
        raise UsageError("this launch has a single process")
    try:
        with world.step("the benchmark"):
            if not world.is_first:
                run_mlperf(workload, scale, procedure, storage, world)
                return

            def run(progress: Any) -> _Result:
                document = run_mlperf(workload, scale, procedure, storage, world, progress=progress).to_dict()
                document["mlperf"] = figures(document, workload, world.world_size, scale, procedure)
                return _Result(document)

            run_and_emit(run, output=open_output(output_dir, "bench-mlperf"), plot_path=plot_path,
                         output_format=output_format, plot=plot_distributed_bench, print_tables=lambda report, doc: _print(doc))
    finally:
        leave_world()


def _print(document: dict[str, Any]) -> None:
    print_distributed_tables(document)
    m = document["mlperf"]
    w, p = m["workload"], m["procedure"]
    ranks = m["rank_bytes"]
    console = stdout_console()
    console.print(
        f"[bold]MLPerf Storage v2.0 checkpointing, {w['name']}[/]: {m['what_ran']} (TP{w['tp']} x PP{w['pp']} x "
        f"DP{w['dp']}, ZeRO-{w['zero_stage']}; checkpoint {format_size(w['checkpoint_bytes'])}); "
        f"{format_size(m['bytes_per_run'])} per checkpoint here, per rank {format_size(min(ranks))}"
        + (f"–{format_size(max(ranks))}" if max(ranks) != min(ranks) else ""))
    console.print(f"  {p['num_checkpoints_write']} writes, then the page cache dropped once, then "
                  f"{p['num_checkpoints_read']} reads")
    for op in ("write", "read"):
        f = m[op]
        console.print(f"  {op}: [bold]{f['gib_per_s']:.2f} GB/s (GiB/s)[/] as MLPerf reports it = {f['gbps']:.2f} GB/s "
                      f"(1e9 B/s); mean of {len(f['runs_duration_s'])} checkpoints, each the slowest rank's "
                      f"{format_duration(f['duration_s'])} on average")
    if not m["comparable"]:
        click.secho(f"  scaled to {m['scale']:g} of MLPerf's bytes per rank (a test/dev run): not comparable "
                    "with a submission", fg="yellow")
