"""Two results of the same kind compared metric by metric: the ratio NEW / OLD with its uncertainty from the
runs, whether the change is beyond the noise (``model.noise.beats``, the tie rule everywhere else), and which
changes are regressions past a threshold. Pure: ``compare-results`` prints it.

The ratio is of the medians. Its uncertainty propagates each side's relative standard deviation
(sample stdev / mean of its runs), as hyperfine does for its "1.8 ± 0.2 times faster":
``ratio x sqrt((s_old / m_old)^2 + (s_new / m_new)^2)``. A side with a single run has no spread to
give: its term is left out, and its verdict is ``unknown``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from ckptbench.bench.rows import METRICS, Row, labelled, rows, schema_of
from ckptbench.errors import UsageError
from ckptbench.model.noise import beats

#: Metrics a "slower" threshold applies to: rates (lower is slower) and times (higher is slower).
SPEED_METRICS = ("write_gbps", "read_gbps", "save_gbps", "load_gbps", "stall_s", "persist_s")


def _relative_stdev(samples: tuple[float, ...]) -> float:
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / mean if len(samples) > 1 and mean > 0 else 0.0


@dataclass(frozen=True)
class Change:
    """One metric of one configuration, OLD against NEW."""

    configuration: str
    metric: str
    old: tuple[float, ...]
    new: tuple[float, ...]

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric]

    @property
    def ratio(self) -> float:
        """median(NEW) / median(OLD); infinite when OLD's median is 0 and NEW's is not."""
        old, new = statistics.median(self.old), statistics.median(self.new)
        if old == 0:
            return 1.0 if new == 0 else math.inf
        return new / old

    @property
    def ratio_error(self) -> float:
        """The ratio's standard uncertainty from both sides' runs (0 when neither has two)."""
        if not math.isfinite(self.ratio):
            return math.nan
        return abs(self.ratio) * math.hypot(_relative_stdev(self.old), _relative_stdev(self.new))

    @property
    def verdict(self) -> str:
        """``better`` or ``worse`` beyond the noise (every run of one side beats every run of the other),
        ``within the noise``, or ``unknown`` when a side has a single run (no spread to judge by)."""
        if len(self.old) < 2 or len(self.new) < 2:
            return "unknown"
        if beats(self.new, self.old, self.higher_is_better):
            return "better"
        if beats(self.old, self.new, self.higher_is_better):
            return "worse"
        return "within the noise"

    def slower_by(self) -> float | None:
        """How much slower NEW is as a fraction (0.1 = 10 % slower), for :data:`SPEED_METRICS`; None otherwise.
        Negative when it is faster. For rates 1 - ratio, for times ratio - 1."""
        if self.metric not in SPEED_METRICS or not math.isfinite(self.ratio):
            return None
        return 1 - self.ratio if self.higher_is_better else self.ratio - 1

    def to_dict(self, threshold: float | None) -> dict[str, Any]:
        slower = self.slower_by()
        return {
            "configuration": self.configuration, "metric": self.metric, "higher_is_better": self.higher_is_better,
            "old_median": statistics.median(self.old), "old_runs": len(self.old), "old_samples": list(self.old),
            "new_median": statistics.median(self.new), "new_runs": len(self.new), "new_samples": list(self.new),
            "ratio": self.ratio if math.isfinite(self.ratio) else None,
            "ratio_error": self.ratio_error if math.isfinite(self.ratio_error) else None,
            "verdict": self.verdict, "slower_by": slower,
            "regression": threshold is not None and slower is not None and slower > threshold,
        }


@dataclass(frozen=True)
class Comparison:
    kind: str
    changes: tuple[Change, ...]
    only_old: tuple[str, ...]
    only_new: tuple[str, ...]

    def regressions(self, threshold: float) -> list[Change]:
        """The changes slower than ``threshold`` (a fraction), by median."""
        return [c for c in self.changes if (c.slower_by() or 0.0) > threshold]


def compare(old: dict[str, Any], new: dict[str, Any], old_where: str, new_where: str) -> Comparison:
    """OLD and NEW matched by configuration (writer, tier); a one-line ``UsageError`` when either is not a
    result this version reads, when they are of different kinds, or when they have no configuration in common."""
    old_kind, new_kind = schema_of(old, old_where), schema_of(new, new_where)
    if old_kind != new_kind:
        raise UsageError(f"{old_where} is a {old_kind} result and {new_where} a {new_kind} one: compare two results "
                         "of the same kind")
    old_rows, new_rows = labelled(rows(old, old_where)), labelled(rows(new, new_where))
    common = [label for label in old_rows if label in new_rows]
    if not common:
        raise UsageError(f"{old_where} and {new_where} have no configuration in common "
                         f"(OLD: {', '.join(old_rows) or 'none'}; NEW: {', '.join(new_rows) or 'none'})")
    changes = [change for label in common for change in _changes(label, old_rows[label], new_rows[label])]
    return Comparison(old_kind, tuple(changes), tuple(label for label in old_rows if label not in new_rows),
                      tuple(label for label in new_rows if label not in old_rows))


def _changes(label: str, old: Row, new: Row) -> list[Change]:
    return [Change(label, metric, old.runs[metric], new.runs[metric])
            for metric in METRICS if metric in old.runs and metric in new.runs]
