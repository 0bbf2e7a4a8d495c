"""Goodput and cost of a training run: planned compute, failures, recovery and checkpoints.

Planned time (no failures, no checkpoints): training compute ``6 N D`` FLOPs (``N`` parameters,
``D`` tokens; the usual dense-transformer estimate) at ``GPUs x peak FLOP/s x MFU``:
``planned = 6 N D / (GPUs * peak * MFU)``.

Failures arrive at ``lambda = 1 / M_sys`` per second while the job runs (computing, checkpointing,
redoing lost work); a second fault during a recovery is fixed by that recovery. Each fault costs
``detect + replace + resume`` and, when checkpointing is modelled, the work lost since the newest
durable checkpoint, ``lost = (tau + s + fP)/2 + (1 - f)P`` (``(tau + C)/2`` when synchronous; first
order, see :func:`ckptbench.model.interval.lost_work_per_failure_s`). Checkpoints add
``stalls = (planned / tau) (s + fP)``. So

    faults = lambda * (planned + stalls + faults * lost) = lambda (planned + stalls) / (1 - lambda lost)
    wall   = planned + stalls + faults * (detect + replace + resume + lost)

Without checkpoint options, ``faults = lambda * planned`` and the waste is exactly
``faults x (detect + replace + resume)``: the simple model most articles use. With them, this agrees
with the exact model (:func:`ckptbench.model.interval.expected_wall_time_s` with
``restart_can_fail=False``, see :func:`exact_wall_hours`) to second order in
``(tau + s + P + recovery)/M`` (:func:`first_order_ratio`); when that ratio is large (a checkpoint
interval near the MTBF) the first-order accounting overstates the wall time.

``goodput = planned / wall`` (productive time over wall time); ``wasted_fraction_of_plan =
(wall - planned) / planned``. The whole cluster is paid for during recovery.

Hot spares: ``K`` idle nodes, paid for the whole wall time, let a failed node be swapped out at once
while it is repaired (``replace`` long). A failure waits for a replacement only when all ``K`` spares
are out, which happens with the Erlang-B probability ``B(K, lambda * replace)`` (spares form a
``K``-server loss system). It then waits until the first repair under way finishes: at most
``replace``, and about ``replace / (K + 1)`` when repair times are exponential. The model charges the
whole ``replace``, so ``B(K, lambda * replace) * replace`` is an upper bound on the expected replace
time. ``K`` is at most the job's node count.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ckptbench.errors import UsageError
from ckptbench.model import _checks
from ckptbench.model.failures import MAX_COUNT, SECONDS_PER_HOUR, FailureModel
from ckptbench.model.interval import (
    PLATEAU_TOLERANCE,
    CheckpointCost,
    check_can_keep_up,
    check_in_flight,
    exact_interval_s,
    expected_wall_time_s,
    lost_work_per_failure_s,
    optimum_plateau,
)
from ckptbench.units import format_duration

#: Where :func:`erlang_b` stops summing: the terms left are below this share of the sum.
_ROUNDING = 1e-17
#: Badput categories, in the order they are reported.
BADPUT_CATEGORIES: tuple[str, ...] = ("checkpoint_stall", "lost_progress", "detection", "replacement", "restart_restore")


@dataclass(frozen=True)
class TrainingRun:
    """The run as planned: ``params`` x ``tokens`` on ``gpus`` GPUs at ``peak_flops`` (per GPU, FLOP/s) and ``mfu``."""

    params: float
    tokens: float
    gpus: int
    peak_flops: float
    mfu: float
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        _checks.positive("parameter count", self.params)
        _checks.positive("token count", self.tokens)
        _checks.positive_int("GPU count", self.gpus, at_most=MAX_COUNT)
        _checks.positive("peak FLOP/s", self.peak_flops)
        _checks.fraction("MFU", self.mfu, allow_zero=False)
        _checks.positive_int("GPUs per node", self.gpus_per_node, at_most=MAX_COUNT)
        what = f"6 N D = 6 x {self.params:g} parameters x {self.tokens:g} tokens"
        if not math.isfinite(self.compute_flops):
            raise UsageError(f"{what} is not a finite number of FLOPs")
        sustained = self.gpus * self.peak_flops * self.mfu
        if not (math.isfinite(sustained) and sustained > 0):
            raise UsageError(f"{self.gpus:,} GPUs x {self.peak_flops:g} FLOP/s x {self.mfu:g} MFU = {sustained:g} "
                             "FLOP/s is not a positive finite rate")
        planned = self.planned_s
        if not (math.isfinite(planned) and planned >= 1e-9):  # below a nanosecond, hours underflow in the report
            raise UsageError(f"{what} at {sustained:g} FLOP/s is {planned:.3g} s of planned compute, "
                             "not a finite time of at least 1 ns")

    @property
    def compute_flops(self) -> float:
        """``6 N D``."""
        return 6.0 * self.params * self.tokens

    @property
    def planned_s(self) -> float:
        """``6 N D / (GPUs * peak * MFU)``."""
        return self.compute_flops / (self.gpus * self.peak_flops * self.mfu)

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)  # ceiling division in integers, exact for any count


@dataclass(frozen=True)
class Pricing:
    """What the cluster costs: per GPU-hour or per node-hour (one of them)."""

    gpu_hour_usd: float | None = None
    node_hour_usd: float | None = None

    def __post_init__(self) -> None:
        if self.gpu_hour_usd is not None and self.node_hour_usd is not None:
            raise UsageError(
                f"GPU-hour cost {self.gpu_hour_usd:g} and node-hour cost {self.node_hour_usd:g} both give the price",
                hint="give one of them",
            )
        if self.gpu_hour_usd is not None:
            _checks.positive("GPU-hour cost", self.gpu_hour_usd)
        if self.node_hour_usd is not None:
            _checks.positive("node-hour cost", self.node_hour_usd)

    @property
    def given(self) -> bool:
        return self.gpu_hour_usd is not None or self.node_hour_usd is not None

    def cluster_hour_usd(self, run: TrainingRun) -> float | None:
        """Cost of one hour of the whole job (``gpus x $/GPU-h`` or ``nodes x $/node-h``)."""
        if self.gpu_hour_usd is not None:
            return self.gpu_hour_usd * run.gpus
        if self.node_hour_usd is not None:
            return self.node_hour_usd * run.nodes
        return None

    def node_hour(self, run: TrainingRun) -> float | None:
        """Cost of one node for an hour (``gpus_per_node x $/GPU-h`` when priced per GPU)."""
        if self.node_hour_usd is not None:
            return self.node_hour_usd
        if self.gpu_hour_usd is not None:
            return self.gpu_hour_usd * run.gpus_per_node
        return None


@dataclass(frozen=True)
class Recovery:
    """What one failure costs before training resumes: ``detect`` + ``replace`` + ``resume`` (restart and restore)."""

    detect_s: float
    replace_s: float
    resume_s: float

    def __post_init__(self) -> None:
        _checks.nonnegative("detection time (s)", self.detect_s)
        _checks.nonnegative("replacement time (s)", self.replace_s)
        _checks.nonnegative("resume time (s)", self.resume_s)

    @property
    def total_s(self) -> float:
        return self.detect_s + self.replace_s + self.resume_s


@dataclass(frozen=True)
class CheckpointPolicy:
    """Checkpoint every ``interval_s`` of compute at ``cost`` each."""

    interval_s: float
    cost: CheckpointCost

    def __post_init__(self) -> None:
        _checks.positive("checkpoint interval (s)", self.interval_s)
        check_in_flight(self.interval_s, self.cost)


@dataclass(frozen=True)
class GoodputResult:
    """Hours, fractions and dollars of one scenario (dollars are ``None`` without pricing)."""

    planned_hours: float
    wall_hours: float
    wasted_hours: float
    goodput: float
    wasted_fraction_of_plan: float
    faults: float
    faults_per_day: float
    badput_hours: dict[str, float]
    includes_checkpointing: bool
    per_fault_hours: float
    replace_effective_s: float
    hot_spare_nodes: int
    checkpoints: float | None
    checkpoint_interval_s: float | None
    planned_cost_usd: float | None
    wall_cost_usd: float | None
    spare_cost_usd: float | None
    total_cost_usd: float | None
    wasted_cost_usd: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SkippedScenario:
    """A what-if that cannot be computed (at the optimal interval a fault may lose more work than the
    MTBF, for instance), and why: it is reported, not allowed to fail the baseline it is compared with."""

    name: str
    description: str
    reason: str


@dataclass(frozen=True)
class Scenario:
    """A what-if: its result and what it changes against the baseline."""

    name: str
    description: str
    result: GoodputResult
    saved_hours: float
    extra_cost_usd: float | None
    net_saving_usd: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "wall_hours": self.result.wall_hours,
            "wasted_hours": self.result.wasted_hours,
            "goodput": self.result.goodput,
            "saved_hours": self.saved_hours,
            "extra_cost_usd": self.extra_cost_usd,
            "net_saving_usd": self.net_saving_usd,
        }


def erlang_b(servers: int, offered_load: float) -> float:
    """Erlang-B blocking probability ``B(K, a)`` (``B(0, a) = 1``) in at most about ``20 sqrt(min(K, a))`` steps.

    ``1/B = sum_{j=0..K} t_j`` with ``t_j = K! / ((K - j)! a^j)``: positive terms, each ``(K - j + 1) / a``
    times the one before, so they rise up to ``j = max(0, floor(K + 1 - a))`` and fall after it. The sum
    starts at that largest term (its logarithm from ``lgamma``) and walks outwards both ways; the ratios
    only fall as it goes, so once one is ``r < 1`` the terms left add up to at most ``t r / (1 - r)``, and
    it stops when that is below rounding. Terms fall like ``e^{-d^2 / 2 min(K, a)}`` at ``d`` from the
    largest, or faster, so a million spares cost thousands of steps, not the million the recurrence
    ``B_k = a B_{k-1} / (k + a B_{k-1})`` takes. ``K`` is at most :data:`MAX_COUNT` (spares are nodes),
    which keeps the relative error, about ``1e-16 K log K`` from ``lgamma``, under 1e-6.
    """
    if not isinstance(servers, int) or isinstance(servers, bool) or servers < 0:
        raise UsageError(f"hot spare count {servers!r} must be zero or more")
    if servers:
        _checks.positive_int("hot spare count", servers, at_most=MAX_COUNT)
    _checks.nonnegative("offered load", offered_load)
    if offered_load == 0.0:
        return 1.0 if servers == 0 else 0.0
    k, a = servers, offered_load
    peak = min(k, max(0, math.floor(k + 1 - a)))
    log_peak = math.lgamma(k + 1) - math.lgamma(k - peak + 1) - peak * math.log(a) if peak else 0.0
    total = 1.0  # sum of t_j / t_peak
    term, j = 1.0, peak
    while j < k:  # upwards: t_{j+1} = t_j (K - j) / a
        ratio = (k - j) / a
        if ratio < 1.0 and term * ratio / (1.0 - ratio) <= _ROUNDING * total:
            break
        term *= ratio
        total += term
        j += 1
    term, j = 1.0, peak
    while j > 0:  # downwards: t_{j-1} = t_j a / (K - j + 1)
        ratio = a / (k - j + 1)
        if ratio < 1.0 and term * ratio / (1.0 - ratio) <= _ROUNDING * total:
            break
        term *= ratio
        total += term
        j -= 1
    return math.exp(-log_peak) / total


def estimate(
    run: TrainingRun,
    failures: FailureModel,
    recovery: Recovery,
    *,
    checkpoint: CheckpointPolicy | None = None,
    pricing: Pricing | None = None,
    hot_spare_nodes: int = 0,
) -> GoodputResult:
    """Wall time, waste by category, goodput and cost of ``run`` (see the module docstring for the model).

    Raises ``UsageError`` for more hot spares than the job has nodes, when a checkpoint takes as long
    as the MTBF to become durable (the same refusal as ``ckptbench interval``), when recovering from a
    fault takes as long as the MTBF (:func:`check_recovery_keeps_up`), when each fault loses more work
    than the MTBF (the run never finishes), or when a result is not a finite number.
    """
    if checkpoint is not None:
        check_can_keep_up(checkpoint.cost, failures.mtbf_s)
    pricing = pricing or Pricing()
    rate = failures.rate_per_s
    replace_s = effective_replace_s(run, failures, recovery, hot_spare_nodes)
    check_recovery_keeps_up(recovery, replace_s, failures.mtbf_s)
    lost_s = lost_work_per_failure_s(checkpoint.interval_s, checkpoint.cost) if checkpoint else 0.0
    per_fault_s = recovery.detect_s + replace_s + recovery.resume_s + lost_s
    planned_s = run.planned_s
    checkpoints = planned_s / checkpoint.interval_s if checkpoint else None
    stalls_s = checkpoints * checkpoint.cost.blocking_s if checkpoint and checkpoints else 0.0
    if rate * lost_s >= 1.0:
        raise UsageError(
            f"failures arrive every {failures.mtbf_s / SECONDS_PER_HOUR:.3g} h on average but each throws "
            f"away {lost_s / SECONDS_PER_HOUR:.3g} h of work, so the run never finishes",
            hint="checkpoint more often or faster, or fail less often",
        )
    faults = rate * (planned_s + stalls_s) / (1.0 - rate * lost_s)
    wall_s = planned_s + stalls_s + faults * per_fault_s
    badput_s = {
        "checkpoint_stall": stalls_s,
        "lost_progress": faults * lost_s,
        "detection": faults * recovery.detect_s,
        "replacement": faults * replace_s,
        "restart_restore": faults * recovery.resume_s,
    }
    hour = SECONDS_PER_HOUR
    wall_h, planned_h = wall_s / hour, planned_s / hour
    cluster_rate = pricing.cluster_hour_usd(run)
    node_rate = pricing.node_hour(run)
    if cluster_rate is not None and node_rate is not None:
        planned_cost = cluster_rate * planned_h
        wall_cost = cluster_rate * wall_h
        spare_cost = hot_spare_nodes * node_rate * wall_h
        total_cost: float | None = wall_cost + spare_cost
        wasted_cost: float | None = wall_cost + spare_cost - planned_cost
    else:
        planned_cost = wall_cost = spare_cost = total_cost = wasted_cost = None
    if not math.isfinite(wall_s):
        raise UsageError(f"the wall time ({planned_h:.3g} h planned, {faults:.3g} faults) is not a finite number")
    if total_cost is not None and not math.isfinite(total_cost):
        raise UsageError(f"the cost (${cluster_rate:g} per cluster-hour for {wall_h:,.0f} h) is not a finite number")
    return GoodputResult(
        planned_hours=planned_h,
        wall_hours=wall_h,
        wasted_hours=wall_h - planned_h,
        goodput=planned_s / wall_s,
        wasted_fraction_of_plan=(wall_s - planned_s) / planned_s,
        faults=faults,
        faults_per_day=failures.faults_per_day,
        badput_hours={k: v / hour for k, v in badput_s.items()},
        includes_checkpointing=checkpoint is not None,
        per_fault_hours=per_fault_s / hour,
        replace_effective_s=replace_s,
        hot_spare_nodes=hot_spare_nodes,
        checkpoints=checkpoints,
        checkpoint_interval_s=checkpoint.interval_s if checkpoint else None,
        planned_cost_usd=planned_cost,
        wall_cost_usd=wall_cost,
        spare_cost_usd=spare_cost,
        total_cost_usd=total_cost,
        wasted_cost_usd=wasted_cost,
    )


def effective_replace_s(run: TrainingRun, failures: FailureModel, recovery: Recovery, hot_spare_nodes: int) -> float:
    """Expected replace time per fault with ``K`` hot spares: ``B(K, lambda * replace) * replace`` (an upper bound)."""
    if hot_spare_nodes > run.nodes:
        raise UsageError(
            f"hot spare count {hot_spare_nodes} is more than the job's {run.nodes:,} nodes",
            hint=f"give at most {run.nodes:,}",
        )
    return erlang_b(hot_spare_nodes, failures.rate_per_s * recovery.replace_s) * recovery.replace_s


def recovery_per_fault_s(run: TrainingRun, failures: FailureModel, recovery: Recovery, hot_spare_nodes: int) -> float:
    """One fault's detect + replace (after ``hot_spare_nodes`` spares: :func:`effective_replace_s`) + resume."""
    return recovery.detect_s + effective_replace_s(run, failures, recovery, hot_spare_nodes) + recovery.resume_s


