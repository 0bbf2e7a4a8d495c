"""``ckptbench bench TARGET``: throughput of a directory with durable writes and cold reads."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

import click

from ckptbench.cli import params
from ckptbench.cli.render import print_warnings, progress_bar, stdout_console
from ckptbench.config import FsBenchSpec
from ckptbench.errors import UsageError
from ckptbench.units import format_size

DEFAULT_SIZE = "1GiB"
DEFAULT_FILES = 8


def _sigterm_as_interrupt() -> None:
    """SIGTERM cleans up like Ctrl-C (scratch files removed) instead of killing mid-write."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _open_output(output_dir: Path | None) -> tuple[Path, IO[str]] | None:
    """Create the result file before the run, so a bad --output fails in a second, not after an hour."""
    if output_dir is None:
        return None
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        path = output_dir / f"bench-{socket.gethostname()}-{stamp}.json"
        return path, path.open("x")
    except OSError as exc:
        raise UsageError(f"--output {str(output_dir)!r} cannot hold a result file: {exc.strerror}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("target", required=False)
@click.option("--size", type=params.SIZE, default=DEFAULT_SIZE, show_default=True,
              help="Bytes written (and read) per run, over all files: 8GiB, 500MB.")
@click.option("--file-size", type=params.SIZE, default=None,
              help="Size of each file (the file count follows from --size). Not with --files.")
@click.option("--files", type=params.POSITIVE_INT, default=None,
              help=f"Number of files (shards) per run  [default: {DEFAULT_FILES}]. Not with --file-size.")
@click.option("--threads", type=params.INT_LIST, default="1,2,4", show_default=True,
              help="I/O threads; a comma list sweeps them: 1,2,4,8.")
@click.option("--block-size", type=params.SIZE_LIST, default="4MiB", show_default=True,
              help="Bytes per pwrite/pread; a comma list sweeps them: 1MiB,4MiB,16MiB.")
@click.option("--schedule", type=params.ListType(click.Choice(["shared", "per-file"])), default="shared",
              show_default=True,
              help="How threads share the work: 'shared' (every thread takes the next block, files in order) or "
                   "'per-file' (each thread streams whole files, like fio numjobs); a comma list sweeps both.")
@click.option("--direct/--buffered", default=True, show_default=True,
              help="O_DIRECT (falls back to buffered+fdatasync where unsupported, and says so) or the page cache.")
@click.option("--fsync/--no-fsync", default=True, show_default=True,
              help="fdatasync each file and fsync the directory inside the timed region (durable writes).")
@click.option("--read/--no-read", default=True, show_default=True, help="Also read the files back, cold.")
@click.option("--repeat", type=params.POSITIVE_INT, default=3, show_default=True, help="Measured runs per configuration.")
@click.option("--warmup", type=params.NONNEGATIVE_INT, default=1, show_default=True,
              help="Discarded runs before measuring each configuration.")
@click.option("--metadata/--no-metadata", default=False, show_default=True,
              help="Also measure the small-file create+write+fsync rate (sharded checkpoints create many files).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document to stdout instead of tables.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also draw the sweep (GB/s per configuration) to this PNG file.")
@click.option("--output", "output_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Directory to write the JSON result file into (created if missing).")
def bench(target: str, size: int, file_size: int | None, files: int | None, threads: list[int],
          block_size: list[int], schedule: list[str], direct: bool, fsync: bool, read: bool, repeat: int, warmup: int,
          metadata: bool, as_json: bool, plot_path: Path | None, output_dir: Path | None) -> None:
    """Measure a directory (local NVMe or a mounted network filesystem) like a checkpoint writer would.

    TARGET defaults to the system's temporary directory (usually /tmp). Every run writes --size bytes over --files files with the native engine, durable by default
    (O_DIRECT + fdatasync inside the timed region), then reads them back cold. Work happens in a
    scratch directory inside TARGET that is removed afterwards, also on Ctrl-C; nothing else is touched.

    \b
    Examples:
      ckptbench bench
      ckptbench bench /mnt/nvme --size 8GiB --threads 1,2,4,8 --block-size 1MiB,4MiB,16MiB
      ckptbench bench /mnt/cephfs --metadata --json > cephfs.json
      ckptbench bench /mnt/nvme --output results/
    """
    import tempfile

    from ckptbench.bench.fs import run_fs_bench
    from ckptbench.storage import resolve_target

    target = target if target is not None else tempfile.gettempdir()

    if file_size is not None and files is not None:
        raise UsageError("give --file-size or --files, not both")
    nfiles = files if files is not None else (-(-size // file_size) if file_size else DEFAULT_FILES)
    spec = FsBenchSpec(
        size_bytes=size, files=nfiles, threads=tuple(threads), block_sizes=tuple(block_size),
        schedules=tuple(dict.fromkeys(schedule)),
        direct=direct, fsync=fsync, read=read, repeat=repeat, warmup=warmup, metadata=metadata,
    )
    storage = resolve_target(target)
    if plot_path is not None and not plot_path.parent.is_dir():
        raise UsageError(f"--plot {str(plot_path)!r}: directory {str(plot_path.parent)!r} does not exist")
    output = _open_output(output_dir)
    _sigterm_as_interrupt()
    try:
        with progress_bar(enabled=True) as progress:
            report = run_fs_bench(spec, storage, progress=progress)
    except BaseException:
        if output is not None:
            output[1].close()
            output[0].unlink(missing_ok=True)
        raise
    document = report.to_dict()
    document["argv"] = ["ckptbench", *sys.argv[1:]]
    text = json.dumps(document, indent=2)
    if output is not None:
        with output[1] as fh:
            fh.write(text + "\n")
    if plot_path is not None:
        from ckptbench.report.sweep import plot_fs_sweep

        plot_fs_sweep(document, plot_path)
    if as_json:
        click.echo(text)
    else:
        _print_tables(report, document)
        if output is not None:
            click.echo(f"result: {os.path.relpath(output[0])}")
        if plot_path is not None:
            click.echo(f"plot: {plot_path}")
    print_warnings(document["warnings"])


def _print_tables(report: Any, document: dict[str, Any]) -> None:
    from rich.table import Table

    from ckptbench.units import format_rate

    console = stdout_console()
    spec = report.spec
    first = report.results[0].write
    mode = ("O_DIRECT" if first.direct_used else "buffered") + (f" + {first.sync}" if first.sync != "none" else "")
    console.print(
        f"[bold]{report.target}[/]  {document['environment']['target']['filesystem']}  ·  "
        f"{format_size(spec.size_bytes)} in {spec.files} files per run  ·  {mode}  ·  "
        f"{spec.repeat} runs (+{spec.warmup} warm-up)  ·  memcpy {format_rate(report.memcpy_bps)}"
    )
    table = Table(title=None, header_style="bold")
    table.add_column("threads", justify="right")
    table.add_column("block", justify="right")
    sweep_schedule = len(spec.schedules) > 1
    if sweep_schedule:
        table.add_column("schedule")
    table.add_column("write GB/s", justify="right")
    table.add_column("min–max", justify="right")
    table.add_column("p10/p90", justify="right")
    table.add_column("p99 op ms", justify="right")
    if spec.read:
        table.add_column("read GB/s", justify="right")
        table.add_column("min–max", justify="right")
        table.add_column("p10/p90", justify="right")
    best = report.best_index
    for i, (result, record) in enumerate(zip(report.results, document["results"], strict=True)):
        w = record["write"]
        row = [str(result.threads), format_size(result.block_size), *([result.schedule] if sweep_schedule else []),
               f"{w['gbps']:.2f}",
               f"{w['summary_gbps']['min']:.2f}–{w['summary_gbps']['max']:.2f}",
               f"{w['summary_gbps']['p10']:.2f}/{w['summary_gbps']['p90']:.2f}",
               f"{w['latency_ms']['p99']:.1f}" if w["latency_ms"] else "-"]
        if spec.read:
            r = record["read"]
            row += [f"{r['gbps']:.2f}", f"{r['summary_gbps']['min']:.2f}–{r['summary_gbps']['max']:.2f}",
                    f"{r['summary_gbps']['p10']:.2f}/{r['summary_gbps']['p90']:.2f}"]
        table.add_row(*row, style="bold green" if i == best and len(report.results) > 1 else None)
    console.print(table)
    b = report.results[best]
    read_text = f", read {b.read.gbps:.2f} GB/s" if b.read else ""
    console.print(f"best: [bold]{b.threads} threads x {format_size(b.block_size)}[/] blocks, {b.schedule}: "
                  f"write {b.write.gbps:.2f} GB/s{read_text}")
    for m in document["metadata"]:
        lat = m["latency_ms"]
        console.print(f"metadata: {m['threads']} thr: {m['ops_per_s']:.0f} files/s "
                      f"({m['files']} x {format_size(m['file_size_bytes'])}, {m['sync']}; p99 {lat['p99']:.2f} ms)")
