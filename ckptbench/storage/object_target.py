"""A benchmark target on object storage (``s3://bucket/prefix``, or another fsspec URL).

Benchmarks write only under a scratch prefix of their own (``PREFIX/ckptbench-scratch-PID-HEX/``)
and delete everything under it on exit, Ctrl-C included: every object, and (S3) every multipart
upload still open there, so no parts stay billed. Nothing outside the scratch prefix is touched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ckptbench.storage.local_target import scratch_in_use, scratch_name
from ckptbench.storage.store import Store, open_store

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "ckptbench-scratch-"


def _remove_everything(store: Store) -> int:
    """Delete every object under ``store``'s location (sub-prefixes too where the store can list them)."""
    names = store.list_recursive()
    if names:
        store.remove(names)
    return len(names)


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

    def open(self, subpath: str, **options: Any) -> Store:
        """A Store for ``URL/subpath`` with extra storage options (e.g. part_size, max_concurrency)."""
        return open_store(f"{self.url}/{subpath}", {**self.storage_options, **options})

    @contextmanager
    def scratch(self, shared_name: str | None = None) -> Iterator[ObjectScratch]:
        """A fresh scratch prefix, emptied on exit (also on Ctrl-C or error); ``shared_name``: the
        prefix another rank of a launch named."""
        scratch = ObjectScratch(self, shared_name or scratch_name(SCRATCH_PREFIX))
        log.info("scratch prefix %s", scratch.url)
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

    def cleanup(self) -> None:
        """Delete every object under the scratch prefix and abort its open multipart uploads."""
        try:
            store = self.store()
            removed = _remove_everything(store)
            aborted = store.abort_incomplete_uploads()
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the run's own error
            log.warning("could not clean the scratch prefix %s: %s", self.url, exc)
            return
        log.info("scratch prefix %s: %d object(s) deleted, %d upload(s) aborted", self.url, removed, aborted)
