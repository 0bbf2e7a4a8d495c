"""A benchmark target on object storage (``s3://bucket/prefix``, or another fsspec URL).

Benchmarks write only under a scratch prefix of their own (``PREFIX/ckptbench-scratch-PID-HEX/``)
and delete everything under it on exit, Ctrl-C included: every object, and (S3) every multipart
upload still open there, so no parts stay billed. Nothing outside the scratch prefix is touched.

A scratch prefix records the process that made it (``.ckptbench-owner.json``, as a local scratch
directory does, deleted last), so the prefixes of runs killed on this host (SIGKILL, a batch job's time
limit) are found and removed by :func:`remove_object_leftovers` (``ckptbench clean s3://...``).
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from ckptbench.errors import StorageIOError
from ckptbench.storage import owner as owners
from ckptbench.storage.local_target import (
    NOT_REMOVED,
    SCRATCH_OWNER,
    UNKNOWN_OWNER,
    Leftover,
    scratch_in_use,
    scratch_name,
)
from ckptbench.storage.store import Store, open_store

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "ckptbench-scratch-"
_SCRATCH_NAME = re.compile(rf"^{SCRATCH_PREFIX}\d+-[0-9a-f]+$")
#: The most bytes of an owner record read (one is about 250): a larger object is no record.
_MAX_OWNER_BYTES = 4096


def _remove_everything(store: Store) -> int:
    """Delete every object under ``store``'s location (sub-prefixes too where the store can list them)."""
    names = store.list_recursive()
    if names:
        store.remove(names)
    return len(names)


