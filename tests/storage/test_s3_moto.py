"""The S3 paths against a second server, moto (in this process, on 127.0.0.1: no Ceph needed), and the
AWS environment read the way the AWS SDKs read it: endpoint, profile, credentials, region, addressing
style and checksum settings from variables and from ``~/.aws/config``, as botocore resolves them.

Also ``ckptbench clean s3://`` on the scratch prefixes of killed runs, and TLS with a private CA. Where
moto does not answer as S3 does (it returns every open multipart upload in one page; it checks no
signatures, so access denied is the Ceph tests'), a test takes S3's answer from botocore's ``Stubber``.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import os
import socket
import stat
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import lock
from ckptbench.checkpoint.lock import CheckpointLockedError, acquire_save_lock
from ckptbench.errors import CheckpointExistsError, TargetError, UsageError
from ckptbench.storage.s3 import S3Store
from ckptbench.storage.s3_clients import s3fs_arguments
from ckptbench.storage.store import open_store

pytest.importorskip("moto.moto_server.werkzeug_app", reason="these tests need moto's server: pip install 'moto[s3,server]'")

pytestmark = [pytest.mark.moto, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

MiB = 2**20


def _flexible_checksums() -> bool:
    """Whether botocore computes request checksums unless told to compute them only where S3 requires one
    (its request_checksum_calculation, from 1.36); older releases compute none they are not asked for."""
    from botocore.config import Config

    return "request_checksum_calculation" in Config.OPTION_DEFAULTS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _moto_server(ssl_context: tuple[str, str] | None = None) -> Iterator[int]:
    """moto's S3 application served on 127.0.0.1 by werkzeug, on a port the kernel picks (moto's own
    ``ThreadedMotoServer`` takes no port 0, and waits forever when its port is taken); its port."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=True,
                         ssl_context=ssl_context)
    thread = threading.Thread(target=server.serve_forever, name="moto", daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 over http, stopped after the module."""
    with _moto_server() as port:
        yield f"http://127.0.0.1:{port}"


@dataclass
class Aws:
    """The AWS environment of one test: its config and credentials files, the moto endpoint, a bucket."""

    endpoint: str
    config: Path
    credentials: Path
    bucket: str

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def stored(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def uploads(self) -> list[str]:
        return [u["Key"] for u in self.client().list_multipart_uploads(Bucket=self.bucket).get("Uploads", [])]


@pytest.fixture
def aws(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Aws:
    """Only this test's AWS environment: keys and AWS_ENDPOINT_URL in variables, empty config files of
    its own (tests write them), no instance metadata; and a fresh bucket."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    env = Aws(moto_endpoint, tmp_path / "aws-config", tmp_path / "aws-credentials", f"moto-{uuid.uuid4().hex[:12]}")
    env.config.write_text("")
    env.credentials.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(env.config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(env.credentials))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    env.client().create_bucket(Bucket=env.bucket)
    return env


def state(seed: int = 0, big: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    sd = {"w": torch.randn(256, 64, generator=g), "b": torch.arange(10) + seed, "step": seed}
    if big:
        sd["big"] = torch.randn(3 * MiB, generator=g)  # 12 MiB: a multipart object at 5 MiB parts
    return sd


def assert_same(expected: dict, got: dict) -> None:
    assert set(expected) == set(got)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, got[key]), key
        else:
            assert value == got[key], key


class Requests:
    """Every request the store's boto3 clients send: method, URL and headers (``before-send``)."""

    def __init__(self, store: S3Store, stop_with: type[BaseException] | None = None) -> None:
        self.sent: list[tuple[str, str, dict[str, str]]] = []
        self.bodies: list[Any] = []
        self._stop_with = stop_with
        for client in (store._data, store._control):
            client.meta.events.register("before-send.s3", self._record)

    def _record(self, request: Any, **_: Any) -> None:
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        self.sent.append((request.method, request.url, headers))
        self.bodies.append(request.body)
        if self._stop_with is not None:
            raise self._stop_with("stopped before sending")

    def with_header_prefix(self, prefix: str) -> list[str]:
        return [url for _, url, headers in self.sent if any(k.startswith(prefix) for k in headers)]


class NotSent(Exception):
    pass


# -- the library's S3 paths ---------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["with space/a+b", "pct%2F%41/x=y&z;~'!", "ünïcødé/日本",
                                    "(parens)/[brackets]"])
def test_round_trip_list_and_delete_with_keys_that_need_escaping(aws: Aws, prefix: str):
    url = f"s3://{aws.bucket}/{prefix}"
    sd = state(1)
    ckptbench.save(sd, url)
    assert_same(sd, ckptbench.load(url))
    keys = aws.stored()
    assert keys and all(key.startswith(prefix + "/") for key in keys)  # stored under the very prefix given
    store = open_store(url)
    assert sorted(store.list()) == sorted(key[len(prefix) + 1:] for key in keys)
    store.remove(store.list())
    assert aws.stored() == []


def test_async_multipart_save_and_overwrite(aws: Aws):
    url = f"s3://{aws.bucket}/ckpt"
    options = {"part_size": "5MiB"}
    first = state(1, big=True)
    ckptbench.save(first, url, storage_options=options, async_=True).result()
    assert aws.uploads() == []
    assert_same(first, ckptbench.load(url, storage_options=options))
    with pytest.raises(CheckpointExistsError):
        ckptbench.save(state(2), url, storage_options=options)
    second = state(2, big=True)
    ckptbench.save(second, url, storage_options=options, overwrite=True)
    assert_same(second, ckptbench.load(url, storage_options=options))
    assert aws.uploads() == []
    assert not any(key.endswith(".ckptbench.lock") for key in aws.stored())


def test_manager_steps_retention_and_latest(aws: Aws):
    root = f"s3://{aws.bucket}/run"
    with ckptbench.CheckpointManager(root, keep_last=2) as manager:
        for step in (1, 2):
            manager.save(step, state(step))
        manager.save(3, state(3), async_=True).result()
        assert manager.steps() == [2, 3] and manager.latest() == 3
        assert_same(state(2), manager.load(2))
    assert {key.split("/")[1] for key in aws.stored()} == {"step-00000002", "step-00000003"}


def test_dcp_writer_and_reader(aws: Aws):
    import torch.distributed.checkpoint as dcp

    from ckptbench.integrations.dcp import Reader, Writer

    url = f"s3://{aws.bucket}/dcp"
    sd = {"model": {"w": torch.randn(64, 32), "b": torch.arange(7.0)}}
    dcp.save(sd, storage_writer=Writer(url, files_per_rank=2), no_dist=True)
    loaded = {"model": {"w": torch.zeros(64, 32), "b": torch.zeros(7)}}
    dcp.load(loaded, storage_reader=Reader(url), no_dist=True)
    assert torch.equal(loaded["model"]["w"], sd["model"]["w"]) and torch.equal(loaded["model"]["b"], sd["model"]["b"])


