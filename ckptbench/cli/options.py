"""Pieces several commands share: reading a result file, and ``--from RESULT.json`` (a measurement instead of
hand-copied numbers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ckptbench import safeio
from ckptbench.cli import params
from ckptbench.cli.params import shown_path
from ckptbench.errors import UsageError


def read_result(path: Path) -> dict[str, Any]:
    """A result file as JSON; one-line UsageError when it is missing, not UTF-8, not JSON or absurdly nested."""
    try:
        text = safeio.read_text(path, safeio.MAX_RESULT_BYTES, "result file")
    except FileNotFoundError:
        raise UsageError(f"result file {shown_path(path)} does not exist") from None
    except UnicodeDecodeError:
        raise UsageError(f"{shown_path(path)} is not JSON (not UTF-8 text)") from None
    except OSError as exc:
        raise UsageError(f"cannot read {shown_path(path)}: {exc.strerror}") from None
    try:
        return json.loads(text, parse_constant=_non_finite)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{shown_path(path)} is not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # NaN/Infinity, or an integer too long to convert
        raise UsageError(f"{shown_path(path)} is not JSON ({exc})") from None
    except RecursionError:
        raise UsageError(f"{shown_path(path)} is not a ckptbench result (JSON nested too deeply to read)") from None


def _non_finite(constant: str) -> float:
    """``parse_constant`` for :func:`json.loads`: Python accepts NaN and Infinity, JSON does not."""
    raise ValueError(f"{constant} is not a JSON number")


def from_result_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--from RESULT.json``: take ``what`` from a measurement (bench, shoot-out, distributed or preflight)."""
    return click.option("--from", "from_result", type=params.RESULT_FILE, default=None, metavar="RESULT.json",
                        help=f"Take {what} from a result of `ckptbench bench` (a sweep, --workload checkpoint, under "
                             "torchrun) or `ckptbench preflight` instead of typing them.")


def measured_from(path: Path) -> Any:
    """The checkpoint rates a result file measured (``decide.advice.MeasuredRates``), its schema checked."""
    from ckptbench.decide.advice import rates_from_result

    return rates_from_result(str(path), read_result(path))
