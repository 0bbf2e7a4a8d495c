"""Real storage servers for the storage tests: a single-node Ceph cluster on 127.0.0.1 (RGW for S3,
CephFS through ceph-fuse for the network-filesystem tier).

The ``ceph`` session fixture uses, in this order:
1. an already running server: ``CKPTBENCH_TEST_S3_ENDPOINT`` (+ ``AWS_ACCESS_KEY_ID`` /
   ``AWS_SECRET_ACCESS_KEY``; ``CKPTBENCH_TEST_CEPHFS`` for a mounted CephFS, else netfs tests skip);
2. a cluster it starts with ``tests/servers/ceph.sh`` (session scope, on free ports, stopped and
   removed at session end, Ctrl-C included) when the Ceph binaries are installed and we are root;
3. otherwise it skips, saying why. Binaries present but a failed start is a test failure, not a skip.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CEPH_SH = Path(__file__).resolve().parents[1] / "servers" / "ceph.sh"


# tests/servers is not a package: its proxy module is imported by name (``import faultproxy``) by the
# test modules here, once this conftest has put the directory on the path.
if str(CEPH_SH.parent) not in sys.path:
    sys.path.insert(0, str(CEPH_SH.parent))


@pytest.fixture
def fault_proxy(s3_server) -> Iterator[Any]:
    """tests/servers/faultproxy.py's proxy in front of the server (started, stopped after the test)."""
    import faultproxy

    with faultproxy.FaultProxy(s3_server.endpoint) as running:
        yield running
S3_BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph")
CEPHFS_BINARIES = ("ceph-mds", "ceph-fuse")
INSTALL = "apt-get install radosgw ceph-mon ceph-osd ceph-common ceph-mds ceph-fuse"


@dataclass(frozen=True)
class Ceph:
    """Where the test servers are. ``secret`` is a test credential; ``repr`` hides it anyway."""

    endpoint: str | None
    key: str | None
    secret: str | None = field(repr=False)
    cephfs: Path | None
    why_no_s3: str | None = None
    why_no_cephfs: str | None = None

    def options(self, **extra: Any) -> dict[str, Any]:
        """storage_options reaching this server with its credentials."""
        return {"endpoint_url": self.endpoint, "key": self.key, "secret": self.secret, **extra}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.key, aws_secret_access_key=self.secret)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _missing(names: tuple[str, ...]) -> list[str]:
    return [name for name in names if shutil.which(name) is None]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _kill_scratch_daemons(where: Path, mount: Path) -> None:
    """SIGKILL this cluster's daemons at once (their pid files), after unmounting CephFS. A clean
    shutdown (``ceph.sh stop``: one daemon after the other, ~2-3 s each) buys nothing for a cluster
    whose data is thrown away; ``ceph.sh stop`` then only tidies up."""
    if os.path.ismount(mount):
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)
    for pid_file in (where / "run").glob("*.pid"):
        try:
            pid = int(pid_file.read_text())
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if command.startswith((b"ceph-", b"radosgw")):  # the pid is still the daemon this cluster started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ceph]:
    endpoint = os.environ.get("CKPTBENCH_TEST_S3_ENDPOINT")
    if endpoint:
        cephfs = os.environ.get("CKPTBENCH_TEST_CEPHFS")
        yield Ceph(endpoint, os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY"),
                   Path(cephfs) if cephfs else None,
                   why_no_cephfs=None if cephfs else "CKPTBENCH_TEST_S3_ENDPOINT is set but CKPTBENCH_TEST_CEPHFS is not")
        return
    missing = _missing(S3_BINARIES)
    if missing or os.geteuid() != 0:
        why = (f"Ceph is not installed ({', '.join(missing)} missing; {INSTALL})" if missing
               else "starting Ceph needs root")
        why += " and CKPTBENCH_TEST_S3_ENDPOINT is not set"
        yield Ceph(None, None, None, None, why_no_s3=why, why_no_cephfs=why)
        return
    with_cephfs = not _missing(CEPHFS_BINARIES) and os.path.exists("/dev/fuse")
    where = tmp_path_factory.mktemp("ceph")
    mount = where / "cephfs"
    env = {**os.environ, "CEPH_MON_PORT": str(_free_port()), "CEPH_RGW_PORT": str(_free_port())}
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        _kill_scratch_daemons(where, mount)
        subprocess.run(["bash", str(CEPH_SH), "stop", str(where)], env=env, capture_output=True, timeout=120)
        if not os.path.ismount(mount):
            shutil.rmtree(where, ignore_errors=True)  # the OSD's sparse block file with it

    atexit.register(stop)  # in case the session ends without running finalizers
    cmd = ["bash", str(CEPH_SH), "start", str(where)] + (["--cephfs", str(mount)] if with_cephfs else [])
    try:
        started = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        stop()
        pytest.fail("tests/servers/ceph.sh start took more than 240 s")
    if started.returncode != 0:
        detail = f"{started.stderr[-2000:]}\n{_tail(where / 'log' / 'daemons.err')}"
        stop()
        pytest.fail(f"tests/servers/ceph.sh start failed (exit {started.returncode}):\n{detail}")
    values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    try:
        yield Ceph(values["CKPTBENCH_TEST_S3_ENDPOINT"], values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"],
                   Path(values["CKPTBENCH_TEST_CEPHFS"]) if "CKPTBENCH_TEST_CEPHFS" in values else None,
                   why_no_cephfs=None if with_cephfs else f"CephFS needs {', '.join(CEPHFS_BINARIES)} and /dev/fuse")
    finally:
        stop()


@pytest.fixture(scope="session")
def s3_server(ceph: Ceph) -> Ceph:
    """The S3 endpoint (Ceph RGW) and its credentials; skips with the reason when there is none."""
    if ceph.endpoint is None:
        pytest.skip(ceph.why_no_s3 or "no S3 server")
    return ceph


@pytest.fixture
def s3_bucket(s3_server: Ceph) -> Iterator[str]:
    """A fresh, empty bucket; emptied (objects and multipart uploads) and deleted afterwards."""
    client = s3_server.client()
    name = f"ckptbench-test-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    yield name
    from s3_buckets import remove_bucket

    remove_bucket(client, name)


@pytest.fixture
def cephfs_dir(ceph: Ceph) -> Iterator[Path]:
    """A fresh directory on the CephFS mount (a FUSE network filesystem), removed afterwards."""
    if ceph.cephfs is None:
        pytest.skip(ceph.why_no_cephfs or "no CephFS mount")
    path = ceph.cephfs / f"ckptbench-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
