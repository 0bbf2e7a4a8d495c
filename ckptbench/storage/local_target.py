"""Local and mounted filesystems (NVMe, CephFS/NFS/Lustre mounts): a directory driven by the engine."""

from __future__ import annotations

import contextlib
import errno
import grp
import io
import logging
import os
import pwd
import secrets
import shlex
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ckptbench import safeio
from ckptbench.errors import InsufficientSpaceError, TargetError, UnsafeFileError
from ckptbench.storage import owner as owners
from ckptbench.units import format_size

log = logging.getLogger(__name__)

SCRATCH_PREFIX = ".ckptbench-scratch-"
_SYSTEM = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
           "/sys", "/usr", "/var")
#: Directories a benchmark refuses as its target unless forced: the scratch directory would land among
#: the system's own files (or in a pseudo-filesystem). Matched on the resolved path, so symlinks count;
#: where /bin is a link (merged /usr), /usr/bin is refused as well.
SYSTEM_DIRECTORIES = frozenset({*_SYSTEM, *(os.path.realpath(d) for d in _SYSTEM)})


#: Filesystem types (the third field of /proc/mounts) served over a network or by a user-space daemon,
#: where O_DIRECT may be a synchronous round trip per request; any ``fuse.*`` type counts too.
NETWORK_FSTYPES = frozenset({
    "ceph", "nfs", "nfs4", "lustre", "gpfs", "beegfs", "wekafs", "9p", "cifs", "smb3", "smbfs", "glusterfs",
    "orangefs", "pvfs2", "afs", "ocfs2", "gfs2", "virtiofs", "fuse", "fuseblk", "panfs", "quobyte", "vastfs",
})


def is_network(fstype: str | None) -> bool:
    """Whether a filesystem type is a network or FUSE filesystem (not local block storage)."""
    if not fstype:
        return False
    return fstype in NETWORK_FSTYPES or fstype.startswith(("fuse.", "nfs"))


@dataclass(frozen=True)
class MountInfo:
    """The /proc/mounts line whose mount point holds a path."""

    mount_point: str
    device: str
    fstype: str
    options: str


def mount_of(path: Path, mounts: str | None = None) -> MountInfo | None:
    """The mount holding ``path`` (longest mount-point prefix in /proc/mounts, or in ``mounts``, text
    in its format), or None off Linux."""
    real = os.path.realpath(path) if mounts is None else os.path.normpath(path)
    best: MountInfo | None = None
    try:
        with open("/proc/mounts") if mounts is None else io.StringIO(mounts) as lines:
            for line in lines:
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


