#!/usr/bin/env python3
"""Does preflight's verdict hold when the user runs it again? Run the default ``ckptbench preflight`` N times in
a row on a quiet machine, then N times while K steady busy processes share the CPU (as data loaders or another
job do on real hosts), and report every verdict, every check's status and the predictions' ranges.

Goal (the decisions issue): the same verdict every time within each set, and no flip between PASS/WARN and
FAIL across the two sets; where the load moves a measurement across a threshold, the check says BORDERLINE.

    python tests/perf/preflight_stability.py --runs 5 --busy 2 --output results/preflight-stability-vm.json

The busy processes are this script's children (a spinning loop each), stopped by PID when the loaded set ends.
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
from collections import Counter
from pathlib import Path

SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def preflight(args: list[str]) -> dict:
    env = {**os.environ, "CKPTBENCH_LOG_PROGRESS": "0"}
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "preflight", *args, "--json"], capture_output=True,
                          text=True, env=env, timeout=1800)
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"preflight failed ({proc.returncode}): {proc.stderr[-2000:]}")
    doc = json.loads(proc.stdout)
    p = doc["predictions"]
    return {
        "verdict": doc["verdict"], "exit_code": proc.returncode,
        "checks": {c["name"]: c["status"] for c in doc["checks"]},
        "blocking_s": p["blocking_s"], "blocking_s_range": p["blocking_s_range"], "mode": p["mode"],
        "sync_checkpoint_s": p["sync_checkpoint_s"], "sync_checkpoint_s_range": p["sync_checkpoint_s_range"],
        "optimal_interval_s": p["optimal_interval_s"], "recommended_interval_s": p["recommended_interval_s"],
        "write_bps": doc["measurements"]["write_bps"], "writers": doc["measurements"]["writers"],
        "bottleneck": (doc["measurements"].get("bottleneck") or {}).get("limit"),
    }


def run_set(name: str, runs: int, args: list[str]) -> list[dict]:
    out = []
    for i in range(runs):
        started = time.time()
        r = preflight(args) | {"set": name, "run": i + 1}
        r["seconds"] = time.time() - started
        out.append(r)
        print(f"{name} {i + 1}/{runs}: {r['verdict']:10s} blocking {r['blocking_s']:.2f} s "
              f"[{r['blocking_s_range'][0]:.2f}, {r['blocking_s_range'][1]:.2f}] ({r['mode']}), interval "
              f"{r['recommended_interval_s'] / 60:.0f} min, write {r['write_bps'] / 1e9:.2f} GB/s, "
              f"{' '.join(f'{k}={v}' for k, v in r['checks'].items() if v != 'PASS')}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=2, help="busy processes during the loaded set")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("preflight_args", nargs="*", help="arguments for preflight (default: none)")
    args = parser.parse_args()
    rows = run_set("quiet", args.runs, args.preflight_args)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=7200)]) for _ in range(args.busy)]
    try:
        rows += run_set(f"loaded-{args.busy}", args.runs, args.preflight_args)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    summary = {}
    for name in sorted({r["set"] for r in rows}):
        verdicts = Counter(r["verdict"] for r in rows if r["set"] == name)
        summary[name] = dict(verdicts)
    everything = {r["verdict"] for r in rows}
    flip = bool(everything & {"PASS", "WARN"}) and "FAIL" in everything
    print(f"\nverdicts: {summary}; a flip between PASS/WARN and FAIL: {'YES' if flip else 'no'}")
    if args.output:
        args.output.write_text(json.dumps({
            "schema": "ckptbench.preflight-stability/1", "host": socket.gethostname(), "machine": platform.platform(),
            "cpus": os.cpu_count(), "busy_processes": args.busy, "preflight_args": args.preflight_args,
            "summary": summary, "flip_pass_fail": flip, "runs": rows,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
