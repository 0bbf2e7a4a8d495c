"""MLPerf Storage v2.0's checkpointing workload: its four model shapes, the bytes each rank writes, and a
distributed run's numbers in MLPerf's units, so a result can be set next to a published submission.

Source: mlcommons/storage, ``Submission_guidelines.md`` (v2.0), section 2.2 "Checkpointing", Table 2 (model
architectures, TP x PP x DP, ZeRO stage, checkpoint size; 8, 64, 512 and 1024 processes for CLOSED), and
``configs/dlio/workload/llama3_{8b,70b,405b,1t}.yaml`` (fp16 model, fp32 optimizer, ``num_checkpoints_write``
and ``num_checkpoints_read`` 10, ``fsync: True``). The rules: write the checkpoints, clear the page cache,
read them; a run's duration is the slowest rank's; the result is the mean of the runs.

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
#: Checkpoints written, then read, in one MLPerf run.
CHECKPOINTS = 10
#: The model preset whose tensor layout the state_dicts take (the largest: every subset fits in it).
LAYOUT_MODEL = "llama3-405b"


def figures(document: dict[str, Any], workload: MlperfWorkload, ranks: int, scale: float) -> dict[str, Any]:
    """A distributed run's (``ckptbench.bench.distributed/1``) writes and reads in MLPerf's terms: per run,
    the slowest rank's duration and all ranks' bytes over it; the mean of the runs, in GiB/s (MLPerf's
    "GB/s") and in 1e9 bytes/s (ckptbench's GB/s)."""
    out: dict[str, Any] = {
        "workload": workload.to_dict(), "mode": "default" if ranks == workload.ranks else "subset",
        "ranks_run": ranks, "scale": scale, "comparable": scale == 1.0,
        "bytes_per_run": None, "units": {"gib_per_s": 'MLPerf\'s "GB/s": 2^30 bytes per second',
                                         "gbps": "ckptbench's GB/s: 1e9 bytes per second"},
    }
    for op, name in (("save", "write"), ("load", "read")):
        rounds = document["rounds"][op]
        durations = [r["duration_s"] for r in rounds]
        moved = rounds[0]["total_bytes"]
        out["bytes_per_run"] = moved
        out[name] = {
            "runs_duration_s": durations,
            "duration_s": statistics.fmean(durations),
            "gib_per_s": statistics.fmean(moved / d / GIB for d in durations),
            "gbps": statistics.fmean(moved / d / 1e9 for d in durations),
        }
    return out
