#!/usr/bin/env python3
"""dcp.save / dcp.load through torch's FileSystemWriter/Reader vs ckptbench's Writer/Reader.

Same state_dict (SIZE of float32/bfloat16 tensors plus a few small ones and plain values), same
thread count, both durable (FileSystemWriter(sync_files=True) fsyncs every file; ckptbench's
Writer fdatasyncs every file and fsyncs the directory). Rounds alternate which side goes first;
every round saves into a new directory and removes it afterwards. Before each load the page cache
of the checkpoint's files is dropped (fdatasync + POSIX_FADV_DONTNEED), so both loads are cold.
ckptbench's Writer and Reader are reused across rounds (as a training loop would), so their
one-off allocation of the staging/read buffer is reported apart, from a warm-up save and load.
``--one-shot`` makes a new ckptbench Writer for every save instead (``Writer(path)`` per save, the
staging memory then comes from the process's pool). ``--async`` uses ``dcp.async_save`` and reports
the stall (until async_save returns) and the total (until its future is done) instead of the loads.

    python tests/perf/dcp_compare.py --dir /var/tmp --size 1GiB --rounds 3 --threads 4
    python tests/perf/dcp_compare.py --dir /var/tmp --size 1GiB --rounds 5 --threads 4 --one-shot [--async]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from ckptbench.integrations.dcp import Reader, Writer
from ckptbench.units import format_size, parse_size


def make_state(total_bytes: int) -> dict:
    """64 MiB tensors (float32, every fourth bfloat16) up to ``total_bytes``, some small ones, and values."""
    g = torch.Generator().manual_seed(0)
    big = 64 * 2**20
    layers = {}
    for i in range(max(1, total_bytes // big)):
        dtype = torch.bfloat16 if i % 4 == 3 else torch.float32
        layers[f"layer{i}"] = {"weight": torch.randn(big // dtype.itemsize, generator=g).to(dtype),
                               "bias": torch.randn(1024, generator=g)}
    return {"model": layers, "step": 1000, "lr": 3e-4}


def zeros_like_state(state: dict) -> dict:
    return {k: zeros_like_state(v) if isinstance(v, dict) else torch.zeros_like(v) if isinstance(v, torch.Tensor)
            else None for k, v in state.items()}


def drop_cache(directory: Path) -> None:
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed_round(name: str, writer, make_reader, state: dict, target: dict, directory: Path,
                async_: bool = False) -> tuple[float, float]:
    """(save_s, load_s) of one side, or with ``async_`` (stall_s, save_s); the directory is removed afterwards."""
    t0 = time.perf_counter()
    if async_:
        future = dcp.async_save(state, storage_writer=writer, checkpoint_id=directory)
        stall_s = time.perf_counter() - t0
        future.result()
        save_s = time.perf_counter() - t0
        shutil.rmtree(directory)
        return stall_s, save_s
    dcp.save(state, storage_writer=writer, checkpoint_id=directory)
    save_s = time.perf_counter() - t0
    drop_cache(directory)
    t0 = time.perf_counter()
    dcp.load(target, storage_reader=make_reader(directory))
    load_s = time.perf_counter() - t0
    shutil.rmtree(directory)
    return save_s, load_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="directory on the disk to use")
    parser.add_argument("--size", default="1GiB", help="state_dict size (default 1GiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="FileSystemWriter thread_count = ckptbench threads")
    parser.add_argument("--one-shot", action="store_true", help="a new ckptbench Writer for every save")
    parser.add_argument("--async", dest="async_", action="store_true", help="dcp.async_save: stall and total")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    size = parse_size(args.size)
    state = make_state(size)
    target = zeros_like_state(state)
    nbytes = sum(t.numel() * t.element_size() for layer in state["model"].values() for t in layer.values())
    scratch = Path(tempfile.mkdtemp(prefix="dcp-compare-", dir=args.dir))
    ours_reader = Reader(scratch, threads=args.threads)
    ours = Writer(scratch, threads=args.threads)

    def stock_reader(d: Path) -> FileSystemReader:
        return FileSystemReader(d)

    def our_reader(d: Path) -> Reader:
        ours_reader.reset(d)
        return ours_reader

    sides = {
        "torch": (lambda: FileSystemWriter(scratch, thread_count=args.threads, sync_files=True), stock_reader),
        "ckptbench": ((lambda: Writer(scratch, thread_count=args.threads)) if args.one_shot else (lambda: ours),
                      our_reader),
    }
    ops = ("stall", "save") if args.async_ else ("save", "load")
    try:
        warm = timed_round("ckptbench", sides["ckptbench"][0](), our_reader, state, target, scratch / "warm-up",
                           args.async_)
        print(f"state_dict {format_size(nbytes)} in {len(state['model']) * 2} tensors, threads {args.threads}, "
              f"dir {args.dir}, ckptbench writer {'new per save' if args.one_shot else 'reused'}, "
              f"{'async_save' if args.async_ else 'save'}")
        print(f"ckptbench warm-up (allocates its buffers): {ops[0]} {warm[0]:.3f} s, {ops[1]} {warm[1]:.3f} s")
        times: dict[str, dict[str, list[float]]] = {k: {op: [] for op in ops} for k in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                make_writer, make_reader = sides[name]
                first, second = timed_round(name, make_writer(), make_reader, state, target, scratch / f"{name}-{r}",
                                            args.async_)
                times[name][ops[0]].append(first)
                times[name][ops[1]].append(second)
                print(f"round {r} {name:9s} {ops[0]} {first:7.3f} s ({nbytes / first / 1e9:5.2f} GB/s)  "
                      f"{ops[1]} {second:7.3f} s ({nbytes / second / 1e9:5.2f} GB/s)", flush=True)
        for op in ops:
            stock, mine = statistics.median(times["torch"][op]), statistics.median(times["ckptbench"][op])
            print(f"{op}: median torch {stock:.3f} s, ckptbench {mine:.3f} s -> ckptbench is {stock / mine:.2f}x "
                  f"as fast (time ratio torch/ckptbench)")
        if ours.last_stats is not None:
            s = ours.last_stats
            print(f"ckptbench writer: direct={s.direct} sync={s.sync} files={s.files}"
                  + (f" (O_DIRECT fallback: {s.fallback_reason})" if s.fallback_reason else ""))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        ours.close()
        ours_reader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
