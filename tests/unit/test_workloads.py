"""The checkpoint workload: planning (pure), building, verification; the runner's cache and RSS helpers."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from ckptbench.bench.records_ckpt import CheckpointBenchReport, Goal, MemoryResult, Timings, WriterResult
from ckptbench.bench.shootout import CacheDropper, CheckpointBenchSpec, PeakRss
from ckptbench.bench.workloads import build_state_dict, compose, plan_workload
from ckptbench.bench.writers import WRITERS, fault_in, verify_state_dict
from ckptbench.errors import StorageIOError, UsageError
from ckptbench.model.presets import load_model, preset_names


@pytest.mark.parametrize("name", preset_names("models"))
@pytest.mark.parametrize("scale", [0.1, 0.05, 0.01])
def test_scale_lands_near_the_target_and_keeps_the_layout(name, scale):
    full = load_model(name)
    w = plan_workload(full, scale=scale)
    assert w.total_bytes == pytest.approx(scale * w.full_bytes, rel=0.05)
    assert w.scale == pytest.approx(scale, rel=0.05)
    s = w.shape
    assert s.heads % s.kv_heads == 0 and s.heads // s.kv_heads == full.heads // full.kv_heads
    assert s.head_dim == full.head_dim  # realistic scales keep the head size
    assert s.layers >= 1 and s.hidden <= full.hidden and s.vocab <= full.vocab
    names = [t.name for t in w.tensors]
    assert len(names) == len(set(names))
    # every block holds the same kinds of tensors
    per_block = {n.split(".", 3)[3] for n in names if n.startswith("model.layers.0.")}
    last = {n.split(".", 3)[3] for n in names if n.startswith(f"model.layers.{s.layers - 1}.")}
    assert per_block == last and len(per_block) == 10


def test_composition_mixes_dtypes_and_many_small_tensors():
    w = plan_workload(load_model("llama3-8b"), scale=0.1)
    by_dtype = w.bytes_by_dtype()
    assert by_dtype["bf16"] > 0 and by_dtype["fp32"] > 0
    assert 0.05 < by_dtype["fp32"] / w.total_bytes < 0.3
    doc = w.to_dict()
    assert doc["small_tensors"] > len(w.tensors) / 3
    assert doc["smallest_tensor_bytes"] == 4  # the 0-dim Adam step
    names = {t.name for t in w.tensors}
    assert "model.embed_tokens.weight" in names and "lm_head.weight" in names
    assert "optimizer.state.model.layers.0.self_attn.k_proj.weight.exp_avg_sq" in names
    assert "optimizer.state.model.norm.weight.step" in names
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" in names
    assert "optimizer.state.model.layers.0.mlp.up_proj.weight.exp_avg" not in names  # a subset only
    assert doc["shape"]["params"] == w.shape.params_from_shape()


def test_scale_one_is_the_full_model():
    full = load_model("llama3-8b")
    w = plan_workload(full, scale=1.0)
    assert w.shape == full and w.total_bytes == w.full_bytes == sum(t.nbytes for t in compose(full))


def test_size_targets_and_the_smallest_workload():
    shape = load_model("llama3-8b")
    w = plan_workload(shape, size_bytes=32 * 2**20)
    assert w.total_bytes == pytest.approx(32 * 2**20, rel=0.1)
    with pytest.raises(UsageError, match="below the smallest"):
        plan_workload(shape, size_bytes=64 * 1024)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"scale": 0.0}, "(0, 1]"), ({"scale": 1.5}, "(0, 1]"), ({}, "not both"),
    ({"scale": 0.1, "size_bytes": 2**20}, "not both"), ({"size_bytes": -1}, "positive"),
    ({"size_bytes": 2**50}, "more than the full"),
])
def test_plan_rejects_bad_input(kwargs, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        plan_workload(load_model("llama3-8b"), **kwargs)


@pytest.fixture(scope="module")
def small():
    w = plan_workload(load_model("llama3-8b"), size_bytes=2 * 2**20)
    return w, build_state_dict(w)


def test_build_fills_every_tensor_finite_and_reproducibly(small):
    import torch

    w, sd = small
    assert list(sd) == [t.name for t in w.tensors]
    for spec in w.tensors:
        t = sd[spec.name]
        assert tuple(t.shape) == spec.shape
        assert t.dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[spec.dtype]
        assert torch.isfinite(t).all()
    assert sum(t.numel() * t.element_size() for t in sd.values()) == w.total_bytes
    again = build_state_dict(w)
    verify_state_dict(sd, again, "rebuild")  # same seed, same bytes
    other = build_state_dict(w, seed=1)
    assert not torch.equal(other["model.embed_tokens.weight"], sd["model.embed_tokens.weight"])
    fault_in(sd)


def test_verify_names_what_differs(small):
    import torch

    w, sd = small
    copy = {k: v.clone() for k, v in sd.items()}
    key = "model.layers.0.mlp.down_proj.weight"
    copy[key].reshape(-1).view(torch.uint8)[7] ^= 1
    with pytest.raises(StorageIOError, match="different bytes"):
        verify_state_dict(sd, copy, "w")
    copy[key] = sd[key].float()
    with pytest.raises(StorageIOError, match="loaded as torch.float32"):
        verify_state_dict(sd, copy, "w")
    copy[key] = torch.empty_like(sd[key], device="meta")
    with pytest.raises(StorageIOError, match="loaded to meta, saved from cpu"):
        verify_state_dict(sd, copy, "w")
    del copy[key]
    with pytest.raises(StorageIOError, match="keys differ"):
        verify_state_dict(sd, copy, "w")


def test_cache_dropper_falls_back_to_fadvise(tmp_path: Path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 8192)
    dropper = CacheDropper(drop_caches=str(tmp_path / "no" / "drop_caches"))
    assert dropper.method == "fadvise" and "drop_caches" in dropper.reason
    dropper.drop(tmp_path / "d")
    assert dropper.to_dict()["method"] == "fadvise"


@pytest.mark.parametrize("exact", [True, False])
def test_peak_rss_sees_an_allocation(exact):
    import mmap
    import time

    import numpy as np

    rss = PeakRss()
    if exact and not rss.exact:
        pytest.skip("VmHWM cannot be reset here")
    rss.exact = exact
    with rss.measure() as peak:
        # Fresh anonymous memory, touched page by page: a malloc'd block could reuse pages an earlier
        # test freed but the allocator kept resident, and add no RSS at all.
        block = mmap.mmap(-1, 64 * 2**20)
        np.frombuffer(block, dtype=np.uint8)[::4096] = 1
        time.sleep(0.05)
        block.close()
    assert peak["extra_bytes"] >= 48 * 2**20


def test_spec_validation():
    assert CheckpointBenchSpec(scale=0.1).to_dict()["workload"] == "checkpoint"
    for kwargs, needle in [({"scale": 0.1, "writers": ("nope",)}, "unknown writer"),
                           ({"scale": 0.1, "writers": ("torch", "torch")}, "twice"),
                           ({"scale": 2.0}, "(0, 1]"), ({}, "not both"), ({"scale": 0.1, "repeat": 0}, "repeat")]:
        with pytest.raises(UsageError, match=re.escape(needle)):
            CheckpointBenchSpec(**kwargs)


def test_cli_writer_names_match_the_adapters():
    from ckptbench.cli.bench import WRITER_NAMES

    assert tuple(WRITER_NAMES) == WRITERS


def _result(writer: str, save_s: float, load_s: float) -> WriterResult:
    return WriterResult(writer, "", "", Timings("save", 10**9, (save_s,)), Timings("load", 10**9, (load_s,)),
                        True, 1, 10**9, (0,))


def test_goals_are_ratios_of_medians():
    spec = CheckpointBenchSpec(scale=0.1, writers=("ckptbench", "torch"), repeat=3)
    report = CheckpointBenchReport(
        target="/x", spec=spec, workload=None, memcpy_bps=1e10,
        results=(_result("ckptbench", 1.0, 0.5), _result("torch", 2.0, 2.0)), async_results=(),
        memory=MemoryResult(10, "m", 10**9, 0, int(1.05e9), 0, (5, 5 + 10**6)),
        cache_drop={"method": "fadvise", "reason": "EACCES"}, probe=None, rss_method="VmHWM", environment={},
    )
    goals = {g.name: g for g in report.goals()}
    assert goals["save_vs_torch"].value == pytest.approx(2.0) and goals["save_vs_torch"].met
    assert goals["load_vs_torch"].value == pytest.approx(4.0) and goals["load_vs_torch"].met
    assert goals["peak_extra_rss_vs_checkpoint"].met and goals["rss_growth_vs_checkpoint"].value == pytest.approx(1e-3)
    assert "save_vs_dcp" not in goals
    assert "cache-not-dropped" in {w.code for w in report.warnings()}
    assert not Goal("x", "", 0.5, 0.3, "<=").met and math.isclose(Goal("x", "", 0.3, 0.3, "<=").value, 0.3)
    assert goals["load_vs_torch"].ceiling is None and goals["load_vs_torch"].reachable  # no fio in this run


def test_a_goal_beyond_what_fio_itself_reaches_is_marked_out_of_reach():
    spec = CheckpointBenchSpec(scale=0.1, writers=("ckptbench", "torch", "fio"), repeat=3)
    # load: ckptbench 1.0 s, torch 1.2 s, fio 0.9 s -> 1.2x torch; fio itself is only 1.33x torch (goal 2x)
    report = CheckpointBenchReport(
        target="/x", spec=spec, workload=None, memcpy_bps=1e10,
        results=(_result("ckptbench", 1.0, 1.0), _result("torch", 4.0, 1.2), _result("fio", 0.5, 0.9)),
        async_results=(), memory=None, cache_drop={"method": "drop_caches", "reason": None}, probe=None,
        rss_method="VmHWM", environment={})
    goals = {g.name: g.to_dict() for g in report.goals()}
    load = goals["load_vs_torch"]
    assert not load["met"] and load["ceiling"] == pytest.approx(1.2 / 0.9) and load["reachable"] is False
    save = goals["save_vs_torch"]  # fio saves 8x torch: 1.5x is within reach, and met (4x)
    assert save["met"] and save["ceiling"] == pytest.approx(8.0) and save["reachable"] is True
    assert goals["load_vs_fio"]["ceiling"] is None and goals["load_vs_fio"]["reachable"] is True
