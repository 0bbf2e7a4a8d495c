"""Monte Carlo simulation of two-level checkpointing (:mod:`ckptbench.model.twolevel`) with random failures.

The run does ``groups`` groups of ``k`` intervals of ``tau`` of compute (the work rounded up to whole
groups). It follows the schedule of the two-level model: segments of ``a = tau + c1`` of wall time,
the last of each group ``a + c2`` (the drain's cost); a failure that keeps the local copy costs the
local recovery ``r1`` and the segment it struck again; a failure that loses the local copy (each
failure independently, with probability ``q``) costs the remote recovery ``r2`` and its whole group
again; a failure during a recovery starts that recovery over (a loss failure during a local recovery
turns it into a remote one). The run is done when its last group completes.

Failures form a renewal process in wall-clock time, exponential or Weibull with shape ``k_w`` and
scale ``M / Gamma(1 + 1/k_w)`` (mean ``M``), the first drawn at time 0, as in
:mod:`ckptbench.model.simulate`. With exponential failures the mean wall time converges to
``groups x`` :func:`ckptbench.model.twolevel.group_time_s`; Weibull failures show what burstier
(``k_w < 1``) failures do to the same schedule.

Vectorised over runs with numpy: one loop step per failure of the longest run. The work is bounded
as in :mod:`ckptbench.model.simulate` (``MAX_SIMULATED_FAILURES``); Weibull runs that do not finish
within twice that are stopped with a reason.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ckptbench.errors import UsageError
from ckptbench.model import _checks, twolevel
from ckptbench.model.failures import check_weibull_shape
from ckptbench.model.simulate import MAX_SIMULATED_FAILURES, STEP_COST_RUNS, WallTimes, failure_sampler
from ckptbench.units import format_duration


@dataclass(frozen=True)
class TwoLevelSimulationConfig:
    """One simulated two-level run (repeated ``runs`` times with a seeded RNG)."""

    work_s: float
    interval_s: float
    every: int
    cost: twolevel.TwoLevelCost
    mtbf_s: float
    weibull_shape: float = 1.0
    runs: int = 10_000
    seed: int | None = 0

    def __post_init__(self) -> None:
        """Validates the values, the in-flight bounds and the size of the simulation."""
        _checks.positive("work (s)", self.work_s)
        check_weibull_shape("Weibull shape", self.weibull_shape)
        _checks.positive_int("simulated runs", self.runs, at_most=MAX_SIMULATED_FAILURES)
        twolevel.group_time_s(self.interval_s, self.every, self.cost, self.mtbf_s)  # validates tau, k, M
        if self.groups > 2**40:
            raise UsageError(f"work {format_duration(self.work_s)} is {self.groups:.3g} groups per run: too many to "
                             "simulate", hint="a shorter run (--work) or a longer interval")
        expected = self.expected_wall_s()
        per_run = expected / self.mtbf_s
        total = (self.runs + STEP_COST_RUNS) * (per_run + 1.0)
        if not (math.isfinite(total) and total <= MAX_SIMULATED_FAILURES):
            raise UsageError(
                f"{self.runs:,} simulated runs of {format_duration(self.work_s)} of compute would each see about "
                f"{per_run:.3g} failures: more than the simulator handles in a few seconds "
                f"(about {MAX_SIMULATED_FAILURES:.0e} in all)",
                hint="use fewer runs (--simulate) or a shorter run (--work)",
            )

    @property
    def groups(self) -> int:
        """Groups of ``every`` intervals per run: the work rounded up."""
        return max(1, math.ceil(self.work_s / (self.every * self.interval_s) * (1.0 - 1e-12)))

    @property
    def simulated_work_s(self) -> float:
        """The compute actually simulated: ``groups x every x tau``."""
        return self.groups * self.every * self.interval_s

    def expected_wall_s(self) -> float:
        """The exact model's expected wall time of one run (exponential failures)."""
        return self.groups * twolevel.group_time_s(self.interval_s, self.every, self.cost, self.mtbf_s)


