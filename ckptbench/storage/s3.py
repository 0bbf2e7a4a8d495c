"""S3 (and S3-compatible: Ceph RGW, MinIO) checkpoint storage on boto3, driven by threads.

Why boto3 and threads rather than s3fs: bandwidth to object storage comes from concurrency (one
connection to real S3 tops out near 100 MB/s), so every part of every shard goes through one pool of
``max_concurrency`` workers, each part uploaded straight from the caller's memory (no copy of the
shard), and reads are ranged GETs in parallel into the caller's buffers.

Semantics the checkpoint writer relies on (see ``store.Store``):

- ``write_files`` returns once every object is complete (PutObject or CompleteMultipartUpload
  acknowledged: S3 stores it durably before answering). On any failure, Ctrl-C included, the
  multipart uploads it started are aborted (no orphan parts) and the objects it completed are deleted.
- ``put_atomic`` is one PutObject: the object appears whole or not at all. It is the commit.
- Requests are retried by botocore (``standard`` mode: exponential backoff with jitter on throttling,
  5xx and connection errors). Metadata requests use fewer attempts and a short connect timeout, so an
  unreachable endpoint fails in a few seconds, not a hang.
- Data requests pass through one AIMD controller per connection (``s3_pacing.Aimd``): throttling
  halves the requests in flight, successes add them back up to the configured concurrency. What the
  requests met (throttled answers, retries, the seconds they cost) is counted (``s3_pacing``).
- Servers that differ from S3 are found out from their answers and the finding kept per connection
  (``_Quirks``): DeleteObjects refused (GCS's XML API): one DeleteObject per key; ListObjectsV2 refused or
  answered without continuation tokens: ListObjects with a Marker. docs/library.md lists the servers.
- ``prefix_spread=N`` stores the objects ``write_files`` writes under N hashed sub-prefixes
  (``3-spread/NAME``) for buckets that throttle per prefix; names stay flat (see ``S3Store._data_key``).

Credentials and endpoint come the standard way (environment incl. ``AWS_ENDPOINT_URL``, profiles,
shared files, instance roles) or from ``storage_options``; see :class:`S3Options`. Secrets never
appear in messages, logs or ``repr``: errors name the credential *source*.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

from ckptbench.errors import (
    CkptbenchError,
    MissingDependencyError,
    OutcomeUnknownError,
    StorageIOError,
    TargetError,
    UsageError,
)
from ckptbench.interrupts import Workers
from ckptbench.storage.s3_clients import CLIENTS, DEFAULT_CLIENT, ViewStream, data_path, require
from ckptbench.storage.s3_pacing import Aimd, RequestStats, is_throttle
from ckptbench.storage.store import Store, WriteReport
from ckptbench.units import format_size, parse_size

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'ckptbench[s3]'"
MIN_PART_BYTES = 5 * 2**20  # S3: every part but the last is at least 5 MiB
MAX_PART_BYTES = 5 * 2**30
MAX_PARTS = 10_000
#: Below this many workers an upload is bounded by per-connection throughput; used when neither
#: ``max_concurrency`` nor a larger ``threads`` is given (logged).
DEFAULT_MIN_CONCURRENCY = 8
#: Attempts (first try included) and connect timeout of metadata requests (HEAD, GET manifest, LIST):
#: 3 attempts x 2 s plus backoff bound how long an unreachable endpoint takes to report (< 10 s).
CONTROL_MAX_ATTEMPTS = 3
CONTROL_CONNECT_TIMEOUT_S = 2.0
READ_CHUNK_BYTES = 2**20
#: HTTP connections a data client may keep (created on demand): the ceiling on requests in flight.
MAX_POOL_CONNECTIONS = 64
#: ``write_files``: objects whose CompleteMultipartUpload may be in flight beside the part uploads.
COMPLETING_AT_ONCE = 4
#: DeleteObject requests in flight where a server refuses DeleteObjects (``S3Store._delete_each``).
DELETE_EACH_AT_ONCE = 16
#: The most hashed sub-prefixes ``prefix_spread`` accepts; their names: ``_spread_dir``.
MAX_PREFIX_SPREAD = 4096
_SPREAD_DIR = re.compile(r"^[0-9a-f]{1,3}-spread$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                 "ExpiredToken", "TokenRefreshRequired", "AllAccessDisabled", "403"}
_CREDENTIAL_METHODS = {
    "env": "the environment (AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "the shared credentials file (~/.aws/credentials)",
    "config-file": "the AWS config file (~/.aws/config)",
    "iam-role": "the instance metadata (IAM role)",
    "container-role": "the container credentials endpoint",
    "assume-role": "an assumed role",
    "assume-role-with-web-identity": "a web identity role",
    "sso": "AWS SSO",
}


def _import_boto3() -> Any:
    try:
        import boto3
        import botocore  # noqa: F401 - comes with boto3; imported here so a broken install says so
    except ImportError as exc:
        raise MissingDependencyError(f"s3:// needs boto3, which is not installed ({exc})", hint=INSTALL_HINT) from None
    return boto3


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"storage option {key}={value!r} is not a boolean (true/false)")


def _as_number(key: str, value: Any, kind: Callable[[str], Any], minimum: float) -> Any:
    try:
        number = kind(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum:
        raise UsageError(f"storage option {key}={value!r} must be a number >= {minimum:g}")
    return number


@dataclass(frozen=True)
class S3Options:
    """``storage_options`` for ``s3://`` (the CLI's ``--storage-option key=value`` and ``--endpoint-url``).

    Strings are accepted for every field (``part_size="16MiB"``, ``max_concurrency="32"``). Names of
    boto3 and s3fs work as aliases (``aws_access_key_id``/``key``, ``region``/``region_name``,
    ``client_kwargs={"endpoint_url": ...}``).
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    profile: str | None = None
    key: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    #: Unsigned requests (public buckets); no credentials are looked up.
    anon: bool = False
    #: Multipart part size; objects up to this size are one PutObject. Raised automatically (logged)
    #: for objects that would need more than ``max_parts`` parts.
    part_size: int = 16 * 2**20
    #: The most parts of one multipart upload: S3's 10,000, or a server's lower limit (Ceph RGW's
    #: ``rgw_multipart_part_upload_limit``, for one).
    max_parts: int = MAX_PARTS
    #: Parts in flight across all objects (uploads and ranged reads). Default: max(threads, 8).
    max_concurrency: int | None = None
    #: botocore attempts per data request (first try included), standard retry mode. Default:
    #: ``AWS_MAX_ATTEMPTS`` where set (as the AWS SDKs read it), else 8.
    max_attempts: int = 8
    #: Adapt the data requests in flight to throttling (AIMD, ``s3_pacing``); off: always ``max_concurrency``.
    adaptive_concurrency: bool = True
    #: Spread the objects a save writes over this many hashed sub-prefixes (0: none); for buckets
    #: that throttle per prefix. Loads find them whatever this is set to.
    prefix_spread: int = 0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    #: Create the bucket in ``prepare`` when it does not exist (never done implicitly otherwise).
    create_bucket: bool = False
    #: "path", "virtual" or "auto"; default: the AWS profile's ``s3 = addressing_style`` where set, else
    #: path-style with a custom endpoint (what RGW/MinIO expect), else auto.
    addressing_style: str | None = None
    #: What moves the data: "boto3", "s3fs" or "crt" (``s3_clients``); metadata requests use boto3.
    client: str = DEFAULT_CLIENT
    #: boto3: SHA-256 of every body in its SigV4 signature (botocore does it over http unless told not to).
    #: Off: UNSIGNED-PAYLOAD, as over https; what is stored is checked by ckptbench's CRC-32C per tensor.
    #: The hash cost ~2 s of client CPU per GiB uploaded (measured on the CI machines' 2 vCPUs).
    #: Default: the AWS profile's ``s3 = payload_signing_enabled`` where set, else off.
    sign_payload: bool | None = None
    #: botocore's CRC32 of every upload's body (flexible checksums); off: only where S3 requires one
    #: (servers without ``x-amz-checksum-*`` support). Default: as AWS_REQUEST_CHECKSUM_CALCULATION or the
    #: profile's ``request_checksum_calculation`` say where set, else off.
    request_checksums: bool | None = None

    def __post_init__(self) -> None:
        if self.endpoint_url is not None and "@" in self.endpoint_url:  # user:password@ (a password may hold "/")
            raise UsageError("endpoint_url holds credentials (user:password@host); they are not accepted there",
                             hint="give the host only, and credentials through the environment or a profile")
        if self.endpoint_url is not None and not re.match(r"^https?://[^/\s]+", self.endpoint_url):
            raise UsageError(f"endpoint_url {self.endpoint_url!r} is not an http:// or https:// URL")
        if not MIN_PART_BYTES <= self.part_size <= MAX_PART_BYTES:
            raise UsageError(f"part_size {format_size(self.part_size)} is outside S3's limits "
                             f"({format_size(MIN_PART_BYTES)} to {format_size(MAX_PART_BYTES)})")
        if not 1 <= self.max_parts <= MAX_PARTS:
            raise UsageError(f"max_parts {self.max_parts} is outside S3's limits (1 to {MAX_PARTS})")
        if self.client not in CLIENTS:
            raise UsageError(f"unknown S3 client {self.client!r}", hint=f"accepted: {', '.join(CLIENTS)}")
        if self.addressing_style not in (None, "path", "virtual", "auto"):
            raise UsageError(f"addressing_style {self.addressing_style!r} must be path, virtual or auto")
        if (self.key is None) != (self.secret is None):
            raise UsageError("storage options key and secret must be given together")
        if self.prefix_spread > MAX_PREFIX_SPREAD:
            raise UsageError(f"prefix_spread {self.prefix_spread} is more than {MAX_PREFIX_SPREAD} sub-prefixes")
        if self.token is not None and self.key is None:
            raise UsageError("storage option token (a session token) needs key and secret too",
                             hint="pass key=... and secret=... with it, or drop token")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> S3Options:
        aliases = {"aws_access_key_id": "key", "aws_secret_access_key": "secret", "aws_session_token": "token",
                   "region": "region_name", "profile_name": "profile", "connect_timeout": "connect_timeout_s",
                   "read_timeout": "read_timeout_s", "endpoint": "endpoint_url"}
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for raw_key, value in _flatten_s3fs_style(dict(options or {})).items():
            key = aliases.get(raw_key, raw_key)
            if key not in known:
                raise UsageError(f"unknown storage option {raw_key!r} for s3://",
                                 hint=f"known: {', '.join(sorted(known))}")
            if value is not None:
                values[key] = value
        if "part_size" in values:
            try:
                values["part_size"] = parse_size(values["part_size"])
            except ValueError as exc:
                raise UsageError(f"storage option part_size: {exc}") from None
        for key in ("anon", "create_bucket", "sign_payload", "request_checksums", "adaptive_concurrency"):
            if key in values:
                values[key] = _as_bool(key, values[key])
        for key, kind, minimum in (("max_concurrency", int, 1), ("max_attempts", int, 1), ("prefix_spread", int, 0),
                                   ("max_parts", int, 1),
                                   ("connect_timeout_s", float, 0.1), ("read_timeout_s", float, 0.1)):
            if key in values:
                values[key] = _as_number(key, values[key], kind, minimum)
        raw = os.environ.get("AWS_MAX_ATTEMPTS", "").strip()
        if "max_attempts" not in values and raw:
            try:
                values["max_attempts"] = _as_number("max_attempts", raw, int, 1)
            except UsageError:
                raise UsageError(f"AWS_MAX_ATTEMPTS={raw!r} must be a whole number >= 1") from None
        return cls(**values)


