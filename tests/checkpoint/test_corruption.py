"""Corruption detection (a guarantee in docs/guarantees.md): a damaged checkpoint is refused with an error that
names the file and the tensor, never a KeyError/TypeError traceback and never wrong tensors.

Damaged shards (a flipped byte, a truncated or missing shard) are in test_save_load.py; here the
manifest: bytes that do not parse, JSON of the wrong shape, entries with missing keys or wrong
types, and references to data that is not there.
"""

from __future__ import annotations

import collections
import copy
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint.manifest import CorruptCheckpointError, NotACheckpointError
from ckptbench.errors import CkptbenchError
from ckptbench.storage.store import LocalStore

REFUSED = (NotACheckpointError, CorruptCheckpointError)


class Pair(NamedTuple):
    first: Any
    second: Any


def state_dict() -> dict:
    """Something of every kind a manifest describes: several shards, a tied and an empty tensor,
    non-str keys, tuples and non-finite floats among the plain values, an OrderedDict with its
    ``_metadata``, a parameter, a tensor that requires grad, a namedtuple and a torch.Size."""
    w = torch.randn(64, 8)
    ordered = collections.OrderedDict(p=torch.nn.Parameter(torch.ones(4)), g=torch.zeros(2, requires_grad=True))
    ordered._metadata = collections.OrderedDict({"": {"version": 2}})
    return {"w": w, "tied": w, "b": torch.randn(300).half(), "empty": torch.empty(0, 3), ("k", 1): torch.ones(7),
            "values": [1, (2, 3.5), float("nan"), None, "s"], "module": ordered,
            "pair": Pair(torch.arange(3), torch.Size([2, 3]))}


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict]:
    """A committed checkpoint of two shards; (its directory, its manifest)."""
    Checkpointer(shard_size=2048).save(state_dict(), tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert len(manifest["shards"]) == 2
    return tmp_path / "c", manifest


def rewrite(directory: Path, manifest: Any) -> str:
    """Replace the manifest with ``manifest`` (JSON); returns its path as messages name it."""
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return str(directory / "manifest.json")


def tensor(manifest: dict, key: str) -> dict:
    return next(t for t in manifest["tensors"] if t["key"] == key)


# -- a manifest that does not parse ---------------------------------------------------------------


@pytest.mark.parametrize("content", [
    b"", b"\x00\xff\xfe garbage \x89PNG", b"\xff" * 64, b"{", b"[" * 100_000 + b"]" * 100_000, b"NaN",
], ids=["empty", "binary", "not-utf8", "one-brace", "nested-too-deep", "nan"])
def test_garbage_bytes_are_not_a_checkpoint(saved, content: bytes):
    c, _ = saved
    (c / "manifest.json").write_bytes(content)
    with pytest.raises(NotACheckpointError, match=rf"{c / 'manifest.json'} (is not a valid manifest|has format)"):
        ckptbench.load(c)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.999])
def test_truncated_manifest_is_not_a_checkpoint(saved, keep: float):
    c, _ = saved
    text = (c / "manifest.json").read_bytes()
    (c / "manifest.json").write_bytes(text[:int(len(text) * keep)])
    with pytest.raises(NotACheckpointError, match=rf"{c / 'manifest.json'} is not a valid manifest"):
        ckptbench.load(c)


@pytest.mark.parametrize("value", [[1, 2], "ckptbench.checkpoint/1", 42, None, {"format": "other/2"}, {}],
                         ids=["list", "string", "number", "null", "other-format", "empty-object"])
def test_json_of_the_wrong_shape_is_not_a_checkpoint(saved, value: Any):
    c, _ = saved
    path = rewrite(c, value)
    with pytest.raises(NotACheckpointError, match=rf"{path} has format"):
        ckptbench.load(c)


# -- a manifest of the right format with malformed parts ------------------------------------------


def _set(field: str, value: Any) -> Callable[[dict], None]:
    return lambda m: m.update({field: value})


