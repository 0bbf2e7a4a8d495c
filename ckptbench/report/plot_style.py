"""One style across the PNGs: the interval axis of every waste-versus-interval plot, and min–max whiskers
drawn only from enough runs. matplotlib is imported inside the functions."""

from __future__ import annotations

from typing import Any

#: The x label of every plot against the checkpoint interval.
INTERVAL_LABEL = "checkpoint interval: compute time between checkpoints"


#: Tick candidates of an interval axis, in seconds: durations people name.
_NICE_S = (1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600,
           86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400, 90 * 86400, 365 * 86400)


def interval_axis(ax: Any, unit_s: float = 1.0) -> None:
    """The one style of an interval axis, in every plot against the checkpoint interval: values in seconds,
    a log scale, ticks at durations people name (``5m``, ``30m``, ``2h``), at most eight, one label.
    Call it once the curves are drawn (the ticks follow the axis' range); ``unit_s`` is the seconds in one
    unit of the plotted values (60 for minutes)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    from ckptbench.units import format_duration

    ax.set_xscale("log")
    low, high = (limit * unit_s for limit in ax.get_xlim())
    ticks = [t / unit_s for t in _NICE_S if low <= t <= high]
    step = max(1, -(-len(ticks) // 8))
    ax.xaxis.set_major_locator(FixedLocator(ticks[::step] or [low / unit_s, high / unit_s]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: format_duration(value * unit_s) if value > 0 else ""))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(INTERVAL_LABEL)


def whisker(summary: dict[str, Any], median: float) -> tuple[float, float]:
    """The min–max whisker below and above ``median`` from a summary of runs; none (0, 0) with fewer than
    ``units.RANGE_MIN_RUNS`` runs, where a range says nothing about the noise (as in the tables)."""
    from ckptbench.units import RANGE_MIN_RUNS

    if summary.get("n", 0) < RANGE_MIN_RUNS:
        return 0.0, 0.0
    return median - summary["min"], summary["max"] - median