#: s3fs's nested storage options (``client_kwargs``, ``config_kwargs`` and botocore's ``s3`` and
#: ``retries`` settings in it) that name a setting of ours.
_S3FS_NESTED = {
    "client_kwargs": ("endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key", "aws_session_token"),
    "config_kwargs": ("connect_timeout", "read_timeout", "s3", "retries"),
    "config_kwargs['s3']": ("addressing_style", "payload_signing_enabled"),
    "config_kwargs['retries']": ("total_max_attempts", "max_attempts"),
}


def _nested(where: str, value: Any) -> Mapping[str, Any]:
    """``value`` (the s3fs-style option ``where``), checked to hold only what ckptbench applies."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(f"storage option {where} must be a mapping (as for s3fs), not {type(value).__name__}")
    unknown = sorted(set(value) - set(_S3FS_NESTED[where]))
    if unknown:
        raise UsageError(f"storage option {where} holds {', '.join(map(repr, unknown))}, which s3:// does not apply",
                         hint=f"{where} may hold: {', '.join(_S3FS_NESTED[where])}")
    return value


def _flatten_s3fs_style(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with s3fs's ``client_kwargs`` and ``config_kwargs`` (as given to fsspec for s3://)
    turned into ours; a nested key that ckptbench would not apply is a UsageError, never ignored."""
    flat = {k: v for k, v in options.items() if k not in ("client_kwargs", "config_kwargs")}
    flat.update(_nested("client_kwargs", options.get("client_kwargs")))
    config = dict(_nested("config_kwargs", options.get("config_kwargs")))
    s3 = _nested("config_kwargs['s3']", config.pop("s3", None))
    retries = _nested("config_kwargs['retries']", config.pop("retries", None))
    flat.update(config)
    for ours, botocores in (("addressing_style", "addressing_style"), ("sign_payload", "payload_signing_enabled")):
        if s3.get(botocores) is not None:
            flat[ours] = s3[botocores]
    if retries.get("total_max_attempts") is not None:
        flat["max_attempts"] = retries["total_max_attempts"]
    elif retries.get("max_attempts") is not None:  # botocore's max_attempts counts the retries alone
        flat["max_attempts"] = _as_number("max_attempts", retries["max_attempts"], int, 0) + 1
    return flat


