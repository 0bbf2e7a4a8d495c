"""The save lock: one save at a time per checkpoint location (the Concurrency guarantee, docs/guarantees.md).

Why a lock: shards carry a per-save id and, after its commit, a save removes the files its manifest
does not name (older or crashed saves). Two saves to one location at once would each remove the
other's shards, and the later commit would name files that are gone. With the lock the second save
fails at once (CheckpointLockedError, naming the holder) and nothing of the first is touched.

Call sequence (``api.Checkpointer.save``):

1. ``acquire_save_lock(store)``       - after ``store.prepare()``, before staging and the first shard
                                        write; CheckpointLockedError when another save holds it.
2. ``with lock.committing(store, shards):`` around the manifest commit and the stale-file sweep: checks
                                        the lock is still held (else removes ``shards``, this save's,
                                        and raises LockLostError: nothing is committed) and keeps it
                                        from being released (abandoned) until the sweep is done.
3. ``lock.release()``                 - after the sweep, also on failure (``with lock:``); async saves
                                        release on the persist thread. Idempotent.
4. ``lock.finish_before_exit(future)`` (async saves): the interpreter's exit, also one caused by
                                        Ctrl-C, first waits for the persist; a second Ctrl-C abandons it
                                        (releases the lock, so no commit follows) and ends the process
                                        (``checkpoint/at_exit.py``).

Where the lock lives:

- **Local and mounted filesystems**: ``flock(2)`` on ``.ckptbench.lock`` inside the checkpoint
  directory. The kernel drops it when the holder dies (SIGKILL included): no stale locks. The file is
  removed on release, so a finished save leaves only its manifest and shards. NFS (v4, or v3 with
  NLM) and CephFS carry flock across hosts; a filesystem without flock (Lustre mounted without
  ``-o flock``) gets a warning and no lock.
- **S3 and S3-compatible stores with conditional writes** (``S3Store.put_if``; Ceph RGW, AWS S3,
  MinIO): a lease object ``.ckptbench.lock`` (owner token, host, pid, times, TTL) created with
  ``If-None-Match: *``, so of two saves exactly one creates it. The holder renews it every
  ``LEASE_TTL_S / 4`` with ``If-Match`` on its own ETag, and once more right before its commit. A
  lease not renewed for ``LEASE_TTL_S`` (its holder died or hangs) is taken over, atomically
  (``If-Match`` on the stale lease's ETag); so is, at once, a lease whose holder is provably dead (same
  host, boot and pid namespace, and its process is gone). Removed on release.
- **Other object stores (fsspec) and S3 servers that ignore conditional writes**: best effort, the
  same lease written with plain PUTs: check it is absent, write it, wait ``settle`` (4x the round
  trip, at least 50 ms), read it back; the save proceeds only if its own token is there.
- **S3 servers that honour ``If-None-Match: *`` but not ``If-Match``** (AWS S3 from August to November
  2024 answered it 501; some gateways ignore it): the lease is created conditionally, and renewed and
  taken over best effort as above.

Which a server honours is probed once per endpoint and bucket (``_honours_conditions``), on an object
of its own: a second ``If-None-Match: *`` PUT must be refused, an ``If-Match`` PUT with another ETag
refused and one with the object's own ETag accepted. A server that silently ignores a condition fails
the probe rather than granting two leases; one that honours a condition only sometimes (MinIO without
read quorum accepts conditional PUTs unchecked) cannot be told apart and is only as safe as it is.

Limits, precisely:

- Leases assume the hosts' clocks agree to well within ``LEASE_TTL_S`` (default 60 s).
- A holder stalled for longer than ``LEASE_TTL_S`` (SIGSTOP, a hung mount) loses its lease; it finds
  out at its next renewal or at the check before its commit and commits nothing. Only a stall that
  falls between that check and the end of its sweep (a few requests) can still overlap the new holder.
- A save whose store became unreachable cannot remove its lease: the next save of the same process
  takes it over at once, other processes after ``LEASE_TTL_S``.
- Releasing a lease is read-then-delete (Ceph RGW ignores conditions on DELETE): a holder that
  stalled past its TTL right between the two could delete its successor's lease.
- Best effort only: two saves whose check-to-write intervals overlap within the settle time can
  both proceed; the pre-commit check then stops the one whose lease was overwritten, unless its check
  happened before the other's write landed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace

from ckptbench import knobs, safeio
from ckptbench.checkpoint import at_exit
from ckptbench.errors import CheckpointLockedError, LockLostError, StorageIOError
from ckptbench.interrupts import QuietThread
from ckptbench.storage.owner import boot_id as _boot_id
from ckptbench.storage.owner import pid_namespace as _pid_namespace
from ckptbench.storage.owner import process_gone
from ckptbench.storage.owner import process_start as _process_start
from ckptbench.storage.store import Store

log = logging.getLogger(__name__)

LOCK_NAME = ".ckptbench.lock"
#: Tokens of the leases this process holds now (a lease of this process with another token is a leftover).
_live_tokens: set[str] = set()
#: A lease not renewed for this long is taken over (its holder renews every quarter of it).
LEASE_TTL_S = knobs.LOCK_TTL_S
#: errnos of a filesystem that has no flock: saves go on unlocked, with a warning.
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: written into the lock file / lease object, read back for error messages."""

    token: str
    host: str
    pid: int
    acquired_unix_s: float
    renewed_unix_s: float
    ttl_s: float
    boot_id: str = ""
    pid_namespace: str = ""
    process_start: str = ""

    @classmethod
    def me(cls, ttl_s: float) -> Holder:
        now = time.time()
        return cls(secrets.token_hex(8), socket.gethostname(), os.getpid(), now, now, ttl_s, _boot_id(),
                   _pid_namespace(), _process_start(os.getpid()))

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> Holder | None:
        """The holder in ``data``; None for anything else (empty, half-written, foreign, or fields of other
        types: whoever could write the lock may have written anything there)."""
        try:
            holder = cls(**json.loads(data))
        except (ValueError, TypeError, RecursionError):  # RecursionError: JSON nested past the parser's depth
            return None
        texts = (holder.token, holder.host, holder.boot_id, holder.pid_namespace, holder.process_start)
        times = (holder.acquired_unix_s, holder.renewed_unix_s, holder.ttl_s)
        if type(holder.pid) is not int or holder.pid <= 0 or not all(isinstance(t, str) for t in texts) \
                or not all(type(t) in (int, float) and math.isfinite(t) for t in times):
            return None
        return holder

    def describe(self) -> str:
        held_s = max(0.0, time.time() - self.acquired_unix_s)
        if self.host == socket.gethostname() and self.pid == os.getpid():
            return f"another Checkpointer in this process, pid {self.pid}, for {held_s:.0f} s"
        return f"pid {self.pid} on host {self.host}, for {held_s:.0f} s"

    def expired(self, now: float) -> bool:
        return now > self.renewed_unix_s + self.ttl_s

    def provably_dead(self) -> bool:
        """Same host, boot and pid namespace, and its process is gone (or another one), or it is this
        process and no lock here holds it (a release that could not reach the store)."""
        if (self.host, self.boot_id, self.pid_namespace) != (socket.gethostname(), _boot_id(), _pid_namespace()):
            return False
        if not self.boot_id:
            return False
        if self.pid == os.getpid():
            return self.token not in _live_tokens
        return process_gone(self.pid, self.process_start)


