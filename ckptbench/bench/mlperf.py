"""MLPerf Storage v2.0's checkpointing workload: its four model shapes, the bytes each rank writes, and a
distributed run's numbers in MLPerf's units, so a result can be set next to a published submission.

Source: mlcommons/storage, ``Submission_guidelines.md`` (v2.0), section 2.2 "Checkpointing", Table 2 (model
architectures, TP x PP x DP, ZeRO stage, checkpoint size; 8, 64, 512 and 1024 processes for CLOSED), and
``configs/dlio/workload/llama3_{8b,70b,405b,1t}.yaml`` (fp16 model, fp32 optimizer, ``num_checkpoints_write``
and ``num_checkpoints_read`` 10, ``fsync: True``). The procedure (section 2.2.2): write every checkpoint, clear
the cache, then read them; ``default`` mode runs the table's rank count, ``subset`` mode a host's ranks,
each writing its rank's share (a fraction ranks / (TP x PP x DP) of the checkpoint). The figures (section
2.2.3, and DLIO's ``statscounter.py`` ``end_save_ckpt``/``end_load_ckpt``): a checkpoint's duration is the
slowest rank's, its rate the bytes of every rank over that duration, and the result the mean of the rates.

MLPerf's "GB" are binary: Table 2's 105 "GB" for llama3-8b is 8.03e9 parameters x 14 bytes (fp16 weights 2,
fp32 master weights and Adam's two moments 12) = 112.4e9 bytes = 104.7 GiB; its "GB/s" are GiB/s. Both
are reported here, labelled.

Per-rank bytes follow the layout: the 14 bytes per parameter split into weights (2) and optimizer state
(12). ZeRO-3 shards both over every rank. ZeRO-1 shards the optimizer state over every rank and keeps the
weights once per data-parallel replica: each tensor x pipeline slice is written by its data-parallel rank 0.
Ranks are numbered tensor-parallel fastest, then pipeline stage, then data-parallel replica.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ckptbench.bench.workloads import DTYPE_BYTES, CheckpointWorkload, TensorSpec
from ckptbench.errors import UsageError

GIB = 2**30
TIB = 2**40
#: Bytes per parameter in MLPerf's checkpoint: fp16 weights, and fp32 master weights + Adam m + v.
WEIGHT_BYTES, OPTIMIZER_BYTES = 2, 12


@dataclass(frozen=True)
class MlperfWorkload:
    """One row of MLPerf Storage v2.0's Table 2."""

    name: str
    ranks: int
    tp: int
    pp: int
    dp: int
    zero: int
    checkpoint_bytes: int  # the published size, read as binary units

    @property
    def params(self) -> float:
        return self.checkpoint_bytes / (WEIGHT_BYTES + OPTIMIZER_BYTES)

    def rank_bytes(self, rank: int) -> int:
        """What ``rank`` writes (tensor-parallel fastest, then pipeline stage, then data-parallel replica)."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} is not one of {self.name}'s {self.ranks}")
        optimizer = self.params * OPTIMIZER_BYTES / self.ranks
        if self.zero == 3:
            return round(optimizer + self.params * WEIGHT_BYTES / self.ranks)
        first_replica = rank < self.tp * self.pp
        return round(optimizer + (self.params * WEIGHT_BYTES / (self.tp * self.pp) if first_replica else 0.0))

    def rank_parts(self, rank: int) -> tuple[float, float]:
        """``(weight_bytes, optimizer_bytes)`` of ``rank``'s share; they sum to :meth:`rank_bytes`."""
        total = self.rank_bytes(rank)
        optimizer = self.params * OPTIMIZER_BYTES / self.ranks
        return total - optimizer, optimizer

    def subset_bytes(self, ranks: int) -> int:
        """What the first ``ranks`` ranks write together: MLPerf's ``subset`` mode on one host."""
        return sum(self.rank_bytes(r) for r in range(ranks))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ranks": self.ranks, "tp": self.tp, "pp": self.pp, "dp": self.dp,
                "zero_stage": self.zero, "checkpoint_bytes": self.checkpoint_bytes, "params": self.params}


WORKLOADS = {
    w.name: w for w in (
        MlperfWorkload("llama3-8b", 8, 1, 1, 8, 3, 105 * GIB),
        MlperfWorkload("llama3-70b", 64, 8, 1, 8, 3, 912 * GIB),
        MlperfWorkload("llama3-405b", 512, 8, 32, 2, 1, round(5.29 * TIB)),
        MlperfWorkload("llama3-1t", 1024, 8, 64, 2, 1, 18 * TIB),
    )
}
#: Checkpoints written, then read, in one MLPerf run (``num_checkpoints_write``/``num_checkpoints_read``).
CHECKPOINTS = 10
#: The model preset recorded as the shape of a workload with no preset of its own (llama3-1t).
LAYOUT_MODEL = "llama3-405b"
#: Largest tensor of a rank's state_dict, in elements: a share is cut into tensors of at most this many.
TENSOR_ELEMENTS = 64 * 2**20


