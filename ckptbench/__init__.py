"""ckptbench: checkpoint I/O benchmarking and tuning for large-scale ML training.

``ckptbench.save`` / ``ckptbench.load`` / ``ckptbench.Checkpointer`` are imported lazily so that
``import ckptbench`` (and the model commands) never pay for torch. Every error a user may catch is
exported here, from :mod:`ckptbench.errors` (see the tree there).
"""

from ckptbench.errors import (
    CheckFailed,
    CheckpointExistsError,
    CheckpointLockedError,
    CheckpointNotFoundError,
    CkptbenchError,
    CommitOutcomeUnknown,
    CommitOutcomeUnknownError,
    CompetitorFailedError,
    ConfigError,
    CorruptCheckpointError,
    CowStagingError,
    DcpCheckpointExistsError,
    DrainStalledError,
    InsufficientMemoryError,
    InsufficientSpaceError,
    LockLostError,
    MissingDependencyError,
    NotACheckpointError,
    NotReadableHereError,
    OutcomeUnknownError,
    PickleNotAllowedError,
    RankFailedError,
    SettingError,
    StepNotFoundError,
    StorageIOError,
    TargetError,
    UnknownFormatError,
    UnknownTorchValueError,
    UnsafeFileError,
    UsageError,
)

__version__ = "0.1.0"

#: Names imported from ckptbench.checkpoint on first use (it imports torch).
_LAZY = ("save", "load", "Checkpointer", "SaveResult", "SaveHandle", "CheckpointManager")

__all__ = [
    *_LAZY,
    "CheckFailed",
    "CheckpointExistsError",
    "CheckpointLockedError",
    "CheckpointNotFoundError",
    "CkptbenchError",
    "CommitOutcomeUnknown",
    "CommitOutcomeUnknownError",
    "CompetitorFailedError",
    "ConfigError",
    "SettingError",
    "CorruptCheckpointError",
    "DcpCheckpointExistsError",
    "DrainStalledError",
    "InsufficientMemoryError",
    "InsufficientSpaceError",
    "LockLostError",
    "MissingDependencyError",
    "NotACheckpointError",
    "NotReadableHereError",
    "OutcomeUnknownError",
    "PickleNotAllowedError",
    "RankFailedError",
    "CowStagingError",
    "StepNotFoundError",
    "StorageIOError",
    "TargetError",
    "UnknownFormatError",
    "UnknownTorchValueError",
    "UnsafeFileError",
    "UsageError",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from ckptbench import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'ckptbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
