"""``ckptbench preflight [TARGET]``: measure the target briefly with the real writer, size the job's
checkpoint, predict stall, restore, overhead and goodput, and give PASS/WARN/FAIL verdicts."""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from ckptbench.bench.records import document_header
from ckptbench.cli import params
from ckptbench.cli.bench import storage_options_from
from ckptbench.cli.formats import format_options
from ckptbench.cli.options import (
    FAILURE_RATE,
    checked_device,
    failure_options,
    flags_override_config,
    resolve_failures,
    two_level_options,
)
from ckptbench.cli.render import open_output, run_and_emit, stdout_console
from ckptbench.decide.scaling import SAME_SIZE
from ckptbench.errors import UsageError
from ckptbench.model import sizing
from ckptbench.units import format_duration, format_rate, format_size

DEFAULT_MODEL = "llama3-8b"
DEFAULT_RANKS = 64
DEFAULT_SHARDING = "fsdp"
DEFAULT_FAILURES = "llama3"
DEFAULT_MEASURE_SIZE = "512MiB"
#: The third sample's runs: a fitted line read at k times its largest size carries that size's spread about
#: k times over, so the nearer the node's bytes, the narrower the range; 60 s reaches about 4 GB at 1 GB/s.
DEFAULT_MEASURE_TIME = "60s"
UNITS = {"_s": "seconds", "_bytes": "bytes", "_bps": "bytes per second", "_fraction, goodput, interference":
         "fraction (0..1)", "_usd_per_day": "US dollars per day", "_gpu_hours_per_day": "GPU hours per day"}
#: Filesystem types (``/proc/mounts``) whose storage other nodes share.
SHARED_FILESYSTEMS = ("fuse", "nfs", "ceph", "lustre", "gpfs", "beegfs", "cifs", "smb", "wekafs", "9p")
_STYLE = {"PASS": "bold green", "WARN": "bold yellow", "FAIL": "bold red", "BORDERLINE": "bold magenta"}


def _interval(value: str) -> float | None:
    if value.strip().lower() == "auto":
        return None
    return params.BOUNDED_DURATION.convert(value, None, None)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("target", required=False)
@click.option("--model", metavar="PRESET", default=None,
              help=f"Model preset from configs/models (llama3-8b, llama3-70b, llama3-405b, dense-100b)  "
                   f"[default: {DEFAULT_MODEL}]. Not with --params.")
@click.option("--params", "params", type=params.FINITE_COUNT, default=None,
              help="Model parameters instead of a preset: 70B.")
@click.option("--dtype", type=click.Choice(sorted(sizing.DTYPE_BYTES)), default="bf16", show_default=True,
              help="Weights dtype.")
@click.option("--optimizer", type=click.Choice(sorted(sizing.OPTIMIZER_BYTES)), default="adam", show_default=True,
              help="Optimizer state saved: adam (8 B/param), sgd (4), none.")
@click.option("--weights-only", is_flag=True, help="Checkpoints hold the weights alone.")
@click.option("--ranks", type=params.POSITIVE_INT, default=DEFAULT_RANKS, show_default=True,
              help="GPUs (ranks) in the job.")
@click.option("--gpus-per-node", type=params.POSITIVE_INT, default=8, show_default=True,
              help="Ranks per node: they share the node's storage bandwidth and host memory.")
@click.option("--tp", type=params.POSITIVE_INT, default=1, show_default=True, help="Tensor-parallel ranks.")
@click.option("--pp", type=params.POSITIVE_INT, default=1, show_default=True, help="Pipeline-parallel ranks.")
@click.option("--sharding", type=click.Choice(sizing.SHARDING), default=DEFAULT_SHARDING, show_default=True,
              help="Data-parallel sharding of the state: zero1 (optimizer), zero2 (+grads), zero3/fsdp (+weights).")
@click.option("--interval", "interval", default="auto", show_default=True, metavar="DURATION|auto",
              help="Checkpoint interval (training time between checkpoints) to check: 30m; auto = the optimum.")
@failure_options(with_count=False)
@click.option("--restart", type=params.BOUNDED_DURATION, default=None,
              help="Time to detect a failure and get the job running again, before reloading the checkpoint: "
                   "10m  [default: 0].")
@click.option("--max-overhead", type=params.FRACTION, default="2%", show_default=True,
              help="FAIL when checkpoints cost more than this share of compute (and restores of the time).")
@click.option("--max-ckpt-time", type=params.BOUNDED_DURATION, default="10s", show_default=True,
              help="FAIL when training blocks longer than this per checkpoint.")
@click.option("--retain", type=params.POSITIVE_INT, default=2, show_default=True,
              help="Checkpoints kept on the target (free space must hold these plus one being written).")
@click.option("--aggregate-bandwidth", type=params.FINITE_RATE, default=None,
              help="Shared storage: the most it delivers to all nodes together (40GB/s); caps the per-node rate.")
@click.option("--interference", type=params.FRACTION_OR_ZERO, default=None,
              help="Async: training throughput lost while a checkpoint persists (5%)  [default: assumed 2 %, "
                   "range 0-5 %; the CPU probe on this host is reported, not used].")
@click.option("--node-memory", type=params.FINITE_SIZE, default=None,
              help="Host memory of one training node (2TiB), when preflight runs elsewhere (a login node)  "
                   "[default: this host's].")
@click.option("--node-network", type=params.FINITE_RATE, default=None,
              help="The most one training node moves to shared storage (200Gb/s): caps its checkpoint and "
                   "restore rates on a network filesystem or object storage.")
@click.option("--gpu-hour-usd", type=params.FINITE_POSITIVE_NUMBER, default=None,
              help="Price of one GPU hour, for the wasted cost: 2.5.")
@click.option("--measure-size", type=params.SIZE, default=DEFAULT_MEASURE_SIZE, show_default=True,
              help="Bytes the writer saves and loads per measured run (a model-shaped state_dict).")