def test_the_save_lock_is_conditional_and_held(aws: Aws):
    store = open_store(f"s3://{aws.bucket}/locked")
    store.prepare()
    lock._conditions_honoured.pop(store.server(), None)
    held = acquire_save_lock(store)
    try:
        # moto refuses If-None-Match: * over an object, and If-Match with another ETag
        assert lock._conditions_honoured[store.server()] == lock._Conditions(create=True, replace=True)
        with pytest.raises(CheckpointLockedError):
            ckptbench.save(state(1), f"s3://{aws.bucket}/locked")
    finally:
        held.release()
    ckptbench.save(state(1), f"s3://{aws.bucket}/locked")


def test_more_than_1000_objects_are_listed_and_removed(aws: Aws):
    from concurrent.futures import ThreadPoolExecutor

    client = aws.client()
    names = [f"obj-{i:05d}" for i in range(1001)]  # a second page of ListObjectsV2 and DeleteObjects
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: client.put_object(Bucket=aws.bucket, Key=f"many/{n}", Body=b"x"), names))
    store = open_store(f"s3://{aws.bucket}/many")
    assert sorted(store.list()) == names
    assert sorted(store.list_recursive()) == names
    store.remove(names)
    assert aws.stored() == []


def test_bench_checkpoint_workload(aws: Aws, cli):
    doc = cli.json("bench", f"s3://{aws.bucket}/bench", "--workload", "checkpoint", "--size", "8MiB",
                   "--repeat", "1", "--warmup", "0")
    (result,) = doc["results"]
    assert result["verified"] is True
    assert doc["environment"]["target"]["endpoint_source"] == "AWS_ENDPOINT_URL"
    assert aws.stored() == [] and aws.uploads() == []


