"""torch.distributed.checkpoint on ``s3://`` (Ceph RGW) through ckptbench's Writer and Reader: save,
async save and load round trips are bit-exact, resharded loads read byte ranges of the data objects,
a missing data object is a CorruptCheckpointError, and two gloo ranks save and load one checkpoint.

This file is also the worker of the two-rank test (``torchrun ... test_dcp_s3.py BUCKET OUT_DIR``;
endpoint and keys from the environment).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ckptbench.checkpoint.manifest import CorruptCheckpointError
from ckptbench.integrations.dcp import Reader, Writer

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def random_bits(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    numel = int(torch.Size(shape).numel())
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape).clone()


def make_state() -> dict:
    return {
        "model": {"big": random_bits(torch.float32, (1536, 1024), 1),  # 6 MiB: a multipart object
                  "bias": random_bits(torch.bfloat16, (48,), 2),
                  "strided": random_bits(torch.float32, (64, 48), 3)[::3, 1::2]},
        "optim": {"step": 12, "betas": (0.9, 0.99)},
    }


def zeros_like(state: dict) -> dict:
    return {k: zeros_like(v) if isinstance(v, dict) else torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
            for k, v in state.items()}


def assert_same(expected, got, path: str = "state") -> None:
    if isinstance(expected, torch.Tensor):
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape), path
        assert torch.equal(expected.contiguous().view(torch.uint8), got.contiguous().view(torch.uint8)), path
    elif isinstance(expected, dict):
        assert set(expected) == set(got), path
        for key in expected:
            assert_same(expected[key], got[key], f"{path}.{key}")
    else:
        assert expected == got, path


def keys(client, bucket: str, prefix: str) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


def test_save_and_load_round_trip_on_s3(s3_server, s3_bucket):
    options = s3_server.options(part_size="5MiB")
    url = f"s3://{s3_bucket}/dcp/step-1"
    state = make_state()
    writer = Writer(url, files_per_rank=2, storage_options=options)
    dcp.save(state, storage_writer=writer)
    names = [k.removeprefix("dcp/step-1/") for k in keys(s3_server.client(), s3_bucket, "dcp/step-1/")]
    assert ".metadata" in names and any(n.endswith(".distcp") for n in names)
    assert writer.last_stats is not None and writer.last_stats.sync == "s3-complete"

    loaded = zeros_like(state)
    dcp.load(loaded, storage_reader=Reader(url, storage_options=options))
    assert_same(state, loaded)
    assert s3_server.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_async_save_to_s3_then_load_a_slice(s3_server, s3_bucket):
    """async_save stages before returning; a load of one tensor reads only its range of an object."""
    options = s3_server.options()
    state = make_state()
    writer = Writer(f"s3://{s3_bucket}/unused", storage_options=options)
    future = dcp.async_save(state, storage_writer=writer, checkpoint_id=f"s3://{s3_bucket}/async")
    expected = state["model"]["big"].clone()
    state["model"]["big"].fill_(0)  # the caller may change its tensors once async_save returned
    future.result()

    reader = Reader(f"s3://{s3_bucket}/async", storage_options=options)
    ranges: list[tuple[str, int, int]] = []
    store_class = type(reader._store)  # S3Store
    store_read = store_class.read_ranges

    def spy(self, wanted, **kwargs):
        ranges.extend((name, offset, len(view)) for name, offset, view in wanted)
        return store_read(self, wanted, **kwargs)

    only_bias = {"model": {"bias": torch.zeros(48, dtype=torch.bfloat16)}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_class, "read_ranges", spy)
        dcp.load(only_bias, storage_reader=reader)
    assert_same(make_state()["model"]["bias"], only_bias["model"]["bias"])
    assert ranges and sum(n for _, _, n in ranges) < 2**20  # not the 6 MiB object holding "big"

    loaded = zeros_like(make_state())
    dcp.load(loaded, storage_reader=Reader(f"s3://{s3_bucket}/async", storage_options=options))
    assert_same(expected, loaded["model"]["big"])


def test_a_missing_data_object_is_a_corrupt_checkpoint(s3_server, s3_bucket):
    options = s3_server.options()
    url = f"s3://{s3_bucket}/broken"
    dcp.save(make_state(), storage_writer=Writer(url, storage_options=options))
    client = s3_server.client()
    data = next(k for k in keys(client, s3_bucket, "broken/") if k.endswith(".distcp"))
    data_url = f"{s3_bucket}/{data}"
    client.delete_object(Bucket=s3_bucket, Key=data)
    with pytest.raises(CheckpointException) as excinfo:  # DCP wraps a rank's error in it
        dcp.load(zeros_like(make_state()), storage_reader=Reader(url, storage_options=options))
    (failure, _trace), *_ = excinfo.value.failures.values()
    assert isinstance(failure, CorruptCheckpointError)
    assert f"data file s3://{data_url} of the checkpoint is missing" in str(failure)


# -- two ranks --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # three interpreters import torch on two cores
def test_two_gloo_ranks_save_and_load_on_s3(s3_server, s3_bucket, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AWS_ENDPOINT_URL": s3_server.endpoint,
           "AWS_ACCESS_KEY_ID": s3_server.key, "AWS_SECRET_ACCESS_KEY": s3_server.secret}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(Path(__file__).resolve()), s3_bucket, str(tmp_path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (tmp_path / "rank0.ok").exists() and (tmp_path / "rank1.ok").exists()
    names = [k.removeprefix("sync/") for k in keys(s3_server.client(), s3_bucket, "sync/")]
    assert ".metadata" in names and any(n.startswith("__0_") for n in names) and any(n.startswith("__1_") for n in names)


def _worker(bucket: str, out: Path) -> None:
    """One rank: DTensor shards and a rank-private tensor; save (sync and async) to s3://, load into
    the same sharding and into a different one (ranged reads of both ranks' objects)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    full = random_bits(torch.float32, (64, 48), 11)

    def state(zero: bool, placement: int = 0) -> dict:
        pick = torch.zeros_like if zero else (lambda t: t)
        return {"sharded": distribute_tensor(pick(full), mesh, [Shard(placement)]),
                f"rank{rank}": pick(torch.full((5,), rank + 1, dtype=torch.int64)),
                "step": None if zero else 42}

    def check(loaded: dict) -> None:
        assert_same(full, loaded["sharded"].full_tensor())
        assert torch.equal(loaded[f"rank{rank}"], torch.full((5,), rank + 1, dtype=torch.int64))
        assert loaded["step"] == 42

    dcp.save(state(False), storage_writer=Writer(f"s3://{bucket}/sync"))
    for placement in (0, 1):
        loaded = state(True, placement)
        dcp.load(loaded, storage_reader=Reader(f"s3://{bucket}/sync"))
        check(loaded)
    writer = Writer(f"s3://{bucket}/unused")
    dcp.async_save(state(False), storage_writer=writer, checkpoint_id=f"s3://{bucket}/async").result()
    loaded = state(True)
    dcp.load(loaded, storage_reader=Reader(f"s3://{bucket}/async"))
    check(loaded)
    dist.barrier()
    dist.destroy_process_group()
    (out / f"rank{rank}.ok").touch()


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]))
    os._exit(0)  # as tests/integration/test_dcp.py's worker: skip the interpreter teardown after async_save
