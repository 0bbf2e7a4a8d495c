"""Parse and format sizes, rates, durations, counts and fractions.

Conventions (docs/ARCHITECTURE.md): GB = 1e9 bytes, GiB = 2**30 bytes, GB/s = 1e9 bytes/s. Single-letter
suffixes on sizes (``4k``, ``1M``, ``2G``) are binary, as in fio and dd. Every parser raises
:class:`ValueError` with a message naming the bad value and what would be accepted; the CLI turns
that into a one-line usage error.

Bits and bytes: a capital ``B`` is a byte and a lowercase ``b`` (or ``bit``) a bit, everywhere; the
prefix letter may take either case. Rates take both (``10Gb/s`` and ``10Gbit/s`` are 1.25 GB/s).
Sizes are in bytes, so a size in bits (``1Gb``, ``4kb``, ``512b``) is refused, naming the byte
spelling to write instead (``1GB`` or ``1GiB``).

Sizes are whole bytes: a bare number (or ``B``) must be whole (``1.5`` is refused: did you mean
``1.5GiB``?); a fraction of a larger unit (``1.5GiB``, ``1.3k``) rounds to the nearest byte.

Durations may combine units, largest first and each once (``1h30m``, ``1d 2h``, as
:func:`format_duration` prints them); a repeated unit (``1m1m``) or one out of order (``30m1h``) is refused.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"

SIZE_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50,
}

DURATION_UNITS: dict[str, float] = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3,
    "": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0,
    "h": 3600.0, "hr": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0, "w": 604800.0,
}

COUNT_UNITS: dict[str, float] = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}

_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]*)\s*$")
_RATE_RE = re.compile(rf"^\s*{_NUMBER}\s*([kKmMgGtTpP]?)(i?)(B|b|bits|bit|bytes|byte)?\s*(?:/s|ps)\s*$")
_DURATION_PART_RE = re.compile(rf"{_NUMBER}\s*([a-zA-Zµ]*)")


def _require_finite(value: float, text: object) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{str(text)!r} must be finite (it overflows to infinity)")


def parse_size(text: str | int) -> int:
    """``"140GB"`` -> 140_000_000_000; ``"1.5GiB"`` -> 1610612736; ``"4k"`` -> 4096; plain ints pass.

    Refused: a size in bits (``1Gb``), and a fraction of a byte (``1.5``, ``1.5B``)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        bits_prefix = _bits_prefix(m.group(2)) if m else None
        if m and bits_prefix is not None:
            raise ValueError(f"{text!r} is in bits; sizes are in bytes (B, not b): write "
                             f"{_in_bytes(m.group(1), bits_prefix)}")
        unit = m.group(2).lower() if m else None
        if not m or unit not in SIZE_UNITS:
            raise ValueError(f"{text!r} is not a size (try 4096, 4KiB, 1.5GiB, 140GB)")
        number = float(m.group(1))
        _require_finite(number * SIZE_UNITS[unit], text)
        if SIZE_UNITS[unit] == 1 and not number.is_integer():
            guess = "" if m.group(2) else f"; did you mean {m.group(1)}GiB?"  # a bare number: the unit forgotten
            raise ValueError(f"{text!r} is not a whole number of bytes{guess}")
        value = round(number * SIZE_UNITS[unit])
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value


_SIZE_PREFIXES = ("", "k", "m", "g", "t", "p", "ki", "mi", "gi", "ti", "pi")


def _bits_prefix(unit: str) -> str | None:
    """The prefix of a unit in bits (``"G"`` of ``Gb`` or ``Gbit``, ``""`` of ``b``), or None for any other unit."""
    for bits in ("bits", "bit", "b"):
        spelled = unit if bits == "b" else unit.lower()  # "bit" in any case; "b" lowercase only, as "B" is a byte
        if spelled.endswith(bits) and unit[: -len(bits)].lower() in _SIZE_PREFIXES:
            return unit[: -len(bits)]
    return None