def shared_without_sticky_bit(path: Path) -> str | None:
    """Who else can write into ``path`` when that is someone and it lacks the sticky bit (which would
    stop them renaming or removing what others made there), else None. A group-writable directory
    whose group holds only its owner (a user private group) counts as private."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_mode & stat.S_ISVTX:
        return None
    if st.st_mode & stat.S_IWOTH:
        return "is writable by every user"
    if st.st_mode & stat.S_IWGRP and _group_has_others(st.st_gid, st.st_uid):
        return f"is writable by the other members of group {_group_name(st.st_gid)}"
    return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _group_has_others(gid: int, owner_uid: int) -> bool:
    """Whether users besides ``owner_uid`` belong to group ``gid`` (as members, or as their primary group)."""
    try:
        owner = pwd.getpwuid(owner_uid).pw_name
    except KeyError:
        owner = None
    try:
        if set(grp.getgrgid(gid).gr_mem) - {owner}:
            return True
    except KeyError:
        return True  # an unknown group: cannot tell who is in it
    return any(user.pw_gid == gid and user.pw_uid != owner_uid for user in pwd.getpwall())


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
    def from_string(cls, text: str, *, force: bool = False, forceable: bool = True) -> LocalDirectory:
        """Check ``text`` names an existing, writable directory (TargetError with one line if not).

        ``force``: accept a system directory (``SYSTEM_DIRECTORIES``, also through a symlink) and a directory
        others can write to without the sticky bit as well. ``forceable``: whether the command offers
        ``--force``; the refusals of those two suggest it only then.
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
                              hint="give a directory on the storage to measure"
                                   + (", or --force if you mean it" if forceable else ""))
        if not os.access(path, os.W_OK | os.X_OK):  # also catches read-only mounts (EROFS), even for root
            raise TargetError(f"{text!r} is not writable", hint="pick a directory you can write to")
        shared = shared_without_sticky_bit(resolved)
        if shared is not None and not force:
            raise TargetError(f"{text!r} {shared} and has no sticky bit: they could rename the run's scratch "
                              f"directory and plant symlinks in its place",
                              hint="use a directory only you can write to (or a sticky one like /tmp)"
                                   + (", or --force if you trust everyone who can write there" if forceable else ""))
        return cls(resolved)

    def __str__(self) -> str:
        return str(self.path)

    def server_on_this_host(self) -> bool | None:
        """Whether the storage's server runs on this host (as :meth:`ObjectTarget.server_on_this_host`):
        unknown for a directory (a network filesystem's servers are not looked up)."""
        return None

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def require_inodes(self, needed_files: int) -> None:
        """Raise InsufficientSpaceError when fewer inodes than ``needed_files`` are free (where the
        filesystem counts them: statvfs reports a total; ceph-fuse reports -1 free, no limit)."""
        fs = os.statvfs(self.path)
        if fs.f_files and 0 <= fs.f_favail < needed_files:
            raise InsufficientSpaceError(
                f"{self.path} has {fs.f_favail} free inodes of {fs.f_files} but the run creates {needed_files} "
                f"files and directories", hint="remove files there (the filesystem is out of inodes, not bytes)")

    def require_free(self, needed_bytes: int) -> None:
        """Raise InsufficientSpaceError when fewer than ``needed_bytes`` are free."""
        usage = shutil.disk_usage(self.path)
        if usage.total == 0:  # ramfs and some FUSE filesystems report no size at all
            log.info("%s reports no size; free-space check skipped", self.path)
            return
        free = usage.free
        self.warn_leftovers()
        if free < needed_bytes:
            leftovers = self._leftovers_found()
            dead = [f for f in leftovers if f.removable]
            unknown = [f for f in leftovers if f.state == UNKNOWN_OWNER]
            held = "".join(
                f"; {len(found)} scratch director{'y' if len(found) == 1 else 'ies'} {whose} there "
                f"{'holds' if len(found) == 1 else 'hold'} {format_size(sum(f.size_bytes or 0 for f in found))}"
                for found, whose in ((dead, "left by killed runs"), (unknown, "of unknown owner")) if found)
            raise InsufficientSpaceError(
                f"{self.path} has {format_size(free)} free but the run needs {format_size(needed_bytes)}{held}",
                hint=("`ckptbench clean " + shlex.quote(str(self.path)) + "` removes the killed runs' ones; "
                      if dead else "") + "free space, or lower --size",
            )

    def leftovers(self) -> list[Leftover]:
        """The entries directly in this directory named like a scratch directory, except this process's
        own ones in use, each with its owner's :attr:`Leftover.state`; sized when not live or elsewhere."""
        return find_leftovers(self.path)

    def _leftovers_found(self) -> list[Leftover]:
        """:meth:`leftovers`; none (and why, logged) when this directory cannot be read."""
        try:
            return self.leftovers()
        except OSError as exc:
            log.info("cannot look for leftover scratch directories in %s: %s", self.path, exc.strerror or exc)
            return []

    def warn_leftovers(self) -> None:
        """A warning for each scratch directory a killed run left here; a process looks at a directory
        once (a run opens several scratch directories in its target)."""
        if self.path in _WARNED:
            return
        _WARNED.add(self.path)
        for leftover in self._leftovers_found():
            if leftover.removable:
                log.warning("%s (%s) is a scratch directory a killed run left behind (pid %d, gone); remove it "
                            "with `ckptbench clean %s`", leftover.path, format_size(leftover.size_bytes or 0),
                            leftover.owner.pid if leftover.owner else 0, shlex.quote(str(self.path)))

    @contextmanager
    def scratch(self, shared_name: str | None = None) -> Iterator[Path]:
        """A fresh directory inside the target, removed on exit (also on Ctrl-C or error).

        Never touches anything that existed before: the name is new (mkdir fails if it exists).
        ``shared_name``: join the scratch directory another rank of a launch named (see
        :func:`scratch_name`); it may exist already (a shared filesystem) or not (node-local disks).

        The path yielded reaches the directory through a descriptor held open for the block
        (``/proc/self/fd/N``, :meth:`safeio.Directory.path_of`): if someone renames the scratch
        directory away and puts a symlink in its place, every write, read and delete of the run,
        and the cleanup, still go to the scratch directory itself, never through the link.
        """
        name = shared_name or scratch_name()
        scratch = self.path / name
        self.warn_leftovers()
        try:
            target = safeio.Directory.open(self.path)
        except (OSError, UnsafeFileError) as exc:
            raise TargetError(f"{self.path} cannot be opened ({getattr(exc, 'strerror', None) or exc})",
                              hint="give an existing directory") from None
        with target:
            try:
                target.mkdir(name, 0o700)  # private: no one else reads or swaps files in it
            except FileExistsError:
                if shared_name is None:
                    raise
            except PermissionError:
                raise TargetError(f"{self.path} is not writable", hint="pick a directory you can write to") from None
            except OSError as exc:
                if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise TargetError(f"{self.path} is not writable ({exc.strerror})",
                                      hint="pick a writable directory") from None
                # e.g. ENOENT in /proc, ENOSPC: nothing was written, so it is the target that cannot be used
                raise TargetError(f"cannot create a scratch directory in {self.path} ({exc.strerror})",
                                  hint="pick a directory on a regular filesystem") from None
            try:
                directory = target.subdir(name)
            except UnsafeFileError as exc:  # swapped for a symlink between the mkdir and the open
                raise TargetError(f"the scratch directory {scratch} was replaced as it was created: {exc}",
                                  hint="another user can write to the target; use a directory only you can write to")\
                    from None
            if shared_name is None and directory.owner_mismatch():
                directory.close()
                raise TargetError(f"the scratch directory {scratch} was replaced as it was created",
                                  hint="another user can write to the target; use a directory only you can write to")
            if not directory.exists(SCRATCH_OWNER):
                _record_owner(directory)
            log.info("scratch directory %s", scratch)
            with scratch_in_use(str(scratch)), directory:
                anchored = directory.path_of()
                try:
                    yield Path(anchored)
                except BaseException as exc:
                    _name_scratch(exc, anchored, str(scratch))
                    raise
                finally:
                    _remove_scratch(target, directory, name, scratch)

    @contextmanager
    def reporting_full_disk(self, needs_bytes: int | None = None, *, size_hint: str = "lower --size") -> Iterator[None]:
        """Turn a run's failure that ran out of space into one InsufficientSpaceError saying what the
        run needs (``needs_bytes``, when given) and what was free as it started. Use it inside
        :meth:`scratch`, so the failed run's files still take their space when it looks
        (:func:`space_failure`). Other failures pass through unchanged.

        The free-space check before a run (:meth:`require_free`) passed, so the disk filled up meanwhile:
        something else wrote there, or the filesystem holds less than it reported."""
        free_at_start = self.free_bytes()
        try:
            yield
        except BaseException as exc:  # dcp's CheckpointException is a BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            reason = space_failure(exc, self.path)
            if reason is None:
                raise
            if reason.startswith("no free inodes"):
                raise InsufficientSpaceError(f"{self.path} ran out of inodes during the run: {reason}",
                                             hint="remove files there, or run with fewer files") from exc
            # Not the free space after the failure: a writer's failed file can stay open, and
            # allocated, for as long as its exception lives.
            needs = f"the run needs {format_size(needs_bytes)}, " if needs_bytes is not None else ""
            raise InsufficientSpaceError(
                f"{self.path} ran out of space during the run ({reason}): {needs}{format_size(free_at_start)} "
                f"was free when it started",
                hint=f"free space (something else may be filling it) or {size_hint}") from exc


