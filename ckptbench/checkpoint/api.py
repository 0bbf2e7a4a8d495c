"""The public surface of the checkpoint writer: ``save`` / ``load`` and the reusable :class:`Checkpointer`.

The save path is in ``saver.py`` (plan, stage, write, persist), the commit and the two-phase commit
under a launch in ``commit.py``, the load path (retry, verified read, ``into=``, fault-ahead) in
``loader.py``; a Checkpointer is the state they share (settings, staging arena, read buffer, plan cache).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from typing import Any

from ckptbench import knobs
from ckptbench.checkpoint import tuning
from ckptbench.checkpoint.distributed import World, current_world
from ckptbench.checkpoint.loader import LOAD_ATTEMPTS, _Loader
from ckptbench.checkpoint.plan import PlanCache
from ckptbench.checkpoint.ring import Ring
from ckptbench.checkpoint.saver import SaveHandle, SaveResult, _Saver
from ckptbench.checkpoint.stage import Arena
from ckptbench.errors import CheckpointExistsError, CommitOutcomeUnknown, CommitOutcomeUnknownError, UsageError
from ckptbench.storage.store import open_store

__all__ = ["LOAD_ATTEMPTS", "CheckpointExistsError", "Checkpointer", "CommitOutcomeUnknown", "CommitOutcomeUnknownError",
           "SaveHandle", "SaveResult", "load", "save"]


class Checkpointer(_Saver, _Loader):
    """Saves and loads checkpoints, keeping its staging memory between saves.

    Make one per training job and save through it every time: the host memory that staging copies
    the tensors into (one page-aligned arena, sized to the checkpoint) is allocated by the first
    save and reused by the next ones. A sync save of CPU tensors to a directory needs no copy of
    the checkpoint: it goes through a bounded staging ring (a few 64 MiB slots, each staged while
    the others are written; ``CKPTBENCH_STAGE_RING*``) and leaves the arena as it is. At most one save is in flight: a save started while the
    previous one persists first waits for it, and that wait counts as stall. ``close()`` (or the
    ``with`` block's end) waits for it and frees the arena.

    Args:
        threads: writer/reader threads of the engine, also its CRC-32C threads (default: the CPU count,
            2..8; ``CKPTBENCH_SAVE_THREADS``).
        shard_size: target bytes per shard file (default 256 MiB; ``CKPTBENCH_SAVE_SHARD_BYTES``).
            Tensors are balanced over about total / shard_size shards; a tensor is never split.
        block_size: bytes per I/O request (default 4 MiB; ``CKPTBENCH_SAVE_BLOCK_BYTES``).
        direct: True: O_DIRECT writes and reads where the filesystem allows (elsewhere the engine falls
            back to buffered I/O + fdatasync and the SaveResult says why); False: buffered + fdatasync;
            None (default): auto. ``threads``, ``block_size`` and ``direct`` left None are chosen per
            mount by ``checkpoint.tuning`` (measured once per mount and process; SaveResult.tuning
            says what and why); anything but None/True/False for ``direct`` is a TypeError.
        checksum: CRC-32C of every tensor in the manifest, verified by ``load`` (default True).

    Example::

        with ckptbench.Checkpointer() as ckpt:
            for step in range(steps):
                ...
                handle = ckpt.save(state, f"/ckpt/step-{step}", async_=True)  # returns after staging
            state = ckpt.load("/ckpt/step-99")
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        shard_size: int | None = None,
        block_size: int | None = None,
        direct: bool | None = None,
        checksum: bool = True,
    ) -> None:
        self._given = (threads, block_size, tuning.check_direct(direct))  # None: auto, per target
        self._tuning: tuning.Tuning | None = None
        self.threads = threads or knobs.SAVE_THREADS
        self.shard_size = shard_size or knobs.SAVE_SHARD_BYTES
        self.block_size = block_size or knobs.SAVE_BLOCK_BYTES
        self.direct = True if direct is None else direct
        self.checksum = checksum
        if self.threads < 1 or self.shard_size <= 0 or self.block_size <= 0:
            raise UsageError(f"threads ({self.threads}), shard_size ({self.shard_size}) and block_size "
                             f"({self.block_size}) must be positive")
        self._arena = Arena()
        self._ring = Ring()  # sync saves and bounded-memory loads: a few slots, not the whole checkpoint
        self._plans = PlanCache()  # the last save's plan, for the next save of the same layout
        self._read_buffer = Arena()
        self._in_flight: Future | None = None
        self._lock = threading.Lock()
        #: Seconds the last ``load`` spent reading and rebuilding this process's part (no waits for other ranks).
        self.last_load_s = 0.0

    # -- save ---------------------------------------------------------------------------------

    def save(self, state_dict: Any, path: str | os.PathLike, *, async_: bool = False,
             overwrite: bool = False, storage_options: dict | None = None,
             distributed: bool | None = None, allow_pickle: bool = False) -> SaveResult | SaveHandle:
        """Save ``state_dict`` to the directory ``path`` (created if missing).

        Sync: returns the SaveResult once the checkpoint is durable. Async: returns a SaveHandle
        after staging; the caller may then modify its tensors. Raises CheckpointExistsError when
        ``path`` holds a checkpoint and ``overwrite`` is False (nothing is written then).

        Args:
            state_dict: a dict of tensors (any device, nn.Parameter included), numpy arrays and
                plain values (numbers, str, bytes, None, lists, tuples incl. namedtuples, dicts incl.
                OrderedDict, sets, pathlib paths, Enum members), nested; tied tensors are stored once.
            path: a directory, or a URL (``s3://bucket/prefix``, any fsspec protocol).
            async_: return after staging with a SaveHandle; persist on a background thread.
            overwrite: replace a checkpoint already at ``path`` (it stays loadable until the new
                one commits).
            storage_options: for object storage (endpoint_url, key, secret, ...).
            distributed: None detects a torchrun/srun launch, False saves from this process alone,
                True requires a launch.
            allow_pickle: pickle values of any other type (loading them then needs
                ``allow_pickle=True`` too); without it they are refused, naming the key.

        Returns:
            SaveResult (sync) or SaveHandle (async).

        Under a torch.distributed launch (torchrun, srun; ``distributed=None`` detects it, False
        opts out) every rank calls ``save`` with its own state_dict and the same ``path``: each
        writes its own shards, and rank 0 commits one manifest for all of them only after every
        rank's shards are durable (two-phase commit). A rank that fails means no checkpoint; every
        rank raises, naming it. See ``checkpoint/commit.py``.

        One save at a time per path: while another save to ``path`` runs (another process or host,
        or another Checkpointer here), this one fails at once with CheckpointLockedError naming the
        holder (``checkpoint/lock.py``).

        Interrupted async saves: the interpreter's exit, also one caused by an uncaught Ctrl-C
        (KeyboardInterrupt) or ``sys.exit``, first completes a persist in flight (logged); a second
        Ctrl-C abandons it and ends the process at once: nothing is committed, the previous
        checkpoint stays, the next save to the path removes the partial files. A process killed
        outright (SIGKILL, SIGTERM without a handler) abandons it the same way.
        """
        t0 = time.perf_counter()
        _check_path(path, "save to")
        self._wait_in_flight()
        world = world_for(distributed)
        store = open_store(path, storage_options)
        if world is not None:
            return self._save_distributed(world, state_dict, path, store, async_, overwrite, t0, allow_pickle)
        return self._save_alone(state_dict, path, store, async_, overwrite, t0, allow_pickle)

    # -- load ---------------------------------------------------------------------------------

    def load(self, path: str | os.PathLike, map_location: Any = None, *, device: Any = None, verify: bool = True,
             into: dict | None = None, storage_options: dict | None = None,
             distributed: bool | None = None, rank: int | None = None, allow_pickle: bool = False,
             bounded_memory: bool = False, weights_only: bool | None = None, mmap: bool | None = None) -> dict:
        """The state_dict saved at ``path``: same structure, dtypes and shapes, bit-exact; containers
        and parameters come back as the types they were saved as (see :func:`state_dict_format.rebuild`).

        Args:
            path: the checkpoint directory or URL.
            map_location: as ``torch.load``'s (see :func:`load_device`): a device ("cpu", "cuda:1", a
                torch.device), a dict of locations, or a function ``f(storage, location)``; None: the CPU.
            device: where the tensors go ("cpu", "cuda", "cuda:1", a torch.device); the same as
                ``map_location`` given a device (only one of the two).
            verify: check every tensor's CRC-32C (CorruptCheckpointError names a mismatch).
            into: a state_dict of the same structure to load into, in place (see below).
            storage_options: for object storage.
            distributed: as for :meth:`save`.
            rank: in one process, load the part rank ``rank`` of a distributed save wrote.
            allow_pickle: unpickle entries a save with ``allow_pickle=True`` pickled. Without it a
                checkpoint holding any is refused (PickleNotAllowedError names them) before anything
                is read: unpickling runs code the checkpoint names; allow it only for a trusted one.
            bounded_memory: with ``into=`` (contiguous CPU tensors) in a directory (not on a network or
                FUSE mount): read through the bounded staging ring straight into ``into``'s tensors
                instead of a read buffer the size of the checkpoint (host memory: the ring's few
                slots). Every CRC-32C is still checked, but as the bytes arrive: a mismatch is raised
                once everything was read, with ``into`` holding what was read, and under a launch a
                rank's ``into`` changes even if another rank fails. Elsewhere it loads as without it.
            weights_only: as ``torch.load``'s, for its callers: True refuses pickled entries even with
                ``allow_pickle=True``; False does not unpickle by itself (``allow_pickle=True`` does);
                None: as ``allow_pickle`` says.
            mmap: as ``torch.load``'s, accepted for its callers: a CPU load's tensors are views of
                one fresh memory mapping either way, read in full, not pages of the shard files.

        Returns:
            dict: the state_dict (``into`` itself when given).

        Shards are read with the engine (O_DIRECT) into one aligned buffer, a group of ``threads``
        shards at a time; ``verify`` checks the CRC-32C of each group while the next one is read.
        Without ``into``, every tensor has a storage of its own, as after ``torch.load``: on CPU each
        is a view of exactly its bytes in a fresh buffer (no copies; a helper thread faults it in ahead
        of the reads; the buffer is freed with the last of them), on ``device`` a copy. With ``into`` (a
        state_dict of the same structure, e.g. the live model's), every tensor is copied into the
        matching preallocated tensor, on whatever device it lives (parameters included), every
        plain value that differs (a step counter) is put into its dict or list, the read buffer is
        the Checkpointer's own and reused across loads, and ``into`` is returned; an ``into`` that
        does not fit is refused before anything in it changes. ``verify`` checks every CRC-32C and
        names the tensor and shard of any mismatch (CorruptCheckpointError).

        A checkpoint saved by N ranks loads under a launch of N ranks (each gets its own part;
        rank 0 reads the manifest and hands it round, so node-local storage works too), or in one
        process with ``rank=K`` (that rank's part). Another world size is refused with the reason:
        resharding is not supported. A checkpoint that a save with ``overwrite=True`` replaces while
        it is read is loaded again, the new one (under a launch, by every rank together), at most
        ``LOAD_ATTEMPTS`` times.
        """
        _check_path(path, "load from")
        device = load_device(map_location, device)
        if not all(flag is None or isinstance(flag, bool) for flag in (weights_only, mmap)):
            raise UsageError(f"weights_only ({weights_only!r}) and mmap ({mmap!r}) must be True, False or None")
        if weights_only:
            allow_pickle = False  # torch's word for no unpickling
        store = open_store(path, storage_options)
        world = world_for(distributed) if rank is None else None
        if world is None:
            return self._load_latest(store, rank, device, verify, into, allow_pickle, bounded_memory)
        return self._load_distributed(world, store, device, verify, into, allow_pickle, bounded_memory)

    def close(self) -> None:
        """Wait for a save in flight, then free the staging arena and the read buffer (a later save
        allocates them again)."""
        self._wait_in_flight()
        self._arena.close()
        self._ring.close()
        self._plans.clear()
        self._read_buffer.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_device(map_location: Any, device: Any = None) -> Any:
    """Where a load puts its tensors, from ``torch.load``'s ``map_location`` or ckptbench's ``device``.

    A checkpoint does not record the device its tensors were saved from: every tensor is read into host
    memory, location ``"cpu"``, and goes on from there. So a device (str, torch.device) or None (the CPU)
    is where they go; a dict maps locations as ``torch.load``'s does, ``"cpu"`` included (any other
    location in it is not met: those tensors stay on the CPU); a function is called as ``torch.load``
    calls it, ``f(storage, "cpu")`` for each tensor's storage, and the storage it returns (None: the
    CPU's) holds the tensor. Anything else is a UsageError.
    """
    if map_location is not None and device is not None:
        raise UsageError(f"map_location ({map_location!r}) and device ({device!r}) both given",
                         hint="give one of them: they say the same thing")
    where = device if map_location is None else map_location
    if where is None:
        return "cpu"
    if isinstance(where, dict):
        where = where.get("cpu", "cpu")
    if callable(where) and not isinstance(where, str):
        return where
    import torch

    try:
        return torch.device(where)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"map_location {where!r} is not a device, a dict of devices or a function ({exc})",
                         hint="use 'cpu', 'cuda:0', a torch.device, {'cpu': 'cuda:0'} or f(storage, location)"
                         ) from None


