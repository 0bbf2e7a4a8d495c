"""The drain: committed checkpoints of a fast tier copied to a durable one in the background.

:func:`copy_checkpoint` copies one committed checkpoint from a source store to a target store with
the commit protocol of a save (``checkpoint/manifest.py``): the target's save lock is taken, the
shards are written and durable first (``Store.write_files``), then the source's manifest is
committed as is (``manifest.commit``), the last step; a copy killed at any point leaves the
target's previous checkpoint, or none, never a half one. To a target that uploads a file part by
part (``upload_in_parts``: S3), each shard is streamed: read one part at a time into a small ring
of part buffers, each part uploaded while the next ones are read (``DRAIN_BUFFER_BYTES`` bounds the
buffers), every tensor's CRC-32C checked as its last part is read, and no object completed before
every shard was read and checked. To other targets, shards are read into a host buffer a batch at
a time, the next batch read while the previous one is written, every tensor's CRC-32C checked before
its bytes are written. Either way a damaged source is refused, never copied.

:class:`Drainer` runs those copies on one background thread for ``CheckpointManager(remote=...)``:
one copy at a time, the newest step asked for first (an older one still waiting is skipped); a
copy that fails (the remote tier unreachable, say) is retried after ``CKPTBENCH_DRAIN_RETRY_S``
or as soon as another step is submitted, and :meth:`Drainer.status` says what happened. Its thread
runs at a lower CPU priority (``CKPTBENCH_DRAIN_NICE``) and reads in the idle I/O class
(``CKPTBENCH_DRAIN_IDLE_IO``): local saves stall no longer for it.
:class:`DrainProcess` runs each copy in a process of its own, watched: a copy with no progress for
``CKPTBENCH_DRAIN_TIMEOUT_S`` (a remote tier that stopped answering) is killed and fails like any other.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing.context
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ckptbench import interrupts, knobs, native
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.lock import acquire_save_lock
from ckptbench.errors import CorruptCheckpointError, DrainStalledError, NotACheckpointError
from ckptbench.storage.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainResult:
    """One checkpoint copied to the remote tier (``copied`` False: it was there already)."""

    step: int
    bytes: int
    files: int
    seconds: float
    copied: bool = True

    @property
    def gbps(self) -> float:
        """GB/s (1e9 bytes/s) from the start of the copy to its commit."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class DrainStatus:
    """Where the drain of a manager stands.

    ``pending_step``: waiting for its copy (or for the retry of a failed one); ``draining_step``: being
    copied now; ``drained_step``: the newest step this manager copied; ``last_error``: why the latest
    attempt failed (None after a success); ``failures``: failed attempts since the last success;
    ``last``: the latest successful copy; ``stalls``: copies the watchdog stopped (no progress for the
    drain timeout), in all."""

    pending_step: int | None
    draining_step: int | None
    drained_step: int | None
    last_error: str | None
    failures: int
    last: DrainResult | None
    stalls: int = 0

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing being copied."""
        return self.pending_step is None and self.draining_step is None


def _parts(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    parts = manifest.get("ranks")
    return [manifest] if parts is None else list(parts)


def _checks(part: dict[str, Any], block: int, where: str) -> dict[int, list[tuple[int, int, int]]]:
    """{shard index: [(offset in the shard, bytes, CRC-32C)]} of every checksummed tensor block."""
    by_shard: dict[int, list[tuple[int, int, int]]] = {}
    for entry in part["tensors"]:
        if entry.get("alias_of") is not None or not entry["nbytes"] or entry.get("crc32c") is None:
            continue
        starts = range(0, entry["nbytes"], block)
        if len(entry["crc32c"]) != len(starts):
            raise CorruptCheckpointError(f"the manifest of {where} lists {len(entry['crc32c'])} checksums for "
                                         f"tensor {entry['key']!r}, which needs {len(starts)}")
        by_shard.setdefault(entry["shard"], []).extend(
            (entry["offset"] + start, min(block, entry["nbytes"] - start), crc)
            for start, crc in zip(starts, entry["crc32c"], strict=True))
    return by_shard


class _Shard:
    __slots__ = ("checks", "name", "nbytes")

    def __init__(self, name: str, nbytes: int, checks: list[tuple[int, int, int]]) -> None:
        self.name, self.nbytes, self.checks = name, nbytes, checks


def _shards(manifest: dict[str, Any], where: str) -> list[_Shard]:
    checksum = manifest.get("checksum")
    block = checksum["block_bytes"] if isinstance(checksum, dict) else None
    shards = []
    for part in _parts(manifest):
        checks = _checks(part, block, where) if block else {}
        shards += [_Shard(s["name"], s["nbytes"], checks.get(index, [])) for index, s in enumerate(part["shards"])]
    return shards


def _batches(shards: list[_Shard], budget_bytes: int) -> list[list[_Shard]]:
    """Consecutive shards, each batch within ``budget_bytes`` (a larger shard is a batch of its own)."""
    batches: list[list[_Shard]] = []
    size = 0
    for shard in shards:
        if not batches or size + shard.nbytes > budget_bytes:
            batches.append([])
            size = 0
        batches[-1].append(shard)
        size += shard.nbytes
    return batches


class DrainBuffers:
    """Page-aligned host buffers by slot (two for the batches of a whole-file copy, one per part in flight
    for a streamed one), kept between copies."""

    def __init__(self) -> None:
        self._buffers: list[mmap.mmap | None] = []

    def get(self, slot: int, nbytes: int) -> mmap.mmap:
        self._buffers += [None] * (slot + 1 - len(self._buffers))
        buffer = self._buffers[slot]
        if buffer is None or len(buffer) < nbytes:
            if buffer is not None:
                buffer.close()
            buffer = mmap.mmap(-1, max(nbytes, 1))
            self._buffers[slot] = buffer
        return buffer

    @property
    def held_bytes(self) -> int:
        """The bytes of every buffer held now."""
        return sum(len(b) for b in self._buffers if b is not None)

    @property
    def slots(self) -> int:
        """How many buffers are held now."""
        return sum(b is not None for b in self._buffers)

    def close(self) -> None:
        for buffer in self._buffers:
            if buffer is not None:
                try:
                    buffer.close()
                except BufferError:  # a view of it is still referenced: it is freed with the last one
                    log.debug("a drain buffer is still viewed; left to the garbage collector")
        self._buffers = []


def _mismatch(name: str, where: str, got: int, crc: int) -> CorruptCheckpointError:
    """The error of a shard whose bytes do not match the manifest's CRC-32C: nothing of it is copied."""
    return CorruptCheckpointError(
        f"checksum mismatch in {name} of {where} (crc32c {got:#010x}, manifest {crc:#010x}): the damaged "
        "checkpoint is not copied", hint="the remote tier keeps its previous checkpoints")


