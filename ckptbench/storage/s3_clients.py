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
- ``crt``: ``awscrt.s3.S3Client`` (C, its own event loop threads): each object one request that the
  CRT splits into parts (PUT: read from the caller's memory into its part buffers; GET: ranged GETs
  written straight into the caller's buffer), at most ``concurrency`` connections.
"""

from __future__ import annotations

import functools
import io
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from ckptbench.errors import MissingDependencyError, StorageIOError, TargetError
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
        __import__(module)
    except ImportError as exc:
        raise MissingDependencyError(f"the S3 client {client!r} needs {module.split('.')[0]}, which is not "
                                     f"installed ({exc})", hint=INSTALL[client]) from None


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
    if options.addressing_style or custom_endpoint:
        config["s3"] = {"addressing_style": options.addressing_style or "path"}
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


class _ViewStream(io.RawIOBase):
    """A seekable read-only stream over a memoryview: the CRT reads each part's bytes from it."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

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


class CrtData:
    """Objects through the AWS CRT's S3 client (``awscrt.s3``): requests it splits into parts itself."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        url = urlsplit(store.endpoint)
        self.tls = url.scheme == "https"
        path_style = (store.options.addressing_style or ("path" if store.endpoint_source != "the default"
                                                         else "virtual")) == "path"
        self.host = url.netloc if path_style else f"{store.bucket}.{url.netloc}"
        self.root = f"/{store.bucket}/" if path_style else "/"

    def _client(self, concurrency: int) -> Any:
        frozen = None if self.store.options.anon else self.store.credentials()
        return _crt_client(self.store.region, self.tls, self.store.options.part_size, concurrency,
                           None if frozen is None else (frozen.access_key, frozen.secret_key, frozen.token))

    def _request(self, method: str, name: str, headers: list[tuple[str, str]], body: Any = None) -> Any:
        from awscrt.http import HttpHeaders, HttpRequest

        path = self.root + quote(self.store._data_key(name), safe="/~")
        return HttpRequest(method, path, HttpHeaders([("Host", self.host), *headers]), body_stream=body)

    def _wait(self, requests: list[tuple[str, Any]], action: str) -> None:
        """Wait for every request; on the first failure cancel the rest and raise it (as the Store's error)."""
        failure: BaseException | None = None
        for name, request in requests:
            try:
                request.finished_future.result()
            except BaseException as exc:  # noqa: BLE001 - the first failure is raised once all have ended
                if failure is None:
                    failure = exc if not isinstance(exc, Exception) else _crt_error(self.store, exc, action, name)
                    for _, other in requests:
                        other.cancel()
        if failure is not None:
            raise failure

    def write(self, files: list[tuple[str, memoryview]], concurrency: int, on_request: Callable | None) -> None:
        from awscrt.s3 import S3RequestType

        client = self._client(concurrency)
        requests: list[tuple[str, Any]] = []
        completed: list[str] = []
        try:
            for name, view in files:
                started = time.perf_counter()
                request = self._request("PUT", name, [("Content-Length", str(len(view)))], _ViewStream(view))

                def done(error: Any = None, _name: str = name, _n: int = len(view), _t: float = started,
                         **_: Any) -> None:
                    if error is None:
                        completed.append(_name)
                        if on_request is not None:
                            on_request(_n, time.perf_counter() - _t)

                requests.append((name, client.make_request(type=S3RequestType.PUT_OBJECT, request=request,
                                                           on_done=done)))
            self._wait(requests, "uploading")
        except BaseException:
            for _, request in requests:
                request.cancel()
            for _, request in requests:
                request.finished_future.exception()
            _discard(self.store, [name for name, _ in files], list(completed))
            raise

    def read(self, jobs: list[tuple[str, memoryview, int]], concurrency: int, on_request: Callable | None) -> None:
        from awscrt.s3 import S3RequestType

        client = self._client(concurrency)
        requests: list[tuple[str, Any]] = []
        filled: list[int] = []
        try:
            for index, (name, view, start) in enumerate(jobs):
                filled.append(0)
                end = start + len(view) - 1

                def on_body(chunk: Any, offset: int, _view: memoryview = view, _start: int = start,
                            _i: int = index, **_: Any) -> None:
                    at = offset - _start if offset >= _start else offset  # the CRT's offsets are the object's
                    _view[at:at + len(chunk)] = chunk
                    filled[_i] += len(chunk)

                request = self._request("GET", name, [("Range", f"bytes={start}-{end}")])
                started = time.perf_counter()

                def done(error: Any = None, _n: int = len(view), _t: float = started, **_: Any) -> None:
                    if error is None and on_request is not None:
                        on_request(_n, time.perf_counter() - _t)

                requests.append((name, client.make_request(type=S3RequestType.GET_OBJECT, request=request,
                                                           on_body=on_body, on_done=done)))
            self._wait(requests, "reading")
        except BaseException:
            for _, request in requests:
                request.cancel()
            raise
        for (name, view, start), got in zip(jobs, filled, strict=True):
            if got != len(view):
                raise StorageIOError(f"{self.store._where(name)} ended at byte {start + got}, expected "
                                     f"{start + len(view)}")


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
def _crt_client(region: str, tls: bool, part_size: int, connections: int,
                credentials: tuple[str, str, str | None] | None) -> Any:
    """One CRT S3 client per setting (each has its event loop threads and connection pools)."""
    from awscrt import auth, s3
    from awscrt import io as crt_io

    loops = crt_io.EventLoopGroup(min(4, max(1, connections)))
    bootstrap = crt_io.ClientBootstrap(loops, crt_io.DefaultHostResolver(loops))
    provider = None if credentials is None else auth.AwsCredentialsProvider.new_static(*credentials)
    log.debug("CRT S3 client: %d connections, part size %d", connections, part_size)
    return s3.S3Client(bootstrap=bootstrap, region=region, credential_provider=provider, part_size=part_size,
                       multipart_upload_threshold=part_size, max_active_connections_override=connections,
                       tls_mode=s3.S3RequestTlsMode.ENABLED if tls else s3.S3RequestTlsMode.DISABLED)
