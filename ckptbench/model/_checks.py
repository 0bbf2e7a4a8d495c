"""Validation helpers shared by the model's dataclasses: each raises ``UsageError`` naming the value."""

from __future__ import annotations

import math

from ckptbench.errors import UsageError


def positive(name: str, value: float) -> None:
    """``value`` must be a finite number above zero."""
    finite(name, value)
    if value <= 0:
        raise UsageError(f"{name} {value!r} must be a positive number")


def nonnegative(name: str, value: float) -> None:
    """``value`` must be a finite number, zero or more."""
    finite(name, value)
    if value < 0:
        raise UsageError(f"{name} {value!r} must be zero or more")


def finite(name: str, value: float) -> None:
    """``value`` must be a number, neither infinite nor NaN."""
    if not _is_number(value):
        raise UsageError(f"{name} {value!r} must be a number")
    if not math.isfinite(value):
        raise UsageError(f"{name} {value!r} must be finite")


def positive_int(name: str, value: int, *, at_most: int | None = None) -> None:
    """``value`` must be a whole number, at least 1 (and at most ``at_most``: a float cannot hold every int)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{name} {value!r} must be a whole number of at least 1")
    if at_most is not None and value > at_most:
        raise UsageError(f"{name} {_shown_int(value)} is more than {at_most:,}, the most accepted")


def fraction(name: str, value: float, *, allow_zero: bool) -> None:
    """``value`` must lie in [0, 1] (``allow_zero``) or (0, 1]."""
    low_ok = _is_number(value) and (value >= 0 if allow_zero else value > 0)
    if not (low_ok and value <= 1):
        bound = "[0, 1]" if allow_zero else "(0, 1]"
        raise UsageError(f"{name} {value!r} must lie in {bound}")


def one_of(name: str, value: str, choices: tuple[str, ...] | list[str]) -> None:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise UsageError(f"{name} {value!r} is not one of {', '.join(choices)}")


def _shown_int(value: int) -> str:
    """``1,234``, or ``about 10^400`` past 15 digits: a message stays one readable line."""
    return f"{value:,}" if value < 10**15 else f"about 10^{math.log10(value):.0f}"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
