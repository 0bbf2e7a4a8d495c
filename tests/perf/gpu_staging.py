#!/usr/bin/env python3
"""GPU device-to-host staging vs a plain pinned copy of the same bytes (needs a CUDA GPU).

For each state_dict shape the benchmark times, alternating the order every round:

- ``memcpy``: one contiguous device buffer of the same total bytes copied into page-locked host
  memory (``torch.empty(..., pin_memory=True).copy_(..., non_blocking=True)`` = cudaMemcpyAsync),
  the ceiling of a device-to-host copy;
- ``stage``: ckptbench's staging step (``checkpoint.stage.stage``) into its reused, cudaHostRegister'ed
  arena (the part of an async save that blocks training) with the default knobs, as a training loop
  saves the same state_dict again and again (a Checkpointer reuses its plan, and the arena the staging
  it worked out for those plan arrays): big tensors by the copy engine, small ones by a kernel writing
  straight into the mapped arena from the table the arena prepared the first time;
- ``stage (worked out)``: the same with the staging worked out anew from the plan (the per-tensor
  numpy work), the prepared table found again by comparing the copies (a plan made afresh);
- ``stage (new layout)``: the same, the table prepared anew each time (the first save, or tensors that
  moved);
- ``stage (gather+copy)``: small tensors gathered into device buffers, a launch per batch of runs,
  while the copy engine moves earlier batches (``CKPTBENCH_STAGE_GATHER_MAPPED=0``), prepared once
  or (``new layout``) each time;
- ``stage (torch.cat)``: the kernel switched off (``CKPTBENCH_STAGE_GATHER_KERNEL=0``);
- ``gather only (device)``: the kernel alone into a device buffer (no copy to the host);
- ``plan``: planning alone (flattening the state_dict and laying it out);
- ``plan+stage``: the same plus planning (the whole stall of ``save(async_=True)`` minus the wait);
- ``plan (reused)``, ``plan (reused)+stage``: the same with a Checkpointer's plan cache, as every
  save after the first of a training loop plans (``plan.PlanCache``: a lighter walk, same layout);
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
from typing import Any

import numpy as np
import torch

from ckptbench import knobs
from ckptbench.bench.workloads import build_state_dict, plan_workload
from ckptbench.bench.writers import make_writer
from ckptbench.checkpoint import gather
from ckptbench.checkpoint.plan import PlanCache, plan_save
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


def small_rows(plan, tensors, piece: int | None = None) -> tuple[Any, int]:
    """The gather kernel's rows, on the GPU, for every small tensor of ``plan`` as staging lays them out
    (pieces of ``piece`` bytes), and the bytes they cover, padding included."""
    index, offsets, nbytes = plan.placements.T
    small = nbytes < knobs.STAGE_GATHER_BELOW_BYTES
    addresses = np.frombuffer(tensors.addresses, np.int64)[index][small]
    table, _ = gather.kernel_table(addresses, offsets[small], nbytes[small], plan.padding[small], piece)
    return torch.from_numpy(table).to("cuda"), int((nbytes[small] + plan.padding[small]).sum())


def gather_only(plan, tensors) -> Any:
    """The gather kernel alone over every small tensor, into a device buffer laid out like the arena
    (no copy to the host): how fast the device gathers."""
    rows, _ = small_rows(plan, tensors)
    if not len(rows):
        return lambda: None
    device = torch.device("cuda")
    out = torch.empty(plan.arena_bytes, dtype=torch.uint8, device=device)
    kernel = gather.kernel_for(device)
    return lambda: gather._launch(kernel, torch.cuda.current_stream(), rows, out)


def kernel_sweep(plan, tensors, arena, reps: int = 5) -> list[tuple[float, int, int, int]]:
    """Device time of the gather kernel alone writing every small tensor straight into the mapped
    ``arena`` (CUDA events, median of ``reps``), for threads per block x block limits x piece sizes;
    the first entry is a pinned ``cudaMemcpyAsync`` of the same bytes. Returns (seconds, threads,
    blocks, piece) sorted fastest first, memcpy as (s, 0, 0, 0)."""
    device = torch.device("cuda")
    kernel, flat, stream = gather.kernel_for(device), arena.bytes_tensor(), torch.cuda.current_stream()
    total = small_rows(plan, tensors)[1]
    src = torch.empty(total, dtype=torch.uint8, device=device)

    def timed(fn) -> float:
        out = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        return statistics.median(out)

    results = [(timed(lambda: flat[:total].copy_(src, non_blocking=True)), 0, 0, 0)]
    saved = gather.THREADS_PER_BLOCK, gather.MAX_BLOCKS
    try:
        for piece in (16 * 1024, 64 * 1024, 256 * 1024):
            rows, _ = small_rows(plan, tensors, piece)
            for threads in (128, 256, 512, 1024):
                for blocks in (1024, 2048, 4096, 8192, 32768):
                    gather.THREADS_PER_BLOCK, gather.MAX_BLOCKS = threads, blocks
                    results.append((timed(lambda rows=rows: gather._launch(kernel, stream, rows, flat)), threads, blocks, piece))
    finally:
        gather.THREADS_PER_BLOCK, gather.MAX_BLOCKS = saved
    return sorted(results)


def launch_costs(plan, tensors, arena, reps: int = 50) -> dict[str, float]:
    """Host microseconds per call of: the gather kernel's launch over one row, on the current stream and
    on a side stream; over every small tensor's row into the arena; a torch kernel (``zero_`` of 16
    bytes) for reference; a CUDA graph replaying the launch over every row. And, timed to the end, the
    graph's replay against the default ``stage``, both in milliseconds."""
    device = torch.device("cuda")
    kernel, flat = gather.kernel_for(device), arena.bytes_tensor()
    table, _ = small_rows(plan, tensors)
    scratch = torch.zeros(32, dtype=torch.uint8, device=device)
    one = torch.tensor([[scratch.data_ptr(), 16, 16, 0]], dtype=torch.int64, device=device)
    side = torch.cuda.Stream()

    def host_us(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / reps * 1e6

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gather._launch(kernel, torch.cuda.current_stream(), table, flat)
    out = {
        "launch 1 row, current stream (us)": host_us(lambda: gather._launch(kernel, gather.CurrentStream.of(device),
                                                                            one, scratch)),
        "launch 1 row, side stream (us)": host_us(lambda: gather._launch(kernel, side, one, scratch)),
        "launch all rows into the arena (us)": host_us(lambda: gather._launch(kernel, gather.CurrentStream.of(device),
                                                                              table, flat)),
        "torch zero_ (us)": host_us(lambda: scratch.zero_()),
        "graph replay, all rows (us)": host_us(graph.replay),
    }
    out["graph replay, to the end (ms)"] = statistics.median(time_it(graph.replay) for _ in range(7)) * 1e3
    out["stage, to the end (ms)"] = statistics.median(time_it(lambda: stage(plan, tensors, arena, 8))
                                                      for _ in range(7)) * 1e3
    return out


def issue_time(fn) -> tuple[float, float, float]:
    """Seconds from the start of one call of ``fn`` until its first kernel launch, until staging's device
    work was all queued, and until it was done."""
    queued: list[float] = []
    launched: list[float] = []
    wait, launch = gather.Queued.wait, gather._launch

    def timed_wait(self) -> None:
        queued.append(time.perf_counter())
        wait(self)

    def timed_launch(*args) -> None:
        launched.append(time.perf_counter())
        launch(*args)

    torch.cuda.synchronize()
    gather.Queued.wait, gather._launch = timed_wait, timed_launch
    try:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
    finally:
        gather.Queued.wait, gather._launch = wait, launch
    nan = float("nan")
    return (launched[0] - t0 if launched else nan), (queued[0] - t0 if queued else nan), t1 - t0


def host_timeline(fn, min_us: float = 4.0, depth: int = 7) -> list[str]:
    """One call of ``fn`` with every Python and C function it calls timed (``sys.setprofile``): the calls
    of at least ``min_us`` microseconds, at most ``depth`` deep, as "start +duration name" lines in
    call order. Profiling slows each call by ~1 us; what counts is where the host's time goes."""
    stack: list[tuple[float, int, str]] = []
    done: list[tuple[float, float, int, str]] = []

    def name_of(frame, event, arg) -> str:
        if event.startswith("c_"):
            return f"{getattr(arg, '__qualname__', arg)}()"
        code = frame.f_code
        return f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_qualname}"

    def hook(frame, event, arg) -> None:
        now = time.perf_counter()
        if event in ("call", "c_call"):
            stack.append((now, len(stack), name_of(frame, event, arg)))
        elif event in ("return", "c_return", "c_exception") and stack:
            start, level, name = stack.pop()
            done.append((start, now - start, level, name))

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    torch.cuda.synchronize()
    return [f"{(start - t0) * 1e6:8.1f} +{took * 1e6:7.1f} us {'  ' * level}{name}"
            for start, took, level, name in sorted(done) if took * 1e6 >= min_us and level <= depth]


