"""click parameter types built on ``units``: the one place flags and TOML values are validated.

Every type here refuses a bad value with ``click.BadParameter`` (one line, exit 2) whatever it is given:
a flag's string, or a ``--config`` TOML value of any type (number, boolean, array, table).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ckptbench import units
from ckptbench.config import MAX_BLOCK_BYTES, MAX_FILES, MAX_RUNS, MAX_RUNTIME_S, MAX_THREADS, MIN_SAMPLE_EVERY_S
from ckptbench.errors import UsageError


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


#: Values in one comma list or TOML array of a sweep option.
MAX_LIST_ITEMS = 256


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
        if len(items) > MAX_LIST_ITEMS:
            self.fail(f"{len(items)} values, more than a sweep takes ({MAX_LIST_ITEMS})", param, ctx)
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


def _duration_or_zero(value: Any) -> float:
    """A bounded duration, or zero (``0``, ``0s``, ``0m``): for costs the model allows to be nothing,
    such as a restart or a detection. Negative durations are refused. (Only the options of those
    costs take it: elsewhere a zero duration is a mistake, an interval or a checkpoint time.)"""
    return 0.0 if units.parse_duration(value, allow_zero=True) == 0 else _duration_in_range(value)


BOUNDED_DURATION_OR_ZERO = _UnitType("duration", _duration_or_zero)


def _duration_between(low: float, high: float) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        seconds = units.parse_duration(value)
        if not low <= seconds <= high:
            raise ValueError(f"duration {str(value)!r} must lie between {units.format_duration(low)} and "
                             f"{units.format_duration(high)}")
        return seconds
    return parse


#: A run by time (``--runtime``) and the timeline's interval (``--sample-every``).
RUNTIME = _UnitType("duration", _duration_between(MIN_SAMPLE_EVERY_S, MAX_RUNTIME_S))
SAMPLE_EVERY = _UnitType("duration", _duration_between(MIN_SAMPLE_EVERY_S, MAX_RUNTIME_S))


class Bounded(click.ParamType):
    """Another type's value, refused above ``at_most``; the error states the bound (``shown``)."""

    def __init__(self, inner: click.ParamType, at_most: float, shown: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.at_most = at_most
        self.shown = shown

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        converted = self.inner.convert(value, param, ctx)
        if converted > self.at_most:
            self.fail(f"{value!r} is more than {self.shown}, the most accepted", param, ctx)
        return converted


THREADS = Bounded(POSITIVE_INT, MAX_THREADS, f"{MAX_THREADS} threads")
FILES = Bounded(POSITIVE_INT, MAX_FILES, f"{MAX_FILES} files")
RUNS = Bounded(POSITIVE_INT, MAX_RUNS, f"{MAX_RUNS} runs")
WARMUP_RUNS = Bounded(NONNEGATIVE_INT, MAX_RUNS, f"{MAX_RUNS} runs")
BLOCK_SIZE = Bounded(SIZE, MAX_BLOCK_BYTES, units.format_size(MAX_BLOCK_BYTES))
THREADS_LIST = ListType(THREADS)
BLOCK_SIZE_LIST = ListType(BLOCK_SIZE)


# -- paths -----------------------------------------------------------------------------------------------


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as error messages name it: quoted and escaped (a newline stays on one line), long ones elided."""
    text = repr(os.fspath(path))
    return text if len(text) <= 80 else f"{text[:56]}...{text[-20:]}"


def _path_text(value: Any, what: str) -> str:
    """``value`` as a path string, or UsageError: a TOML number or table, a NUL byte."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise UsageError(f"{value!r} is not a {what} (a string)")
    if "\x00" in value:
        raise UsageError(f"{shown_path(value)} contains a NUL byte")
    return value


def _stat(path: str) -> os.stat_result | None:
    """``os.stat`` or None where nothing is there; UsageError for a name the system cannot look up."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return None
        raise UsageError(f"{shown_path(path)}: {exc.strerror}") from None


def check_output_file(value: Any, *, allow_dash: bool = False) -> Path:
    """A file a command will write (a PNG, a report), checked before any work, with nothing left behind.

    It must name a file, not a directory, in a directory that exists, and be writable there: an
    existing file must be writable; a new name is tried by creating the file and removing it again,
    which catches a name too long, a read-only filesystem, /proc and missing permissions alike.
    Raises UsageError naming the problem; returns the path.
    """
    text = _path_text(value, "file name")
    if allow_dash and text == "-":
        return Path(text)
    if not text:
        raise UsageError("an empty name is not a file", hint="give a file name")
    existing = _stat(text)
    if text.endswith(os.sep) or (existing is not None and os.path.isdir(text)):
        raise UsageError(f"{shown_path(text)} is a directory", hint="give a file name")
    parent = os.path.dirname(text) or "."
    if not os.path.isdir(parent):
        raise UsageError(f"{shown_path(text)}: directory {shown_path(parent)} does not exist")
    if existing is not None:
        if not os.access(text, os.W_OK):
            raise UsageError(f"{shown_path(text)} is not writable")
        return Path(text)
    # The probe is created and removed through one descriptor of the directory: a directory renamed, or
    # swapped for a symlink, between the two cannot turn the removal onto another directory's file.
    name = os.path.basename(text)
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{shown_path(text)}: directory {shown_path(parent)} cannot be opened ({exc.strerror})") from None
    try:
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=parent_fd))
        except FileExistsError:
            # Created since the stat: another process checks the same name (every rank of a torchrun
            # launch validates its options) and is about to remove its probe. The name can be created.
            return Path(text)
        except OSError as exc:
            raise UsageError(f"{shown_path(text)} cannot be written ({exc.strerror})") from None
        with contextlib.suppress(FileNotFoundError):  # (removed by such a process already)
            os.unlink(name, dir_fd=parent_fd)
    finally:
        os.close(parent_fd)
    return Path(text)


def check_output_dir(value: Any) -> Path:
    """A directory a command will write result files into (created, with its parents, when missing).

    Checked here: it is a string without NUL whose existing part is a directory. Whether it can
    really be created and written is found when the result file is opened, before the run.
    """
    text = _path_text(value, "directory name")
    existing = _stat(text or ".")
    if existing is not None and not os.path.isdir(text or "."):
        raise UsageError(f"{shown_path(text)} is not a directory")
    return Path(text)


def check_input_file(value: Any, what: str) -> Path:
    """A file a command will read (a result, a config), checked to exist and be a file before any work."""
    text = _path_text(value, "file name")
    if not text:
        raise UsageError(f"an empty name is not a {what}", hint="give a file name")
    if _stat(text) is None:
        raise UsageError(f"{what} {shown_path(text)} does not exist")
    if os.path.isdir(text):
        raise UsageError(f"{what} {shown_path(text)} is a directory, not a file")
    return Path(text)


class _PathType(click.ParamType):
    """A click type around one of the checks above: its UsageError becomes BadParameter (exit 2)."""

    def __init__(self, name: str, check: Callable[[Any], Path]) -> None:
        self.name = name
        self._check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self._check(value)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


#: --plot, --html, --markdown: a file written after the work, checked before it
OUTPUT_FILE = _PathType("file", check_output_file)
#: report --html, where '-' is stdout
OUTPUT_FILE_OR_DASH = _PathType("file", lambda v: check_output_file(v, allow_dash=True))
#: --output: a directory for result files
OUTPUT_DIR = _PathType("directory", check_output_dir)
#: RESULT.json arguments of report and recommend
RESULT_FILE = _PathType("file", lambda v: check_input_file(v, "result file"))
#: the group's --config
CONFIG_FILE = _PathType("file", lambda v: check_input_file(v, "config file"))
# The parsers reject infinite and overflowing values ("must be finite") themselves.
FINITE_SIZE, FINITE_RATE, FINITE_COUNT, FINITE_POSITIVE_NUMBER = SIZE, RATE, COUNT, POSITIVE_NUMBER
