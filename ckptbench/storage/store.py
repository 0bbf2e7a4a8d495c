"""The storage seam for checkpoints: a handful of primitives a backend implements; the writer,
the reader and the commit protocol are written once above them (``checkpoint/``).

Contract, in the order the writer calls it:

1. ``prepare()``            - make the location usable (mkdir / check the bucket); idempotent
2. ``write_files(files)``   - write whole named objects from memory; durable when it returns
                              (local: O_DIRECT or fdatasync per file + directory fsync; object
                              stores: completed uploads). On failure nothing half-written stays
                              visible under those names (partial files removed, multipart aborted).
3. ``put_atomic(name, b)``  - the commit: a small object that appears whole or not at all, durable
                              when it returns (local: temp + fsync + rename + fsync dir; S3: one PUT)
4. ``remove(names)``        - best effort, after the commit

Readers use ``get``, ``size`` and ``read_files`` (fill caller buffers, in parallel); ``list`` names
the objects directly under the location. Names are flat (no ``/``).

Optional capabilities are declared on :class:`Store` with defaults that say what a store without
them does; callers ask them instead of probing for methods:

- ``local_path``: the directory of a store on a mounted filesystem (the save lock uses flock
  there; None: object stores, which get a lease object instead).
- ``writes_follow_copy``: ``write_files(..., after=cow_copy)`` writes each block once a copy-on-write
  staging has copied its bytes (the engine waits for them); False: the caller finishes the copy first.
- ``pieces(names)``: the files ``names`` written piece by piece (``PieceWriter``: a buffer at an offset
  of a file, any number of times, then every file synced at once); what a save through a bounded
  staging ring needs (``checkpoint/ring.py``). ``writes_pieces`` says whether a store has it.
- ``write_gathered(files, ranges)``: whole files written, buffered and durable as ``write_files`` leaves
  them, from memory where their bytes already are (per file a table of (address, offset, nbytes)
  segments, zeros between them), with the CRC-32C of byte ranges computed on the way: a sync save
  without a staging copy (``checkpoint/saver.py``). ``writes_gathered`` says whether a store has it.
- ``conditional_writes``: ``put_if(name, data, etag=)`` (only if absent, or only over that version;
  the new ETag or None) and ``get_tagged(name)`` (bytes and ETag) exist, for the save lease
  (``checkpoint/lock.py``). ``S3Store`` has them; other object stores get a best-effort lease.
- ``server()``: where requests go (endpoint and bucket); what a server honours is probed once per server.
- ``read_ranges(ranges)``: fill caller buffers from byte ranges of objects (``ranged_reads``: only
  those bytes are read; default: each object whole through ``read_files``, then sliced).
- ``list_recursive()``: names under sub-prefixes too (default: ``list()``).
- ``abort_incomplete_uploads(owned)``: abort multipart uploads left open (default: none to abort).
- ``describe()``: where requests go and how credentials were found, never secrets (default: nothing).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench import knobs, native, safeio
from ckptbench.interrupts import QuietThread, join
from ckptbench.storage.local_target import is_network, mount_of

log = logging.getLogger(__name__)


_engine_lock = threading.Lock()
_engine_calls: list[list[native.IoResult]] = []


@contextlib.contextmanager
def engine_calls() -> Iterator[list[native.IoResult]]:
    """The engine results of every ``LocalStore`` write and read in this process while the block runs
    (a benchmark's timelines and latency histograms of a save or a load); nothing is kept otherwise."""
    calls: list[native.IoResult] = []
    with _engine_lock:
        _engine_calls.append(calls)
    try:
        yield calls
    finally:
        with _engine_lock:
            _engine_calls.remove(calls)


def _through(fds: list[int]) -> list[int]:
    """The descriptors the engine writes files through (``native.write``'s ``fds``): the files created and
    checked here, whatever their names come to name; none where there is no ``/proc`` to reopen them by
    (the engine then opens the paths, never through a symlink)."""
    return list(fds) if safeio.have_proc_fd() else []


#: Descriptors the engine opens per file while the caller's stay open (``safeio.opened_files``'s ``reopened``):
#: one for O_DIRECT, one buffered (an unaligned tail), each through ``/proc`` or the file's path.
_ENGINE_OPENS_PER_FILE = 2


def _fallback_named(reason: str, directory: safeio.Directory) -> str | None:
    """The engine's reason for not using O_DIRECT (None: it did), with the directory named as the user gave
    it instead of the /proc/PID/fd path the engine reached it by (gone with the process)."""
    return reason.replace(directory.path_of(), directory.shown) if reason else None


def _engine_result(result: native.IoResult) -> native.IoResult:
    """``result``, kept by every :func:`engine_calls` block open."""
    if _engine_calls:
        with _engine_lock:
            for calls in _engine_calls:
                calls.append(result)
    return result


@dataclass(frozen=True)
class WriteReport:
    """How ``write_files`` made the bytes durable."""

    direct: bool
    sync: str
    fallback_reason: str | None = None


class Store:
    """The base of every checkpoint store: the primitives, which each backend implements (see the
    module docstring for the order the writer calls them in), and the optional capabilities, whose
    defaults here say what a store without them does."""

    url: str

    # -- primitives ---------------------------------------------------------------------------

    def prepare(self) -> None:
        raise NotImplementedError

    def write_files(self, files: list[tuple[str, memoryview]], *, threads: int, block_size: int,
                    direct: bool) -> WriteReport:
        raise NotImplementedError

    def read_files(self, files: list[tuple[str, memoryview]], *, threads: int, block_size: int,
                   direct: bool) -> None:
        raise NotImplementedError

    def put_atomic(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, name: str) -> bytes:
        raise NotImplementedError

    def size(self, name: str) -> int | None:
        raise NotImplementedError

    def list(self) -> list[str]:
        raise NotImplementedError

    def remove(self, names: list[str]) -> None:
        raise NotImplementedError

    def free_bytes(self) -> int | None:
        raise NotImplementedError

    def is_dir_like(self) -> bool:
        raise NotImplementedError

    # -- optional capabilities ----------------------------------------------------------------

    #: The directory of a store on a mounted filesystem; None for object stores.
    local_path: Path | None = None
    #: Whether ``write_files`` takes ``after=`` (a copy-on-write staging it follows block by block).
    writes_follow_copy: bool = False
    #: Whether ``pieces`` is implemented (files written piece by piece, synced at the end).
    writes_pieces: bool = False
    #: Whether ``write_gathered`` is implemented (buffered writes straight from the caller's memory).
    writes_gathered: bool = False
    #: Whether ``put_if`` and ``get_tagged`` (conditional writes) are implemented.
    conditional_writes: bool = False
    #: Whether ``read_ranges`` reads only the ranges asked for (False: whole objects, then sliced).
    ranged_reads: bool = False

    def read_ranges(self, ranges: list[tuple[str, int, memoryview]], *, threads: int, block_size: int,
                    direct: bool) -> None:
        """Fill each ``(name, offset, view)``'s view with the bytes of ``name`` from ``offset`` on, in
        parallel where the store can. FileNotFoundError for a missing object; OSError ENODATA (naming
        it) when an object ends before a range does.

        This default reads every object named whole with ``read_files`` and copies the ranges out of
        it (memory: the objects' size); stores with ranged reads (``ranged_reads``) override it."""
        names = sorted({name for name, _, _ in ranges})
        buffers: dict[str, bytearray] = {}
        for name in names:
            size = self.size(name)
            if size is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or object", f"{self.url}/{name}")
            buffers[name] = bytearray(size)
        self.read_files([(name, memoryview(buffers[name])) for name in names], threads=threads,
                        block_size=block_size, direct=direct)
        for name, offset, view in ranges:
            data = buffers[name]
            if offset + len(view) > len(data):
                raise OSError(errno.ENODATA, f"{len(data)} bytes, fewer than the {offset + len(view)} to read",
                              f"{self.url}/{name}")
            view[:] = memoryview(data)[offset:offset + len(view)]

    def pieces(self, names: list[str]) -> contextlib.AbstractContextManager[PieceWriter]:
        """The files ``names`` created, to be written piece by piece (``writes_pieces``); durable when
        the block ends without an error, removed when it raises."""
        raise NotImplementedError

    def write_gathered(self, files: list[tuple[str, Any, int]], ranges: Any, *, threads: int,
                       block_size: int) -> tuple[WriteReport, list[int]]:
        """Write each ``(name, segments, size)`` file, buffered, from the memory its bytes are in:
        ``segments`` is an int64 table of (source address, offset in the file, nbytes) rows sorted by
        offset; the bytes between them are zeros. ``ranges``: an int64 table of (file index, offset,
        nbytes) rows, each inside one segment; their CRC-32C are returned, computed as the bytes are
        written. Durable and cleaned up on failure as ``write_files``. The caller keeps every source
        address valid and unchanged until it returns (``writes_gathered``)."""
        raise NotImplementedError

    def put_if(self, name: str, data: bytes, *, etag: str | None = None) -> str | None:
        """Write ``name`` only if it is absent (``etag`` None) or still that version: the new ETag, or
        None when the condition failed."""
        raise NotImplementedError

    def get_tagged(self, name: str) -> tuple[bytes, str]:
        """The bytes of ``name`` and their ETag."""
        raise NotImplementedError

    def server(self) -> str:
        """Where requests go: stores with the same server honour the same request conditions."""
        return self.url

    def list_recursive(self) -> list[str]:
        """Every name under the location, those under sub-prefixes too (as paths relative to it)."""
        return self.list()

    def sizes_recursive(self) -> dict[str, int]:
        """:meth:`list_recursive`'s names with their sizes in bytes. This default asks each one's size;
        stores whose listing carries sizes (S3, fsspec) take them from it, a request per page, not per name."""
        sizes = {name: self.size(name) for name in self.list_recursive()}
        return {name: size for name, size in sizes.items() if size is not None}

    def abort_incomplete_uploads(self, owned: Callable[[str], bool] | None = None, *, strict: bool = False) -> int:
        """Abort the multipart uploads left open under the location (of the names ``owned`` accepts);
        how many. Best effort, unless ``strict``: then StorageIOError when any could not be listed or
        aborted. Stores without multipart uploads have none."""
        return 0

    def describe(self) -> dict[str, Any]:
        """Where requests go and where credentials came from, for result files (never secrets)."""
        return {}

    def abandon(self) -> None:
        """After a save that failed before its commit: remove what ``prepare`` created for it (directories
        it made that are still empty). Object stores create nothing there."""

    def hold_unlinked(self) -> None:
        """Before removing a checkpoint found by listing: pin the location so that a symlink swapped in for
        it afterwards cannot redirect the removal. Only a mounted directory can be swapped so; elsewhere
        nothing to do."""

    def remove_location(self) -> bool:
        """Remove the location itself once it holds nothing, on storage reached by URL that has real
        directories (``prepare`` made one: fsspec's memory://, sftp://, ...); otherwise nothing, as on
        object stores, where a prefix with no objects under it is gone already. A mounted directory
        (``local_path``) is its owner's to remove. False when the location stays because something is
        still in it (a sub-directory) or its removal failed (logged)."""
        return True

    def directory(self) -> Any:
        """The ``safeio.Directory`` of a store on a mounted filesystem (``local_path`` set), held open:
        the save lock is taken relative to it."""
        raise NotImplementedError


def fsync_directory(path: Path) -> None:
    """fsync a directory; filesystems that cannot (some FUSE, tmpfs variants) are tolerated."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise
    finally:
        os.close(fd)


def _fsync_parents(created: list[Path]) -> None:
    """fsync the parent of each directory in ``created``, so that its new entry survives a power cut."""
    for path in created:
        try:
            fsync_directory(path.parent)
        except PermissionError:  # a parent one may write into but not read (mode 0333): nothing to open
            log.info("cannot open %s to fsync it: the new directory's entry may not survive a power cut",
                     path.parent)


class _Background:
    """``call(*args)`` on a thread that takes no signals; :meth:`result` waits for it and raises its error."""

    def __init__(self, call: Callable[..., None], *args: Any) -> None:
        self._error: BaseException | None = None

        def run() -> None:
            try:
                call(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to result()
                self._error = exc

        self._thread = QuietThread(target=run, name="ckptbench-fsync-dirs", daemon=True)
        self._thread.start()

    def result(self) -> None:
        join(self._thread)  # not Thread.join: a Ctrl-C inside it can abort the process (see interrupts.join)
        if self._error is not None:
            raise self._error


class PieceWriter:
    """Files of a :class:`LocalStore` open for writing, written piece by piece by the engine (no sync per
    piece); :meth:`finish` makes them durable. From ``LocalStore.pieces``."""

    def __init__(self, directory: safeio.Directory, fds: dict[str, int]) -> None:
        self._directory = directory
        self._fds = fds
        self._direct: bool | None = None
        self._fallback: str | None = None
        self.report: WriteReport | None = None  # once finished

    def write(self, pieces: list[tuple[str, int, memoryview]], *, threads: int, block_size: int,
              direct: bool) -> native.IoResult:
        """Write each (file name, offset, buffer) piece; aligned pieces (address, offset, length) go
        O_DIRECT where ``direct`` and the filesystem allow, the rest buffered; nothing is synced yet. On
        ext4 each piece's range is reserved first (``native.write``'s ``preallocate``): pieces of one file
        written side by side then do not take turns on its inode lock."""
        jobs = [(view, self._directory.path_of(name), offset) for name, offset, view in pieces]
        named = dict.fromkeys(name for name, _, _ in pieces)  # each file once, in the order the jobs name it
        result = _engine_result(native.write(jobs, threads=threads, block_size=block_size, direct=direct,
                                             sync="none", sync_dir=False, preallocate=True,
                                             fds=_through([self._fds[name] for name in named])))
        self._direct = result.direct_used if self._direct is None else self._direct and result.direct_used
        self._fallback = self._fallback or _fallback_named(result.fallback_reason, self._directory)
        return result

    def finish(self) -> WriteReport:
        """fdatasync every file, then fsync the directory: durable as ``write_files`` leaves them."""
        for fd in self._fds.values():
            os.fdatasync(fd)
        fsync_directory(Path(self._directory.path_of()))
        self.report = WriteReport(bool(self._direct), "fdatasync", self._fallback)
        return self.report


class LocalStore(Store):
    """A directory on a local or mounted filesystem, written and read by the native engine.

    The directory is held open by descriptor from its first use (:class:`~ckptbench.safeio.Directory`):
    every file is opened, renamed and removed relative to it, never through a symlink, and only
    regular files are read or written, so a checkpoint (or a directory shared with other users)
    holding a symlink or a FIFO cannot redirect a write, leak a file or hang a load."""

    writes_follow_copy = True

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.url = str(self.path)
        self.local_path = self.path
        self._dir: safeio.Directory | None = None
        self._created: list[Path] = []  # directories prepare() made, deepest last
        self._entries_synced: _Background | None = None  # prepare()'s fsyncs of their parents
        self._network: bool | None = None

    def _schedule(self, per_file: bool | None) -> str:
        """The engine's schedule: ``per_file`` when given, else one stream per file (``per-file``) on a
        network or FUSE mount, whose client reads ahead and writes back each file's stream in order
        (threads sharing a file's blocks defeat both), and shared blocks elsewhere."""
        if per_file is None:
            if self._network is None:
                mount = mount_of(self.path)
                self._network = mount is not None and is_network(mount.fstype)
            per_file = self._network
        return "per-file" if per_file else "shared"

    def directory(self) -> safeio.Directory:
        """The directory, opened on first use; FileNotFoundError while it does not exist."""
        if self._dir is None:
            self._dir = safeio.Directory.open(self.path)
        return self._dir

    def hold_unlinked(self) -> None:
        """Open the directory now, refusing a symlink as its last component (UnsafeFileError;
        FileNotFoundError when there is none): what follows works in the directory that was listed, not
        one a symlink swapped in for it points to. For removals of directories ckptbench found by listing."""
        if self._dir is None:
            self._dir = safeio.Directory.open(self.path, follow=False)

    def _existing(self) -> safeio.Directory | None:
        try:
            return self.directory()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def close(self) -> None:
        if self._dir is not None:
            self._dir.close()
            self._dir = None

    def is_dir_like(self) -> bool:
        return not self.path.exists() or self.path.is_dir()

    def prepare(self) -> None:
        """Create the directory (and missing parents); each new entry's parent is fsynced, or a
        power cut could take the new directory, and the checkpoint in it, with it. Those fsyncs run on
        a thread of their own while the shards are written (on a network filesystem each is a round
        trip to its metadata server); the writes of shards wait for them before they return durable, and
        so does :meth:`put_atomic` (the commit). The
        directories it made are removed again by :meth:`abandon` when the save fails before its commit."""
        created = []
        path = self.path
        while not path.exists() and path.parent != path:
            created.append(path)
            path = path.parent
        self.path.mkdir(parents=True, exist_ok=True)
        self._created = list(reversed(created))
        if self._created:
            self._entries_synced = _Background(_fsync_parents, list(self._created))
        self.directory()

    def _await_entries(self) -> None:
        """The new directories' entries durable (:meth:`prepare`'s fsyncs finished); their error, if any."""
        pending, self._entries_synced = self._entries_synced, None
        if pending is not None:
            pending.result()

    def abandon(self) -> None:
        """After a failed save: remove the directories :meth:`prepare` made, deepest first, where they
        are empty (a directory something else wrote into stays)."""
        with contextlib.suppress(OSError):
            self._await_entries()
        for path in reversed(self._created):
            try:
                path.rmdir()
            except OSError:
                break
        self._created = []

    def write_files(self, files: list[tuple[str, memoryview]], *, threads: int, block_size: int,
                    direct: bool, after: native.CowCopy | None = None, per_file: bool | None = None) -> WriteReport:
        """``after``: a copy-on-write staging still copying into the views; each block is written
        once its bytes are there (the caller finishes it afterwards, which says if it failed).
        ``per_file``: each file written by one thread from start to end (None: on a network or FUSE
        mount, ``_schedule``), else the threads share every file's blocks.

        Each file is created here first (regular, not through a symlink, no other hard link), then
        written by the engine through that very descriptor (reopened, never looked up by name again). On ext4 the
        engine reserves each file's O_DIRECT blocks first (``preallocate``), so threads sharing a file's
        blocks write them at once."""
        if not files:
            return WriteReport(direct=direct, sync="fdatasync")
        directory = self.directory()
        try:
            with safeio.opened_files(directory, [name for name, _ in files], os.O_WRONLY | os.O_CREAT,
                                     reopened=_ENGINE_OPENS_PER_FILE) as fds:
                jobs = [(view, directory.path_of(name), 0) for name, view in files]
                result = _engine_result(native.write(jobs, threads=threads, block_size=block_size, direct=direct,
                                                     sync="fdatasync", sync_dir=True, after=after,
                                                     schedule=self._schedule(per_file), preallocate=True,
                                                     fds=_through(fds)))
                self._await_entries()
        except OSError as exc:
            self.remove([name for name, _ in files])
            raise self._named(exc) from None
        except safeio.UnsafeFileError:
            self.remove([name for name, _ in files])
            raise
        return WriteReport(result.direct_used, result.sync, _fallback_named(result.fallback_reason, directory))

    writes_gathered = True

    def write_gathered(self, files: list[tuple[str, Any, int]], ranges: Any, *, threads: int, block_size: int,
                       per_file: bool | None = None) -> tuple[WriteReport, list[int]]:
        """``per_file`` as for :meth:`write_files`. Each file is created here (regular, not through a
        symlink) and the engine writes through that very descriptor: one open per file."""
        if not files:
            return WriteReport(direct=False, sync="fdatasync"), []
        with self._new_files([name for name, _, _ in files], reopened=0) as (directory, fds):
            jobs = [(directory.path_of(name), segments, size) for name, segments, size in files]
            result, crcs = native.write_gathered(jobs, ranges, threads=threads, block_size=block_size,
                                                 sync="fdatasync", sync_dir=True, schedule=self._schedule(per_file),
                                                 fds=fds)
            _engine_result(result)
            self._await_entries()
        return WriteReport(False, result.sync), crcs

    @property
    def writes_pieces(self) -> bool:  # type: ignore[override]
        """Not on a network or FUSE mount, whose files are written whole, one stream each (``_schedule``)."""
        return self._schedule(None) == "shared"

    @contextlib.contextmanager
    def _new_files(self, names: list[str], *, reopened: int) -> Iterator[tuple[safeio.Directory, list[int]]]:
        """The directory and the files ``names`` created in it (regular, not through a symlink), held open
        for the block (``reopened``: as ``safeio.opened_files``'s); all removed when it raises (an OSError
        names the file)."""
        directory = self.directory()
        try:
            with safeio.opened_files(directory, names, os.O_WRONLY | os.O_CREAT, reopened=reopened) as fds:
                yield directory, fds
        except OSError as exc:
            self.remove(names)
            raise self._named(exc) from None
        except BaseException:
            self.remove(names)
            raise

    @contextlib.contextmanager
    def pieces(self, names: list[str]) -> Iterator[PieceWriter]:
        """The files ``names`` created here (regular, not through a symlink) and held open while the
        block writes them piece by piece; fdatasynced and the directory fsynced when it ends (the
        writer's ``report`` says how), all removed when it raises (an OSError names the file)."""
        with self._new_files(names, reopened=_ENGINE_OPENS_PER_FILE) as (directory, fds):
            writer = PieceWriter(directory, dict(zip(names, fds, strict=True)))
            yield writer
            writer.finish()
            self._await_entries()

    def read_files(self, files: list[tuple[str, memoryview]], *, threads: int, block_size: int,
                   direct: bool, per_file: bool | None = None) -> None:
        """Fill each view from its file. Every file is opened here first (a regular file, not through a
        symlink, at least as long as its view: UnsafeFileError, or OSError ENODATA naming it) and the
        engine reads that very file.

        ``per_file`` (None: on a network or FUSE mount, ``_schedule``): each file is read as sequential
        streams, ``threads // len(files)`` of them (at least one), each a contiguous part read by one
        thread from start to end through a descriptor of its own (a client reads ahead per open file);
        else the threads share every file's blocks."""
        if not files:
            return
        directory = self.directory()
        schedule = self._schedule(per_file)
        streams = max(1, threads // len(files)) if schedule == "per-file" and safeio.have_proc_fd() else 1
        # No part smaller than a block: a small file is one stream.
        parts = [max(1, min(streams, -(-len(view) // block_size))) for _, view in files]
        names = [name for (name, _), n in zip(files, parts, strict=True) for _ in range(n)]
        with safeio.opened_files(directory, names, os.O_RDONLY, reopened=_ENGINE_OPENS_PER_FILE) as fds:
            jobs, first = [], 0
            for (name, view), n in zip(files, parts, strict=True):
                own, first = fds[first:first + n], first + n
                size = os.fstat(own[0]).st_size
                if size < len(view):
                    raise OSError(errno.ENODATA, f"{size} bytes, fewer than the {len(view)} to read",
                                  directory.shown_path(name))
                step = -(-len(view) // n // knobs.ALIGNMENT_BYTES) * knobs.ALIGNMENT_BYTES  # O_DIRECT may read them
                for k, fd in enumerate(own):
                    low, high = min(k * step, len(view)), min((k + 1) * step, len(view))
                    if k == 0 or high > low:
                        where = safeio.fd_path(fd) if safeio.have_proc_fd() else directory.path_of(name)
                        jobs.append((view[low:high], where, low))
            try:
                _engine_result(native.read(jobs, threads=threads, block_size=block_size, direct=direct, schedule=schedule))
            except OSError as exc:
                raise self._named(exc, {safeio.fd_path(fd): name for name, fd in zip(names, fds, strict=True)})\
                    from None

    ranged_reads = True

    def read_ranges(self, ranges: list[tuple[str, int, memoryview]], *, threads: int, block_size: int,
                    direct: bool) -> None:
        """As :meth:`read_files`, for byte ranges: every file is opened here first (regular, not through
        a symlink) and must reach the end of each range read from it (else OSError ENODATA naming it);
        the page cache is left as it is (ranges of one file may share pages)."""
        if not ranges:
            return
        directory = self.directory()
        names = sorted({name for name, _, _ in ranges})
        with safeio.opened_files(directory, names, os.O_RDONLY, reopened=_ENGINE_OPENS_PER_FILE) as fds:
            by_name = dict(zip(names, fds, strict=True))
            for name, offset, view in ranges:
                size = os.fstat(by_name[name]).st_size
                if size < offset + len(view):
                    raise OSError(errno.ENODATA, f"{size} bytes, fewer than the {offset + len(view)} to read",
                                  directory.shown_path(name))
            paths = {name: safeio.fd_path(fd) if safeio.have_proc_fd() else directory.path_of(name)
                     for name, fd in by_name.items()}
            try:
                _engine_result(native.read([(view, paths[name], offset) for name, offset, view in ranges],
                                           threads=threads, block_size=block_size, direct=direct, drop_cache=False))
            except OSError as exc:
                raise self._named(exc, {path: name for name, path in paths.items()}) from None

    def _named(self, exc: OSError, by_fd: dict[str, str] | None = None) -> OSError:
        """``exc`` with the file named by its path in the checkpoint, not through /proc/PID/fd."""
        filename = exc.filename if isinstance(exc.filename, str) else None
        if filename is None:
            return exc
        name = (by_fd or {}).get(filename) or (os.path.basename(filename) if safeio.is_fd_path(filename) else None)
        if name is None:
            return exc
        return type(exc)(exc.errno, exc.strerror, str(self.path / name))

    def put_atomic(self, name: str, data: bytes) -> None:
        self._await_entries()
        self.directory().write_atomic(name, lambda out: out.write(data), durable=True)

    def get(self, name: str, max_bytes: int = safeio.MAX_MANIFEST_BYTES) -> bytes:
        """The bytes of the regular file ``name`` (at most ``max_bytes``: UnsafeFileError beyond)."""
        directory = self._existing()
        if directory is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(self.path / name))
        return directory.read(name, max_bytes)

    def size(self, name: str) -> int | None:
        """The size of the regular file ``name``; None if absent; UnsafeFileError for a symlink or special file."""
        directory = self._existing()
        return None if directory is None else directory.regular_size(name)

    def list(self) -> list[str]:
        directory = self._existing()
        return [] if directory is None else directory.listdir()

    def remove(self, names: list[str]) -> None:
        directory = self._existing()
        if directory is None:
            return
        for name in names:
            try:
                directory.unlink(name)  # a symlink is removed itself, never what it points to
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("could not remove %s: %s", self.path / name, exc)

    def free_bytes(self) -> int | None:
        directory = self._existing()
        if directory is not None:
            usage = os.fstatvfs(directory.fd)
        else:
            probe = self.path.parent
            while not probe.exists():
                probe = probe.parent
            usage = os.statvfs(probe)
        return usage.f_bavail * usage.f_frsize if usage.f_blocks else None


#: Checkpoint stores by URL scheme, as "module:Class", imported on first use so that optional
#: dependencies (boto3, fsspec backends) stay optional. Schemes not listed go to the generic
#: fsspec store, which refuses protocols fsspec does not know.
STORES: dict[str, str] = {
    "s3": "ckptbench.storage.s3:S3Store",
    "s3a": "ckptbench.storage.s3:S3Store",
}
FSSPEC_STORE = "ckptbench.storage.fsspec_store:FsspecStore"


def open_store(url: str | os.PathLike, storage_options: dict | None = None) -> Store:
    """The Store for a checkpoint location, chosen by URL scheme: a path (or ``file://``) ->
    LocalStore; ``s3://`` -> S3Store; any other fsspec protocol -> FsspecStore. Opening does no I/O
    beyond resolving credentials; ``prepare`` checks the location."""
    import importlib

    from ckptbench.errors import UsageError
    from ckptbench.storage import scheme_of

    text = os.fspath(url)
    scheme = scheme_of(text)
    if scheme == "file" and re.match(r"^(s3a?|gcs?|gs|az|abfss?):(?!//)", text, re.IGNORECASE):
        raise UsageError(f"{text!r} is a malformed URL", hint="write SCHEME://BUCKET/PREFIX, e.g. s3://bucket/ckpt")
    if scheme == "file":
        if storage_options:
            raise UsageError("storage_options apply to object storage, not to a local path")
        return LocalStore(text.removeprefix("file://"))
    module_name, _, class_name = STORES.get(scheme, FSSPEC_STORE).partition(":")
    store_class = getattr(importlib.import_module(module_name), class_name)
    return store_class(text, storage_options)
