"""PlanCache: a Checkpointer reuses its last plan only when planning would give the same one."""

from __future__ import annotations

import collections
import gc
import weakref
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

from ckptbench import knobs
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint.plan import PlanCache, plan_save
from ckptbench.errors import UsageError

SHARD = 4096


class Pair(NamedTuple):
    first: torch.Tensor
    second: int


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(8, 6, generator=g)
    return {"w": torch.randn(40, 30, generator=g), "b": torch.zeros(30), "tied": base, "t": base.t(),
            "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3), "half": torch.randn(64, generator=g).half(),
            "grad": torch.randn(5, generator=g).requires_grad_(), "c": torch.randn(4, dtype=torch.complex64),
            **{f"small{i}": torch.full((1 + i,), float(i)) for i in range(40)}}


def _state(ts: dict[str, torch.Tensor], **changes) -> dict:
    """A nested state_dict over ``ts`` (built anew each call, as state_dict() does), ``changes`` applied."""
    model = collections.OrderedDict((k, v) for k, v in ts.items() if k.startswith("small"))
    model._metadata = {"": {"version": 1}, "layer": {"version": 2}}
    sd = {"model": model,
          "opt": {"state": {0: {"step": ts["scalar"], "exp_avg": ts["w"]}},
                  "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0, 1], "name": None}]},
          "w": ts["w"], "b": ts["b"], "tied": ts["tied"], "t": ts["t"], "empty": ts["empty"], "half": ts["half"],
          "grad": ts["grad"], "c": ts["c"], "pair": Pair(ts["b"], 3), "step": 100, "loss": 0.0, (1, 2.0): "key",
          "mixed": [0, ts["scalar"], None]}
    for path, value in changes.items():
        *parents, last = path.split("/")
        node = sd
        for part in parents:
            node = node[int(part)] if isinstance(node, list) or part not in node else node[part]
        node[last] = value
    return sd


def _assert_same(got, expected) -> None:
    (plan, sources), (fresh, fresh_sources) = got, expected
    assert plan.shards == fresh.shards and plan.arena_bytes == fresh.arena_bytes
    assert plan.manifest_skeleton == fresh.manifest_skeleton
    assert np.array_equal(plan.placements, fresh.placements) and np.array_equal(plan.padding, fresh.padding)
    assert plan.entries == fresh.entries
    assert len(sources) == len(fresh_sources) and all(a is b for a, b in zip(sources, fresh_sources, strict=True))
    assert sources.addresses == fresh_sources.addresses and sources.routes == fresh_sources.routes


def test_the_same_layout_reuses_the_plan_renamed_and_equal_to_a_fresh_one():
    ts = _tensors()
    cache = PlanCache()
    first = cache.plan(_state(ts), SHARD, "shard-a")
    assert not cache.reused
    _assert_same(first, plan_save(_state(ts), SHARD, "shard-a"))
    for t in ts.values():  # new values at the same addresses: the same plan
        if t.numel():
            t.data.add_(1) if not t.requires_grad else t.data.mul_(2)
    again = cache.plan(_state(ts), SHARD, "shard-b")
    assert cache.reused
    assert [s.name for s in again[0].shards] == [s.name.replace("shard-a", "shard-b") for s in first[0].shards]
    _assert_same(again, plan_save(_state(ts), SHARD, "shard-b"))


@pytest.mark.parametrize("change", [
    pytest.param(lambda ts: {"w": ts["w"].clone()}, id="another-address"),
    pytest.param(lambda ts: {"w": ts["w"].view(30, 40)}, id="shape"),
    pytest.param(lambda ts: {"w": ts["w"].as_strided((40, 30), (1, 40))}, id="strides"),
    pytest.param(lambda ts: {"w": ts["w"].view(torch.int32)}, id="dtype"),
    pytest.param(lambda ts: {"c": ts["c"].conj()}, id="conjugate-bit"),
    pytest.param(lambda ts: {"c": ts["c"]._neg_view()}, id="negative-bit"),
    pytest.param(lambda ts: {"t": ts["tied"].clone().t()}, id="untied"),
    pytest.param(lambda ts: {"opt/param_groups/0/betas": [0.9, 0.95]}, id="tuple-to-list"),
    pytest.param(lambda ts: {"pair": (ts["b"], 3)}, id="namedtuple-to-tuple"),
    pytest.param(lambda ts: {"extra": 1}, id="key-added"),
    pytest.param(lambda ts: {"mixed": [ts["scalar"], 0, None]}, id="tensor-and-value-swapped"),
    pytest.param(lambda ts: {"mixed": [0, None, ts["scalar"]]}, id="tensor-and-none-swapped"),
    pytest.param(lambda ts: {"mixed": [0, [ts["scalar"]], None]}, id="tensor-nested-deeper"),
    pytest.param(lambda ts: {"opt/state/0/exp_avg_sq": ts["b"]}, id="tensor-added"),
    pytest.param(lambda ts: {"model": dict(_state(ts)["model"])}, id="ordereddict-to-dict"),
])
def test_any_change_planning_reads_plans_afresh(change):
    ts = _tensors()
    cache = PlanCache()
    cache.plan(_state(ts), SHARD, "s")
    changed = _state(ts, **change(ts))
    got = cache.plan(changed, SHARD, "s")
    assert not cache.reused
    _assert_same(got, plan_save(changed, SHARD, "s"))
    cache.plan(changed, SHARD, "s")  # and that layout is the one kept for next time
    assert cache.reused


@pytest.mark.parametrize("change", [
    pytest.param(lambda ts: {"step": 101}, id="int-value"),
    pytest.param(lambda ts: {"step": 100.0}, id="int-to-float"),
    pytest.param(lambda ts: {"loss": -0.0}, id="negative-zero"),
    pytest.param(lambda ts: {"opt/param_groups/0/lr": 2e-3}, id="nested-value"),
    pytest.param(lambda ts: {"opt/param_groups/0/name": "decay"}, id="none-to-str"),
    pytest.param(lambda ts: {"mixed": [7.5, ts["scalar"], "x"]}, id="values-beside-a-tensor"),
    pytest.param(lambda ts: {"b": torch.nn.Parameter(ts["b"])}, id="as-parameter"),
    pytest.param(lambda ts: {"b": torch.nn.Parameter(ts["b"], requires_grad=False)}, id="frozen-parameter"),
    pytest.param(lambda ts: {"b": ts["b"].detach().requires_grad_()}, id="requires-grad"),
])
def test_new_plain_values_keep_the_layout_with_a_new_skeleton(change):
    """A training loop's step, learning rate...: the layout is reused, the values (and the tensors'
    types and requires_grad, in the skeleton too) are this save's."""
    ts = _tensors()
    cache = PlanCache()
    cache.plan(_state(ts), SHARD, "s")
    changed = _state(ts, **change(ts))
    got = cache.plan(changed, SHARD, "s")
    assert cache.reused
    _assert_same(got, plan_save(changed, SHARD, "s"))


def test_a_renamed_key_a_new_shard_size_or_the_knob_off_plans_afresh(monkeypatch):
    ts = _tensors()
    cache = PlanCache()
    cache.plan(_state(ts), SHARD, "s")
    renamed = _state(ts)
    renamed["bias"] = renamed.pop("b")
    cache.plan(renamed, SHARD, "s")
    assert not cache.reused
    cache.plan(renamed, SHARD * 2, "s")
    assert not cache.reused
    monkeypatch.setattr(knobs, "PLAN_REUSE", 0)
    cache.plan(renamed, SHARD * 2, "s")
    assert not cache.reused


def test_new_module_metadata_is_the_saves_own_and_a_failed_reading_is_left_to_planning():
    ts = _tensors()
    cache = PlanCache()
    sd = _state(ts)
    cache.plan(sd, SHARD, "s")
    sd["model"]._metadata = {"": {"version": 1}, "other": {"version": 7}}
    got = cache.plan(sd, SHARD, "s")
    assert cache.reused
    _assert_same(got, plan_save(sd, SHARD, "s"))
    sparse = _state(ts, w=ts["w"].to_sparse())
    with pytest.raises(UsageError, match="w: torch.sparse_coo tensors are not supported"):
        cache.plan(sparse, SHARD, "s")


def test_the_cache_keeps_no_tensor_alive():
    cache = PlanCache()
    ts = _tensors()
    cache.plan(_state(ts), SHARD, "s")
    watch = weakref.ref(ts["w"])
    del ts
    gc.collect()
    assert watch() is None


def test_a_training_loop_saves_each_step_values_through_the_reused_plan(tmp_path: Path):
    ts = _tensors()
    with Checkpointer(shard_size=SHARD) as ckpt:
        for step in range(3):
            for t in ts.values():
                if t.numel() and not t.is_complex():
                    t.data.fill_(step)
            handle = ckpt.save(_state(ts, step=step), tmp_path / f"c{step}", async_=step == 1)
            result = handle.result() if step == 1 else handle
            assert ckpt._plans.reused == result.plan_reused == (step > 0)
        for t in ts.values():
            if t.numel() and not t.is_complex():
                t.data.fill_(3)
        ckpt.save(_state(ts, step=3), tmp_path / "c0", overwrite=True)  # over a checkpoint of this layout
        for step, name in ((3, "c0"), (1, "c1"), (2, "c2")):
            out = ckpt.load(tmp_path / name)
            assert out["step"] == step and torch.equal(out["w"], torch.full((40, 30), float(step)))
            assert torch.equal(out["t"], out["tied"].t()) and type(out["pair"]) is Pair
            assert out["model"]._metadata == {"": {"version": 1}, "layer": {"version": 2}}


def _random_state(rng, pool: list[torch.Tensor], depth: int = 0):
    """A random nested state_dict over ``pool``'s tensors (ties, views, plain values of every kind)."""
    kinds = ["tensor", "view", "value", "dict", "list", "tuple", "pair", "ordered"] if depth < 3 else ["tensor", "value"]
    kind = kinds[rng.randrange(len(kinds))]
    if kind in ("tensor", "value") and depth and rng.random() < 0.3:  # lists mixing values and tensors
        return [rng.choice([0, None, "v"]), pool[rng.randrange(len(pool))]]
    if kind == "tensor":
        return pool[rng.randrange(len(pool))]
    if kind == "view":
        t = pool[rng.randrange(len(pool))]
        return t.t() if t.dim() == 2 else t[1:] if t.numel() > 1 else t
    if kind == "value":
        return rng.choice([0, 1, -0.0, 2.5, float("inf"), True, None, "s", (1, 2.0), [3, "x"]])
    children = [_random_state(rng, pool, depth + 1) for _ in range(rng.randrange(4))]
    if kind == "list":
        return children
    if kind == "tuple":
        return tuple(children)
    if kind == "pair":
        return Pair(pool[rng.randrange(len(pool))], rng.randrange(3))
    keys = rng.sample(["a", "b", "c", "d", 1, 2.0, (1, "k"), None, False], len(children))
    node = (collections.OrderedDict if kind == "ordered" else dict)(zip(keys, children, strict=True))
    if kind == "ordered":
        node._metadata = {"": {"version": rng.randrange(3)}}
    return node


def _mutate(rng, state: dict, pool: list[torch.Tensor]) -> dict:
    """``state`` rebuilt with one random change somewhere (or none)."""
    def walk(node):
        if isinstance(node, dict):
            out = type(node)((k, walk(v)) for k, v in node.items())
            if hasattr(node, "_metadata"):
                out._metadata = dict(node._metadata)
            return out
        if isinstance(node, Pair):
            return Pair(walk(node.first), node.second)
        if isinstance(node, (list, tuple)):
            items = [walk(v) for v in node]
            if len(items) > 1 and rng.random() < 0.2:  # neighbours swapped: [0, t] -> [t, 0]
                k = rng.randrange(len(items) - 1)
                items[k], items[k + 1] = items[k + 1], items[k]
            return items if isinstance(node, list) else tuple(items)
        if isinstance(node, torch.Tensor) and rng.random() < 0.3:  # same address and shape, other bits
            if node.dim() == 2 and node.shape[0] == node.shape[1]:
                return node.t()
            if node.is_complex():
                return node.conj()
        if rng.random() < 0.1:  # pool[-1] is square: its transpose differs in strides only
            return rng.choice([pool[rng.randrange(len(pool))], 7, "changed", None, pool[0].clone(), [1], pool[-1].t()])
        return node
    return walk(state)


@pytest.mark.parametrize("seed", range(60))
def test_random_state_dicts_and_changes_plan_as_planning_afresh_does(seed):
    import random

    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randn(int(n), generator=g) for n in torch.randint(1, 50, (4,), generator=g)]
    pool += [torch.randn(3, 5, generator=g), torch.zeros(0), torch.tensor(1.5), torch.randn(4, dtype=torch.complex64).conj(),
             torch.randn(4, 4, generator=g)]
    state = {"root": _random_state(rng, pool), "t": pool[0]}
    cache = PlanCache()
    _assert_same(cache.plan(state, 256, "s"), plan_save(state, 256, "s"))
    for _ in range(4):
        state = _mutate(rng, state, pool)
        _assert_same(cache.plan(state, 256, "s"), plan_save(state, 256, "s"))