def _read_batch(source: Store, batch: list[_Shard], buffer: mmap.mmap, *, threads: int, block_size: int,
                direct: bool) -> list[tuple[str, memoryview]]:
    """Read ``batch`` into ``buffer`` and check its CRC-32Cs: the views to write."""
    view = memoryview(buffer)
    files, offset, ranges, expected = [], 0, [], []
    for shard in batch:
        files.append((shard.name, view[offset:offset + shard.nbytes]))
        for start, nbytes, crc in shard.checks:
            ranges.append((offset + start, nbytes))
            expected.append((shard.name, crc))
        offset += shard.nbytes
    try:
        source.read_files(files, threads=threads, block_size=block_size, direct=direct)
        crcs = native.crc32c_ranges(buffer, ranges, threads) if ranges else []
        for got, (name, crc) in zip(crcs, expected, strict=True):
            if got != crc:
                raise _mismatch(name, source.url, got, crc)
    except BaseException:
        for _, part in files:  # the buffer is reused (or closed) after a failure: no view may outlive it
            part.release()
        view.release()
        raise
    return files


def _read_ahead(source: Store, batches: list[list[_Shard]], buffers: DrainBuffers,
                **io: Any) -> Iterator[list[tuple[str, memoryview]]]:
    """The batches, read and checked, each next one read while the caller writes the previous one."""
    with ThreadPoolExecutor(1, thread_name_prefix="ckptbench-drain-read") as reader:
        def read(index: int) -> Future:
            batch = batches[index]
            return reader.submit(_read_batch, source, batch, buffers.get(index % 2, sum(s.nbytes for s in batch)),
                                 **io)

        upcoming = read(0) if batches else None
        for index in range(len(batches)):
            assert upcoming is not None
            files = upcoming.result()
            upcoming = read(index + 1) if index + 1 < len(batches) else None
            try:
                yield files
            except BaseException:
                if upcoming is not None:
                    upcoming.cancel()
                raise
            finally:
                for _, view in files:
                    view.release()


