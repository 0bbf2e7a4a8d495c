"""PNGs of a sweep (filesystem or object storage): write and read GB/s per configuration, median with
min–max whiskers, the best configuration's label in bold; below, when the document has them, the best
configuration's bandwidth over time and latency histogram (``report.timeseries_plot``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptbench.report.plot_footer import save_with_footer
from ckptbench.report.plot_style import whisker
from ckptbench.report.timeseries_plot import best_phases, draw_histogram, draw_timeline, has_series
from ckptbench.units import format_size


def plot_fs_sweep(document: dict[str, Any], path: Path) -> Path:
    """Draw ``ckptbench bench --json``'s document to ``path`` (PNG) and return the path."""
    results = document["results"]
    several = len({r["config"]["schedule"] for r in results}) > 1
    labels = [f"{r['config']['threads']} thr\n{format_size(r['config']['block_size'])}"
              + (f"\n{r['config']['schedule']}" if several else "") for r in results]
    target = document["environment"].get("target") or {}
    config = results[0]["config"]
    mode = ("O_DIRECT" if config["direct"] else "buffered") + (f" + {config['sync']}" if config["fsync"] else "")
    title = (f"{document['target']} ({target.get('filesystem')}): {format_size(config['size_bytes'])} "
             f"in {config['files']} files, {mode}")
    return _plot_bars(document, labels, title, path)


def plot_object_sweep(document: dict[str, Any], path: Path) -> Path:
    """Draw ``ckptbench bench s3://... --json``'s document to ``path`` (PNG) and return the path."""
    results = document["results"]
    labels = []
    for r in results:
        c = r["config"]
        part = "1 PUT" if c["parts_per_object"] == 1 else f"{format_size(c['part_size_bytes'])} parts"
        labels.append(f"{format_size(c['object_size_bytes'])}\nx{c['concurrency']}\n{part}")
    target = document["environment"].get("target") or {}
    title = (f"{document['target']} at {target.get('endpoint', '?')}, {format_size(document['spec']['size_bytes'])} "
             "per run\nobject size / requests in flight / part size")
    return _plot_bars(document, labels, title, path)


def _plot_bars(document: dict[str, Any], labels: list[str], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    results = document["results"]
    ops = [op for op in ("write", "read") if results[0][op] is not None]
    x = np.arange(len(results))
    width = 0.8 / len(ops)
    series = best_phases(document)
    if has_series(series):
        fig = plt.figure(figsize=(max(10.0, 1.1 * len(results) + 2), 8.5), dpi=120)
        grid = fig.add_gridspec(2, 2, height_ratios=(1.1, 1))
        ax = fig.add_subplot(grid[0, :])
        draw_timeline(fig.add_subplot(grid[1, 0]), series)
        draw_histogram(fig.add_subplot(grid[1, 1]), series)
    else:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(results) + 2), 4.5), dpi=120)
    colors = {"write": "#3b6fb6", "read": "#e07b39"}
    peak = 0.0
    for i, op in enumerate(ops):
        med = np.array([r[op]["gbps"] for r in results])
        low, high = (np.array(side) for side in zip(*(whisker(r[op]["summary_gbps"], m)
                                                       for r, m in zip(results, med, strict=True)), strict=True))
        bars = ax.bar(x + (i - (len(ops) - 1) / 2) * width, med, width, yerr=[low, high], capsize=3,
                      label=f"{op} (median, min–max)", color=colors[op])
        for bar, value, top, record in zip(bars, med, med + high, results, strict=True):
            note = "\ncached!" if record[op]["cached"] else ""
            ax.annotate(f"{value:.2f}{note}", (bar.get_x() + bar.get_width() / 2, top), ha="center",
                        va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
        peak = max(peak, float((med + high).max()))
    best = document["best"]
    ax.set_ylim(0, peak * 1.25)  # headroom for the labels and the legend
    ax.set_xticks(x, labels)
    ax.get_xticklabels()[best].set_fontweight("bold")
    ax.set_ylabel("GB/s (1e9 B/s)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper right", fontsize=8, ncols=len(ops))
    ax.grid(axis="y", alpha=0.3)
    return save_with_footer(fig, document, path)
