"""Loads that meet the caller's objects: ``into=`` (checked before anything changes, plain values
restored, parameters), lazy conjugate/negative views, tensor subclasses, a manifest with a misaligned
offset, a checkpoint replaced by another save while it is read, and a new checkpoint directory made
durable in its parent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer, api
from ckptbench.checkpoint.manifest import CorruptCheckpointError
from ckptbench.errors import UsageError
from ckptbench.storage.store import LocalStore


def saved(tmp_path: Path, sd: dict, name: str = "c", **kw) -> Path:
    ckptbench.save(sd, tmp_path / name, **kw)
    return tmp_path / name


# -- into= --------------------------------------------------------------------------------------


def test_an_into_that_does_not_fit_is_left_untouched(tmp_path: Path):
    path = saved(tmp_path, {"a": torch.ones(4), "b": torch.ones(3), "step": 7})
    live = {"a": torch.zeros(4), "b": torch.zeros(5), "step": 0}
    with pytest.raises(UsageError, match=r"b: checkpoint tensor \(3,\)"):
        ckptbench.load(path, into=live)
    assert torch.equal(live["a"], torch.zeros(4)) and live["step"] == 0  # "a" comes first: not copied either


@pytest.mark.parametrize("dtype", [torch.uint3, torch.int4, torch.quint4x2], ids=str)
def test_into_takes_dtypes_torch_has_no_copy_kernel_for(tmp_path: Path, dtype: torch.dtype):
    bits = torch.randint(0, 256, (6, 5), dtype=torch.uint8)
    path = saved(tmp_path, {"q": bits.view(dtype)})
    live = {"q": torch.zeros(6, 5, dtype=torch.uint8).view(dtype)}
    assert ckptbench.load(path, into=live) is live
    assert torch.equal(live["q"].view(torch.uint8), bits)


def test_plain_values_that_differ_are_restored_into_dicts_and_lists(tmp_path: Path):
    sd = {"w": torch.randn(8), "step": 100, "name": "new", "groups": [{"lr": 0.1, "betas": [0.9, 0.99]}],
          "nan": float("nan")}
    path = saved(tmp_path, sd)
    w = torch.zeros(8)
    groups = [{"lr": 3.0, "betas": [0.0, 0.0]}]
    live = {"w": w, "step": 0, "name": "old", "groups": groups, "nan": float("nan")}
    assert ckptbench.load(path, into=live) is live
    assert live["w"] is w and torch.equal(w, sd["w"])
    assert (live["step"], live["name"]) == (100, "new")
    assert live["groups"] is groups and groups == [{"lr": 0.1, "betas": [0.9, 0.99]}]


def test_a_differing_value_inside_a_tuple_is_refused_but_an_equal_one_is_fine(tmp_path: Path):
    path = saved(tmp_path, {"t": (torch.ones(2), 5)})
    live = {"t": (torch.zeros(2), 5)}
    ckptbench.load(path, into=live)
    assert torch.equal(live["t"][0], torch.ones(2))
    stale = {"t": (torch.zeros(2), 4)}
    with pytest.raises(UsageError, match=r"t\[1\].*inside a tuple"):
        ckptbench.load(path, into=stale)
    assert torch.equal(stale["t"][0], torch.zeros(2))


@pytest.mark.parametrize(("stored", "live", "words"), [
    (3, torch.zeros(1), "holds a int, into= holds Tensor"),
    ({"x": 1}, 1, "holds a dict, into= holds int"),
    (torch.ones(1), 1.0, "holds a tensor, into= holds float"),
])
def test_a_leaf_of_another_kind_is_refused(tmp_path: Path, stored, live, words):
    path = saved(tmp_path, {"v": stored})
    with pytest.raises(UsageError, match=words):
        ckptbench.load(path, into={"v": live})


def test_keys_that_differ_are_named(tmp_path: Path):
    path = saved(tmp_path, {"a": torch.ones(1), "b": torch.ones(1)})
    with pytest.raises(UsageError, match=r"missing from into=: 'b'; not in the checkpoint: 'c'"):
        ckptbench.load(path, into={"a": torch.zeros(1), "c": torch.zeros(1)})


def test_into_a_models_parameters(tmp_path: Path):
    source, target = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    path = saved(tmp_path, dict(source.named_parameters()))
    params = dict(target.named_parameters())
    ckptbench.load(path, into=params)
    assert all(torch.equal(params[k], p) for k, p in source.named_parameters())
    assert all(p.requires_grad and p.grad is None for p in target.parameters())


# -- what the tensors are -----------------------------------------------------------------------


def test_lazy_conjugate_and_negative_views_are_not_taken_for_tied_weights(tmp_path: Path):
    c = torch.randn(6, dtype=torch.complex64)
    x = torch.randn(6)
    sd = {"c": c, "conj": c.conj(), "x": x, "neg": x._neg_view(), "tied": c}
    out = ckptbench.load(saved(tmp_path, sd))
    assert torch.equal(out["conj"], c.conj().resolve_conj()) and not torch.equal(out["conj"], c)
    assert torch.equal(out["neg"], -x)
    assert out["tied"] is out["c"] and out["conj"] is not out["c"]


class _MyParameter(torch.nn.Parameter):
    pass


class _MyTensor(torch.Tensor):
    pass


def test_tensor_subclasses_from_outside_torch_are_saved_as_tensors(tmp_path: Path):
    p = _MyParameter(torch.randn(5))
    t = torch.randn(3).as_subclass(_MyTensor)
    out = ckptbench.load(saved(tmp_path, {"p": p, "t": t}))
    assert torch.equal(out["p"], p.detach()) and torch.equal(out["t"], t.as_subclass(torch.Tensor))


# -- damaged or replaced ------------------------------------------------------------------------


@pytest.mark.parametrize("verify", [True, False])
def test_a_misaligned_offset_in_the_manifest_is_damage_not_a_traceback(tmp_path: Path, verify: bool):
    path = saved(tmp_path, {"a": torch.randn(3, dtype=torch.float64), "b": torch.randn(9, dtype=torch.float64)},
                 checksum=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["tensors"][1]["offset"] += 4
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match="tensor 'b' starts at byte .* multiple of its element size"):
        ckptbench.load(path, verify=verify)


def test_a_checkpoint_replaced_while_it_is_read_loads_the_new_one(tmp_path: Path, monkeypatch):
    path = saved(tmp_path, {"v": torch.zeros(1000)})
    real = api.Checkpointer._timed_load
    calls = []

    def replaced_first(self, store, manifest, part, *args):
        calls.append(manifest)
        if len(calls) == 1:  # another process commits a new save (and removes these shards) right now
            ckptbench.save({"v": torch.ones(1000)}, path, overwrite=True)
        return real(self, store, manifest, part, *args)

    monkeypatch.setattr(api.Checkpointer, "_timed_load", replaced_first)
    assert torch.equal(ckptbench.load(path)["v"], torch.ones(1000))
    assert len(calls) == 2 and calls[0] != calls[1]


def test_a_checkpoint_replaced_on_every_try_is_refused_clearly(tmp_path: Path, monkeypatch):
    path = saved(tmp_path, {"v": torch.zeros(10)})
    real = api.Checkpointer._timed_load
    step = iter(range(1, 100))

    def always_replaced(self, *args):
        ckptbench.save({"v": torch.full((10,), float(next(step)))}, path, overwrite=True)
        return real(self, *args)

    monkeypatch.setattr(api.Checkpointer, "_timed_load", always_replaced)
    with pytest.raises(CorruptCheckpointError, match=f"replaced by a new save {api.LOAD_ATTEMPTS} times"):
        ckptbench.load(path)


def test_a_shard_removed_under_an_unchanged_manifest_is_damage(tmp_path: Path, monkeypatch):
    path = saved(tmp_path, {"v": torch.zeros(1000)})
    real = LocalStore.read_files

    def removed_first(self, files, **kw):
        for name, _ in files:
            (self.path / name).unlink()
        return real(self, files, **kw)

    monkeypatch.setattr(LocalStore, "read_files", removed_first)
    with Checkpointer() as ckpt, pytest.raises(CorruptCheckpointError, match="disappeared while it was read"):
        ckpt.load(path)


# -- durability of the directory itself ----------------------------------------------------------


def test_a_new_checkpoint_directory_is_made_durable_in_its_parents(tmp_path: Path, monkeypatch):
    from ckptbench.storage import store

    synced: list[Path] = []
    real = store.fsync_directory
    monkeypatch.setattr(store, "fsync_directory", lambda path: (synced.append(Path(path)), real(path)))
    ckptbench.save({"a": torch.ones(3)}, tmp_path / "runs" / "step-1")
    assert synced[:2] == [tmp_path, tmp_path / "runs"]  # the new entries, before anything is written
    synced.clear()
    ckptbench.save({"a": torch.ones(3)}, tmp_path / "runs" / "step-1", overwrite=True)
    assert tmp_path not in synced and tmp_path / "runs" not in synced  # nothing new in them


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(1).expand(3),
    lambda: torch.zeros(3, device="meta"),
    lambda: torch.inference_mode()(torch.zeros)(3),
])
def test_an_into_tensor_that_cannot_take_a_copy_is_refused_before_anything_changes(tmp_path: Path, make):
    path = saved(tmp_path, {"a": torch.ones(3), "b": torch.ones(3), "step": 5})
    live = {"a": torch.zeros(3), "b": make(), "step": 0}
    with pytest.raises(UsageError, match="b: the into= tensor cannot be loaded into"):
        ckptbench.load(path, into=live)
    assert torch.equal(live["a"], torch.zeros(3)) and live["step"] == 0


def test_a_wrapper_subclass_without_data_of_its_own_is_refused_by_name(tmp_path: Path):
    class Wrapped(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

        def __init__(self, inner):
            self.inner = inner

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda x: x.inner if isinstance(x, Wrapped) else x  # noqa: E731
            return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})

    with pytest.raises(UsageError, match="w: this Wrapped holds no data of its own"):
        ckptbench.save({"w": Wrapped(torch.ones(4))}, tmp_path / "c")
    assert not (tmp_path / "c" / "manifest.json").exists()
