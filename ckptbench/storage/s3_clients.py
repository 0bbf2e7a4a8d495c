"""The S3 data path through other clients than boto3: s3fs (fsspec's S3) and the AWS Common Runtime.

``S3Store`` (``s3.py``) moves its data (objects, their parts and ranged reads) through the client
that ``storage_options={"client": ...}`` names; metadata requests (HEAD, LIST, the manifest's PUT,
conditional writes, aborts) go through boto3 whatever the client. Each client keeps the Store's
contract: ``write`` returns once every object is complete, and on failure removes what it
completed and aborts its open multipart uploads; ``read`` fills the caller's buffers exactly.

- ``boto3``: ``S3Store``'s own threads (parts uploaded straight from the caller's memory).
- ``s3fs``: ``S3FileSystem.pipe_file`` per object (s3fs's multipart upload, ``max_concurrency``
  parts in flight per object, one object per worker) and ``cat_file`` of byte ranges in parallel.
  What teams whose pipelines already use fsspec get.
- ``crt``: ``awscrt.s3.S3Client`` (C, its own event loop threads) sends each of ``S3Store``'s data
  requests (PutObject, UploadPart read from the caller's memory, ranged GETs written into the
  caller's buffer); the parts, the concurrency (the AIMD controller) and the retries are the store's,
  as for boto3, so throttling paces it and is counted the same way.
"""

from __future__ import annotations

import functools
import importlib
import io
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from ckptbench.errors import CkptbenchError, MissingDependencyError, StorageIOError, TargetError
from ckptbench.interrupts import Workers

if TYPE_CHECKING:
    from ckptbench.storage.s3 import S3Store

log = logging.getLogger(__name__)

#: The clients ``storage_options["client"]`` (``--client``) accepts.
CLIENTS = ("boto3", "s3fs", "crt")
#: The client used when none is named: the fastest measured (the README's object-storage section has
#: the measurements behind it).
DEFAULT_CLIENT = "boto3"
#: What to install for each client beyond boto3.
INSTALL = {"s3fs": "pip install s3fs (or 'ckptbench[s3]')", "crt": "pip install awscrt"}


def require(client: str) -> None:
    """MissingDependencyError naming what to install when ``client``'s package is absent."""
    module = {"s3fs": "s3fs", "crt": "awscrt.s3"}.get(client)
    if module is None:
        return
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"the S3 client {client!r} needs {module.split('.')[0]}, which is not "
                                     f"installed ({exc})", hint=INSTALL[client]) from None
    if client == "crt" and not hasattr(getattr(imported, "S3RetryMode", None), "NONE"):  # its retries stay on
        raise MissingDependencyError("the S3 client 'crt' needs a newer awscrt (0.38.1 or later: "
                                     "awscrt.s3.S3RetryMode.NONE)", hint="pip install -U awscrt")


def data_path(store: S3Store) -> Any:
    """The data path of ``store``'s client (None: boto3, the store's own)."""
    client = store.options.client
    if client == "s3fs":
        return S3fsData(store)
    if client == "crt":
        return CrtData(store)
    return None


def _discard(store: S3Store, names: list[str], completed: list[str]) -> None:
    """After a failed write: abort this call's open multipart uploads, delete its completed objects."""
    wanted = set(names)
    store.abort_incomplete_uploads(owned=lambda name: name in wanted)
    if completed:
        store.remove(list(completed))


