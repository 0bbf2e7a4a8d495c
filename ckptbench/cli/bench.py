"""``ckptbench bench TARGET``: throughput of a directory with durable writes and cold reads
(``--workload fs``), or checkpoint writers saving and loading a model-shaped state_dict
(``--workload checkpoint``)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ckptbench import knobs, units
from ckptbench.cli import params
from ckptbench.cli.formats import format_options
from ckptbench.cli.launch import LAUNCH_ONLY, bench_under_launch, launch_from_environment
from ckptbench.cli.options import checked_device
from ckptbench.cli.render import best_or_tied, open_output, run_and_emit, stdout_console
from ckptbench.config import MAX_FILES, FsBenchSpec
from ckptbench.errors import StorageIOError, UsageError
from ckptbench.storage.s3_clients import CLIENTS as S3_CLIENTS
from ckptbench.storage.s3_clients import DEFAULT_CLIENT as S3_DEFAULT_CLIENT
from ckptbench.units import count_text, format_size, percentiles_text, range_text, runs_text

log = logging.getLogger(__name__)

DEFAULT_SIZE = "1GiB"
DEFAULT_FILES = 8
DEFAULT_MODEL = "llama3-8b"
#: Writers ``--writers`` accepts (bench.writers.WRITERS; spelled out so --help needs no import).
WRITER_NAMES = ("ckptbench", "torch", "dcp", "safetensors", "fio", "s3torchconnector")
#: Options of the filesystem workload only, by parameter name -> flag.
FS_ONLY = {"file_size": "--file-size", "files": "--files", "block_size": "--block-size", "schedule": "--schedule",
           "direct": "--direct/--buffered", "fsync": "--fsync/--no-fsync", "read": "--read/--no-read",
           "metadata": "--metadata", "runtime": "--runtime"}
CHECKPOINT_ONLY = {"model": "--model", "scale": "--scale", "writers": "--writers", "device": "--device"}
#: Options of the object-storage sweep only.
OBJECT_ONLY = {"object_size": "--object-size", "concurrency": "--concurrency", "part_size": "--part-size"}
DEFAULT_OBJECT_SIZE = "64MiB"
DEFAULT_CONCURRENCY = "1,8,32"
DEFAULT_PART_SIZE = "16MiB"


def storage_options_from(endpoint_url: str | None, pairs: tuple[str, ...], client: str | None = None) -> dict[str, str]:
    """``--endpoint-url``, ``--client`` and ``--storage-option KEY=VALUE`` (repeatable) as a storage_options dict."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            # The value may be a mistyped credential (secret:VALUE): name no part of it.
            raise UsageError("--storage-option expects KEY=VALUE; one was given without '=' (not shown: it may "
                             "hold a credential)",
                             hint="e.g. --storage-option part_size=32MiB --storage-option max_concurrency=16")
        options[key] = value
    if endpoint_url is not None:
        options["endpoint_url"] = endpoint_url
    if client is not None:
        options["client"] = client
    return options


#: ``--client``: what moves the data on s3:// (storage/s3_clients.py); metadata requests use boto3.
ENDPOINT_URL_OPTION = click.option(
    "--endpoint-url", default=None, metavar="URL",
    help="Object storage: the S3 endpoint (Ceph RGW, MinIO, ...); else AWS_ENDPOINT_URL or AWS's default.")


def storage_option_option(what: str) -> Callable[[Any], Any]:
    """``--storage-option KEY=VALUE`` (repeatable), its help naming ``what`` options a user gives there."""
    return click.option(
        "--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
        help=f"Object storage: an option for the store, repeatable: {what}... Credentials given here never appear "
             "in output or result files; prefer the environment or a profile.")


CLIENT_OPTION = click.option(
    "--client", type=click.Choice(S3_CLIENTS), default=None,
    help="s3://: the S3 client that moves the data: boto3, s3fs (pip install s3fs) or crt (the AWS CRT: pip "
         f"install awscrt)  [default: {S3_DEFAULT_CLIENT}, the fastest measured; see docs/commands/bench.md].")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("target", required=False)
@click.option("--size", type=params.SIZE, default=DEFAULT_SIZE, show_default=True,
              help="Bytes written (and read) per run, over all files: 8GiB, 500MB.")
@click.option("--file-size", type=params.SIZE, default=None,
              help="Size of each file (the file count follows from --size). Not with --files.")
@click.option("--files", type=params.FILES, default=None,
              help=f"Number of files (shards) per run  [default: {DEFAULT_FILES}]. Not with --file-size.")
@click.option("--threads", type=params.THREADS_LIST, default="1,2,4", show_default=True,
              help="I/O threads; a comma list sweeps them: 1,2,4,8.")
@click.option("--block-size", type=params.BLOCK_SIZE_LIST, default="4MiB", show_default=True,
              help="Bytes per pwrite/pread; a comma list sweeps them: 1MiB,4MiB,16MiB.")
