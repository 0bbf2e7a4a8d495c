"""Two-level checkpointing: a fast local tier every interval, every k-th checkpoint also drained to a remote tier.

Notation (every time in seconds): ``M`` the job's MTBF (failures at rate ``lambda = 1/M``), ``tau``
the interval (training compute between two local checkpoints), ``k`` the remote period in local
checkpoints ("every k-th local checkpoint is also drained to the remote tier").

The schedule:

* **Level 1 (local)**: host memory or local NVMe, one copy per node. A local checkpoint costs what an
  asynchronous checkpoint costs in :mod:`ckptbench.model.interval`: stall ``s``, persist ``P``,
  interference ``f``; blocking cost ``c1 = s + fP``, and a failure rolls back ``l1 = (1 - f) P``
  further because the newest snapshot is still persisting (``P = 0, f = 0`` when synchronous).
* **Level 2 (remote)**: a durable shared tier (parallel filesystem, object store). Every ``k``-th local
  checkpoint, once durable locally, is copied to it in the background (a *drain*) taking ``D`` of wall
  time, bandwidth-bound; training runs at ``1 - f2`` of its speed meanwhile, so a drain costs
  ``c2 = f2 D`` of training time, and the remote copy lags the local one by ``(1 - f2) D`` of
  training. A drain must finish before the next one starts: ``k (tau + c1) + c2 >= D``.
* **Failures**: exponential at rate ``1/M``; each one, independently, with probability ``q`` (the
  *local loss*) takes the failed node's level-1 copy with it (a hardware fault: the node is replaced).
  Those restart from the newest remote checkpoint after ``R2``; the others restart from the newest
  local one after ``R1``.

The exact model (:func:`group_time_s`) treats a *group* of ``k`` local segments as the unit: segments
of ``a = tau + c1`` wall time, the last one ``a + c2``. A non-loss failure in a segment costs a local
recovery ``r1 = R1 + l1`` (the restart plus the rollback of the persisting snapshot, re-run) and the
segment again; a loss failure (at any point of the group, its local recoveries included) costs a
remote recovery ``r2 = R2 + l1 + (1 - f2) D`` and the whole group again. A failure during a recovery
starts it over. The lags are folded into the recoveries as in the single-level async model: the group
boundary is where the remote copy counts as made, and a loss failure re-runs the lag on top of the
restart. Because loss failures are a Poisson thinning of all failures, independent of the non-loss
ones, the expected time of a group has a closed form through the Laplace transform ``L`` of the time
``X`` to run the group with non-loss failures alone (:func:`_log_laplace_segment`), evaluated at
``lambda2 = q/M``: ``E[group] = (1/L - 1) (1/lambda2 + (e^{r2/M} - 1) M)``. It reduces to
:func:`ckptbench.model.interval.cycle_time_s` with ``q = 0`` (``k`` groups of local cycles) and to a
single-level checkpoint of cost ``c1 + c2`` restarting from remote with ``q = 1, k = 1``. The
waste fraction is ``1 - k tau / E[group]``; :mod:`ckptbench.model.simulate_twolevel` runs this schedule
with random failures (exponential or Weibull) and agrees with it within sampling error.

The first-order closed form (Benoit, Cavelan, Le Fevre, Robert, Sun, "Towards optimal multi-level
checkpointing", IEEE Trans. Computers 66(7), 2017): waste per unit of work
``H(tau, k) = (c1 + c2/k)/tau + lambda1 (tau/2 + r1) + lambda2 (k tau/2 + r2)`` with
``lambda1 = (1 - q)/M``, ``lambda2 = q/M``; its optimum has ``tau = sqrt(2 c1/lambda1)``,
``k tau = sqrt(2 c2/lambda2)`` and overhead ``sqrt(2 lambda1 c1) + sqrt(2 lambda2 c2) + lambda1 r1 +
lambda2 r2``: the k-level ``sum sqrt(2 lambda_l C_l)``. For an integer ``k`` (at least 1):
``tau_k = sqrt(2 (c1 + c2/k) / (lambda1 + k lambda2))``.

The single-level comparison is the best *remote-only* schedule: checkpoints written straight to the
remote tier (async: stall ``s``, persist ``D``, interference ``f2``; sync: ``D`` blocking), every
failure restarting from it after ``R2``, analysed by :func:`ckptbench.model.interval.analyse`. With
``q = 1`` the local tier never serves a restart and only costs, so the remote-only schedule wins;
with ``q = 0`` no failure needs the remote tier and the answer is local-only (remote copies are then
for durability beyond the job, at any period the drain allows).

Peer replication (the Gemini what-if, Wang et al., SOSP 2023): each node's level-1 copy also lives in
a peer node's memory, so a loss failure loses the checkpoint only when the peer also loses its copy
before the replacement node has restored and re-replicated it. Assumed: node-losing failures strike
nodes independently and evenly, ``q/(M N)`` per node for ``N`` nodes, and the window is the local
restart ``R1``, so ``q_peer = q (1 - e^{-q R1/(M N)})`` (:func:`peer_replica_loss`); the replica's
cost is part of ``c1`` (give the stall and persist of the replicated save).

Assumptions shared with the single-level model: failures strike at any moment (computing,
checkpointing, restarting), are independent of what the job is doing, and the formulas assume
exponential inter-failure times; at most one local checkpoint in flight (``tau >= (1 - f) P``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ckptbench.errors import UsageError
from ckptbench.model import _checks
from ckptbench.model import interval as single
from ckptbench.units import format_duration

#: Largest remote period searched (local checkpoints per remote one). Past it the remote tier serves a
#: restart so rarely that the answer is "drain as rarely as durability allows".
MAX_EVERY = 100_000


@dataclass(frozen=True)
class TwoLevelCost:
    """What the two tiers cost and how failures use them.

    ``local`` is the level-1 checkpoint (:class:`~ckptbench.model.interval.CheckpointCost`);
    ``drain_s`` the wall time ``D`` of copying one local checkpoint to the remote tier, in the
    background at interference ``drain_interference`` (``f2``); ``local_restart_s`` (``R1``) and
    ``remote_restart_s`` (``R2``) the restarts from each tier; ``local_loss`` (``q``) the fraction of
    failures that lose the failed node's level-1 copy.
    """

    local: single.CheckpointCost
    drain_s: float
    drain_interference: float
    local_restart_s: float
    remote_restart_s: float
    local_loss: float

    def __post_init__(self) -> None:
        _checks.positive("remote checkpoint (drain) time (s)", self.drain_s)
        _checks.fraction("drain interference", self.drain_interference, allow_zero=True)
        if self.drain_interference >= 1:
            raise UsageError(f"drain interference {self.drain_interference!r} must be below 1")
        _checks.nonnegative("local restart (s)", self.local_restart_s)
        _checks.nonnegative("remote restart (s)", self.remote_restart_s)
        _checks.fraction("local loss", self.local_loss, allow_zero=True)

    @property
    def c1_s(self) -> float:
        """``s + f P``: training time a local checkpoint costs."""
        return self.local.blocking_s

    @property
    def c2_s(self) -> float:
        """``f2 D``: training time a drain costs."""
        return self.drain_interference * self.drain_s

    @property
    def local_recovery_s(self) -> float:
        """``r1 = R1 + (1 - f) P``: restart from level 1 plus the rollback of the persisting snapshot."""
        return self.local_restart_s + self.local.rollback_s

    @property
    def remote_recovery_s(self) -> float:
        """``r2 = R2 + (1 - f) P + (1 - f2) D``: restart from level 2 plus the lag of the remote copy."""
        return self.remote_restart_s + self.local.rollback_s + (1.0 - self.drain_interference) * self.drain_s

    def min_interval_s(self, every: int) -> float:
        """Smallest interval for remote period ``every``: one local checkpoint in flight, one drain in flight."""
        drain_bound = (self.drain_s - self.c2_s) / every - self.c1_s
        return max(self.local.min_interval_s, drain_bound, 0.0)

    def remote_only(self) -> single.CheckpointCost:
        """The single-level alternative: checkpoints written straight to the remote tier."""
        if self.local.is_async:
            return single.CheckpointCost(self.local.stall_s, self.drain_s, self.drain_interference)
        return single.CheckpointCost.sync(self.drain_s)


def peer_replica_loss(local_loss: float, mtbf_s: float, nodes: int, window_s: float) -> float:
    """``q (1 - e^{-q W/(M N)})``: the fraction of failures that lose a checkpoint replicated to a peer node.

    A loss failure loses the checkpoint only if the peer holding the replica also suffers a loss failure
    within the window ``W`` (the local restart: until the replacement has restored and re-replicated).
    Node-losing failures are assumed independent and spread evenly over the ``N`` nodes.
    """
    _checks.fraction("local loss", local_loss, allow_zero=True)
    _checks.positive("MTBF (s)", mtbf_s)
    _checks.positive_int("nodes", nodes)
    _checks.nonnegative("window (s)", window_s)
    if nodes < 2:
        raise UsageError("a peer replica needs at least 2 nodes (--nodes)")
    return local_loss * -math.expm1(-local_loss * window_s / (mtbf_s * nodes))


def group_time_s(interval_s: float, every: int, cost: TwoLevelCost, mtbf_s: float) -> float:
    """Expected wall time of one group of ``every`` local intervals ending in a remote copy (exact model)."""
    _validate(interval_s, every, cost, mtbf_s)
    return _group(interval_s, every, cost, mtbf_s)


def waste_fraction(interval_s: float, every: int, cost: TwoLevelCost, mtbf_s: float) -> float:
    """Expected fraction of wall time that is not useful compute: ``1 - k tau / E[group]``."""
    _validate(interval_s, every, cost, mtbf_s)
    return _waste(interval_s, every, cost, mtbf_s)


def first_order_overhead(interval_s: float, every: int, cost: TwoLevelCost, mtbf_s: float) -> float:
    """``H = (c1 + c2/k)/tau + lambda1 (tau/2 + r1) + lambda2 (k tau/2 + r2)``: waste per unit of work, first order."""
    _checks.positive("interval (s)", interval_s)
    _checks.positive_int("remote every", every, at_most=MAX_EVERY)
    lam1, lam2 = _rates(cost, mtbf_s)
    return ((cost.c1_s + cost.c2_s / every) / interval_s + lam1 * (interval_s / 2.0 + cost.local_recovery_s)
            + lam2 * (every * interval_s / 2.0 + cost.remote_recovery_s))


def benoit_interval_s(every: int, cost: TwoLevelCost, mtbf_s: float) -> float:
    """The first-order optimal interval for a given remote period: ``sqrt(2 (c1 + c2/k) / (lambda1 + k lambda2))``."""
    lam1, lam2 = _rates(cost, mtbf_s)
    return math.sqrt(2.0 * (cost.c1_s + cost.c2_s / every) / (lam1 + every * lam2))


def benoit_every(cost: TwoLevelCost, mtbf_s: float) -> float:
    """The first-order optimal remote period (not rounded): ``sqrt(c2 lambda1 / (c1 lambda2))``; ``inf`` when ``q = 0``."""
    lam1, lam2 = _rates(cost, mtbf_s)
    if lam2 == 0:
        return math.inf
    return math.sqrt(cost.c2_s * lam1 / (cost.c1_s * lam2))


@dataclass(frozen=True)
class BenoitOptimum:
    """The first-order (Benoit et al.) answer: ``every`` rounded to the better integer, its interval and overhead."""

    every_continuous: float
    every: int
    interval_s: float
    overhead: float
    waste_fraction_first_order: float
    waste_fraction_exact: float


def benoit_optimum(cost: TwoLevelCost, mtbf_s: float) -> BenoitOptimum:
    """The first-order optimum, rounded to an integer ``k`` (the better of floor and ceiling by ``H``), within the bounds.

    ``waste_fraction_first_order`` is ``H / (1 + H)`` (per unit of wall time); ``waste_fraction_exact``
    the exact model at the same schedule. Needs ``q > 0``.
    """
    if cost.local_loss == 0:
        raise UsageError("the two-level optimum needs a local loss above 0 (with none, no restart uses the remote tier)")
    k_real = benoit_every(cost, mtbf_s)
    candidates = {max(1, min(MAX_EVERY, math.floor(k_real))), max(1, min(MAX_EVERY, math.ceil(k_real)))}
    best: tuple[float, int, float] | None = None
    for k in sorted(candidates):
        tau = max(benoit_interval_s(k, cost, mtbf_s), cost.min_interval_s(k))
        h = first_order_overhead(tau, k, cost, mtbf_s)
        if best is None or h < best[0]:
            best = (h, k, tau)
    assert best is not None
    h, k, tau = best
    return BenoitOptimum(k_real, k, tau, h, h / (1.0 + h), _waste(tau, k, cost, mtbf_s))


@dataclass(frozen=True)
class TwoLevelAnalysis:
    """Everything ``ckptbench interval`` reports about two levels.

    ``schedule`` is what wins: ``"two-level"``, ``"remote-only"`` (the local tier does not pay, or ties
    within :data:`~ckptbench.model.interval.PLATEAU_TOLERANCE`) or ``"local-only"`` (``q = 0``).
    ``interval_s``/``every``/``waste_fraction`` are the best two-level schedule (``every`` ``None``
    when ``q = 0``); ``interval_plateau_s`` the intervals within the tolerance of its waste at that
    ``every``; ``every_tied`` the range of ``every`` whose best waste is within the tolerance.
    ``single_level_*`` are the best remote-only schedule.
    """

    schedule: str
    local_loss: float
    interval_s: float
    every: int | None
    waste_fraction: float
    interval_plateau_s: tuple[float, float]
    recommended_interval_s: float
    every_tied: tuple[int, int] | None
    first_order_overhead: float
    benoit: BenoitOptimum | None
    single_level_interval_s: float
    single_level_recommended_interval_s: float
    single_level_waste_fraction: float
    at_interval: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def optimise(cost: TwoLevelCost, mtbf_s: float) -> tuple[float, int, float]:
    """The ``(tau, k, waste)`` minimising the exact model's waste, ``k`` in ``1..MAX_EVERY`` (needs ``q > 0``).

    For each ``k`` the interval is found by golden-section search on ``log tau``; over ``k`` the best
    waste is unimodal: doubling ``k`` brackets the minimum, an integer ternary search finds it.
    """
    if cost.local_loss == 0:
        raise UsageError("the two-level optimum needs a local loss above 0 (with none, no restart uses the remote tier)")
    _checks.positive("MTBF (s)", mtbf_s)
    cache: dict[int, tuple[float, float]] = {}

    def best(k: int) -> tuple[float, float]:
        if k not in cache:
            cache[k] = _best_interval(k, cost, mtbf_s)
        return cache[k]

    k = 1
    while k < MAX_EVERY and best(min(2 * k, MAX_EVERY))[1] < best(k)[1]:
        k = min(2 * k, MAX_EVERY)
    lo, hi = max(1, k // 2), min(2 * k, MAX_EVERY)
    while hi - lo > 2:
        m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if best(m1)[1] <= best(m2)[1]:
            hi = m2
        else:
            lo = m1
    k_best = min(range(lo, hi + 1), key=lambda j: (best(j)[1], j))
    tau, waste = best(k_best)
    if not math.isfinite(waste) or waste >= 1.0:
        raise UsageError(
            f"no two-level schedule completes: the job fails every {format_duration(mtbf_s)} on average, too often "
            "for these checkpoint and restart times",
        )
    return tau, k_best, waste


def analyse(cost: TwoLevelCost, mtbf_s: float, every_s: float | None = None, remote_every: int | None = None,
            ) -> TwoLevelAnalysis:
    """The best two-level schedule, the first-order check, the best remote-only schedule, and which wins.

    With ``every_s`` (and optionally ``remote_every``, else the optimum's), ``at_interval`` holds that
    schedule's waste.
    """
    _checks.positive("MTBF (s)", mtbf_s)
    single.check_can_keep_up(cost.local, mtbf_s)
    remote_cost = cost.remote_only()
    single.check_can_keep_up(remote_cost, mtbf_s)
    remote = single.analyse(remote_cost, mtbf_s, cost.remote_restart_s)
    r_low, r_high = single.optimum_plateau(remote_cost, mtbf_s, cost.remote_restart_s)
    remote_round = single.round_interval_s(r_low, r_high, remote.optimal_interval_s)
    tolerance = single.PLATEAU_TOLERANCE
    benoit: BenoitOptimum | None = None
    if cost.local_loss == 0:
        local = single.analyse(cost.local, mtbf_s, cost.local_restart_s)
        low, high = single.optimum_plateau(cost.local, mtbf_s, cost.local_restart_s)
        tau, k, waste, tied = local.optimal_interval_s, None, local.waste_fraction, None
        h = local.first_order_waste
        schedule = "local-only"
    else:
        tau, k, waste = optimise(cost, mtbf_s)
        low, high = _plateau(tau, k, waste, cost, mtbf_s, tolerance)
        tied = _tied_every(k, waste, cost, mtbf_s, tolerance)
        h = first_order_overhead(tau, k, cost, mtbf_s)
        benoit = benoit_optimum(cost, mtbf_s)
        schedule = "two-level" if waste < remote.waste_fraction - tolerance else "remote-only"
    at_interval = None
    if every_s is not None:
        k_at = remote_every if remote_every is not None else k
        if k_at is None:
            at_interval = {"interval_s": every_s, "every": None,
                           "waste_fraction": single.waste_fraction(every_s, cost.local, mtbf_s, cost.local_restart_s)}
        else:
            at_interval = {"interval_s": every_s, "every": k_at,
                           "waste_fraction": waste_fraction(every_s, k_at, cost, mtbf_s)}
    return TwoLevelAnalysis(
        schedule=schedule, local_loss=cost.local_loss, interval_s=tau, every=k, waste_fraction=waste,
        interval_plateau_s=(low, high), recommended_interval_s=single.round_interval_s(low, high, tau),
        every_tied=tied, first_order_overhead=h, benoit=benoit,
        single_level_interval_s=remote.optimal_interval_s, single_level_recommended_interval_s=remote_round,
        single_level_waste_fraction=remote.waste_fraction, at_interval=at_interval,
    )


def waste_curve(cost: TwoLevelCost, mtbf_s: float, every: int, intervals_s: list[float]) -> list[tuple[float, float]]:
    """``(tau, exact waste)`` for each interval at remote period ``every`` (infeasible ones as ``nan``; for plots)."""
    return [(t, _waste(t, every, cost, mtbf_s) if t >= cost.min_interval_s(every) else math.nan) for t in intervals_s]


# -- internals ---------------------------------------------------------------------------------


def _rates(cost: TwoLevelCost, mtbf_s: float) -> tuple[float, float]:
    """``(lambda1, lambda2)``: rates of failures that restart locally and of those that lose the local copy."""
    _checks.positive("MTBF (s)", mtbf_s)
    return (1.0 - cost.local_loss) / mtbf_s, cost.local_loss / mtbf_s


def _validate(interval_s: float, every: int, cost: TwoLevelCost, mtbf_s: float) -> None:
    _checks.positive("interval (s)", interval_s)
    _checks.positive_int("remote every", every, at_most=MAX_EVERY)
    _checks.positive("MTBF (s)", mtbf_s)
    bound = cost.min_interval_s(every)
    if interval_s < bound * (1.0 - 1e-12):
        raise UsageError(
            f"interval {format_duration(interval_s)} with a remote copy every {every} checkpoints would put two "
            f"checkpoints or two drains in flight: it must be at least {format_duration(bound)}",
            hint="a longer interval or a larger remote period",
        )


def _log_laplace_segment(s: float, mu: float, length_s: float, recovery_s: float) -> float:
    """``log E[e^{-s T}]`` for the time ``T`` to run ``length_s`` with failures at rate ``mu``, each followed by a
    recovery of ``recovery_s`` that a failure starts over.

    ``phi = e^{-(s+mu) a} / (1 - mu/(s+mu) (1 - e^{-(s+mu) a}) psi)`` with ``psi`` the same expression for
    the recovery (length ``r``, nothing after its own failures).
    """
    rate = s + mu
    if mu == 0:
        return -s * length_s
    share = mu / rate
    log_psi = -rate * recovery_s - math.log1p(-share * -math.expm1(-rate * recovery_s))
    return -rate * length_s - math.log1p(-share * -math.expm1(-rate * length_s) * math.exp(log_psi))


def _group(tau: float, k: int, cost: TwoLevelCost, mtbf_s: float) -> float:
    """:func:`group_time_s` unchecked; ``inf`` when it overflows."""
    lam = 1.0 / mtbf_s
    lam1, lam2 = _rates(cost, mtbf_s)
    a = tau + cost.c1_s
    r1, r2 = cost.local_recovery_s, cost.remote_recovery_s
    if lam2 == 0:  # no loss failures: k local cycles and the drain's cost
        if lam1 * (max(a + cost.c2_s, r1)) + lam1 * r1 > single.MAX_EXPONENT:
            return math.inf
        return mtbf_s * math.exp(lam1 * r1) * ((k - 1) * math.expm1(lam1 * a) + math.expm1(lam1 * (a + cost.c2_s)))
    if lam * r2 > single.MAX_EXPONENT:
        return math.inf
    try:
        log_l = ((k - 1) * _log_laplace_segment(lam2, lam1, a, r1)
                 + _log_laplace_segment(lam2, lam1, a + cost.c2_s, r1))
    except (OverflowError, ValueError):
        return math.inf
    if -log_l > single.MAX_EXPONENT:
        return math.inf
    return math.expm1(-log_l) * (1.0 / lam2 + math.expm1(lam * r2) * mtbf_s)


def _waste(tau: float, k: int, cost: TwoLevelCost, mtbf_s: float) -> float:
    group = _group(tau, k, cost, mtbf_s)
    return 1.0 - k * tau / group if math.isfinite(group) else 1.0


def _best_interval(k: int, cost: TwoLevelCost, mtbf_s: float) -> tuple[float, float]:
    """``(tau, waste)`` minimising the waste at remote period ``k`` over ``tau`` in ``[bound, M]``."""
    bound = cost.min_interval_s(k)
    guess = benoit_interval_s(k, cost, mtbf_s)
    floor = max(bound, min(1e-12 * mtbf_s, guess / 1e3))
    top = max(mtbf_s, floor * 2.0)
    tau = single._minimise_log(lambda t: _waste(t, k, cost, mtbf_s), floor, top)
    if bound > 0 and _waste(bound, k, cost, mtbf_s) <= _waste(tau, k, cost, mtbf_s):
        tau = bound
    return tau, _waste(tau, k, cost, mtbf_s)


def _plateau(tau: float, k: int, waste: float, cost: TwoLevelCost, mtbf_s: float, tolerance: float,
             ) -> tuple[float, float]:
    """Intervals at remote period ``k`` whose waste is within ``tolerance`` of ``waste`` (unimodal: one range)."""
    limit = waste + tolerance
    return single.plateau_around(lambda t: _waste(t, k, cost, mtbf_s) <= limit, tau, cost.min_interval_s(k), mtbf_s)


def _tied_every(k: int, waste: float, cost: TwoLevelCost, mtbf_s: float, tolerance: float) -> tuple[int, int]:
    """The range of remote periods whose best waste is within ``tolerance`` of ``waste``."""
    limit = waste + tolerance

    def within(j: int) -> bool:
        return _best_interval(j, cost, mtbf_s)[1] <= limit

    low = k
    while low > 1 and within(low - 1):
        low -= 1
    high, step = k, 1
    while high + step <= MAX_EVERY and within(high + step):  # grow geometrically, then bisect the edge
        high += step
        step *= 2
    step //= 2
    while step >= 1:
        if high + step <= MAX_EVERY and within(high + step):
            high += step
        step //= 2
    return low, high