class SaveLock:
    """A held save lock. Subclasses implement ``_verify`` (still ours?) and ``_release``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._mutex = threading.Lock()  # a commit in progress and a release exclude each other
        self._released = False
        self._committed = False

    def __enter__(self) -> SaveLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @contextlib.contextmanager
    def committing(self, store: Store, shards: list[str]) -> Iterator[None]:
        """Run the commit and the sweep while the lock is verified held and cannot be released."""
        with self._mutex:
            reason = "the save was abandoned at exit" if self._released else self._verify()
            if reason is not None:
                store.remove(shards)  # never to be committed
                raise LockLostError(f"{self.url} was not committed: {reason}",
                                    hint="the previous checkpoint, if any, is unchanged; save again")
            yield
            self._committed = True

    def release(self) -> bool:
        """Give the lock up (idempotent; never raises). True when this save had committed."""
        with self._mutex:
            if not self._released:
                self._released = True
                try:
                    self._release()
                except Exception as exc:  # noqa: BLE001 - runs in cleanup paths
                    log.warning("could not release the save lock on %s: %s", self.url, exc)
            return self._committed

    def finish_before_exit(self, future: Future) -> None:
        """Make the interpreter's exit wait for ``future`` (an async persist holding this lock); see
        ``checkpoint/at_exit.py``."""
        at_exit.finish_before_exit(future, self)

    def _verify(self) -> str | None:
        return None

    def _release(self) -> None:
        pass


class _Unlocked(SaveLock):
    """Where no lock can be taken (a filesystem without flock)."""


class _FileLock(SaveLock):
    """flock(2) on LOCK_NAME in the checkpoint directory; the file is unlinked on release.

    The file is opened relative to the directory's descriptor and never through a symlink, and
    must be a regular file (``safeio.open_regular``): a ``.ckptbench.lock`` planted as a symlink or
    FIFO is refused, never truncated or written through."""

    def __init__(self, url: str, directory: safeio.Directory, fd: int) -> None:
        super().__init__(url)
        self._directory = directory
        self._fd = fd

    @classmethod
    def acquire(cls, directory: safeio.Directory, url: str) -> SaveLock:
        shown = directory.shown_path(LOCK_NAME)
        while True:
            try:
                fd = directory.open_file(LOCK_NAME, os.O_RDWR | os.O_CREAT)
            except safeio.UnsafeFileError as exc:
                raise CheckpointLockedError(f"cannot take the save lock: {exc}",
                                            hint="remove it if no save is running; nothing was written") from None
            except OSError as exc:
                raise StorageIOError(f"cannot create the save lock {shown}: {exc.strerror}") from None
            if os.fstat(fd).st_nlink > 1:  # a hard link to some other file: never truncated or written
                os.close(fd)
                raise CheckpointLockedError(f"cannot take the save lock: {shown} is a hard link to another file",
                                            hint="remove it if no save is running; nothing was written")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = None
                for _ in range(20):  # the holder writes who it is right after taking the lock
                    holder = Holder.decode(os.pread(fd, 4096, 0))
                    if holder is not None:
                        break
                    time.sleep(0.005)
                os.close(fd)
                raise _locked(url, holder) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno not in _NO_FLOCK:
                    raise
                log.warning("%s: the filesystem does not support flock (%s); concurrent saves to this path are "
                            "not excluded", url, exc.strerror)
                with contextlib.suppress(OSError):
                    directory.unlink(LOCK_NAME)
                return _Unlocked(url)
            # A holder releasing unlinks the file: what we locked must still be the file at its name
            # (the name itself, not what a symlink put there meanwhile would point to).
            try:
                same = os.path.samestat(os.fstat(fd), directory.lstat(LOCK_NAME))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        with contextlib.suppress(OSError):  # who holds it, for the error message of a save that waits
            os.ftruncate(fd, 0)
            os.pwrite(fd, Holder.me(0.0).encode(), 0)
        return cls(url, directory, fd)

    def _release(self) -> None:
        try:
            self._directory.unlink(LOCK_NAME)  # while still locked: whoever opens the name next gets a fresh file
        finally:
            os.close(self._fd)


@dataclass(frozen=True)
class _Conditions:
    """The conditional PUTs a server honours (``_honours_conditions``)."""

    create: bool = False  # If-None-Match: * (the lease created only where there is none)
    replace: bool = False  # If-Match (the lease renewed or taken over only as it was read)


class _Lease(SaveLock):
    """A lease object on an object store, created and replaced with the conditional PUTs ``conditions``
    says the server honours, best effort where it does not."""

    def __init__(self, store: Store, conditions: _Conditions) -> None:
        super().__init__(store.url)
        self._store = store
        self._conditions = conditions
        self._me = Holder.me(LEASE_TTL_S)
        self._etag: str | None = None
        self._settle_s = 0.05
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self) -> SaveLock:
        for _ in range(5):  # each round ends in the lock, an error, or a lease that changed meanwhile
            if self._create():
                break
            current, etag = self._read()
            if current is not None and current.token == self._me.token:  # our create landed; its answer was lost
                self._etag = etag
                break
            if current is None:
                continue  # released meanwhile
            if not (current.expired(time.time()) or current.provably_dead()):
                raise _locked(self.url, current)
            log.warning("%s: taking over the save lock of %s (%s)", self.url, current.describe(),
                        "its process is gone" if current.provably_dead() else
                        f"not renewed for {time.time() - current.renewed_unix_s:.0f} s")
            if self._replace(etag):
                break
        else:
            raise CheckpointLockedError(f"{self.url}: the save lock changed hands 5 times while this save tried "
                                        "to take it", hint="another process is saving here; save to another path")
        _live_tokens.add(self._me.token)
        self._heartbeat = QuietThread(target=self._renew_periodically, name="ckptbench-lease", daemon=True)
        try:
            self._heartbeat.start()
        except BaseException:  # a Ctrl-C raised as it started: nobody will release what this returns
            self.release()
            raise
        return self

    # -- the two schemes ----------------------------------------------------------------------

    def _read(self) -> tuple[Holder | None, str | None]:
        try:
            if self._conditions.replace:
                data, etag = self._store.get_tagged(LOCK_NAME)
                return Holder.decode(data), etag
            return Holder.decode(self._store.get(LOCK_NAME)), None
        except FileNotFoundError:
            return None, None

    def _create(self) -> bool:
        if self._conditions.create:
            self._etag = self._store.put_if(LOCK_NAME, self._me.encode())
            return self._etag is not None
        if self._store.size(LOCK_NAME) is not None:
            return False
        return self._put_and_confirm()

    def _replace(self, etag: str | None) -> bool:
        if self._conditions.replace:
            self._etag = self._store.put_if(LOCK_NAME, self._me.encode(), etag=etag)
            return self._etag is not None
        return self._put_and_confirm()

    def _put_and_confirm(self) -> bool:
        """Best effort: write the lease, wait for racing writers' PUTs to land, keep it if ours survived."""
        started = time.perf_counter()
        self._store.put_atomic(LOCK_NAME, self._me.encode())
        self._settle_s = min(2.0, max(0.05, 4 * (time.perf_counter() - started)))
        time.sleep(self._settle_s)
        current, _ = self._read()
        return current is not None and current.token == self._me.token

    # -- held ---------------------------------------------------------------------------------

    def _renew(self) -> str | None:
        """Extend the lease; the reason when it is no longer ours."""
        renewed = replace(self._me, renewed_unix_s=time.time())
        if self._conditions.replace:
            etag = self._store.put_if(LOCK_NAME, renewed.encode(), etag=self._etag)
            if etag is None:
                current, _ = self._read()
                return _lost_to(current)
            self._etag = etag
        else:
            current, _ = self._read()
            if current is None or current.token != self._me.token:
                return _lost_to(current)
            self._store.put_atomic(LOCK_NAME, renewed.encode())
        self._me = renewed
        return None

    def _renew_periodically(self) -> None:
        while not self._stop.wait(LEASE_TTL_S / 4):
            with self._mutex:
                if self._released:
                    return
                try:
                    reason = self._renew()
                except Exception as exc:  # noqa: BLE001 - the pre-commit check decides; try again later
                    log.warning("%s: could not renew the save lock: %s", self.url, exc)
                    continue
                if reason is not None:
                    log.warning("%s: %s", self.url, reason)
                    return

    def _verify(self) -> str | None:
        try:
            return self._renew()
        except Exception as exc:  # noqa: BLE001 - an unreachable store: do not commit blind
            return f"the save lock could not be checked ({exc})"

    def _release(self) -> None:
        self._stop.set()
        _live_tokens.discard(self._me.token)
        current, _ = self._read()
        if current is not None and current.token == self._me.token:
            self._store.remove([LOCK_NAME])


