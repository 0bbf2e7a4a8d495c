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
is still queued there finds nothing yet and leaves that checkpoint behind). Not around ``async_=True``:
that wrapper never calls this plugin's ``teardown``, so the last save would still persist after ``fit``
and its error would be lost.

Limits:

- ``LightningModule.load_from_checkpoint`` reads with ``torch.load`` and never asks a CheckpointIO (on a
  ckptbench checkpoint, a directory, it fails with ``IsADirectoryError``): use this module's
  :func:`load_from_checkpoint` (``load_from_checkpoint(MyModel, path)``), which builds the module from the
  saved hyperparameters as Lightning does. ``Trainer(plugins=[CkptbenchCheckpointIO()])``'s
  ``fit``/``validate``/``test``/``predict`` with ``ckpt_path=`` read through the plugin.
- A path with nothing at it raises ``CheckpointNotFoundError``, a ``FileNotFoundError`` as Lightning's
  ``TorchCheckpointIO`` raises. A ``.ckpt`` file ``TorchCheckpointIO`` wrote (a run begun without this plugin)
  is read by ``torch.load`` with ``weights_only=True`` (unpickling only with ``allow_pickle``), and a save to its
  name replaces it, so such a run resumes with this plugin.
- ``map_location`` of ``load_checkpoint``: as ``torch.load``'s (a device, a dict, a function ``f(storage,
  location)``), except that None loads to the CPU and every tensor's location is ``"cpu"``: a checkpoint
  does not record the device it was saved from (Lightning moves the state where it belongs afterwards).
- Values other than those ckptbench saves (tensors, numpy, plain Python values, paths, Enum members,
  torch dtypes and devices, see ``ckptbench.save``) in ``hyper_parameters`` or callback states need
  ``allow_pickle=True``, which also lets loads unpickle them (never with ``weights_only=True``).
- Importing this module does not import torch or Lightning; the class is made on first access and
  says what to install when Lightning is missing (``pip install lightning``).
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
import types
from typing import TYPE_CHECKING, Any

from ckptbench import safeio
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.api import Checkpointer, SaveHandle
from ckptbench.checkpoint.manager import remove_checkpoint
from ckptbench.errors import MissingDependencyError, PickleNotAllowedError, UnsafeFileError, UsageError
from ckptbench.storage.store import open_store

