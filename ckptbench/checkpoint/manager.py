"""A series of training steps under one root: ``CheckpointManager``.

Layout: every step is an ordinary checkpoint directory (``Checkpointer.save``) named
``step-<step, 8 digits or more>`` under the root::

    ROOT/step-00000100/manifest.json, shard-*.bin
    ROOT/step-00000200/...

A step exists once its manifest is committed: ``steps()`` lists only those, so a save still running
or one that was killed is never offered for loading. After a save commits (``_after_commit``), the
steps beyond ``keep_last`` and the leftovers of interrupted saves (step directories without a
manifest) are removed: never before the new step is committed, never a step a save is writing (its
save lock is taken first), and only the files a save creates (a directory with anything else in it
is left in place).

Where the steps live is a :class:`_Tier` (a root URL and its storage options). With ``remote=URL``
the manager has two: saves go to the local tier (the root), and every ``remote_every``-th committed
local step is then copied to the remote tier in the background (``checkpoint/drain.py``: shards,
then the manifest, under the remote step's save lock), with the same layout, listing and retention
(``keep_remote``). Loads take the newest committed step of either tier, the local copy first, and
fall back to the remote copy when the local one is missing or damaged.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import re
import threading
import time
from collections.abc import Collection
from concurrent.futures import Future
from typing import Any

from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.api import Checkpointer, SaveHandle, SaveResult, world_for
from ckptbench.checkpoint.drain import Drainer, DrainProcess, DrainResult, DrainStatus
from ckptbench.checkpoint.lock import LOCK_NAME, CheckpointLockedError, acquire_save_lock
from ckptbench.errors import (
    CorruptCheckpointError,
    NotACheckpointError,
    NotReadableHereError,
    StepNotFoundError,
    StorageIOError,
    UsageError,
)
from ckptbench.storage.store import Store, open_store

log = logging.getLogger(__name__)

#: Step directories: ``step-`` and the step, zero-padded to 8 digits (so they sort by name too).
STEP_DIR = re.compile(r"^step-(\d{8,})$")


def step_dirname(step: int) -> str:
    """The directory name of ``step`` under a manager's root."""
    return f"step-{step:08d}"


def _parse_step(name: str) -> int | None:
    match = STEP_DIR.match(name)
    if match is None or step_dirname(int(match[1])) != name:
        return None
    return int(match[1])


