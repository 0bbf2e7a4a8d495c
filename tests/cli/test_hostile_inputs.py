"""Hostile input to every command: each option x a table of values a careless or malicious user may
type (huge, non-finite, negative, zero, look-alike unicode, control characters, empty), and hostile
targets (spaces, symlinks, read-only, system pseudo-filesystems).

A bad value always ends the same way: exit 2, exactly one line on stderr starting
``ckptbench: error:``, no traceback, nothing on stdout, and nothing written anywhere: the test runs
in a sandbox (working directory, TMPDIR and target inside tmp_path) and compares it before and after.
Where a hostile value is a valid one (``--warmup 0``), the command must succeed instead.

``compare`` is covered by its own tests. Known bugs are ``xfail(strict=True)`` with the reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptbench.cli import COMMANDS, LazyGroup, config_defaults, main
from ckptbench.config import MAX_BLOCK_BYTES, MAX_RUNS, MAX_THREADS, FsBenchSpec
from ckptbench.errors import ConfigError, UsageError

# -- the values --------------------------------------------------------------------------------------------

HUGE = ["1e400", "99999999999999999999PiB", "99999999999999999999"]
NOT_FINITE = ["nan", "inf", "-inf"]
SIGN = ["-1", "0"]
UNICODE = ["１０GiB",  # fullwidth digits
           "10 ГиБ",  # Cyrillic look-alike unit
           "\u200f10GiB",  # right-to-left mark
           "10\x00GiB"]  # NUL byte (reachable through a --config TOML string)
BLANK = ["", " ", "\t"]
HOSTILE = HUGE + NOT_FINITE + SIGN + UNICODE + BLANK
#: strings for name-like options (presets, choices): also a name longer than a file name may be
HOSTILE_NAMES = ["", " ", "x" * 300, "../models/llama3-8b", "/etc/passwd", "llama3\x00", "\u200fllama3", "a\nb"]
#: values of options naming a file to write: the working directory, a NUL, a name too long, a newline,
#: a pseudo-filesystem, a directory that does not exist
HOSTILE_OUTPUT_PATHS = ["", "x\x00.png", "x" * 300 + ".png", "/proc/ckptbench.png", "/", "missing/x.png"]

MiB1 = ["--size", "1MiB"]
BENCH_FS = ["--files", "1", "--threads", "1", "--block-size", "1MiB", "--repeat", "1", "--warmup", "0", "--no-read",
            "--json", *MiB1]
BENCH_CKPT = ["--workload", "checkpoint", "--repeat", "1", "--warmup", "0", "--json", *MiB1]
BENCH_S3 = ["s3://bucket/x", "--endpoint-url", "http://127.0.0.1:9", "--storage-option", "max_attempts=1",
            "--repeat", "1", "--warmup", "0", *MiB1]
PREFLIGHT = ["--measure-size", "24MiB", "--measure-time", "0", "--repeat", "1", "--params", "100M", "--ranks", "1", "--mtbf", "1d",
             "--max-ckpt-time", "60s", "--json"]
INTERVAL = ["--ckpt-time", "140s", "--mtbf", "3h", "--json"]
INTERVAL_BYTES = ["--bandwidth", "1GB/s", "--mtbf", "3h", "--json"]
INTERVAL_ASYNC = ["--stall", "1s", "--persist", "60s", "--mtbf", "3h", "--json"]
INTERVAL_SIM = [*INTERVAL, "--simulate", "20", "--work", "1d"]
GOODPUT = ["--params", "100B", "--tokens", "20T", "--gpus", "4000", "--peak-tflops", "989", "--mfu", "0.35",
           "--faults-per-day", "1", "--detect", "60m", "--replace", "60m", "--resume", "30m", "--json"]
RECOMMEND = ["--target", "{target}", *MiB1, "--json"]


def _drop(args: list[str], *flags: str) -> list[str]:
    """``args`` without ``flag VALUE`` pairs (so the option under test is the only one of its kind)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


