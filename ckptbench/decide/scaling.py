"""From a sample to the node's size (pure): a checkpoint's times measured at two sizes, fitted as a fixed part
plus a per-byte part, and read at the bytes the node writes.

One size cannot tell fixed costs (planning, the commit's fsyncs and renames, coordination between ranks,
setting up copy-on-write staging) from the per-byte cost, and scaling it in proportion overstates a large
node's time whenever fixed costs weigh at the sample's size. Two sizes can: ``t(b) = fixed + b / rate``.
Every time (sync save, cold load, async stall, persist) is fitted on its own, through the medians of the
runs for the point and through every pair of extreme runs for the range, which is at least the 90 % interval
of the runs made again (a few runs' min and max understate how far the next few fall).

With more than two sizes the line is drawn through the two sizes nearest the target on its side (the
pair around it, or the two largest below it): a checkpoint's time grows less than in proportion where
per-tensor costs weigh (the tensor count grows slower than the bytes), so the slope measured far below
the target overstates it. A size measured at the target itself is read as it is, with no line at all.
:func:`extended_size` says how far up the sample can go within the host's memory and a time budget, and
:func:`affordable_runs` how many runs the time left at that size buys.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ckptbench import knobs


def line_time_s(small_bytes: float, small_s: float, large_bytes: float, large_s: float, target_bytes: float,
                min_slope: float = 0.0) -> float:
    """The time at ``target_bytes`` on the line through the two measurements. Noise (or a smaller size's
    layout with more of its bytes in small tensors) can make the line fall or flatten below ``min_slope``
    (seconds per byte: the fastest the bytes can go, e.g. the writer's own rate into memory): then the time
    of the size nearer the target stands, and the bytes beyond the larger size cost ``min_slope`` each. A
    line that crosses zero (a negative fixed part) gives the per-byte cost alone, in proportion to the
    larger."""
    if large_bytes <= small_bytes:
        raise ValueError(f"sizes {small_bytes} and {large_bytes} must grow")
    if _flat(small_bytes, small_s, large_bytes, large_s, min_slope):
        nearer = small_s if _small_is_nearer(small_bytes, large_bytes, target_bytes) else large_s
        return nearer + max(target_bytes - large_bytes, 0.0) * min_slope
    slope = (large_s - small_s) / (large_bytes - small_bytes)
    fixed = small_s - slope * small_bytes
    if fixed < 0:
        return large_s * target_bytes / large_bytes
    return fixed + slope * target_bytes


def _flat(small_bytes: float, small_s: float, large_bytes: float, large_s: float, min_slope: float) -> bool:
    """Whether the line through the two times falls or runs flatter than ``min_slope``."""
    return (large_s - small_s) / (large_bytes - small_bytes) <= min_slope


def _small_is_nearer(small_bytes: float, large_bytes: float, target_bytes: float) -> bool:
    return abs(target_bytes - small_bytes) < abs(target_bytes - large_bytes)


@dataclass(frozen=True)
class Fitted:
    """A time read off the fit at the target size: the point and its range."""

    point_s: float
    low_s: float
    high_s: float

    def as_dict(self) -> dict[str, float]:
        return {"point_s": self.point_s, "low_s": self.low_s, "high_s": self.high_s}


#: Student's t at 95 % (either end of a 90 % interval) for 1, 2, ... degrees of freedom; the normal's beyond.
_T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)


def next_median_half_width(runs_s: Sequence[float]) -> float:
    """Half the width of a 90 % interval for the median of as many runs made again: two medians of n runs
    differ with a standard deviation of about ``s * sqrt(pi / n)``, and with few runs ``s`` itself is
    uncertain (Student's t). ``s`` is :func:`robust_scale`: one slow run among three moves the next
    median little, so it must not move this interval much either (the range still reaches every run).
    0 from one run (nothing to go by)."""
    n = len(runs_s)
    if n < 2:
        return 0.0
    t = _T90[n - 2] if n - 2 < len(_T90) else 1.645
    return t * robust_scale(runs_s) * math.sqrt(math.pi / n)


def robust_scale(runs_s: Sequence[float]) -> float:
    """The runs' standard deviation, or where smaller, 1.4826 x their median absolute deviation (the
    normal's standard deviation from the middle half of the runs, which an outlier does not inflate)."""
    sd = statistics.stdev(runs_s)
    if len(runs_s) < 3:
        return sd
    middle = statistics.median(runs_s)
    return min(sd, 1.4826 * statistics.median(abs(x - middle) for x in runs_s))


def _widened(point: float, low: float, high: float, half_width: float, floor_s: float) -> Fitted:
    """``[low, high]`` widened to ``point -/+ half_width``, never below ``floor_s`` (nor zero)."""
    floor_s = max(floor_s, point * 1e-3, 1e-9)
    return Fitted(point, max(min(low, point - half_width), floor_s), max(high, point + half_width))


def fit_time(small_bytes: float, small_runs_s: Sequence[float], large_bytes: float, large_runs_s: Sequence[float],
             target_bytes: float, min_slope: float = 0.0) -> Fitted:
    """The point through both sizes' medians; the range over the lines through every pair of extreme runs,
    and at least the 90 % interval of the runs made again (:func:`next_median_half_width` of each size,
    carried along the line). ``min_slope``: see :func:`line_time_s`.

    Where the medians' line falls or runs flatter than ``min_slope``, the point is the nearer size's time
    (plus ``min_slope`` per byte beyond the larger size), and so is the range: that size's runs and the
    interval of its median made again, carried one to one. A line through one size's fast run and the
    other's slow one would rise where the medians say it does not, and read far out (a stall, whose cost
    follows the tensors' layout more than their bytes, can be smaller at a larger size)."""
    small_median, large_median = statistics.median(small_runs_s), statistics.median(large_runs_s)
    point = line_time_s(small_bytes, small_median, large_bytes, large_median, target_bytes, min_slope)
    if _flat(small_bytes, small_median, large_bytes, large_median, min_slope):
        near = small_runs_s if _small_is_nearer(small_bytes, large_bytes, target_bytes) else large_runs_s
        beyond = max(target_bytes - large_bytes, 0.0) * min_slope
        return _widened(point, min(min(near) + beyond, point), max(max(near) + beyond, point),
                        next_median_half_width(near), target_bytes * min_slope)
    ends = [line_time_s(small_bytes, a, large_bytes, b, target_bytes, min_slope)
            for a in (min(small_runs_s), max(small_runs_s)) for b in (min(large_runs_s), max(large_runs_s))]
    weight_large = (target_bytes - small_bytes) / (large_bytes - small_bytes)
    half = math.hypot((1 - weight_large) * next_median_half_width(small_runs_s),
                      weight_large * next_median_half_width(large_runs_s))
    return _widened(point, min([point, *ends]), max([point, *ends]), half, target_bytes * min_slope)


def widen_end(point: float, end: float, factor: float, *, up: bool) -> float:
    """One end of a measured range around ``point`` moved further out (above it with ``up``, else below) by
    ``factor``, the allowance for a measurement of another shape than the one predicted (a sample's size,
    fewer writers). The two are independent errors, so they add in quadrature on a log scale: an end the
    runs already put 40 % out moves to ``exp(hypot(ln 1.4, ln factor))``, and an end at the point moves the
    whole factor (an end on the other side of the point counts as at it). ``factor <= 1`` leaves ``end`` as
    it is, and so does a point or end of zero (nothing to scale)."""
    if factor <= 1 or point <= 0 or end <= 0:
        return end
    gap = max(math.log(end / point) if up else math.log(point / end), 0.0)
    return point * math.exp((1 if up else -1) * math.hypot(gap, math.log(factor)))


def sample_allowance(sampled: bool) -> float:
    """How far a job's times may lie beyond the runs' spread (a factor either way, for :func:`widen_end`):
    ``knobs.SAMPLE_EXTRAPOLATION`` for a measurement made without the job's launcher (one host's processes
    measuring a sample, minutes before the job starts), 1 for the job's own ranks (``shape`` job or nodes).
    A sample differs from the job even at the node's own bytes and ranks: another process, later, under a
    launcher; the host's rate itself drifts between processes by more than the runs in one process spread."""
    return max(1.0, knobs.SAMPLE_EXTRAPOLATION) if sampled else 1.0


#: A size within this fraction of the target is the target's own measurement (a workload of a model's
#: layout lands within one block of the size asked for), read in proportion to the target's bytes.
SAME_SIZE = 0.05


def fit_sizes(sizes: Sequence[float], runs_s: Sequence[Sequence[float]], target_bytes: float,
              min_slope: float = 0.0) -> Fitted:
    """The time at ``target_bytes`` from runs at any number of ``sizes`` (each with its runs): the runs at
    the target when a size is the target's (:data:`SAME_SIZE`); else the line (:func:`fit_time`, no flatter
    than ``min_slope``) through the two sizes nearest it on its side; one size alone, in proportion."""
    if len(sizes) != len(runs_s) or not sizes:
        raise ValueError("one list of runs per size, at least one size")
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    xs, ys = [float(sizes[i]) for i in order], [list(runs_s[i]) for i in order]
    fitted = _fit_sorted(xs, ys, target_bytes, min_slope)
    if any(abs(x / target_bytes - 1) <= SAME_SIZE for x in xs):
        return fitted  # measured at the target: its own runs say how low it goes
    # More bytes never take less time: the range starts no lower than the fastest run of a smaller size.
    below = [min(y) for x, y in zip(xs, ys, strict=True) if x < target_bytes * (1 - SAME_SIZE)]
    low = min(max(fitted.low_s, max(below, default=0.0)), fitted.point_s)
    return Fitted(fitted.point_s, low, fitted.high_s)


def _fit_sorted(xs: list[float], ys: list[list[float]], target_bytes: float, min_slope: float) -> Fitted:
    """:func:`fit_sizes` over sizes in increasing order, before the floor of the smaller sizes' runs."""
    same = [i for i, x in enumerate(xs) if abs(x / target_bytes - 1) <= SAME_SIZE]
    if same or len(xs) == 1:
        i = same[0] if same else 0
        k = target_bytes / xs[i]
        # The floor (the fastest the bytes can go) is itself measured: a run that went faster still counts.
        return _widened(statistics.median(ys[i]) * k, min(ys[i]) * k, max(ys[i]) * k,
                        next_median_half_width(ys[i]) * k, min(target_bytes * min_slope, min(ys[i]) * k))
    above = next((i for i, x in enumerate(xs) if x > target_bytes), len(xs))
    i = min(max(above - 1, 0), len(xs) - 2)
    return fit_time(xs[i], ys[i], xs[i + 1], ys[i + 1], target_bytes, min_slope)


def extended_size(target_bytes: float, sampled_bytes: float, run_seconds: float, *, runs: int, memory_bytes: float,
                  copies: float, budget_s: float, most_bytes: float, least_growth: float = 1.5) -> int | None:
    """The largest size worth measuring next, nearer ``target_bytes`` than the ``sampled_bytes`` that took
    ``run_seconds`` per run (save, load and asynchronous save together): at most the target, ``runs`` runs
    within ``budget_s``, ``copies`` of it within ``memory_bytes``, and ``most_bytes`` (the workload's
    largest). None when it would not reach ``least_growth`` times the sample."""
    if min(target_bytes, sampled_bytes, run_seconds, runs, copies) <= 0:
        raise ValueError("sizes, seconds, runs and copies must be positive")
    by_time = budget_s / runs / run_seconds * sampled_bytes
    size = min(target_bytes, memory_bytes / copies, by_time, most_bytes)
    if not math.isfinite(size) or size < least_growth * sampled_bytes:
        return None
    return int(size)


def affordable_runs(budget_s: float, run_seconds: float, *, least: int, most: int,
                    warmups: Callable[[int], int]) -> int:
    """The most measured runs, from ``least`` to ``most``, that fit ``budget_s`` at ``run_seconds`` each
    together with their warm-ups (``warmups(runs)``: one per process the runs are shared among). Where the
    budget is what set the size, that is ``least``; where the node's bytes or the host's memory did, the time
    left buys runs that narrow the range (Student's t of a few runs falls fast: 2.92 for three, 2.02 for
    six)."""
    if least < 1 or most < least or run_seconds <= 0:
        raise ValueError("runs must be positive, most >= least, and a run must take time")
    runs = least
    while runs < most and (runs + 1 + warmups(runs + 1)) * run_seconds <= budget_s:
        runs += 1
    return runs
