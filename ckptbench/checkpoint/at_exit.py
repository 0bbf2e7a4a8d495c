"""Async saves still persisting when the interpreter exits are finished first, or abandoned.

The interpreter's exit, also one caused by an uncaught Ctrl-C (KeyboardInterrupt) or ``sys.exit``,
waits for every persist registered with :func:`finish_before_exit` (by ``SaveLock.finish_before_exit``),
saying so. A second Ctrl-C abandons them: their save locks are released first, so no commit can
follow, and the process ends at once.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered before ours (see the end)
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, NoReturn

from ckptbench import interrupts

if TYPE_CHECKING:
    from ckptbench.checkpoint.lock import SaveLock

log = logging.getLogger(__name__)

_in_flight: dict[Future, SaveLock] = {}
_in_flight_lock = threading.Lock()


def finish_before_exit(future: Future, lock: SaveLock) -> None:
    """Make the interpreter's exit wait for ``future``, an async persist holding ``lock``."""
    with _in_flight_lock:
        _in_flight[future] = lock
    future.add_done_callback(_forget)


def _forget(future: Future) -> None:
    with _in_flight_lock:
        _in_flight.pop(future, None)


def _finish_saves_in_flight() -> None:
    """At exit (also after an uncaught KeyboardInterrupt or SystemExit): finish async persists.

    A second Ctrl-C (or SystemExit, from a signal handler) while waiting abandons them: their locks
    are released first, so no commit can follow, and the process ends at once, by SIGINT (Ctrl-C) or
    with the SystemExit's code, skipping the rest of the interpreter's shutdown. Finalizing under a
    persist thread that is inside the engine would abort the process (its C++ frames unwound by the
    thread's forced exit)."""
    # A second Ctrl-C is recorded by the handler and acted on here, never raised inside the wait (see
    # ckptbench.interrupts); a third one changes nothing: the abandon is under way. One that comes
    # after every save finished is dropped: the process is exiting anyway.
    with contextlib.suppress(KeyboardInterrupt, SystemExit), interrupts.Deferred() as signals:
        with _in_flight_lock:
            pending = list(_in_flight.items())
        for future, lock in pending:
            if future.done():
                continue
            log.warning("ckptbench: finishing the async save to %s before exit (Ctrl-C again to abandon it)",
                        lock.url)
            while not future.done() and signals.interrupt is None:
                time.sleep(interrupts.POLL_S)
            if signals.interrupt is not None:
                _abandon(pending, signals.interrupt)
            if future.exception() is not None:
                log.warning("ckptbench: the async save to %s failed: %s", lock.url, future.exception())


def _abandon(pending: list[tuple[Future, SaveLock]], interrupt: BaseException) -> NoReturn:
    for future, lock in pending:
        if not future.done() and not lock.release():
            log.warning("ckptbench: abandoned the async save to %s: nothing was committed (the previous checkpoint "
                        "stays; the next save removes the partial files)", lock.url)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if isinstance(interrupt, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    code = interrupt.code if isinstance(interrupt, SystemExit) else 130
    os._exit(code if isinstance(code, int) else 1)


# Registered with threading's exit hooks, not atexit's: those run first, last registered first, so
# this one runs before concurrent.futures' (imported above), after which a persist could no longer
# queue work on a thread pool (S3 part uploads). atexit where that private hook is missing.
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_finish_saves_in_flight)
else:  # pragma: no cover - CPython before 3.9
    atexit.register(_finish_saves_in_flight)
