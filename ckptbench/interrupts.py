"""Ctrl-C where the code can take it: deferred signal exceptions and a worker pool that honours them.

Python raises a signal handler's exception (Ctrl-C's KeyboardInterrupt, an application's
``sys.exit`` on SIGTERM) in the main thread at whatever bytecode runs next. While that thread
coordinates worker threads (submitting to a pool, waiting on futures, inside a
``threading.Condition``) the next bytecode can lie between taking a lock and the ``try`` that gives
it back. A worker then blocks on that lock forever, and the cleanup that joins the worker hangs. CI
caught a Ctrl-C during an S3 upload hanging this way, and a second Ctrl-C during the exit's wait for
an async save escaping its handler with "cannot release un-acquired lock".

:class:`Deferred` catches such an exception inside the handler and records it; the code raises it
where it chooses (:meth:`Deferred.check`), so cleanup starts from a consistent state. A signal
whose handler does not raise (an application's own handler) behaves as before, and signals at
SIG_DFL or SIG_IGN keep their action. :class:`Workers` is a thread pool that waits in short polls
and checks between them: Ctrl-C stops it within ``POLL_S``, cancelling what has not started and
waiting for what has.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
POLL_S = 0.05
# Blocked in every thread ckptbench starts, as csrc/threads.hpp does for the engine's workers.
ASYNC_SIGNALS = frozenset(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1",
                                                             "SIGUSR2", "SIGALRM") if hasattr(signal, name))

_active: Deferred | None = None  # the outermost Deferred of the main thread; nested ones share it


def quiet(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with ASYNC_SIGNALS blocked on the calling thread, so threads it starts keep them
    blocked (a new thread inherits the mask); a signal arriving meanwhile waits and comes after.

    Why: the kernel hands a signal sent to the process to any thread that does not block it, and a
    thread busy in syscalls (a persist writing shards) often takes it first. Python runs handlers on
    the main thread only and does not wake it when another thread took the signal: an application
    whose main thread sleeps or waits would not see its Ctrl-C (CI caught a SIGTERM lost this way)."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX
        return fn(*args)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # read first: a pending handler may raise
    try:                                                      # inside the call that blocks
        signal.pthread_sigmask(signal.SIG_BLOCK, ASYNC_SIGNALS)
        return fn(*args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class QuietThread(threading.Thread):
    """A ``threading.Thread`` that never takes the application's signals (see :func:`quiet`)."""

    def start(self) -> None:
        quiet(super().start)


class Deferred:
    """``with Deferred() as signals:`` ... ``signals.check()`` at safe points.

    The first signal exception is recorded; later ones while it is recorded are dropped (it is the
    same request: stop), their handlers still run, each at once: one that ends the process (the
    command line's, on a Ctrl-C after its cleanup notice) is never held up by the wait it
    interrupted. Leaving the block is a safe point too: a recorded exception not yet checked
    is raised there, after the handlers are back. Handlers take no lock (a handler runs on the main
    thread, which may hold that very lock), so code that waits polls :attr:`interrupt`. Off the main
    thread nothing is installed (Python runs handlers on the main thread only) and nothing is ever
    recorded. Nested on the main thread, the inner one shares the outer one's record.

    ``signal.signal`` runs handlers of signals already pending, so installing and restoring are
    written to survive a handler raising in the middle: nothing is left wrapped, nothing is lost."""

    def __init__(self) -> None:
        self._interrupt: BaseException | None = None
        self._previous: dict[int, Any] = {}
        # The instance whose handlers are installed, None for this one (not self: a cycle the collector must free)
        self._owner: Deferred | None = None

    @property
    def interrupt(self) -> BaseException | None:
        """The recorded signal exception (not cleared)."""
        return (self._owner or self)._interrupt

    def __enter__(self) -> Deferred:
        global _active
        if threading.current_thread() is not threading.main_thread():
            return self
        if _active is not None:
            self._owner = _active
            return self
        _active = self
        try:
            for name in SIGNALS:
                signum = getattr(signal, name, None)
                handler = signal.getsignal(signum) if signum is not None else None
                if callable(handler):
                    self._previous[signum] = handler
                    signal.signal(signum, self._handle)
        except BaseException:
            self._restore()
            raise
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        try:
            self._previous[signum](signum, frame)
        except BaseException as exc:
            if self._interrupt is None:
                self._interrupt = exc

    def check(self) -> None:
        """Raise the recorded signal exception, if any (and forget it)."""
        owner = self._owner or self
        interrupt, owner._interrupt = owner._interrupt, None
        if interrupt is not None:
            raise interrupt

    def _restore(self) -> BaseException | None:
        """Put every handler back that is still ours; a pending signal's handler that raises meanwhile is
        returned, after the rest are back."""
        global _active
        raised = None
        for signum, handler in self._previous.items():
            while signal.getsignal(signum) == self._handle:  # else it replaced itself (CLI: SIG_IGN)
                try:
                    signal.signal(signum, handler)
                except BaseException as exc:  # noqa: BLE001 - raised below, once every handler is back
                    raised = raised or exc
        self._previous.clear()
        if _active is self:
            _active = None
        return raised

    def __exit__(self, *exc: object) -> None:
        owner, self._owner = self._owner or self, None
        raised = self._restore() if owner is self else None
        interrupt, owner._interrupt = owner._interrupt, None
        if raised is not None or interrupt is not None:
            raise raised if raised is not None else interrupt


