"""Splitting a checkpoint workload across the ranks of a dp x tp x pp job (pure planning)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from ckptbench.bench.sharding import (
    RankCoordinates,
    check_world,
    pipeline_stages,
    rank_coordinates,
    rank_of,
    shard_plan,
    shard_workload,
    world_bytes,
)
from ckptbench.bench.workloads import CheckpointWorkload, TensorSpec, plan_workload
from ckptbench.errors import UsageError
from ckptbench.model.presets import load_model
from ckptbench.model.sizing import SHARDING, Parallelism


@pytest.fixture(scope="module")
def workload() -> CheckpointWorkload:
    # 8 blocks, hidden 512 (kv rows 128, ffn 1792, vocab 3776), about 67 MiB
    return plan_workload(load_model("llama3-8b"), size_bytes=64 * 2**20)


LAYOUTS = [
    *(Parallelism(dp=4, sharding=s) for s in SHARDING),
    Parallelism(tp=2),
    Parallelism(pp=2),
    Parallelism(pp=3),  # 8 blocks do not split evenly
    Parallelism(dp=2, tp=2, pp=2, sharding="fsdp"),
    Parallelism(tp=3),  # 3 divides none of 512, 128, 1792, 3776
    Parallelism(dp=3, tp=3, pp=2, sharding="zero1"),
    Parallelism(dp=3, tp=2, sharding="zero3"),
]


def _ids(p: Parallelism) -> str:
    return f"dp{p.dp}-tp{p.tp}-pp{p.pp}-{p.sharding}"


def _parts_by_name(workload: CheckpointWorkload, parallelism: Parallelism) -> dict[str, list]:
    parts = defaultdict(list)
    for rank in range(parallelism.ranks):
        for shard in shard_plan(workload, parallelism, rank):
            parts[shard.part.name].append(shard)
    return parts


@pytest.mark.parametrize("parallelism", LAYOUTS, ids=_ids)
def test_the_ranks_together_write_every_byte_exactly_once(workload, parallelism):
    parts = _parts_by_name(workload, parallelism)
    assert set(parts) == {t.name for t in workload.tensors}  # no tensor lost, none invented
    for spec in workload.tensors:
        shards = sorted(parts[spec.name], key=lambda s: s.start_row)
        assert all(s.full_shape == spec.shape and s.part.dtype == spec.dtype for s in shards)
        if not spec.shape:  # 0-d: one rank writes it
            assert len(shards) == 1 and shards[0].part == spec
            continue
        component = "optimizer" if spec.name.startswith("optimizer.") else "weights"
        if component not in parallelism.sharded_components() and (len(spec.shape) == 1 or parallelism.tp == 1):
            assert len(shards) == 1  # replicated across tp and dp: written once
        # the parts tile dim 0: contiguous, no overlap, no gap, nothing empty
        row = 0
        for shard in shards:
            assert shard.start_row == row
            assert shard.part.shape[0] > 0 and shard.part.shape[1:] == spec.shape[1:]
            row += shard.part.shape[0]
        assert row == spec.shape[0]
        assert sum(s.part.nbytes for s in shards) == spec.nbytes
    assert sum(world_bytes(workload, parallelism)) == workload.total_bytes


@pytest.mark.parametrize("parallelism", LAYOUTS, ids=_ids)
def test_a_rank_never_holds_two_parts_of_one_tensor(workload, parallelism):
    for rank in range(parallelism.ranks):
        names = [t.name for t in shard_workload(workload, parallelism, rank).tensors]
        assert len(names) == len(set(names))


def test_shard_workload_keeps_the_workload_fields_and_order(workload):
    parallelism = Parallelism(dp=2, tp=2, pp=2, sharding="fsdp")
    shard = shard_workload(workload, parallelism, 5)
    assert (shard.preset, shard.shape, shard.requested_bytes, shard.full_bytes) == (
        workload.preset, workload.shape, workload.requested_bytes, workload.full_bytes)
    order = [t.name for t in workload.tensors]
    names = [t.name for t in shard.tensors]
    assert names == sorted(names, key=order.index)
    assert shard.total_bytes == world_bytes(workload, parallelism)[5]


def test_tensor_parallel_splits_matrices_and_rank_0_writes_vectors(workload):
    parallelism = Parallelism(tp=3)
    first, last = (shard_workload(workload, parallelism, r) for r in (0, 2))
    shapes0 = {t.name: t.shape for t in first.tensors}
    shapes2 = {t.name: t.shape for t in last.tensors}
    assert shapes0["model.embed_tokens.weight"] == (1259, 512)  # 3776 = 1259 + 1259 + 1258
    assert shapes2["model.embed_tokens.weight"] == (1258, 512)
    assert shapes0["model.layers.0.self_attn.k_proj.weight"] == (43, 512)  # 128 = 43 + 43 + 42
    assert shapes0["model.norm.weight"] == (512,) and "model.norm.weight" not in shapes2
    assert "optimizer.state.model.norm.weight.step" not in shapes2


def test_zero1_data_parallel_rank_0_writes_the_most_and_the_others_equal(workload):
    """checkpoint_size's story: rank 0 = replicated weights + its optimizer share; the others their share."""
    dp = 4
    sizes = world_bytes(workload, Parallelism(dp=dp, sharding="zero1"))
    optimizer = sum(t.nbytes for t in workload.tensors if t.name.startswith("optimizer."))
    weights = workload.total_bytes - optimizer
    assert sizes[0] == max(sizes) > sizes[1]
    assert sizes[1] == sizes[2] == sizes[3] == pytest.approx(optimizer / dp, rel=1e-3)
    assert sizes[0] == pytest.approx(weights + optimizer / dp, rel=1e-3)


