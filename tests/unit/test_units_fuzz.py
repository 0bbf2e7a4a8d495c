"""Property tests for the unit parsers and formatters (``ckptbench.units``, ``ckptbench.cli.params``).

Whatever text (or TOML value) reaches a parser, it either returns a finite value inside the bounds
the parser documents or raises ValueError, which the CLI turns into one line and exit 2; never
another exception, never inf or nan. What the formatters print parses back to what was formatted,
within the rounding of the print. The example-based cases live in test_units.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptbench import units
from ckptbench.cli import params


def _ascii_upper(text: str) -> str:
    return "".join(c.upper() if c.isascii() else c for c in text)  # "µs".upper() is Greek "ΜS"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


#: parser -> what every value it returns satisfies (the documented bounds)
PARSERS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], bool]]] = {
    "size": (units.parse_size, lambda v: _is_int(v) and v >= 1),
    "rate": (units.parse_rate, _positive),
    "duration": (units.parse_duration, _positive),
    "count": (units.parse_count, _positive),
    "fraction": (units.parse_fraction, lambda v: isinstance(v, float) and 0 < v <= 1),
    "fraction-or-zero": (lambda t: units.parse_fraction(t, allow_zero=True),
                         lambda v: isinstance(v, float) and 0 <= v <= 1),
    "positive-int": (params._positive_int, lambda v: _is_int(v) and v >= 1),
    "nonnegative-int": (params._nonnegative_int, lambda v: _is_int(v) and v >= 0),
    "positive-number": (params._positive_number, _positive),
    "bounded-duration": (params._duration_in_range,
                         lambda v: _positive(v) and params.DURATION_RANGE_S[0] <= v <= params.DURATION_RANGE_S[1]),
}

UNIT_SUFFIXES = sorted({*units.SIZE_UNITS, *units.DURATION_UNITS, *units.COUNT_UNITS} - {""})
RATE_SUFFIXES = ["B/s", "GB/s", "MiB/s", "Gbit/s", "Gbps", "kb/s", "PiB/s", "iB/s", "bit/s", "bytes/s"]

#: pieces of number-like text: the grammar's own tokens, and what users and attackers type instead
PIECES = st.sampled_from([
    *"0123456789", "0", "1", "9", ".", "e", "E", "+", "-", "%", "$", ",", "_", " ", "\t", "/s", "ps",
    *UNIT_SUFFIXES, *RATE_SUFFIXES, "1e400", "1e-400", "1e308", "99999999999999999999", "nan", "NaN", "inf",
    "-inf", "Infinity", "0x10", "1_000", "１", "０", "٣", "\u200f", "\u200b", "\u202e", "\x00", "\n", "ГиБ", "µ",
    "Μ",
])
NUMBER_LIKE = st.lists(PIECES, max_size=10).map("".join)
ANY_TEXT = st.one_of(st.text(), NUMBER_LIKE, st.text(alphabet=st.characters(codec="utf-8"), max_size=50))
#: what a TOML config can hand the same parsers (``--config``): numbers, booleans, lists, tables
TOML_VALUES = st.one_of(st.floats(), st.integers(), st.integers(min_value=-(2**80), max_value=2**80),
                        st.booleans(), st.none(), st.lists(st.integers(), max_size=3),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                        st.floats().map(repr), st.decimals().map(str))


def _check(name: str, value: Any) -> None:
    parse, within_bounds = PARSERS[name]
    try:
        result = parse(value)
    except ValueError:
        return
    assert within_bounds(result), f"{name}({value!r}) = {result!r} is outside its documented bounds"


@pytest.mark.parametrize("name", sorted(PARSERS))
@given(text=ANY_TEXT)
def test_any_text_parses_within_bounds_or_raises_value_error(name: str, text: str) -> None:
    _check(name, text)


@pytest.mark.parametrize("name", sorted(PARSERS))
@given(value=TOML_VALUES)
def test_any_config_value_parses_within_bounds_or_raises_value_error(name: str, value: Any) -> None:
    _check(name, value)


@pytest.mark.parametrize("param_type", [params.SIZE, params.RATE, params.DURATION, params.COUNT, params.FRACTION,
                                        params.FRACTION_OR_ZERO, params.POSITIVE_NUMBER, params.POSITIVE_INT,
                                        params.NONNEGATIVE_INT, params.BOUNDED_DURATION, params.SIZE_LIST,
                                        params.INT_LIST], ids=lambda t: t.name)
@given(value=st.one_of(ANY_TEXT, TOML_VALUES))
def test_click_types_fail_only_with_bad_parameter(param_type: click.ParamType, value: Any) -> None:
    """The CLI's layer: a bad value is click's BadParameter (one line, exit 2), never anything else."""
    try:
        result = param_type.convert(value, None, None)
    except click.BadParameter as exc:
        assert "\n" not in exc.format_message().strip() or "\n" in str(value)
        return
    for item in result if isinstance(result, list) else [result]:
        assert math.isfinite(item)


OVERFLOWING = st.integers(min_value=309, max_value=100_000)


@given(exponent=OVERFLOWING, unit=st.sampled_from(["", "B", "KiB", "GB", "PiB", "k", "P"]))
def test_sizes_that_overflow_a_float_are_refused_as_not_finite(exponent: int, unit: str) -> None:
    with pytest.raises(ValueError, match="finite"):
        units.parse_size(f"1e{exponent}{unit}")


@given(exponent=OVERFLOWING, unit=st.sampled_from(RATE_SUFFIXES[:-3]))
def test_rates_that_overflow_a_float_are_refused_as_not_finite(exponent: int, unit: str) -> None:
    with pytest.raises(ValueError, match="finite"):
        units.parse_rate(f"1e{exponent}{unit}")


@given(exponent=OVERFLOWING, unit=st.sampled_from(["", "s", "ms", "h", "d", "w"]))
def test_durations_and_counts_that_overflow_are_refused_as_not_finite(exponent: int, unit: str) -> None:
    with pytest.raises(ValueError, match="finite"):
        units.parse_duration(f"1e{exponent}{unit}")
    with pytest.raises(ValueError, match="finite"):
        units.parse_count(f"1e{exponent}")


@given(parts=st.lists(st.sampled_from(["w", "d", "h", "m", "s"]), min_size=2, max_size=4, unique=True),
       shares=st.lists(st.floats(min_value=0.6, max_value=0.99), min_size=4, max_size=4))
def test_duration_parts_that_overflow_together_are_refused(parts: list[str], shares: list[float]) -> None:
    """Every part finite, their sum not: ``1e303w1e308s`` (units largest first, each once)."""
    units_in_order = sorted(parts, key=units.DURATION_UNITS.__getitem__, reverse=True)
    text = "".join(f"{share * 1.7976931348623157e308 / units.DURATION_UNITS[unit]!r}{unit}"
                   for share, unit in zip(shares, units_in_order, strict=False))
    with pytest.raises(ValueError, match="finite"):
        units.parse_duration(text)


@given(text=st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "nan%", "inf%", "-0%", "1e-400"]),
       allow_zero=st.booleans())
def test_fractions_refuse_nan_and_infinity(text: str, allow_zero: bool) -> None:
    try:
        value = units.parse_fraction(text, allow_zero=allow_zero)
    except ValueError:
        return
    assert allow_zero and value == 0  # "-0%" and an underflow to zero are zero, allowed only with allow_zero


# -- well-formed input: every unit of every table, any case, any spacing -----------------------------------


def _in_bytes(unit: str) -> str:
    """``unit`` (a key of SIZE_UNITS, lowercase) spelled in bytes: its final b a capital B."""
    return unit[:-1] + "B" if unit.endswith("b") else unit


@given(number=st.floats(min_value=1, max_value=1e6), unit=st.sampled_from(sorted(units.SIZE_UNITS)),
       upper=st.booleans(), space=st.sampled_from(["", " ", "  ", "\t"]))
def test_every_size_unit_parses_in_any_case_and_spacing(number: float, unit: str, upper: bool, space: str) -> None:
    """The prefix in either case; the byte a capital B. A bare number of bytes must be whole."""
    if units.SIZE_UNITS[unit] == 1:
        number = float(round(number))
    text = f"{space}{number!r}{space}{_in_bytes(_ascii_upper(unit) if upper else unit)}{space}"
    assert units.parse_size(text) == round(number * units.SIZE_UNITS[unit])


@given(number=st.floats(min_value=1, max_value=1e6), unit=st.sampled_from(sorted(u for u in units.SIZE_UNITS
                                                                                 if u.endswith("b"))),
       upper_prefix=st.booleans(), spelling=st.sampled_from(["b", "bit", "bits", "BIT"]))
def test_every_size_unit_in_bits_is_refused(number: float, unit: str, upper_prefix: bool, spelling: str) -> None:
    prefix = unit[:-1].upper() if upper_prefix else unit[:-1]
    with pytest.raises(ValueError, match="is in bits; sizes are in bytes"):
        units.parse_size(f"{number!r}{prefix}{spelling}")


@given(number=st.floats(min_value=1e-3, max_value=1e6).filter(lambda n: not n.is_integer()),
       unit=st.sampled_from(["", "B"]))
def test_a_fraction_of_a_byte_is_refused_whatever_the_number(number: float, unit: str) -> None:
    with pytest.raises(ValueError, match="is not a whole number of bytes" + ("; did you mean" if not unit else "$")):
        units.parse_size(f"{number!r}{unit}")


@given(number=st.floats(min_value=1e-3, max_value=1e6), unit=st.sampled_from(sorted(units.DURATION_UNITS)),
       upper=st.booleans())
def test_every_duration_unit_parses_in_any_case(number: float, unit: str, upper: bool) -> None:
    text = f"{number!r}{_ascii_upper(unit) if upper else unit}"
    assert units.parse_duration(text) == pytest.approx(number * units.DURATION_UNITS[unit], rel=1e-12)


@given(number=st.floats(min_value=1e-3, max_value=1e6), unit=st.sampled_from(sorted(units.COUNT_UNITS)))
def test_every_count_unit_parses(number: float, unit: str) -> None:
    assert units.parse_count(f"{number!r}{unit}") == pytest.approx(number * units.COUNT_UNITS[unit], rel=1e-12)


@given(number=st.floats(min_value=1e-3, max_value=1e6), prefix=st.sampled_from(["", "k", "M", "G", "T", "P"]),
       binary=st.booleans(), unit=st.sampled_from(["B/s", "b/s", "bit/s", "Bps", "bps", "byte/s", "bytes/s"]))
def test_every_rate_spelling_parses(number: float, prefix: str, binary: bool, unit: str) -> None:
    binary = binary and bool(prefix)
    scale = ["", "k", "m", "g", "t", "p"].index(prefix.lower())
    bits = unit.startswith("b") and not unit.startswith("byte")
    expected = number * (1024 if binary else 1000) ** scale / (8 if bits else 1)
    text = f"{number!r}{prefix}{'i' if binary else ''}{unit}"
    assert units.parse_rate(text) == pytest.approx(expected, rel=1e-12)


# -- round trips: what the tool prints can be typed back in -------------------------------------------------


@given(nbytes=st.integers(min_value=1, max_value=2**70), binary=st.booleans())
def test_printed_sizes_parse_back_within_their_rounding(nbytes: int, binary: bool) -> None:
    """``format_size`` as the tables print it (2 decimals, a space before the unit) parses back as is."""
    text = units.format_size(nbytes, binary=binary)
    number = float(text.split()[0])
    half_last_digit = 0.005 if number >= 1 else 0  # bytes are printed whole
    assert math.isclose(units.parse_size(text), nbytes, rel_tol=half_last_digit / number + 1e-12, abs_tol=0.5)


@given(seconds=st.floats(min_value=1e-9, max_value=1e18))
def test_printed_durations_parse_back_within_their_rounding(seconds: float) -> None:
    """``format_duration`` output, spaces and ``µs`` included, over the whole range the models accept."""
    text = units.format_duration(seconds)
    back = units.parse_duration(text)
    # three significant figures below a minute; above, whole seconds, then two units ("1d 2h")
    half_unit = 1800.5 if seconds >= 86399.5 else 30.5 if seconds >= 3599.5 else 0.5 if seconds >= 59.95 else 0
    assert math.isclose(back, seconds, rel_tol=5e-3 if half_unit == 0 else 1e-12, abs_tol=half_unit)


@given(bytes_per_s=st.floats(min_value=1, max_value=1e6), unit=st.sampled_from(["GB/s", "MB/s", "GiB/s", "MiB/s",
                                                                                "Gbit/s"]))
def test_printed_rates_parse_back_within_their_rounding(bytes_per_s: float, unit: str) -> None:
    """``format_rate`` with its default 2 decimals, for rates of at least one of its unit."""
    divisor = units.parse_rate(f"1{unit}")
    value = bytes_per_s * divisor
    back = units.parse_rate(units.format_rate(value, unit))
    assert math.isclose(back, value, rel_tol=1e-12, abs_tol=0.005 * divisor * (1 + 1e-9))


@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_formatters_take_any_finite_value(value: float) -> None:
    assert units.format_size(value)
    assert units.format_duration(value)
    assert units.format_rate(value)