class S3fsData:
    """Objects through ``s3fs.S3FileSystem`` (its own asyncio loop and aiobotocore connections)."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        arguments = s3fs_arguments(store)
        self.fs = _cached_s3fs(store, arguments)
        _watch_s3fs(self.fs, store)

    def _path(self, name: str) -> str:
        return f"{self.store.bucket}/{self.store._data_key(name)}"

    def write(self, files: list[tuple[str, memoryview]], concurrency: int, on_request: Callable | None) -> None:
        completed: list[str] = []
        lock = threading.Lock()
        per_object = max(1, concurrency // max(1, min(concurrency, len(files))))

        def put(name: str, view: memoryview) -> None:
            started = time.perf_counter()
            part = self.store.part_bytes_for(len(view))
            with self.store._slot(None) as slot:  # an object (its parts in flight at once) per slot
                try:
                    # Below two parts s3fs sends one PutObject of the body as given (which must be bytes).
                    body = _Slices(view) if len(view) >= 2 * part else bytes(view)
                    self.fs.pipe_file(self._path(name), body, chunksize=part, max_concurrency=per_object)
                    _succeeded(self.store, slot)
                except Exception as exc:
                    raise _as_storage_error(self.store, exc, "uploading", name) from None
            with lock:
                completed.append(name)
            if on_request is not None:
                on_request(len(view), time.perf_counter() - started)

        try:
            with Workers(min(concurrency, len(files)), "ckptbench-s3fs") as pool:
                for name, view in files:
                    pool.submit(put, name, view)
                pool.join()
        except BaseException:
            _discard(self.store, [name for name, _ in files], completed)
            raise

    def read(self, jobs: list[tuple[str, memoryview, int]], concurrency: int, on_request: Callable | None) -> None:
        def get(name: str, view: memoryview, start: int) -> None:
            started = time.perf_counter()
            with self.store._slot(None) as slot:
                try:
                    data = self.fs.cat_file(self._path(name), start=start, end=start + len(view))
                    _succeeded(self.store, slot)
                except FileNotFoundError:
                    raise self.store._error(_not_found(), "reading", name) from None
                except Exception as exc:
                    raise _as_storage_error(self.store, exc, "reading", name) from None
            if len(data) != len(view):
                raise StorageIOError(f"{self.store._where(name)} ended at byte {start + len(data)}, expected "
                                     f"{start + len(view)}")
            view[:] = data
            if on_request is not None:
                on_request(len(view), time.perf_counter() - started)

        with Workers(min(concurrency, len(jobs)), "ckptbench-s3fs") as pool:
            for job in jobs:
                pool.submit(get, *job)
            pool.join()


class _Slices:
    """A memoryview that s3fs slices into parts: each slice is copied to bytes, the only body type
    botocore's parameter validation and aiohttp both take (one part in memory at a time per worker)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view

    def __len__(self) -> int:
        return len(self._view)

    def __getitem__(self, index: slice) -> bytes:
        return bytes(self._view[index])


def s3fs_arguments(store: S3Store) -> dict[str, Any]:
    """``s3fs.S3FileSystem`` arguments reaching what ``store`` reaches (endpoint, region, credentials,
    addressing, timeouts, retries); also the storage options of fsspec-based writers (DCP's FsspecWriter)."""
    options = store.options
    config: dict[str, Any] = {"read_timeout": options.read_timeout_s, "connect_timeout": options.connect_timeout_s,
                              "retries": {"total_max_attempts": options.max_attempts, "mode": "standard"},
                              "max_pool_connections": 64}
    custom_endpoint = store.endpoint_source != "the default"
    if store.addressing_style != "auto":
        config["s3"] = {"addressing_style": store.addressing_style}
    config.update(store.checksums)
    arguments: dict[str, Any] = {"anon": options.anon, "key": options.key, "secret": options.secret,
                                 "token": options.token, "client_kwargs": {"region_name": store.region},
                                 "config_kwargs": config}
    if options.profile:
        arguments["profile"] = options.profile
    if custom_endpoint:
        arguments["endpoint_url"] = store.endpoint
    return arguments


def _succeeded(store: S3Store, slot: float | None) -> None:
    """A request of a client with its own retries done: one more for the counts and the controller."""
    store.stats.add(requests=1)
    if store.pacing is not None and slot is not None:
        store.pacing.succeeded()


