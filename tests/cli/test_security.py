"""Security: system directories refused without ``--force``; private scratch directories; credentials
never printed, logged or written (canary secrets); no shell anywhere in the package or the engine.

Known bugs are ``xfail(strict=True)`` with the reason.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import stat
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ckptbench.cli.render import SECRET_OPTIONS, redacted_argv
from ckptbench.errors import CkptbenchError, TargetError, UsageError
from ckptbench.storage import local_target, resolve_target
from ckptbench.storage.local_target import LocalDirectory

REPO = Path(__file__).resolve().parents[2]
BENCH_TINY = ["--size", "1MiB", "--files", "1", "--threads", "1", "--block-size", "1MiB", "--repeat", "1",
              "--warmup", "0", "--no-read"]
PREFLIGHT_TINY = ["--measure-size", "24MiB", "--measure-time", "0", "--repeat", "1", "--params", "100M", "--ranks", "1", "--mtbf", "1d"]
TINY = {"bench": BENCH_TINY, "preflight": PREFLIGHT_TINY}


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout[-300:], result.stderr)
    lines = result.stderr.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


# -- system directories --------------------------------------------------------------------------------------


def _scratch_dirs(directory: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if n.startswith(local_target.SCRATCH_PREFIX))
    except OSError:
        return []


SYSTEM_TARGETS = ["/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/sbin", "/sys", "/usr", "/var",
                  "//", "/etc/", "/usr/../etc", "/./usr", "file:///", "file:///etc"]


@pytest.mark.parametrize("target", SYSTEM_TARGETS)
@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_system_directories_are_refused_without_force(cli, command: str, target: str) -> None:
    path = target.removeprefix("file://")
    if not os.path.isdir(path):
        pytest.skip(f"{path} does not exist here")
    before = _scratch_dirs(path)
    line = _one_error_line(cli(command, target, *TINY[command]))
    assert "system directory" in line and "--force" in line
    assert _scratch_dirs(path) == before


@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_a_symlink_to_root_is_refused_too(cli, tmp_path: Path, command: str) -> None:
    link = tmp_path / "innocent-looking"
    link.symlink_to("/")
    line = _one_error_line(cli(command, str(link), *TINY[command]))
    assert "resolves to /)" in line and "--force" in line


@pytest.mark.parametrize("path", ["/tmp", "/var/tmp", "/mnt", "/home"])
def test_temporary_and_ordinary_directories_are_not_system_directories(path: str) -> None:
    assert path not in local_target.SYSTEM_DIRECTORIES
    if os.path.isdir(path) and os.access(path, os.W_OK):
        assert LocalDirectory.from_string(path).path == Path(path).resolve()  # checks only, writes nothing


def test_resolve_target_passes_force_through() -> None:
    with pytest.raises(TargetError, match="--force"):
        resolve_target("/")
    with pytest.raises(TargetError, match="--force"):
        resolve_target("file:///usr")
    assert resolve_target("/", force=True).path == Path("/")  # validation only: nothing is written


@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_force_lets_a_system_directory_through(cli, tmp_path: Path, monkeypatch, command: str) -> None:
    """A stand-in system directory (a real one would be written to): refused, then measured with --force."""
    target = tmp_path / "pretend-usr"
    target.mkdir()
    monkeypatch.setattr(local_target, "SYSTEM_DIRECTORIES", local_target.SYSTEM_DIRECTORIES | {str(target)})
    assert "--force" in _one_error_line(cli(command, str(target), *TINY[command]))
    result = cli(command, str(target), *TINY[command], "--force", "--json")
    assert result.exit_code in ((0,) if command == "bench" else (0, 1)), result.stderr  # preflight: a verdict
    assert json.loads(result.stdout)["target"] == str(target)
    assert list(target.iterdir()) == []  # its scratch directory removed


@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_force_does_not_skip_the_other_checks(cli, command: str) -> None:
    """/proc with --force: no scratch directory can be made there; one line, exit 2, not a traceback."""
    line = _one_error_line(cli(command, "/proc", *TINY[command], "--force"))
    assert "/proc" in line


@pytest.mark.parametrize("command, args", [
    ("compare", ["--size", "1MiB", "--repeat", "1", "--warmup", "0", "--mtbf", "1d"]),
    ("recommend", ["--size", "1MiB"]),
])
@pytest.mark.parametrize("kind", ["system", "shared"])
def test_a_refusal_names_no_option_the_command_lacks(cli, tmp_path: Path, monkeypatch, command: str,
                                                     args: list[str], kind: str) -> None:
    """compare and recommend have no --force: their refusal of a system or shared directory says what to do
    instead of naming a flag they would reject."""
    target = tmp_path / "target"
    target.mkdir()
    if kind == "system":
        monkeypatch.setattr(local_target, "SYSTEM_DIRECTORIES", local_target.SYSTEM_DIRECTORIES | {str(target)})
    else:
        target.chmod(0o777)
    target_args = ["--target", str(target)] if command == "recommend" else [str(target)]
    line = _one_error_line(cli(command, *target_args, *args))
    assert ("system directory" if kind == "system" else "sticky bit") in line
    assert "--force" not in line
    assert "--force" not in cli(command, "--help").stdout
    assert list(target.iterdir()) == []


# -- scratch directories -------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_scratch_directories_are_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        with LocalDirectory(tmp_path).scratch() as scratch:
            assert stat.S_IMODE(scratch.stat().st_mode) == 0o700
            real = Path(os.path.realpath(scratch))  # the path goes through the descriptor held open
            assert real.parent == tmp_path and real.name.startswith(local_target.SCRATCH_PREFIX)
    finally:
        os.umask(old)
    assert list(tmp_path.iterdir()) == []


def test_a_scratch_directory_is_listed_as_in_use_until_it_is_removed(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), LocalDirectory(tmp_path).scratch() as scratch:
        real = os.path.realpath(scratch)
        assert local_target.SCRATCH_IN_USE[-1] == real  # what a second Ctrl-C names as left behind: its real path
        raise RuntimeError("the run fails")
    assert real not in local_target.SCRATCH_IN_USE and not os.path.exists(real)


@pytest.mark.parametrize("workload", ["fs", "checkpoint"])
def test_benchmarks_write_inside_a_private_scratch_directory(cli, tmp_path: Path, monkeypatch, workload: str) -> None:
    modes: list[int] = []
    original = LocalDirectory.scratch

    @contextmanager
    def watched(self: LocalDirectory) -> Iterator[Path]:
        with original(self) as scratch:
            modes.append(stat.S_IMODE(scratch.stat().st_mode))
            yield scratch

    monkeypatch.setattr(LocalDirectory, "scratch", watched)
    old = os.umask(0)  # the loosest umask: the mode must not depend on it
    try:
        args = BENCH_TINY if workload == "fs" else ["--workload", "checkpoint", "--size", "1MiB", "--repeat", "1",
                                                    "--warmup", "0"]
        result = cli("bench", str(tmp_path), *args)
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.stderr
    assert modes and set(modes) == {0o700}
    assert list(tmp_path.iterdir()) == []


# -- credentials ---------------------------------------------------------------------------------------------

CANARY_KEY = "AKIACANARYKEY7Q3Z9XW1"
CANARY_SECRET = "CANARYsecret/wJalrXUtnFEMI+K7MDENGbPxRfiCY"
CANARY_TOKEN = "CANARYtokenFwoGZXIvYXdzEJr//////////wEaDO"
UNREACHABLE = ["--endpoint-url", "http://127.0.0.1:9", "--storage-option", "max_attempts=1"]


def _credentials(*, token: bool = False) -> list[str]:
    pairs = [f"key={CANARY_KEY}", f"secret={CANARY_SECRET}"] + ([f"token={CANARY_TOKEN}"] if token else [])
    return [arg for pair in pairs for arg in ("--storage-option", pair)]


def _ckptbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real console entry point, so logging is configured exactly as for a user (-v -v: DEBUG)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _everything_written(root: Path) -> str:
    """The bytes of every file under ``root``, as text (binary files included, decoded leniently)."""
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("args", [
    ["bench", "s3://bucket/x", "--size", "1MiB"],
    ["bench", "s3://bucket/x", "--workload", "checkpoint", "--size", "1MiB"],
    ["preflight", "s3://bucket/x", "--measure-size", "24MiB"],
], ids=["bench-objects", "bench-checkpoint", "preflight"])
def test_canary_secret_is_never_printed_logged_or_written(tmp_path: Path, args: list[str]) -> None:
    """An unreachable endpoint, the most verbose logging, an --output directory: the secret appears nowhere."""
    proc = _ckptbench("-v", "-v", *args, *UNREACHABLE, *_credentials(), "--output", str(tmp_path / "out"),
                      cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot reach the S3 endpoint" in proc.stderr
    assert "DEBUG" in proc.stderr  # the logging really was verbose
    for text in (proc.stdout, proc.stderr, _everything_written(tmp_path)):
        assert CANARY_SECRET not in text


def test_canary_key_id_and_session_token_are_never_logged(tmp_path: Path) -> None:
    proc = _ckptbench("-v", "-v", "bench", "s3://bucket/x", "--size", "1MiB", *UNREACHABLE, *_credentials(token=True),
                      cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert CANARY_SECRET not in proc.stderr
    assert CANARY_TOKEN not in proc.stderr
    assert CANARY_KEY not in proc.stderr


def test_canary_credentials_stay_out_of_a_complete_run(tmp_path: Path) -> None:
    """A run that succeeds (memory:// needs no server): JSON on stdout, result file, plot, DEBUG logs."""
    out = tmp_path / "out"
    proc = _ckptbench("-v", "-v", "bench", "memory://ckptbench-canary/run", "--workload", "checkpoint",
                      "--size", "1MiB", "--repeat", "1", "--warmup", "0", *_credentials(token=True),
                      "--output", str(out), "--json", "--plot", str(tmp_path / "shootout.png"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result_file,) = out.glob("bench-checkpoint-*.json")
    document = json.loads(result_file.read_text())
    assert {"secret=***", "key=***", "token=***"} <= set(document["argv"])
    assert (tmp_path / "shootout.png").stat().st_size > 0
    for text in (proc.stdout, proc.stderr, _everything_written(tmp_path)):
        for canary in (CANARY_KEY, CANARY_SECRET, CANARY_TOKEN):
            assert canary not in text


def test_result_files_carry_the_command_line_redacted(cli, tmp_path: Path, monkeypatch) -> None:
    """The result file's argv comes from sys.argv: every spelling of a credential option is masked there."""
    argv = ["ckptbench", "bench", str(tmp_path / "t"), "--storage-option", f"secret={CANARY_SECRET}",
            f"--storage-option=key={CANARY_KEY}", "--storage-option", f" Token ={CANARY_TOKEN}",
            "--storage-option", f"AWS_SECRET_ACCESS_KEY={CANARY_SECRET}", "--storage-option", "part_size=8MiB"]
    monkeypatch.setattr(sys, "argv", argv)
    (tmp_path / "t").mkdir()
    result = cli("bench", str(tmp_path / "t"), *BENCH_TINY, "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    (saved,) = (tmp_path / "out").iterdir()
    text = saved.read_text()
    for canary in (CANARY_KEY, CANARY_SECRET, CANARY_TOKEN):
        assert canary not in text
    assert "part_size=8MiB" in json.loads(text)["argv"]  # only credentials are masked


@pytest.mark.parametrize("option", sorted(SECRET_OPTIONS))
def test_every_credential_option_is_masked(option: str) -> None:
    for spelled in (option, option.upper(), f" {option} "):
        masked = redacted_argv(["--storage-option", f"{spelled}={CANARY_SECRET}",
                                f"--storage-option={spelled}={CANARY_SECRET}"])
        assert CANARY_SECRET not in " ".join(masked)


def test_library_save_keeps_the_secret_out_of_errors_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    import ckptbench

    caplog.set_level(logging.DEBUG)
    options = {"endpoint_url": "http://127.0.0.1:9", "key": CANARY_KEY, "secret": CANARY_SECRET,
               "token": CANARY_TOKEN, "max_attempts": 1}
    with pytest.raises(CkptbenchError) as info:
        ckptbench.save({"w": torch.zeros(4)}, "s3://bucket/ckpt", storage_options=options)
    shown = "".join(traceback.format_exception(info.value)) + repr(info.value)
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.args!r}" for r in caplog.records)
    assert caplog.records  # DEBUG really was captured
    for text in (shown, logged):
        assert CANARY_SECRET not in text  # from any logger, botocore's included
    own = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("ckptbench"))
    for canary in (CANARY_KEY, CANARY_TOKEN):
        assert canary not in shown and canary not in own  # ckptbench's own records never name a credential


def test_store_options_and_descriptions_hide_credentials() -> None:
    from ckptbench.storage.object_target import ObjectTarget
    from ckptbench.storage.s3 import S3Options

    options = {"endpoint_url": "http://127.0.0.1:9", "key": CANARY_KEY, "secret": CANARY_SECRET, "token": CANARY_TOKEN}
    assert not any(c in repr(S3Options.from_mapping(options)) for c in (CANARY_KEY, CANARY_SECRET, CANARY_TOKEN))
    target = ObjectTarget("s3://bucket/x", options)  # no request is made until prepare()
    described = json.dumps(target.describe()) + str(target) + repr(target.store)
    assert not any(c in described for c in (CANARY_KEY, CANARY_SECRET, CANARY_TOKEN))


@pytest.mark.parametrize("pair", [f"={CANARY_SECRET}", "secret", " secret "])
def test_a_malformed_storage_option_does_not_echo_a_credential(cli, pair: str) -> None:
    line = _one_error_line(cli("bench", "s3://bucket/x", "--storage-option", pair))
    assert CANARY_SECRET not in line


def test_a_mistyped_credential_option_is_not_echoed(cli) -> None:
    line = _one_error_line(cli("bench", "s3://bucket/x", "--storage-option", f"secret:{CANARY_SECRET}"))
    assert CANARY_SECRET not in line


@pytest.mark.parametrize("secret", [
    CANARY_SECRET.replace("/", "").replace("+", ""),
    pytest.param(CANARY_SECRET),
], ids=["plain-secret", "secret-with-slash"])
def test_credentials_inside_the_url_are_refused_without_echo(cli, secret: str) -> None:
    line = _one_error_line(cli("bench", f"s3://{CANARY_KEY}:{secret}@bucket/x", *UNREACHABLE))
    assert secret.split("/")[0] not in line and CANARY_KEY not in line


def test_credentials_inside_the_endpoint_url_are_not_echoed(cli) -> None:
    result = cli("bench", "s3://bucket/x", "--endpoint-url", f"http://user:{CANARY_SECRET}@127.0.0.1:9",
                 "--storage-option", "max_attempts=1", *_credentials())
    assert CANARY_SECRET not in result.stderr + result.stdout


def test_usage_errors_about_credentials_name_no_value() -> None:
    from ckptbench.storage.s3 import S3Options

    with pytest.raises(UsageError) as info:
        S3Options.from_mapping({"key": CANARY_KEY})  # a key without a secret
    with pytest.raises(UsageError) as other:
        S3Options.from_mapping({"secrett": CANARY_SECRET})  # a misspelt name
    assert CANARY_KEY not in str(info.value) and CANARY_SECRET not in str(other.value)


# -- no shell ------------------------------------------------------------------------------------------------

#: calls that run a command line through /bin/sh
SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput"),
               ("asyncio", "create_subprocess_shell"), ("commands", "getoutput"), ("pty", "spawn")}
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output"}