PART_DAMAGE: dict[str, Callable[[dict], None]] = {
    "shards-missing": lambda m: m.pop("shards"),
    "tensors-missing": lambda m: m.pop("tensors"),
    "skeleton-missing": lambda m: m.pop("skeleton"),
    "shards-object": _set("shards", {"0": "shard"}),
    "tensors-null": _set("tensors", None),
    "shard-a-string": lambda m: m["shards"].__setitem__(0, "shard-0.bin"),
    "shard-without-name": lambda m: m["shards"][0].pop("name"),
    "shard-nbytes-string": lambda m: m["shards"][0].update(nbytes="4096"),
    "shard-nbytes-negative": lambda m: m["shards"][1].update(nbytes=-1),
    "shard-name-a-path": lambda m: m["shards"][0].update(name="../elsewhere/shard.bin"),
    "shard-name-dotdot": lambda m: m["shards"][0].update(name=".."),
    "checksum-a-list": _set("checksum", [1]),
    "checksum-block-zero": lambda m: m["checksum"].update(block_bytes=0),
    # one range check per block: a 1-byte block would have a small manifest build one per byte of the tensors
    "checksum-block-one-byte": lambda m: m["checksum"].update(block_bytes=1),
    "skeleton-a-number": _set("skeleton", 5),
    "skeleton-unknown-node": _set("skeleton", {"__set__": []}),
    "skeleton-dict-not-pairs": _set("skeleton", {"__dict__": [["a"]]}),
    "skeleton-unhashable-key": _set("skeleton", {"__dict__": [[{"__key__": [1]}, {"__value__": 1}]]}),
    "skeleton-bad-float": _set("skeleton", {"__value__": {"__float__": "lots"}}),
    "skeleton-tuple-not-list": _set("skeleton", {"__value__": {"__tuple__": 3}}),
    "skeleton-parameter-not-bool": _set("skeleton", {"__tensor__": 0, "__parameter__": 1}),
    "skeleton-extra-on-another-node": _set("skeleton", {"__list__": [], "__ordered__": True}),
    "skeleton-two-tags": _set("skeleton", {"__list__": [], "__tuple__": []}),
    "skeleton-metadata-with-a-tensor": _set("skeleton", {"__dict__": [], "__ordered__": True,
                                                         "__metadata__": {"__tensor__": 0}}),
    "skeleton-metadata-of-a-plain-dict": _set("skeleton", {"__dict__": [], "__metadata__": {"__value__": 1}}),
    "skeleton-class-not-a-str": _set("skeleton", {"__tuple__": [], "__class__": 5}),
    "skeleton-fields-without-class": _set("skeleton", {"__tuple__": [], "__fields__": ["x"]}),
    "skeleton-fields-not-strings": _set("skeleton", {"__tuple__": [], "__class__": "m:P", "__fields__": ["x", 1]}),
    "skeleton-key-class-not-a-str": _set("skeleton", {"__dict__": [[{"__key__": {"__tuple__": [1], "__class__": 5}},
                                                                    {"__value__": 1}]]}),
    "skeleton-key-fields-without-class": _set("skeleton", {"__dict__": [[{"__key__": {"__tuple__": [1],
                                                                                      "__fields__": ["a"]}},
                                                                         {"__value__": 1}]]}),
    "skeleton-metadata-not-pairs": _set("skeleton", {"__dict__": [], "__ordered__": True, "__metadata__": [["", 1]]}),
    "skeleton-metadata-value-a-list": _set("skeleton", {"__dict__": [], "__ordered__": True,
                                                        "__metadata__": [["", [["version", [2]]]]]}),
}


@pytest.mark.parametrize("damage", PART_DAMAGE.values(), ids=PART_DAMAGE.keys())
def test_a_malformed_part_is_refused_naming_the_manifest(saved, damage):
    c, manifest = saved
    damage(manifest)
    path = rewrite(c, manifest)
    with pytest.raises(NotACheckpointError, match=rf"^{path} "):
        ckptbench.load(c)


@pytest.mark.parametrize("field", ["key", "dtype", "shape", "nbytes", "shard", "offset", "alias_of", "crc32c"])
def test_a_tensor_entry_missing_a_field_is_refused_naming_it(saved, field: str):
    c, manifest = saved
    tensor(manifest, "b").pop(field)
    path = rewrite(c, manifest)
    named = "tensor 'b'" if field != "key" else r"tensor \d+ is \{"
    with pytest.raises(NotACheckpointError, match=rf"^{path} is not a valid manifest: {named}.*{field}"
                       if field != "key" else rf"^{path} is not a valid manifest: {named}.*not an object with a 'key'"):
        ckptbench.load(c)


@pytest.mark.parametrize(("field", "value"), [
    ("dtype", "float99"), ("dtype", 7), ("dtype", "__class__"), ("shape", "64x8"), ("shape", [64, "8"]),
    ("shape", [-1, 8]), ("nbytes", "2048"), ("nbytes", 2048.0), ("nbytes", True), ("offset", None),
    ("offset", -64), ("shard", "0"), ("alias_of", "w"), ("crc32c", "0x1234"), ("crc32c", [2**32]),
])
def test_a_tensor_field_of_the_wrong_type_is_refused_naming_the_tensor(saved, field: str, value: Any):
    c, manifest = saved
    tensor(manifest, "w")[field] = value
    path = rewrite(c, manifest)
    with pytest.raises(NotACheckpointError, match=rf"^{path} is not a valid manifest: tensor 'w' has {field} "):
        ckptbench.load(c)


