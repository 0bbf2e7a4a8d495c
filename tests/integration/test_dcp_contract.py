"""ckptbench's DCP Writer/Reader against what torch 2.13's own DCP code does with a storage writer and reader,
beyond the conformance suite: every dtype torch saves (and conjugate/negative views, quantized tensors),
optimizer state through ``get_state_dict``/``set_state_dict``, loads of some keys and of every key
(``_load_state_dict_from_keys``), torch's ``DefaultStager`` as the stager of our writer, saves with the
planner's plan cache, async saves through one writer that overlap, ``checkpoint_id`` as
str/Path/PathLike/``file://``, ``storage_meta`` and ``validate_checkpoint_id`` as FileSystemWriter's, a save
over a FileSystemWriter checkpoint, ``overwrite=False`` in per-rank saves, and torch's own tools
(``dcp_to_torch_save``, ``FsspecReader``) on our checkpoints.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from ckptbench.errors import DcpCheckpointExistsError
from ckptbench.integrations.dcp import Reader, Writer, extension_registry

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled",
                                        "ignore:torch.distributed is unavailable or uninitialized",
                                        "ignore:Detected an existing checkpoint",
                                        "ignore:ComplexHalf support is experimental",
                                        "ignore:torch.quantize_per_tensor, torch.quantize_per_channel",
                                        "ignore:TypedStorage is deprecated")

WRITERS: dict[str, Callable[..., Any]] = {
    "torch": lambda path, **kw: FileSystemWriter(path, **kw),
    "ckptbench": lambda path, **kw: Writer(path, **kw),
    "ckptbench-torch_save": lambda path, **kw: Writer(path, serialization="torch_save", **kw),
}
READERS: dict[str, Callable[..., Any]] = {
    "torch": lambda path: FileSystemReader(path, _extension_registry=extension_registry()),
    "ckptbench": lambda path: Reader(path),
}
PAIRS = [(w, r) for w in WRITERS for r in READERS]


def failure_of(excinfo: pytest.ExceptionInfo) -> BaseException:
    (failure,) = excinfo.value.failures.values()
    return failure[0] if isinstance(failure, tuple) else failure


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's values as bytes (NaN payloads and signed zeros compare exactly)."""
    plain = tensor.detach().resolve_conj().resolve_neg().contiguous()
    return plain.reshape(-1).view(torch.uint8) if plain.numel() else plain.reshape(-1)


def dtypes_torch_saves() -> list[torch.dtype]:
    """Every dtype of this torch that FileSystemWriter saves: all but the sub-byte integers and bit
    types (DCP's planner cannot size them) and the quantized ones (they need a quantizer)."""
    return [d for d in sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str)
            if not re.fullmatch(r"torch\.(bits\w*|u?int[1-7]|q\w+)", str(d))]


