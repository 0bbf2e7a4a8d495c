"""Local and mounted filesystems (NVMe, CephFS/NFS/Lustre mounts): a directory driven by the engine."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ckptbench.errors import InsufficientSpaceError, TargetError
from ckptbench.units import format_size

log = logging.getLogger(__name__)

SCRATCH_PREFIX = ".ckptbench-scratch-"
_SYSTEM = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
           "/sys", "/usr", "/var")
#: Directories a benchmark refuses as its target unless forced: the scratch directory would land among
#: the system's own files (or in a pseudo-filesystem). Matched on the resolved path, so symlinks count;
#: where /bin is a link (merged /usr), /usr/bin is refused as well.
SYSTEM_DIRECTORIES = frozenset({*_SYSTEM, *(os.path.realpath(d) for d in _SYSTEM)})


@dataclass(frozen=True)
class MountInfo:
    """The /proc/mounts line whose mount point holds a path."""

    mount_point: str
    device: str
    fstype: str
    options: str


def mount_of(path: Path) -> MountInfo | None:
    """The mount holding ``path`` (longest mount-point prefix in /proc/mounts), or None off Linux."""
    real = os.path.realpath(path)
    best: MountInfo | None = None
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 4:
                    continue
                # /proc/mounts escapes spaces and friends as octal (\040).
                point = fields[1].encode().decode("unicode_escape")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and (best is None or len(point) >= len(best.mount_point)):
                    best = MountInfo(point, fields[0], fields[2], fields[3])
    except OSError:
        return None
    return best


#: The scratch directories and prefixes of this process that exist now, in creation order: what the
#: command line names when a second Ctrl-C makes it exit without cleaning up.
SCRATCH_IN_USE: list[str] = []


@contextmanager
def scratch_in_use(where: str) -> Iterator[None]:
    """``where`` listed in :data:`SCRATCH_IN_USE` while the block runs (its cleanup included)."""
    SCRATCH_IN_USE.append(where)
    try:
        yield
    finally:
        SCRATCH_IN_USE.remove(where)


def scratch_name(prefix: str = SCRATCH_PREFIX) -> str:
    """A name no earlier run used: the scratch prefix, this process's id and random hex."""
    return f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class LocalDirectory:
    """An existing, writable directory. Benchmarks write only inside a scratch directory of their own."""

    path: Path

    @classmethod
    def from_string(cls, text: str, *, force: bool = False) -> LocalDirectory:
        """Check ``text`` names an existing, writable directory (TargetError with one line if not).

        ``force``: accept a system directory (``SYSTEM_DIRECTORIES``, also through a symlink) as well.
        """
        if not text.strip():
            raise TargetError("the target is empty", hint="give a directory path")
        path = Path(text).expanduser()
        try:
            exists = path.exists()
            is_dir = exists and path.is_dir()
            resolved = path.resolve() if is_dir else path
        except (OSError, ValueError) as exc:  # a name too long, a NUL byte
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise TargetError(f"{text!r} cannot be used as a directory ({reason})",
                              hint="give an existing directory") from None
        if not exists:
            raise TargetError(f"{text!r} does not exist", hint="give an existing directory")
        if not is_dir:
            raise TargetError(f"{text!r} is a file, not a directory", hint="give the directory to benchmark")
        if str(resolved) in SYSTEM_DIRECTORIES and not force:
            shown = repr(text) if str(resolved) == text else f"{text!r} (resolves to {resolved})"
            raise TargetError(f"{shown} is a system directory: a benchmark would write its scratch files there",
                              hint="give a directory on the storage to measure, or --force if you mean it")
        if not os.access(path, os.W_OK | os.X_OK):  # also catches read-only mounts (EROFS), even for root
            raise TargetError(f"{text!r} is not writable", hint="pick a directory you can write to")
        return cls(resolved)

    def __str__(self) -> str:
        return str(self.path)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def require_free(self, needed_bytes: int) -> None:
        """Raise InsufficientSpaceError when fewer than ``needed_bytes`` are free."""
        usage = shutil.disk_usage(self.path)
        if usage.total == 0:  # ramfs and some FUSE filesystems report no size at all
            log.info("%s reports no size; free-space check skipped", self.path)
            return
        free = usage.free
        if free < needed_bytes:
            raise InsufficientSpaceError(
                f"{self.path} has {format_size(free)} free but the run needs {format_size(needed_bytes)}",
                hint="free space, or lower --size",
            )

    @contextmanager
    def scratch(self, shared_name: str | None = None) -> Iterator[Path]:
        """A fresh directory inside the target, removed on exit (also on Ctrl-C or error).

        Never touches anything that existed before: the name is new (mkdir fails if it exists).
        ``shared_name``: join the scratch directory another rank of a launch named (see
        :func:`scratch_name`); it may exist already (a shared filesystem) or not (node-local disks).
        """
        scratch = self.path / (shared_name or scratch_name())
        try:
            scratch.mkdir(mode=0o700, exist_ok=shared_name is not None)  # private: no one else reads or swaps files
        except PermissionError:
            raise TargetError(f"{self.path} is not writable", hint="pick a directory you can write to") from None
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise TargetError(f"{self.path} is not writable ({exc.strerror})", hint="pick a writable directory") from None
            # e.g. ENOENT in /proc, ENOSPC: nothing was written, so it is the target that cannot be used
            raise TargetError(f"cannot create a scratch directory in {self.path} ({exc.strerror})",
                              hint="pick a directory on a regular filesystem") from None
        log.info("scratch directory %s", scratch)
        with scratch_in_use(str(scratch)):
            try:
                yield scratch
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
                if scratch.exists():
                    log.warning("could not remove scratch directory %s", scratch)

    @contextmanager
    def reporting_full_disk(self, needs_bytes: int | None = None) -> Iterator[None]:
        """Turn a run's failure that ran out of space into one InsufficientSpaceError saying what the
        run needs (``needs_bytes``, when given) and what was free as it started. Use it inside
        :meth:`scratch`, so the failed run's files still take their space when it looks
        (:func:`_space_failure`). Other failures pass through unchanged.

        The free-space check before a run (:meth:`require_free`) passed, so the disk filled up meanwhile:
        something else wrote there, or the filesystem holds less than it reported."""
        free_at_start = self.free_bytes()
        try:
            yield
        except BaseException as exc:  # dcp's CheckpointException is a BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            reason = _space_failure(exc, self.path)
            if reason is None:
                raise
            # Not the free space after the failure: a writer's failed file can stay open, and
            # allocated, for as long as its exception lives.
            needs = f"the run needs {format_size(needs_bytes)}, " if needs_bytes is not None else ""
            raise InsufficientSpaceError(
                f"{self.path} ran out of space during the run ({reason}): {needs}{format_size(free_at_start)} "
                f"was free when it started",
                hint="free space (something else may be filling it) or lower --size") from exc


