"""Time-series panels: bandwidth versus time (one run's timeline, its burst and sustained rates marked)
and the per-operation latency histogram (log-linear buckets, p50/p99 marked).

Reads the JSON form written by ``bench.timeline`` (``timeline``, ``latency_histogram`` and
``steady_state`` of a phase); matplotlib is imported by the caller's figure, the functions here draw on
given axes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptbench.report.plot_footer import save_with_footer
from ckptbench.units import format_size

COLORS = {"write": "#3b6fb6", "read": "#e07b39", "save": "#3b6fb6", "load": "#e07b39"}


def median_run(phase: dict[str, Any]) -> dict[str, Any] | None:
    """The timeline run of median length of a phase's JSON (the one its ``steady_state`` describes)."""
    timeline = phase.get("timeline") if phase else None
    if not timeline or not timeline.get("runs"):
        return None
    runs = sorted(timeline["runs"], key=lambda r: r["duration_s"])
    return runs[(len(runs) - 1) // 2]


def has_series(phases: dict[str, dict[str, Any] | None]) -> bool:
    """Whether any of ``phases`` (op -> phase JSON) carries a timeline or a latency histogram."""
    return any(p and (p.get("timeline") or p.get("latency_histogram")) for p in phases.values())


def steady_text(op: str, steady: dict[str, Any] | None,
                too_short: str = "use --runtime or a larger --size") -> str | None:
    """One line about a phase's steady state (``too_short``: what to do when the run was too short), or None
    when there is nothing to say."""
    if not steady:
        return None
    if steady["state"] == "burst":
        return (f"{op}: burst {steady['burst_gbps']:.2f} GB/s for the first {format_size(steady['burst_bytes'])} "
                f"({steady['change_s']:.1f} s), then sustained {steady['sustained_gbps']:.2f} GB/s")
    return {"steady": f"{op}: steady rate through the run",
            "drifting": f"{op}: the rate drifts during the run (no single drop)",
            "too-short": f"{op}: run too short to tell burst from sustained rate" + (f" ({too_short})" if too_short else ""),
            }.get(steady["state"])


def draw_timeline(ax: Any, phases: dict[str, dict[str, Any] | None]) -> None:
    """GB/s per interval of each phase's median run, with burst and sustained rates as dashed lines."""
    drawn = False
    for op, phase in phases.items():
        run = median_run(phase) if phase else None
        if run is None:
            continue
        interval = phase["timeline"]["interval_s"]
        times, rates = [], []
        for i, n in enumerate(run["bytes"]):
            length = min(interval, run["duration_s"] - i * interval)
            if length <= 0:
                continue
            times += [i * interval, i * interval + length]
            rates += [n / length / 1e9] * 2
        color = COLORS.get(op, "#555555")
        ax.plot(times, rates, color=color, label=op, linewidth=1.2)
        steady = run.get("steady_state") or {}
        if steady.get("state") == "burst":
            change = steady["change_s"]
            ax.hlines(steady["burst_gbps"], 0, change, colors=color, linestyles="--", linewidth=0.9)
            ax.hlines(steady["sustained_gbps"], change, run["duration_s"], colors=color, linestyles="--",
                      linewidth=0.9)
            ax.annotate(f"burst {format_size(steady['burst_bytes'])}", (change, steady["sustained_gbps"]),
                        fontsize=7, color=color, xytext=(3, 4), textcoords="offset points")
        drawn = True
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("GB/s per interval")
    ax.set_title("bandwidth over time (median run)", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)


def draw_histogram(ax: Any, phases: dict[str, dict[str, Any] | None]) -> None:
    """Operations per latency bucket (ms, log scale) of each phase, p50 and p99 marked."""
    drawn = False
    for op, phase in phases.items():
        hist = phase.get("latency_histogram") if phase else None
        if not hist or not hist["buckets"]:
            continue
        color = COLORS.get(op, "#555555")
        edges = [hist["buckets"][0][0] / 1e6]
        counts = []
        for low, high, n in hist["buckets"]:
            if low / 1e6 > edges[-1]:  # an empty gap between buckets
                edges.append(low / 1e6)
                counts.append(0)
            edges.append(high / 1e6)
            counts.append(n)
        ax.stairs(counts, edges, color=color, label=f"{op} ({hist['count']} ops)", linewidth=1.2)
        for name, style in (("p50_ms", ":"), ("p99_ms", "--")):
            if hist.get(name) is not None:
                ax.axvline(hist[name], color=color, linestyle=style, linewidth=0.8)
        drawn = True
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("operation latency, ms (dotted p50, dashed p99)")
    ax.set_ylabel("operations")
    ax.set_title("latency histogram", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if drawn:
        ax.legend(fontsize=7)


def plot_series(document: dict[str, Any], phases: dict[str, dict[str, Any] | None], title: str, path: Path) -> Path:
    """Both panels side by side for ``phases`` (op -> phase JSON) of ``document``, to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    histograms = any(p and p.get("latency_histogram") for p in phases.values())
    fig, axes = plt.subplots(1, 2 if histograms else 1, figsize=(10 if histograms else 6, 4), dpi=120,
                             squeeze=False)
    draw_timeline(axes[0][0], phases)
    if histograms:
        draw_histogram(axes[0][1], phases)
    fig.suptitle(title, fontsize=10)
    return save_with_footer(fig, document, path, top=0.93)


def best_phases(document: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """The write and read phases of a sweep's best configuration."""
    best = document["results"][document["best"]]
    return {"write": best.get("write"), "read": best.get("read")}