def test_a_missing_bucket_is_one_line_and_exit_2(aws: Aws, cli):
    with pytest.raises(TargetError, match="bucket 'no-such-bucket-here' does not exist"):
        ckptbench.load("s3://no-such-bucket-here/ckpt")
    result = cli("bench", "s3://no-such-bucket-here/x", "--workload", "checkpoint", "--size", "8MiB")
    assert result.exit_code == 2
    assert "does not exist" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_slowdown_and_500_are_retried_with_the_sdk_backoff(aws: Aws, monkeypatch: pytest.MonkeyPatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))
    import faultproxy

    with faultproxy.FaultProxy(aws.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.fail(2, status=503, kind="PutObject")
        proxy.fail(1, status=500, kind="GetObject")
        sd = state(3)
        ckptbench.save(sd, f"s3://{aws.bucket}/retried")
        assert_same(sd, ckptbench.load(f"s3://{aws.bucket}/retried"))
        assert proxy.injected("status", "PutObject") == 2 and proxy.injected("status", "GetObject") == 1


# -- the AWS environment, as botocore resolves it -------------------------------------------------


def test_aws_endpoint_url_s3_wins_over_aws_endpoint_url(aws: Aws, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws.endpoint)
    url = f"s3://{aws.bucket}/env"
    ckptbench.save(state(1), url)
    store = open_store(url)
    assert (store.endpoint, store.endpoint_source) == (aws.endpoint, "AWS_ENDPOINT_URL_S3")


@pytest.mark.parametrize("where", ["profile", "services"])
def test_endpoint_from_the_config_file_reaches_every_client(aws: Aws, monkeypatch: pytest.MonkeyPatch, where: str):
    """A profile's ``endpoint_url`` or its ``services`` section: a custom endpoint like any other (path
    style, named as the source), for boto3, s3fs and (where installed) the CRT alike."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    if where == "profile":
        aws.config.write_text(f"[profile moto]\nendpoint_url = {aws.endpoint}\n")
    else:
        aws.config.write_text(f"[profile moto]\nservices = local\n\n[services local]\ns3 =\n"
                              f"  endpoint_url = {aws.endpoint}\n")
    monkeypatch.setenv("AWS_PROFILE", "moto")
    url = f"s3://{aws.bucket}/cfg"
    store = open_store(url)
    assert store.endpoint == aws.endpoint and "AWS config file" in store.endpoint_source
    assert store.describe()["endpoint_source"] == store.endpoint_source
    assert store.addressing_style == "path"
    assert s3fs_arguments(store)["endpoint_url"] == aws.endpoint
    clients = ["boto3", "s3fs"]
    with contextlib.suppress(ImportError):
        import awscrt.s3  # noqa: F401

        clients.append("crt")
    for client in clients:
        sd = state(len(client))
        ckptbench.save(sd, f"{url}/{client}", storage_options={"client": client})
        assert_same(sd, ckptbench.load(f"{url}/{client}", storage_options={"client": client}))


def test_ignore_configured_endpoint_urls_is_honoured(aws: Aws, monkeypatch: pytest.MonkeyPatch):
    aws.config.write_text(f"[default]\nendpoint_url = {aws.endpoint}\n")
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    store = S3Store(f"s3://{aws.bucket}/x")  # no request is made
    assert store.endpoint_source == "the default"
    assert "amazonaws.com" in store.endpoint


def test_profile_credentials_session_token_and_region(aws: Aws, monkeypatch: pytest.MonkeyPatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    aws.credentials.write_text("[team]\naws_access_key_id = AKIDTEAM\naws_secret_access_key = secret-team\n"
                               "aws_session_token = token-team\n")
    aws.config.write_text("[profile team]\nregion = eu-west-3\n")
    monkeypatch.setenv("AWS_PROFILE", "team")
    url = f"s3://{aws.bucket}/team"
    store = open_store(url)
    assert store.region == "eu-west-3"
    assert "shared credentials file" in store.credential_source and "'team'" in store.credential_source
    requests = Requests(store)
    store.prepare()
    (_, _, headers), = requests.sent
    assert headers["x-amz-security-token"] == "token-team"
    assert "AKIDTEAM/" in headers["authorization"] and "/eu-west-3/s3/" in headers["authorization"]
    ckptbench.save(state(1), url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")  # the variable wins over the profile, as in botocore
    assert open_store(url).region == "ap-south-1"


def test_credential_process(aws: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    script = tmp_path / "creds.sh"
    script.write_text('#!/bin/sh\necho \'{"Version": 1, "AccessKeyId": "AKIDPROC", "SecretAccessKey": "s", '
                      '"SessionToken": "token-proc"}\'\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    aws.config.write_text(f"[default]\ncredential_process = {script}\n")
    url = f"s3://{aws.bucket}/proc"
    store = open_store(url)
    requests = Requests(store)
    store.prepare()
    assert requests.sent[0][2]["x-amz-security-token"] == "token-proc"
    ckptbench.save(state(1), url)
    assert_same(state(1), ckptbench.load(url))


def test_anonymous_requests_are_unsigned(aws: Aws):
    store = open_store(f"s3://{aws.bucket}/anon", {"anon": True})
    requests = Requests(store)
    store.prepare()
    assert "authorization" not in requests.sent[0][2]
    assert store.credential_source.startswith("none")


@pytest.mark.parametrize(("profile_style", "option", "host_has_bucket"), [
    ("virtual", None, True),
    ("virtual", "path", False),
    (None, None, False),  # a custom endpoint: path style unless told otherwise
])
def test_addressing_style_from_the_profile(aws: Aws, monkeypatch: pytest.MonkeyPatch, profile_style: str | None,
                                           option: str | None, host_has_bucket: bool):
    from urllib.parse import urlsplit

    endpoint = aws.endpoint.replace("127.0.0.1", "localhost")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    if profile_style:
        aws.config.write_text(f"[default]\ns3 =\n  addressing_style = {profile_style}\n")
    store = S3Store(f"s3://{aws.bucket}/style", {"addressing_style": option} if option else None)
    requests = Requests(store, stop_with=NotSent)
    with pytest.raises(NotSent):
        store.get("manifest.json")
    host = urlsplit(requests.sent[0][1]).hostname
    assert host == (f"{aws.bucket}.localhost" if host_has_bucket else "localhost")
    assert store.addressing_style == (option or profile_style or "path")


@pytest.mark.parametrize(("setting", "option", "checksums"), [
    (None, None, False),  # ckptbench's default: only where S3 requires one (DeleteObjects)
    ("when_supported", None, True),
    ("when_supported", False, False),
    ("when_required", True, True),
])
def test_request_checksums_follow_the_aws_setting(aws: Aws, monkeypatch: pytest.MonkeyPatch, setting: str | None,
                                                  option: bool | None, checksums: bool):
    """AWS_REQUEST_CHECKSUM_CALCULATION as botocore reads it, unless storage_options request_checksums
    says otherwise; the same for every request, the save lock's conditional PUTs included."""
    if setting:
        monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", setting)
    options = {"part_size": "5MiB", **({} if option is None else {"request_checksums": option})}
    url = f"s3://{aws.bucket}/sums"
    store = open_store(url, options)
    requests = Requests(store)  # the clients of every store opened with these options
    ckptbench.save(state(1, big=True), url, storage_options=options)
    puts = [(url, headers) for method, url, headers in requests.sent if method == "PUT"]
    summed = [url for url, headers in puts if any(k.startswith("x-amz-checksum-") for k in headers)]
    assert puts
    assert summed == ([url for url, _ in puts] if checksums and _flexible_checksums() else [])
    assert_same(state(1, big=True), ckptbench.load(url, storage_options=options))


def test_request_checksums_reach_s3fs(aws: Aws, monkeypatch: pytest.MonkeyPatch):
    store = open_store(f"s3://{aws.bucket}/x")
    expected = "when_required" if _flexible_checksums() else None
    assert s3fs_arguments(store)["config_kwargs"].get("request_checksum_calculation") == expected
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported")
    assert "request_checksum_calculation" not in s3fs_arguments(open_store(f"s3://{aws.bucket}/x"))["config_kwargs"]


class _Redirecting(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint whose every bucket is in eu-west-1: 301 PermanentRedirect to every request."""

    def _answer(self) -> None:
        body = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>PermanentRedirect</Code><Message>The bucket "
                b"you are attempting to access must be addressed using the specified endpoint.</Message></Error>")
        self.send_response(301)
        self.send_header("x-amz-bucket-region", "eu-west-1")
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def redirecting_endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_bucket_in_another_region_is_one_clear_line(aws: Aws, monkeypatch: pytest.MonkeyPatch,
                                                      redirecting_endpoint: str, cli):
    monkeypatch.setenv("AWS_ENDPOINT_URL", redirecting_endpoint)
    with pytest.raises(TargetError, match="is in region 'eu-west-1', not 'us-east-1'") as info:
        ckptbench.load("s3://elsewhere/ckpt")
    assert "AWS_DEFAULT_REGION=eu-west-1" in info.value.hint
    result = cli("bench", "s3://elsewhere/x", "--workload", "checkpoint", "--size", "8MiB")
    assert result.exit_code == 2 and "eu-west-1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# -- what a page of results or a server without a feature looks like (botocore's Stubber) ----------


def test_multipart_uploads_are_aborted_past_the_first_page(aws: Aws):
    from botocore.stub import ANY, Stubber

    store = S3Store(f"s3://{aws.bucket}/pages")
    first = [{"Key": f"pages/shard-{i:05d}.bin", "UploadId": f"u{i}"} for i in range(1000)]
    second = [{"Key": "pages/shard-01000.bin", "UploadId": "u1000"}]
    with Stubber(store._control) as control, Stubber(store._data) as data:
        control.add_response("list_multipart_uploads", {"Uploads": first, "IsTruncated": True,
                                                        "NextKeyMarker": "pages/shard-00999.bin",
                                                        "NextUploadIdMarker": "u999"},
                             {"Bucket": aws.bucket, "Prefix": "pages/"})
        control.add_response("list_multipart_uploads", {"Uploads": second, "IsTruncated": False},
                             {"Bucket": aws.bucket, "Prefix": "pages/", "KeyMarker": "pages/shard-00999.bin",
                              "UploadIdMarker": "u999"})
        for _ in range(1001):
            data.add_response("abort_multipart_upload", {}, {"Bucket": aws.bucket, "Key": ANY, "UploadId": ANY})
        assert store.abort_incomplete_uploads() == 1001
        data.assert_no_pending_responses()


def test_a_server_without_conditional_writes_gives_a_best_effort_lock(aws: Aws, caplog: pytest.LogCaptureFixture):
    from botocore.stub import Stubber

    store = open_store(f"s3://{aws.bucket}/nocond")
    lock._conditions_honoured.pop(store.server(), None)
    with Stubber(store._control) as control:
        control.add_client_error("put_object", service_error_code="NotImplemented", http_status_code=501)
        with caplog.at_level(logging.WARNING):
            assert lock._honours_conditions(store) == lock._Conditions(create=False, replace=False)
    assert "does not honour conditional writes" in caplog.text
    lock._conditions_honoured.pop(store.server(), None)


def test_delete_objects_carries_content_md5_for_servers_that_require_it(aws: Aws):
    """DeleteObjects needs Content-MD5 or an x-amz-checksum-* header; servers that predate the latter
    refuse a request without the former (botocore >= 1.36 sends only the CRC32)."""
    import base64
    import hashlib

    url = f"s3://{aws.bucket}/md5"
    ckptbench.save(state(1), url)
    store = open_store(url)
    requests = Requests(store)
    names = store.list()
    store.remove(names)
    deletes = [(headers, body) for (method, url, headers), body in zip(requests.sent, requests.bodies, strict=True)
               if method == "POST" and url.endswith("?delete")]
    assert deletes
    for headers, body in deletes:
        body = body.encode() if isinstance(body, str) else body
        assert headers["content-md5"] == base64.b64encode(hashlib.md5(body).digest()).decode()
    assert aws.stored() == []



# -- servers that differ from S3 (docs/library.md, "S3-compatible servers"): moto behind the fault proxy,
#    which answers or alters requests as those servers do --------------------------------------------


@pytest.fixture
def proxy(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fault proxy in front of moto, as every store's endpoint (a new port: new clients, nothing
    learnt about another test's server)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))
    import faultproxy

    with faultproxy.FaultProxy(aws.endpoint) as running:
        monkeypatch.setenv("AWS_ENDPOINT_URL", running.endpoint)
        lock._conditions_honoured.clear()
        yield running
    lock._conditions_honoured.clear()


@pytest.mark.parametrize(("status", "code", "message"), [
    (501, "NotImplemented", "A header or query you provided requested a function that is not implemented."),  # GCS
    (400, "MalformedXML", "The XML you provided was not well-formed."),
    (400, "InvalidArgument", "Unsupported header 'x-amz-checksum-crc32' received for this API call."),  # B2's refusal
])
def test_a_server_refusing_delete_objects_gets_one_delete_per_key(aws: Aws, proxy, caplog, status: int, code: str,
                                                                 message: str):
    """The stale shards of an overwritten checkpoint are still removed, one DeleteObject each, and the
    refusal is learnt once per connection."""
    proxy.fail(None, status=status, code=code, message=message, kind="DeleteObjects")
    url = f"s3://{aws.bucket}/nodelete"
    ckptbench.save(state(1), url)
    first = set(aws.stored())
    with caplog.at_level(logging.WARNING, logger="ckptbench.storage.s3"):
        ckptbench.save(state(2), url, overwrite=True)
        ckptbench.save(state(3), url, overwrite=True)
    assert_same(state(3), ckptbench.load(url))
    stored = set(aws.stored())
    assert not stored & (first - {"nodelete/manifest.json"})  # every shard of the first save is gone
    assert proxy.count("DeleteObjects") == 1 and proxy.count("DeleteObject") >= 2
    assert "refuses DeleteObjects" in caplog.text and "could not delete" not in caplog.text


def test_deleting_an_absent_key_one_by_one_is_no_failure(aws: Aws, proxy, caplog):
    """GCS answers 404 to a DeleteObject of an absent key (S3: 204); ``remove`` deletes keys that may be absent."""
    proxy.fail(None, status=501, code="NotImplemented", kind="DeleteObjects")
    proxy.fail(None, status=404, code="NoSuchKey", kind="DeleteObject", path="/gone/absent")
    aws.client().put_object(Bucket=aws.bucket, Key="gone/there", Body=b"x")
    store = open_store(f"s3://{aws.bucket}/gone")
    with caplog.at_level(logging.WARNING, logger="ckptbench.storage.s3"):
        store.remove(["absent", "there"])
    assert aws.stored() == [] and "could not delete" not in caplog.text
    assert proxy.injected("status", "DeleteObject") == 1


def test_a_server_ignoring_if_none_match_gets_the_best_effort_lock(aws: Aws, proxy, caplog):
    """Old MinIO releases and some gateways store a PUT whatever its If-None-Match says: the probe finds it
    out and the lease is written best effort, never believed conditional."""
    proxy.rewrite(None, drop_headers=("If-None-Match",), kind="PutObject")
    url = f"s3://{aws.bucket}/ignores"
    with caplog.at_level(logging.WARNING, logger="ckptbench.checkpoint.lock"):
        ckptbench.save(state(1), url)
    assert "does not honour conditional writes" in caplog.text
    held = acquire_save_lock(open_store(url))
    try:
        with pytest.raises(CheckpointLockedError):
            ckptbench.save(state(2), url, overwrite=True)
    finally:
        held.release()
    assert lock._conditions_honoured[open_store(url).server()] == lock._Conditions(create=False, replace=False)


def _foreign_lease(aws: Aws, prefix: str) -> None:
    now = __import__("time").time()
    holder = lock.Holder("f" * 16, "elsewhere", 4242, now, now, lock.LEASE_TTL_S)
    aws.client().put_object(Bucket=aws.bucket, Key=f"{prefix}/{lock.LOCK_NAME}", Body=holder.encode())


def test_a_server_ignoring_if_match_does_not_let_a_lease_taken_over_commit(aws: Aws, proxy):
    """A server that honours If-None-Match but ignores If-Match would accept the renewal of a lease
    another process took over: the renewal must read the lease instead, and the save commit nothing."""
    proxy.rewrite(None, drop_headers=("If-Match",), kind="PutObject")
    store = open_store(f"s3://{aws.bucket}/takenover")
    held = acquire_save_lock(store)
    try:
        _foreign_lease(aws, "takenover")  # another process took the lease over meanwhile
        with pytest.raises(lock.LockLostError, match="taken over by pid 4242 on host elsewhere"), \
                held.committing(store, []):
            pass
    finally:
        held.release()
    assert lock.Holder.decode(aws.client().get_object(Bucket=aws.bucket, Key=f"takenover/{lock.LOCK_NAME}")
                              ["Body"].read()).pid == 4242  # the new holder's lease is left alone
    assert lock._conditions_honoured[store.server()] == lock._Conditions(create=True, replace=False)


def test_a_server_refusing_if_match_still_saves(aws: Aws, proxy, caplog):
    """AWS S3 answered If-Match on PutObject with 501 NotImplemented until November 2024 while it honoured
    If-None-Match: the lease is created conditionally and renewed best effort, and saves commit."""
    proxy.fail(None, status=501, code="NotImplemented",
               message="A header you provided implies functionality that is not implemented", header="if-match",
               kind="PutObject")
    url = f"s3://{aws.bucket}/nomatch"
    with caplog.at_level(logging.WARNING, logger="ckptbench.checkpoint.lock"):
        ckptbench.save(state(1), url)
        ckptbench.save(state(2), url, overwrite=True)
    assert_same(state(2), ckptbench.load(url))
    assert not any(key.endswith(lock.LOCK_NAME) for key in aws.stored())
    assert "honours If-None-Match but not If-Match" in caplog.text
    assert lock._conditions_honoured[open_store(url).server()] == lock._Conditions(create=True, replace=False)


def _without_continuation(body: bytes) -> bytes:
    import re

    return re.sub(rb"<NextContinuationToken>.*?</NextContinuationToken>", b"", body)


@pytest.mark.parametrize("how", ["no-token", "v2-refused"])
def test_listing_falls_back_to_list_objects_v1(aws: Aws, proxy, caplog, how: str):
    """A truncated ListObjectsV2 page without a NextContinuationToken (a server answering it as V1), or
    ListObjectsV2 refused (501): the listing goes on with ListObjects and a Marker, pages of 2 here."""
    client = aws.client()
    names = [f"obj-{i}" for i in range(5)]
    for name in names:
        client.put_object(Bucket=aws.bucket, Key=f"v1/{name}", Body=b"x")
    client.put_object(Bucket=aws.bucket, Key="v1/sub/deeper", Body=b"y")
    if how == "no-token":
        proxy.rewrite(None, add_query="max-keys=2", answer=_without_continuation, kind="ListObjectsV2")
    else:
        proxy.fail(None, status=501, code="NotImplemented", kind="ListObjectsV2")
    proxy.rewrite(None, add_query="max-keys=2", kind="ListObjects")
    store = open_store(f"s3://{aws.bucket}/v1")
    with caplog.at_level(logging.WARNING, logger="ckptbench.storage.s3"):
        assert sorted(store.list()) == names
        assert sorted(store.list_recursive()) == [*names, "sub/deeper"]
    assert proxy.count("ListObjectsV2") == 1  # learnt once: then ListObjects only
    # pages of 2 (each page of the non-recursive listing also names sub/): after the first V2 page, 2 + 3; else 3 + 3
    assert proxy.count("ListObjects") == (5 if how == "no-token" else 6)
    assert "listing with ListObjects from now on" in caplog.text


def test_a_listing_that_does_not_advance_is_an_error(aws: Aws, proxy):
    from ckptbench.errors import StorageIOError

    for i in range(3):
        aws.client().put_object(Bucket=aws.bucket, Key=f"stuck/obj-{i}", Body=b"x")
    proxy.fail(None, status=501, code="NotImplemented", kind="ListObjectsV2")
    first: list[bytes] = []
    proxy.rewrite(None, add_query="max-keys=2", answer=lambda body: (first or [first.append(body)]) and first[0],
                  kind="ListObjects")  # a server that ignores the Marker: the first page again and again
    with pytest.raises(StorageIOError, match="do not advance"):
        open_store(f"s3://{aws.bucket}/stuck").list()


def test_a_listing_naming_keys_outside_the_prefix_touches_none_of_them(aws: Aws):
    """A server that ignores a listing's Prefix (or a proxy rewriting it) names others' keys: never taken
    for this location's, so another job's upload is not aborted nor its objects listed as ours."""
    from botocore.stub import Stubber

    store = S3Store(f"s3://{aws.bucket}/pages")
    uploads = [{"Key": "other-job/shard-0123abcd-00000.bin", "UploadId": "theirs"},
               {"Key": "pages/shard-0123abcd-00000.bin", "UploadId": "ours"}]
    with Stubber(store._control) as control, Stubber(store._data) as data:
        control.add_response("list_multipart_uploads", {"Uploads": uploads, "IsTruncated": False},
                             {"Bucket": aws.bucket, "Prefix": "pages/"})
        data.add_response("abort_multipart_upload", {},
                          {"Bucket": aws.bucket, "Key": "pages/shard-0123abcd-00000.bin", "UploadId": "ours"})
        assert store.abort_incomplete_uploads(strict=True) == 1
        data.assert_no_pending_responses()
        listing = {"Contents": [{"Key": "other-job/shard-0123abcd-00000.bin", "Size": 1}, {"Key": "pages/", "Size": 0},
                                {"Key": "pages/manifest.json", "Size": 2}], "IsTruncated": False}
        control.add_response("list_objects_v2", listing, {"Bucket": aws.bucket, "Prefix": "pages/"})
        assert store.list_recursive() == ["manifest.json"]
        control.add_response("list_objects_v2", listing, {"Bucket": aws.bucket, "Prefix": "pages/"})
        assert store.sizes_recursive() == {"manifest.json": 2}


def test_multipart_uploads_past_a_page_without_markers_are_aborted(aws: Aws):
    """A truncated ListMultipartUploads page without NextKeyMarker: the next page starts after its last upload."""
    from botocore.stub import ANY, Stubber

    store = S3Store(f"s3://{aws.bucket}/pages")
    first = [{"Key": f"pages/shard-{i:05d}.bin", "UploadId": f"u{i}"} for i in range(1000)]
    with Stubber(store._control) as control, Stubber(store._data) as data:
        control.add_response("list_multipart_uploads", {"Uploads": first, "IsTruncated": True},
                             {"Bucket": aws.bucket, "Prefix": "pages/"})
        control.add_response("list_multipart_uploads",
                             {"Uploads": [{"Key": "pages/shard-01000.bin", "UploadId": "u1000"}], "IsTruncated": False},
                             {"Bucket": aws.bucket, "Prefix": "pages/", "KeyMarker": "pages/shard-00999.bin",
                              "UploadIdMarker": "u999"})
        for _ in range(1001):
            data.add_response("abort_multipart_upload", {}, {"Bucket": aws.bucket, "Key": ANY, "UploadId": ANY})
        assert store.abort_incomplete_uploads(strict=True) == 1001


def test_a_larger_minimum_part_size_names_the_setting(aws: Aws, proxy):
    """A server whose parts must be larger than 5 MiB refuses the completion (EntityTooSmall): the error
    says which storage option to raise."""
    from ckptbench.errors import StorageIOError

    proxy.fail(None, status=400, code="EntityTooSmall",
               message="Your proposed upload is smaller than the minimum allowed object size.",
               kind="CompleteMultipartUpload")
    with pytest.raises(StorageIOError, match="EntityTooSmall") as info:
        ckptbench.save(state(1, big=True), f"s3://{aws.bucket}/small", storage_options={"part_size": "5MiB"})
    assert "part_size" in (info.value.hint or "")
    assert aws.uploads() == [] and not any(key.startswith("small/shard-") for key in aws.stored())


def test_a_server_refusing_checksum_headers_names_the_setting(aws: Aws, proxy):
    """Backblaze B2 refuses x-amz-checksum-* headers (InvalidArgument): with request_checksums on, the
    error says how to turn them off (off, ckptbench's default, no PUT carries one: see
    test_request_checksums_follow_the_aws_setting)."""
    from ckptbench.errors import StorageIOError

    if not _flexible_checksums():
        pytest.skip("a botocore older than 1.36 sends no x-amz-checksum-* header for a server to refuse")
    proxy.fail(None, status=400, code="InvalidArgument",
               message="Unsupported header 'x-amz-checksum-crc32' received for this API call.",
               header="x-amz-checksum-", kind="PutObject")
    with pytest.raises(StorageIOError, match="Unsupported header") as info:
        ckptbench.save(state(1), f"s3://{aws.bucket}/sums", storage_options={"request_checksums": True})
    assert "request_checksums=false" in (info.value.hint or "")
    ckptbench.save(state(1), f"s3://{aws.bucket}/sums")  # the default sends none: saved
    assert proxy.injected("status") >= 1


@pytest.mark.parametrize("client", ["boto3", "crt"])
def test_a_part_answered_without_an_etag_fails_the_save_and_leaves_nothing(aws: Aws, proxy, client: str):
    """CompleteMultipartUpload names every part's ETag: a part answered without one (a proxy that drops
    the header) fails the save, never an upload left uncompleted under a committed manifest."""
    from ckptbench.errors import StorageIOError

    if client == "crt":
        pytest.importorskip("awscrt", reason="the CRT client needs awscrt")
    proxy.rewrite(None, drop_answer_headers=("ETag",), kind="UploadPart")
    url = f"s3://{aws.bucket}/noetag"
    with pytest.raises(StorageIOError, match="without an ETag"):
        ckptbench.save(state(1, big=True), url, storage_options={"part_size": "5MiB", "client": client})
    assert aws.uploads() == [] and not any(key.startswith("noetag/shard-") for key in aws.stored())
    assert not any(key == "noetag/manifest.json" for key in aws.stored())


def test_a_conditional_put_answered_without_an_etag(aws: Aws, proxy):
    """A PutObject answer without an ETag: put_if takes the object's from a HEAD; the lock still works."""
    proxy.rewrite(None, drop_answer_headers=("ETag",), kind="PutObject")
    store = open_store(f"s3://{aws.bucket}/noputetag")
    etag = store.put_if("x", b"1")
    assert etag and etag == aws.client().head_object(Bucket=aws.bucket, Key="noputetag/x")["ETag"]
    assert store.put_if("x", b"2", etag=etag) is not None
    ckptbench.save(state(1), f"s3://{aws.bucket}/noputetag/ckpt")
    assert lock._conditions_honoured[store.server()] == lock._Conditions(create=True, replace=True)


def test_a_ranged_get_answered_with_the_whole_object_is_an_error(aws: Aws, proxy):
    """A server (or proxy) that ignores Range answers 200 with the whole object: those are not the bytes
    of a later range, so the load fails saying so, also without checksums."""
    from ckptbench.errors import StorageIOError

    url, options = f"s3://{aws.bucket}/norange", {"part_size": "5MiB"}
    ckptbench.save(state(1, big=True), url, storage_options=options)
    proxy.rewrite(None, drop_headers=("Range",), kind="GetObject")
    with pytest.raises(StorageIOError, match="no Content-Range"):
        ckptbench.load(url, storage_options=options, verify=False)


@pytest.mark.parametrize("client", ["boto3", "crt", "s3fs"])
def test_every_upload_carries_its_content_length(aws: Aws, proxy, client: str):
    """Servers that refuse a streamed body without Content-Length (411 MissingContentLength) or aws-chunked
    framing: every PutObject and UploadPart of every client says its length up front."""
    if client == "crt":
        pytest.importorskip("awscrt", reason="the CRT client needs awscrt")
    url, options = f"s3://{aws.bucket}/lengths-{client}", {"part_size": "5MiB", "client": client}
    ckptbench.save(state(1, big=True), url, storage_options=options)
    uploads = [r for r in proxy.requests if r.kind in ("PutObject", "UploadPart")]
    assert any(r.kind == "UploadPart" for r in uploads)
    assert all(r.content_length is not None and "x-amz-decoded-content-length" not in r.header_names
               for r in uploads)
    assert_same(state(1, big=True), ckptbench.load(url, storage_options=options))


def test_every_part_but_the_last_has_the_same_size(aws: Aws, proxy):
    """Cloudflare R2 (and Garage) refuse a multipart upload whose non-trailing parts differ in size: every
    part ckptbench uploads (a save's, and the drain's ``upload_in_parts``) is ``part_size``, the last no larger."""
    url = f"s3://{aws.bucket}/equal"
    ckptbench.save(state(1, big=True), url, storage_options={"part_size": "5MiB"})
    part = open_store(url, {"part_size": "5MiB"}).upload_in_parts("drained.bin", 11 * MiB)
    for index in range(3):
        part.put(index, memoryview(bytes(min(5 * MiB, 11 * MiB - index * 5 * MiB))))
    part.complete()
    sizes: dict[str, list[tuple[int, int]]] = {}
    for request in proxy.requests:
        if request.kind == "UploadPart":
            sizes.setdefault(request.query["uploadId"][0], []).append((request.part_number, request.content_length))
    assert len(sizes) == 2
    for parts in sizes.values():
        lengths = [length for _, length in sorted(parts)]
        assert len(lengths) >= 3 and set(lengths[:-1]) == {5 * MiB} and lengths[-1] <= 5 * MiB


def test_a_server_with_fewer_parts_per_upload_gets_no_more_than_max_parts(aws: Aws, proxy):
    """A server configured below S3's 10,000 parts per upload (Ceph RGW's rgw_multipart_part_upload_limit):
    with ``max_parts``, a save's objects use larger parts rather than more of them, and load bit-exact."""
    url, options = f"s3://{aws.bucket}/fewparts", {"part_size": "5MiB", "max_parts": "2"}
    ckptbench.save(state(1, big=True), url, storage_options=options)
    parts: dict[str, int] = {}
    for request in proxy.requests:
        if request.kind == "UploadPart":
            upload = request.query["uploadId"][0]
            parts[upload] = max(parts.get(upload, 0), request.part_number)
    assert parts and max(parts.values()) == 2  # 12 MiB at 5 MiB parts would be 3
    assert_same(state(1, big=True), ckptbench.load(url, storage_options=options))
    for bad in ("0", "10001", "many"):
        with pytest.raises(UsageError, match="max_parts"):
            open_store(url, {"max_parts": bad})


# -- scratch prefixes of killed runs: ckptbench clean s3://... --------------------------------------

#: A benchmark's scratch prefix: an object written, a multipart upload open, then SIGKILL.
_KILLED_RUN = """
import os, signal, sys
from ckptbench.storage.object_target import ObjectTarget
with ObjectTarget(sys.argv[1]).scratch() as scratch:
    store = scratch.store("c0", part_size="5MiB")
    store.put_atomic("shard-00000.bin", b"x" * 4096)
    store.upload_in_parts("big.bin", 12 * 2**20).put(0, memoryview(bytes(5 * 2**20)))
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_clean_removes_the_scratch_prefixes_of_killed_runs_only(aws: Aws, cli):
    import signal
    import subprocess

    from ckptbench.storage.object_target import ObjectTarget

    url = f"s3://{aws.bucket}/bench"
    done = subprocess.run([sys.executable, "-c", _KILLED_RUN, url], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    (killed,) = {key.split("/")[1] for key in aws.stored()}
    assert aws.uploads() and killed.startswith("ckptbench-scratch-")
    client = aws.client()
    client.put_object(Bucket=aws.bucket, Key="bench/ckptbench-scratch-1-00ff00ff/shard.bin", Body=b"?")  # no owner
    client.put_object(Bucket=aws.bucket, Key="bench/step-1/manifest.json", Body=b"{}")  # not a scratch prefix
    with ObjectTarget(url).scratch() as live:
        live.store().put_atomic("in-use.bin", b"y")
        dry = cli.json("clean", url, "--dry-run")
        assert {e["path"]: e["action"] for e in dry["entries"]} == {
            f"{url}/{killed}": "would remove", f"{url}/ckptbench-scratch-1-00ff00ff": "kept", live.url: "kept"}
        assert f"bench/{killed}/c0/shard-00000.bin" in aws.stored("bench/")
        doc = cli.json("clean", url)
        removed = [e for e in doc["entries"] if e["action"] == "removed"]
        assert [e["path"] for e in removed] == [f"{url}/{killed}"] and removed[0]["size_bytes"] > 4096
        kept = {e["path"]: e["why_kept"] for e in doc["entries"] if e["action"] == "kept"}
        assert "still runs" in kept[live.url] and "no owner" in kept[f"{url}/ckptbench-scratch-1-00ff00ff"]
        assert not any(key.startswith(f"bench/{killed}/") for key in aws.stored())
        assert aws.uploads() == []
        assert f"bench/{live.name}/in-use.bin" in aws.stored()
    assert sorted(aws.stored()) == ["bench/ckptbench-scratch-1-00ff00ff/shard.bin", "bench/step-1/manifest.json"]


def test_not_modified_to_a_conditional_put_is_a_failed_condition(aws: Aws):
    """A server that answers an ``If-None-Match: *`` PUT over an existing object with 304 (RFC 7232's
    answer to a GET, which some MinIO releases give) refuses the write as a 412 would."""
    from botocore.stub import Stubber

    store = open_store(f"s3://{aws.bucket}/notmodified")
    with Stubber(store._control) as control:
        control.add_client_error("put_object", service_error_code="304", service_message="Not Modified",
                                 http_status_code=304)
        assert store.put_if(".ckptbench.lock", b"x") is None


@pytest.mark.parametrize(("profile", "option", "signed"), [
    ("true", None, True),
    ("true", False, False),
    (None, None, False),  # ckptbench's default: UNSIGNED-PAYLOAD (each tensor's CRC-32C is checked on load)
])
def test_payload_signing_follows_the_profile(aws: Aws, profile: str | None, option: bool | None, signed: bool):
    if profile:
        aws.config.write_text(f"[default]\ns3 =\n  payload_signing_enabled = {profile}\n")
    options = {} if option is None else {"sign_payload": option}
    url = f"s3://{aws.bucket}/signed"
    requests = Requests(open_store(url, options))
    ckptbench.save(state(1), url, storage_options=options)
    shards = [headers for method, url, headers in requests.sent if method == "PUT" and "/shard-" in url]
    assert shards
    assert all((headers["x-amz-content-sha256"] != "UNSIGNED-PAYLOAD") == signed for headers in shards)


@pytest.fixture(scope="module")
def tls_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """moto's S3 over https with a self-signed certificate for localhost: (endpoint, the certificate)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    where = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (where / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (where / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    with _moto_server((str(where / "cert.pem"), str(where / "key.pem"))) as port:
        yield f"https://localhost:{port}", where / "cert.pem"


def test_aws_ca_bundle_reaches_every_client(aws: Aws, monkeypatch: pytest.MonkeyPatch, tls_endpoint):
    """A server whose certificate only AWS_CA_BUNDLE vouches for (a private CA): boto3, s3fs and the
    CRT all verify it with that bundle."""
    import boto3

    endpoint, certificate = tls_endpoint
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(certificate))
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=aws.bucket)
    clients = ["boto3", "s3fs"]
    with contextlib.suppress(ImportError):
        import awscrt.s3  # noqa: F401

        clients.append("crt")
    for client in clients:
        url, sd = f"s3://{aws.bucket}/{client}", state(len(client))
        ckptbench.save(sd, url, storage_options={"client": client, "max_attempts": 2})
        assert_same(sd, ckptbench.load(url, storage_options={"client": client, "max_attempts": 2}))


