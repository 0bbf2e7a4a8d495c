#!/usr/bin/env python3
"""The writers on a network filesystem (CephFS through ceph-fuse) and on the local disk, side by side.

Per target, interleaved round by round (the order rotates each round), each into a fresh directory
removed afterwards:
- checkpoint saves and cold loads: ``ckptbench.save``/``ckptbench.load`` with the defaults (auto durable
  mode, threads and block size, measured once per mount by the warm-up save; its tuning is recorded, and
  per save the staging path it took, e.g. "zero-copy", and this process's CPU seconds, as for torch.save),
  ``torch.save`` + fsync of the file and the directory / ``torch.load``, and ``dcp.save`` with torch's
  ``FileSystemWriter(thread_count=4, sync_files=True)``. Before each load the page cache of the files is
  dropped (fdatasync + POSIX_FADV_DONTNEED per file: the machine is shared, so not the global
  drop_caches; ceph-fuse's own client cache stays, for every reader alike).
- raw durable writes: ``ckptbench bench`` with its default write mode (no read, no warm-up) vs fio
  ``--direct=1 --end_fsync=1`` and fio buffered ``--end_fsync=1``, same shape (jobs = threads = files,
  4 MiB blocks, the same bytes) and the same sample: on a network mount bench measures both durable
  modes, ``REPEAT`` runs each, run by run interleaved, each into new files removed after it; fio runs
  the same sequence (O_DIRECT, buffered, O_DIRECT, ...). Per mode the median of the round (every run
  kept); bench's default reports the faster mode's.

Goals (issue: the writer tunes itself per target): on CephFS save >= 1.0x torch.save+fsync and >= 1.0x
DCP, cold load >= 1.0x torch.load, bench's default durable write >= 0.9x the faster fio mode; on the local
disk save >= 1.1x DCP (4 threads). Ratios are of medians; every round's ratio is kept too.

    python tests/perf/netfs_compare.py --cephfs /mnt/cephfs --local /var/tmp --size 256MiB --rounds 3 \\
        --save results/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

import ckptbench
from ckptbench.bench.environment import collect_environment
from ckptbench.units import format_size, parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script, also under PYTHONSAFEPATH
from dcp_compare import drop_cache  # noqa: E402 - fdatasync + POSIX_FADV_DONTNEED of every file in a directory

JOBS = 2
BLOCK = 4 << 20
REPEAT = 3  # runs per mode and round, for bench and fio alike
GOALS = {"cephfs": {"save_vs_torch": 1.0, "save_vs_dcp": 1.0, "load_vs_torch": 1.0, "bench_vs_best_fio": 0.9},
         "local": {"save_vs_dcp": 1.1}}


def make_state(total_bytes: int) -> dict:
    """64 MiB float32 tensors up to ``total_bytes`` plus a small one and a step counter."""
    g = torch.Generator().manual_seed(0)
    big = 64 << 20
    state = {f"layer{i}.weight": torch.randn(big // 4, generator=g) for i in range(max(1, total_bytes // big))}
    state["bias"] = torch.randn(1024, generator=g)
    state["step"] = 1000
    return state


def nbytes(state: dict) -> int:
    return sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def ckptbench_round(ckpt: ckptbench.Checkpointer, state: dict, where: Path) -> tuple[float, float, dict]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    result = ckpt.save(state, where)
    save_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    drop_cache(where)
    load_s = timed(lambda: ckpt.load(where))
    return save_s, load_s, {"direct": result.direct, "threads": result.threads, "block_size": result.block_size,
                            "staging": result.staging, "cpu_s": cpu_s}


def torch_round(state: dict, where: Path) -> tuple[float, float, dict]:
    path = where / "model.pt"

    def save() -> None:  # makes its directory, as ckptbench.save and dcp.save do inside their timed region
        where.mkdir()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(where)

    cpu0 = time.process_time()
    save_s = timed(save)
    cpu_s = time.process_time() - cpu0
    drop_cache(where)
    load_s = timed(lambda: torch.load(path, weights_only=True))
    return save_s, load_s, {"cpu_s": cpu_s}


def dcp_round(state: dict, where: Path) -> tuple[float, float, dict]:
    writer = FileSystemWriter(where, thread_count=4, sync_files=True)
    return timed(lambda: dcp.save(state, storage_writer=writer)), float("nan"), {}


def fio_run(directory: Path, size: int, direct: bool) -> float:
    """One fio write in one durable mode into new files, removed after it: GB/s."""
    cmd = ["fio", "--output-format=json", "--group_reporting", f"--directory={directory}", "--ioengine=psync",
           f"--direct={int(direct)}", f"--bs={BLOCK}", f"--numjobs={JOBS}", f"--size={size // JOBS}",
           "--fallocate=none", "--name=netfs", "--rw=write", "--end_fsync=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    job = json.loads(proc.stdout)["jobs"][0]["write"]
    for p in directory.iterdir():
        p.unlink()
    return job["io_bytes"] / (job["runtime"] / 1e3) / 1e9


def fio(directory: Path, size: int) -> dict[str, tuple[float, dict]]:
    """fio in both durable modes, sampled as ``bench`` samples them on a network mount: ``REPEAT`` runs of
    each, run by run interleaved (O_DIRECT, buffered, O_DIRECT, ...); per mode the median and every run."""
    runs: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(REPEAT):
        for direct in (True, False):
            runs[direct].append(fio_run(directory, size, direct))
    return {f"fio_{'direct' if direct else 'buffered'}": (statistics.median(r), {"runs_gbps": r})
            for direct, r in runs.items()}


def bench(directory: Path, size: int) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "ckptbench", "bench", str(directory), "--size", str(size), "--files", str(JOBS),
           "--threads", str(JOBS), "--block-size", str(BLOCK), "--warmup", "0", "--repeat", str(REPEAT), "--no-read",
           "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    record = json.loads(proc.stdout)["results"][0]
    return record["write"]["gbps"], {"direct": record["config"]["direct"], "runs_gbps": record["write"]["runs_gbps"],
                                     "durable_modes": record.get("durable_modes")}


def measure_target(name: str, root: Path, size: int, rounds: int) -> dict:
    state = make_state(size)
    total = nbytes(state)
    work = root / f"netfs-compare-{os.getpid()}"
    work.mkdir()
    samples: dict[str, dict[str, list[float]]] = {}
    details: dict[str, list[dict]] = {}
    try:
        ckpt = ckptbench.Checkpointer()
        warm = time.perf_counter()
        first = ckpt.save(state, work / "warm-ckptbench")  # tunes this mount (once per process)
        warmup = {"ckptbench_first_save_s": time.perf_counter() - warm, "tuning": first.tuning}
        chosen = ", ".join(f"{k}={first.tuning[k]['value']}" for k in ("direct", "threads", "block_size"))
        print(f"{name}: ckptbench tuned {chosen} ({first.tuning['direct']['reason']}); first save "
              f"{warmup['ckptbench_first_save_s']:.1f} s", file=sys.stderr)
        torch_round(state, work / "warm-torch")
        dcp_round(state, work / "warm-dcp")
        for d in work.iterdir():
            shutil.rmtree(d)
        savers = {"ckptbench": lambda w: ckptbench_round(ckpt, state, w), "torch": lambda w: torch_round(state, w),
                  "dcp": lambda w: dcp_round(state, w)}
        raw = {"bench": lambda d: {"bench": bench(d, size)}, "fio": lambda d: fio(d, size)}
        for r in range(rounds):
            names = list(savers)
            for tool in names[r % len(names):] + names[:r % len(names)]:
                where = work / f"{tool}-{r}"
                save_s, load_s, info = savers[tool](where)
                shutil.rmtree(where)
                entry = samples.setdefault(tool, {"save_gbps": [], "load_gbps": []})
                entry["save_gbps"].append(total / save_s / 1e9)
                if load_s == load_s:  # not NaN
                    entry["load_gbps"].append(total / load_s / 1e9)
                details.setdefault(tool, []).append(info)
                print(f"{name} round {r + 1}: {tool} save {total / save_s / 1e9:.3f} GB/s"
                      + (f", load {total / load_s / 1e9:.3f} GB/s" if load_s == load_s else ""), file=sys.stderr)
            names = list(raw)
            for tool in names[r % len(names):] + names[:r % len(names)]:
                d = work / f"{tool}-{r}"
                d.mkdir()
                for key, (gbps, info) in raw[tool](d).items():
                    samples.setdefault(key, {"write_gbps": []})["write_gbps"].append(gbps)
                    details.setdefault(key, []).append(info)
                    print(f"{name} round {r + 1}: {key} write {gbps:.3f} GB/s", file=sys.stderr)
                shutil.rmtree(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"path": str(root), "bytes": total, "samples": samples, "details": details, "warmup": warmup,
            **ratios(name, samples)}


def ratios(name: str, s: dict) -> dict:
    def med(tool: str, key: str) -> float:
        return statistics.median(s[tool][key])

    def per_round(a: tuple[str, str], b: tuple[str, str]) -> list[float]:
        return [x / y for x, y in zip(s[a[0]][a[1]], s[b[0]][b[1]], strict=True)]

    best_fio = "fio_direct" if med("fio_direct", "write_gbps") >= med("fio_buffered", "write_gbps") else "fio_buffered"
    pairs = {"save_vs_torch": (("ckptbench", "save_gbps"), ("torch", "save_gbps")),
             "save_vs_dcp": (("ckptbench", "save_gbps"), ("dcp", "save_gbps")),
             "load_vs_torch": (("ckptbench", "load_gbps"), ("torch", "load_gbps")),
             "bench_vs_best_fio": (("bench", "write_gbps"), (best_fio, "write_gbps"))}
    out = {"median_gbps": {t: {k: statistics.median(v) for k, v in d.items() if v} for t, d in s.items()},
           "best_fio": best_fio, "ratios": {}, "goals": {}}
    for key, (a, b) in pairs.items():
        out["ratios"][key] = {"median": med(*a) / med(*b), "rounds": per_round(a, b)}
        goal = GOALS[name].get(key)
        if goal is not None:
            out["goals"][key] = {"goal": goal, "met": out["ratios"][key]["median"] >= goal,
                                 "every_round": all(x >= goal for x in out["ratios"][key]["rounds"])}
    return out


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(doc["targets"]), figsize=(6 * len(doc["targets"]), 4.2), squeeze=False)
    for ax, (name, t) in zip(axes[0], doc["targets"].items(), strict=True):
        bars = []
        for tool, key, label in (("ckptbench", "save_gbps", "ckptbench.save"), ("torch", "save_gbps", "torch.save+fsync"),
                                 ("dcp", "save_gbps", "DCP FSWriter(4)"), ("ckptbench", "load_gbps", "ckptbench.load"),
                                 ("torch", "load_gbps", "torch.load"), ("bench", "write_gbps", "bench write"),
                                 ("fio_direct", "write_gbps", "fio --direct=1"),
                                 ("fio_buffered", "write_gbps", "fio buffered+fsync")):
            values = t["samples"].get(tool, {}).get(key)
            if values:
                bars.append((label, statistics.median(values), min(values), max(values)))
        xs = range(len(bars))
        colors = ["tab:blue" if b[0].startswith(("ckptbench", "bench")) else "tab:gray" for b in bars]
        ax.bar(xs, [b[1] for b in bars], color=colors,
               yerr=[[b[1] - b[2] for b in bars], [b[3] - b[1] for b in bars]], capsize=3)
        ax.set_xticks(list(xs), [b[0] for b in bars], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("GB/s (median, min-max)")
        goals = ", ".join(f"{k} {v['median']:.2f}x" for k, v in t["ratios"].items())
        ax.set_title(f"{name}: {t['path']} ({format_size(t['bytes'])})\n{goals}", fontsize=8)
    fig.suptitle(f"netfs_compare on {doc['environment']['host']} ({doc['environment'].get('cpu_count', '?')} CPUs; "
                 f"load average 1/5/15 min before {doc['load_before']}, after {doc['load_after']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cephfs", type=Path, help="a directory on the network filesystem (e.g. a ceph-fuse mount)")
    parser.add_argument("--local", type=Path, help="a directory on the local disk")
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--local-size", default=None, help="size on the local disk (default: --size)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--save", type=Path, help="directory for the JSON and PNG (e.g. results/)")
    args = parser.parse_args()
    if not (args.cephfs or args.local):
        parser.error("give --cephfs and/or --local")
    if not shutil.which("fio"):
        parser.error("fio is not installed (apt-get install fio)")
    doc: dict = {"benchmark": "tests/perf/netfs_compare.py", "command": sys.argv,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "load_before": [round(x, 1) for x in os.getloadavg()], "rounds": args.rounds, "jobs": JOBS, "block_size": BLOCK,
                 "drop_cache": "fdatasync + POSIX_FADV_DONTNEED per file before each load",
                 "fio_version": subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip(),
                 "targets": {}}
    for name, root, size in (("cephfs", args.cephfs, args.size), ("local", args.local, args.local_size or args.size)):
        if root is not None:
            doc["targets"][name] = measure_target(name, root, parse_size(size), args.rounds)
    doc["load_after"] = [round(x, 1) for x in os.getloadavg()]
    doc["environment"] = collect_environment(args.cephfs or args.local)
    for name, t in doc["targets"].items():
        for key, r in t["ratios"].items():
            goal = t["goals"].get(key)
            verdict = "" if goal is None else (" OK" if goal["met"] else " BELOW GOAL") + f" (goal >= {goal['goal']})"
            print(f"{name:6s} {key:18s} {r['median']:.3f}x  rounds {', '.join(f'{x:.2f}' for x in r['rounds'])}{verdict}")
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        stem = args.save / f"netfs-compare-{socket.gethostname()}-{time.strftime('%Y%m%dT%H%M%S')}"
        stem.with_suffix(".json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        plot(doc, stem.with_suffix(".png"))
        print(f"saved {stem}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
