"""Pieces several commands share: ``--from RESULT.json`` (a measurement instead of hand-copied numbers), and
the one reader of result files (``bench.records.read_result``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ckptbench.cli import params


def read_result(path: Path) -> dict[str, Any]:
    """:func:`ckptbench.bench.records.read_result`, imported when used: `interval` and `goodput` start
    without numpy."""
    from ckptbench.bench.records import read_result as read

    return read(path)


def from_result_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--from RESULT.json``: take ``what`` from a measurement (bench, shoot-out, distributed or preflight)."""
    return click.option("--from", "from_result", type=params.RESULT_FILE, default=None, metavar="RESULT.json",
                        help=f"Take {what} from a result of `ckptbench bench` (a sweep, --workload checkpoint, under "
                             "torchrun) or `ckptbench preflight` instead of typing them.")


def measured_from(path: Path) -> Any:
    """The checkpoint rates a result file measured (``decide.advice.MeasuredRates``), its schema checked."""
    from ckptbench.decide.advice import rates_from_result

    return rates_from_result(str(path), read_result(path))
