"""How often to checkpoint: Young, Daly, the exact optimum of Daly's model, and the async model.

Notation (every time in seconds): ``M`` the job's MTBF, ``R`` the restart cost (detect, replace,
reload; paid after every failure), ``tau`` the *interval*: training compute between two checkpoints
(what "checkpoint every N steps" sets). Failures are exponential (Poisson) in wall-clock time and
may strike at any moment: while computing, while checkpointing, and while restarting.

Synchronous checkpoints take ``C`` and block training.

* Young (1974), first order: ``tau = sqrt(2 C M)``.
* Daly (2006), higher order: ``tau = sqrt(2CM) [1 + (1/3) sqrt(C/2M) + (1/9)(C/2M)] - C`` for
  ``C < 2M``, else ``tau = M``.
* Daly's full model: expected wall time ``T_w(tau) = M e^{R/M} (e^{(tau+C)/M} - 1) T_s / tau`` for
  ``T_s`` of compute, where a failure during a checkpoint loses the whole segment and a failure during
  a restart starts the restart over. Its exact optimum is found numerically (golden-section search on
  ``log tau``); it does not depend on ``R``.

Asynchronous checkpoints: stall ``s`` (blocking staging), persist ``P`` (staging end -> durable,
overlapping training), interference ``f`` (training runs at ``1 - f`` of its speed while persisting),
and at most one checkpoint in flight. A snapshot is durable ``s + P`` after its stall starts; a
failure before that loses it, and the job falls back to the previous durable snapshot.

* First order (waste per unit of useful work): ``waste(tau) = (s + fP)/tau + (tau/2 + s + P + R)/M``,
  optimum ``tau = sqrt(2 (s + fP) M)`` (Young with ``C = s + fP``).
* Exact, for this schedule: the same as Daly's full model with the blocking cost
  ``C_eff = s + fP`` and the restart ``R + (1 - f)P`` (a failure rolls back ``(1 - f)P`` further
  because the newest snapshot is still persisting): per interval in steady state
  ``E_cycle(tau) = M e^{(R + (1-f)P)/M} (e^{(tau + s + fP)/M} - 1)``. Its optimum is Daly's exact
  optimum with ``C = s + fP``.
* Constraint: the next checkpoint may not start before the previous one is durable. The period
  between checkpoint starts is ``T = tau + s + fP`` and must be ``>= s + P``, i.e.
  ``tau >= (1 - f) P``. When the unconstrained optimum is shorter, the optimum is the bound and
  :class:`IntervalAnalysis` reports ``constraint_binding`` and the waste that costs.

"Waste fraction" is the expected fraction of wall-clock time that is not useful compute:
``1 - tau / E_cycle(tau)`` (``1 - goodput``). ``overhead_fraction`` is the checkpoint cost alone:
``(s + fP) / tau`` (``C / tau`` when synchronous).

Limits: ``E_cycle`` grows like ``e^{(R + tau + s + P)/M}``. When that exponent passes
:data:`MAX_EXPONENT` (a restart or an interval hundreds of MTBFs long) the job essentially never
completes and the number cannot be represented; :func:`check_completes` refuses such inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ckptbench.errors import UsageError
from ckptbench.model import _checks
from ckptbench.model.failures import SECONDS_PER_DAY
from ckptbench.units import format_duration

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
#: Largest ``(R + tau + s + P)/M`` computed: ``e^700`` is about 1e304, near the largest float (e^709.8).
MAX_EXPONENT = 700.0


@dataclass(frozen=True)
class CheckpointCost:
    """What one checkpoint costs the job.

    Synchronous: ``stall_s`` is the whole checkpoint time ``C`` (``persist_s = 0``). Asynchronous:
    ``stall_s`` is the blocking staging ``s``, ``persist_s`` the time from staging end to durable
    ``P``, and ``interference`` the fraction ``f`` of training throughput lost while persisting.
    """

    stall_s: float
    persist_s: float = 0.0
    interference: float = 0.0

    def __post_init__(self) -> None:
        _checks.positive("stall (s)", self.stall_s)
        _checks.nonnegative("persist (s)", self.persist_s)
        _checks.fraction("interference", self.interference, allow_zero=True)
        if self.persist_s == 0 and self.interference:
            raise UsageError(f"interference {self.interference!r} needs a persist time (asynchronous checkpoints)")

    @classmethod
    def sync(cls, checkpoint_s: float) -> CheckpointCost:
        """A blocking checkpoint of ``checkpoint_s``."""
        return cls(stall_s=checkpoint_s)

    @property
    def is_async(self) -> bool:
        return self.persist_s > 0

    @property
    def blocking_s(self) -> float:
        """``C_eff = s + f P``: training time lost per checkpoint (``C`` when synchronous)."""
        return self.stall_s + self.interference * self.persist_s

    @property
    def durable_s(self) -> float:
        """``s + P``: from the start of a checkpoint until it is durable."""
        return self.stall_s + self.persist_s

    @property
    def rollback_s(self) -> float:
        """``(1 - f) P``: extra rollback a failure costs because the newest snapshot is not yet durable."""
        return (1.0 - self.interference) * self.persist_s

    @property
    def min_interval_s(self) -> float:
        """Smallest interval with at most one checkpoint in flight: ``tau >= (1 - f) P`` (0 when synchronous)."""
        return self.rollback_s


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): ``sqrt(2 C M)``, first order in ``C/M``."""
    _checks.positive("checkpoint time (s)", checkpoint_s)
    _checks.positive("MTBF (s)", mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order estimate; ``M`` when ``C >= 2M``."""
    _checks.positive("checkpoint time (s)", checkpoint_s)
    _checks.positive("MTBF (s)", mtbf_s)
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - checkpoint_s


def exact_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """The ``tau`` minimising Daly's full model ``(e^{(tau + C)/M} - 1) / tau`` (numeric, independent of ``R``).

    Golden-section search on ``log tau`` over ``[min(1e-12 M, Young / 1000), M]``: the optimum solves
    ``e^{(tau+C)/M} (1 - tau/M) = 1``, so it lies below ``M``, and it is within a factor of two of
    Young's ``sqrt(2 C M)`` for ``C < M``, so the floor is far below it however small ``C/M`` is.
    The objective is evaluated as ``(M (e^x - 1 - x) + C) / tau`` with ``x = (tau + C)/M`` (the same
    function times ``M``, minus 1), which keeps its variation above rounding when ``C/M`` is tiny.
    Relative precision about 1e-8.
    """
    _checks.positive("checkpoint time (s)", checkpoint_s)
    _checks.positive("MTBF (s)", mtbf_s)

    def excess(tau: float) -> float:  # M (e^((tau+C)/M) - 1)/tau - 1
        return (mtbf_s * _expm1_minus_x((tau + checkpoint_s) / mtbf_s) + checkpoint_s) / tau

    floor = min(1e-12 * mtbf_s, young_interval_s(checkpoint_s, mtbf_s) / 1e3)
    return _minimise_log(excess, floor, mtbf_s)


def cycle_time_s(interval_s: float, cost: CheckpointCost, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Expected wall time of one interval in steady state: ``M e^{(R + (1-f)P)/M} (e^{(tau + s + fP)/M} - 1)``."""
    _validate(interval_s, cost, mtbf_s, restart_s)
    return _cycle(interval_s, cost, mtbf_s, restart_s)


def waste_fraction(interval_s: float, cost: CheckpointCost, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Expected fraction of wall time that is not useful compute, in steady state: ``1 - tau / E_cycle``."""
    _validate(interval_s, cost, mtbf_s, restart_s)
    return _waste(interval_s, cost, mtbf_s, restart_s)


def first_order_waste(interval_s: float, cost: CheckpointCost, mtbf_s: float, restart_s: float = 0.0) -> float:
    """``(s + fP)/tau + (tau/2 + s + P + R)/M``: waste per unit of useful work, first order in ``tau/M``."""
    _validate(interval_s, cost, mtbf_s, restart_s)
    return _first_order(interval_s, cost, mtbf_s, restart_s)


def overhead_fraction(interval_s: float, cost: CheckpointCost) -> float:
    """Checkpoint cost per unit of compute: ``(s + fP) / tau`` (``C / tau`` when synchronous).

    Raises ``UsageError`` for an interval that would put two async checkpoints in flight.
    """
    _checks.positive("interval (s)", interval_s)
    check_in_flight(interval_s, cost)
    return cost.blocking_s / interval_s


def lost_work_per_failure_s(interval_s: float, cost: CheckpointCost) -> float:
    """Expected wall time a failure throws away, first order: ``(tau + s + fP)/2 + (1 - f)P``.

    Failures strike uniformly over the running time, whose period is ``tau + s + fP``; a failure
    loses the time since the newest durable point plus the ``(1 - f)P`` of work done while that
    snapshot was persisting (``(tau + C)/2`` when synchronous). Stalls of kept checkpoints are counted
    as checkpoint overhead, not here. (Per unit of useful work instead of per failure, the same
    bookkeeping gives the ``(tau/2 + s + P + R)/M`` term of :func:`first_order_waste`.)
    """
    _checks.positive("interval (s)", interval_s)
    return (interval_s + cost.blocking_s) / 2.0 + cost.rollback_s


def expected_wall_time_s(
    work_s: float, interval_s: float, cost: CheckpointCost, mtbf_s: float, restart_s: float = 0.0,
    *, restart_can_fail: bool = True,
) -> float:
    """Exact expected wall time to finish ``work_s`` of compute, including a final durable checkpoint.

    The work is split into ``n = ceil(work / tau)`` equal intervals (so the interval used is
    ``work / n``, at most ``tau``; fewer when that would break the one-in-flight bound, and one when
    the work is shorter than the bound: its single checkpoint has none to overlap). The first
    interval starts with nothing in flight and costs
    ``M e^{R/M} (e^{(tau + s + P)/M} - 1)``; each later one costs :func:`cycle_time_s`. This is the
    schedule :func:`ckptbench.model.simulate.simulate` runs, so the two agree to sampling error.

    ``restart_can_fail=False`` is the variant where failures cannot strike during a restart (a
    second fault is fixed in the same recovery): every ``e^{R/M}`` becomes ``1 + R/M``.
    """
    _checks.positive("work (s)", work_s)
    _validate(interval_s, cost, mtbf_s, restart_s, restart_can_fail)
    n = intervals_for(work_s, interval_s, cost.min_interval_s)
    tau = work_s / n
    if n > 1:
        check_in_flight(tau, cost)
    check_completes(tau, cost, mtbf_s, restart_s, restart_can_fail=restart_can_fail)
    factor = _restart_factor(restart_s, mtbf_s, restart_can_fail)
    first = mtbf_s * factor * math.expm1((tau + cost.durable_s) / mtbf_s)
    return first + (n - 1) * _cycle(tau, cost, mtbf_s, restart_s, restart_can_fail)


def check_can_keep_up(cost: CheckpointCost, mtbf_s: float) -> None:
    """Raise ``UsageError`` when a checkpoint takes as long as the MTBF to become durable."""
    if cost.durable_s >= mtbf_s:
        what = "to become durable" if cost.is_async else ""
        raise UsageError(
            f"checkpointing cannot keep up: a checkpoint takes {format_duration(cost.durable_s)} {what}".rstrip()
            + f" but the job fails every {format_duration(mtbf_s)} on average (MTBF), so most checkpoints never complete",
            hint="write faster: more bandwidth, smaller or sharded checkpoints, async; or fail less often",
        )


def check_in_flight(interval_s: float, cost: CheckpointCost) -> None:
    """Raise ``UsageError`` when ``interval_s`` would put two async checkpoints in flight (``tau < (1 - f) P``)."""
    if interval_s < cost.min_interval_s * (1.0 - 1e-12):  # tolerance: an interval computed as the bound itself
        raise UsageError(
            f"interval {format_duration(interval_s)} would put two checkpoints in flight: with persist "
            f"{format_duration(cost.persist_s)} and interference {cost.interference:g} it must be at least "
            f"(1 - f) P = {format_duration(cost.min_interval_s)}",
        )


def check_completes(
    interval_s: float, cost: CheckpointCost, mtbf_s: float, restart_s: float = 0.0, *, restart_can_fail: bool = True,
) -> None:
    """Raise ``UsageError`` when the restart or the interval is so far beyond the MTBF that the job never completes.

    A restart ``R`` (which starts over when a failure strikes it) or a segment ``tau + s + P`` hundreds
    of MTBFs long is almost surely interrupted: the expected time grows like ``e^{(R + tau + s + P)/M}``,
    past :data:`MAX_EXPONENT` beyond what a float holds. The message names the longer of the two.
    """
    restart_part = restart_s / mtbf_s if restart_can_fail else 0.0
    interval_part = (interval_s + cost.durable_s) / mtbf_s
    if restart_part + interval_part <= MAX_EXPONENT:
        return
    if restart_part >= interval_part:
        what, value, hint = "restart", restart_s, "recover faster (detection, spares, restore) or fail less often"
    else:
        what, value, hint = "interval", interval_s, "checkpoint more often"
    raise UsageError(
        f"{what} {format_duration(value)} is {value / mtbf_s:,.0f} times the MTBF ({format_duration(mtbf_s)}): "
        f"a failure almost surely strikes before it ends, so the job essentially never completes (its expected "
        f"time, about e^{restart_part + interval_part:.0f} times the MTBF, cannot even be computed)",
        hint=hint,
    )


@dataclass(frozen=True)
class IntervalAnalysis:
    """Everything ``ckptbench interval`` reports for one checkpoint cost and failure rate.

    Intervals are compute time between checkpoints (s). Waste fractions are shares of wall time from
    the exact model; ``waste_fraction_young``/``_daly`` are taken at those intervals, or at the
    one-in-flight bound when they fall below it. ``first_order_waste`` is the first-order formula
    (waste per unit of useful work) at the optimum. ``constraint_*`` describes the async bound.
    """

    stall_s: float
    persist_s: float
    interference: float
    blocking_s: float
    mtbf_s: float
    restart_s: float
    young_interval_s: float
    daly_interval_s: float
    exact_interval_s: float
    optimal_interval_s: float
    min_interval_s: float
    constraint_binding: bool
    constraint_cost_fraction: float
    waste_fraction: float
    waste_fraction_young: float
    waste_fraction_daly: float
    first_order_waste: float
    overhead_fraction_at_optimum: float
    lost_work_per_failure_s: float
    failures_per_day: float
    interval_s: float | None = None
    overhead_fraction: float | None = None
    waste_fraction_at_interval: float | None = None
    lost_work_per_failure_at_interval_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def analyse(
    cost: CheckpointCost, mtbf_s: float, restart_s: float = 0.0, every_s: float | None = None,
) -> IntervalAnalysis:
    """Young, Daly, the exact optimum (constrained when async) and, with ``every_s``, that interval's cost.

    Raises ``UsageError`` if a checkpoint cannot become durable within the MTBF, or if ``every_s``
    would put two async checkpoints in flight. ``constraint_cost_fraction`` is the waste the
    one-in-flight bound adds over the unconstrained optimum of the same formula (0 when it does not bind).
    """
    _checks.positive("MTBF (s)", mtbf_s)
    _checks.nonnegative("restart (s)", restart_s)
    check_can_keep_up(cost, mtbf_s)
    c_eff = cost.blocking_s
    young = young_interval_s(c_eff, mtbf_s)
    daly = daly_interval_s(c_eff, mtbf_s)
    exact = exact_interval_s(c_eff, mtbf_s)
    binding = exact < cost.min_interval_s
    optimal = max(exact, cost.min_interval_s)
    check_completes(optimal, cost, mtbf_s, restart_s)
    waste_opt = _waste(optimal, cost, mtbf_s, restart_s)
    fields: dict[str, Any] = {}
    if every_s is not None:
        _validate(every_s, cost, mtbf_s, restart_s)
        fields = {
            "interval_s": every_s,
            "overhead_fraction": overhead_fraction(every_s, cost),
            "waste_fraction_at_interval": _waste(every_s, cost, mtbf_s, restart_s),
            "lost_work_per_failure_at_interval_s": lost_work_per_failure_s(every_s, cost),
        }
    return IntervalAnalysis(
        stall_s=cost.stall_s,
        persist_s=cost.persist_s,
        interference=cost.interference,
        blocking_s=c_eff,
        mtbf_s=mtbf_s,
        restart_s=restart_s,
        young_interval_s=young,
        daly_interval_s=daly,
        exact_interval_s=exact,
        optimal_interval_s=optimal,
        min_interval_s=cost.min_interval_s,
        constraint_binding=binding,
        constraint_cost_fraction=waste_opt - _waste(exact, cost, mtbf_s, restart_s) if binding else 0.0,
        waste_fraction=waste_opt,
        waste_fraction_young=_waste(max(young, cost.min_interval_s), cost, mtbf_s, restart_s),
        waste_fraction_daly=_waste(max(daly, cost.min_interval_s), cost, mtbf_s, restart_s),
        first_order_waste=_first_order(optimal, cost, mtbf_s, restart_s),
        overhead_fraction_at_optimum=overhead_fraction(optimal, cost),
        lost_work_per_failure_s=lost_work_per_failure_s(optimal, cost),
        failures_per_day=SECONDS_PER_DAY / mtbf_s,
        **fields,
    )


#: The optimum is flat: every interval whose waste is within this many fractions of wall time (0.1
#: percentage points) of the minimum is as good as the optimum for planning purposes.
PLATEAU_TOLERANCE = 0.001

#: Interval steps people configure, coarsest first (seconds).
ROUND_STEPS_S = (3600.0, 1800.0, 900.0, 600.0, 300.0, 60.0, 30.0, 10.0, 1.0)


def optimum_plateau(
    cost: CheckpointCost, mtbf_s: float, restart_s: float = 0.0, tolerance: float = PLATEAU_TOLERANCE,
) -> tuple[float, float]:
    """The intervals ``(low, high)`` whose exact waste is within ``tolerance`` of the optimum's (the waste is
    unimodal in the interval, so the set is one range; ``low`` never undercuts the one-in-flight bound)."""
    optimum = analyse(cost, mtbf_s, restart_s)
    limit = optimum.waste_fraction + tolerance
    return plateau_around(lambda tau: _waste(tau, cost, mtbf_s, restart_s) <= limit, optimum.optimal_interval_s,
                          cost.min_interval_s, mtbf_s)


def plateau_around(within: Callable[[float], bool], optimum_s: float, bound_s: float,
                   mtbf_s: float) -> tuple[float, float]:
    """The range of intervals around ``optimum_s`` where ``within`` holds (a unimodal waste under a limit),
    found by bisection in log space to 1e-6 relative; it starts no lower than ``bound_s``."""
    def edge(inside: float, outside: float) -> float:
        for _ in range(200):
            if abs(math.log(outside / inside)) < 1e-6:
                break
            middle = math.sqrt(inside * outside)
            inside, outside = (middle, outside) if within(middle) else (inside, middle)
        return inside

    low = bound_s if bound_s > 0 and within(bound_s) else edge(optimum_s, max(optimum_s * 1e-9, bound_s))
    far = optimum_s * 2.0
    while within(far) and far < mtbf_s * MAX_EXPONENT / 2:
        far *= 2.0
    return max(low, bound_s), edge(optimum_s, far)


def round_interval_s(low_s: float, high_s: float, near_s: float) -> float:
    """A value people configure inside ``[low_s, high_s]``: a multiple of the coarsest step in
    :data:`ROUND_STEPS_S` that falls inside, the one nearest ``near_s``; ``near_s`` itself if none does."""
    for step in ROUND_STEPS_S:
        candidates = [k * step for k in (math.floor(near_s / step), math.ceil(near_s / step)) if k >= 1]
        inside = [c for c in candidates if low_s <= c <= high_s]
        if inside:
            return min(inside, key=lambda c: abs(c - near_s))
    return near_s


def waste_curve(
    cost: CheckpointCost, mtbf_s: float, restart_s: float, intervals_s: list[float],
) -> list[tuple[float, float, float]]:
    """``(tau, exact waste fraction, first-order waste)`` for each interval (infeasible ones included; for plots)."""
    return [(t, _waste(t, cost, mtbf_s, restart_s), _first_order(t, cost, mtbf_s, restart_s)) for t in intervals_s]


def intervals_for(work_s: float, interval_s: float, min_interval_s: float = 0.0) -> int:
    """Equal intervals the work splits into: ``ceil(work / tau)``, fewer if that would undercut the bound.

    Work shorter than the bound is a single interval below it: with one checkpoint, nothing else can
    be in flight.
    """
    _checks.positive("interval (s)", interval_s)
    count = work_s / interval_s
    if not math.isfinite(count):
        raise UsageError(f"work {work_s:.3g} s in intervals of {interval_s:.3g} s is not a finite number of intervals")
    n = max(1, math.ceil(count * (1.0 - 1e-12)))
    if n > 1 and work_s / n < min_interval_s:
        n = max(1, math.floor(work_s / min_interval_s))
    return n


# -- internals ---------------------------------------------------------------------------------


def _restart_factor(restart_s: float, mtbf_s: float, restart_can_fail: bool = True) -> float:
    """``e^{R/M}`` (a failure during a restart starts it over) or ``1 + R/M`` (restarts cannot fail)."""
    return math.exp(restart_s / mtbf_s) if restart_can_fail else 1.0 + restart_s / mtbf_s


def _cycle(tau: float, cost: CheckpointCost, mtbf_s: float, restart_s: float, restart_can_fail: bool = True) -> float:
    """:func:`cycle_time_s` unchecked; ``inf`` past :data:`MAX_EXPONENT` (plots draw such intervals as all waste)."""
    restart_part = restart_s / mtbf_s if restart_can_fail else 0.0
    if restart_part + (tau + cost.durable_s) / mtbf_s > MAX_EXPONENT:
        return math.inf
    return (
        mtbf_s * _restart_factor(restart_s, mtbf_s, restart_can_fail) * math.exp(cost.rollback_s / mtbf_s)
        * math.expm1((tau + cost.blocking_s) / mtbf_s)
    )


def _waste(tau: float, cost: CheckpointCost, mtbf_s: float, restart_s: float) -> float:
    return 1.0 - tau / _cycle(tau, cost, mtbf_s, restart_s)


def _first_order(tau: float, cost: CheckpointCost, mtbf_s: float, restart_s: float) -> float:
    return cost.blocking_s / tau + (tau / 2.0 + cost.durable_s + restart_s) / mtbf_s


def _validate(
    interval_s: float, cost: CheckpointCost, mtbf_s: float, restart_s: float, restart_can_fail: bool = True,
) -> None:
    _checks.positive("interval (s)", interval_s)
    _checks.positive("MTBF (s)", mtbf_s)
    _checks.nonnegative("restart (s)", restart_s)
    check_in_flight(interval_s, cost)
    check_completes(interval_s, cost, mtbf_s, restart_s, restart_can_fail=restart_can_fail)


def _expm1_minus_x(x: float) -> float:
    """``e^x - 1 - x`` without cancellation for small ``x`` (series below 1e-3: error under 1e-15 relative)."""
    if abs(x) < 1e-3:
        return x * x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x / 120.0)))
    return math.expm1(x) - x


def _minimise_log(func: Callable[[float], float], lo: float, hi: float, rel_tol: float = 1e-10) -> float:
    """Golden-section search for the minimum of a unimodal ``func`` on ``[lo, hi]``, in ``log`` space."""
    a, b = math.log(lo), math.log(hi)
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = func(math.exp(c)), func(math.exp(d))
    while b - a > rel_tol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = func(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = func(math.exp(d))
    return math.exp((a + b) / 2.0)
