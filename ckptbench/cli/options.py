"""Options several commands share and how they are resolved: the failure rate (``interval``, ``goodput``,
``compare``, ``preflight``, ``recommend``), an asynchronous checkpoint's cost (``interval``, ``goodput``),
flags overriding ``--config``, ``--from RESULT.json`` (a measurement instead of hand-copied numbers), and
the one reader of result files (``bench.records.read_result``). Nothing here imports torch or numpy.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ckptbench.cli import params
from ckptbench.errors import UsageError
from ckptbench.model import interval as model
from ckptbench.model.failures import MAX_COUNT, FailureModel
from ckptbench.model.interference import ASSUMED
from ckptbench.units import format_duration

log = logging.getLogger(__name__)



def read_result(path: Path) -> dict[str, Any]:
    """:func:`ckptbench.bench.records.read_result`, imported when used: `interval` and `goodput` start
    without numpy."""
    from ckptbench.bench.records import read_result as read

    return read(path)


#: The results ``--from`` reads where any measurement of the writer serves.
ANY_RESULT = "`ckptbench bench` (a sweep, --workload checkpoint, under torchrun) or `ckptbench preflight`"


def from_result_option(what: str, sources: str = ANY_RESULT) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--from RESULT.json``: take ``what`` from a measurement (``sources``: by default bench, shoot-out,
    distributed or preflight)."""
    return click.option("--from", "from_result", type=params.RESULT_FILE, default=None, metavar="RESULT.json",
                        help=f"Take {what} from a result of {sources} instead of typing them.")


def measured_from(path: Path) -> Any:
    """The checkpoint rates a result file measured (``decide.advice.MeasuredRates``), its schema checked."""
    from ckptbench.decide.advice import rates_from_result

    return rates_from_result(str(path), read_result(path))


#: Counts of GPUs and nodes (shared with ``goodput``): refused where they are parsed past the
#: model's :data:`~ckptbench.model.failures.MAX_COUNT`, before a float overflows on them.
GPU_COUNT = params.Bounded(params.POSITIVE_INT, MAX_COUNT, f"{MAX_COUNT:,} GPUs")
NODE_COUNT = params.Bounded(params.POSITIVE_INT, MAX_COUNT, f"{MAX_COUNT:,} nodes")


