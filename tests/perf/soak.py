#!/usr/bin/env python3
"""Soak: many consecutive async saves, the saving process SIGKILLed at random moments and restarted.

A child process (one life) resumes from the latest committed checkpoint (loads it, checks every
tensor), then saves version after version to one path with ``Checkpointer.save(..., async_=True,
overwrite=True)``: while a version persists it "trains" (fills its tensors with the next version's
values), then waits for ``handle.result()`` and reports the version committed, with its RSS
(/proc/self/status VmRSS), stall and persist times. About every ``--kill-every`` saves the parent
SIGKILLs it at a random moment (staging, writing, committing or training) and starts the next
life. After every kill, and at the end, the parent loads the checkpoint and checks it.

A checkpoint is **lost** when a version the child reported committed (``handle.result()`` returned)
is later not loadable, or the loaded version is older than it. Expected: 0.

Not a test (not collected by pytest): run by hand. The JSON summary goes to stdout; with
``--output`` also to that file.

    python tests/perf/soak.py --saves 200 --size 256MiB --kill-every 20 --output results/soak-vm.json
"""

from __future__ import annotations

import argparse
import json
import platform
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TENSORS = 16


def value(version: int, index: int) -> float:
    return float(version * 100 + index)  # exact in float32 for the versions a soak reaches


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return -1


def check(loaded: dict, version: int, tensor_elems: int) -> str | None:
    """None when ``loaded`` is exactly ``version``; else what differs."""
    import torch

    if loaded.get("version") != version or loaded.get("step") != version * 10:
        return f"version/step {loaded.get('version')}/{loaded.get('step')}, expected {version}"
    if not torch.equal(loaded["small"], torch.arange(version % 13 + 1)):
        return "tensor 'small' differs"
    for i in range(TENSORS):
        t = loaded["model"][f"w{i:02d}"]
        if t.numel() != tensor_elems or not bool((t == value(version, i)).all()):
            return f"tensor w{i:02d} differs"
    return None


# -- the child: one life of the training job ---------------------------------------------------


def child(path: str, size_bytes: int, last_version: int) -> None:
    import torch

    from ckptbench.checkpoint import Checkpointer
    from ckptbench.checkpoint.manifest import NotACheckpointError

    elems = size_bytes // TENSORS // 4
    ckpt = Checkpointer()
    try:
        loaded = ckpt.load(path)
        version = loaded["version"]
        problem = check(loaded, version, elems)
        del loaded
    except NotACheckpointError:
        version, problem = 0, None
    print(json.dumps({"event": "resumed", "version": version, "problem": problem}), flush=True)
    if problem:
        sys.exit(3)
    model = {f"w{i:02d}": torch.empty(elems, dtype=torch.float32) for i in range(TENSORS)}

    def fill(v: int) -> None:  # a training step: every tensor changes
        for i, t in enumerate(model.values()):
            t.fill_(value(v, i))

    fill(version + 1)
    while version < last_version:
        version += 1
        state = {"model": model, "step": version * 10, "version": version, "small": torch.arange(version % 13 + 1)}
        handle = ckpt.save(state, path, async_=True, overwrite=True)
        fill(version + 1)  # training goes on while it persists
        result = handle.result()
        print(json.dumps({"event": "committed", "version": version, "rss_bytes": rss_bytes(),
                          "stall_s": result.stall_s, "persist_s": result.persist_s}), flush=True)
    ckpt.close()


# -- the parent --------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    from ckptbench.units import parse_size as parse

    return parse(text)


def start_life(script: Path, path: Path, size_bytes: int, last_version: int) -> tuple[subprocess.Popen, queue.Queue]:
    proc = subprocess.Popen([sys.executable, str(script), "--child", "--path", str(path), "--size", str(size_bytes),
                             "--last-version", str(last_version)], stdout=subprocess.PIPE, text=True)
    events: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            events.put(json.loads(line))
        events.put(None)  # EOF: the child is gone

    threading.Thread(target=read, daemon=True).start()
    return proc, events


