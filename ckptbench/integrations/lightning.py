"""A Lightning ``CheckpointIO`` backed by ckptbench's writer: :class:`CkptbenchCheckpointIO`.

    from lightning.pytorch import Trainer
    from ckptbench.integrations.lightning import CkptbenchCheckpointIO

    trainer = Trainer(plugins=[CkptbenchCheckpointIO(async_=True)])
    trainer.fit(model)                                  # ModelCheckpoint saves through ckptbench
    trainer.fit(model, ckpt_path="checkpoints/last.ckpt")  # resume

Every ``.ckpt`` Lightning asks for is a ckptbench checkpoint **directory** at that path (shards and a
manifest; ``ckptbench.load(path)`` reads it), written durably (fdatasync + directory fsync, manifest
last). With ``async_=True``, ``save_checkpoint`` returns once the state is staged (copy-on-write where
the kernel allows), as Lightning's ``AsyncCheckpointIO`` contract asks: an error of a save in flight
is raised by the next ``save_checkpoint`` or by ``teardown``, which waits for it. Lightning's own
``AsyncCheckpointIO(CkptbenchCheckpointIO())`` works too (it clones every tensor on the training thread
first, then saves on a thread of its own; a removal ModelCheckpoint asks for while the save it removes
is still queued there finds nothing yet and leaves that checkpoint behind).

Limits:

- ``LightningModule.load_from_checkpoint`` and ``Trainer(...).test(ckpt_path=...)`` on another machine
  read with ``torch.load`` where they bypass the CheckpointIO (``load_from_checkpoint`` always does):
  load with ``CkptbenchCheckpointIO().load_checkpoint(path)`` and ``model.load_state_dict(ckpt["state_dict"])``
  instead.
- ``map_location`` of ``load_checkpoint``: as ``torch.load``'s (a device, a dict, a function ``f(storage,
  location)``), except that None loads to the CPU and every tensor's location is ``"cpu"``: a checkpoint
  does not record the device it was saved from (Lightning moves the state where it belongs afterwards).
- Values other than those ckptbench saves (tensors, numpy, plain Python values, paths, Enum members,
  see ``ckptbench.save``) in ``hyper_parameters`` or callback states need ``allow_pickle=True``, which
  also lets loads unpickle them (never with ``weights_only=True``).
- Importing this module does not import torch or Lightning; the class is made on first access and
  says what to install when Lightning is missing (``pip install lightning``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import types
from typing import TYPE_CHECKING, Any

from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.api import Checkpointer, SaveHandle
from ckptbench.checkpoint.manager import remove_checkpoint
from ckptbench.errors import MissingDependencyError
from ckptbench.storage.store import open_store

__all__ = ["CkptbenchCheckpointIO"]

log = logging.getLogger(__name__)

#: Longest wait of ``remove_checkpoint`` for a save of that checkpoint still running elsewhere.
REMOVE_WAIT_S = 600.0


class _CkptbenchCheckpointIO:
    """Lightning CheckpointIO that saves and loads through a :class:`ckptbench.Checkpointer`.

    Args:
        async_: save in the background once the state is staged (see the module docstring).
        allow_pickle: pickle values ckptbench does not store natively, and unpickle them on load
            (unless Lightning asks for ``weights_only=True``).
        storage_options: for object-storage paths (``s3://...``), as for ``ckptbench.save``.
        threads, shard_size, block_size, direct, checksum: the Checkpointer's settings.
    """

    def __init__(self, *, async_: bool = False, allow_pickle: bool = False, storage_options: dict | None = None,
                 threads: int | None = None, shard_size: int | None = None, block_size: int | None = None,
                 direct: bool | None = None, checksum: bool = True) -> None:
        super().__init__()
        self.async_ = async_
        self.allow_pickle = allow_pickle
        self.storage_options = storage_options
        self._checkpointer = Checkpointer(threads=threads, shard_size=shard_size, block_size=block_size,
                                          direct=direct, checksum=checksum)
        self._in_flight: tuple[str, SaveHandle] | None = None
        self._lock = threading.Lock()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        """Save ``checkpoint`` as a ckptbench checkpoint directory at ``path`` (replacing one there).

        Args:
            checkpoint: the state Lightning collected.
            path: where (``.../epoch=0-step=10.ckpt``; becomes a directory).
            storage_options: object-storage options for this save (else the plugin's).

        Raises:
            The error of the previous async save, if it failed (nothing of this save is written then).
        """
        self._raise_failed_save()
        options = storage_options if isinstance(storage_options, dict) else self.storage_options
        result = self._checkpointer.save(checkpoint, path, async_=self.async_, overwrite=True,
                                         storage_options=options, distributed=False, allow_pickle=self.allow_pickle)
        if isinstance(result, SaveHandle):
            with self._lock:
                self._in_flight = (os.fspath(path), result)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Load the checkpoint at ``path`` (waiting for a save of it still in flight).

        Args:
            path: a checkpoint this plugin (or ``ckptbench.save``) wrote.
            map_location: as ``torch.load``'s: a device, a dict, a function, or None for the CPU
                (``ckptbench.checkpoint.api.load_device``).
            weights_only: True refuses pickled entries even with ``allow_pickle``.

        Returns:
            dict: the checkpoint, as it was saved.
        """
        self._wait_for(path)
        return self._checkpointer.load(path, map_location, storage_options=self.storage_options, distributed=False,
                                       allow_pickle=self.allow_pickle, weights_only=weights_only is True)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Remove the checkpoint at ``path`` (only the files a save creates; the manifest first)."""
        self._wait_for(path)
        store = open_store(path, self.storage_options)
        if store.size(mf.MANIFEST_NAME) is None and not store.list():
            return
        # A save of it may still run on another thread (Lightning's AsyncCheckpointIO): removed after it.
        remove_checkpoint(store, "removed by Lightning", wait_s=REMOVE_WAIT_S)

    def teardown(self) -> None:
        """Wait for a save in flight and raise its error, if any; the staging memory stays for the next fit."""
        self._raise_failed_save(wait=True)

    def _wait_for(self, path: str | os.PathLike) -> None:
        with self._lock:
            in_flight = self._in_flight
        if in_flight is not None and in_flight[0] == os.fspath(path):
            self._raise_failed_save(wait=True)

    def _raise_failed_save(self, wait: bool = False) -> None:
        with self._lock:
            in_flight = self._in_flight
            if in_flight is None or not (wait or in_flight[1].done()):
                return
            self._in_flight = None
        in_flight[1].result()  # its error, if it failed

    def close(self) -> None:
        """Wait for a save in flight, then free the staging memory."""
        try:
            self.teardown()
        finally:
            self._checkpointer.close()


@functools.cache
def _classes() -> dict[str, type]:
    try:
        from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    except ImportError:
        try:
            from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
        except ImportError:
            raise MissingDependencyError("ckptbench.integrations.lightning needs Lightning, which is not installed",
                                         hint="pip install lightning") from None

    def body(namespace: dict[str, Any]) -> None:
        namespace.update(__module__=__name__, __qualname__="CkptbenchCheckpointIO",
                         __doc__=_CkptbenchCheckpointIO.__doc__)

    return {"CkptbenchCheckpointIO": types.new_class("CkptbenchCheckpointIO", (_CkptbenchCheckpointIO, CheckpointIO),
                                                     exec_body=body)}


def __getattr__(name: str) -> Any:
    if name == "CkptbenchCheckpointIO":
        cls = _classes()[name]
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:

    class CkptbenchCheckpointIO(_CkptbenchCheckpointIO): ...
