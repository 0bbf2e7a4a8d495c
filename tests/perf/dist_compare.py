#!/usr/bin/env python3
"""Issue 7's goal: 2 ranks (torchrun, gloo) saving their halves at once vs one process with 2 threads
saving the whole, on the same disk: aggregate durable write GB/s, and the coordination overhead.

Both sides save the same model-shaped checkpoint (``--size`` of llama3-8b's layout; the ranks split it
FSDP-style, half each) with ckptbench's writer, durable (O_DIRECT/fdatasync + manifest commit), into
a fresh directory per save (removed afterwards, untimed). The sides alternate: single, ranks, single,
ranks... ``--alternations`` times, ``--rounds`` saves each (the first save of every run is a warm-up).

* single process: ``Checkpointer(threads=2).save(whole)``, timed call to return.
* 2 ranks: ``Checkpointer(threads=1).save(half, distributed=True)`` between two barriers; the
  duration is rank 0's barrier-to-barrier time; the overhead is that minus the slower rank's own
  work (plan, stage, write its shards): the agreement, the save lock, the two-phase commit, the
  barriers.

    python tests/perf/dist_compare.py --dir /var/tmp --size 1GiB --rounds 5 --alternations 3 \\
        --output results/dist-compare-vm.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def _workload(size: int):
    from ckptbench.bench.workloads import plan_workload
    from ckptbench.model.presets import load_model

    return plan_workload(load_model("llama3-8b"), size_bytes=size)


def single(directory: Path, size: int, rounds: int) -> dict:
    from ckptbench.bench.workloads import build_state_dict
    from ckptbench.checkpoint.api import Checkpointer

    workload = _workload(size)
    state_dict = build_state_dict(workload)
    ckpt = Checkpointer(threads=2)
    times = []
    for i in range(rounds + 1):
        where = directory / f"single-{os.getpid()}-{i}"
        start = time.perf_counter()
        ckpt.save(state_dict, where)
        elapsed = time.perf_counter() - start
        shutil.rmtree(where)
        if i:
            times.append(elapsed)
    return {"bytes": workload.total_bytes, "save_s": times}


def ranks(directory: Path, size: int, rounds: int) -> dict | None:
    from ckptbench.bench.sharding import shard_workload
    from ckptbench.bench.workloads import _SEED, build_state_dict
    from ckptbench.checkpoint.api import Checkpointer
    from ckptbench.checkpoint.distributed import current_world
    from ckptbench.model.sizing import Parallelism

    world = current_world()
    assert world is not None and world.world_size == 2
    mine = shard_workload(_workload(size), Parallelism(dp=2, sharding="fsdp"), world.rank)
    state_dict = build_state_dict(mine, seed=_SEED + world.rank)
    ckpt = Checkpointer(threads=1)
    b2b, writes, total = [], [], 0
    for i in range(rounds + 1):
        where = directory / f"ranks-{i}"
        world.barrier()
        start = time.perf_counter()
        result = ckpt.save(state_dict, where, distributed=True, overwrite=False)
        write_s = result.stage_s + result.write_s  # this rank's own work
        world.barrier()
        elapsed = time.perf_counter() - start
        slowest_write = max(world.all_gather(write_s))
        total = result.world_bytes
        world.barrier()
        if world.is_first:
            shutil.rmtree(where)
        if i:
            b2b.append(elapsed)
            writes.append(slowest_write)
    return {"bytes": total, "save_s": b2b, "slowest_write_s": writes} if world.is_first else None


def _run_ranks(directory: Path, size: int, rounds: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = directory / "ranks.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "FATAL"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(port), str(HERE), "--worker", "ranks", "--dir", str(directory),
                    "--size", str(size), "--rounds", str(rounds), "--worker-output", str(out)],
                   check=True, env=env)
    result = json.loads(out.read_text())
    out.unlink()
    return result


def _run_single(directory: Path, size: int, rounds: int) -> dict:
    out = directory / "single.json"
    subprocess.run([sys.executable, str(HERE), "--worker", "single", "--dir", str(directory), "--size", str(size),
                    "--rounds", str(rounds), "--worker-output", str(out)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    result = json.loads(out.read_text())
    out.unlink()
    return result


def main() -> None:
    from ckptbench.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--alternations", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--worker", choices=["single", "ranks"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = parse_size(str(args.size))
    if args.worker == "single":
        args.worker_output.write_text(json.dumps(single(args.dir, size, args.rounds)))
        return
    if args.worker == "ranks":
        result = ranks(args.dir, size, args.rounds)
        if result is not None:
            args.worker_output.write_text(json.dumps(result))
        sys.stdout.flush()
        os._exit(0)  # skip interpreter teardown with a live gloo group
    scratch = args.dir / f"ckptbench-dist-compare-{os.getpid()}"
    scratch.mkdir()
    runs: dict[str, list[dict]] = {"single": [], "ranks": []}
    try:
        for i in range(args.alternations):
            runs["single"].append(_run_single(scratch, size, args.rounds))
            runs["ranks"].append(_run_ranks(scratch, size, args.rounds))
            print(f"alternation {i + 1}/{args.alternations} done", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    nbytes = runs["single"][0]["bytes"]
    single_gbps = [nbytes / s / 1e9 for r in runs["single"] for s in r["save_s"]]
    rank_gbps = [r["bytes"] / s / 1e9 for r in runs["ranks"] for s in r["save_s"]]
    overhead_ms = [(s - w) * 1e3 for r in runs["ranks"] for s, w in zip(r["save_s"], r["slowest_write_s"], strict=True)]
    summary = {
        "single_process_2_threads_gbps_median": statistics.median(single_gbps),
        "two_ranks_1_thread_each_gbps_median": statistics.median(rank_gbps),
        "ratio_ranks_over_single": statistics.median(rank_gbps) / statistics.median(single_gbps),
        "goal_ratio": 0.9,
        "overhead_ms_median": statistics.median(overhead_ms),
        "overhead_ms_max": max(overhead_ms),
        "goal_overhead_ms": 50,
    }
    document = {"schema": "ckptbench.perf.dist-compare/1", "host": platform.node(), "cpus": os.cpu_count(),
                "dir": str(args.dir), "bytes": nbytes, "rounds": args.rounds, "alternations": args.alternations,
                "argv": sys.argv, "runs": runs, "single_gbps": single_gbps, "ranks_gbps": rank_gbps,
                "overhead_ms": overhead_ms, "summary": summary}
    print(json.dumps(summary, indent=2))
    if args.output is not None:
        args.output.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