def shell_uses(source: str, filename: str = "<source>") -> list[str]:
    """Every place in ``source`` that starts a shell or passes a command as one string."""
    found = []
    imported_names: dict[str, tuple[str, str]] = {}  # `from os import system as s` -> s: (os, system)
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported_names[alias.asname or alias.name] = (node.module, alias.name)
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            qualified = (func.value.id, func.attr)
        elif isinstance(func, ast.Name) and func.id in imported_names:
            qualified = imported_names[func.id]
        else:
            qualified = ("", getattr(func, "attr", getattr(func, "id", "")))
        where = f"{filename}:{node.lineno}"
        if qualified in SHELL_CALLS:
            found.append(f"{where}: {'.'.join(qualified)}()")
        for keyword in node.keywords:
            never = isinstance(keyword.value, ast.Constant) and keyword.value.value is False
            if keyword.arg == "shell" and not never:
                found.append(f"{where}: shell={ast.unparse(keyword.value)}")
        if qualified[0] == "subprocess" and qualified[1] in SUBPROCESS_CALLS and node.args:
            command = node.args[0]
            if isinstance(command, (ast.JoinedStr, ast.BinOp)) or (
                    isinstance(command, ast.Constant) and isinstance(command.value, str)):
                found.append(f"{where}: subprocess.{qualified[1]} with a command string, not an argument list")
    return found


def test_the_shell_detector_detects() -> None:
    sample = ("import os, subprocess\nfrom os import system as run_it\nos.system('ls')\nos.popen('ls')\n"
              "subprocess.run('ls ' + x, shell=True)\nsubprocess.check_output(f'ls {x}')\nrun_it('x')\n"
              "subprocess.run(['ls', x], shell=False)\n")
    assert len(shell_uses(sample)) == 6


def test_no_shell_invocation_in_the_package() -> None:
    sources = sorted((REPO / "ckptbench").rglob("*.py"))
    assert len(sources) > 20
    found = [use for path in sources for use in shell_uses(path.read_text(), str(path.relative_to(REPO)))]
    assert found == []


def test_no_shell_invocation_in_the_engine() -> None:
    pattern = re.compile(r"\b(system|popen|execl|execlp|execle|execv|execvp|execvpe|posix_spawnp?)\s*\(")
    sources = [p for p in sorted((REPO / "csrc").rglob("*")) if p.suffix in (".cpp", ".cc", ".h", ".hpp", ".cu")]
    assert sources
    found = [f"{p.name}:{n}: {line.strip()}" for p in sources
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line) and not line.lstrip().startswith("//")]
    assert found == []