def _watch_s3fs(fs: Any, store: S3Store) -> None:
    """Count the attempts of ``fs``'s requests (aiobotocore's ``needs-retry`` event, on its event loop):
    a throttled answer brings ``store``'s controller down (standing for the oldest request in flight),
    every failed attempt counts as a retry (botocore retries it while attempts are left)."""
    from ckptbench.storage.s3_pacing import is_throttle

    client = fs.connect()
    if getattr(client, "_ckptbench_watched", False):
        return
    stats, pacing = store.stats, store.pacing

    def attempt(response: Any = None, caught_exception: BaseException | None = None, **_: Any) -> None:
        if caught_exception is not None:
            stats.add(errors=1, retries=1)
            return
        if response is None:
            return
        http, parsed = response
        status = getattr(http, "status_code", None)
        code = parsed.get("Error", {}).get("Code") if isinstance(parsed, dict) else None
        if is_throttle(status, code):
            stats.add(throttled=1, retries=1)
            if pacing is not None:
                pacing.throttled()
        elif status is not None and status >= 500:
            stats.add(errors=1, retries=1)

    client.meta.events.register_first("needs-retry.s3", attempt)
    client._ckptbench_watched = True


_S3FS: dict[tuple[Any, ...], Any] = {}
_S3FS_LOCK = threading.Lock()


def _cached_s3fs(store: S3Store, arguments: dict[str, Any]) -> Any:
    """One ``s3fs.S3FileSystem`` per set of store options and endpoint (it keeps its connection pool)."""
    import s3fs

    key = (store.options, store.endpoint, store.region)
    with _S3FS_LOCK:
        if key not in _S3FS:
            _S3FS[key] = s3fs.S3FileSystem(skip_instance_cache=True, **arguments)
        return _S3FS[key]


def _not_found() -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": "NoSuchKey"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "GetObject")


def _as_storage_error(store: S3Store, exc: BaseException, action: str, name: str) -> BaseException:
    """An s3fs/aiobotocore or CRT failure as the Store's errors (botocore's through ``S3Store._error``)."""
    converted = store._error(exc, action, name)
    if converted is not exc:
        return converted
    if isinstance(exc, PermissionError):
        return TargetError(f"access denied to {store.url} at {store.endpoint}; credentials from "
                           f"{store.credential_source}", hint="check the key pair and the bucket's permissions")
    if isinstance(exc, FileNotFoundError):
        return store._error(_not_found(), action, name)
    if isinstance(exc, (OSError, RuntimeError, ValueError)) or type(exc).__module__.startswith(("awscrt", "aio")):
        return StorageIOError(f"{action} {store._where(name)} failed: {type(exc).__name__}: {exc}")
    return exc


#: The least a ``ViewStream.read`` returns (where that many bytes are left): botocore's HTTP connection
#: asks for 16 KiB at a time and hands each read to one ``sendall``; views of 1 MiB take 64 times fewer
#: Python iterations and system calls for the same bytes (a tenth of the client CPU of a save, measured).
SEND_CHUNK_BYTES = 2**20