def sample(dtype: torch.dtype, shape: tuple[int, ...] = (5, 7)) -> torch.Tensor:
    """Distinct bit patterns of ``dtype`` (for float8 and the like: every byte value in turn)."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    raw = (torch.arange(nbytes, dtype=torch.int64) * 37 % 251).to(torch.uint8)
    if dtype == torch.bool:
        return (raw[: torch.Size(shape).numel()] % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


# -- what tensors can be ------------------------------------------------------------------------


@pytest.mark.parametrize(("writer", "reader"), [p for p in PAIRS if p[0] != "torch"])
def test_every_dtype_torch_saves_round_trips_bit_exactly(tmp_path: Path, writer: str, reader: str) -> None:
    dtypes = dtypes_torch_saves()
    assert {torch.float8_e4m3fn, torch.complex64, torch.uint16, torch.bfloat16} <= set(dtypes)
    state = {str(d): sample(d) for d in dtypes}
    dcp.save(state, storage_writer=WRITERS[writer](tmp_path))
    target = {key: torch.zeros_like(value) for key, value in state.items()}
    dcp.load(target, storage_reader=READERS[reader](tmp_path))
    for key, value in state.items():
        assert target[key].dtype == value.dtype and torch.equal(bits(target[key]), bits(value)), key


def views() -> dict[str, torch.Tensor]:
    """Tensors whose memory is not their values laid out row-major: conjugate and negative views
    (a bit on the tensor, not in its bytes), zero strides, channels-last, an offset into a storage."""
    z = sample(torch.complex64, (4, 3))
    return {
        "conj": z.conj(),
        "conj_t": z.conj().t(),
        "neg": torch._neg_view(sample(torch.float32, (6,))),
        "imag_of_conj": z.conj().imag,
        "expanded": sample(torch.float32, (3, 1)).expand(3, 4),
        "channels_last": sample(torch.float32, (2, 3, 4, 5)).to(memory_format=torch.channels_last),
        "offset": sample(torch.float32, (100,))[37:51],
    }


@pytest.mark.parametrize("how", ["save", "async_save"])
@pytest.mark.parametrize(("writer", "reader"), [p for p in PAIRS if p[0] != "torch"])
def test_views_are_saved_as_their_values(tmp_path: Path, writer: str, reader: str, how: str) -> None:
    state = views()
    if how == "save":
        dcp.save(state, storage_writer=WRITERS[writer](tmp_path))
    else:
        dcp.async_save(state, storage_writer=WRITERS[writer](tmp_path)).result()
    target = {key: torch.zeros(value.shape, dtype=value.dtype) for key, value in state.items()}
    dcp.load(target, storage_reader=READERS[reader](tmp_path))
    for key, value in state.items():
        assert torch.equal(bits(target[key]), bits(value)), key


@pytest.mark.parametrize("how", ["save", "async_save"])
@pytest.mark.parametrize(("writer", "reader"), [p for p in PAIRS if p[0] != "torch"])
def test_quantized_tensors_load_as_torchs_writer_stores_them(tmp_path: Path, writer: str, reader: str, how: str) -> None:
    # A quantized tensor's bytes are its integers only: stored as raw bytes it would load without its
    # quantizer, or not at all. It is stored as FileSystemWriter stores it (torch.save).
    state = {
        "per_tensor": torch.quantize_per_tensor(torch.linspace(-1, 1, 16).reshape(4, 4), 0.05, 3, torch.qint8),
        "per_channel": torch.quantize_per_channel(torch.linspace(-2, 2, 12).reshape(3, 4),
                                                  torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 1, 2]), 0,
                                                  torch.quint8),
        "plain": torch.arange(3.0),
    }
    if how == "save":
        dcp.save(state, storage_writer=WRITERS[writer](tmp_path))
    else:
        dcp.async_save(state, storage_writer=WRITERS[writer](tmp_path)).result()
    # Zeros with the same quantizers (DCP copies the stored integers into the destination, which keeps
    # its own scale and zero point, with torch's writer and reader too).
    target = {
        "per_tensor": torch.quantize_per_tensor(torch.zeros(4, 4), 0.05, 3, torch.qint8),
        "per_channel": torch.quantize_per_channel(torch.zeros(3, 4), torch.tensor([0.1, 0.2, 0.3]),
                                                  torch.tensor([0, 1, 2]), 0, torch.quint8),
        "plain": torch.zeros(3),
    }
    dcp.load(target, storage_reader=READERS[reader](tmp_path))
    for key in ("per_tensor", "per_channel"):
        assert torch.equal(target[key].int_repr(), state[key].int_repr()), key
        assert torch.equal(target[key].dequantize(), state[key].dequantize()), key
    assert torch.equal(target["plain"], state["plain"])


# -- torch.distributed.checkpoint.state_dict ----------------------------------------------------


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3 * (seed + 1))
    for _ in range(2):
        model(torch.randn(3, 8)).sum().backward()
        optim.step()
        optim.zero_grad()
    return model, optim


@pytest.mark.parametrize(("writer", "reader"), PAIRS)
def test_model_and_optimizer_through_get_and_set_state_dict(tmp_path: Path, writer: str, reader: str) -> None:
    model, optim = trained(0)
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=WRITERS[writer](tmp_path))

    fresh_model, fresh_optim = trained(1)
    model_sd, optim_sd = get_state_dict(fresh_model, fresh_optim)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=READERS[reader](tmp_path))
    set_state_dict(fresh_model, fresh_optim, model_state_dict=state["model"], optim_state_dict=state["optim"])

    for (name, saved), loaded in zip(model.state_dict().items(), fresh_model.state_dict().values(), strict=True):
        assert torch.equal(saved, loaded), name
    saved_optim, loaded_optim = optim.state_dict(), fresh_optim.state_dict()
    assert loaded_optim["param_groups"][0]["lr"] == saved_optim["param_groups"][0]["lr"]
    for param, values in saved_optim["state"].items():
        for name, value in values.items():
            assert torch.equal(loaded_optim["state"][param][name], value), (param, name)


@pytest.mark.parametrize("safe", [False, True])
@pytest.mark.parametrize("writer", WRITERS)
def test_some_keys_or_every_key_without_a_target(tmp_path: Path, writer: str, safe: bool) -> None:
    saved = {"a": torch.arange(5.0), "b": {"c": torch.ones(3, dtype=torch.bfloat16), "n": 7}, "s": "text"}
    dcp.save(saved, storage_writer=WRITERS[writer](tmp_path))
    some = _load_state_dict_from_keys(keys={"a", "b.n"}, storage_reader=Reader(tmp_path, safe=safe))
    assert some.keys() == {"a", "b"} and some["b"] == {"n": 7} and torch.equal(some["a"], saved["a"])
    every = _load_state_dict_from_keys(storage_reader=Reader(tmp_path, safe=safe))
    assert every["s"] == "text" and every["b"]["n"] == 7
    assert every["b"]["c"].dtype == torch.bfloat16 and torch.equal(every["b"]["c"], saved["b"]["c"])
    target = {"a": torch.zeros(5)}  # a state_dict with fewer keys than the checkpoint
    dcp.load(target, storage_reader=Reader(tmp_path, safe=safe))
    assert torch.equal(target["a"], saved["a"])


# -- async_save with torch's stager; the planner's plan cache -----------------------------------


@pytest.mark.parametrize("options", [
    {},
    {"use_shared_memory": True},
    {"use_async_staging": True},
    {"use_async_staging": True, "use_shared_memory": True},
])
def test_torchs_default_stager_stages_for_our_writer(tmp_path: Path, options: dict) -> None:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    state = {"w": sample(torch.float32, (64, 64)), "step": 3}
    expected = state["w"].clone()
    stager = DefaultStager(StagingOptions(use_pinned_memory=False, **{
        "use_shared_memory": False, "use_async_staging": False, "use_non_blocking_copy": False, **options}))
    try:
        response = dcp.async_save(state, storage_writer=Writer(tmp_path), async_stager=stager)
        if options.get("use_async_staging"):
            response.staging_completion.result()
            upload = response.upload_completion
        else:
            upload = response
        state["w"].zero_()  # training goes on once staged
        upload.result()
    finally:
        stager.close()
    target = {"w": torch.zeros(64, 64), "step": None}
    dcp.load(target, storage_reader=Reader(tmp_path))
    assert torch.equal(target["w"], expected) and target["step"] == 3


@pytest.fixture
def empty_plan_cache():
    def clear() -> None:
        for cache in ("_cached_save_plan", "_cached_all_plans", "_cached_global_plan", "_cached_metadata",
                      "_cached_final_save_plan"):
            getattr(SavePlanner, cache).clear()

    clear()  # the planner caches plans per class, process-wide
    yield
    clear()


@pytest.mark.usefixtures("empty_plan_cache")
@pytest.mark.parametrize("writer", WRITERS)
def test_saves_with_the_planners_plan_cache(tmp_path: Path, writer: str) -> None:
    storage = WRITERS[writer](tmp_path / "unused")
    ids = [tmp_path / f"step-{n}" for n in range(3)] + [tmp_path / "same"] * 3
    for step, checkpoint_id in enumerate(ids):
        state = {"w": torch.full((100,), float(step)), "step": step}
        dcp.save(state, storage_writer=storage, checkpoint_id=checkpoint_id,
                 planner=DefaultSavePlanner(enable_plan_caching=True))
        target = {"w": torch.zeros(100), "step": None}
        dcp.load(target, storage_reader=Reader(checkpoint_id))
        assert torch.equal(target["w"], state["w"]) and target["step"] == step, checkpoint_id


# -- saves through one writer that overlap -----------------------------------------------------


class HeldPlanner(DefaultSavePlanner):
    """Holds its save once planned (before write_data) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.reached, self.release = threading.Event(), threading.Event()

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        self.reached.set()
        assert self.release.wait(60)
        return super().finish_plan(new_plan)


