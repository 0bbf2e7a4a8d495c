"""``save`` / ``load`` and the reusable :class:`Checkpointer` (the common training-loop use).

Call sequence of a save (each step's result feeds the next; only step 2 blocks an async caller):

1. plan   - flatten the state_dict, lay tensors out in shards (pure, ``plan.plan_save``)
2. stage  - copy every tensor into the reused host arena (``stage.stage``); ``stall_s`` ends here
3. write  - the engine writes the shards from the arena, O_DIRECT where possible, each file
            fdatasynced and the directory fsynced; CRC-32C of every tensor computed alongside
4. commit - the manifest, written to a temp name, fsynced, renamed, directory fsynced. Only now does
            the checkpoint exist; ``persist_s`` (staging end -> durable) ends here.

A save never touches the files of a committed checkpoint: shards carry a per-save id, and the files
of the previous checkpoint are removed only after the new manifest is committed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from ckptbench import __version__, interrupts, knobs, native, safeio
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.distributed import RankFailedError, World, current_world
from ckptbench.checkpoint.lock import CheckpointLockedError, SaveLock, acquire_save_lock
from ckptbench.checkpoint.plan import CHECKSUM_BLOCK_BYTES, PlanCache, SavePlan, rebuild, refuse_pickled
from ckptbench.checkpoint.stage import (
    Arena,
    CopyBehind,
    SnapshotError,
    available_memory_bytes,
    copy_values,
    dtype_of,
    stage,
    typed_view,
)
from ckptbench.errors import (
    CheckpointExistsError,
    CommitOutcomeUnknown,
    InsufficientMemoryError,
    InsufficientSpaceError,
    OutcomeUnknownError,
    StorageIOError,
    UnsafeFileError,
    UsageError,
)
from ckptbench.interrupts import QuietThread, Workers
from ckptbench.storage.store import Store, WriteReport, open_store
from ckptbench.units import format_size

log = logging.getLogger(__name__)


#: Seconds between re-reads of the manifest after a write whose answer was lost (it may land late).
COMMIT_RECHECK_S = (0.1, 0.3, 0.6, 1.0)
#: Loads of a checkpoint that a save with overwrite=True keeps replacing, before giving up.
LOAD_ATTEMPTS = 3
#: Load failures a replacing save can cause (its sweep removes the shards being read); the manifest decides.
_MAYBE_REPLACED = (mf.CorruptCheckpointError, OSError, StorageIOError)


def _current_manifest(store: Store) -> dict | None:
    try:
        return mf.read_manifest(store)
    except mf.NotACheckpointError:
        return None


@dataclass(frozen=True)
class SaveResult:
    """What a save did, returned by a sync save and by ``SaveHandle.result()``.

    Attributes:
        path: where the checkpoint is (URL or directory).
        bytes: tensor bytes this process wrote; files: shards + manifest; tensors: how many.
        stall_s: seconds the caller was blocked (plan + stage, plus any wait for a previous save).
        persist_s: seconds from staging's end to the durable commit.
        threads, shard_size, block_size, direct, checksum: the settings used; ``direct`` says whether
            O_DIRECT was used (``direct_fallback_reason`` says why not, where it was asked for).
        sync: how durability was reached ("fdatasync", or the object store's completed uploads).
        total_s, gbps (properties): stall + persist, and bytes / that in GB/s (1e9 bytes/s).
        to_dict(): every field plus total_s and gbps, JSON-ready.
    """

    path: str
    bytes: int
    files: int
    tensors: int
    stall_s: float
    persist_s: float
    threads: int
    shard_size: int
    block_size: int
    direct: bool
    sync: str
    checksum: bool
    direct_fallback_reason: str | None = None
    #: Under a distributed launch: this rank, the launch's size, and the bytes of all ranks together
    #: (``bytes`` and the times are this rank's own).
    rank: int = 0
    world_size: int = 1
    world_bytes: int | None = None
    #: From this process's shards being durable to the save returning: the manifest commit, and under
    #: a launch the wait for the other ranks and for rank 0's commit. Part of ``persist_s``.
    commit_s: float = 0.0
    #: This process's own work, without waits for others: planning + staging, and writing its shards.
    stage_s: float = 0.0
    write_s: float = 0.0
    #: The plan of the save before was reused: the state_dict was laid out the same way (a training
    #: loop's next save; ``Checkpointer`` only, see ``plan.PlanCache``).
    plan_reused: bool = False
    #: How the host tensors were staged: "copy" (before the caller went on, or the write began) or
    #: "copy-on-write" (their pages write-protected and copied behind the caller, the write following
    #: the copy; see ``stage.CopyBehind``), and how many of the caller's writes waited for a page.
    staging: str = "copy"
    cow_faults: int = 0

    @property
    def total_s(self) -> float:
        return self.stall_s + self.persist_s

    @property
    def gbps(self) -> float:
        return self.bytes / self.total_s / 1e9 if self.total_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_s": self.total_s, "gbps": self.gbps}


class SaveHandle:
    """An asynchronous save in flight, returned by ``save(..., async_=True)`` once the caller may change
    its tensors; ``result()`` blocks until the checkpoint is durable (committed) and returns its SaveResult."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def done(self) -> bool:
        """Whether the save has finished (committed or failed); never blocks.

        Returns:
            bool
        """
        return self._future.done()

    def result(self, timeout: float | None = None) -> SaveResult:
        """Wait for the save to be durable.

        Args:
            timeout: seconds to wait at most (None: as long as it takes).

        Returns:
            SaveResult: what the save did.

        Raises:
            The save's own error (nothing was committed then), or TimeoutError.
        """
        return interrupts.result_of(self._future, timeout)


def _require_memory(store: Store, nbytes: int) -> None:
    """Refuse a load whose read buffer (``nbytes``, what the manifest and the shards' sizes claim) is
    more than the host has available, before allocating it."""
    available = available_memory_bytes()
    if available is not None and nbytes > available:
        raise InsufficientMemoryError(
            f"loading {store.url} needs {format_size(nbytes)} of host memory for its shards but only "
            f"{format_size(available)} is available", hint="free memory, or load on a host with more")


def _agreed_url(store: Store) -> str:
    """The location the ranks compare: a path inside a directory held open by descriptor (a bench's
    scratch directory, ``/proc/PID/fd/N/...``, different in every process) as the real path it names."""
    return os.path.realpath(store.url) if store.local_path is not None and safeio.is_fd_path(store.url) else store.url


def _require_free(store: Store, nbytes: int) -> None:
    free = store.free_bytes()
    if free is not None and free < nbytes:
        raise InsufficientSpaceError(
            f"{store.url} has {format_size(free)} free but the checkpoint needs {format_size(nbytes)}",
            hint="free space or save elsewhere",
        )


def _out_of_space(store: Store, needed_bytes: int, exc: OSError) -> InsufficientSpaceError:
    """The error for a save that ran out of space (or quota) while writing its shards; they are removed
    by then (``Store.write_files``), so the free space it reports is what a retry would find."""
    try:
        free = store.free_bytes()
    except OSError:
        free = None
    full = "exceeded its disk quota" if exc.errno == errno.EDQUOT else "ran out of space"
    has = "the free space is unknown" if free is None else f"{format_size(free)} is free now"
    return InsufficientSpaceError(
        f"{store.url} {full} while writing the checkpoint: it needs {format_size(needed_bytes)}, {has}; "
        f"nothing was committed and the partial shards were removed",
        hint="free space or save elsewhere; a checkpoint committed earlier is intact")


class Checkpointer:
    """Saves and loads checkpoints, keeping its staging arena between saves.

    Make one per training job and save through it every time: the host memory that staging copies
    the tensors into (one page-aligned arena, sized to the checkpoint) is allocated by the first
    save and reused by the next ones. At most one save is in flight: a save started while the
    previous one persists first waits for it, and that wait counts as stall. ``close()`` (or the
    ``with`` block's end) waits for it and frees the arena.

    Args:
        threads: writer/reader threads of the engine, also its CRC-32C threads (default: the CPU count,
            2..8; ``CKPTBENCH_SAVE_THREADS``).
        shard_size: target bytes per shard file (default 256 MiB; ``CKPTBENCH_SAVE_SHARD_BYTES``).
            Tensors are balanced over about total / shard_size shards; a tensor is never split.
        block_size: bytes per I/O request (default 4 MiB; ``CKPTBENCH_SAVE_BLOCK_BYTES``).
        direct: O_DIRECT writes and reads where the filesystem allows (default True); elsewhere the
            engine falls back to buffered I/O + fdatasync and the SaveResult says why.
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
        self.threads = threads or knobs.SAVE_THREADS
        self.shard_size = shard_size or knobs.SAVE_SHARD_BYTES
        self.block_size = block_size or knobs.SAVE_BLOCK_BYTES
        self.direct = True if direct is None else direct
        self.checksum = checksum
        if self.threads < 1 or self.shard_size <= 0 or self.block_size <= 0:
            raise UsageError(f"threads ({self.threads}), shard_size ({self.shard_size}) and block_size "
                             f"({self.block_size}) must be positive")
        self._arena = Arena()
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
        rank raises, naming it. See :meth:`_persist_distributed`.

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
        self._wait_in_flight()
        world = _world_for(distributed)
        store = open_store(path, storage_options)
        if world is not None:
            return self._save_distributed(world, state_dict, path, store, async_, overwrite, t0, allow_pickle)
        if not store.is_dir_like():
            raise UsageError(f"{os.fspath(path)!r} is a file; a checkpoint is a directory")
        if store.size(mf.MANIFEST_NAME) is not None and not overwrite:
            raise CheckpointExistsError.at(store.url)
        save_id = secrets.token_hex(4)
        planning = time.perf_counter()
        plan, tensors = self._plans.plan(state_dict, self.shard_size, shard_prefix=f"shard-{save_id}",
                                         allow_pickle=allow_pickle)
        plan_s = time.perf_counter() - planning
        store.prepare()
        # Held from before the first shard write until the stale files are removed (async: released
        # by the persist thread): a concurrent save to this path fails here, not after losing its shards.
        try:
            lock = acquire_save_lock(store)
        except BaseException:
            store.abandon()  # the directories it created go again, where empty
            raise
        try:
            if store.size(mf.MANIFEST_NAME) is not None and not overwrite:  # committed while we planned
                raise CheckpointExistsError(f"{store.url} already holds a checkpoint (a save just committed it)",
                                            hint="pass overwrite=True to replace it")
            _require_free(store, plan.total_bytes)
            staging = time.perf_counter()
            with self._lock:
                behind = stage(plan, tensors, self._arena, self.threads, cow=_stages_behind(async_, store))
            stage_s = plan_s + time.perf_counter() - staging
        except BaseException:
            lock.release()
            store.abandon()
            raise
        del tensors  # the arena holds the bytes now (or `behind` holds them until it has copied them)
        stall_s = time.perf_counter() - t0
        if not async_:
            try:
                with lock:
                    return self._persist(plan, store, save_id, stall_s, time.perf_counter(), lock, stage_s, behind)
            except BaseException:
                store.abandon()
                raise
        future: Future = Future()
        staged_at = time.perf_counter()

        def run() -> None:
            try:
                with lock:  # released before the result is set: a save waiting on it can take the lock
                    result = self._persist(plan, store, save_id, stall_s, staged_at, lock, stage_s, behind)
                future.set_result(result)
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                store.abandon()
                future.set_exception(exc)

        self._start_persist(run, future, lock, behind)
        return SaveHandle(future)

    def _save_distributed(self, world: World, state_dict: Any, path: str | os.PathLike, store: Store,
                          async_: bool, overwrite: bool, t0: float,
                          allow_pickle: bool = False) -> SaveResult | SaveHandle:
        """One rank's part of a distributed save: agree, plan + stage, then persist (see there).

        Rank 0 takes the save lock (``checkpoint/lock.py``) before any rank writes and holds it until
        its sweep: a concurrent save to the path, distributed or not, fails on every rank at once.
        Every rank reaches the same collectives whatever fails: rank 0's setup errors travel in the
        broadcast, a rank's planning or staging error reaches rank 0 through the gather."""
        world.agree("the checkpoint path and overwrite", (_agreed_url(store), overwrite))
        lock = SaveLock(store.url)  # rank 0's real one below; elsewhere it only makes exit wait for a persist
        found: tuple[str, str | None] = ("", None)
        setup_error: BaseException | None = None
        if world.is_first:
            try:
                found = (secrets.token_hex(4), _describe_location(store))
                if found[1] != "file":
                    store.prepare()
                    lock = acquire_save_lock(store)
                    found = (found[0], _describe_location(store))  # under the lock: a save may just have committed
            except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they wait in the broadcast
                setup_error, found = exc, ("", f"{type(exc).__name__}: {exc}")
        try:
            save_id, problem = world.broadcast(found, "starting the save")
            if setup_error is not None:
                raise setup_error
            if problem == "file":
                raise UsageError(f"{os.fspath(path)!r} is a file; a checkpoint is a directory")
            if problem == "checkpoint" and not overwrite:
                raise CheckpointExistsError.at(store.url)
            if problem is not None and problem.startswith("CheckpointLockedError: "):
                raise CheckpointLockedError(problem.removeprefix("CheckpointLockedError: "))
            if problem not in (None, "checkpoint"):
                raise RankFailedError(f"rank {world.rank}: rank 0 could not start the save: {problem}")
        except BaseException:
            lock.release()
            raise
        key = f"save/{save_id}"
        try:
            started = time.perf_counter()
            plan, tensors = self._plans.plan(state_dict, self.shard_size,
                                             shard_prefix=f"shard-{save_id}-r{world.rank:05d}",
                                             allow_pickle=allow_pickle)
            store.prepare()
            _require_free(store, plan.total_bytes)
            with self._lock:
                behind = stage(plan, tensors, self._arena, self.threads, cow=_stages_behind(async_, store))
            del tensors
            stage_s = time.perf_counter() - started
        except BaseException as exc:
            _abandon(world, key, exc)  # the coordinator would wait for this rank's shards otherwise
            lock.release()
            raise
        stall_s = time.perf_counter() - t0
        if not async_:
            with lock:
                return self._persist_distributed(world, key, plan, store, save_id, stall_s, time.perf_counter(),
                                                 lock, stage_s, behind)
        future: Future = Future()
        staged_at = time.perf_counter()

        def run() -> None:
            try:
                with lock:
                    result = self._persist_distributed(world, key, plan, store, save_id, stall_s, staged_at, lock,
                                                       stage_s, behind)
                future.set_result(result)
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                future.set_exception(exc)

        self._start_persist(run, future, lock, behind)  # every rank: an exit waits for its persist
        return SaveHandle(future)

    def _start_persist(self, run: Callable[[], None], future: Future, lock: SaveLock,
                       behind: CopyBehind | None) -> None:
        """Run ``run`` (the persist, which finishes ``behind``) on a thread; an exit waits for it."""
        self._in_flight = future
        try:
            lock.finish_before_exit(future)
            QuietThread(target=run, name="ckptbench-persist", daemon=True).start()
        except BaseException:
            if behind is not None:  # no thread will: nothing may copy into the arena after this raises
                behind.close()
            raise

    def _persist_distributed(self, world: World, key: str, plan: SavePlan, store: Store, save_id: str,
                             stall_s: float, staged_at: float, lock: SaveLock, stage_s: float,
                             behind: CopyBehind | None = None) -> SaveResult:
        """Two-phase commit, coordinated through the rendezvous store (so it runs on any thread).

        1. every rank writes its shards (durable) and sends their description to rank 0, or its failure;
        2. rank 0, with every rank's part in hand, commits one manifest naming all of them and
           publishes the outcome; if any rank failed, died or timed out, it commits nothing and
           publishes why. Every rank then removes its shards (failure) or its stale files (success).

        A rank that loses rank 0 before the outcome leaves its shards in place: the commit may have
        happened, and removing them could break it; the next save's sweep removes orphans.
        """
        own = [s.name for s in plan.shards]
        write_started = time.perf_counter()
        try:
            report, section = self._write_section(plan, store, behind)
        except BaseException as exc:
            store.remove(own)
            _abandon(world, key, exc)
            raise
        written_at = time.perf_counter()
        section.update(rank=world.rank, host=world.host)
        outcome_key = f"{key}/outcome"
        if not world.is_first:
            world.gather_to_first(key, section)
            outcome = world.wait_for(outcome_key, readers=world.world_size - 1,
                                     what=f"waiting for rank 0 to commit {store.url} (outcome unknown: this rank's "
                                          f"shards stay for the next save to remove)")
            if outcome["failed"] is not None:
                if outcome.get("keep"):
                    raise RankFailedError(f"rank {world.rank}: whether {store.url} was committed is unknown "
                                          f"({outcome['failed']}); this rank's shards are kept")
                store.remove(own)
                raise RankFailedError(f"rank {world.rank}: {store.url} was not committed: {outcome['failed']}")
            keep = set(own)
            _remove_stale(store, keep, owns=lambda name: f"-r{world.rank:05d}-" in name)
            return self._result(plan, store, report, stall_s, staged_at, written_at, stage_s=stage_s,
                                write_s=written_at - write_started, behind=behind, rank=world.rank,
                                world_size=world.world_size, world_bytes=outcome["world_bytes"])
        try:
            sections = world.gather_to_first(key, section, what=f"saving {store.url}")
            assert sections is not None
        except RankFailedError as exc:
            world.publish(outcome_key, {"failed": str(exc)})
            store.remove(own)
            raise RankFailedError(f"{exc}; {store.url} was not committed") from None
        except BaseException as exc:
            world.publish(outcome_key, {"failed": f"rank 0: {exc}"})
            store.remove(own)
            raise
        world_bytes = sum(part["total_bytes"] for part in sections)
        manifest = {**self._header(save_id), "world_size": world.world_size, "total_bytes": world_bytes,
                    "ranks": sections}
        committed = False
        try:
            with lock.committing(store, own):  # still ours (else LockLostError: nothing commits)
                self._commit(store, manifest, own)
                committed = True
                world.publish(outcome_key, {"failed": None, "world_bytes": world_bytes})
                _remove_stale(store, {s["name"] for part in sections for s in part["shards"]})
        except BaseException as exc:
            if not committed:
                # Not committed for sure -> every rank removes its shards; unknown -> every rank keeps them.
                unknown = isinstance(exc, CommitOutcomeUnknown) or not isinstance(exc, Exception)
                world.publish(outcome_key, {"failed": f"rank 0 could not commit the manifest: {exc}",
                                            "keep": unknown})
            raise
        return self._result(plan, store, report, stall_s, staged_at, written_at, stage_s=stage_s,
                            write_s=written_at - write_started, behind=behind, rank=0, world_size=world.world_size,
                            world_bytes=world_bytes)

    def _wait_in_flight(self) -> None:
        if self._in_flight is not None:
            with contextlib.suppress(Exception):  # that save's caller sees its own error
                interrupts.result_of(self._in_flight)
            self._in_flight = None

    def _write_section(self, plan: SavePlan, store: Store,
                       behind: CopyBehind | None = None) -> tuple[WriteReport, dict[str, Any]]:
        """Write the plan's shards from the arena (durable on return) and describe them: the
        manifest's per-save part (total bytes, shards, tensors with their CRC-32C, skeleton).
        ``behind``: a copy-on-write staging still copying into the arena: the engine writes each block
        as its bytes land (elsewhere it is finished first); the checksums wait for all of it. It is
        finished when this returns or raises: nothing copies into the arena after that."""
        try:
            return self._write_shards(plan, store, behind)
        finally:
            if behind is not None:
                behind.close()

    def _write_shards(self, plan: SavePlan, store: Store,
                      behind: CopyBehind | None) -> tuple[WriteReport, dict[str, Any]]:
        write_behind: dict[str, Any] = {}
        if behind is not None and _follows_copy(store):
            write_behind["after"] = behind.snapshot
        elif behind is not None:
            behind.finish()
        arena = self._arena.buffer
        view = memoryview(arena)
        files = [(s.name, view[s.arena_offset:s.arena_offset + s.nbytes]) for s in plan.shards]
        ranges = plan.checksum_ranges() if self.checksum else []
        crcs: list[int] = []
        crc_thread = None
        if ranges:
            # CRC-32C of the staged bytes runs beside the write (CPU-bound vs I/O-bound).
            def checksum() -> None:
                if behind is not None:
                    behind.close()  # every byte there (a failure is raised below, after the write)
                crcs.extend(native.crc32c_ranges(arena, [(o, n) for _, o, n in ranges], max(1, self.threads // 2)))

            crc_thread = QuietThread(target=checksum, name="ckptbench-crc")
        try:
            if crc_thread is not None:  # inside the try: a signal raised as it starts still joins it
                crc_thread.start()
            report = store.write_files(files, threads=self.threads, block_size=self.block_size, direct=self.direct,
                                       **write_behind)
            if behind is not None:
                try:
                    behind.finish()
                except SnapshotError:
                    store.remove([name for name, _ in files])  # written from a torn copy
                    raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the free-space check passed; something else filled it
                raise _out_of_space(store, sum(s.nbytes for s in plan.shards), exc) from exc
            raise StorageIOError(f"writing the checkpoint to {store.url} failed: {exc}") from exc
        finally:
            if crc_thread is not None:
                interrupts.join(crc_thread)
        per_entry: dict[int, list[int]] = {}
        for (index, _, _), crc in zip(ranges, crcs, strict=True):
            per_entry.setdefault(index, []).append(crc)
        section = {
            "total_bytes": plan.total_bytes,
            "shards": [{"name": s.name, "nbytes": s.nbytes} for s in plan.shards],
            "tensors": [
                {"key": e.key, "dtype": e.dtype, "shape": list(e.shape), "nbytes": e.nbytes, "shard": e.shard,
                 "offset": e.offset, "alias_of": e.alias_of, "crc32c": per_entry.get(e.index)}
                for e in plan.entries
            ],
            "skeleton": plan.manifest_skeleton,
        }
        return report, section

    def _header(self, save_id: str) -> dict[str, Any]:
        return {
            "format": mf.FORMAT,
            "save_id": save_id,
            "tool_version": __version__,
            "created_unix_s": time.time(),
            "checksum": {"algorithm": "crc32c", "block_bytes": CHECKSUM_BLOCK_BYTES} if self.checksum else None,
        }

    def _result(self, plan: SavePlan, store: Store, report: WriteReport, stall_s: float, staged_at: float,
                written_at: float, *, stage_s: float, write_s: float, behind: CopyBehind | None = None,
                **world: Any) -> SaveResult:
        now = time.perf_counter()
        return SaveResult(
            path=store.url, bytes=plan.total_bytes, files=len(plan.shards) + 1, tensors=len(plan.entries),
            stall_s=stall_s, persist_s=now - staged_at, commit_s=now - written_at, stage_s=stage_s, write_s=write_s,
            threads=self.threads,
            shard_size=self.shard_size, block_size=self.block_size, direct=report.direct, sync=report.sync,
            checksum=self.checksum, direct_fallback_reason=report.fallback_reason, plan_reused=plan.reused,
            staging="copy" if behind is None else "copy-on-write", cow_faults=0 if behind is None else behind.faults,
            **world,
        )

    def _persist(self, plan: SavePlan, store: Store, save_id: str, stall_s: float, staged_at: float,
                 lock: SaveLock, stage_s: float, behind: CopyBehind | None = None) -> SaveResult:
        write_started = time.perf_counter()
        report, section = self._write_section(plan, store, behind)
        written_at = time.perf_counter()
        shards = [s.name for s in plan.shards]
        with lock.committing(store, shards):  # still ours (else LockLostError), not abandoned until swept
            self._commit(store, {**self._header(save_id), **section}, shards)
            _remove_stale(store, set(shards))
        return self._result(plan, store, report, stall_s, staged_at, written_at, stage_s=stage_s,
                            write_s=written_at - write_started, behind=behind)

    @staticmethod
    def _commit(store: Store, manifest: dict, shards: list[str]) -> None:
        """Write the manifest; if that fails, remove this save's shards unless the manifest did land.

        A failed PUT may still have been stored (the answer was lost), so the manifest is read back:
        ours -> the commit happened; another save's, or none -> our shards are orphans, removed. Two
        cases keep them for the next save's sweep, since removing them could break a checkpoint that
        commits after all: the manifest cannot be read back, or the store says the write's outcome is
        unknown (OutcomeUnknownError: a request whose answer was lost may still be applied after the
        read-back; it is read again for a while first).
        """
        try:
            mf.commit(store, manifest)
        except BaseException as failure:
            unknown = isinstance(failure, OutcomeUnknownError)
            try:
                for wait_s in (0.0, *(COMMIT_RECHECK_S if unknown else ())):
                    time.sleep(wait_s)
                    current = _current_manifest(store)
                    if current is not None and current.get("save_id") == manifest["save_id"]:
                        log.info("%s: the manifest landed although its write failed (%s)", store.url, failure)
                        return
            except Exception:  # noqa: BLE001 - unreachable: leave the shards to the next sweep, report the commit
                if isinstance(failure, Exception):
                    raise CommitOutcomeUnknown(
                        f"committing {store.url} failed ({failure}) and its manifest could not be read back: the "
                        "checkpoint may or may not be committed; its shards are kept",
                        hint="load it to find out; the next save removes what is not committed") from failure
                raise failure from None
            if unknown:
                raise CommitOutcomeUnknown(
                    f"committing {store.url} failed ({failure}) and the manifest has not appeared since: the "
                    "checkpoint may still commit; its shards are kept",
                    hint="load it to find out; the next save removes what is not committed") from failure
            store.remove(shards)
            raise

    # -- load ---------------------------------------------------------------------------------

    def load(self, path: str | os.PathLike, *, device: Any = "cpu", verify: bool = True,
             into: dict | None = None, storage_options: dict | None = None,
             distributed: bool | None = None, rank: int | None = None, allow_pickle: bool = False) -> dict:
        """The state_dict saved at ``path``: same structure, dtypes and shapes, bit-exact; containers
        and parameters come back as the types they were saved as (see :func:`plan.rebuild`).

        Args:
            path: the checkpoint directory or URL.
            device: where the tensors go ("cpu", "cuda", "cuda:1", a torch.device).
            verify: check every tensor's CRC-32C (CorruptCheckpointError names a mismatch).
            into: a state_dict of the same structure to load into, in place (see below).
            storage_options: for object storage.
            distributed: as for :meth:`save`.
            rank: in one process, load the part rank ``rank`` of a distributed save wrote.
            allow_pickle: unpickle entries a save with ``allow_pickle=True`` pickled. Without it a
                checkpoint holding any is refused (PickleNotAllowedError names them) before anything
                is read: unpickling runs code the checkpoint names; allow it only for a trusted one.

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
        store = open_store(path, storage_options)
        world = _world_for(distributed) if rank is None else None
        if world is None:
            return self._load_latest(store, rank, device, verify, into, allow_pickle)
        return self._load_distributed(world, store, device, verify, into, allow_pickle)

    def _load_latest(self, store: Store, rank: int | None, device: Any, verify: bool, into: dict | None,
                     allow_pickle: bool = False) -> dict:
        """Load what the manifest names; when a save with ``overwrite=True`` commits a new checkpoint
        meanwhile (and removes the shards being read), load the new one instead. A failure with the
        manifest unchanged is the checkpoint's own (a missing shard is damage, said as such)."""
        manifest = mf.read_manifest(store)
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            part = mf.rank_part(manifest, store.url, rank=rank, world_size=1)
            try:
                return self._timed_load(store, manifest, part, device, verify, into, False, allow_pickle)
            except _MAYBE_REPLACED as exc:
                latest = _current_manifest(store) or manifest  # gone altogether: report what went wrong
                if latest == manifest:
                    damage = _vanished_shard(store, exc)
                    if damage is not None:
                        raise damage from None
                    raise
                if attempt == LOAD_ATTEMPTS:
                    raise _replaced_too_often(store) from exc
                log.info("%s was replaced by a new save while loading it: loading the new one", store.url)
                manifest = latest
        raise AssertionError("unreachable")

    def _load_distributed(self, world: World, store: Store, device: Any, verify: bool, into: dict | None,
                          allow_pickle: bool = False) -> dict:
        """This rank's part of a load under a launch, of the same committed checkpoint as every other rank.

        1. rank 0 reads the manifest and hands it round (node-local storage works too)
        2. every rank loads its part (a single-process checkpoint: all of it), and all compare outcomes
        3. all loaded: done. Some failed, each in a way a replacing save can cause (a shard gone, a read
           error): rank 0 reads the manifest again and decides for everyone. A new one (a save with
           ``overwrite=True`` committed meanwhile): every rank loads it, back to 2, up to
           ``LOAD_ATTEMPTS`` loads, then every rank raises the same CorruptCheckpointError. The same one,
           or any other failure: a rank that failed raises its error, the others RankFailedError
           naming it.

        So no rank returns a part of one checkpoint while another loads a different one, and every
        rank makes the same collective calls (the failures gathered are the same on all of them). With
        ``into=``, a rank copies into it only once every rank has read its part and found that it fits:
        when one fails, no rank's ``into`` has changed.
        """
        manifest = _shared_manifest(world, store)
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            loaded, failure, error = None, None, None
            try:
                # A single-process checkpoint loads whole on every rank; a distributed one part by part.
                part = mf.rank_part(manifest, store.url, rank=world.rank if "ranks" in manifest else None,
                                    world_size=world.world_size)
                # With into=, each rank reads its part and checks that it fits, but copies nothing yet.
                loaded = self._timed_load(store, manifest, part, device, verify, into, into is not None, allow_pickle)
            except Exception as exc:
                failure, error = (f"{type(exc).__name__}: {exc}", isinstance(exc, _MAYBE_REPLACED)), exc
            failures = world.all_gather(failure, "loading")  # every rank gets here, failed or not
            bad = {r: f for r, f in enumerate(failures) if f is not None}
            if not bad:
                if into is not None:
                    loaded()  # every rank's part was read and fits its into=: now each copies
                    return into
                return loaded
            verdict, latest = "failed", None
            if all(maybe_replaced for _, maybe_replaced in bad.values()):
                verdict, latest = _recheck_together(world, store, manifest, attempt)
            if verdict == "retry":
                if world.is_first:
                    log.info("%s was replaced by a new save while loading it: every rank loads the new one",
                             store.url)
                manifest = latest
                continue
            if verdict == "replaced":
                raise _replaced_too_often(store) from error
            if error is not None:
                damage = _vanished_shard(store, error) if verdict == "unchanged" else None
                if damage is not None:
                    raise damage from None
                raise error
            raise RankFailedError(f"rank {world.rank}: loading {store.url} failed on "
                                  + "; ".join(f"rank {r} ({text})" for r, (text, _) in sorted(bad.items())))
        raise AssertionError("unreachable")

    def _timed_load(self, store: Store, manifest: dict, part: dict, device: Any, verify: bool,
                    into: dict | None, defer: bool = False, allow_pickle: bool = False) -> Any:
        """``_load_part``, its time kept in ``last_load_s`` (reads and rebuild, no coordination; with
        ``defer``, the copy into ``into`` is timed into it when it is made)."""
        start = time.perf_counter()
        loaded = self._load_part(store, manifest, part, device, verify, into, defer, allow_pickle)
        self.last_load_s = time.perf_counter() - start
        if not defer:
            return loaded

        def copy() -> None:
            started = time.perf_counter()
            loaded()
            self.last_load_s += time.perf_counter() - started

        return copy

    def _load_part(self, store: Store, manifest: dict, part: dict, device: Any, verify: bool,
                   into: dict | None, defer: bool = False, allow_pickle: bool = False) -> Any:
        """Load one save's (or one rank's) ``part`` of ``manifest``; see :meth:`load`. With ``into`` and
        ``defer``: check that the part fits ``into`` and return the copy into it, to be called (before
        the next load reuses the read buffer) instead of made."""
        import torch

        if not allow_pickle:
            refuse_pickled(part["skeleton"])  # before anything is read
        shards = part["shards"]  # checked by mf.check_part: well formed, every tensor inside its shard
        for s in shards:  # before the read buffer is sized by what the manifest claims
            try:
                size = store.size(s["name"])
            except UnsafeFileError as exc:  # a symlink or special file where a shard belongs: never read
                raise mf.CorruptCheckpointError(f"shard {s['name']} of {store.url}: {exc}") from None
            if size != s["nbytes"]:
                raise mf.CorruptCheckpointError(
                    f"shard {s['name']} of {store.url} is {'missing' if size is None else f'{size} bytes'}; "
                    f"the manifest says {s['nbytes']} bytes")
        offsets, total = [], 0
        for s in shards:
            offsets.append(total)
            total = -(-(total + s["nbytes"]) // 4096) * 4096
        to_device = into is None and torch.device(device).type != "cpu"
        if into is not None or to_device:
            # The Checkpointer's own read buffer: reused, and registered with CUDA (pinned) where
            # one is present, so host-to-device copies out of it run at full speed.
            self._read_buffer.ensure(max(total, 4096))
            buffer = self._read_buffer.buffer
            faulting: Any = contextlib.nullcontext()  # in memory since its first load
        else:
            _require_memory(store, total)
            buffer = _fresh_read_buffer(max(total, 4096))
            faulting = _faulting_ahead(buffer)
        entries = part["tensors"]
        with faulting:
            view = memoryview(buffer)
            files = [(s["name"], view[o:o + s["nbytes"]]) for s, o in zip(shards, offsets, strict=True)]
            try:
                if verify and manifest.get("checksum"):
                    checks = _checksum_ranges(entries, offsets, manifest["checksum"]["block_bytes"], store.url)
                    self._read_verified(store, buffer, files, checks, shards)
                else:
                    store.read_files(files, threads=self.threads, block_size=self.block_size, direct=self.direct)
            except UnsafeFileError as exc:  # a shard swapped for a symlink or special file since its size was checked
                raise mf.CorruptCheckpointError(f"{store.url}: {exc}") from None
        flat = torch.frombuffer(buffer, dtype=torch.uint8) if total and into is not None else None
        tensors: list[Any] = []
        for e in entries:
            dtype, shape = dtype_of(e["dtype"]), tuple(e["shape"])
            if e["alias_of"] is not None:
                tensors.append(tensors[e["alias_of"]])
                continue
            if e["nbytes"] == 0:
                tensors.append(torch.empty(shape, dtype=dtype, device=device if to_device else "cpu"))
                continue
            offset = offsets[e["shard"]] + e["offset"]
            if flat is not None:  # into=: views into the reused read buffer, copied out below
                t = typed_view(flat, offset, e["nbytes"], dtype, shape)
            elif to_device:  # its own device memory, copied out of the pinned read buffer
                t = torch.empty(shape, dtype=dtype, device=device)
                copy_values(t, _own_storage_view(buffer, offset, e["nbytes"], dtype, shape), non_blocking=True)
            else:
                t = _own_storage_view(buffer, offset, e["nbytes"], dtype, shape)
            tensors.append(t)
        loaded = rebuild(part["skeleton"], tensors, allow_pickle)
        if to_device:
            _synchronize(device)  # the read buffer is reused by the next load
        if into is None:
            return loaded
        copy = _fit_into(into, loaded)
        if defer:
            return copy
        copy()
        return into

    def _read_verified(self, store: Store, buffer: Any, files: list[tuple[str, memoryview]],
                       checks: list[list[_Check]], shards: list[dict]) -> None:
        """Read ``files`` (one per shard) in groups of ``threads`` shards, and check the CRC-32C of each
        group's tensors on a second thread while the next group is read (engine reads and CRCs both
        release the GIL). Fails like reading everything, then checking everything: a read error
        first, else the mismatch of the first tensor in manifest order."""
        reads_done = threading.Event()

        def check(group: range) -> list[tuple[_Check, int]]:
            # Beside the reads, half the threads (the readers fault pages in); all of them after.
            threads = self.threads if reads_done.is_set() else max(1, self.threads // 2)
            ranges = [c for shard in group for c in checks[shard]]
            crcs = native.crc32c_ranges(buffer, [(c.offset, c.nbytes) for c in ranges], threads)
            return [(c, got) for c, got in zip(ranges, crcs, strict=True) if got != c.crc32c]

        per_group = max(1, self.threads)  # stores that read whole files in parallel keep every thread busy
        groups = [range(i, min(i + per_group, len(files))) for i in range(0, len(files), per_group)]
        with Workers(1, "ckptbench-verify") as verifier:
            for n, group in enumerate(groups):
                store.read_files(files[group.start:group.stop], threads=self.threads,
                                 block_size=self.block_size, direct=self.direct)
                if n == len(groups) - 1:
                    reads_done.set()
                verifier.submit(check, group)
            mismatches = [m for found in verifier.join() for m in found]
        if mismatches:
            first, got = min(mismatches, key=lambda m: m[0].order)
            raise mf.CorruptCheckpointError(
                f"checksum mismatch in tensor {first.key!r} (shard {shards[first.shard]['name']} of {store.url}): "
                f"crc32c {got:#010x}, manifest {first.crc32c:#010x}",
                hint="the checkpoint is damaged; restore from another one")

    def close(self) -> None:
        """Wait for a save in flight, then free the staging arena and the read buffer (a later save
        allocates them again)."""
        self._wait_in_flight()
        self._arena.close()
        self._plans.clear()
        self._read_buffer.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _own_storage_view(buffer: Any, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """A (shape, dtype) tensor over ``buffer[offset : offset + nbytes]`` with a storage of its own.

    As after ``torch.load``, a loaded tensor's storage starts at its first byte and ends at its last:
    ``torch.set_rng_state`` accepts it, ``torch.save``/pickle write only its bytes, and no two loaded
    tensors share one (their storages all keep ``buffer`` alive, which is freed with the last of them,
    as the tensors of ``torch.load(mmap=True)`` keep their file's mapping)."""
    import torch

    return torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).view(shape)


class _Check(NamedTuple):
    """One checksummed range of the read buffer: whose it is, where, and the CRC-32C the manifest holds."""

    order: tuple[int, int]  # (tensor index in the manifest, block index in the tensor)
    key: str
    shard: int
    offset: int
    nbytes: int
    crc32c: int


def _checksum_ranges(entries: list[dict], offsets: list[int], block: int, where: str) -> list[list[_Check]]:
    """The checksummed ranges of every stored tensor, by shard (aliases and empty tensors have none)."""
    by_shard: list[list[_Check]] = [[] for _ in offsets]
    for index, e in enumerate(entries):
        if e["alias_of"] is not None or not e["nbytes"]:
            continue
        starts = range(0, e["nbytes"], block)
        if len(e["crc32c"] or ()) != len(starts):
            raise mf.CorruptCheckpointError(
                f"the manifest of {where} lists {len(e['crc32c'] or ())} checksums for tensor {e['key']!r}, "
                f"which needs {len(starts)}")
        base = offsets[e["shard"]] + e["offset"]
        by_shard[e["shard"]].extend(
            _Check((index, k), e["key"], e["shard"], base + start, min(block, e["nbytes"] - start), crc)
            for k, (start, crc) in enumerate(zip(starts, e["crc32c"], strict=True)))
    return by_shard


#: madvise(2) advice that faults a range in, writable, in one call (Linux 5.14+; Python has no name for it).
_MADV_POPULATE_WRITE = 23
#: Bytes faulted in per madvise call ahead of the readers (the call holds the GIL: keep it short).
_FAULT_AHEAD_BYTES = 8 * 2**20


def _fresh_read_buffer(nbytes: int) -> mmap.mmap:
    """Zeroed, page-aligned memory for one load, not yet faulted in (see :func:`_faulting_ahead`).

    Not MADV_HUGEPAGE: huge pages speed reads up only while the host still backs the memory, and slow
    them down a lot once it has taken it back (a VM's free page reporting), which can change within a run."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)


@contextlib.contextmanager
def _faulting_ahead(buffer: mmap.mmap) -> Iterator[None]:
    """Fault ``buffer`` in from its start on a helper thread while the body reads into it in order.

    Page faults are most of a cold load's CPU time: done by the reader threads, between their
    reads, they leave the device idle; touching the whole buffer first, on one thread, delays every
    read. Faulted in alongside the reads, from the front, the buffer stays ahead of the readers
    (where they overtake it, they fault their own pages). Without MADV_POPULATE_WRITE (Linux before
    5.14, other systems) the readers fault every page themselves.
    """
    stop = threading.Event()

    def fault_in() -> None:
        for start in range(0, len(buffer), _FAULT_AHEAD_BYTES):
            if stop.is_set():
                return
            try:
                buffer.madvise(_MADV_POPULATE_WRITE, start, min(_FAULT_AHEAD_BYTES, len(buffer) - start))
            except OSError:
                return

    helper = QuietThread(target=fault_in, name="ckptbench-fault-ahead", daemon=True)
    try:
        if sys.platform == "linux":
            helper.start()
        yield
    finally:
        stop.set()
        interrupts.join(helper)


def _fit_into(dst: Any, src: Any) -> Callable[[], None]:
    """How ``dst`` (``load``'s ``into=``) comes to hold the loaded ``src``: each tensor copied into the
    matching preallocated tensor, in place (under no_grad: parameters are fine), and each plain value
    that differs (a step counter, a learning rate) put into its dict or list. Everything is checked
    here, and the copy returned to be made: an ``into=`` that does not fit is refused untouched, naming
    the first misfit."""
    import torch

    copies: list[tuple[Any, Any, str]] = []
    arrays: list[tuple[np.ndarray, np.ndarray]] = []  # numpy arrays copied in place
    updates: list[tuple[Any, Any, Any]] = []  # (container, key or index, value)

    def where(path: str) -> str:
        return path or "<root>"

    def visit(d: Any, s: Any, path: str, parent: Any = None, slot: Any = None) -> None:
        if isinstance(s, torch.Tensor):
            if not isinstance(d, torch.Tensor):
                raise UsageError(f"{where(path)}: the checkpoint holds a tensor, into= holds {type(d).__name__}")
            if d.shape != s.shape or d.dtype != s.dtype:
                raise UsageError(f"{where(path)}: checkpoint tensor {tuple(s.shape)} {s.dtype} does not fit into "
                                 f"{tuple(d.shape)} {d.dtype}")
            problem = _unwritable(d)
            if problem:
                raise UsageError(f"{where(path)}: the into= tensor cannot be loaded into: {problem}")
            copies.append((d, s, path))
        elif isinstance(s, dict):
            if not isinstance(d, dict):
                raise UsageError(f"{where(path)}: the checkpoint holds a dict, into= holds {type(d).__name__}")
            if d.keys() != s.keys():
                missing, extra = [k for k in s if k not in d], [k for k in d if k not in s]
                raise UsageError(f"{where(path)}: keys differ between the checkpoint and into= ("
                                 + "; ".join(f"{label}: {', '.join(map(repr, keys[:5]))}{' ...' if len(keys) > 5 else ''}"
                                             for label, keys in (("missing from into=", missing),
                                                                 ("not in the checkpoint", extra)) if keys) + ")")
            for key in s:
                visit(d[key], s[key], f"{path}.{key}" if path else str(key), d, key)
        elif isinstance(s, np.ndarray):
            if isinstance(d, np.ndarray) and d.shape == s.shape and d.dtype == s.dtype and d.flags.writeable:
                arrays.append((d, s))  # in place, as tensors are
            elif isinstance(parent, tuple):
                raise UsageError(f"{where(path)}: the checkpoint holds a {s.dtype} array of shape {s.shape}, into= "
                                 f"holds {type(d).__name__} inside a tuple, which cannot be updated")
            else:
                updates.append((parent, slot, s))
        elif isinstance(s, (list, tuple)):
            if not isinstance(d, (list, tuple)) or len(d) != len(s):
                raise UsageError(f"{where(path)}: a sequence of {len(s)} items does not fit into= here")
            for i, (di, si) in enumerate(zip(d, s, strict=True)):
                visit(di, si, f"{path}[{i}]", d, i)
        else:
            if isinstance(d, (torch.Tensor, dict, list, tuple)):
                raise UsageError(f"{where(path)}: the checkpoint holds a {type(s).__name__}, "
                                 f"into= holds {type(d).__name__}")
            if type(d) is type(s) and bool(d == s or d != d and s != s):  # equal (NaN equals NaN here)
                return
            if isinstance(parent, tuple):
                raise UsageError(f"{where(path)}: the checkpoint holds {s!r}, into= holds {d!r} inside a tuple, "
                                 "which cannot be updated", hint="use a list, or pass into= without it")
            updates.append((parent, slot, s))

    visit(dst, src, "")

    def copy() -> None:
        with torch.no_grad():
            for d, s, path in copies:
                try:
                    copy_values(d, s, non_blocking=d.device.type == "cuda")  # out of pinned memory; synchronized after
                except RuntimeError as exc:  # a destination torch refuses that the checks above did not foresee
                    raise UsageError(f"{where(path)}: copying into the into= tensor failed ({exc}); the tensors "
                                     "before it in into= were loaded") from exc
        for d, s in arrays:
            np.copyto(d, s)
        for container, slot, value in updates:
            container[slot] = value
        _synchronize_all(dst)

    return copy


def _unwritable(t: Any) -> str | None:
    """Why ``t`` cannot take an in-place copy (checked before any is made), or None."""
    import torch

    if t.device.type == "meta":
        return "it is on the meta device (no memory to load into)"
    if t.layout is not torch.strided:
        return f"it is a {t.layout} tensor"
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return "it was made under torch.inference_mode() and can only be updated inside it"
    if any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(), strict=True)):
        return "its elements overlap (an expanded view)"
    return None


def _synchronize(device: Any) -> None:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _synchronize_all(tree: Any) -> None:
    """Wait for the non-blocking copies into every CUDA device that ``tree``'s tensors live on."""
    import torch

    devices: set[Any] = set()

    def walk(node: Any) -> None:
        if isinstance(node, torch.Tensor):
            if node.device.type == "cuda":
                devices.add(node.device)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(tree)
    for device in devices:
        torch.cuda.synchronize(device)


def _follows_copy(store: Store) -> bool:
    """Whether ``store``'s writes can follow a copy still landing in the arena: the engine writes it
    (a filesystem) and waits for each block's bytes (``native.write(after=...)``)."""
    return store.writes_follow_copy


def _stages_behind(async_: bool, store: Store) -> bool:
    """Whether a save stages host tensors copy-on-write (``stage.CopyBehind``): every async save (the
    caller goes on at once), and sync saves whose write follows the copy instead of waiting for all of
    it (:func:`_follows_copy`)."""
    return async_ or _follows_copy(store)


def _world_for(distributed: bool | None) -> World | None:
    """The launch to coordinate with: detected (None), none (False), required (True)."""
    if distributed is False:
        return None
    world = current_world()
    if distributed and world is None:
        raise UsageError("distributed=True, but this process is not part of a launch of two or more ranks",
                         hint="start it with torchrun/srun, or leave distributed unset")
    return world


def _shared_manifest(world: World, store: Store) -> dict:
    """The manifest rank 0 reads, on every rank; rank 0 raises its own error, the others say so."""
    found: tuple[dict | None, str | None] = (None, None)
    first_error: BaseException | None = None
    if world.is_first:
        try:
            found = (mf.read_manifest(store), None)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they wait in the broadcast
            first_error, found = exc, (None, str(exc))
    manifest, problem = world.broadcast(found, "reading the manifest")
    if first_error is not None:
        raise first_error
    if problem is not None:
        raise mf.NotACheckpointError(f"rank 0 could not read the manifest: {problem}")
    return manifest


def _recheck_together(world: World, store: Store, manifest: dict, attempt: int) -> tuple[str, dict | None]:
    """After load failures a replacing save can cause, rank 0 reads the manifest again and every rank
    gets its verdict: ("retry", the new manifest), ("replaced", None) after ``LOAD_ATTEMPTS``, or
    ("unchanged", None). A rank 0 that cannot read it raises its error, the others RankFailedError."""
    verdict: tuple[str, Any] = ("unreadable", None)
    reread_error: BaseException | None = None
    if world.is_first:
        try:
            latest = _current_manifest(store) or manifest  # gone altogether: report what went wrong
            if latest == manifest:
                verdict = ("unchanged", None)
            else:
                verdict = ("replaced", None) if attempt == LOAD_ATTEMPTS else ("retry", latest)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they wait in the broadcast
            reread_error, verdict = exc, ("unreadable", f"{type(exc).__name__}: {exc}")
    verdict = world.broadcast(verdict, "checking whether the checkpoint was replaced")
    if reread_error is not None:
        raise reread_error
    if verdict[0] == "unreadable":
        raise RankFailedError(f"rank {world.rank}: loading {store.url} failed, and rank 0 could not read "
                              f"its manifest again: {verdict[1]}")
    return verdict


def _vanished_shard(store: Store, exc: BaseException) -> mf.CorruptCheckpointError | None:
    """A shard that was not found under an unchanged manifest, said as the damage it is; else None."""
    if not isinstance(exc, FileNotFoundError):
        return None
    return mf.CorruptCheckpointError(
        f"a shard of {store.url} disappeared while it was read ({exc.filename or exc})",
        hint="the checkpoint is damaged or was removed meanwhile; restore from another one")


def _replaced_too_often(store: Store) -> mf.CorruptCheckpointError:
    return mf.CorruptCheckpointError(
        f"{store.url} was replaced by a new save {LOAD_ATTEMPTS} times while loading it",
        hint="load it when no save is writing to it")


def _describe_location(store: Store) -> str | None:
    """What stands at a save's location: None (free), "file", or "checkpoint"."""
    if not store.is_dir_like():
        return "file"
    return "checkpoint" if store.size(mf.MANIFEST_NAME) is not None else None


def _abandon(world: World, key: str, exc: BaseException) -> None:
    """This rank fails before its shards are durable: tell the coordinator (rank 0 tells everyone)."""
    message = f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(Exception):
        if world.is_first:
            world.publish(f"{key}/outcome", {"failed": f"rank 0 failed: {message}"})
            # The others still send their parts (and some megabytes of tensor lists): collect them in
            # the background, so the rendezvous store does not keep them for the rest of the job.
            QuietThread(target=_drain, args=(world, key, message), name="ckptbench-drain", daemon=True).start()
        else:
            world.gather_to_first(key, failed=message)


def _drain(world: World, key: str, message: str) -> None:
    with contextlib.suppress(Exception):
        world.gather_to_first(key, failed=message)


def _remove_stale(store: Store, keep: set[str], owns: Any = None) -> None:
    """After a commit: remove the files (and abort the uploads) of older or crashed saves that
    ``keep`` does not name; ``owns`` narrows them further (a rank removes only its own)."""
    store.remove([name for name in mf.stale_files(store, keep) if owns is None or owns(name)])
    # Uploads an earlier, failed save could not abort (stores without multipart uploads have none).
    store.abort_incomplete_uploads(lambda name: bool(mf.OWNED_FILE.match(name)) and name not in keep
                                   and (owns is None or owns(name)))


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


def load(path: str | os.PathLike, *, device: Any = "cpu", verify: bool = True, into: dict | None = None,
         storage_options: dict | None = None, distributed: bool | None = None, rank: int | None = None,
         allow_pickle: bool = False) -> dict:
    """Load the checkpoint at ``path``; see :meth:`Checkpointer.load` for the arguments.

    Returns:
        dict: the state_dict, each tensor with a storage of its own as after ``torch.load``
        (``into`` itself when given).
    """
    return _default_checkpointer().load(path, device=device, verify=verify, into=into,
                                        storage_options=storage_options, distributed=distributed, rank=rank,
                                        allow_pickle=allow_pickle)