#: (command, option, base arguments with TARGET standing for the sandbox's target directory)
NUMERIC_OPTIONS: list[tuple[str, str, list[str]]] = [
    *[("bench", o, ["{target}", *BENCH_FS]) for o in ("--size", "--files", "--threads", "--block-size", "--repeat",
                                                      "--warmup")],
    ("bench", "--file-size", ["{target}", *_drop(BENCH_FS, "--files")]),
    ("bench", "--scale", ["{target}", *_drop(BENCH_CKPT, "--size")]),
    ("bench", "--threads", ["{target}", *BENCH_CKPT]),
    *[("bench", o, BENCH_S3) for o in ("--object-size", "--concurrency", "--part-size")],
    *[("preflight", o, ["{target}", *PREFLIGHT]) for o in (
        "--ranks", "--gpus-per-node", "--tp", "--pp", "--interval", "--restart", "--max-overhead", "--max-ckpt-time",
        "--retain", "--aggregate-bandwidth", "--interference", "--gpu-hour-usd", "--measure-size", "--measure-time", "--repeat",
        "--mtbf", "--params")],
    *[("preflight", o, ["{target}", *_drop(PREFLIGHT, "--mtbf")]) for o in ("--faults-per-day", "--node-mtbf")],
    *[("interval", o, INTERVAL) for o in ("--ckpt-time", "--mtbf", "--restart", "--every")],
    *[("interval", o, INTERVAL_SIM) for o in ("--simulate", "--work", "--weibull-shape", "--seed")],
    *[("interval", o, [*INTERVAL_BYTES, "--size", "140GB"]) for o in ("--bandwidth",)],
    ("interval", "--size", INTERVAL_BYTES),
    ("interval", "--params", INTERVAL_BYTES),
    *[("interval", o, [*INTERVAL_BYTES, "--params", "8B"]) for o in ("--dp", "--tp", "--pp")],
    *[("interval", o, INTERVAL_ASYNC) for o in ("--stall", "--persist", "--interference")],
    ("interval", "--gpus", ["--ckpt-time", "140s", "--gpu-mtbf", "50000h"]),
    ("interval", "--gpu-mtbf", ["--ckpt-time", "140s", "--gpus", "1000"]),
    ("interval", "--nodes", ["--ckpt-time", "140s", "--node-mtbf", "5000h"]),
    ("interval", "--node-mtbf", ["--ckpt-time", "140s", "--nodes", "100"]),
    ("interval", "--faults-per-day", ["--ckpt-time", "140s"]),
    *[("goodput", o, GOODPUT) for o in (
        "--params", "--tokens", "--gpus", "--peak-tflops", "--mfu", "--gpus-per-node", "--node-hour-cost",
        "--gpu-hour-cost", "--detect", "--replace", "--resume", "--hot-spares", "--faults-per-day")],
    ("goodput", "--mtbf", _drop(GOODPUT, "--faults-per-day")),
    *[("goodput", o, [*GOODPUT, "--ckpt-interval", "30m", "--ckpt-time", "140s"]) for o in (
        "--ckpt-interval", "--ckpt-time")],
    *[("goodput", o, [*GOODPUT, "--ckpt-interval", "30m", "--stall", "1s", "--persist", "60s"]) for o in (
        "--stall", "--persist", "--interference")],
    *[("recommend", o, RECOMMEND) for o in ("--size",)],
    *[("recommend", o, ["results/bench-vm-20261126T042848.json", "--json", "--ckpt-size", "140GB", "--mtbf", "3h"])
      for o in ("--ckpt-size", "--mtbf", "--restart")],
]
NAME_OPTIONS: list[tuple[str, str, list[str]]] = [
    ("bench", "--model", ["{target}", *BENCH_CKPT]),
    ("bench", "--writers", ["{target}", *BENCH_CKPT]),
    ("bench", "--workload", ["{target}", *BENCH_FS]),
    ("bench", "--schedule", ["{target}", *BENCH_FS]),
    ("bench", "--endpoint-url", _drop(BENCH_S3, "--endpoint-url")),
    ("bench", "--storage-option", BENCH_S3),
    ("preflight", "--model", ["{target}", *_drop(PREFLIGHT, "--params")]),
    ("preflight", "--failures", ["{target}", *_drop(PREFLIGHT, "--mtbf")]),
    ("preflight", "--dtype", ["{target}", *PREFLIGHT]),
    ("preflight", "--sharding", ["{target}", *PREFLIGHT]),
    ("interval", "--model", INTERVAL_BYTES),
    ("interval", "--failures", ["--ckpt-time", "140s", "--json"]),
    ("interval", "--dtype", [*INTERVAL_BYTES, "--params", "8B"]),
    ("goodput", "--model", _drop(GOODPUT, "--params")),
    ("goodput", "--failures", _drop(GOODPUT, "--faults-per-day")),
]
OUTPUT_OPTIONS: list[tuple[str, str, list[str]]] = [
    ("bench", "--plot", ["{target}", *BENCH_FS]),
    ("bench", "--output", ["{target}", *BENCH_FS]),
    ("preflight", "--plot", ["{target}", *PREFLIGHT]),
    ("interval", "--plot", INTERVAL),
    ("report", "--html", ["results/bench-vm-20261126T042848.json"]),
    ("report", "--markdown", ["results/bench-vm-20261126T042848.json"]),
]