def check_recovery_keeps_up(recovery: Recovery, replace_s: float, mtbf_s: float) -> None:
    """Raise ``UsageError`` when one recovery (``replace_s``: the replace time after hot spares) takes as
    long as the MTBF: most recoveries would then be struck by further faults, which this model lets the
    recovery under way absorb for free, so its wall time would mean nothing (the recovery counterpart
    of :func:`~ckptbench.model.interval.check_can_keep_up`)."""
    recovery_s = recovery.detect_s + replace_s + recovery.resume_s
    if recovery_s >= mtbf_s:
        replaced = "replace" if replace_s == recovery.replace_s else "replace after hot spares"
        raise UsageError(
            f"recovery cannot keep up: each fault takes {format_duration(recovery_s)} to recover from (detect "
            f"{format_duration(recovery.detect_s)} + {replaced} {format_duration(replace_s)} + resume "
            f"{format_duration(recovery.resume_s)}) but the job fails every {format_duration(mtbf_s)} on average "
            "(MTBF), so it would never stop recovering",
            hint="recover faster: quicker detection and restore, hot spares; or check the failure rate",
        )


def first_order_ratio(
    run: TrainingRun, failures: FailureModel, recovery: Recovery, checkpoint: CheckpointPolicy,
    hot_spare_nodes: int = 0,
) -> float:
    """``(tau + s + P + recovery)/M``: the relative size of the terms the first-order accounting drops."""
    recovery_s = recovery_per_fault_s(run, failures, recovery, hot_spare_nodes)
    return (checkpoint.interval_s + checkpoint.cost.durable_s + recovery_s) / failures.mtbf_s


