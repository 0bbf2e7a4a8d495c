"""Storage tiers (``configs/tiers/NAME.toml``): where a tier is, what storing checkpoints there costs,
and the storage bill of one training run.

A tier file holds these keys (every one but ``url`` optional):

==========================  ===================================================================
``url``                     a directory path (local disk, NFS/CephFS/Lustre mount; a relative path is
                            taken from the current directory) or a URL (``s3://bucket/prefix``)
``description``             one line
``notes``                   free text: what the tier is, where its prices come from
``cost_per_gb_month_usd``   USD per GB (1e9 bytes) kept for one month (730 hours)
``cost_per_gib_month_usd``  the same per GiB (2^30 bytes), as AWS bills it; give at most one of the two
``cost_per_1000_put_usd``   USD per 1000 write-class requests (PUT, POST, COPY, LIST); object storage only
``cost_per_1000_get_usd``   USD per 1000 read-class requests (GET, HEAD); object storage only
``[storage_options]``       as ``--storage-option`` (``endpoint_url``, ``part_size``, ...); credentials are
                            refused here: they come from the environment, a profile or the command line
==========================  ===================================================================

The bill (:func:`run_bill`) is what the tier charges for one run, nothing else (no GPU time, no
data transfer): ``keep`` checkpoints stored for the run's wall time, plus the requests of every
checkpoint written and every restore read. Request counts are estimates from the writer's layout
(:func:`object_requests`). Pure except :func:`load_tier`, which reads one TOML file.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptbench import safeio
from ckptbench.errors import ConfigError
from ckptbench.model.presets import configs_dir, preset_names

#: A billing month: 730 hours (8760 / 12), the month AWS's monthly estimates use.
SECONDS_PER_MONTH = 730 * 3600.0
GIB_PER_GB = 1e9 / 2**30
#: storage_options keys that hold credentials: never accepted in a tier file (they get committed).
CREDENTIAL_OPTIONS = frozenset({"key", "secret", "token", "aws_access_key_id", "aws_secret_access_key",
                                "aws_session_token", "password", "account_key", "sas_token", "client_secret"})
_PRICE_KEYS = ("cost_per_gb_month_usd", "cost_per_gib_month_usd", "cost_per_1000_put_usd", "cost_per_1000_get_usd")
_KEYS = frozenset({"url", "description", "notes", "storage_options", *_PRICE_KEYS})


@dataclass(frozen=True)
class TierPrices:
    """What a tier charges: per GB (1e9 bytes) per month of 730 h, per 1000 write and read requests (USD).
    ``None`` means not given (unknown), which is not the same as 0 (free)."""

    per_gb_month_usd: float | None = None
    per_1000_put_usd: float | None = None
    per_1000_get_usd: float | None = None

    def __post_init__(self) -> None:
        for name in ("per_gb_month_usd", "per_1000_put_usd", "per_1000_get_usd"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                      or not math.isfinite(value) or value < 0):
                raise ConfigError(f"price {name} {value!r} must be a number, zero or more")

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.per_gb_month_usd, self.per_1000_put_usd, self.per_1000_get_usd))

    @property
    def has_requests(self) -> bool:
        return self.per_1000_put_usd is not None or self.per_1000_get_usd is not None

    def to_dict(self) -> dict[str, float | None]:
        return {"cost_per_gb_month_usd": self.per_gb_month_usd, "cost_per_1000_put_usd": self.per_1000_put_usd,
                "cost_per_1000_get_usd": self.per_1000_get_usd}


@dataclass(frozen=True)
class Tier:
    """One storage tier: a location, its storage options (no credentials), its prices and notes."""

    name: str
    url: str
    description: str = ""
    notes: str = ""
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    prices: TierPrices = field(default_factory=TierPrices)
    source: str = ""

    def __post_init__(self) -> None:
        where = f"tier {self.name!r}"
        if not isinstance(self.url, str) or not self.url.strip():
            raise ConfigError(f"{where}: url must be a directory path or a URL, got {self.url!r}")
        secrets = sorted(k for k in self.storage_options if str(k).lower() in CREDENTIAL_OPTIONS)
        if secrets:
            raise ConfigError(f"{where}: storage_options {secrets[0]!r} is a credential, which a tier file must not "
                              "hold", hint="use the environment (AWS_ACCESS_KEY_ID ...), a profile, or "
                                           "--storage-option on the command line")
        if self.prices.has_requests and not self.is_url:
            raise ConfigError(f"{where}: request prices apply to object storage (a URL), not to the directory "
                              f"{self.url!r}", hint="drop cost_per_1000_put_usd / cost_per_1000_get_usd")
        if self.storage_options and not self.is_url:
            raise ConfigError(f"{where}: storage_options apply to object storage (a URL), not to the directory "
                              f"{self.url!r}")

    @property
    def is_url(self) -> bool:
        return "://" in self.url and not self.url.lower().startswith("file://")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "description": self.description, "notes": self.notes,
                "storage_options": dict(self.storage_options), **self.prices.to_dict(), "source": self.source}


def tier_names() -> list[str]:
    """The tiers shipped in ``configs/tiers``, sorted."""
    return preset_names("tiers")


def is_tier_file(text: str) -> bool:
    return text.endswith(".toml") and Path(text).is_file()


def load_tier(name_or_path: str) -> Tier:
    """The tier ``configs/tiers/NAME.toml``, or a tier file ``PATH.toml`` (ConfigError naming what is wrong)."""
    if name_or_path.endswith(".toml"):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ConfigError(f"tier file {name_or_path!r} does not exist")
        name = path.stem
    else:
        path = configs_dir() / "tiers" / f"{name_or_path}.toml"
        if "/" in name_or_path or "\\" in name_or_path or not path.is_file():
            raise ConfigError(f"unknown tier {name_or_path!r}",
                              hint=f"known: {', '.join(tier_names()) or 'none found'}, or a TIER.toml file")
        name = name_or_path
    try:
        data = safeio.loads_toml(safeio.read_text(path, safeio.MAX_CONFIG_BYTES, "tier file"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"tier file {str(path)!r} is not valid TOML: {exc}") from None
    return tier_from_mapping(name, data, source=str(path))


def tier_from_mapping(name: str, data: Mapping[str, Any], *, source: str = "") -> Tier:
    """A :class:`Tier` from a tier file's table (keys and units in the module docstring)."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"tier {name!r} has unknown key {unknown[0]!r}", hint=f"known: {', '.join(sorted(_KEYS))}")
    if "url" not in data:
        raise ConfigError(f"tier {name!r} has no url", hint="url = \"/mnt/nvme\" or url = \"s3://bucket/prefix\"")
    for key in ("url", "description", "notes"):
        if key in data and not isinstance(data[key], str):
            raise ConfigError(f"tier {name!r}: {key} must be a string, got {data[key]!r}")
    options = data.get("storage_options", {})
    if not isinstance(options, Mapping):
        raise ConfigError(f"tier {name!r}: storage_options must be a table, got {options!r}")
    if "cost_per_gb_month_usd" in data and "cost_per_gib_month_usd" in data:
        raise ConfigError(f"tier {name!r} gives both cost_per_gb_month_usd and cost_per_gib_month_usd",
                          hint="give one: per GB (1e9 bytes) or per GiB (2^30 bytes)")
    per_gb = data.get("cost_per_gb_month_usd")
    if "cost_per_gib_month_usd" in data:
        per_gib = data["cost_per_gib_month_usd"]
        _price(name, "cost_per_gib_month_usd", per_gib)
        per_gb = per_gib * GIB_PER_GB
    for key in _PRICE_KEYS:
        if key in data:
            _price(name, key, data[key])
    prices = TierPrices(per_gb, data.get("cost_per_1000_put_usd"), data.get("cost_per_1000_get_usd"))
    return Tier(name=name, url=data["url"], description=data.get("description", ""), notes=data.get("notes", ""),
                storage_options=dict(options), prices=prices, source=source)