class _Checker:
    """The CRC-32Cs of one shard checked as its parts are read in order: a checksummed block that spans
    parts is carried from one to the next."""

    def __init__(self, shard: _Shard, where: str) -> None:
        self._shard, self._where = shard, where
        self._checks = sorted(shard.checks)
        self._next = 0  # the first block not yet checked whole
        self._crc = 0  # the CRC-32C so far of that block (of its bytes before the current part)

    def part(self, start: int, view: memoryview) -> None:
        """Check the blocks that end inside ``view`` (the shard's bytes from ``start`` on), carry the rest."""
        end = start + len(view)
        while self._next < len(self._checks):
            offset, nbytes, crc = self._checks[self._next]
            if offset >= end:
                return
            lo, hi = max(offset, start), min(offset + nbytes, end)
            self._crc = native.crc32c(view[lo - start:hi - start], self._crc)
            if hi < offset + nbytes:
                return  # the block goes on in the next part
            if self._crc != crc:
                raise _mismatch(self._shard.name, self._where, self._crc, crc)
            self._next, self._crc = self._next + 1, 0


class _NotStreamed(Exception):
    """The target cannot upload this file part by part: the copy writes whole files."""


def _upload_workers(target: Store, threads: int) -> int:
    """Parts uploading at once: ``CKPTBENCH_DRAIN_UPLOADS``, else as many as a save to the target sends."""
    if knobs.DRAIN_UPLOADS > 0:
        return knobs.DRAIN_UPLOADS
    concurrency = getattr(target, "concurrency", None)
    return max(1, concurrency(threads) if callable(concurrency) else threads)


