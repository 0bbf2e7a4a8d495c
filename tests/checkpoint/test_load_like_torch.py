"""A plain ``load`` returns tensors that behave as after ``torch.load``: each has a storage of its own."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer


def _state() -> dict:
    return {
        "rng": torch.get_rng_state(),
        "model": {"w": torch.randn(300, 70), "b": torch.randn(70).to(torch.bfloat16)},
        "small": torch.arange(10),
        "step": 7,
        "empty": torch.empty(0, 3),
    }


def _tensors(tree) -> list[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        return [("", tree)]
    if isinstance(tree, dict):
        return [(f"{k}.{p}".rstrip("."), t) for k, v in tree.items() for p, t in _tensors(v)]
    return []


def test_each_loaded_tensor_has_a_storage_of_exactly_its_bytes(tmp_path: Path):
    ckptbench.save(_state(), tmp_path / "c")
    loaded = ckptbench.load(tmp_path / "c")
    seen = set()
    for key, t in _tensors(loaded):
        storage = t.untyped_storage()
        assert t.storage_offset() == 0, key
        assert storage.nbytes() == t.nbytes, key
        if t.nbytes:
            assert storage.data_ptr() == t.data_ptr(), key
            assert storage.data_ptr() not in seen, key
            seen.add(storage.data_ptr())
    assert len(seen) == 4  # every non-empty tensor


def test_set_rng_state_accepts_a_loaded_rng_state(tmp_path: Path):
    """torch's CPU set_rng_state crashed the interpreter on a view into a shared buffer: run it apart."""
    script = textwrap.dedent(f"""
        import torch, ckptbench
        torch.manual_seed(3)
        ckptbench.save({{"pad": torch.ones(1000), "rng": torch.get_rng_state()}}, {str(tmp_path / "c")!r})
        expected = torch.rand(5)
        torch.manual_seed(99)
        torch.set_rng_state(ckptbench.load({str(tmp_path / "c")!r})["rng"])
        assert torch.equal(torch.rand(5), expected)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_torch_save_and_pickle_of_one_loaded_tensor_write_only_its_bytes(tmp_path: Path):
    big = torch.randn(1 << 20)  # 4 MiB beside the small one
    ckptbench.save({"big": big, "small": torch.arange(10)}, tmp_path / "c")
    loaded = ckptbench.load(tmp_path / "c")
    buffer = io.BytesIO()
    torch.save(loaded["small"], buffer)
    reference = io.BytesIO()
    torch.save(torch.arange(10), reference)
    assert len(buffer.getvalue()) == len(reference.getvalue())
    assert len(pickle.dumps(loaded["small"])) == len(pickle.dumps(torch.arange(10)))
    assert torch.equal(pickle.loads(pickle.dumps(loaded["small"])), torch.arange(10))
    assert loaded["small"].numpy().tolist() == list(range(10))
    assert torch.equal(torch.load(io.BytesIO(buffer.getvalue())), torch.arange(10))


def test_loaded_tensors_stay_valid_after_the_rest_is_dropped(tmp_path: Path):
    ckptbench.save({"a": torch.arange(1000.0), "b": torch.ones(3)}, tmp_path / "c")
    loaded = ckptbench.load(tmp_path / "c")
    b = loaded.pop("b")
    del loaded
    import gc

    gc.collect()
    assert torch.equal(b + 1, torch.full((3,), 2.0))


def test_tied_tensors_still_load_as_one(tmp_path: Path):
    w = torch.randn(4, 4)
    ckptbench.save({"embed": w, "head": w}, tmp_path / "c")
    loaded = ckptbench.load(tmp_path / "c")
    assert loaded["embed"] is loaded["head"]


@pytest.mark.parametrize("reuse", [False, True])
def test_load_into_is_unchanged(tmp_path: Path, reuse: bool):
    sd = _state()
    ckptbench.save(sd, tmp_path / "c")
    into = {**_state(), "model": {"w": torch.zeros(300, 70), "b": torch.zeros(70, dtype=torch.bfloat16)}}
    with Checkpointer() as ckpt:
        for _ in range(2 if reuse else 1):
            out = ckpt.load(tmp_path / "c", into=into)
    assert out is into
    assert torch.equal(into["model"]["w"], sd["model"]["w"])
    assert torch.equal(into["model"]["b"], sd["model"]["b"])
