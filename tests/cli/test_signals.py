"""Signals (issue 8, guarantee 4, the command line): SIGINT (Ctrl-C) or SIGTERM sent to a real
``python -m ckptbench`` while it measures (``bench`` on a directory, ``bench --workload checkpoint``,
``compare`` of two directories, ``preflight``) stops it cleanly: exit 130 for SIGINT, 143 for SIGTERM,
one line on stderr naming the signal, no traceback, nothing on stdout, every scratch directory removed,
and no result file (nor the --output directory made for it) left behind.

Each run is signalled only once bytes are being written inside its scratch directory, so the signal
lands in the middle of the work, not before it starts. Small I/O; never asserts timings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptbench.storage.local import SCRATCH_PREFIX

#: how long a run may take to start writing on a busy machine (torch import, planning, memcpy probe)
START_S = 240
#: how long the cleanup may take once signalled
STOP_S = 120


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
    assert err.strip().splitlines() == [line]
    assert out == ""
    assert not (cwd / "results").exists(), _contents(cwd)
    assert {d: _contents(d) for d in (cwd, *dirs.values())} == before  # every scratch directory removed


def test_sigterm_is_ours_only_while_a_command_runs(cli, tmp_path: Path) -> None:
    """In-process (a library caller, a test runner), the SIGTERM handler in place before a command is put
    back when it returns, whatever the outcome."""
    before = signal.getsignal(signal.SIGTERM)
    seen: list[int] = []

    def mine(signum: int, frame: object) -> None:
        seen.append(signum)

    signal.signal(signal.SIGTERM, mine)
    try:
        assert cli("interval", "--ckpt-time", "140s", "--mtbf", "3h", "--json").exit_code == 0
        assert signal.getsignal(signal.SIGTERM) is mine
        assert cli("bench", str(tmp_path / "missing")).exit_code == 2
        assert signal.getsignal(signal.SIGTERM) is mine  # checked before sending: ours would stop pytest
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:  # handlers run between bytecodes of the main thread
            time.sleep(0.01)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)