def verify(path: Path, size_bytes: int) -> tuple[int | None, str | None]:
    """(loaded version, problem) of the checkpoint at ``path``, checked tensor by tensor."""
    import ckptbench
    from ckptbench.errors import CkptbenchError

    try:
        loaded = ckptbench.load(path)
    except CkptbenchError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    version = loaded["version"]
    return version, check(loaded, version, size_bytes // TENSORS // 4)


def summarize(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=200, help="committed saves in all (default 200)")
    parser.add_argument("--size", default="256MiB", help="checkpoint size (default 256MiB)")
    parser.add_argument("--kill-every", type=int, default=20, help="SIGKILL about every N saves (default 20)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the checkpoint goes (a fresh subdirectory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="also write the JSON summary here (e.g. results/soak-vm.json)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--last-version", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.path, int(args.size), args.last_version)
        return 0

    size_bytes = parse_size(args.size)
    if args.saves < 1 or args.kill_every < 2 or size_bytes < TENSORS * 4:
        parser.error("--saves >= 1, --kill-every >= 2 and --size >= 64 bytes")
    output = Path(args.output) if args.output else None
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.touch()  # opened before the long run: a bad path fails now, not after it
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="ckptbench-soak-", dir=args.dir))
    path = workdir / "ckpt"
    started = time.perf_counter()
    committed = 0  # the newest version a child reported committed
    lost, kills, verified, unreported, lives = 0, 0, 0, 0, []
    problems: list[str] = []
    stalls, persists, save_intervals = [], [], []
    try:
        while committed < args.saves:
            life: dict[str, Any] = {"life": len(lives) + 1, "resumed_from": None, "saves": 0, "rss_bytes": [],
                                    "killed": False}
            lives.append(life)
            kill_after = rng.randint(max(1, args.kill_every // 2), args.kill_every * 3 // 2)
            proc, events = start_life(Path(__file__).resolve(), path, size_bytes, args.saves)
            last_event_at = None
            while True:
                event = events.get(timeout=600)
                if event is None:
                    break
                if event["event"] == "resumed":
                    life["resumed_from"] = event["version"]
                    verified += event["problem"] is None and event["version"] > 0
                    if event["version"] < committed:
                        lost += committed - event["version"]
                        problems.append(f"life {life['life']} resumed from {event['version']}, {committed} was committed")
                    if event["problem"]:
                        problems.append(f"life {life['life']}: resume check: {event['problem']}")
                    continue
                now = time.perf_counter()
                if last_event_at is not None:
                    save_intervals.append(now - last_event_at)
                last_event_at = now
                committed = max(committed, event["version"])
                life["saves"] += 1
                life["rss_bytes"].append(event["rss_bytes"])
                stalls.append(event["stall_s"])
                persists.append(event["persist_s"])
                if not life["killed"] and life["saves"] >= kill_after and committed < args.saves:
                    typical = statistics.median(save_intervals) if save_intervals else 1.0
                    time.sleep(rng.uniform(0.0, 1.5 * typical))  # anywhere in the next save, or between two
                    proc.send_signal(signal.SIGKILL)
                    life["killed"] = True
                    kills += 1
            # Versions committed just before the kill arrive before EOF.
            proc.wait()
            if not life["killed"] and proc.returncode != 0:
                problems.append(f"life {life['life']} exited with {proc.returncode}")
                break
            version, problem = verify(path, size_bytes)
            if problem is not None or version is None or version < committed:
                lost += committed - (version or 0)
                problems.append(f"after life {life['life']}: loaded {version}, committed {committed}: {problem}")
            else:
                verified += 1
                unreported += version > committed
                committed = version  # a save committed just before the kill, before it was reported
            print(f"life {life['life']}: {life['saves']} saves, {'killed' if life['killed'] else 'done'}, "
                  f"checkpoint at version {version}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall_s = time.perf_counter() - started

    def rss(life: dict) -> dict[str, Any]:
        values = life.pop("rss_bytes")
        return {**life, "rss_first_bytes": values[0] if values else None, "rss_last_bytes": values[-1] if values else None,
                "rss_max_bytes": max(values) if values else None}

    summary = {
        "schema": "ckptbench.soak/1",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "host": platform.node(), "python": platform.python_version(),
        "size_bytes": size_bytes, "saves_requested": args.saves, "kill_every": args.kill_every, "seed": args.seed,
        # versions whose handle.result() returned in the child; the newest version, counting the ones that
        # committed just before a kill, before the child could report them
        "saves_reported_committed": sum(life["saves"] for life in lives), "newest_version": committed,
        "committed_but_unreported_at_kill": unreported,
        "kills": kills, "restarts": len(lives) - 1, "verified_loads": verified,
        "lost_checkpoints": lost, "problems": problems,
        "stall_s": summarize(stalls), "persist_s": summarize(persists),
        "wall_s": wall_s,
        "lives": [rss(life) for life in lives],
        "units": {"*_bytes": "bytes", "*_s": "seconds"},
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if output is not None:
        output.write_text(text + "\n")
    return 0 if lost == 0 and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
