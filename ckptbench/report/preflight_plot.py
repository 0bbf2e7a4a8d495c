"""PNG of a preflight: expected waste versus checkpoint interval, with the interval used and the optimum marked;
beside it, when the preflight wrote past the write-back cache, that write's bandwidth over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptbench.report.plot_footer import save_with_footer
from ckptbench.report.plot_style import interval_axis
from ckptbench.units import format_duration, format_size


def plot_waste_curve(document: dict[str, Any], path: Path) -> Path:
    """Draw ``ckptbench preflight --json``'s document to ``path`` (PNG) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = document["predictions"]
    curve = document["model"]["curve"]
    seconds = [pt["interval_s"] for pt in curve]
    waste = [100 * pt["waste_fraction"] for pt in curve]
    sustained = document["measurements"].get("sustained")
    if sustained:
        from ckptbench.report.timeseries_plot import draw_timeline

        fig, (ax, right) = plt.subplots(1, 2, figsize=(13, 4.5), dpi=120, width_ratios=(1.4, 1))
        timeline = sustained["timeline"]
        draw_timeline(right, {"write": {"timeline": {"interval_s": timeline["interval_s"], "runs": [
            {**timeline, "steady_state": sustained["steady_state"]}]}}})
        right.set_title(f"sustained write: {format_size(sustained['bytes'])}"
                        + (", sustained rate used" if sustained["used"] else ""), fontsize=9)
    else:
        fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    ax.plot(seconds, waste, color="#3b6fb6", label=f"expected waste ({p['mode']} checkpoints)")
    ax.axvline(p["optimal_interval_s"], color="#2a9d4b", linestyle="--",
               label=f"optimum {format_duration(p['optimal_interval_s'])}")
    if not p["interval_is_optimal"]:
        ax.axvline(p["interval_s"], color="#e07b39", linestyle=":",
                   label=f"yours {format_duration(p['interval_s'])}: {100 * p['waste_fraction']:.2f} %")
    interval_axis(ax)
    ax.set_ylim(0, min(100.0, max(waste) * 1.1))
    ax.set_ylabel("waste (% of wall time)")
    job = document["job"]
    ax.set_title(f"{document['target']}: {job['model']} on {job['ranks']} ranks, MTBF "
                 f"{format_duration(job['failures']['mtbf_s'])} — verdict {document['verdict']}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return save_with_footer(fig, document, path)
