#!/usr/bin/env python3
"""The drain's goals, on a local directory and an S3 server: rate and interference, rounds interleaved.

With ckptbench's writer and drain (``ckptbench.bench.drain_measure.run_drain_bench``, the measurement of
``compare --local --remote``), in rounds of four runs (direct save, drain, local save alone, local save
during a drain), each round starting one run later than the one before:

- the drain of a committed local checkpoint to s3:// against ``ckptbench.save`` of the same
  state_dict straight to s3:// (wall clock from the call to the commit). Goal: drain >= 0.9x;
- the stall of an async local save while a drain runs against one with no drain. Goal: <= 1.2x.

Prints every round's ratio and load average, the medians, and ``uptime`` before and after, as JSON (exit 1
when a goal's median misses).

With the S3 server on the same host (as ``tests/servers/ceph.sh`` runs it), the server's daemons finish the
drain's requests on the CPUs the local save stages on. ``--client-cpus`` confines this benchmark (and the
processes it starts, the drain's included) to some CPUs; ``--server-pid`` with ``--server-cpus`` confines the
server's processes (every thread) to others, as a stand-in for a server on another host. Run it with the
server on the client's CPUs and then on its own, same ``--client-cpus``, to see which part of the stall is
the server's. The layout is recorded as ``layout`` (the server's CPUs are restored at the end).

    eval "$(tests/servers/ceph.sh start /tmp/ceph)"   # or any S3 endpoint and credentials
    export CKPTBENCH_TEST_S3_ENDPOINT AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    python tests/perf/drain_compare.py --local /var/tmp --size 512MiB --rounds 7
    python tests/perf/drain_compare.py --local /var/tmp --client-cpus 0 \
        --server-pid $(cat /tmp/ceph/run/*.pid) --server-cpus 1          # the server on CPUs of its own
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

from ckptbench.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # s3_buckets (not a package)
from s3_buckets import remove_bucket  # noqa: E402

DRAIN_GOAL = 0.9
STALL_GOAL = 1.2


def measure(local: str, endpoint: str, size: int, rounds: int, warmup: int, stall_saves: int) -> dict:
    import boto3

    from ckptbench.bench.drain_measure import run_drain_bench
    from ckptbench.bench.shootout import CheckpointBenchSpec, plan
    from ckptbench.storage.local_target import LocalDirectory
    from ckptbench.storage.object_target import ObjectTarget

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"ckptbench-drain-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    try:
        workload = plan(CheckpointBenchSpec(model="llama3-8b", size_bytes=size, writers=("ckptbench",)))
        bench = run_drain_bench(workload, LocalDirectory.from_string(local),
                                ObjectTarget(f"s3://{bucket}/drain", {"endpoint_url": endpoint}), repeat=rounds,
                                warmup=warmup, stall_saves=stall_saves)
    finally:
        remove_bucket(client, bucket)
    doc = bench.to_dict()
    doc["goals"] = {
        "drain_vs_direct": {"goal": f">= {DRAIN_GOAL}", "median": statistics.median(bench.drain_vs_direct_by_round),
                            "met": statistics.median(bench.drain_vs_direct_by_round) >= DRAIN_GOAL},
        "stall_ratio": {"goal": f"<= {STALL_GOAL}", "median": statistics.median(bench.stall_ratio_by_round),
                        "met": statistics.median(bench.stall_ratio_by_round) <= STALL_GOAL},
    }
    return doc


def cpu_list(text: str) -> set[int]:
    """``"0,2-3"`` -> {0, 2, 3}."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def confine(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` onto ``cpus`` (threads it starts later inherit them)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", default="/var/tmp", help="the local tier: a directory")
    parser.add_argument("--endpoint", default=os.environ.get("CKPTBENCH_TEST_S3_ENDPOINT"))
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and discarded")
    parser.add_argument("--stall-saves", type=int, default=3,
                        help="local saves alone, and during a drain, per round (a round's stall: their median)")
    parser.add_argument("--client-cpus", type=cpu_list, metavar="LIST",
                        help="CPUs for this benchmark and its processes, e.g. 0 or 0-3 (default: all)")
    parser.add_argument("--server-pid", type=int, nargs="+", default=[], metavar="PID",
                        help="the S3 server's processes, to confine to --server-cpus")
    parser.add_argument("--server-cpus", type=cpu_list, metavar="LIST",
                        help="CPUs for --server-pid's processes during the run (default: all)")
    args = parser.parse_args()
    if not args.endpoint:
        parser.error("give --endpoint or set CKPTBENCH_TEST_S3_ENDPOINT")
    if args.server_cpus is not None and not args.server_pid:
        parser.error("--server-cpus needs --server-pid")
    everything = os.sched_getaffinity(0)
    layout = {"client_cpus": sorted(args.client_cpus or everything),
              "server_cpus": sorted(args.server_cpus or everything) if args.server_pid else None,
              "server_pids": args.server_pid}
    if args.client_cpus is not None:
        os.sched_setaffinity(0, args.client_cpus)  # before any thread or process is started
    try:
        for pid in args.server_pid:
            confine(pid, args.server_cpus or everything)
        before = uptime()
        doc = measure(args.local, args.endpoint, parse_size(args.size), args.rounds, args.warmup,
                      args.stall_saves)
    finally:
        for pid in args.server_pid:
            confine(pid, everything)
    doc["layout"] = layout
    doc["uptime_before"], doc["uptime_after"] = before, uptime()
    print(json.dumps(doc, indent=2))
    return 0 if all(goal["met"] for goal in doc["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