def _price(name: str, key: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"tier {name!r}: {key} {value!r} must be a number, zero or more (USD)")


# -- the bill of one run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectRequests:
    """Requests one checkpoint save and one restore issue on object storage (estimates, see :func:`object_requests`)."""

    objects_per_checkpoint: int
    put_per_checkpoint: int
    get_per_restore: int


def object_requests(rank_bytes: int, ranks: int, shard_bytes: int, part_bytes: int) -> ObjectRequests:
    """Requests of a checkpoint of ``ranks`` ranks each writing ``rank_bytes``, by the ckptbench writer.

    Each rank writes ``ceil(rank_bytes / shard_bytes)`` shard objects of equal size and one manifest. A
    shard up to ``part_bytes`` is one PUT; a larger one is a multipart upload: create + one PUT per part
    + complete (all write-class requests). A restore reads each rank's manifest (one GET) and every shard
    in ranged GETs of ``part_bytes``. Listing, HEADs and retries are not counted.
    """
    shards = max(1, math.ceil(rank_bytes / shard_bytes))
    shard = math.ceil(rank_bytes / shards)
    parts = max(1, math.ceil(shard / part_bytes))
    put_per_shard = 1 if parts == 1 else parts + 2
    return ObjectRequests(
        objects_per_checkpoint=ranks * (shards + 1),
        put_per_checkpoint=ranks * (shards * put_per_shard + 1),
        get_per_restore=ranks * (shards * parts + 1),
    )


