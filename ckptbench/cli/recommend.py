"""``ckptbench recommend [RESULT.json ...]``: the settings to use, each with the measurement behind it,
as a TOML snippet and as ``ckptbench.save`` / ``Checkpointer`` / DCP writer arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ckptbench.cli import params
from ckptbench.cli.formats import emit, format_options
from ckptbench.cli.options import failure_options, read_result, resolve_failures
from ckptbench.cli.render import progress_bar, stdout_console
from ckptbench.errors import UsageError
from ckptbench.units import format_duration, format_size

SWEEP_THREADS = (1, 2, 4)
SWEEP_BLOCKS = (2**20, 4 * 2**20, 16 * 2**20)
SWEEP_SIZE = 512 * 2**20


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("results", nargs=-1, type=params.RESULT_FILE)
@click.option("--target", default=None,
              help="With no RESULT files: sweep this directory now (threads 1,2,4 x blocks 1,4,16 MiB, 512 MiB per "
                   "run)  [default: the temporary directory].")
@click.option("--size", type=params.SIZE, default=None,
              help="Bytes per run of the fresh sweep, over 4 files (block sizes larger than a file shrink to it)  "
                   "[default: 512MiB].")
@click.option("--ckpt-size", type=params.FINITE_SIZE, default=None,
              help="Bytes each node writes per checkpoint: with a failure rate, also recommends the interval.")
@failure_options(with_count=True)
@click.option("--restart", type=params.BOUNDED_DURATION, default=None,
              help="Time from a failure to training again, before reloading: 10m  [default: 0].")
@format_options
def recommend(results: tuple[Path, ...], target: str | None, size: int | None, ckpt_size: int | None, restart: float | None,
              output_format: str, **rate: Any) -> None:
    """Settings to use, each with the measurement that justifies it.

    Reads results of `ckptbench bench` (filesystem or s3:// sweeps, --workload checkpoint, under
    torchrun/srun) and `ckptbench preflight`; later files win where two speak about the same setting. With no files it
    runs a short filesystem sweep on --target first. Prints a TOML snippet (reasons as comments) and
    the same settings as arguments to ckptbench.save / Checkpointer, the DCP writers, and as
    CKPTBENCH_* environment knobs.

    \b
    Examples:
      ckptbench recommend results/bench-vm-20261126T042848.json
      ckptbench recommend SWEEP.json PREFLIGHT.json --ckpt-size 140GB --mtbf 6h
      ckptbench recommend --target /mnt/nvme --ckpt-size 140GB --failures llama3 --gpus 1024
    """
    from ckptbench.decide import advice as rec

    documents = [(str(path), read_result(path)) for path in results]
    for where, doc in documents:  # every file checked before any work
        rec.check_schema(doc, where)
    failures = resolve_failures(
        mtbf_s=rate["mtbf"], gpu_mtbf_s=rate["gpu_mtbf"], node_mtbf_s=rate["node_mtbf"],
        faults_per_day=rate["faults_per_day"], failure_preset=rate["failures"], gpus=rate["gpus"],
        nodes=rate["nodes"], count_given=True)
    if (failures is None) != (ckpt_size is None):
        raise UsageError("--ckpt-size and a failure rate (--mtbf, --failures...) go together: both give the interval")
    if (target is not None or size is not None) and documents:
        raise UsageError("--target and --size are for a fresh sweep, when no RESULT files are given")
    if not documents:
        documents.append(_fresh_sweep(target, size or SWEEP_SIZE))
    advice = rec.advice_from_results(documents)
    if failures is not None:
        assert ckpt_size is not None
        advice["interval_s"] = _interval(documents, advice, ckpt_size, failures, restart or 0.0)
    doc = {"schema": "ckptbench.recommendation/1", "sources": [w for w, _ in documents],
           "settings": {k: {"value": a.value, "reason": a.reason} for k, a in advice.items()},
           "toml": rec.as_toml(advice), "code": rec.as_code(advice), "notes": rec.layout_notes(documents, advice)}
    emit(doc, output_format, _print, csv_rows)


#: ``--format csv``: one row per setting.
CSV_COLUMNS = ("setting", "value", "reason")


def csv_rows(doc: dict[str, Any]) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    return CSV_COLUMNS, [{"setting": name, **entry} for name, entry in doc["settings"].items()]


def _print(doc: dict[str, Any]) -> None:
    console = stdout_console()
    console.print(f"[bold]from:[/] {', '.join(doc['sources'])}")
    console.print("[bold]# ckptbench settings (TOML)[/]")
    click.echo(doc["toml"])
    console.print("[bold]# as arguments[/]")
    for line in doc["code"]:
        click.echo(line)
    if doc["notes"]:
        console.print("[bold]# the filesystem's layout[/]")
        for line in doc["notes"]:
            click.echo(f"# {line}")

def _fresh_sweep(target: str | None, size: int) -> tuple[str, dict[str, Any]]:
    import tempfile

    from ckptbench.bench.fs import run_fs_bench
    from ckptbench.cli.bench import fit_block_sizes
    from ckptbench.config import FsBenchSpec
    from ckptbench.storage import resolve_target
    from ckptbench.storage.local_target import LocalDirectory

    storage = resolve_target(target or tempfile.gettempdir(), forceable=False)
    if not isinstance(storage, LocalDirectory):
        raise UsageError("recommend sweeps directories; for s3:// run `ckptbench bench s3://...` and pass its result")
    # Block sizes larger than the files of a small --size shrink to the largest I/O the sweep issues.
    spec = fit_block_sizes(FsBenchSpec(size_bytes=size, files=4, threads=SWEEP_THREADS, block_sizes=SWEEP_BLOCKS,
                                       repeat=2, warmup=1), chosen=False)
    with progress_bar(enabled=True) as progress:
        report = run_fs_bench(spec, storage, progress=progress)
    return f"a fresh sweep of {storage}", report.to_dict()


def _interval(documents: list[tuple[str, dict[str, Any]]], advice: dict[str, Any], ckpt_size: int,
              failures: Any, restart_s: float) -> Any:
    """The interval for ``ckpt_size`` bytes in the mode recommended: async (the measured staging and persist
    rates; the interference a result measured on the training device, else assumed) when ``advice`` says
    async and a result measured it, else sync at the best measured durable write rate. A round value inside
    the optimum's plateau."""
    from ckptbench.decide.advice import Advice, async_rates, device_interference, write_rates
    from ckptbench.model import interval as model
    from ckptbench.model.interference import ASSUMED

    rates = write_rates(documents)
    if not rates:
        raise UsageError("no write rate in these results to turn --ckpt-size into a checkpoint time")
    rate, where = max(rates)
    measured_async = async_rates(documents)
    if "async" in advice and advice["async"].value and measured_async:
        staging_bps, persist_bps, where = measured_async[-1]
        on_device = [(f, w) for w, doc in documents if (f := device_interference(doc)) is not None]
        interference, source = (on_device[-1][0], f"measured on the training device by {on_device[-1][1]}"
                                ) if on_device else (ASSUMED.point, "assumed")
        cost = model.CheckpointCost(ckpt_size / staging_bps, ckpt_size / persist_bps, interference)
        how = (f"{where}: {format_size(ckpt_size)} stall {format_duration(cost.stall_s)} and persist "
               f"{format_duration(cost.persist_s)} async (interference {interference:.1%}, {source})")
    else:
        cost = model.CheckpointCost.sync(ckpt_size / rate)
        how = (f"{where}: {format_size(ckpt_size)} at {rate / 1e9:.2f} GB/s take "
               f"{format_duration(ckpt_size / rate)} sync")
    analysis = model.analyse(cost, failures.mtbf_s, restart_s)
    low, high = model.optimum_plateau(cost, failures.mtbf_s, restart_s)
    chosen = model.round_interval_s(low, high, analysis.optimal_interval_s)
    return Advice("interval_s", max(1, round(chosen)),  # whole seconds, at least one
                  f"{how}; with an MTBF of {format_duration(failures.mtbf_s)} the exact optimum is "
                  f"{format_duration(analysis.optimal_interval_s)} (waste {analysis.waste_fraction:.2%}), within "
                  f"{model.PLATEAU_TOLERANCE:.1%} of it from {format_duration(low)} to {format_duration(high)}")
