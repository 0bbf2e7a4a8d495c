#!/usr/bin/env python3
"""Sync saves through the bounded staging ring against the whole-checkpoint arena, rounds interleaved.

One state_dict (a llama3-8b shaped workload of ``--size``, built as the bench builds it) saved sync to
``DIR`` by two Checkpointers in each round, alternating which goes first (A B, then B A): one with
``CKPTBENCH_STAGE_RING`` off (every byte staged into an arena the size of the checkpoint, copy-on-write,
the write following the copy), one through the ring (``checkpoint/ring.py``). Each save is timed from
the call to the commit (``SaveResult.total_s``); its checkpoint is removed untimed. Prints every round's
rate ratio (ring / arena), the medians, and the staging memory each Checkpointer held, as JSON. Goal: the ring's median
rate at least ``GOAL`` x the arena's (not worse beyond noise).

    python tests/perf/ring_compare.py /var/tmp --size 1536MiB --rounds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from ckptbench.units import parse_size

GOAL = 0.95


def measure(directory: str, size: int, rounds: int) -> dict:
    from ckptbench import knobs
    from ckptbench.bench.shootout import CheckpointBenchSpec, PeakRss, plan
    from ckptbench.bench.workloads import build_state_dict
    from ckptbench.checkpoint import Checkpointer

    workload = plan(CheckpointBenchSpec(size_bytes=size))
    state = build_state_dict(workload)
    rss = PeakRss()
    scratch = Path(tempfile.mkdtemp(prefix="ring-compare-", dir=directory))
    runs: dict[str, list[dict]] = {"arena": [], "ring": []}
    ckpts = {"arena": Checkpointer(), "ring": Checkpointer()}
    try:
        for round_ in range(rounds + 1):  # round 0 warms both up (arena and ring allocated, mount tuned)
            order = ["arena", "ring"] if round_ % 2 else ["ring", "arena"]
            for name in order:
                knobs.STAGE_RING = int(name == "ring")
                where = scratch / f"{name}-{round_}"
                with rss.measure() as peak:
                    result = ckpts[name].save(state, where)
                shutil.rmtree(where)
                assert result.staging == ("ring" if name == "ring" else "copy-on-write"), result.staging
                if round_:
                    runs[name].append({"gbps": result.gbps, "total_s": result.total_s, "threads": result.threads,
                                       "peak_extra_rss_bytes": peak["extra_bytes"], "staging": result.staging})
    finally:
        held = {"arena": ckpts["arena"]._arena.nbytes, "ring": ckpts["ring"]._ring.nbytes}
        for c in ckpts.values():
            c.close()
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = [r["gbps"] / a["gbps"] for a, r in zip(runs["arena"], runs["ring"], strict=True)]
    return {
        "size_bytes": workload.total_bytes,
        "rounds": rounds,
        "ring_bytes": knobs.STAGE_RING_SLOTS * knobs.STAGE_RING_SLOT_BYTES,
        "median_gbps": {name: statistics.median(r["gbps"] for r in rs) for name, rs in runs.items()},
        "ratio_per_round": ratios,
        "median_ratio": statistics.median(ratios),
        "goal": GOAL,
        "staging_memory_held_bytes": held,
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--size", default="1536MiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    out = measure(args.directory, parse_size(args.size), args.rounds)
    print(json.dumps(out, indent=2))
    return 0 if out["median_ratio"] >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
