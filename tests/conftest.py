"""Shared fixtures: CLI invocation, real (tiny) filesystems mounted for error paths."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import click.testing
import pytest


class _BothStreams(click.testing.Result):
    """click < 8.2's Result, whose ``output`` is stdout and stderr together as in click >= 8.2 (stderr after
    stdout, where click >= 8.2 interleaves them as written)."""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class _SeparateStreams(click.testing.CliRunner):
    """click < 8.2's CliRunner, with stderr kept apart from stdout as click >= 8.2 keeps it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, mix_stderr=False, **kwargs)

    def invoke(self, *args, **kwargs) -> click.testing.Result:
        result = super().invoke(*args, **kwargs)
        return _BothStreams(result.runner, result.stdout_bytes, result.stderr_bytes, result.return_value,
                            result.exit_code, result.exception, result.exc_info)


# The tests read a command's stdout and stderr apart (``result.stdout``, ``result.stderr``), as click >= 8.2's
# CliRunner gives them. pyproject.toml allows click 8.1 (tests/perf/floors_check.sh runs the tests with it),
# whose CliRunner mixes them unless told not to: there every test module's CliRunner is this one.
if "mix_stderr" in inspect.signature(click.testing.CliRunner.__init__).parameters:
    click.testing.CliRunner = _SeparateStreams
CliRunner = click.testing.CliRunner

# Set before ckptbench is imported: its knobs read the environment once.
# Measuring commands print a line per step to stderr when it is not a terminal (logs); the tests read stderr
# for the one-line errors, so they run without them (tests/cli/test_progress_log.py turns them on).
os.environ.setdefault("CKPTBENCH_LOG_PROGRESS", "0")
# Saves use the default settings, not ones measured per mount (checkpoint/tuning.py), unless a test turns the
# measurement on (tests/checkpoint/test_tuning.py): a test's save then writes exactly what it says, and no probe
# writes land in the tests that intercept or count the writes of a save.
os.environ.setdefault("CKPTBENCH_TUNE", "0")
# preflight's write past the write-back cache, kept short in tests (its own tests set what they need)
os.environ.setdefault("CKPTBENCH_SUSTAINED_PROBE_MAX_BYTES", str(64 << 20))
os.environ.setdefault("CKPTBENCH_SUSTAINED_PROBE_DIRECT_S", "1")

from ckptbench.cli import main  # noqa: E402

# Child interpreters (``python -c``, multiprocessing's forkserver, torchrun workers) must import the
# installed ckptbench, not the source tree the tests run from (no compiled engine there under CI's
# non-editable install): Python 3.11's safe-path mode keeps the working directory off sys.path.
os.environ.setdefault("PYTHONSAFEPATH", "1")

# A shell runs a background job (`.ci/run &`, nohup) with SIGINT ignored, and children inherit an ignored
# signal: the tests that press Ctrl-C on a child would then wait for nothing. Give children the
# disposition a program started from a terminal has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class Cli:
    """Runs ``ckptbench ARGS`` in-process; stdout and stderr kept apart."""

    def __call__(self, *args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    def json(self, *args: str) -> dict:
        result = self(*args, "--json")
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def two_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """Two empty target directories (for compare), the first holding a file no run may touch."""
    a, b = tmp_path / "fast", tmp_path / "slow"
    a.mkdir()
    b.mkdir()
    (a / "keep.bin").write_bytes(b"keep me")
    return a, b


@pytest.fixture
def cli() -> Cli:
    return Cli()


def _kill_when_it_says(argv: list[str], env: dict[str, str], line: str) -> None:
    """Start ``argv`` (a worker that prints ``line`` when it reaches the moment to die), SIGKILL it there,
    and check both: the line came, and the kill ended it."""
    worker = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert worker.stdout is not None
        said = worker.stdout.readline()
        assert said.strip() == line, said
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == -signal.SIGKILL


@pytest.fixture
def kill_when_it_says():
    """:func:`_kill_when_it_says`: a worker process SIGKILLed at the moment it names."""
    return _kill_when_it_says


def _mount(fstype: str, where: Path, options: str | None) -> bool:
    cmd = ["mount", "-t", fstype, fstype, str(where)] + (["-o", options] if options else [])
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture
def mount_fs(tmp_path: Path) -> Iterator:
    """``mount_fs("tmpfs", "size=1m")`` mounts a real filesystem in tmp_path (skips where mount is refused)."""
    mounted: list[Path] = []

    def make(fstype: str, options: str | None = None) -> Path:
        where = tmp_path / f"mnt-{fstype}-{uuid.uuid4().hex[:6]}"
        where.mkdir()
        if not _mount(fstype, where, options):
            pytest.skip(f"cannot mount {fstype} here (needs root and mount permission)")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=10)


def _uses_ceph(item: pytest.Item) -> bool:
    """Whether a test needs the session's Ceph cluster (tests/storage/conftest.py), directly or through a
    fixture: every test under tests/storage/, and any test marked s3 or netfs."""
    return ("tests/storage/" in item.nodeid or item.get_closest_marker("s3") is not None
            or item.get_closest_marker("netfs") is not None or "ceph" in getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups of the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under pytest-xdist (``-n 2 --dist loadgroup``: the README's test command) the tests that use the Ceph
    # cluster go to one worker together, so one cluster is started for the run, not one per worker.
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if _uses_ceph(item):
            item.add_marker(pytest.mark.xdist_group("ceph"))


@pytest.fixture
def scratch_leftover():
    """``scratch_leftover(where, name, owner)``: a scratch directory made by hand in ``where``, holding 64 KiB
    and ``owner`` (a ``ProcessOwner``) as its owner record, or no record when None."""
    from ckptbench.storage.local_target import SCRATCH_OWNER, SCRATCH_PREFIX

    def make(where: Path, name: str, recorded) -> Path:
        path = where / f"{SCRATCH_PREFIX}{name}"
        path.mkdir(mode=0o700)
        (path / "shard-00000.bin").write_bytes(b"s" * 65536)
        if recorded is not None:
            (path / SCRATCH_OWNER).write_bytes(recorded.encode())
        return path

    return make
