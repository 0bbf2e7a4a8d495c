"""PNGs only the report draws: sweep heat maps, a waste-versus-interval curve from a document's points,
and the tier comparison across result files. matplotlib is imported inside each function (object API,
Agg canvas), so importing this module is free and no global backend is changed."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench import safeio
from ckptbench.report.plot_footer import save_with_footer
from ckptbench.report.plot_style import interval_axis
from ckptbench.units import format_duration, format_size


@dataclass(frozen=True)
class HeatPanel:
    """One heat map: ``values[row][col]`` in GB/s (None where the sweep has no such cell)."""

    title: str
    row_axis: str
    col_axis: str
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    values: tuple[tuple[float | None, ...], ...]
    best: tuple[int, int] | None = None  # (row, col) outlined


def fs_heat_panels(document: dict[str, Any]) -> list[HeatPanel]:
    """Threads x block size of a ``ckptbench.bench.fs/1`` sweep: write (and read) GB/s, one panel per schedule."""
    results = document["results"]
    threads = sorted({r["config"]["threads"] for r in results})
    blocks = sorted({r["config"]["block_size"] for r in results})
    schedules = list(dict.fromkeys(r["config"]["schedule"] for r in results))
    best = results[document["best"]]["config"]
    panels = []
    for op in ("write", "read"):
        if results[0][op] is None:
            continue
        for schedule in schedules:
            cells = {(r["config"]["threads"], r["config"]["block_size"]): r[op]["gbps"]
                     for r in results if r["config"]["schedule"] == schedule}
            mark = None
            if op == "write" and best["schedule"] == schedule:
                mark = (threads.index(best["threads"]), blocks.index(best["block_size"]))
            panels.append(HeatPanel(
                title=f"{op} GB/s" + (f", {schedule}" if len(schedules) > 1 else ""),
                row_axis="threads", col_axis="block size",
                row_labels=tuple(str(t) for t in threads), col_labels=tuple(format_size(b) for b in blocks),
                values=tuple(tuple(cells.get((t, b)) for b in blocks) for t in threads), best=mark))
    return panels


def object_heat_panels(document: dict[str, Any]) -> list[HeatPanel]:
    """Requests in flight x object size of a ``ckptbench.bench.objects/1`` sweep, best part size per cell."""
    results = document["results"]
    conc = sorted({r["config"]["concurrency"] for r in results})
    sizes = sorted({r["config"]["object_size_bytes"] for r in results})
    several_parts = len({r["config"]["part_size_bytes"] for r in results}) > 1
    best = results[document["best"]]["config"]
    panels = []
    for op in ("write", "read"):
        if results[0][op] is None:
            continue
        cells: dict[tuple[int, int], float] = {}
        for r in results:
            key = (r["config"]["concurrency"], r["config"]["object_size_bytes"])
            cells[key] = max(cells.get(key, 0.0), r[op]["gbps"])
        mark = (conc.index(best["concurrency"]), sizes.index(best["object_size_bytes"])) if op == "write" else None
        panels.append(HeatPanel(
            title=f"{op} GB/s" + (" (best part size)" if several_parts else ""),
            row_axis="requests in flight", col_axis="object size",
            row_labels=tuple(str(c) for c in conc), col_labels=tuple(format_size(s) for s in sizes),
            values=tuple(tuple(cells.get((c, s)) for s in sizes) for c in conc), best=mark))
    return panels


def heat_cells(panels: Sequence[HeatPanel]) -> int:
    return max((len(p.row_labels) * len(p.col_labels) for p in panels), default=0)


def plot_heatmaps(document: dict[str, Any], panels: Sequence[HeatPanel], title: str, path: Path) -> Path:
    """The panels side by side on one colour scale (so write and read compare), each cell labelled."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    found = [v for p in panels for row in p.values for v in row if v is not None]
    low, high = min(found), max(found)
    if high - low < 1e-9:
        low, high = low * 0.9, high * 1.1 + 1e-9
    cols = max(len(p.col_labels) for p in panels)
    rows = max(len(p.row_labels) for p in panels)
    fig = Figure(figsize=(max(3.6, 0.95 * cols + 1.4) * len(panels) + 1.2, max(3.2, 0.55 * rows + 2.2)), dpi=120,
                 layout="constrained")
    fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))  # room for the footer
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    image = None
    for ax, panel in zip(axes, panels, strict=True):
        grid = [[math.nan if v is None else v for v in row] for row in panel.values]
        image = ax.imshow(grid, cmap="viridis", vmin=low, vmax=high, aspect="auto", origin="lower")
        for i, row in enumerate(panel.values):
            for j, value in enumerate(row):
                if value is None:
                    continue
                light = (value - low) / (high - low) > 0.6
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=9,
                        color="black" if light else "white",
                        fontweight="bold" if panel.best == (i, j) else "normal")
        if panel.best is not None:
            i, j = panel.best
            ax.add_patch(_outline(j, i))
        ax.set_xticks(range(len(panel.col_labels)), panel.col_labels, fontsize=8)
        ax.set_yticks(range(len(panel.row_labels)), panel.row_labels, fontsize=8)
        ax.set_xlabel(panel.col_axis)
        ax.set_ylabel(panel.row_axis)
        ax.set_title(panel.title, fontsize=9)
    fig.colorbar(image, ax=list(axes), label="GB/s (1e9 B/s, median)", shrink=0.9)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, document, path, tight=False)