__all__ = ["CkptbenchCheckpointIO", "load_from_checkpoint"]

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
        self._settings = {"threads": threads, "shard_size": shard_size, "block_size": block_size, "direct": direct,
                          "checksum": checksum}
        self._start()

    def _start(self) -> None:
        """The plugin's own state: its Checkpointer (staging memory), the save in flight, their lock."""
        self._checkpointer = Checkpointer(**self._settings)
        self._in_flight: tuple[str, SaveHandle] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Its settings only: a copy (``ddp_spawn`` pickles the Trainer's plugins into each process, a deepcopy)
        starts with a Checkpointer of its own and no save in flight."""
        state = self.__dict__.copy()
        for name in ("_checkpointer", "_in_flight", "_lock"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

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
        if storage_options is not None and not isinstance(storage_options, dict):
            raise UsageError(f"storage_options must be a dict (object-storage options), not "
                             f"{type(storage_options).__name__}", hint="pass a dict, or None for the plugin's own")
        self._raise_failed_save()
        options = storage_options if storage_options is not None else self.storage_options
        self._replace_torch_save_file(path, options)
        try:
            result = self._checkpointer.save(checkpoint, path, async_=self.async_, overwrite=True,
                                             storage_options=options, distributed=False,
                                             allow_pickle=self.allow_pickle)
        except UsageError as exc:
            if self.allow_pickle or "allow_pickle=True" not in (exc.hint or ""):
                raise
            # A value ckptbench does not store natively: say where this plugin's opt-in is.
            raise UsageError(exc.args[0], hint="CkptbenchCheckpointIO(allow_pickle=True) pickles it, and its loads "
                             "unpickle it: only for checkpoints from a source you trust") from None
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
        torch_file = _torch_save_file(open_store(path, self.storage_options).local_path)
        if torch_file is not None:
            return self._load_torch_save_file(path, torch_file, map_location, weights_only)
        try:
            return self._checkpointer.load(path, map_location, storage_options=self.storage_options,
                                           distributed=False, allow_pickle=self.allow_pickle,
                                           weights_only=weights_only is True)
        except PickleNotAllowedError as exc:
            if self.allow_pickle:
                raise  # Lightning asked for weights_only=True
            raise PickleNotAllowedError(exc.args[0], hint="CkptbenchCheckpointIO(allow_pickle=True) unpickles them: "
                                        "only for checkpoints from a source you trust") from None

    def _load_torch_save_file(self, path: str | os.PathLike, fd: int, map_location: Any,
                              weights_only: bool | None) -> dict[str, Any]:
        """A ``.ckpt`` TorchCheckpointIO wrote (a run begun without this plugin, resumed with it), read from
        ``fd`` by ``torch.load`` as TorchCheckpointIO reads it, but with ``weights_only=True`` unless this plugin
        has ``allow_pickle`` and Lightning does not ask for ``weights_only=True``."""
        import pickle

        import torch

        restricted = weights_only is True or not self.allow_pickle
        with os.fdopen(fd, "rb") as file:
            try:
                return torch.load(file, map_location=map_location, weights_only=restricted)
            except pickle.UnpicklingError as exc:
                if not restricted:
                    raise
                why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                hint = ("Lightning asked for weights_only=True" if self.allow_pickle else
                        "CkptbenchCheckpointIO(allow_pickle=True) unpickles it: only for checkpoints from a source "
                        "you trust")
                raise PickleNotAllowedError(f"{os.fspath(path)} is a torch.save file holding values that "
                                            f"torch.load(weights_only=True) refuses ({why})", hint=hint) from None

    def _replace_torch_save_file(self, path: str | os.PathLike, storage_options: dict | None) -> None:
        """Remove the file TorchCheckpointIO wrote at ``path`` (``last.ckpt`` of a run that switched to this
        plugin, saved again under its name), as TorchCheckpointIO replaces it; the save then writes the checkpoint
        directory there. Any other file stays, and the save refuses it."""
        local = open_store(path, storage_options).local_path
        if local is None:
            return
        try:
            if not stat.S_ISREG(os.lstat(local).st_mode) or not _written_by_torch_save(local):
                return
        except FileNotFoundError:
            return
        log.info("replacing %s, a file torch.save wrote, with a ckptbench checkpoint", local)
        local.unlink()

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Remove the checkpoint at ``path`` (only the files a save creates; the manifest first). A symlink
        there (``ModelCheckpoint(save_last="link")``'s ``last.ckpt``) is removed itself, never what it points to;
        so is a file ``torch.save`` wrote there (a ``.ckpt`` of ``TorchCheckpointIO`` from before a run switched
        to this plugin, which ``ModelCheckpoint`` still tracks), as ``TorchCheckpointIO`` would remove it. Any
        other file, a FIFO or a device is left alone, with a warning."""
        self._wait_for(path)
        store = open_store(path, self.storage_options)
        if store.local_path is not None:
            try:
                mode = os.lstat(store.local_path).st_mode
            except FileNotFoundError:
                return
            if stat.S_ISLNK(mode) or (stat.S_ISREG(mode) and _written_by_torch_save(store.local_path)):
                store.local_path.unlink()  # a link also as "link/" or file://link
                return
            if not stat.S_ISDIR(mode):
                log.warning("not removing %s: neither a checkpoint nor a file torch.save wrote", store.local_path)
                return
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


#: How a file ``torch.save`` wrote begins: its zip format (torch >= 1.6), or the legacy pickle's protocol 2.
_TORCH_SAVE_MAGIC = (b"PK\x03\x04", b"\x80\x02")


def _open_if_torch_save(path: os.PathLike | str) -> int | None:
    """A descriptor of the regular file ``path`` (opened without following a link or blocking on a FIFO
    swapped in) when it begins as a ``torch.save`` file does; else None. A failed read raises."""
    try:
        fd = safeio.open_regular(path)
    except (OSError, UnsafeFileError):
        return None
    try:
        if os.pread(fd, 4, 0).startswith(_TORCH_SAVE_MAGIC):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _written_by_torch_save(path: os.PathLike) -> bool:
    """Whether the regular file ``path`` begins as a ``torch.save`` file does (read without following a link
    or blocking on a FIFO swapped in)."""
    fd = _open_if_torch_save(path)
    if fd is None:
        return False
    os.close(fd)
    return True


def _torch_save_file(path: os.PathLike | None) -> int | None:
    """A descriptor of the local file ``path`` when it (or what a link there points to: ``save_last="link"``'s
    ``last.ckpt``) is a regular file that begins as a ``torch.save`` file does; else None."""
    if path is None:
        return None
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            return None
        return _open_if_torch_save(os.path.realpath(path))
    except OSError:
        return None


def load_from_checkpoint(cls: type, checkpoint_path: str | os.PathLike, map_location: Any | None = None,
                         strict: bool | None = None, *, allow_pickle: bool = False,
                         storage_options: dict | None = None, **kwargs: Any) -> Any:
    """``cls.load_from_checkpoint(checkpoint_path, ...)`` for a checkpoint :class:`CkptbenchCheckpointIO` wrote.

    Lightning's own ``load_from_checkpoint`` reads with ``torch.load`` and never asks a CheckpointIO. This reads
    the checkpoint with ckptbench, then builds the LightningModule (or LightningDataModule) as Lightning does:
    ``cls(**hyper_parameters, **kwargs)``, its ``on_load_checkpoint`` hook, ``load_state_dict(strict=...)``,
    and the module moved to the device of the loaded tensors.

    Args:
        cls: the LightningModule or LightningDataModule class.
        checkpoint_path: the checkpoint (a directory or URL).
        map_location: as for ``ckptbench.load`` (``torch.load``'s meaning; None loads to the CPU).
        strict: as Lightning's (None: the module's ``strict_loading``).
        allow_pickle: unpickle values the save pickled (only for checkpoints from a source you trust).
        storage_options: for object storage.
        **kwargs: hyperparameters that replace the saved ones, as Lightning's.
    """
    from ckptbench.checkpoint.api import load

    _classes()  # Lightning is installed, or a MissingDependencyError says how to install it
    from lightning.pytorch import LightningDataModule, LightningModule

    try:
        from lightning.pytorch.core.saving import _load_state
    except ImportError:
        raise MissingDependencyError("this Lightning has no lightning.pytorch.core.saving._load_state, which "
                                     "load_from_checkpoint builds the module with",
                                     hint="load with CkptbenchCheckpointIO().load_checkpoint(path) and "
                                          "model.load_state_dict(checkpoint['state_dict'])") from None
    if not (isinstance(cls, type) and issubclass(cls, LightningModule | LightningDataModule)):
        raise UsageError(f"load_from_checkpoint builds a LightningModule or LightningDataModule class, not {cls!r}")
    checkpoint = load(checkpoint_path, map_location, storage_options=storage_options, distributed=False,
                      allow_pickle=allow_pickle)
    checkpoint.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {})
    checkpoint[cls.CHECKPOINT_HYPER_PARAMS_KEY].update(kwargs)
    if issubclass(cls, LightningDataModule):
        return _load_state(cls, checkpoint, **kwargs)
    if strict is None and not hasattr(LightningModule, "strict_loading"):  # Lightning < 2.2: strict unless told
        strict = True
    model = _load_state(cls, checkpoint, strict=strict, **kwargs)
    import torch

    tensors = (t for t in checkpoint.get("state_dict", {}).values() if isinstance(t, torch.Tensor))
    first = next(tensors, None)
    return model if first is None else model.to(first.device)


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