def _stream_shards(source: Store, target: Store, shards: list[_Shard], buffers: DrainBuffers, *, budget: int,
                   threads: int, block_size: int, direct: bool, moved: Callable[[], None]) -> list[str]:
    """Copy ``shards`` to a target that uploads files part by part (``upload_in_parts``): each shard is
    read from ``source`` one part at a time into a free part buffer, checked, and handed to an upload
    worker while the next part is read; a buffer is free again once its part is uploaded. At most
    ``slots`` parts (read, waiting or uploading) are held at once: min(``budget`` // part size, upload
    workers + 1), at least 2. Every object is completed only after every shard was read and checked,
    so a damaged source completes none. The names completed; on an error every upload is aborted
    (objects completed included), and it is raised.

    Raises _NotStreamed (nothing written) when the target declines the first shard."""
    opener = getattr(target, "upload_in_parts", None)
    if opener is None or not shards:
        raise _NotStreamed
    workers = _upload_workers(target, threads)
    uploads: list[Any] = []
    free: queue.SimpleQueue[int] = queue.SimpleQueue()
    failed: list[BaseException] = []
    slots = 0

    def upload(part: Any, index: int, view: memoryview, slot: int) -> None:
        try:
            if not failed:
                part.put(index, view)
                moved()
        except BaseException as exc:
            failed.append(exc)
            raise
        finally:
            view.release()
            free.put(slot)

    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="ckptbench-drain-up") as pool:
            futures: list[Future] = []
            try:
                for shard in shards:
                    part = opener(shard.name, shard.nbytes, part_bytes=knobs.DRAIN_PART_BYTES or None)
                    if part is None:
                        if uploads:
                            raise RuntimeError(f"{target.url} declined a part upload after accepting one")
                        raise _NotStreamed
                    uploads.append(part)
                    if not slots:
                        slots = max(2, min(budget // part.part_bytes, workers + 1))
                        for slot in range(slots):
                            free.put(slot)
                    checker = _Checker(shard, source.url)
                    for index in range(part.parts):
                        start = index * part.part_bytes
                        nbytes = min(part.part_bytes, shard.nbytes - start)
                        slot = free.get()
                        if failed:
                            raise failed[0]
                        view = memoryview(buffers.get(slot, part.part_bytes))[:nbytes]
                        try:
                            if nbytes:
                                source.read_ranges([(shard.name, start, view)], threads=threads,
                                                   block_size=block_size, direct=direct)
                                checker.part(start, view)
                            moved()
                            futures.append(pool.submit(upload, part, index, view, slot))
                        except BaseException:
                            view.release()
                            raise
                for future in futures:
                    future.result()
            except BaseException:
                failed.append(RuntimeError("the copy failed"))  # queued parts upload nothing
                raise
        for part in uploads:
            part.complete()
            moved()
    except BaseException:
        for part in uploads:
            try:
                part.abort()
            except Exception as exc:  # noqa: BLE001 - the next copy or retention sweeps them
                log.info("could not abort the upload of %s to %s: %s", part.name, target.url, exc)
        raise
    return [shard.name for shard in shards]


def copy_checkpoint(source: Store, target: Store, *, step: int, threads: int, block_size: int, direct: bool,
                    buffers: DrainBuffers | None = None, buffer_bytes: int | None = None,
                    progress: Callable[[], None] | None = None) -> DrainResult:
    """Copy the committed checkpoint of ``source`` to ``target``: shards durable, then the manifest.

    ``progress()`` is called whenever the copy moves on: a part or batch of shards read (and checked), a
    part uploaded or a batch written, an object completed, the manifest committed.

    Nothing is written when ``target`` already holds this very checkpoint (the same save id). The
    target's save lock is held throughout (a save or copy already there: CheckpointLockedError);
    after the commit, files of older or crashed copies there are removed. A copy that fails before
    its commit removes the shards it wrote.

    Raises:
        NotACheckpointError: ``source`` holds no committed checkpoint.
        CorruptCheckpointError: a shard of ``source`` fails its checksum (nothing is committed).
        OSError / StorageIOError / CheckpointLockedError: from the stores.
    """
    started = time.perf_counter()
    manifest = mf.read_manifest(source)
    mf.check_layout(manifest, source.url)  # shard names inside the checkpoint, ranges inside the shards
    shards = _shards(manifest, source.url)
    total = sum(s.nbytes for s in shards)
    try:
        there = mf.read_manifest(target)
    except NotACheckpointError:
        there = None
    if there is not None and there.get("save_id") == manifest.get("save_id"):
        return DrainResult(step, total, len(shards) + 1, time.perf_counter() - started, copied=False)
    own = buffers or DrainBuffers()
    budget = buffer_bytes or knobs.DRAIN_BUFFER_BYTES
    moved = progress or (lambda: None)
    names = [s.name for s in shards]
    target.prepare()
    written: list[str] = []
    committed = False
    try:
        with acquire_save_lock(target) as lock:
            try:
                written = _stream_shards(source, target, shards, own, budget=budget, threads=threads,
                                         block_size=block_size, direct=direct, moved=moved)
            except _NotStreamed:
                batches = _read_ahead(source, _batches(shards, max(1, budget // 2)), own, threads=threads,
                                      block_size=block_size, direct=direct)
                with contextlib.closing(batches):  # a failed write releases the batch read ahead at once
                    for files in batches:
                        moved()
                        target.write_files(files, threads=threads, block_size=block_size, direct=direct)
                        written += [name for name, _ in files]
                        moved()
            with lock.committing(target, names):
                mf.commit(target, manifest)
                committed = True
                moved()
                target.remove(mf.stale_files(target, set(names)))
    except BaseException:
        if not committed and written:
            try:
                target.remove(written)
            except Exception as exc:  # noqa: BLE001 - the next copy or retention sweeps them
                log.info("could not remove the shards of the failed copy to %s: %s", target.url, exc)
        raise
    finally:
        if buffers is None:
            own.close()
    return DrainResult(step, total, len(shards) + 1, time.perf_counter() - started)


#: ioprio_set(2) by machine (Linux); its "who" is a thread id, and the threads a thread starts inherit it.
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273, "s390x": 282}
_IOPRIO_IDLE = 3 << 13  # IOPRIO_CLASS_IDLE: disk time only when no other process wants the disk


def _idle_io(tid: int) -> None:
    """The thread's disk I/O in the idle class (its reads wait for local saves' writes; schedulers that keep
    no classes ignore it)."""
    import ctypes
    import platform

    number = _IOPRIO_SET.get(platform.machine())
    if number is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 1, tid, _IOPRIO_IDLE) != 0:  # IOPRIO_WHO_PROCESS
        log.debug("could not put the drain's I/O in the idle class: %s", os.strerror(ctypes.get_errno()))


def lower_priority() -> None:
    """Lower the calling thread's CPU priority by ``CKPTBENCH_DRAIN_NICE`` and, with
    ``CKPTBENCH_DRAIN_IDLE_IO``, put its disk I/O in the idle class (on Linux a thread's nice value and
    I/O priority are its own, and the threads it starts inherit them: the engine's and the S3 uploads'
    workers). A drain in the background then takes the CPU and the disk that local saves and training
    leave; it is not slowed on a machine with idle cores and an idle disk."""
    if not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    if knobs.DRAIN_NICE > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + knobs.DRAIN_NICE))
        except OSError as exc:
            log.debug("could not lower the drain's priority: %s", exc)
    if knobs.DRAIN_IDLE_IO and sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            _idle_io(tid)