#: The file in a scratch directory that names the process that made it (:class:`owners.ProcessOwner`).
SCRATCH_OWNER = ".ckptbench-owner.json"
#: :attr:`Leftover.state` besides :meth:`owners.ProcessOwner.state`'s: no readable record (made before
#: scratch directories recorded their owner, or the record is not one), not a directory, a mount point
UNKNOWN_OWNER, NOT_A_DIRECTORY, OTHER_FILESYSTEM = "unknown owner", "not a directory", "other filesystem"
#: A killed run's leftover that :func:`remove_leftovers` could not remove (the warning logged says why).
NOT_REMOVED = "not removed"
_WHY_KEPT = {
    owners.LIVE: "its process still runs",
    owners.OTHER_HOST: "made on another host (or pid namespace): whether its process runs cannot be told here",
    owners.OTHER_BOOT: "made on a host of this name in another boot: before its last restart, or on another machine "
                       "of this name (on storage other machines reach, a clone of this one)",
    UNKNOWN_OWNER: "it records no owner (an older ckptbench made it, or its record is unreadable): remove it by "
                   "hand once no run uses it",
    NOT_A_DIRECTORY: "not a directory (a symbolic link or a file): ckptbench never makes one",
    OTHER_FILESYSTEM: "another filesystem is mounted there",
    NOT_REMOVED: "a killed run's, but it could not be removed (see the warning)",
}
#: The directories this process looked for leftovers in (and warned about what it found).
_WARNED: set[Path] = set()


