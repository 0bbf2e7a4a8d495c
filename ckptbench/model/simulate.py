"""Monte Carlo simulation of a training run with random failures, checkpoints and restarts.

The run must do ``work_s`` of compute. It is split into ``n = ceil(work / tau)`` equal intervals of
``tau = work / n`` (fewer if that would break the one-in-flight bound); after each one the job
checkpoints, and it is done when the final checkpoint is durable. Checkpoints are synchronous
(``cost.stall_s = C``, training waits) or asynchronous (stall ``s`` blocks training, then the
snapshot persists for ``P`` while training runs at ``1 - f`` of its speed; at most one in flight,
so ``tau >= (1 - f) P``, unless the work is shorter than that and takes one interval, whose single
checkpoint has none to overlap). The snapshot holds the state at the start of its stall.

Failures form a renewal process in wall-clock time: the times between them are independent,
exponential or Weibull with shape ``k`` and scale ``M / Gamma(1 + 1/k)`` (so their mean is the
MTBF ``M``), and the first is drawn at time 0. They strike whatever the job is doing:

* while computing: the work since the newest *durable* snapshot is lost;
* during a synchronous checkpoint, or during an async stall or persist: that checkpoint is lost
  (it never became durable) and the job falls back to the previous durable one;
* during a restart: the restart starts over (its elapsed time counts as restart time); with
  ``restart_can_fail=False`` such a failure is absorbed by the recovery under way and not counted
  (the convention of :mod:`ckptbench.model.goodput`).

After a failure the job restarts (``restart_s``) and resumes from the newest durable snapshot with
nothing in flight. Every second of wall time lands in exactly one category:
``wall = work + checkpoint + lost + restart``, where ``checkpoint`` is the stalls, the throughput
lost to interference and the wait for the final snapshot to persist, counted for the checkpoints
that were kept; the rest of a failed segment is ``lost``.

Vectorised over runs with numpy: the loop runs once per failure (the longest run's count), each step
handling the next failure of every unfinished run at once. With exponential failures the mean wall
time converges to :func:`ckptbench.model.interval.expected_wall_time_s`.

Cost: about one numpy step per failure of the longest run plus a few operations per failure of every
run, i.e. proportional to ``(runs + STEP_COST_RUNS) x (expected failures per run + 1)``.
:class:`SimulationConfig` refuses configurations where that exceeds :data:`MAX_SIMULATED_FAILURES`
(a few seconds). The expectation is the exponential one, and with exponential failures the loop runs
until every run is done: a failure-free stretch of restart + interval + checkpoint advances a run by
a checkpoint, so its failure count is at most a sum of geometric counts, whose tail is exponentially
small; the longest of ``R`` runs needs about ``log R`` standard deviations more than the mean, and
those steps handle only the few runs still going, at about ``STEP_COST_RUNS`` failures' worth each.
(A cap on steps near the mean would be wrong: of two million runs a few need twice the mean.)
Weibull failures can need far more, or never finish (with a large shape, failures so regular that a
segment longer than the MTBF never completes), so for them :func:`simulate` stops once it has done
twice the budget's worth of work, counted as above, and says so.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ckptbench.errors import UsageError
from ckptbench.model import _checks
from ckptbench.model.failures import check_weibull_shape
from ckptbench.model.interval import CheckpointCost, check_in_flight, expected_wall_time_s, intervals_for
from ckptbench.units import format_duration

log = logging.getLogger(__name__)

#: Budget of a simulation in failures handled, ``(runs + STEP_COST_RUNS) x (failures per run + 1)``:
#: about 3e7 a second are handled, so this is a few seconds.
MAX_SIMULATED_FAILURES = 100_000_000
#: One loop step (numpy call overhead) costs about as much as handling one failure of this many runs.
STEP_COST_RUNS = 1_000
#: Checkpoints per run are counted in 64-bit integers and float seconds: exact below 2^53.
MAX_CHECKPOINTS = 2**53


@dataclass(frozen=True)
class SimulationConfig:
    """One simulated training run (repeated ``runs`` times with a seeded RNG)."""

    work_s: float
    interval_s: float
    cost: CheckpointCost
    mtbf_s: float
    restart_s: float = 0.0
    weibull_shape: float = 1.0
    runs: int = 10_000
    seed: int | None = 0
    restart_can_fail: bool = True

    def __post_init__(self) -> None:
        """Validates the values, the one-in-flight bound, and the size of the work (see :meth:`expected_failures`)."""
        _checks.positive("work (s)", self.work_s)
        _checks.positive("interval (s)", self.interval_s)
        _checks.positive("MTBF (s)", self.mtbf_s)
        _checks.nonnegative("restart (s)", self.restart_s)
        check_weibull_shape("Weibull shape", self.weibull_shape)
        _checks.positive_int("simulated runs", self.runs, at_most=MAX_SIMULATED_FAILURES)
        check_in_flight(self.interval_s, self.cost)
        if self.checkpoints > MAX_CHECKPOINTS:
            raise UsageError(
                f"work {format_duration(self.work_s)} in intervals of {format_duration(self.interval_s)} is "
                f"{self.checkpoints:.3g} checkpoints per run, more than the simulator counts exactly (2^53)",
                hint="a shorter run (--work) or a longer interval",
            )
        self._check_size()

    @property
    def checkpoints(self) -> int:
        """Checkpoints per run without failures (including the final one)."""
        return intervals_for(self.work_s, self.interval_s, self.cost.min_interval_s)

    @property
    def used_interval_s(self) -> float:
        """The interval actually used: ``work / checkpoints`` (at most ``interval_s``, see above)."""
        return self.work_s / self.checkpoints

    def expected_wall_s(self) -> float:
        """The exact model's expected wall time of one run (exponential failures)."""
        return expected_wall_time_s(
            self.work_s, self.interval_s, self.cost, self.mtbf_s, self.restart_s,
            restart_can_fail=self.restart_can_fail,
        )

    def _check_size(self) -> None:
        """Refuse simulations that would not finish in a few seconds, saying what to shrink."""
        expected = self.expected_wall_s()
        per_run = expected / self.mtbf_s
        total = (self.runs + STEP_COST_RUNS) * (per_run + 1.0)
        if math.isfinite(total) and total <= MAX_SIMULATED_FAILURES:
            log.debug("simulating %d runs, about %.1f failures each", self.runs, per_run)
            return
        runs = f"{self.runs:,} simulated run{'s' if self.runs > 1 else ''} of {format_duration(self.work_s)} of compute"
        if self.cost.durable_s >= self.mtbf_s:
            raise UsageError(
                f"{runs}: checkpointing cannot keep up with this failure rate (a checkpoint takes longer than the "
                f"MTBF to become durable), so each run would see about {per_run:.3g} failures",
                hint="write checkpoints faster or fail less often",
            )
        slow = f"; at this failure rate a run takes {expected / self.work_s:.3g} times its compute time" if (
            expected > 10.0 * self.work_s) else ""
        raise UsageError(
            f"{runs} would each see about {per_run:.3g} failures, {self.runs * per_run:.3g} in all: more than the "
            f"simulator handles in a few seconds (about {MAX_SIMULATED_FAILURES:.0e}){slow}",
            hint="use fewer runs (--simulate) or a shorter run (--work)",
        )


