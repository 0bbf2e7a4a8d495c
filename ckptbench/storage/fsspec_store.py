"""Any other fsspec protocol (``gcs://``, ``az://``, ``memory://``, ...) as a checkpoint Store.

The generic path: correct on every fsspec filesystem, tuned for none. Files go through
``fs.open(..., "wb")`` (object-store implementations turn that into multipart uploads) with one
file per worker; reads fill the caller's buffers with ``readinto``. ``put_atomic`` is
``fs.pipe_file``: a single PUT on object stores (atomic there); on filesystems reached through
fsspec (sftp, ...) it is a plain write, so prefer a mount plus a local path for those.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ckptbench.errors import MissingDependencyError, StorageIOError, TargetError
from ckptbench.interrupts import Workers
from ckptbench.storage.store import Store, WriteReport

log = logging.getLogger(__name__)


def _filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str, str]:
    """(filesystem, protocol, root path) for ``url``; one-line errors for unknown or uninstalled protocols."""
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError:
        raise MissingDependencyError(f"{url!r} needs fsspec, which is not installed",
                                     hint="pip install fsspec") from None
    protocol = url.partition("://")[0].lower()
    if protocol not in known_implementations and protocol not in fsspec.registry:
        raise TargetError(f"{url!r}: unknown storage protocol {protocol!r}",
                          hint="give a local path, s3://BUCKET/PREFIX, or a protocol fsspec knows "
                               "(gcs, az, memory, ...)")
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        needed = known_implementations.get(protocol, {}).get("err") or str(exc)
        raise MissingDependencyError(f"{protocol}:// needs an fsspec backend that is not installed: {needed}") \
            from None
    # Options the URL carries (ftp://USER@HOST:PORT/path: host, port, username) count as given; explicit ones win.
    with _quiet_half_built(cls):
        try:
            fs = cls(**{**cls._get_kwargs_from_urls(url), **dict(storage_options or {})})
        except TypeError as exc:
            traceback.clear_frames(exc.__traceback__)  # (releases the half-built instance here, hook in place)
            raise TargetError(f"storage_options do not fit {protocol}:// ({exc})") from None
        except (OSError, ValueError) as exc:  # a filesystem that connects when built (ftp, sftp): no server there
            traceback.clear_frames(exc.__traceback__)
            raise TargetError(f"{protocol}:// filesystem cannot be opened: {exc}",
                              hint="check the host and port in the URL") from None
    root = cls._strip_protocol(url).rstrip("/")
    return fs, protocol, root


@contextmanager
def _quiet_half_built(cls: type) -> Iterator[None]:
    """Silences ``cls.__del__`` on an instance its ``__init__`` left half built (fsspec's FTP closes a
    connection it never opened): an "Exception ignored" traceback in the middle of a one-line error."""
    previous = sys.unraisablehook
    finalizer = getattr(cls, "__del__", None)

    def hook(unraisable: Any) -> None:
        if finalizer is None or unraisable.object is not finalizer:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


#: The fsspec filesystems whose ``rmdir`` was read and refuses a directory with anything in it (a real
#: directory: memory, a mount, sftp, ftp, smb; a folder of a GCS bucket with a hierarchical namespace):
#: the only ones asked to remove a location's directory. Listing it empty and removing it are two steps,
#: and a save may write in between; a recursive ``rmdir`` (pyarrow's ``delete_dir`` behind hdfs://) would
#: take that save's files. The object-store filesystems keep no directory below a bucket to remove.
_RMDIR_REFUSES_CONTENTS = frozenset({
    "fsspec.implementations.memory.MemoryFileSystem",
    "fsspec.implementations.local.LocalFileSystem",
    "fsspec.implementations.sftp.SFTPFileSystem",
    "fsspec.implementations.ftp.FTPFileSystem",
    "fsspec.implementations.smb.SMBFileSystem",
    "gcsfs.extended_gcsfs.ExtendedGcsFileSystem",
})


def _rmdir_refuses_contents(fs: Any) -> bool:
    """Whether ``fs``'s ``rmdir`` is one of :data:`_RMDIR_REFUSES_CONTENTS` (not a subclass's own)."""
    method = "_rmdir" if getattr(fs, "async_impl", False) else "rmdir"
    owner = next((cls for cls in type(fs).__mro__ if method in vars(cls)), None)
    return owner is not None and f"{owner.__module__}.{owner.__qualname__}" in _RMDIR_REFUSES_CONTENTS


class FsspecStore(Store):
    """A location ``PROTOCOL://path`` on an fsspec filesystem; objects are ``path/NAME``."""

    ranged_reads = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.fs, self.protocol, self.root = _filesystem(url, storage_options)
        self.url = f"{self.protocol}://{self.root}"
        self._made_root = False

    def __repr__(self) -> str:
        return f"FsspecStore({self.url!r})"

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def is_dir_like(self) -> bool:
        try:
            return not self.fs.isfile(self.root)
        except OSError:
            return True

    def free_bytes(self) -> int | None:
        return None

    def prepare(self) -> None:
        """Create the location's directory (where the filesystem has them); :meth:`abandon` removes it
        again only if it was not there before."""
        try:
            self._made_root = _rmdir_refuses_contents(self.fs) and not self.fs.exists(self.root)
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise TargetError(f"cannot create {self.url}: {exc}") from None

    def write_files(self, files: list[tuple[str, memoryview]], *, threads: int, block_size: int,
                    direct: bool) -> WriteReport:
        """One file per worker; on any failure every file of this call is removed."""

        def write_one(name: str, view: memoryview) -> None:
            with self.fs.open(self._path(name), "wb") as out:
                for start in range(0, len(view), block_size):
                    out.write(view[start:start + block_size])

        try:
            self._parallel(write_one, files, threads)
        except BaseException:
            self.remove([name for name, _ in files])
            raise
        return WriteReport(direct=False, sync=f"{self.protocol}-close")

    def read_files(self, files: list[tuple[str, memoryview]], *, threads: int, block_size: int,
                   direct: bool) -> None:
        self.read_ranges([(name, 0, view) for name, view in files], threads=threads, block_size=block_size,
                         direct=direct)

    def read_ranges(self, ranges: list[tuple[str, int, memoryview]], *, threads: int, block_size: int,
                    direct: bool) -> None:
        """Each range through its own open file: seek, then ``readinto`` the caller's buffer."""

        def read_one(name: str, offset: int, view: memoryview) -> None:
            with self.fs.open(self._path(name), "rb") as src:
                src.seek(offset)
                filled = 0
                while filled < len(view):
                    got = src.readinto(view[filled:])
                    if not got:
                        raise StorageIOError(f"{self.url}/{name} ended at byte {offset + filled}, expected "
                                             f"{offset + len(view)}")
                    filled += got

        self._parallel(read_one, [(name, offset, view) for name, offset, view in ranges], threads)

    @staticmethod
    def _parallel(fn: Any, jobs: list[tuple[Any, ...]], threads: int) -> None:
        """``fn(*job)`` for every job on up to ``threads`` workers; the last item of a job is a view (as bytes)."""
        if not jobs:
            return
        with Workers(min(threads, len(jobs)), "ckptbench-fsspec") as pool:
            for *args, view in jobs:
                pool.submit(fn, *args, view.cast("B") if view.format != "B" else view)
            pool.join()

    def put_atomic(self, name: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(name), bytes(data))

    def get(self, name: str) -> bytes:
        return self.fs.cat_file(self._path(name))

    def size(self, name: str) -> int | None:
        try:
            return int(self.fs.size(self._path(name)))
        except FileNotFoundError:
            return None

    def list(self) -> list[str]:
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        return [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") != "directory"]

    def list_recursive(self) -> list[str]:
        """Every file under the location, sub-directories included (``a/b`` relative names)."""
        return list(self.sizes_recursive())

    def sizes_recursive(self) -> dict[str, int]:
        """Every file under the location with its size, from one ``find`` with details."""
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return {}
        root = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        return {self.fs._strip_protocol(path).removeprefix(root): int(info.get("size") or 0)
                for path, info in found.items()}

    def remove_location(self) -> bool:
        """The location's directory, where the filesystem keeps one, it is empty and its ``rmdir`` would
        refuse it otherwise (:data:`_RMDIR_REFUSES_CONTENTS`: memory, sftp, ...; not hdfs). Never a
        top-level one: on object-store filesystems (gcsfs) that is a bucket, which their ``rmdir`` deletes.
        False when it stays because something is in it (a sub-directory) or ``rmdir`` failed (logged)."""
        if "/" not in self.root.strip("/") or not _rmdir_refuses_contents(self.fs):
            return True
        try:
            if self.fs.ls(self.root, detail=False):
                return False
            self.fs.rmdir(self.root)
        except FileNotFoundError:
            return True
        except (OSError, NotImplementedError) as exc:
            log.warning("could not remove the empty directory %s: %s", self.url, exc)
            return False
        return True

    def abandon(self) -> None:
        """The directory :meth:`prepare` made, where still empty; one that was there before stays."""
        if self._made_root:
            self._made_root = False
            self.remove_location()

    def remove(self, names: list[str]) -> None:
        for name in names:
            try:
                self.fs.rm_file(self._path(name))
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("could not remove %s/%s: %s", self.url, name, exc)
