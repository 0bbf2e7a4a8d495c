"""Deferred signal exceptions and the Ctrl-C safe worker pool (ckptbench.interrupts)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ckptbench import interrupts
from ckptbench.interrupts import Deferred, Workers


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.01)  # the handler runs at the next bytecode of the main thread


def test_a_deferred_ctrl_c_is_raised_where_the_code_checks():
    with Deferred() as signals:
        ctrl_c()
        assert isinstance(signals.interrupt, KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            signals.check()
        signals.check()  # raised once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_later_signals_are_dropped_while_one_is_recorded_and_leaving_raises_an_unchecked_one():
    with pytest.raises(KeyboardInterrupt), Deferred() as signals:
        ctrl_c()
        first = signals.interrupt
        ctrl_c()
        ctrl_c()
        assert signals.interrupt is first
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with Deferred() as signals:  # checked: leaving is quiet
        ctrl_c()
        with pytest.raises(KeyboardInterrupt):
            signals.check()


def test_the_handler_runs_for_every_signal_even_while_one_is_recorded():
    """Only the exception is dropped: a handler that acts on a later signal (the CLI's Ctrl-C after its
    cleanup notice ends the process) does so at once, inside whatever wait the block is in."""
    calls = []

    def counting(signum, frame):
        calls.append(signum)
        raise KeyboardInterrupt(len(calls))

    previous = signal.signal(signal.SIGINT, counting)
    try:
        with pytest.raises(KeyboardInterrupt) as info, Deferred():
            for _ in range(3):
                ctrl_c()
            assert len(calls) == 3
        assert info.value.args == (1,)  # the first one's exception
    finally:
        signal.signal(signal.SIGINT, previous)


def test_in_a_library_call_ctrl_c_again_during_cleanup_waits_for_it():
    """Outside the command line nothing ends the process: a second Ctrl-C while run_interruptible joins
    its cancelled worker is raised once the worker has finished, as the first one was."""
    from ckptbench import native

    seen = {}

    def call(*, control):
        while not control.cancel_requested:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, while the caller waits for this worker
        time.sleep(0.2)
        seen["finished"] = True

    threading.Timer(0.1, ctrl_c).start()
    with pytest.raises(KeyboardInterrupt):
        native.run_interruptible(call)
    assert seen.get("finished") is True
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@contextlib.contextmanager
def a_foreign_thread_taking_sigusr1():
    """``(seen, send)``: ``send()`` signals a thread ckptbench did not start (as numpy's OpenBLAS pool),
    signals not blocked, and the SIGUSR1 handler sets ``seen``. The kernel hands a process's signal to
    such a thread when the main thread has one pending already (a Ctrl-C right after another signal);
    Python runs the handler only once the main thread runs Python code again."""
    seen = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.set())
    foreign = threading.Thread(target=seen.wait, args=(30,), name="foreign")
    foreign.start()
    try:
        yield seen, lambda: signal.pthread_kill(foreign.ident, signal.SIGUSR1)
    finally:
        seen.set()
        foreign.join()
        signal.signal(signal.SIGUSR1, previous)


def test_a_signal_another_thread_took_is_handled_while_join_waits():
    handled_in_the_wait = []
    with a_foreign_thread_taking_sigusr1() as (seen, send):
        worker = interrupts.QuietThread(target=lambda: handled_in_the_wait.append(seen.wait(20)))
        worker.start()
        threading.Timer(0.1, send).start()
        interrupts.join(worker)
    assert handled_in_the_wait == [True]


def test_a_signal_another_thread_took_is_handled_while_workers_wait_for_running_jobs():
    handled_in_the_wait = []
    with (
        a_foreign_thread_taking_sigusr1() as (seen, send),
        pytest.raises(ValueError, match="stop"),
        Workers(1, "test-workers") as pool,
    ):
        pool.submit(lambda: handled_in_the_wait.append(seen.wait(20)))
        threading.Timer(0.1, send).start()
        raise ValueError("stop")  # leaving by an exception waits for the running job
    assert handled_in_the_wait == [True]


def failing_on_call(real, when):
    """``real`` (signal.signal / pthread_sigmask) that, on the call ``when`` picks, does its work and then
    raises as a pending signal's handler run inside it would."""
    def call(*args):
        result = real(*args)
        if when(*args):
            raise KeyboardInterrupt
        return result
    return call


def test_a_handler_raising_while_the_handlers_are_installed_leaves_nothing_wrapped(monkeypatch):
    calls = []
    real = signal.signal
    monkeypatch.setattr(interrupts.signal, "signal",
                        failing_on_call(real, lambda *args: calls.append(args) or len(calls) == 2))
    with pytest.raises(KeyboardInterrupt), Deferred():
        pytest.fail("entered")
    monkeypatch.setattr(interrupts.signal, "signal", real)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and interrupts._active is None


def test_a_handler_raising_while_the_handlers_are_restored_still_restores_them_all(monkeypatch):
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    real, raised = signal.signal, []
    try:
        with pytest.raises(KeyboardInterrupt), Deferred():
            monkeypatch.setattr(interrupts.signal, "signal", failing_on_call(
                real, lambda signum, handler: not raised and signum == signal.SIGINT and not raised.append(1)))
        monkeypatch.setattr(interrupts.signal, "signal", real)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert not isinstance(signal.getsignal(signal.SIGTERM), type(Deferred()._handle))
        assert interrupts._active is None
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_quiet_gives_the_mask_back_even_when_a_pending_handler_raises_inside_the_block(monkeypatch):
    before = blocked_now()
    real = signal.pthread_sigmask
    monkeypatch.setattr(interrupts.signal, "pthread_sigmask",
                        failing_on_call(real, lambda how, mask: how == signal.SIG_BLOCK and bool(mask)))
    with pytest.raises(KeyboardInterrupt):
        interrupts.quiet(pytest.fail, "ran")
    monkeypatch.setattr(interrupts.signal, "pthread_sigmask", real)
    assert blocked_now() == before


def test_result_of_takes_a_ctrl_c_between_polls_and_honours_its_timeout():
    from concurrent.futures import Future
    from concurrent.futures import TimeoutError as FutureTimeout

    future: Future = Future()
    threading.Timer(0.1, ctrl_c).start()
    with pytest.raises(KeyboardInterrupt):
        interrupts.result_of(future)
    with pytest.raises(FutureTimeout):
        interrupts.result_of(future, timeout=0.1)
    threading.Timer(0.1, future.set_result, [42]).start()
    assert interrupts.result_of(future) == 42
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_leaving_workers_without_join_still_raises_a_jobs_failure():
    with pytest.raises(ValueError, match="late"), Workers(2, "test-workers") as pool:
        pool.submit(lambda: (_ for _ in ()).throw(ValueError("late")))


def test_a_handler_that_does_not_raise_keeps_working_and_ignored_signals_stay_ignored():
    seen = []
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with Deferred() as signals:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.01)
            assert seen == [signal.SIGTERM] and signals.interrupt is None
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGHUP, previous_hup)


