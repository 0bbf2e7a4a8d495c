"""Zero-copy sync saves (``checkpoint/zero_copy.py``): buffered saves written from the tensors' own memory,
without staging into the arena. They must write the very shard bytes and checksums a staged save writes,
for odd sizes, unaligned tensors, views, lazy conjugates, tied and empty tensors, at any shard size,
thread count and block size; where they do not apply the save is staged as before, and the tuning and
``SaveResult`` say which path a save took."""

from __future__ import annotations

import copy
import errno
import json
import types
from array import array
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ckptbench  # noqa: E402
from ckptbench import native  # noqa: E402
from ckptbench.checkpoint import Checkpointer, tuning, zero_copy  # noqa: E402
from ckptbench.checkpoint import manifest as mf  # noqa: E402
from ckptbench.checkpoint.plan import plan_save  # noqa: E402
from ckptbench.checkpoint.routing import ROUTE_HOST, ROUTE_TORCH, Sources  # noqa: E402
from ckptbench.errors import InsufficientSpaceError, StorageIOError, UsageError  # noqa: E402
from ckptbench.storage import store as store_module  # noqa: E402
from ckptbench.storage.local_target import MountInfo  # noqa: E402
from ckptbench.storage.store import LocalStore  # noqa: E402
from ckptbench.units import format_size  # noqa: E402

MiB = 2**20


@pytest.fixture
def path_is(monkeypatch: pytest.MonkeyPatch):
    """``path_is("1")`` / ``path_is("0")``: the next saves write zero-copy or staged (CKPTBENCH_SAVE_ZERO_COPY)."""
    return lambda flag: monkeypatch.setenv("CKPTBENCH_SAVE_ZERO_COPY", flag)


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (70_000,), dtype=torch.uint8, generator=g)
    halves = torch.randn(9_001, generator=g).half()
    tied = torch.randn(77, generator=g)
    return {
        "big": torch.randn(300_001, generator=g),  # odd size, crosses blocks and checksum parts
        "odd": torch.randint(0, 256, (4097,), dtype=torch.uint8, generator=g),
        "unaligned": raw[3:3 + 65_537],  # contiguous, starting 3 bytes into its storage
        "half_view": halves[1:],  # contiguous, 2 bytes in
        "bf16": torch.randn(333, 129, generator=g).to(torch.bfloat16),
        "t": torch.randn(300, 200, generator=g).t(),  # not contiguous: made contiguous first
        "strided": torch.arange(10_000, dtype=torch.int64)[::3],
        "conj": torch.randn(50, dtype=torch.complex64, generator=g).conj(),  # a lazy conjugate bit
        "small": [torch.randn(3, 5, generator=g) for _ in range(300)],  # packed at 64-byte steps
        "flags": torch.rand(1001, generator=g) > 0.5,
        "scalar": torch.tensor(3.25, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        "tied_a": tied,
        "tied_b": tied,  # the same storage: stored once
        "step": 12,
    }


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.resolve_conj().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else t


def _leaves(obj, path: str = "") -> dict:
    """Every leaf of nested dicts and lists by its path."""
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in _leaves(value, f"{path}.{key}").items()}
    if isinstance(obj, list):
        return {k: v for i, value in enumerate(obj) for k, v in _leaves(value, f"{path}[{i}]").items()}
    return {path: obj}


def _assert_equal(got, want) -> None:
    """Same structure, plain values equal, tensors of the same dtype and shape bit for bit."""
    got, want = _leaves(got), _leaves(want)
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert torch.equal(_bytes(got[key]), _bytes(value)), key
        else:
            assert got[key] == value, key


def _shards(path: Path) -> list[bytes]:
    return [(path / s["name"]).read_bytes() for s in json.loads((path / mf.MANIFEST_NAME).read_text())["shards"]]


def _crcs(path: Path) -> list:
    return [(t["key"], t["crc32c"]) for t in json.loads((path / mf.MANIFEST_NAME).read_text())["tensors"]]


