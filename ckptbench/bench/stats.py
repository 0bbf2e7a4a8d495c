"""Summaries of repeated measurements and latency samples (pure functions, numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ckptbench.model.noise import beats, leaders

__all__ = ["beats", "latency_percentiles_ms", "leaders", "relative_spread", "summarize"]


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
