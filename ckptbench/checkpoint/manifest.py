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

from ckptbench.errors import CkptbenchError
from ckptbench.storage.store import Store

MANIFEST_NAME = "manifest.json"
FORMAT = "ckptbench.checkpoint/1"
#: Files a save may create: shards named by save id, and the manifest's temp name.
OWNED_FILE = re.compile(r"^(shard-[0-9a-f]{8}-\d{5}\.bin|\.manifest\.json\.tmp-[0-9a-f]{8})$")


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