def _check_step(step: Any) -> int:
    if isinstance(step, bool):
        raise UsageError(f"step must be a non-negative integer, got {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise UsageError(f"step must be a non-negative integer, got {step!r} ({type(step).__name__})") from None
    if value < 0:
        raise UsageError(f"step must be a non-negative integer, got {value}")
    return value


class _Tier:
    """Where a series of steps lives: a root (local directory or URL) and how to reach it.

    ``listing()`` is one pass over the root: every step directory there and whether it is committed.
    """

    def __init__(self, root: str | os.PathLike, storage_options: dict | None) -> None:
        self.storage_options = storage_options
        self.root = open_store(root, storage_options)  # refuses malformed URLs and unknown schemes now
        self.url = self.root.url if self.root.local_path is not None else self.root.url.rstrip("/")

    def step_url(self, step: int) -> str:
        if self.root.local_path is not None:
            return str(self.root.local_path / step_dirname(step))
        return f"{self.url}/{step_dirname(step)}"

    def step_store(self, step: int) -> Store:
        return open_store(self.step_url(step), self.storage_options)

    def listing(self) -> dict[int, bool]:
        """{step: committed} for every step directory under the root."""
        if self.root.local_path is not None:
            found: dict[int, bool] = {}
            try:
                entries = list(os.scandir(self.root.local_path))
            except FileNotFoundError:
                return {}
            except NotADirectoryError:
                raise UsageError(f"{self.url} is a file; a CheckpointManager's root is a directory") from None
            for entry in entries:
                step = _parse_step(entry.name)
                if step is not None and entry.is_dir(follow_symlinks=False):
                    found[step] = os.path.isfile(os.path.join(entry.path, mf.MANIFEST_NAME))
            return found
        found = {}
        for name in self.root.list_recursive():
            head, _, rest = name.partition("/")
            step = _parse_step(head)
            if step is not None and rest:
                found[step] = found.get(step, False) or rest == mf.MANIFEST_NAME
        return found

    def remove_step(self, step: int, why: str) -> bool:
        """Remove ``step``'s checkpoint (see :func:`remove_checkpoint`)."""
        return remove_checkpoint(self.step_store(step), why)

    def overlaps(self, other: _Tier) -> bool:
        """Whether the two roots are the same location, or one lies inside the other."""
        if (self.root.local_path is None) != (other.root.local_path is None):
            return False
        if self.root.local_path is not None and other.root.local_path is not None:
            mine, theirs = self.root.local_path.resolve(), other.root.local_path.resolve()
            return mine == theirs or mine in theirs.parents or theirs in mine.parents
        mine, theirs = self.url.rstrip("/") + "/", other.url.rstrip("/") + "/"
        return mine.startswith(theirs) or theirs.startswith(mine)

    def retain(self, step: int, keep_last: int | None, busy: set[int], damaged: Collection[int] = ()) -> None:
        """After ``step`` committed here: remove the steps beyond the newest ``keep_last`` and the
        leftovers of saves that never committed, except ``step`` and the ``busy`` ones. The ``damaged``
        steps (found so by a load) neither count among the ``keep_last`` nor are removed. Never raises:
        what could not be listed or removed is logged (the next commit tries again)."""
        try:
            listing = self.listing()
            committed = sorted(s for s, ok in listing.items() if ok and s not in damaged)
            doomed: list[tuple[int, str]] = [(s, "an interrupted save") for s, ok in listing.items()
                                            if not ok and s != step and s not in busy]
            if keep_last is not None:
                kept = set(committed[-keep_last:]) | {step} | busy
                doomed += [(s, f"keep_last={keep_last}") for s in committed if s not in kept]
        except Exception as exc:  # noqa: BLE001 - retention must not turn a committed save into a failure
            log.warning("retention after saving step %d under %s could not list the steps: %s", step, self.url, exc)
            return
        for old, why in sorted(doomed):
            try:
                self.remove_step(old, why)
            except Exception as exc:  # noqa: BLE001 - the next save tries again
                log.warning("could not remove step %d under %s (%s): %s", old, self.url, why, exc)


def remove_checkpoint(store: Store, why: str, wait_s: float = 0.0) -> bool:
    """Remove what saves created in ``store``'s checkpoint directory, the manifest first (so a half-removed
    checkpoint is no longer one), then its directory where that is a real one and empty. False (logged)
    when a save is writing there (its lock is held, still after ``wait_s`` seconds of waiting for it)
    or something else is left in it. A local directory is opened first without following a symlink as its
    last component (UnsafeFileError): one swapped in after the listing that found the step cannot turn the
    removal onto the checkpoint it points to."""
    store.hold_unlinked()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock = acquire_save_lock(store)
            break
        except CheckpointLockedError as exc:
            if time.monotonic() >= deadline:
                log.info("not removing %s (%s): %s", store.url, why, exc)
                return False
            time.sleep(0.05)
    with lock:
        store.remove([mf.MANIFEST_NAME])
        store.remove([name for name in store.list() if mf.OWNED_FILE.match(name)])
    left = [name for name in store.list() if name != LOCK_NAME]
    if left:
        log.warning("removed the checkpoint files of %s (%s) but left the directory: it holds %s",
                    store.url, why, ", ".join(sorted(left)[:5]))
        return False
    if store.local_path is not None:
        try:
            store.local_path.rmdir()
        except OSError as exc:
            log.warning("could not remove the directory %s: %s", store.local_path, exc)
            return False
    elif not store.remove_location():
        log.warning("removed the checkpoint files of %s (%s) but left the directory: it holds %s", store.url, why,
                    ", ".join(sorted(store.list_recursive())[:5]) or "a sub-directory")
        return False
    log.info("removed %s (%s)", store.url, why)
    return True


class CheckpointManager:
    """Saves and loads a series of training steps under one root, keeping the last ``keep_last``.

    Each step is a checkpoint of its own (``root/step-00000100``), written by one
    :class:`Checkpointer` that the manager keeps, so its staging arena is allocated once and reused
    by every step. Works on local and mounted directories and on object storage (``s3://...``,
    with ``storage_options``), and under torchrun/srun, where every rank calls ``save`` and ``load``
    with its own state_dict, as with :func:`ckptbench.save` (the root must then be storage every rank
    reaches: rank 0 lists the steps and removes old ones).

    A step is listed by :meth:`steps` only once its save has committed. Retention runs after each
    save commits: the steps beyond the newest ``keep_last`` (by step number; the step just saved is
    always kept) and the leftovers of saves that never committed are removed then, never earlier.

    **Damaged steps.** A local step that a :meth:`load` of this manager found damaged (a shard missing or
    failing its checksum twice: a step that loads when read again is returned, as a flaky read's; ``load()``
    then falls back to an older step) no longer counts among the
    ``keep_last`` (so retention keeps that many loadable steps) and is not removed by it; the loop that
    resumed from the older step replaces it when it saves that step again (no ``overwrite`` needed;
    logged). In one process only: under a launch a load does not fall back, so nothing is marked. A step
    that this ckptbench or torch cannot read (a newer manifest format, a torch dtype or device this torch
    lacks: :class:`~ckptbench.errors.NotReadableHereError`) may be intact: it is skipped, never marked.

    **Two tiers.** With ``remote``, saves still go to ``root`` (the fast, local tier) and return as
    before; every ``remote_every``-th step this manager commits there is then copied to ``remote``
    (the durable tier: a directory or ``s3://...``) in the background (a thread that hands the copy to a
    process of its own, :class:`~ckptbench.checkpoint.drain.DrainProcess`), its shards first and its
    manifest last, so the remote tier only ever lists whole checkpoints. One copy runs at a time:
    when a newer step is due before the previous copy started, the newer one is copied instead. While
    an async save stages (training is blocked), the drain process is stopped
    (:meth:`DrainProcess.paused`; ``CKPTBENCH_DRAIN_PAUSE=0`` lets it run on). A copy that fails (the
    remote tier unreachable) does not stop the saves: it is retried (``CKPTBENCH_DRAIN_RETRY_S``, and
    at once when the next step is due), and :meth:`remote_status`
    says what happened. A copy that makes no progress for ``drain_timeout`` seconds (a remote tier
    that accepts connections and never answers, say) is stopped, its process killed, and counts as a
    failed one (``remote_status().stalls``). The local tier keeps a step until its copy is done, beyond
    ``keep_last`` if need be (the newest step due, when newer ones replaced it meanwhile); ``keep_remote`` is the remote tier's own retention. :meth:`latest` and :meth:`load`
    see the steps of both tiers; a step is loaded from the local tier when it is committed there and
    from the remote tier when it is not, or when the local copy fails to load (a shard missing or
    failing its checksum). Under torchrun/srun, rank 0 copies every rank's shards, so the local
    root must then be storage rank 0 reads (a shared or single-node directory).

    Args:
        root: directory or URL that holds the steps (created on the first save).
        keep_last: how many committed steps to keep (the newest), or None to keep all of them.
        storage_options: for object storage, as for :func:`ckptbench.save`.
        threads, shard_size, block_size, direct, checksum: the settings of the manager's
            :class:`Checkpointer` (its defaults where None).
        distributed: None detects a torch.distributed launch, False opts out, True requires one.
        allow_pickle: pickle values of other types at save and unpickle them at load (only for
            steps this job wrote or others it trusts; see :meth:`Checkpointer.load`).
        remote: the durable tier's directory or URL (another location than ``root``), or None for
            one tier.
        remote_every: copy every k-th committed step to ``remote`` (default 1: every one).
        keep_remote: how many committed steps the remote tier keeps (the newest), or None for all.
        remote_storage_options: for a remote tier on object storage, as ``storage_options``.
        drain_timeout: seconds a copy to the remote tier may go without progress (no part or batch of shards read
            or written) before it is stopped and retried later (a remote tier that stopped answering);
            None: ``CKPTBENCH_DRAIN_TIMEOUT_S`` (300 s).

    Example::

        with ckptbench.CheckpointManager("/ckpt/run1", keep_last=3) as manager:
            start = 0
            if manager.latest() is not None:
                state = manager.load()  # the newest step that loads (a damaged one is logged, skipped)
                start = state["step"]
            for step in range(start, steps):
                ...
                if step % 100 == 0:
                    manager.save(step, {"model": model.state_dict(), "optim": optim.state_dict(),
                                        "step": step}, async_=True)
    """

    def __init__(self, root: str | os.PathLike, *, keep_last: int | None = None,
                 storage_options: dict | None = None, threads: int | None = None, shard_size: int | None = None,
                 block_size: int | None = None, direct: bool | None = None, checksum: bool = True,
                 distributed: bool | None = None, allow_pickle: bool = False,
                 remote: str | os.PathLike | None = None, remote_every: int | None = None,
                 keep_remote: int | None = None, remote_storage_options: dict | None = None,
                 drain_timeout: float | None = None) -> None:
        _check_count("keep_last", keep_last, "keep every step")
        _check_count("keep_remote", keep_remote, "keep every remote step")
        if remote is None:
            given = [name for name, value in (("remote_every", remote_every), ("keep_remote", keep_remote),
                                              ("remote_storage_options", remote_storage_options),
                                              ("drain_timeout", drain_timeout)) if value is not None]
            if given:
                raise UsageError(f"{', '.join(given)} need remote=URL (the remote tier)")
        elif remote_every is None:
            remote_every = 1
        else:
            _check_count("remote_every", remote_every, None)
        if drain_timeout is not None and (isinstance(drain_timeout, bool) or not isinstance(drain_timeout, int | float)
                                          or not drain_timeout > 0):
            raise UsageError(f"drain_timeout must be a positive number of seconds or None (the default), got "
                             f"{drain_timeout!r}")
        self.keep_last = keep_last
        self.keep_remote = keep_remote
        self.remote_every = remote_every
        self.distributed = distributed
        self.allow_pickle = allow_pickle
        self._tier = _Tier(root, storage_options)
        self._remote: _Tier | None = None
        self._drainer: Drainer | None = None
        if remote is not None:
            self._remote = _Tier(remote, remote_storage_options)
            if self._remote.overlaps(self._tier):
                raise UsageError(f"the remote tier {self._remote.url} is the local tier {self._tier.url} or inside "
                                 "it (or holds it)", hint="give remote= another directory or bucket")
            self._drainer = Drainer(self._drain, self._retain_remote)
            self._drain_process = DrainProcess(drain_timeout)
        self._committed_here = 0  # local commits by this manager: every remote_every-th is drained
        self._checkpointer = Checkpointer(threads=threads, shard_size=shard_size, block_size=block_size,
                                          direct=direct, checksum=checksum)
        self._pending: Future | None = None
        self._lock = threading.Lock()
        self._closed = False
        #: Local steps a load of this manager found damaged (see the class): replaced by the next save of them.
        self._damaged: set[int] = set()

    @property
    def root(self) -> str:
        """The root's URL (a local path for a directory)."""
        return self._tier.url

    @property
    def remote(self) -> str | None:
        """The remote tier's URL, or None without one."""
        return None if self._remote is None else self._remote.url

    def path(self, step: int) -> str:
        """Where ``step`` is (or would be) saved: a checkpoint directory any ``ckptbench.load`` reads."""
        return self._tier.step_url(_check_step(step))

    # -- listing ------------------------------------------------------------------------------

    def steps(self, tier: str | None = None) -> list[int]:
        """The committed steps, ascending. Saves in flight and interrupted saves are not among them.

        Args:
            tier: "local" or "remote" for one tier's steps; None for the steps of either tier (a remote
                tier that cannot be listed is left out, logged).

        Returns:
            list[int]: step numbers; empty when nothing is committed (or the root does not exist yet).
        """
        if tier not in (None, "local", "remote"):
            raise UsageError(f"tier must be 'local', 'remote' or None, got {tier!r}")
        if tier == "remote" and self._remote is None:
            raise UsageError(f"the CheckpointManager of {self.root} has no remote tier")
        found: set[int] = set()
        if tier in (None, "local"):
            found |= _committed(self._tier)
        if tier == "remote" or (tier is None and self._remote is not None):
            assert self._remote is not None
            try:
                found |= _committed(self._remote)
            except Exception as exc:
                if tier == "remote":
                    raise
                log.warning("the remote tier %s could not be listed (local steps only): %s", self._remote.url, exc)
        return sorted(found)

    def latest(self) -> int | None:
        """The newest committed step, or None when there is none.

        Returns:
            int | None
        """
        steps = self.steps()
        return steps[-1] if steps else None

    # -- save ---------------------------------------------------------------------------------

    def save(self, step: int, state_dict: Any, *, async_: bool = False,
             overwrite: bool = False) -> SaveResult | SaveHandle:
        """Save ``state_dict`` as ``step``; then apply retention (see the class).

        A save still in flight from this manager is waited for first (that wait counts as stall).

        Args:
            step: a non-negative integer, the training step (any order; ``latest`` is the largest).
            state_dict: what :func:`ckptbench.save` takes.
            async_: return once the tensors are staged (the caller may change them); the returned
                handle's ``result()`` waits until the step is committed and retention is done.
            overwrite: replace ``step`` if it is already committed (it stays loadable until the new
                one commits); without it, such a save raises CheckpointExistsError.

        Returns:
            SaveResult (sync) or SaveHandle (async), as :meth:`Checkpointer.save`.
        """
        step = _check_step(step)
        self._check_open()
        self.wait()
        url = self._tier.step_url(step)
        if step in self._damaged and not overwrite:
            log.warning("step %d under %s was found damaged by a load: this save replaces it", step, self._tier.url)
            overwrite = True
        with self._drain_paused(async_):  # training is blocked while staging: the drain waits
            handle = self._checkpointer.save(state_dict, url, async_=async_, overwrite=overwrite,
                                             storage_options=self._tier.storage_options,
                                             distributed=self.distributed, allow_pickle=self.allow_pickle)
        if not async_:
            self._after_commit(step)
            return handle
        assert isinstance(handle, SaveHandle)
        done: Future = Future()

        def retain(saved: Future) -> None:
            try:
                result = saved.result()
            except BaseException as exc:  # noqa: BLE001 - delivered through the manager's handle
                done.set_exception(exc)
                return
            try:
                self._after_commit(step)
            finally:
                done.set_result(result)

        with self._lock:
            self._pending = done
        handle._future.add_done_callback(retain)
        return SaveHandle(done)

    def wait(self) -> None:
        """Wait for this manager's save in flight, if any (its error is its caller's: not raised here)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            try:
                SaveHandle(pending).result()
            except Exception as exc:  # noqa: BLE001 - the save's own handle reports it
                log.debug("the save waited for failed: %s", exc)

    def _after_commit(self, step: int) -> None:
        """Once ``step`` is committed (rank 0 only under a launch): queue its copy to the remote tier
        when it is due, then retention and cleanup. Never raises: the step is saved whatever happens
        here; what could not be removed is logged and retried by the next save."""
        world = world_for(self.distributed)
        if world is not None and not world.is_first:
            return
        busy: set[int] = set()
        if self._drainer is not None:
            assert self.remote_every is not None
            self._committed_here += 1
            if self._committed_here % self.remote_every == 0:
                self._drainer.submit(step)
            busy = self._drainer.busy_steps()
        self._damaged.discard(step)
        self._tier.retain(step, self.keep_last, busy, damaged=set(self._damaged))

    # -- remote tier --------------------------------------------------------------------------

    def _drain(self, step: int) -> DrainResult:
        assert self._remote is not None
        ckpt = self._checkpointer
        return self._drain_process.copy((self._tier.step_url(step), self._tier.storage_options),
                                        (self._remote.step_url(step), self._remote.storage_options), step=step,
                                        threads=ckpt.threads, block_size=ckpt.block_size, direct=bool(ckpt.direct))

    def _drain_paused(self, async_: bool) -> contextlib.AbstractContextManager:
        """The drain stopped during an async save's staging (:meth:`DrainProcess.paused`). Not during a sync
        save: its write may outlast the remote save lock's lease (``CKPTBENCH_LOCK_TTL_S``) of a paused copy."""
        if self._drainer is None or not async_:
            return contextlib.nullcontext()
        return self._drain_process.paused()

    def _retain_remote(self, step: int) -> None:
        assert self._remote is not None
        self._remote.retain(step, self.keep_remote, set())

    def remote_status(self) -> DrainStatus | None:
        """Where the copies to the remote tier stand (None without a remote tier): the step waiting or
        being copied, the newest one copied, and the latest failure (see :class:`DrainStatus`)."""
        return None if self._drainer is None else self._drainer.status()

    def wait_remote(self, timeout: float | None = None) -> DrainStatus | None:
        """Wait for the saves in flight, then until the remote tier has every step due (or the latest
        copy failed: it is retried later; see ``last_error``), at most ``timeout`` seconds.

        Returns:
            DrainStatus | None: the status then (None without a remote tier).
        """
        self.wait()
        return None if self._drainer is None else self._drainer.wait(timeout)

    # -- load / delete ------------------------------------------------------------------------

    def load(self, step: int | None = None, *, into: dict | None = None, device: Any = None,
             verify: bool = True, map_location: Any = None) -> dict:
        """Load ``step`` (None: the latest) as :func:`ckptbench.load` does.

        With a remote tier, a step is loaded from the local tier when it is committed there, else
        from the remote one; a local copy that fails to load (a shard missing or failing its checksum,
        the manifest unreadable) is logged and the remote copy loaded instead. For ``step=None`` an
        older step is tried next when no copy of the newest one loads. Under a launch every rank
        loads the same step from the same tier: rank 0's choice (by which tier holds a manifest).

        Args:
            step: the step to load, or None for :meth:`latest`.
            into: a state_dict of the same structure to load into, in place (then returned).
            device: where the loaded tensors go without ``into`` (default: the CPU).
            verify: check every tensor's CRC-32C.
            map_location: ``torch.load``'s, with :func:`ckptbench.load`'s meaning (instead of ``device``).

        Returns:
            dict: the state_dict (``into`` itself when given).

        Raises:
            StepNotFoundError: ``step`` is not committed here (the message lists the steps that are),
                or ``step`` is None and no step is.
            CorruptCheckpointError, NotACheckpointError, StorageIOError: no copy of the step(s) loads
                (the error of the last copy tried; the others are logged).
        """
        self._check_open()
        explicit = step is not None
        if explicit:
            step = _check_step(step)
        where = self.root if self._remote is None else f"{self.root} or {self._remote.url}"
        world = world_for(self.distributed)
        candidates: list[tuple[int, _Tier]] = []
        if world is None or world.is_first:
            for s in [step] if explicit else sorted(self.steps(), reverse=True):
                candidates += [(s, tier) for tier in self._tiers_holding(s)]
        if world is not None:
            chosen = world.broadcast([(s, tier is self._remote) for s, tier in candidates[:1]], "choosing the step")
            candidates = [(s, self._remote if remote else self._tier) for s, remote in chosen]
        if not candidates:
            if explicit:
                raise StepNotFoundError(f"step {step} is not a committed checkpoint under {where}; "
                                        f"{_describe_steps(self.steps())}")
            raise StepNotFoundError(f"no committed step under {where}", hint="save one first, or check the root")
        def load_from(s: int, tier: _Tier) -> dict:
            return self._checkpointer.load(tier.step_url(s), map_location, device=device, verify=verify, into=into,
                                           storage_options=tier.storage_options, distributed=self.distributed,
                                           allow_pickle=self.allow_pickle)

        for n, (s, tier) in enumerate(candidates):
            try:
                return load_from(s, tier)
            except _DAMAGED as exc:
                if world is None and tier is self._tier and isinstance(exc, _DAMAGED_DATA) \
                        and not isinstance(exc, NotReadableHereError):
                    # read once more before the step is marked (its next save replaces it): a flaky read
                    # (a bit flipped in transit, a network filesystem's hiccup) must not cost a good step
                    try:
                        state = load_from(s, tier)
                    except _DAMAGED:
                        self._damaged.add(s)
                    else:
                        log.warning("step %d under %s did not load (%s), then loaded when read again", s, tier.url,
                                    exc)
                        return state
                if n == len(candidates) - 1:
                    raise
                following = candidates[n + 1]
                log.warning("step %d under %s does not load (%s); loading step %d from %s instead", s, tier.url, exc,
                            following[0], following[1].url)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _tiers_holding(self, step: int) -> list[_Tier]:
        """The tiers where ``step`` is committed, local first (a tier that cannot be asked is skipped, logged)."""
        held = []
        for tier in (self._tier, self._remote):
            if tier is None:
                continue
            try:
                if tier.step_store(step).size(mf.MANIFEST_NAME) is not None:
                    held.append(tier)
            except Exception as exc:
                if tier is self._tier:
                    raise
                # an unreachable remote tier must not stop a load that the local tier can serve
                log.warning("the remote tier %s could not be asked for step %d: %s", tier.url, step, exc)
        return held

    def delete(self, step: int) -> None:
        """Remove the committed ``step`` from every tier holding it (its manifest first, so it is never
        half listed).

        Raises:
            StepNotFoundError: ``step`` is not committed here.
        """
        self._check_open()
        step = _check_step(step)
        tiers = self._tiers_holding(step)
        if not tiers:
            raise StepNotFoundError(f"step {step} is not a committed checkpoint under {self.root}; "
                                    f"{_describe_steps(self.steps())}")
        for tier in tiers:
            tier.remove_step(step, "deleted")

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for a save in flight (and its retention), then for the copy to the remote tier of the
        last step due (one more attempt where it failed; a step left uncopied is logged), then free
        the staging arena. Idempotent."""
        if self._closed:
            return
        self.wait()
        if self._drainer is not None:
            self._drainer.close()
            self._drain_process.close()
        self._checkpointer.close()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"the CheckpointManager of {self.root} is closed")

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._remote is None:
            return f"CheckpointManager({self.root!r}, keep_last={self.keep_last})"
        return (f"CheckpointManager({self.root!r}, keep_last={self.keep_last}, remote={self._remote.url!r}, "
                f"remote_every={self.remote_every}, keep_remote={self.keep_remote})")


#: What a copy that fails to load raises: the next copy (the remote one, an older step) is tried.
_DAMAGED = (CorruptCheckpointError, NotACheckpointError, StorageIOError, OSError)
#: What says a step's own data is damaged, so that saving the step again may replace it (an I/O error may pass;
#: a NotReadableHereError, a step of a newer torch or ckptbench, may be intact).
_DAMAGED_DATA = (CorruptCheckpointError, NotACheckpointError)


def _check_count(name: str, value: Any, none_means: str | None) -> None:
    if value is None and none_means is not None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        alternative = f" or None ({none_means})" if none_means else ""
        raise UsageError(f"{name} must be a positive integer{alternative}, got {value!r}")


def _committed(tier: _Tier) -> set[int]:
    return {step for step, committed in tier.listing().items() if committed}


def _describe_steps(steps: list[int]) -> str:
    if not steps:
        return "none is committed there"
    shown = ", ".join(map(str, steps[-10:]))
    return f"committed steps: {'..., ' if len(steps) > 10 else ''}{shown}"
