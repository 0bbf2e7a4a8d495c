"""ckptbench.save/load: bit-exact round trips, structure, aliasing, errors, crash safety."""

from __future__ import annotations

import collections
import gc
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer, loader
from ckptbench.checkpoint.api import CheckpointExistsError
from ckptbench.checkpoint.manifest import CorruptCheckpointError, NotACheckpointError
from ckptbench.checkpoint.plan import plan_save
from ckptbench.errors import UsageError
from ckptbench.storage.store import LocalStore


def all_cpu_dtypes() -> list[torch.dtype]:
    """Every dtype this torch has (float8/float4, sub-byte uint1..uint7 and int1..int7, bits), but the
    q-ints: they belong to quantized tensors, refused (test_quantized_tensor_is_refused)."""
    dtypes = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    return sorted((d for d in dtypes if not torch.empty(0, dtype=d).is_quantized), key=str)


_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random bits of the dtype (every bit pattern, NaNs included), so equality is bitwise."""
    g = torch.Generator().manual_seed(seed)
    nbytes = int(torch.empty(shape, dtype=dtype).numel()) * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    t = raw.view(dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype)
    return t if dtype != torch.bool else (raw.reshape(shape) % 2).bool() if nbytes else t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    # As the integers of their width first: torch cannot copy (reshape) some dtypes, like uint3.
    width = _SAME_WIDTH_INT.get(a.element_size())
    a, b = (a.view(width), b.view(width)) if width else (a, b)
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def assert_same(a, b, path="root"):
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert same_bits(a, b), f"{path}: tensors differ"
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b, path


@pytest.mark.parametrize("dtype", all_cpu_dtypes(), ids=str)
def test_every_cpu_dtype_round_trips_bit_exact(tmp_path: Path, dtype: torch.dtype):
    x = random_tensor(dtype, (33, 7), seed=1)
    sd = {"x": x, "scalar": random_tensor(dtype, (), seed=2), "empty": torch.empty((0, 5), dtype=dtype),
          "transposed": x.t(), "strided": x[::3, 1:5]}
    ckptbench.save(sd, tmp_path / "c")
    assert_same(sd, ckptbench.load(tmp_path / "c"))


def test_nested_structure_and_plain_values(tmp_path: Path):
    sd = {
        "model": {"w": torch.randn(64, 64), "b": torch.zeros(64)},
        "optimizer": {"state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.randn(64, 64)}, 1: {}},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0, 1], "name": None}]},
        "step": 1234, "loss": float("nan"), "inf": float("-inf"), "flag": True, "tag": "run-7",
        "tuple_of_tensors": (torch.ones(3), [torch.arange(4)]),
        (1, 2): "tuple key", 2.5: "float key", None: "none key", False: "bool key",
    }
    ckptbench.save(sd, tmp_path / "c")
    assert_same(sd, ckptbench.load(tmp_path / "c"))


class Moments(NamedTuple):
    """A namedtuple defined where the load finds it imported."""

    mean: torch.Tensor
    count: int


Renamed = collections.namedtuple("Renamed", ["a", "def"], rename=True)  # fields ('a', '_1')


def test_types_come_back_as_saved(tmp_path: Path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    shared = torch.nn.Parameter(torch.randn(5))
    local = collections.namedtuple("Local", "a b")  # not findable by the load: a plain tuple comes back
    sd = {"model": model.state_dict(), "params": dict(model.named_parameters()), "embed": shared, "head": shared,
          "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False), "grad": torch.randn(3, requires_grad=True),
          "moments": Moments(torch.ones(2), 7), "local": local(1, torch.zeros(1)), "size": torch.Size([2, 3]),
          "default": collections.defaultdict(int, a=1), "renamed": Renamed(1, 2)}
    ckptbench.save(sd, tmp_path / "c")
    out = ckptbench.load(tmp_path / "c")

    assert type(out["model"]) is collections.OrderedDict and out["model"]._metadata == model.state_dict()._metadata
    assert list(out["model"]) == list(sd["model"]) and all(same_bits(out["model"][k], v) for k, v in sd["model"].items())
    assert all(type(p) is torch.nn.Parameter and p.requires_grad for p in out["params"].values())
    assert out["embed"] is out["head"] and type(out["embed"]) is torch.nn.Parameter
    assert type(out["frozen"]) is torch.nn.Parameter and not out["frozen"].requires_grad
    assert type(out["grad"]) is torch.Tensor and out["grad"].requires_grad and out["grad"].is_leaf
    assert not out["model"]["0.weight"].requires_grad  # state_dict() tensors are detached
    assert type(out["moments"]) is Moments and out["moments"].count == 7
    assert type(out["local"]) is tuple and out["local"][0] == 1
    assert type(out["size"]) is torch.Size and out["size"] == (2, 3)
    assert type(out["default"]) is dict and out["default"] == {"a": 1}  # other dict subclasses: plain dicts
    assert type(out["renamed"]) is Renamed and out["renamed"]._1 == 2

    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    fresh.load_state_dict(out["model"])
    assert torch.equal(fresh[0].weight, model[0].weight)


def test_module_metadata_is_encoded_off_the_stall_and_compactly():
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(50)])
    plan, _ = plan_save({"model": model.state_dict()}, 2**20)
    node = plan.skeleton["__dict__"][0][1]
    assert "__metadata__" not in node  # planning (in an async save's stall) only took a list
    assert plan.manifest_skeleton is plan.skeleton and node["__metadata__"][:2] == [["", [["version", 1]]],
                                                                                    ["0", [["version", 1]]]]


def test_namedtuple_and_size_dict_keys_come_back_as_saved(tmp_path: Path):
    """Tuple subclasses as dict keys keep their class like tuple values do (they came back as plain
    tuples); one whose class the load does not find comes back a plain tuple of the same items."""
    local = collections.namedtuple("Local", "a b")
    sd = {Moments(1, 2): torch.ones(2), torch.Size([2, 3]): "shape", (Moments(3, 4), torch.Size([5])): 1,
          local(5, 6): "local", (7, 8): "plain"}
    ckptbench.save(sd, tmp_path / "c")
    out = ckptbench.load(tmp_path / "c")
    assert list(out) == list(sd)
    kinds = [type(k) for k in out]
    assert kinds == [Moments, torch.Size, tuple, tuple, tuple]
    nested = list(out)[2]
    assert type(nested[0]) is Moments and type(nested[1]) is torch.Size
    assert list(out)[3] == (5, 6) and torch.equal(out[Moments(1, 2)], torch.ones(2))


def test_a_namedtuple_whose_module_is_not_imported_is_not_imported_by_the_load(tmp_path: Path):
    ckptbench.save({"t": Moments(torch.ones(1), 1)}, tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    node = manifest["skeleton"]["__dict__"][0][1]
    node["__class__"] = "ckptbench_never_imported_module:Moments"
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
    out = ckptbench.load(tmp_path / "c", verify=False)
    assert "ckptbench_never_imported_module" not in sys.modules
    assert type(out["t"]) is tuple and out["t"][1] == 1


def test_non_contiguous_and_views(tmp_path: Path):
    base = torch.randn(32, 48)
    sd = {"t": base.t(), "slice": base[::2, 3:9], "expanded": torch.randn(1, 5).expand(4, 5),
          "conj": torch.randn(3, 3, dtype=torch.complex64).conj(), "neg": torch.randn(4)._neg_view()}
    ckptbench.save(sd, tmp_path / "c")
    out = ckptbench.load(tmp_path / "c")
    for k in sd:
        assert torch.equal(out[k], sd[k].resolve_conj().resolve_neg()), k


def test_tied_weights_are_stored_once_and_load_tied(tmp_path: Path):
    w = torch.randn(256, 256)
    sd = {"embed": w, "lm_head": w, "other": torch.randn(256, 256)}
    result = ckptbench.save(sd, tmp_path / "c")
    assert result.bytes == 2 * w.numel() * 4
    out = ckptbench.load(tmp_path / "c")
    assert out["embed"] is out["lm_head"] and torch.equal(out["embed"], w)


def test_many_tiny_tensors(tmp_path: Path):
    sd = {f"layer{i}.bias": torch.full((3,), float(i)) for i in range(20000)}
    result = ckptbench.save(sd, tmp_path / "c")
    assert result.tensors == 20000
    out = ckptbench.load(tmp_path / "c")
    assert all(torch.equal(out[k], v) for k, v in sd.items())
    # tiny tensors pack densely (64-byte alignment), not one page each
    assert sum(s["nbytes"] for s in json.loads((tmp_path / "c" / "manifest.json").read_text())["shards"]) < 20000 * 64 + 64


def test_plan_balances_shards_and_aligns_big_tensors():
    sd = {f"w{i}": torch.empty(1024 * (i + 1), dtype=torch.uint8) for i in range(40)}
    plan, tensors = plan_save(sd, shard_size=200 * 1024)
    sizes = [s.nbytes for s in plan.shards]
    assert len(sizes) == 5 and max(sizes) - min(sizes) < 64 * 1024
    for e in plan.entries:
        assert e.offset % (4096 if e.nbytes >= 64 * 1024 else 64) == 0
    # no overlaps inside a shard
    for s in plan.shards:
        spans = sorted((e.offset, e.offset + e.nbytes) for e in plan.entries if e.shard == s.index)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_plan_padding_is_exactly_the_bytes_of_the_shard_files_no_tensor_covers():
    sd = {f"w{i}": torch.empty(37 * (i + 1) + (70_000 if i % 5 == 0 else 0), dtype=torch.uint8) for i in range(40)}
    plan, _ = plan_save(sd, shard_size=100 * 1024)
    assert len(plan.shards) > 1
    covered = np.zeros(plan.arena_bytes, np.int8)
    assert len(plan.padding) == len(plan.placements) and plan.padding.max() < 4096 and plan.padding.any()
    for (_, offset, nbytes), after in zip(plan.placements.tolist(), plan.padding.tolist(), strict=True):
        covered[offset:offset + nbytes + after] += 1
    for shard in plan.shards:  # every byte of every file once, nothing between the files
        assert (covered[shard.arena_offset:shard.arena_offset + shard.nbytes] == 1).all()
        covered[shard.arena_offset:shard.arena_offset + shard.nbytes] = 0
    assert not covered.any()


def shard_bytes(path: Path) -> list[bytes]:
    manifest = json.loads((path / "manifest.json").read_text())
    return [(path / shard["name"]).read_bytes() for shard in manifest["shards"]]


def test_padding_runs_to_the_next_non_empty_extent_or_the_end_of_the_file():
    from ckptbench.checkpoint.plan import padding_after

    # 10 bytes at 0, an empty extent at 64, 100 bytes at 128 (file ends at 256), then 5 bytes at 4096
    # in the next file (it ends at 4101)
    offsets, nbytes, limits = [0, 64, 128, 4096], [10, 0, 100, 5], [256, 256, 256, 4101]
    assert padding_after(offsets, nbytes, limits).tolist() == [118, 64, 28, 0]
    assert padding_after(offsets[:3], nbytes[:3], 300).tolist() == [118, 64, 72]  # one limit for all
    assert padding_after([], [], 0).tolist() == []


def test_shard_files_do_not_depend_on_what_the_arena_held_before(tmp_path: Path):
    """A reused arena's previous contents must not reach the padding of the next save's files (stale
    bytes of another model in a checkpoint, and the same state saving to different files)."""
    small = {f"b{i}": torch.full((i % 7 + 1,), float(i)) for i in range(300)}
    with Checkpointer() as checkpointer:
        checkpointer.save({"noise": torch.randint(-2**31, 2**31 - 1, (2**18,), dtype=torch.int32)}, tmp_path / "a")
        checkpointer.save(small, tmp_path / "reused")
    ckptbench.save(small, tmp_path / "fresh")
    assert shard_bytes(tmp_path / "reused") == shard_bytes(tmp_path / "fresh")


def test_async_save_returns_after_staging(tmp_path: Path):
    ckpt = Checkpointer()
    sd = {"w": torch.randn(512, 1024)}
    handle = ckpt.save(sd, tmp_path / "c", async_=True)
    expected = sd["w"].clone()
    sd["w"].add_(1.0)  # the caller may now change its tensors
    result = handle.result(timeout=60)
    assert handle.done() and result.persist_s > 0 and result.stall_s > 0
    assert torch.equal(ckpt.load(tmp_path / "c")["w"], expected)
    ckpt.close()


def test_second_save_waits_for_the_first(tmp_path: Path):
    ckpt = Checkpointer()
    first = ckpt.save({"w": torch.randn(1024, 1024)}, tmp_path / "a", async_=True)
    second = ckpt.save({"w": torch.ones(1024, 1024)}, tmp_path / "b", async_=True)
    assert first.done()  # the second save could not stage before the first persisted
    second.result(timeout=60)
    assert torch.equal(ckpt.load(tmp_path / "b")["w"], torch.ones(1024, 1024))
    ckpt.close()


def test_existing_checkpoint_needs_overwrite_and_survives_refusal(tmp_path: Path):
    ckptbench.save({"v": torch.tensor([1])}, tmp_path / "c")
    with pytest.raises(CheckpointExistsError):
        ckptbench.save({"v": torch.tensor([2])}, tmp_path / "c")
    assert ckptbench.load(tmp_path / "c")["v"].item() == 1
    ckptbench.save({"v": torch.tensor([3])}, tmp_path / "c", overwrite=True)
    assert ckptbench.load(tmp_path / "c")["v"].item() == 3
    shards = [p.name for p in (tmp_path / "c").iterdir() if p.name.startswith("shard-")]
    assert len(shards) == 1  # the replaced checkpoint's shard was removed after the commit


def test_unrelated_files_are_left_alone(tmp_path: Path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    ckptbench.save({"v": torch.ones(3)}, tmp_path / "c")
    ckptbench.save({"v": torch.ones(3)}, tmp_path / "c", overwrite=True)
    assert (tmp_path / "c" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("value", "needle"),
    [(object(), "model.weird: value of type object"),
     (torch.randn(4, 4).to_sparse(), "model.weird: torch.sparse_coo"),
     (torch.empty(3, device="meta"), "meta tensors")],
)
def test_unsupported_leaves_name_the_key_and_write_nothing(tmp_path: Path, value, needle):
    with pytest.raises(UsageError, match=needle.replace(".", r"\.")):
        ckptbench.save({"model": {"ok": torch.ones(2), "weird": value}}, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_quantized_tensor_is_refused(tmp_path: Path):
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    with pytest.raises(UsageError, match="quantized"):
        ckptbench.save({"q": q}, tmp_path / "c")


def test_load_refuses_a_directory_without_manifest(tmp_path: Path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "shard-0123abcd-00000.bin").write_bytes(b"x" * 100)
    with pytest.raises(NotACheckpointError, match="no committed checkpoint"):
        ckptbench.load(tmp_path / "c")
    with pytest.raises(NotACheckpointError):
        ckptbench.load(tmp_path / "missing")


def test_corruption_names_the_tensor_and_shard(tmp_path: Path):
    sd = {"a": torch.randn(1000), "b": torch.randn(1000)}
    ckptbench.save(sd, tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    entry = next(t for t in manifest["tensors"] if t["key"] == "b")
    shard = tmp_path / "c" / manifest["shards"][entry["shard"]]["name"]
    data = bytearray(shard.read_bytes())
    data[entry["offset"] + 17] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"tensor 'b' \(shard shard-"):
        ckptbench.load(tmp_path / "c")
    assert ckptbench.load(tmp_path / "c", verify=False)["a"].equal(sd["a"])  # verify=False skips the check


def test_truncated_shard_is_reported(tmp_path: Path):
    ckptbench.save({"a": torch.randn(4096)}, tmp_path / "c")
    shard = next((tmp_path / "c").glob("shard-*.bin"))
    os.truncate(shard, 100)
    with pytest.raises(CorruptCheckpointError, match="100 bytes"):
        ckptbench.load(tmp_path / "c")



def many_shards(tmp_path: Path, shards: int = 10) -> tuple[dict, Path, dict]:
    """A checkpoint of 40 tensors spread round-robin over ``shards`` shards; (state_dict, dir, manifest)."""
    sd = {f"t{i:02d}": torch.randn(4096) for i in range(40)}
    Checkpointer(threads=2, shard_size=40 * 16 * 1024 // shards).save(sd, tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert len(manifest["shards"]) == shards
    return sd, tmp_path / "c", manifest


def flip_byte(directory: Path, manifest: dict, key: str, at: int = 17) -> str:
    """Damage one byte of tensor ``key`` on disk; returns the name of its shard."""
    entry = next(t for t in manifest["tensors"] if t["key"] == key)
    name = manifest["shards"][entry["shard"]]["name"]
    with open(directory / name, "r+b") as f:
        f.seek(entry["offset"] + at)
        byte = f.read(1)[0]
        f.seek(entry["offset"] + at)
        f.write(bytes([byte ^ 0xFF]))
    return name


@pytest.mark.parametrize("which", ["first", "last"])
def test_corruption_in_the_first_or_last_of_many_shards_is_named(tmp_path: Path, which: str):
    sd, c, manifest = many_shards(tmp_path)
    shard = 0 if which == "first" else len(manifest["shards"]) - 1
    key = next(t["key"] for t in manifest["tensors"] if t["shard"] == shard)
    name = flip_byte(c, manifest, key)
    for threads in (1, 2, 3, 16):  # one shard per read, several, all at once
        with pytest.raises(CorruptCheckpointError, match=rf"tensor '{key}' \(shard {name} of "):
            Checkpointer(threads=threads).load(c)
    out = ckptbench.load(c, verify=False)
    assert all(torch.equal(out[k], v) for k, v in sd.items() if k != key)


def test_several_corrupt_shards_name_the_first_tensor_in_manifest_order(tmp_path: Path):
    _, c, manifest = many_shards(tmp_path)
    shard_of = {t["key"]: t["shard"] for t in manifest["tensors"]}
    assert shard_of["t31"] < shard_of["t15"]  # t31's shard is read (and checked) first
    flip_byte(c, manifest, "t31")
    name = flip_byte(c, manifest, "t15")
    for threads in (1, 2, 16):
        with pytest.raises(CorruptCheckpointError, match=rf"tensor 't15' \(shard {name} of "):
            Checkpointer(threads=threads).load(c)


def test_missing_shard_among_many_is_reported_before_any_read(tmp_path: Path, monkeypatch):
    _, c, manifest = many_shards(tmp_path)
    name = manifest["shards"][7]["name"]
    (c / name).unlink()
    reads = []
    real = LocalStore.read_files
    monkeypatch.setattr(LocalStore, "read_files", lambda self, files, **kw: reads.append(files) or real(self, files, **kw))
    with pytest.raises(CorruptCheckpointError, match=rf"shard {name} of .* is missing; the manifest says"):
        ckptbench.load(c)
    assert reads == []


def test_many_shards_are_each_read_once_in_groups_of_threads(tmp_path: Path, monkeypatch):
    sd, c, manifest = many_shards(tmp_path)
    calls = []
    real = LocalStore.read_files

    def recording(self, files, **kw):
        calls.append(([name for name, _ in files], kw["threads"]))
        return real(self, files, **kw)

    monkeypatch.setattr(LocalStore, "read_files", recording)
    out = Checkpointer(threads=3).load(c)
    assert all(torch.equal(out[k], v) for k, v in sd.items())
    assert [n for names, _ in calls for n in names] == [s["name"] for s in manifest["shards"]]
    assert [len(names) for names, _ in calls] == [3, 3, 3, 1] and {t for _, t in calls} == {3}
    calls.clear()
    Checkpointer(threads=3).load(c, verify=False)  # nothing to overlap with: one read of everything
    assert [len(names) for names, _ in calls] == [10]


def test_read_error_wins_over_a_checksum_mismatch_found_meanwhile(tmp_path: Path, monkeypatch):
    _, c, manifest = many_shards(tmp_path)
    key = next(t["key"] for t in manifest["tensors"] if t["shard"] == 0)
    flip_byte(c, manifest, key)
    last = manifest["shards"][-1]["name"]
    real = LocalStore.read_files

    def failing(self, files, **kw):
        if any(name == last for name, _ in files):
            raise OSError(5, "Input/output error", str(self.path / last))
        return real(self, files, **kw)

    monkeypatch.setattr(LocalStore, "read_files", failing)
    with pytest.raises(OSError, match="Input/output error"):
        Checkpointer(threads=2).load(c)


def test_load_without_populate_support_still_faults_in(tmp_path: Path, monkeypatch):
    # Kernels before 5.14 refuse MADV_POPULATE_WRITE: the readers fault the pages in themselves.
    sd, c, _ = many_shards(tmp_path)
    monkeypatch.setattr(loader, "MADV_POPULATE_WRITE", 0x7FFF)  # EINVAL everywhere
    out = ckptbench.load(c)
    assert all(torch.equal(out[k], v) for k, v in sd.items())


def test_loaded_tensors_outlive_the_checkpointer(tmp_path: Path):
    sd, c, _ = many_shards(tmp_path)
    ckpt = Checkpointer()
    out = ckpt.load(c)
    ckpt.close()
    del ckpt
    gc.collect()
    assert all(torch.equal(out[k], v) for k, v in sd.items())
    out["t00"].add_(1)  # writable, like any loaded tensor
    assert torch.equal(out["t00"], sd["t00"] + 1)


def test_manifest_with_a_wrong_checksum_count_is_corrupt(tmp_path: Path):
    _, c, manifest = many_shards(tmp_path)
    manifest["tensors"][3]["crc32c"].append(0)
    (c / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match="lists 2 checksums for tensor 't03', which needs 1"):
        ckptbench.load(c)


def test_save_into_a_file_path_is_refused(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        ckptbench.save({"a": torch.ones(1)}, tmp_path / "f")


def test_failed_write_leaves_no_checkpoint_and_no_shards(mount_fs):
    where = mount_fs("tmpfs", "size=1m")
    with pytest.raises(Exception, match="No space left|free"):
        ckptbench.save({"a": torch.randn(1024, 1024)}, where / "c")
    assert not (where / "c" / "manifest.json").exists()
    assert not list((where / "c").glob("shard-*")) if (where / "c").exists() else True


def test_load_into_preallocated_tensors_reuses_one_buffer(tmp_path: Path):
    ckpt = Checkpointer()
    sd = {"w": torch.randn(64, 64), "opt": {"step": 3, "m": [torch.randn(10)]}}
    ckpt.save(sd, tmp_path / "c")
    live = {"w": torch.zeros(64, 64), "opt": {"step": 3, "m": [torch.zeros(10)]}}
    w_before = live["w"]
    assert ckpt.load(tmp_path / "c", into=live) is live
    assert live["w"] is w_before and torch.equal(live["w"], sd["w"]) and torch.equal(live["opt"]["m"][0], sd["opt"]["m"][0])
    address = ckpt._read_buffer.buffer.address
    ckpt.load(tmp_path / "c", into=live)
    assert ckpt._read_buffer.buffer.address == address  # reused, not reallocated
    with pytest.raises(UsageError, match="does not fit"):
        ckpt.load(tmp_path / "c", into={"w": torch.zeros(3), "opt": {"step": 3, "m": [torch.zeros(10)]}})
    with pytest.raises(UsageError, match="keys differ"):
        ckpt.load(tmp_path / "c", into={"w": torch.zeros(64, 64)})
    ckpt.close()


def test_settings_are_reported(tmp_path: Path):
    r = ckptbench.save({"a": torch.randn(100)}, tmp_path / "c", threads=3, shard_size=2**20, checksum=False)
    assert (r.threads, r.shard_size, r.checksum, r.sync) == (3, 2**20, False, "fdatasync")
    assert r.direct is True and r.files == 2 and r.gbps > 0
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["checksum"] is None
    ckptbench.load(tmp_path / "c")  # loads without checksums


CHILD = textwrap.dedent("""
    import sys, torch, ckptbench
    path = sys.argv[1]
    version = 1
    while True:
        sd = {f"w{i}": torch.full((256, 1024), float(version * 100 + i)) for i in range(8)}
        sd["version"] = version
        ckptbench.save(sd, path, overwrite=True)
        print(version, flush=True)
        version += 1
