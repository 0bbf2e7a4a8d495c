"""The error tree. Every error a user can cause or meet derives from :class:`CkptbenchError`.

``cli/`` catches the base class once and turns it into one red line on stderr and an exit code:
``exit_code`` 2 for bad input (nothing was done), 1 for a failed check or a runtime I/O failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class CkptbenchError(Exception):
    """Base class. ``hint`` (optional) tells the user how to fix it."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        msg = super().__str__()
        return f"{msg} ({self.hint})" if self.hint else msg


class UsageError(CkptbenchError):
    """Bad input: a value, option combination or preset that cannot be used. Nothing was done."""

    exit_code = 2


class ConfigError(UsageError):
    """A TOML config or preset that is missing, malformed or holds a bad value."""


class TargetError(UsageError):
    """A benchmark/checkpoint target that cannot be used (missing, not a directory, unwritable, unknown scheme)."""


class InsufficientSpaceError(UsageError):
    """The target has less free space than the run needs."""


class MissingDependencyError(UsageError):
    """An optional dependency is not installed; the message names what to install."""


class StorageIOError(CkptbenchError):
    """An I/O operation failed at run time (after validation passed)."""


class OutcomeUnknownError(StorageIOError):
    """A write failed without an answer: a request reached the store (or may have), but its response
    never came back, so it may have been stored all the same, now or a little later."""


class CheckFailed(CkptbenchError):
    """A pre-flight check failed; the command ran correctly but the verdict is FAIL."""


@contextmanager
def reading_document(where: str, schema: str) -> Iterator[None]:
    """What a malformed result document raises while it is read (a missing key, a wrong type, a value
    out of range, nesting too deep) as one UsageError naming the file."""
    try:
        yield
    except KeyError as exc:
        raise UsageError(f"{where}: not a well-formed {schema} document (no {exc.args[0]!r})") from exc
    except RecursionError as exc:
        raise UsageError(f"{where}: not a well-formed {schema} document (values nested too deeply)") from exc
    except (TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as exc:
        raise UsageError(f"{where}: not a well-formed {schema} document ({exc})") from exc