# -- a manifest that refers to data that is not there ---------------------------------------------


def test_a_shard_name_not_on_disk_is_named_before_anything_is_read(saved, monkeypatch):
    c, manifest = saved
    manifest["shards"][1]["name"] = "shard-deadbeef-00001.bin"
    rewrite(c, manifest)
    reads = []
    monkeypatch.setattr(LocalStore, "read_files", lambda self, files, **kw: reads.append(files))
    with pytest.raises(CorruptCheckpointError, match=rf"shard shard-deadbeef-00001.bin of {c} is missing"):
        ckptbench.load(c)
    assert reads == []


def test_a_shard_bigger_in_the_manifest_than_on_disk_is_refused_before_allocating(saved, monkeypatch):
    c, manifest = saved
    name = manifest["shards"][0]["name"]
    manifest["shards"][0]["nbytes"] = 2**62  # sized by the manifest, the read buffer could not be allocated
    rewrite(c, manifest)
    monkeypatch.setattr("ckptbench.checkpoint.loader._fresh_read_buffer", lambda n: pytest.fail(f"allocated {n} bytes"))
    with pytest.raises(CorruptCheckpointError, match=rf"shard {name} of {c} is \d+ bytes; the manifest says {2**62}"):
        ckptbench.load(c)


@pytest.mark.parametrize("how", ["offset", "nbytes-and-shape"])
def test_a_tensor_running_past_the_end_of_its_shard_is_named(saved, how: str):
    c, manifest = saved
    entry = tensor(manifest, "b")
    shard = manifest["shards"][entry["shard"]]
    if how == "offset":
        entry["offset"] = shard["nbytes"] - 2
    else:
        entry["shape"], entry["nbytes"] = [shard["nbytes"]], 2 * shard["nbytes"]
    path = rewrite(c, manifest)
    with pytest.raises(CorruptCheckpointError,
                       match=rf"^{path}: tensor 'b' \(bytes \d+\.\.\d+\) runs past the end of shard {shard['name']}"):
        ckptbench.load(c)


@pytest.mark.parametrize("index", [2, 99, -1])
def test_a_shard_index_out_of_range_is_named(saved, index: int):
    c, manifest = saved
    tensor(manifest, "w")["shard"] = index
    path = rewrite(c, manifest)
    with pytest.raises(CorruptCheckpointError, match=rf"^{path}: tensor 'w' is in shard {index}, but the manifest "
                                                     r"lists 2 shards"):
        ckptbench.load(c)


def test_a_shape_that_does_not_match_the_bytes_is_named(saved):
    c, manifest = saved
    tensor(manifest, "w")["shape"] = [8, 8]
    path = rewrite(c, manifest)
    with pytest.raises(CorruptCheckpointError, match=rf"^{path}: tensor 'w' has 2048 bytes, but shape \[8, 8\] of "
                                                     r"float32 needs 256"):
        ckptbench.load(c)


@pytest.mark.parametrize(("alias", "message"), [
    (9, "is an alias of tensor 9, which is not one of the 1 tensors before it"),
    (1, "is an alias of tensor 1, which is not one of the 1 tensors before it"),  # itself
])
def test_an_alias_out_of_range_is_named(saved, alias: int, message: str):
    c, manifest = saved
    tensor(manifest, "tied")["alias_of"] = alias
    path = rewrite(c, manifest)
    with pytest.raises(CorruptCheckpointError, match=rf"^{path}: tensor 'tied' {message}"):
        ckptbench.load(c)


def test_an_alias_of_another_shape_is_named(saved):
    c, manifest = saved
    entry = tensor(manifest, "tied")
    entry["shape"] = [8, 64]  # same bytes, but not what it aliases
    path = rewrite(c, manifest)
    with pytest.raises(CorruptCheckpointError, match=rf"^{path}: tensor 'tied' is an alias of 'w', which has another"):
        ckptbench.load(c)


def test_a_skeleton_pointing_past_the_tensors_is_refused(saved):
    c, manifest = saved
    count = len(manifest["tensors"])
    manifest["skeleton"]["__dict__"][0][1] = {"__tensor__": count}
    path = rewrite(c, manifest)
    with pytest.raises(NotACheckpointError, match=rf"^{path} is not a valid manifest: skeleton: tensor index {count} "):
        ckptbench.load(c)