_worker_buffers: DrainBuffers | None = None
_worker_progress: Any = None  # the shared counter DrainProcess watches: (moves so far, this process's pid)


def _start_worker(progress: Any) -> None:
    """In the drain process: die with the thread that started it (Linux; a parent killed by SIGKILL takes
    its drain along, as a thread would go), lower its priority, keep one pair of buffers, say its pid."""
    global _worker_buffers, _worker_progress
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    lower_priority()
    _worker_buffers = DrainBuffers()
    _worker_progress = progress
    progress[1] = os.getpid()


def _moved() -> None:
    _worker_progress[0] += 1


def _copy_in_worker(source: tuple[str, dict | None], target: tuple[str, dict | None], step: int,
                    io: dict[str, Any]) -> DrainResult:
    from ckptbench.storage.store import open_store

    _moved()
    return copy_checkpoint(open_store(*source), open_store(*target), step=step, buffers=_worker_buffers,
                           progress=_moved, **io)


#: The name the drain's processes carry (``_drain_context``): spawn leaves the caller's main module out of them.
_WORKER_NAME = "ckptbench-drain"


class _DrainSpawnProcess(multiprocessing.context.SpawnProcess):
    """A spawned process named ``_WORKER_NAME-…``: ``_drain_context`` keeps the caller's main module out of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.name = f"{_WORKER_NAME}-{self.name}"


class _DrainSpawnContext(multiprocessing.context.SpawnContext):
    Process = _DrainSpawnProcess


def _drain_context() -> Any:
    """A "spawn" context whose processes never import the caller's main module.

    A spawned child normally imports the parent's ``__main__`` again (as ``__mp_main__``, from its path or
    its ``-m`` name) so that functions defined there can be unpickled; a training script without an
    ``if __name__ == "__main__":`` guard then runs its top level, training included, a second time in the
    drain process. Everything the drain runs is in ckptbench's own modules, so its processes (named
    ``_WORKER_NAME``) are given no main module to import; other processes are spawned as before."""
    from multiprocessing import spawn

    if not getattr(spawn.get_preparation_data, "_ckptbench", False):
        parent = spawn.get_preparation_data

        def get_preparation_data(name: str) -> dict[str, Any]:
            data = parent(name)
            if str(name).startswith(_WORKER_NAME):
                data.pop("init_main_from_name", None)
                data.pop("init_main_from_path", None)
            return data

        get_preparation_data._ckptbench = True  # type: ignore[attr-defined]
        spawn.get_preparation_data = get_preparation_data
    return _DrainSpawnContext()


class DrainProcess:
    """Copies run in a process of their own, started on the first copy and kept for the next ones.

    Why a process: a copy to object storage runs Python (the S3 client signs and sends every part),
    and on a thread of the training process it would contend for the GIL with every save's staging,
    which takes the GIL back once per tensor: local saves would stall longer while a drain runs. The
    process runs at the drain's lower priority (``CKPTBENCH_DRAIN_NICE``) and ends with the thread that
    started it (``close()``, or that thread's death). Locations go to it as (URL, storage options).

    A watchdog: a copy that makes no progress (no part or batch of shards read or written, no commit) for
    ``timeout_s`` seconds (default ``CKPTBENCH_DRAIN_TIMEOUT_S``) has its process killed and raises
    :class:`~ckptbench.errors.DrainStalledError`; the next copy starts another process. What the
    killed copy wrote is never committed (its manifest comes last) and is swept by the next commit.
    """

    def __init__(self, timeout_s: float | None = None) -> None:
        self.timeout_s = knobs.DRAIN_TIMEOUT_S if timeout_s is None else timeout_s
        if not self.timeout_s > 0:
            raise ValueError(f"drain timeout {self.timeout_s!r} must be a positive number of seconds")
        self._pool: Any = None
        self._progress: Any = None  # [moves, pid] shared with the process
        self._pause_lock = threading.Lock()
        self._pauses = 0  # paused() blocks in progress
        self._stopped_pid = 0  # the process paused() stopped
        self._pause_epoch = 0  # paused() blocks so far: the watchdog does not count their time

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The drain process stopped (SIGSTOP) inside this block and continued (SIGCONT) after it: while a
        local save stages, training is blocked, and the drain must not take the CPU from it (nor its reads
        and uploads the disk and the network). Copies in flight lose the block's time, no more; the
        watchdog does not count it. Nested blocks (saves from several threads) stop it once. A no-op
        without a process, or with ``CKPTBENCH_DRAIN_PAUSE=0``."""
        import signal

        with self._pause_lock:
            self._pauses += 1
            self._pause_epoch += 1
            pid = int(self._progress[1]) if self._progress is not None and self._pool is not None else 0
            if self._pauses == 1 and pid and knobs.DRAIN_PAUSE:
                try:
                    os.kill(pid, signal.SIGSTOP)
                    self._stopped_pid = pid
                except ProcessLookupError:
                    pass
        try:
            yield
        finally:
            with self._pause_lock:
                self._pauses -= 1
                self._pause_epoch += 1
                if self._pauses == 0 and self._stopped_pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self._stopped_pid, signal.SIGCONT)
                    self._stopped_pid = 0

    @property
    def pid(self) -> int | None:
        """The drain process's pid (None before the first copy, or once it ended)."""
        return int(self._progress[1]) or None if self._pool is not None and self._progress is not None else None

    @property
    def moves(self) -> int:
        """How often the copies so far moved on (parts or batches read and written, commits): a copy in
        flight counts up."""
        return int(self._progress[0]) if self._progress is not None else 0

    def copy(self, source: tuple[str, dict | None], target: tuple[str, dict | None], *, step: int, threads: int,
             block_size: int, direct: bool) -> DrainResult:
        """:func:`copy_checkpoint` from ``source`` to ``target`` in the drain process; its error, raised here
        (DrainStalledError when the watchdog stopped it)."""
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        if self._pool is None:
            context = _drain_context()
            self._progress = context.RawArray("q", 2)
            self._pool = ProcessPoolExecutor(1, mp_context=context, initializer=_start_worker,
                                             initargs=(self._progress,))
        io = {"threads": threads, "block_size": block_size, "direct": direct}
        future = self._pool.submit(_copy_in_worker, source, target, step, io)
        seen, since = (self._progress[0], self._pause_epoch), time.monotonic()
        try:
            while True:
                try:
                    return future.result(timeout=min(1.0, self.timeout_s / 4))
                except TimeoutError:
                    now = time.monotonic()
                    # a process still starting (its pid not yet said: imports on a busy host), or one paused
                    # meanwhile, is not stalled
                    if (self._progress[0], self._pause_epoch) != seen or not self._progress[1] or self._pauses:
                        seen, since = (self._progress[0], self._pause_epoch), now
                    elif now - since >= self.timeout_s:
                        self._kill()
                        raise DrainStalledError(
                            f"the drain made no progress for {self.timeout_s:g} s (the remote tier does not "
                            f"answer?): its process was stopped", hint="it is tried again") from None
        except BrokenProcessPool:
            self.close()  # the process died (killed): the next copy starts another
            raise

    def _kill(self) -> None:
        """End the process now, mid-copy (its pid from the process itself); the next copy starts another."""
        import signal

        pool, self._pool = self._pool, None
        pid = int(self._progress[1]) if self._progress is not None else 0
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """End the process (after the copy in flight, if any)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class Drainer:
    """One background thread that copies the steps submitted to it, newest first, one at a time.

    ``copy(step)`` does one copy (:func:`copy_checkpoint` with the manager's tiers) and
    ``after(step)`` runs after each successful one (the remote tier's retention). A failed copy
    stays pending and is retried after ``retry_s`` seconds, or at once when a newer step is
    submitted (which replaces it). ``close()`` stops retries and waits for the copy in flight; at
    the interpreter's exit a copy in flight is finished first (it is never cut inside the engine).
    """

    def __init__(self, copy: Callable[[int], DrainResult], after: Callable[[int], None], *,
                 retry_s: float | None = None, name: str = "remote") -> None:
        self._copy = copy
        self._after = after
        self._retry_s = knobs.DRAIN_RETRY_S if retry_s is None else retry_s
        self._name = name
        self._cond = threading.Condition()
        self._pending: int | None = None
        self._draining: int | None = None
        self._drained: int | None = None
        self._error: str | None = None
        self._failures = 0
        self._stalls = 0
        self._last: DrainResult | None = None
        self._retry_at = 0.0
        self._submitted = 0  # submissions (and last tries) so far
        self._failed = -1  # the submission whose latest attempt failed
        self._stopping = False
        self._thread: threading.Thread | None = None
        _live.add(self)

    def submit(self, step: int) -> None:
        """Queue ``step`` for copying (it replaces a step still waiting, which is then skipped)."""
        with self._cond:
            if self._stopping:
                return
            if self._pending is not None and self._pending != step:
                log.info("drain to the %s tier: step %d is skipped, step %d is newer", self._name, self._pending, step)
            self._pending = step
            self._retry_at = 0.0
            self._submitted += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = interrupts.QuietThread(target=self._run, name="ckptbench-drain", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def busy_steps(self) -> set[int]:
        """Steps waiting for a copy or being copied: the local tier must keep them."""
        with self._cond:
            return {s for s in (self._pending, self._draining) if s is not None}

    def status(self) -> DrainStatus:
        with self._cond:
            return self._status()

    def _status(self) -> DrainStatus:
        return DrainStatus(self._pending, self._draining, self._drained, self._error, self._failures, self._last,
                           self._stalls)

    def wait(self, timeout: float | None = None) -> DrainStatus:
        """Wait until nothing is pending or being copied, or the latest attempt failed (then its step
        stays pending for a retry), or ``timeout`` seconds passed; the status then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not (self._draining is None and (self._pending is None or self._failed == self._submitted)):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(interrupts.POLL_S if left is None else min(left, interrupts.POLL_S))
            return self._status()

    def close(self, *, last_try: bool = True) -> DrainStatus:
        """Stop: a step still pending gets one more attempt (``last_try``), the copy in flight is
        waited for; then no more copies. The final status (a step left undrained is logged)."""
        with self._cond:
            if last_try and self._pending is not None and not self._stopping:
                self._retry_at = 0.0
                self._submitted += 1
                self._cond.notify_all()
        if last_try:
            self.wait()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            while self._draining is not None:
                self._cond.wait(interrupts.POLL_S)
            if self._pending is not None:
                log.warning("drain to the %s tier: step %d was not copied (%s)", self._name, self._pending,
                            self._error or "closed before its copy")
        _live.discard(self)
        return self.status()

    def _run(self) -> None:
        lower_priority()
        while True:
            with self._cond:
                while not self._stopping and (self._pending is None or time.monotonic() < self._retry_at):
                    wait_s = None if self._pending is None else self._retry_at - time.monotonic()
                    self._cond.wait(wait_s)
                if self._stopping:
                    return
                step, self._pending, self._draining = self._pending, None, self._pending
                submission = self._submitted
            assert step is not None
            error: BaseException | None = None
            result: DrainResult | None = None
            try:
                result = self._copy(step)
                self._after(step)
            except BaseException as exc:  # noqa: BLE001 - reported through status() and the log
                error = exc
            with self._cond:
                self._draining = None
                if error is None:
                    assert result is not None
                    self._drained, self._last, self._error, self._failures = step, result, None, 0
                    log.info("drained step %d to the %s tier: %d bytes in %.2f s", step, self._name, result.bytes,
                             result.seconds)
                else:
                    self._error = f"step {step}: {error}"
                    self._failures += 1
                    self._stalls += isinstance(error, DrainStalledError)
                    self._failed = submission
                    if self._pending is None:  # nothing newer came meanwhile: retry this one later
                        self._pending = step
                        self._retry_at = time.monotonic() + self._retry_s
                    log.warning("drain to the %s tier failed (attempt %d; retried in %g s or at the next save): %s",
                                self._name, self._failures, self._retry_s, self._error)
                self._cond.notify_all()


#: Drainers not closed yet: the interpreter's exit stops their retries and lets a copy in flight finish.
_live: set[Drainer] = set()


def _stop_at_exit() -> None:
    for drainer in list(_live):
        drainer.close(last_try=False)


# A threading exit hook, as checkpoint/at_exit.py explains: it runs before concurrent.futures' own (the
# S3 store's part uploads need its pools) and before daemon threads are cut off mid-call.
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_stop_at_exit)
else:  # pragma: no cover - CPython before 3.9
    import atexit

    atexit.register(_stop_at_exit)
