"""The two-level waste-versus-interval PNG of ``ckptbench interval --plot`` (and ``compare --remote``):
the single-level schedule (checkpoints straight to the remote tier) against the two-level one (local
every interval, every k-th drained to the remote tier), each with its optimum marked and its plateau
shaded. matplotlib is imported inside the function (object API, Agg canvas)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ckptbench.model import interval as single
from ckptbench.model import twolevel
from ckptbench.report.plot_style import interval_axis
from ckptbench.report.report_plots import save_figure
from ckptbench.units import format_duration


def plot_two_level_waste(path: Path, cost: twolevel.TwoLevelCost, mtbf_s: float, two: dict[str, Any],
                         document: dict[str, Any] | None = None, *,
                         measured_single: tuple[single.CheckpointCost, float] | None = None) -> Path:
    """Waste (% of wall time) versus interval for both schedules of ``two`` (the ``two_level`` section of
    ``ckptbench interval --json``), written as PNG.

    The two-level curve is drawn at the chosen remote period k (x: the local interval tau); the
    single-level curve is the remote-only schedule (x: its interval). The chosen (tau, k) and the
    remote-only optimum are marked; each plateau (intervals within 0.1 pp of its minimum) is shaded.
    ``document``: where the numbers were measured (adds the usual footer), if anywhere. ``measured_single``:
    the remote tier's own (cost, restart) for the single-level curve, where it was measured (else the
    model's: a checkpoint persisted in the drain's time, restarted in ``remote_restart_s``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    best = two["two_level_schedule"]
    local_level, remote_level = best["levels"]
    tau, every = local_level["interval_s"], remote_level["every"]
    remote_only = two["remote_only_schedule"]
    single_tau = remote_only["levels"][0]["interval_s"]
    single_cost, single_restart_s = measured_single or (cost.remote_only(), cost.remote_restart_s)
    points = [p for p in (tau, single_tau, *best["interval_plateau_s"]) if p]
    lo = min(points) / 8.0
    hi = min(max(points) * 8.0, 20.0 * mtbf_s)
    n = 300
    grid = [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (n - 1)) for i in range(n)]

    fig = Figure(figsize=(8, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    minutes = [t / 60.0 for t in grid]
    remote_waste = [100.0 * w if t >= single_cost.min_interval_s else math.nan
                    for t, w, _ in single.waste_curve(single_cost, mtbf_s, single_restart_s, grid)]
    ax.plot(minutes, remote_waste, color="C1", lw=2, label="single level: straight to the remote tier")
    if every is not None:
        two_waste = [100.0 * w for _, w in twolevel.waste_curve(cost, mtbf_s, every, grid)]
        label = f"two levels: local every tau, remote every {every}"
    else:  # no failure loses the local copy: the remote tier never serves a restart
        two_waste = [100.0 * w if t >= cost.local.min_interval_s else math.nan
                     for t, w, _ in single.waste_curve(cost.local, mtbf_s, cost.local_restart_s, grid)]
        label = "two levels: local every tau (the remote tier never serves a restart)"
    ax.plot(minutes, two_waste, color="C0", lw=2, label=label)

    low, high = best["interval_plateau_s"]
    ax.axvspan(low / 60.0, high / 60.0, color="C0", alpha=0.12,
               label=f"two-level plateau {format_duration(low)}-{format_duration(high)}")
    single_low, single_high = single.optimum_plateau(single_cost, mtbf_s, single_restart_s)
    ax.axvspan(single_low / 60.0, single_high / 60.0, color="C1", alpha=0.12,
               label=f"single-level plateau {format_duration(single_low)}-{format_duration(single_high)}")
    chosen = f"tau {format_duration(tau)}" + (f", k {every}" if every is not None else "")
    ax.plot([tau / 60.0], [100.0 * best["waste_fraction"]], "o", color="C0", ms=7,
            label=f"chosen {chosen}: {100.0 * best['waste_fraction']:.2f}%")
    ax.plot([single_tau / 60.0], [100.0 * remote_only["waste_fraction"]], "s", color="C1", ms=6,
            label=f"remote only {format_duration(single_tau)}: {100.0 * remote_only['waste_fraction']:.2f}%")
    interval_axis(ax, unit_s=60.0)  # this plot's values are minutes
    lowest = min(best["waste_fraction"], remote_only["waste_fraction"]) * 100.0
    highest = max(best["waste_fraction"], remote_only["waste_fraction"]) * 100.0
    ax.set_ylim(0, min(100.0, max(highest * 2.0, lowest + 5.0)))
    ax.set_xlabel("interval: compute time between checkpoints (two levels: between local checkpoints)")
    ax.set_ylabel("waste (% of wall time)")
    winner = {"two-level": "two levels recommended", "remote-only": "single level recommended",
              "local-only": "local only recommended"}.get(two["schedule"], two["schedule"])
    ax.set_title(f"Two-level checkpointing: MTBF {format_duration(mtbf_s)}, local loss {100 * cost.local_loss:.3g}%, "
                 f"drain {format_duration(cost.drain_s)} ({winner})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, document or {}, path)


def plot_measured_two_level(document: dict[str, Any], path: Path) -> Path:
    """Both schedules of a ``compare --local --remote`` document (its ``two_level.model``), as PNG."""
    model = document["two_level"]["model"]
    c = model["cost"]
    cost = twolevel.TwoLevelCost(single.CheckpointCost(c["stall_s"], c["persist_s"], c["interference"]), c["drain_s"],
                                 c["drain_interference"], c["local_restart_s"], c["remote_restart_s"], c["local_loss"])
    s = model["single_cost"]
    measured = (single.CheckpointCost(s["stall_s"], s["persist_s"], s["interference"]), s["restart_s"])
    return plot_two_level_waste(path, cost, model["mtbf_s"], model, document, measured_single=measured)
