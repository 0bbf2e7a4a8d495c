"""What a report is made of, independent of its output format: frozen records that the section
renderers (:mod:`ckptbench.report.sections`) produce and the writers (:mod:`ckptbench.report.html`)
turn into HTML or Markdown. Every cell is already formatted text; figures are PNG bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ckptbench.units import format_duration, format_size


@dataclass(frozen=True)
class Table:
    """Rows of formatted cells under ``columns``; rows in ``highlight`` are the best (emphasised), rows in
    ``failed`` a failed check or a missed goal (flagged)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    highlight: frozenset[int] = frozenset()
    failed: frozenset[int] = frozenset()
    note: str = ""

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.title!r}: row {row!r} has {len(row)} cells for {len(self.columns)} columns")
            for cell in row:
                if not isinstance(cell, str):
                    raise TypeError(f"table {self.title!r}: {cell!r} where text belongs")


@dataclass(frozen=True)
class Figure:
    caption: str
    png: bytes = field(repr=False)


@dataclass(frozen=True)
class Headline:
    """One result file's best numbers, for the tier comparison across files."""

    workload: str
    best: str
    write_gbps: float | None
    read_gbps: float | None

    def __post_init__(self) -> None:
        for rate in (self.write_gbps, self.read_gbps):
            if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                     or not math.isfinite(rate)):
                raise TypeError(f"headline {self.workload!r}: rate {rate!r} is not a number of GB/s")


@dataclass(frozen=True)
class Section:
    """What a renderer makes of one part of a result document: a title, prose lines, tables, figures."""

    title: str
    lines: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    figures: tuple[Figure, ...] = ()
    headline: Headline | None = None

    def __post_init__(self) -> None:
        for line in self.lines:
            if not isinstance(line, str):
                raise TypeError(f"section {self.title!r}: {line!r} where text belongs")


@dataclass(frozen=True)
class DocumentReport:
    """One result file, rendered: where it came from, what it measured on, its sections and warnings."""

    source: str
    schema: str
    title: str
    target: str
    created: str
    command: str | None
    environment: tuple[tuple[str, str], ...]
    verdict: str | None
    sections: tuple[Section, ...]
    warnings: tuple[tuple[str, str], ...]  # (message, remedy)
    where: str = ""  # the storage in a few words: "ext4 on /dev/vda", "s3 at http://rgw:7480"

    @property
    def headline(self) -> Headline | None:
        return next((s.headline for s in self.sections if s.headline is not None), None)


@dataclass(frozen=True)
class Report:
    title: str
    created: str
    tool_version: str
    overview: Section | None
    documents: tuple[DocumentReport, ...]

    @property
    def figures(self) -> list[Figure]:
        """Every figure in reading order (the Markdown writer numbers its PNG files this way)."""
        sections = ([self.overview] if self.overview else []) + [s for d in self.documents for s in d.sections]
        return [f for s in sections for f in s.figures]


def format_ranged(key: str, value: Any, span: Any) -> str:
    """``value`` with its range ``span`` ([low, high], either end may be None) as "point (low–high)"; the point
    alone when there is no range or both ends read the same as it."""
    point = format_value(key, value)
    if not isinstance(span, (list, tuple)) or len(span) != 2 or all(v is None for v in span):
        return point
    low, high = (format_value(key, v) if v is not None else "?" for v in span)
    return point if low == high == point else f"{point} ({low}–{high})"


def format_value(key: str, value: Any) -> str:
    """A JSON value as a table cell, its unit taken from the key's suffix (``_s``, ``_bytes``, ``_gbps``...)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return str(value)
        if key.endswith("_s"):
            return format_duration(value)
        if key.endswith("_bytes"):
            return format_size(value)
        if key.endswith("_gbps"):
            return f"{value:.2f} GB/s"
        if key.endswith("_bps"):
            return f"{value / 1e9:.2f} GB/s"
        if "usd" in key.split("_"):
            return format_usd(value) + (" per day" if key.endswith("_per_day") else "")
        if key.endswith("_fraction") or "_fraction_" in key or key in PERCENT_KEYS:
            return f"{value:.1%}" if value == 0 or abs(value) >= 0.01 else f"{value:.2%}"
        if key.endswith("_hours_per_day"):
            return f"{format_number(value)} h per day"
        if key.endswith("_hours"):
            return f"{format_number(value)} h"
        if key.endswith("_per_day"):
            return f"{format_number(value)} per day"
        return format_number(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(key, v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {format_value(k, v)}" for k, v in value.items())
    return str(value)


#: Keys whose value is a fraction though their name does not end in ``_fraction``.
PERCENT_KEYS = frozenset({"goodput", "interference", "mfu", "overhead", "waste", "local_loss"})


def format_usd(value: float) -> str:
    """``$1,075``, ``$2.50``, ``$22.05M``: whole dollars from 10, cents below, millions from 1M."""
    sign, amount = ("-" if value < 0 else ""), abs(value)
    if amount >= 1e6:
        return f"{sign}${amount / 1e6:,.2f}M"
    return f"{sign}${amount:,.0f}" if amount >= 10 else f"{sign}${amount:.2f}"


def format_number(value: float) -> str:
    """3 significant digits, integers as they are: ``1.7601`` -> ``1.76``, ``2729.16`` -> ``2729``."""
    if isinstance(value, int):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{value:.3g}"
