"""Helpers of the trust-boundary tests: a second, unprivileged user, and the victim's files to watch.

The tests run as root (``.ci/run`` does): the attacker is ``nobody``, whose actions run through
``setpriv`` (uid, gid and groups dropped, no capabilities); the victim is this process, running
ckptbench as root, the account with the most to lose. Not root: the tests that need the second user
skip, saying so.
"""

from __future__ import annotations

import hashlib
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

#: Every attack and every victim command is bounded by this: a hang fails the test, not the run.
TIMEOUT_S = 120


def attacker_ids() -> tuple[int, int] | None:
    import pwd

    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return user.pw_uid, user.pw_gid


def setpriv_path() -> str | None:
    return shutil.which("setpriv")


@dataclass
class Attacker:
    """Runs Python as another, unprivileged user (``nobody``)."""

    uid: int
    gid: int

    def run(self, code: str, *args: str, check: bool = True, timeout: float = TIMEOUT_S) -> str:
        """Run ``code`` (``sys.argv[1:]`` = ``args``) as the attacker; its stdout."""
        cmd = [setpriv_path(), f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
               "--inh-caps=-all", "--", sys.executable, "-I", "-c", textwrap.dedent(code), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")
        if check:
            assert done.returncode == 0, f"the attacker's step failed: {done.stderr[-2000:]}"
        return done.stdout

    def start(self, code: str, *args: str) -> subprocess.Popen:
        """Start ``code`` as the attacker in the background (it races the victim)."""
        cmd = [setpriv_path(), f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
               "--inh-caps=-all", "--", sys.executable, "-I", "-c", textwrap.dedent(code), *args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")


@dataclass
class Arena:
    """``root``: a directory everyone can traverse; ``shared``: one everyone can write, without the
    sticky bit (the attack surface); ``victim``: root's files outside it, which must stay as they are."""

    root: Path
    shared: Path
    victim: Path

    def snapshot(self) -> dict[str, tuple]:
        """Every entry under ``victim``: kind, mode, owner, size, content hash, mtime."""
        out: dict[str, tuple] = {}
        for path in sorted(self.victim.rglob("*")):
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
            out[str(path.relative_to(self.victim))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                                       st.st_uid, st.st_size, digest, st.st_mtime_ns)
        return out


def make_arena() -> Arena:
    """Made under /tmp (pytest's own tmp_path is private to root: the attacker could not reach it)."""
    root = Path(tempfile.mkdtemp(prefix="ckptbench-security-", dir="/tmp"))
    root.chmod(0o755)
    shared, victim = root / "shared", root / "victim"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may rename or replace what others made there
    victim.mkdir()
    (victim / "important.conf").write_text("root's configuration: must never change\n")
    secret = victim / "secret.key"
    secret.write_bytes(b"ROOT-ONLY-SECRET-" * 64)
    secret.chmod(0o600)
    (victim / "shard-00000.bin").write_bytes(b"the victim's own file of that name\n")
    return Arena(root, shared, victim)


def ckptbench_cli(*args: str, timeout: float = TIMEOUT_S, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real command line (a fresh interpreter, as a user runs it), as this process's user."""
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or "/")


def python(code: str, *args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter as this process's user (a library call that might hang stays bounded)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def one_error_line(done: subprocess.CompletedProcess, exit_code: int = 2) -> str:
    """The single ``ckptbench: error:`` line of a refused command (exit 2 for bad input), no traceback."""
    assert done.returncode == exit_code, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    lines = done.stderr.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: "), done.stderr[-2000:]
    return lines[0]
