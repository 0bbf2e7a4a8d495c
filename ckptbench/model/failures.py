"""The cluster's failure rate: one mean time between failures (MTBF) for the whole job.

A synchronous training job stops when any of its parts fails, so with ``N`` parts that each fail
independently at rate ``1/M`` the job fails at rate ``N/M``: ``M_sys = M / N`` (exact for
exponential lifetimes, the standard assumption). Three ways in:

* a per-GPU or per-node MTBF and a count: :meth:`FailureModel.from_unit_mtbf`;
* a number of faults per day for the whole cluster: :meth:`FailureModel.from_faults_per_day`;
* a published run (``interruptions`` over ``days`` on ``gpus``): :meth:`FailureModel.from_run`,
  which infers the per-GPU MTBF and, given another GPU count, scales to it.

The closed forms in :mod:`ckptbench.model.interval` assume exponential (memoryless) failures;
``weibull_shape`` is carried for the simulator (:mod:`ckptbench.model.simulate`), which draws
Weibull times between failures with that shape and the same mean (a shape of at least
:data:`MIN_WEIBULL_SHAPE`). Counts of GPUs, nodes and interruptions are at most :data:`MAX_COUNT`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckptbench.errors import UsageError
from ckptbench.model import _checks

SECONDS_PER_DAY = 86400.0
SECONDS_PER_HOUR = 3600.0
#: Most GPUs, nodes or interruptions one job is given: 10^8, hundreds of times the largest clusters
#: built. Past it counts stop meaning anything (and past 10^308 they no longer convert to a float).
MAX_COUNT = 100_000_000
#: Smallest Weibull shape taken. Below it the time between failures is so skewed (at 0.1 its standard
#: deviation is already 430 times its mean) that no simulation reproduces its mean, and the scale,
#: ``M / Gamma(1 + 1/k)``, soon overflows (for ``k`` under about 0.006).
MIN_WEIBULL_SHAPE = 0.1


@dataclass(frozen=True)
class FailureModel:
    """Failures of the whole job: mean time between them ``mtbf_s`` and the Weibull shape of that time.

    ``weibull_shape`` 1 is exponential; below 1, failures cluster (infant mortality, bad batches of
    nodes); above 1, they wear out. ``source`` says in words where the number came from.
    """

    mtbf_s: float
    weibull_shape: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        _checks.positive("MTBF (s)", self.mtbf_s)
        check_weibull_shape("Weibull shape", self.weibull_shape)

    @property
    def faults_per_day(self) -> float:
        return SECONDS_PER_DAY / self.mtbf_s

    @property
    def rate_per_s(self) -> float:
        return 1.0 / self.mtbf_s

    @property
    def weibull_scale_s(self) -> float:
        """Scale ``lambda`` of a Weibull whose mean is the MTBF: ``lambda = M / Gamma(1 + 1/k)``."""
        return self.mtbf_s / math.gamma(1.0 + 1.0 / self.weibull_shape)

    @classmethod
    def from_unit_mtbf(
        cls, unit_mtbf_s: float, count: int, *, unit: str = "GPU", weibull_shape: float = 1.0,
    ) -> FailureModel:
        """``M_sys = M / N`` for ``count`` units (GPUs or nodes) each with MTBF ``unit_mtbf_s``."""
        _checks.positive(f"per-{unit} MTBF (s)", unit_mtbf_s)
        _checks.positive_int(f"{unit} count", count, at_most=MAX_COUNT)
        return cls(
            unit_mtbf_s / count,
            weibull_shape,
            f"{_hours(unit_mtbf_s)} per {unit} / {count:,} {unit}s",
        )

    @classmethod
    def from_faults_per_day(cls, faults_per_day: float, *, weibull_shape: float = 1.0) -> FailureModel:
        """``M_sys = 1 day / faults_per_day`` for the whole cluster."""
        _checks.positive("faults per day", faults_per_day)
        return cls(SECONDS_PER_DAY / faults_per_day, weibull_shape, f"{faults_per_day:g} faults per day")

    @classmethod
    def from_run(
        cls, interruptions: int, days: float, gpus: int, *, scale_to_gpus: int | None = None,
        weibull_shape: float = 1.0,
    ) -> FailureModel:
        """From a published run: ``M_sys = days / interruptions`` on ``gpus`` GPUs.

        With ``scale_to_gpus``, the per-GPU MTBF ``M_sys * gpus`` is divided by the new count
        (which assumes failures scale with the GPU count, as they do when most are hardware faults).
        """
        _checks.positive_int("interruptions", interruptions, at_most=MAX_COUNT)
        _checks.positive("days", days)
        _checks.positive_int("GPU count", gpus, at_most=MAX_COUNT)
        mtbf_s = days * SECONDS_PER_DAY / interruptions
        source = f"{interruptions} interruptions in {days:g} days on {gpus:,} GPUs"
        if scale_to_gpus is None or scale_to_gpus == gpus:
            return cls(mtbf_s, weibull_shape, source)
        _checks.positive_int("GPU count", scale_to_gpus, at_most=MAX_COUNT)
        per_gpu_s = mtbf_s * gpus
        return cls(per_gpu_s / scale_to_gpus, weibull_shape, f"{source}, scaled to {scale_to_gpus:,} GPUs")


@dataclass(frozen=True)
class FailurePreset:
    """A named failure rate from ``configs/failures/NAME.toml``: exactly one of three kinds.

    ``gpu_mtbf_hours`` (per GPU: needs a GPU count), ``faults_per_day`` (whole cluster, not scaled),
    or ``interruptions`` + ``days`` + ``gpus`` (a published run: scaled when a GPU count is given).
    ``local_loss``, where the source breaks its failures down, is the share of them that take a node
    out of the job and with it the node's local (level-1) checkpoint copy (two-level checkpointing:
    :mod:`ckptbench.model.twolevel`).
    """

    name: str
    description: str = ""
    gpu_mtbf_hours: float | None = None
    faults_per_day: float | None = None
    interruptions: int | None = None
    days: float | None = None
    gpus: int | None = None
    weibull_shape: float = 1.0
    local_loss: float | None = None

    def __post_init__(self) -> None:
        run = (self.interruptions, self.days, self.gpus)
        kinds = [self.gpu_mtbf_hours is not None, self.faults_per_day is not None, any(v is not None for v in run)]
        if sum(kinds) != 1:
            raise UsageError(
                f"failure preset {self.name!r} must give exactly one of gpu_mtbf_hours, faults_per_day, "
                "or interruptions + days + gpus",
            )
        if kinds[2] and any(v is None for v in run):
            raise UsageError(f"failure preset {self.name!r} needs all of interruptions, days and gpus")
        check_weibull_shape(f"failure preset {self.name!r}: weibull_shape", self.weibull_shape)
        if self.local_loss is not None:
            _checks.fraction(f"failure preset {self.name!r}: local_loss", self.local_loss, allow_zero=True)

    @property
    def scales_with_gpus(self) -> bool:
        return self.faults_per_day is None

    def model(self, gpus: int | None = None) -> FailureModel:
        """The cluster's failure model; ``gpus`` scales per-GPU and published-run presets to your job."""
        k = self.weibull_shape
        if self.gpu_mtbf_hours is not None:
            if gpus is None:
                raise UsageError(
                    f"failure preset {self.name!r} is a per-GPU MTBF ({self.gpu_mtbf_hours:g} h)",
                    hint="give the job's GPU count with --gpus",
                )
            model = FailureModel.from_unit_mtbf(self.gpu_mtbf_hours * SECONDS_PER_HOUR, gpus, weibull_shape=k)
        elif self.faults_per_day is not None:
            model = FailureModel.from_faults_per_day(self.faults_per_day, weibull_shape=k)
        else:
            assert self.interruptions is not None and self.days is not None and self.gpus is not None
            model = FailureModel.from_run(self.interruptions, self.days, self.gpus, scale_to_gpus=gpus, weibull_shape=k)
        source = f"preset {self.name}: {model.source}"
        if gpus is not None and not self.scales_with_gpus:
            source += " (for the whole job, not scaled by GPU count)"
        return FailureModel(model.mtbf_s, k, source)


def check_weibull_shape(name: str, shape: float) -> None:
    """Raise ``UsageError`` for a shape that is not a number of at least :data:`MIN_WEIBULL_SHAPE`."""
    _checks.positive(name, shape)
    if shape < MIN_WEIBULL_SHAPE:
        raise UsageError(
            f"{name} {shape:g} is below {MIN_WEIBULL_SHAPE:g}: failures that bursty are too skewed to simulate "
            f"(at {MIN_WEIBULL_SHAPE:g} the standard deviation of the time between them is already 430 times its mean)",
            hint=f"use a shape of at least {MIN_WEIBULL_SHAPE:g}",
        )


def _hours(seconds: float) -> str:
    return f"{seconds / SECONDS_PER_HOUR:,.6g} h"
