#!/usr/bin/env python3
"""Where the wall time of one save to S3 goes: a timeline of its HTTP requests, its phases and the CPU.

For each save (``ckptbench.save`` and the anchor, ``dcp.save`` with s3torchconnector's
``S3StorageWriter(thread_count=4)``), in alternating rounds:

- every HTTP request, as the relay in front of the server saw it (``tests/servers/faultproxy.py``, which
  also fills the empty ETag Ceph RGW 16 answers a multipart completion with, so the anchor's save
  completes; it runs in a process of its own): its S3 operation, start, end and body bytes; with ``--direct`` ckptbench's requests go
  straight to the server and are timed by botocore's events instead (the anchor still needs the relay);
- ckptbench's phases (location check, plan, lock, staging, shard uploads, commit, sweeps, release),
  from wrappers around the functions the saver calls;
- the host's CPU, from ``/proc/stat`` sampled every 10 ms by a separate process, and the CPU time of
  this process, radosgw and ceph-osd over the save.

From these it reports, per save: the wall time; the time spent with 0, 1, ... data requests (part
uploads and object PUTs above 1 MiB) in flight; the serial stretches (no data request in flight) and
what ran in them; the host's idle CPU, over the save and during the serial stretches; and the
latency of a 0-byte PUT on this endpoint (the fixed cost of one round trip).

    eval "$(tests/servers/ceph.sh start /tmp/ceph)"
    export CKPTBENCH_TEST_S3_ENDPOINT AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    python tests/perf/s3_timeline.py --size 384MiB --rounds 3 --ceph-dir /tmp/ceph [--json out.json] [--verbose]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from ckptbench.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # s3_buckets, faultproxy (not packages)
from s3_anchor import make_state, s3_parser  # noqa: E402
from s3_buckets import remove_bucket  # noqa: E402

DATA_BYTES = 2**20  # requests with a larger body count as data requests
CLK_TCK = os.sysconf("SC_CLK_TCK")

SAMPLER = r"""
import os, sys, time
pids = [int(p) for p in sys.argv[2:]]
out = open(sys.argv[1], "w", buffering=1)
def proc(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0
while True:
    with open("/proc/stat") as f:
        cpu = f.readline().split()[1:]
    busy = sum(map(int, cpu)) - int(cpu[3]) - int(cpu[4])
    out.write(f"{time.monotonic():.4f} {busy} {sum(map(int, cpu))} {' '.join(str(proc(p)) for p in pids)}\n")
    time.sleep(0.01)
"""


def server_pids(ceph_dir: str | None) -> dict[str, int]:
    """radosgw's and ceph-osd's pids, from the pid files of ``tests/servers/ceph.sh``'s cluster in
    ``ceph_dir`` (other clusters may run on the machine: their daemons are not this endpoint's)."""
    pids = {}
    for name, file in (("radosgw", "rgw.pid"), ("ceph-osd", "osd.pid")):
        with contextlib.suppress(OSError, ValueError):
            pids[name] = int(Path(ceph_dir or "", "run", file).read_text())
    return pids if ceph_dir else {}


class CpuSampler:
    """A separate process writing the host's busy/total ticks (and per-process ticks) every 10 ms."""

    def __init__(self, path: Path, pids: dict[str, int]) -> None:
        self.path, self.names = path, list(pids)
        self.proc = subprocess.Popen([sys.executable, "-c", SAMPLER, str(path), *map(str, pids.values())])

    def stop(self) -> list[list[float]]:
        self.proc.terminate()
        self.proc.wait()
        rows = []
        for line in self.path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rows.append([float(x) for x in line.split()])
        return rows


def cpu_between(rows: list[list[float]], start: float, end: float, ncpu: int) -> dict[str, float]:
    """Host busy seconds, idle seconds (of ``ncpu`` CPUs) and per-process seconds over [start, end]."""
    inside = [r for r in rows if start <= r[0] <= end]
    before = [r for r in rows if r[0] < start]
    after = [r for r in rows if r[0] > end]
    first = before[-1] if before else (inside[0] if inside else None)
    last = after[0] if after else (inside[-1] if inside else None)
    if first is None or last is None or last[0] <= first[0]:
        return {}
    span = last[0] - first[0]
    busy = (last[1] - first[1]) / CLK_TCK
    result = {"span_s": span, "busy_s": busy, "idle_s": max(0.0, span * ncpu - busy),
              "idle_fraction": max(0.0, 1 - busy / (span * ncpu))}
    for i in range(3, len(last)):
        result[f"proc{i - 3}_s"] = (last[i] - first[i]) / CLK_TCK
    return result


class Recorder:
    """Requests and phases with monotonic times (the sampler's clock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []

    def request(self, **fields: Any) -> None:
        with self.lock:
            self.requests.append(fields)

    def phase(self, name: str, start: float, end: float) -> None:
        with self.lock:
            self.phases.append({"name": name, "start": start, "end": end,
                                "thread": threading.current_thread().name})

    def clear(self) -> None:
        with self.lock:
            self.requests, self.phases = [], []


RELAY = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[3])
import faultproxy
records = []
original = faultproxy.FaultProxy._handle
def handle(self, connection, client, head, request, rule):
    try:
        return original(self, connection, client, head, request, rule)
    finally:
        length = head.headers.get("content-length")
        records.append({"op": request.kind, "start": request.started, "end": time.monotonic(),
                        "bytes": int(length) if length and length.isdigit() else 0, "via": "relay"})
faultproxy.FaultProxy._handle = handle
proxy = faultproxy.FaultProxy(sys.argv[1], fill_etag=True).start()
print(proxy.endpoint, flush=True)
sys.stdin.read()
proxy.stop()
with open(sys.argv[2], "w") as f:
    json.dump(records, f)
"""


class Relay:
    """The ETag-filling relay (``tests/servers/faultproxy.py``) in a process of its own, recording every
    request it passes (operation, body bytes, start and end on the monotonic clock)."""

    def __init__(self, upstream: str) -> None:
        self.path = Path(f"/tmp/s3-timeline-{os.getpid()}.relay.json")
        servers = str(Path(__file__).resolve().parents[1] / "servers")
        self.proc = subprocess.Popen([sys.executable, "-c", RELAY, upstream, str(self.path), servers],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("http"):
            raise RuntimeError("the relay did not start")

    def stop(self) -> list[dict[str, Any]]:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        records = json.loads(self.path.read_text())
        self.path.unlink()
        return records


def record_botocore(client: Any, recorder: Recorder) -> None:
    """botocore's events on ``client``: each operation's start (before-call) and end (after-call)."""
    local = threading.local()

    def before(model: Any = None, params: Any = None, **_: Any) -> None:
        local.start = time.monotonic()
        body = (params or {}).get("body")
        local.bytes = len(body) if body is not None and hasattr(body, "__len__") else 0

    def after(model: Any = None, **_: Any) -> None:
        recorder.request(op=model.name, start=getattr(local, "start", time.monotonic()), end=time.monotonic(),
                         bytes=getattr(local, "bytes", 0), via="botocore")

    client.meta.events.register("before-call.s3", before)
    client.meta.events.register("after-call.s3", after)


def record_phases(recorder: Recorder) -> None:
    """Wrap what the saver calls, so each call is a phase of the timeline."""
    from ckptbench.checkpoint import lock as lock_module
    from ckptbench.checkpoint import saver
    from ckptbench.storage import s3

    def timed(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                recorder.phase(name, start, time.monotonic())
        return wrapper

    for name in ("acquire_save_lock", "stage", "commit", "remove_stale"):
        setattr(saver, name, timed(name, getattr(saver, name)))
    saver.PlanCache.plan = timed("plan", saver.PlanCache.plan)
    for name in ("write_files", "prepare", "size", "remove", "list", "abort_incomplete_uploads"):
        setattr(s3.S3Store, name, timed(f"store.{name}", getattr(s3.S3Store, name)))
    lease = lock_module._Lease
    lease._release = timed("lock.release", lease._release)
    lease._verify = timed("lock.verify", lease._verify)


def in_flight_profile(requests: list[dict[str, Any]], start: float, end: float) -> dict[int, float]:
    """Seconds of [start, end] with k data requests in flight, for each k."""
    events = []
    for r in requests:
        if r["bytes"] > DATA_BYTES:
            events += [(max(start, r["start"]), 1), (min(end, r["end"]), -1)]
    events.sort()
    profile: dict[int, float] = {}
    level, t = 0, start
    for when, delta in events:
        profile[level] = profile.get(level, 0.0) + max(0.0, when - t)
        level, t = level + delta, max(t, when)
    profile[level] = profile.get(level, 0.0) + max(0.0, end - t)
    return {k: v for k, v in sorted(profile.items()) if v > 0}


def idle_by_in_flight(requests: list[dict[str, Any]], cpu: list[list[float]], start: float, end: float,
                      ncpu: int) -> dict[int, float]:
    """Idle CPU seconds of the host over [start, end], by the data requests in flight when they were idle
    (per sampling interval, the level at its middle)."""
    spans = [(r["start"], r["end"]) for r in requests if r["bytes"] > DATA_BYTES]
    idle: dict[int, float] = {}
    for a, b in zip(cpu, cpu[1:], strict=False):
        if a[0] < start or b[0] > end or b[0] <= a[0]:
            continue
        middle = (a[0] + b[0]) / 2
        level = sum(1 for s, e in spans if s <= middle < e)
        idle[level] = idle.get(level, 0.0) + max(0.0, (b[0] - a[0]) * ncpu - (b[1] - a[1]) / CLK_TCK)
    return {k: round(v, 3) for k, v in sorted(idle.items())}


def serial_stretches(requests: list[dict[str, Any]], start: float, end: float) -> list[tuple[float, float]]:
    """The intervals of [start, end] with no data request in flight."""
    busy = sorted((r["start"], r["end"]) for r in requests if r["bytes"] > DATA_BYTES)
    gaps, t = [], start
    for s, e in busy:
        if s > t:
            gaps.append((t, min(s, end)))
        t = max(t, e)
    if t < end:
        gaps.append((t, end))
    return [(s, e) for s, e in gaps if e > s]


def analyse(name: str, start: float, end: float, requests: list[dict[str, Any]], phases: list[dict[str, Any]],
            cpu: list[list[float]], ncpu: int, procs: list[str]) -> dict[str, Any]:
    mine = [r for r in requests if r["start"] >= start - 0.001 and r["end"] <= end + 0.001]
    gaps = serial_stretches(mine, start, end)
    cpu_all = cpu_between(cpu, start, end, ncpu)
    stretches = []
    for s, e in gaps:
        during = sorted({p["name"] for p in phases if p["start"] < e and p["end"] > s})
        small = [r["op"] for r in mine if r["start"] < e and r["end"] > s]
        stretches.append({"from_s": round(s - start, 4), "seconds": round(e - s, 4), "phases": during,
                          "requests": small})
    serial_idle = sum(cpu_between(cpu, s, e, ncpu).get("idle_s", 0.0) for s, e in gaps if e - s >= 0.02)
    data = [r for r in mine if r["bytes"] > DATA_BYTES]
    first_data = min((r["start"] for r in data), default=end)
    last_data = max((r["end"] for r in data), default=end)
    return {
        "side": name, "wall_s": end - start, "requests": len(mine), "data_requests": len(data),
        "first_data_at_s": first_data - start, "after_last_data_s": end - last_data,
        "in_flight_s": {str(k): round(v, 4) for k, v in in_flight_profile(mine, start, end).items()},
        "serial_s": sum(e - s for s, e in gaps), "serial_stretches": stretches,
        "cpu": {**{k: v for k, v in cpu_all.items() if not k.startswith("proc")},
                **{f"{procs[int(k[4:-2])]}_s": v for k, v in cpu_all.items() if k.startswith("proc")}},
        "idle_cpu_in_serial_s": serial_idle,
        "idle_cpu_by_in_flight_s": {str(k): v for k, v in idle_by_in_flight(mine, cpu, start, end, ncpu).items()},
        "phases": [{"name": p["name"], "from_s": round(p["start"] - start, 4),
                    "seconds": round(p["end"] - p["start"], 4)} for p in sorted(phases, key=lambda p: p["start"])
                   if start <= p["start"] <= end],
        "timeline": [{"op": r["op"], "from_s": round(r["start"] - start, 4), "seconds": round(r["end"] - r["start"], 4),
                      "bytes": r["bytes"]} for r in sorted(mine, key=lambda r: r["start"])],
    }


def zero_put_latency(client: Any, bucket: str, n: int = 20) -> dict[str, float]:
    """Median and p90 seconds of a 0-byte PutObject (and of a HeadObject) on ``client``."""
    puts, heads = [], []
    for i in range(n):
        t = time.perf_counter()
        client.put_object(Bucket=bucket, Key=f"latency/{i}", Body=b"")
        puts.append(time.perf_counter() - t)
        t = time.perf_counter()
        client.head_object(Bucket=bucket, Key=f"latency/{i}")
        heads.append(time.perf_counter() - t)
    q = statistics.quantiles
    return {"put0_median_s": statistics.median(puts), "put0_p90_s": q(puts, n=10)[-1],
            "head_median_s": statistics.median(heads), "head_p90_s": q(heads, n=10)[-1]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import boto3

    import ckptbench
    from ckptbench.bench.writers import S3TorchConnectorContender
    from ckptbench.storage.store import open_store

    warnings.filterwarnings("ignore")
    recorder = Recorder()
    record_phases(recorder)
    relay = Relay(args.endpoint)
    ours_endpoint = args.endpoint if args.direct else relay.endpoint
    os.environ["AWS_ENDPOINT_URL"] = relay.endpoint  # the anchor's endpoint
    direct_client = boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1")
    bucket = f"ckptbench-timeline-{uuid.uuid4().hex[:8]}"
    direct_client.create_bucket(Bucket=bucket)
    options = {"endpoint_url": ours_endpoint, **({"client": args.client} if args.client else {}),
               **dict(kv.split("=", 1) for kv in args.option)}
    state = make_state(parse_size(args.size))
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    anchor = S3TorchConnectorContender(None)
    anchor.prepare(state)
    store = open_store(f"s3://{bucket}/ck", options)
    if args.direct:
        record_botocore(store._data, recorder)
        record_botocore(store._control, recorder)
    pids = {"client": os.getpid(), "relay": relay.proc.pid, **server_pids(args.ceph_dir)}
    sampler = CpuSampler(Path(f"/tmp/s3-timeline-{os.getpid()}.cpu"), pids)
    ncpu = os.cpu_count() or 1
    marks: list[tuple[str, float, float]] = []
    load_before = os.getloadavg()
    try:
        latency = {"direct": zero_put_latency(direct_client, bucket),
                   "relay": zero_put_latency(boto3.client("s3", endpoint_url=relay.endpoint,
                                                          region_name="us-east-1"), bucket)}
        ckptbench.save(state, f"s3://{bucket}/ck", storage_options=options)  # warm-up: arena, connections
        anchor._save(state, f"s3://{bucket}/anchor")
        sides = [("ckptbench", lambda: ckptbench.save(state, f"s3://{bucket}/ck", storage_options=options,
                                                      overwrite=True)),
                 ("s3torchconnector", lambda: anchor._save(state, f"s3://{bucket}/anchor"))]
        if args.anchor_only or args.ours_only:
            sides = sides[1:] if args.anchor_only else sides[:1]
        recorder.clear()
        since = time.monotonic()
        for i in range(args.rounds):
            for name, fn in sides[i % len(sides):] + sides[:i % len(sides)]:
                time.sleep(0.3)  # the previous save's garbage settles; the CPU samples separate
                start = time.monotonic()
                fn()
                marks.append((name, start, time.monotonic()))
            print(f"round {i + 1}: " + ", ".join(f"{n} {nbytes / (e - s) / 1e6:.0f} MB/s"
                                                 for n, s, e in marks[-len(sides):]), flush=True)
        time.sleep(0.1)
    finally:
        cpu = sampler.stop()
        recorder.requests += relay.stop()
        remove_bucket(direct_client, bucket)
    load_after = os.getloadavg()
    recorder.requests = [r for r in recorder.requests if r["start"] >= since]
    saves = [analyse(name, s, e, recorder.requests, recorder.phases, cpu, ncpu, list(pids)) for name, s, e in marks]
    return {"bytes": nbytes, "rounds": args.rounds, "ours_direct": args.direct, "latency": latency,
            "load_average_before_after": [load_before[0], load_after[0]], "cpus": ncpu, "saves": saves}


def summary(result: dict[str, Any], verbose: bool) -> None:
    lat = result["latency"]
    print(f"0-byte PUT: direct median {lat['direct']['put0_median_s'] * 1e3:.1f} ms "
          f"(p90 {lat['direct']['put0_p90_s'] * 1e3:.1f}), through the relay {lat['relay']['put0_median_s'] * 1e3:.1f} ms; "
          f"HEAD direct {lat['direct']['head_median_s'] * 1e3:.1f} ms")
    for save in result["saves"]:
        cpu = save["cpu"]
        procs = ", ".join(f"{k[:-2]} {v:.2f}" for k, v in cpu.items() if k.endswith("_s") and k not in
                          ("span_s", "busy_s", "idle_s"))
        print(f"\n{save['side']}: {save['wall_s']:.3f} s, {save['requests']} requests ({save['data_requests']} data), "
              f"first data request at {save['first_data_at_s'] * 1e3:.0f} ms, {save['after_last_data_s'] * 1e3:.0f} ms "
              f"after the last; no data request in flight {save['serial_s'] * 1e3:.0f} ms")
        print(f"  in flight (s): {save['in_flight_s']}")
        print(f"  CPU: busy {cpu.get('busy_s', 0):.2f} s, idle {cpu.get('idle_s', 0):.2f} s of {result['cpus']} CPUs "
              f"({cpu.get('idle_fraction', 0):.0%}); {procs}; idle during serial stretches "
              f"{save['idle_cpu_in_serial_s']:.2f} s")
        print(f"  idle CPU (s) by data requests in flight: {save['idle_cpu_by_in_flight_s']}")
        for stretch in save["serial_stretches"]:
            if stretch["seconds"] >= 0.005:
                print(f"  serial at {stretch['from_s'] * 1e3:6.0f} ms for {stretch['seconds'] * 1e3:5.0f} ms: "
                      f"{', '.join(stretch['phases']) or '-'} | {', '.join(stretch['requests']) or '-'}")
        if verbose:
            for p in save["phases"]:
                print(f"    phase {p['name']:28s} at {p['from_s'] * 1e3:7.1f} ms for {p['seconds'] * 1e3:7.1f} ms")
            for r in save["timeline"]:
                print(f"    {r['op']:28s} at {r['from_s'] * 1e3:7.1f} ms for {r['seconds'] * 1e3:7.1f} ms "
                      f"{r['bytes']:>10d} B")


def main() -> None:
    parser = s3_parser(__doc__)
    parser.add_argument("--direct", action="store_true",
                        help="ckptbench's requests straight to the server (timed by botocore), not through the relay")
    parser.add_argument("--ceph-dir", default=None,
                        help="the cluster's directory (tests/servers/ceph.sh start DIR): radosgw's and ceph-osd's "
                             "CPU time is reported from their pid files there")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a storage option of ckptbench's saves (max_concurrency=16, part_size=32MiB)")
    parser.add_argument("--anchor-only", action="store_true", help="time only the anchor's saves")
    parser.add_argument("--ours-only", action="store_true", help="time only ckptbench's saves")
    parser.add_argument("--verbose", action="store_true", help="every phase and request of every save")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not args.endpoint:
        parser.error("--endpoint (or CKPTBENCH_TEST_S3_ENDPOINT) is required")
    result = run(args)
    summary(result, args.verbose)
    print(f"\nload average (1 min) before/after: {result['load_average_before_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
