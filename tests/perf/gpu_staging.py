#!/usr/bin/env python3
"""GPU device-to-host staging vs a plain pinned copy of the same bytes (needs a CUDA GPU).

For each state_dict shape the benchmark times, alternating the order every round:

- ``memcpy``: one contiguous device buffer of the same total bytes copied into page-locked host
  memory (``torch.empty(..., pin_memory=True).copy_(..., non_blocking=True)`` = cudaMemcpyAsync),
  the ceiling of a device-to-host copy;
- ``stage``: ckptbench's staging step (``checkpoint.stage.stage``) into its reused, cudaHostRegister'ed
  arena (the part of an async save that blocks training), small tensors gathered by one kernel launch;
- ``stage (direct)``: the same with the kernel writing straight into the mapped arena
  (``CKPTBENCH_STAGE_GATHER_DIRECT=1``);
- ``stage (torch.cat)``: the same with the kernel switched off (``CKPTBENCH_STAGE_GATHER_KERNEL=0``);
- ``plan``: planning alone (flattening the state_dict and laying it out);
- ``plan+stage``: the same plus planning (the whole stall of ``save(async_=True)`` minus the wait);
- ``tensor.cpu()``: the per-tensor copy that ``torch.save`` of GPU tensors does (to pageable memory).

Then the async stall on the ``llama`` state_dict: ``Checkpointer.save(async_=True)`` against
``dcp.async_save`` (FileSystemWriter, 4 threads, sync_files), both to DIR, alternating; stall = time
until the call returns, total = until durable.

Shapes: ``large`` (16 x 128 MiB), ``small`` (thousands of 4-64 KiB tensors), ``tiny`` (20k tensors of
64 B - 4 KiB, ~42 MB), and ``llama`` (a synthetic Llama-3 8B state_dict scaled to SIZE: big matrices
plus hundreds of norm vectors).

    python tests/perf/gpu_staging.py --size 2GiB --rounds 5 --save results/
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ckptbench import knobs
from ckptbench.bench.workloads import build_state_dict, make_writer, plan_workload
from ckptbench.checkpoint.plan import plan_save
from ckptbench.checkpoint.stage import Arena, stage
from ckptbench.model.presets import load_model
from ckptbench.units import format_size, parse_size

CASES = ("large", "small", "tiny", "llama")


def shapes(total: int, cases: tuple[str, ...] = CASES) -> dict[str, dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    out: dict[str, dict] = {}
    big = 128 * 2**20
    if "large" in cases:
        out["large"] = {f"w{i}": torch.randn(big // 2, device="cuda", generator=g).to(torch.bfloat16)
                        for i in range(max(1, total // big))}
    sizes = [4096, 8192, 16384, 65536]
    if "small" in cases:
        small, used, i = {}, 0, 0
        while used < total // 8:  # thousands of small tensors (an eighth of SIZE keeps the count ~10k at 2 GiB)
            n = sizes[i % len(sizes)]
            small[f"s{i}"] = torch.randn(n // 4, device="cuda", generator=g)
            used += n
            i += 1
        out["small"] = small
    if "tiny" in cases:
        out["tiny"] = {f"t{i}": torch.randn(16 * (1 + i % 64), device="cuda", generator=g) for i in range(20_000)}
    if "llama" in cases:
        out["llama"] = {k: v.to("cuda") for k, v in
                        build_state_dict(plan_workload(load_model("llama3-8b"), size_bytes=total)).items()}
    return out


def total_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def time_it(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_case(name: str, state: dict, rounds: int, threads: int, profile: bool = False) -> dict:
    nbytes = total_bytes(state)
    device_flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    arena = Arena()
    plan, tensors = plan_save(state, 256 * 2**20, shard_prefix="s")
    stage(plan, tensors, arena, threads)  # allocate and register the arena once, as a Checkpointer does

    def do_plan_stage() -> None:
        p, ts = plan_save(state, 256 * 2**20, shard_prefix="s")
        stage(p, ts, arena, threads)

    def stage_with(knob: str, value: int):
        def run() -> None:
            before = getattr(knobs, knob)
            setattr(knobs, knob, value)
            try:
                stage(plan, tensors, arena, threads)
            finally:
                setattr(knobs, knob, before)
        return run

    contenders = {
        "memcpy": lambda: pinned.copy_(device_flat, non_blocking=True),
        "stage": lambda: stage(plan, tensors, arena, threads),
        "stage (direct)": stage_with("STAGE_GATHER_DIRECT", 1),
        "stage (torch.cat)": stage_with("STAGE_GATHER_KERNEL", 0),
        "plan": lambda: plan_save(state, 256 * 2**20, shard_prefix="s"),
        "plan+stage": do_plan_stage,
        "tensor.cpu()": lambda: [t.cpu() for t in state.values()],
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for r in range(rounds):
        order = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
        for key in order:
            times[key].append(time_it(contenders[key]))
    # Bit-exactness of the staged bytes, tensor by tensor.
    flat = arena.bytes_tensor()
    for entry, tensor in zip(plan.entries, tensors, strict=True):
        if entry.alias_of is None and entry.nbytes:
            off = plan.arena_offset(entry)
            if not torch.equal(flat[off:off + entry.nbytes], tensor.reshape(-1).view(torch.uint8).cpu()):
                raise SystemExit(f"{name}: staged bytes of {entry.key} differ from the GPU tensor")
    if profile:
        import cProfile
        import pstats

        for key in ("stage", "plan"):
            prof = cProfile.Profile()
            prof.runcall(contenders[key])
            torch.cuda.synchronize()
            print(f"-- Python profile of {key} ({name})")
            pstats.Stats(prof).sort_stats("tottime").print_stats(8)
        for key in ("stage", "stage (direct)"):
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                time_it(contenders[key])
            print(f"-- CUDA calls and kernels of {key} ({name})")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    arena.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "tensors": len(state), "bytes": nbytes,
        "median_s": med, "all_s": times,
        "gbps": {k: nbytes / v / 1e9 for k, v in med.items()},
        "ratio_vs_memcpy": {k: med["memcpy"] / v for k, v in med.items()},
    }


def async_stall(state: dict, rounds: int, directory: Path) -> dict:
    writers = {name: make_writer(name) for name in ("ckptbench", "dcp")}
    for w in writers.values():
        w.prepare(state)
    stall: dict[str, list[float]] = {k: [] for k in writers}
    total: dict[str, list[float]] = {k: [] for k in writers}
    scratch = Path(tempfile.mkdtemp(prefix="gpu-async-", dir=directory))
    try:
        for r in range(rounds + 1):  # round 0 warms up (arena allocation, dcp's pinned cache)
            order = list(writers) if r % 2 == 0 else list(writers)[::-1]
            for name in order:
                target = scratch / f"{name}-{r}"
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                pending = writers[name].save_async(state, target)
                t1 = time.perf_counter()
                pending.wait()
                t2 = time.perf_counter()
                if r:
                    stall[name].append(t1 - t0)
                    total[name].append(t2 - t0)
                shutil.rmtree(target)
    finally:
        for w in writers.values():
            w.close()
        shutil.rmtree(scratch, ignore_errors=True)
    med_stall = {k: statistics.median(v) for k, v in stall.items()}
    med_total = {k: statistics.median(v) for k, v in total.items()}
    return {"stall_s": stall, "total_s": total, "median_stall_s": med_stall, "median_total_s": med_total,
            "stall_ratio_ckptbench_vs_dcp": med_stall["ckptbench"] / med_stall["dcp"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--save", type=Path, help="directory for gpu-staging.json")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the async saves go")
    ap.add_argument("--async-rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES), help=f"which state_dicts, of {','.join(CASES)}")
    ap.add_argument("--profile", action="store_true", help="print where staging and planning spend CPU time")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    size = parse_size(args.size)
    results = {}
    states = shapes(size, tuple(args.cases.split(",")))
    for name, state in states.items():
        results[name] = res = run_case(name, state, args.rounds, args.threads, args.profile and name in ("small", "tiny"))
        print(f"{name:6s} {res['tensors']:6d} tensors {format_size(res['bytes']):>10s}  " + "  ".join(
            f"{k} {res['gbps'][k]:6.1f} GB/s ({res['ratio_vs_memcpy'][k]:.2f}x)" for k in res["gbps"]), flush=True)
    if args.async_rounds and "llama" in states:
        results["async_llama"] = a = async_stall(states["llama"], args.async_rounds, args.dir)
        print("async llama: " + "  ".join(f"{k} stall {a['median_stall_s'][k] * 1e3:.1f} ms total "
                                          f"{a['median_total_s'][k]:.2f} s" for k in a["median_stall_s"])
              + f"  stall ratio {a['stall_ratio_ckptbench_vs_dcp']:.2f}x")
    doc = {
        "benchmark": "gpu-staging", "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "host": platform.node(),
        "cpus": __import__("os").cpu_count(), "rounds": args.rounds, "threads": args.threads, "cases": results,
    }
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        (args.save / "gpu-staging.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
