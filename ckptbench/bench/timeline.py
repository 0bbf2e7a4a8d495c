"""Time series of a run: bytes per interval (the bandwidth timeline), per-operation latency histograms,
and where a timeline drops from a burst rate to a sustained one.

The engine counts the bytes each chunk moved in the interval in which it completed and files each
chunk's latency into a log-linear histogram (:data:`SUB_BITS`); the object-store and checkpoint benches
build the same records from their own samples. Everything here is pure: plain numbers in, records
out, no I/O and no torch.

Steady state (:func:`steady_state`): a write-back cache (the page cache up to the dirty limits, an
SSD's fast cache, a server's memory) takes a first part of a run at a burst rate, then the run goes on
at the rate of what lies behind it. A timeline is cut where one step best explains it; the cut is a
burst only when the rate before it is at least ``1 + min_drop`` times the rate after it, the drop
stands out of the noise, and one step explains the timeline clearly better than a straight line (a
slow ramp is a drift, not a burst).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: The histogram's resolution: below 2**SUB_BITS ns one bucket per nanosecond, above it every power of
#: two cut into 2**SUB_BITS equal buckets (as the engine's ``latency_bucket``).
SUB_BITS = 3
BUCKETS = (64 - SUB_BITS + 1) << SUB_BITS

#: steady_state's defaults: fewest full intervals to judge, fewest intervals after the step, and the
#: smallest drop (burst / sustained - 1) called a burst.
MIN_INTERVALS = 5
MIN_SUSTAINED_INTERVALS = 3
MIN_DROP = 0.25

STATES = ("burst", "steady", "drifting", "too-short")


def bucket_of(ns: int) -> int:
    """The histogram bucket of a latency of ``ns`` nanoseconds."""
    sub = 1 << SUB_BITS
    ns = max(int(ns), 0)
    if ns < sub:
        return ns
    shift = ns.bit_length() - 1 - SUB_BITS
    return ((shift + 1) << SUB_BITS) + ((ns >> shift) & (sub - 1))


def bucket_bounds_ns(index: int) -> tuple[int, int]:
    """[low, high) nanoseconds of histogram bucket ``index``."""
    sub = 1 << SUB_BITS
    if index < sub:
        return index, index + 1
    shift = (index >> SUB_BITS) - 1
    low = (sub + (index & (sub - 1))) << shift
    return low, low + (1 << shift)


@dataclass(frozen=True)
class LatencyHistogram:
    """Operation counts per latency bucket (only the buckets that have any)."""

    counts: tuple[tuple[int, int], ...]  # (bucket, operations), buckets ascending

    @classmethod
    def from_counts(cls, counts: Iterable[int]) -> LatencyHistogram:
        """From a dense array of counts per bucket (the engine's ``latency_histogram``)."""
        return cls(tuple((i, int(n)) for i, n in enumerate(counts) if n))

    @classmethod
    def from_samples(cls, latencies_ns: Iterable[float]) -> LatencyHistogram:
        """From raw latency samples in nanoseconds."""
        dense: dict[int, int] = {}
        for ns in latencies_ns:
            b = bucket_of(int(ns))
            dense[b] = dense.get(b, 0) + 1
        return cls(tuple(sorted(dense.items())))

    @property
    def count(self) -> int:
        return sum(n for _, n in self.counts)

    def percentile_ns(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100): the middle of the bucket it falls in; None when empty."""
        total = self.count
        if total == 0:
            return None
        rank = max(1, math.ceil(q / 100 * total))
        seen = 0
        for bucket, n in self.counts:
            seen += n
            if seen >= rank:
                low, high = bucket_bounds_ns(bucket)
                return (low + high - 1) / 2
        raise AssertionError("unreachable: rank <= total")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "unit": "ns",
            "scheme": f"log-linear: one bucket per ns below {1 << SUB_BITS} ns, "
                      f"then {1 << SUB_BITS} equal buckets per power of two",
            "count": self.count,
            "buckets": [[*bucket_bounds_ns(b), n] for b, n in self.counts],
        }
        for name, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99), ("p99_9_ms", 99.9)):
            value = self.percentile_ns(q)
            out[name] = value / 1e6 if value is not None else None
        return out


def merge_histograms(histograms: Iterable[LatencyHistogram]) -> LatencyHistogram:
    """One histogram of every operation of ``histograms`` (repeats, threads, ranks)."""
    dense: dict[int, int] = {}
    for h in histograms:
        for b, n in h.counts:
            dense[b] = dense.get(b, 0) + n
    return LatencyHistogram(tuple(sorted(dense.items())))


@dataclass(frozen=True)
class Timeline:
    """Bytes completed in each interval of a run, from its start; the last interval may be partial."""

    interval_s: float
    bytes: tuple[int, ...]
    duration_s: float

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, not {self.interval_s!r}")

    @classmethod
    def from_engine(cls, result: Any) -> Timeline:
        """From an engine ``IoResult`` (``interval_ns``, ``timeline_bytes``, ``seconds``)."""
        return cls(result.interval_ns / 1e9, tuple(int(b) for b in result.timeline_bytes), result.seconds)

    @classmethod
    def from_events(cls, events: Iterable[tuple[float, int]], interval_s: float, duration_s: float) -> Timeline:
        """From (completion time in seconds since the start, bytes) of each operation."""
        slots: list[int] = []
        for t, n in events:
            i = max(int(t // interval_s), 0)
            if i >= len(slots):
                slots.extend([0] * (i + 1 - len(slots)))
            slots[i] += int(n)
        return cls(interval_s, tuple(slots), duration_s)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes)

    def full_intervals(self) -> list[int]:
        """The bytes of each interval that lasted a whole interval (a short last one is left out)."""
        whole = int(self.duration_s // self.interval_s + 1e-9)
        return list(self.bytes[: max(whole, 0)])

    def rates_bps(self) -> list[float]:
        """Bytes per second of each interval; the last one over the part of it the run lasted."""
        out = []
        for i, n in enumerate(self.bytes):
            length = min(self.interval_s, self.duration_s - i * self.interval_s)
            out.append(n / length if length > 0 else 0.0)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "duration_s": self.duration_s, "bytes": list(self.bytes)}


def merge_timelines(timelines: Sequence[Timeline], offsets_s: Sequence[float] | None = None) -> Timeline:
    """One timeline of ``timelines`` summed interval by interval, each shifted by its offset (seconds
    after the first start, rounded to an interval): ranks or threads that ran together (offsets 0, the
    default), or passes of a run by time that ran one after another."""
    if not timelines:
        raise ValueError("no timelines to merge")
    interval = timelines[0].interval_s
    if any(not math.isclose(t.interval_s, interval) for t in timelines):
        raise ValueError("timelines of different intervals cannot be merged")
    offsets = list(offsets_s) if offsets_s is not None else [0.0] * len(timelines)
    slots: list[int] = []
    duration = 0.0
    for t, offset in zip(timelines, offsets, strict=True):
        shift = max(round(offset / interval), 0)
        need = shift + len(t.bytes)
        if need > len(slots):
            slots.extend([0] * (need - len(slots)))
        for i, n in enumerate(t.bytes):
            slots[shift + i] += n
        duration = max(duration, offset + t.duration_s)
    return Timeline(interval, tuple(slots), duration)


@dataclass(frozen=True)
class SteadyState:
    """How a run's rate behaved: ``burst`` (a drop from ``burst_bps`` to ``sustained_bps`` once
    ``burst_bytes`` were written, ``change_s`` into the run), ``steady``, ``drifting`` (a trend, no
    single step) or ``too-short`` (too few intervals to tell)."""

    state: str
    burst_bps: float | None = None
    sustained_bps: float | None = None
    burst_bytes: int | None = None
    change_s: float | None = None

    @property
    def burst(self) -> bool:
        return self.state == "burst"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "burst_gbps": self.burst_bps / 1e9 if self.burst_bps is not None else None,
            "sustained_gbps": self.sustained_bps / 1e9 if self.sustained_bps is not None else None,
            "burst_bytes": self.burst_bytes,
            "change_s": self.change_s,
        }


def _sse(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values)


def _line_sse(values: Sequence[float]) -> tuple[float, float]:
    """(residual sum of squares, slope) of the least-squares line through ``values`` at x = 0, 1, ..."""
    n = len(values)
    xm = (n - 1) / 2
    ym = sum(values) / n
    sxx = sum((i - xm) ** 2 for i in range(n))
    slope = sum((i - xm) * (v - ym) for i, v in enumerate(values)) / sxx if sxx else 0.0
    sse = sum((v - ym - slope * (i - xm)) ** 2 for i, v in enumerate(values))
    return sse, slope


def steady_state(
    bytes_per_interval: Sequence[float],
    interval_s: float,
    *,
    min_intervals: int = MIN_INTERVALS,
    min_sustained: int = MIN_SUSTAINED_INTERVALS,
    min_drop: float = MIN_DROP,
) -> SteadyState:
    """Find a drop from a burst rate to a sustained rate in the bytes of consecutive whole intervals."""
    values = [float(b) for b in bytes_per_interval]
    n = len(values)
    if n < max(min_intervals, min_sustained + 1):
        return SteadyState("too-short")
    best_k, best_sse = 0, math.inf
    for k in range(1, n - min_sustained + 1):
        sse = _sse(values[:k]) + _sse(values[k:])
        if sse < best_sse:
            best_k, best_sse = k, sse
    before = sum(values[:best_k]) / best_k
    after = sum(values[best_k:]) / (n - best_k)
    line_sse, slope = _line_sse(values)
    noise = math.sqrt(best_sse / max(n - 2, 1))
    if (after > 0 and before >= (1 + min_drop) * after and before - after > 3 * noise
            and best_sse <= 0.5 * line_sse):
        return SteadyState(
            "burst",
            burst_bps=before / interval_s,
            sustained_bps=after / interval_s,
            burst_bytes=int(sum(values[:best_k])),
            change_s=best_k * interval_s,
        )
    mean = sum(values) / n
    total_sse = _sse(values)
    if mean > 0 and abs(slope) * (n - 1) >= min_drop * mean and line_sse <= 0.5 * total_sse:
        return SteadyState("drifting")
    return SteadyState("steady")


def detect(timeline: Timeline, **kwargs: Any) -> SteadyState:
    """:func:`steady_state` of a timeline's whole intervals."""
    return steady_state(timeline.full_intervals(), timeline.interval_s, **kwargs)


