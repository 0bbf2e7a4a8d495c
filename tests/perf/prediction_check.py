#!/usr/bin/env python3
"""Do preflight's predictions hold? For job shapes that fit this machine, run preflight in one process (a
sample, extrapolated to the node), then measure the job's real shape under torchrun (every rank writes its
share at once), and compare: predicted point, predicted range, measured median (min-max).

Goals (the decisions issue): every measured median inside its predicted range, point error <= 20 %, ranges
no wider than 2.5x (high / low). The sides alternate per shape (prediction, then the real shape) on the same
directory, so both see the same machine.

    python tests/perf/prediction_check.py --dir /var/tmp --output results/prediction-check-vm.json

Each shape is ``NAME:PARAMS:RANKS`` (all ranks on one node, FSDP-sharded); the default three are a 1-rank
4 GB checkpoint, 2 ranks sharing 5.6 GB, and 1 rank of 2 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_SHAPES = ("1rank-4GB:285.7M:1", "2ranks-5.6GB:400M:2", "1rank-2GB:142.9M:1")
#: (prediction key, distributed-bench operation, what is compared, preflight's ``scaling.runs_s`` key: the
#: sample's runs behind the prediction)
QUANTITIES = (("sync_checkpoint_s", "save", "duration_s", "save"), ("restore_s", "load", "duration_s", "load"),
              ("async_stall_s", "async", "stall_s", "stall"))


def _env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    # The writer's per-mount tuning off on both sides: ranks under a launch do not tune, and the check is of
    # the extrapolation, with the same writer settings.
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "CKPTBENCH_LOG_PROGRESS": "0",
            "OMP_NUM_THREADS": "1", "CKPTBENCH_TUNE": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=3600)
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def predict(directory: str, params: str, ranks: int, repeat: int, measure_time: str | None) -> dict:
    more = ["--measure-time", measure_time] if measure_time is not None else []
    return _run([sys.executable, "-m", "ckptbench", "preflight", directory, "--params", params, "--ranks", str(ranks),
                 "--gpus-per-node", str(ranks), "--mtbf", "1d", "--max-ckpt-time", "1h", "--repeat", str(repeat),
                 *more, "--json"])


def measure(directory: str, node_bytes: int, ranks: int, repeat: int) -> dict:
    """The real shape: ``ranks`` processes writing ``node_bytes`` together (the distributed bench, one node);
    one rank saves with ckptbench alone, as a job does (not between torch.save's and DCP's runs)."""
    cmd = [sys.executable, "-m", "ckptbench", "bench", directory, "--workload", "checkpoint", "--size",
           str(node_bytes), "--repeat", str(repeat), "--warmup", "1", "--json"]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
               "127.0.0.1", "--master-port", str(_free_port()), *cmd[1:]]
        doc = _run(cmd)
        return {key: [r[field] for r in doc["rounds"][op]] for _, op, field, _ in QUANTITIES for key in [op]}
    doc = _run([*cmd, "--writers", "ckptbench"])
    ours = next(r for r in doc["results"] if r["writer"] == "ckptbench")
    async_ = next(a for a in doc["async"] if a["writer"] == "ckptbench")
    return {"save": ours["save"]["runs_s"], "load": ours["load"]["runs_s"], "async": async_["runs_stall_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--shapes", nargs="*", default=list(DEFAULT_SHAPES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--measure-time", default=None,
                        help="preflight's --measure-time (its default when left out; 0: two sizes of 512 MiB and less)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None,
                        help="a PNG of every row: predicted range and point against the measured runs (with --output: "
                             "this run's; with --replot: those results side by side)")
    parser.add_argument("--replot", type=Path, nargs="+", default=None, metavar="RESULT.json",
                        help="measure nothing: draw --plot from these results of this script")
    args = parser.parse_args()
    if args.replot:
        plot([json.loads(path.read_text()) for path in args.replot], [path.stem for path in args.replot], args.plot
             or args.replot[-1].with_suffix(".png"))
        return
    rows = []
    for shape in args.shapes:
        name, params, ranks_text = shape.split(":")
        ranks = int(ranks_text)
        started = time.time()
        prediction = predict(args.dir, params, ranks, args.repeat, args.measure_time)
        p = prediction["predictions"]
        measured = measure(args.dir, p["checkpoint_per_node_bytes"], ranks, args.repeat)
        scaling = prediction["measurements"]["checkpoint_bench"]["scaling"]
        for key, op, _, sampled in QUANTITIES:
            values = sorted(measured[op])
            median = values[len(values) // 2]
            low, high = p[f"{key}_range"]
            rows.append({
                "shape": name, "quantity": key, "predicted_s": p[key], "predicted_range_s": [low, high],
                "measured_median_s": median, "measured_runs_s": values, "inside": low <= median <= high,
                "point_error": p[key] / median - 1, "range_width": high / low,
                "writers_sampled": prediction["measurements"]["writers"],
                "sample_sizes_bytes": scaling["sizes_bytes"],
                # every sampled run per size, so another range rule can be judged against this real shape
                "sample_runs_s": scaling["runs_s"][sampled], "sample_fitted": scaling["fitted"][sampled],
                "largest_sessions": scaling.get("largest_sessions"),
                # what faulting the node's fresh memory in cost, and whether a hypervisor takes memory back
                "fresh_memory": prediction["measurements"].get("fresh_memory"),
                "hypervisor_reclaims": prediction["measurements"].get("hypervisor_reclaims"),
                "extrapolation_factor": p["extrapolation_factor"], "verdict": prediction["verdict"],
                "seconds": time.time() - started,
            })
            r = rows[-1]
            print(f"{name:14s} {key:18s} predicted {r['predicted_s']:7.3f} s [{low:7.3f}, {high:7.3f}]  measured "
                  f"{median:7.3f} s ({values[0]:.3f}-{values[-1]:.3f})  {'inside' if r['inside'] else 'OUTSIDE'}  "
                  f"error {r['point_error']:+.0%}  width {r['range_width']:.2f}x", flush=True)
        _write(args, rows)  # after each shape: a run stopped early keeps the shapes it finished
    if args.plot and args.output:
        plot([json.loads(args.output.read_text())], [args.output.stem], args.plot)
    held = sum(r["inside"] for r in rows)
    print(f"\n{held}/{len(rows)} measured medians inside their predicted ranges; point errors "
          f"{min(r['point_error'] for r in rows):+.0%} to {max(r['point_error'] for r in rows):+.0%}; widest range "
          f"{max(r['range_width'] for r in rows):.2f}x")


def _write(args: argparse.Namespace, rows: list[dict]) -> None:
    if args.output:
        args.output.write_text(json.dumps({
            "schema": "ckptbench.prediction-check/1", "host": socket.gethostname(), "machine": platform.platform(),
            "cpus": os.cpu_count(), "dir": args.dir, "repeat": args.repeat, "measure_time": args.measure_time,
            "load_average": os.getloadavg(), "rows": rows,
            "goals": {"inside": "every measured median inside its range", "point_error": "<= 20 %",
                      "range_width": "<= 2.5x"},
        }, indent=2) + "\n")


def plot(results: list[dict], labels: list[str], path: Path) -> None:
    """One panel per quantity; per shape and result, the predicted range as a bar, its point as a tick and
    the measured runs as dots, all relative to the measured median (1.0), with the goal's +-20 % shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [key for key, _, _, _ in QUANTITIES]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4.5), sharey=True)
    for ax, key in zip(axes, keys, strict=True):
        ticks = []
        for i, (doc, label) in enumerate(zip(results, labels, strict=True)):
            for j, row in enumerate(r for r in doc["rows"] if r["quantity"] == key):
                x = j * (len(results) + 1) + i
                median = row["measured_median_s"]
                low, high = row["predicted_range_s"]
                ax.vlines(x, low / median, high / median, color=f"C{i}", linewidth=6, alpha=0.4,
                          label=label if j == 0 else None)
                ax.plot(x, row["predicted_s"] / median, "_", color=f"C{i}", markersize=18, markeredgewidth=2)
                ax.plot([x] * len(row["measured_runs_s"]), [v / median for v in row["measured_runs_s"]], ".",
                        color="black", markersize=4)
                if i == 0:
                    ticks.append((x + (len(results) - 1) / 2, row["shape"]))
        ax.axhspan(0.8, 1.2, color="green", alpha=0.08)
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_xticks([x for x, _ in ticks], [name for _, name in ticks], fontsize=8)
        ax.set_title(key)
    axes[0].set_ylabel("÷ measured median\n(bar: predicted range, tick: point, dots: measured runs)", fontsize=8)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"preflight's prediction (one process, sampled) vs the real shape; {results[-1]['host']}, "
                 f"{results[-1]['cpus']} CPUs", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
