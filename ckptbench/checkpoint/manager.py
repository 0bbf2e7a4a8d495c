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

Where the steps live is a :class:`_Tier` (a root URL and its storage options): the manager writes to
one. A second, remote tier drained every k-th step would be another ``_Tier`` with the same listing
and retention, fed after the local commit.
"""

from __future__ import annotations

import logging
import operator
import os
import re
import threading
import time
from concurrent.futures import Future
from typing import Any

from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.api import Checkpointer, SaveHandle, SaveResult, _world_for
from ckptbench.checkpoint.lock import LOCK_NAME, CheckpointLockedError, acquire_save_lock
from ckptbench.errors import StepNotFoundError, UsageError
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


def remove_checkpoint(store: Store, why: str, wait_s: float = 0.0) -> bool:
    """Remove what saves created in ``store``'s checkpoint directory, the manifest first (so a half-removed
    checkpoint is no longer one), then its directory where that is a real one and empty. False (logged)
    when a save is writing there (its lock is held, still after ``wait_s`` seconds of waiting for it)
    or something else is left in it."""
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

    Args:
        root: directory or URL that holds the steps (created on the first save).
        keep_last: how many committed steps to keep (the newest), or None to keep all of them.
        storage_options: for object storage, as for :func:`ckptbench.save`.
        threads, shard_size, block_size, direct, checksum: the settings of the manager's
            :class:`Checkpointer` (its defaults where None).
        distributed: None detects a torch.distributed launch, False opts out, True requires one.
        allow_pickle: pickle values of other types at save and unpickle them at load (only for
            steps this job wrote or others it trusts; see :meth:`Checkpointer.load`).

    Example::

        with ckptbench.CheckpointManager("/ckpt/run1", keep_last=3) as manager:
            start = manager.latest()
            if start is not None:
                state = manager.load(start)
            for step in range(start or 0, steps):
                ...
                if step % 100 == 0:
                    manager.save(step, {"model": model.state_dict(), "optim": optim.state_dict()},
                                 async_=True)
    """

    def __init__(self, root: str | os.PathLike, *, keep_last: int | None = None,
                 storage_options: dict | None = None, threads: int | None = None, shard_size: int | None = None,
                 block_size: int | None = None, direct: bool | None = None, checksum: bool = True,
                 distributed: bool | None = None, allow_pickle: bool = False) -> None:
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise UsageError(f"keep_last must be a positive integer or None (keep every step), got {keep_last!r}")
        self.keep_last = keep_last
        self.distributed = distributed
        self.allow_pickle = allow_pickle
        self._tier = _Tier(root, storage_options)
        self._checkpointer = Checkpointer(threads=threads, shard_size=shard_size, block_size=block_size,
                                          direct=direct, checksum=checksum)
        self._pending: Future | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def root(self) -> str:
        """The root's URL (a local path for a directory)."""
        return self._tier.url

    def path(self, step: int) -> str:
        """Where ``step`` is (or would be) saved: a checkpoint directory any ``ckptbench.load`` reads."""
        return self._tier.step_url(_check_step(step))

    # -- listing ------------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """The committed steps, ascending. Saves in flight and interrupted saves are not among them.

        Returns:
            list[int]: step numbers; empty when nothing is committed (or the root does not exist yet).
        """
        return sorted(step for step, committed in self._tier.listing().items() if committed)

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
        handle = self._checkpointer.save(state_dict, url, async_=async_, overwrite=overwrite,
                                         storage_options=self._tier.storage_options, distributed=self.distributed,
                                         allow_pickle=self.allow_pickle)
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
        """Retention and cleanup once ``step`` is committed (rank 0 only under a launch). Never raises:
        the step is saved whatever happens here; what could not be removed is logged and retried by
        the next save."""
        world = _world_for(self.distributed)
        if world is not None and not world.is_first:
            return
        try:
            listing = self._tier.listing()
            committed = sorted(s for s, ok in listing.items() if ok)
            doomed: list[tuple[int, str]] = [(s, "an interrupted save") for s, ok in listing.items()
                                            if not ok and s != step]
            if self.keep_last is not None:
                kept = set(committed[-self.keep_last:]) | {step}
                doomed += [(s, f"keep_last={self.keep_last}") for s in committed if s not in kept]
        except Exception as exc:  # noqa: BLE001 - retention must not turn a committed save into a failure
            log.warning("retention after saving step %d under %s could not list the steps: %s", step, self.root, exc)
            return
        for old, why in sorted(doomed):
            try:
                self._tier.remove_step(old, why)
            except Exception as exc:  # noqa: BLE001 - the next save tries again
                log.warning("could not remove step %d under %s (%s): %s", old, self.root, why, exc)

    # -- load / delete ------------------------------------------------------------------------

    def load(self, step: int | None = None, *, into: dict | None = None, device: Any = "cpu",
             verify: bool = True) -> dict:
        """Load ``step`` (None: the latest) as :func:`ckptbench.load` does.

        Under a launch every rank loads the same step: rank 0's choice for ``step=None``.

        Args:
            step: the step to load, or None for :meth:`latest`.
            into: a state_dict of the same structure to load into, in place (then returned).
            device: where the loaded tensors go without ``into``.
            verify: check every tensor's CRC-32C.

        Returns:
            dict: the state_dict (``into`` itself when given).

        Raises:
            StepNotFoundError: ``step`` is not committed here (the message lists the steps that are),
                or ``step`` is None and no step is.
        """
        self._check_open()
        world = _world_for(self.distributed)
        if step is None:
            chosen = self.latest() if world is None or world.is_first else None
            if world is not None:
                chosen = world.broadcast(chosen, "choosing the latest step")
            if chosen is None:
                raise StepNotFoundError(f"no committed step under {self.root}",
                                        hint="save one first, or check the root")
            step = chosen
        else:
            step = _check_step(step)
            if self._tier.step_store(step).size(mf.MANIFEST_NAME) is None:
                raise StepNotFoundError(f"step {step} is not a committed checkpoint under {self.root}; "
                                        f"{_describe_steps(self.steps())}")
        return self._checkpointer.load(self._tier.step_url(step), device=device, verify=verify, into=into,
                                       storage_options=self._tier.storage_options, distributed=self.distributed,
                                       allow_pickle=self.allow_pickle)

    def delete(self, step: int) -> None:
        """Remove the committed ``step`` (its manifest first, so it is never half listed).

        Raises:
            StepNotFoundError: ``step`` is not committed here.
        """
        self._check_open()
        step = _check_step(step)
        if step not in self.steps():
            raise StepNotFoundError(f"step {step} is not a committed checkpoint under {self.root}; "
                                    f"{_describe_steps(self.steps())}")
        self._tier.remove_step(step, "deleted")

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for a save in flight (and its retention), then free the staging arena. Idempotent."""
        if self._closed:
            return
        self.wait()
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
        return f"CheckpointManager({self.root!r}, keep_last={self.keep_last})"


def _describe_steps(steps: list[int]) -> str:
    if not steps:
        return "none is committed there"
    shown = ", ".join(map(str, steps[-10:]))
    return f"committed steps: {'..., ' if len(steps) > 10 else ''}{shown}"
