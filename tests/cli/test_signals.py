"""Signals (a guarantee in docs/guarantees.md; the command line): SIGINT (Ctrl-C) or SIGTERM sent to a real
``python -m ckptbench`` while it measures (``bench`` on a directory, ``bench --workload checkpoint``,
``compare`` of two directories, ``preflight``) stops it cleanly: exit 130 for SIGINT, 143 for SIGTERM,
one line on stderr naming the signal, no traceback, nothing on stdout, every scratch directory removed,
and no result file (nor the --output directory made for it) left behind.

Each run is signalled only once bytes are being written inside its scratch directory, so the signal
lands in the middle of the work, not before it starts. Small I/O; never asserts timings.

A cleanup can wait on I/O that never answers (S3 retries a read timeout for minutes, a hard NFS
mount forever): the first Ctrl-C says it is cleaning up and that another one exits without it, and
that other one ends the process at once, naming what this run may have left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptbench.storage.local_target import SCRATCH_PREFIX

#: how long a run may take to start writing on a busy machine (torch import, planning, memcpy probe)
START_S = 240
#: how long the cleanup may take once signalled
STOP_S = 120
#: how long a Ctrl-C after the cleanup notice may take to end the process (at once; generous for a busy machine)
ESCAPE_S = 30

NOTICE = "ckptbench: stopping and cleaning up (press Ctrl-C again to exit at once, without cleaning up)"


@dataclass(frozen=True)
class Scenario:
    """A command that measures for longer than the test waits, on targets made in ``tmp_path``."""

    args: tuple[str, ...]  # {a}, {b}: target directories
    targets: tuple[str, ...]  # which of them to watch for writes: the signal lands while these are written


SCENARIOS = {
    "bench-fs": Scenario(("bench", "{a}", "--size", "4GiB", "--threads", "1", "--block-size", "64KiB",
                          "--repeat", "5", "--json"), ("a",)),
    "bench-checkpoint": Scenario(("bench", "{a}", "--workload", "checkpoint", "--size", "256MiB", "--writers",
                                  "ckptbench,torch", "--repeat", "20", "--warmup", "0", "--json"), ("a",)),
    # the signal lands while the second tier is measured: the first tier's scratch is long gone by then
    "compare": Scenario(("compare", "{a}", "{b}", "--size", "64MiB", "--repeat", "12", "--warmup", "0", "--json"),
                        ("b",)),
    "preflight": Scenario(("preflight", "{a}", "--measure-size", "128MiB", "--repeat", "20", "--params", "100M",
                           "--ranks", "1", "--mtbf", "1d", "--max-ckpt-time", "60s", "--json"), ("a",)),
}
SIGNALS = {signal.SIGINT: (130, "ckptbench: error: interrupted (SIGINT)"),
           signal.SIGTERM: (143, "ckptbench: error: terminated (SIGTERM)")}


def _writing(directory: Path) -> bool:
    """Whether a file with bytes in it exists under one of ``directory``'s scratch directories."""
    try:
        return any(f.is_file() and f.stat().st_size > 0
                   for scratch in directory.glob(f"{SCRATCH_PREFIX}*") for f in scratch.rglob("*"))
    except OSError:  # removed while we looked: the run moved on
        return False


def _contents(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", list(SIGNALS), ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_signal_mid_run_cleans_up_and_exits_with_its_code(tmp_path: Path, name: str, sig: int) -> None:
    scenario = SCENARIOS[name]
    cwd, dirs = tmp_path / "cwd", {"a": tmp_path / "a", "b": tmp_path / "b"}
    for d in (cwd, *dirs.values()):
        d.mkdir()
        (d / "keep").write_text("not ours")
    before = {d: _contents(d) for d in (cwd, *dirs.values())}
    output = cwd / "results" / "new"  # made before the run, so it must be removed again
    args = [a.format(**{k: str(v) for k, v in dirs.items()}) for a in scenario.args]
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", *args, "--output", str(output)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + START_S
        while not any(_writing(dirs[t]) for t in scenario.targets):
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"{name} ended (exit {proc.returncode}) before it was signalled:\n{err[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} never wrote into its scratch directory in {START_S} s")
            time.sleep(0.05)
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=STOP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    code, line = SIGNALS[sig]
    assert "Traceback" not in err, err
    assert proc.returncode == code, err
    said = [text for text in err.splitlines() if text.strip()]  # click ends a Ctrl-C's line with a blank one
    assert said == ([NOTICE] if sig == signal.SIGINT else []) + [line]
    assert out == ""
    assert not (cwd / "results").exists(), _contents(cwd)
    assert {d: _contents(d) for d in (cwd, *dirs.values())} == before  # every scratch directory removed


def test_sigterm_and_sigint_are_ours_only_while_a_command_runs(cli, tmp_path: Path) -> None:
    """In-process (a library caller, a test runner), the SIGTERM and SIGINT handlers in place before a
    command are put back when it returns, whatever the outcome: the CLI's Ctrl-C that exits without
    cleanup never outlives the command."""
    before = signal.getsignal(signal.SIGTERM)
    before_int = signal.getsignal(signal.SIGINT)
    seen: list[int] = []

    def mine(signum: int, frame: object) -> None:
        seen.append(signum)

    signal.signal(signal.SIGTERM, mine)
    try:
        assert cli("interval", "--ckpt-time", "140s", "--mtbf", "3h", "--json").exit_code == 0
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is before_int
        assert cli("bench", str(tmp_path / "missing")).exit_code == 2
        assert signal.getsignal(signal.SIGINT) is before_int
        assert signal.getsignal(signal.SIGTERM) is mine  # checked before sending: ours would stop pytest
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:  # handlers run between bytecodes of the main thread
            time.sleep(0.01)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