#: Below this much free space (or 1% of the filesystem, if less) a failed write found the disk full.
_FULL_BYTES = 64 * 2**20
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _space_failure(exc: BaseException, path: Path) -> str | None:
    """Why ``exc`` (raised while writing under ``path``) is a full disk, or None if it is not.

    Full when an error in its chain is ENOSPC/EDQUOT (also as text: writers like safetensors and fio
    report the OS error in their message only), or when ``path``'s filesystem is nearly full right
    now (torch.save and dcp fail with a C++ stream error that names no cause)."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    for error in chain:
        if isinstance(error, InsufficientSpaceError):  # a ckptbench save's: it says more than the run can use
            return "a checkpoint save found too little space"
        if isinstance(error, OSError) and error.errno in _SPACE_ERRNOS:
            return error.strerror or os.strerror(error.errno)
    for error in chain:
        for code in _SPACE_ERRNOS:
            if os.strerror(code) in str(error):
                return os.strerror(code)
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    if usage.total and usage.free < min(_FULL_BYTES, usage.total // 100):
        first = chain[0]
        text = str(first).strip().splitlines()[0] if str(first).strip() else ""
        return (f"{format_size(usage.free)} of {format_size(usage.total)} left when it failed with "
                f"{type(first).__name__}{': ' + text[:120] if text else ''}")
    return None
