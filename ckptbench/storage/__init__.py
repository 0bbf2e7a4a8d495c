"""Where bytes go. A target string (a path or a URL) resolves to a storage target by its scheme:
a plain path (or ``file://``) is a local or mounted directory (the native engine); ``s3://`` and
any other fsspec protocol are object storage (``objects.ObjectTarget`` over a checkpoint ``Store``).
"""

from __future__ import annotations

from typing import Any

from ckptbench.errors import UsageError
from ckptbench.storage.local_target import LocalDirectory

__all__ = ["LocalDirectory", "resolve_target", "scheme_of"]


def scheme_of(target: str) -> str:
    """``"s3://b/p"`` -> ``"s3"``; a plain path -> ``"file"``."""
    head, sep, _ = target.partition("://")
    return head.lower() if sep else "file"


def resolve_target(target: str, storage_options: dict[str, Any] | None = None, *, force: bool = False,
                   forceable: bool = True) -> Any:
    """Validate ``target`` and return what serves it: a LocalDirectory, or an ObjectTarget for URLs
    (raises TargetError / UsageError / MissingDependencyError with one line). A system directory
    (``/``, ``/etc``, ``/usr``...) is refused unless ``force``; ``forceable=False`` where the command has no
    ``--force`` to suggest."""
    scheme = scheme_of(target)
    if scheme == "file":
        if storage_options:
            raise UsageError("--storage-option and --endpoint-url apply to object storage (s3://...), "
                             "not to a directory")
        return LocalDirectory.from_string(target.removeprefix("file://"), force=force, forceable=forceable)
    from ckptbench.storage.object_target import ObjectTarget

    return ObjectTarget(target, storage_options)
