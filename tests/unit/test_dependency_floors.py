"""What ckptbench does with the oldest releases pyproject.toml allows, here with the newest installed: each
test takes away (or puts back) what the old release lacks or does. ``tests/perf/floors_check.sh`` runs the
no-Ceph tests with those releases themselves."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import click
import pytest

from ckptbench import cli as cli_module
from ckptbench.errors import ConfigError, MissingDependencyError


class _Sent(Exception):
    """Raised where a request would go out: the test has what it wanted to see."""


def _offline_s3_client() -> Any:
    boto3 = pytest.importorskip("boto3")
    return boto3.session.Session().client("s3", endpoint_url="http://127.0.0.1:9", region_name="us-east-1",
                                          aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret")


def _headers_sent(client: Any, **condition: str) -> dict[str, str]:
    """The headers of ``client``'s PutObject with ``condition``, caught as it is sent."""
    sent: list[dict[str, str]] = []

    def catch(request: Any, **_: Any) -> None:
        sent.append(dict(request.headers.items()))
        raise _Sent

    client.meta.events.register("before-send.s3.PutObject", catch)
    try:
        with pytest.raises(_Sent):
            client.put_object(Bucket="bucket", Key="lock", Body=b"me", **condition)
    finally:
        client.meta.events.unregister("before-send.s3.PutObject", catch)
    return {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
            for k, v in sent[-1].items()}


def test_conditional_writes_go_as_headers_where_botocore_has_no_such_parameter():
    """botocore < 1.35.2 has no IfNoneMatch on PutObject, < 1.35.69 no IfMatch: the save lock's
    conditional writes then go as their headers, signed like the rest."""
    from botocore.exceptions import ParamValidationError

    from ckptbench.storage.s3 import CONDITIONAL_PUT_HEADERS, _send_conditions_as_headers

    client = _offline_s3_client()
    members = client.meta.service_model.operation_model("PutObject").input_shape.members
    for name in CONDITIONAL_PUT_HEADERS:  # this client's model as an old botocore's
        members.pop(name, None)
    with pytest.raises(ParamValidationError, match="IfNoneMatch"):
        client.put_object(Bucket="bucket", Key="lock", Body=b"me", IfNoneMatch="*")

    _send_conditions_as_headers(client)
    created = _headers_sent(client, IfNoneMatch="*")
    assert created["If-None-Match"] == "*" and "If-Match" not in created
    assert "if-none-match" in created["Authorization"]
    renewed = _headers_sent(client, IfMatch='"abc"')
    assert renewed["If-Match"] == '"abc"' and "If-None-Match" not in renewed
    assert "If-Match" not in _headers_sent(client)


@pytest.mark.parametrize("missing", ["S3RetryMode", "NONE"])
def test_an_awscrt_whose_retries_cannot_be_turned_off_is_refused(monkeypatch: pytest.MonkeyPatch, missing: str):
    """awscrt 0.37 has S3RetryConfig but no S3RetryMode; 0.38.1 has S3RetryMode.NONE, what the CRT client needs."""
    s3 = pytest.importorskip("awscrt.s3")
    from ckptbench.storage.s3_clients import require

    require("crt")
    if missing == "S3RetryMode":
        monkeypatch.delattr(s3, "S3RetryMode")
    else:
        monkeypatch.setattr(s3, "S3RetryMode", type("S3RetryMode", (), {"STANDARD": 0}))
    with pytest.raises(MissingDependencyError, match=r"newer awscrt \(0\.38\.1"):
        require("crt")


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, 3, True])
def test_a_choice_given_anything_but_a_string_in_a_config_file_is_refused(value: Any):
    """click < 8.2's Choice looks the value up in a dict: an array or a table raised TypeError there."""
    with pytest.raises(ConfigError, match=r"\[bench\] format = .* is not one of 'table', 'json', 'csv'"):
        cli_module.config_defaults({"bench": {"format": value}}, "c.toml")


def test_sigterm_exits_143_when_click_drops_the_interrupt_it_replaces(monkeypatch: pytest.MonkeyPatch):
    """click < 8.1.4 raises its Abort ``from None`` in place of the KeyboardInterrupt (our Terminated):
    the exit status still says SIGTERM."""

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are the main thread's")

    def main_of_click_8_1_0(group: click.Group, *args: Any, **kwargs: Any) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler's exception ends it
        except KeyboardInterrupt:
            raise click.Abort() from None
        return 0

    monkeypatch.setattr(click.Group, "main", main_of_click_8_1_0)
    assert cli_module._run(cli_module.main, ["interval"], "ckptbench", {}) == 128 + signal.SIGTERM


def test_a_torch_older_than_the_dcp_integration_needs_is_told_so(monkeypatch: pytest.MonkeyPatch):
    """torch >= 2.2 is allowed; the DCP StorageWriter/Reader need 2.7's transform descriptors. An older torch,
    which has no DCP _extension module either, gets the error that says so, not an ImportError."""
    import dataclasses

    from torch.distributed.checkpoint import filesystem

    from ckptbench.integrations import dcp

    @dataclasses.dataclass
    class _StorageInfo:  # an older torch's: no transform_descriptors
        relative_path: str
        offset: int
        length: int

    monkeypatch.setattr(filesystem, "_StorageInfo", _StorageInfo)
    monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint._extension", None)
    with pytest.raises(MissingDependencyError, match=r"needs torch >= 2\.7"):
        dcp._classes.__wrapped__()  # around the cache: the classes this torch builds stay as they are


def test_the_shoot_outs_dcp_writer_runs_its_async_round_only_where_torch_has_async_save(monkeypatch):
    """``dcp.async_save`` came with torch 2.3 (the package accepts 2.2): the dcp competitor then has no async
    round, instead of an AttributeError in it."""
    import torch.distributed.checkpoint as dcp

    from ckptbench.bench.writers import DcpContender

    assert DcpContender().supports_async is True
    monkeypatch.delattr(dcp, "async_save")
    assert DcpContender().supports_async is False
