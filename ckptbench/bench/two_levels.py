"""Two tiers measured as two levels, the one code path of ``compare --local --remote`` and
``preflight --local --remote``: both tiers checked before anything is written, then each measured with
the real writer (:func:`~ckptbench.bench.tier_comparison.run_compare`), then the drain from the local
tier to the remote one and its interference with local saves
(:func:`~ckptbench.bench.drain_measure.run_drain_bench`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench.bench.drain_measure import DrainBench, run_drain_bench
from ckptbench.bench.progress import Progress
from ckptbench.bench.tier_comparison import CompareReport, CompareTarget, JobSpec, check_targets, run_compare
from ckptbench.bench.workloads import CheckpointWorkload
from ckptbench.errors import UsageError


@dataclass(frozen=True)
class TwoLevelMeasurement:
    """Both tiers as ``compare`` measures them (``report.tiers``: local, remote) and the drain between them."""

    report: CompareReport
    drain: DrainBench

    @property
    def local(self) -> Any:
        return self.report.tiers[0]

    @property
    def remote(self) -> Any:
        return self.report.tiers[1]


def check_two_level_targets(targets: Sequence[CompareTarget], workload: CheckpointWorkload) -> None:
    """Everything that can fail before measuring two levels: the local tier is a directory, the remote
    one another location (not the local one, not inside it nor holding it), free space, the remote tier
    reachable (:func:`check_targets`). Raises the first problem (one line, exit 2)."""
    local, remote = targets
    if local.on_objects:
        raise UsageError(f"--local {local.given}: the local tier is a directory on this machine")
    if local.location == remote.location or (not remote.on_objects and _nested(local.location, remote.location)):
        raise UsageError(f"--remote {remote.given} is the --local tier ({local.location}) or inside it",
                         hint="give the remote tier another directory or a bucket")
    check_targets(targets, workload)


def _nested(a: str, b: str) -> bool:
    first, second = Path(a).resolve(), Path(b).resolve()
    return first == second or first in second.parents or second in first.parents


def measure_two_levels(spec: Any, job: JobSpec, targets: Sequence[CompareTarget], *, workload: CheckpointWorkload,
                       progress: Progress | None = None) -> TwoLevelMeasurement:
    """Measure ``workload`` on both tiers (``targets``: local, remote, checked by
    :func:`check_two_level_targets`), the job modelled on each as ``compare`` does, then the drain."""
    report = run_compare(spec, job, targets, workload=workload, progress=progress)
    drain = run_drain_bench(workload, targets[0].storage, targets[1].storage, repeat=spec.repeat,
                            warmup=spec.warmup, threads=spec.threads, progress=progress)
    return TwoLevelMeasurement(report, drain)
