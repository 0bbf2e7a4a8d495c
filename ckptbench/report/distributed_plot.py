"""PNG of a distributed checkpoint benchmark: aggregate GB/s per operation (median, min–max whiskers)
and, for the median save round, every rank's timeline from the barrier: its own work, the
coordination (agreement, lock, two-phase commit), and the wait for slower ranks in the barrier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptbench.report.plot_footer import save_with_footer
from ckptbench.report.plot_style import whisker
from ckptbench.units import format_size

_COLORS = {"save": "#3b6fb6", "load": "#e07b39", "async": "#5a9e5a",
           "io": "#3b6fb6", "commit": "#8fb3de", "barrier": "#d9d9d9", "stall": "#b63b3b"}
_OP_LABELS = {"save": "durable save", "load": "cold load", "async": "async save\n(stall + persist)"}
#: Ranks drawn in the timeline; beyond this the slowest and fastest are kept.
MAX_TIMELINE_RANKS = 32


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose aggregate GB/s is the median (the lower middle one for an even count)."""
    ordered = sorted(rounds, key=lambda r: r["gbps"])
    return ordered[(len(ordered) - 1) // 2]


def timeline_ranks(ranks: list[dict[str, Any]], limit: int = MAX_TIMELINE_RANKS) -> list[dict[str, Any]]:
    """At most ``limit`` ranks, slowest first: all of them when they fit, else the slowest and fastest halves."""
    ordered = sorted(ranks, key=lambda s: -s["end_s"])
    if len(ordered) <= limit:
        return ordered
    return ordered[:limit // 2] + ordered[-(limit - limit // 2):]


def plot_distributed(document: dict[str, Any], path: Path) -> Path:
    """Draw ``ckptbench bench --workload checkpoint`` under a launch (``--json``'s document) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = document["summary"]
    ops = [op for op in ("save", "load", "async") if op in summary]
    fig, (rates, timeline) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=120, gridspec_kw={"width_ratios": [1, 1.6]})
    medians = [summary[op]["gbps"]["median"] for op in ops]
    low, high = (list(side) for side in zip(*(whisker(summary[op]["gbps"], m)
                                               for op, m in zip(ops, medians, strict=True)), strict=True))
    bars = rates.bar(range(len(ops)), medians, yerr=[low, high], capsize=4, color=[_COLORS[op] for op in ops])
    for bar, value in zip(bars, medians, strict=True):  # inside the bar: the whiskers stay readable
        rates.text(bar.get_x() + bar.get_width() / 2, bar.get_height() / 2, f"{value:.2f}", ha="center",
                   va="center", fontsize=9, color="white", fontweight="bold")
    rates.set_xticks(range(len(ops)), [_OP_LABELS[op] for op in ops], fontsize=8)
    rates.set_ylabel("aggregate GB/s (all ranks' bytes / slowest rank)")
    rates.set_title("aggregate throughput (median, min–max)", fontsize=9)

    round_ = median_round(document["rounds"]["save"])
    shown = timeline_ranks(round_["ranks"])
    for y, span in enumerate(shown):
        io_s, end_s = span["io_s"], span["end_s"]
        timeline.barh(y, io_s, color=_COLORS["io"], label="own work (plan, stage, write)" if y == 0 else None)
        timeline.barh(y, end_s - io_s, left=io_s, color=_COLORS["commit"],
                      label="coordination (agree, lock, commit)" if y == 0 else None)
        timeline.barh(y, span["barrier_s"], left=end_s, color=_COLORS["barrier"],
                      label="waiting for slower ranks" if y == 0 else None)
    timeline.set_yticks(range(len(shown)), [f"rank {s['rank']} ({format_size(s['bytes'])})" for s in shown],
                        fontsize=7 if len(shown) > 12 else 8)
    timeline.invert_yaxis()
    timeline.set_xlabel("seconds from the barrier")
    left_out = len(round_["ranks"]) - len(shown)
    timeline.set_title(f"save round {round_['round']} (the median one), per rank, slowest first"
                       + (f"; {left_out} middle ranks not drawn" if left_out else ""), fontsize=9)
    timeline.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    workload, spec = document["workload"], document["spec"]
    par = spec["parallelism"]
    fig.suptitle(f"{document['launch']['world_size']} ranks on {len(set(document['hosts']))} host(s) -> "
                 f"{document['target']}: {workload['model']} x{workload['scale']:.3g}, "
                 f"{format_size(workload['total_bytes'])} in all (dp {par['dp']} x tp {par['tp']} x pp {par['pp']}, "
                 f"{par['sharding']})", fontsize=9)
    return save_with_footer(fig, document, path, top=0.93)