def failure_sampler(rng: np.random.Generator, mtbf_s: float, weibull_shape: float) -> Callable[[int], np.ndarray]:
    """``draw(n)``: ``n`` times to the next failure from ``rng``, exponential (shape 1) or Weibull with mean
    ``mtbf_s``."""
    scale = mtbf_s / math.gamma(1.0 + 1.0 / weibull_shape)

    def draw(size: int) -> np.ndarray:
        if weibull_shape == 1.0:
            return rng.exponential(mtbf_s, size)
        return scale * rng.weibull(weibull_shape, size)

    return draw


class WallTimes:
    """The wall-time summary every simulation result shares (``wall_s``: one simulated run's wall time each)."""

    wall_s: np.ndarray

    @property
    def mean_wall_s(self) -> float:
        return float(self.wall_s.mean())

    @property
    def stderr_wall_s(self) -> float:
        """Standard error of :attr:`mean_wall_s` (NaN for a single run, which has no spread)."""
        return float(self.wall_s.std(ddof=1) / math.sqrt(self.wall_s.size)) if self.wall_s.size > 1 else math.nan


@dataclass(frozen=True, eq=False)
class SimulationResult(WallTimes):
    """Per-run outcomes (numpy arrays, seconds) and their means.

    ``wall_s = work + checkpoint_s + lost_s + restart_s`` for every run.
    """

    config: SimulationConfig
    wall_s: np.ndarray = field(repr=False)
    checkpoint_s: np.ndarray = field(repr=False)
    lost_s: np.ndarray = field(repr=False)
    restart_s: np.ndarray = field(repr=False)
    failures: np.ndarray = field(repr=False)

    @property
    def goodput(self) -> float:
        """Useful compute / expected wall time (a ratio of means: what the bill sees)."""
        return self.config.work_s / self.mean_wall_s

    @property
    def waste_fraction(self) -> float:
        return 1.0 - self.goodput

    def breakdown_s(self) -> dict[str, float]:
        """Mean seconds per run in each category: ``work``, ``checkpoint``, ``lost``, ``restart``."""
        return {
            "work": self.config.work_s,
            "checkpoint": float(self.checkpoint_s.mean()),
            "lost": float(self.lost_s.mean()),
            "restart": float(self.restart_s.mean()),
        }