def series_dict(timelines: Sequence[Timeline], histogram: LatencyHistogram | None) -> dict[str, Any]:
    """The JSON keys every measured phase carries: ``timeline`` (per run: bytes per interval and its
    steady state), ``latency_histogram`` and ``steady_state`` (of the run of median length); None where
    nothing was recorded."""
    if timelines:
        ordered = sorted(timelines, key=lambda t: t.duration_s)
        steady: dict[str, Any] | None = detect(ordered[(len(ordered) - 1) // 2]).to_dict()
        timeline: dict[str, Any] | None = {
            "interval_s": timelines[0].interval_s,
            "runs": [{**t.to_dict(), "steady_state": detect(t).to_dict()} for t in timelines],
        }
    else:
        steady = timeline = None
    return {"latency_histogram": histogram.to_dict() if histogram else None, "timeline": timeline,
            "steady_state": steady}


def from_engine_calls(calls: Sequence[Any], start_ns: int, duration_s: float) -> tuple[Timeline, LatencyHistogram] | None:
    """One run's timeline and histogram from the engine calls it made (``IoResult``s, one after another or
    at once), placed at their start after ``start_ns`` (``time.monotonic_ns()``); None without calls."""
    if not calls:
        return None
    timeline = merge_timelines([Timeline.from_engine(c) for c in calls],
                               [max(c.start_ns - start_ns, 0) / 1e9 for c in calls])
    timeline = Timeline(timeline.interval_s, timeline.bytes, max(duration_s, timeline.duration_s))
    return timeline, merge_histograms(LatencyHistogram.from_counts(c.latency_histogram) for c in calls)