@pytest.mark.parametrize("listing_allowed", [True, False])
def test_a_policy_that_allows_listing_only_under_the_prefix(aws: Aws, listing_allowed: bool):
    """HeadBucket needs s3:ListBucket on the whole bucket; a policy that grants it only with an s3:prefix
    condition denies HeadBucket (403) and allows listing under the prefix: the save goes on."""
    from botocore.stub import Stubber

    store = S3Store(f"s3://{aws.bucket}/team/run")
    with Stubber(store._control) as control:
        control.add_client_error("head_bucket", service_error_code="403", http_status_code=403)
        if listing_allowed:
            control.add_response("list_objects_v2", {"KeyCount": 0},
                                 {"Bucket": aws.bucket, "Prefix": "team/run/", "MaxKeys": 1})
            store.prepare()
        else:
            control.add_client_error("list_objects_v2", service_error_code="AccessDenied", http_status_code=403)
            with pytest.raises(TargetError, match="access denied"):
                store.prepare()
        control.assert_no_pending_responses()


def test_s3fs_style_storage_options_are_applied_or_refused(aws: Aws):
    """The storage options an fsspec user passes for s3:// (s3fs's client_kwargs and config_kwargs) reach
    the same settings as ours; what ckptbench would not apply is one line, not silently dropped."""
    from ckptbench.storage.s3 import S3Options

    options = S3Options.from_mapping({
        "client_kwargs": {"endpoint_url": aws.endpoint, "region_name": "eu-central-1",
                          "aws_access_key_id": "AKIDNESTED", "aws_secret_access_key": "s"},
        "config_kwargs": {"s3": {"addressing_style": "virtual"}, "retries": {"max_attempts": 4},
                          "read_timeout": 30}})
    assert (options.endpoint_url, options.region_name, options.key) == (aws.endpoint, "eu-central-1", "AKIDNESTED")
    assert (options.addressing_style, options.max_attempts, options.read_timeout_s) == ("virtual", 5, 30.0)
    assert S3Options.from_mapping({"addressing_style": "path", "config_kwargs": {}}).addressing_style == "path"
    for bad in ({"client_kwargs": {"verify": False}}, {"config_kwargs": {"proxies": {"https": "p:1"}}},
                {"config_kwargs": {"retries": {"mode": "adaptive"}}}, {"client_kwargs": "http://h:1"}):
        with pytest.raises(UsageError, match="storage option (client|config)_kwargs") as info:
            S3Options.from_mapping(bad)
        assert "\n" not in str(info.value)
    store = open_store(f"s3://{aws.bucket}/nested", {"client_kwargs": {"endpoint_url": aws.endpoint}})
    ckptbench.save(state(1), store.url, storage_options={"client_kwargs": {"endpoint_url": aws.endpoint}})
    assert store.endpoint_source == "storage_options endpoint_url"


