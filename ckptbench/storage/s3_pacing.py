"""How many S3 data requests are in flight, adapted to throttling, and what throttling cost.

:class:`Aimd` is the concurrency controller the S3 data path's requests (part uploads, whole-object
PUTs, ranged GETs) pass through: a request waits for a slot while ``in_flight >= limit``. Each
request that succeeds adds ``1 / limit`` to the limit (one slot more per ``limit`` successes:
additive increase), up to the ceiling, the configured concurrency. A throttled answer (503
SlowDown, 429, a Throttling code) multiplies it by ``decrease`` (multiplicative decrease), down to a
floor of one; throttles of requests that started before the last decrease are that same congestion
answering late and do not decrease it again (one decrease per round of requests, as TCP does per
round trip). A transfer starting ``RESTORE_AFTER_S`` after the last decrease starts at the ceiling. One controller per S3 connection (client and options) in a process, so every store
with those options, and every save and load through them, shares what it learned.

:class:`RequestStats` counts, per connection and in a process-wide total that benchmarks take
differences of (:func:`totals`): requests, throttled answers, retries (attempts after the first),
failed attempts of other kinds (5xx, connection resets, timeouts), and the seconds retries cost
(from a request's first attempt to its last: the failed attempts and the backoff between them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

#: The factor a throttled answer multiplies the limit by.
DEFAULT_DECREASE = 0.5
#: A transfer that starts this long after the last throttled answer starts at the ceiling again (the
#: limit learned then is about a burst that has passed; throttling now brings it down within a round).
RESTORE_AFTER_S = 2.0
#: Error codes S3 and S3-compatible servers use for "slow down" (HTTP 503 SlowDown, 429 and others).
THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
                            "RequestThrottled", "RequestLimitExceeded", "TooManyRequests",
                            "TooManyRequestsException", "ProvisionedThroughputExceededException",
                            "RequestThrottledException", "BandwidthLimitExceeded", "EC2ThrottledException"})
THROTTLE_STATUSES = frozenset({429, 503})
#: How often a request waiting for a slot checks whether its transfer was stopped.
_WAIT_POLL_S = 0.1


def is_throttle(status: int | None, code: str | None) -> bool:
    """Whether an answer asks the client to slow down (503 without another code counts: S3's SlowDown)."""
    return bool(code and code in THROTTLE_CODES) or status in THROTTLE_STATUSES


class Aimd:
    """Additive-increase / multiplicative-decrease limit on requests in flight (module docstring)."""

    def __init__(self, ceiling: int, *, floor: int = 1, decrease: float = DEFAULT_DECREASE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ceiling < 1 or floor < 1:
            raise ValueError("the ceiling and the floor must be at least 1")
        if not 0 < decrease < 1:
            raise ValueError("decrease must be between 0 and 1")
        self._floor = floor
        self._decrease = decrease
        self._clock = clock
        self._cond = threading.Condition()
        self._ceiling = ceiling
        self._limit = float(ceiling)
        self._in_flight = 0
        self._starts: list[float] = []  # the slots in flight, by start time
        self._last_decrease = -float("inf")
        self.decreases = 0
        self.lowest = ceiling

    @property
    def ceiling(self) -> int:
        return self._ceiling

    @property
    def limit(self) -> int:
        """Requests allowed in flight now (the whole part of the adapted limit, at least the floor)."""
        return max(self._floor, min(self._ceiling, int(self._limit + 1e-9)))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def set_ceiling(self, ceiling: int) -> None:
        """The configured concurrency of the next transfer. A limit that never came down follows it,
        and so does one whose last decrease is ``RESTORE_AFTER_S`` old; a limit learned from recent
        throttling stays (clamped to the new ceiling) and grows back from there."""
        if ceiling < 1:
            raise ValueError("the ceiling must be at least 1")
        with self._cond:
            if self._limit >= self._ceiling or self._clock() - self._last_decrease >= RESTORE_AFTER_S:
                self._limit = float(ceiling)
            self._ceiling = ceiling
            self._limit = min(self._limit, float(ceiling))
            self.lowest = min(self.lowest, self.limit)
            self._cond.notify_all()

    def acquire(self, stopped: Callable[[], bool] | None = None) -> float | None:
        """Wait for a slot; its start time (for :meth:`throttled`), or None when ``stopped`` said so."""
        with self._cond:
            while self._in_flight >= self.limit:
                if stopped is not None and stopped():
                    return None
                self._cond.wait(_WAIT_POLL_S)
            self._in_flight += 1
            started = self._clock()
            self._starts.append(started)
            return started

    def release(self, started: float | None = None) -> None:
        with self._cond:
            self._in_flight -= 1
            if started is not None and started in self._starts:
                self._starts.remove(started)
            elif self._starts:
                self._starts.pop(0)
            self._cond.notify_all()

    def succeeded(self) -> None:
        """A request was answered without throttling: additive increase."""
        with self._cond:
            if self._limit < self._ceiling:
                self._limit = min(float(self._ceiling), self._limit + 1.0 / self.limit)
                self._cond.notify_all()

    def throttled(self, started: float | None = None) -> None:
        """A request that started at ``started`` was throttled: multiplicative decrease, unless the limit
        already came down after it started. A client that cannot tell which request it was (its own
        event loop sends them) gives None: the oldest slot in flight stands for it."""
        with self._cond:
            if started is None and self._starts:
                started = min(self._starts)
            if started is not None and started < self._last_decrease:
                return
            self._limit = max(float(self._floor), self._limit * self._decrease)
            self._last_decrease = self._clock()
            self.decreases += 1
            self.lowest = min(self.lowest, self.limit)

    @contextmanager
    def slot(self, stopped: Callable[[], bool] | None = None) -> Iterator[float | None]:
        """A slot for one request (None inside when ``stopped``: the caller skips its request)."""
        started = self.acquire(stopped)
        try:
            yield started
        finally:
            if started is not None:
                self.release(started)


@dataclass
class Counts:
    """What the data path's requests met (see the module docstring)."""

    requests: int = 0
    throttled: int = 0
    retries: int = 0
    errors: int = 0
    retry_s: float = 0.0

    def minus(self, other: Counts) -> Counts:
        return Counts(self.requests - other.requests, self.throttled - other.throttled,
                      self.retries - other.retries, self.errors - other.errors, self.retry_s - other.retry_s)

    def plus(self, other: Counts) -> Counts:
        return Counts(self.requests + other.requests, self.throttled + other.throttled,
                      self.retries + other.retries, self.errors + other.errors, self.retry_s + other.retry_s)

    def to_dict(self) -> dict[str, float | int]:
        out = asdict(self)
        out["retry_s"] = round(self.retry_s, 6)
        return out


_TOTAL = Counts()
_TOTAL_LOCK = threading.Lock()


def totals() -> Counts:
    """Every S3 connection's counts in this process so far (take two and subtract)."""
    with _TOTAL_LOCK:
        return Counts(**asdict(_TOTAL))


class RequestStats:
    """Counts of one connection; updated from worker threads (and the process total with them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = Counts()

    def add(self, *, requests: int = 0, throttled: int = 0, retries: int = 0, errors: int = 0,
            retry_s: float = 0.0) -> None:
        delta = Counts(requests, throttled, retries, errors, retry_s)
        with self._lock:
            self.counts = self.counts.plus(delta)
        global _TOTAL
        with _TOTAL_LOCK:
            _TOTAL = _TOTAL.plus(delta)

    def snapshot(self) -> Counts:
        with self._lock:
            return Counts(**asdict(self.counts))


def summary_text(counts: Counts) -> str:
    """One line for a console: the throttled answers, retries and their seconds (or that there were none)."""
    if not counts.throttled and not counts.retries and not counts.errors:
        return f"throttling: none ({counts.requests} data requests, no retries)"
    cost = f", {counts.retry_s:.2f} s spent in retried requests" if counts.retry_s else ""
    return (f"throttling: {counts.throttled} throttled answers (503 SlowDown/429), {counts.errors} other failed "
            f"attempts, {counts.retries} retries of {counts.requests} data requests{cost}")
