"""PNG of a checkpoint-writer shoot-out: save and load GB/s per writer (median, min–max whiskers) and,
for the async writers, stall and persist seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptbench.report.plot_footer import save_with_footer
from ckptbench.report.plot_style import whisker
from ckptbench.units import format_size

_COLORS = {"save": "#3b6fb6", "load": "#e07b39", "stall": "#b63b3b", "persist": "#8fb3de"}


def plot_shootout(document: dict[str, Any], path: Path) -> Path:
    """Draw ``ckptbench bench --workload checkpoint --json``'s document to ``path`` (PNG); return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ckptbench.report.timeseries_plot import draw_histogram, draw_timeline, has_series

    results, runs = document["results"], document["async"]
    ours = next((r for r in results if r["writer"] == "ckptbench"), None)
    series = {"save": ours.get("save"), "load": ours.get("load")} if ours else {}
    widths = [max(4.0, 1.2 * len(results) + 1.5)] + ([max(3.0, 1.2 * len(runs) + 1.5)] if runs else [])
    rows = 2 if has_series(series) else 1
    fig = plt.figure(figsize=(max(sum(widths) + 0.5, 10.0 if rows == 2 else 0.0), 4.8 * rows), dpi=120)
    outer = fig.add_gridspec(rows, 1)
    top = outer[0].subgridspec(1, len(widths), width_ratios=widths)
    _rates(fig.add_subplot(top[0, 0]), results)
    if runs:
        _async(fig.add_subplot(top[0, 1]), runs)
    if rows == 2:  # the ckptbench writer over time, below
        bottom = outer[1].subgridspec(1, 2)
        draw_timeline(fig.add_subplot(bottom[0, 0]), series)
        draw_histogram(fig.add_subplot(bottom[0, 1]), series)
    workload, env = document["workload"], document["environment"]
    shape = workload["shape"]
    fs = (env.get("target") or {}).get("filesystem")
    fig.suptitle(f"{document['target']} ({fs}): {workload['model']} x{workload['scale']:.3g} "
                 f"({shape['layers']} blocks, hidden {shape['hidden']}), {format_size(workload['total_bytes'])} in "
                 f"{workload['tensors']} tensors; saves durable, loads cold ({document['cache_drop']['method']})",
                 fontsize=9)
    return save_with_footer(fig, document, path, top=0.95)


def _rates(ax: Any, results: list[dict[str, Any]]) -> None:
    import numpy as np

    x = np.arange(len(results))
    width = 0.38
    peak = 0.0
    for i, op in enumerate(("save", "load")):
        med = np.array([r[op]["gbps"] for r in results])
        low, high = (np.array(side) for side in zip(*(whisker(r[op]["summary_gbps"], m)
                                                       for r, m in zip(results, med, strict=True)), strict=True))
        bars = ax.bar(x + (i - 0.5) * width, med, width, yerr=[low, high], capsize=3, color=_COLORS[op],
                      label=f"{op} (median, min–max)")
        for bar, value, top, record in zip(bars, med, med + high, results, strict=True):
            if record["writer"] == "fio":
                bar.set_hatch("//")
            note = "\ncached!" if record[op]["cached"] else ""
            ax.annotate(f"{value:.2f}{note}", (bar.get_x() + bar.get_width() / 2, top), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 2), textcoords="offset points")
        peak = max(peak, float((med + high).max()))
    labels = [r["writer"] + (" (raw bytes)" if r["writer"] == "fio" else "") for r in results]
    ax.set_xticks(x, labels, fontsize=8)
    for tick, record in zip(ax.get_xticklabels(), results, strict=True):
        if record["writer"] == "ckptbench":
            tick.set_fontweight("bold")
    ax.set_ylim(0, peak * 1.25 if peak > 0 else 1)
    ax.set_ylabel("GB/s (1e9 B/s of state_dict)")
    ax.set_title("durable save, cold load", fontsize=9)
    ax.legend(loc="upper right", fontsize=7, ncols=2)
    ax.grid(axis="y", alpha=0.3)


def _async(ax: Any, runs: list[dict[str, Any]]) -> None:
    import numpy as np
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    x = np.arange(len(runs))
    width = 0.38
    for i, part in enumerate(("stall", "persist")):
        med = np.array([a[f"{part}_s"] for a in runs])
        low, high = (np.array(side) for side in zip(*(whisker(a[f"summary_{part}_s"], m)
                                                       for a, m in zip(runs, med, strict=True)), strict=True))
        bars = ax.bar(x + (i - 0.5) * width, med, width, yerr=[low, high], capsize=3, color=_COLORS[part],
                      label=f"{part} (median, min–max)")
        for bar, value, top in zip(bars, med, med + high, strict=True):
            ax.annotate(_short_s(value), (bar.get_x() + bar.get_width() / 2, top), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 2), textcoords="offset points")
    labels = []
    for a in runs:
        slowdown = "n/a" if a["interference"] is None else f"{a['interference']:+.0%}"
        labels.append(f"{a['writer']}\nprobe {slowdown}")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: _short_s(value)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("seconds (log scale)")
    ax.set_title("async save: stall vs persist", fontsize=9)
    ax.legend(loc="upper left", fontsize=7)
    ax.grid(axis="y", alpha=0.3, which="both")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 3)  # room for the labels


def _short_s(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"

