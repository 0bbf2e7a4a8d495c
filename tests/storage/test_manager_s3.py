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
