"""The error tree. Every error a user can cause or meet derives from :class:`CkptbenchError`, is defined
here, and is exported from ``ckptbench`` (``from ckptbench import CorruptCheckpointError``)::

    CkptbenchError
    ├── UsageError                      bad input; nothing was done (exit 2)
    │   ├── ConfigError
    │   │   └── SettingError            a CKPTBENCH_* environment setting that is not a valid value (a ValueError too)
    │   ├── TargetError
    │   ├── InsufficientSpaceError
    │   ├── InsufficientMemoryError
    │   ├── UnsafeFileError
    │   ├── MissingDependencyError
    │   ├── CheckpointExistsError
    │   │   └── DcpCheckpointExistsError    (a RuntimeError too, as torch's FileSystemWriter raises)
    │   ├── StepNotFoundError           a CheckpointManager step that is not committed
    │   └── PickleNotAllowedError       a load of pickled entries without allow_pickle=True
    ├── StorageIOError                  an I/O operation failed at run time
    │   ├── OutcomeUnknownError
    │   ├── CommitOutcomeUnknownError   (also reachable as CommitOutcomeUnknown)
    │   ├── DrainStalledError           a copy to the remote tier made no progress
    │   └── CompetitorFailedError       a competitor writer's own failure in the writer shoot-out
    ├── NotACheckpointError             (exit 2)
    │   └── CheckpointNotFoundError     nothing at all at the path (a FileNotFoundError too, as torch.load's)
    ├── CorruptCheckpointError
    ├── CheckpointLockedError
    │   └── LockLostError
    ├── RankFailedError
    ├── CowStagingError
    └── CheckFailed

``cli/`` catches the base class once and turns it into one red line on stderr and an exit code:
``exit_code`` 2 for bad input (nothing was done), 1 for a failed check or a runtime I/O failure.
The engine (``ckptbench.native``) raises ``OSError`` with errno and path.
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


class SettingError(ConfigError, ValueError):
    """A ``CKPTBENCH_*`` environment setting (``ckptbench.knobs``) that is not a number in its range."""


class TargetError(UsageError):
    """A benchmark/checkpoint target that cannot be used (missing, not a directory, unwritable, unknown scheme)."""


class InsufficientSpaceError(UsageError):
    """The target has less free space than the run needs."""


class UnsafeFileError(UsageError):
    """A path ckptbench refuses to open: a symlink, FIFO, device or socket where a regular file (or a
    directory) belongs, or a document larger than any ckptbench writes (``ckptbench/safeio.py``)."""


class MissingDependencyError(UsageError):
    """An optional dependency is not installed; the message names what to install."""


class InsufficientMemoryError(UsageError):
    """Not enough host memory for the staging arena."""


class CheckpointExistsError(UsageError):
    """The target already holds a committed checkpoint and ``overwrite`` was not given."""

    @classmethod
    def at(cls, url: str) -> CheckpointExistsError:
        return cls(f"{url} already holds a checkpoint",
                   hint="pass overwrite=True to replace it (the old one stays valid until the new one commits)")


class DcpCheckpointExistsError(CheckpointExistsError, RuntimeError):
    """A DCP save with ``overwrite=False`` found a checkpoint there; a RuntimeError too, with torch's
    words, as torch's ``FileSystemWriter`` raises (``ckptbench.integrations.dcp.Writer``)."""


class StepNotFoundError(UsageError):
    """A ``CheckpointManager`` was asked for a step that is not committed under its root; the message
    lists the steps that are."""


class PickleNotAllowedError(UsageError):
    """A checkpoint holds pickled entries and the load was not given ``allow_pickle=True``; the message
    names them. Unpickling runs code the checkpoint names: only for checkpoints one trusts."""


class StorageIOError(CkptbenchError):
    """An I/O operation failed at run time (after validation passed)."""


class DrainStalledError(StorageIOError):
    """A drain to the remote tier made no progress for its timeout (the remote tier stopped answering,
    say): its process was stopped; the step stays undrained and is retried."""


class CompetitorFailedError(StorageIOError):
    """A competitor writer's own failure in the writer shoot-out (``bench --workload checkpoint``): its save,
    load or async save raised, or what it loaded differs from what it saved. The shoot-out records it and
    goes on without that writer."""


class OutcomeUnknownError(StorageIOError):
    """A write failed without an answer: a request reached the store (or may have), but its response
    never came back, so it may have been stored all the same, now or a little later."""


class CommitOutcomeUnknownError(StorageIOError):
    """The manifest write failed and could not be read back: committed or not, nobody knows yet."""


#: The same class under the name code written against earlier releases catches.
CommitOutcomeUnknown = CommitOutcomeUnknownError


class NotACheckpointError(CkptbenchError):
    """The path holds no committed checkpoint (no manifest, or one that cannot be read)."""

    exit_code = 2


class CheckpointNotFoundError(NotACheckpointError, FileNotFoundError):
    """Nothing at all at the path a load was given: a FileNotFoundError too, as ``torch.load`` and Lightning's
    ``TorchCheckpointIO`` raise for a missing file, so a loop's ``except FileNotFoundError`` (start afresh)
    works the same."""


class CorruptCheckpointError(CkptbenchError):
    """A committed checkpoint whose data does not match its manifest (checksum or size)."""


class NotReadableHereError(CkptbenchError):
    """A checkpoint that may well be intact but that this ckptbench or torch cannot read: raised as
    :class:`UnknownFormatError` or :class:`UnknownTorchValueError`. A CheckpointManager never counts such a
    step as damaged (it is not replaced without ``overwrite``)."""


class UnknownFormatError(NotACheckpointError, NotReadableHereError):
    """A manifest of another ckptbench checkpoint format (a newer ckptbench's)."""


class UnknownTorchValueError(CorruptCheckpointError, NotReadableHereError):
    """A torch dtype or device (saved as a value) that this torch does not have."""


class CheckpointLockedError(CkptbenchError):
    """Another save (another process, or another Checkpointer here) is writing to the same location."""


class LockLostError(CheckpointLockedError):
    """The save lost its lock before the commit (lease taken over, or the save was abandoned at exit)."""


class RankFailedError(CkptbenchError):
    """Another rank of the launch failed, died or did not answer in time; the message names it."""

    exit_code = 1


class CowStagingError(CkptbenchError):
    """The tensors changed under a copy-on-write staging in a way it cannot keep up with (freed, moved)."""


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