@pytest.mark.parametrize(("shard_size", "threads", "block_size"), [
    (256 * MiB, 1, 4 * MiB),  # one shard
    (100_000, 3, 4096),  # many shards, every tensor and checksum cut by blocks
    (300_000, 2, 5000),  # blocks not a multiple of a page
])
def test_a_zero_copy_save_writes_what_a_staged_save_writes(tmp_path: Path, path_is, shard_size, threads,
                                                           block_size):
    state = _state()
    before = copy.deepcopy(state)
    with Checkpointer(direct=False, shard_size=shard_size, threads=threads, block_size=block_size) as ckpt:
        path_is("1")
        result = ckpt.save(state, tmp_path / "zero-copy")
        assert result.staging == "zero-copy" and ckpt._arena.nbytes == 0  # nothing was staged
        assert result.direct is False and result.sync == "fdatasync"
        assert result.tuning["zero_copy"] == {"value": True, "source": "settings",
                                              "reason": "CKPTBENCH_SAVE_ZERO_COPY"}
        _assert_equal(state, before)  # the tensors are as they were
        _assert_equal(ckpt.load(tmp_path / "zero-copy"), before)  # checksums verified on the way
        path_is("0")
        assert ckpt.save(state, tmp_path / "staged").staging != "zero-copy"
        assert ckpt.save(state, tmp_path / "staged", overwrite=True).tuning["zero_copy"]["value"] is False
    # byte for byte the same shards (alignment padding written as zeros alike), the same checksums
    assert _shards(tmp_path / "zero-copy") == _shards(tmp_path / "staged")
    assert _crcs(tmp_path / "zero-copy") == _crcs(tmp_path / "staged")


def test_a_training_loop_of_zero_copy_saves_reuses_its_plan(tmp_path: Path, path_is):
    path_is("1")
    with Checkpointer(direct=False, threads=2, shard_size=200_000) as ckpt:
        state = _state()
        for step in range(3):
            result = ckpt.save(state, tmp_path / "c", overwrite=True)
            assert result.staging == "zero-copy" and result.plan_reused is (step > 0)
            _assert_equal(ckpt.load(tmp_path / "c"), state)
            with torch.no_grad():
                state["big"].add_(1.0)
                state["t"].mul_(2.0)  # the next save copies the new values of the view
            state["step"] += 1


def test_without_checksums_nothing_is_recorded(tmp_path: Path, path_is):
    path_is("1")
    with Checkpointer(direct=False, checksum=False) as ckpt:
        assert ckpt.save(_state(), tmp_path / "c").staging == "zero-copy"
        assert {crc for _, crc in _crcs(tmp_path / "c")} == {None}
        _assert_equal(ckpt.load(tmp_path / "c"), _state())


def test_where_zero_copy_does_not_apply_the_save_is_staged(tmp_path: Path, path_is):
    path_is("1")
    state = _state()
    with Checkpointer(direct=False) as ckpt:
        handle = ckpt.save(state, tmp_path / "async", async_=True)  # the caller goes on at once: a copy
        assert handle.result().staging in ("copy", "copy-on-write")
    with Checkpointer(direct=True) as ckpt:  # O_DIRECT writes from the aligned arena
        result = ckpt.save(state, tmp_path / "direct")
        assert result.staging != "zero-copy"
        assert result.tuning["zero_copy"] == {"value": False, "source": "default",
                                              "reason": "O_DIRECT writes from the aligned staging arena"}
    for name in ("async", "direct"):
        _assert_equal(ckptbench.load(tmp_path / name), state)


def test_tensors_off_the_host_are_named_as_the_reason():
    plan, sources = plan_save({"cpu": torch.ones(10), "view": torch.ones(4, 4).t()}, 1 << 20)
    assert zero_copy.unavailable(plan, sources) == ""
    # The same plan as if the contiguous tensor were on GPU 0, or the view on another device.
    on_gpu = Sources.of_columns(list(sources), sources.addresses, array("h", [0 if r == ROUTE_HOST else r
                                                                             for r in sources.routes]))
    assert zero_copy.unavailable(plan, on_gpu) == "a tensor is on a GPU"
    elsewhere = [types.SimpleNamespace(device=torch.device("xpu", 1)) if r == ROUTE_TORCH else t
                 for t, r in zip(sources, sources.routes, strict=True)]
    assert zero_copy.unavailable(plan, Sources.of_columns(elsewhere, sources.addresses, sources.routes)) == \
        "a tensor is on xpu:1"