def full_state(value: float) -> dict:
    return {"w": torch.full((256, 64), value), "step": int(value)}


def loaded_step(path: Path) -> int:
    target = {"w": torch.zeros(256, 64), "step": None}
    dcp.load(target, storage_reader=Reader(path))
    assert torch.equal(target["w"], torch.full((256, 64), float(target["step"])))
    return target["step"]


def test_an_async_save_started_before_the_last_one_ended_moves_nothing_of_it(tmp_path: Path) -> None:
    # The second save's reset(checkpoint_id) must not repoint the first, which is still running.
    writer, held = Writer(tmp_path / "unused"), HeldPlanner()
    first = dcp.async_save(full_state(1), storage_writer=writer, checkpoint_id=tmp_path / "a", planner=held)
    try:
        assert held.reached.wait(60)
        dcp.async_save(full_state(2), storage_writer=writer, checkpoint_id=tmp_path / "b").result()
    finally:
        held.release.set()
    first.result()
    assert (loaded_step(tmp_path / "a"), loaded_step(tmp_path / "b")) == (1, 2)
    assert writer.path == tmp_path / "b"  # where the writer points now, as after FileSystemWriter's reset
    dcp.save(full_state(3), storage_writer=writer)
    assert loaded_step(tmp_path / "b") == 3