def _is_local_address(family: int, address: str) -> bool:
    """Whether ``address`` is one of this host's: binding a socket to it works only then."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


class ObjectTarget:
    """An object-storage location given to ``bench``: checked on ``prepare``, written only in scratch."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        self.store = open_store(url, self.storage_options)  # URL and credentials checked here
        self.url = self.store.url
        self.scheme = url.partition("://")[0].lower()

    def __str__(self) -> str:
        return self.url

    def prepare(self) -> None:
        """Check the bucket exists and is reachable (one-line TargetError naming what is wrong)."""
        self.store.prepare()

    def free_bytes(self) -> int | None:
        return None  # object stores have no free-space figure

    def describe(self) -> dict[str, Any]:
        """The environment's ``target`` block: where, and which endpoint and credential *source* (never secrets)."""
        return {"url": self.url, "filesystem": self.scheme, **self.store.describe()}

    def server_on_this_host(self) -> bool | None:
        """Whether the endpoint's server answers on this host (a loopback address, or an address of one of this
        host's interfaces): then its work on our requests runs on our CPUs. None without a known endpoint."""
        endpoint = self.store.describe().get("endpoint")
        host = urlsplit(endpoint).hostname if endpoint else None
        if not host:
            return None
        try:
            addresses = {(info[0], info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
        except (OSError, UnicodeError):
            return None
        return any(_is_local_address(family, address) for family, address in addresses)

    def open(self, subpath: str, **options: Any) -> Store:
        """A Store for ``URL/subpath`` with extra storage options (e.g. part_size, max_concurrency)."""
        return open_store(f"{self.url}/{subpath}", {**self.storage_options, **options})

    @contextmanager
    def scratch(self, shared_name: str | None = None) -> Iterator[ObjectScratch]:
        """A fresh scratch prefix, emptied on exit (also on Ctrl-C or error); ``shared_name``: the
        prefix another rank of a launch named."""
        scratch = ObjectScratch(self, shared_name or scratch_name(SCRATCH_PREFIX))
        log.info("scratch prefix %s", scratch.url)
        if shared_name is None:  # ranks sharing one prefix record no single owner (``clean`` keeps it)
            scratch.record_owner()
        with scratch_in_use(f"{scratch.url}/ (objects, incomplete multipart uploads)"):
            try:
                yield scratch
            finally:
                scratch.cleanup()


class ObjectScratch:
    """The scratch prefix of one run: locations inside it, their removal, and the final cleanup."""

    def __init__(self, target: ObjectTarget, name: str) -> None:
        self.target = target
        self.name = name
        self.url = f"{target.url}/{name}"

    def location(self, name: str) -> str:
        return f"{self.url}/{name}"

    def store(self, name: str = "", **options: Any) -> Store:
        return self.target.open(f"{self.name}/{name}".rstrip("/"), **options)

    def files(self, location: str) -> tuple[int, int]:
        """(objects, bytes) stored at ``location`` (a checkpoint: shards plus manifest)."""
        store = open_store(location, self.target.storage_options)
        names = store.list()
        return len(names), sum(store.size(n) or 0 for n in names)

    def remove(self, location: str) -> None:
        _remove_everything(open_store(location, self.target.storage_options))

    def record_owner(self) -> None:
        """Record this process as the prefix's owner; best effort (without it ``clean`` keeps the prefix)."""
        try:
            self.store().put_atomic(SCRATCH_OWNER, owners.ProcessOwner.me().encode())
        except Exception as exc:  # noqa: BLE001 - the run goes on
            log.info("could not record the owner of scratch prefix %s: %s", self.url, exc)

    def cleanup(self) -> None:
        """Delete every object under the scratch prefix and abort its open multipart uploads."""
        try:
            removed, aborted = _empty(self.store())
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the run's own error
            log.warning("could not clean the scratch prefix %s: %s", self.url, exc)
            return
        log.info("scratch prefix %s: %d object(s) deleted, %d upload(s) aborted", self.url, removed, aborted)


def _empty(store: Store) -> tuple[int, int]:
    """Delete every object under ``store``'s location, the owner record last (a kill on the way leaves it
    for ``clean``), and abort its open multipart uploads (where the store has them). (objects, uploads)."""
    names = store.list_recursive()
    others = [name for name in names if name != SCRATCH_OWNER]
    if others:
        store.remove(others)  # best effort: what it could not delete is logged, and listed below
    try:
        aborted, uploads_left = store.abort_incomplete_uploads(strict=True), False
    except StorageIOError:  # logged: parts may still be open, billed
        aborted, uploads_left = 0, True
    if SCRATCH_OWNER in names and not uploads_left \
            and not (others and [n for n in store.list_recursive() if n != SCRATCH_OWNER]):
        store.remove([SCRATCH_OWNER])  # only once nothing else is left: the record says whose the rest is
    return len(names), aborted


@dataclass(frozen=True)
class ObjectLeftover(Leftover):
    """A scratch prefix and whether a killed run of this host left it."""

    path: str  # type: ignore[assignment] - the prefix's URL (a Path would fold its "//")


def find_object_leftovers(url: str, storage_options: dict[str, Any] | None = None) -> list[ObjectLeftover]:
    """The scratch prefixes directly under ``url`` (``URL/ckptbench-scratch-PID-HEX/``), each with its
    owner's state (see ``owner.ProcessOwner.state``; none recorded: ``unknown owner``) and, where it may
    be removed, its bytes."""
    store = open_store(url, storage_options)
    found: dict[str, dict[str, int]] = {}
    for name, nbytes in store.sizes_recursive().items():  # one listing, sizes included
        head, _, rest = name.partition("/")
        if rest and _SCRATCH_NAME.match(head):
            found.setdefault(head, {})[rest] = nbytes
    leftovers = []
    for name, inside in sorted(found.items()):
        scratch = open_store(f"{store.url}/{name}", storage_options)
        owner = None
        if SCRATCH_OWNER in inside and inside[SCRATCH_OWNER] <= _MAX_OWNER_BYTES:
            try:
                owner = owners.ProcessOwner.decode(scratch.get(SCRATCH_OWNER))
            except (OSError, ValueError):
                owner = None
        state = UNKNOWN_OWNER if owner is None else owner.state(shared=True)
        size = sum(inside.values()) if state == owners.DEAD else None
        leftovers.append(ObjectLeftover(f"{store.url}/{name}", state, owner, size))
    return leftovers


def remove_object_leftovers(url: str, storage_options: dict[str, Any] | None = None, *,
                            dry_run: bool = False) -> tuple[list[ObjectLeftover], list[ObjectLeftover]]:
    """Remove the scratch prefixes that runs killed on this host left under ``url`` (``dry_run``: only
    say which): their objects and open multipart uploads, nothing else. Returns (removed, kept)."""
    removed: list[ObjectLeftover] = []
    kept: list[ObjectLeftover] = []
    for leftover in find_object_leftovers(url, storage_options):
        if not leftover.removable:
            kept.append(leftover)
            continue
        if not dry_run:
            scratch = open_store(str(leftover.path), storage_options)
            try:
                _empty(scratch)
            except Exception as exc:  # noqa: BLE001 - said, and the prefix kept
                log.warning("could not remove the scratch prefix %s: %s", leftover.path, exc)
            if scratch.list_recursive():
                kept.append(replace(leftover, state=NOT_REMOVED))
                continue
        removed.append(leftover)
    return removed, kept