@dataclass(frozen=True)
class MlperfProcedure:
    """MLPerf's order: ``writes`` checkpoints written one after another (each durable: fsync), the page cache
    dropped once, then ``reads`` checkpoints read (checkpoint ``i % writes`` for read ``i``)."""

    writes: int = CHECKPOINTS
    reads: int = CHECKPOINTS

    def __post_init__(self) -> None:
        if self.writes < 1:
            raise UsageError(f"--num-checkpoints-write {self.writes} must be at least 1")
        if self.reads < 1:
            raise UsageError(f"--num-checkpoints-read {self.reads} must be at least 1")

    def to_dict(self) -> dict[str, Any]:
        return {"num_checkpoints_write": self.writes, "num_checkpoints_read": self.reads,
                "order": "every write, then the page cache dropped once, then every read"}


def run_shape(workload: MlperfWorkload, ranks: int) -> tuple[str, str]:
    """``(mode, what it is)`` of a run of ``workload``'s first ``ranks`` ranks; UsageError when too many."""
    if ranks > workload.ranks:
        raise UsageError(f"{workload.name} has {workload.ranks} ranks; this launch has {ranks}",
                         hint=f"launch {workload.ranks} ranks (default mode) or fewer (subset mode)")
    if ranks == workload.ranks:
        return "default", f"default mode: all {workload.ranks} ranks"
    return "subset", (f"subset mode: ranks 0-{ranks - 1} of {workload.ranks}, "
                      f"{workload.subset_bytes(ranks) / workload.checkpoint_bytes:.1%} of the checkpoint")


def rank_workload(workload: MlperfWorkload, rank: int, scale: float = 1.0) -> CheckpointWorkload:
    """The state_dict ``rank`` writes (pure): its fp16 weights and its fp32 optimizer state (master weights,
    Adam's two moments), ``scale`` x MLPerf's bytes, cut into tensors of at most ``TENSOR_ELEMENTS``."""
    from ckptbench.model.presets import load_model

    weight_bytes, optimizer_bytes = workload.rank_parts(rank)
    tensors: list[TensorSpec] = []
    for name, dtype, nbytes in (("model.weights", "bf16", weight_bytes * scale),
                                *((f"optimizer.{part}", "fp32", optimizer_bytes * scale / 3)
                                  for part in ("master_weights", "exp_avg", "exp_avg_sq"))):
        elements = round(nbytes / DTYPE_BYTES[dtype])
        for i, start in enumerate(range(0, elements, TENSOR_ELEMENTS)):
            tensors.append(TensorSpec(f"{name}.{i}", (min(TENSOR_ELEMENTS, elements - start),), dtype))
    preset = workload.name if workload.name in ("llama3-8b", "llama3-70b", "llama3-405b") else LAYOUT_MODEL
    requested = round(workload.rank_bytes(rank) * scale)
    return CheckpointWorkload(workload.name, load_model(preset), requested, workload.checkpoint_bytes,
                              tuple(tensors), "--scale")


def run_workload(workload: MlperfWorkload, ranks: int, scale: float = 1.0) -> CheckpointWorkload:
    """Every rank's tensors of a run of the first ``ranks`` ranks, together (the whole run's checkpoint)."""
    parts = [rank_workload(workload, r, scale) for r in range(ranks)]
    tensors = tuple(TensorSpec(f"rank{r}.{t.name}", t.shape, t.dtype) for r, p in enumerate(parts)
                    for t in p.tensors)
    return CheckpointWorkload(workload.name, parts[0].shape, sum(p.requested_bytes for p in parts),
                              workload.checkpoint_bytes, tensors, "--scale")


def figures(document: dict[str, Any], workload: MlperfWorkload, ranks: int, scale: float,
            procedure: MlperfProcedure) -> dict[str, Any]:
    """An MLPerf run's document (``ckptbench.bench.distributed/1``, save rounds = the writes, load rounds = the
    reads) in MLPerf's terms: per checkpoint, the slowest rank's duration and every rank's bytes over it; the
    mean of those rates, in GiB/s (MLPerf's "GB/s") and in 1e9 bytes/s (ckptbench's GB/s)."""
    mode, what = run_shape(workload, ranks)
    out: dict[str, Any] = {
        "workload": workload.to_dict(), "mode": mode, "what_ran": what, "ranks_run": ranks, "scale": scale,
        "comparable": scale == 1.0, "procedure": procedure.to_dict(),
        "rank_bytes": list(document["rank_bytes"]), "bytes_per_run": sum(document["rank_bytes"]),
        "aggregation": "per checkpoint: duration = the slowest rank's (barrier to its return), rate = every "
                       "rank's bytes / that duration; the figure is the mean of the checkpoints' rates",
        "units": {"gib_per_s": 'MLPerf\'s "GB/s": 2^30 bytes per second',
                  "gbps": "ckptbench's GB/s: 1e9 bytes per second"},
    }
    for op, name in (("save", "write"), ("load", "read")):
        rounds = document["rounds"][op]
        durations = [r["duration_s"] for r in rounds]
        out[name] = {
            "runs_duration_s": durations,
            "slowest_rank": [r["slowest_rank"] for r in rounds],
            "duration_s": statistics.fmean(durations),
            "gib_per_s": statistics.fmean(r["total_bytes"] / r["duration_s"] / GIB for r in rounds),
            "gbps": statistics.fmean(r["total_bytes"] / r["duration_s"] / 1e9 for r in rounds),
        }
    return out
