"""Where bytes go. A target string (a path or a URL) resolves to a storage target by its scheme.

Today only local and mounted filesystems (a plain path or ``file://``) are supported; object
storage (``s3://`` and other fsspec protocols) plugs in here by scheme.
"""

from __future__ import annotations

from ckptbench.errors import TargetError
from ckptbench.storage.local import LocalDirectory

__all__ = ["LocalDirectory", "resolve_target", "scheme_of"]

#: Schemes that are recognised but not implemented yet, with what to do meanwhile.
_NOT_YET = {"s3", "gs", "gcs", "az", "abfs", "abfss", "hdfs", "http", "https", "memory"}


def scheme_of(target: str) -> str:
    """``"s3://b/p"`` -> ``"s3"``; a plain path -> ``"file"``."""
    head, sep, _ = target.partition("://")
    return head.lower() if sep else "file"


def resolve_target(target: str) -> LocalDirectory:
    """Validate ``target`` and return the storage object that serves it (raises TargetError)."""
    scheme = scheme_of(target)
    if scheme == "file":
        return LocalDirectory.from_string(target.removeprefix("file://"))
    if scheme in _NOT_YET:
        raise TargetError(
            f"{target!r}: {scheme}:// targets are not supported yet by the storage benchmark",
            hint="give a local or mounted directory; checkpoints (ckptbench.save) can already go to s3://",
        )
    raise TargetError(f"{target!r}: unknown URL scheme {scheme!r}", hint="give a directory path")