def _in_bytes(number: str, prefix: str) -> str:
    """How to write ``number`` ``prefix`` in bytes: ``1GB or 1GiB``, ``1GiB`` (from ``Gib``), ``512B``."""
    letter = prefix[:1].upper()
    if not letter:
        return f"{number}B"
    if prefix[1:].lower() == "i":
        return f"{number}{letter}iB"
    return f"{number}{'k' if letter == 'K' else letter}B or {number}{letter}iB"


def parse_rate(text: str | float) -> float:
    """Bytes per second from ``"1GB/s"``, ``"10Gbit/s"``, ``"10Gbps"``, ``"800MiB/s"``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _RATE_RE.match(str(text))
        if not m:
            raise ValueError(f"{text!r} is not a rate (try 1GB/s, 800MiB/s, 10Gbit/s)")
        number, prefix, binary, unit = m.groups()
        prefix = prefix.lower()
        if binary and not prefix:
            raise ValueError(f"{text!r} is not a rate (try 1GB/s, 800MiB/s, 10Gbit/s)")
        scale = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}[prefix]
        multiplier = (1024**scale) if binary else (1000**scale)
        is_bits = unit in ("b", "bit", "bits") or (unit is None and str(text).strip().endswith("ps"))
        value = float(number) * multiplier / (8 if is_bits else 1)
    _require_finite(value, text)
    if value <= 0:
        raise ValueError(f"rate {text!r} must be positive")
    return value


def parse_duration(text: str | float, *, allow_zero: bool = False) -> float:
    """Seconds from ``"30m"``, ``"2h"``, ``"500ms"``, ``"1d"``, ``"1h30m"`` or a bare number of seconds;
    positive, or zero too with ``allow_zero`` (a cost that may be nothing, a restart). Combined units
    go largest first, each once: ``"1m1m"`` and ``"30m1h"`` are refused."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip().replace(" ", "")
        pos, value, parts, bare, previous_scale = 0, 0.0, 0, False, math.inf
        for m in _DURATION_PART_RE.finditer(s):
            if m.start() != pos or m.group(2).lower() not in DURATION_UNITS:
                break
            scale = DURATION_UNITS[m.group(2).lower()]
            if m.group(2) and scale >= previous_scale:
                problem = "repeats a unit" if scale == previous_scale else "comes after a smaller unit"
                raise ValueError(f"{text!r} is not a duration: {m.group(0)!r} {problem} (give each unit once, "
                                 "largest first: 1h30m)")
            value += float(m.group(1)) * scale
            pos, parts, bare, previous_scale = m.end(), parts + 1, bare or not m.group(2), scale
        # A bare number means seconds only when it stands alone ("1h30" is ambiguous).
        if parts == 0 or pos != len(s) or (bare and parts > 1):
            raise ValueError(f"{text!r} is not a duration (try 500ms, 140s, 30m, 2h, 1d, 1h30m)")
    _require_finite(value, text)
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"duration {text!r} must be {'zero or more' if allow_zero else 'positive'}")
    return value


def parse_count(text: str | float) -> float:
    """A large count such as parameters or tokens: ``"70B"`` -> 7e10, ``"20T"`` -> 2e13, ``"1.5k"``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _SIZE_RE.match(str(text))
        unit = m.group(2).lower() if m else None
        if not m or unit not in COUNT_UNITS:
            raise ValueError(f"{text!r} is not a count (try 4000, 8B, 70B, 20T)")
        value = float(m.group(1)) * COUNT_UNITS[unit]
    _require_finite(value, text)
    if value <= 0:
        raise ValueError(f"count {text!r} must be positive")
    return value


def parse_fraction(text: str | float, *, allow_zero: bool = False) -> float:
    """A fraction in [0, 1] from ``"2%"``, ``"0.35"`` or ``35%``."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise ValueError(f"{text!r} is not a fraction (try 0.35 or 35%)") from None
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 1):
        bound = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{text!r} must lie in {bound} (a fraction like 0.35 or 35%)")
    return value


def parse_list(text: str | list | tuple, parse) -> list:
    """``"1,2,4"`` -> ``[parse("1"), parse("2"), parse("4")]``; lists pass element-wise."""
    items = list(text) if isinstance(text, (list, tuple)) else [p for p in str(text).split(",") if p.strip()]
    if not items:
        raise ValueError(f"{text!r} is an empty list")
    return [parse(item) for item in items]


