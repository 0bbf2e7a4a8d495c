"""Opening what ckptbench does not fully own: checkpoints, benchmark targets, report outputs, configs.

Someone else (another user of a shared directory, whoever handed over a checkpoint) may have planted
a symlink, a FIFO or a device under a name ckptbench uses, or may swap a directory for a symlink
while a run works in it. Every such open goes through here, under four rules:

- **The last component is never followed** (``O_NOFOLLOW``): a planted symlink is refused, not
  written through or read from.
- **Only regular files hold data** (``fstat`` after the open): FIFOs, devices and sockets are
  refused. The open itself is non-blocking, so a FIFO that nobody writes cannot hang it.
- **Inside a directory a run works in** (a checkpoint, a scratch directory) every open, rename,
  unlink and mkdir is relative to a descriptor of that directory (:class:`Directory`, ``openat``
  and friends): renaming the directory away and putting a symlink in its place redirects nothing.
  Code that needs a path (the engine, torch, fio) gets :meth:`Directory.path_of`, a path through
  ``/proc/PID/fd`` that names the directory held open, not whatever has its name now.
- **Outputs** (:func:`write_output`) are written under a fresh random name (``O_EXCL``) in the
  destination's directory and renamed over the final name, which replaces a planted symlink
  instead of writing through it. **Documents** (manifests, configs) are read up to a cap
  (:func:`read_capped`), so ``/dev/zero`` or a huge file cannot exhaust memory.

Errors: :class:`~ckptbench.errors.UnsafeFileError` (one line naming the path and what it is);
other ``OSError`` pass through for the caller to word.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import secrets
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from ckptbench.errors import UnsafeFileError
from ckptbench.units import format_size

log = logging.getLogger(__name__)

PROC_FD = "/proc/self/fd"
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
#: Largest manifest (``manifest.json``, DCP ``.metadata``) a load reads; a real one of a million
#: tensors is about 300 MB.
MAX_MANIFEST_BYTES = 1 << 30
#: Largest TOML config or preset read (real ones are a few kB).
MAX_CONFIG_BYTES = 4 << 20
#: Largest result document (JSON) read by ``report``, ``recommend``, ``compare``.
MAX_RESULT_BYTES = 1 << 30
#: Deepest nesting of tables and arrays accepted in a TOML config (real ones nest 2 deep).
MAX_TOML_DEPTH = 32


def describe_mode(mode: int) -> str:
    """What a file is, from its ``st_mode`` (for error messages)."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _refused(shown: str, what: str) -> UnsafeFileError:
    return UnsafeFileError(f"{shown} is {what}, not a regular file: ckptbench does not open it",
                           hint="someone may have planted it; remove it, or use a directory only you can write to")


