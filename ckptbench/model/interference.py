"""Interference: how much an asynchronous checkpoint slows training while it persists.

One definition in every command and result: **the fraction of training throughput lost while a checkpoint
persists in the background** (0 = no effect; 0.2 = training runs at 80 % of its speed until the checkpoint
is durable). It is the ``f`` of the async model in :mod:`ckptbench.model.interval`.

Where it comes from, in this order:

1. given by the user (``--interference``): used as is;
2. measured on the training device (``--device cuda``: a GPU compute loop timed alone and during persist);
3. otherwise :data:`ASSUMED`, a stated assumption with a range. A CPU matmul probe on the host that runs
   the benchmark says little about a GPU training step (the step does not run on those cores), so the
   probe is reported as information only and never decides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interference:
    """A value of the interference with the range it may lie in and where it comes from."""

    point: float
    low: float
    high: float
    source: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.point <= self.high < 1.0:
            raise ValueError(f"interference {self.point!r} in [{self.low!r}, {self.high!r}] must lie in [0, 1)")

    @classmethod
    def given(cls, value: float, source: str = "given (--interference)") -> Interference:
        return cls(value, value, value, source)

    def as_dict(self) -> dict[str, object]:
        return {"interference": self.point, "interference_range": [self.low, self.high],
                "interference_source": self.source}


#: Persisting from host memory (PCIe, host CPU, NIC) while the GPUs compute: the FastPersist evaluation
#: (Wang et al., 2024, arXiv:2406.13768) overlaps checkpoint writes with training and reports negligible
#: training overhead; 0-5 % is the range assumed here, 2 % the point the model uses.
ASSUMED = Interference(0.02, 0.0, 0.05, "assumed: 2 % (0-5 %) for persisting from host memory while GPUs "
                                        "compute; overlapped writes cost negligible training time in FastPersist "
                                        "(arXiv:2406.13768)")


def from_slowdown(slowdown: float | None) -> float | None:
    """A probe's slowdown (step time during / alone - 1) as the fraction of throughput lost (capped at 0.99)."""
    if slowdown is None:
        return None
    slowdown = max(0.0, slowdown)
    return min(0.99, slowdown / (1.0 + slowdown))