def join(thread: threading.Thread, timeout: float | None = None) -> None:
    """``thread.join(timeout)`` with a signal's exception raised after the wait, never inside it (and
    nothing to wait for when the thread never started).

    Why: Python 3.11's ``Thread.join``, interrupted by a handler's exception while the thread still
    runs, releases the thread's state lock itself and marks the thread stopped (its bpo-45274 fix).
    Every later join returns at once; the interpreter exits under a thread still in native code, and
    when that thread takes the GIL back it is unwound through C++ frames: the process aborts. A
    Ctrl-C early in ``ckptbench bench`` did that about 1 run in 5.

    It waits in short polls: a signal the kernel gave a thread ckptbench did not start (numpy's
    OpenBLAS pool blocks nothing; it gets the signal when the main thread has one pending already)
    has its handler run on the main thread only once that thread runs Python code again, never
    inside an untimed wait. Ctrl-C again during a cleanup must reach the command line's handler."""
    if thread.ident is None:
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    with Deferred():
        while thread.is_alive():
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                break
            thread.join(left)


def result_of(future: Future, timeout: float | None = None) -> Any:
    """``future.result(timeout)`` for the main thread: a Ctrl-C is taken between polls, never inside
    the wait (where it can leave the future's lock released twice or held)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with Deferred() as signals:
        while not future.done():
            signals.check()
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                break
            wait([future], timeout=left)
    return future.result(timeout=0)


def _wait_polling(futures: list[Future]) -> None:
    """Until every future is done, in waits of ``POLL_S`` (inside a Deferred: nothing raises in them)."""
    pending = [future for future in futures if not future.done()]
    while pending:
        pending = list(wait(pending, timeout=POLL_S).not_done)


class Workers:
    """A pool of ``threads`` workers for the main thread to fan work out to, Ctrl-C safe.

    ``submit`` queues ``fn(*args)``; ``join`` waits for everything submitted and raises the first
    failure (or a deferred signal exception); leaving the block joins too. Leaving by an exception
    calls ``on_failure`` (a flag the jobs check, say), cancels what has not started and waits for
    what has (a Ctrl-C meanwhile comes after), then lets the exception go on."""

    def __init__(self, threads: int, name: str, *, on_failure: Callable[[], None] | None = None) -> None:
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix=name)
        self._futures: list[Future] = []
        self._on_failure = on_failure
        self._signals = Deferred()

    def __enter__(self) -> Workers:
        self._signals.__enter__()
        return self

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        self._signals.check()
        future = quiet(self._pool.submit, fn, *args)  # it may start a worker
        self._futures.append(future)
        return future

    def join(self) -> list[Any]:
        """Every submitted job's result, in submission order, once all are done."""
        pending = set(self._futures)
        while pending:
            self._signals.check()
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    raise future.exception()
        self._signals.check()
        return [future.result() for future in self._futures]

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        failed = kind is not None
        try:
            if not failed:
                try:
                    self.join()
                except BaseException:
                    failed = True
                    raise
        finally:
            try:
                if failed and self._on_failure is not None:
                    self._on_failure()
                self._pool.shutdown(wait=False, cancel_futures=failed)
                _wait_polling(self._futures)  # not shutdown's untimed joins: see join()
                self._pool.shutdown(wait=True)  # idle workers, ending
            finally:
                self._signals.__exit__()