def _check_path(path: Any, doing: str) -> None:
    """A UsageError for what is not a directory or URL (``torch.save``'s file objects, io.BytesIO)."""
    if isinstance(path, (str, os.PathLike)):
        return
    what = "a file object" if hasattr(path, "read") or hasattr(path, "write") else "a"
    raise UsageError(f"cannot {doing} {what} {type(path).__name__}: a ckptbench checkpoint is a directory "
                     "(shards and a manifest) or a URL, never one file or stream",
                     hint="give a directory path or URL; torch.save/torch.load handle file objects")


def world_for(distributed: bool | None) -> World | None:
    """The launch to coordinate with: detected (None), none (False), required (True)."""
    if distributed is False:
        return None
    world = current_world()
    if distributed and world is None:
        raise UsageError("distributed=True, but this process is not part of a launch of two or more ranks",
                         hint="start it with torchrun/srun, or leave distributed unset")
    return world


_default: Checkpointer | None = None
_default_lock = threading.Lock()


def _default_checkpointer() -> Checkpointer:
    global _default
    with _default_lock:
        if _default is None:
            _default = Checkpointer()
        return _default


def save(state_dict: Any, path: str | os.PathLike, *, async_: bool = False, threads: int | None = None,
         shard_size: int | None = None, direct: bool | None = None, checksum: bool = True,
         overwrite: bool = False, storage_options: dict | None = None,
         distributed: bool | None = None, allow_pickle: bool = False) -> SaveResult | SaveHandle:
    """Save ``state_dict`` to the directory ``path``; see :meth:`Checkpointer.save` for the arguments.

    With default settings a process-wide Checkpointer is reused, so its staging arena survives
    between calls (allocate once, save many). Custom settings (``threads``, ``shard_size``,
    ``direct``, ``checksum``, see :class:`Checkpointer`) use a one-off Checkpointer.

    Returns:
        SaveResult (sync: once durable) or SaveHandle (``async_=True``: once staged).
    """
    if threads is None and shard_size is None and direct is None and checksum:
        return _default_checkpointer().save(state_dict, path, async_=async_, overwrite=overwrite,
                                            storage_options=storage_options, distributed=distributed,
                                            allow_pickle=allow_pickle)
    ckpt = Checkpointer(threads=threads, shard_size=shard_size, direct=direct, checksum=checksum)
    return ckpt.save(state_dict, path, async_=async_, overwrite=overwrite, storage_options=storage_options,
                     distributed=distributed, allow_pickle=allow_pickle)


def load(path: str | os.PathLike, map_location: Any = None, *, device: Any = None, verify: bool = True,
         into: dict | None = None, storage_options: dict | None = None, distributed: bool | None = None,
         rank: int | None = None, allow_pickle: bool = False, bounded_memory: bool = False,
         weights_only: bool | None = None, mmap: bool | None = None) -> dict:
    """Load the checkpoint at ``path``; see :meth:`Checkpointer.load` for the arguments (``map_location``,
    ``weights_only`` and ``mmap`` as ``torch.load`` takes them, with their meaning here).

    Returns:
        dict: the state_dict, each tensor with a storage of its own as after ``torch.load``
        (``into`` itself when given).
    """
    return _default_checkpointer().load(path, map_location, device=device, verify=verify, into=into,
                                        storage_options=storage_options, distributed=distributed, rank=rank,
                                        allow_pickle=allow_pickle, bounded_memory=bounded_memory,
                                        weights_only=weights_only, mmap=mmap)