def _lost_to(current: Holder | None) -> str:
    if current is None:
        return "its save lock was removed by another process (it had not been renewed in time)"
    return f"its save lock was taken over by {current.describe()} (it had not been renewed in time)"


def _locked(url: str, holder: Holder | None) -> CheckpointLockedError:
    who = holder.describe() if holder is not None else "another save that is just starting"
    return CheckpointLockedError(f"{url} is being saved by {who}",
                                 hint="one save at a time per path: wait for that save, or save to another path")


def acquire_save_lock(store: Store) -> SaveLock:
    """Take the save lock of ``store``'s location (after ``store.prepare()``); see the module docstring."""
    if store.local_path is not None:
        return _FileLock.acquire(store.directory(), store.url)
    conditions = _honours_conditions(store) if store.conditional_writes else _Conditions()
    return _Lease(store, conditions).acquire()


_conditions_honoured: dict[str, _Conditions] = {}
#: An ETag no object has: an ``If-Match`` with it must be refused.
_NO_SUCH_ETAG = '"00000000000000000000000000000000"'


def _honours_conditions(store: Store) -> _Conditions:
    """Which conditional PUTs the server honours (checked once per endpoint and bucket, on a probe object
    that is removed again): ``If-None-Match: *`` over an existing object refused; ``If-Match`` with
    another ETag refused and with the object's own accepted. Refused with 501 (NotImplementedError) or
    silently ignored, a condition is not honoured: a server that ignores ``If-None-Match`` would make
    every lease creation succeed, one that ignores ``If-Match`` every renewal and takeover."""
    key = store.server()
    if key not in _conditions_honoured:
        probe = f"{LOCK_NAME}.probe-{secrets.token_hex(4)}"
        create = replace = False
        try:
            etag = store.put_if(probe, b"")
            create = etag is not None and store.put_if(probe, b"") is None
            if create and etag:  # without an ETag, no If-Match can name the object
                replace = (store.put_if(probe, b"1", etag=_NO_SUCH_ETAG) is None
                           and store.put_if(probe, b"2", etag=etag) is not None)
        except NotImplementedError:
            pass
        finally:
            store.remove([probe])
        if not create:
            log.warning("%s: the server does not honour conditional writes (If-None-Match); the save lock is "
                        "best effort there (see ckptbench.checkpoint.lock)", store.url)
        elif not replace:
            log.warning("%s: the server honours If-None-Match but not If-Match; the save lock is created "
                        "conditionally, renewed and taken over best effort (see ckptbench.checkpoint.lock)",
                        store.url)
        _conditions_honoured[key] = _Conditions(create, replace)
    return _conditions_honoured[key]
