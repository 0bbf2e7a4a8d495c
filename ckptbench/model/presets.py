"""Named presets: model shapes (``configs/models/*.toml``) and failure rates (``configs/failures/*.toml``).

Lookup order for the ``configs`` directory: ``ckptbench/_configs`` (where an installed wheel carries
a copy), then the repository's top-level ``configs/``. A preset's name is its file name without
``.toml``. The files hold their sources in comments; see :func:`configs_dir`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from ckptbench import safeio
from ckptbench.errors import ConfigError
from ckptbench.model.failures import FailurePreset
from ckptbench.model.sizing import ModelShape

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def configs_dir() -> Path:
    """The presets directory: ``ckptbench/_configs`` if installed there, else the repository's ``configs/``."""
    packaged = _PACKAGE_DIR / "_configs"
    if packaged.is_dir():
        return packaged
    return _PACKAGE_DIR.parent / "configs"


def preset_names(kind: str) -> list[str]:
    """Names of the presets of one kind (``models`` or ``failures``), sorted."""
    directory = configs_dir() / kind
    return sorted(p.stem for p in directory.glob("*.toml")) if directory.is_dir() else []


def load_model(name: str) -> ModelShape:
    """The model preset ``name`` (e.g. ``llama3-70b``) as a :class:`ModelShape`."""
    data = _load("models", name)
    return _build(ModelShape, "model", name, data)


def load_failures(name: str) -> FailurePreset:
    """The failure preset ``name`` (e.g. ``llama3``) as a :class:`FailurePreset`."""
    data = _load("failures", name)
    return _build(FailurePreset, "failure", name, data)


def _load(kind: str, name: str) -> dict[str, Any]:
    # Only a name that is one of the files: never a path built from user text (``..``, a NUL byte, a
    # name longer than the filesystem allows) handed to the filesystem.
    names = preset_names(kind)
    if name not in names:
        singular = kind.rstrip("s")
        raise ConfigError(f"unknown {singular} preset {name!r}", hint=f"known: {', '.join(names) or 'none found'}")
    path = configs_dir() / kind / f"{name}.toml"
    try:
        return safeio.loads_toml(safeio.read_text(path, safeio.MAX_CONFIG_BYTES, "preset"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"preset {str(path)!r} is not valid TOML: {exc}") from None


def _build(cls: type, what: str, name: str, data: dict[str, Any]) -> Any:
    fields = {f.name for f in dataclasses.fields(cls)} - {"name"}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(
            f"{what} preset {name!r} has unknown key {unknown[0]!r}",
            hint=f"known: {', '.join(sorted(fields))}",
        )
    try:
        return cls(name=name, **data)
    except TypeError as exc:  # a required key is missing
        raise ConfigError(f"{what} preset {name!r}: {exc}") from None