@click.option("--schedule", type=params.ListType(click.Choice(["shared", "per-file"])), default=None,
              help="How threads share the work: 'shared' (every thread takes the next block, files in order) or "
                   "'per-file' (each thread streams whole files, like fio numjobs); a comma list sweeps both  "
                   "[default: per-file on a network or FUSE mount, as the checkpoint writer there; else shared].")
@click.option("--direct/--buffered", default=True, show_default=True,
              help="O_DIRECT (falls back to buffered+fdatasync where unsupported, and says so) or the page cache.")
@click.option("--fsync/--no-fsync", default=True, show_default=True,
              help="fdatasync each file and fsync the directory inside the timed region (durable writes).")
@click.option("--read/--no-read", default=True, show_default=True, help="Also read the files back, cold.")
@click.option("--repeat", type=params.RUNS, default=3, show_default=True, help="Measured runs per configuration.")
@click.option("--warmup", type=params.WARMUP_RUNS, default=1, show_default=True,
              help="Discarded runs before measuring each configuration.")
@click.option("--metadata/--no-metadata", default=False, show_default=True,
              help="Also measure the small-file create+write+fsync rate (sharded checkpoints create many files).")
@click.option("--runtime", type=params.RUNTIME, default=None, metavar="DURATION",
              help="Run each configuration for this long instead of once over --size: pass after pass over the "
                   "same --size of files (as fio's time_based), e.g. 60s, 5m. Filesystem sweep only.")
@click.option("--sample-every", "sample_every", type=params.SAMPLE_EVERY, default="1s", show_default=True,
              metavar="DURATION", help="Interval of the bandwidth timeline recorded in every run (JSON, --plot).")
@format_options
@click.option("--plot", "plot_path", type=params.OUTPUT_FILE, default=None,
              help="Also draw the sweep (GB/s per configuration), or with --workload checkpoint the writers' "
                   "shoot-out, to this PNG file.")
@click.option("--output", "output_dir", type=params.OUTPUT_DIR, default=None,
              help="Directory to write the JSON result file into (created if missing).")
@click.option("--workload", type=click.Choice(["fs", "checkpoint"]), default="fs", show_default=True,
              help="'fs': files written and read by the engine (a threads x block-size sweep). 'checkpoint': a "
                   "synthetic model state_dict saved (sync and async) and loaded cold by checkpoint writers.")
@click.option("--model", default=None,
              help=f"Checkpoint workload: the model preset (configs/models) whose tensor shapes it uses  "
                   f"[default: {DEFAULT_MODEL}].")
@click.option("--scale", type=params.FRACTION, default=None,
              help="Checkpoint workload: its size as a fraction of the full model's (0.05 or 5%), instead of --size.")
@click.option("--writers", type=params.ListType(click.Choice(WRITER_NAMES)), default=None,
              help="Checkpoint workload: writers compared in one process, alternating: "
                   f"{','.join(WRITER_NAMES)} (fio: the raw-bytes reference; s3torchconnector: s3:// only; "
                   "on object storage: ckptbench, dcp and torch through s3fs, s3torchconnector)  "
                   "[default: ckptbench].")
@click.option("--device", default=None, metavar="cpu|cuda|cuda:N",
              help="Checkpoint workload: where the state_dict lives while it is saved, and where loads put it. "
                   "cuda measures what training does: device-to-host staging, then the writes; under "
                   "torchrun/srun each rank uses its own GPU (cuda:LOCAL_RANK)  [default: cpu].")
@click.option("--object-size", type=params.SIZE_LIST, default=None,
              help=f"s3:// sweep: object sizes; a comma list sweeps them  [default: {DEFAULT_OBJECT_SIZE}].")
@click.option("--concurrency", type=params.INT_LIST, default=None,
              help=f"s3:// sweep: requests in flight (parts and ranged GETs)  [default: {DEFAULT_CONCURRENCY}].")
@click.option("--part-size", type=params.SIZE_LIST, default=None,
              help=f"s3:// sweep: multipart part size and ranged-GET size (5MiB-5GiB)  [default: {DEFAULT_PART_SIZE}].")
@ENDPOINT_URL_OPTION
@storage_option_option("region_name, profile, part_size, max_concurrency, max_attempts, create_bucket, anon")
@CLIENT_OPTION
@click.option("--force", is_flag=True,
              help="Accept as TARGET a system directory (/, /etc, /usr, /var...) or a directory other users can "
                   "write to without the sticky bit, each refused otherwise: the scratch files would land among the "
                   "system's own, or where another user could swap them.")
@click.option("--mlperf", type=click.Choice(["llama3-8b", "llama3-70b", "llama3-405b", "llama3-1t"]), default=None,
              help="MLPerf Storage v2.0's checkpointing workload (its TP x PP x DP, ZeRO stage and checkpoint size), "
                   "each rank writing its MLPerf share: under torchrun/srun every launched rank (all of the "
                   "model's ranks: default mode; fewer: subset mode), else --ranks processes here (subset mode). "
                   "10 writes, the page cache dropped, 10 reads; reported in GB/s and MLPerf's GB/s (GiB/s). "
                   "--scale shrinks every rank's bytes for a test/dev run (then not comparable).")
