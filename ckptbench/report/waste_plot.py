"""PNG plots. matplotlib is imported inside each function (object API, Agg canvas), so importing this
module is free and no global backend is changed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ckptbench import safeio
from ckptbench.model.interval import CheckpointCost, waste_curve
from ckptbench.report.plot_style import interval_axis
from ckptbench.units import format_duration


def plot_waste_curve(
    path: Path, cost: CheckpointCost, mtbf_s: float, restart_s: float, marks: dict[str, Any],
) -> Path:
    """Waste (share of wall time, exact and first order) versus interval, on a log axis, written as PNG.

    ``marks`` holds ``optimal_interval_s``, ``young_interval_s``, ``daly_interval_s`` and optionally
    ``interval_s`` (the user's), each drawn as a vertical line; intervals below the async
    one-in-flight bound are shaded.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    optimum = marks["optimal_interval_s"]
    points = [optimum, marks["young_interval_s"], marks["daly_interval_s"]]
    if marks.get("interval_s"):
        points.append(marks["interval_s"])
    lo, hi = min(points) / 8.0, min(max(points) * 8.0, 20.0 * mtbf_s)
    n = 300
    grid = [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (n - 1)) for i in range(n)]
    curve = waste_curve(cost, mtbf_s, restart_s, grid)
    seconds = [t for t, _, _ in curve]
    exact = [100.0 * w for _, w, _ in curve]
    first = [100.0 * fo / (1.0 + fo) for _, _, fo in curve]  # per-work waste as a share of wall time

    fig = Figure(figsize=(8, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(seconds, exact, color="C0", lw=2, label="exact model")
    ax.plot(seconds, first, color="C0", lw=1, ls="--", alpha=0.7, label="first-order formula")
    ax.axvline(optimum, color="C2", lw=1.5, label=f"optimum {format_duration(optimum)}")
    ax.axvline(marks["young_interval_s"], color="C1", lw=1, ls=":",
               label=f"Young {format_duration(marks['young_interval_s'])}")
    ax.axvline(marks["daly_interval_s"], color="C4", lw=1, ls="-.",
               label=f"Daly {format_duration(marks['daly_interval_s'])}")
    if marks.get("interval_s"):
        ax.axvline(marks["interval_s"], color="C3", lw=1.5,
                   label=f"yours {format_duration(marks['interval_s'])}")
    if cost.min_interval_s > lo:
        ax.axvspan(lo, cost.min_interval_s, color="0.85", label="two checkpoints in flight")
    best = min(exact)
    ax.set_ylim(0, min(100.0, max(best * 3.0, best + 5.0)))
    interval_axis(ax)
    ax.set_ylabel("waste (% of wall time)")
    mode = "async" if cost.is_async else "sync"
    ax.set_title(f"Checkpoint interval ({mode}): MTBF {format_duration(mtbf_s)}, "
                 f"checkpoint cost {format_duration(cost.blocking_s)}, restart {format_duration(restart_s)}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    safeio.write_output(path, lambda out: fig.savefig(out, format="png"))
    return path
