"""One conformance suite for DCP storage, run against torch's FileSystemWriter/FileSystemReader and
ckptbench's Writer/Reader alike: what PyTorch's own CPU filesystem checkpoint tests check
(``test/distributed/checkpoint/test_file_system_checkpoint_cpu.py``: module state_dicts at 1 and 2
threads, tensors with a Stateful blob, plain values replaced on load, dtype casts on load, stream
extensions read back), plus overwrite, checkpoint_id reuse, per-rank metadata and async_save, which
its e2e tests cover. Each case is written once and run for every writer x reader pair that can
read what the writer wrote (a raw checkpoint of ours needs our extension registry in torch's reader).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from ckptbench.integrations.dcp import Reader, Writer, extension_registry

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled",
                                        "ignore:Detected an existing checkpoint")

WRITERS: dict[str, Callable[..., Any]] = {
    "torch": lambda path, **kw: FileSystemWriter(path, **kw),
    "ckptbench": lambda path, **kw: Writer(path, **kw),
}
READERS: dict[str, Callable[..., Any]] = {
    "torch": lambda path, **kw: FileSystemReader(path, _extension_registry=kw.get("registry") or extension_registry()),
    "ckptbench": lambda path, **kw: Reader(path, _extension_registry=kw.get("registry")),
}
PAIRS = [(w, r) for w in WRITERS for r in READERS]


class SmallModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = torch.nn.Linear(5, 5)
        self.linear_2 = torch.nn.Linear(5, 1)
        self.emb = torch.nn.EmbeddingBag(5, 10)


class Blob:
    """A Stateful holding bytes: DCP saves its state_dict's non-tensor value as a byte blob."""

    def __init__(self, value: bytes) -> None:
        self.state = {"blob": value}

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = state_dict


def assert_tensors_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("thread_count", [1, 2])
@pytest.mark.parametrize(("writer", "reader"), PAIRS)
def test_module_state_dict_round_trip(tmp_path: Path, writer: str, reader: str, thread_count: int) -> None:
    saved = SmallModule().state_dict()
    dcp.save(saved, storage_writer=WRITERS[writer](tmp_path, thread_count=thread_count))
    target = SmallModule().state_dict()
    assert not all(torch.equal(saved[k], target[k]) for k in saved)  # fresh weights differ
    dcp.load(target, storage_reader=READERS[reader](tmp_path))
    assert_tensors_equal(saved, target)


@pytest.mark.parametrize(("writer", "reader"), PAIRS)
def test_tensors_and_a_stateful_blob(tmp_path: Path, writer: str, reader: str) -> None:
    saved = {**SmallModule().state_dict(), "blob": Blob(b"SomeBlobForTesting")}
    dcp.save(saved, storage_writer=WRITERS[writer](tmp_path, thread_count=2))
    target = {**SmallModule().state_dict(), "blob": Blob(b"")}
    dcp.load(target, storage_reader=READERS[reader](tmp_path))
    assert target["blob"].state == {"blob": b"SomeBlobForTesting"}
    assert_tensors_equal({k: v for k, v in saved.items() if k != "blob"}, {k: v for k, v in target.items()
                                                                          if k != "blob"})


@pytest.mark.parametrize(("writer", "reader"), PAIRS)
def test_plain_values_are_replaced_on_load(tmp_path: Path, writer: str, reader: str) -> None:
    dcp.save({"bytes0": [1], "bytes1": "string"}, storage_writer=WRITERS[writer](tmp_path))
    target = {"bytes0": [2], "bytes1": "other"}
    dcp.load(target, storage_reader=READERS[reader](tmp_path))
    assert target == {"bytes0": [1], "bytes1": "string"}


@pytest.mark.parametrize(("writer", "reader"), PAIRS)
def test_a_load_casts_to_the_target_dtype(tmp_path: Path, writer: str, reader: str) -> None:
    saved = torch.rand(4, 3, dtype=torch.float32)
    dcp.save({"w": saved}, storage_writer=WRITERS[writer](tmp_path))
    narrow = {"w": torch.zeros(4, 3, dtype=torch.bfloat16)}
    dcp.load(narrow, storage_reader=READERS[reader](tmp_path))
    assert narrow["w"].dtype == torch.bfloat16 and torch.equal(narrow["w"], saved.to(torch.bfloat16))


