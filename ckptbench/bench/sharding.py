"""Which tensors each rank of a dp x tp x pp job writes: a checkpoint workload split like a real one.

Pure: no torch, no I/O. The split follows the story of ``model.sizing`` (tensor and pipeline
parallelism split every tensor, data-parallel sharding splits some components, replicated state is
written by data-parallel rank 0 only), applied tensor by tensor so every rank gets real shapes.

Ranks are numbered as Megatron-Core does by default (``order="tp-cp-ep-dp-pp"``, without context or
expert parallelism): tensor parallel fastest, then data parallel, pipeline stages slowest, so a
node's GPUs hold one stage's tensor-parallel groups::

    rank = pp_i * (dp * tp) + dp_i * tp + tp_i

Rules, in the order they are applied to each tensor of the workload:

1. **Pipeline.** Stage ``pp_i`` owns a contiguous range of blocks (``model.layers.{i}.*``), the
   blocks split as evenly as possible, earlier stages taking one more block when ``pp`` does not
   divide the block count (:func:`pipeline_stages`). ``model.norm.weight`` and ``lm_head.weight``
   belong to the last stage, the embedding (and any other tensor outside a block) to the first.
   Optimizer state (``optimizer.state.<param>.*``) follows its parameter. ``pp`` must not exceed
   the number of blocks.
2. **Tensor parallel.** A tensor with two or more dimensions is split along dim 0 into ``tp``
   near-equal parts, the first parts one row larger when ``tp`` does not divide the rows. 1-D and
   0-d tensors are replicated across ``tp``; tensor-parallel rank 0 writes them.
3. **Data parallel.** A tensor belongs to the ``optimizer`` component (``optimizer.state.*``) or to
   ``weights`` (everything else: the bf16 weights and the fp32 ``inv_freq`` buffers). A component
   in ``Parallelism.sharded_components()`` (optimizer state from ``zero1`` on, weights too with
   ``zero3``/``fsdp``) has its tensor-parallel part split again along dim 0 into ``dp`` near-equal
   parts; a 0-d tensor (Adam's ``step``) cannot be split and data-parallel rank 0 writes it. A
   component that is not sharded is written by data-parallel rank 0 only, so with ``sharding="none"``
   the other data-parallel ranks write nothing.

An empty part (more ranks than rows) is omitted. A part keeps the tensor's name (each rank has its
own state_dict); :class:`TensorShard` records where along dim 0 it sits in the full tensor. Every
byte of the workload is written by exactly one rank, so the per-rank totals sum to the workload's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ckptbench.bench.workloads import CheckpointWorkload, TensorSpec
from ckptbench.errors import UsageError
from ckptbench.model.sizing import Parallelism

_BLOCK_PREFIX = "model.layers."
_OPTIMIZER_PREFIX = "optimizer.state."
_LAST_STAGE_TENSORS = ("model.norm.weight", "lm_head.weight")


@dataclass(frozen=True)
class RankCoordinates:
    """Where a rank sits in the job: its data-parallel, pipeline and tensor-parallel index."""

    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class TensorShard:
    """One rank's part of a tensor: the part (same name, fewer rows) and where it sits in the full one.

    ``start_row`` is the part's first index along dim 0 of the full tensor of shape ``full_shape``
    (0 for a whole or 0-d tensor).
    """

    part: TensorSpec
    full_shape: tuple[int, ...]
    start_row: int


def rank_coordinates(rank: int, parallelism: Parallelism) -> RankCoordinates:
    """The (dp, pp, tp) indices of ``rank``: tensor parallel fastest, then data parallel, then pipeline."""
    if not 0 <= rank < parallelism.ranks:
        raise UsageError(f"rank {rank} is out of range: {_layout(parallelism)} is {parallelism.ranks} ranks "
                         f"(0 to {parallelism.ranks - 1})")
    tp_i = rank % parallelism.tp
    dp_i = rank // parallelism.tp % parallelism.dp
    pp_i = rank // (parallelism.tp * parallelism.dp)
    return RankCoordinates(dp=dp_i, pp=pp_i, tp=tp_i)


def rank_of(coordinates: RankCoordinates, parallelism: Parallelism) -> int:
    """The rank at ``coordinates`` (the inverse of :func:`rank_coordinates`)."""
    return (coordinates.pp * parallelism.dp + coordinates.dp) * parallelism.tp + coordinates.tp


def check_world(parallelism: Parallelism, world_size: int, source: str = "WORLD_SIZE") -> None:
    """Raise UsageError unless ``dp * tp * pp`` equals the launch's ``world_size`` (read from ``source``)."""
    if parallelism.ranks != world_size:
        raise UsageError(f"{_layout(parallelism)} is {parallelism.ranks} ranks, but the launch has "
                         f"{world_size} ({source})", hint="make dp x tp x pp equal the number of processes")