def test_overlapping_saves_to_one_directory_never_remove_each_others_files(tmp_path: Path) -> None:
    class HeldCommit(Writer):
        """Holds the first commit it is asked for until released."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.committing, self.commit = threading.Event(), threading.Event()

        def finish(self, metadata: Any, results: Any) -> None:
            if not self.committing.is_set():
                self.committing.set()
                assert self.commit.wait(60)
            super().finish(metadata, results)

    writer, held = HeldCommit(tmp_path), HeldPlanner()
    first = dcp.async_save(full_state(1), storage_writer=writer, planner=held)
    try:
        assert held.reached.wait(60)
        second = dcp.async_save(full_state(2), storage_writer=writer)
        assert writer.committing.wait(60)  # the second save's files are written, its metadata not yet
        held.release.set()
        first.result()  # commits, then sweeps the directory: the second save's files are not stale
    finally:
        held.release.set()
        writer.commit.set()
    second.result()
    assert loaded_step(tmp_path) == 2


def test_a_sweep_while_a_save_is_in_flight_spares_other_ranks_files_and_metadata_temps(tmp_path: Path) -> None:
    """Under a launch another rank names its files of a save with a tag of its own, which this process does not
    know, and a metadata temp may be a commit in progress on another thread: a sweep while a save is in flight
    leaves both (here planted as rank 1's file of the held save and its commit's temp); the sweep of a commit
    with no save in flight removes them."""
    writer, held = Writer(tmp_path), HeldPlanner()
    first = dcp.async_save(full_state(1), storage_writer=writer, planner=held)
    other_rank, temp = tmp_path / "__1_0.0badc0de.distcp", tmp_path / "..metadata.tmp-0badc0de"
    try:
        assert held.reached.wait(60)
        other_rank.write_bytes(b"rank 1")
        temp.write_bytes(b"commit")
        dcp.save(full_state(2), storage_writer=writer)
        assert other_rank.exists() and temp.exists()
        assert loaded_step(tmp_path) == 2
    finally:
        held.release.set()
    first.result()
    assert not other_rank.exists() and not temp.exists()
    assert loaded_step(tmp_path) == 1


def test_overlapping_saves_through_two_writers_never_remove_each_others_files(tmp_path: Path) -> None:
    """As above with a Writer per save (as the Writer's docstring allows): the first save's sweep spares
    the files of the second, written but not yet committed by another Writer of this process."""

    class HeldCommit(Writer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.committing, self.commit = threading.Event(), threading.Event()

        def finish(self, metadata: Any, results: Any) -> None:
            self.committing.set()
            assert self.commit.wait(60)
            super().finish(metadata, results)

    held, second_writer = HeldPlanner(), HeldCommit(tmp_path)
    first = dcp.async_save(full_state(1), storage_writer=Writer(tmp_path), planner=held)
    try:
        assert held.reached.wait(60)
        second = dcp.async_save(full_state(2), storage_writer=second_writer)
        assert second_writer.committing.wait(60)  # the second save's files are written, its metadata not yet
        held.release.set()
        first.result()
    finally:
        held.release.set()
        second_writer.commit.set()
    second.result()
    assert loaded_step(tmp_path) == 2


# -- checkpoint_id, storage_meta, validate_checkpoint_id ----------------------------------------


class CustomPathLike:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)


def test_checkpoint_id_as_str_path_pathlike_or_file_url(tmp_path: Path) -> None:
    writer, reader = Writer(tmp_path / "unused"), Reader(tmp_path / "unused")
    ids = {"str": str(tmp_path / "str"), "path": tmp_path / "path", "pathlike": CustomPathLike(tmp_path / "pathlike"),
           "url": f"file://{tmp_path / 'url'}"}
    for value, checkpoint_id in enumerate(ids.values()):
        dcp.save({"w": torch.full((3,), float(value))}, storage_writer=writer, checkpoint_id=checkpoint_id)
    for value, (name, checkpoint_id) in enumerate(ids.items()):
        target = {"w": torch.zeros(3)}
        dcp.load(target, storage_reader=reader, checkpoint_id=checkpoint_id)
        assert torch.equal(target["w"], torch.full((3,), float(value))), name
        assert (tmp_path / name / ".metadata").is_file(), name
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("how", ["constructor", "checkpoint_id"])
def test_storage_meta_is_what_filesystem_writer_records(tmp_path: Path, how: str) -> None:
    def saved_meta(make: Callable[..., Any], path: Path) -> Any:
        if how == "constructor":
            return dcp.save({"w": torch.ones(2)}, storage_writer=make(path)).storage_meta
        return dcp.save({"w": torch.ones(2)}, storage_writer=make(tmp_path / "unused"),
                        checkpoint_id=str(path)).storage_meta

    ours, stock = saved_meta(Writer, tmp_path / "ours"), saved_meta(FileSystemWriter, tmp_path / "stock")
    assert type(ours.checkpoint_id) is type(stock.checkpoint_id)
    assert ours.checkpoint_id == tmp_path / "ours" and stock.checkpoint_id == tmp_path / "stock"
    assert ours.save_id and ours.save_id != saved_meta(Writer, tmp_path / "ours").save_id
    loaded = _load_state_dict_from_keys(storage_reader=FileSystemReader(tmp_path / "ours",
                                                                       _extension_registry=extension_registry()))
    assert torch.equal(loaded["w"], torch.ones(2))


@pytest.mark.parametrize("storage", [Writer, Reader])
def test_validate_checkpoint_id_accepts_what_it_can_store_to(tmp_path: Path, storage: type) -> None:
    assert storage.validate_checkpoint_id(tmp_path / "new" / "dir")
    assert storage.validate_checkpoint_id(str(tmp_path / "new"))
    assert storage.validate_checkpoint_id(f"file://{tmp_path / 'new'}")
    assert storage.validate_checkpoint_id("s3://bucket/prefix")
    assert storage.validate_checkpoint_id("memory://ckpt")  # a protocol fsspec knows
    assert not storage.validate_checkpoint_id("abc://abc.abc")
    assert storage.validate_checkpoint_id(str(tmp_path)) == FileSystemWriter.validate_checkpoint_id(str(tmp_path))


@pytest.mark.parametrize("serialization", ["raw", "torch_save"])
def test_a_save_over_torchs_checkpoint_removes_its_files_once_committed(tmp_path: Path, serialization: str) -> None:
    dcp.save({"w": torch.ones(1000), "step": 1}, storage_writer=FileSystemWriter(tmp_path, thread_count=2))
    (tmp_path / ".metadata.tmp").write_bytes(b"a crashed save of torch's")
    torch_files = {p.name for p in tmp_path.iterdir()} - {".metadata"}
    assert {"__0_0.distcp", "__0_1.distcp"} <= torch_files

    dcp.save({"w": torch.full((1000,), 2.0), "step": 2}, storage_writer=Writer(tmp_path, serialization=serialization))
    names = {p.name for p in tmp_path.iterdir()}
    assert not names & torch_files and ".metadata" in names
    assert all(re.fullmatch(r"__0_\d+\.[0-9a-f]{8}\.distcp", n) for n in names - {".metadata"}), names
    target = {"w": torch.zeros(1000), "step": None}
    dcp.load(target, storage_reader=FileSystemReader(tmp_path, _extension_registry=extension_registry()))
    assert torch.equal(target["w"], torch.full((1000,), 2.0)) and target["step"] == 2


# -- overwrite=False in per-rank saves --------------------------------------------------------


def per_rank_writer(path: Path, rank: int, **kwargs: Any) -> Writer:
    """A Writer set up as DCP sets it up on ``rank`` of a save with ``use_collectives=False``."""
    writer = Writer(path, **kwargs)
    writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=False)
    return writer


def test_per_rank_overwrite_false_looks_at_this_ranks_metadata_only(tmp_path: Path) -> None:
    # Without collectives, rank 0 may commit its __0.metadata before rank 1 plans the same save:
    # rank 1 must not take it for an existing checkpoint.
    dcp.save({"w": torch.ones(4)}, storage_writer=Writer(tmp_path), use_collectives=False)
    assert (tmp_path / "__0.metadata").is_file()
    per_rank_writer(tmp_path, 1, overwrite=False).prepare_local_plan(SavePlan([]))

    # Its own metadata, or a collective checkpoint, is one.
    (tmp_path / "__1.metadata").write_bytes((tmp_path / "__0.metadata").read_bytes())
    with pytest.raises(DcpCheckpointExistsError, match=r"^Checkpoint already exists and self.overwrite=False\."):
        per_rank_writer(tmp_path, 1, overwrite=False).prepare_local_plan(SavePlan([]))
    dcp.save({"w": torch.ones(4)}, storage_writer=Writer(tmp_path / "collective"))
    with pytest.raises(DcpCheckpointExistsError):
        per_rank_writer(tmp_path / "collective", 1, overwrite=False).prepare_local_plan(SavePlan([]))
    with pytest.raises(DcpCheckpointExistsError):  # raised as it is: no collective gathers it
        dcp.save({"w": torch.zeros(4)}, storage_writer=Writer(tmp_path, overwrite=False), use_collectives=False)


# -- torch's format tools -----------------------------------------------------------------------


def test_dcp_to_torch_save_reads_torch_save_serialization_and_names_the_raw_format(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 4}
    dcp.save(state, storage_writer=Writer(tmp_path / "torch_save", serialization="torch_save"))
    dcp_to_torch_save(tmp_path / "torch_save", tmp_path / "out.pt")
    converted = torch.load(tmp_path / "out.pt", weights_only=True)
    assert torch.equal(converted["w"], state["w"]) and converted["step"] == 4

    # torch's converters build their own FileSystemReader, without our extension: the raw format is
    # refused by name (docs/library.md says to save with serialization="torch_save" for them).
    dcp.save(state, storage_writer=Writer(tmp_path / "raw"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointException) as excinfo:
            dcp_to_torch_save(tmp_path / "raw", tmp_path / "raw.pt")
    assert "ckptbench-raw" in str(failure_of(excinfo))
    assert not os.path.exists(tmp_path / "raw.pt")

    torch.save(state, tmp_path / "in.pt")
    torch_save_to_dcp(tmp_path / "in.pt", tmp_path / "from_torch_save")
    target = {"w": torch.zeros(2, 3), "step": None}
    dcp.load(target, storage_reader=Reader(tmp_path / "from_torch_save"))
    assert torch.equal(target["w"], state["w"]) and target["step"] == 4


def test_torchs_fsspec_reader_reads_torch_save_serialization_and_names_the_raw_format(tmp_path: Path) -> None:
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 4}
    dcp.save(state, storage_writer=Writer(tmp_path / "torch_save", serialization="torch_save"))
    target = {"w": torch.zeros(2, 3), "step": None}
    dcp.load(target, storage_reader=FsspecReader(str(tmp_path / "torch_save")))
    assert torch.equal(target["w"], state["w"]) and target["step"] == 4

    dcp.save(state, storage_writer=Writer(tmp_path / "raw"))  # FsspecReader takes no extension registry
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load({"w": torch.zeros(2, 3), "step": None}, storage_reader=FsspecReader(str(tmp_path / "raw")))
    assert "ckptbench-raw" in str(failure_of(excinfo))
