"""One-launch gathering of many small CUDA tensors into a device buffer laid out like the arena.

A device-to-host copy costs a few microseconds however small it is, and so does every tensor a
``torch.cat`` is handed from Python: staging 11k tensors of 4-64 KiB one way or the other took ~13x
longer than one copy of the same bytes. Here a table of (source address, destination offset, nbytes)
rows goes to the device once and one kernel copies every tensor (a block per row, 16-byte words where
both ends allow it); then each run of neighbours travels to the host with one copy.

The kernel is compiled at run time with NVRTC (``torch.cuda._compile_kernel``, which ships with CUDA
builds of PyTorch), once per process and device, so the package builds and runs without a CUDA
toolchain. Where that is unavailable (an older torch, no NVRTC, ``CKPTBENCH_STAGE_GATHER_KERNEL=0``)
:func:`kernel_for` returns None and staging falls back to ``torch.cat``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import numpy as np

from ckptbench import knobs

log = logging.getLogger(__name__)

KERNEL_NAME = "ckptbench_gather"
KERNEL_SOURCE = r"""
struct alignas(16) Words { unsigned long long lo, hi; };

// rows: n x (source address, destination offset, nbytes); one block copies one row at a time.
extern "C" __global__ void ckptbench_gather(const long long* rows, int n, unsigned char* dst) {
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const unsigned char* src = reinterpret_cast<const unsigned char*>(rows[3 * i]);
        unsigned char* out = dst + rows[3 * i + 1];
        const long long nbytes = rows[3 * i + 2];
        long long done = 0;
        if (((reinterpret_cast<unsigned long long>(src) | reinterpret_cast<unsigned long long>(out)) & 15) == 0) {
            const long long words = nbytes >> 4;
            const Words* s = reinterpret_cast<const Words*>(src);
            Words* d = reinterpret_cast<Words*>(out);
            for (long long j = threadIdx.x; j < words; j += blockDim.x) d[j] = s[j];
            done = words << 4;
        }
        for (long long j = done + threadIdx.x; j < nbytes; j += blockDim.x) out[j] = src[j];
    }
}
"""
MIN_TORCH = (2, 11)
THREADS_PER_BLOCK = 256
MAX_BLOCKS = 4096

_kernels: dict[int, Any] = {}
_lock = threading.Lock()


def kernel_for(device: Any) -> Any | None:
    """The compiled gather kernel for CUDA ``device`` (compiled on first use), or None where unavailable."""
    if not knobs.STAGE_GATHER_KERNEL:
        return None
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        if index not in _kernels:
            _kernels[index] = _compile(index)
        return _kernels[index]


def _compile(index: int) -> Any | None:
    import torch

    compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
    if compile_kernel is None or _release(torch.__version__) < MIN_TORCH:
        # Earlier releases' launcher did not pass its stream to cuLaunchKernel (the gather must run on
        # the staging stream, ordered with the copies around it); 2.11 is the oldest run on a GPU here.
        log.info("torch %s: small tensors are gathered with torch.cat (the gather kernel needs torch >= %s)",
                 torch.__version__, ".".join(map(str, MIN_TORCH)))
        return None
    try:
        with torch.cuda.device(index):
            kernel = compile_kernel(KERNEL_SOURCE, KERNEL_NAME)
    except Exception as exc:  # NVRTC missing or failing: the torch.cat path still works
        log.warning("could not compile the GPU gather kernel (%s); small tensors are gathered with torch.cat", exc)
        return None
    log.info("GPU gather kernel compiled for cuda:%d", index)
    return kernel


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.11.0+cu130'."""
    major, minor = (version.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def gather_runs_to_host(kernel: Any, device: Any, stream: Any, addresses: np.ndarray, offsets: np.ndarray,
                        nbytes: np.ndarray, runs: list[tuple[int, int]], flat: Any) -> None:
    """Gather tensors (``addresses``, sorted by arena ``offsets``) run by run and queue each run's
    device-to-host copy into ``flat`` on ``stream`` (current). Device scratch is bounded by
    ``knobs.STAGE_GATHER_SCRATCH_BYTES`` (at least one run); the caller synchronises ``stream``."""
    ends = offsets + nbytes
    batch: list[tuple[int, int, int]] = []
    scratch_bytes = 0
    for first, stop in runs:
        span = int(ends[stop - 1] - offsets[first])
        if batch and scratch_bytes + _align(span) > knobs.STAGE_GATHER_SCRATCH_BYTES:
            _gather_batch(kernel, device, stream, addresses, offsets, nbytes, batch, flat)
            batch, scratch_bytes = [], 0
        batch.append((first, stop, span))
        scratch_bytes += _align(span)
    _gather_batch(kernel, device, stream, addresses, offsets, nbytes, batch, flat)


def gather_into_host(kernel: Any, device: Any, stream: Any, addresses: np.ndarray, offsets: np.ndarray,
                     nbytes: np.ndarray, flat: Any) -> None:
    """Queue one kernel on ``stream`` (current) that copies every tensor straight to its offset in
    ``flat``, registered (mapped) host memory: the device writes across the bus itself, no scratch
    buffer and no separate device-to-host copies. The caller synchronises ``stream``."""
    _launch(kernel, device, stream, np.column_stack((addresses, offsets, nbytes)), flat)


def _gather_batch(kernel: Any, device: Any, stream: Any, addresses: np.ndarray, offsets: np.ndarray,
                  nbytes: np.ndarray, batch: list[tuple[int, int, int]], flat: Any) -> None:
    """Gather the runs ``batch`` ((first, stop, span) each) into one zeroed scratch buffer, then queue
    one device-to-host copy per run."""
    import torch

    rows, pieces, base = [], [], 0
    for first, stop, span in batch:
        start = int(offsets[first])
        rows.append(np.column_stack((addresses[first:stop], offsets[first:stop] - start + base, nbytes[first:stop])))
        pieces.append((base, start, span))
        base += _align(span)
    scratch = torch.zeros(base, dtype=torch.uint8, device=device)  # the padding between tensors stays zero
    _launch(kernel, device, stream, np.concatenate(rows), scratch)
    for base, start, span in pieces:
        flat[start:start + span].copy_(scratch[base:base + span], non_blocking=True)


def _launch(kernel: Any, device: Any, stream: Any, table: np.ndarray, dst: Any) -> None:
    """Upload ``table`` ((address, offset, nbytes) rows) and queue the kernel on ``stream``: each row
    copied to ``dst`` (a device tensor, or registered host memory) at its offset."""
    import torch

    rows = len(table)
    on_device = torch.from_numpy(np.ascontiguousarray(table, np.int64)).to(device, non_blocking=True)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        kernel(grid=(min(rows, MAX_BLOCKS), 1, 1), block=(THREADS_PER_BLOCK, 1, 1), args=[on_device, rows, dst],
               stream=stream)


def _align(nbytes: int, to: int = 256) -> int:
    return -(-nbytes // to) * to