def simulate(config: SimulationConfig) -> SimulationResult:
    """Simulate ``config.runs`` independent runs; see the module docstring for the semantics."""
    cost, mtbf = config.cost, config.mtbf_s
    n = config.checkpoints
    tau = config.used_interval_s
    period = tau + cost.blocking_s  # durable-to-durable in steady state: tau + s + fP
    first = tau + cost.durable_s  # resume-to-durable: tau + s + P

    shape = config.weibull_shape
    draw = failure_sampler(np.random.default_rng(config.seed), mtbf, shape)
    runs = config.runs
    out_wall = np.empty(runs)
    out_ckpt = np.empty(runs)
    out_lost = np.empty(runs)
    out_restart = np.empty(runs)
    out_failures = np.empty(runs, dtype=np.int64)

    # State of the unfinished runs (compacted as runs finish).
    idx = np.arange(runs)
    durable = np.zeros(runs, dtype=np.int64)  # index of the newest durable snapshot (0 = the start)
    t_start = np.zeros(runs)  # when compute (re)starts from that snapshot
    t_fail = draw(runs)  # absolute time of the next failure
    ckpt = np.zeros(runs)
    lost = np.zeros(runs)
    restart = np.zeros(runs)
    failures = np.zeros(runs, dtype=np.int64)
    handled = 0  # the loop's work so far, in the budget's units (see the module docstring)

    for step in itertools.count():
        if not idx.size:
            break
        handled += idx.size + STEP_COST_RUNS
        if shape != 1.0 and handled > 2 * MAX_SIMULATED_FAILURES:
            expected = config.expected_wall_s() / mtbf
            raise UsageError(
                f"after {step:,} failures {idx.size:,} of {runs:,} simulated runs had not finished, where "
                f"exponential failures would take about {expected:.3g} per run: with Weibull shape {shape:g} the "
                "failures keep these runs from finishing",
                hint="a shorter --work, a shorter interval or persist, or a Weibull shape nearer 1",
            )
        in_restart = t_fail < t_start
        elapsed = t_fail - t_start
        remaining = n - durable
        finish = first + (remaining - 1) * period
        done = ~in_restart & (elapsed >= finish)

        if done.any():  # finished before this failure: record and drop
            k = remaining[done]
            out_idx = idx[done]
            out_wall[out_idx] = t_start[done] + finish[done]
            out_ckpt[out_idx] = ckpt[done] + k * cost.blocking_s + cost.rollback_s
            out_lost[out_idx] = lost[done]
            out_restart[out_idx] = restart[done]
            out_failures[out_idx] = failures[done]
            live = ~done
            idx, durable, t_start, t_fail = idx[live], durable[live], t_start[live], t_fail[live]
            ckpt, lost, restart, failures = ckpt[live], lost[live], restart[live], failures[live]
            in_restart, elapsed, remaining = in_restart[live], elapsed[live], remaining[live]

        # Every remaining run fails now: during a restart (which starts over) or while computing or
        # checkpointing (keeping the snapshots that became durable before the failure).
        kept = np.clip(np.floor((elapsed - first) / period).astype(np.int64) + 1, 0, remaining - 1)
        kept[in_restart] = 0
        ckpt += kept * cost.blocking_s
        lost += np.where(in_restart, 0.0, elapsed - kept * period)
        durable += kept
        if config.restart_can_fail:
            restart += config.restart_s - np.where(in_restart, -elapsed, 0.0)
            t_start = t_fail + config.restart_s
            failures += 1
        else:  # a failure during a restart is absorbed by it
            restart += np.where(in_restart, 0.0, config.restart_s)
            t_start = np.where(in_restart, t_start, t_fail + config.restart_s)
            failures += ~in_restart
        t_fail = t_fail + draw(idx.size)

    return SimulationResult(config, out_wall, out_ckpt, out_lost, out_restart, out_failures)