@pytest.mark.parametrize("node", [
    {"__tuple__": [{"__value__": 2**70}], "__class__": "torch:Size"},  # no int64: no torch.Size
    {"__tuple__": [{"__value__": 1}, {"__value__": 2}], "__class__": "__main__:X", "__fields__": ["\ufb01", "fi"]},
    {"__tuple__": [{"__value__": 1}], "__class__": "collections:OrderedDict", "__fields__": ["a"]},  # not a tuple
    {"__tuple__": [{"__value__": 1}], "__class__": "tests.checkpoint.test_corruption:Pair", "__fields__": ["first"]},
    {"__tuple__": [{"__value__": 1}], "__class__": "torch:distributed.reduce_op", "__fields__": ["a"]},
    {"__tuple__": [{"__value__": 1}], "__class__": "no.such.module:P", "__fields__": ["a"]},
], ids=["size-overflow", "nfkc-twins", "not-a-tuple-class", "other-fields", "module-attribute", "not-imported"])
def test_a_class_record_that_does_not_fit_loads_as_a_plain_tuple(saved, node):
    c, manifest = saved
    manifest["skeleton"]["__dict__"].append(["odd", node])
    rewrite(c, manifest)
    out = ckptbench.load(c)
    assert type(out["odd"]) is tuple and len(out["odd"]) == len(node["__tuple__"])


def test_one_bad_rank_part_is_named_with_its_rank(saved):
    c, manifest = saved
    part = {k: manifest.pop(k) for k in ("total_bytes", "shards", "tensors", "skeleton")}
    broken = copy.deepcopy(part)
    tensor(broken, "b")["offset"] = 10**9
    rewrite(c, {**manifest, "world_size": 2, "ranks": [dict(part, rank=0), dict(broken, rank=1)]})
    assert torch.equal(ckptbench.load(c, rank=0)["w"], ckptbench.load(c, rank=0)["tied"])
    with pytest.raises(CorruptCheckpointError, match=rf"^{c / 'manifest.json'} \(rank 1\): tensor 'b' \(bytes "):
        ckptbench.load(c, rank=1)


def test_every_valid_kind_of_entry_still_loads(saved):
    c, _ = saved
    out = ckptbench.load(c)
    expected = state_dict()
    assert out.keys() == expected.keys() and out["tied"] is out["w"] and out["empty"].shape == (0, 3)
    assert out["values"][:2] == [1, (2, 3.5)] and out["values"][2] != out["values"][2]
    assert type(out["module"]) is collections.OrderedDict and out["module"]._metadata == {"": {"version": 2}}
    assert type(out["module"]["p"]) is torch.nn.Parameter and out["module"]["g"].requires_grad
    assert type(out["pair"]) is Pair and type(out["pair"].second) is torch.Size


# -- whatever the damage: refused or loaded, never another exception ------------------------------

HOSTILE = [None, True, -1, 0, 1, 2**31, 2**64, 1.5, float("inf"), "", "x", "../x", [], [0], {}, {"__tensor__": 0}]


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    """Every place in a JSON tree: (key or index, ...) to each value."""
    found = [at]
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        found += _paths(child, (*at, key))
    return found


def _damage(manifest: dict, rng: random.Random) -> str:
    """Change one value of ``manifest`` in place (replace, delete, or nudge a number); says what."""
    at = rng.choice([p for p in _paths(manifest) if p])
    parent = manifest
    for key in at[:-1]:
        parent = parent[key]
    old = parent[at[-1]]
    roll = rng.random()
    if roll < 0.2 and isinstance(parent, dict):
        del parent[at[-1]]
        return f"deleted {at}"
    if roll < 0.5 and isinstance(old, int) and not isinstance(old, bool):
        parent[at[-1]] = old + rng.choice([-4097, -1, 1, 64, 4096, 2**40])
    else:
        parent[at[-1]] = rng.choice(HOSTILE)
    return f"{at}: {old!r} -> {parent[at[-1]]!r}"


def test_one_random_damage_at_a_time_is_refused_or_loaded_never_a_traceback(saved):
    c, original = saved
    rng = random.Random(8)
    outcomes = {"refused": 0, "loaded": 0}
    for _ in range(400):
        manifest = copy.deepcopy(original)
        what = _damage(manifest, rng)
        rewrite(c, manifest)
        try:
            ckptbench.load(c)
        except CkptbenchError as exc:
            assert str(c) in str(exc), f"{what}: {exc}"
            outcomes["refused"] += 1
        except Exception as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{what}: {type(exc).__name__}: {exc}")
        else:
            outcomes["loaded"] += 1
    assert outcomes["refused"] > 200, outcomes  # the damage did reach the fields that matter
