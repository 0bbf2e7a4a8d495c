"""ckptbench's DCP Writer as a drop-in for FileSystemWriter: torch's keywords (supported or refused, each
with its reason), and staging memory shared by every Writer of a process, so ``Writer(path)`` per save
does not allocate a new arena each time."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import SerializationFormat

from ckptbench import knobs
from ckptbench.errors import UsageError
from ckptbench.integrations import dcp as ours
from ckptbench.integrations.dcp import Reader, Writer, release_staging_memory

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(autouse=True)
def empty_pool():
    # An earlier test's Writer left in a reference cycle gives its arena back when collected: collect it
    # now, not inside a test that counts the pool's arenas.
    gc.collect()
    release_staging_memory()
    yield
    release_staging_memory()


def pool_buffers() -> list:
    return [arena.buffer for arena, _ in ours._POOL._idle]


def state(value: float = 1.0) -> dict:
    return {"w": torch.full((256, 1024), value), "b": torch.full((100,), value), "step": 3}


def loaded(path: Path) -> dict:
    target = {"w": torch.zeros(256, 1024), "b": torch.zeros(100), "step": None}
    dcp.load(target, storage_reader=Reader(path))
    return target


def test_torchs_keywords_in_torchs_order(tmp_path: Path):
    # path, single_file_per_rank, sync_files, thread_count, per_thread_copy_ahead, cache_staged_state_dict,
    # overwrite, _extensions, serialization_format: as FileSystemWriter takes them
    writer = Writer(tmp_path, True, True, 3, 10_000_000, True, False, None, SerializationFormat.TORCH_SAVE)
    assert (writer.threads, writer.overwrite, writer.serialization, writer.cache_staged_state_dict) == \
        (3, False, "torch_save", True)
    assert Writer(tmp_path, thread_count=2).threads == 2
    assert Writer(tmp_path, thread_count=2, threads=2).threads == 2
    assert Writer(tmp_path, sync_files=False).sync_files  # durable all the same
    dcp.save(state(), storage_writer=Writer(tmp_path, sync_files=False, per_thread_copy_ahead=0,
                                            cache_staged_state_dict=True))
    assert loaded(tmp_path)["step"] == 3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"single_file_per_rank": False}, "single_file_per_rank=False .* not supported.*files_per_rank"),
    ({"thread_count": 2, "threads": 4}, "thread_count=2 and threads=4 disagree"),
    ({"serialization_format": SerializationFormat.SAFETENSORS}, "serialization_format=.*SAFETENSORS.* not supported"),
    ({"serialization_format": SerializationFormat.TORCH_SAVE, "serialization": "raw"}, "disagree"),
    ({"per_thread_copy_ahead": -1}, "per_thread_copy_ahead must be an int >= 0, got -1"),
])
def test_what_it_cannot_do_is_refused_with_the_reason(tmp_path: Path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        Writer(tmp_path, **kwargs)


def test_stream_extensions_are_refused(tmp_path: Path):
    from torch.testing._internal.distributed.checkpoint_utils import Rot13Example

    with pytest.raises(UsageError, match="_extensions \\(Rot13Example\\) are not supported.*FileSystemWriter"):
        Writer(tmp_path, _extensions=[Rot13Example()])
    Writer(tmp_path, _extensions=[])  # none is fine


def test_a_new_writer_per_sync_save_reuses_the_last_ones_memory(tmp_path: Path):
    writer = Writer(tmp_path / "0")
    dcp.save(state(0), storage_writer=writer)
    first = writer._arena.buffer
    assert first is not None
    del writer
    gc.collect()
    assert pool_buffers() == [first]  # the writer is gone: its arena waits for the next one
    for step in (1, 2):
        writer = Writer(tmp_path / str(step))
        dcp.save(state(step), storage_writer=writer)
        assert writer._arena.buffer is first
        del writer
        assert loaded(tmp_path / str(step))["w"][0, 0] == step


def test_a_new_writer_per_async_save_reuses_the_staging_memory(tmp_path: Path):
    staged_into = []
    for step in range(3):
        sd = state(step)
        writer = Writer(tmp_path / str(step))
        future = dcp.async_save(sd, storage_writer=writer)
        staged_into.append(writer._stagings[0].arena.buffer)
        sd["w"].zero_()
        future.result()
        del future, writer
        gc.collect()
        assert loaded(tmp_path / str(step))["w"][0, 0] == step
    assert staged_into[1] is staged_into[0] and staged_into[2] is staged_into[0]


def test_idle_memory_is_released(tmp_path: Path, monkeypatch):
    dcp.save(state(), storage_writer=Writer(tmp_path / "a"))
    gc.collect()
    assert pool_buffers()
    release_staging_memory()
    assert pool_buffers() == []
    monkeypatch.setattr(knobs, "DCP_ARENA_IDLE_S", 0.05)
    dcp.save(state(), storage_writer=Writer(tmp_path / "b"))
    gc.collect()
    deadline = time.monotonic() + 30
    while pool_buffers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool_buffers() == [], "idle arenas were kept past DCP_ARENA_IDLE_S"


def test_at_most_a_few_idle_arenas_are_kept(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "DCP_IDLE_ARENAS", 1)
    writers = [Writer(tmp_path / str(k)) for k in range(3)]
    for k, writer in enumerate(writers):
        dcp.save({"w": torch.ones((k + 1) * 100_000)}, storage_writer=writer)
    biggest = writers[-1]._arena.buffer
    del writers, writer
    gc.collect()
    assert pool_buffers() == [biggest]