class ViewStream:
    """A seekable, read-only file over a memoryview: a request body sent without copying it, and rewound
    to send it again on a retry. botocore reads it with ``read`` (views of the memory, which the socket
    layer takes as they are, at least ``SEND_CHUNK_BYTES`` per read whatever size it asks for: every
    reader of a request body takes the length it gets); the CRT with ``readinto`` (into its own buffers)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def __len__(self) -> int:
        return len(self._view)

    def read(self, size: int | None = -1) -> memoryview:
        if size is None or size < 0:
            end = len(self._view)
        else:
            end = min(len(self._view), self._pos + max(size, SEND_CHUNK_BYTES))
        chunk = self._view[self._pos:end]
        self._pos = end
        return chunk

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), len(self._view) - self._pos)
        buffer[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


#: Backoff between attempts of a CRT request: full jitter, up to 2**retry seconds, at most this (as
#: botocore's standard mode, which paces the boto3 and s3fs data paths).
MAX_BACKOFF_S = 20.0


class CrtData:
    """Single requests (PutObject, UploadPart, ranged GetObject) through the AWS CRT's S3 client
    (``awscrt.s3``): its C event loop does the HTTP, signing and connection reuse; the parts, the
    concurrency and the retries are the store's, as for boto3. The CRT client is made without
    retries of its own (it would retry inside its event loop, unseen), so every attempt's answer
    reaches ``CrtData.attempts``: a throttled one brings the store's AIMD controller down, and each
    is counted."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        url = urlsplit(store.endpoint)
        self.tls = url.scheme == "https"
        path_style = store.addressing_style == "path"
        self.host = url.netloc if path_style else f"{store.bucket}.{url.netloc}"
        self.root = f"/{store.bucket}/" if path_style else "/"

    def _client(self) -> Any:
        frozen = None if self.store.options.anon else self.store.credentials()
        connections = self.store.pacing.ceiling if self.store.pacing is not None else self.store.concurrency(1)
        return _crt_client(self.host, self.store.region, self.tls, connections,
                           None if frozen is None else (frozen.access_key, frozen.secret_key, frozen.token),
                           self.store.ca_bundle if self.tls else None)

    def _request(self, method: str, key: str, headers: list[tuple[str, str]], query: str = "",
                 body: Any = None) -> Any:
        from awscrt.http import HttpHeaders, HttpRequest

        path = self.root + quote(key, safe="/~") + query
        return HttpRequest(method, path, HttpHeaders([("Host", self.host), *headers]), body_stream=body)

    def put(self, action: str, name: str, key: str, view: memoryview, slot: float | None,
            upload_id: str | None = None, part_number: int | None = None) -> dict[str, str]:
        """One PutObject (or, with ``upload_id``, one UploadPart) of ``view``; its ETag."""
        from awscrt.s3 import S3RequestType

        query = "" if upload_id is None else f"?partNumber={part_number}&uploadId={quote(upload_id, safe='')}"
        operation = "PutObject" if upload_id is None else "UploadPart"

        def send() -> dict[str, str]:
            answer: dict[str, str] = {}

            def on_headers(headers: Any = (), **_: Any) -> None:
                answer.update((k.lower(), v) for k, v in headers)

            request = self._request("PUT", key, [("Content-Length", str(len(view)))], query, ViewStream(view))
            self._client().make_request(type=S3RequestType.DEFAULT, operation_name=operation, request=request,
                                        on_headers=on_headers).finished_future.result()
            return {"ETag": answer.get("etag", "")}

        return self.attempts(action, name, slot, send)

    def get(self, name: str, key: str, view: memoryview, start: int, slot: float | None) -> int:
        """One ranged GetObject of ``len(view)`` bytes from ``start`` into ``view``; the bytes it filled."""
        from awscrt.s3 import S3RequestType

        def send() -> int:
            filled = [0]

            def on_body(chunk: Any, **_: Any) -> None:
                at = filled[0]
                if at + len(chunk) > len(view):
                    raise StorageIOError(f"{self.store._where(name)}: more bytes than the range asked for")
                view[at:at + len(chunk)] = chunk
                filled[0] = at + len(chunk)

            request = self._request("GET", key, [("Range", f"bytes={start}-{start + len(view) - 1}")])
            self._client().make_request(type=S3RequestType.DEFAULT, operation_name="GetObject", request=request,
                                        on_body=on_body).finished_future.result()
            return filled[0]

        return self.attempts("reading", name, slot, send)

    def attempts(self, action: str, name: str, slot: float | None, send: Callable[[], Any]) -> Any:
        """``send()`` until it succeeds, a failure is not worth retrying, or ``max_attempts`` are spent:
        throttled answers and 5xx and connection failures are retried after a full-jitter backoff, a
        throttled one first reported to the AIMD controller (as of ``slot``); counted as boto3's are."""
        store = self.store
        attempts = throttled = errors = 0
        first = last = time.perf_counter()
        ok = False
        try:
            while True:
                attempts += 1
                last = time.perf_counter()
                try:
                    result = send()
                    ok = True
                    store._reached = True
                    return result
                except Exception as exc:
                    kind = _crt_failure(exc)
                    if kind == "throttled":
                        throttled += 1
                        if store.pacing is not None:
                            store.pacing.throttled(slot)
                    elif kind == "transient":
                        errors += 1
                    if kind is None or attempts >= store.options.max_attempts:
                        raise _crt_error(store, exc, action, name) from None
                time.sleep(random.random() * min(MAX_BACKOFF_S, 2.0 ** (attempts - 1)))
        finally:
            if ok and store.pacing is not None and not throttled:
                store.pacing.succeeded()
            spent = ((last if ok else time.perf_counter()) - first) if attempts > 1 or not ok else 0.0
            store.stats.add(requests=1, throttled=throttled, retries=attempts - 1, errors=errors, retry_s=spent)


