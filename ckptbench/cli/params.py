"""click parameter types built on ``units``: the one place flags and TOML values are validated."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from ckptbench import units


class _UnitType(click.ParamType):
    """Wraps a ``units.parse_*`` function; a ValueError becomes click's BadParameter (exit 2)."""

    def __init__(self, name: str, parse: Callable[[Any], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class ListType(click.ParamType):
    """A comma-separated list (``1,2,4``) of another type; TOML arrays are accepted too."""

    def __init__(self, item: click.ParamType) -> None:
        self.item = item
        self.name = f"{item.name}[,{item.name}...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            items = units.parse_list(value, lambda v: self.item.convert(v, param, ctx))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return items


def _positive_int(value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number") from None
    if number <= 0:
        raise ValueError(f"{value!r} must be a positive whole number")
    return number


def _nonnegative_int(value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number") from None
    if number < 0:
        raise ValueError(f"{value!r} must be zero or more")
    return number


def _positive_number(value: Any) -> float:
    """A plain positive number: ``1979``, ``11.25``, ``$90``, ``1,000``."""
    try:
        number = float(str(value).strip().lstrip("$").replace(",", ""))
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{value!r} must be finite")
    if number <= 0:
        raise ValueError(f"{value!r} must be a positive number")
    return number


SIZE = _UnitType("size", units.parse_size)
RATE = _UnitType("rate", units.parse_rate)
DURATION = _UnitType("duration", units.parse_duration)
COUNT = _UnitType("count", units.parse_count)
FRACTION = _UnitType("fraction", units.parse_fraction)
FRACTION_OR_ZERO = _UnitType("fraction", lambda v: units.parse_fraction(v, allow_zero=True))
POSITIVE_NUMBER = _UnitType("number", _positive_number)
POSITIVE_INT = _UnitType("integer", _positive_int)
NONNEGATIVE_INT = _UnitType("integer", _nonnegative_int)
SIZE_LIST = ListType(SIZE)
INT_LIST = ListType(POSITIVE_INT)


# Durations the failure and interval models take: 1 ns to 1e18 s (about 32 billion years). Beyond
# these, products and ratios of durations underflow or overflow a float long before they mean anything.
DURATION_RANGE_S = (1e-9, 1e18)


def _duration_in_range(value: Any) -> float:
    seconds = units.parse_duration(value)
    low, high = DURATION_RANGE_S
    if not low <= seconds <= high:
        raise ValueError(f"duration {str(value)!r} must lie between 1 ns and {high:.0e} s")
    return seconds


BOUNDED_DURATION = _UnitType("duration", _duration_in_range)
# The parsers reject infinite and overflowing values ("must be finite") themselves.
FINITE_SIZE, FINITE_RATE, FINITE_COUNT, FINITE_POSITIVE_NUMBER = SIZE, RATE, COUNT, POSITIVE_NUMBER