#: huge but finite: the command may take it (1e20 GPUs, $1e20 an hour) or refuse it, in one line and at once;
#: never a traceback, never a run that does not end
HUGE_FINITE = {"99999999999999999999PiB", "99999999999999999999"}
#: options where zero is a valid value: the command must succeed
ZERO_IS_VALID = {("bench", "--warmup"), ("preflight", "--interference"), ("preflight", "--measure-time"), ("interval", "--seed"),
                 ("interval", "--interference"), ("interval", "--restart"), ("goodput", "--hot-spares"),
                 ("goodput", "--interference"), ("goodput", "--detect"), ("goodput", "--replace"),
                 ("goodput", "--resume")}
#: (command, option, value) that asks for a file to be written where it is valid: "" is the working directory
WRITES = {("bench", "--output", ""), ("bench", "--output", "missing/x.png")}


def _bug(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=reason)


#: (command, option, value) -> xfail(strict=True) mark naming a known bug; empty while none is known
KNOWN_BUGS: dict[tuple[str, str, str], pytest.MarkDecorator] = {}


#: known bugs where the run never ends: interrupted after a few seconds
ENDLESS = {k for k, mark in KNOWN_BUGS.items() if "never ends" in mark.kwargs["reason"]}


def _table(options: list[tuple[str, str, list[str]]], values: list[str]) -> list[Any]:
    cases = []
    for command, option, base in options:
        for value in values:
            if option == "--output" and value == "/":
                continue  # a valid request to write into /: not something a test may do
            key = (command, option, value)
            marks = [KNOWN_BUGS[key]] if key in KNOWN_BUGS else []
            label = command + ("-checkpoint" if "checkpoint" in base else "-s3" if BENCH_S3[0] in base else "")
            cases.append(pytest.param(command, option, value, base, marks=marks, id=f"{label}{option}={value!r}"))
    return cases


# -- the sandbox --------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
SYSTEM_DIRS = ["/", "/etc", "/usr", "/proc"]


@dataclass
class Sandbox:
    """A working directory, TMPDIR and target directory, all inside tmp_path, watched for writes."""

    root: Path
    target: Path
    baseline: dict[str, int] | None = None

    def rebase(self) -> None:
        """Accept what is there now (files a test made itself, or asked a command to write)."""
        self.baseline = self.snapshot()

    def snapshot(self) -> dict[str, int]:
        found = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                found[os.path.relpath(path, self.root)] = os.lstat(path).st_size
        return found


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    cwd, tmp, target = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "target"
    for d in (cwd, tmp, target):
        d.mkdir()
    (cwd / "results").symlink_to(REPO / "results")  # reference result files, read-only use
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    box = Sandbox(tmp_path, target)
    box.rebase()
    system_before = {d: _scratch_dirs(d) for d in SYSTEM_DIRS}
    yield box
    assert box.snapshot() == box.baseline, "files appeared (or changed size) in the sandbox"
    assert {d: _scratch_dirs(d) for d in SYSTEM_DIRS} == system_before


def _scratch_dirs(directory: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if n.startswith(".ckptbench-scratch-"))
    except OSError:
        return []


