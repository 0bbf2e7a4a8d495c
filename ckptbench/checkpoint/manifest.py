"""The manifest: the commit record of a checkpoint, written last and atomically.

A directory holds a checkpoint exactly when it holds a valid ``manifest.json``. Commit order:
shards durable (fdatasync each, fsync the directory) -> manifest written to a temp name, fsynced ->
renamed over ``manifest.json`` -> directory fsynced. A crash at any point leaves either the previous
manifest (and the shards it names, which a save never touches) or the new one.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ckptbench.errors import CkptbenchError

MANIFEST_NAME = "manifest.json"
FORMAT = "ckptbench.checkpoint/1"
#: Files a save may create: shards named by save id, and the manifest's temp name.
OWNED_FILE = re.compile(r"^(shard-[0-9a-f]{8}-\d{5}\.bin|\.manifest\.json\.tmp-[0-9a-f]{8})$")


class NotACheckpointError(CkptbenchError):
    """The path holds no committed checkpoint (no manifest, or one that cannot be read)."""

    exit_code = 2


class CorruptCheckpointError(CkptbenchError):
    """A committed checkpoint whose data does not match its manifest (checksum or size)."""


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some FUSE filesystems refuse directory fsync
        if exc.errno not in (22, 95, 30):
            raise
    finally:
        os.close(fd)


def commit(directory: Path, manifest: dict[str, Any], save_id: str) -> None:
    """Write ``manifest`` durably and atomically as ``directory/manifest.json``."""
    tmp = directory / f".manifest.json.tmp-{save_id}"
    data = json.dumps(manifest, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / MANIFEST_NAME)
    fsync_directory(directory)


def read_manifest(directory: Path) -> dict[str, Any]:
    """The committed manifest of ``directory``; NotACheckpointError with the reason otherwise."""
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise NotACheckpointError(f"{directory} is not a directory holding a checkpoint")
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise NotACheckpointError(
            f"{directory} holds no committed checkpoint (no {MANIFEST_NAME})",
            hint="a save that did not finish leaves no manifest; nothing here can be loaded",
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotACheckpointError(f"{path} is not a valid manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise NotACheckpointError(f"{path} has format {found!r}; this ckptbench reads {FORMAT!r}")
    return manifest


def stale_files(directory: Path, keep: set[str]) -> list[Path]:
    """Files a save created that the committed manifest no longer names (older or crashed saves)."""
    return [p for p in directory.iterdir() if OWNED_FILE.match(p.name) and p.name not in keep]