def test_an_application_sys_exit_on_sigterm_is_deferred_with_its_code():
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with Deferred() as signals:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            with pytest.raises(SystemExit) as info:
                signals.check()
            assert info.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_handler_that_replaces_itself_keeps_its_replacement():
    """An application's SIGTERM handler that switches SIGTERM to SIG_IGN before raising (so a second one
    cannot cut its cleanup short): leaving the block must not put the raising handler back."""

    def once(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, once)
    try:
        with pytest.raises(SystemExit), Deferred() as signals:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            signals.check()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_nested_deferred_share_one_record_and_the_outer_restores_the_handlers():
    with Deferred() as outer:
        with pytest.raises(KeyboardInterrupt), Deferred():
            ctrl_c()
            assert isinstance(outer.interrupt, KeyboardInterrupt)  # one record
        assert signal.getsignal(signal.SIGINT) != signal.default_int_handler  # still the outer's
        outer.check()  # already taken by the inner one
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_off_the_main_thread_nothing_is_installed():
    handlers = []

    def run() -> None:
        with Deferred() as signals:
            handlers.append(signal.getsignal(signal.SIGINT))
            signals.check()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert handlers == [signal.default_int_handler]


def test_workers_return_results_in_order_and_raise_the_first_failure():
    with Workers(3, "test-workers") as pool:
        for i in range(10):
            pool.submit(lambda i: i * i, i)
        assert pool.join() == [i * i for i in range(10)]

    failed = []
    with pytest.raises(ValueError, match="job 2"), Workers(2, "test-workers", on_failure=lambda: failed.append(1)) as pool:
        for i in range(4):
            pool.submit(lambda i: (_ for _ in ()).throw(ValueError(f"job {i}")) if i == 2 else i, i)
        pool.join()
    assert failed == [1]


def test_ctrl_c_while_workers_run_cancels_the_queue_and_waits_for_the_running():
    started, finished = [], []
    stop = threading.Event()

    def job(i: int) -> None:
        started.append(i)
        stop.wait(5)
        finished.append(i)

    with pytest.raises(KeyboardInterrupt), Workers(2, "test-workers", on_failure=stop.set) as pool:
        for i in range(20):
            pool.submit(job, i)
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        pool.join()
    assert sorted(started) == sorted(finished) and len(started) < 20  # queued jobs never ran
    assert not [t for t in threading.enumerate() if t.name.startswith("test-workers")]


