"""What a result was measured on: host, kernel, CPU, memory, filesystem and device, tool version."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from ckptbench import __version__
from ckptbench.storage.local_target import mount_of


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def _cpu_model() -> str | None:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def _memory_bytes() -> int | None:
    text = _read("/proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def _git_sha() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def block_device_info(device: str) -> dict[str, Any]:
    """Model, rotational flag and queue settings of the block device behind ``/dev/...``, where readable."""
    name = os.path.basename(os.path.realpath(device)) if device.startswith("/dev/") else None
    if not name or not os.path.exists(f"/sys/class/block/{name}"):
        return {}
    sys_dir = Path(os.path.realpath(f"/sys/class/block/{name}"))
    disk = sys_dir.parent if (sys_dir / "partition").exists() else sys_dir
    info: dict[str, Any] = {"name": disk.name}
    for key, rel in (("model", "device/model"), ("vendor", "device/vendor"), ("rotational", "queue/rotational"),
                     ("scheduler", "queue/scheduler"), ("logical_block_bytes", "queue/logical_block_size")):
        value = _read(disk / rel)
        if value is not None:
            info[key] = int(value) if value.isdigit() else value
    return info


def collect_environment(target: Path | None = None) -> dict[str, Any]:
    """Everything a reader needs to judge where a result came from."""
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "tool_version": __version__,
        "git_sha": _git_sha(),
    }
    if target is not None:
        mount = mount_of(target)
        usage = shutil.disk_usage(target)
        env["target"] = {
            "path": str(target),
            "free_bytes": usage.free,
            "total_bytes": usage.total,
            "filesystem": mount.fstype if mount else None,
            "mount_point": mount.mount_point if mount else None,
            "mount_device": mount.device if mount else None,
            "mount_options": mount.options if mount else None,
            "device": block_device_info(mount.device) if mount else {},
        }
    return env