def _plant_dead_scratch(aws: Aws, name: str, record: bytes | None = None) -> str:
    """A scratch prefix ``bench/NAME/`` with one object and an owner record (by default one of this host
    whose process is gone: this pid with another start time); its URL."""
    import dataclasses

    from ckptbench.storage import owner
    from ckptbench.storage.local_target import SCRATCH_OWNER

    if record is None:
        record = dataclasses.replace(owner.ProcessOwner.me(), process_start="1").encode()
    client = aws.client()
    client.put_object(Bucket=aws.bucket, Key=f"bench/{name}/shard-00000.bin", Body=b"x" * 100)
    client.put_object(Bucket=aws.bucket, Key=f"bench/{name}/{SCRATCH_OWNER}", Body=record)
    return f"s3://{aws.bucket}/bench/{name}"


def test_clean_keeps_the_owner_record_while_objects_it_could_not_delete_remain(aws: Aws, cli, monkeypatch):
    """A prefix whose objects could not all be deleted keeps its owner record, so that the next
    ``clean`` still knows whose it is and removes it then."""
    from ckptbench.storage.local_target import SCRATCH_OWNER
    from ckptbench.storage.s3 import S3Store

    url = _plant_dead_scratch(aws, "ckptbench-scratch-7-0a0a0a0a")
    delete_keys = S3Store._delete_keys
    monkeypatch.setattr(S3Store, "_delete_keys",  # the server refuses to delete the data objects
                        lambda self, keys: delete_keys(self, [k for k in keys if k.endswith(SCRATCH_OWNER)]))
    failed = cli("clean", f"s3://{aws.bucket}/bench", "--json")
    assert failed.exit_code == 1
    assert [e["action"] for e in json.loads(failed.stdout)["entries"]] == ["kept"]
    assert f"bench/ckptbench-scratch-7-0a0a0a0a/{SCRATCH_OWNER}" in aws.stored()
    monkeypatch.setattr(S3Store, "_delete_keys", delete_keys)
    doc = cli.json("clean", f"s3://{aws.bucket}/bench")
    assert [(e["path"], e["action"]) for e in doc["entries"]] == [(url, "removed")]
    assert aws.stored() == []