def run_case(name: str, state: dict, rounds: int, threads: int, profile: bool = False,
             trace: Path | None = None) -> dict:
    nbytes = total_bytes(state)
    device_flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    arena = Arena()
    plan, tensors = plan_save(state, 256 * 2**20, shard_prefix="s")
    stage(plan, tensors, arena, threads)  # allocate and register the arena once, as a Checkpointer does

    def do_plan_stage() -> None:
        p, ts = plan_save(state, 256 * 2**20, shard_prefix="s")
        stage(p, ts, arena, threads)

    plans = PlanCache()  # a Checkpointer's: the next save of the same layout reuses the plan
    plans.plan(state, 256 * 2**20, "s")

    def do_replan_stage() -> None:
        p, ts = plans.plan(state, 256 * 2**20, "s")
        stage(p, ts, arena, threads)

    def stage_with(new_layout: bool = False, worked_out: bool = False, **settings: int):
        def run() -> None:
            before = {knob: getattr(knobs, knob) for knob in settings}
            for knob, value in settings.items():
                setattr(knobs, knob, value)
            if new_layout or worked_out:  # a plan made afresh (its arrays new to the arena)
                arena.forget()
            if new_layout:  # as for the first save, or a state_dict whose tensors moved
                arena.prepared.clear()
            try:
                stage(plan, tensors, arena, threads)
            finally:
                for knob, value in before.items():
                    setattr(knobs, knob, value)
        return run

    contenders = {
        "memcpy": lambda: pinned.copy_(device_flat, non_blocking=True),
        "stage": lambda: stage(plan, tensors, arena, threads),
        "stage (worked out)": stage_with(worked_out=True),
        "stage (new layout)": stage_with(new_layout=True),
        "stage (gather+copy)": stage_with(STAGE_GATHER_MAPPED=0),
        "stage (gather+copy, new layout)": stage_with(new_layout=True, STAGE_GATHER_MAPPED=0),
        "stage (torch.cat)": stage_with(STAGE_GATHER_KERNEL=0),
        "gather only (device)": gather_only(plan, tensors),
        "plan": lambda: plan_save(state, 256 * 2**20, shard_prefix="s"),
        "plan+stage": do_plan_stage,
        "plan (reused)": lambda: plans.plan(state, 256 * 2**20, "s"),
        "plan (reused)+stage": do_replan_stage,
        "tensor.cpu()": lambda: [t.cpu() for t in state.values()],
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for r in range(rounds):
        order = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
        for key in order:
            times[key].append(time_it(contenders[key]))
    # Bit-exactness of the staged bytes, tensor by tensor, after the default staging.
    stage(plan, tensors, arena, threads)
    flat = arena.bytes_tensor()
    for entry, tensor in zip(plan.entries, tensors, strict=True):
        if entry.alias_of is None and entry.nbytes:
            off = plan.arena_offset(entry)
            if not torch.equal(flat[off:off + entry.nbytes], tensor.reshape(-1).view(torch.uint8).cpu()):
                raise SystemExit(f"{name}: staged bytes of {entry.key} differ from the GPU tensor")
    extra: dict[str, Any] = {}
    if profile:
        import cProfile
        import pstats

        for key in ("stage", "plan"):
            prof = cProfile.Profile()
            prof.runcall(contenders[key])
            torch.cuda.synchronize()
            print(f"-- Python profile of {key} ({name})")
            pstats.Stats(prof).sort_stats("tottime").print_stats(8)
        sweep = extra["kernel_sweep"] = kernel_sweep(plan, tensors, arena)
        memcpy = next(t for t, threads, _, _ in sweep if threads == 0)
        default = next(t for t, threads, blocks, piece in sweep if (threads, blocks, piece) == (
            gather.THREADS_PER_BLOCK, gather.MAX_BLOCKS, gather.PIECE_BYTES))
        print(f"-- kernel straight into the arena ({name}), device time vs memcpy {memcpy * 1e3:.3f} ms: default "
              f"{memcpy / default:.3f}x; best " + ", ".join(
                  f"{threads}x{blocks} piece {piece // 1024}K {memcpy / t:.3f}x" for t, threads, blocks, piece in sweep[:6]
                  if threads))
        costs = extra["launch_costs"] = launch_costs(plan, tensors, arena)
        print(f"-- launch costs ({name}): " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()))
        contenders["stage"]()  # warm
        print(f"-- host timeline of stage ({name})")
        print("\n".join(host_timeline(contenders["stage"])))
        for key in ("stage", "stage (worked out)", "stage (new layout)", "stage (gather+copy)"):
            issued = [issue_time(contenders[key]) for _ in range(3)]
            print(f"-- {key} ({name}): first launch, all queued, done after " + ", ".join(
                f"{f * 1e3:.2f}/{q * 1e3:.2f}/{t * 1e3:.2f} ms" for f, q, t in issued))
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                time_it(contenders[key])
            print(f"-- CUDA calls and kernels of {key} ({name})")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=6))
            if trace is not None and key in ("stage", "stage (gather+copy)"):
                tag = "".join(ch if ch.isalnum() else "-" for ch in key)
                prof.export_chrome_trace(str(trace / f"trace-{name}-{tag}.json"))
    arena.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "tensors": len(state), "bytes": nbytes,
        "median_s": med, "all_s": times,
        "gbps": {k: nbytes / v / 1e9 for k, v in med.items()},
        "ratio_vs_memcpy": {k: med["memcpy"] / v for k, v in med.items()},
        **extra,
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