@dataclass(frozen=True)
class RunUse:
    """What one training run does on a tier: ``retained_bytes`` kept for ``wall_s``; ``checkpoints``
    saves and ``restores`` loads, each issuing ``requests`` (None on a filesystem)."""

    retained_bytes: int
    wall_s: float
    checkpoints: float | None
    restores: float
    requests: ObjectRequests | None


def run_bill(prices: TierPrices, use: RunUse) -> dict[str, Any] | None:
    """USD the tier charges for ``use``: ``storage_usd``, ``put_usd``, ``get_usd`` and ``total_usd``
    (a part is None when its price is not given, or when the number of checkpoints is unknown);
    None when the tier has no prices at all.

    storage = retained GB x months of wall time x price per GB-month; puts = checkpoints x PUTs per
    checkpoint / 1000 x price; gets = restores x GETs per restore / 1000 x price.
    """
    if not prices.given:
        return None
    storage = None
    if prices.per_gb_month_usd is not None:
        storage = use.retained_bytes / 1e9 * (use.wall_s / SECONDS_PER_MONTH) * prices.per_gb_month_usd
    puts = gets = None
    if use.requests is not None:
        if prices.per_1000_put_usd is not None and use.checkpoints is not None:
            puts = use.checkpoints * use.requests.put_per_checkpoint / 1000 * prices.per_1000_put_usd
        if prices.per_1000_get_usd is not None:
            gets = use.restores * use.requests.get_per_restore / 1000 * prices.per_1000_get_usd
    parts = [p for p in (storage, puts, gets) if p is not None]
    incomplete = prices.per_1000_put_usd is not None and use.requests is not None and use.checkpoints is None
    return {
        "storage_usd": storage,
        "put_usd": puts,
        "get_usd": gets,
        "total_usd": sum(parts) if parts else None,
        "complete": not incomplete,
        "months": use.wall_s / SECONDS_PER_MONTH,
        "retained_bytes": use.retained_bytes,
        "checkpoints": use.checkpoints,
        "restores": use.restores,
        "put_requests_per_checkpoint": use.requests.put_per_checkpoint if use.requests else None,
        "get_requests_per_restore": use.requests.get_per_restore if use.requests else None,
        "objects_per_checkpoint": use.requests.objects_per_checkpoint if use.requests else None,
    }
