"""Named presets: model shapes (``configs/models/*.toml``, with the published run's training defaults in an
optional ``[training]`` table), failure rates (``configs/failures/*.toml``) and GPUs' peak compute
(``configs/gpus/*.toml``).

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


@dataclasses.dataclass(frozen=True)
class GpuPreset:
    """A GPU's peak dense tensor-core rate in the training dtype (BF16), from its datasheet (``source``)."""

    name: str
    peak_tflops: float
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.peak_tflops, bool) or not isinstance(self.peak_tflops, (int, float)) \
                or not 0 < self.peak_tflops < 1e6:
            raise ConfigError(f"gpu preset {self.name!r}: peak_tflops {self.peak_tflops!r} is not a positive number")


@dataclasses.dataclass(frozen=True)
class TrainingDefaults:
    """What a model's published training run used (a model preset's ``[training]`` table), each ``None``
    where the source does not say: the defaults ``goodput`` takes for ``--tokens``, ``--gpu``, ``--mfu``."""

    name: str
    tokens: float | None = None
    gpu: str | None = None
    mfu: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for key, value, high in (("tokens", self.tokens, 1e18), ("mfu", self.mfu, 1.0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value <= high):
                raise ConfigError(f"model preset {self.name!r}: [training] {key} = {value!r} is out of range")


def load_model(name: str) -> ModelShape:
    """The model preset ``name`` (e.g. ``llama3-70b``) as a :class:`ModelShape`."""
    data = dict(_load("models", name))
    data.pop("training", None)
    return _build(ModelShape, "model", name, data)


def load_training(name: str) -> TrainingDefaults:
    """The ``[training]`` table of model preset ``name`` (all ``None`` when it has none)."""
    table = _load("models", name).get("training", {})
    if not isinstance(table, dict):
        raise ConfigError(f"model preset {name!r}: [training] must be a table")
    return _build(TrainingDefaults, "model training", name, table)


def load_gpu(name: str) -> GpuPreset:
    """The GPU preset ``name`` (e.g. ``h100``)."""
    return _build(GpuPreset, "gpu", name, _load("gpus", name))


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
