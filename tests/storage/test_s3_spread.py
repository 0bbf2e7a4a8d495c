"""``prefix_spread``: the objects a save writes lie under hashed sub-prefixes of the checkpoint, on
the real server (Ceph RGW); loads, listings, overwrites, deletes and retention find them, whatever
the storage options of the reader."""

from __future__ import annotations

import pytest
import torch

import ckptbench
from ckptbench.checkpoint.manifest import MANIFEST_NAME
from ckptbench.errors import UsageError
from ckptbench.storage.s3 import S3Options
from ckptbench.storage.store import open_store

pytestmark = pytest.mark.s3


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.randn(2**18, generator=g) for i in range(6)}  # 6 MiB: several shards


def same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def keys(s3_server, bucket: str, prefix: str) -> list[str]:
    client = s3_server.client()
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


@pytest.mark.parametrize("client", ["boto3", "s3fs", "crt"])
def test_shards_lie_under_spread_prefixes_and_load_with_any_setting(s3_server, s3_bucket, client):
    if client != "boto3":
        pytest.importorskip({"s3fs": "s3fs", "crt": "awscrt"}[client])
    url, expected = f"s3://{s3_bucket}/run/ckpt", state(1)
    spread = s3_server.options(prefix_spread=4, client=client)
    ckptbench.save(expected, url, shard_size=2**20, storage_options=spread)
    stored = keys(s3_server, s3_bucket, "run/ckpt/")
    shards = [k for k in stored if k.endswith(".bin")]
    assert len(shards) >= 4
    assert all(k.split("/")[2].endswith("-spread") for k in shards)  # run/ckpt/<h>-spread/shard-...bin
    assert len({k.split("/")[2] for k in shards}) >= 2  # spread over more than one sub-prefix
    assert f"run/ckpt/{MANIFEST_NAME}" in stored  # the commit stays where loads look first
    # Without the option (as a reader that never heard of it) and with it: bit-exact.
    assert same(ckptbench.load(url, storage_options=s3_server.options()), expected)
    assert same(ckptbench.load(url, storage_options=spread), expected)
    # A listing shows the flat names the manifest holds.
    listed = open_store(url, s3_server.options()).list()
    assert sorted(n for n in listed if n.endswith(".bin")) == sorted(k.rpartition("/")[2] for k in shards)


def test_overwrite_removes_the_old_spread_shards(s3_server, s3_bucket):
    url = f"s3://{s3_bucket}/ckpt"
    spread = s3_server.options(prefix_spread=8)
    ckptbench.save(state(2), url, shard_size=2**20, storage_options=spread)
    first = keys(s3_server, s3_bucket, "ckpt/")
    expected = state(3)
    ckptbench.save(expected, url, shard_size=2**20, storage_options=s3_server.options(), overwrite=True)
    after = keys(s3_server, s3_bucket, "ckpt/")
    assert not [k for k in first if k.endswith(".bin") and k in after]  # the first save's shards are gone
    assert same(ckptbench.load(url, storage_options=spread), expected)


def test_retention_deletes_spread_checkpoints(s3_server, s3_bucket):
    root = f"s3://{s3_bucket}/run"
    manager = ckptbench.CheckpointManager(root, keep_last=1, storage_options=s3_server.options(prefix_spread=4))
    for step in (1, 2):
        manager.save(step, state(step))
    manager.wait()
    left = keys(s3_server, s3_bucket, "run/")
    assert len({k.split("/")[1] for k in left}) == 1 and manager.steps() == [2]  # step 1 is gone
    assert any(k.endswith(".bin") and "-spread/" in k for k in left)
    assert same(manager.load(), state(2))
    manager.close()

def test_prefix_spread_bad_values_are_refused():
    with pytest.raises(UsageError):
        S3Options.from_mapping({"prefix_spread": -1})
    with pytest.raises(UsageError):
        S3Options.from_mapping({"prefix_spread": 10**6})
