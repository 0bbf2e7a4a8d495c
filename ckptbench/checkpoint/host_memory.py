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