def two_level_options(*, local_help: str, remote_every_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The two-level flags: --local DIR, --remote DIR|URL, --local-loss, --remote-every (``local_dir``,
    ``remote_url``, ``local_loss``, ``remote_every``)."""
    options = [
        click.option("--local", "local_dir", default=None, metavar="DIR", help=local_help),
        click.option("--remote", "remote_url", default=None, metavar="DIR|URL",
                     help="Two levels: the durable remote tier (a directory or s3://bucket/prefix), with --local."),
        click.option("--local-loss", default=None, metavar="FRACTION|PRESET",
                     help="Two levels: the share of failures that lose the node's local copy (30%, or a failure "
                          "preset that gives it: llama3)  [default: the failure preset's]."),
        click.option("--remote-every", type=params.POSITIVE_INT, default=None, help=remote_every_help),
    ]

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def failure_options(*, with_count: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The failure-rate flags: one of --mtbf, --gpu-mtbf (with a GPU count), --node-mtbf, --faults-per-day, --failures."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.option("--mtbf", type=params.BOUNDED_DURATION, default=None,
                         help="MTBF of the whole job: 3h, 90m."),
            click.option("--gpu-mtbf", type=params.BOUNDED_DURATION, default=None,
                         help="MTBF of one GPU (50000h); divided by the GPU count."),
            click.option("--node-mtbf", type=params.BOUNDED_DURATION, default=None,
                         help="MTBF of one node; divided by the node count."),
            click.option("--faults-per-day", type=params.FINITE_POSITIVE_NUMBER, default=None,
                         help="Faults of the whole job per day: 1, 0.5."),
            click.option("--failures", metavar="PRESET", default=None,
                         help="A failure preset from configs/failures: llama3, mlcommons, one-per-day."),
        ]
        if with_count:
            options += [
                click.option("--gpus", type=GPU_COUNT, default=None,
                             help="GPUs in the job (for --gpu-mtbf, and to scale --failures presets)."),
                click.option("--nodes", type=NODE_COUNT, default=None,
                             help="Nodes in the job (for --node-mtbf)."),
            ]
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


#: The failure-rate options (click names): each gives the rate alone, so any two compete.
FAILURE_RATE = ("mtbf", "gpu_mtbf", "node_mtbf", "faults_per_day", "failures")


def is_set(value: Any) -> bool:
    return value is not None and value is not False


def flags_override_config(
    opts: dict[str, Any], *rivals: tuple[str, ...], serving: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """Let a flag typed on the command line override the ``--config`` values it competes with, in ``opts``.

    Each of ``rivals`` is a group of options (click names) that give the same thing (the failure rate,
    the model size). Where one of a group is on the command line, the others set by the config file are
    reset to their defaults (logged at INFO), so the commands' "both give" checks refuse only flags
    typed together, as the config files promise. ``serving`` maps a config option that only serves
    others (``bandwidth`` serves ``size``, ``params``, ``model``) to them: it goes with them when it
    serves nothing left. Call it before any check, from inside a command.
    """
    ctx = click.get_current_context()
    source = ctx.get_parameter_source
    defaults = {param.name: param.default for param in ctx.command.params}
    from_config = {name for name, value in opts.items()
                   if is_set(value) and source(name) == click.core.ParameterSource.DEFAULT_MAP}
    dropped: set[str] = set()

    def drop(name: str, why: str) -> None:
        log.info("%s = %r from --config is dropped: %s", name.replace("_", "-"), opts[name], why)
        opts[name] = defaults[name]
        from_config.discard(name)
        dropped.add(name)

    for group in rivals:
        typed = [name for name in group if is_set(opts[name])
                 and source(name) == click.core.ParameterSource.COMMANDLINE]
        for name in (group if typed else ()):
            if name in from_config:
                drop(name, f"--{typed[0].replace('_', '-')} on the command line overrides it")
    for name, served in (serving or {}).items():
        if name in from_config and dropped & set(served) and not any(is_set(opts[s]) for s in served):
            drop(name, "what it serves was overridden")


def resolve_failures(
    *, mtbf_s: float | None, gpu_mtbf_s: float | None, node_mtbf_s: float | None, faults_per_day: float | None,
    failure_preset: str | None, gpus: int | None, nodes: int | None, count_given: bool,
) -> FailureModel | None:
    """The job's failure model from whichever single flag gave it (``None`` when none did).

    ``count_given``: ``--gpus``/``--nodes`` were typed on this command line for the MTBF (not the
    run size, as in ``goodput``), so they are rejected where nothing uses them.
    """
    from ckptbench.model import presets

    given = [flag for flag, value in (
        ("--mtbf", mtbf_s), ("--gpu-mtbf", gpu_mtbf_s), ("--node-mtbf", node_mtbf_s),
        ("--faults-per-day", faults_per_day), ("--failures", failure_preset),
    ) if value is not None]
    if len(given) > 1:
        raise UsageError(f"{given[0]} and {given[1]} both give the failure rate", hint="give one of them")
    if gpu_mtbf_s is not None and gpus is None:
        raise UsageError("--gpu-mtbf needs --gpus (the GPU count it is divided by)")
    if node_mtbf_s is not None and nodes is None:
        raise UsageError("--node-mtbf needs --nodes (the node count it is divided by)")
    if count_given:
        if gpus is not None and gpu_mtbf_s is None and failure_preset is None:
            raise UsageError(f"--gpus {gpus} is used only with --gpu-mtbf or --failures")
        if nodes is not None and node_mtbf_s is None:
            raise UsageError(f"--nodes {nodes} is used only with --node-mtbf")
    if mtbf_s is not None:
        failures = FailureModel(mtbf_s, source=f"--mtbf {format_duration(mtbf_s)}")
    elif gpu_mtbf_s is not None:
        assert gpus is not None
        failures = FailureModel.from_unit_mtbf(gpu_mtbf_s, gpus, unit="GPU")
    elif node_mtbf_s is not None:
        assert nodes is not None
        failures = FailureModel.from_unit_mtbf(node_mtbf_s, nodes, unit="node")
    elif faults_per_day is not None:
        per_day = FailureModel.from_faults_per_day(faults_per_day)
        failures = dataclasses.replace(per_day, source=f"--faults-per-day {faults_per_day:g}")
    elif failure_preset is not None:
        failures = presets.load_failures(failure_preset).model(gpus)
    else:
        return None
    low, high = params.DURATION_RANGE_S
    if not low <= failures.mtbf_s <= high:
        raise UsageError(
            f"{failures.source} gives a job MTBF of {failures.mtbf_s:.3g} s: outside the 1 ns to {high:.0e} s the "
            "model takes",
        )
    return failures


def async_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--stall / --persist / --interference: an asynchronous checkpoint."""
    func = click.option("--interference", type=params.FRACTION_OR_ZERO, default=None,
                        help="Async: fraction of training throughput lost while a checkpoint persists (5%)  "
                             f"[default: {ASSUMED.point:.0%}, assumed: see --explain].")(func)
    func = click.option("--persist", type=params.BOUNDED_DURATION, default=None,
                        help="Async: staging end to durable (default: the checkpoint time).")(func)
    func = click.option("--stall", type=params.BOUNDED_DURATION, default=None,
                        help="Async: time training is blocked per checkpoint (staging); makes it async.")(func)
    return func


def resolve_cost(
    write_s: float | None, write_flag: str, *, stall_s: float | None, persist_s: float | None,
    interference: float | None,
) -> model.CheckpointCost | None:
    """A sync cost from the write time, or an async one from --stall (+ --persist or the write time as persist)."""
    if stall_s is None:
        for flag, value in (("--persist", persist_s), ("--interference", interference)):
            if value is not None:
                raise UsageError(f"{flag} describes asynchronous checkpoints; add --stall (the blocking part)")
        return model.CheckpointCost.sync(write_s) if write_s is not None else None
    if persist_s is not None and write_s is not None:
        raise UsageError(f"--persist and {write_flag} both give the persist time", hint="give one of them")
    persist = persist_s if persist_s is not None else write_s
    if persist is None:
        raise UsageError("--stall needs the persist time: --persist, or the checkpoint time or size")
    return model.CheckpointCost(stall_s, persist, ASSUMED.point if interference is None else interference)


#: Click parameter name (the flag, as ``--config`` TOML keys use it) -> the name with its unit used in code.
OPTION_KEYS: dict[str, str] = {
    "ckpt_time": "ckpt_time_s", "size": "size_bytes", "params": "param_count", "model": "model_preset",
    "bandwidth": "bandwidth_bytes_per_s", "stall": "stall_s", "persist": "persist_s", "mtbf": "mtbf_s",
    "gpu_mtbf": "gpu_mtbf_s", "node_mtbf": "node_mtbf_s", "failures": "failure_preset", "restart": "restart_s",
    "every": "every_s", "plot": "plot_path", "simulate": "simulate_runs", "work": "work_s",
    "detect": "detect_s", "replace": "replace_s", "resume": "resume_s", "ckpt_interval": "ckpt_interval_s",
    "remote_ckpt_time": "remote_ckpt_time_s", "remote_restart": "remote_restart_s",
}


def named(opts: dict[str, Any]) -> dict[str, Any]:
    """The command's options under the names code uses (units in the names)."""
    return {OPTION_KEYS.get(key, key): value for key, value in opts.items()}


def resolve_local_loss(text: str | None, failure_preset: str | None) -> tuple[float, str]:
    """``q`` and its source from ``--local-loss`` (a fraction, or a failure preset that gives one) or the preset."""
    from ckptbench.model import presets
    from ckptbench.units import parse_fraction

    if text is None:
        if failure_preset is not None:
            preset = presets.load_failures(failure_preset)
            if preset.local_loss is not None:
                return preset.local_loss, f"preset {failure_preset} (--failures): {preset.local_loss:.1%} of failures"
        raise UsageError("two levels need --local-loss: the share of failures that lose the node's local copy "
                         "(30%, or a failure preset that gives it: llama3)")
    if text in presets.preset_names("failures"):
        preset = presets.load_failures(text)
        if preset.local_loss is None:
            with_share = [n for n in presets.preset_names("failures") if presets.load_failures(n).local_loss is not None]
            raise UsageError(f"--local-loss {text}: that failure preset does not give the share of failures that "
                             f"lose a node", hint=f"give a fraction (30%) or one of: {', '.join(with_share) or 'none'}")
        return preset.local_loss, f"preset {text}: {preset.local_loss:.1%} of failures take a node out"
    try:
        return parse_fraction(text, allow_zero=True), "given (--local-loss)"
    except ValueError as exc:
        raise UsageError(f"--local-loss: {exc}, or a failure preset (llama3)") from None


def checked_device(device: str, sample_bytes: int, *, launched: bool) -> str:
    """``--device`` checked before anything is measured: cpu, or a GPU torch sees with room for
    ``sample_bytes`` (under a launch: cpu or cuda, each rank on its own GPU, checked by the ranks)."""
    import re

    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise UsageError(f"--device {device!r} must be cpu, cuda or cuda:N")
    if launched and device not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: under a launch each rank uses its own GPU",
                         hint="give --device cuda (rank r uses cuda:LOCAL_RANK)")
    if device != "cpu" and not launched:
        from ckptbench.bench.workloads import check_device

        check_device(device, sample_bytes)
    return device
