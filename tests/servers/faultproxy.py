"""A fault-injecting HTTP/1.1 proxy for S3 tests (stdlib only): put it in front of the real server
(Ceph RGW) and switch faults on and off from the test while the client runs.

In a test::

    with FaultProxy("http://127.0.0.1:7480") as proxy:      # listens on 127.0.0.1:<free port>
        options = {"endpoint_url": proxy.endpoint, ...}
        proxy.fail(3, status=503, kind="UploadPart")  # the next 3 part uploads: 503 SlowDown
        proxy.reset(2, after_bytes=2**20, kind="UploadPart")  # RST after 1 MiB of the body
        proxy.stall(1, kind="UploadPart")             # never answer: the client's read timeout fires
        proxy.down_on(kind="UploadPart", skip=2)      # the 3rd part upload stops the "server"
        proxy.down(for_s=1.5); proxy.up()             # refuse connections (and reset open ones)
        proxy.fail(None, status=501, code="NotImplemented", kind="DeleteObjects")  # an S3 error of choice
        proxy.rewrite(None, drop_headers=("If-Match",), kind="PutObject")  # a server that ignores a header
        proxy.rewrite(None, add_query="max-keys=2", answer=fn, kind="ListObjectsV2")  # alter what goes or comes
        proxy.clear()                                 # pass-through again
        proxy.count("UploadPart"), proxy.injected("status", "UploadPart"), proxy.requests

By hand: ``python tests/servers/faultproxy.py --upstream http://127.0.0.1:7480`` prints the endpoint,
then reads commands from stdin (``help`` lists them).

How faults look on the wire:

- ``fail``: a final answer instead of the upstream's, with an S3 XML error body (503 ``SlowDown``,
  500 ``InternalError``, other statuses a generic code). A request announcing ``Expect: 100-continue``
  gets it before sending its body (as S3 does) and the connection is closed; otherwise the body is
  read and discarded and the connection stays open.
- ``reset``: the request goes upstream, but after ``after_bytes`` of its body (or after the whole body,
  when shorter) both connections are closed abruptly (SO_LINGER 0: a TCP RST).
- ``stall``: the body is read and discarded and no answer ever comes, until ``release()``, ``clear()``,
  ``down()``, ``stop()`` or ``stall_s``; then the connection is reset.
- ``down``: the listening socket is closed (new connections are refused, like a stopped server) and
  every open connection is reset, requests in flight included; ``up()`` listens on the same port again.
- ``rewrite``: the request goes upstream without the header fields ``drop_headers`` and with
  ``add_query`` appended to its query string, and its answer's body passes through ``answer`` (bytes to
  bytes; its Content-Length set to match) and without the header fields ``drop_answer_headers``. This is how a test plays a server that ignores a header or
  answers in its own way; a server that checks signatures refuses the altered request (moto checks none).

A ``fail`` or ``rewrite`` rule with ``header`` matches only requests carrying a header field whose name
starts with it (``header="x-amz-checksum-"``): a server refusing what a client sends.

Every request is classified by its S3 operation (``UploadPart``, ``CompleteMultipartUpload``,
``PutObject``, ...: see :func:`s3_operation`) and recorded in :attr:`FaultProxy.requests` with what
happened to it, so a test can assert that retries really took place. Connections refused while down
never reach the proxy and are not recorded.

The proxy answers ``Expect: 100-continue`` itself and opens one upstream connection per request (so
no upstream keep-alive state can leak faults from one request into the next).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import select
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

RECV_BYTES = 256 * 1024
MAX_HEAD_BYTES = 64 * 1024
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
#: How often blocked loops (accept, stalls) look at the proxy's state.
POLL_S = 0.05
#: How long a closing connection waits for the client to stop sending (a "lingering close", so
#: the answer is not destroyed by a RST caused by unread data).
LINGER_S = 1.0
_ERRORS = {
    503: ("Slow Down", "SlowDown", "Please reduce your request rate."),
    500: ("Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
}
ACTIONS = ("status", "reset", "stall", "down", "rewrite")


class _Closed(Exception):
    """The peer closed its side in the middle of a message."""


class _ResetNow(Exception):
    """A reset fault fired: close both connections abruptly."""


def s3_operation(method: str, path: str, query: dict[str, list[str]], headers: Any = None) -> str:
    """The S3 operation of a path-style request (``/bucket`` or ``/bucket/key``), e.g. ``UploadPart``."""
    has_key = "/" in path.strip("/")
    if method == "PUT":
        if not has_key:
            return "CreateBucket"
        if "partNumber" in query and "uploadId" in query:
            copy = headers is not None and headers.get("x-amz-copy-source") is not None
            return "UploadPartCopy" if copy else "UploadPart"
        return "PutObject"
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload"
        if "uploadId" in query:
            return "CompleteMultipartUpload"
        if "delete" in query:
            return "DeleteObjects"
        return "POST"
    if method == "DELETE":
        if "uploadId" in query:
            return "AbortMultipartUpload"
        return "DeleteObject" if has_key else "DeleteBucket"
    if method == "GET":
        if has_key:
            return "ListParts" if "uploadId" in query else "GetObject"
        if "uploads" in query:
            return "ListMultipartUploads"
        return "ListObjectsV2" if "list-type" in query else "ListObjects"
    if method == "HEAD":
        return "HeadObject" if has_key else "HeadBucket"
    return method


# -- HTTP messages ------------------------------------------------------------------------------


class _Headers:
    """Header fields in order, looked up case-insensitively."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self.items = items

    def get(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.items:
            if key.lower() == name:
                return value
        return None

    def has_token(self, name: str, token: str) -> bool:
        return any(key.lower() == name.lower() and token in value.lower() for key, value in self.items)


@dataclass
class _Head:
    start_line: str
    headers: _Headers

    @classmethod
    def parse(cls, raw: bytes) -> _Head:
        lines = raw.decode("latin-1").split("\r\n")
        items = []
        for line in lines[1:]:
            if line:
                key, _, value = line.partition(":")
                items.append((key.strip(), value.strip()))
        return cls(lines[0], _Headers(items))

    def encode(self, drop: Iterable[str] = ()) -> bytes:
        dropped = {name.lower() for name in drop}
        lines = [self.start_line] + [f"{k}: {v}" for k, v in self.headers.items if k.lower() not in dropped]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Stream:
    """Buffered reads from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def _fill(self) -> bool:
        data = self.sock.recv(RECV_BYTES)
        self.buffer += data
        return bool(data)

    def read_head(self) -> bytes | None:
        """One message head (through the blank line); None on a clean EOF before it."""
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(self.buffer[:end + 4])
                del self.buffer[:end + 4]
                return head
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise _Closed("message head too large")
            if not self._fill():
                if self.buffer.strip():
                    raise _Closed("connection closed inside a message head")
                return None

    def readline(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            if not self._fill():
                raise _Closed("connection closed inside a chunked body")
        line = bytes(self.buffer[:end + 2])
        del self.buffer[:end + 2]
        return line

    def read_some(self, limit: int) -> bytes:
        if not self.buffer and not self._fill():
            raise _Closed("connection closed inside a body")
        data = bytes(self.buffer[:limit])
        del self.buffer[:limit]
        return data

    def read_to_eof(self) -> Iterator[bytes]:
        if self.buffer:
            yield bytes(self.buffer)
            self.buffer.clear()
        while data := self.sock.recv(RECV_BYTES):
            yield data


class _Sink:
    """Sends to a socket; with a budget, sends that many bytes and then raises _ResetNow."""

    def __init__(self, sock: socket.socket, budget: int | None = None) -> None:
        self.sock, self.budget, self.sent = sock, budget, 0

    def send(self, data: bytes) -> None:
        if self.budget is not None and self.sent + len(data) >= self.budget:
            self.sock.sendall(data[:self.budget - self.sent])
            self.sent = self.budget
            raise _ResetNow
        self.sock.sendall(data)
        self.sent += len(data)


def _framing(headers: _Headers, *, request: bool, method: str = "", status: int = 0) -> tuple[str, int]:
    """How a body ends: ("none", 0), ("length", n), ("chunked", 0) or ("close", 0)."""
    if not request and (method == "HEAD" or 100 <= status < 200 or status in (204, 304)):
        return "none", 0
    if headers.has_token("transfer-encoding", "chunked"):
        return "chunked", 0
    length = headers.get("content-length")
    if length is not None:
        return "length", int(length)
    return ("none", 0) if request else ("close", 0)


def _relay_body(src: _Stream, framing: tuple[str, int], send: Callable[[bytes], None]) -> None:
    kind, remaining = framing
    if kind == "length":
        while remaining:
            data = src.read_some(min(remaining, RECV_BYTES))
            send(data)
            remaining -= len(data)
    elif kind == "chunked":
        while True:
            line = src.readline()
            send(line)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (trailer := src.readline()) != b"\r\n":
                    send(trailer)
                send(b"\r\n")
                return
            _relay_body(src, ("length", size + 2), send)  # the data and its CRLF
    elif kind == "close":
        for data in src.read_to_eof():
            send(data)


def _discard_body(src: _Stream, framing: tuple[str, int]) -> None:
    _relay_body(src, framing, lambda data: None)


def _error_response(status: int, resource: str, request_id: str, *, head_only: bool, close: bool,
                    code: str | None = None, message: str | None = None) -> bytes:
    reason, default_code, default_message = _ERRORS.get(status, ("Error", f"Http{status}", f"Injected HTTP {status}."))
    code, message = code or default_code, message or default_message
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId></Error>").encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            f"x-amz-request-id: {request_id}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n")
    return head.encode() + (b"" if head_only else body)


# -- what the proxy records and how faults are chosen ---------------------------------------------


@dataclass
class Request:
    """One request the proxy received. ``outcome``: "passed" (answered by the upstream), an action of
    :data:`ACTIONS` when a fault hit it, or "failed" (the client or upstream broke off)."""

    kind: str
    method: str
    path: str
    query: dict[str, list[str]]
    outcome: str = "passed"
    started: float = field(default_factory=time.monotonic)
    #: The request's header field names, lower case.
    header_names: tuple[str, ...] = ()
    #: Its Content-Length (None: chunked or no body).
    content_length: int | None = None

    @property
    def part_number(self) -> int | None:
        values = self.query.get("partNumber")
        return int(values[0]) if values else None


@dataclass
class Rule:
    """A fault for requests that match ``kind``/``method``/``query``/``path``: the first ``skip`` matches
    pass, the next ``times`` (None: all) get ``action``."""

    action: str
    times: int | None = 1
    kind: str | None = None
    method: str | None = None
    query: tuple[str, ...] = ()
    path: str | None = None
    skip: int = 0
    status: int = 503
    after_bytes: int = 0
    stall_s: float | None = None
    down_for_s: float | None = None
    #: "status": the S3 error code and message of the answer (default: by status, see ``_ERRORS``).
    code: str | None = None
    message: str | None = None
    #: Matches only requests with a header field whose name starts with this (case-insensitive).
    header: str | None = None
    #: "rewrite": header fields removed from the request, text appended to its query, its answer's body altered.
    drop_headers: tuple[str, ...] = ()
    add_query: str = ""
    answer: Callable[[bytes], bytes] | None = None
    drop_answer_headers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {ACTIONS}")

    def matches(self, request: Request) -> bool:
        return ((self.kind is None or request.kind == self.kind)
                and (self.method is None or request.method == self.method.upper())
                and all(name in request.query for name in self.query)
                and (self.path is None or self.path in request.path)
                and (self.header is None or any(name.startswith(self.header.lower()) for name in request.header_names)))

    @property
    def spent(self) -> bool:
        return self.times is not None and self.times <= 0


class _Connection:
    """One client connection and, while a request is forwarded, its upstream connection."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.killed = threading.Event()
        self._lock = threading.Lock()
        self._closed = False

    def kill(self) -> None:
        """From another thread: wake the handler out of any blocking call; it then resets the sockets."""
        self.killed.set()
        with self._lock:
            if self._closed:
                return
            for sock in (self.client, self.upstream):
                if sock is not None:
                    _set_linger_zero(sock)
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

    def close_upstream(self, *, reset: bool = False) -> None:
        with self._lock:
            sock, self.upstream = self.upstream, None
        if sock is not None:
            if reset:
                _set_linger_zero(sock)
            sock.close()

    def close(self, *, reset: bool) -> None:
        self.close_upstream(reset=reset)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if reset or self.killed.is_set():
                _set_linger_zero(self.client)
            self.client.close()


def _set_linger_zero(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _lingering_close(sock: socket.socket) -> None:
    """Half-close, then read what the client still sends (briefly), so our answer is not lost to a RST."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(LINGER_S)
        deadline = time.monotonic() + LINGER_S
        while time.monotonic() < deadline and sock.recv(RECV_BYTES):
            pass


# -- the proxy ----------------------------------------------------------------------------------


class FaultProxy:
    """A threaded HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``) with
    faults switchable at run time. Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0, fill_etag: bool = False) -> None:
        """``fill_etag``: answer a CompleteMultipartUpload whose result holds an empty ``<ETag></ETag>``
        (Ceph RGW 16 does) with a placeholder ETag (``"<md5 of the upload id>-0"``), which clients that
        require one (the AWS CRT through s3torchconnector) need to finish their uploads."""
        parts = urlsplit(upstream)
        self.fill_etag = fill_etag
        self.etags_filled = 0
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream {upstream!r} must be http://HOST:PORT")
        self.upstream = (parts.hostname, parts.port)
        self.host, self.port = host, port
        self.requests: list[Request] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listener: socket.socket | None = None
        self._connections: set[_Connection] = set()
        self._threads: set[threading.Thread] = set()
        self._stopped = threading.Event()
        self._released = threading.Event()  # set: stalled requests end
        self._up_timer: threading.Timer | None = None
        self._accept_thread: threading.Thread | None = None
        self._downs = 0
        self._ids = 0

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        self._listen()
        self._accept_thread = threading.Thread(target=self._accept_loop, name="faultproxy-accept", daemon=True)
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Stop listening, reset every connection, end every thread (they are daemons: never a hang)."""
        self._stopped.set()
        self._released.set()
        with self._lock:
            if self._up_timer is not None:
                self._up_timer.cancel()
            self._close_listener()
            connections, threads = list(self._connections), list(self._threads)
        for connection in connections:
            connection.kill()
        for thread in [*threads, self._accept_thread]:
            if thread is not None:
                thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.host, self.port))
        except OSError as exc:
            listener.close()
            raise OSError(exc.errno, f"fault proxy cannot listen on {self.host}:{self.port}: {exc.strerror}") from exc
        listener.listen(128)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener

    def _close_listener(self) -> None:
        if self._listener is not None:
            # shutdown first: it takes the socket out of LISTEN at once and wakes the accept thread's
            # select(), which otherwise keeps the socket alive (and accepting SYNs) until it returns.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None

    # -- faults (any thread) ------------------------------------------------------------------

    def fail(self, times: int | None = 1, *, status: int = 503, **match: Any) -> Rule:
        """Answer matching requests with ``status`` and an S3 error (503: SlowDown, 500: InternalError)."""
        return self.add(Rule("status", times, status=status, **match))

    def reset(self, times: int | None = 1, *, after_bytes: int = 0, **match: Any) -> Rule:
        """Reset matching requests' connections after ``after_bytes`` of the request body went upstream."""
        return self.add(Rule("reset", times, after_bytes=after_bytes, **match))

    def stall(self, times: int | None = 1, *, stall_s: float | None = None, **match: Any) -> Rule:
        """Never answer matching requests (until released, or for ``stall_s``): read timeouts."""
        self._released.clear()
        return self.add(Rule("stall", times, stall_s=stall_s, **match))

    def rewrite(self, times: int | None = 1, *, drop_headers: Iterable[str] = (), add_query: str = "",
                answer: Callable[[bytes], bytes] | None = None, drop_answer_headers: Iterable[str] = (),
                **match: Any) -> Rule:
        """Forward matching requests without ``drop_headers``, with ``add_query`` appended to the query,
        and their answers without ``drop_answer_headers`` and with their bodies through ``answer``."""
        return self.add(Rule("rewrite", times, drop_headers=tuple(drop_headers), add_query=add_query, answer=answer,
                             drop_answer_headers=tuple(drop_answer_headers), **match))

    def down_on(self, *, skip: int = 0, for_s: float | None = None, **match: Any) -> Rule:
        """Go down when a matching request arrives after ``skip`` of them passed (up after ``for_s``)."""
        return self.add(Rule("down", 1, skip=skip, down_for_s=for_s, **match))

    def add(self, rule: Rule) -> Rule:
        """Add a fault rule; rules are tried in the order they were added."""
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Pass-through: drop every rule and end stalls (does not bring a down proxy up)."""
        with self._lock:
            self._rules.clear()
        self._released.set()

    def release(self) -> None:
        """End the stalls in progress (stall rules stay)."""
        self._released.set()

    def down(self, for_s: float | None = None) -> None:
        """Refuse new connections and reset open ones (the server stopped); ``up()`` after ``for_s``."""
        with self._lock:
            if self._up_timer is not None:
                self._up_timer.cancel()
                self._up_timer = None
            self._close_listener()
            self._downs += 1
            connections = list(self._connections)
            if for_s is not None:
                self._up_timer = threading.Timer(for_s, self.up)
                self._up_timer.daemon = True
                self._up_timer.start()
        self._released.set()
        for connection in connections:
            connection.kill()

    def up(self) -> None:
        """Listen again on the same port (the server restarted)."""
        with self._lock:
            if self._up_timer is not None:
                self._up_timer.cancel()
                self._up_timer = None
            if self._listener is None and not self._stopped.is_set():
                self._listen()

    @property
    def is_down(self) -> bool:
        return self._listener is None

    # -- what happened ------------------------------------------------------------------------

    def count(self, kind: str | None = None, outcome: str | None = None) -> int:
        """Requests received (of ``kind``, with ``outcome``)."""
        with self._lock:
            return sum(1 for r in self.requests
                       if (kind is None or r.kind == kind) and (outcome is None or r.outcome == outcome))

    def injected(self, action: str | None = None, kind: str | None = None) -> int:
        """Requests a fault hit (``action`` one of :data:`ACTIONS`)."""
        return sum(self.count(kind, a) for a in ([action] if action else ACTIONS))

    def counts(self) -> Counter[tuple[str, str]]:
        """(kind, outcome) -> requests."""
        with self._lock:
            return Counter((r.kind, r.outcome) for r in self.requests)

    @property
    def downs(self) -> int:
        """How many times the proxy went down (by ``down()`` or a ``down_on`` rule)."""
        return self._downs

    def wait_for(self, kind: str | None, n: int, timeout_s: float = 10.0) -> bool:
        """Wait until ``n`` requests of ``kind`` were received; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while sum(1 for r in self.requests if kind is None or r.kind == kind) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    # -- serving ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            listener = self._listener
            if listener is None:
                time.sleep(POLL_S)
                continue
            try:
                readable, _, _ = select.select([listener], [], [], POLL_S)
            except (OSError, ValueError):  # closed by down() meanwhile
                continue
            with self._lock:
                if listener is not self._listener or not readable:
                    continue
                try:
                    client, _ = listener.accept()
                except (BlockingIOError, OSError):
                    continue
                client.setblocking(True)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                connection = _Connection(client)
                thread = threading.Thread(target=self._serve, args=(connection,), name="faultproxy-conn", daemon=True)
                self._connections.add(connection)
                self._threads.add(thread)
            thread.start()

    def _serve(self, connection: _Connection) -> None:
        client = _Stream(connection.client)
        reset = False
        try:
            while not connection.killed.is_set():
                raw = client.read_head()
                if raw is None:
                    return
                head = _Head.parse(raw)
                request, rule = self._admit(head)
                try:
                    keep = self._handle(connection, client, head, request, rule)
                except _ResetNow:
                    reset = True
                    return
                except BaseException:
                    self._set_outcome(request, "failed")
                    raise
                if not keep:
                    return
        except (OSError, _Closed, ValueError):
            reset = True
        finally:
            connection.close(reset=reset)
            with self._lock:
                self._connections.discard(connection)
                self._threads.discard(threading.current_thread())

    def _admit(self, head: _Head) -> tuple[Request, Rule | None]:
        """Record the request and pick the fault that hits it (consuming one of its ``times``)."""
        method, target, _ = (head.start_line.split(" ", 2) + ["", ""])[:3]
        split = urlsplit(target)
        query = parse_qs(split.query, keep_blank_values=True)
        path = unquote(split.path)
        length = head.headers.get("content-length")
        request = Request(s3_operation(method, path, query, head.headers), method, path, query,
                          header_names=tuple(key.lower() for key, _ in head.headers.items),
                          content_length=int(length) if length is not None and length.isdigit() else None)
        chosen = None
        with self._changed:
            self.requests.append(request)
            self._ids += 1
            for rule in self._rules:
                if rule.spent or not rule.matches(request):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                if rule.times is not None:
                    rule.times -= 1
                chosen = rule
                request.outcome = rule.action
                break
            self._rules = [rule for rule in self._rules if not rule.spent]
            self._changed.notify_all()
        return request, chosen

    def _set_outcome(self, request: Request, outcome: str) -> None:
        with self._lock:
            if request.outcome == "passed":
                request.outcome = outcome

    def _handle(self, connection: _Connection, client: _Stream, head: _Head, request: Request,
                rule: Rule | None) -> bool:
        """Serve one request; True when the client connection stays open for the next one."""
        expects = head.headers.has_token("expect", "100-continue")
        framing = _framing(head.headers, request=True)
        if rule is None:
            return self._forward(connection, client, head, expects, framing, budget=None,
                                 complete=request.kind == "CompleteMultipartUpload")
        if rule.action == "rewrite":
            return self._forward(connection, client, _rewritten(head, rule), expects, framing, budget=None,
                                 answer=rule.answer or (lambda body: body), drop_answer=rule.drop_answer_headers)
        if rule.action == "reset":
            self._forward(connection, client, head, expects, framing, budget=rule.after_bytes)
            raise _ResetNow  # the body was shorter than the budget: reset before the answer
        if rule.action == "down":
            self.down(rule.down_for_s)
            raise _ResetNow
        if rule.action == "stall":
            if not expects:
                _discard_body(client, framing)
            self._wait_stalled(connection, rule.stall_s)
            raise _ResetNow
        # "status": early answer to an Expect request (no body follows), else after reading the body
        request_id = f"faultproxy-{self._ids}"
        if expects:
            connection.client.sendall(_error_response(rule.status, request.path, request_id,
                                                      head_only=request.method == "HEAD", close=True,
                                                      code=rule.code, message=rule.message))
            _lingering_close(connection.client)
            return False
        _discard_body(client, framing)
        connection.client.sendall(_error_response(rule.status, request.path, request_id,
                                                  head_only=request.method == "HEAD", close=False,
                                                  code=rule.code, message=rule.message))
        return True

    def _wait_stalled(self, connection: _Connection, stall_s: float | None) -> None:
        """Hold the request unanswered until released, killed, the client gives up, or ``stall_s``."""
        deadline = None if stall_s is None else time.monotonic() + stall_s
        while not (self._released.is_set() or connection.killed.is_set()):
            if deadline is not None and time.monotonic() >= deadline:
                return
            readable, _, _ = select.select([connection.client], [], [], POLL_S)
            if readable and not connection.client.recv(RECV_BYTES):
                return  # the client timed out and closed

    def _forward(self, connection: _Connection, client: _Stream, head: _Head, expects: bool,
                 framing: tuple[str, int], budget: int | None, complete: bool = False,
                 answer: Callable[[bytes], bytes] | None = None, drop_answer: tuple[str, ...] = ()) -> bool:
        upstream = socket.create_connection(self.upstream, timeout=UPSTREAM_CONNECT_TIMEOUT_S)
        upstream.settimeout(None)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.upstream = upstream
        if connection.killed.is_set():
            raise _ResetNow
        if expects:  # answered here; the upstream gets the body without waiting for its own 100
            connection.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        upstream.sendall(head.encode(drop=("expect",)))
        _relay_body(client, framing, _Sink(upstream, budget).send)
        if budget is not None:
            raise _ResetNow
        answer_fn, answer = answer, _Stream(upstream)
        method = head.start_line.split(" ", 1)[0]
        while True:
            raw = answer.read_head()
            if raw is None:
                raise _Closed("the upstream closed without answering")
            response = _Head.parse(raw)
            status = int(response.start_line.split(" ", 2)[1])
            response_framing = _framing(response.headers, request=False, method=method, status=status)
            if answer_fn is not None and not 100 <= status < 200:
                body = bytearray()
                _relay_body(answer, response_framing, body.extend)
                body = answer_fn(bytes(body))
                dropped = {"content-length", "transfer-encoding", *(name.lower() for name in drop_answer)}
                items = [(k, v) for k, v in response.headers.items if k.lower() not in dropped]
                if response_framing[0] != "none":
                    items.append(("Content-Length", str(len(body))))
                connection.client.sendall(_Head(response.start_line, _Headers(items)).encode() + body)
                connection.close_upstream()
                return response_framing[0] != "close" and not response.headers.has_token("connection", "close") \
                    and not head.headers.has_token("connection", "close")
            if self.fill_etag and complete and status == 200 and response_framing[0] == "length":
                body = b""
                while len(body) < response_framing[1]:
                    data = answer.read_some(response_framing[1] - len(body))
                    if not data:
                        raise _Closed("the upstream closed in the middle of an answer")
                    body += data
                if b"<ETag></ETag>" in body:
                    upload = parse_qs(urlsplit(head.start_line.split(" ")[1]).query).get("uploadId", [""])[0]
                    body = body.replace(b"<ETag></ETag>", b'<ETag>&quot;' + hashlib.md5(upload.encode()).hexdigest()
                                        .encode() + b'-0&quot;</ETag>')
                    with self._lock:
                        self.etags_filled += 1
                items = [(k, str(len(body)) if k.lower() == "content-length" else v) for k, v in response.headers.items]
                connection.client.sendall(_Head(response.start_line, _Headers(items)).encode() + body)
                connection.close_upstream()
                return not response.headers.has_token("connection", "close") \
                    and not head.headers.has_token("connection", "close")
            connection.client.sendall(raw)
            if not 100 <= status < 200:
                break
        _relay_body(answer, response_framing, connection.client.sendall)
        connection.close_upstream()
        return (response_framing[0] != "close" and not response.headers.has_token("connection", "close")
                and not head.headers.has_token("connection", "close"))