def invoke(*args: str, within_s: float = 20) -> Result:
    """``ckptbench ARGS`` in-process. A command still running after ``within_s`` gets Ctrl-C (exit 130,
    scratch removed), so a value that makes a run endless fails the test instead of hanging it."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, within_s)
    try:
        return CliRunner().invoke(main, list(args), catch_exceptions=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _no_traceback(result: Result) -> None:
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        shown = "".join(traceback.format_exception(result.exception))
        pytest.fail(f"uncaught {type(result.exception).__name__} (a traceback for the user):\n{shown}")
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout


def assert_refused(result: Result) -> None:
    """Exit 2, exactly one line on stderr naming the problem, nothing on stdout, no traceback."""
    _no_traceback(result)
    assert result.exit_code == 2, f"exit {result.exit_code}\nstdout: {result.stdout[-500:]}\nstderr: {result.stderr}"
    lines = result.stderr.rstrip("\n").split("\n")
    assert len(lines) == 1, f"{len(lines)} lines on stderr: {result.stderr!r}"
    assert lines[0].startswith("ckptbench: error: "), lines[0]
    assert result.stdout == ""


def _args(base: list[str], sandbox: Sandbox, *extra: str) -> list[str]:
    return [str(sandbox.target) if a == "{target}" else a for a in base] + list(extra)


def _run_case(sandbox: Sandbox, command: str, option: str, value: str, base: list[str]) -> None:
    key = (command, option, value)
    result = invoke(command, *_args(base, sandbox, option, value), within_s=3 if key in ENDLESS else 60)
    _no_traceback(result)
    if value == "0" and (command, option) in ZERO_IS_VALID or key in WRITES:
        assert result.exit_code == 0, result.stderr
        sandbox.rebase()
    elif value in HUGE_FINITE and result.exit_code != 2:
        # taken: a result, or preflight's verdict (1: FAIL), never an interrupted run (130)
        assert result.exit_code in ((0, 1) if command == "preflight" else (0,)), result.stderr
    else:
        assert_refused(result)


@pytest.mark.parametrize(("command", "option", "value", "base"), _table(NUMERIC_OPTIONS, HOSTILE))
def test_hostile_number(sandbox: Sandbox, command: str, option: str, value: str, base: list[str]) -> None:
    _run_case(sandbox, command, option, value, base)


@pytest.mark.parametrize(("command", "option", "value", "base"), _table(NAME_OPTIONS, HOSTILE_NAMES))
def test_hostile_name(sandbox: Sandbox, command: str, option: str, value: str, base: list[str]) -> None:
    _run_case(sandbox, command, option, value, base)


@pytest.mark.parametrize(("command", "option", "value", "base"), _table(OUTPUT_OPTIONS, HOSTILE_OUTPUT_PATHS))
def test_hostile_output_path(sandbox: Sandbox, command: str, option: str, value: str, base: list[str]) -> None:
    _run_case(sandbox, command, option, value, base)


@pytest.mark.parametrize("value", [
    "", "x\x00.json", "x" * 300,
    "a\nb.json",
    "/proc", "/", "missing.json", "/etc/passwd"])
@pytest.mark.parametrize("command", ["report", "recommend"])
def test_hostile_result_file_argument(sandbox: Sandbox, command: str, value: str) -> None:
    assert_refused(invoke(command, value))


@pytest.mark.parametrize("value", ["", "x\x00.toml", "x" * 300, "/", "/proc", "/etc/passwd", "missing.toml"])
def test_hostile_config_path(sandbox: Sandbox, value: str) -> None:
    assert_refused(invoke("--config", value, "interval", *INTERVAL))


@pytest.mark.parametrize("toml", [
    "[interval]\nmtbf = nan\n", "[interval]\nmtbf = inf\n", "[interval]\nckpt-time = -1\n",
    "[interval]\nckpt-time = 1e400\n", "[interval]\nckpt-time = true\n", "[interval]\nckpt-time = [1, 2]\n",
    "[interval]\nckpt-time = {a = 1}\n", '[interval]\nckpt-time = "1\\u0000s"\n', "[interval]\nsimulate = 1e30\n",
    "[bench]\nthreads = [0]\n", "[bench]\nthreads = []\n", "[bench]\nsize = 1e400\n", "[bench]\nsize = nan\n",
    "[goodput]\nmfu = nan\n", "[goodput]\ngpus = 1.5\n", "[goodput]\nhot-spares = -1\n",
    "[interval]\nplot = 3\n", "[interval]\nplot = [\"a.png\"]\n", "[bench]\noutput = {a = 1}\n",
    "[interval]\njson = 3\n", "[bench]\ndirect = [true]\n",
    "[interval]\njson = \"maybe\"\n",
])
def test_hostile_config_values(sandbox: Sandbox, toml: str) -> None:
    """A TOML file hands the parsers numbers, booleans, arrays and tables, not just strings."""
    config = sandbox.root / "cwd" / "c.toml"
    config.write_text(toml)
    sandbox.rebase()
    command = toml.split("]")[0].lstrip("[")
    base = {"interval": ["--ckpt-time", "140s", "--mtbf", "3h"] if "ckpt-time" not in toml and "mtbf" not in toml
            else (["--mtbf", "3h"] if "ckpt-time" in toml else ["--ckpt-time", "140s"]),
            "bench": [str(sandbox.target), "--repeat", "1", "--warmup", "0"], "goodput": GOODPUT}[command]
    if command == "goodput":
        key = toml.split("\n")[1].split(" =")[0]
        base = _drop(base, f"--{key}")
    assert_refused(invoke("--config", str(config), command, *base))


#: values a TOML file can hold, none of them a valid setting of any option that writes or reads a file
TOML_VALUES: list[Any] = [3, -1, 1.5, True, [1, 2], [], {"a": 1}, "", "x\x00"]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_setting_takes_any_toml_value_without_a_traceback(command: str) -> None:
    """Each setting of each command, given each kind of TOML value, the way ``--config`` hands it over
    (checked by ``config_defaults``, then converted by the parameter's type): refused as ConfigError or
    click's BadParameter (exit 2, one line) or taken, never an exception from inside a type (``plot = 3``
    once raised TypeError in click.Path, ``json = 3`` AttributeError in click's BOOL)."""
    cmd = LazyGroup().get_command(click.Context(main), command)
    assert cmd is not None and cmd.params
    for param in cmd.params:
        for value in TOML_VALUES:
            try:
                converted = config_defaults({command: {param.name: value}}, "c.toml")[command][param.name]
                param.process_value(click.Context(cmd), converted)
            except (ConfigError, click.UsageError):
                pass
            except Exception as exc:  # noqa: BLE001 - the failure this test is about
                pytest.fail(f"{command} {param.name} = {value!r}: {type(exc).__name__}: {exc}")


# -- bounds ---------------------------------------------------------------------------------------------------

#: (command, option, the largest value taken, the first refused, what the error names, base arguments)
BOUNDS = [
    *[(c, "--threads", "4096", "4097", f"{MAX_THREADS} threads", base) for c, base in (
        ("bench", ["{target}", *BENCH_FS]), ("bench", ["{target}", *BENCH_CKPT]), ("compare", ["{target}"]))],
    ("bench", "--block-size", "1TiB", str(MAX_BLOCK_BYTES + 1), "1 TiB", ["{target}", *BENCH_FS]),
    *[(c, o, "10000", "10001", f"{MAX_RUNS} runs", base) for c, base in (
        ("bench", ["{target}", *BENCH_FS]), ("preflight", ["{target}", *PREFLIGHT]), ("compare", ["{target}"]))
      for o in ("--repeat", "--warmup") if (c, o) != ("preflight", "--warmup")],
]


@pytest.mark.parametrize(("command", "option", "largest", "refused", "named", "base"), BOUNDS,
                         ids=[f"{b[0]}{b[1]}" for b in BOUNDS])
def test_counts_and_sizes_have_an_upper_bound_named_in_the_error(sandbox: Sandbox, command: str, option: str,
                                                                  largest: str, refused: str, named: str,
                                                                  base: list[str]) -> None:
    result = invoke(command, *_args(base, sandbox, option, refused))
    assert_refused(result)
    assert option in result.stderr and named in result.stderr
    param = next(p for p in LazyGroup().get_command(click.Context(main), command).params if p.opts == [option])
    taken = param.type.convert(largest, param, None)  # the bound itself is taken (not run here: 10000 runs)
    expected = MAX_BLOCK_BYTES if option == "--block-size" else int(largest)
    assert taken in (expected, [expected])  # a sweep option gives a list


@pytest.mark.parametrize("change", [{"threads": (MAX_THREADS + 1,)}, {"block_sizes": (2 * MAX_BLOCK_BYTES,)},
                                    {"repeat": MAX_RUNS + 1}, {"warmup": MAX_RUNS + 1}], ids=lambda c: next(iter(c)))
def test_library_specs_have_the_same_bounds_as_the_flags(change: dict[str, Any]) -> None:
    spec = {"size_bytes": 2**20, "files": 1, "threads": (MAX_THREADS,), "block_sizes": (MAX_BLOCK_BYTES,),
            "repeat": MAX_RUNS, "warmup": MAX_RUNS}
    FsBenchSpec(**spec)  # every bound itself is valid
    with pytest.raises(UsageError, match=str(MAX_RUNS) if "repeat" in change or "warmup" in change else
                       "1 TiB" if "block_sizes" in change else str(MAX_THREADS)):
        FsBenchSpec(**{**spec, **change})


def test_a_failed_run_removes_only_the_output_directories_it_made(sandbox: Sandbox) -> None:
    (Path("existing")).mkdir()
    (Path("existing") / "mine.json").write_text("{}")
    sandbox.rebase()
    assert_refused(invoke("bench", str(sandbox.target), *BENCH_FS, "--size", "1PiB", "--output",
                          "existing/new/deeper"))
    # the sandbox checks the rest: existing/ and its file kept, new/deeper gone


# -- hostile targets ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_a_target_with_spaces_and_unicode_works(sandbox: Sandbox, command: str) -> None:
    target = sandbox.target / "my checkpoints ‏ünï"
    target.mkdir()
    sandbox.rebase()
    args = [str(target), *BENCH_FS] if command == "bench" else [str(target), *PREFLIGHT]
    result = invoke(command, *args, within_s=60)
    _no_traceback(result)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["target"] == str(target)
    assert list(target.iterdir()) == []  # scratch removed


def _hostile_target(sandbox: Sandbox, kind: str) -> str:
    where = sandbox.target
    if kind == "symlink to a file":
        (sandbox.root / "plain.txt").write_text("x")
        (where / "link").symlink_to(sandbox.root / "plain.txt")
        return str(where / "link")
    if kind == "dangling symlink":
        (where / "link").symlink_to(sandbox.root / "gone")
        return str(where / "link")
    if kind == "symlink loop":
        (where / "a").symlink_to(where / "b")
        (where / "b").symlink_to(where / "a")
        return str(where / "a")
    if kind == "a file":
        (where / "plain.txt").write_text("x")
        return str(where / "plain.txt")
    return {"missing": str(where / "missing"), "a name too long": "/" + "x" * 300, "a NUL byte": f"{where}\x00x",
            "a newline": f"{where}\nx", "empty": "", "blank": "  ", "/dev/null": "/dev/null",
            "file:// to nowhere": "file:///nonexistent/x", "an unknown scheme": "nosuch://x/y",
            "s3 without a bucket": "s3://"}[kind]


HOSTILE_TARGETS = ["symlink to a file", "dangling symlink", "symlink loop", "a file", "missing", "a name too long",
                   "a NUL byte", "a newline", "empty", "blank", "/dev/null", "file:// to nowhere", "an unknown scheme",
                   "s3 without a bucket"]


@pytest.mark.parametrize("kind", HOSTILE_TARGETS)
@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_hostile_target_is_refused(sandbox: Sandbox, command: str, kind: str) -> None:
    target = _hostile_target(sandbox, kind)
    sandbox.rebase()
    assert_refused(invoke(command, target, *(BENCH_FS if command == "bench" else PREFLIGHT)))


def _read_only_dir(mount_fs) -> Path:
    """A directory inside a read-only tmpfs (mounted read-write, filled, then remounted read-only)."""
    where = mount_fs("tmpfs", "size=1m")
    (where / "inside").mkdir()
    remount = subprocess.run(["mount", "-o", "remount,ro", str(where)], capture_output=True, timeout=10)
    if remount.returncode != 0:
        pytest.skip(f"cannot remount tmpfs read-only: {remount.stderr.decode(errors='replace').strip()}")
    return where / "inside"


@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_target_inside_a_read_only_directory(mount_fs, sandbox: Sandbox, command: str) -> None:
    inside = _read_only_dir(mount_fs)
    sandbox.rebase()
    args = BENCH_FS if command == "bench" else PREFLIGHT
    result = invoke(command, str(inside), *args)
    assert_refused(result)
    assert "not writable" in result.stderr
    assert_refused(invoke(command, str(inside / "new"), *args))  # and a new directory there
    assert list(inside.iterdir()) == []


def test_output_inside_a_read_only_directory(mount_fs, sandbox: Sandbox) -> None:
    inside = _read_only_dir(mount_fs)
    sandbox.rebase()
    result = invoke("bench", str(sandbox.target), *BENCH_FS, "--output", str(inside / "results"))
    assert_refused(result)
    assert "--output" in result.stderr and list(inside.iterdir()) == []


def test_plot_inside_a_read_only_directory(mount_fs, sandbox: Sandbox) -> None:
    inside = _read_only_dir(mount_fs)
    sandbox.rebase()
    assert_refused(invoke("bench", str(sandbox.target), *BENCH_FS, "--plot", str(inside / "sweep.png")))


def test_a_failed_run_leaves_no_output_directory(sandbox: Sandbox) -> None:
    result = invoke("bench", str(sandbox.target), *BENCH_FS, "--size", "1PiB", "--output", "new/results")
    assert_refused(result)  # not enough free space: found during the run, after the file was opened
    leftover = Path("new").exists()
    sandbox.rebase()
    assert not leftover


# -- fuzzing the fast commands ------------------------------------------------------------------------------

FUZZ_VALUES = st.one_of(
    st.sampled_from(HOSTILE + ["140s", "3h", "1GB/s", "100B", "20T", "0.35", "35%", "1", "8", "4000", "1e-300",
                               "1e300", "50000h", "30m", "1.5", "1,000", "$90", "0x10", "1_000", "-0", "1e-9s"]),
    st.text(max_size=12),
)
INTERVAL_FLAGS = ["--ckpt-time", "--mtbf", "--restart", "--every", "--size", "--bandwidth", "--params", "--dp",
                  "--tp", "--pp", "--stall", "--persist", "--interference", "--gpus", "--gpu-mtbf", "--nodes",
                  "--node-mtbf", "--faults-per-day", "--failures", "--model", "--dtype", "--optimizer", "--sharding"]
GOODPUT_FLAGS = ["--params", "--tokens", "--gpus", "--peak-tflops", "--mfu", "--gpus-per-node", "--node-hour-cost",
                 "--gpu-hour-cost", "--detect", "--replace", "--resume", "--ckpt-interval", "--ckpt-time", "--stall",
                 "--persist", "--interference", "--hot-spares", "--mtbf", "--faults-per-day", "--failures",
                 "--model"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _fuzz_once(command: str, base: list[str], changes: dict[str, str]) -> None:
    args = _drop(base, *changes)
    for flag, value in changes.items():
        args += [flag, value]
    result = invoke(command, *args)
    _no_traceback(result)
    assert result.exit_code in (0, 2), (args, result.exit_code, result.stderr)
    if result.exit_code == 2:
        assert_refused(result)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(INTERVAL_FLAGS), FUZZ_VALUES, min_size=1, max_size=4))
def test_fuzz_interval(sandbox: Sandbox, changes: dict[str, str]) -> None:
    _fuzz_once("interval", INTERVAL, changes)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(GOODPUT_FLAGS), FUZZ_VALUES, min_size=1, max_size=4))
def test_fuzz_goodput(sandbox: Sandbox, changes: dict[str, str]) -> None:
    _fuzz_once("goodput", GOODPUT, changes)
