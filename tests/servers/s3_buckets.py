"""Bucket clean-up for the tests and benchmarks against the S3 server: ``remove_bucket`` empties a bucket
(every object, every unfinished multipart upload) and deletes it. Not a package: imported by name with
``tests/servers`` on ``sys.path`` (tests/storage/conftest.py, and the scripts in tests/perf)."""

from __future__ import annotations

from typing import Any


def remove_bucket(client: Any, bucket: str) -> None:
    """Abort ``bucket``'s multipart uploads, delete its objects, then the bucket (a boto3 S3 ``client``)."""
    for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    client.delete_bucket(Bucket=bucket)
