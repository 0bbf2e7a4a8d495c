#!/usr/bin/env python3
"""``ckptbench bench s3://`` object throughput vs a plain multi-threaded boto3 upload, best vs best.

Both sides sweep the same grid (requests in flight x part size) for one object size against the
same server, one configuration after the other, alternating which side goes first per
configuration; each side's best median upload rate is compared (goal: ckptbench >= 0.9x boto3).

- ckptbench: ``bench.objects.run_object_bench`` (what ``ckptbench bench s3://...`` runs): the upload
  is timed until every object is complete;
- boto3: ``client.upload_fileobj`` with ``TransferConfig(multipart_chunksize=PART,
  max_concurrency=N)`` from an in-memory buffer of the same bytes, timed the same way.

    eval "$(tests/servers/ceph.sh start /tmp/ceph)"     # or any S3 endpoint and credentials
    export CKPTBENCH_TEST_S3_ENDPOINT AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    python tests/perf/s3_bench_compare.py --object-size 256MiB --concurrency 4,8,16 --part-size 8MiB,16MiB
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from ckptbench.bench.object_sweep import ObjectBenchSpec, run_object_bench
from ckptbench.storage.object_target import ObjectTarget
from ckptbench.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # s3_buckets (not a package)
from s3_buckets import remove_bucket  # noqa: E402


def boto3_upload(client, bucket: str, data: bytes, concurrency: int, part: int, rounds: int) -> list[float]:
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=concurrency,
                            use_threads=True)
    times = []
    for i in range(rounds):
        key = f"boto3/object-{i}"
        start = time.perf_counter()
        client.upload_fileobj(io.BytesIO(data), bucket, key, Config=config)
        times.append(time.perf_counter() - start)
        client.delete_object(Bucket=bucket, Key=key)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", default=os.environ.get("CKPTBENCH_TEST_S3_ENDPOINT"))
    ap.add_argument("--object-size", default="256MiB")
    ap.add_argument("--concurrency", default="4,8,16")
    ap.add_argument("--part-size", default="8MiB,16MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--save", type=Path, help="directory for s3-bench-compare.json")
    args = ap.parse_args()
    if not args.endpoint:
        print("give --endpoint or set CKPTBENCH_TEST_S3_ENDPOINT", file=sys.stderr)
        return 2
    import boto3

    obj = parse_size(args.object_size)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    parts = [parse_size(p) for p in args.part_size.split(",")]
    client = boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1")
    bucket = f"ckptbench-perf-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    data = os.urandom(obj)
    target = ObjectTarget(f"s3://{bucket}/ckptbench", {"endpoint_url": args.endpoint})
    rows = []
    try:
        for i, (conc, part) in enumerate((c, p) for c in concurrency for p in parts):
            spec = ObjectBenchSpec(size_bytes=obj, object_sizes=(obj,), concurrency=(conc,), part_sizes=(part,),
                                   read=False, repeat=args.rounds, warmup=1)

            def ours(spec: ObjectBenchSpec = spec) -> float:
                return run_object_bench(spec, target).results[0].write.gbps

            def theirs(conc: int = conc, part: int = part) -> float:
                times = boto3_upload(client, bucket, data, conc, part, args.rounds + 1)[1:]  # first: warm-up
                return obj / statistics.median(times) / 1e9

            sides = [("ckptbench", ours), ("boto3", theirs)]
            got = dict((name, fn()) for name, fn in (sides if i % 2 == 0 else sides[::-1]))
            rows.append({"concurrency": conc, "part_size": part, **{f"{k}_gbps": v for k, v in got.items()}})
            print(f"{conc:3d} in flight, {part / 2**20:.0f} MiB parts: ckptbench {got['ckptbench'] * 1e3:6.0f} MB/s  "
                  f"boto3 {got['boto3'] * 1e3:6.0f} MB/s", flush=True)
    finally:
        remove_bucket(client, bucket)
    best_ours = max(rows, key=lambda r: r["ckptbench_gbps"])
    best_theirs = max(rows, key=lambda r: r["boto3_gbps"])
    ratio = best_ours["ckptbench_gbps"] / best_theirs["boto3_gbps"]
    print(f"best ckptbench {best_ours['ckptbench_gbps'] * 1e3:.0f} MB/s ({best_ours['concurrency']} x "
          f"{best_ours['part_size'] / 2**20:.0f} MiB), best boto3 {best_theirs['boto3_gbps'] * 1e3:.0f} MB/s "
          f"({best_theirs['concurrency']} x {best_theirs['part_size'] / 2**20:.0f} MiB): ratio {ratio:.2f}x "
          f"(goal >= 0.90x)")
    if args.save:
        from ckptbench.bench.environment import collect_environment

        args.save.mkdir(parents=True, exist_ok=True)
        doc = {"benchmark": "s3-bench-vs-boto3", "command": " ".join(sys.argv), "endpoint": args.endpoint,
               "object_size": obj, "rounds": args.rounds, "rows": rows, "ratio_best_vs_best": ratio,
               "environment": collect_environment()}
        (args.save / "s3-bench-compare.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