def _rewritten(head: _Head, rule: Rule) -> _Head:
    """``head`` without the rule's ``drop_headers`` and with its ``add_query`` appended."""
    method, target, version = (head.start_line.split(" ", 2) + ["", ""])[:3]
    if rule.add_query:
        target += ("&" if "?" in target else "?") + rule.add_query
    dropped = {name.lower() for name in rule.drop_headers}
    return _Head(f"{method} {target} {version}", _Headers([(k, v) for k, v in head.headers.items
                                                          if k.lower() not in dropped]))


# -- by hand ------------------------------------------------------------------------------------

_HELP = """commands:
  fail N [STATUS] [KIND]   answer the next N requests (of KIND) with STATUS (503 SlowDown, 500, ...)
  reset N BYTES [KIND]     reset the next N requests' connections after BYTES of their body
  stall N [KIND]           never answer the next N requests (read timeouts); 'release' ends stalls
  down [SECONDS]           refuse and reset all connections (up again after SECONDS)
  up | clear | release | counts | quit"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fault-injecting HTTP proxy for S3 tests.", epilog=_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="http://HOST:PORT of the S3 server")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    args = parser.parse_args(argv)
    with FaultProxy(args.upstream, port=args.port) as proxy:
        print(f"FAULTPROXY_ENDPOINT={proxy.endpoint}", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            command, rest = words[0], words[1:]
            try:
                if command == "fail":
                    proxy.fail(int(rest[0]), status=int(rest[1]) if len(rest) > 1 else 503,
                               kind=rest[2] if len(rest) > 2 else None)
                elif command == "reset":
                    proxy.reset(int(rest[0]), after_bytes=int(rest[1]), kind=rest[2] if len(rest) > 2 else None)
                elif command == "stall":
                    proxy.stall(int(rest[0]), kind=rest[1] if len(rest) > 1 else None)
                elif command == "down":
                    proxy.down(float(rest[0]) if rest else None)
                elif command in ("up", "clear", "release"):
                    getattr(proxy, command)()
                elif command == "counts":
                    for (kind, outcome), n in sorted(proxy.counts().items()):
                        print(f"{kind:28} {outcome:8} {n}", flush=True)
                elif command == "quit":
                    break
                else:
                    print(_HELP, flush=True)
                    continue
            except (IndexError, ValueError) as exc:
                print(f"bad command {line.strip()!r}: {exc}\n{_HELP}", flush=True)
                continue
            print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
