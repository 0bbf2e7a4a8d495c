"""The tie rule: one set of repeated measurements is better than another only beyond the noise of both.

Used wherever a choice is made from measurements (``bench`` ranking configurations and tiers, the writer's
per-mount tuning in ``checkpoint.tuning``); ``bench.stats`` re-exports both functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def beats(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True) -> bool:
    """Whether ``a`` is better than ``b`` beyond the noise of both: each has two or more samples and every
    sample of ``a`` is better than every sample of ``b`` (their ranges do not overlap). One sample says
    nothing about the noise, so it never beats and is never beaten."""
    if len(a) < 2 or len(b) < 2:
        return False
    return min(a) > max(b) if higher_is_better else max(a) < min(b)


def leaders(candidates: Sequence[Sequence[float]], higher_is_better: bool = True) -> list[int]:
    """Indices of the candidates tied for best, best median first: the one with the best median, and every
    other one it does not :func:`beats`. One index means a winner beyond the noise."""
    if not candidates:
        raise ValueError("no candidates to rank")
    medians = [float(np.median(np.asarray(c, dtype=float))) for c in candidates]
    order = sorted(range(len(candidates)), key=lambda i: medians[i], reverse=higher_is_better)
    top = order[0]
    return [top] + [i for i in order[1:] if not beats(candidates[top], candidates[i], higher_is_better)]
