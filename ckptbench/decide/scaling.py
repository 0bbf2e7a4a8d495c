"""From a sample to the node's size (pure): a checkpoint's times measured at two sizes, fitted as a fixed part
plus a per-byte part, and read at the bytes the node writes.

One size cannot tell fixed costs (planning, the commit's fsyncs and renames, coordination between ranks,
setting up copy-on-write staging) from the per-byte cost, and scaling it in proportion overstates a large
node's time whenever fixed costs weigh at the sample's size. Two sizes can: ``t(b) = fixed + b / rate``.
Every time (sync save, cold load, async stall, persist) is fitted on its own, through the medians of the
runs for the point and through every pair of extreme runs for the range.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def line_time_s(small_bytes: float, small_s: float, large_bytes: float, large_s: float, target_bytes: float) -> float:
    """The time at ``target_bytes`` on the line through the two measurements. Noise can make the line fall
    (the larger took less time: the cost is flat, so the larger time stands) or cross zero (a negative
    fixed part: the per-byte cost alone, in proportion to the larger)."""
    if large_bytes <= small_bytes:
        raise ValueError(f"sizes {small_bytes} and {large_bytes} must grow")
    slope = (large_s - small_s) / (large_bytes - small_bytes)
    if slope <= 0:
        return max(small_s, large_s)
    fixed = small_s - slope * small_bytes
    if fixed < 0:
        return large_s * target_bytes / large_bytes
    return fixed + slope * target_bytes


@dataclass(frozen=True)
class Fitted:
    """A time read off the fit at the target size: the point and its range."""

    point_s: float
    low_s: float
    high_s: float

    def as_dict(self) -> dict[str, float]:
        return {"point_s": self.point_s, "low_s": self.low_s, "high_s": self.high_s}


def fit_time(small_bytes: float, small_runs_s: Sequence[float], large_bytes: float, large_runs_s: Sequence[float],
             target_bytes: float) -> Fitted:
    """The point through both sizes' medians; the range over the lines through every pair of extreme runs."""
    point = line_time_s(small_bytes, statistics.median(small_runs_s), large_bytes, statistics.median(large_runs_s),
                        target_bytes)
    ends = [line_time_s(small_bytes, a, large_bytes, b, target_bytes)
            for a in (min(small_runs_s), max(small_runs_s)) for b in (min(large_runs_s), max(large_runs_s))]
    return Fitted(point, min([point, *ends]), max([point, *ends]))
