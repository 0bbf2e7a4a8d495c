"""CUDA paths: device-to-host staging into the registered arena, and loading straight to the GPU.

Run on a machine with a GPU: ``pytest -m gpu tests/gpu``. Without one every test skips with the reason.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from ckptbench.checkpoint import Checkpointer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


def test_gpu_state_dict_round_trips_through_pinned_arena(tmp_path: Path):
    ckpt = Checkpointer()
    sd = {
        "w": torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16),
        "small": [torch.randn(7, device="cuda") for _ in range(1000)],
        "noncontig": torch.randn(64, 128, device="cuda").t(),
        "cpu": torch.arange(10),
    }
    ckpt.save(sd, tmp_path / "c")
    assert ckpt._arena._registered  # cudaHostRegister succeeded
    out = ckpt.load(tmp_path / "c", device="cuda")
    assert out["w"].device.type == "cuda" and torch.equal(out["w"], sd["w"])
    assert all(torch.equal(a, b) for a, b in zip(out["small"], sd["small"], strict=True))
    assert torch.equal(out["noncontig"], sd["noncontig"])
    ckpt.close()


def test_async_save_of_gpu_tensors_is_safe_to_mutate_after_return(tmp_path: Path):
    ckpt = Checkpointer()
    w = torch.randn(2048, 2048, device="cuda")
    expected = w.clone()
    handle = ckpt.save({"w": w}, tmp_path / "c", async_=True)
    w.zero_()
    handle.result(timeout=120)
    assert torch.equal(ckpt.load(tmp_path / "c", device="cuda")["w"], expected)
    ckpt.close()


def test_load_into_gpu_tensors(tmp_path: Path):
    ckpt = Checkpointer()
    sd = {"w": torch.randn(256, 256, device="cuda")}
    ckpt.save(sd, tmp_path / "c")
    live = {"w": torch.zeros(256, 256, device="cuda")}
    ckpt.load(tmp_path / "c", into=live)
    assert torch.equal(live["w"], sd["w"])
    ckpt.close()


def test_every_dtype_and_gathered_small_tensors_round_trip(tmp_path: Path):
    """Small CUDA tensors go through the on-device gather; big ones straight; both bit-exact."""
    g = torch.Generator(device="cuda").manual_seed(1)
    sd = {
        "many": [torch.randn(int(n), device="cuda", generator=g) for n in torch.randint(1, 5000, (3000,))],
        "big": torch.randn(3 * 2**20, device="cuda", generator=g),  # 12 MiB: copied directly
        "bool": torch.rand(101, device="cuda", generator=g) > 0.5,
        "complex": torch.randn(33, dtype=torch.complex64, device="cuda", generator=g).conj(),
        "bf16": torch.randn(7, 9, device="cuda", generator=g).to(torch.bfloat16),
        "int": torch.arange(-50, 50, device="cuda", dtype=torch.int16),
        "scalar": torch.tensor(1.5, device="cuda"),
        "empty": torch.empty(0, 4, device="cuda"),
    }
    ckpt = Checkpointer()
    ckpt.save(sd, tmp_path / "c")
    out = ckpt.load(tmp_path / "c", device="cuda")
    assert all(t.device.type == "cuda" for t in out["many"])
    assert all(torch.equal(a, b) for a, b in zip(out["many"], sd["many"], strict=True))
    for key in ("big", "bool", "bf16", "int", "scalar", "empty"):
        assert out[key].device.type == "cuda" and out[key].dtype == sd[key].dtype
        assert torch.equal(out[key], sd[key]), key
    assert torch.equal(out["complex"], sd["complex"].resolve_conj())
    cpu = ckpt.load(tmp_path / "c")  # the same checkpoint on the CPU
    assert torch.equal(cpu["big"], sd["big"].cpu())
    ckpt.close()


def test_gpu_load_does_not_alias_the_reused_read_buffer(tmp_path: Path):
    ckpt = Checkpointer()
    ckpt.save({"w": torch.ones(1000, device="cuda")}, tmp_path / "a")
    ckpt.save({"w": torch.full((1000,), 2.0, device="cuda")}, tmp_path / "b")
    a = ckpt.load(tmp_path / "a", device="cuda")
    b = ckpt.load(tmp_path / "b", device="cuda")
    assert torch.equal(a["w"], torch.ones(1000, device="cuda"))
    assert torch.equal(b["w"], torch.full((1000,), 2.0, device="cuda"))
    ckpt.close()


def _gpu_state(seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    raw = torch.randint(-128, 127, (10_000,), dtype=torch.int8, device="cuda", generator=g)
    return {
        "many": [torch.randn(int(n), device="cuda", generator=g) for n in torch.randint(1, 20_000, (2000,))],
        "odd": [raw[i:i + 17 * i + 1] for i in range(1, 40, 3)],  # contiguous, but at odd addresses
        "bf16": torch.randn(33, 65, device="cuda", generator=g).to(torch.bfloat16),
        "bool": torch.rand(1001, device="cuda", generator=g) > 0.5,
        "big": torch.randn(3 * 2**20, device="cuda", generator=g),
        "view": torch.randn(64, 48, device="cuda", generator=g).t(),
        "cpu": torch.arange(100),
    }


def _staged(state: dict) -> bytes:
    """The bytes of the shard files as staged into an arena that held other bytes before (0xAB): the
    padding must come out zero whichever way the tensors were copied."""
    from ckptbench.checkpoint.plan import plan_save
    from ckptbench.checkpoint.stage import Arena, stage

    plan, sources = plan_save(state, shard_size=4 * 2**20, shard_prefix="s")
    arena = Arena()
    arena.ensure(plan.arena_bytes)
    arena.bytes_tensor().fill_(0xAB)
    stage(plan, sources, arena, threads=2)
    out = b"".join(bytes(memoryview(arena.buffer)[s.arena_offset:s.arena_offset + s.nbytes]) for s in plan.shards)
    arena.close()
    return out


@pytest.mark.skipif(not hasattr(torch.cuda, "_compile_kernel"), reason="torch has no torch.cuda._compile_kernel")
@pytest.mark.parametrize(("run", "slots", "direct"), [(256 * 1024, 3, 0), (4096, 1, 0), (4096, 3, 0),
                                                     (256 * 1024, 3, 1)])
def test_gather_kernel_stages_the_same_bytes_as_torch_cat(monkeypatch, run, slots, direct):
    from ckptbench import knobs
    from ckptbench.checkpoint import gather

    assert gather.kernel_for(torch.device("cuda")) is not None  # NVRTC compiled it
    state = _gpu_state(2)
    monkeypatch.setattr(knobs, "STAGE_GATHER_MAPPED", direct)
    monkeypatch.setattr(knobs, "STAGE_GATHER_SLOTS", slots)
    monkeypatch.setattr(knobs, "STAGE_GATHER_RUN_BYTES", run)
    with_kernel = _staged(state)
    monkeypatch.setattr(knobs, "STAGE_GATHER_KERNEL", 0)
    with_cat = _staged(state)
    assert with_kernel == with_cat
    on_cpu = _staged({k: [t.cpu() for t in v] if isinstance(v, list) else v.cpu() for k, v in state.items()})
    assert with_kernel == on_cpu  # the engine's copies of the same tensors on the host


@pytest.mark.parametrize("own_stream", [False, True])
def test_staging_waits_for_work_queued_on_the_current_stream(tmp_path: Path, own_stream):
    """Tensors written by kernels still running when save() is called are saved with their final values,
    on the default stream and on a stream the caller made current (small tensors are staged on it)."""
    ckpt = Checkpointer()
    with torch.cuda.stream(torch.cuda.Stream()) if own_stream else contextlib.nullcontext():
        a = torch.randn(8192, 8192, device="cuda")
        for _ in range(5):
            a = a @ a / 8192  # queue milliseconds of work ahead of the fills
        outs = [torch.empty(1000, device="cuda").fill_(float(i)) for i in range(500)]
        ckpt.save({"outs": outs}, tmp_path / "c")
    got = ckpt.load(tmp_path / "c")
    assert all(torch.equal(t, torch.full((1000,), float(i))) for i, t in enumerate(got["outs"]))
    ckpt.close()


def test_dcp_writer_stages_gpu_tensors(tmp_path: Path):
    import torch.distributed.checkpoint as dcp

    from ckptbench.integrations.dcp import Reader, Writer

    state = _gpu_state(4)
    state.pop("view")  # DCP saves views as they are; the round trip below compares values
    flat = {f"many{i}": t for i, t in enumerate(state.pop("many"))} | {f"odd{i}": t for i, t in
                                                                          enumerate(state.pop("odd"))} | state
    expected = {k: v.clone() for k, v in flat.items()}
    writer = Writer(tmp_path / "unused")
    future = dcp.async_save(flat, storage_writer=writer, checkpoint_id=tmp_path / "c")
    for t in flat.values():
        t.zero_()  # staged before async_save returned
    future.result()
    loaded = {k: torch.empty_like(v) for k, v in expected.items()}
    dcp.load(loaded, storage_reader=Reader(tmp_path / "c"))
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)
    writer.close()


def test_checkpoint_bench_with_the_state_dict_on_the_gpu(cli, tmp_path: Path):
    """`bench --workload checkpoint --device cuda`: every writer saves GPU tensors and loads them back
    onto the GPU, verified bit-exact."""
    doc = cli.json("bench", str(tmp_path), "--workload", "checkpoint", "--size", "32MiB", "--repeat", "1",
                   "--warmup", "0", "--device", "cuda", "--writers", "ckptbench,torch,dcp")
    assert doc["spec"]["device"] == "cuda"
    assert all(r["verified"] for r in doc["results"]) and {r["writer"] for r in doc["results"]} == {
        "ckptbench", "torch", "dcp"}
    assert all(a["verified"] for a in doc["async"])
    assert doc["probe"]["device"].startswith("cuda")  # the interference probe computes where training does
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(torch.cuda, "_compile_kernel"), reason="torch has no torch.cuda._compile_kernel")
@pytest.mark.parametrize("direct", [0, 1])
def test_repeated_saves_reuse_the_prepared_staging_and_save_the_new_values(tmp_path: Path, monkeypatch, direct):
    """A training loop's saves: the same tensors (addresses) with new values reuse the arena's prepared
    gathering; a tensor replaced by another one is prepared anew. Every checkpoint holds its values."""
    from ckptbench import knobs
    from ckptbench.checkpoint import gather

    monkeypatch.setattr(knobs, "STAGE_GATHER_MAPPED", direct)
    uploads, upload = [], gather.upload
    monkeypatch.setattr(gather, "upload", lambda table, *rest: uploads.append(len(table)) or upload(table, *rest))
    state = _gpu_state(3)
    ckpt = Checkpointer()
    for step in range(4):
        uploads.clear()
        for tensors in state.values():
            for t in tensors if isinstance(tensors, list) else [tensors]:
                t.logical_not_() if t.dtype == torch.bool else t.add_(1)
        if step == 3:
            state["many"][7] = state["many"][7].clone()  # another address
        expected = {k: [t.cpu() for t in v] if isinstance(v, list) else v.cpu() for k, v in state.items()}
        ckpt.save(state, tmp_path / f"c{step}")
        got = ckpt.load(tmp_path / f"c{step}")
        for key, value in expected.items():
            pairs = zip(got[key], value, strict=True) if isinstance(value, list) else [(got[key], value)]
            assert all(torch.equal(a, b) for a, b in pairs), (step, key)
        assert (uploads == []) == (step in (1, 2)), (step, uploads)  # prepared once, reused, then anew
    ckpt.close()


@pytest.mark.skipif(not hasattr(torch.cuda, "_compile_kernel"), reason="torch has no torch.cuda._compile_kernel")
def test_a_training_loop_on_one_gpu_repeats_the_remembered_staging(tmp_path: Path, monkeypatch):
    """Every tensor on one GPU: a Checkpointer's next save of the same layout reuses its plan, and the
    arena issues the staging it remembered for those very plan arrays (no per-tensor work); the values
    saved are each step's. A replaced tensor (another address) plans and works it out anew."""
    from ckptbench.checkpoint import stage as staging

    worked_out = []
    monkeypatch.setattr(staging.MappedStaging, "of", classmethod(
        lambda cls, *args, of=staging.MappedStaging.of.__func__: worked_out.append(1) or of(cls, *args)))
    full = _gpu_state(4)
    state = {"many": full["many"], "odd": full["odd"], "big": full["big"], "bool": full["bool"], "step": 0}
    ckpt = Checkpointer()
    for step in range(4):
        worked_out.clear()
        for tensors in state.values():
            for t in tensors if isinstance(tensors, list) else [tensors] if isinstance(tensors, torch.Tensor) else []:
                t.logical_not_() if t.dtype == torch.bool else t.add_(1)
        state["step"] = step
        if step == 3:
            state["many"][5] = state["many"][5].clone()
        expected = {k: [t.cpu() for t in v] if isinstance(v, list) else v.cpu() for k, v in state.items() if k != "step"}
        ckpt.save(state, tmp_path / f"c{step}")
        assert ckpt._plans.reused == (step in (1, 2)) and len(worked_out) == (0 if step in (1, 2) else 1), step
        got = ckpt.load(tmp_path / f"c{step}")
        assert got["step"] == step
        for key, value in expected.items():
            pairs = zip(got[key], value, strict=True) if isinstance(value, list) else [(got[key], value)]
            assert all(torch.equal(a, b) for a, b in pairs), (step, key)
    ckpt.close()
