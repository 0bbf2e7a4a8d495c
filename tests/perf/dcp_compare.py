#!/usr/bin/env python3
"""dcp.save / dcp.load through torch's FileSystemWriter/Reader vs ckptbench's Writer/Reader.

Same state_dict (SIZE of float32/bfloat16 tensors plus a few small ones and plain values), same
thread count, both durable (FileSystemWriter(sync_files=True) fsyncs every file; ckptbench's
Writer fdatasyncs every file and fsyncs the directory). Rounds alternate which side goes first;
every round saves into a new directory and removes it afterwards. Before each load the page cache
of the checkpoint's files is dropped (fdatasync + POSIX_FADV_DONTNEED), so both loads are cold.
ckptbench's Writer and Reader are reused across rounds (as a training loop would), so their
one-off allocation of the staging/read buffer is reported apart, from a warm-up save and load.

    python tests/perf/dcp_compare.py --dir /var/tmp --size 1GiB --rounds 3 --threads 4
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


def timed_round(name: str, writer, make_reader, state: dict, target: dict, directory: Path) -> tuple[float, float]:
    """(save_s, load_s) of one side; the directory is removed afterwards."""
    t0 = time.perf_counter()
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
        "ckptbench": (lambda: ours, our_reader),
    }
    try:
        warm = timed_round("ckptbench", ours, our_reader, state, target, scratch / "warm-up")
        print(f"state_dict {format_size(nbytes)} in {len(state['model']) * 2} tensors, threads {args.threads}, "
              f"dir {args.dir}")
        print(f"ckptbench warm-up (allocates its buffers): save {warm[0]:.3f} s, load {warm[1]:.3f} s")
        times: dict[str, dict[str, list[float]]] = {k: {"save": [], "load": []} for k in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                make_writer, make_reader = sides[name]
                save_s, load_s = timed_round(name, make_writer(), make_reader, state, target, scratch / f"{name}-{r}")
                times[name]["save"].append(save_s)
                times[name]["load"].append(load_s)
                print(f"round {r} {name:9s} save {save_s:7.3f} s ({nbytes / save_s / 1e9:5.2f} GB/s)  "
                      f"load {load_s:7.3f} s ({nbytes / load_s / 1e9:5.2f} GB/s)", flush=True)
        for op in ("save", "load"):
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
