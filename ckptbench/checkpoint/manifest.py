"""The manifest: the commit record of a checkpoint, written last and atomically.

A location holds a checkpoint exactly when it holds a valid ``manifest.json``. Commit order:
shards durable (``Store.write_files``) -> manifest put atomically (``Store.put_atomic``: locally a
temp name, fsync, rename, directory fsync). A crash at any point leaves either the previous manifest
(and the shards it names, which a save never touches) or the new one.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ckptbench.errors import CkptbenchError, UsageError
from ckptbench.storage.store import Store

MANIFEST_NAME = "manifest.json"
FORMAT = "ckptbench.checkpoint/1"
#: Files a save may create: shards named by save id, and the manifest's temp name.
#: Under a distributed launch shards carry the rank too: ``shard-<save id>-r<rank>-<index>.bin``.
OWNED_FILE = re.compile(r"^(shard-[0-9a-f]{8}(-r\d{5})?-\d{5}\.bin|\.manifest\.json\.tmp-[0-9a-f]{8})$")


class NotACheckpointError(CkptbenchError):
    """The path holds no committed checkpoint (no manifest, or one that cannot be read)."""

    exit_code = 2


class CorruptCheckpointError(CkptbenchError):
    """A committed checkpoint whose data does not match its manifest (checksum or size)."""


def commit(store: Store, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` durably and atomically as the store's ``manifest.json``: the commit."""
    store.put_atomic(MANIFEST_NAME, json.dumps(manifest, separators=(",", ":")).encode())


def read_manifest(store: Store) -> dict[str, Any]:
    """The committed manifest of ``store``; NotACheckpointError with the reason otherwise."""
    path = f"{store.url}/{MANIFEST_NAME}"
    if not store.is_dir_like():
        raise NotACheckpointError(f"{store.url} is not a directory holding a checkpoint")
    try:
        manifest = json.loads(store.get(MANIFEST_NAME))
    except FileNotFoundError:
        raise NotACheckpointError(
            f"{store.url} holds no committed checkpoint (no {MANIFEST_NAME})",
            hint="a save that did not finish leaves no manifest; nothing here can be loaded",
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotACheckpointError(f"{path} is not a valid manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise NotACheckpointError(f"{path} has format {found!r}; this ckptbench reads {FORMAT!r}")
    return manifest


def stale_files(store: Store, keep: set[str]) -> list[str]:
    """Objects a save created that the committed manifest no longer names (older or crashed saves)."""
    return [name for name in store.list() if OWNED_FILE.match(name) and name not in keep]


def rank_part(manifest: dict[str, Any], where: str, *, rank: int | None, world_size: int) -> dict[str, Any]:
    """The part of ``manifest`` one process loads: all of a single-process save; of a save by N
    ranks, part ``rank`` when given, else this launch's own rank's part (``world_size`` must be N).

    Raises UsageError for a rank or world size that does not match how it was saved (resharding is
    not supported), NotACheckpointError for a manifest whose parts are malformed."""
    parts = manifest.get("ranks")
    if parts is None:
        if rank not in (None, 0):
            raise UsageError(f"{where} was saved by one process; it has no rank {rank}")
        part = manifest
    else:
        saved = manifest.get("world_size")
        if not isinstance(parts, list) or saved != len(parts) or not parts:
            raise NotACheckpointError(f"{where}/{MANIFEST_NAME} says world_size {saved!r} but lists "
                                      f"{len(parts) if isinstance(parts, list) else 'no'} rank parts")
        if rank is None or world_size != saved and world_size > 1:
            here = f"this launch has {world_size} ranks" if world_size > 1 else "this is one process"
            raise UsageError(f"{where} was saved by {saved} ranks and {here}: each rank loads its own part, so "
                             f"it loads under a launch of {saved} ranks (resharding is not supported)",
                             hint=f"to read one rank's state_dict in one process, pass rank=K (0..{saved - 1})")
        if not 0 <= rank < saved:
            raise UsageError(f"{where} was saved by {saved} ranks; rank {rank} is not one of 0..{saved - 1}")
        part = parts[rank]
    missing = [k for k in ("shards", "tensors", "skeleton") if not isinstance(part, dict) or k not in part]
    if missing:
        raise NotACheckpointError(f"{where}/{MANIFEST_NAME} lacks {', '.join(missing)}"
                                  + (f" for rank {rank}" if parts is not None else ""))
    return part
