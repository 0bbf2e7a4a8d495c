"""A loaded checkpoint is freed by reference counting alone: once the caller drops what load() returned
(or load(into=...) has copied into the caller's tensors), no tensor waits for the cyclic garbage
collector. A reference cycle holding the loaded tensors keeps the checkpoint's memory until a collection
runs, and that collection then frees it inside whatever runs next (an async save's stall)."""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import ckptbench  # noqa: E402
from ckptbench.checkpoint.manager import CheckpointManager  # noqa: E402


@pytest.fixture
def cycles_kept() -> Iterator[Callable[[], list[Any]]]:
    """Collects once, then with the collector off runs the test; ``found()`` collects again, keeping what
    only a collection could free, and returns the tensors and ckptbench's own objects among it."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    flags = gc.get_debug()

    def found() -> list[Any]:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            return [o for o in gc.garbage
                    if isinstance(o, torch.Tensor) or type(o).__module__.startswith("ckptbench")]
        finally:
            gc.set_debug(flags)
            gc.garbage.clear()

    try:
        yield found
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        if enabled:
            gc.enable()


def _state_dict() -> dict[str, Any]:
    nested = collections.OrderedDict(weight=torch.randn(64, 32), bias=torch.zeros(32))
    return {"model": nested, "opt": {"state": [torch.arange(10), {"m": torch.ones(3, 3)}], "step": 7},
            "param": torch.nn.Parameter(torch.randn(8)), "tied": nested["weight"]}


@pytest.mark.parametrize("how", ["ckptbench.load", "Checkpointer.load", "into", "into-bounded"])
def test_a_loaded_checkpoint_needs_no_garbage_collection(tmp_path, cycles_kept, how):
    sd = _state_dict()
    ckptbench.save(sd, tmp_path / "c")
    cycles_kept()  # whatever the save left (none expected, but this test is about loads)
    if how == "ckptbench.load":
        out = ckptbench.load(tmp_path / "c")
    elif how == "Checkpointer.load":
        with ckptbench.Checkpointer() as ck:
            out = ck.load(tmp_path / "c")
    else:
        with ckptbench.Checkpointer() as ck:
            out = ck.load(tmp_path / "c", into=_state_dict(), bounded_memory=how == "into-bounded")
    assert torch.equal(out["model"]["weight"], sd["model"]["weight"])
    del out
    assert cycles_kept() == []


def test_a_managers_load_needs_no_garbage_collection(tmp_path, cycles_kept):
    sd = _state_dict()
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, sd)
        manager.wait()
        cycles_kept()
        out = manager.load()
        assert torch.equal(out["opt"]["state"][1]["m"], sd["opt"]["state"][1]["m"])
        del out
        assert cycles_kept() == []


@pytest.mark.parametrize("async_", [False, True])
def test_a_save_leaves_nothing_to_the_garbage_collector(tmp_path, cycles_kept, async_):
    sd = _state_dict()
    with ckptbench.Checkpointer() as ck:
        result = ck.save(sd, tmp_path / "c", async_=async_)
        if async_:
            result = result.result()
        assert result.bytes > 0
        del result
    assert cycles_kept() == []
