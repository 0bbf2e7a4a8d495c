"""Which process made something (a scratch directory, a save lock) and whether it still runs.

A pid means something only on the host, boot and pid namespace it came from, and only together with
the process's start time (pids are reused): :class:`ProcessOwner` records all of them, and
:meth:`ProcessOwner.state` says "dead" only when every one of them matches here and the process is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path


def boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def machine_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/etc/machine-id").read_text().strip()
    return ""


def pid_namespace() -> str:
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return ""


def process_start(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, field 22 of ``/proc/PID/stat``); None when there
    is no live process ``pid``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return None if fields[0] in ("Z", "X") else fields[19]


def process_gone(pid: int, recorded_start: str) -> bool:
    """Whether process ``pid`` of this host and namespace, which started at ``recorded_start`` (``""``:
    not recorded), no longer runs: no live process has that pid, or another one does."""
    start = process_start(pid)
    return start is None or (bool(recorded_start) and start != recorded_start)


#: :meth:`ProcessOwner.state` values
DEAD, LIVE, OTHER_HOST, OTHER_BOOT = "dead", "live", "other host", "other boot"


@dataclass(frozen=True)
class ProcessOwner:
    """A process, recorded so that another process, later, can tell whether it still runs."""

    host: str
    pid: int
    process_start: str
    boot_id: str
    machine_id: str
    pid_namespace: str

    @classmethod
    def me(cls) -> ProcessOwner:
        return cls(socket.gethostname(), os.getpid(), process_start(os.getpid()) or "", boot_id(), machine_id(),
                   pid_namespace())

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> ProcessOwner | None:
        """The owner in ``data``; None for anything else (empty, half-written, foreign)."""
        try:
            owner = cls(**json.loads(data))
        except (ValueError, TypeError, RecursionError):  # RecursionError: JSON nested past the parser's depth
            return None
        fields = (owner.host, owner.process_start, owner.boot_id, owner.machine_id, owner.pid_namespace)
        if not all(isinstance(f, str) for f in fields) or type(owner.pid) is not int or owner.pid <= 0:
            return None
        return owner

    def state(self, *, shared: bool = False) -> str:
        """:data:`LIVE`, :data:`DEAD` (this host, namespace and boot, and its process is gone or another
        one has its pid; or, on storage only this machine reaches, this machine restarted since),
        :data:`OTHER_HOST` (its pids mean nothing here) or :data:`OTHER_BOOT` (this host's name but
        another boot, and the machine cannot be told apart from another one of the same name).

        ``shared``: the record lies where other machines reach it too (an object store, a network
        filesystem). Machines cloned from one image share the host name, the machine id and the initial
        pid namespace, so there another boot may be another machine running now: OTHER_BOOT, never DEAD."""
        here = ProcessOwner.me()
        if (self.host, self.pid_namespace) != (here.host, here.pid_namespace) or not self.boot_id \
                or (self.machine_id and here.machine_id and self.machine_id != here.machine_id):
            return OTHER_HOST
        if self.boot_id != here.boot_id:
            return DEAD if not shared and self.machine_id and self.machine_id == here.machine_id else OTHER_BOOT
        return DEAD if process_gone(self.pid, self.process_start) else LIVE
