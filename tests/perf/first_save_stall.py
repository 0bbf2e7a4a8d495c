#!/usr/bin/env python3
"""The first async save of a process: how long the caller waits (the stall) and how long until it is
durable, next to the second save of the same state_dict. Each writer runs in a fresh process per round, as
a training job's first checkpoint does, the writers alternating round by round:

- ``ckptbench``: ``Checkpointer.save(async_=True)``, the staging arena left untouched when allocated;
- ``ckptbench-prefault``: the same with ``CKPTBENCH_ARENA_PREFAULT=1`` (every arena page touched on the
  caller's thread when the arena is allocated, inside the first save's stall);
- ``dcp``: ``torch.distributed.checkpoint.async_save`` (no process group), its ``FileSystemWriter``.

    python tests/perf/first_save_stall.py --dir /var/tmp/x --size 4GB --rounds 3 --output results/first-save-stall-vm.json

Reports every round's stalls and the medians, and the ratio of each writer's first-save stall to ckptbench's.
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

WRITERS = ("ckptbench", "ckptbench-prefault", "dcp")

_CHILD = r"""
import json, os, sys, time
import torch
writer, directory, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
tensors = 16
state = {f"layer{i}.weight": torch.full((nbytes // 4 // tensors,), float(i)) for i in range(tensors)}
out = []
if writer.startswith("ckptbench"):
    from ckptbench import Checkpointer
    ckpt = Checkpointer()
    for n in range(2):
        t = time.perf_counter()
        handle = ckpt.save(state, os.path.join(directory, f"c{n}"), async_=True)
        stall = time.perf_counter() - t
        handle.result()
        out.append((stall, time.perf_counter() - t))
    ckpt.close()
else:
    import torch.distributed.checkpoint as dcp
    for n in range(2):
        t = time.perf_counter()
        future = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(os.path.join(directory, f"c{n}")),
                                no_dist=True)
        stall = time.perf_counter() - t
        future.result()
        out.append((stall, time.perf_counter() - t))
print(json.dumps(out))
"""


def run_one(writer: str, directory: Path, nbytes: int) -> list[tuple[float, float]]:
    env = {**os.environ, "CKPTBENCH_LOG_PROGRESS": "0", "CKPTBENCH_TUNE": "0",
           "CKPTBENCH_ARENA_PREFAULT": "1" if writer == "ckptbench-prefault" else "0"}
    place = Path(tempfile.mkdtemp(prefix=f"first-{writer}-", dir=directory))
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, writer, str(place), str(nbytes)], capture_output=True,
                              text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{writer} failed:\n{proc.stderr[-3000:]}")
        return [tuple(x) for x in json.loads(proc.stdout.splitlines()[-1])]
    finally:
        shutil.rmtree(place, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--size", default="4GB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", nargs="+", default=list(WRITERS), choices=WRITERS)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    nbytes = parse_size(args.size)
    runs: dict[str, list[dict]] = {w: [] for w in args.writers}
    for round_ in range(args.rounds):
        order = args.writers[round_ % len(args.writers):] + args.writers[:round_ % len(args.writers)]
        for writer in order:
            (first_stall, first_total), (second_stall, second_total) = run_one(writer, args.dir, nbytes)
            runs[writer].append({"round": round_, "first_stall_s": first_stall, "first_total_s": first_total,
                                 "second_stall_s": second_stall, "second_total_s": second_total})
            print(f"round {round_ + 1}/{args.rounds} {writer:19s} first save: stall {first_stall:7.3f} s, durable "
                  f"after {first_total:6.2f} s; second: stall {second_stall:7.3f} s, durable after {second_total:6.2f} s",
                  flush=True)
    medians = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "round"} for w, rs in runs.items()}
    print()
    for writer, m in medians.items():
        ratio = (f"  first stall {m['first_stall_s'] / medians['ckptbench']['first_stall_s']:.1f}x ckptbench's"
                 if "ckptbench" in medians and writer != "ckptbench" else "")
        print(f"{writer:19s} medians: first stall {m['first_stall_s']:.3f} s (durable {m['first_total_s']:.2f} s), "
              f"second stall {m['second_stall_s']:.3f} s (durable {m['second_total_s']:.2f} s){ratio}")
    if args.output:
        args.output.write_text(json.dumps({
            "schema": "ckptbench.first-save-stall/1", "host": socket.gethostname(), "machine": platform.platform(),
            "cpus": os.cpu_count(), "dir": str(args.dir), "size_bytes": nbytes, "rounds": args.rounds,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average": os.getloadavg(),
            "runs": runs, "medians": medians,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
