"""The save path of :class:`~ckptbench.checkpoint.api.Checkpointer` (``api.py`` holds the public surface).

Call sequence of a save (each step's result feeds the next; only steps 1-2 block an async caller):

1. plan   - flatten the state_dict, lay tensors out in shards (pure, ``plan.plan_save``)
2. stage  - copy every tensor into the reused host arena (``stage.stage``); ``stall_s`` ends here
3. write  - the engine writes the shards from the arena, O_DIRECT where possible, each file
            fdatasynced and the directory fsynced; CRC-32C of every tensor computed alongside
            A sync save of host tensors whose durable mode is buffered skips 2: the shards are written
            straight from the tensors' own memory, the CRC-32C computed on the same pass
            (``zero_copy.write_zero_copy``; where ``SaveResult.tuning["zero_copy"]`` says so).
            Else a sync save of contiguous CPU tensors to a directory, larger than the staging ring,
            does 2 and 3 together through the ring (``ring.write_through_ring``: a few slot-sized
            buffers staged while the others are written), so it holds no copy of the checkpoint.
4. commit - the manifest, written to a temp name, fsynced, renamed, directory fsynced
            (``commit.commit``; under a launch the two-phase ``commit.commit_across_ranks``). Only now
            does the checkpoint exist; ``persist_s`` (staging end -> durable) ends here.

A save never touches the files of a committed checkpoint: shards carry a per-save id, and the files
of the previous checkpoint are removed only after the new manifest is committed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ckptbench import __version__, interrupts, knobs, native, safeio
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint import tuning
from ckptbench.checkpoint.commit import announce_failure, commit, commit_across_ranks, remove_stale
from ckptbench.checkpoint.distributed import RankFailedError, World
from ckptbench.checkpoint.lock import CheckpointLockedError, SaveLock, acquire_save_lock
from ckptbench.checkpoint.plan import CHECKSUM_BLOCK_BYTES, PlanCache, SavePlan
from ckptbench.checkpoint.ring import Ring, ring_bytes, write_through_ring
from ckptbench.checkpoint.routing import ROUTE_HOST, Sources
from ckptbench.checkpoint.stage import Arena, CowStaging, CowStagingError, stage
from ckptbench.checkpoint.zero_copy import unavailable as zero_copy_unavailable
from ckptbench.checkpoint.zero_copy import write_zero_copy
from ckptbench.errors import CheckpointExistsError, InsufficientSpaceError, StorageIOError, UsageError
from ckptbench.interrupts import QuietThread
from ckptbench.storage.store import Store, WriteReport
from ckptbench.units import format_size


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
    #: How the host tensors were staged: "copy" (before the caller went on, or the write began),
    #: "copy-on-write" (their pages write-protected and copied behind the caller, the write following
    #: the copy; see ``stage.CowStaging``), "ring" (a sync save chunk by chunk through the bounded
    #: staging ring, each chunk written while the next is staged: ``stage_s`` is then planning only and
    #: ``write_s`` holds the staging; see ``checkpoint/ring.py``) or "zero-copy" (not staged: a sync
    #: buffered save written from the tensors' own memory, views made contiguous first; ``stage_s`` is
    #: planning only; see ``checkpoint/zero_copy.py``), and how many of the caller's writes waited for
    #: a page.
    staging: str = "copy"
    cow_faults: int = 0
    #: How direct, threads and block_size were chosen: each value, its source and reason, the mount
    #: and the probe's samples (``checkpoint.tuning.Tuning.to_dict``).
    tuning: dict[str, Any] | None = None

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


@contextlib.contextmanager
def _write_errors(store: Store, plan: SavePlan) -> Any:
    """A failed shard write as the error a caller can act on: out of space (or quota), else StorageIOError."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the free-space check passed; something else filled it
            raise _out_of_space(store, sum(s.nbytes for s in plan.shards), exc) from exc
        raise StorageIOError(f"writing the checkpoint to {store.url} failed: {exc}") from exc


