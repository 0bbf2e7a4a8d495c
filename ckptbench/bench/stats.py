"""Summaries of repeated measurements and latency samples (pure functions, numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def summarize(samples: Sequence[float]) -> dict[str, float | int]:
    """Median, min, max, p10, p90, mean and stdev of repeated measurements (hyperfine-style)."""
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        raise ValueError("no samples to summarize")
    return {
        "median": float(np.median(values)),
        "min": float(values.min()),
        "max": float(values.max()),
        "p10": float(np.percentile(values, 10)),
        "p90": float(np.percentile(values, 90)),
        "mean": float(values.mean()),
        "stdev": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        "n": int(values.size),
    }


def latency_percentiles_ms(latencies_ns: np.ndarray) -> dict[str, float] | None:
    """p50/p90/p99/p99.9/max/mean of per-operation latencies, in milliseconds (None when empty)."""
    if latencies_ns.size == 0:
        return None
    ms = latencies_ns.astype(np.float64) / 1e6
    p50, p90, p99, p999 = np.percentile(ms, [50, 90, 99, 99.9])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "p99_9": float(p999),
        "max": float(ms.max()),
        "mean": float(ms.mean()),
        "count": int(ms.size),
    }


def relative_spread(samples: Sequence[float]) -> float:
    """(max - min) / median: how far apart repeats landed (0 for a single sample)."""
    values = np.asarray(samples, dtype=float)
    median = float(np.median(values))
    return float((values.max() - values.min()) / median) if values.size > 1 and median > 0 else 0.0


def beats(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True) -> bool:
    """Whether ``a`` is better than ``b`` beyond the noise of both: each has two or more samples and every
    sample of ``a`` is better than every sample of ``b`` (their ranges do not overlap). One sample says
    nothing about the noise, so it never beats and is never beaten."""
    if len(a) < 2 or len(b) < 2:
        return False
    return min(a) > max(b) if higher_is_better else max(a) < min(b)


def leaders(candidates: Sequence[Sequence[float]], higher_is_better: bool = True) -> list[int]:
    """Indices of the candidates tied for best, best median first: the one with the best median, and every
    other one it does not :func:`beats`. One index means a winner beyond the noise."""
    if not candidates:
        raise ValueError("no candidates to rank")
    medians = [float(np.median(np.asarray(c, dtype=float))) for c in candidates]
    order = sorted(range(len(candidates)), key=lambda i: medians[i], reverse=higher_is_better)
    top = order[0]
    return [top] + [i for i in order[1:] if not beats(candidates[top], candidates[i], higher_is_better)]