@dataclass(frozen=True)
class Leftover:
    """An entry named like a scratch directory, and whether a killed run of this host left it."""

    path: Path
    state: str
    owner: owners.ProcessOwner | None
    size_bytes: int | None

    @property
    def removable(self) -> bool:
        return self.state == owners.DEAD

    @property
    def why_kept(self) -> str | None:
        return None if self.removable else _WHY_KEPT.get(self.state, self.state)

    def to_dict(self) -> dict[str, object]:
        return {"path": str(self.path), "state": self.state, "size_bytes": self.size_bytes,
                "owner": None if self.owner is None else {"host": self.owner.host, "pid": self.owner.pid},
                "why_kept": self.why_kept}


def _record_owner(directory: safeio.Directory) -> None:
    try:
        directory.write_atomic(SCRATCH_OWNER, lambda out: out.write(owners.ProcessOwner.me().encode()), mode=0o600)
    except OSError as exc:  # the run goes on: a later run sees an unknown owner and keeps the directory
        log.info("could not record the owner of scratch directory %s: %s", directory.shown, exc)


def _inspect(target: safeio.Directory, name: str, *,
             shared: bool) -> tuple[str, owners.ProcessOwner | None, safeio.Directory | None]:
    """(state, owner, the directory held open unless it is not one) of the entry ``name``; ``shared``: the
    target is on a network filesystem, which other machines reach too (``ProcessOwner.state``)."""
    try:
        directory = target.subdir(name)
    except (UnsafeFileError, NotADirectoryError):
        return NOT_A_DIRECTORY, None, None
    except PermissionError:  # another user's (scratch directories are 0700)
        return UNKNOWN_OWNER, None, None
    if os.fstat(directory.fd).st_dev != os.fstat(target.fd).st_dev:
        return OTHER_FILESYSTEM, None, directory
    try:
        owner = owners.ProcessOwner.decode(directory.read(SCRATCH_OWNER, 4096, what="owner record"))
    except (OSError, UnsafeFileError):
        owner = None
    return (UNKNOWN_OWNER if owner is None else owner.state(shared=shared)), owner, directory