def exact_wall_hours(
    run: TrainingRun, failures: FailureModel, recovery: Recovery, checkpoint: CheckpointPolicy,
    hot_spare_nodes: int = 0,
) -> float:
    """Wall hours from the exact model under the same conventions (a fault during a recovery is fixed by it).

    :func:`ckptbench.model.interval.expected_wall_time_s` with the per-fault recovery as the restart
    and ``restart_can_fail=False``; it also ends with a durable checkpoint and splits the work into
    whole intervals, which :func:`estimate` does not.
    """
    recovery_s = recovery_per_fault_s(run, failures, recovery, hot_spare_nodes)
    wall_s = expected_wall_time_s(run.planned_s, checkpoint.interval_s, checkpoint.cost, failures.mtbf_s, recovery_s,
                                  restart_can_fail=False)
    return wall_s / SECONDS_PER_HOUR


def what_if(
    run: TrainingRun,
    failures: FailureModel,
    recovery: Recovery,
    *,
    checkpoint: CheckpointPolicy | None = None,
    pricing: Pricing | None = None,
    hot_spare_nodes: int = 0,
) -> tuple[list[Scenario], list[SkippedScenario]]:
    """Alternatives to the baseline: halve detection, one more hot spare (or none), the optimal interval.

    Each reports the hours it saves and, with pricing, its extra cost (spares) and net saving. "Faster
    detection" is left out when detection is already instant, "one more hot spare" when the spares
    already match the job's node count. A what-if that :func:`estimate` refuses is returned second,
    with the reason, rather than raised: the baseline (which is raised) is what the user asked about.
    """
    kwargs: dict[str, Any] = {"checkpoint": checkpoint, "pricing": pricing, "hot_spare_nodes": hot_spare_nodes}
    base = estimate(run, failures, recovery, **kwargs)
    candidates: list[tuple[str, str, dict[str, Any], Recovery]] = []
    if recovery.detect_s:
        candidates.append(("faster_detection", f"detect failures in {_fmt_min(recovery.detect_s / 2)} instead of "
                           f"{_fmt_min(recovery.detect_s)}", {}, replace(recovery, detect_s=recovery.detect_s / 2)))
    if hot_spare_nodes < run.nodes:
        candidates.append(("hot_spare", f"keep {hot_spare_nodes + 1} hot spare node{'s' if hot_spare_nodes else ''}",
                           {"hot_spare_nodes": hot_spare_nodes + 1}, recovery))
    if hot_spare_nodes:
        candidates.append(("no_hot_spares", "keep no hot spare nodes", {"hot_spare_nodes": 0}, recovery))
    if checkpoint is not None:
        best = optimal_interval_s(checkpoint.cost, failures.mtbf_s)
        candidates.append((
            "optimal_interval", f"checkpoint every {_fmt_min(best)} (the optimum) instead of every "
            f"{_fmt_min(checkpoint.interval_s)}",
            {"checkpoint": CheckpointPolicy(best, checkpoint.cost)}, recovery,
        ))
    scenarios, skipped = [], []
    for name, description, changes, rec in candidates:
        try:
            result = estimate(run, failures, rec, **(kwargs | changes))
        except UsageError as exc:
            skipped.append(SkippedScenario(name, description, str(exc)))
            continue
        if name == "optimal_interval" and checkpoint is not None:
            tied = _tied_with_the_optimum(run, failures, recovery, checkpoint, hot_spare_nodes)
            if tied:
                skipped.append(SkippedScenario(name, description, tied))
                continue
        extra = net = None
        if base.total_cost_usd is not None and result.total_cost_usd is not None:
            extra = (result.spare_cost_usd or 0.0) - (base.spare_cost_usd or 0.0)
            net = base.total_cost_usd - result.total_cost_usd
        scenarios.append(Scenario(name, description, result, base.wall_hours - result.wall_hours, extra, net))
    return scenarios, skipped


