"""Values real training states hold: numpy arrays and RNG states, bytes, sets, paths, Enum members;
anything else only pickled, with ``allow_pickle=True`` at save and again at load."""

from __future__ import annotations

import enum
import json
import pathlib
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint.manifest import CorruptCheckpointError, NotACheckpointError
from ckptbench.errors import PickleNotAllowedError, UsageError


class Color(enum.Enum):
    RED = 1
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    TRAIN = "train"


class Perm(enum.Flag):
    R = 4
    W = 2


class Opaque:
    """Picklable, but no plain value."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.x == self.x

    def __hash__(self) -> int:
        return hash(self.x)


def roundtrip(tmp_path: Path, sd: dict, **load: object) -> dict:
    ckptbench.save(sd, tmp_path / "c", overwrite=True)
    return ckptbench.load(tmp_path / "c", **load)


ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f64_fortran": np.asfortranarray(np.random.default_rng(0).standard_normal((5, 3))),
    "i64_strided": np.arange(40, dtype=np.int64)[::3],
    "u16": np.arange(7, dtype=np.uint16),
    "bool": np.array([True, False, True]),
    "c128": np.array([1 + 2j, -3j]),
    "f16": np.array([0.5, -1.25], dtype=np.float16),
    "big_endian": np.arange(4, dtype=">i4"),
    "datetime": np.array(["2026-01-01T00:00", "1970-01-01"], dtype="datetime64[ns]"),
    "unicode": np.array(["a", "bcd"]),
    "bytes_S": np.array([b"xy", b"z"]),
    "empty": np.empty((0, 3), dtype=np.float32),
    "zero_d": np.array(3.5),
    "longdouble": np.array([1.0, 2.0], dtype=np.longdouble),
    "nan": np.array([np.nan, np.inf]),
}


def test_numpy_arrays_round_trip_with_dtype_shape_and_bits(tmp_path: Path):
    loaded = roundtrip(tmp_path, {"arrays": dict(ARRAYS)})["arrays"]
    for name, want in ARRAYS.items():
        got = loaded[name]
        assert isinstance(got, np.ndarray), name
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), name
    loaded["f32"][0, 0] = 7  # writable, as np.load's
    # stored as tensors' bytes: the manifest has no array data
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert len(json.dumps(manifest)) < 20_000
    assert {t["dtype"] for t in manifest["tensors"]} == {"uint8"}


def test_numpy_scalars_come_back_as_numpy_scalars(tmp_path: Path):
    sd = {"f": np.float64(0.1), "i": np.int32(-7), "b": np.bool_(True), "h": np.float16(2.5)}
    loaded = roundtrip(tmp_path, sd)
    for key, want in sd.items():
        assert type(loaded[key]) is type(want) and loaded[key] == want, key


def test_numpy_and_python_rng_states_round_trip_exactly(tmp_path: Path):
    np.random.seed(1234)
    np.random.standard_normal(3)  # a cached gaussian in the state
    random.seed(99)
    sd = {"np_rng": np.random.get_state(), "py_rng": random.getstate(),
          "np_generator": np.random.default_rng(5).bit_generator.state, "torch_rng": torch.get_rng_state()}
    expected = (np.random.standard_normal(5), [random.random() for _ in range(5)])
    loaded = roundtrip(tmp_path, sd)
    assert loaded["py_rng"] == sd["py_rng"]
    np.random.seed(0)
    random.seed(0)
    np.random.set_state(loaded["np_rng"])
    random.setstate(loaded["py_rng"])
    assert np.array_equal(np.random.standard_normal(5), expected[0])
    assert [random.random() for _ in range(5)] == expected[1]
    generator = np.random.default_rng()
    generator.bit_generator.state = loaded["np_generator"]
    assert generator.random() == np.random.default_rng(5).random()
    torch.set_rng_state(loaded["torch_rng"])


def test_bytes_sets_paths_and_enums_round_trip(tmp_path: Path):
    sd = {
        "blob": b"\x00\xffabc" * 1000, "empty": b"", "mutable": bytearray(b"xyz"),
        "tags": {"a", 1, (2, 3), b"k", frozenset({4})}, "frozen": frozenset({"x", None}), "no_tags": set(),
        "paths": [Path("/data/run1"), pathlib.PurePosixPath("rel/x"), pathlib.PureWindowsPath(r"C:\data\x")],
        "enums": [Color.RED, Color.GREEN, Level.HIGH, Mode.TRAIN, Perm.R | Perm.W],
        "in_tuple": (Color.RED, b"b", frozenset({1})),
        Color.RED: "enum key", b"raw": "bytes key", frozenset({1, 2}): "frozenset key",
        pathlib.PurePosixPath("/k"): "path key", Level.LOW: "intenum key",
    }
    loaded = roundtrip(tmp_path, sd)
    assert loaded == sd
    for key, value in sd.items():
        assert type(loaded[key]) is type(value), key
    assert [type(p) for p in loaded["paths"]] == [type(Path("/")), pathlib.PurePosixPath, pathlib.PureWindowsPath]
    assert all(a is b for a, b in zip(loaded["enums"][:4], sd["enums"][:4], strict=True))
    assert loaded["enums"][4] is Perm.R | Perm.W
    assert type(next(k for k in loaded if k == Level.LOW)) is Level  # not the int 1


def test_an_enum_whose_class_is_not_imported_loads_as_its_value(tmp_path: Path):
    Local = enum.Enum("Local", {"A": 5})  # noqa: N806
    Local.__module__ = "not_a_module_anyone_imported"
    Local.__qualname__ = "Local"
    assert roundtrip(tmp_path, {"e": Local.A})["e"] == 5


def test_values_of_other_kinds_are_refused_naming_the_key_and_the_opt_in(tmp_path: Path):
    for value in (Opaque(1), np.array([object()]), np.zeros(2, dtype=[("a", "i4"), ("b", "f4")]), {Opaque(1)}):
        with pytest.raises(UsageError, match=r"state\.extra.*allow_pickle=True"):
            ckptbench.save({"state": {"extra": value}}, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_pickled_entries_need_allow_pickle_at_save_and_again_at_load(tmp_path: Path):
    structured = np.zeros(2, dtype=[("a", "i4"), ("b", "f4")])
    sd = {"w": torch.ones(3), "state": {"extra": Opaque(7), "table": structured}, "list": [1, {Opaque(2)}]}
    ckptbench.save(sd, tmp_path / "c", allow_pickle=True)
    with pytest.raises(PickleNotAllowedError,
                       match=r"3 pickled entries \(state\.extra, state\.table, list\[1\]\).*allow_pickle=True"):
        ckptbench.load(tmp_path / "c")
    with pytest.raises(PickleNotAllowedError):
        ckptbench.load(tmp_path / "c", into={"w": torch.zeros(3), "state": {"extra": None, "table": None},
                                             "list": [1, None]})
    loaded = ckptbench.load(tmp_path / "c", allow_pickle=True)
    assert loaded["state"]["extra"] == Opaque(7)
    assert loaded["state"]["table"].dtype == structured.dtype
    assert loaded["list"][1] == {Opaque(2)}
    # pickles are ordinary uint8 tensors in the shards: checksummed like the rest
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert {t["key"] for t in manifest["tensors"]} >= {"state.extra", "state.table", "list[1]"}


def test_load_into_copies_numpy_arrays_in_place(tmp_path: Path):
    sd = {"a": np.arange(6.0), "b": np.arange(3), "t": torch.ones(2), "s": {1, 2}}
    ckptbench.save(sd, tmp_path / "c")
    target = np.zeros(6)
    into = {"a": target, "b": np.zeros(5, dtype=np.int64), "t": torch.zeros(2), "s": set()}
    Checkpointer().load(tmp_path / "c", into=into)
    assert into["a"] is target and np.array_equal(target, sd["a"])
    assert np.array_equal(into["b"], sd["b"])  # another shape: replaced
    assert into["s"] == {1, 2}


def test_an_async_save_keeps_the_numpy_values_it_was_given(tmp_path: Path):
    array = np.arange(2**20, dtype=np.float32)
    with Checkpointer() as ckpt:
        handle = ckpt.save({"a": array}, tmp_path / "c", async_=True)
        array[:] = -1
        handle.result()
        assert np.array_equal(ckpt.load(tmp_path / "c")["a"], np.arange(2**20, dtype=np.float32))


def _edit_numpy_node(directory: Path, **changes: object) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    node = manifest["skeleton"]["__dict__"][0][1]
    node["__numpy__"].update(changes)
    path.write_text(json.dumps(manifest))


def test_a_manifest_cannot_make_numpy_read_pointers_or_past_a_tensor(tmp_path: Path):
    ckptbench.save({"a": np.arange(4, dtype=np.int64)}, tmp_path / "c")
    _edit_numpy_node(tmp_path / "c", dtype="|O")
    with pytest.raises(NotACheckpointError, match="not one a save writes"):
        ckptbench.load(tmp_path / "c")
    ckptbench.save({"a": np.arange(4, dtype=np.int64)}, tmp_path / "c", overwrite=True)
    _edit_numpy_node(tmp_path / "c", shape=[8])
    with pytest.raises(CorruptCheckpointError, match="needs 64"):
        ckptbench.load(tmp_path / "c")