@contextmanager
def _leftovers_open(path: Path) -> Iterator[tuple[safeio.Directory, list[tuple[Leftover, safeio.Directory | None]]]]:
    """``path`` open, and the leftovers in it, each with its directory held open while the block runs."""
    in_use = {Path(p).name for p in SCRATCH_IN_USE}
    held: list[tuple[Leftover, safeio.Directory | None]] = []
    mount = mount_of(path)
    shared = mount is None or is_network(mount.fstype)
    with safeio.Directory.open(path) as target:
        try:
            for name in sorted(target.listdir()):
                if not name.startswith(SCRATCH_PREFIX) or name in in_use:
                    continue
                try:
                    state, owner, directory = _inspect(target, name, shared=shared)
                except FileNotFoundError:
                    continue
                size = None
                if directory is not None and state not in (owners.LIVE, OTHER_FILESYSTEM):
                    with contextlib.suppress(OSError):
                        size = directory.usage_bytes()
                held.append((Leftover(path / name, state, owner, size), directory))
            yield target, held
        finally:
            for _, directory in held:
                if directory is not None:
                    directory.close()


def find_leftovers(path: Path) -> list[Leftover]:
    """The entries named like a scratch directory directly in ``path`` (see :class:`Leftover`)."""
    with _leftovers_open(path) as (_, held):
        return [leftover for leftover, _ in held]


def remove_leftovers(path: Path, *, dry_run: bool = False) -> tuple[list[Leftover], list[Leftover]]:
    """Remove the scratch directories killed runs of this host left in ``path`` (``dry_run``: only say
    which), each through the descriptor it was inspected with, as a run removes its own: no symlink
    followed, no other filesystem entered, nothing outside it touched. Returns (removed, kept)."""
    removed: list[Leftover] = []
    kept: list[Leftover] = []
    with _leftovers_open(path) as (target, held):
        for leftover, directory in held:
            if not leftover.removable or directory is None:
                kept.append(leftover)
                continue
            if not dry_run:
                _remove_scratch(target, directory, leftover.path.name, leftover.path)
                if target.exists(leftover.path.name):
                    kept.append(replace(leftover, state=NOT_REMOVED))
                    continue
            removed.append(leftover)
    return removed, kept


def _name_scratch(exc: BaseException, anchored: str, real: str) -> None:
    """Say the scratch directory's real path, not ``anchored`` (its /proc/PID/fd path), in the messages
    of ``exc`` and the exceptions it was raised from: what the user reads names a directory they know."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 16:
        seen.append(exc)
        exc.args = tuple(a.replace(anchored, real) if isinstance(a, str) else a for a in exc.args)
        if isinstance(getattr(exc, "hint", None), str):
            exc.hint = exc.hint.replace(anchored, real)  # type: ignore[attr-defined]
        if isinstance(exc, OSError):
            for attr in ("filename", "filename2"):
                value = getattr(exc, attr)
                if isinstance(value, str) and value.startswith(anchored):
                    setattr(exc, attr, real + value[len(anchored):])
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def _remove_scratch(target: safeio.Directory, directory: safeio.Directory, name: str, scratch: Path) -> None:
    """Empty the scratch directory through its descriptor, then remove its name from the target if
    that name is still this directory (not a symlink or another directory put in its place)."""
    try:
        directory.clear()
    except OSError as exc:
        log.warning("could not empty scratch directory %s: %s", scratch, exc)
    if directory.same_as(name, target):
        try:
            target.rmdir(name)
        except FileNotFoundError:
            pass  # another rank of a launch removed it first
        except OSError as exc:
            log.warning("could not remove scratch directory %s: %s", scratch, exc)
    elif target.exists(name):
        log.warning("the scratch directory %s was renamed or replaced during the run; its contents were removed "
                    "and what has its name now was left alone", scratch)


#: Below this much free space (or 1% of the filesystem, if less) a failed write found the disk full.
_FULL_BYTES = 64 * 2**20
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _out_of_inodes(path: Path) -> str | None:
    """"no free inodes (N in all)" when ``path``'s filesystem has none left, else None."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    return f"no free inodes ({fs.f_files} in all; bytes were not the limit)" if fs.f_files and not fs.f_favail \
        else None


def space_failure(exc: BaseException, path: Path) -> str | None:
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
            return _out_of_inodes(path) or error.strerror or os.strerror(error.errno)
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