def test_the_choice_per_durable_mode_filesystem_and_setting(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CKPTBENCH_SAVE_ZERO_COPY", raising=False)
    network = tuning.zero_copy_choice(False, "fuse.ceph-fuse")
    assert (network.value, network.source) == (True, "default") and "network or FUSE" in network.reason
    assert tuning.zero_copy_choice(False, "nfs4").value is True
    local = tuning.zero_copy_choice(False, "ext4")
    assert (local.value, local.source) == (tuning.ZERO_COPY_LOCAL, "default")
    assert tuning.zero_copy_choice(True, "fuse.ceph-fuse").value is False  # O_DIRECT: staged
    monkeypatch.setenv("CKPTBENCH_SAVE_ZERO_COPY", "0")
    assert tuning.zero_copy_choice(False, "fuse.ceph-fuse") == tuning.Choice(False, "settings",
                                                                             "CKPTBENCH_SAVE_ZERO_COPY")
    monkeypatch.setenv("CKPTBENCH_SAVE_ZERO_COPY", "yes")
    with pytest.raises(UsageError, match="CKPTBENCH_SAVE_ZERO_COPY='yes' must be 0 or 1"):
        tuning.zero_copy_choice(False, "ext4")


def test_a_buffered_save_on_a_network_mount_is_zero_copy_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CKPTBENCH_SAVE_ZERO_COPY", raising=False)
    fuse = MountInfo(str(tmp_path), "ceph-fuse", "fuse.ceph-fuse", "rw")
    monkeypatch.setattr(tuning, "mount_of", lambda path: fuse)
    monkeypatch.setattr(store_module, "mount_of", lambda path: fuse)
    schedules = []
    real = native.write_gathered
    monkeypatch.setattr(native, "write_gathered", lambda *a, **k: schedules.append(k["schedule"]) or real(*a, **k))
    state = _state()
    result = ckptbench.save(state, tmp_path / "c", direct=False, threads=2, shard_size=200_000)
    assert result.staging == "zero-copy" and result.tuning["zero_copy"]["source"] == "default"
    assert result.tuning["fstype"] == "fuse.ceph-fuse" and schedules == ["per-file"]  # one stream per shard
    _assert_equal(ckptbench.load(tmp_path / "c"), state)


def test_a_write_error_commits_nothing_and_leaves_no_shard(tmp_path: Path, path_is, monkeypatch: pytest.MonkeyPatch):
    path_is("1")
    state = _state()
    with Checkpointer(direct=False, shard_size=100_000, threads=2) as ckpt:
        ckpt.save(state, tmp_path / "c")
        before = sorted(p.name for p in (tmp_path / "c").iterdir())
        real = native.write_gathered

        def failing(files, ranges, **kwargs):
            fds = list(kwargs.pop("fds", ()))[:2]
            real(files[:2], np.zeros((0, 3), np.int64), fds=fds, **kwargs)  # two shards written, then the error
            raise OSError(errno.EIO, "Input/output error", files[2][0])

        monkeypatch.setattr(native, "write_gathered", failing)
        with pytest.raises(StorageIOError, match="writing the checkpoint to .* failed: .*Input/output error"):
            ckpt.save(_state(1), tmp_path / "c", overwrite=True)
        assert sorted(p.name for p in (tmp_path / "c").iterdir()) == before  # no partial shard, no temp, no lock
        monkeypatch.setattr(native, "write_gathered", real)
        _assert_equal(ckpt.load(tmp_path / "c"), state)  # the committed one is intact


def test_a_zero_copy_save_filling_the_disk_says_what_it_needed(mount_fs, path_is, monkeypatch: pytest.MonkeyPatch):
    where = mount_fs("tmpfs", "size=6m")
    path_is("1")
    g = torch.Generator().manual_seed(1)
    ckptbench.save({"w": torch.randn(MiB // 4, generator=g)}, where / "c", direct=False)
    before = {p.name: p.read_bytes() for p in (where / "c").iterdir()}
    monkeypatch.setattr(LocalStore, "free_bytes", lambda self: None)  # no check up front: the disk fills mid-write
    big = {"layers": [torch.randn(MiB // 4, generator=g) for _ in range(8)]}
    with pytest.raises(InsufficientSpaceError, match=rf"ran out of space while writing the checkpoint: it needs "
                                                     rf"{format_size(8 * MiB)}, the free space is unknown"):
        Checkpointer(direct=False, shard_size=MiB).save(big, where / "c", overwrite=True)
    assert {p.name: p.read_bytes() for p in (where / "c").iterdir()} == before
    assert torch.equal(ckptbench.load(where / "c")["w"], torch.randn(MiB // 4, generator=torch.Generator().manual_seed(1)))