def _crt_failure(exc: BaseException) -> str | None:
    """What a CRT request's failure was: "throttled" (503 SlowDown, 429), "transient" (another 5xx, a
    connection closed or timed out), or None (an answer retrying cannot change: 4xx, a cancellation).
    The CRT names 503s and 500s itself (``AWS_ERROR_S3_SLOW_DOWN``, ``AWS_ERROR_S3_INTERNAL_ERROR``,
    without the status); other answers come as ``S3ResponseError`` with the status and body."""
    from ckptbench.storage.s3_pacing import is_throttle

    if isinstance(exc, CkptbenchError):
        return None
    status = getattr(exc, "status_code", None)
    if status:
        body = (getattr(exc, "body", None) or b"")[:300].decode(errors="replace")
        code = body.partition("<Code>")[2].partition("</Code>")[0] or None
        if is_throttle(status, code):
            return "throttled"
        return "transient" if status >= 500 or code in ("RequestTimeout", "InternalError") else None
    name = getattr(exc, "name", "")
    if name == "AWS_ERROR_S3_SLOW_DOWN":  # the CRT's name for a 503 (or a SlowDown code): no status given
        return "throttled"
    if not type(exc).__module__.startswith("awscrt") or "CANCEL" in name:
        return None
    return "transient"  # AWS_ERROR_S3_INTERNAL_ERROR (a 500), a connection closed or refused, a timeout


def _crt_error(store: S3Store, exc: BaseException, action: str, name: str) -> BaseException:
    status = getattr(exc, "status_code", None)
    if status == 404:
        return store._error(_not_found(), action, name)
    if status == 403:
        return TargetError(f"access denied to {store.url} at {store.endpoint}; credentials from "
                           f"{store.credential_source}", hint="check the key pair and the bucket's permissions")
    if status is not None:
        body = (getattr(exc, "body", None) or b"")[:300].decode(errors="replace")
        code = body.partition("<Code>")[2].partition("</Code>")[0]
        return StorageIOError(f"{action} {store._where(name)} failed: {code or status}")
    return StorageIOError(f"{action} {store._where(name)} failed: {getattr(exc, 'name', type(exc).__name__)}: "
                          f"{exc}")


@functools.lru_cache(maxsize=8)
def _crt_client(host: str, region: str, tls: bool, connections: int,
                credentials: tuple[str, str, str | None] | None, ca_bundle: str | None = None) -> Any:
    """One CRT S3 client per endpoint and setting (each has its event loop threads and connection
    pools), at most ``connections`` open, and no retries of its own (``CrtData.attempts`` makes them).
    ``ca_bundle``: the certificates TLS is verified with instead of the system's (as botocore's).
    Per endpoint (``host``, the Host header with its port): a client keeps one connection pool per host
    name, port left out, so requests to 127.0.0.1:B would go to the 127.0.0.1:A it connected to first."""
    from awscrt import auth, s3
    from awscrt import io as crt_io

    loops = crt_io.EventLoopGroup(min(4, max(1, connections)))
    bootstrap = crt_io.ClientBootstrap(loops, crt_io.DefaultHostResolver(loops))
    provider = None if credentials is None else auth.AwsCredentialsProvider.new_static(*credentials)
    log.debug("CRT S3 client: %d connections", connections)
    tls_options = None
    if ca_bundle:
        context = crt_io.TlsContextOptions()
        context.override_default_trust_store_from_path(None, ca_bundle)
        tls_options = crt_io.ClientTlsContext(context).new_connection_options()
    return s3.S3Client(bootstrap=bootstrap, region=region, credential_provider=provider,
                       max_active_connections_override=connections, tls_connection_options=tls_options,
                       retry_config=s3.S3RetryConfig(retry_mode=s3.S3RetryMode.NONE),
                       tls_mode=s3.S3RequestTlsMode.ENABLED if tls else s3.S3RequestTlsMode.DISABLED)
