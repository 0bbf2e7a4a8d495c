"""Bad input and failures on s3://: one-line errors (exit code 2 for bad input), bounded time when the
endpoint is unreachable, no orphan multipart uploads, no secrets in messages or logs."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

import ckptbench
from ckptbench.checkpoint.manifest import NotACheckpointError
from ckptbench.errors import CkptbenchError, MissingDependencyError, StorageIOError, TargetError, UsageError
from ckptbench.storage.s3 import S3Options, S3Store, parse_s3_url
from ckptbench.storage.store import open_store

REPO = Path(__file__).resolve().parents[2]
FAKE_SECRET = "not-the-secret-Zq9xW2"  # noqa: S105 - a wrong credential, on purpose


def one_line_usage_error(exc: BaseException) -> str:
    assert isinstance(exc, UsageError), repr(exc)
    assert exc.exit_code == 2
    text = str(exc)
    assert "\n" not in text
    return text


@pytest.fixture
def no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credentials or endpoint from this machine's environment or files leak into a test."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# -- no server needed ----------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://", "names no bucket"),
    ("s3:///ckpt", "names no bucket"),
    ("s3://Bad_Bucket/ckpt", "not a valid bucket name"),
    ("s3://ab/ckpt", "not a valid bucket name"),
    ("s3://bucket/a/../b", "'..' are not allowed"),
    ("s3://bucket/ckpt?versionId=3", "query strings"),
    ("s3:/bucket/ckpt", "malformed URL"),
    ("s3://AKIAXXXX:" + FAKE_SECRET + "@bucket/ckpt", "credentials inside an s3:// URL"),
])
def test_malformed_url(url: str, expected: str):
    with pytest.raises(UsageError) as info:
        ckptbench.load(url)
    text = one_line_usage_error(info.value)
    assert expected in text
    assert FAKE_SECRET not in text


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://bucket/a/b/", ("bucket", "a/b")),
    ("s3://bucket/a//b", ("bucket", "a//b")),
    ("s3://bucket//a", ("bucket", "/a")),
    ("s3://bucket", ("bucket", "")),
    ("s3a://bucket/a/", ("bucket", "a")),
])
def test_the_prefix_is_the_key_prefix_as_written(url: str, expected: tuple[str, str]):
    """S3 keys are strings: ``a//b/x`` is another object than ``a/b/x``, so a prefix is never collapsed."""
    assert parse_s3_url(url) == expected


def test_unknown_protocol():
    with pytest.raises(UsageError) as info:
        ckptbench.load("nosuchproto://bucket/ckpt")
    assert "unknown storage protocol 'nosuchproto'" in one_line_usage_error(info.value)


def test_protocol_whose_package_is_missing():
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    with pytest.raises(MissingDependencyError) as info:
        ckptbench.load("gcs://bucket/ckpt")
    assert "gcsfs" in one_line_usage_error(info.value)


def test_missing_boto3_says_what_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    with pytest.raises(MissingDependencyError) as info:
        ckptbench.load("s3://bucket/ckpt", storage_options={"endpoint_url": "http://127.0.0.1:1"})
    assert "pip install 'ckptbench[s3]'" in one_line_usage_error(info.value)


@pytest.mark.parametrize(("options", "expected"), [
    ({"no_such_option": 1}, "unknown storage option 'no_such_option'"),
    ({"part_size": "1MiB"}, "outside S3's limits"),
    ({"part_size": "lots"}, "not a size"),
    ({"max_concurrency": "0"}, "max_concurrency='0' must be a number >= 1"),
    ({"endpoint_url": "127.0.0.1:7480"}, "not an http:// or https:// URL"),
    ({"key": "AKIAXXXX"}, "key and secret must be given together"),
])
def test_bad_storage_options(options: dict, expected: str):
    with pytest.raises(UsageError) as info:
        open_store("s3://bucket/ckpt", options)
    assert expected in one_line_usage_error(info.value)


def test_storage_options_accept_strings_as_from_the_command_line():
    opts = S3Options.from_mapping({"part_size": "8MiB", "max_concurrency": "32", "create_bucket": "true",
                                   "client_kwargs": {"endpoint_url": "http://h:1"}, "secret": "s", "key": "k"})
    assert (opts.part_size, opts.max_concurrency, opts.create_bucket, opts.endpoint_url) == (
        8 * 2**20, 32, True, "http://h:1")
    assert "'s'" not in repr(opts) and "secret" not in repr(opts)