PLOTTED = ("stage", "stage (worked out)", "stage (new layout)", "stage (gather+copy)", "stage (torch.cat)", "plan+stage",
           "plan (reused)+stage")


def plot(doc: dict, png: Path) -> None:
    """Bars of each staging variant's bandwidth over the pinned memcpy's, per state_dict, 0.9x marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in CASES if c in doc["cases"]]
    keys = [k for k in PLOTTED if any(k in doc["cases"][c]["ratio_vs_memcpy"] for c in cases)]
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(11, 4.6))
    for j, key in enumerate(keys):
        xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(cases))]
        ys = [doc["cases"][c]["ratio_vs_memcpy"].get(key, 0.0) for c in cases]
        bars = ax.bar(xs, ys, width, label=key)
        ax.bar_label(bars, fmt="%.2f", fontsize=6, rotation=90, padding=2)
    ax.axhline(0.9, color="grey", linestyle="--", linewidth=0.8)
    ax.text(-0.45, 1.3, "dashed: the goal, 0.9x", ha="left", fontsize=7, color="grey")
    ax.set_xticks(range(len(cases)), [f"{c}\n{doc['cases'][c]['tensors']} tensors, "
                                      f"{doc['cases'][c]['bytes'] / 2**20:.0f} MiB" for c in cases])
    ax.set_ylabel("bandwidth / pinned cudaMemcpy of the same bytes")
    ax.set_ylim(0, 1.4)
    ax.set_title(f"GPU device-to-host staging, {doc['device']} (torch {doc['torch']}), "
                 f"median of {doc['rounds']} rounds")
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


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
    ap.add_argument("--trace", type=Path, help="with --profile: write Chrome traces of staging (small, tiny) here")
    ap.add_argument("--plot", type=Path, metavar="PNG", help="write a bar chart of the ratios here")
    ap.add_argument("--from-json", type=Path, help="with --plot: chart a saved gpu-staging.json (no GPU needed)")
    args = ap.parse_args()
    if args.from_json:
        plot(json.loads(args.from_json.read_text()), args.plot or args.from_json.with_suffix(".png"))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if gather.kernel_for(torch.device("cuda")) is None:
        print("the gather kernel did not compile (see the log); only torch.cat would be measured", file=sys.stderr)
        return 2
    size = parse_size(args.size)
    results = {}
    states = shapes(size, tuple(args.cases.split(",")))
    for name, state in states.items():
        results[name] = res = run_case(name, state, args.rounds, args.threads, args.profile and name in ("small", "tiny"),
                                    args.trace)
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
    if args.plot:
        plot(doc, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