def test_zero3_spreads_everything_and_none_leaves_the_others_idle(workload):
    spread = world_bytes(workload, Parallelism(dp=4, sharding="zero3"))
    assert max(spread) - min(spread) <= 64 * 4  # 0-d step tensors and remainder rows only
    assert world_bytes(workload, Parallelism(dp=4, sharding="fsdp")) == spread
    idle = world_bytes(workload, Parallelism(dp=4, sharding="none"))
    assert idle == [workload.total_bytes, 0, 0, 0]


def test_a_rank_with_nothing_to_write_is_an_empty_workload_that_still_reports(workload):
    empty = shard_workload(workload, Parallelism(dp=2), 1)
    assert empty.tensors == () and empty.total_bytes == 0
    summary = empty.to_dict()
    assert summary["tensors"] == 0 and summary["largest_tensor_bytes"] == 0
    assert "0 B in 0 tensors" in empty.describe()


def test_pipeline_stages_own_contiguous_blocks():
    assert pipeline_stages(8, 3) == (range(0, 3), range(3, 6), range(6, 8))
    assert pipeline_stages(8, 2) == (range(0, 4), range(4, 8))
    assert pipeline_stages(5, 5) == tuple(range(i, i + 1) for i in range(5))
    with pytest.raises(UsageError, match=r"--pp 9 .* 8 blocks"):
        pipeline_stages(8, 9)


def test_each_stage_writes_its_blocks_and_the_ends_go_first_and_last(workload):
    parallelism = Parallelism(pp=3)
    stages = pipeline_stages(workload.shape.layers, 3)
    for stage in range(3):
        names = {t.name for t in shard_workload(workload, parallelism, stage).tensors}
        blocks = {int(n.split(".")[2]) for n in names if n.startswith("model.layers.")}
        assert blocks == set(stages[stage])
        optimizer_blocks = {int(n.split(".")[4]) for n in names if n.startswith("optimizer.state.model.layers.")}
        assert optimizer_blocks == set(stages[stage])  # optimizer state follows its parameter
        assert ("model.embed_tokens.weight" in names) == (stage == 0)
        assert ("lm_head.weight" in names) == ("model.norm.weight" in names) == (stage == 2)
        assert ("optimizer.state.model.norm.weight.exp_avg" in names) == (stage == 2)


def test_empty_parts_are_omitted_when_there_are_more_ranks_than_rows(workload):
    tiny = dataclasses.replace(workload, tensors=(TensorSpec("lm_head.weight", (3, 4), "bf16"),))
    parallelism = Parallelism(dp=2, tp=4, sharding="zero3")
    shards = [shard_plan(tiny, parallelism, rank) for rank in range(parallelism.ranks)]
    rows = [s[0].part.shape[0] if s else 0 for s in shards]
    # tp parts of 1, 1, 1 and 0 rows; each 1-row part split across dp gives dp rank 1 nothing
    assert rows == [1, 1, 1, 0, 0, 0, 0, 0]
    assert [len(s) for s in shards] == [1, 1, 1, 0, 0, 0, 0, 0]


def test_rank_coordinates_follow_megatron_order_and_round_trip():
    parallelism = Parallelism(dp=2, tp=2, pp=3)
    assert rank_coordinates(0, parallelism) == RankCoordinates(dp=0, pp=0, tp=0)
    assert rank_coordinates(1, parallelism) == RankCoordinates(dp=0, pp=0, tp=1)
    # Megatron-Core's default order "tp-cp-ep-dp-pp": data parallel next, pipeline stages slowest
    assert rank_coordinates(2, parallelism) == RankCoordinates(dp=1, pp=0, tp=0)
    assert rank_coordinates(4, parallelism) == RankCoordinates(dp=0, pp=1, tp=0)
    assert rank_coordinates(7, parallelism) == RankCoordinates(dp=1, pp=1, tp=1)
    assert rank_coordinates(11, parallelism) == RankCoordinates(dp=1, pp=2, tp=1)
    seen = {rank_coordinates(r, parallelism) for r in range(parallelism.ranks)}
    assert len(seen) == parallelism.ranks
    assert all(rank_of(rank_coordinates(r, parallelism), parallelism) == r for r in range(parallelism.ranks))


@pytest.mark.parametrize("rank", [-1, 12, 100])
def test_a_rank_outside_the_job_is_a_usage_error(workload, rank):
    parallelism = Parallelism(dp=2, tp=2, pp=3)
    with pytest.raises(UsageError, match=rf"rank {rank} is out of range.*12 ranks"):
        rank_coordinates(rank, parallelism)
    with pytest.raises(UsageError):
        shard_workload(workload, parallelism, rank)


def test_check_world_names_both_sizes():
    check_world(Parallelism(dp=2, tp=2), 4)
    with pytest.raises(UsageError) as info:
        check_world(Parallelism(dp=2, tp=2), 2)
    assert str(info.value).startswith("--dp 2 --tp 2 --pp 1 is 4 ranks, but the launch has 2 (WORLD_SIZE)")
    assert "\n" not in str(info.value)


def test_more_stages_than_blocks_is_a_usage_error(workload):
    with pytest.raises(UsageError, match=r"--pp 9 .* 8 blocks"):
        shard_workload(workload, Parallelism(pp=9), 0)
