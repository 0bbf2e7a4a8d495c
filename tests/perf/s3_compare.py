#!/usr/bin/env python3
"""ckptbench.save to s3:// vs s3fs's default ``put_file`` of the same bytes, alternating, and the ratio.

Both sides upload SIZE bytes to the same S3 server: ckptbench saves a state_dict of one uint8 tensor
(shards of 256 MiB, multipart with its defaults: 16 MiB parts, max(threads, 8) in flight); s3fs
uploads a local file holding the same bytes (page-cached, so the read is nearly free) with its
default settings. Each side's time is wall clock around the call, objects deleted between rounds;
rounds alternate which side goes first. Goal: ckptbench >= 1.5x s3fs.

    eval "$(tests/servers/ceph.sh start /tmp/ceph)"   # or any S3 endpoint and credentials
    export CKPTBENCH_TEST_S3_ENDPOINT AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    python tests/perf/s3_compare.py --size 300MiB --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ckptbench.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # s3_buckets (not a package)
from s3_buckets import remove_bucket  # noqa: E402


def compare(endpoint: str, size: int, rounds: int) -> dict:
    import boto3
    import s3fs
    import torch

    import ckptbench

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"ckptbench-perf-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, client_kwargs={"region_name": "us-east-1"})
    data = torch.randint(0, 256, (size,), dtype=torch.uint8)
    options = {"endpoint_url": endpoint}
    samples: dict[str, list[float]] = {"ckptbench": [], "s3fs": []}

    def run_ckptbench() -> float:
        start = time.perf_counter()
        ckptbench.save({"data": data}, f"s3://{bucket}/ckpt", storage_options=options, overwrite=True)
        return time.perf_counter() - start

    with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as local:
        local.write(data.numpy().tobytes())
        local.flush()

        def run_s3fs() -> float:
            start = time.perf_counter()
            fs.put_file(local.name, f"{bucket}/s3fs/data.bin")
            return time.perf_counter() - start

        try:
            run_ckptbench()  # warm-up: the staging arena, connections
            for i in range(rounds):
                order = [("ckptbench", run_ckptbench), ("s3fs", run_s3fs)]
                for name, fn in order if i % 2 == 0 else order[::-1]:
                    samples[name].append(size / fn() / 1e9)
        finally:
            remove_bucket(client, bucket)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {"endpoint": endpoint, "bytes": size, "rounds": rounds, "samples_gbps": samples,
            "median_gbps": medians, "ratio_ckptbench_over_s3fs": medians["ckptbench"] / medians["s3fs"],
            "s3fs_version": s3fs.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", default=os.environ.get("CKPTBENCH_TEST_S3_ENDPOINT"))
    parser.add_argument("--size", default="300MiB")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.endpoint:
        parser.error("no endpoint: pass --endpoint or set CKPTBENCH_TEST_S3_ENDPOINT")
    doc = compare(args.endpoint, parse_size(args.size), args.rounds)
    print(json.dumps(doc, indent=2))
    print(f"upload: ckptbench {doc['median_gbps']['ckptbench'] * 1e3:.0f} MB/s, s3fs "
          f"{doc['median_gbps']['s3fs'] * 1e3:.0f} MB/s, ratio {doc['ratio_ckptbench_over_s3fs']:.2f}x (goal >= 1.5x)")


if __name__ == "__main__":
    main()
