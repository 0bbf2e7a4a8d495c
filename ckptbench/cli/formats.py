"""``--format table|json|csv`` (``--json`` its alias), the same on every command, and the one place that writes
a command's document in the format asked for.

``table`` is for people (rich tables, text); ``json`` is the command's whole document; ``csv`` is one row per
configuration, writer or tier for results (columns: ``bench.rows.COLUMNS``, the same for every result
schema), and for ``interval``, ``goodput``, ``recommend`` and ``compare-results`` one row per interval,
scenario, setting or metric with the columns their ``CSV_COLUMNS`` name.
"""

from __future__ import annotations

import csv
import functools
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click

from ckptbench.errors import UsageError

FORMATS = ("table", "json", "csv")


def format_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--format`` and ``--json`` to a click command's function, which receives ``output_format``
    (one of :data:`FORMATS`) instead of either. ``--json --format csv`` is refused (exit 2)."""

    @functools.wraps(command)
    def with_format(*args: Any, **kwargs: Any) -> Any:
        as_json, chosen = kwargs.pop("json"), kwargs.pop("format")
        if as_json and chosen not in (None, "json"):
            raise UsageError(f"--json and --format {chosen} ask for two formats", hint="give one of them")
        kwargs["output_format"] = "json" if as_json else (chosen or "table")
        return command(*args, **kwargs)

    with_format = click.option(
        "--json", "json", is_flag=True, default=False, help="The same as --format json.")(with_format)
    return click.option(
        "--format", "format", type=click.Choice(FORMATS), default=None,
        help="Output on stdout: table (for people, the default), json (one JSON document) or csv (one row per "
             "configuration, writer or tier; columns in docs/FORMATS.md).")(with_format)


def emit(document: dict[str, Any], output_format: str, print_tables: Callable[[dict[str, Any]], None],
         csv_rows: Callable[[dict[str, Any]], tuple[Sequence[str], Iterable[dict[str, Any]]]] | None = None) -> None:
    """Write ``document`` to stdout as ``output_format`` asks: ``print_tables(document)``, the JSON document,
    or ``csv_rows(document)`` (columns and rows; default: :func:`result_rows`) as CSV."""
    if output_format == "json":
        click.echo(json.dumps(document, indent=2, allow_nan=False))
    elif output_format == "csv":
        columns, found = (csv_rows or result_rows)(document)
        write_csv(columns, found)
    else:
        print_tables(document)


def result_rows(document: dict[str, Any], source: str = "") -> tuple[Sequence[str], list[dict[str, Any]]]:
    """The CSV of a result document: ``bench.rows.COLUMNS`` and one row per configuration, writer or tier."""
    from ckptbench.bench.rows import COLUMNS, rows

    return COLUMNS, [row.columns() for row in rows(document, source)]


def write_csv(columns: Sequence[str], found: Iterable[dict[str, Any]]) -> None:
    """A header and the rows as CSV on stdout: None is an empty cell, booleans are true/false, floats in
    full precision."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    for row in found:
        writer.writerow([_cell(row.get(name)) for name in columns])
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return ";".join(_cell(v) for v in value)
    return str(value)