# A Ctrl-C landing inside concurrent.futures.wait() while it holds some futures' locks: raised there,
# it leaves them held, a worker's set_result blocks on one forever and the cleanup's join hangs (how an
# S3 save hung in CI). The signal is sent from inside that window, so the race is certain.
LOCKS_HELD = textwrap.dedent("""
    import concurrent.futures._base as base, os, signal, time
    from ckptbench.interrupts import Workers
    real_enter = base._AcquireFutures.__enter__
    def enter(self):
        futures = sorted(self.futures, key=id)
        futures[0]._condition.acquire()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs at the next bytecode: here, with one lock held
        for future in futures[1:]:
            future._condition.acquire()
    base._AcquireFutures.__enter__ = enter
    def job():
        time.sleep(0.3)
    try:
        with Workers(2, "w") as pool:
            for _ in range(4):
                pool.submit(job)
            pool.join()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def test_ctrl_c_inside_a_wait_holding_future_locks_does_not_hang():
    proc = subprocess.run([sys.executable, "-c", LOCKS_HELD], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "interrupted", proc.stderr
    assert proc.returncode == 0, proc.stderr



def blocked_now() -> set[int]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_threads_ckptbench_starts_never_take_the_applications_signals(tmp_path, monkeypatch):
    import torch

    import ckptbench
    from ckptbench.storage.store import LocalStore

    masks = {}
    write_files = LocalStore.write_files

    def recording(self, *args, **kwargs):
        masks["persist"] = blocked_now()
        return write_files(self, *args, **kwargs)

    monkeypatch.setattr(LocalStore, "write_files", recording)
    ckptbench.save({"w": torch.ones(1000)}, tmp_path / "c", async_=True).result()
    with Workers(2, "test-workers") as pool:
        masks["workers"] = pool.submit(blocked_now).result()
    assert signal.SIGINT in masks["persist"] and signal.SIGTERM in masks["persist"]
    assert masks["workers"] >= interrupts.ASYNC_SIGNALS
    assert signal.SIGINT not in blocked_now()  # the main thread got its mask back


def test_the_engines_worker_threads_never_take_the_applications_signals():
    """Threads the C++ engine spawns (here from the main thread) block the signals; /proc shows each
    thread's mask."""
    import numpy as np

    from ckptbench import native

    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        pytest.skip("needs /proc")
    before = {p.name for p in tasks.iterdir()}
    seen: dict[str, int] = {}
    done = threading.Event()

    def scan() -> None:
        me = str(threading.get_native_id())
        while not done.is_set():
            for task in tasks.iterdir():
                if task.name in before or task.name == me or task.name in seen:
                    continue
                with contextlib.suppress(OSError):
                    status = (task / "status").read_text()
                    seen[task.name] = int(next(line.split()[1] for line in status.splitlines()
                                               if line.startswith("SigBlk:")), 16)

    scanner = threading.Thread(target=scan)
    scanner.start()
    buffer = np.zeros(64 * 2**20, dtype=np.uint8)
    try:
        deadline = time.monotonic() + 20
        while len(seen) < 3 and time.monotonic() < deadline:
            native.crc32c_ranges(buffer, [(i * 2**20, 2**20) for i in range(64)], 4)
    finally:
        done.set()
        scanner.join()
    assert len(seen) >= 3, "the engine's workers were never seen"
    for tid, mask in seen.items():
        assert mask & (1 << (signal.SIGINT - 1)) and mask & (1 << (signal.SIGTERM - 1)), (tid, hex(mask))
    assert signal.SIGINT not in blocked_now()


def test_a_ctrl_c_raised_as_the_io_worker_starts_cancels_and_joins_it(monkeypatch):
    """Unblocking signals after a QuietThread starts runs a pending Ctrl-C's handler right there: the
    worker runs, and run_interruptible must still cancel and join it before the interrupt goes on
    (the CLI's cleanup then removes scratch files; a worker still writing recreated them, and the
    engine's threads alive at exit aborted the process)."""
    from ckptbench import native

    real_start = interrupts.QuietThread.start

    def start_then_ctrl_c(self):
        real_start(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(interrupts.QuietThread, "start", start_then_ctrl_c)
    seen = {}

    def call(*, control):
        while not control.cancel_requested:
            time.sleep(0.01)
        time.sleep(0.2)  # still closing files: the interrupt must wait for this
        seen["finished"] = True

    with pytest.raises(KeyboardInterrupt):
        native.run_interruptible(call)
    assert seen.get("finished") is True


def test_join_raises_a_ctrl_c_only_once_the_thread_has_finished():
    """Python 3.11's Thread.join, interrupted while the thread runs, marks it stopped anyway: the
    interpreter then exits under a thread in native code (an abort). interrupts.join waits it out."""
    finished = threading.Event()

    def work():
        time.sleep(0.5)
        finished.set()

    thread = interrupts.QuietThread(target=work)
    thread.start()
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        interrupts.join(thread)
    assert finished.is_set() and not thread.is_alive()
    interrupts.join(interrupts.QuietThread(target=work))  # never started: nothing to wait for
