"""``CheckpointManager`` on S3 (Ceph RGW): steps listed from the bucket, retention, leftovers, loads."""

from __future__ import annotations

import pytest
import torch

import ckptbench
from ckptbench.errors import StepNotFoundError

pytestmark = pytest.mark.s3


def test_manager_on_s3(s3_server, s3_bucket):
    options = s3_server.options()
    root = f"s3://{s3_bucket}/run"
    client = s3_server.client()
    # an interrupted save of step 9: a shard, no manifest
    client.put_object(Bucket=s3_bucket, Key="run/step-00000009/shard-0123abcd-00000.bin", Body=b"x" * 10)
    with ckptbench.CheckpointManager(root, keep_last=2, storage_options=options) as manager:
        assert manager.steps() == []
        for step in (1, 2):
            manager.save(step, {"w": torch.full((4096,), float(step)), "step": step})
        manager.save(3, {"w": torch.full((4096,), 3.0), "step": 3}, async_=True).result()
        assert manager.steps() == [2, 3] and manager.latest() == 3
        assert manager.load()["step"] == 3
        assert torch.equal(manager.load(2)["w"], torch.full((4096,), 2.0))
        with pytest.raises(StepNotFoundError, match="committed steps: 2, 3"):
            manager.load(1)
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket).get("Contents", []))
    assert {k.split("/")[1] for k in keys} == {"step-00000002", "step-00000003"}
    assert not any(k.endswith(".ckptbench.lock") for k in keys)


@pytest.mark.parametrize("root", ["run//a", "/run"])
def test_retention_under_a_prefix_with_empty_segments_keeps_to_its_own_keys(s3_server, s3_bucket, root):
    """A root whose prefix has empty segments (``run//a``, ``/run``) is its keys as written: its steps are
    listed and retired there, and the steps under the prefix it would collapse to (``run/a``, ``run``), which
    are another location's, are neither listed nor removed."""
    options = s3_server.options()
    client = s3_server.client()
    other = root.strip("/").replace("//", "/")
    foreign = [f"{other}/step-00000001/manifest.json", f"{other}/step-00000001/shard-0123abcd-00000.bin"]
    for key in foreign:
        client.put_object(Bucket=s3_bucket, Key=key, Body=b"{}")
    with ckptbench.CheckpointManager(f"s3://{s3_bucket}/{root}", keep_last=1, storage_options=options) as manager:
        for step in (2, 3):
            manager.save(step, {"w": torch.full((4096,), float(step))})
        assert manager.steps() == [3]
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket).get("Contents", []))
    ours = [k for k in keys if k not in foreign]
    assert ours and all(k.startswith(f"{root}/step-00000003/") for k in ours), keys
    assert set(foreign) <= set(keys)


def test_a_remote_tier_on_s3_serves_the_steps_the_local_one_lost(s3_server, s3_bucket, tmp_path):
    import shutil

    options = s3_server.options()
    client = s3_server.client()
    remote = f"s3://{s3_bucket}/remote"
    local = tmp_path / "local"

    def state(step: int) -> dict:
        return {"w": torch.full((8192,), float(step)), "b": torch.arange(16) + step, "step": step}

    with ckptbench.CheckpointManager(local, keep_last=1, remote=remote, remote_every=2, keep_remote=2,
                                     remote_storage_options=options) as manager:
        for step in range(1, 8):
            manager.save(step, state(step), async_=step % 2 == 1)
            manager.wait_remote()
        assert manager.remote_status().last_error is None
        assert manager.steps("remote") == [4, 6] and manager.steps("local") == [7]
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket).get("Contents", []))
    assert {k.split("/")[1] for k in keys} == {"step-00000004", "step-00000006"}
    assert not any(k.endswith(".ckptbench.lock") for k in keys)
    shutil.rmtree(local)
    with ckptbench.CheckpointManager(local, remote=remote, remote_storage_options=options) as manager:
        assert manager.latest() == 6
        loaded = manager.load()
        assert loaded["step"] == 6 and torch.equal(loaded["w"], state(6)["w"]) and torch.equal(loaded["b"],
                                                                                              state(6)["b"])
    # an unreachable remote tier: local saves go on, the status says why the copy waits
    unreachable = {**options, "endpoint_url": "http://127.0.0.1:9", "max_attempts": 1}
    with ckptbench.CheckpointManager(tmp_path / "other", remote=remote, remote_storage_options=unreachable) as manager:
        manager.save(1, state(1))
        status = manager.wait_remote()
        assert status.pending_step == 1 and status.last_error is not None
        assert manager.load()["step"] == 1


