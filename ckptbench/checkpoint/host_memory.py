"""The host's memory: what is available, which staging arenas and read buffers are checked against before
they are allocated (a save or load, and the benchmarks sizing their checkpoints); how to fault memory in
ahead of use; and whether a hypervisor takes this host's free memory back."""

from __future__ import annotations

import os


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes: what can be allocated without swapping; None
    where it cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


#: madvise(2) advice that faults a range in, writable, in one call (Linux 5.14+; Python has no name for it).
MADV_POPULATE_WRITE = 23

#: The virtio device id of a memory balloon, and its feature bit for free page reporting (the guest hands
#: its free memory back to the hypervisor, which must find and zero host memory again at the next touch).
_VIRTIO_BALLOON = 0x0005
_VIRTIO_BALLOON_F_REPORTING = 5


def reports_free_memory(devices: str = "/sys/bus/virtio/devices") -> bool:
    """Whether this host is a VM that reports its free memory to the hypervisor (a virtio balloon with free
    page reporting): memory freed here is taken back, and faulting fresh memory in can cost far more than
    zeroing it, depending on the hypervisor's own memory."""
    try:
        names = os.listdir(devices)
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(devices, name, "device")) as f:
                device = int(f.read().strip(), 16)
            with open(os.path.join(devices, name, "features")) as f:
                features = f.read().strip()
        except (OSError, ValueError):
            continue
        if device == _VIRTIO_BALLOON and len(features) > _VIRTIO_BALLOON_F_REPORTING \
                and features[_VIRTIO_BALLOON_F_REPORTING] == "1":
            return True
    return False


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _count(path: str) -> int | None:
    """The whole number a sysfs file holds, None when it cannot be read or holds something else."""
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def proactive_reclaim(damon: str = "/sys/kernel/mm/damon/admin/kdamonds",
                      module: str = "/sys/module/damon_reclaim/parameters") -> float | None:
    """The seconds after which this host's kernel pages out memory left unaccessed (DAMON running a
    ``pageout`` scheme, or the ``damon_reclaim`` module enabled), the shortest where there are several;
    None when it does not. Page cache and, with swap, a process's idle memory then leave memory on a timer
    that has nothing to do with the storage measured."""
    found: list[float] = []
    if _read(os.path.join(module, "enabled")) in ("Y", "1"):
        min_age_us = _count(os.path.join(module, "min_age"))
        if min_age_us is not None:
            found.append(min_age_us / 1e6)
    try:
        kdamonds = [k for k in os.listdir(damon) if k.isdigit()]
    except OSError:
        kdamonds = []
    for kdamond in kdamonds:
        if _read(os.path.join(damon, kdamond, "state")) != "on":
            continue
        contexts = os.path.join(damon, kdamond, "contexts")
        for context in _numbered(contexts):
            aggr_us = _count(os.path.join(contexts, context, "monitoring_attrs", "intervals", "aggr_us"))
            schemes = os.path.join(contexts, context, "schemes")
            for scheme in _numbered(schemes):
                if _read(os.path.join(schemes, scheme, "action")) != "pageout":
                    continue
                age = _count(os.path.join(schemes, scheme, "access_pattern", "age", "min"))
                found.append(age * aggr_us / 1e6 if age is not None and aggr_us is not None else 0.0)
    return min(found) if found else None


def _numbered(directory: str) -> list[str]:
    try:
        return sorted((n for n in os.listdir(directory) if n.isdigit()), key=int)
    except OSError:
        return []