@pytest.mark.parametrize("record", [b"[" * 4000, b'{"host": "' + b"h" * (8 << 20) + b'"}'])
def test_clean_keeps_a_prefix_whose_owner_record_is_hostile(aws: Aws, cli, record: bytes):
    """An owner record nested past the JSON parser's depth, or far larger than any record, is no owner:
    the prefix is kept, and ``clean`` goes on."""
    _plant_dead_scratch(aws, "ckptbench-scratch-8-0b0b0b0b", record)
    doc = cli.json("clean", f"s3://{aws.bucket}/bench")
    assert [(e["action"], e["state"]) for e in doc["entries"]] == [("kept", "unknown owner")]
    assert len(aws.stored()) == 2


def test_clean_keeps_a_prefix_of_another_boot_of_a_machine_like_this_one(aws: Aws, cli):
    """A record with this host's name and machine id but another boot may come from a clone of this machine
    (one image: same name, same machine id) sharing the bucket and running now: kept, never removed."""
    import dataclasses

    from ckptbench.storage import owner

    clone = dataclasses.replace(owner.ProcessOwner.me(), boot_id="another-boot").encode()
    _plant_dead_scratch(aws, "ckptbench-scratch-9-0c0c0c0c", clone)
    doc = cli.json("clean", f"s3://{aws.bucket}/bench")
    assert [(e["action"], e["state"]) for e in doc["entries"]] == [("kept", "other boot")]
    assert len(aws.stored()) == 2