@dataclass(frozen=True, eq=False)
class TwoLevelSimulationResult(WallTimes):
    """Per-run wall times and failure counts (numpy arrays) and their summaries."""

    config: TwoLevelSimulationConfig
    wall_s: np.ndarray = field(repr=False)
    failures: np.ndarray = field(repr=False)
    remote_restarts: np.ndarray = field(repr=False)

    @property
    def waste_fraction(self) -> float:
        """``1 - work / mean wall time`` (a ratio of means: what the bill sees)."""
        return 1.0 - self.config.simulated_work_s / self.mean_wall_s

    @property
    def stderr_waste_fraction(self) -> float:
        """Standard error of :attr:`waste_fraction` (delta method: ``work x stderr / mean^2``)."""
        return self.config.simulated_work_s * self.stderr_wall_s / self.mean_wall_s ** 2

    def z_score(self) -> float:
        """``(simulated mean - exact model) / standard error`` of the wall time (exponential failures)."""
        return (self.mean_wall_s - self.config.expected_wall_s()) / self.stderr_wall_s


def simulate(config: TwoLevelSimulationConfig) -> TwoLevelSimulationResult:
    """Simulate ``config.runs`` independent runs; see the module docstring for the schedule."""
    cost, mtbf, k = config.cost, config.mtbf_s, config.every
    a = config.interval_s + cost.c1_s
    group = k * a + cost.c2_s
    total = config.groups * group  # failure-free path length of the run, in segment wall time
    r1, r2, q = cost.local_recovery_s, cost.remote_recovery_s, cost.local_loss

    rng = np.random.default_rng(config.seed)
    shape = config.weibull_shape
    draw = failure_sampler(rng, mtbf, shape)
    runs = config.runs
    out_wall = np.empty(runs)
    out_failures = np.empty(runs, dtype=np.int64)
    out_remote = np.empty(runs, dtype=np.int64)

    idx = np.arange(runs)
    group_done = np.zeros(runs, dtype=np.int64)  # where the path resumes: whole groups done
    segment = np.zeros(runs, dtype=np.int64)  # and whole segments of the current group
    recovery = np.zeros(runs)  # the recovery to run before it (0 at the start)
    remote = np.ones(runs, dtype=bool)  # is that recovery a remote one
    t_start = np.zeros(runs)  # when the recovery starts
    t_fail = draw(runs)
    failures = np.zeros(runs, dtype=np.int64)
    remote_restarts = np.zeros(runs, dtype=np.int64)
    handled = 0

    for step in itertools.count():
        if not idx.size:
            break
        handled += idx.size + STEP_COST_RUNS
        if shape != 1.0 and handled > 2 * MAX_SIMULATED_FAILURES:
            raise UsageError(
                f"after {step:,} failures {idx.size:,} of {runs:,} simulated runs had not finished: with Weibull "
                f"shape {shape:g} the failures keep these runs from finishing",
                hint="a shorter --work or a Weibull shape nearer 1",
            )
        elapsed = t_fail - t_start
        finish = recovery + (total - group_done * group - segment * a)
        done = elapsed >= finish
        if done.any():
            out = idx[done]
            out_wall[out] = t_start[done] + finish[done]
            out_failures[out] = failures[done]
            out_remote[out] = remote_restarts[done]
            live = ~done
            idx, recovery, remote = idx[live], recovery[live], remote[live]
            group_done, segment = group_done[live], segment[live]
            t_start, t_fail, elapsed = t_start[live], t_fail[live], elapsed[live]
            failures, remote_restarts = failures[live], remote_restarts[live]

        loses = rng.random(idx.size) < q
        in_recovery = elapsed < recovery
        # Where a failure while computing strikes, counted from the current group's start (integers
        # for whole groups and segments, so that no rounding moves a run across a boundary).
        offset = segment * a + np.maximum(elapsed - recovery, 0.0)
        more_groups = np.floor(offset / group).astype(np.int64)
        struck_segment = np.minimum(np.floor((offset - more_groups * group) / a).astype(np.int64), k - 1)
        # A failure while computing resumes from its segment (local) or its group (remote); one during a
        # recovery starts it over, a loss failure turning a local recovery into a remote one.
        to_remote = loses | (in_recovery & remote)
        group_done = np.where(in_recovery, group_done, group_done + more_groups)
        segment = np.where(to_remote, 0, np.where(in_recovery, segment, struck_segment))
        remote = to_remote
        recovery = np.where(to_remote, r2, r1)
        remote_restarts += to_remote
        failures += 1
        t_start = t_fail
        t_fail = t_fail + draw(idx.size)

    return TwoLevelSimulationResult(config, out_wall, out_failures, out_remote)