@click.option("--ranks", type=params.POSITIVE_INT, default=None,
              help="--mlperf without a launcher: ranks run on this host, the first of the model's layout  "
                   "[default: 8].")
@click.option("--num-checkpoints-write", "num_checkpoints_write", type=params.RUNS, default=None,
              help="--mlperf: checkpoints written before the reads (MLPerf's num_checkpoints_write)  [default: 10].")
@click.option("--num-checkpoints-read", "num_checkpoints_read", type=params.RUNS, default=None,
              help="--mlperf: checkpoints read after the page cache is dropped (MLPerf's num_checkpoints_read); "
                   "read i reads checkpoint i mod the writes  [default: 10].")
@click.option("--dp", type=params.POSITIVE_INT, default=None,
              help="Under torchrun/srun: data-parallel ranks  [default: the ranks tp x pp leave].")
@click.option("--tp", type=params.POSITIVE_INT, default=None, help="Under torchrun/srun: tensor-parallel size  [default: 1].")
@click.option("--pp", type=params.POSITIVE_INT, default=None,
              help="Under torchrun/srun: pipeline stages (contiguous blocks each)  [default: 1].")
@click.option("--zero", type=click.Choice(["none", "zero1", "zero2", "zero3", "fsdp"]), default=None,
              help="Under torchrun/srun: what data-parallel ranks shard (ZeRO stage; fsdp = zero3); 'none': dp rank 0 "
                   "writes all  [default: fsdp].")