def test_clean_keeps_the_owner_record_while_uploads_it_could_not_list_may_be_open(aws: Aws, cli, monkeypatch):
    """Open multipart uploads bill their parts: a prefix whose uploads could not be listed (so not aborted)
    keeps its owner record, and the next ``clean`` aborts them and removes it."""
    from ckptbench.storage.local_target import SCRATCH_OWNER
    from ckptbench.storage.s3 import S3Store

    url = _plant_dead_scratch(aws, "ckptbench-scratch-10-0d0d0d0d")
    key = "bench/ckptbench-scratch-10-0d0d0d0d/shard-00001.bin"
    aws.client().create_multipart_upload(Bucket=aws.bucket, Key=key)
    call = S3Store._call

    def refuse_listing_uploads(self, client, action, name, method, **kwargs):
        if method == "list_multipart_uploads":
            raise ckptbench.errors.StorageIOError("listing uploads refused")
        return call(self, client, action, name, method, **kwargs)

    monkeypatch.setattr(S3Store, "_call", refuse_listing_uploads)
    failed = cli("clean", f"s3://{aws.bucket}/bench", "--json")
    assert failed.exit_code == 1
    assert f"bench/ckptbench-scratch-10-0d0d0d0d/{SCRATCH_OWNER}" in aws.stored()
    monkeypatch.setattr(S3Store, "_call", call)
    doc = cli.json("clean", f"s3://{aws.bucket}/bench")
    assert [(e["path"], e["action"]) for e in doc["entries"]] == [(url, "removed")]
    assert aws.stored() == [] and not aws.client().list_multipart_uploads(Bucket=aws.bucket).get("Uploads")