def test_a_remote_tier_that_stops_answering_is_timed_out_and_caught_up(s3_server, s3_bucket, tmp_path):
    # the remote tier accepts connections and never answers (an OSD that stopped acknowledging, say): the
    # watchdog stops each drain after drain_timeout, local saves go on, the newest step due is kept locally
    # and drained once the remote tier answers again
    import shutil
    import time

    from test_s3_faults import faultproxy  # tests/servers/faultproxy.py, loaded once

    def state(step: int) -> dict:
        return {"w": torch.full((8192,), float(step)), "b": torch.arange(16) + step, "step": step}

    def wait_for(manager, done) -> None:
        deadline = time.monotonic() + 120
        while not done(manager.remote_status()) and time.monotonic() < deadline:
            time.sleep(0.05)

    local, remote = tmp_path / "local", f"s3://{s3_bucket}/remote"
    with faultproxy.FaultProxy(s3_server.endpoint) as proxy:
        options = s3_server.options(endpoint_url=proxy.endpoint)
        with ckptbench.CheckpointManager(local, keep_last=1, remote=remote, remote_storage_options=options,
                                         drain_timeout=8.0) as manager:  # a busy CI host spawns slowly
            for kind in ("PutObject", "UploadPart", "CreateMultipartUpload"):
                proxy.stall(None, kind=kind)
            manager.save(1, state(1))
            wait_for(manager, lambda s: s.stalls >= 1)
            status = manager.remote_status()
            assert status.stalls >= 1 and status.pending_step == 1 and status.drained_step is None
            assert "no progress for 8 s" in status.last_error
            manager.save(2, state(2))  # saves go on; step 2, newer, is the one to drain now
            assert manager.steps("local") == [2]
            assert manager.latest() == 2
            proxy.clear()
            wait_for(manager, lambda s: s.drained_step == 2)
            status = manager.wait_remote()
            assert status.drained_step == 2 and status.last_error is None
            assert manager.steps("remote") == [2]
    shutil.rmtree(local)
    with ckptbench.CheckpointManager(local, remote=remote, remote_storage_options=s3_server.options()) as manager:
        loaded = manager.load()
        assert loaded["step"] == 2 and torch.equal(loaded["w"], state(2)["w"]) and torch.equal(loaded["b"],
                                                                                              state(2)["b"])


@pytest.mark.parametrize("data_client", ["boto3", "crt"])
def test_a_drain_to_s3_streams_multipart_shards_bit_exact_and_refuses_damage(s3_server, s3_bucket, tmp_path,
                                                                             data_client):
    # shards of several parts (part_size 5 MiB): each uploaded part by part, completed after every read
    from ckptbench.checkpoint.drain import copy_checkpoint
    from ckptbench.errors import CorruptCheckpointError
    from ckptbench.storage.store import LocalStore, open_store

    if data_client == "crt":
        pytest.importorskip("awscrt")
    options = {**s3_server.options(), "part_size": "5MiB", "client": data_client}
    assert open_store(f"s3://{s3_bucket}/drained", options).upload_in_parts("probe", 1) is not None
    client = s3_server.client()
    generator = torch.Generator().manual_seed(5)
    saved = {"a": torch.randn(3_000_001, generator=generator), "b": torch.randn(1_234_567, generator=generator)}
    ckptbench.save(saved, tmp_path / "local", shard_size=8 * 2**20)
    shards = {p.name: p.read_bytes() for p in (tmp_path / "local").glob("shard-*")}
    assert len(shards) >= 2 and max(len(b) for b in shards.values()) > 5 * 2**20
    io = {"threads": 2, "block_size": 1 << 20, "direct": False}
    url = f"s3://{s3_bucket}/drained"
    copy_checkpoint(LocalStore(tmp_path / "local"), open_store(url, options), step=1, **io)
    loaded = ckptbench.load(url, storage_options=options)
    assert torch.equal(loaded["a"], saved["a"]) and torch.equal(loaded["b"], saved["b"])
    for name, data in shards.items():
        assert client.get_object(Bucket=s3_bucket, Key=f"drained/{name}")["Body"].read() == data

    ckptbench.save({"a": saved["a"] + 1, "b": saved["b"]}, tmp_path / "other", shard_size=8 * 2**20)
    shard = max((tmp_path / "other").glob("shard-*"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x55  # in the last part: the parts before it are uploaded by then
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        copy_checkpoint(LocalStore(tmp_path / "other"), open_store(url, options), step=2, **io)
    assert not client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads")  # aborted
    loaded = ckptbench.load(url, storage_options=options)  # the previous copy, as it was
    assert torch.equal(loaded["a"], saved["a"]) and torch.equal(loaded["b"], saved["b"])
