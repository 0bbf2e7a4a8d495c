#!/usr/bin/env python3
"""Buffered sync saves written from the tensors' own memory (zero-copy) against the same saves staged
through the arena first, interleaved round by round (the order alternates each round), with
torch.save + fsync beside them, on each target given.

With ``--pid-files DIR`` (e.g. ``tests/servers/ceph.sh``'s ``DIR/run``), each save's CPU seconds also
count the processes named by the ``*.pid`` files there (ceph-fuse, the OSD, the MDS...), read from
``/proc/PID/stat`` before the save and after it plus a short settle: on a machine whose CPU is the
bottleneck, the CPU a save costs the whole storage path is the steadier figure.

Both ckptbench variants use one Checkpointer with ``direct=False`` and the same threads and block size
(the target's tuned values, from a warm-up save); ``CKPTBENCH_SAVE_ZERO_COPY`` switches the path per
save, and each save's ``SaveResult.staging`` is checked to be the one asked for. Reported per target:
every round's GB/s and process CPU seconds, the medians, the zero-copy / staged ratio per round, and
the verdict of the project's tie rule (``ckptbench.model.noise.beats``: zero-copy wins only when every
round of it is faster than every round of the staged save).

    python tests/perf/zero_copy_compare.py --target local=/var/tmp --target cephfs=/mnt/cephfs \\
        --size 512MiB --rounds 5 --pid-files /tmp/ceph/run --save results/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

import ckptbench
from ckptbench.bench.environment import collect_environment
from ckptbench.model.noise import beats
from ckptbench.units import parse_size

VARIANTS = {"staged": "0", "zero-copy": "1"}
#: After a save, how long the storage daemons are given to finish its work before their CPU is read.
SETTLE_S = 0.5
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def daemon_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total * TICK_S


def make_state(total_bytes: int) -> dict:
    """64 MiB float32 tensors up to ``total_bytes``, 200 small ones and a step counter."""
    g = torch.Generator().manual_seed(0)
    big = 64 << 20
    state = {f"layer{i}.weight": torch.randn(big // 4, generator=g) for i in range(max(1, total_bytes // big))}
    state["norms"] = [torch.randn(1000 + i, generator=g) for i in range(200)]
    state["step"] = 1000
    return state


def nbytes(state: dict) -> int:
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)] + state["norms"]
    return sum(t.numel() * t.element_size() for t in tensors)


def torch_save(state: dict, where: Path) -> None:
    where.mkdir()
    with open(where / "model.pt", "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def measure(root: Path, size: int, rounds: int, pids: list[int]) -> dict:
    state = make_state(size)
    total = nbytes(state)
    work = root / f"zero-copy-compare-{os.getpid()}"
    work.mkdir()
    samples: dict[str, dict[str, list[float]]] = {k: {"gbps": [], "cpu_s": [], "daemon_cpu_s": []}
                                                  for k in (*VARIANTS, "torch")}
    paths: dict[str, set[str]] = {}
    try:
        warm = ckptbench.Checkpointer(direct=False).save(state, work / "warm")  # tunes threads and block size
        ckpt = ckptbench.Checkpointer(direct=False, threads=warm.threads, block_size=warm.block_size)
        for name, flag in VARIANTS.items():  # each path once before timing (the staged one allocates its arena)
            os.environ["CKPTBENCH_SAVE_ZERO_COPY"] = flag
            ckpt.save(state, work / f"warm-{name}")
        torch_save(state, work / "warm-torch")
        for d in work.iterdir():
            shutil.rmtree(d)
        order = [*VARIANTS, "torch"]
        for r in range(rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                where = work / f"{name}-{r}"
                time.sleep(SETTLE_S if pids else 0)  # the previous save's background work done
                daemons0 = daemon_cpu_s(pids)
                cpu0, t0 = time.process_time(), time.perf_counter()
                if name == "torch":
                    torch_save(state, where)
                else:
                    os.environ["CKPTBENCH_SAVE_ZERO_COPY"] = VARIANTS[name]
                    result = ckpt.save(state, where)
                    if (result.staging == "zero-copy") != (name == "zero-copy"):
                        raise SystemExit(f"the {name} save took the {result.staging} path")
                    paths.setdefault(name, set()).add(result.staging)
                seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                if pids:
                    time.sleep(SETTLE_S)
                    samples[name]["daemon_cpu_s"].append(daemon_cpu_s(pids) - daemons0)
                shutil.rmtree(where)
                samples[name]["gbps"].append(total / seconds / 1e9)
                samples[name]["cpu_s"].append(cpu)
                print(f"{root} round {r + 1}: {name} {total / seconds / 1e9:.3f} GB/s, CPU {cpu:.3f} s", file=sys.stderr)
    finally:
        os.environ.pop("CKPTBENCH_SAVE_ZERO_COPY", None)
        shutil.rmtree(work, ignore_errors=True)
    zc, st, th = (samples[k]["gbps"] for k in ("zero-copy", "staged", "torch"))
    return {"path": str(root), "bytes": total, "threads": ckpt.threads, "block_size": ckpt.block_size,
            "staging": {k: sorted(v) for k, v in paths.items()}, "samples": samples,
            "median_gbps": {k: statistics.median(v["gbps"]) for k, v in samples.items()},
            "median_cpu_s": {k: statistics.median(v["cpu_s"]) for k, v in samples.items()},
            "median_cpu_with_daemons_s": {k: statistics.median(a + b for a, b in zip(v["cpu_s"], v["daemon_cpu_s"],
                                                                                      strict=True))
                                          for k, v in samples.items() if v["daemon_cpu_s"]},
            "zero_copy_vs_staged": {"median": statistics.median(zc) / statistics.median(st),
                                    "rounds": [a / b for a, b in zip(zc, st, strict=True)]},
            "zero_copy_vs_torch": {"median": statistics.median(zc) / statistics.median(th),
                                   "rounds": [a / b for a, b in zip(zc, th, strict=True)]},
            "verdict": "zero-copy faster beyond the noise" if beats(zc, st)
            else "staged faster beyond the noise" if beats(st, zc) else "tied within the noise",
            "cpu_verdict": _cpu_verdict(samples)}


def _cpu_verdict(samples: dict) -> str:
    """The tie rule on each save's CPU seconds (with the daemons' where counted), lower is better."""
    def cpu(name: str) -> list[float]:
        v = samples[name]
        return [a + b for a, b in zip(v["cpu_s"], v["daemon_cpu_s"], strict=True)] if v["daemon_cpu_s"] else v["cpu_s"]

    zc, st = cpu("zero-copy"), cpu("staged")
    if beats(zc, st, higher_is_better=False):
        return "zero-copy uses less CPU beyond the noise"
    return "staged uses less CPU beyond the noise" if beats(st, zc, higher_is_better=False) else "CPU tied within the noise"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", action="append", required=True, metavar="NAME=DIR",
                        help="a directory to save into, named (repeatable)")
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pid-files", type=Path, help="count the CPU of the processes named by DIR/*.pid too")
    parser.add_argument("--save", type=Path, help="directory for the JSON (e.g. results/)")
    args = parser.parse_args()
    pids = sorted(int(p.read_text()) for p in args.pid_files.glob("*.pid")) if args.pid_files else []
    targets = {}
    for item in args.target:
        name, sep, path = item.partition("=")
        if not sep or not path:
            parser.error(f"--target {item!r}: give NAME=DIR")
        targets[name] = Path(path)
    doc: dict = {"benchmark": "tests/perf/zero_copy_compare.py", "command": sys.argv,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "load_before": [round(x, 1) for x in os.getloadavg()], "rounds": args.rounds,
                 "daemon_pids": pids, "targets": {}}
    for name, root in targets.items():
        doc["targets"][name] = measure(root, parse_size(args.size), args.rounds, pids)
    doc["load_after"] = [round(x, 1) for x in os.getloadavg()]
    doc["environment"] = collect_environment(next(iter(targets.values())))
    for name, t in doc["targets"].items():
        r = t["zero_copy_vs_staged"]
        print(f"{name:8s} zero-copy/staged {r['median']:.3f}x (rounds {', '.join(f'{x:.2f}' for x in r['rounds'])}): "
              f"{t['verdict']}, {t['cpu_verdict']}; zero-copy/torch.save {t['zero_copy_vs_torch']['median']:.3f}x; median CPU s "
              + ", ".join(f"{k} {v:.3f}" for k, v in t["median_cpu_s"].items())
              + ("; with the daemons' " + ", ".join(f"{k} {v:.3f}" for k, v in t["median_cpu_with_daemons_s"].items())
                 if t["median_cpu_with_daemons_s"] else ""))
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        path = args.save / f"zero-copy-compare-{socket.gethostname()}-{time.strftime('%Y%m%dT%H%M%S')}.json"
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