# ``ckptbench ARGS`` whose writes hang once started and ignore the cancel, as a request to a store that
# stopped answering does: the cleanup of the first signal waits on it (the engine's worker must be
# joined before the scratch directory is removed) for as long as the hang lasts.
HUNG_WRITES = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ckptbench import native
    from ckptbench.cli import main

    marker = Path(sys.argv[1])

    def hung_write(jobs, *, control, **options):
        marker.write_text("writing")
        while not control.cancel_requested:
            time.sleep(0.01)
        marker.write_text("cancelled")  # the first signal was taken: its cleanup now waits on this write
        time.sleep(3600)

    native.write = hung_write
    main(sys.argv[2:], prog_name="ckptbench")
""")


class _StderrLines:
    """A child's stderr read line by line as it comes (the test acts on the cleanup notice)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, line: str, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: line in self.lines, timeout_s)

    def all(self) -> list[str]:
        self._reader.join(ESCAPE_S)
        return self.lines


def _wait_for_marker(proc: subprocess.Popen, marker: Path, text: str, lines: _StderrLines) -> None:
    deadline = time.monotonic() + START_S
    while not (marker.exists() and marker.read_text() == text):
        if proc.poll() is not None:
            pytest.fail(f"ended (exit {proc.returncode}) before its write was {text}:\n{lines.all()}")
        if time.monotonic() > deadline:
            pytest.fail(f"its write was never {text} in {START_S} s")
        time.sleep(0.05)


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM], ids=lambda s: signal.Signals(s).name)
def test_ctrl_c_again_during_a_hung_cleanup_exits_at_once_naming_what_is_left(tmp_path: Path, first: int) -> None:
    """The first signal stops the run; its cleanup hangs on a write that never returns. After SIGINT the
    notice is printed at once; after SIGTERM a second SIGTERM changes nothing (it must not cut a cleanup
    short) and the first Ctrl-C prints the notice without cutting it short either. The next Ctrl-C exits
    130 at once, with one line naming the scratch directory it leaves, which is indeed there."""
    target, marker = tmp_path / "target", tmp_path / "marker"
    target.mkdir()
    bench = f"bench {target} --size 8MiB --files 1 --threads 1 --block-size 1MiB --repeat 1 --json".split()
    driver = [sys.executable, "-c", HUNG_WRITES, str(marker), *bench]
    proc = subprocess.Popen(driver, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _StderrLines(proc)
    try:
        _wait_for_marker(proc, marker, "writing", lines)
        os.kill(proc.pid, first)
        _wait_for_marker(proc, marker, "cancelled", lines)  # the cleanup now waits on the hung write
        if first == signal.SIGTERM:
            os.kill(proc.pid, signal.SIGTERM)
            os.kill(proc.pid, signal.SIGINT)
        assert lines.wait_for(NOTICE, ESCAPE_S), f"no cleanup notice: {lines.lines}"
        assert proc.poll() is None, lines.all()  # still cleaning up: nothing cut it short
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=ESCAPE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still waiting on the hung cleanup {ESCAPE_S} s after Ctrl-C again: {lines.lines}")
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = lines.all()
    assert proc.returncode == 130, err
    assert out == ""
    assert not any("Traceback" in line for line in err), err
    assert len(err) == 2 and err[0] == NOTICE, err
    assert err[1].startswith("ckptbench: error: interrupted again (SIGINT): exited without cleaning up; "
                             "this run may have left "), err
    left = err[1].removeprefix("ckptbench: error: interrupted again (SIGINT): exited without cleaning up; "
                               "this run may have left ")
    scratch = [str(p) for p in target.glob(f".ckptbench-scratch-{proc.pid}-*")]
    assert left in scratch, (left, _contents(target))  # the line names the very directory left behind


# A command whose stop signal comes out as another error, as a SIGTERM raised inside an extension
# module's import comes out as that import's ImportError; SIGNAL=0: the same error with no signal.
CONVERTED = textwrap.dedent("""
    import os, signal, sys, time
    import click
    from ckptbench import cli

    @click.command()
    def step() -> None:
        try:
            if os.environ["SIGNAL"] != "0":
                os.kill(os.getpid(), int(os.environ["SIGNAL"]))
                time.sleep(10)
        except KeyboardInterrupt:
            pass
        raise ImportError("cannot load module more than once per process")

    sys.exit(cli._run(click.Group(commands={"step": step}), ["step"], "ckptbench", {}))
""")


@pytest.mark.parametrize(("sig", "line"), [(signal.SIGTERM, "ckptbench: error: terminated (SIGTERM)"),
                                           (signal.SIGINT, "ckptbench: error: interrupted (SIGINT)")])
def test_an_error_the_stop_signal_turned_into_ends_as_the_signal(sig: int, line: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CONVERTED], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SIGNAL": str(int(sig))})
    assert proc.returncode == 128 + sig, proc.stderr
    assert "Traceback" not in proc.stderr
    assert [x for x in proc.stderr.splitlines() if x.startswith("ckptbench: error:")] == [line]
    # the same error with no signal is a bug: its traceback comes out
    proc = subprocess.run([sys.executable, "-c", CONVERTED], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SIGNAL": "0"})
    assert proc.returncode == 1 and "ImportError: cannot load module more than once" in proc.stderr
