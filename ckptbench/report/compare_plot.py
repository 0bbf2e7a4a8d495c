"""PNG of a tier comparison: measured save and load GB/s per tier (median, min–max whiskers) and, for the
job, overhead and waste at the optimal interval (with a failure rate) or checkpoint, persist and restore
times (without one)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from ckptbench.report.plot_footer import save_with_footer
from ckptbench.report.plot_style import whisker
from ckptbench.units import format_duration, format_size

_COLORS = {"save": "#3b6fb6", "load": "#e07b39", "overhead": "#8fb3de", "waste": "#b63b3b",
           "checkpoint": "#3b6fb6", "persist": "#8fb3de", "restore": "#e07b39"}


def plot_compare(document: dict[str, Any], path: Path) -> Path:
    """Draw ``ckptbench compare --json``'s document to ``path`` (PNG); return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers, job = document["tiers"], document["job"]
    width = max(4.0, 1.3 * len(tiers) + 1.5)
    fig, (rates, model) = plt.subplots(1, 2, figsize=(2 * width + 0.5, 4.8), dpi=120)
    labels = [f"{t['label']}\n({t['filesystem'] or t['kind']})" for t in tiers]
    _rates(rates, tiers, labels)
    if job["mtbf_s"] is not None:
        _overhead(model, tiers, labels)
    else:
        _times(model, tiers, labels)
    workload = document["workload"]
    who = f"{job['ranks']} ranks" if job["ranks"] > 1 else "1 rank"
    failure = f"MTBF {format_duration(job['mtbf_s'])}" if job["mtbf_s"] is not None else "no failure rate"
    title = (f"measured: {workload['model']} x{workload['scale']:.3g}, {format_size(workload['total_bytes'])} "
             f"per save (ckptbench writer, durable saves, cold loads); job: "
             f"{format_size(job['checkpoint_bytes'])} per checkpoint, {who}, {job['mode']}, {failure}")
    # wrapped to the figure's width (about 16 characters of 8 pt per inch): one tier makes a narrow figure
    lines = textwrap.wrap(title, width=int(fig.get_figwidth() * 16))
    fig.suptitle("\n".join(lines), fontsize=8)
    return save_with_footer(fig, document, path, top=1.0 - 0.05 * len(lines))


def _bars(ax: Any, values: list[list[float | None]], names: list[str], labels: list[str],
          errors: list[tuple[list[float], list[float]]] | None = None,
          fmt: Any = lambda v: f"{v:.2f}") -> None:
    import numpy as np

    x = np.arange(len(labels))
    width = 0.8 / len(names)
    for i, (name, series) in enumerate(zip(names, values, strict=True)):
        heights = np.array([v if v is not None else 0.0 for v in series])
        yerr = None
        if errors is not None:
            yerr = [np.array(errors[i][0]), np.array(errors[i][1])]
        bars = ax.bar(x + (i - (len(names) - 1) / 2) * width, heights, width, yerr=yerr, capsize=3,
                      color=_COLORS[name.split()[0]], label=name)
        tops = heights + (yerr[1] if yerr is not None else 0.0)  # above the whisker, where there is one
        for bar, value, top in zip(bars, series, tops, strict=True):
            text = "n/a" if value is None else fmt(value)
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, top), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, labels, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=7)


def _rates(ax: Any, tiers: list[dict[str, Any]], labels: list[str]) -> None:
    values, errors = [], []
    for op in ("save", "load"):
        summaries = [t["bench"]["results"][0][op]["summary_gbps"] for t in tiers]
        values.append([s["median"] for s in summaries])
        errors.append(tuple(list(side) for side in zip(*(whisker(s, s["median"]) for s in summaries), strict=True)))
    _bars(ax, values, ["save (durable)", "load (cold)"], labels, errors)
    peak = max(s["max"] for t in tiers for op in ("save", "load") for s in [t["bench"]["results"][0][op]["summary_gbps"]])
    ax.set_ylim(0, peak * 1.25 if peak > 0 else 1)
    ax.set_ylabel("GB/s (1e9 B/s of state_dict), median, min–max")
    ax.set_title("measured on each tier", fontsize=9)


def _overhead(ax: Any, tiers: list[dict[str, Any]], labels: list[str]) -> None:
    overhead = [_percent(t["model"]["overhead_fraction"]) for t in tiers]
    waste = [_percent(t["model"]["waste_fraction"]) for t in tiers]
    _bars(ax, [overhead, waste], ["overhead (checkpoint cost)", "waste (of wall time)"], labels,
          fmt=lambda v: f"{v:.2f} %")
    intervals = [f"{lab}\nevery {format_duration(t['model']['optimal_interval_s'])}"
                 if t["model"]["optimal_interval_s"] is not None else f"{lab}\ncannot keep up"
                 for lab, t in zip(labels, tiers, strict=True)]
    ax.set_xticks(ax.get_xticks(), intervals, fontsize=8)
    top = max([v for v in overhead + waste if v is not None] or [1.0])
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel("% (at the optimal interval)")
    ax.set_title("the job on each tier: at the optimal interval", fontsize=9)


def _times(ax: Any, tiers: list[dict[str, Any]], labels: list[str]) -> None:
    from matplotlib.ticker import FuncFormatter

    names, keys = ["checkpoint (sync)", "restore"], ["checkpoint_s", "restore_s"]
    if all(t["model"]["persist_s"] is not None for t in tiers):
        names.insert(1, "persist (async)")
        keys.insert(1, "persist_s")
    _bars(ax, [[t["model"][k] for t in tiers] for k in keys], names, labels, fmt=format_duration)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_duration(value)))
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 3)
    ax.set_ylabel("time for the job's checkpoint (log scale)")
    ax.set_title("the job on each tier", fontsize=9)


def _percent(value: float | None) -> float | None:
    return None if value is None else 100 * value