def test_clean_sizes_a_dead_prefix_from_its_listing_not_a_head_per_object(aws: Aws, cli, monkeypatch):
    """A killed run's prefix can hold thousands of objects: ``clean`` sizes it from the listing's pages,
    one request per thousand objects, instead of a HeadObject each, and reports their bytes exactly."""
    import signal
    import subprocess

    from ckptbench.storage.s3 import S3Store

    url = f"s3://{aws.bucket}/sized"
    done = subprocess.run([sys.executable, "-c", _KILLED_RUN, url], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    client = aws.client()
    stored = client.list_objects_v2(Bucket=aws.bucket, Prefix="sized/")["Contents"]
    heads: list[str] = []
    original = S3Store.size

    def counted(self, name):
        heads.append(name)
        return original(self, name)

    monkeypatch.setattr(S3Store, "size", counted)
    doc = cli.json("clean", url, "--dry-run")
    [entry] = doc["entries"]
    assert entry["action"] == "would remove" and entry["size_bytes"] == sum(o["Size"] for o in stored)
    assert heads == []


def test_clean_takes_the_endpoint_and_credentials_on_the_command_line(aws: Aws, cli, monkeypatch):
    """As bench, preflight and compare do: a run given --endpoint-url and --storage-option key/secret (no AWS
    environment) leaves prefixes that clean, given the same, finds and removes; on a directory both are refused."""
    import signal
    import subprocess

    url = f"s3://{aws.bucket}/options"
    done = subprocess.run([sys.executable, "-c", _KILLED_RUN, url], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    options = ["--endpoint-url", aws.endpoint, "--storage-option", "key=testing", "--storage-option", "secret=testing"]
    doc = cli.json("clean", url, *options)
    assert [e["action"] for e in doc["entries"]] == ["removed"]
    assert aws.stored("options/") == [] and aws.uploads() == []
    refused = cli("clean", str(Path.cwd()), "--endpoint-url", aws.endpoint)
    assert refused.exit_code == 2 and "apply to object storage" in refused.stderr