def bench(target: str, size: int, file_size: int | None, files: int | None, threads: list[int],
          block_size: list[int], schedule: list[str], direct: bool, fsync: bool, read: bool, repeat: int, warmup: int,
          metadata: bool, output_format: str, plot_path: Path | None, output_dir: Path | None, workload: str,
          model: str | None, scale: float | None, writers: list[str] | None, object_size: list[int] | None,
          concurrency: list[int] | None, part_size: list[int] | None, endpoint_url: str | None,
          storage_option: tuple[str, ...], client: str | None, force: bool, dp: int | None, tp: int | None, pp: int | None,
          zero: str | None, device: str | None, runtime: float | None, sample_every: float, mlperf: str | None,
          ranks: int | None, num_checkpoints_write: int | None, num_checkpoints_read: int | None) -> None:
    """Measure a directory (local NVMe or a mounted network filesystem) or an object store like a
    checkpoint writer would.

    TARGET defaults to the system's temporary directory (usually /tmp). Every run writes --size bytes over --files files with the native engine, durable by default
    (O_DIRECT + fdatasync inside the timed region), then reads them back cold. Work happens in a
    scratch directory inside TARGET that is removed afterwards, also on Ctrl-C; nothing else is touched.

    On s3://BUCKET/PREFIX the sweep is object size x requests in flight x part size: each run uploads
    --size bytes as objects (multipart where larger than the part size) and reads them back with
    ranged GETs in parallel, under a scratch prefix deleted afterwards (open uploads aborted).
    Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, AWS_PROFILE...), a
    profile, or --storage-option.

    \b
    Examples:
      ckptbench bench
      ckptbench bench /mnt/nvme --size 8GiB --threads 1,2,4,8 --block-size 1MiB,4MiB,16MiB
      ckptbench bench /mnt/cephfs --metadata --json > cephfs.json
      ckptbench bench /mnt/nvme --output results/
      ckptbench bench /mnt/nvme --workload checkpoint --model llama3-8b --scale 0.05
      ckptbench bench /mnt/nvme --workload checkpoint --size 4GiB --writers ckptbench,torch,dcp,safetensors
      ckptbench bench /mnt/nvme --workload checkpoint --scale 0.1 --device cuda --writers ckptbench,dcp
      ckptbench bench s3://bucket/tmp --endpoint-url http://rgw:7480 --object-size 64MiB,256MiB --concurrency 8,32
      ckptbench bench s3://bucket/tmp --workload checkpoint --scale 0.02
      ckptbench bench /mnt/nvme --mlperf llama3-70b                (MLPerf Storage's checkpointing, 8 ranks)
      srun -N 8 --ntasks-per-node 8 python -m ckptbench bench /mnt/lustre --mlperf llama3-70b    (all 64 ranks)
      torchrun --nproc-per-node 8 -m ckptbench bench /mnt/lustre --model llama3-70b --scale 0.05 --tp 8

    With --workload checkpoint, a state_dict with the model's tensor shapes (bf16 weights, fp32 optimizer
    state for a subset, many small tensors) is built once; each writer saves it (timed until durable),
    the page cache is dropped, and it loads it back (timed, cold, verified bit-exact). ckptbench and dcp
    also save asynchronously: stall, persist and the slowdown of a compute probe running meanwhile.

    Under torchrun or srun (RANK/WORLD_SIZE or SLURM_PROCID/SLURM_STEP_NUM_TASKS set) every rank runs the
    checkpoint workload at once: --scale/--size is the whole checkpoint, split by --dp/--tp/--pp/--zero;
    each rank saves its share with the distributed save (rank 0 commits), barrier to barrier, then
    loads it cold. Aggregate GB/s = all ranks' bytes / the slowest rank's time (as MLPerf Storage),
    with every rank's time kept. Rank 0 prints and writes --output/--plot.
    """
    import tempfile

    from ckptbench.storage import resolve_target, scheme_of

    target = target if target is not None else tempfile.gettempdir()
    ctx = click.get_current_context()
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
    options = storage_options_from(endpoint_url, storage_option, client)
    on_objects = scheme_of(target) != "file"
    if not on_objects and options:
        raise UsageError("--storage-option, --endpoint-url and --client apply to object storage (s3://...), not to a "
                         "directory")
    launch = launch_from_environment()
    if mlperf is not None:
        _bench_mlperf(mlperf, target, given, launch=launch, ranks=ranks, scale=scale, repeat=repeat,
                      writes=num_checkpoints_write, reads=num_checkpoints_read, output_format=output_format,
                      plot_path=plot_path, output_dir=output_dir, storage_options=options, force=force)
        return
    for name, flag in (("ranks", "--ranks"), ("num_checkpoints_write", "--num-checkpoints-write"),
                       ("num_checkpoints_read", "--num-checkpoints-read")):
        if name in given:
            raise UsageError(f"{flag} goes with --mlperf (MLPerf's checkpointing workload)")
    if launch is None:
        misplaced = sorted(given & set(LAUNCH_ONLY))
        if misplaced:
            raise UsageError(f"{LAUNCH_ONLY[misplaced[0]]} splits the checkpoint over the ranks of a distributed "
                             "launch; none was detected (no RANK/WORLD_SIZE)",
                             hint="start it with torchrun --nproc-per-node N -m ckptbench bench ... (or srun)")
    else:
        if "workload" in given and workload != "checkpoint":
            raise UsageError("under a distributed launch bench measures the checkpoint workload",
                             hint="drop --workload fs (the filesystem sweep runs in one process)")
        misplaced = sorted(given & (set(FS_ONLY) | set(OBJECT_ONLY) | {"sample_every"}))
        if misplaced:
            flag = {**FS_ONLY, **OBJECT_ONLY, "sample_every": "--sample-every"}[misplaced[0]]
            raise UsageError(f"{flag} applies to the single-process sweep, not to a distributed launch")
        if device is not None:
            checked_device(device, 0, launched=True)
        bench_under_launch(launch, target, given, size=size, threads=threads, repeat=repeat, warmup=warmup,
                           output_format=output_format, plot_path=plot_path, output_dir=output_dir, model=model, scale=scale,
                           writers=writers, storage_options=options, force=force, dp=dp, tp=tp, pp=pp, zero=zero,
                           default_model=DEFAULT_MODEL, device=device or "cpu")
        return
    if runtime is not None and (workload == "checkpoint" or on_objects):
        raise UsageError("--runtime runs the filesystem sweep (a directory, --workload fs) by time; "
                         f"{'the checkpoint workload' if workload == 'checkpoint' else 'the s3:// sweep'} runs by size",
                         hint="drop --runtime and give --size")
    if workload == "checkpoint" and "sample_every" in given:
        raise UsageError("--sample-every sets the sweeps' timeline interval; the checkpoint workload records "
                         "its timeline every second", hint="drop --sample-every")
    if workload == "checkpoint":
        misplaced = sorted(given & set(OBJECT_ONLY))
        if misplaced:
            raise UsageError(f"{OBJECT_ONLY[misplaced[0]]} applies to the s3:// object sweep (--workload fs) only")
        _bench_checkpoint(target, given, size=size, threads=threads, repeat=repeat, warmup=warmup, output_format=output_format,
                          plot_path=plot_path, output_dir=output_dir, model=model, scale=scale, writers=writers,
                          storage_options=options, force=force, device=device or "cpu")
        return
    misplaced = sorted(given & set(CHECKPOINT_ONLY))
    if misplaced:
        raise UsageError(f"{CHECKPOINT_ONLY[misplaced[0]]} applies to --workload checkpoint only")
    if on_objects:
        _bench_objects(target, given, size=size, read=read, repeat=repeat, warmup=warmup, output_format=output_format,
                       plot_path=plot_path, output_dir=output_dir, object_size=object_size, concurrency=concurrency,
                       part_size=part_size, storage_options=options, sample_every=sample_every)
        return
    misplaced = sorted(given & set(OBJECT_ONLY))
    if misplaced:
        raise UsageError(f"{OBJECT_ONLY[misplaced[0]]} applies to s3:// targets only")

    from ckptbench.bench.fs import run_fs_bench

    if file_size is not None and files is not None:
        raise UsageError("give --file-size or --files, not both")
    nfiles = files if files is not None else (-(-size // file_size) if file_size else DEFAULT_FILES)
    if file_size is not None and nfiles > MAX_FILES:
        raise UsageError(f"--file-size {format_size(file_size)} makes {nfiles} files of --size {format_size(size)}, "
                         f"more than {MAX_FILES}", hint="use a larger --file-size")
    spec = FsBenchSpec(
        size_bytes=size, files=nfiles, threads=tuple(threads), block_sizes=tuple(block_size),
        schedules=tuple(dict.fromkeys(schedule or ["shared"])),
        direct=direct, fsync=fsync, read=read, repeat=repeat, warmup=warmup, metadata=metadata,
        runtime_s=runtime, sample_every_s=sample_every,
    )
    chosen = click.get_current_context().get_parameter_source("block_size") != click.core.ParameterSource.DEFAULT
    spec = fit_block_sizes(spec, chosen=chosen)
    storage = resolve_target(target, force=force)
    if not schedule:
        spec = dataclasses.replace(spec, schedules=(_default_schedule(storage.path),))
    run_and_emit(
        lambda progress: run_fs_bench(spec, storage, progress=progress),
        output=open_output(output_dir, "bench"), plot_path=plot_path, output_format=output_format,
        plot=_plot_sweep,
        print_tables=_print_tables,
    )


def _bench_mlperf(name: str, target: str, given: set[str], *, repeat: int, writes: int | None, reads: int | None,
                  **kwargs: Any) -> None:
    """``--mlperf``: its sizes, layout and procedure come from MLPerf; the options that would change them are
    refused. ``--repeat`` sets both checkpoint counts; ``--num-checkpoints-write/-read`` each one."""
    from ckptbench.bench.mlperf import CHECKPOINTS
    from ckptbench.cli.bench_mlperf import bench_mlperf

    allowed = {"target", "mlperf", "ranks", "scale", "repeat", "num_checkpoints_write", "num_checkpoints_read",
               "json", "format", "plot_path", "output_dir", "endpoint_url", "storage_option", "client", "force"}
    misplaced = sorted(given - allowed)
    if misplaced:
        raise UsageError(f"--{misplaced[0].replace('_', '-')} does not apply to --mlperf: its sizes, layout and "
                         "procedure are MLPerf's")
    count = repeat if "repeat" in given else CHECKPOINTS
    bench_mlperf(name, target, writes=count if writes is None else writes, reads=count if reads is None else reads,
                 **kwargs)


def fit_block_sizes(spec: FsBenchSpec, *, chosen: bool) -> FsBenchSpec:
    """``spec`` with no block size above ``spec.largest_block_bytes``, the largest I/O its runs issue (the
    engine cuts none longer), so that no row claims a block size it did not measure. Every filesystem
    sweep goes through it before it runs (``bench``, ``recommend``'s fresh sweep).

    Block sizes the user ``chosen`` are refused (UsageError naming the largest that fits). Defaults too
    large shrink to that largest one (logged); the default sizes that fit are kept.
    """
    largest = spec.largest_block_bytes
    too_big = [b for b in spec.block_sizes if b > largest]
    if not too_big:
        return spec
    align = knobs.ALIGNMENT_BYTES
    fits = max(largest - largest % align, align) if spec.direct else largest
    if not chosen:
        log.info("block size%s %s shrunk to %s: no I/O of %s files is larger", "s" if len(too_big) > 1 else "",
                 ", ".join(format_size(b) for b in too_big), format_size(fits), format_size(spec.file_size_bytes))
        shrunk = dict.fromkeys(min(b, fits) for b in spec.block_sizes)
        return dataclasses.replace(spec, block_sizes=tuple(shrunk))
    shown = format_size(fits).replace(" ", "")
    if units.parse_size(shown) != fits:
        shown = str(fits)
    if largest < spec.file_size_bytes:  # the files are written from the buffer in pieces
        raise UsageError(
            f"block size {format_size(too_big[0])} is larger than the {format_size(largest)} buffer files are "
            "written from, so no I/O would be that large",
            hint=f"use --block-size {shown} or less, or raise CKPTBENCH_BENCH_BUFFER_MAX_BYTES",
        )
    raise UsageError(
        f"block size {format_size(too_big[0])} is larger than the files, {format_size(largest)} each "
        f"(--size {format_size(spec.size_bytes)} over {spec.files} files), so no I/O would be that large",
        hint=f"use --block-size {shown} or less, or larger files: a larger --size or fewer --files",
    )


def _bench_objects(target: str, given: set[str], *, size: int, read: bool, repeat: int, warmup: int, output_format: str,
                   plot_path: Path | None, output_dir: Path | None, object_size: list[int] | None,
                   concurrency: list[int] | None, part_size: list[int] | None,
                   storage_options: dict[str, str], sample_every: float) -> None:
    """The object-storage sweep on ``s3://``: validate everything (URL, options, bucket), then run."""
    from ckptbench.bench.object_sweep import ObjectBenchSpec, run_object_bench
    from ckptbench.cli.params import INT_LIST, SIZE_LIST
    from ckptbench.storage import resolve_target

    misplaced = sorted(given & (set(FS_ONLY) - {"read"} | {"threads"}))
    if misplaced:
        flag = {**FS_ONLY, "threads": "--threads"}[misplaced[0]]
        hint = " (use --concurrency for requests in flight)" if misplaced[0] == "threads" else ""
        raise UsageError(f"{flag} applies to filesystem targets, not to object storage{hint}")
    spec = ObjectBenchSpec(
        size_bytes=size,
        # The default object size shrinks to --size when that is smaller; given sizes are taken as they are.
        object_sizes=tuple(object_size or [min(size, o) for o in SIZE_LIST.convert(DEFAULT_OBJECT_SIZE, None, None)]),
        concurrency=tuple(concurrency or INT_LIST.convert(DEFAULT_CONCURRENCY, None, None)),
        part_sizes=tuple(part_size or SIZE_LIST.convert(DEFAULT_PART_SIZE, None, None)),
        read=read, repeat=repeat, warmup=warmup, sample_every_s=sample_every,
    )
    storage = resolve_target(target, storage_options)
    storage.prepare()  # a missing bucket or a wrong endpoint fails here, before any allocation
    run_and_emit(
        lambda progress: run_object_bench(spec, storage, progress=progress),
        output=open_output(output_dir, "bench-objects"), plot_path=plot_path, output_format=output_format,
        plot=_plot_object_sweep, print_tables=_print_object_tables,
    )


def _plot_object_sweep(document: dict[str, Any], path: Path) -> None:
    from ckptbench.report.sweep_plot import plot_object_sweep

    plot_object_sweep(document, path)


def _print_object_tables(report: Any, document: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    spec, env_target = report.spec, document["environment"]["target"]
    console.print(
        f"[bold]{report.target}[/]  at {env_target.get('endpoint')} (credentials from "
        f"{env_target.get('credential_source')})  ·  client {env_target.get('client', S3_DEFAULT_CLIENT)}  ·  "
        f"{format_size(spec.size_bytes)} per run  ·  "
        f"{runs_text(spec.repeat, spec.warmup)}  ·  uploads complete (durable), ranged parallel GETs")
    table = Table(header_style="bold")
    for name in ("object", "objects", "in flight", "part", "write MB/s", "min–max", "p99 req ms"):
        table.add_column(name, justify="right")
    if spec.read:
        for name in ("read MB/s", "min–max", "p99 req ms"):
            table.add_column(name, justify="right")
    best, leaders = report.best_index, report.leaders
    for i, (result, record) in enumerate(zip(report.results, document["results"], strict=True)):
        c = record["config"]
        row = [format_size(result.object_size), str(c["objects"]), str(result.concurrency),
               "1 PUT" if c["parts_per_object"] == 1 else format_size(result.part_size)]
        for op in ("write", "read") if spec.read else ("write",):
            r = record[op]
            row += [f"{r['gbps'] * 1e3:.0f}", range_text(r["summary_gbps"], 1e3, 0),
                    f"{r['latency_ms']['p99']:.0f}" if r["latency_ms"] else "-"]
        table.add_row(*row, style="bold green" if [i] == leaders and len(report.results) > 1 else None)
    console.print(table)
    console.print(_throttling([record.get("requests") or {} for record in document["results"]]))
    b = report.results[best]
    read_text = f", read {b.read.gbps * 1e3:.0f} MB/s" if b.read else ""
    if len(report.results) > 1:
        console.print(best_or_tied([r.label() for r in report.results], leaders, spec.repeat))
    console.print(f"fastest median: {b.label()}: write {b.write.gbps * 1e3:.0f} MB/s{read_text}")


def _throttling(per_run: list[dict[str, dict[str, Any]]]) -> str:
    """The line saying what a run's S3 requests met, summed over its phases (``s3_pacing.Counts``)."""
    from ckptbench.storage.s3_pacing import Counts, summary_text

    total = Counts()
    for phases in per_run:
        for counts in phases.values():
            total = total.plus(Counts(**counts))
    return summary_text(total)


def _plot_sweep(document: dict[str, Any], path: Path) -> None:
    from ckptbench.report.sweep_plot import plot_fs_sweep

    plot_fs_sweep(document, path)


def _plot_shootout(document: dict[str, Any], path: Path) -> None:
    from ckptbench.report.shootout_plot import plot_shootout

    plot_shootout(document, path)


def _default_schedule(target: Path) -> str:
    """``per-file`` on a network or FUSE mount (the client reads ahead and writes back each file's stream in
    order; the checkpoint writer writes one stream per shard there), else ``shared``."""
    from ckptbench.storage.local_target import is_network, mount_of

    mount = mount_of(target)
    return "per-file" if mount is not None and is_network(mount.fstype) else "shared"


def _print_tables(report: Any, document: dict[str, Any]) -> None:
    from rich.table import Table

    from ckptbench.units import format_rate

    console = stdout_console()
    spec = report.spec
    first = report.results[0].write
    mode = ("O_DIRECT" if first.direct_used else "buffered") + (f" + {first.sync}" if first.sync != "none" else "")
    console.print(
        f"[bold]{report.target}[/]  {document['environment']['target']['filesystem']}  ·  "
        f"{format_size(spec.size_bytes)} in {count_text(spec.files, 'file')} per run  ·  {mode}  ·  "
        f"{runs_text(spec.repeat, spec.warmup)}  ·  memcpy {format_rate(report.memcpy_bps)}"
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
    best, leaders = report.best_index, report.leaders
    for i, (result, record) in enumerate(zip(report.results, document["results"], strict=True)):
        w = record["write"]
        row = [str(result.threads), format_size(result.block_size), *([result.schedule] if sweep_schedule else []),
               f"{w['gbps']:.2f}",
               range_text(w["summary_gbps"]), percentiles_text(w["summary_gbps"]),
               f"{w['latency_ms']['p99']:.1f}" if w["latency_ms"] else "-"]
        if spec.read:
            r = record["read"]
            row += [f"{r['gbps']:.2f}", range_text(r["summary_gbps"]), percentiles_text(r["summary_gbps"])]
        table.add_row(*row, style="bold green" if [i] == leaders and len(report.results) > 1 else None)
    console.print(table)
    b = report.results[best]
    read_text = f", read {b.read.gbps:.2f} GB/s" if b.read else ""
    if len(report.results) > 1:
        labels = [f"{count_text(r.threads, 'thread')} x {format_size(r.block_size)} blocks, {r.schedule}"
                  for r in report.results]
        console.print(best_or_tied(labels, leaders, spec.repeat))
    console.print(f"fastest median: {count_text(b.threads, 'thread')} x {format_size(b.block_size)} blocks, {b.schedule}: "
                  f"write {b.write.gbps:.2f} GB/s{read_text}")
    layout = document["environment"].get("layout")
    if layout:
        console.print(f"layout: {layout.get('note') or 'skipped: ' + layout['skipped']}")
    if b.durable_modes:
        m = b.durable_modes
        console.print(f"durable modes there: write {m['write_reason']}"
                      + (f"; cold read {m['read_reason']}" if "read_reason" in m else ""))
    from ckptbench.report.timeseries_plot import steady_text

    for op in ("write", "read"):
        text = steady_text(op, (document["results"][best].get(op) or {}).get("steady_state"))
        if text and "too short" not in text:
            console.print(text)
    for m in document["metadata"]:
        lat = m["latency_ms"]
        console.print(f"metadata: {m['threads']} thr: {m['ops_per_s']:.0f} files/s "
                      f"({m['files']} x {format_size(m['file_size_bytes'])}, {m['sync']}; p99 {lat['p99']:.2f} ms)")


def _bench_checkpoint(target: str, given: set[str], *, size: int, threads: list[int], repeat: int, warmup: int,
                      output_format: str, plot_path: Path | None, output_dir: Path | None, model: str | None,
                      scale: float | None, writers: list[str] | None, storage_options: dict[str, str],
                      force: bool = False, device: str = "cpu") -> None:
    """``--workload checkpoint``: validate everything, then run the writers' shoot-out."""
    from ckptbench.bench.shootout import CheckpointBenchSpec, plan, run_checkpoint_bench
    from ckptbench.storage import resolve_target

    misplaced = sorted(given & set(FS_ONLY))
    if misplaced:
        raise UsageError(f"{FS_ONLY[misplaced[0]]} applies to --workload fs only")
    if {"scale", "size"} <= given:
        raise UsageError("give --scale or --size, not both")
    if "threads" in given and len(threads) != 1:
        raise UsageError("--threads takes one value with --workload checkpoint (ckptbench's writer threads)")
    spec = CheckpointBenchSpec(
        model=DEFAULT_MODEL if model is None else model, scale=scale,
        size_bytes=None if scale is not None else size,
        writers=tuple(writers or ("ckptbench",)), repeat=repeat, warmup=warmup,
        threads=threads[0] if "threads" in given else None, device=device,
    )
    storage = resolve_target(target, storage_options, force=force)
    workload = plan(spec)
    reports: list[Any] = []
    run_and_emit(
        lambda progress: reports.append(run_checkpoint_bench(spec, storage, progress=progress, workload=workload))
        or reports[-1],
        output=open_output(output_dir, "bench-checkpoint"), plot_path=plot_path, output_format=output_format,
        plot=_plot_shootout,
        print_tables=lambda report, doc: _print_checkpoint_tables(doc),
    )
    failed = [f.writer for f in reports[-1].failed]
    if failed:  # the results of the others are out; the exit status says the run was not all it was asked
        raise StorageIOError(f"{len(failed)} of {len(spec.writers)} writers failed ({', '.join(failed)}); "
                             "the others' results are complete")


def _seconds(value: float | None) -> str:
    from ckptbench.units import format_duration

    return "-" if value is None else format_duration(value)


def _print_checkpoint_tables(document: dict[str, Any]) -> None:
    from rich.table import Table

    from ckptbench.units import format_rate

    console = stdout_console()
    spec, workload = document["spec"], document["workload"]
    shape = workload["shape"]
    by_dtype = ", ".join(f"{d} {b / workload['total_bytes']:.0%}" for d, b in workload["bytes_by_dtype"].items() if b)
    console.print(
        f"[bold]{document['target']}[/]  {document['environment']['target']['filesystem']}  ·  "
        f"{workload['model']} x{workload['scale']:.3g}: {shape['layers']} blocks, hidden {shape['hidden']}, "
        f"{format_size(workload['total_bytes'])} in {workload['tensors']} tensors ({by_dtype})  ·  "
        f"state_dict on {spec.get('device', 'cpu')}  ·  "
        f"{runs_text(spec['repeat'], spec['warmup'])}, writers alternating  ·  "
        f"cold loads: {document['cache_drop']['method']}  ·  memcpy {format_rate(document['memcpy_gbps'] * 1e9)}"
    )
    table = Table(header_style="bold")
    for name, justify in (("writer", "left"), ("save GB/s", "right"), ("min–max", "right"), ("load GB/s", "right"),
                          ("min–max", "right"), ("files", "right"), ("on disk", "right"), ("verified", "center")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in document["results"]:
        save, load = r["save"], r["load"]
        verified = {True: "yes", False: "NO", None: "n/a"}[r["verified"]]
        table.add_row(r["writer"], f"{save['gbps']:.2f}",
                      range_text(save["summary_gbps"]),
                      f"{load['gbps']:.2f}" + (" (cached!)" if load["cached"] else ""),
                      range_text(load["summary_gbps"]),
                      str(r["files"]), format_size(r["disk_bytes"]), verified,
                      style="bold green" if r["writer"] == "ckptbench" and len(document["results"]) > 1 else None)
    console.print(table)
    for f in document.get("failed_writers", ()):
        console.print(f"[red]{f['writer']}: failed during {f['during']}, no results (the warning below says why)[/]")
    for r in document["results"]:
        if (r.get("details") or {}).get("s3_requests"):
            console.print(f"{r['writer']} {_throttling([r['details']['s3_requests']])}")
    if document["async"]:
        table = Table(header_style="bold", title="async saves (medians)", title_justify="left")
        for name in ("writer", "stall", "persist", "total", "interference"):
            table.add_column(name, justify="left" if name == "writer" else "right")
        for a in document["async"]:
            table.add_row(a["writer"], _seconds(a["stall_s"]), _seconds(a["persist_s"]), _seconds(a["total_s"]),
                          "-" if a["interference"] is None else f"{a['interference']:+.0%}")
        console.print(table)
        probe = document["probe"]
        where = probe.get("device", "cpu")
        where = f"{probe['torch_threads']} threads" if where == "cpu" else f"on {where}"
        console.print(f"interference: slowdown of a {probe['kind']} {probe['matrix'][0]}x{probe['matrix'][1]} loop "
                      f"({where}) while persisting, vs the same loop alone")
        ours = next((r["details"] for r in document["results"] if r["writer"] == "ckptbench"), {})
        if ours.get("async_staging") == "copy-on-write":
            console.print("ckptbench async staging: copy-on-write (host tensors write-protected, copied behind the "
                          f"caller; {ours.get('async_cow_faults', 0)} writes waited for their page in the last save)")
        elif ours.get("async_staging"):
            why = ours.get("async_cow_unavailable") or "no host tensor it could protect"
            console.print(f"ckptbench async staging: copied before returning ({why})")
    memory = document["memory"]
    if memory:
        console.print(
            f"memory: first save +{format_size(memory['first_peak_extra_bytes'])} peak RSS "
            f"({memory['first_peak_extra_bytes'] / memory['checkpoint_bytes']:.2f}x the checkpoint, staging memory included), "
            f"later saves +{format_size(memory['steady_peak_extra_bytes'])}; "
            f"RSS growth over {memory['saves']} saves {format_size(memory['growth_bytes'])}")
    for g in document["goals"]:  # ratios, as facts: the project's own targets for them stay in the JSON
        console.print(f"{g['description']}: {g['value']:.2f}")
    for r in document["results"]:
        console.print(f"[dim]{r['writer']}: durable: {r['durable']}; load: {r['load_how']}[/]")
