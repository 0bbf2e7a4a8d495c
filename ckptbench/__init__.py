"""ckptbench: checkpoint I/O benchmarking and tuning for large-scale ML training.

``ckptbench.save`` / ``ckptbench.load`` / ``ckptbench.Checkpointer`` are imported lazily so that
``import ckptbench`` (and the model commands) never pay for torch.
"""

from typing import Any

__version__ = "0.1.0"

_LAZY = {"save", "load", "Checkpointer", "SaveResult", "SaveHandle"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from ckptbench import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'ckptbench' has no attribute {name!r}")
