"""S3 clients (``storage_options["client"]``, ``--client``): save/load through each client against
RGW, bad client names and missing client packages as one-line errors (exit 2, nothing measured),
and the client named in results. The Store primitives on every client: ``test_conformance.py``."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from click.testing import CliRunner

import ckptbench
from ckptbench.cli import main
from ckptbench.errors import MissingDependencyError, UsageError
from ckptbench.storage.s3 import S3Options, S3Store
from ckptbench.storage.s3_clients import CLIENTS, DEFAULT_CLIENT

NEEDS = {"s3fs": "s3fs", "crt": "awscrt"}


def test_unknown_client_names_the_accepted_ones():
    with pytest.raises(UsageError) as excinfo:
        S3Options.from_mapping({"client": "minio"})
    assert "unknown S3 client 'minio'" in str(excinfo.value) and "boto3, s3fs, crt" in excinfo.value.hint
    assert S3Options.from_mapping({}).client == DEFAULT_CLIENT in CLIENTS


@pytest.mark.parametrize("client", ["s3fs", "crt"])
def test_a_missing_client_package_says_what_to_install(client, monkeypatch):
    module = NEEDS[client]
    # None in sys.modules: importing the client's module fails as if it were not installed
    monkeypatch.setitem(sys.modules, {"crt": "awscrt.s3"}.get(client, module), None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with pytest.raises(MissingDependencyError) as excinfo:
        S3Store("s3://bucket/x", {"client": client, "endpoint_url": "http://127.0.0.1:9"})
    assert f"pip install {module}" in excinfo.value.hint

    result = CliRunner().invoke(main, ["bench", "s3://bucket/x", "--client", client,
                                       "--endpoint-url", "http://127.0.0.1:9"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2 and f"pip install {module}" in result.stderr and "Traceback" not in result.stderr


def test_cli_client_choices():
    result = CliRunner().invoke(main, ["bench", "s3://bucket/x", "--client", "nope"])
    assert result.exit_code == 2 and "'boto3', 's3fs', 'crt'" in result.stderr
    result = CliRunner().invoke(main, ["bench", "/tmp", "--client", "s3fs"])
    assert result.exit_code == 2 and "apply to object storage" in result.stderr


@pytest.mark.s3
@pytest.mark.parametrize("client", CLIENTS)
def test_save_and_load_through_each_client(s3_server, s3_bucket, client):
    if client in NEEDS:
        pytest.importorskip(NEEDS[client], reason=f"the {client} S3 client needs {NEEDS[client]}")
    options = s3_server.options(client=client, part_size="5MiB")
    state = {"w": torch.arange(3 * 2**20, dtype=torch.float32), "b": torch.ones(7, dtype=torch.bfloat16), "step": 3}
    url = f"s3://{s3_bucket}/ckpt-{client}"
    ckptbench.save(state, url, storage_options=options)
    loaded = ckptbench.load(url, storage_options=options)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"]) and loaded["step"] == 3
    assert s3_server.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


@pytest.mark.s3
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("prefix", ["runs//c", "/lead"])
def test_each_client_puts_and_finds_the_keys_as_written(s3_server, s3_bucket, client, prefix):
    """Every client's data path (multipart uploads, ranged reads) takes a prefix with empty segments as the
    keys it names: nothing lands under the prefix it would collapse to, and a load finds the checkpoint."""
    if client in NEEDS:
        pytest.importorskip(NEEDS[client], reason=f"the {client} S3 client needs {NEEDS[client]}")
    options = s3_server.options(client=client, part_size="5MiB")
    state = {"w": torch.arange(3 * 2**20, dtype=torch.float32)}  # 12 MiB: a multipart upload
    ckptbench.save(state, f"s3://{s3_bucket}/{prefix}", storage_options=options)
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert keys and all(key.startswith(f"{prefix}/") for key in keys), keys
    assert torch.equal(ckptbench.load(f"s3://{s3_bucket}/{prefix}/", storage_options=options)["w"], state["w"])


@pytest.mark.s3
@pytest.mark.slow
def test_bench_records_the_client_and_recommend_names_it(s3_server, s3_bucket, monkeypatch, tmp_path):
    pytest.importorskip("awscrt", reason="the crt S3 client needs awscrt")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    result = CliRunner().invoke(main, ["bench", f"s3://{s3_bucket}/b", "--endpoint-url", s3_server.endpoint,
                                       "--client", "crt", "--size", "12MiB", "--object-size", "6MiB",
                                       "--concurrency", "2", "--part-size", "5MiB", "--repeat", "1", "--warmup", "0",
                                       "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["environment"]["target"]["client"] == "crt"
    saved = tmp_path / "s3.json"
    saved.write_text(result.stdout)
    advice = CliRunner().invoke(main, ["recommend", str(saved)])
    assert advice.exit_code == 0, advice.output
    assert 'client = "crt"' in advice.stdout and "measured with the crt client" in advice.stdout
    client = s3_server.client()
    assert client.list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0  # scratch removed


def test_the_s3torchconnector_writer_is_for_object_storage_only():
    from ckptbench.bench.writers import make_writer

    with pytest.raises(UsageError, match="s3:// only"):
        make_writer("s3torchconnector")
    with pytest.raises(UsageError, match="writes local files only"):
        make_writer("safetensors", objects=True)