def _outline(x: float, y: float) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="#d62728", linewidth=2.5)


def plot_waste_points(document: dict[str, Any], curve: Sequence[dict[str, Any]], marks: dict[str, float],
                      path: Path) -> Path:
    """Waste (% of wall time) against the checkpoint interval from ``curve`` ({interval_s, waste_fraction}
    points, as a document's ``model.curve`` holds them) on a log axis; ``marks`` are vertical lines
    (label -> interval in seconds), a dot labels the optimum (:func:`waste_dot`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = sorted((float(p["interval_s"]), float(p["waste_fraction"])) for p in curve)
    seconds = [t for t, _ in points]
    waste = [100.0 * w for _, w in points]
    fig = Figure(figsize=(8, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(seconds, waste, color="C0", lw=2, label="waste")
    lowest = min(range(len(points)), key=lambda i: waste[i])
    dot_s, dot_waste = waste_dot(seconds, waste, marks)
    ax.plot([dot_s], [dot_waste], "o", color="C0")
    ax.annotate(f"{dot_waste:.2f} % at {format_duration(dot_s)}", (dot_s, dot_waste),
                xytext=(6, 8), textcoords="offset points", ha="left", fontsize=8)
    for k, (label, interval_s) in enumerate(marks.items()):
        ax.axvline(interval_s, color=f"C{k + 1}", lw=1.2, ls=("-", "--", ":", "-.")[k % 4],
                   label=f"{label} {format_duration(interval_s)}")
    interval_axis(ax)
    best = waste[lowest]
    ax.set_ylim(0, min(100.0, max(max(best * 3.0, best + 5.0), 1.0)))
    ax.set_ylabel("waste (% of wall time)")
    ax.set_title(f"{document.get('target', '')}: waste versus checkpoint interval", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, document, path)


def waste_dot(seconds: Sequence[float], waste: Sequence[float], marks: dict[str, float]) -> tuple[float, float]:
    """Where the waste plot puts its labelled dot: at the optimum the legend names (``optimal interval``, or
    another mark starting ``optim``), on the curve; at the curve's lowest sample only without one in range."""
    optimum = marks.get("optimal interval", next((t for label, t in marks.items() if label.startswith("optim")), None))
    if optimum is None or not seconds[0] <= optimum <= seconds[-1]:
        optimum = seconds[min(range(len(waste)), key=lambda i: waste[i])]
    return optimum, _on_curve(seconds, waste, optimum)


def _on_curve(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """``ys`` at ``x``, linear in log(x) between the two samples around it (the nearest end outside them)."""
    import bisect

    i = bisect.bisect_left(xs, x)
    if i == 0 or i == len(xs):
        return ys[min(i, len(xs) - 1)]
    x0, x1 = math.log(xs[i - 1]), math.log(xs[i])
    share = 0.0 if x1 == x0 else (math.log(x) - x0) / (x1 - x0)
    return ys[i - 1] + share * (ys[i] - ys[i - 1])


def plot_tiers(rows: Sequence[tuple[str, float | None, float | None]], footer: str, path: Path) -> Path:
    """Horizontal bars of write (or save) and read (or load) GB/s, one group per row (label, write, read)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, max(2.4, 0.75 * len(rows) + 1.4)), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    height = 0.38
    peak = max([v for _, w, r in rows for v in (w, r) if v is not None], default=1.0)
    for k, (op, color) in enumerate((("save / write", "#3b6fb6"), ("load / read", "#e07b39"))):
        labelled = False
        for i, row in enumerate(rows):
            value = row[1 + k]
            if value is None:
                continue
            y = i + (k - 0.5) * height
            ax.barh(y, value, height, color=color, label=None if labelled else op)
            labelled = True
            ax.annotate(f"{value:.2f}", (value, y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=8)
    # long places (paths, URLs) wrap rather than push the bars out of the figure
    ax.set_yticks(range(len(rows)), ["\n".join(textwrap.wrap(label, 34)) or label for label, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, peak * 1.18)
    ax.set_xlabel("GB/s (1e9 B/s, median of the runs)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    fig.text(0.99, 0.01, footer, ha="right", fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    safeio.write_output(path, lambda out: fig.savefig(out, format="png"))
    return path


def save_figure(fig: Any, document: dict[str, Any], path: Path, *, tight: bool = True) -> Path:
    """The common footer (where it was measured) where the document has an environment; else a bare PNG."""
    if isinstance(document.get("environment"), dict) and "created" in document:
        if tight:
            return save_with_footer(fig, document, path)
        env = document["environment"]
        fig.text(0.99, 0.01, f"{env.get('host')} · {env.get('cpu_count')} CPUs · kernel {env.get('kernel')} · "
                 f"ckptbench {env.get('tool_version')} · {document['created']}", ha="right", fontsize=6, color="gray")
    elif tight:
        fig.tight_layout()
    safeio.write_output(path, lambda out: fig.savefig(out, format="png"))
    return path