def _describe_part(plan: SavePlan, ranges: list[tuple[int, int, int]], crcs: list[int]) -> dict[str, Any]:
    """The manifest's per-save part of ``plan``: total bytes, shards, tensors with the CRC-32C of each of
    their ``ranges`` (``plan.checksum_ranges()``, or none), skeleton."""
    per_entry: dict[int, list[int]] = {}
    for (index, _, _), crc in zip(ranges, crcs, strict=True):
        per_entry.setdefault(index, []).append(crc)
    return {
        "total_bytes": plan.total_bytes,
        "shards": [{"name": s.name, "nbytes": s.nbytes} for s in plan.shards],
        "tensors": [
            {"key": e.key, "dtype": e.dtype, "shape": list(e.shape), "nbytes": e.nbytes, "shard": e.shard,
             "offset": e.offset, "alias_of": e.alias_of, "crc32c": per_entry.get(e.index)}
            for e in plan.entries
        ],
        "skeleton": plan.manifest_skeleton,
    }


def _describe_location(store: Store) -> str | None:
    """What stands at a save's location: None (free), "file", or "checkpoint"."""
    if not store.is_dir_like():
        return "file"
    return "checkpoint" if store.size(mf.MANIFEST_NAME) is not None else None


@dataclass(frozen=True)
class _Unstaged:
    """A sync save written without staging into the arena: ``how`` ("zero-copy" or "ring") and the
    plan's sources it reads while it writes."""

    how: str
    sources: Sources


def _through_ring(async_: bool, store: Store, plan: SavePlan, tensors: Sources) -> bool:
    """Whether a save goes through the bounded staging ring (``checkpoint/ring.py``) instead of the
    whole-checkpoint arena: sync saves (an async one needs a copy of everything to return early) to a
    store written piece by piece, larger than the ring, of contiguous CPU tensors only
    (``knobs.STAGE_RING`` on)."""
    if async_ or not knobs.STAGE_RING or not store.writes_pieces or plan.arena_bytes <= ring_bytes():
        return False
    routes = np.frombuffer(tensors.routes, np.int16)
    return bool(len(routes)) and bool((routes == ROUTE_HOST).all())


def _unstaged(async_: bool, store: Store, plan: SavePlan, tensors: Sources, direct: bool,
              settled: tuning.Tuning | None) -> _Unstaged | None:
    """How a save writes without staging its tensors into the arena, or None (staged): "zero-copy" for a
    sync buffered save to a store that writes from the caller's memory (``writes_gathered``) where the
    tuning chose it (``Tuning.zero_copy``) and every tensor is in host memory; else "ring" where
    ``_through_ring`` says so. An async save always stages: the caller goes on at once."""
    if async_:
        return None
    if (not direct and store.writes_gathered and settled is not None and settled.zero_copy is not None
            and settled.zero_copy.value and not zero_copy_unavailable(plan, tensors)):
        return _Unstaged("zero-copy", tensors)
    return _Unstaged("ring", tensors) if _through_ring(async_, store, plan, tensors) else None


def _stages_copy_on_write(async_: bool, store: Store) -> bool:
    """Whether a save stages host tensors copy-on-write (``stage.CowStaging``): every async save (the
    caller goes on at once), and sync saves whose write follows the copy instead of waiting for all of
    it (``Store.writes_follow_copy``: the engine writes it, waiting for each block's bytes)."""
    return async_ or store.writes_follow_copy