@click.option("--measure-time", type=params.BOUNDED_DURATION_OR_ZERO, default=DEFAULT_MEASURE_TIME,
              show_default=True,
              help="Time the runs of a third, larger sample may take when the node's checkpoint is larger than "
                   "--measure-size (building it and verifying its loads come on top): it is measured as near the "
                   "node's bytes as this time and the host's memory allow (the node's own bytes when they fit: no "
                   "extrapolation; the nearer, the narrower the ranges), and time left over buys it more runs "
                   "(up to twice --repeat); 0 measures only --measure-size and a quarter of it.")
@click.option("--repeat", type=params.RUNS, default=3, show_default=True, help="Measured runs.")
@click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda|cuda:N",
              help="Where the measured state_dict lives, as in training: cuda saves it with device-to-host staging, "
                   "loads it back to the GPU, and measures the interference as a GPU compute loop's slowdown while "
                   "the checkpoint persists (used instead of the assumed value). Under torchrun/srun: cpu or cuda "
                   "(each rank on cuda:LOCAL_RANK).")
@click.option("--endpoint-url", default=None, metavar="URL", help="Object storage: the S3 endpoint.")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="Object storage: a store option, repeatable (see `ckptbench bench --help`).")
@two_level_options(local_help="Two levels: the fast local tier (a directory), with --remote, instead of TARGET: "
                              "both tiers and the drain between them measured, the two-level schedule checked.",
                   remote_every_help="Two levels: check a drain every this many local checkpoints  [default: the "
                                     "optimum's].")
@format_options
@click.option("--output", "output_dir", type=params.OUTPUT_DIR, default=None,
              help="Directory to write the JSON result file into (created if missing).")
@click.option("--plot", "plot_path", type=params.OUTPUT_FILE, default=None,
              help="Also draw waste versus checkpoint interval (the interval used and the optimum marked) to a PNG.")
@click.option("--force", is_flag=True,
              help="Accept as TARGET a system directory (/, /etc, /usr, /var...) or a directory other users can "
                   "write to without the sticky bit, each refused otherwise.")