def pipeline_stages(blocks: int, pp: int) -> tuple[range, ...]:
    """The blocks each of ``pp`` stages owns: contiguous, as even as possible, earlier stages one more."""
    if pp > blocks:
        raise UsageError(f"--pp {pp} is more pipeline stages than the workload's {blocks} blocks",
                         hint="use a smaller --pp or a larger --size/--scale")
    stages, start = [], 0
    for rows in _split_sizes(blocks, pp):
        stages.append(range(start, start + rows))
        start += rows
    return tuple(stages)


def shard_plan(workload: CheckpointWorkload, parallelism: Parallelism, rank: int) -> tuple[TensorShard, ...]:
    """Every part ``rank`` writes, in the workload's order, with its place in the full tensor."""
    at = rank_coordinates(rank, parallelism)
    stages = pipeline_stages(workload.shape.layers, parallelism.pp)
    stage_of_block = {block: i for i, stage in enumerate(stages) for block in stage}
    sharded = parallelism.sharded_components()
    shards = []
    for spec in workload.tensors:
        if _stage(spec.name, stage_of_block, parallelism.pp) != at.pp:
            continue
        component = "optimizer" if spec.name.startswith(_OPTIMIZER_PREFIX) else "weights"
        start, rows = _tp_rows(spec, parallelism.tp, at.tp)
        if rows is None:
            continue
        if component in sharded and spec.shape:
            offset, rows = _part(rows, parallelism.dp, at.dp)
            start += offset
        elif at.dp != 0:
            continue
        if spec.shape and rows == 0:
            continue
        part = dataclasses.replace(spec, shape=(rows, *spec.shape[1:])) if spec.shape else spec
        shards.append(TensorShard(part=part, full_shape=spec.shape, start_row=start))
    return tuple(shards)


def shard_workload(workload: CheckpointWorkload, parallelism: Parallelism, rank: int) -> CheckpointWorkload:
    """The tensors ``rank`` writes, as a workload (``total_bytes`` is this rank's bytes; may hold none).

    The other fields (preset, shape, requested and full bytes) are the whole workload's.
    """
    parts = tuple(shard.part for shard in shard_plan(workload, parallelism, rank))
    return dataclasses.replace(workload, tensors=parts)


def world_bytes(workload: CheckpointWorkload, parallelism: Parallelism) -> list[int]:
    """Bytes each rank writes, indexed by rank; they sum to ``workload.total_bytes``."""
    return [shard_workload(workload, parallelism, rank).total_bytes for rank in range(parallelism.ranks)]


def _layout(parallelism: Parallelism) -> str:
    return f"--dp {parallelism.dp} --tp {parallelism.tp} --pp {parallelism.pp}"


def _split_sizes(n: int, parts: int) -> list[int]:
    """``n`` split into ``parts`` near-equal sizes, the first ones one larger."""
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _part(n: int, parts: int, index: int) -> tuple[int, int]:
    """(start, size) of part ``index`` of ``n`` split by :func:`_split_sizes`."""
    base, extra = divmod(n, parts)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def _tp_rows(spec: TensorSpec, tp: int, tp_i: int) -> tuple[int, int | None]:
    """(start, rows) of this tensor-parallel rank's part; rows None where another tp rank writes it."""
    if len(spec.shape) >= 2:
        return _part(spec.shape[0], tp, tp_i)
    if tp_i != 0:
        return 0, None
    return 0, spec.shape[0] if spec.shape else 0


def _stage(name: str, stage_of_block: dict[int, int], pp: int) -> int:
    """The pipeline stage that owns tensor ``name`` (optimizer state: its parameter's stage)."""
    if name.startswith(_OPTIMIZER_PREFIX):
        name = name.removeprefix(_OPTIMIZER_PREFIX).rsplit(".", 1)[0]
    if name.startswith(_BLOCK_PREFIX):
        return stage_of_block[int(name.split(".")[2])]
    if name in _LAST_STAGE_TENSORS:
        return pp - 1
    return 0
