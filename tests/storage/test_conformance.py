"""One conformance suite for every checkpoint Store: the same tests against a local directory, CephFS
(a FUSE network filesystem), S3 (Ceph RGW) and a generic fsspec filesystem (memory://).

Part 1 exercises the Store primitives the writer relies on; part 2 the checkpoint API on top of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.api import CheckpointExistsError
from ckptbench.checkpoint.manifest import NotACheckpointError
from ckptbench.errors import StorageIOError
from ckptbench.storage.store import Store, open_store

PART = 5 * 2**20  # S3's smallest part: objects above it are multipart uploads / several ranged GETs


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    storage_options: dict[str, Any] | None

    def store(self) -> Store:
        return open_store(self.url, self.storage_options)

    def save(self, state_dict: Any, **kwargs: Any) -> Any:
        return Checkpointer(threads=2, shard_size=4 * 2**20).save(
            state_dict, self.url, storage_options=self.storage_options, **kwargs)

    def load(self) -> dict:
        return ckptbench.load(self.url, storage_options=self.storage_options)


@pytest.fixture(params=[
    pytest.param("local"),
    pytest.param("cephfs", marks=pytest.mark.netfs),
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("s3-s3fs", marks=pytest.mark.s3),
    pytest.param("s3-crt", marks=pytest.mark.s3),
    pytest.param("memory"),
])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    if kind == "local":
        yield Backend(kind, str(tmp_path / "ckpt"), None)
    elif kind == "cephfs":
        yield Backend(kind, str(request.getfixturevalue("cephfs_dir") / "ckpt"), None)
    elif kind.startswith("s3"):
        client = kind.partition("-")[2] or "boto3"  # the client moving the data: every one passes the suite
        needed = {"s3fs": "s3fs", "crt": "awscrt"}.get(client)
        if needed:
            pytest.importorskip(needed, reason=f"the {client} S3 client needs {needed}")
        server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
        yield Backend(kind, f"s3://{bucket}/runs/ckpt", server.options(part_size=PART, max_concurrency=4,
                                                                        client=client))
    else:
        import fsspec

        root = f"/ckptbench-test-{uuid.uuid4().hex[:12]}"
        yield Backend(kind, f"memory://{root}/ckpt", None)
        memory = fsspec.filesystem("memory")
        if memory.exists(root):
            memory.rm(root, recursive=True)


def pattern(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


# -- the Store primitives ------------------------------------------------------------------------


def test_write_read_round_trip_of_several_sizes(backend: Backend):
    store = backend.store()
    store.prepare()
    sizes = {"empty.bin": 0, "one.bin": 1, "odd.bin": 4097, "exact-part.bin": PART, "parts.bin": 2 * PART + 12345}
    data = {name: pattern(n, i) for i, (name, n) in enumerate(sizes.items())}
    report = store.write_files([(n, memoryview(a)) for n, a in data.items()], threads=2, block_size=2**20,
                               direct=False)
    assert report.sync
    assert sorted(store.list()) == sorted(sizes)
    for name, n in sizes.items():
        assert store.size(name) == n
    back = {name: np.zeros(n, dtype=np.uint8) for name, n in sizes.items()}
    store.read_files([(n, memoryview(a)) for n, a in back.items()], threads=3, block_size=2**20, direct=False)
    for name in sizes:
        assert np.array_equal(back[name], data[name]), name


def test_read_ranges(backend: Backend):
    """Byte ranges of an object (across S3 part boundaries, the last byte, an empty one); a missing
    object is an OSError (FileNotFoundError)."""
    store = backend.store()
    store.prepare()
    data = pattern(PART + PART // 2, 7).tobytes()
    store.write_files([("blob", memoryview(data))], threads=2, block_size=2**20, direct=False)
    wanted = [(0, 10), (PART - 3, PART // 4), (len(data) - 1, 1), (123, 0)]
    views = [memoryview(bytearray(n)) for _, n in wanted]
    store.read_ranges([("blob", offset, view) for (offset, _), view in zip(wanted, views, strict=True)],
                      threads=3, block_size=2**20, direct=False)
    for (offset, n), view in zip(wanted, views, strict=True):
        assert bytes(view) == data[offset:offset + n]
    with pytest.raises(OSError):
        store.read_ranges([("absent", 0, memoryview(bytearray(4)))], threads=1, block_size=2**20, direct=False)


def test_the_default_read_ranges_reads_whole_objects_and_slices(tmp_path: Path):
    """What a store without ranged reads does (the base's default), on a local store's primitives."""
    store = open_store(tmp_path / "d")
    store.prepare()
    store.write_files([("a", memoryview(b"0123456789"))], threads=1, block_size=4096, direct=False)
    view = memoryview(bytearray(4))
    Store.read_ranges(store, [("a", 3, view)], threads=1, block_size=4096, direct=False)
    assert bytes(view) == b"3456"
    with pytest.raises(OSError, match="fewer than the 12 to read"):
        Store.read_ranges(store, [("a", 8, memoryview(bytearray(4)))], threads=1, block_size=4096, direct=False)
    with pytest.raises(FileNotFoundError):
        Store.read_ranges(store, [("b", 0, memoryview(bytearray(4)))], threads=1, block_size=4096, direct=False)


def test_put_atomic_replaces_the_whole_object(backend: Backend):
    store = backend.store()
    store.prepare()
    store.put_atomic("m.json", b"a" * 1000)
    store.put_atomic("m.json", b"short")
    assert store.get("m.json") == b"short"
    assert store.size("m.json") == 5
    assert [n for n in store.list() if not n.startswith(".")] == ["m.json"]


def test_get_size_list_remove(backend: Backend):
    store = backend.store()
    store.prepare()
    assert store.list() == []
    for name in ("a", "b", "c"):
        store.put_atomic(name, name.encode() * 3)
    assert sorted(store.list()) == ["a", "b", "c"]
    assert store.get("b") == b"bbb"
    store.remove(["a", "c", "never-existed"])
    assert store.list() == ["b"]
    assert store.size("a") is None


def test_missing_object(backend: Backend):
    store = backend.store()
    store.prepare()
    assert store.size("nope") is None
    with pytest.raises(FileNotFoundError):
        store.get("nope")


def test_a_location_never_prepared_lists_nothing(backend: Backend):
    store = backend.store()
    assert store.list() == []
    assert store.size(mf.MANIFEST_NAME) is None
    assert store.is_dir_like()


# -- the checkpoint API on each backend ----------------------------------------------------------


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"big": torch.randn(1536, 1024, generator=g),  # 6 MiB: a shard above the part size
                  "w": torch.randn(256, 256, generator=g).to(torch.bfloat16), "empty": torch.empty(0, 3)},
        "optimizer": {"step": torch.tensor(seed), "m": torch.randn(512, 700, generator=g)},
        "meta": {"epoch": seed, "name": "run", "lr": 1e-3},
    }


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    else:
        assert a == b


def test_save_load_bit_exact(backend: Backend):
    sd = state(1)
    result = backend.save(sd)
    assert result.files >= 3  # several shards and the manifest
    assert result.path.rstrip("/").endswith("ckpt")
    assert_same(sd, backend.load())


def test_existing_checkpoint_needs_overwrite(backend: Backend):
    backend.save(state(1))
    with pytest.raises(CheckpointExistsError):
        backend.save(state(2))
    assert_same(state(1), backend.load())


def test_overwrite_keeps_the_old_checkpoint_until_the_commit(backend: Backend, monkeypatch: pytest.MonkeyPatch):
    backend.save(state(1))
    first = set(backend.store().list())

    def crash_before_commit(store: Store, manifest: dict) -> None:
        raise RuntimeError("crashed before the commit")

    with monkeypatch.context() as patch:
        patch.setattr(mf, "commit", crash_before_commit)
        with pytest.raises(RuntimeError, match="before the commit"):
            backend.save(state(2), overwrite=True)
    # A commit that fails (rather than a process killed before it) removes the shards it left behind.
    assert set(backend.store().list()) == first
    assert_same(state(1), backend.load())
    backend.save(state(3), overwrite=True)
    assert_same(state(3), backend.load())
    manifest = mf.read_manifest(backend.store())
    # the crashed save's and the replaced checkpoint's shards are gone
    assert sorted(backend.store().list()) == sorted([mf.MANIFEST_NAME] + [s["name"] for s in manifest["shards"]])


def test_load_without_manifest_refuses(backend: Backend):
    store = backend.store()
    store.prepare()
    store.put_atomic("shard-0123abcd-00000.bin", b"x" * 10)
    with pytest.raises(NotACheckpointError, match="no committed checkpoint"):
        backend.load()


def test_a_removed_checkpoint_leaves_nothing_at_its_location(backend: Backend):
    """What removes a checkpoint (CheckpointManager's retention, Lightning's remove_checkpoint) leaves no trace
    that a tool listing the parent would take for one: no object, and no empty directory where the storage
    has directories (a mount, or fsspec's memory://, which keeps the one ``prepare`` made)."""
    import fsspec

    from ckptbench.checkpoint.manager import remove_checkpoint

    backend.save(state(1))
    store = backend.store()
    assert remove_checkpoint(store, "test") is True
    assert store.list_recursive() == []
    if backend.name in ("local", "cephfs"):
        assert not Path(backend.url).exists()
    elif backend.name == "memory":
        memory = fsspec.filesystem("memory")
        assert not memory.exists(backend.url) and memory.exists(backend.url.rsplit("/", 1)[0])


def test_a_top_level_location_is_never_removed_as_a_directory():
    """On object-store filesystems reached through fsspec (s3fs, gcsfs) a top-level location is a bucket, and
    their ``rmdir`` deletes it: removing a checkpoint saved there leaves the location itself alone."""
    import fsspec

    from ckptbench.checkpoint.manager import remove_checkpoint

    top = f"/ckptbench-top-{uuid.uuid4().hex[:12]}"
    memory = fsspec.filesystem("memory")
    try:
        Checkpointer(threads=1).save(state(1), f"memory://{top}")
        store = open_store(f"memory://{top}")
        assert remove_checkpoint(store, "test") is True and store.list() == []
        assert memory.exists(top)
    finally:
        if memory.exists(top):
            memory.rm(top, recursive=True)


def test_a_removal_that_leaves_a_sub_directory_says_so(caplog: pytest.LogCaptureFixture):
    """A checkpoint directory on fsspec storage with a sub-directory of someone else's in it: the checkpoint's
    files go, the directory stays with what it holds, and the removal says it left it (False, logged)."""
    import fsspec

    from ckptbench.checkpoint.manager import remove_checkpoint

    root = f"/ckptbench-sub-{uuid.uuid4().hex[:12]}"
    memory = fsspec.filesystem("memory")
    try:
        Checkpointer(threads=1).save(state(1), f"memory://{root}/ckpt")
        memory.pipe(f"{root}/ckpt/notes/todo.txt", b"mine")
        store = open_store(f"memory://{root}/ckpt")
        with caplog.at_level("WARNING", logger="ckptbench"):
            assert remove_checkpoint(store, "test") is False
        assert store.list_recursive() == ["notes/todo.txt"]
        assert "left the directory" in caplog.text and "notes/todo.txt" in caplog.text
    finally:
        if memory.exists(root):
            memory.rm(root, recursive=True)


def _fail_writes(monkeypatch: pytest.MonkeyPatch, store: Store) -> None:
    """Every shard write of ``store``'s kind fails, as on an I/O error of the storage."""

    def failing(self: Store, files: Any, **kwargs: Any) -> Any:
        raise OSError(5, "Input/output error (injected)")

    monkeypatch.setattr(type(store), "write_files", failing)



@pytest.mark.parametrize("existed", [True, False], ids=["the-users-directory", "one-the-save-made"])
@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_failed_save_removes_only_the_directory_it_made(kind: str, existed: bool, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    """A save that fails before its commit takes the empty directory it created with it, and leaves one
    that was there before it (made by the user, maybe with its own permissions or a mount under it)."""
    import fsspec

    memory = fsspec.filesystem("memory")
    root = f"/ckptbench-test-{uuid.uuid4().hex[:12]}"
    url = f"memory://{root}/ckpt" if kind == "memory" else str(tmp_path / "ckpt")

    def is_dir() -> bool:
        return memory.isdir(f"{root}/ckpt") if kind == "memory" else Path(url).is_dir()

    try:
        if existed and kind == "memory":
            memory.makedirs(f"{root}/ckpt")
        elif existed:
            Path(url).mkdir()
        _fail_writes(monkeypatch, open_store(url))
        with pytest.raises(StorageIOError, match="injected"):
            Checkpointer(threads=1).save(state(1), url)
        assert is_dir() is existed
    finally:
        if memory.exists(root):
            memory.rm(root, recursive=True)


def test_removing_a_location_never_takes_a_file_written_since_it_was_listed(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """Removing a checkpoint's empty directory lists it, then removes it: two steps, so a save into it can
    write between them. On a filesystem whose ``rmdir`` deletes recursively (pyarrow's ``delete_dir``, behind
    fsspec's hdfs://) that file would go with the directory; the directory is left there instead."""
    pytest.importorskip("pyarrow.fs", reason="fsspec's arrow filesystems need pyarrow")
    import sys

    from fsspec.implementations.arrow import ArrowFSWrapper
    from pyarrow.fs import LocalFileSystem

    class ArrowLocal(ArrowFSWrapper):
        """fsspec's HadoopFileSystem, over a local pyarrow filesystem."""

        protocol = "ckptbench-arrow-test"

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(LocalFileSystem(), **kwargs)

    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, ArrowLocal.protocol, ArrowLocal)
    location = tmp_path / "ckpt"
    location.mkdir()
    store = open_store(f"{ArrowLocal.protocol}://{location}")
    shard = location / "shard-0123abcd-00000.bin"
    listing = store.fs.ls

    def listed_then_a_save_writes(path: str, *args: Any, **kwargs: Any) -> Any:
        found = listing(path, *args, **kwargs)
        shard.write_bytes(b"a concurrent save's shard")
        return found

    monkeypatch.setattr(store.fs, "ls", listed_then_a_save_writes)
    store.remove_location()
    assert location.is_dir()
    assert not shard.exists() or shard.read_bytes() == b"a concurrent save's shard"


def test_removing_a_memory_location_keeps_a_file_written_since_it_was_listed(monkeypatch: pytest.MonkeyPatch):
    """On memory:// the empty directory goes with a removed checkpoint; a file a save wrote after the
    listing makes the ``rmdir`` refuse, and both stay."""
    import fsspec

    memory = fsspec.filesystem("memory")
    root = f"/ckptbench-test-{uuid.uuid4().hex[:12]}"
    store = open_store(f"memory://{root}/ckpt")
    store.prepare()
    shard = f"{root}/ckpt/shard-0123abcd-00000.bin"
    listing = store.fs.ls

    def listed_then_a_save_writes(path: str, *args: Any, **kwargs: Any) -> Any:
        found = listing(path, *args, **kwargs)
        memory.pipe_file(shard, b"a concurrent save's shard")
        return found

    try:
        monkeypatch.setattr(store.fs, "ls", listed_then_a_save_writes)
        store.remove_location()
        assert memory.cat_file(shard) == b"a concurrent save's shard"
        monkeypatch.undo()
        memory.rm_file(shard)
        store.remove_location()
        assert not memory.exists(f"{root}/ckpt") and memory.exists(root)
    finally:
        if memory.exists(root):
            memory.rm(root, recursive=True)
