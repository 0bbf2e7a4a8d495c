"""The commit: one manifest, written last and atomically, and the two-phase commit under a launch.

A save's shards are durable before its manifest is written (``commit``); a checkpoint exists once
the manifest is, and only then are the files of older or crashed saves removed (``remove_stale``).
A manifest write that fails may still have landed (an object store's answer lost on the way): it is
read back, and when that cannot settle it the shards are kept and ``CommitOutcomeUnknownError`` raised.

Under a launch (``commit_across_ranks``), coordinated through the rendezvous store:

1. every rank writes its shards (durable) and sends their description to rank 0, or its failure
   (``announce_failure``);
2. rank 0, with every rank's part in hand, commits one manifest naming all of them and publishes the
   outcome; if any rank failed, died or timed out, it commits nothing and publishes why;
3. every rank then removes its shards (failure) or its stale files (success); a rank that loses
   rank 0 before the outcome keeps its shards (the commit may have happened), for the next save's sweep.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.distributed import RankFailedError, World
from ckptbench.checkpoint.lock import SaveLock
from ckptbench.errors import CommitOutcomeUnknownError, OutcomeUnknownError
from ckptbench.interrupts import QuietThread, Workers
from ckptbench.storage.store import Store

log = logging.getLogger(__name__)

#: Seconds between re-reads of the manifest after a write whose answer was lost (it may land late).
COMMIT_RECHECK_S = (0.1, 0.3, 0.6, 1.0)


def current_manifest(store: Store) -> dict | None:
    """The manifest committed at ``store``, or None where there is none."""
    try:
        return mf.read_manifest(store)
    except mf.NotACheckpointError:
        return None


def commit(store: Store, manifest: dict, shards: list[str]) -> None:
    """Write the manifest; if that fails, remove this save's shards unless the manifest did land.

    A failed PUT may still have been stored (the answer was lost), so the manifest is read back:
    ours -> the commit happened; another save's, or none -> our shards are orphans, removed. Two
    cases keep them for the next save's sweep, since removing them could break a checkpoint that
    commits after all: the manifest cannot be read back, or the store says the write's outcome is
    unknown (OutcomeUnknownError: a request whose answer was lost may still be applied after the
    read-back; it is read again for a while first).
    """
    try:
        mf.commit(store, manifest)
    except BaseException as failure:
        unknown = isinstance(failure, OutcomeUnknownError)
        try:
            for wait_s in (0.0, *(COMMIT_RECHECK_S if unknown else ())):
                time.sleep(wait_s)
                current = current_manifest(store)
                if current is not None and current.get("save_id") == manifest["save_id"]:
                    log.info("%s: the manifest landed although its write failed (%s)", store.url, failure)
                    return
        except Exception:  # noqa: BLE001 - unreachable: leave the shards to the next sweep, report the commit
            if isinstance(failure, Exception):
                raise CommitOutcomeUnknownError(
                    f"committing {store.url} failed ({failure}) and its manifest could not be read back: the "
                    "checkpoint may or may not be committed; its shards are kept",
                    hint="load it to find out; the next save removes what is not committed") from failure
            raise failure from None
        if unknown:
            raise CommitOutcomeUnknownError(
                f"committing {store.url} failed ({failure}) and the manifest has not appeared since: the "
                "checkpoint may still commit; its shards are kept",
                hint="load it to find out; the next save removes what is not committed") from failure
        store.remove(shards)
        raise


def commit_across_ranks(world: World, key: str, store: Store, lock: SaveLock, own: list[str],
                        own_part: dict[str, Any], header: dict[str, Any]) -> int:
    """Phases 1 (after this rank's write) to 3 of the two-phase commit, on every rank: ``own_part``
    describes this rank's durable shards ``own``; rank 0 commits ``header`` with every rank's part.

    Returns:
        int: the bytes of all ranks together.

    Raises:
        RankFailedError: another rank failed, or rank 0 could not commit (this rank's shards are
            removed, or kept when the outcome is unknown); on rank 0, its own commit's error.
    """
    outcome_key = f"{key}/outcome"
    if not world.is_first:
        world.gather_to_first(key, own_part)
        outcome = world.wait_for(outcome_key, readers=world.world_size - 1,
                                 what=f"waiting for rank 0 to commit {store.url} (outcome unknown: this rank's "
                                      f"shards stay for the next save to remove)")
        if outcome["failed"] is not None:
            if outcome.get("keep"):
                raise RankFailedError(f"rank {world.rank}: whether {store.url} was committed is unknown "
                                      f"({outcome['failed']}); this rank's shards are kept")
            store.remove(own)
            raise RankFailedError(f"rank {world.rank}: {store.url} was not committed: {outcome['failed']}")
        keep = set(own)
        remove_stale(store, keep, owns=lambda name: f"-r{world.rank:05d}-" in name)
        return outcome["world_bytes"]
    try:
        parts = world.gather_to_first(key, own_part, what=f"saving {store.url}")
        assert parts is not None
    except RankFailedError as exc:
        world.publish(outcome_key, {"failed": str(exc)})
        store.remove(own)
        raise RankFailedError(f"{exc}; {store.url} was not committed") from None
    except BaseException as exc:
        world.publish(outcome_key, {"failed": f"rank 0: {exc}"})
        store.remove(own)
        raise
    world_bytes = sum(part["total_bytes"] for part in parts)
    manifest = {**header, "world_size": world.world_size, "total_bytes": world_bytes,
                "ranks": parts}
    committed = False
    try:
        with lock.committing(store, own):  # still ours (else LockLostError: nothing commits)
            commit(store, manifest, own)
            committed = True
            world.publish(outcome_key, {"failed": None, "world_bytes": world_bytes})
            remove_stale(store, {s["name"] for part in parts for s in part["shards"]})
    except BaseException as exc:
        if not committed:
            # Not committed for sure -> every rank removes its shards; unknown -> every rank keeps them.
            unknown = isinstance(exc, CommitOutcomeUnknownError) or not isinstance(exc, Exception)
            world.publish(outcome_key, {"failed": f"rank 0 could not commit the manifest: {exc}",
                                        "keep": unknown})
        raise
    return world_bytes


def announce_failure(world: World, key: str, exc: BaseException) -> None:
    """This rank fails before its shards are durable: tell the coordinator (rank 0 tells everyone)."""
    message = f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(Exception):
        if world.is_first:
            world.publish(f"{key}/outcome", {"failed": f"rank 0 failed: {message}"})
            # The others still send their parts (and some megabytes of tensor lists): collect them in
            # the background, so the rendezvous store does not keep them for the rest of the job.
            QuietThread(target=_drain, args=(world, key, message), name="ckptbench-drain", daemon=True).start()
        else:
            world.gather_to_first(key, failed=message)


def _drain(world: World, key: str, message: str) -> None:
    with contextlib.suppress(Exception):
        world.gather_to_first(key, failed=message)


def remove_stale(store: Store, keep: set[str], owns: Any = None) -> None:
    """After a commit: remove the files (and abort the uploads) of older or crashed saves that
    ``keep`` does not name; ``owns`` narrows them further (a rank removes only its own). On object
    storage the two sweeps run side by side (each is a listing and a request or more); on a mounted
    filesystem one after the other on this thread (a directory listing, and no uploads to abort)."""

    def files() -> None:
        store.remove([name for name in mf.stale_files(store, keep) if owns is None or owns(name)])

    def uploads() -> None:  # an earlier, failed save could not abort (stores without multipart uploads have none)
        store.abort_incomplete_uploads(lambda name: bool(mf.OWNED_FILE.match(name)) and name not in keep
                                       and (owns is None or owns(name)))

    if store.local_path is not None:
        files()
        uploads()
        return
    with Workers(2, "ckptbench-sweep") as pool:
        pool.submit(files)
        pool.submit(uploads)
        pool.join()
