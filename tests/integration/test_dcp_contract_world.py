"""ckptbench's DCP Writer/Reader across world sizes, as training jobs that change their parallelism use them:
a checkpoint saved by one process is loaded by two gloo ranks into DTensor and ShardedTensor shards, and one
saved by two ranks (sharded evenly, unevenly and with an empty shard, replicated, ShardedTensor) is loaded by
one process into whole tensors, each with our writer and torch's FileSystemWriter, read by our reader and
torch's; an FSDP2 (``fully_shard``) model and its optimizer, through ``get_state_dict``, saved by the two
ranks, go back into FSDP2 and into one process's plain model. The two ranks also save
with ``dcp.async_save(async_checkpointer_type=PROCESS)`` (the writer and the staged state cross a process
boundary) and per rank with ``use_collectives=False, overwrite=False`` where rank 1 starts only once rank 0
has committed.

This file is also the worker of the two-rank part (``torchrun ... test_dcp_contract_world.py OUT_DIR``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from ckptbench.integrations.dcp import Reader, Writer, extension_registry

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

FULL = torch.arange(16 * 12, dtype=torch.float32).reshape(16, 12)  # sharded by DTensor
ROWS = torch.arange(10 * 4, dtype=torch.int32).reshape(10, 4)  # sharded by rows as a ShardedTensor
UNEVEN = torch.arange(15 * 3, dtype=torch.float64).reshape(15, 3)  # 8 rows on rank 0, 7 on rank 1
ONE_ROW = torch.arange(4, dtype=torch.bfloat16).reshape(1, 4)  # rank 1's shard of it is empty
WRITERS = {"ours": Writer, "torch": FileSystemWriter}
READERS = {"ours": Reader, "torch": lambda path: FileSystemReader(path, _extension_registry=extension_registry())}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _trained(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
        optim.step()
        optim.zero_grad()
    return optim


@pytest.mark.slow  # two ranks and the async checkpoint process each import torch: 25-50 s on two shared cores
def test_checkpoints_move_between_one_process_and_two_ranks(tmp_path: Path) -> None:
    for name, writer in WRITERS.items():
        dcp.save({"d": FULL.clone(), "rows": ROWS.clone(), "step": 6}, storage_writer=writer(tmp_path / f"one_{name}"))

    # --standalone: torchrun's own rendezvous on a free local port; each rank asserts what it loads
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    ranks = subprocess.run([*torchrun, str(Path(__file__).resolve()), str(tmp_path)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert ranks.returncode == 0, ranks.stdout[-3000:] + ranks.stderr[-6000:]

    for writer in WRITERS:
        for reader in READERS:
            target = {"d": torch.zeros(16, 12), "r": torch.zeros(2, 12), "rows": torch.zeros(10, 4, dtype=torch.int32),
                      "uneven": torch.zeros_like(UNEVEN), "one_row": torch.zeros_like(ONE_ROW), "step": None}
            dcp.load(target, storage_reader=READERS[reader](tmp_path / f"two_{writer}"))
            assert torch.equal(target["d"], FULL) and torch.equal(target["r"], FULL[:2]), (writer, reader)
            assert torch.equal(target["uneven"], UNEVEN) and torch.equal(target["one_row"], ONE_ROW), (writer, reader)
            assert torch.equal(target["rows"], ROWS) and target["step"] == 5, (writer, reader)

    # An FSDP2 model and its optimizer, saved by two ranks through get_state_dict, into one process's.
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    expected = torch.load(tmp_path / "fsdp_full.pt", weights_only=True)
    for reader in READERS:
        model = _model()
        optim = _trained(model, lr=1.0)
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, storage_reader=READERS[reader](tmp_path / "fsdp"))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        for name, value in model.state_dict().items():
            assert torch.equal(value, expected["model"][name]), (reader, name)
        exp_avg = {k: v["exp_avg"] for k, v in optim.state_dict()["state"].items()}
        assert exp_avg.keys() == expected["exp_avg"].keys(), reader
        assert all(torch.equal(exp_avg[k], v) for k, v in expected["exp_avg"].items()), reader
        assert optim.param_groups[0]["lr"] == 0.01, reader


def _worker(out: Path, rank: int, world: int) -> None:
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import Shard as TensorShard
    from torch.distributed._shard.sharded_tensor import ShardMetadata, init_from_local_shards
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    rows = ROWS.shape[0] // world

    def row_shards(full: torch.Tensor) -> object:
        local = full[rank * rows:(rank + 1) * rows].clone()
        return init_from_local_shards([TensorShard(local, ShardMetadata([rank * rows, 0], [rows, 4], f"rank:{rank}/cpu"))],
                                      list(full.shape))

    # One process's checkpoint, loaded into two ranks' shards (DTensor by columns, ShardedTensor by rows).
    for name in WRITERS:
        for reader in READERS:
            target = {"d": distribute_tensor(torch.zeros(16, 12), mesh, [Shard(1)]),
                      "rows": row_shards(torch.zeros_like(ROWS)), "step": None}
            dcp.load(target, storage_reader=READERS[reader](out / f"one_{name}"))
            assert torch.equal(target["d"].full_tensor(), FULL), (name, reader)
            assert torch.equal(target["rows"].local_shards()[0].tensor, ROWS[rank * rows:(rank + 1) * rows]), name
            assert target["step"] == 6

    def state() -> dict:
        return {"d": distribute_tensor(FULL.clone(), mesh, [Shard(0)]),
                "r": distribute_tensor(FULL[:2].clone(), mesh, [Replicate()]), "rows": row_shards(ROWS),
                "uneven": distribute_tensor(UNEVEN.clone(), mesh, [Shard(0)]),
                "one_row": distribute_tensor(ONE_ROW.clone(), mesh, [Shard(0)]), "step": 5}

    for name, writer in WRITERS.items():
        dcp.save(state(), storage_writer=writer(out / f"two_{name}"))

    # The process-based async checkpointer pickles the writer and the staged state to its own process.
    dcp.async_save(state(), storage_writer=Writer(out / "process"),
                   async_checkpointer_type=AsyncCheckpointerType.PROCESS).result()
    target = {"d": distribute_tensor(torch.zeros(16, 12), mesh, [Shard(1)]),
              "uneven": distribute_tensor(torch.zeros_like(UNEVEN), mesh, [Shard(1)]),
              "one_row": distribute_tensor(torch.zeros_like(ONE_ROW), mesh, [Replicate()]), "step": None}
    dcp.load(target, storage_reader=Reader(out / "process"))
    assert torch.equal(target["d"].full_tensor(), FULL) and target["step"] == 5
    assert torch.equal(target["uneven"].full_tensor(), UNEVEN) and torch.equal(target["one_row"].full_tensor(), ONE_ROW)

    # FSDP2 (fully_shard): model and optimizer through get_state_dict, loaded into another sharded model.
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    def sharded_model() -> torch.nn.Module:
        model = _model()
        for module in (model[0], model[2], model):
            fully_shard(module, mesh=mesh)
        return model

    model = sharded_model()
    optim = _trained(model, lr=0.01)
    model_sd, optim_sd = get_state_dict(model, optim)  # the live parameters and optimizer state
    full = {"model": {k: v.full_tensor() for k, v in model.state_dict().items()},
            "exp_avg": {k: v["exp_avg"].full_tensor() for k, v in optim.state_dict()["state"].items()}}
    probe = torch.randn(3, 8)
    expected = model(probe)
    if rank == 0:
        torch.save(full, out / "fsdp_full.pt")
    # The save's collectives run on a group of their own (as torchtitan does): training's all-gathers go
    # on in the meantime on the default one.
    saved = dcp.async_save({"model": model_sd, "optim": optim_sd}, storage_writer=Writer(out / "fsdp"),
                           process_group=dist.new_group(backend="gloo"))
    _trained(model, lr=0.5)  # training goes on: the save keeps what was staged
    saved.result()
    again = sharded_model()
    again_optim = _trained(again, lr=1.0)
    model_sd, optim_sd = get_state_dict(again, again_optim)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=Reader(out / "fsdp"))
    set_state_dict(again, again_optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert all(torch.equal(v.full_tensor(), full["model"][k]) for k, v in again.state_dict().items())
    assert torch.equal(again(probe), expected)

    # Per-rank saves (no collectives): rank 1 plans its save after rank 0 committed __0.metadata; with
    # overwrite=False that is no checkpoint already there.
    if rank == 1:
        deadline = time.monotonic() + 60
        while not (out / "per_rank" / "__0.metadata").exists():
            assert time.monotonic() < deadline, "rank 0 never committed its per-rank metadata"
            time.sleep(0.05)
    mine = torch.full((5,), rank + 1, dtype=torch.int64)
    dcp.save({"mine": mine, "step": 7}, storage_writer=Writer(out / "per_rank", overwrite=False), use_collectives=False)
    target = {"mine": torch.zeros(5, dtype=torch.int64), "step": None}
    dcp.load(target, storage_reader=Reader(out / "per_rank"))
    assert torch.equal(target["mine"], mine) and target["step"] == 7


if __name__ == "__main__":
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        _worker(Path(sys.argv[1]), dist.get_rank(), dist.get_world_size())
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # no interpreter teardown, where torch 2.13 may abort after an async_save over gloo (test_dcp.py)
