#!/usr/bin/env python3
"""S3 write throughput over a (possibly emulated) link: ckptbench.save vs a plain boto3 multipart upload.

Both sides upload the same bytes (a state_dict of TENSORS float32 tensors, SIZE in all) to one S3
endpoint, alternating which goes first each round, after one warm-up each. ckptbench: ``ckptbench.save``
to ``s3://BUCKET/ckpt`` with its defaults (16 MiB parts, max(threads, 8) in flight). boto3: one object
with ``upload_fileobj`` and a TransferConfig of the same part size and concurrency. MB/s = payload bytes
(the tensors; 1 MB = 1e6 B) / wall clock around the call. With ``--iface`` (the client's side of the
link), the bytes that interface sent in the same time are reported too (``iface_tx_MBps``): proof that the
traffic took the link. The kernel counts TSO super-packets with one set of headers, so it is close to the
payload, not the on-wire bytes; tbf itself charges every segment's headers.

``--link-rate`` (tc units: 1gbit) is what the link was shaped to; ``--expect-near-link F`` exits 1
unless F x link < the ckptbench median < link (both in payload bytes/s). Use tests/perf/s3_link.sh to set
up the link (tests/servers/netns.sh) and Ceph (tests/servers/ceph.sh) and run this inside it:

    ip netns exec NAME-cli python tests/perf/s3_link.py --endpoint-url http://10.213.0.2:7480 \\
        --link-rate 1gbit --iface veth-cli --expect-near-link 0.72
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import sys
import time
import uuid
from pathlib import Path

from ckptbench.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))  # s3_buckets (not a package)
from s3_buckets import remove_bucket  # noqa: E402

MIB = 2**20


def rate_bits(rate: str | None) -> float | None:
    """tc-style rate ("1gbit", "500mbit") -> bits/s; None for no/unknown shaping ("none")."""
    if not rate or rate == "none":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)bit", rate.lower())
    if not match:
        raise ValueError(f"link rate {rate!r}: use tc units such as 500mbit, 1gbit, 10gbit, or none")
    return float(match[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[match[2]]


def tx_bytes(iface: str | None) -> int | None:
    if not iface:
        return None
    return int(Path(f"/sys/class/net/{iface}/statistics/tx_bytes").read_text())


def measure(endpoint: str, key: str, secret: str, size: int, tensors: int, rounds: int, iface: str | None,
            part_size: int, concurrency: int) -> dict:
    import boto3
    import torch
    from boto3.s3.transfer import TransferConfig

    import ckptbench

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=key, aws_secret_access_key=secret)
    bucket = f"ckptbench-link-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    numel = size // tensors // 4
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.rand(numel, generator=generator) for i in range(tensors)}
    payload = sum(t.numel() * t.element_size() for t in state.values())
    blob = b"".join(t.numpy().tobytes() for t in state.values())  # the same bytes, in one object for boto3
    options = {"endpoint_url": endpoint, "key": key, "secret": secret,
               "part_size": part_size, "max_concurrency": concurrency}
    transfer = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                              max_concurrency=concurrency, use_threads=True)
    samples: dict[str, list[float]] = {"ckptbench": [], "boto3": []}
    iface_tx: dict[str, list[float]] = {"ckptbench": [], "boto3": []}

    def run_ckptbench() -> None:
        ckptbench.save(state, f"s3://{bucket}/ckpt", storage_options=options, overwrite=True)

    def run_boto3() -> None:
        client.upload_fileobj(io.BytesIO(blob), bucket, "boto3/blob.bin", Config=transfer)

    def timed(name: str, fn, record: bool) -> None:
        sent = tx_bytes(iface)
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        if record:
            samples[name].append(payload / elapsed / 1e6)
            if sent is not None:
                iface_tx[name].append((tx_bytes(iface) - sent) / elapsed / 1e6)
        print(f"s3_link: {name}{'' if record else ' (warm-up)'}: {payload / elapsed / 1e6:.1f} MB/s "
              f"({elapsed:.2f} s)", file=sys.stderr, flush=True)

    try:
        timed("ckptbench", run_ckptbench, record=False)  # the staging arena, connections
        timed("boto3", run_boto3, record=False)
        for i in range(rounds):
            order = [("ckptbench", run_ckptbench), ("boto3", run_boto3)]
            for name, fn in order if i % 2 == 0 else order[::-1]:
                timed(name, fn, record=True)
    finally:
        remove_bucket(client, bucket)
    doc = {"endpoint": endpoint, "bytes": payload, "tensors": tensors, "rounds": rounds,
           "part_size": part_size, "max_concurrency": concurrency,
           "samples_MBps": samples, "median_MBps": {k: statistics.median(v) for k, v in samples.items()}}
    if iface:
        doc["iface"] = iface
        doc["iface_tx_samples_MBps"] = iface_tx
        doc["iface_tx_median_MBps"] = {k: statistics.median(v) for k, v in iface_tx.items()}
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint-url", default=os.environ.get("CKPTBENCH_TEST_S3_ENDPOINT"))
    parser.add_argument("--key", default=os.environ.get("AWS_ACCESS_KEY_ID", "ckptbenchaccess"))
    parser.add_argument("--secret", default=os.environ.get("AWS_SECRET_ACCESS_KEY", "ckptbenchsecret0123456789"))
    parser.add_argument("--size", default="512MiB", help="payload per upload (default 512MiB)")
    parser.add_argument("--tensors", type=int, default=8, help="tensors in the state_dict (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--part-size", default="16MiB", help="both sides (ckptbench's default: 16MiB)")
    parser.add_argument("--max-concurrency", type=int, default=8, help="both sides (ckptbench's default: 8)")
    parser.add_argument("--link-rate", default=None, help="what the link is shaped to (tc units), for the report")
    parser.add_argument("--iface", default=None, help="the client's link interface: count the bytes it sent")
    parser.add_argument("--expect-near-link", type=float, default=None, metavar="F",
                        help="exit 1 unless F x link < ckptbench median < link")
    parser.add_argument("--save", default=None, metavar="DIR", help="also write DIR/s3_link-RATE.json")
    args = parser.parse_args()
    if not args.endpoint_url:
        parser.error("no endpoint: pass --endpoint-url or set CKPTBENCH_TEST_S3_ENDPOINT")
    link_bits = rate_bits(args.link_rate)
    if args.expect_near_link is not None and link_bits is None:
        parser.error("--expect-near-link needs --link-rate")
    doc = measure(args.endpoint_url, args.key, args.secret, parse_size(args.size), args.tensors, args.rounds,
                  args.iface, parse_size(args.part_size), args.max_concurrency)
    doc["link_rate"] = args.link_rate or "none"
    doc["link_MBps"] = link_bits / 8e6 if link_bits else None
    if link_bits:
        doc["fraction_of_link"] = {k: v / doc["link_MBps"] for k, v in doc["median_MBps"].items()}
    ok = True
    if args.expect_near_link is not None:
        low, high = args.expect_near_link * doc["link_MBps"], doc["link_MBps"]
        ok = low < doc["median_MBps"]["ckptbench"] < high
        doc["expect"] = {"low_MBps": low, "high_MBps": high, "ok": ok}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        (Path(args.save) / f"s3_link-{doc['link_rate']}.json").write_text(text + "\n")
    medians = doc["median_MBps"]
    link = f"link {doc['link_rate']}" + (f" = {doc['link_MBps']:.0f} MB/s" if link_bits else "")
    print(f"s3_link: {link}; upload ckptbench {medians['ckptbench']:.1f} MB/s, boto3 {medians['boto3']:.1f} MB/s"
          + (f"; expected {doc['expect']['low_MBps']:.0f}..{doc['expect']['high_MBps']:.0f}: "
             f"{'ok' if ok else 'FAILED'}" if "expect" in doc else ""), file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
