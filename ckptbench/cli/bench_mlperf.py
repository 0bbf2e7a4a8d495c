"""``ckptbench bench --mlperf MODEL``: MLPerf Storage v2.0's checkpointing workload (``bench.mlperf``), its
subset mode on this host: the first ``--ranks`` ranks of the model's layout as processes started here,
each writing its share; writes, the page cache dropped, then reads; reported in ckptbench's units and MLPerf's."""

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


def bench_mlperf(name: str, target: str, *, ranks: int | None, scale: float | None, repeat: int, warmup: int,
                 output_format: str, plot_path: Path | None, output_dir: Path | None,
                 storage_options: dict[str, str]) -> None:
    """Validate, then run the subset with ``run_local_ranks`` and add the ``mlperf`` figures to its document."""
    from ckptbench.bench.mlperf import LAYOUT_MODEL, WORKLOADS, figures

    workload = WORKLOADS[name]
    ranks = min(DEFAULT_RANKS, workload.ranks) if ranks is None else ranks
    if not 2 <= ranks <= workload.ranks:
        raise UsageError(f"--ranks {ranks}: {name} has {workload.ranks} ranks; this host runs 2 to {workload.ranks} "
                         "of them")
    size = round(workload.subset_bytes(ranks) * (1.0 if scale is None else scale))
    if size < ranks:
        raise UsageError(f"--scale {scale:g} leaves less than a byte per rank", hint="use a larger --scale")
    output = open_output(output_dir, "bench-mlperf")

    def run(progress: Any) -> _Result:
        from ckptbench.bench.local_ranks import run_local_ranks

        progress.phase(f"MLPerf {name}: {ranks} ranks writing {format_size(size)} x {repeat}, then reading")
        document = run_local_ranks(target, ranks=ranks, size_bytes=size, model=LAYOUT_MODEL, repeat=repeat,
                                   warmup=warmup, timeout_s=RANKS_TIMEOUT_S, storage_options=storage_options)
        document["mlperf"] = figures(document, workload, ranks, 1.0 if scale is None else scale)
        return _Result(document)

    from ckptbench.cli.launch import _plot

    run_and_emit(run, output=output, plot_path=plot_path, output_format=output_format, plot=_plot,
                 print_tables=lambda report, doc: _print(doc))


def _print(document: dict[str, Any]) -> None:
    print_distributed_tables(document)
    m = document["mlperf"]
    w = m["workload"]
    console = stdout_console()
    console.print(
        f"[bold]MLPerf Storage v2.0 checkpointing, {w['name']}[/]: {m['mode']} mode, {m['ranks_run']} of "
        f"{w['ranks']} ranks on this host (TP{w['tp']} x PP{w['pp']} x DP{w['dp']}, ZeRO-{w['zero_stage']}; "
        f"checkpoint {format_size(w['checkpoint_bytes'])}), {format_size(m['bytes_per_run'])} per checkpoint here")
    for op in ("write", "read"):
        f = m[op]
        console.print(f"  {op}: [bold]{f['gib_per_s']:.2f} GB/s (GiB/s)[/] as MLPerf reports it = {f['gbps']:.2f} GB/s "
                      f"(1e9 B/s); mean of {len(f['runs_duration_s'])} runs, each the slowest rank's "
                      f"{format_duration(f['duration_s'])} on average")
    if not m["comparable"]:
        click.secho(f"  scaled to {m['scale']:g} of the subset's bytes: not comparable with a submission", fg="yellow")