def test_aws_max_attempts_is_the_default_attempts_and_a_storage_option_wins(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    assert S3Options.from_mapping({}).max_attempts == 8
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", " 5 ")
    assert S3Options.from_mapping({}).max_attempts == 5
    assert S3Options.from_mapping({"max_attempts": "3"}).max_attempts == 3
    for bad in ("many", "0", "2.5"):
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", bad)
        with pytest.raises(UsageError) as info:
            S3Options.from_mapping({})
        assert one_line_usage_error(info.value).startswith(f"AWS_MAX_ATTEMPTS={bad!r} must be a whole number >= 1")
    assert S3Options.from_mapping({"max_attempts": 4}).max_attempts == 4  # given: the environment is not read


def test_no_credentials(no_aws_environment: None):
    with pytest.raises(TargetError) as info:
        open_store("s3://bucket/ckpt", {"endpoint_url": "http://127.0.0.1:1"})
    assert "no AWS credentials" in one_line_usage_error(info.value)


@pytest.mark.parametrize("via", ["storage_options", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"])
def test_a_missing_profile_is_named_with_where_it_came_from(via: str, no_aws_environment: None,
                                                           monkeypatch: pytest.MonkeyPatch):
    options = {"endpoint_url": "http://127.0.0.1:1"}
    if via == "storage_options":
        options["profile"] = "no-such-profile"
    else:
        monkeypatch.setenv(via, "no-such-profile")
    with pytest.raises(UsageError) as info:
        open_store("s3://bucket/ckpt", options)
    assert f"AWS profile 'no-such-profile' (from {via if via.startswith('AWS') else 'storage_options profile'}) " \
           "not found" in one_line_usage_error(info.value)


@pytest.mark.parametrize("via", ["storage_options", "AWS_ENDPOINT_URL"])
def test_unreachable_endpoint_fails_fast_and_names_it(via: str, no_aws_environment: None,
                                                      monkeypatch: pytest.MonkeyPatch):
    options = {"key": "AKIAXXXX", "secret": FAKE_SECRET}
    start = time.monotonic()
    with pytest.raises(TargetError) as info:
        if via == "storage_options":
            options["endpoint_url"] = "http://127.0.0.1:1"
            ckptbench.save({"x": torch.ones(4)}, "s3://bucket/ckpt", storage_options=options)
        else:
            monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
            options["max_attempts"] = "2"  # also bounds the metadata requests' attempts
            ckptbench.load("s3://bucket/ckpt", storage_options=options)
    assert time.monotonic() - start < 10
    text = one_line_usage_error(info.value)
    assert "http://127.0.0.1:1" in text and via in text and f"after {options.get('max_attempts', 3)} attempts" in text
    assert FAKE_SECRET not in text


# -- against the real server ---------------------------------------------------------------------


@pytest.mark.s3
def test_missing_bucket_is_named(s3_server):
    url = "s3://ckptbench-no-such-bucket/ckpt"
    with pytest.raises(TargetError) as info:
        ckptbench.save({"x": torch.ones(4)}, url, storage_options=s3_server.options())
    assert "bucket 'ckptbench-no-such-bucket' does not exist" in one_line_usage_error(info.value)
    with pytest.raises(TargetError) as info:
        ckptbench.load(url, storage_options=s3_server.options())
    assert "'ckptbench-no-such-bucket'" in one_line_usage_error(info.value)


@pytest.mark.s3
def test_a_double_slash_in_the_prefix_names_the_keys_other_clients_name(s3_server, s3_bucket):
    """A checkpoint saved to ``s3://B/runs//c`` is under the keys ``runs//c/...`` (where boto3 and the AWS
    CLI put and find ``s3://B/runs//c/...``), not under ``runs/c/``."""
    ckptbench.save({"x": torch.arange(8.0)}, f"s3://{s3_bucket}/runs//c", storage_options=s3_server.options())
    keys = [item["Key"] for item in s3_server.client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert keys and all(key.startswith("runs//c/") for key in keys), keys
    loaded = ckptbench.load(f"s3://{s3_bucket}/runs//c/", storage_options=s3_server.options())
    assert torch.equal(loaded["x"], torch.arange(8.0))
    with pytest.raises(NotACheckpointError):
        ckptbench.load(f"s3://{s3_bucket}/runs/c", storage_options=s3_server.options())


@pytest.mark.s3
def test_create_bucket_when_asked(s3_server):
    name = f"ckptbench-created-{os.getpid()}"
    try:
        ckptbench.save({"x": torch.ones(4)}, f"s3://{name}/ckpt",
                       storage_options=s3_server.options(create_bucket="true"))
        assert torch.equal(ckptbench.load(f"s3://{name}/ckpt", storage_options=s3_server.options())["x"],
                           torch.ones(4))
    finally:
        client = s3_server.client()
        for item in client.list_objects_v2(Bucket=name).get("Contents", []):
            client.delete_object(Bucket=name, Key=item["Key"])
        client.delete_bucket(Bucket=name)


@pytest.mark.s3
@pytest.mark.parametrize("source", ["storage_options", "environment"])
def test_access_denied_names_the_credential_source_not_the_secret(s3_server, s3_bucket, source, no_aws_environment,
                                                                   monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    options = {"endpoint_url": s3_server.endpoint}
    if source == "storage_options":
        options.update(key=s3_server.key, secret=FAKE_SECRET)
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    url = f"s3://{s3_bucket}/ckpt"
    for action in (lambda: ckptbench.save({"x": torch.ones(4)}, url, storage_options=options),
                   lambda: ckptbench.load(url, storage_options=options)):
        with pytest.raises(TargetError) as info:
            action()
        text = one_line_usage_error(info.value)
        assert "access denied" in text and source in text
        assert FAKE_SECRET not in text
    assert FAKE_SECRET not in caplog.text


@pytest.mark.s3
@pytest.mark.parametrize("failure", [StorageIOError("injected: the network went away"), KeyboardInterrupt()],
                         ids=["error", "ctrl-c"])
def test_failed_upload_aborts_multipart_and_leaves_nothing(s3_server, s3_bucket, failure, monkeypatch):
    store = S3Store(f"s3://{s3_bucket}/ckpt", s3_server.options(part_size="5MiB", max_concurrency=2))
    store.prepare()
    real_upload_part, calls = store._data.upload_part, []

    def failing_upload_part(**kwargs):
        calls.append(kwargs["PartNumber"])
        if len(calls) == 4:
            raise failure
        return real_upload_part(**kwargs)

    monkeypatch.setattr(store._data, "upload_part", failing_upload_part)
    data = np.random.default_rng(0).integers(0, 256, size=12 * 2**20, dtype=np.uint8)
    files = [("small.bin", memoryview(data[:1000])), ("a.bin", memoryview(data)), ("b.bin", memoryview(data))]
    with pytest.raises(type(failure)):
        store.write_files(files, threads=2, block_size=2**20, direct=False)
    client = s3_server.client()
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


@pytest.mark.s3
def test_ctrl_c_during_save_leaves_no_objects_and_no_uploads(s3_server, s3_bucket, tmp_path):
    """A real SIGINT to a process saving to S3: its uploads are aborted and its objects deleted."""
    script = tmp_path / "save.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time, torch, botocore.client, ckptbench
        real = botocore.client.BaseClient._make_api_call
        def slow(self, operation, params):  # slow parts down so the signal lands mid-upload
            if operation == "UploadPart":  # one write per line: two upload threads must not interleave
                sys.stdout.write("uploading\\n")
                sys.stdout.flush()
                time.sleep(0.2)
            return real(self, operation, params)
        botocore.client.BaseClient._make_api_call = slow
        options = {json.dumps(s3_server.options(part_size="5MiB", max_concurrency=2))}
        ckptbench.save({{"w": torch.randn(40, 2**18)}}, "s3://{s3_bucket}/ckpt", storage_options=options)
        print("finished", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    assert proc.stdout.readline().strip() == "uploading", proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr
    client = s3_server.client()
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


@pytest.mark.s3
def test_secrets_never_appear_in_results_messages_or_logs(s3_server, s3_bucket, caplog):
    caplog.set_level(logging.DEBUG)
    options = s3_server.options(part_size="5MiB")
    url = f"s3://{s3_bucket}/ckpt"
    result = ckptbench.save({"w": torch.randn(3 * 2**20)}, url, storage_options=options)
    loaded = ckptbench.load(url, storage_options=options)
    assert loaded["w"].numel() == 3 * 2**20
    store = open_store(url, options)
    texts = [json.dumps(result.to_dict()), repr(store), repr(store.options), caplog.text]
    with pytest.raises(CkptbenchError) as info:
        ckptbench.load(f"s3://{s3_bucket}/nothing-here", storage_options=options)
    texts.append(str(info.value))
    for text in texts:
        assert s3_server.secret not in text


@pytest.mark.s3
def test_a_bucket_is_checked_once_and_its_removal_still_named(s3_server, fault_proxy):
    """A second save to a bucket found by the first sends no HeadBucket; once the bucket is removed,
    the next save names it missing (its first request meets NoSuchBucket), and the one after that
    checks it again."""
    from s3_buckets import remove_bucket

    client = s3_server.client()
    name = f"ckptbench-once-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    options = s3_server.options(endpoint_url=fault_proxy.endpoint)
    try:
        ckptbench.save({"x": torch.ones(4)}, f"s3://{name}/a", storage_options=options)
        checks = fault_proxy.count("HeadBucket")
        assert checks >= 1
        ckptbench.save({"x": torch.ones(4)}, f"s3://{name}/b", storage_options=options)
        assert fault_proxy.count("HeadBucket") == checks
    finally:
        remove_bucket(client, name)
    for _ in range(2):
        with pytest.raises(TargetError) as info:
            ckptbench.save({"x": torch.ones(4)}, f"s3://{name}/c", storage_options=options, overwrite=True)
        assert f"bucket {name!r} does not exist" in one_line_usage_error(info.value)
    assert fault_proxy.count("HeadBucket") == checks + 1