def parse_s3_url(url: str) -> tuple[str, str]:
    """``"s3://bucket/a/b/"`` -> ``("bucket", "a/b")``; UsageError for anything that is not such a URL.

    The prefix is the key prefix as written, less trailing slashes: ``a//b`` stays ``a//b`` (S3 keys are
    strings, and ``a//b/x`` is another object than ``a/b/x``, as boto3, the AWS CLI and s3torchconnector
    name it)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("s3", "s3a"):
        raise TargetError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = rest.partition("/")
    # user:secret@bucket; AWS secrets may hold '/', so look past the first one too. Never echo it.
    if "@" in bucket or (":" in bucket and "@" in rest):
        raise TargetError("credentials inside an s3:// URL are not accepted",
                          hint="use the environment, a profile or storage_options")
    shown = f"s3://{bucket}/{prefix}"
    if not bucket:
        raise TargetError(f"{url!r} names no bucket", hint="write s3://BUCKET/PREFIX")
    if "?" in rest or "#" in rest:
        raise TargetError(f"{shown!r}: query strings and fragments are not part of an S3 location")
    if ":" in bucket:  # possibly user:secret — do not repeat it
        raise TargetError("an s3:// URL with ':' in the bucket name is not valid (credentials do not belong in the URL)",
                          hint="write s3://BUCKET/PREFIX; give credentials through the environment or a profile")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise TargetError(f"{shown!r}: {bucket!r} is not a valid bucket name",
                          hint="3-63 characters: lowercase letters, digits, '.', '-'")
    prefix = prefix.rstrip("/")
    if any(p in (".", "..") for p in prefix.split("/")):
        raise TargetError(f"{shown!r}: '.' and '..' are not allowed in an S3 prefix")
    return bucket, prefix


@dataclass
class _Upload:
    """One multipart upload in flight: the worker finishing its last part completes it."""

    key: str
    view: memoryview
    part_bytes: int
    upload_id: str
    etags: list[str | None]
    lock: threading.Lock = field(default_factory=threading.Lock)
    completed: bool = False

    @property
    def parts(self) -> int:
        return len(self.etags)


class PartUpload:
    """One object of ``S3Store.upload_in_parts``: ``put(index, view)`` uploads part ``index`` (from any
    thread, ``part_bytes`` each, the last one shorter), ``complete()`` makes the object once every part
    is in, ``abort()`` removes what was uploaded. An object of a single part is put whole by ``put(0)``.
    Nothing is visible under its name before ``complete()`` (the single part: before its ``put``)."""

    def __init__(self, store: S3Store, name: str, nbytes: int, part_bytes: int | None = None) -> None:
        self._store, self.name, self._key = store, name, store._data_key(name)
        self.part_bytes = store.part_bytes_for(nbytes, part_bytes)
        self.parts = max(1, math.ceil(nbytes / self.part_bytes))
        self._etags: list[str | None] = [None] * self.parts
        self._upload_id: str | None = None
        if self.parts > 1:
            self._upload_id = store._data_call("starting the upload of", name, "create_multipart_upload",
                                               Key=self._key)["UploadId"]
        self._whole = False  # the single part was put

    def put(self, index: int, view: memoryview) -> None:
        view = view.cast("B") if view.format != "B" else view
        started = time.perf_counter()
        with self._store._slot(None) as slot:
            if self._upload_id is None:
                self._store._upload("uploading", self.name, slot, self._key, view)
                self._whole = True
            else:
                self._etags[index] = self._store._upload("uploading a part of", self.name, slot, self._key, view,
                                                         upload_id=self._upload_id, part_number=index + 1)["ETag"]
        self._store._moved(len(view), started)

    def complete(self) -> None:
        if self._upload_id is not None:
            parts = [{"PartNumber": i + 1, "ETag": etag} for i, etag in enumerate(self._etags)]
            self._store._data_call("completing", self.name, "complete_multipart_upload", Key=self._key,
                                   UploadId=self._upload_id, MultipartUpload={"Parts": parts})
            self._upload_id = None
            self._whole = True

    def abort(self) -> None:
        """Best effort: an unfinished upload aborted, a completed object deleted."""
        upload = _Upload(self._key, memoryview(b""), self.part_bytes, self._upload_id or "", self._etags,
                         completed=self._upload_id is None)
        self._store._discard([upload] if self._upload_id else [], [self._key] if self._whole else [])


@dataclass(frozen=True)
class _Connection:
    """boto3 clients for one set of options; shared by every S3Store opened with them."""

    data: Any  # part uploads and ranged reads: many attempts (standard retries), paced by AIMD, a large pool
    control: Any  # metadata requests: few attempts, short connect timeout (fast, bounded failure)
    endpoint: str
    endpoint_source: str
    credential_source: str
    session: Any  # the boto3 session: credentials for clients other than boto3
    region: str
    pacing: Aimd  # requests in flight on the data path, adapted to throttling
    stats: RequestStats  # what the data path's requests met
    #: "path", "virtual" or "auto" (botocore's choice per request): as storage_options, the profile's
    #: ``s3`` settings or the custom endpoint decided; the other clients address the bucket the same way.
    addressing_style: str = "auto"
    checksums: dict[str, str] = field(default_factory=dict)  # the clients' checksum setting (``_checksum_setting``)
    #: The CA bundle botocore verifies TLS with (AWS_CA_BUNDLE, the profile's ca_bundle); None: the system's.
    ca_bundle: str | None = None
    #: Buckets a ``prepare`` found (see there); ``S3Store._missing_bucket`` forgets one.
    buckets_found: set[str] = field(default_factory=set)
    #: What this endpoint was found to answer otherwise than S3 does (``_Quirks``), learnt on first use.
    quirks: _Quirks = field(default_factory=lambda: _Quirks())


@dataclass
class _Quirks:
    """How a server that differs from S3 is talked to, found out from its answers and remembered per
    connection (so per endpoint and options): each flag is set once, with a log line, and never unset."""

    #: DeleteObjects refused (501 NotImplemented from GCS's XML API, 400 MalformedXML or a refused
    #: checksum header elsewhere): one DeleteObject per key instead.
    delete_each: bool = False
    #: ListObjectsV2 refused, or answered without a NextContinuationToken on a truncated page (a server
    #: that answers it as ListObjects V1): ListObjects with a Marker instead.
    list_v1: bool = False


def _credential_source(session: Any, opts: S3Options) -> str:
    if opts.anon:
        return "none (anonymous requests)"
    if opts.key is not None:
        return "storage_options (key/secret)"
    credentials = session.get_credentials()
    if credentials is None:
        raise TargetError(
            "no AWS credentials found for s3://",
            hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, use a profile (AWS_PROFILE or storage_options "
                 "profile), pass storage_options key/secret, or anon=true for a public bucket")
    source = _CREDENTIAL_METHODS.get(credentials.method, credentials.method)
    if opts.profile or session.profile_name not in (None, "default"):
        source += f", profile {session.profile_name!r}"
    return source


def _configured_endpoint(core: Any) -> tuple[str | None, str]:
    """The endpoint botocore resolves for S3 when none is passed, and where it comes from: the
    AWS_ENDPOINT_URL_S3 and AWS_ENDPOINT_URL variables, then the profile's ``services`` section and its
    ``endpoint_url`` (botocore's own ``ConfiguredEndpointProvider``), none where
    AWS_IGNORE_CONFIGURED_ENDPOINT_URLS (or the profile's ``ignore_configured_endpoint_urls``) says so."""
    from botocore.configprovider import ConfiguredEndpointProvider

    if core.get_config_variable("ignore_configured_endpoint_urls"):
        return None, "the default"
    endpoint = ConfiguredEndpointProvider(full_config=core.full_config, scoped_config=core.get_scoped_config(),
                                          client_name="s3").provide()
    if not endpoint:
        return None, "the default"
    for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(variable) == endpoint:
            return endpoint, variable
    return endpoint, f"the AWS config file (profile {core.get_config_variable('profile') or 'default'!r})"


def _configured(core: Any, name: str, variable: str | None = None) -> Any:
    """A setting the AWS environment gives (``variable``, then the profile's ``name``), None when unset."""
    value = os.environ.get(variable) if variable else None
    return value or core.get_scoped_config().get(name)


@functools.lru_cache(maxsize=8)
def _connect(opts: S3Options, aws_environment: tuple[tuple[str, str], ...]) -> _Connection:
    """Clients for ``opts`` (cached: creating a boto3 session costs ~0.2-0.5 s). ``aws_environment``
    (the AWS_* variables) is part of the cache key, so changed credentials give new clients.

    What ``opts`` leaves unset is botocore's to resolve, as for any AWS SDK: the endpoint
    (``_configured_endpoint``), the region, credentials, the CA bundle, the profile's ``s3``
    settings and the checksum settings. Three defaults are ckptbench's where neither ``opts`` nor
    the AWS environment sets them: path-style addressing with a custom endpoint (what RGW and MinIO
    expect), unsigned payloads, and checksums only where S3 requires one (``_checksum_setting``)."""
    boto3 = _import_boto3()
    import botocore.session
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ProfileNotFound

    env = dict(aws_environment)
    core = botocore.session.get_session()
    try:
        session = boto3.session.Session(profile_name=opts.profile, aws_access_key_id=opts.key,
                                        aws_secret_access_key=opts.secret, aws_session_token=opts.token,
                                        botocore_session=core)
        credential_source = _credential_source(session, opts)
        endpoint, endpoint_source = opts.endpoint_url, "storage_options endpoint_url"
        if endpoint is None:
            endpoint, endpoint_source = _configured_endpoint(core)
        configured_s3 = core.get_config_variable("s3") or {}
        ca_bundle = core.get_config_variable("ca_bundle")
        checksums = _checksum_setting(Config, opts, core)
    except ProfileNotFound:
        named, where = next(((name, source) for name, source in (
            (opts.profile, "storage_options profile"), (env.get("AWS_PROFILE"), "AWS_PROFILE"),
            (env.get("AWS_DEFAULT_PROFILE"), "AWS_DEFAULT_PROFILE")) if name), (None, "AWS_DEFAULT_PROFILE"))
        raise UsageError(f"AWS profile {named!r} (from {where}) not found",
                         hint="check ~/.aws/config and AWS_CONFIG_FILE") from None
    except BotoCoreError as exc:  # a malformed config file, a services section that is not there
        raise UsageError(f"the AWS configuration cannot be used: {exc}") from None
    style = opts.addressing_style or configured_s3.get("addressing_style") or ("path" if endpoint else None)
    common: dict[str, Any] = {"read_timeout": opts.read_timeout_s, **checksums}
    s3_config: dict[str, Any] = {"addressing_style": style} if style else {}
    if opts.anon:
        common["signature_version"] = UNSIGNED
    region = opts.region_name or session.region_name or "us-east-1"
    try:
        data = session.client("s3", endpoint_url=endpoint, region_name=region, config=Config(
            retries={"total_max_attempts": opts.max_attempts, "mode": "standard"}, connect_timeout=opts.connect_timeout_s,
            max_pool_connections=max(opts.max_concurrency or 0, MAX_POOL_CONNECTIONS) + COMPLETING_AT_ONCE,
            s3={**s3_config, **_payload_signing(opts, configured_s3)}, **common))
        control = session.client("s3", endpoint_url=endpoint, region_name=region, config=Config(
            retries={"total_max_attempts": min(CONTROL_MAX_ATTEMPTS, opts.max_attempts), "mode": "standard"},
            connect_timeout=min(CONTROL_CONNECT_TIMEOUT_S, opts.connect_timeout_s), s3=s3_config, **common))
    except (ValueError, BotoCoreError) as exc:
        where = f" from {endpoint_source}" if endpoint else ""
        raise UsageError(f"cannot use S3 endpoint {endpoint!r}{where}: {exc}") from None
    for client in (data, control):  # first: the retry handler that answers the event would hide it
        client.meta.events.register_first("needs-retry.s3.PutObject", _note_put_attempt)
        client.meta.events.register("before-sign.s3.DeleteObjects", _add_content_md5)
    _send_conditions_as_headers(control)
    data.meta.events.register_first("needs-retry.s3", _note_attempt)
    data.meta.events.register("before-send.s3", _note_send)
    return _Connection(data, control, data.meta.endpoint_url, endpoint_source, credential_source, session, region,
                       Aimd(opts.max_concurrency or DEFAULT_MIN_CONCURRENCY), RequestStats(), style or "auto",
                       checksums, ca_bundle)


def _payload_signing(opts: S3Options, configured_s3: Mapping[str, Any]) -> dict[str, Any]:
    """The data client's ``payload_signing_enabled``: ``sign_payload`` where given; none where the
    profile's ``s3`` settings have one (botocore reads it); else off."""
    if opts.sign_payload is None and "payload_signing_enabled" in configured_s3:
        return {}
    return {"payload_signing_enabled": bool(opts.sign_payload)}


def _checksum_setting(config: Any, opts: S3Options, core: Any) -> dict[str, str]:
    """botocore's flexible-checksum setting: ``request_checksums`` where given; else none where the AWS
    environment sets one (AWS_REQUEST_CHECKSUM_CALCULATION, the profile's request_checksum_calculation:
    botocore reads it); else only where S3 requires one. botocore < 1.36 computes no such checksum."""
    if "request_checksum_calculation" not in getattr(config, "OPTION_DEFAULTS", {}):
        return {}
    if opts.request_checksums is None:
        if _configured(core, "request_checksum_calculation", "AWS_REQUEST_CHECKSUM_CALCULATION"):
            return {}
        return {"request_checksum_calculation": "when_required"}
    return {"request_checksum_calculation": "when_supported" if opts.request_checksums else "when_required"}


#: PutObject's conditional-write parameters (``S3Store.put_if``) and their headers. botocore's S3 model has
#: IfNoneMatch from 1.35.2 and IfMatch from 1.35.69; boto3 >= 1.28 allows a botocore from 1.31.
CONDITIONAL_PUT_HEADERS = {"IfNoneMatch": "If-None-Match", "IfMatch": "If-Match"}


def _send_conditions_as_headers(client: Any) -> None:
    """Where ``client``'s botocore has no conditional-write parameter on PutObject (its validation refuses
    one it does not know), send it as its header: taken out of the parameters before they are checked,
    put on the request before it is signed."""
    members = client.meta.service_model.operation_model("PutObject").input_shape.members
    missing = {name: header for name, header in CONDITIONAL_PUT_HEADERS.items() if name not in members}
    if not missing:
        return

    def take(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        headers = {missing[name]: params.pop(name) for name in list(params) if name in missing}
        if headers:
            context["ckptbench_conditions"] = headers

    def send(request: Any, **_: Any) -> None:
        for header, value in request.context.get("ckptbench_conditions", {}).items():
            del request.headers[header]  # once, on every attempt's signing
            request.headers[header] = value

    client.meta.events.register("before-parameter-build.s3.PutObject", take)
    client.meta.events.register("before-sign.s3.PutObject", send)


def _add_content_md5(request: Any, **_: Any) -> None:
    """botocore's ``before-sign`` of a DeleteObjects: S3 requires a Content-MD5 or an ``x-amz-checksum-*``
    header on it, and botocore >= 1.36 sends only the CRC32 one, which servers that predate those headers
    refuse (400 MissingContentMD5 or InvalidRequest): with both, every server takes it."""
    body = request.body
    if isinstance(body, str):
        body = body.encode()
    if isinstance(body, bytes | bytearray) and "Content-MD5" not in request.headers:
        digest = hashlib.md5(body, usedforsecurity=False).digest()
        request.headers["Content-MD5"] = base64.b64encode(digest).decode()


#: Per thread: whether an attempt of the PutObject in progress may have reached the server unanswered.
_put_attempts = threading.local()


def _note_put_attempt(caught_exception: BaseException | None = None, **_: Any) -> None:
    """botocore's ``needs-retry`` event, on the calling thread for each attempt of a PutObject: note an
    attempt that failed after it may have been sent (a connection closed or a read timed out, not a
    connection that never opened). Returns None, so the retry decision stays botocore's."""
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

    if caught_exception is not None and not isinstance(caught_exception, (EndpointConnectionError,
                                                                          ConnectTimeoutError)):
        _put_attempts.unanswered = True


@dataclass
class _Tracked:
    """The data request a worker thread has in flight: its attempts, as botocore's events report them."""

    pacing: Aimd | None
    started: float | None  # when it got its slot (the controller's clock)
    attempts: int = 0
    first_send: float = 0.0
    last_send: float = 0.0
    throttled: int = 0
    errors: int = 0


#: Per thread: the data request in flight (None outside one).
_tracking = threading.local()


def _note_send(**_: Any) -> None:
    """botocore's ``before-send``, once per attempt on the sending thread. Returns None (send it)."""
    tracked = getattr(_tracking, "request", None)
    if tracked is not None:
        now = time.perf_counter()
        tracked.first_send = tracked.first_send or now
        tracked.last_send = now
        tracked.attempts += 1


def _note_attempt(response: Any = None, caught_exception: BaseException | None = None, **_: Any) -> None:
    """botocore's ``needs-retry`` after every attempt of a data request: a throttled answer brings the
    concurrency down (``Aimd.throttled``); throttles and other failures are counted. Returns None, so
    the retry decision stays botocore's."""
    tracked = getattr(_tracking, "request", None)
    if tracked is None:
        return
    if caught_exception is not None:
        tracked.errors += 1
        return
    if response is None:
        return
    http, parsed = response
    status = getattr(http, "status_code", None)
    code = (parsed or {}).get("Error", {}).get("Code") if isinstance(parsed, dict) else None
    if is_throttle(status, code):
        tracked.throttled += 1
        if tracked.pacing is not None:
            tracked.pacing.throttled(tracked.started)
    elif status is not None and status >= 500:
        tracked.errors += 1


def _answer(exc: BaseException) -> tuple[int | None, str]:
    """The HTTP status and S3 error code of a refused request (``exc`` a botocore ClientError, or the
    ckptbench error ``S3Store._call`` made of one); (None, "") for anything else."""
    from botocore.exceptions import ClientError

    cause = exc if isinstance(exc, ClientError) else exc.__cause__
    if not isinstance(cause, ClientError):
        return None, ""
    return (cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode"),
            str(cause.response.get("Error", {}).get("Code", "")))


#: Answers that say a server does not take an operation (or our form of it), rather than that it failed.
_REFUSED_STATUSES = {400, 405, 411, 501}
_REFUSED_CODES = {"NotImplemented", "MalformedXML", "MethodNotAllowed", "InvalidRequest", "InvalidArgument",
                  "MissingContentMD5", "MissingContentLength", "XNotImplemented"}


def _refused(exc: BaseException) -> bool:
    status, code = _answer(exc)
    return code in _REFUSED_CODES or status in _REFUSED_STATUSES


@dataclass
class _Progress:
    """What the pages of one listing brought so far: the greatest key, and the common prefixes."""

    greatest_key: str | None = None
    prefixes: set[str] = field(default_factory=set)

    def advanced(self, page: Mapping[str, Any]) -> bool:
        """Whether ``page`` lists a key past every key before it or a common prefix not seen before (a
        server may repeat a common prefix on every page)."""
        keys = [item["Key"] for item in page.get("Contents", [])]
        prefixes = {p["Prefix"] for p in page.get("CommonPrefixes", [])}
        newer = bool(keys) and (self.greatest_key is None or max(keys) > self.greatest_key)
        advanced = newer or bool(prefixes - self.prefixes)
        if newer:
            self.greatest_key = max(keys)
        self.prefixes |= prefixes
        return advanced


def _under(items: list[dict[str, Any]], prefix: str, url: str, what: str = "object") -> list[dict[str, Any]]:
    """The listed ``items`` whose ``Key`` lies under ``prefix`` (the prefix's own directory marker, a key
    equal to it, is none of them). A server that ignores a request's Prefix, or a proxy that rewrites it,
    may list others' keys: those are never taken for ours, so never deleted or aborted (logged)."""
    inside, outside = [], []
    for item in items:
        key = item.get("Key")
        if isinstance(key, str) and key.startswith(prefix):
            if len(key) > len(prefix):
                inside.append(item)
        else:
            outside.append(key)
    if outside:
        log.warning("the listing of %s named %d %s(s) outside it (such as %r): left alone", url, len(outside), what,
                    outside[0])
    return inside


def _last_listed(page: Mapping[str, Any]) -> str | None:
    """The greatest key or common prefix of a listing page (S3 lists in UTF-8 byte order, which is the
    order of Python's str comparison), None for an empty page."""
    listed = [item["Key"] for item in page.get("Contents", [])] + [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return max(listed, default=None)


def _spread_dir(name: str, spread: int) -> str:
    """The hashed sub-prefix of ``name`` among ``spread`` (SHA-1: the same in every process, and names
    that differ in one digit land far apart)."""
    return f"{int.from_bytes(hashlib.sha1(name.encode()).digest()[:4], 'big') % spread:x}-spread"


class S3Store(Store):
    """``s3://bucket/prefix``: objects named ``prefix/NAME``. See the module docstring for semantics."""

    conditional_writes = True
    ranged_reads = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.options = S3Options.from_mapping(storage_options)
        _import_boto3()
        require(self.options.client)  # before any client is made: a missing package is the news
        connection = _connect(self.options, tuple(sorted((k, v) for k, v in os.environ.items()
                                                         if k.startswith("AWS_"))))
        self._data, self._control = connection.data, connection.control
        self.endpoint, self.endpoint_source = connection.endpoint, connection.endpoint_source
        self.credential_source = connection.credential_source
        self._session, self.region = connection.session, connection.region
        self.pacing = connection.pacing if self.options.adaptive_concurrency else None
        self.stats = connection.stats
        self.addressing_style = connection.addressing_style
        self.checksums = connection.checksums
        self.ca_bundle = connection.ca_bundle
        self._buckets_found = connection.buckets_found
        self._quirks = connection.quirks
        self._placed: dict[str, str] = {}  # name -> key of objects found under a spread sub-prefix
        self._discovered = False  # whether this location was listed for them
        self._client_data: Any = None  # the data path of a client other than boto3, made on first use
        self._reached = False  # whether a request succeeded (connection errors after that are runtime errors)
        #: Called as ``(bytes, seconds)`` for every object or part uploaded and every range read (progress
        #: bars, per-request latency); from worker threads.
        self.on_request: Callable[[int, float], None] | None = None
        log.debug("S3 store %s at %s (endpoint from %s), credentials from %s, part size %s", self.url,
                  self.endpoint, self.endpoint_source, self.credential_source, format_size(self.options.part_size))

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r}, credentials from {self.credential_source})"

    def server(self) -> str:
        return f"{self.endpoint}/{self.bucket}"

    def credentials(self) -> Any:
        """The resolved credentials (botocore's frozen ones), for clients other than boto3."""
        credentials = self._session.get_credentials()
        if credentials is None:
            raise TargetError("no AWS credentials found for s3://",
                              hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or storage_options")
        return credentials.get_frozen_credentials()

    def _other_client(self) -> Any:
        if self._client_data is None:
            self._client_data = data_path(self)
        return self._client_data

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"endpoint": self.endpoint, "endpoint_source": self.endpoint_source,
                                "credential_source": self.credential_source}
        info = {key: value for key, value in info.items() if value is not None}
        return {**info, "client": self.options.client, "part_size_bytes": self.options.part_size,
                "max_concurrency": self.options.max_concurrency}

    # -- names --------------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _data_key(self, name: str) -> str:
        """The key of an object that ``write_files`` writes or a load reads: where a listing or a lookup
        found it, else under its hashed sub-prefix with ``prefix_spread``, else next to the manifest.
        Names stay flat (a manifest names ``shard-...bin``, wherever the object lies), so a checkpoint
        saved with any spread loads, lists and is removed with any other setting."""
        placed = self._placed.get(name)
        if placed is not None:
            return placed
        if self.options.prefix_spread:
            return self._key(f"{_spread_dir(name, self.options.prefix_spread)}/{name}")
        return self._key(name)

    def _discover(self) -> bool:
        """List this location once to find objects under spread sub-prefixes; whether any was new."""
        if self._discovered:
            return False
        before = len(self._placed)
        self._list(recursive=False)
        self._discovered = True
        return len(self._placed) > before

    def _where(self, name: str | None = None) -> str:
        return f"{self.url}/{name}" if name else self.url

    # -- errors -------------------------------------------------------------------------------

    def _error(self, exc: BaseException, action: str, name: str | None = None,
               attempts: int | None = None) -> BaseException:
        """A botocore exception as a ckptbench error (or FileNotFoundError), in one line."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        if isinstance(exc, (CkptbenchError, FileNotFoundError)):
            return exc
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            status, code = _answer(exc)
            if code == "NoSuchBucket":
                return self._missing_bucket()
            if (status == 301 or code in ("PermanentRedirect", "301", "IllegalLocationConstraintException")
                    or (code == "AuthorizationHeaderMalformed" and error.get("Region"))):
                return self._wrong_region(exc.response)
            if code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchUpload"):
                return FileNotFoundError(f"{self._where(name)} does not exist")
            if code in _ACCESS_CODES or status == 403:
                detail = "" if code in ("403", "AccessDenied") else f" ({code})"
                return TargetError(
                    f"access denied to {self.url} at {self.endpoint}{detail}; credentials from {self.credential_source}",
                    hint="check the key pair and the bucket's permissions")
            message = error.get("Message") or ""
            return StorageIOError(f"{action} {self._where(name)} failed: {code or status}"
                                  f"{': ' + message if message else ''}", hint=self._hint(code, message))
        if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
            kind = StorageIOError if self._reached else TargetError
            tries = f" after {attempts} attempts" if attempts else ""
            # Mid-run (the server answered before), say what failed where; up front, the endpoint is the news.
            doing = f"{action} {self._where(name)} failed: " if self._reached else ""
            return kind(f"{doing}cannot reach the S3 endpoint {self.endpoint} (from {self.endpoint_source}){tries}",
                        hint="check the endpoint URL and that the server is up")
        if isinstance(exc, NoCredentialsError):
            return TargetError("no AWS credentials found for s3://",
                               hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or storage_options")
        if isinstance(exc, BotoCoreError):
            return StorageIOError(f"{action} {self._where(name)} failed: {exc}")
        return exc

    def _hint(self, code: str, message: str) -> str | None:
        """The fix for an answer that says how this server differs from S3, where one is known."""
        if code == "EntityTooSmall":
            return (f"this server's smallest part is larger than part_size={format_size(self.options.part_size)}: "
                    "raise storage_options part_size (what the server's documentation gives as its minimum)")
        if any(word in message.lower() for word in ("checksum", "aws-chunked", "x-amz-trailer")):
            return ("this server refuses botocore's flexible checksums (x-amz-checksum-*, aws-chunked): set "
                    "storage_options request_checksums=false or AWS_REQUEST_CHECKSUM_CALCULATION=when_required "
                    "(ckptbench checks every tensor's CRC-32C on load)")
        return None

    def _wrong_region(self, response: Mapping[str, Any]) -> TargetError:
        """A bucket in another region than the requests were signed for, where botocore's own redirect
        (one retry with the region the server names) did not settle it."""
        headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        region = headers.get("x-amz-bucket-region") or response.get("Error", {}).get("Region")
        where = f"region {region!r}" if region else "another region"
        return TargetError(f"bucket {self.bucket!r} at {self.endpoint} is in {where}, not {self.region!r}",
                           hint=f"set AWS_DEFAULT_REGION={region or 'REGION'} (or the profile's region, or "
                                "storage_options region) to the bucket's region")

    def _missing_bucket(self) -> TargetError:
        self._buckets_found.discard(self.bucket)  # the next prepare looks again (and creates it if asked)
        return TargetError(f"bucket {self.bucket!r} does not exist at {self.endpoint}",
                           hint="create it first, or pass storage_options create_bucket=true")

    def _call(self, client: Any, action: str, name: str | None, method: str, **kwargs: Any) -> Any:
        try:
            response = getattr(client, method)(Bucket=self.bucket, **kwargs)
        except Exception as exc:
            attempts = self.options.max_attempts if client is self._data else min(CONTROL_MAX_ATTEMPTS,
                                                                                  self.options.max_attempts)
            raise self._error(exc, action, name, attempts) from exc
        self._reached = True
        return response

    @contextmanager
    def _slot(self, stop: threading.Event | None) -> Iterator[float | None]:
        """A slot of the AIMD controller for one data request (its start time; None when ``stop`` was
        set while waiting: skip the request). Without the controller, at once."""
        if self.pacing is None:
            yield time.monotonic()
            return
        with self.pacing.slot(stop.is_set if stop is not None else None) as started:
            yield started

    def _data_call(self, action: str, name: str, method: str, *, started: float | None = None,
                   **kwargs: Any) -> Any:
        """One data request on the boto3 client, its attempts counted and a throttled answer reported to
        the AIMD controller (as of ``started``, the request's slot; see ``s3_pacing``)."""
        tracked = _Tracked(self.pacing, started if started is not None else time.monotonic())
        _tracking.request = tracked
        ok = False
        try:
            response = self._call(self._data, action, name, method, **kwargs)
            ok = True
            return response
        finally:
            _tracking.request = None
            if ok and self.pacing is not None and not tracked.throttled:
                self.pacing.succeeded()
            retries = max(0, tracked.attempts - 1)
            spent = 0.0
            if tracked.first_send and (retries or not ok):
                spent = (tracked.last_send if ok else time.perf_counter()) - tracked.first_send
            self.stats.add(requests=1, throttled=tracked.throttled, retries=retries, errors=tracked.errors,
                           retry_s=spent)

    # -- the Store primitives -----------------------------------------------------------------

    def is_dir_like(self) -> bool:
        return True

    def free_bytes(self) -> int | None:
        return None

    def prepare(self) -> None:
        """Check that the bucket exists and is accessible (create it only if ``create_bucket``): HeadBucket,
        or where that is denied, a listing of this location (a policy may allow that alone). Without
        ``create_bucket`` a bucket found once is not checked again by the stores of this connection (a
        request less per save): one removed since fails the save's first request, as a missing bucket."""
        if self.bucket in self._buckets_found and not self.options.create_bucket:
            return
        try:
            self._call(self._control, "checking bucket", None, "head_bucket")
        except FileNotFoundError:
            if not self.options.create_bucket:
                raise self._missing_bucket() from None
            log.info("creating bucket %r at %s (create_bucket=true)", self.bucket, self.endpoint)
            self._call(self._control, "creating bucket", None, "create_bucket")
        except TargetError as exc:
            if _answer(exc)[0] != 403:
                raise
            # HeadBucket needs s3:ListBucket on the whole bucket; a policy that grants it only under this
            # prefix (s3:prefix condition) refuses it: listing the prefix is what ckptbench needs.
            self._call(self._control, "checking bucket", None, "list_objects_v2", Prefix=self._key(""), MaxKeys=1)
        self._buckets_found.add(self.bucket)

    def concurrency(self, threads: int) -> int:
        """Requests in flight: ``max_concurrency``, else max(threads, DEFAULT_MIN_CONCURRENCY)."""
        if self.options.max_concurrency:
            return self.options.max_concurrency
        chosen = min(max(threads, DEFAULT_MIN_CONCURRENCY), MAX_POOL_CONNECTIONS)
        if chosen != threads:
            log.info("S3: %d requests in flight (threads=%d; one connection is bounded by per-request "
                     "throughput; set storage_options max_concurrency to change)", chosen, threads)
        return chosen

    def part_bytes_for(self, nbytes: int, part_bytes: int | None = None) -> int:
        """The part size of a ``nbytes`` object: ``part_bytes`` (default ``part_size``), raised (to whole MiB)
        where the object would need more than ``max_parts`` parts."""
        part = self.options.part_size if part_bytes is None else part_bytes
        if not MIN_PART_BYTES <= part <= MAX_PART_BYTES:
            raise ValueError(f"part size {format_size(part)} is outside S3's limits "
                             f"({format_size(MIN_PART_BYTES)} to {format_size(MAX_PART_BYTES)})")
        most = self.options.max_parts
        if nbytes > part * most:
            part = -(-nbytes // most // 2**20) * 2**20 + 2**20
            if part > MAX_PART_BYTES:
                raise StorageIOError(f"{self.url}: a {format_size(nbytes)} object does not fit in {most} parts of "
                                     f"at most {format_size(MAX_PART_BYTES)}",
                                     hint="more, smaller shards (a smaller shard size), or a higher max_parts")
            log.info("S3: part size raised to %s for a %s object (at most %d parts)", format_size(part),
                     format_size(nbytes), most)
        return part

    def write_files(self, files: list[tuple[str, memoryview]], *, threads: int, block_size: int,
                    direct: bool) -> WriteReport:
        """Upload every file, all parts of all files through one pool, ``concurrency(threads)`` uploads
        in flight; complete every object, or abort and delete everything this call wrote.
        ``block_size`` and ``direct`` do not apply (the unit is ``part_size``).

        Parts go in the order of the files; an object whose last part is in is completed by a pool of
        its own (``COMPLETING_AT_ONCE`` workers), so the next part starts while the completion waits for
        its answer (which takes longer the more parts the object has), not after it."""
        report = WriteReport(direct=False, sync="s3-complete")
        if not files:
            return report
        in_flight = self.concurrency(threads)
        if self.pacing is not None:
            self.pacing.set_ceiling(in_flight)
        objects = [(name, view.cast("B") if view.format != "B" else view) for name, view in files]
        if self.options.client == "s3fs":
            self._other_client().write(objects, in_flight, self.on_request)
            return report
        stop = threading.Event()  # set on the first failure (or Ctrl-C): queued parts do nothing
        uploads: list[_Upload] = []
        done_keys: list[str] = []
        done_lock = threading.Lock()
        objects_parts = [(name, view, self.part_bytes_for(len(view))) for name, view in objects]
        multipart = sum(1 for _, view, part in objects_parts if len(view) > part)

        def put_whole(key: str, name: str, view: memoryview) -> None:
            if stop.is_set():
                return
            started = time.perf_counter()
            with self._slot(stop) as slot:
                if slot is None:
                    return
                self._upload("uploading", name, slot, key, view)
            with done_lock:
                done_keys.append(key)
            self._moved(len(view), started)

        def put_part(upload: _Upload, name: str, index: int) -> None:
            if stop.is_set():
                return
            start = index * upload.part_bytes
            body = upload.view[start:start + upload.part_bytes]
            started = time.perf_counter()
            with self._slot(stop) as slot:
                if slot is None:
                    return
                response = self._upload("uploading a part of", name, slot, upload.key, body,
                                        upload_id=upload.upload_id, part_number=index + 1)
            self._moved(len(body), started)
            with upload.lock:
                upload.etags[index] = response["ETag"]
                last = all(etag is not None for etag in upload.etags)
            if last and not stop.is_set():
                completing.submit(guarded, complete, upload, name)

        def complete(upload: _Upload, name: str) -> None:
            if stop.is_set():
                return
            parts = [{"PartNumber": i + 1, "ETag": etag} for i, etag in enumerate(upload.etags)]
            self._data_call("completing", name, "complete_multipart_upload", Key=upload.key,
                            UploadId=upload.upload_id, MultipartUpload={"Parts": parts})
            upload.completed = True
            with done_lock:
                done_keys.append(upload.key)

        def guarded(fn: Callable[..., None], *args: Any) -> None:
            try:
                fn(*args)
            except BaseException:
                stop.set()
                raise

        try:
            with Workers(in_flight, "ckptbench-s3", on_failure=stop.set) as pool, \
                    Workers(min(multipart, COMPLETING_AT_ONCE), "ckptbench-s3-complete",
                            on_failure=stop.set) as completing:
                for name, view, part in objects_parts:
                    key = self._data_key(name)
                    if len(view) <= part:
                        pool.submit(guarded, put_whole, key, name, view)
                        continue
                    created = self._data_call("starting the upload of", name, "create_multipart_upload", Key=key)
                    upload = _Upload(key, view, part, created["UploadId"], [None] * math.ceil(len(view) / part))
                    uploads.append(upload)
                    for i in range(upload.parts):
                        pool.submit(guarded, put_part, upload, name, i)
                    if stop.is_set():
                        break  # fail fast: no new uploads once one failed
                pool.join()  # every part in: every completion submitted
                completing.join()
            unfinished = [upload.key for upload in uploads if not upload.completed]
            if unfinished:  # never returned as written
                raise StorageIOError(f"writing {self.url} failed: {len(unfinished)} multipart upload(s) were not "
                                     f"completed ({unfinished[0]})")
        except BaseException:
            self._discard(uploads, done_keys)
            raise
        return report

    def upload_in_parts(self, name: str, nbytes: int, part_bytes: int | None = None) -> PartUpload | None:
        """``name`` (``nbytes`` bytes) uploaded part by part as a caller produces its bytes (see
        :class:`PartUpload`), in parts of ``part_bytes`` (default: ``part_size``); None when the data path
        is s3fs's (the caller writes whole files)."""
        if self.options.client == "s3fs":
            return None
        return PartUpload(self, name, nbytes, part_bytes)

    def _upload(self, action: str, name: str, slot: float | None, key: str, view: memoryview, *,
                upload_id: str | None = None, part_number: int | None = None) -> dict[str, Any]:
        """One PutObject (with ``upload_id``: one UploadPart) of ``view`` through the data client (boto3
        or the CRT), in the AIMD slot taken at ``slot``; the answer (its ETag)."""
        if self.options.client == "crt":
            answer = self._other_client().put(action, name, key, view, slot, upload_id, part_number)
        elif upload_id is None:
            return self._data_call(action, name, "put_object", started=slot, Key=key, Body=ViewStream(view))
        else:
            answer = self._data_call(action, name, "upload_part", started=slot, Key=key, UploadId=upload_id,
                                     PartNumber=part_number, Body=ViewStream(view))
        if upload_id is not None and not answer.get("ETag"):
            raise StorageIOError(f"{action} {self._where(name)} failed: the server answered part {part_number} "
                                 "without an ETag, which completing the upload needs",
                                 hint="the server (or a proxy before it) drops the ETag header; let it through")
        return answer

    def _moved(self, nbytes: int, started: float) -> None:
        if self.on_request is not None:
            self.on_request(nbytes, time.perf_counter() - started)

    def abort_incomplete_uploads(self, owned: Callable[[str], bool] | None = None, *, strict: bool = False) -> int:
        """Abort every multipart upload in progress directly under this location whose name ``owned``
        accepts (all when None); best effort, returns how many (``strict``: StorageIOError when any could
        not be listed or aborted). A crash, or an outage through a failed save's own aborts, can leave
        parts billed forever: scratch cleanup and every commit sweep them."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        aborted = failed = 0
        uploads: list[dict[str, Any]] = []
        marker: dict[str, str] = {}
        try:
            while True:  # a page holds at most 1000 uploads
                page = self._call(self._control, "listing uploads under", None, "list_multipart_uploads",
                                  Prefix=prefix, **marker)
                listed = page.get("Uploads", [])
                uploads.extend(listed)
                if not page.get("IsTruncated"):
                    break
                # A server that leaves the markers out of a truncated page: go on from its last upload.
                following = {"KeyMarker": page.get("NextKeyMarker") or (listed[-1]["Key"] if listed else ""),
                             "UploadIdMarker": page.get("NextUploadIdMarker") or
                             (listed[-1]["UploadId"] if listed and not page.get("NextKeyMarker") else "")}
                if not following["KeyMarker"] or following == marker:
                    raise StorageIOError(f"listing multipart uploads under {self.url}: the pages do not advance")
                marker = following
        except Exception as exc:  # noqa: BLE001 - cleanup never raises
            log.warning("could not list multipart uploads under %s: %s", self.url, exc)
            failed += 1
        for upload in _under(uploads, prefix, self.url, "multipart upload"):
            relative = upload["Key"][len(prefix):]
            head, _, rest = relative.partition("/")
            if rest and _SPREAD_DIR.match(head):
                relative = rest  # the name of an object written under a spread sub-prefix
            if owned is not None and not owned(relative):
                continue
            try:
                self._data.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted += 1
            except Exception as exc:  # noqa: BLE001
                log.warning("could not abort the multipart upload of %s: %s", upload["Key"], self._error(exc, "aborting"))
                failed += 1
        if strict and failed:
            raise StorageIOError(f"{self.url}: {failed} multipart upload step(s) failed (logged)")
        return aborted

    def list_recursive(self) -> list[str]:
        """Every object name under this location, sub-prefixes included (``a/b`` relative names)."""
        return self._list(recursive=True)

    def sizes_recursive(self) -> dict[str, int]:
        """Every object under this location with its size, from the listing's pages."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        return {item["Key"][len(prefix):]: int(item.get("Size", 0))
                for page in self._list_pages(prefix, {}) for item in _under(page.get("Contents", []), prefix, self.url)}

    def _list(self, *, recursive: bool, under: str = "") -> list[str]:
        """Names under this location; not ``recursive``: those directly in it, and those in its spread
        sub-prefixes (``3-spread/NAME`` listed as ``NAME``, where it lies remembered)."""
        prefix = f"{self.prefix}/{under}" if self.prefix else under
        delimiter = {} if recursive else {"Delimiter": "/"}
        names: list[str] = []
        spread: list[str] = []
        for page in self._list_pages(prefix, delimiter):
            names.extend(item["Key"][len(prefix):] for item in _under(page.get("Contents", []), prefix, self.url))
            if not recursive and not under:
                spread.extend(p["Prefix"][len(prefix):] for p in page.get("CommonPrefixes", [])
                              if p["Prefix"].startswith(prefix) and _SPREAD_DIR.match(p["Prefix"][len(prefix):].rstrip("/")))
        if self.options.prefix_spread and not recursive and not under:
            for name in names:  # saved without the spread: found next to the manifest
                self._placed.setdefault(name, self._key(name))
        names = list(dict.fromkeys(names))  # a server may list a name on two pages
        for sub in dict.fromkeys(spread):  # or repeat a common prefix on every page
            for name in self._list(recursive=False, under=sub):
                self._placed[name] = self._key(sub + name)
                names.append(name)
        return names

    def _list_pages(self, prefix: str, delimiter: Mapping[str, str]) -> Iterator[dict[str, Any]]:
        """Every page of the listing of ``prefix``: ListObjectsV2 pages, followed by their
        NextContinuationToken; where the server refuses ListObjectsV2 or leaves a truncated page without
        that token (it answered as ListObjects V1: older gateways), ListObjects pages from the last name
        listed (``_Quirks.list_v1``, remembered). A listing whose pages bring nothing new is a StorageIOError."""
        token: dict[str, str] = {}
        progress = _Progress()
        marker: str | None = None  # ListObjects: where the next page starts
        while not self._quirks.list_v1:
            try:
                page = self._call(self._control, "listing", None, "list_objects_v2", Prefix=prefix, **delimiter,
                                  **token)
            except StorageIOError as exc:
                status, code = _answer(exc)
                if token or not (status in (405, 501) or code in ("NotImplemented", "MethodNotAllowed")):
                    raise
                log.warning("%s refuses ListObjectsV2 (%s); listing with ListObjects from now on", self.endpoint,
                            code or status)
                self._quirks.list_v1 = True
                break
            yield page
            if not page.get("IsTruncated"):
                return
            progress.advanced(page)
            if page.get("NextContinuationToken"):
                token = {"ContinuationToken": page["NextContinuationToken"]}
                continue
            log.warning("%s answered ListObjectsV2 with a truncated page and no NextContinuationToken; listing "
                        "with ListObjects from now on", self.endpoint)
            self._quirks.list_v1 = True
            marker = _last_listed(page)
            if marker is None:
                raise StorageIOError(f"listing {self.url} failed: a truncated page listed nothing and named no "
                                     "continuation")
        while True:
            page = self._call(self._control, "listing", None, "list_objects", Prefix=prefix, **delimiter,
                              **({"Marker": marker} if marker is not None else {}))
            yield page
            if not page.get("IsTruncated"):
                return
            # NextMarker where the server gives one (S3 does with a delimiter; it may be opaque), else the last name
            following = page.get("NextMarker") or _last_listed(page)
            if following is None or following == marker or not progress.advanced(page):
                raise StorageIOError(f"listing {self.url} failed: the server's pages do not advance past "
                                     f"{marker or following!r}")
            marker = following

    def _discard(self, uploads: list[_Upload], done_keys: list[str]) -> None:
        """After a failed write: abort unfinished multipart uploads, delete completed objects."""
        for upload in uploads:
            if upload.completed:
                continue
            try:
                self._data.abort_multipart_upload(Bucket=self.bucket, Key=upload.key, UploadId=upload.upload_id)
            except Exception as exc:  # noqa: BLE001 - best effort; the original error is what matters
                log.warning("could not abort the multipart upload of %s: %s", upload.key,
                            self._error(exc, "aborting"))
        if done_keys:
            self._delete_keys(list(done_keys))

    def read_files(self, files: list[tuple[str, memoryview]], *, threads: int, block_size: int,
                   direct: bool) -> None:
        """Fill each caller buffer with its object, ranged GETs of ``part_size`` in parallel."""
        self.read_ranges([(name, 0, view) for name, view in files], threads=threads, block_size=block_size,
                         direct=direct)

    def read_ranges(self, ranges: list[tuple[str, int, memoryview]], *, threads: int, block_size: int,
                    direct: bool) -> None:
        """Fill each ``(name, offset, view)`` from that byte range of the object: ranged GETs of at most
        ``part_size`` in parallel, straight into the caller's buffers."""
        jobs = []
        for name, offset, view in ranges:
            view = view.cast("B") if view.format != "B" else view
            part = self.part_bytes_for(len(view))
            jobs.extend((name, view[start:start + part], offset + start) for start in range(0, len(view), part))
        if not jobs:
            return
        if self.pacing is not None:
            self.pacing.set_ceiling(self.concurrency(threads))
        try:
            self._read_jobs(jobs, threads)
        except FileNotFoundError:
            if not self._discover():  # objects under spread sub-prefixes this store has not seen yet
                raise
            self._read_jobs(jobs, threads)

    def _read_jobs(self, jobs: list[tuple[str, memoryview, int]], threads: int) -> None:
        if self.options.client == "s3fs":
            self._other_client().read(jobs, self.concurrency(threads), self.on_request)
            return
        stop = threading.Event()

        def get_range(name: str, view: memoryview, start: int) -> None:
            if stop.is_set():
                return
            with self._slot(stop) as slot:  # held while the body streams in: that is the request's work
                if slot is not None:
                    get_in_slot(name, view, start, slot)

        def get_in_slot(name: str, view: memoryview, start: int, slot: float) -> None:
            end = start + len(view) - 1
            started = time.perf_counter()
            if self.options.client == "crt":
                filled = self._other_client().get(name, self._data_key(name), view, start, slot)
                if filled != len(view):
                    raise StorageIOError(f"{self._where(name)} ended at byte {start + filled}, expected {end + 1}")
                self._moved(filled, started)
                return
            answer = self._data_call("reading", name, "get_object", started=slot, Key=self._data_key(name),
                                     Range=f"bytes={start}-{end}")
            body = answer["Body"]
            if "ContentRange" not in answer and answer.get("ContentLength", len(view)) != len(view):
                body.close()  # the whole object (200), not the range: its first bytes are not these
                raise StorageIOError(f"reading {self._where(name)} failed: the server answered a ranged GET with "
                                     f"{answer.get('ContentLength')} bytes and no Content-Range",
                                     hint="the server (or a proxy before it) ignores the Range header")
            try:
                filled = 0
                while filled < len(view):
                    chunk = body.read(min(READ_CHUNK_BYTES, len(view) - filled))
                    if not chunk:
                        break
                    view[filled:filled + len(chunk)] = chunk
                    filled += len(chunk)
            except Exception as exc:
                raise self._error(exc, "reading", name) from None
            finally:
                body.close()
            if filled != len(view):
                raise StorageIOError(f"{self._where(name)} ended at byte {start + filled}, expected {end + 1}")
            self._moved(filled, started)

        with Workers(self.concurrency(threads), "ckptbench-s3", on_failure=stop.set) as pool:
            for job in jobs:
                pool.submit(get_range, *job)
            pool.join()

    def put_atomic(self, name: str, data: bytes) -> None:
        """One PutObject: S3 makes it visible whole or not at all, durably, when it answers.

        OutcomeUnknownError when an attempt may have reached the server but its answer was lost (the
        object may then appear, even after this returns); other errors mean nothing was stored."""
        _put_attempts.unanswered = False
        try:
            self._call(self._data, "writing", name, "put_object", Key=self._key(name), Body=bytes(data))
        except StorageIOError as exc:
            if getattr(_put_attempts, "unanswered", False):
                raise OutcomeUnknownError(f"{exc.args[0]} (an attempt's answer was lost: it may have been stored)",
                                          hint=exc.hint) from exc
            raise

    def get(self, name: str) -> bytes:
        return self.get_tagged(name)[0]

    def get_tagged(self, name: str) -> tuple[bytes, str]:
        """The object and its ETag (for :meth:`put_if`)."""
        response = self._call(self._control, "reading", name, "get_object", Key=self._key(name))
        body = response["Body"]
        try:
            return body.read(), response.get("ETag", "")
        except Exception as exc:
            raise self._error(exc, "reading", name) from None
        finally:
            body.close()

    def put_if(self, name: str, data: bytes, *, etag: str | None = None) -> str | None:
        """A conditional PutObject, the save lock's primitive (``checkpoint/lock.py``): store ``data``
        only if ``name`` does not exist (``etag`` None: ``If-None-Match: *``) or still has ``etag``
        (``If-Match``). The new ETag, or None when the condition failed (412; 409 for a racing
        conditional write; 304 from servers that answer an ``If-None-Match`` PUT as they would a GET,
        as some MinIO releases do). NotImplementedError where the server refuses conditional writes. A
        server that answers without an ETag: the one a HEAD gives, "" if none (``If-Match`` is then unusable)."""
        from botocore.exceptions import ClientError

        # Ceph RGW 16 (Pacific, measured) matches If-Match only without the quotes; HTTP's quoted form second.
        conditions = [{"IfNoneMatch": "*"}] if etag is None else [{"IfMatch": etag.strip('"')}, {"IfMatch": etag}]
        for condition in conditions:
            try:
                response = self._control.put_object(Bucket=self.bucket, Key=self._key(name), Body=bytes(data),
                                                    **condition)
            except ClientError as exc:
                status, code = _answer(exc)
                if status in (304, 409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                    continue
                if status == 501 or code == "NotImplemented":
                    raise NotImplementedError(f"{self.endpoint} does not support conditional writes") from None
                raise self._error(exc, "writing", name) from None
            except Exception as exc:
                raise self._error(exc, "writing", name) from None
            self._reached = True
            etag = response.get("ETag")
            if not etag:  # an answer without the ETag: the object's, as a HEAD gives it ("" if none either)
                etag = self._call(self._control, "inspecting", name, "head_object", Key=self._key(name)).get("ETag")
            return str(etag or "")
        return None

    def size(self, name: str) -> int | None:
        """The object's size, None when absent. A data object is looked for where ``_data_key`` says, next
        to the manifest, then (once per store) in the location's spread sub-prefixes; the manifest and
        the lock (JSON and dot names, written by ``put_atomic``/``put_if``) are never spread."""
        data = not name.endswith(".json") and not name.startswith(".")
        keys = list(dict.fromkeys([self._data_key(name), self._key(name)])) if data else [self._key(name)]
        for attempt in range(2):
            for key in keys:
                try:
                    size = int(self._call(self._control, "inspecting", name, "head_object", Key=key)["ContentLength"])
                except FileNotFoundError:
                    continue
                if data:
                    self._placed[name] = key  # where reads of it go
                return size
            if attempt or not data or not self._discover() or name not in self._placed:
                return None
            keys = [self._placed[name]]
        return None

    def list(self) -> list[str]:
        return self._list(recursive=False)

    def remove(self, names: list[str]) -> None:
        """Delete each name wherever it may lie: next to the manifest, where a listing found it, and
        under its spread sub-prefix (deleting an absent key is not an error in S3)."""
        keys = [self._key(name) for name in names]
        keys += [self._data_key(name) for name in names if self._data_key(name) != self._key(name)]
        for name in names:
            self._placed.pop(name, None)
        self._delete_keys(list(dict.fromkeys(keys)))

    def _delete_keys(self, keys: list[str]) -> None:
        """Best effort: failures are logged, never raised (callers are cleaning up). DeleteObjects of up
        to 1000 keys; where the server refuses it (``_Quirks.delete_each``), one DeleteObject per key."""
        for start in range(0, len(keys), 1000):
            batch = keys[start:start + 1000]
            if self._quirks.delete_each:
                self._delete_each(batch)
                continue
            try:
                response = self._data.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            except Exception as exc:  # noqa: BLE001
                if _refused(exc):
                    status, code = _answer(exc)
                    log.warning("%s refuses DeleteObjects (%s); objects are deleted one request each from now on",
                                self.endpoint, code or status)
                    self._quirks.delete_each = True
                    self._delete_each(batch)
                    continue
                log.warning("could not delete %d object(s) under %s: %s", len(batch), self.url,
                            self._error(exc, "deleting"))
                continue
            for error in response.get("Errors", []):
                log.warning("could not delete s3://%s/%s: %s", self.bucket, error.get("Key"), error.get("Code"))

    def _delete_each(self, keys: list[str]) -> None:
        """One DeleteObject per key, a few at once; an absent key is no failure (GCS answers 404)."""
        from concurrent.futures import ThreadPoolExecutor

        def delete(key: str) -> None:
            try:
                self._data.delete_object(Bucket=self.bucket, Key=key)
            except Exception as exc:  # noqa: BLE001 - best effort, as for DeleteObjects
                error = self._error(exc, "deleting")
                if not isinstance(error, FileNotFoundError):
                    log.warning("could not delete s3://%s/%s: %s", self.bucket, key, error)

        with ThreadPoolExecutor(min(len(keys), DELETE_EACH_AT_ONCE) or 1, thread_name_prefix="ckptbench-s3-delete") as pool:
            list(pool.map(delete, keys))
