#!/usr/bin/env python3
"""ckptbench.save/load on s3:// against the anchors, in interleaved rounds, and under throttling.

Per round, each side in turn (the order rotates every round):

- ``ckptbench``: ``ckptbench.save`` / ``ckptbench.load`` of the state_dict (``--client`` picks the S3 client);
- ``s3torchconnector``: ``dcp.save`` / ``dcp.load`` with s3torchconnector's ``S3StorageWriter(thread_count=4)``
  / ``S3StorageReader`` (the AWS CRT through Mountpoint's client). Its writer always uploads multipart
  (its stream's length is unknown), and the CRT takes the object's ETag from the
  CompleteMultipartUploadResult body: Ceph RGW 16 answers ``<ETag></ETag>`` (empty), so the save fails
  with 'Header "ETag" not found'. Then the table says so and its load is timed on the same checkpoint
  written by DCP's ``FsspecWriter``; with ``--fill-etag`` every side goes through
  ``tests/servers/faultproxy.py`` filling that empty ETag with a placeholder, and its save completes;
- ``s3fs put_file``: s3fs's default ``put_file`` of a local file (in /dev/shm) holding the same bytes.

With ``--fill-etag`` the relay runs in a process of its own (``--relay-in-process``: in this one, as
before, where its threads share this process's interpreter lock with ckptbench's threads but not with
the CRT's native ones).

A/B of two ckptbench versions: ``--baseline DIR`` times the ``ckptbench.save`` of the package in DIR
(say main's: ``git archive main ckptbench | tar -x -C DIR``, plus the built ``_native`` module copied
into ``DIR/ckptbench``) next to this one's, each in a worker process of its own, in alternating order;
``--ours-only`` leaves the anchor, s3fs and the loads out.

Times are wall clock around each call; loads read into fresh memory and are verified. With
``--slowdown F`` a ckptbench save through ``tests/servers/faultproxy.py`` answering a fraction F of the
data path's requests (part uploads, their start and completion) with 503 SlowDown is timed in every
round too, next to a clean one through the same proxy: the goal is >= 0.5x the clean rate.

    eval "$(tests/servers/ceph.sh start /tmp/ceph)"
    export CKPTBENCH_TEST_S3_ENDPOINT AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    python tests/perf/s3_anchor.py --size 384MiB --rounds 3 [--client crt] [--slowdown 0.2] [--json out.json]
    python tests/perf/s3_anchor.py --size 384MiB --rounds 5 --fill-etag --ours-only --baseline /tmp/main-pkg
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from ckptbench.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # s3_buckets, faultproxy (not packages)
from s3_buckets import remove_bucket  # noqa: E402

MiB = 2**20


def _faultproxy() -> Any:
    import faultproxy  # tests/servers, on the path above

    return faultproxy


RELAY = r"""
import sys
sys.path.insert(0, sys.argv[2])
import faultproxy
proxy = faultproxy.FaultProxy(sys.argv[1], fill_etag=True).start()
print(proxy.endpoint, flush=True)
sys.stdin.read()
print(proxy.etags_filled, flush=True)
proxy.stop()
"""

WORKER = r"""
import sys, time, warnings
sys.path.append(sys.argv[1])
warnings.filterwarnings("ignore")
import ckptbench
from s3_anchor import make_state
endpoint, url, size = sys.argv[2:5]
options = {"endpoint_url": endpoint, **dict(kv.split("=", 1) for kv in sys.argv[5:])}
state = make_state(int(size))
ckptbench.save(state, url, storage_options=options, overwrite=True)  # warm-up: arena, connections
print("ready", ckptbench.__file__, flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    ckptbench.save(state, url, storage_options=options, overwrite=True)
    print(time.perf_counter() - start, flush=True)
"""


class Relay:
    """The ETag-filling relay (``tests/servers/faultproxy.py``) in a process of its own."""

    def __init__(self, upstream: str) -> None:
        servers = str(Path(__file__).resolve().parents[1] / "servers")
        self.proc = subprocess.Popen([sys.executable, "-c", RELAY, upstream, servers], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.endpoint = self.proc.stdout.readline().strip()
        self.etags_filled = 0
        if not self.endpoint.startswith("http"):
            raise RuntimeError("the ETag-filling relay did not start")

    def stop(self) -> None:
        self.proc.stdin.close()
        self.etags_filled = int(self.proc.stdout.readline() or 0)
        self.proc.wait(timeout=30)


class SaveWorker:
    """A process saving the state_dict with the ckptbench found first on ``package_dir`` (None: the
    installed one), one save per ``save()``; it reports the save's seconds."""

    def __init__(self, package_dir: str | None, endpoint: str, url: str, size: int, options: dict[str, str]) -> None:
        env = dict(os.environ)
        if package_dir:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_dir, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-P", "-c", WORKER, str(Path(__file__).resolve().parent),
                                      endpoint, url, str(size), *(f"{k}={v}" for k, v in options.items())],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        ready = self.proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError(f"the save worker for {package_dir or 'the installed ckptbench'} did not start")
        self.package = ready[1]

    def save(self) -> None:
        self.proc.stdin.write("save\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("the save worker ended")

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def make_state(size: int) -> dict:
    """``size`` bytes over 24 tensors of mixed dtypes (random bits: nothing compresses)."""
    import torch

    per = size // 24
    g = torch.Generator().manual_seed(0)
    dtypes = (torch.bfloat16, torch.float32)
    return {f"layer{i}.w": torch.randint(0, 256, (per,), dtype=torch.uint8, generator=g).view(dtypes[i % 2])
            for i in range(24)}


def same(a: dict, b: dict) -> bool:
    import torch

    return set(a) == set(b) and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


def run(args: argparse.Namespace) -> dict:
    import boto3
    import s3fs
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    import ckptbench
    from ckptbench.bench.writers import S3TorchConnectorContender

    warnings.filterwarnings("ignore")
    endpoint, size = args.endpoint, parse_size(args.size)
    filler = None
    if args.fill_etag:  # every side through the same relay: the anchor's save needs the ETag RGW leaves empty
        filler = _faultproxy().FaultProxy(endpoint, fill_etag=True).start() if args.relay_in_process \
            else Relay(endpoint)
        endpoint = filler.endpoint
    load_before = os.getloadavg()
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"ckptbench-perf-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    given = {**({"client": args.client} if args.client else {}), **dict(kv.split("=", 1) for kv in args.option)}
    options = {"endpoint_url": endpoint, **given}
    state = make_state(size)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, client_kwargs={"region_name": "us-east-1"})
    anchor = S3TorchConnectorContender(None)
    anchor.prepare(state)
    samples: dict[str, list[float | None]] = {}
    notes: list[str] = []
    workers: list[SaveWorker] = []

    def timed(name: str, fn: Any, check: Any = None) -> None:
        """Time ``fn``; then (untimed) ``check`` what it stored."""
        start = time.perf_counter()
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - a side that fails is reported (DCP raises BaseExceptions)
            if isinstance(exc, KeyboardInterrupt):
                raise
            note = f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            if note not in notes:
                notes.append(note)
            samples.setdefault(name, []).append(None)
            return
        samples.setdefault(name, []).append(time.perf_counter() - start)
        if check is not None:
            check()

    def ck_load() -> None:
        assert same(state, ckptbench.load(f"s3://{bucket}/ck", storage_options=options))

    def anchor_save() -> None:
        anchor._save(state, f"s3://{bucket}/anchor")

    def anchor_load() -> None:
        location = f"s3://{bucket}/anchor" if samples["s3torchconnector save"][-1] is not None \
            else f"s3://{bucket}/fsspec"
        assert same(state, anchor._load(location))

    proxy = None
    if args.slowdown:
        faultproxy = _faultproxy()
        proxy = faultproxy.FaultProxy(endpoint).start()
        through = {**options, "endpoint_url": proxy.endpoint}

        def throttled() -> None:
            import random

            chance = random.Random(len(samples.get("ckptbench save, throttled", [])))

            class Sometimes(faultproxy.Rule):
                def matches(self, request: Any) -> bool:
                    return super().matches(request) and chance.random() < args.slowdown

            for kind in ("UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload"):
                proxy.add(Sometimes("status", None, kind=kind, status=503))
            try:
                ckptbench.save(state, f"s3://{bucket}/throttled", storage_options=through, overwrite=True)
            finally:
                proxy.clear()

        def throttled_check() -> None:
            uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
            assert not uploads, f"{len(uploads)} multipart uploads left open"
            assert same(state, ckptbench.load(f"s3://{bucket}/throttled", storage_options=options))

    with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as local:
        for tensor in state.values():
            local.write(tensor.view(torch.uint8).numpy().tobytes())
        local.flush()
        sides = [
            ("ckptbench save", lambda: ckptbench.save(state, f"s3://{bucket}/ck", storage_options=options,
                                                      overwrite=True)),
            ("s3torchconnector save", anchor_save),
            ("s3fs put_file", lambda: fs.put_file(local.name, f"{bucket}/s3fs/data.bin")),
        ]
        loads = [("ckptbench load", ck_load), ("s3torchconnector load", anchor_load)]
        if args.ours_only or args.saves_only:
            sides, loads = sides[:1 if args.ours_only else 2], []
        if args.baseline:  # both versions in worker processes of their own
            baseline = None if args.baseline == "installed" else args.baseline
            for package, prefix, extra in ((baseline, "baseline", args.baseline_option), (None, "ck", args.option)):
                workers.append(SaveWorker(package, endpoint, f"s3://{bucket}/{prefix}", size,
                                          {**({"client": args.client} if args.client else {}),
                                           **dict(kv.split("=", 1) for kv in extra)}))
            notes.append(f"baseline: {workers[0].package}; this one: {workers[1].package}")
            sides[0] = ("ckptbench save", workers[1].save)
            sides.insert(1, ("ckptbench save (baseline)", workers[0].save))
        if proxy is not None:
            sides += [("ckptbench save, through the proxy", lambda: ckptbench.save(
                          state, f"s3://{bucket}/clean", storage_options=through, overwrite=True)),
                      ("ckptbench save, throttled", throttled, throttled_check)]
        try:
            if not workers:
                ckptbench.save(state, f"s3://{bucket}/ck", storage_options=options,  # warm-up: arena, connections
                               overwrite=True)
            if loads:
                dcp.save(state, storage_writer=FsspecWriter(f"s3://{bucket}/fsspec", thread_count=4,
                                                            endpoint_url=endpoint), no_dist=True)
            for i in range(args.rounds):
                k = i % len(sides)
                for name, fn, *check in sides[k:] + sides[:k]:
                    timed(name, fn, *check)
                for name, fn in loads[i % 2:] + loads[:i % 2]:
                    timed(name, fn)
                print(f"round {i + 1}: " + ", ".join(
                    f"{name} {nbytes / s[-1] / 1e6:.0f} MB/s" if s[-1] else f"{name} failed"
                    for name, s in samples.items()), flush=True)
        finally:
            for worker in workers:
                worker.stop()
            if proxy is not None:
                proxy.stop()
            load_after = os.getloadavg()
            remove_bucket(client, bucket)
            if filler is not None:
                filler.stop()
                notes.append(f"every side went through the ETag-filling relay ({filler.etags_filled} ETags filled)")

    def rate(name: str) -> list[float | None]:
        return [nbytes / s / 1e6 if s else None for s in samples[name]]

    def ratios(a: str, b: str) -> list[float | None]:
        return [x / y if x and y else None for x, y in zip(rate(a), rate(b), strict=True)]

    medians = {name: statistics.median([r for r in rate(name) if r] or [0.0]) for name in samples}
    pairs = [("ckptbench save", "s3torchconnector save"), ("ckptbench load", "s3torchconnector load"),
             ("ckptbench save", "s3fs put_file"), ("ckptbench save", "ckptbench save (baseline)")]
    pairs = [(a, b) for a, b in pairs if a in samples and b in samples]
    if proxy is not None:
        pairs.append(("ckptbench save, throttled", "ckptbench save, through the proxy"))
    return {"bytes": nbytes, "client": args.client or "default", "rounds": args.rounds, "notes": notes,
            "options": args.option, "baseline": args.baseline, "baseline_options": args.baseline_option,
            "fill_etag": bool(args.fill_etag), "relay_in_process": bool(args.relay_in_process), "load_average_before_after": [load_before[0], load_after[0]],
            "mb_per_s": {name: rate(name) for name in samples}, "median_mb_per_s": medians,
            "ratios": {f"{a} / {b}": ratios(a, b) for a, b in pairs}}