def _tied_with_the_optimum(run: TrainingRun, failures: FailureModel, recovery: Recovery,
                           checkpoint: CheckpointPolicy, hot_spare_nodes: int) -> str:
    """Why moving to the optimal interval is no what-if ('' when it is one): the interval given already
    wastes within the optimum plateau's tolerance of the minimum, so the difference is below what the
    model can tell apart (``interval.optimum_plateau``, as ``interval`` and ``preflight`` report it)."""
    recovery_s = recovery_per_fault_s(run, failures, recovery, hot_spare_nodes)
    low, high = optimum_plateau(checkpoint.cost, failures.mtbf_s, recovery_s)
    if not low <= checkpoint.interval_s <= high:
        return ""
    return (f"every {_fmt_min(checkpoint.interval_s)} already wastes within {PLATEAU_TOLERANCE * 100:.2g} percentage "
            f"points of the optimum's share of wall time (anything from {_fmt_min(low)} to {_fmt_min(high)} does)")


def optimal_interval_s(cost: CheckpointCost, mtbf_s: float) -> float:
    """The exact model's optimum (``ckptbench interval``'s): Daly's exact optimum for ``s + fP``, or the bound."""
    return max(exact_interval_s(cost.blocking_s, mtbf_s), cost.min_interval_s)


def _fmt_min(seconds: float) -> str:
    minutes = seconds / 60.0
    return f"{minutes:.3g} min" if minutes < 120 else f"{minutes / 60:.3g} h"