@pytest.mark.parametrize("reader", READERS)
def test_stream_extensions_of_torchs_writer_are_read_back(tmp_path: Path, reader: str) -> None:
    from torch.testing._internal.distributed.checkpoint_utils import Rot13Example, get_test_extension_registry

    saved = {**SmallModule().state_dict(), "blob": Blob(b"SomeBlobForTesting")}
    dcp.save(saved, storage_writer=FileSystemWriter(tmp_path, thread_count=2, _extensions=[Rot13Example()]))
    target = {**SmallModule().state_dict(), "blob": Blob(b"")}
    registry = get_test_extension_registry()
    if reader == "torch":
        dcp.load(target, storage_reader=FileSystemReader(tmp_path, _extension_registry=registry))
    else:
        dcp.load(target, storage_reader=Reader(tmp_path, _extension_registry=registry))
    assert target["blob"].state == {"blob": b"SomeBlobForTesting"}
    assert torch.equal(target["linear_1.weight"], saved["linear_1.weight"])


@pytest.mark.parametrize("writer", WRITERS)
def test_overwrite_false_refuses_with_torchs_words(tmp_path: Path, writer: str) -> None:
    dcp.save({"w": torch.ones(3)}, storage_writer=WRITERS[writer](tmp_path))
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(CheckpointException) as excinfo:
        dcp.save({"w": torch.zeros(3)}, storage_writer=WRITERS[writer](tmp_path, overwrite=False))
    (failure,) = excinfo.value.failures.values()
    failure = failure[0] if isinstance(failure, tuple) else failure  # (exception, traceback) in some torch versions
    assert isinstance(failure, RuntimeError)
    assert str(failure).startswith("Checkpoint already exists and self.overwrite=False.")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    target = {"w": torch.zeros(3)}
    dcp.load(target, storage_reader=READERS[writer](tmp_path))
    assert torch.equal(target["w"], torch.ones(3))


@pytest.mark.parametrize(("writer", "reader"), PAIRS)
def test_overwrite_replaces_and_checkpoint_id_reuses_a_writer(tmp_path: Path, writer: str, reader: str) -> None:
    storage = WRITERS[writer](tmp_path / "first")
    for step in range(2):
        dcp.save({"w": torch.full((8,), float(step))}, storage_writer=storage, checkpoint_id=tmp_path / "first")
    dcp.save({"w": torch.full((8,), 5.0)}, storage_writer=storage, checkpoint_id=tmp_path / "second")
    for name, value in (("first", 1.0), ("second", 5.0)):
        target = {"w": torch.zeros(8)}
        dcp.load(target, storage_reader=READERS[reader](tmp_path / name))
        assert torch.equal(target["w"], torch.full((8,), value)), name


@pytest.mark.parametrize(("writer", "reader"), PAIRS)
def test_per_rank_metadata_without_collectives(tmp_path: Path, writer: str, reader: str) -> None:
    saved = {"w": torch.arange(16.0), "step": 3}
    dcp.save(saved, storage_writer=WRITERS[writer](tmp_path), use_collectives=False)
    assert (tmp_path / "__0.metadata").exists() and not (tmp_path / ".metadata").exists()
    target = {"w": torch.zeros(16), "step": None}
    dcp.load(target, storage_reader=READERS[reader](tmp_path))
    assert torch.equal(target["w"], saved["w"]) and target["step"] == 3


@pytest.mark.parametrize(("writer", "reader"), PAIRS)
def test_async_save_keeps_the_state_it_was_given(tmp_path: Path, writer: str, reader: str) -> None:
    state = {"model": SmallModule().state_dict(), "step": 7}
    expected = {k: v.clone() for k, v in state["model"].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        future = dcp.async_save(state, storage_writer=WRITERS[writer](tmp_path))
    for tensor in state["model"].values():  # training goes on
        tensor.zero_()
    future.result()
    target = {"model": {k: torch.empty_like(v) for k, v in expected.items()}, "step": None}
    dcp.load(target, storage_reader=READERS[reader](tmp_path))
    assert_tensors_equal(expected, target["model"])
    assert target["step"] == 7