class _Saver:
    """The save steps of a Checkpointer: its settings, arena and plan cache are the Checkpointer's."""

    threads: int
    shard_size: int
    block_size: int
    direct: bool
    checksum: bool
    _arena: Arena
    _ring: Ring
    _plans: PlanCache
    _in_flight: Future | None
    _lock: threading.Lock
    _given: tuple[int | None, int | None, bool | None]
    _tuning: tuning.Tuning | None

    def _settle(self, store: Store, nbytes: int, world: World | None = None, key: str = "") -> None:
        """This save's direct, threads and block_size: those given, else chosen for the target (``tuning``;
        under a launch, rank 0's for every rank)."""
        given = {"threads": self._given[0], "block_size": self._given[1], "direct": self._given[2],
                 "total_bytes": nbytes, "shard_size": self.shard_size}
        self._tuning = (tuning.settle(store, **given) if world is None else
                        tuning.settle_across(world, f"{key}/tuning", store, failed_key=f"{key}/outcome", **given))
        self.direct, self.threads, self.block_size = (c.value for c in (self._tuning.direct, self._tuning.threads,
                                                                        self._tuning.block_size))

    def _save_alone(self, state_dict: Any, path: str | os.PathLike, store: Store, async_: bool, overwrite: bool,
                    t0: float, allow_pickle: bool = False) -> SaveResult | SaveHandle:
        """A save from this process alone: check the location, plan, lock, stage, then persist here
        (sync) or on a persist thread (async)."""
        if not store.is_dir_like():
            raise UsageError(f"{os.fspath(path)!r} is a file; a checkpoint is a directory")
        # Looked up with overwrite=True too: a manifest name that is a symlink, directory or special file is
        # refused here (UnsafeFileError), before a shard is written, not at the commit's rename.
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
            if not overwrite and store.size(mf.MANIFEST_NAME) is not None:  # committed while we planned
                raise CheckpointExistsError(f"{store.url} already holds a checkpoint (a save just committed it)",
                                            hint="pass overwrite=True to replace it")
            _require_free(store, plan.total_bytes)
            self._settle(store, plan.total_bytes)
            staging = time.perf_counter()
            unstaged = _unstaged(async_, store, plan, tensors, self.direct, self._tuning)
            behind = None
            if unstaged is None:
                with self._lock:
                    behind = stage(plan, tensors, self._arena, self.threads, cow=_stages_copy_on_write(async_, store))
            stage_s = plan_s + time.perf_counter() - staging
        except BaseException:
            lock.release()
            store.abandon()
            raise
        del tensors  # the arena holds the bytes now (or `behind` until it has copied them, or `unstaged`)
        stall_s = time.perf_counter() - t0
        if not async_:
            try:
                with lock:
                    return self._persist(plan, store, save_id, stall_s, time.perf_counter(), lock, stage_s, behind,
                                         unstaged)
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
            self._settle(store, plan.total_bytes, world, key)
            unstaged = _unstaged(async_, store, plan, tensors, self.direct, self._tuning)
            behind = None
            if unstaged is None:
                with self._lock:
                    behind = stage(plan, tensors, self._arena, self.threads, cow=_stages_copy_on_write(async_, store))
            del tensors
            stage_s = time.perf_counter() - started
        except BaseException as exc:
            announce_failure(world, key, exc)  # the coordinator would wait for this rank's shards otherwise
            lock.release()
            raise
        stall_s = time.perf_counter() - t0
        if not async_:
            with lock:
                return self._persist_distributed(world, key, plan, store, save_id, stall_s, time.perf_counter(),
                                                 lock, stage_s, behind, unstaged)
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
                       behind: CowStaging | None) -> None:
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
                             behind: CowStaging | None = None, unstaged: _Unstaged | None = None) -> SaveResult:
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
            report, part = self._write_part(plan, store, behind, unstaged)
        except BaseException as exc:
            store.remove(own)
            announce_failure(world, key, exc)
            raise
        written_at = time.perf_counter()
        part.update(rank=world.rank, host=world.host)
        world_bytes = commit_across_ranks(world, key, store, lock, own, part, self._header(save_id))
        return self._result(plan, store, report, stall_s, staged_at, written_at, stage_s=stage_s,
                            write_s=written_at - write_started, behind=behind, unstaged=unstaged,
                            rank=world.rank,
                            world_size=world.world_size, world_bytes=world_bytes)

    def _wait_in_flight(self) -> None:
        if self._in_flight is not None:
            with contextlib.suppress(Exception):  # that save's caller sees its own error
                interrupts.result_of(self._in_flight)
            self._in_flight = None

    def _write_part(self, plan: SavePlan, store: Store, behind: CowStaging | None = None,
                    unstaged: _Unstaged | None = None) -> tuple[WriteReport, dict[str, Any]]:
        """Write the plan's shards from the arena (durable on return) and describe them: the
        manifest's per-save part (total bytes, shards, tensors with their CRC-32C, skeleton).
        ``behind``: a copy-on-write staging still copying into the arena: the engine writes each block
        as its bytes land (elsewhere it is finished first); the checksums wait for all of it. It is
        finished when this returns or raises: nothing copies into the arena after that.
        ``unstaged``: the plan's sources, written from the tensors' own memory (zero-copy) or staged
        and written through the ring, instead of from the arena."""
        try:
            if unstaged is None:
                return self._write_shards(plan, store, behind)
            with _write_errors(store, plan):
                if unstaged.how == "zero-copy":
                    report, crcs, ranges = write_zero_copy(plan, unstaged.sources, store, threads=self.threads,
                                                           block_size=self.block_size, checksum=self.checksum)
                    return report, _describe_part(plan, ranges, crcs)
                report, crcs, _ = write_through_ring(plan, unstaged.sources, store, self._ring, threads=self.threads,
                                                     block_size=self.block_size, direct=self.direct,
                                                     checksum=self.checksum)
            return report, _describe_part(plan, plan.checksum_ranges() if self.checksum else [], crcs)
        finally:
            if behind is not None:
                behind.close()

    def _write_shards(self, plan: SavePlan, store: Store,
                      behind: CowStaging | None) -> tuple[WriteReport, dict[str, Any]]:
        after_copy: dict[str, Any] = {}
        if behind is not None and store.writes_follow_copy:
            after_copy["after"] = behind.cow_copy
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
            with _write_errors(store, plan):
                if crc_thread is not None:  # inside the try: a signal raised as it starts still joins it
                    crc_thread.start()
                report = store.write_files(files, threads=self.threads, block_size=self.block_size,
                                           direct=self.direct, **after_copy)
                if behind is not None:
                    try:
                        behind.finish()
                    except CowStagingError:
                        store.remove([name for name, _ in files])  # written from a torn copy
                        raise
        finally:
            if crc_thread is not None:
                interrupts.join(crc_thread)
        return report, _describe_part(plan, ranges, crcs)

    def _header(self, save_id: str) -> dict[str, Any]:
        return {
            "format": mf.FORMAT,
            "save_id": save_id,
            "tool_version": __version__,
            "created_unix_s": time.time(),
            "checksum": {"algorithm": "crc32c", "block_bytes": CHECKSUM_BLOCK_BYTES} if self.checksum else None,
        }

    def _result(self, plan: SavePlan, store: Store, report: WriteReport, stall_s: float, staged_at: float,
                written_at: float, *, stage_s: float, write_s: float, behind: CowStaging | None = None,
                unstaged: _Unstaged | None = None, **world: Any) -> SaveResult:
        now = time.perf_counter()
        return SaveResult(
            path=store.url, bytes=plan.total_bytes, files=len(plan.shards) + 1, tensors=len(plan.entries),
            stall_s=stall_s, persist_s=now - staged_at, commit_s=now - written_at, stage_s=stage_s, write_s=write_s,
            threads=self.threads,
            shard_size=self.shard_size, block_size=self.block_size, direct=report.direct, sync=report.sync,
            checksum=self.checksum, direct_fallback_reason=report.fallback_reason, plan_reused=plan.reused,
            staging=unstaged.how if unstaged is not None else "copy" if behind is None else "copy-on-write",
            cow_faults=0 if behind is None else behind.faults,
            tuning=self._tuning.to_dict() if self._tuning is not None else None,
            **world,
        )

    def _persist(self, plan: SavePlan, store: Store, save_id: str, stall_s: float, staged_at: float,
                 lock: SaveLock, stage_s: float, behind: CowStaging | None = None,
                 unstaged: _Unstaged | None = None) -> SaveResult:
        write_started = time.perf_counter()
        report, part = self._write_part(plan, store, behind, unstaged)
        written_at = time.perf_counter()
        shards = [s.name for s in plan.shards]
        with lock.committing(store, shards):  # still ours (else LockLostError), not abandoned until swept
            commit(store, {**self._header(save_id), **part}, shards)
            remove_stale(store, set(shards))
        return self._result(plan, store, report, stall_s, staged_at, written_at, stage_s=stage_s,
                            write_s=written_at - write_started, behind=behind, unstaged=unstaged)