def open_regular(name: str | os.PathLike, flags: int = os.O_RDONLY, *, dir_fd: int | None = None,
                 mode: int = 0o644, shown: str | None = None) -> int:
    """A descriptor of the regular file ``name`` (relative to ``dir_fd`` when given), opened with
    ``flags`` plus ``O_NOFOLLOW | O_CLOEXEC``. Raises UnsafeFileError for a symlink (also a dangling
    one, with ``O_CREAT``), FIFO, device, socket or directory, and, opened for writing, for a file with
    other hard links (someone else's file planted under a name ckptbench writes); other OSError as they come."""
    shown = shown or os.fspath(name)
    try:
        fd = os.open(name, flags | _NOFOLLOW | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(shown, "a symbolic link") from None
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EISDIR, errno.EOPNOTSUPP):
            kind = _lstat_kind(name, dir_fd)
            raise _refused(shown, kind) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(shown, describe_mode(st.st_mode))
        if flags & (os.O_WRONLY | os.O_RDWR) and st.st_nlink > 1:
            raise UnsafeFileError(f"{shown} is a hard link to another file (it has {st.st_nlink} names): ckptbench "
                                  "does not write to it", hint="someone may have planted it; remove it, or use a "
                                  "directory only you can write to")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lstat_kind(name: str | os.PathLike, dir_fd: int | None) -> str:
    try:
        return describe_mode(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return "not a regular file"


def _check_foreign_link(path: Path, shown: str) -> None:
    """Refuse ``path`` when its last component is a symlink that neither this user nor the owner of
    the directory holding it made (the kernel's ``protected_symlinks`` rule, applied everywhere):
    another user's link in a shared directory must not choose where a checkpoint goes."""
    try:
        st = os.lstat(path)
        if not stat.S_ISLNK(st.st_mode) or st.st_uid == os.geteuid():
            return
        parent = os.stat(path.parent if str(path.parent) else ".")
    except OSError:
        return
    if st.st_uid != parent.st_uid:
        raise UnsafeFileError(f"{shown} is a symbolic link made by another user (uid {st.st_uid}) in a directory "
                              f"they do not own: ckptbench does not follow it",
                              hint="give the real path, or remove the link")


def read_capped(name: str | os.PathLike, max_bytes: int, *, dir_fd: int | None = None, shown: str | None = None,
                what: str = "file") -> bytes:
    """The bytes of the regular file ``name``, refusing (UnsafeFileError) one larger than ``max_bytes``:
    checked on its size first, and again while reading (a file that grows, a procfs file sized 0)."""
    shown = shown or os.fspath(name)
    fd = open_regular(name, os.O_RDONLY, dir_fd=dir_fd, shown=shown)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise _too_large(shown, what, size, max_bytes)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise _too_large(shown, what, None, max_bytes)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _too_large(shown: str, what: str, size: int | None, max_bytes: int) -> UnsafeFileError:
    has = f"{format_size(size)}" if size is not None else "more"
    return UnsafeFileError(f"{shown} is {has}, more than a {what} can be ({format_size(max_bytes)}): not read",
                           hint=f"this is not a {what} ckptbench wrote")


def read_text(path: str | os.PathLike, max_bytes: int, what: str = "file") -> str:
    """:func:`read_capped` decoded as UTF-8 (UnicodeDecodeError as it comes)."""
    return read_capped(path, max_bytes, what=what).decode("utf-8")


def loads_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads``, refusing nesting deeper than :data:`MAX_TOML_DEPTH` first (as a
    TOMLDecodeError, which callers already word as invalid TOML)."""
    import tomllib

    problem = toml_depth_problem(text)
    if problem is not None:
        raise tomllib.TOMLDecodeError(problem)
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError("values nested too deeply") from None


def toml_depth_problem(text: str, max_depth: int = MAX_TOML_DEPTH) -> str | None:
    """Why ``text`` nests deeper than ``max_depth`` (arrays and inline tables), or None. Checked before
    ``tomllib`` parses it: its parser recurses once per level and fails with RecursionError."""
    depth = deepest = 0
    in_string: str | None = None
    in_comment = False
    i = 0
    while i < len(text):
        c = text[i]
        if in_comment:
            in_comment = c != "\n"
        elif in_string:
            if c == "\\" and in_string == '"':
                i += 1
            elif text.startswith(in_string, i):
                i += len(in_string) - 1
                in_string = None
        elif c == "#":
            in_comment = True
        elif c in "\"'":
            in_string = c * 3 if text.startswith(c * 3, i) else c
            i += len(in_string) - 1
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > max_depth:
                return f"values nested more than {max_depth} levels deep"
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return None


def ensure_descriptors(count: int) -> None:
    """Raise this process's soft limit of open files (up to the hard one) so ``count`` more fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = len(os.listdir(PROC_FD)) + count + 64 if os.path.isdir(PROC_FD) else count + 256
    if soft != resource.RLIM_INFINITY and wanted > soft:
        new = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            log.info("raised the open-file limit from %d to %d", soft, new)


def fd_path(fd: int) -> str:
    """A path that names what ``fd`` holds open, for code that takes paths only (Linux ``/proc``). By
    process id, not ``/proc/self``: a child process (fio, a torchrun worker) reaches it too."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def is_fd_path(path: str) -> bool:
    return path.startswith("/proc/") and "/fd/" in path[:32]


def have_proc_fd() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir(PROC_FD)


class Directory:
    """A directory held open by descriptor; every operation on its entries is relative to it, never
    to its path, and never follows a symlink among them. Close it (or use ``with``) when done."""

    def __init__(self, fd: int, shown: str) -> None:
        self.fd = fd
        self.shown = shown  # its path when opened: for messages only

    @classmethod
    def open(cls, path: str | os.PathLike, *, follow: bool = True, dir_fd: int | None = None,
             shown: str | None = None) -> Directory:
        """Open the directory ``path``. ``follow=False``: refuse a symlink as its last component (a
        directory inside one we hold). The path's earlier components are resolved as given."""
        shown = shown or os.fspath(path)
        if follow and dir_fd is None:
            _check_foreign_link(Path(path), shown)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        try:
            fd = os.open(path, flags, dir_fd=dir_fd)
        except OSError as exc:
            # O_NOFOLLOW | O_DIRECTORY on a symlink fails with ENOTDIR on Linux, ELOOP elsewhere
            if not follow and (exc.errno == errno.ELOOP or exc.errno == errno.ENOTDIR
                               and _lstat_kind(path, dir_fd) == "a symbolic link"):
                raise UnsafeFileError(f"{shown} is a symbolic link, not a directory: ckptbench does not follow it",
                                      hint="someone may have replaced it; use a directory only you can write to")\
                    from None
            raise
        return cls(fd, shown)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def shown_path(self, name: str) -> str:
        return f"{self.shown.rstrip('/')}/{name}"

    def path_of(self, name: str = "") -> str:
        """A path to ``name`` in this directory (the directory itself for "") that resolves through
        the descriptor: it reaches this directory even after its name was swapped."""
        base = fd_path(self.fd) if have_proc_fd() else self.shown
        return f"{base}/{name}" if name else base

    def open_file(self, name: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
        return open_regular(name, flags, dir_fd=self.fd, mode=mode, shown=self.shown_path(name))

    def read(self, name: str, max_bytes: int, what: str = "file") -> bytes:
        return read_capped(name, max_bytes, dir_fd=self.fd, shown=self.shown_path(name), what=what)

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def regular_size(self, name: str) -> int | None:
        """The size of the regular file ``name``; None when there is none; UnsafeFileError for anything else."""
        try:
            st = self.lstat(name)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise _refused(self.shown_path(name), describe_mode(st.st_mode))
        return st.st_size

    def exists(self, name: str) -> bool:
        try:
            self.lstat(name)
        except FileNotFoundError:
            return False
        return True

    def listdir(self) -> list[str]:
        return os.listdir(self.fd)

    def unlink(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def mkdir(self, name: str, mode: int = 0o700) -> None:
        os.mkdir(name, mode, dir_fd=self.fd)

    def subdir(self, name: str) -> Directory:
        """Open the directory ``name`` in this one (not through a symlink)."""
        return Directory.open(name, follow=False, dir_fd=self.fd, shown=self.shown_path(name))

    def rmtree(self, name: str) -> None:
        """Remove ``name`` and everything under it, relative to this directory, following no symlink."""
        import shutil

        shutil.rmtree(name, dir_fd=self.fd)

    def clear(self) -> None:
        """Remove everything in this directory (it stays), through :meth:`tree`: a symlink is removed,
        never what it points to, and a directory on another filesystem (a mount point inside) is left
        alone with what holds it. Tries every entry, then raises the first OSError met, if any."""
        first: OSError | None = None
        device = os.fstat(self.fd).st_dev
        for parent, name, st in self.tree():
            try:
                if st.st_dev != device:
                    raise OSError(errno.EXDEV, "on another filesystem (a mount point): left alone",
                                  parent.shown_path(name))
                if stat.S_ISDIR(st.st_mode):
                    parent.rmdir(name)
                else:
                    parent.unlink(name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                first = first or exc
        if first is not None:
            raise first

    def usage_bytes(self) -> int:
        """The bytes allocated to this directory and everything in it on its filesystem (as ``du``)."""
        own = os.fstat(self.fd)
        return own.st_blocks * 512 + sum(st.st_blocks * 512 for _, _, st in self.tree() if st.st_dev == own.st_dev)

    def tree(self) -> Iterator[tuple[Directory, str, os.stat_result]]:
        """Everything under this directory as (the directory holding it, its name, its ``lstat``), each
        directory after its contents. Follows no symlink and does not descend into a directory on
        another filesystem (its ``st_dev`` differs: a mount point) or one it cannot open (yielded all
        the same). Iterative, one descriptor per level."""
        device = os.fstat(self.fd).st_dev
        stack: list[tuple[Directory, Iterator[str], tuple[Directory, str, os.stat_result] | None]] = [
            (self, iter(self.listdir()), None)]
        try:
            while stack:
                directory, names, entry = stack[-1]
                name = next(names, None)
                if name is None:
                    stack.pop()
                    if directory is not self:
                        directory.close()
                    if entry is not None:
                        yield entry
                    continue
                try:
                    st = directory.lstat(name)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(st.st_mode) or st.st_dev != device:
                    yield directory, name, st
                    continue
                try:
                    child = directory.subdir(name)
                except (OSError, UnsafeFileError):  # gone, swapped for a symlink, out of descriptors
                    yield directory, name, st
                    continue
                try:
                    same = os.path.samestat(os.fstat(child.fd), st)  # not swapped for another one since
                    children = iter(child.listdir()) if same else None
                except OSError:
                    children = None
                if children is None:
                    child.close()
                    yield directory, name, st
                    continue
                stack.append((child, children, (directory, name, st)))
        finally:
            for directory, _, _ in stack:
                if directory is not self:
                    directory.close()

    def fsync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
                raise

    def rmdir(self, name: str) -> None:
        os.rmdir(name, dir_fd=self.fd)

    def owner_mismatch(self) -> bool:
        """Whether this directory belongs to another user than this process's (someone else's in its place)."""
        return os.fstat(self.fd).st_uid != os.geteuid()

    def same_as(self, name: str, parent: Directory) -> bool:
        """Whether ``name`` in ``parent`` is (still) this very directory, not a symlink or another one."""
        try:
            return os.path.samestat(os.fstat(self.fd), parent.lstat(name))
        except OSError:
            return False

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], Any], *, mode: int = 0o644,
                     durable: bool = False) -> None:
        """Write ``name`` whole or not at all: ``write(file)`` fills a fresh temporary file (random name,
        ``O_EXCL``, never a planted one) that is then renamed over ``name``; ``durable``: fsync it and
        the directory."""
        for _ in range(100):
            tmp = f".{name[:200]}.tmp-{secrets.token_hex(4)}"  # the form checkpoint sweeps recognise
            try:
                fd = self.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - 100 collisions of 32 random bits
            raise FileExistsError(errno.EEXIST, "no free temporary name", self.shown_path(name))
        try:
            with os.fdopen(fd, "wb", closefd=True) as out:
                write(out)
                out.flush()
                if durable:
                    os.fsync(out.fileno())
            self.replace(tmp, name)
        except BaseException:
            with contextlib.suppress(OSError):
                self.unlink(tmp)
            raise
        if durable:
            self.fsync()


def write_output(path: str | os.PathLike, write: Callable[[IO[bytes]], Any] | bytes) -> Path:
    """Write a report output (HTML, Markdown, PNG, JSON) to ``path`` through :meth:`Directory.write_atomic`:
    a planted symlink or predictable temp name in its directory receives nothing. ``write``: the bytes,
    or a function that writes them to the file it is given."""
    path = Path(path)
    body = write if callable(write) else (lambda out: out.write(write))  # type: ignore[misc]
    with Directory.open(path.parent if str(path.parent) else ".") as directory:
        directory.write_atomic(path.name, body, mode=0o666)  # as open() would: the umask decides
    return path


@contextlib.contextmanager
def opened_files(directory: Directory, names: list[str], flags: int, mode: int = 0o644, *,
                 reopened: int = 0) -> Iterator[list[int]]:
    """Each of ``names`` opened through :meth:`Directory.open_file`; all closed on exit. The soft limit of
    open files is raised for them and for ``reopened`` more descriptors per name, opened while these stay
    open (the engine's reopenings of them through ``/proc``)."""
    ensure_descriptors(len(names) * (1 + reopened))
    fds: list[int] = []
    try:
        for name in names:
            fds.append(directory.open_file(name, flags, mode))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)
