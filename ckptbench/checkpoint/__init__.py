"""The checkpoint writer: plan (pure) -> stage (arena) -> write (engine) -> commit (manifest).

``save``/``load`` and :class:`Checkpointer` are the public API; ``ckptbench.save`` re-exports them.
"""

from ckptbench.checkpoint.api import Checkpointer, SaveHandle, SaveResult, load, save
from ckptbench.checkpoint.manager import CheckpointManager

__all__ = ["CheckpointManager", "Checkpointer", "SaveHandle", "SaveResult", "load", "save"]