def s3_parser(description: str | None) -> argparse.ArgumentParser:
    """The options every S3 comparison script here takes: the endpoint, the state_dict's size, rounds, client."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", default=os.environ.get("CKPTBENCH_TEST_S3_ENDPOINT"))
    parser.add_argument("--size", default="384MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client", default=None, help="ckptbench's S3 client (boto3, s3fs, crt)")
    return parser


def main() -> None:
    parser = s3_parser(__doc__)
    parser.add_argument("--slowdown", type=float, default=0.0, help="also time a save with this fraction throttled")
    parser.add_argument("--fill-etag", action="store_true",
                        help="every side through a relay that fills the empty ETag RGW 16 answers a multipart "
                             "completion with (s3torchconnector's save needs it)")
    parser.add_argument("--relay-in-process", action="store_true",
                        help="with --fill-etag: the relay in this process (as before), not in one of its own")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="time the ckptbench.save of the package in DIR too (A/B; see above); 'installed': "
                             "the installed one (an A/B of --option against --baseline-option)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a storage option of this ckptbench's saves (max_concurrency=16, part_size=32MiB)")
    parser.add_argument("--baseline-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a storage option of the baseline's saves")
    parser.add_argument("--ours-only", action="store_true",
                        help="only ckptbench's saves (with --baseline: the A/B), no anchor, s3fs or loads")
    parser.add_argument("--saves-only", action="store_true",
                        help="only the two saves, ckptbench's and the anchor's (no s3fs, no loads)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not args.endpoint:
        parser.error("--endpoint (or CKPTBENCH_TEST_S3_ENDPOINT) is required")
    result = run(args)
    for name, median in result["median_mb_per_s"].items():
        print(f"{name:36s} median {median:7.1f} MB/s  rounds {[round(r) if r else None for r in result['mb_per_s'][name]]}")
    for pair, values in result["ratios"].items():
        print(f"{pair:60s} {[round(v, 2) if v else None for v in values]}")
    print(f"load average (1 min) before/after: {result['load_average_before_after']}")
    for note in result["notes"]:
        print("note:", note)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