@click.pass_context
def preflight(ctx: click.Context, target: str | None, **opts: Any) -> None:
    """Will checkpointing on TARGET work for this job? Measure, predict, and say PASS / WARN / FAIL.

    TARGET (a directory, a mount, or s3://BUCKET/PREFIX) defaults to the system's temporary directory;
    the job defaults to llama3-8b trained with FSDP on 64 GPUs (8 nodes) at the Llama 3 failure rate,
    so `ckptbench preflight` alone runs a complete check in about a minute and a half. The writer saves
    and loads a model-shaped state_dict of --measure-size on TARGET (durable saves, cold loads, async stall and persist); the
    job's checkpoint is sized from the model and its parallelism; the failure model turns both into
    the optimal interval, overhead, restore time and goodput.

    \b
    Every prediction comes with a range (the runs' spread, widened where one process measured a
    sample of a different shape than the job's node). A check is PASS or FAIL only when its whole
    range agrees; otherwise it is BORDERLINE and says what measurement would settle it.

    \b
    Exit status: 0 PASS or WARN, 1 FAIL (a check fails over its whole range), 2 bad input,
    3 BORDERLINE (a check's range spans its threshold; nothing failed).

    \b
    Examples:
      ckptbench preflight
      ckptbench preflight /mnt/nvme --model llama3-70b --ranks 512 --sharding zero1 --interval 30m
      ckptbench preflight /mnt/lustre --params 405B --ranks 16384 --tp 8 --pp 16 --failures llama3 \\
          --aggregate-bandwidth 2TB/s --gpu-hour-usd 2.5 --json
      ckptbench --config configs/runs/llama3-70b-512gpu.toml preflight
    """
    from ckptbench.decide.verdict import Job
    from ckptbench.model import presets
    from ckptbench.storage import resolve_target, scheme_of

    target = target if target is not None else tempfile.gettempdir()
    flags_override_config(opts, FAILURE_RATE, ("model", "params"), ("weights_only", "optimizer"))
    if opts["model"] is not None and opts["params"] is not None:
        raise UsageError("--model and --params both give the model size", hint="give one of them")
    if opts["weights_only"] and ctx.get_parameter_source("optimizer") == click.core.ParameterSource.COMMANDLINE:
        raise UsageError("--weights-only and --optimizer contradict each other", hint="give one of them")
    ranks, tp, pp = opts["ranks"], opts["tp"], opts["pp"]
    if ranks % (tp * pp):
        raise UsageError(f"--ranks {ranks} is not a multiple of --tp {tp} x --pp {pp}")
    preset = opts["model"] if opts["params"] is None else None
    shape = presets.load_model(DEFAULT_MODEL if preset is None else preset)
    param_count = opts["params"] if opts["params"] is not None else shape.params
    recipe = sizing.TrainingRecipe(weights_dtype=opts["dtype"], optimizer=opts["optimizer"],
                                   weights_only=opts["weights_only"])
    layout = sizing.Parallelism(dp=ranks // (tp * pp), tp=tp, pp=pp, sharding=opts["sharding"])
    size = sizing.checkpoint_size(param_count, recipe, layout)
    given_rate = [opts[k] for k in ("mtbf", "gpu_mtbf", "node_mtbf", "faults_per_day", "failures")]
    failures = resolve_failures(
        mtbf_s=opts["mtbf"], gpu_mtbf_s=opts["gpu_mtbf"], node_mtbf_s=opts["node_mtbf"],
        faults_per_day=opts["faults_per_day"],
        failure_preset=opts["failures"] if any(v is not None for v in given_rate) else DEFAULT_FAILURES,
        gpus=ranks, nodes=max(1, -(-ranks // opts["gpus_per_node"])), count_given=False)
    assert failures is not None
    job = Job(size=size, model_name=preset or (f"{param_count:.3g} params" if opts["params"] else DEFAULT_MODEL),
              ranks=ranks, ranks_per_node=opts["gpus_per_node"], failures=failures, restart_s=opts["restart"] or 0.0,
              interval_s=_interval(opts["interval"]), retain=opts["retain"], max_overhead=opts["max_overhead"],
              max_ckpt_time_s=opts["max_ckpt_time"], aggregate_bps=opts["aggregate_bandwidth"],
              interference=opts["interference"], gpu_hour_usd=opts["gpu_hour_usd"],
              node_memory_bytes=opts["node_memory"], node_network_bps=opts["node_network"])
    from ckptbench.cli.preflight_twolevel import preflight_two_levels

    two_levels = preflight_two_levels(job, opts, target=ctx.params["target"])
    if two_levels is not None:
        ctx.exit(two_levels)
    options = storage_options_from(opts["endpoint_url"], opts["storage_option"])
    if scheme_of(target) == "file" and options:
        raise UsageError("--storage-option and --endpoint-url apply to object storage (s3://...), not to a directory")
    from ckptbench.cli.launch import launch_from_environment

    launch = launch_from_environment()
    device = checked_device(opts["device"], opts["measure_size"], launched=launch is not None)
    storage = resolve_target(target, options, force=opts["force"])
    if launch is not None:
        code = preflight_under_launch(launch, job, storage, model=DEFAULT_MODEL if preset is None else preset,
                                      repeat=opts["repeat"], output_format=opts["output_format"], output_dir=opts["output_dir"],
                                      plot_path=opts["plot_path"], device=device)
        ctx.exit(code)
    from ckptbench.bench.shootout import CheckpointBenchSpec, plan

    spec = CheckpointBenchSpec(model=DEFAULT_MODEL if preset is None else preset, size_bytes=opts["measure_size"],
                               writers=("ckptbench",), repeat=opts["repeat"], warmup=1, memory_saves=0,
                               device=device)
    workload = plan(spec, size_option="--measure-size")  # a bad --measure-size fails here, before anything is written
    report_box: list[PreflightReport] = []

    def run(progress: Any) -> PreflightReport:
        report = measure_and_evaluate(job, spec, storage, workload, progress, budget_s=opts["measure_time"])
        report_box.append(report)
        return report

    run_and_emit(run, output=open_output(opts["output_dir"], "preflight"), plot_path=opts["plot_path"],
                 output_format=opts["output_format"], plot=_plot, print_tables=lambda report, doc: _print(doc))
    ctx.exit(report_box[0].verdict.exit_code)


@dataclass(frozen=True)
class PreflightReport:
    target: str
    verdict: Any  # decide.verdict.Verdict
    bench: dict[str, Any]  # the embedded checkpoint-bench document
    created: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        job = v.job
        return {
            **document_header("ckptbench.preflight/1", self.created),
            "target": self.target,
            "verdict": v.verdict,
            "checks": [c.to_dict() for c in v.checks],
            "recommendation": [{"setting": a.setting, "value": a.value, "reason": a.reason} for a in v.recommendation],
            "predictions": v.predictions,
            "model": {"interval_s": v.predictions["interval_s"],
                      "optimal_interval_s": v.predictions["optimal_interval_s"],
                      "waste_fraction": v.predictions["waste_fraction"], "curve": v.predictions["curve"]},
            "job": {
                "model": job.model_name, "ranks": job.ranks, "ranks_per_node": job.ranks_per_node, "nodes": job.nodes,
                "checkpoint": job.size.as_dict(), "failures": {"mtbf_s": job.failures.mtbf_s,
                                                               "source": job.failures.source},
                "restart_s": job.restart_s, "interval_s": job.interval_s, "retain": job.retain,
                "max_overhead": job.max_overhead, "max_ckpt_time_s": job.max_ckpt_time_s,
                "aggregate_bps": job.aggregate_bps, "interference": job.interference,
                "gpu_hour_usd": job.gpu_hour_usd, "node_memory_bytes": job.node_memory_bytes,
                "node_network_bps": job.node_network_bps,
            },
            "measurements": {
                "shape": v.measurements.shape, "launched_ranks": v.measurements.launched_ranks,
                "writers": v.measurements.writers, "bottleneck": v.measurements.bottleneck,
                "sampled_bytes": v.measurements.sampled_bytes,
                "per_rank_bytes": v.measurements.per_rank_bytes or v.measurements.measured_bytes,
                "measured_bytes": v.measurements.measured_bytes, "write_bps": v.measurements.write_bps,
                "write_bps_range": _pair(v.measurements.write_bps_range),
                "read_bps": v.measurements.read_bps, "read_bps_range": _pair(v.measurements.read_bps_range),
                "async_stall_s": v.measurements.stall_s, "async_stall_s_range": _pair(v.measurements.stall_s_range),
                "async_persist_s": v.measurements.persist_s,
                "async_persist_s_range": _pair(v.measurements.persist_s_range),
                "device": v.measurements.device, "interference": v.measurements.interference,
                "interference_range": _pair(v.measurements.interference_range),
                "probe_interference": v.measurements.probe_interference,
                "memcpy_bps": v.measurements.memcpy_bps, "free_bytes": v.measurements.free_bytes,
                "host_memory_bytes": v.measurements.host_memory_bytes, "threads": v.measurements.threads,
                "direct": v.measurements.direct, "shared_storage": v.measurements.shared_storage,
                "sustained": self.bench.get("sustained"),
                "fresh_memory": self.bench.get("fresh_memory"),
                "hypervisor_reclaims": v.measurements.hypervisor_reclaims,
                "proactive_reclaim_s": v.measurements.proactive_reclaim_s,
                "checkpoint_bench": self.bench,
            },
            "assumptions": list(v.assumptions),
            "units": UNITS,
            "warnings": self.bench["warnings"],
            "environment": self.bench["environment"],
        }


def check_launch(job: Any, world_size: int, local_world_size: int | None) -> str:
    """The measurement's shape for a launch of ``world_size`` ranks (``local_world_size`` per node, when the
    launcher says): ``"job"`` for the whole job, ``"nodes"`` for whole nodes of it; UsageError otherwise."""
    if world_size > job.ranks:
        raise UsageError(f"the launch has {world_size} ranks but the job has {job.ranks} (--ranks)",
                         hint="launch at most the job's ranks, or describe the job you launch")
    per_node = min(job.ranks, job.ranks_per_node)
    if local_world_size is not None and local_world_size != per_node:
        raise UsageError(f"the launch runs {local_world_size} ranks per node but the job has {per_node} "
                         f"(--gpus-per-node {job.ranks_per_node})",
                         hint="launch as many ranks per node as the job runs (torchrun --nproc-per-node)")
    if world_size == job.ranks:
        return "job"
    if world_size % per_node:
        raise UsageError(f"the launch's {world_size} ranks are not whole nodes of {per_node} ranks",
                         hint="launch whole nodes of the job")
    return "nodes"


def _local_world_size() -> int | None:
    import os

    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        raw = os.environ.get(name, "").split("(")[0].split(",")[0].strip()
        if raw.isdigit():
            return int(raw)
    return None


def preflight_under_launch(launch: Any, job: Any, storage: Any, *, model: str, repeat: int, output_format: str,
                           output_dir: Path | None, plot_path: Path | None, device: str = "cpu") -> int:
    """Every rank of a torchrun/srun launch writes and cold-reads its real share of the job's checkpoint at
    once (the distributed bench); rank 0 evaluates the verdict on that measurement and prints it.
    Returns the exit status (every rank returns rank 0's)."""
    import os

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from ckptbench.bench.shootout_launched import DistributedBenchSpec, plan, run_distributed_bench
    from ckptbench.checkpoint.distributed import current_world, leave_world
    from ckptbench.model.sizing import Parallelism

    shape = check_launch(job, launch.world_size, _local_world_size())
    per_node = min(job.ranks, job.ranks_per_node)
    rank_bytes = -(-job.node_bytes // per_node)  # the node's bytes, shared evenly by its ranks
    spec = DistributedBenchSpec(model=model, size_bytes=rank_bytes * launch.world_size,
                                parallelism=Parallelism(dp=launch.world_size, sharding="fsdp"), repeat=repeat,
                                warmup=1, device=device)
    plan(spec, launch.world_size)
    world = current_world()
    if world is None:
        raise UsageError("this launch has a single process")
    report_box: list[PreflightReport] = []
    try:
        with world.step("the preflight measurement"):
            if not world.is_first:
                run_distributed_bench(spec, storage, world)
                return int(world.broadcast(None, "sharing the verdict"))

            def run(progress: Any) -> PreflightReport:
                bench = run_distributed_bench(spec, storage, world, progress=progress)
                report = evaluate_launch(job, storage, bench.to_dict(), shape)
                report_box.append(report)
                return report

            try:
                run_and_emit(run, output=open_output(output_dir, "preflight"), plot_path=plot_path, output_format=output_format,
                             plot=_plot, print_tables=lambda report, doc: _print(doc))
            finally:
                code = report_box[0].verdict.exit_code if report_box else 2
                world.broadcast(code, "sharing the verdict")
            return code
    finally:
        leave_world()


def evaluate_launch(job: Any, storage: Any, bench: dict[str, Any], shape: str) -> PreflightReport:
    """The verdict on a distributed measurement (``ckptbench.bench.distributed/1``) of ``shape``."""
    from ckptbench import knobs, native
    from ckptbench.decide.verdict import evaluate, measurements_from_launch
    from ckptbench.storage.local_target import LocalDirectory

    local = isinstance(storage, LocalDirectory)
    env = bench["environment"]
    fstype = (env.get("target") or {}).get("filesystem") or ""
    measurements = measurements_from_launch(
        bench, shape=shape, memcpy_bps=native.memcpy_bandwidth(knobs.MEMCPY_PROBE_BYTES, 3),
        shared_storage=not local or fstype.startswith(SHARED_FILESYSTEMS),
        free_bytes=storage.free_bytes() if local else None, host_memory_bytes=env.get("memory_bytes"),
        threads=knobs.SAVE_THREADS)
    return PreflightReport(target=str(storage), verdict=evaluate(job, measurements), bench=bench)


def _pair(values: tuple[float, float] | None) -> list[float] | None:
    return list(values) if values is not None else None


def measure_and_evaluate(job: Any, spec: Any, storage: Any, workload: Any, progress: Any, *,
                         budget_s: float = 0.0) -> PreflightReport:
    """Run the writer on ``storage`` and turn its numbers into the verdict.

    One process saves and cold-loads the sample (its writer settings, the CPU probe, and against the writer's
    own rate into memory, which side limits). The node's times come from two sizes of the sample (a quarter
    and the whole), each written by as many processes at once as the node runs ranks (up to
    ``knobs.SAMPLE_RANKS_MAX`` and the cores), fitted as a fixed part plus a per-byte part
    (:mod:`ckptbench.decide.scaling`) and read at the node's bytes. A third, larger size nearer the node's
    bytes (the node's own when it fits) is measured when the host's memory and ``budget_s`` allow it, in
    two or three sessions (fresh processes sharing the runs) whose runs are pooled: runs made in one process
    agree more closely than a job's saves minutes later do, and the range must cover the latter. Time the
    budget leaves at that size buys more runs of it (:func:`_extended`)."""
    import dataclasses
    import os
    import statistics

    from ckptbench import knobs
    from ckptbench.bench.ceiling import bottleneck, writer_ceiling_bps
    from ckptbench.bench.records import MEMORY_FILESYSTEMS
    from ckptbench.bench.shootout import plan, run_checkpoint_bench
    from ckptbench.bench.sustained import write_slowdown
    from ckptbench.checkpoint.host_memory import proactive_reclaim, reports_free_memory
    from ckptbench.decide.scaling import fit_sizes
    from ckptbench.decide.verdict import Measurements, evaluate
    from ckptbench.storage.local_target import LocalDirectory

    report = run_checkpoint_bench(spec, storage, progress=progress, workload=workload)
    doc = report.to_dict()
    ours = report.result("ckptbench")
    (async_,) = report.async_results
    env = doc["environment"]
    fstype = (env.get("target") or {}).get("filesystem") or ""
    local = isinstance(storage, LocalDirectory)
    progress.phase("the writer's own rate into memory (tmpfs)")
    ceiling = writer_ceiling_bps(workload, threads=spec.threads)
    # More writer processes than cores would measure this host's CPU contention, not the storage.
    writers = min(job.ranks, job.ranks_per_node, knobs.SAMPLE_RANKS_MAX, os.cpu_count() or 1, _gpus(spec.device))
    if writers < 2 or not local:
        writers = 1
    small = plan(dataclasses.replace(spec, size_bytes=workload.total_bytes // 4))

    def measure(sample: Any, repeat: int = spec.repeat, session: str = "") -> tuple[int, dict[str, list[float]],
                                                                                   dict[str, Any]]:
        """The runs of ``sample`` (a workload; the one already measured: ``workload``); ``session``: which of
        several processes measuring it this is, for the progress line."""
        if writers == 1:
            if sample is workload:
                return _doc_runs(doc)
            progress.phase(f"the sample at {format_size(sample.total_bytes)}{session}")
            sized = dataclasses.replace(spec, size_bytes=sample.total_bytes, repeat=repeat)
            if not local:
                return _doc_runs(run_checkpoint_bench(sized, storage, progress=progress, workload=sample).to_dict())
            from ckptbench.bench.local_ranks import run_sample_fresh

            # In a process of its own, as a rank starts, with the settings this one's writer settled on.
            return _doc_runs(run_sample_fresh(sized, str(storage), settings=_writer_settings(ours)))
        from ckptbench.bench.local_ranks import run_local_ranks

        progress.phase(f"{writers} writers at once ({format_size(sample.total_bytes)} in all), as a node's ranks"
                       f"{session}")
        together = run_local_ranks(str(storage), ranks=writers, size_bytes=sample.total_bytes, model=spec.model,
                                   repeat=repeat, warmup=1, device="cpu" if spec.device == "cpu" else "cuda")
        return _together_runs(together)

    def measure_in_sessions(sample: Any, repeat: int) -> tuple[int, dict[str, list[float]], dict[str, Any]]:
        """``sample``'s ``repeat`` runs measured in fresh processes one after the other (:func:`session_runs`),
        pooled."""
        split = session_runs(repeat)
        sessions = [measure(sample, repeat=n, session=f", session {i + 1} of {len(split)}")
                    for i, n in enumerate(split)]
        nbytes, runs, first_doc = sessions[0]
        pooled = {q: [t for _, r, _ in sessions for t in r[q]] for q in runs}
        session_medians.extend({q: statistics.median(r[q]) for q in r} for _, r, _ in sessions)
        return nbytes, pooled, first_doc

    session_medians: list[dict[str, float]] = []

    target = job.node_bytes
    large_bytes, large_runs, large_doc = measure(workload)
    measured = [(large_bytes, large_runs, large_doc)]
    if small.total_bytes < workload.total_bytes:
        measured.insert(0, measure(small))
    extended = _extended(job, spec, workload, large_bytes, large_runs, writers, budget_s,
                         warmups=lambda n: (len(session_runs(n)) if local else 1) * spec.warmup)
    largest_repeat = spec.repeat
    if extended is not None:  # a target measured in this process (object storage) has no fresh sessions
        sample, largest_repeat = extended
        measured.append(measure_in_sessions(sample, largest_repeat) if local
                        else measure(sample, repeat=largest_repeat))
    sizes = [b for b, _, _ in measured]
    largest_bytes, _, largest_doc = measured[-1]
    # The bytes beyond the largest sample go no faster than the writers into memory (saves) or a memory copy
    # (loads): a line flattened by noise must not predict a node faster than that.
    memcpy = report.memcpy_bps or 0.0
    fastest = {"save": max(ceiling or [memcpy]) * writers, "load": memcpy * writers}
    fastest["persist"] = fastest["save"]
    fitted = {q: fit_sizes(sizes, [r[q] for _, r, _ in measured], target,
                           min_slope=1 / fastest[q] if fastest.get(q) else 0.0) for q in large_runs}
    doc["scaling"] = {"sizes_bytes": sizes, "target_bytes": target, "writers": writers,
                      "budget_s": budget_s, "fastest_bps": fastest, "largest_repeat": largest_repeat,
                      "runs_s": {q: [r[q] for _, r, _ in measured] for q in large_runs},
                      "fitted": {q: f.as_dict() for q, f in fitted.items()},
                      "largest_sessions": session_medians,
                      "measurements": [d for _, _, d in measured] if writers > 1 else None}
    save, load, stall, persist = (fitted[q] for q in ("save", "load", "stall", "persist"))
    # Writes past the write-back cache: the node's bytes beyond a burst go at the sustained rate.
    slower = 1.0
    if local and fstype not in MEMORY_FILESYSTEMS:
        sustained = _sustained_write(storage, ours, workload.total_bytes, writers, progress)
        steady = sustained.steady
        # A sample larger than the burst already wrote past it: its fitted rate includes the drop.
        if not steady.burst or largest_bytes <= (steady.burst_bytes or 0):
            slower = write_slowdown(steady, target, target / save.point_s)
        doc["sustained"] = {**sustained.to_dict(), "used": slower > 1, "slowdown": slower,
                            "fitted_write_bps": target / save.point_s}
    fresh = _fresh_memory(target, largest_bytes, budget_s, progress)
    doc["fresh_memory"] = fresh.to_dict() if fresh is not None else None
    measurements = Measurements(
        measured_bytes=target, write_bps=target / save.point_s / slower, read_bps=target / load.point_s,
        stall_s=stall.point_s, persist_s=persist.point_s * slower,
        write_bps_range=(target / save.high_s / slower, target / save.low_s / slower),
        read_bps_range=(target / load.high_s, target / load.low_s),
        stall_s_range=(stall.low_s, stall.high_s), persist_s_range=(persist.low_s * slower, persist.high_s * slower),
        **_interference(spec.device, async_),
        memcpy_bps=report.memcpy_bps, shared_storage=not local or fstype.startswith(SHARED_FILESYSTEMS),
        free_bytes=storage.free_bytes() if local else None, host_memory_bytes=env.get("memory_bytes"),
        threads=ours.details.get("threads", 0),
        # O_DIRECT and the block size are a filesystem's settings: on object storage the unit is the part
        direct=bool(ours.details.get("direct")) if local else None,
        block_size_bytes=ours.details.get("block_size_bytes") if local else None, shape="sample",
        bottleneck=bottleneck(ours.save.gbps * 1e9, ceiling), writers=writers, sampled_bytes=largest_bytes,
        per_rank_bytes=max(largest_doc["rank_bytes"]) if writers > 1 else largest_bytes, device=spec.device,
        fresh_memory_bps=fresh.bps if fresh is not None else None,
        hypervisor_reclaims=fresh.hypervisor_reclaims if fresh is not None else reports_free_memory(),
        proactive_reclaim_s=proactive_reclaim(),
    )
    if writers > 1:
        doc["together"] = largest_doc
    return PreflightReport(target=str(storage), verdict=evaluate(job, measurements), bench=doc)


def _fresh_memory(node_bytes: int, sampled_bytes: int, budget_s: float, progress: Any) -> Any:
    """The host's rate of faulting the node's restore bytes of fresh memory in (bench.fresh_memory), after the
    sample's runs, as a restarted job's restore finds the host; None where it cannot be measured. Without a
    time budget for a larger sample (``budget_s``), at most the sample's bytes are faulted in."""
    from ckptbench import knobs
    from ckptbench.bench.fresh_memory import measure_fresh_memory

    if not knobs.FRESH_MEMORY_SHARE:
        return None
    limit = node_bytes if budget_s > 0 else min(node_bytes, sampled_bytes)
    progress.phase(f"faulting in {format_size(limit)} of fresh memory, as a restore's tensors")
    fresh = measure_fresh_memory(node_bytes, limit_bytes=limit,
                                 budget_s=min(knobs.FRESH_MEMORY_MAX_S, budget_s / 3 or 1.0))
    progress.end_step(fresh.faulted_bytes if fresh is not None else 0)
    return fresh


def _gpus(device: str) -> int:
    """How many sample writers ``device`` allows: one per GPU (a node's ranks each have their own)."""
    if device == "cpu":
        return 1 << 30
    if device != "cuda":
        return 1  # one named GPU: one writer
    from ckptbench.bench.workloads import gpu_count

    return max(1, gpu_count())


def _interference(device: str, async_: Any) -> dict[str, Any]:
    """Measurements' interference fields: on a GPU the compute probe is the training device's slowdown and
    decides (point = median of the runs, range = their extremes); on the CPU it is information only."""
    from ckptbench.decide.verdict import interference_fraction

    if device == "cpu":
        return {"interference": None, "probe_interference": interference_fraction(async_.interference_median)}
    runs = [interference_fraction(v) for v in async_.interference if v is not None]
    if not runs:
        return {"interference": None, "probe_interference": None}
    return {"interference": interference_fraction(async_.interference_median),
            "interference_range": (min(runs), max(runs)), "probe_interference": None}


#: The share of the available memory a larger sample may take (with the copies the bench keeps of it).
SAMPLE_MEMORY_SHARE = 0.6


#: The processes the largest sample is measured in, one after the other (their runs pooled): two, and up to
#: this many when spare time buys the runs for them (two runs or more each).
SESSIONS_MAX = 3

#: The most runs of the largest sample that spare time may buy: this many times ``--repeat``.
SPARE_RUNS_FACTOR = 2


def session_runs(repeat: int) -> list[int]:
    """The runs of each session: ``repeat`` shared out as evenly as it goes (3: 2 and 1; 6: 2, 2 and 2), each
    session with a warm-up of its own; one run is one session."""
    sessions = min(SESSIONS_MAX, max(2, repeat // 2), repeat)
    return [repeat // sessions + (i < repeat % sessions) for i in range(sessions)]


def _extended(job: Any, spec: Any, workload: Any, sampled_bytes: int, runs: dict[str, list[float]], writers: int,
              budget_s: float, *, warmups: Callable[[int], int]) -> tuple[Any, int] | None:
    """The workload of the size to measure next, nearer the node's bytes, and its measured runs: ``--repeat``,
    and more where the size is set by the node's bytes or the host's memory and the budget has time left
    (:func:`~ckptbench.decide.scaling.affordable_runs`, up to :data:`SPARE_RUNS_FACTOR` times). None: no time,
    no memory, or the sample is the node's size already. ``warmups(runs)``: the warm-up runs that go with
    ``runs`` measured ones."""
    import dataclasses
    import statistics

    from ckptbench.bench.shootout import MEMORY_COPIES, plan
    from ckptbench.checkpoint.host_memory import available_memory_bytes
    from ckptbench.decide.scaling import affordable_runs, extended_size

    available = available_memory_bytes()
    if budget_s <= 0 or available is None or job.node_bytes <= sampled_bytes:
        return None
    run_seconds = sum(statistics.median(runs[q]) for q in ("save", "load", "stall", "persist"))
    most = workload.full_bytes
    if spec.device != "cpu":  # the GPU holds the state_dict and a loaded copy (bench.workloads.DEVICE_COPIES)
        from ckptbench.bench.workloads import DEVICE_COPIES, device_free_bytes

        most = min(most, device_free_bytes(spec.device) * SAMPLE_MEMORY_SHARE / DEVICE_COPIES * writers)
    size = extended_size(job.node_bytes, sampled_bytes, run_seconds, runs=spec.repeat + warmups(spec.repeat),
                         memory_bytes=available * SAMPLE_MEMORY_SHARE, copies=MEMORY_COPIES, budget_s=budget_s,
                         most_bytes=most)
    if size is None:
        return None
    # In proportion to the bytes: a run's fixed part makes this an overestimate, never a budget overrun.
    repeat = affordable_runs(budget_s, run_seconds * size / sampled_bytes, least=spec.repeat,
                             most=spec.repeat * SPARE_RUNS_FACTOR, warmups=warmups)
    return plan(dataclasses.replace(spec, size_bytes=size // writers * writers), size_option="--measure-size"), repeat


def _sustained_write(storage: Any, ours: Any, sample_bytes: int, writers: int, progress: Any) -> Any:
    """The sample's writer settings writing long enough to pass the write-back cache
    (:mod:`ckptbench.bench.sustained`), with a timeline of about 20 intervals (1 s at most)."""
    from ckptbench.bench.sustained import interval_for, probe_bytes, read_dirty_limits, run_sustained_write

    direct = bool(ours.details.get("direct"))
    limits = read_dirty_limits()
    rate = ours.save.gbps * 1e9
    size, why = probe_bytes(limits, direct=direct, sample_bytes=sample_bytes, rate_bps=rate,
                            free_bytes=storage.free_bytes())
    return run_sustained_write(storage, size, threads=max(ours.details.get("threads") or 1, writers),
                               block_size=ours.details.get("block_size_bytes") or 4 << 20, direct=direct,
                               reason=why, interval_s=interval_for(size, rate), progress=progress, limits=limits)


def _doc_runs(doc: dict[str, Any]) -> tuple[int, dict[str, list[float]], dict[str, Any]]:
    """Bytes per run and the runs' seconds of one process's save, load, async stall and persist, from its
    checkpoint-bench document."""
    ours = next(r for r in doc["results"] if r["writer"] == "ckptbench")
    async_ = next(a for a in doc["async"] if a["writer"] == "ckptbench")
    return ours["save"]["bytes_per_run"], {"save": list(ours["save"]["runs_s"]), "load": list(ours["load"]["runs_s"]),
                                           "stall": list(async_["runs_stall_s"]),
                                           "persist": list(async_["runs_persist_s"])}, {}


def _writer_settings(ours: Any) -> dict[str, str]:
    """``CKPTBENCH_SAVE_*`` for the writer settings ``ours`` (a shoot-out result) used, so that another process
    saves the same way without measuring the mount again."""
    d = ours.details
    out = {}
    if d.get("direct") is not None:
        out["CKPTBENCH_SAVE_DIRECT"] = "1" if d["direct"] else "0"
    if d.get("threads"):
        out["CKPTBENCH_SAVE_THREADS"] = str(d["threads"])
    if d.get("block_size_bytes"):
        out["CKPTBENCH_SAVE_BLOCK_BYTES"] = str(d["block_size_bytes"])
    return out


def _together_runs(doc: dict[str, Any]) -> tuple[int, dict[str, list[float]], dict[str, Any]]:
    """The same for writers at once (a distributed bench): a round's time is its slowest writer's."""
    rounds = doc["rounds"]
    return sum(doc["rank_bytes"]), {
        "save": [r["duration_s"] for r in rounds["save"]], "load": [r["duration_s"] for r in rounds["load"]],
        "stall": [r["stall_s"] for r in rounds["async"]],
        "persist": [max(r["duration_s"] - r["stall_s"], 1e-9) for r in rounds["async"]]}, doc


def _plot(document: dict[str, Any], path: Path) -> None:
    from ckptbench.report.preflight_plot import plot_waste_curve

    plot_waste_curve(document, path)


def _print(doc: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    job, p, m = doc["job"], doc["predictions"], doc["measurements"]
    ck = job["checkpoint"]
    env_target = doc["environment"].get("target") or {}
    console.print(
        f"[bold]{doc['target']}[/] ({env_target.get('filesystem')})  ·  job: {job['model']}, {job['ranks']} ranks on "
        f"{job['nodes']} node(s), {ck['recipe']['description']}, {ck['parallelism']['sharding']} sharding  ·  "
        f"MTBF {format_duration(job['failures']['mtbf_s'])} ({job['failures']['source']})")
    who = f"{m['writers']} writers at once" if m["writers"] > 1 else "one writer"
    if m.get("device", "cpu") != "cpu":
        who += f", the state_dict on {m['device']}: saves staged device-to-host, loads back to it"
    scaling = m["checkpoint_bench"].get("scaling") if m["shape"] == "sample" else None
    measured = f"measured ({who})"
    if scaling:
        sizes = scaling["sizes_bytes"]
        at = ", ".join(format_size(b) for b in sizes[:-1]) + f" and {format_size(sizes[-1])}"
        if any(abs(b / scaling["target_bytes"] - 1) <= SAME_SIZE for b in sizes):
            measured = f"measured ({who}) at {at}: the node's own bytes"
        else:
            measured = (f"measured ({who}) at {at}, fitted as fixed + per-byte through the two sizes nearest the "
                        "node's bytes and read there")
    console.print(
        f"{measured}: {format_size(m['measured_bytes'])} saved at {format_rate(m['write_bps'])} (durable), loaded at "
        f"{format_rate(m['read_bps'])} (cold), async stall {format_duration(m['async_stall_s'])}, persist "
        f"{format_duration(m['async_persist_s'])}"
        + (f", CPU probe {m['probe_interference']:.0%} (information)" if m["probe_interference"] is not None else ""))
    sustained = m.get("sustained")
    if sustained:
        steady = sustained["steady_state"]
        wrote = f"a {format_size(sustained['bytes'])} write ({sustained['why_this_size']})"
        if sustained["used"]:
            console.print(
                f"[yellow]write-back cache:[/] {wrote} ran at {steady['burst_gbps']:.2f} GB/s for the first "
                f"{format_size(steady['burst_bytes'])}, then {steady['sustained_gbps']:.2f} GB/s sustained: the node's "
                f"{format_size(p['checkpoint_per_node_bytes'])} use the sustained rate past that (save time "
                f"x{sustained['slowdown']:.2f})")
        elif steady["state"] == "burst":
            console.print(f"write-back cache: {wrote} dropped to {steady['sustained_gbps']:.2f} GB/s after "
                          f"{format_size(steady['burst_bytes'])}; not used: the node's checkpoint fits before the drop, "
                          "the save rate measured is no faster, or a sample already wrote past it")
        else:
            console.print(f"sustained rate: {wrote}: {steady['state']}, no drop from a burst rate")
    limit = m.get("bottleneck") or {}
    if limit.get("limit") == "writer":
        console.print(f"[yellow]writer-bound:[/] one process saved at {limit['fraction_of_ceiling']:.0%} of the writer's "
                      f"own rate into memory here ({format_rate(limit['writer_ceiling_bps'])}): these rates are this "
                      "host's limit, not the storage's")
    elif limit.get("limit") == "unknown" and limit.get("writer_ceiling_bps"):
        console.print(f"bottleneck unknown: one process saved faster than the writer's own rate into memory here "
                      f"({format_rate(limit['writer_ceiling_bps'])}); the host was busy during one of them")
    elif limit.get("limit") == "storage":
        console.print(f"storage-bound: one process saved at {limit['fraction_of_ceiling']:.0%} of the writer's own "
                      f"rate into memory here ({format_rate(limit['writer_ceiling_bps'])})")
    fresh = m.get("fresh_memory")
    if fresh:
        slow = p.get("restore_memory_bound")
        console.print(
            f"{'[yellow]memory-bound restore:[/] ' if slow else ''}fresh memory faulted in at {format_rate(fresh['bps'])} "
            f"(chunks {format_rate(fresh['slowest_chunk_bps'])}–{format_rate(fresh['fastest_chunk_bps'])})"
            + (": slower than the slowest cold reads; a restore's new tensors wait for it, and its range reaches "
               "that far" if slow else "")
            + ("; a VM handing free memory back to its hypervisor" if fresh["hypervisor_reclaims"] else "")
            + (f"; the kernel pages out memory unaccessed for {format_duration(m['proactive_reclaim_s'])} (DAMON)"
               if m.get("proactive_reclaim_s") is not None else ""))
    console.print(f"interference used: {p['interference']:.0%} ({p['interference_source']})")
    console.print(
        f"checkpoint: {format_size(p['checkpoint_total_bytes'])} in all, {format_size(p['checkpoint_per_rank_bytes'])} "
        f"per rank (busiest), {format_size(p['checkpoint_per_node_bytes'])} per node; each rank gets "
        f"{format_rate(p['per_rank_write_bps'])}")
    shape = {"sample": f"a sample ({who}, up to {format_size(m['sampled_bytes'] or m['measured_bytes'])}), scaled "
                       "to the node",
             "nodes": "the job's ranks on a subset of its nodes", "job": "the whole job"}[m["shape"]]
    table = Table(header_style="bold", title=f"predicted from {shape}: point (range)", title_justify="left")
    for name in ("sync save", "async stall", "persist", "restore", "interval", "optimum", "overhead", "goodput"):
        table.add_column(name, justify="right")
    plateau = p["optimal_interval_plateau_s"]

    def ranged(key: str, shown: Any = format_duration) -> str:
        low, high = p.get(f"{key}_range") or (None, None)
        point = shown(p[key])
        if low is None or high is None:
            return point
        return f"{point}\n({shown(low)}–{shown(high)})" if shown(low) != shown(high) else point

    def percent(value: float) -> str:
        return f"{value:.2%}"

    table.add_row(ranged("sync_checkpoint_s"), ranged("async_stall_s"), ranged("async_persist_s"),
                  ranged("restore_s"),
                  format_duration(p["interval_s"]) + (" (opt.)" if p["interval_is_optimal"] else ""),
                  f"{format_duration(p['optimal_interval_s'])} {p['mode']}\n(flat {format_duration(plateau[0])}–"
                  f"{format_duration(plateau[1])})",
                  ranged("overhead_fraction", percent), ranged("goodput", percent))
    console.print(table)
    wasted = f"{p['wasted_gpu_hours_per_day']:.1f} GPU-hours/day wasted"
    if p["wasted_usd_per_day"] is not None:
        wasted += f" (${p['wasted_usd_per_day']:,.0f}/day)"
    console.print(wasted)
    checks = Table(header_style="bold", title="checks", title_justify="left")
    for name in ("check", "status", "detail"):
        checks.add_column(name)
    for c in doc["checks"]:
        detail = c["message"] + (f" [dim]→ {c['remedy']}[/]" if c["remedy"] else "")
        checks.add_row(c["name"], f"[{_STYLE[c['status']]}]{c['status']}[/]", detail)
    console.print(checks)
    console.print("recommendation:")
    for a in doc["recommendation"]:
        value = a["value"]
        shown = format_duration(value) if a["setting"].endswith("_s") else (
            format_size(value) if a["setting"].endswith("_bytes") else value)
        console.print(f"  {a['setting']} = {shown}  [dim]{a['reason']}[/]")
    console.print(f"verdict: [{_STYLE[doc['verdict']]}]{doc['verdict']}[/]")
