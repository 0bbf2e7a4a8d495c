"""CUDA paths: device-to-host staging into the registered arena, and loading straight to the GPU.

Run on a machine with a GPU: ``pytest -m gpu tests/gpu``. Without one every test skips with the reason.
"""

from __future__ import annotations

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