def format_size(nbytes: float, *, binary: bool = True, digits: int = 2) -> str:
    """``format_size(2**30)`` -> ``"1 GiB"``, ``1.5 * 2**30`` -> ``"1.5 GiB"``; ``binary=False`` gives GB/MB/kB."""
    base, units = (1024.0, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]) if binary else (
        1000.0, ["B", "kB", "MB", "GB", "TB", "PB"])
    value, i = float(nbytes), 0
    if abs(value) > 2.0**70:  # beyond any storage: a count, not thousands of the largest unit
        return f"{value:.3g} B"
    while abs(value) >= base and i < len(units) - 1:
        value /= base
        i += 1
    if i == 0:
        return f"{int(value)} B"
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") + f" {units[i]}"


def format_rate(bytes_per_s: float, unit: str = "GB/s", digits: int = 2) -> str:
    """``format_rate(1.5e9)`` -> ``"1.50 GB/s"``; ``unit`` is one of GB/s, MB/s, GiB/s, MiB/s, Gbit/s."""
    divisors = {"GB/s": 1e9, "MB/s": 1e6, "GiB/s": 2**30, "MiB/s": 2**20, "Gbit/s": 1.25e8}
    if unit not in divisors:
        raise ValueError(f"unknown rate unit {unit!r}; one of {', '.join(divisors)}")
    return f"{bytes_per_s / divisors[unit]:.{digits}f} {unit}"


def format_duration(seconds: float) -> str:
    """Human duration: ``0.0005`` -> ``"500 µs"``, ``140`` -> ``"2m 20s"``, ``93600`` -> ``"1d 2h"``."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    seconds = round(seconds)
    for big, small, big_name, small_name in (
        (86400, 3600, "d", "h"), (3600, 60, "h", "m"), (60, 1, "m", "s"),
    ):
        if seconds >= big:
            whole = int(seconds // big)
            rest = round((seconds - whole * big) / small)
            if rest * small >= big:
                whole, rest = whole + 1, 0
            return f"{whole}{big_name}" + (f" {rest}{small_name}" if rest else "")
    raise AssertionError("unreachable")


#: Fewer runs than this show no range (min–max): two samples say next to nothing about the noise.
RANGE_MIN_RUNS = 3
#: Fewer runs than this show no p10/p90: below ten samples a 10th percentile is an interpolated min.
PERCENTILES_MIN_RUNS = 10


def range_text(summary: dict[str, float | int], scale: float = 1.0, digits: int = 2) -> str:
    """``min–max`` of a summary (``bench.stats.summarize``) (times ``scale``), or ``-`` with fewer than
    :data:`RANGE_MIN_RUNS` runs."""
    if summary.get("n", 0) < RANGE_MIN_RUNS:
        return "-"
    return f"{summary['min'] * scale:.{digits}f}–{summary['max'] * scale:.{digits}f}"


def percentiles_text(summary: dict[str, float | int], scale: float = 1.0, digits: int = 2) -> str:
    """``p10/p90`` of a summary (``bench.stats.summarize``), or ``-`` with fewer than :data:`PERCENTILES_MIN_RUNS` runs."""
    if summary.get("n", 0) < PERCENTILES_MIN_RUNS:
        return "-"
    return f"{summary['p10'] * scale:.{digits}f}/{summary['p90'] * scale:.{digits}f}"


def runs_text(repeat: int, warmup: int) -> str:
    """``1 run (no warm-up)``, ``3 runs (+1 warm-up)``."""
    runs = f"{repeat} run{'' if repeat == 1 else 's'}"
    return f"{runs} (no warm-up)" if warmup == 0 else f"{runs} (+{warmup} warm-up)"


def count_text(count: int, noun: str) -> str:
    """``1 file``, ``8 files``: a count with its noun in the right number (nouns that take an ``s``)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def clipped(value: object, width: int = 60) -> str:
    """``repr(value)``, cut to ``width`` characters with "..." (a value from a file, shown in a one-line error)."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."
