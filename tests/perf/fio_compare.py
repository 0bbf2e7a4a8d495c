#!/usr/bin/env python3
"""ckptbench bench vs fio, same shape, alternating, and the ratio of their medians.

Shape (the foundation issue's goal): N threads/jobs and N files of SIZE/N, BLOCK-sized pwrites,
O_DIRECT, fsync at the end of each file, new files every round (fio with --fallocate=none so neither
side gets preallocated blocks); then O_DIRECT reads. Writes compare `ckptbench bench --no-read` with
fio. Reads compare the engine's cold read (the call `ckptbench bench` makes) with fio over the *same*
files: concurrent O_DIRECT writers interleave extents differently, and a read comparison over two
different layouts would measure the layout, not the reader. Rounds alternate which tool goes first.
Goal: ckptbench >= 0.90x fio for write and for read.

    python tests/perf/fio_compare.py --dir /var/tmp --size 2GiB --rounds 3 [--save results/]
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
import tempfile
import time
from pathlib import Path

from ckptbench.units import parse_size


def _fio(directory: Path, size: int, jobs: int, block: int, rw: str) -> float:
    """One fio pass (write with end_fsync, or read) over the jobs' files; GB/s (1e9 B/s)."""
    cmd = [
        "fio", "--output-format=json", "--group_reporting", f"--directory={directory}", "--ioengine=psync",
        "--direct=1", f"--bs={block}", f"--numjobs={jobs}", f"--size={size // jobs}", "--fallocate=none",
        "--name=ckptcmp", f"--rw={rw}", *(["--end_fsync=1"] if rw == "write" else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    job = json.loads(proc.stdout)["jobs"][0][rw]
    return job["io_bytes"] / (job["runtime"] / 1e3) / 1e9  # runtime: ms, max over jobs


def _ckptbench_write(directory: Path, size: int, jobs: int, block: int, schedule: str) -> float:
    """One `ckptbench bench --no-read` run (no warm-up, one repeat) of the same shape; write GB/s."""
    cmd = [
        sys.executable, "-m", "ckptbench", "bench", str(directory), "--size", str(size), "--files", str(jobs),
        "--threads", str(jobs), "--block-size", str(block), "--repeat", "1", "--warmup", "0", "--no-read",
        "--schedule", schedule, "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    record = json.loads(proc.stdout)["results"][0]
    assert record["config"]["direct"] and record["config"]["fsync"], record["config"]
    return record["write"]["gbps"]


def _ckptbench_read(files: list[Path], jobs: int, block: int, schedule: str) -> float:
    """The engine's cold read, exactly as `ckptbench bench` issues it, over the given files; GB/s."""
    from ckptbench import native

    size = max(f.stat().st_size for f in files)
    sink = native.AlignedBuffer(size)
    result = native.read([(memoryview(sink)[: f.stat().st_size], str(f), 0) for f in files],
                         threads=jobs, block_size=block, direct=True, drop_cache=True, schedule=schedule)
    assert result.direct_used
    return result.bytes / result.seconds / 1e9


def compare(directory: Path, size: int, jobs: int, block: int, rounds: int) -> dict:
    """Writes: each tool writes fresh files of its own. Reads: both tools read the same files (fio's),
    so the on-disk layout is identical; the order alternates every round."""
    # "ckptbench": per-file schedule, each thread streams its own file as each fio job does (the
    # like-for-like ratio); "ckptbench-shared": the default schedule, threads share one queue.
    tools = ("fio", "ckptbench", "ckptbench-shared")
    samples: dict[str, dict[str, list[float]]] = {t: {"write": [], "read": []} for t in tools}
    schedule = {"ckptbench": "per-file", "ckptbench-shared": "shared"}
    work = directory / f"fio-compare-{os.getpid()}"
    for r in range(rounds):
        work.mkdir()
        try:
            writers = [("fio", lambda: _fio(work, size, jobs, block, "write"))] + [
                (t, lambda t=t: _ckptbench_write(directory, size, jobs, block, schedule[t])) for t in tools[1:]]
            readers = [("fio", lambda: _fio(work, size, jobs, block, "read"))] + [
                (t, lambda t=t: _ckptbench_read(sorted(work.iterdir()), jobs, block, schedule[t])) for t in tools[1:]]
            if r % 2:
                writers.reverse()
                readers.reverse()
            for op, steps in (("write", writers), ("read", readers)):
                for name, step in steps:
                    samples[name][op].append(step())
            line = "  ".join(f"{n} w {samples[n]['write'][-1]:.2f} r {samples[n]['read'][-1]:.2f}" for n in tools)
            print(f"round {r + 1}/{rounds}: {line} GB/s", file=sys.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        time.sleep(1)
    ratios = {op: statistics.median(samples["ckptbench"][op]) / statistics.median(samples["fio"][op])
              for op in ("write", "read")}
    shared_ratios = {op: statistics.median(samples["ckptbench-shared"][op]) / statistics.median(samples["fio"][op])
                     for op in ("write", "read")}
    return {
        "schema": "ckptbench.perf.fio_compare/1",
        "shape": {"size_bytes": size, "jobs": jobs, "block_size": block, "direct": True, "end_fsync": True,
                  "rounds": rounds, "directory": str(directory),
                  "reads": "both tools read the same fio-written files",
                  "ckptbench_schedule": "per-file (ckptbench-shared: shared)"},
        "units": {"gbps": "1e9 bytes per second"},
        "samples_gbps": samples,
        "median_gbps": {n: {op: statistics.median(v) for op, v in d.items()} for n, d in samples.items()},
        "ratio_ckptbench_over_fio": ratios,
        "ratio_ckptbench_shared_over_fio": shared_ratios,
        "goal": 0.90,
        "fio_version": subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip(),
        "machine": {"host": socket.gethostname(), "kernel": platform.release(), "cpus": os.cpu_count()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="directory on the disk to measure")
    parser.add_argument("--size", default="2GiB", help="bytes per pass over all jobs (default 2GiB)")
    parser.add_argument("--jobs", type=int, default=2, help="fio numjobs = ckptbench threads = files")
    parser.add_argument("--block-size", default="4MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--save", type=Path, help="directory to write the JSON into (e.g. results/)")
    args = parser.parse_args()
    if shutil.which("fio") is None:
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    doc = compare(args.dir, parse_size(args.size), args.jobs, parse_size(args.block_size), args.rounds)
    med = doc["median_gbps"]
    for op in ("write", "read"):
        ratio = doc["ratio_ckptbench_over_fio"][op]
        print(f"{op:5s}: ckptbench {med['ckptbench'][op]:.2f} GB/s  fio {med['fio'][op]:.2f} GB/s  "
              f"ratio {ratio:.3f}  {'OK' if ratio >= doc['goal'] else 'BELOW GOAL'} (goal >= {doc['goal']});  "
              f"shared schedule {med['ckptbench-shared'][op]:.2f} GB/s, "
              f"ratio {doc['ratio_ckptbench_shared_over_fio'][op]:.3f}")
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        path = args.save / f"fio-compare-{socket.gethostname()}-{time.strftime('%Y%m%dT%H%M%S')}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
