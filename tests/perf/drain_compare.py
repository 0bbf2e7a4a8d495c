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

    eval "$(tests/servers/ceph.sh start /tmp/ceph)"   # or any S3 endpoint and credentials
    export CKPTBENCH_TEST_S3_ENDPOINT AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    python tests/perf/drain_compare.py --local /var/tmp --size 512MiB --rounds 7
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    if not args.endpoint:
        parser.error("give --endpoint or set CKPTBENCH_TEST_S3_ENDPOINT")
    before = uptime()
    doc = measure(args.local, args.endpoint, parse_size(args.size), args.rounds, args.warmup,
                  args.stall_saves)
    doc["uptime_before"], doc["uptime_after"] = before, uptime()
    print(json.dumps(doc, indent=2))
    return 0 if all(goal["met"] for goal in doc["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