""")


def test_kill_9_at_random_moments_never_damages_the_committed_checkpoint(tmp_path: Path):
    """A committed checkpoint survives SIGKILL at any moment of a later save: load gives a whole version."""
    path = tmp_path / "c"
    ckptbench.save({**{f"w{i}": torch.full((256, 1024), float(i)) for i in range(8)}, "version": 0}, path)
    rng = random.Random(1234)
    seen_versions = set()
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True,
                                cwd=tmp_path)
        assert proc.stdout.readline().strip()  # it has committed at least one save: now saves are back to back
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        out = ckptbench.load(path)
        v = out["version"]
        seen_versions.add(v)
        for i in range(8):
            assert torch.equal(out[f"w{i}"], torch.full((256, 1024), float(v * 100 + i) if v else float(i))), (v, i)
    assert max(seen_versions) > 0
    # what a killed save leaves behind is cleaned by the next successful one
    ckptbench.save({"w": torch.ones(1)}, path, overwrite=True)
    names = sorted(p.name for p in path.iterdir())
    assert len(names) == 2 and "manifest.json" in names


def test_only_empty_tensors_and_values(tmp_path):
    """A state_dict whose tensors hold no bytes has no shards; it still saves and loads."""
    ckptbench.save({"step": 3, "e": torch.empty(0, 4)}, tmp_path / "c")
    out = ckptbench.load(tmp_path / "c")
    assert out["step"] == 3 and out["e"].shape == (0, 4)


@pytest.mark.parametrize("async_", [False, True], ids=["ring", "arena"])
def test_a_fallback_from_o_direct_names_the_checkpoint_directory(mount_fs, async_: bool):
    """ramfs has no O_DIRECT: the save writes buffered and its reason names the directory the user gave,
    not the /proc/PID/fd path the engine reached it by (gone once the process ends)."""
    where = mount_fs("ramfs") / "ckpt"
    with Checkpointer(direct=True, threads=2, block_size=1 << 20) as ckpt:
        result = ckpt.save({"w": torch.arange(300_000, dtype=torch.float32)}, where, async_=async_)
        result = result.result() if async_ else result
    assert result.direct is False
    assert result.direct_fallback_reason and str(where) in result.direct_fallback_reason
    assert "/proc/" not in result.direct_fallback_reason
