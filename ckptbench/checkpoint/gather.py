"""Gathering many small CUDA tensors with one kernel launch per batch, pipelined with the copies to the host.

A device-to-host copy costs a few microseconds however small it is, and so does every tensor a
``torch.cat`` is handed from Python: staging 11k tensors of 4-64 KiB one way or the other took ~13x
longer than one copy of the same bytes. Here a table of (source address, destination offset, nbytes,
zeros after) rows goes to the device once, and a kernel copies every row of a batch (a block per
row, long tensors split into pieces of ``PIECE_BYTES``, 16-byte words where both ends allow it) and
writes the zero padding after it. Batches are gathered into a few device buffers on one stream while
the copy engine moves finished ones to the host on another, so gathering hides behind the copies.

The kernel is compiled at run time with NVRTC (``torch.cuda._compile_kernel``, which ships with CUDA
builds of PyTorch), once per process and device, so the package builds and runs without a CUDA
toolchain. Where that is unavailable (an older torch, no NVRTC, ``CKPTBENCH_STAGE_GATHER_KERNEL=0``)
:func:`kernel_for` returns None and staging falls back to ``torch.cat``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptbench import knobs

log = logging.getLogger(__name__)

KERNEL_NAME = "ckptbench_gather"
KERNEL_SOURCE = r"""
struct alignas(16) Words { unsigned long long lo, hi; };

// rows: n x (source address, destination offset, nbytes, zero bytes after); a block copies one row at a
// time. Where both ends are 16-byte aligned: the bytes up to a 128-byte boundary of the destination
// first, then four 16-byte words in flight per thread, so each warp writes whole 128-byte lines (what
// crosses the bus when the destination is host memory); bytes otherwise, and for the tail.
extern "C" __global__ void ckptbench_gather(const long long* rows, int n, unsigned char* dst) {
    const long long step = blockDim.x;
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const unsigned char* src = reinterpret_cast<const unsigned char*>(rows[4 * i]);
        unsigned char* out = dst + rows[4 * i + 1];
        const long long nbytes = rows[4 * i + 2], end = nbytes + rows[4 * i + 3];
        long long done = 0;
        const unsigned long long to = reinterpret_cast<unsigned long long>(out);
        if (((reinterpret_cast<unsigned long long>(src) | to) & 15) == 0) {
            long long head = (long long)((128 - (to & 127)) & 127);
            if (head > (nbytes & ~15LL)) head = nbytes & ~15LL;
            for (long long j = threadIdx.x; j < (head >> 4); j += step)
                reinterpret_cast<Words*>(out)[j] = reinterpret_cast<const Words*>(src)[j];
            const long long words = (nbytes - head) >> 4;
            const Words* s = reinterpret_cast<const Words*>(src + head);
            Words* d = reinterpret_cast<Words*>(out + head);
            long long j = threadIdx.x;
            for (; j + 3 * step < words; j += 4 * step) {
                const Words a = s[j], b = s[j + step], c = s[j + 2 * step], e = s[j + 3 * step];
                d[j] = a; d[j + step] = b; d[j + 2 * step] = c; d[j + 3 * step] = e;
            }
            for (; j < words; j += step) d[j] = s[j];
            done = head + (words << 4);
        }
        for (long long j = done + threadIdx.x; j < nbytes; j += step) out[j] = src[j];
        for (long long j = nbytes + threadIdx.x; j < end; j += step) out[j] = 0;
    }
}
"""
MIN_TORCH = (2, 11)
THREADS_PER_BLOCK = 256
MAX_BLOCKS = 4096
#: Rows longer than this are split, so one long tensor is copied by many blocks at once.
PIECE_BYTES = 64 * 1024

_kernels: dict[int, Any] = {}
_lock = threading.Lock()


def kernel_for(device: Any) -> Any | None:
    """The compiled gather kernel for CUDA ``device`` (compiled on first use), or None where unavailable."""
    if not knobs.STAGE_GATHER_KERNEL or device.type != "cuda":
        return None

    index = device_index(device)
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


def kernel_table(addresses: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray, zeros: np.ndarray,
                 piece: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's rows for copies ``k`` (``nbytes[k]`` from ``addresses[k]`` to ``offsets[k]``, then
    ``zeros[k]`` zero bytes), each split into pieces of at most ``piece`` bytes (the zeros go with the
    last). Returns the (rows, 4) int64 table and where each copy's first row is (length n + 1)."""
    piece = piece or PIECE_BYTES
    counts = np.maximum(1, -(-nbytes // piece))
    starts = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    if int(starts[-1]) == len(counts):  # no copy longer than a piece: the common case, no repeats
        return np.column_stack((addresses, offsets, nbytes, zeros)).astype(np.int64, copy=False), starts
    of = np.repeat(np.arange(len(counts)), counts)
    skip = (np.arange(int(starts[-1])) - starts[:-1][of]) * piece
    last = skip + piece >= nbytes[of]
    table = np.column_stack((addresses[of] + skip, offsets[of] + skip, np.minimum(piece, nbytes[of] - skip),
                             np.where(last, zeros[of], 0)))
    return table.astype(np.int64, copy=False), starts


@dataclass
class Queued:
    """Device work queued by staging (:func:`gather_to_host`, :func:`launch_direct`...): the streams to
    wait for and the device buffers they use, kept alive until :meth:`wait` returns."""

    streams: tuple[Any, ...]
    keep: list[Any]

    def wait(self) -> None:
        try:
            wait_all(stream.synchronize for stream in self.streams if stream is not None)
        finally:
            self.keep.clear()


def wait_all(waits: Iterable[Callable[[], None]]) -> None:
    """Call each of ``waits`` (each waits for some device work), every one even when one fails, then
    raise the first failure: nothing may still write into the arena once staging has returned."""
    first: BaseException | None = None
    for wait in waits:
        try:
            wait()
        except BaseException as exc:  # noqa: BLE001 - raised below, after the others are waited for
            first = first or exc
    if first is not None:
        raise first


def batches(spans: np.ndarray, batch_bytes: int) -> list[tuple[int, int]]:
    """Group consecutive runs (``spans``: each one's bytes) into batches ``[first, stop)`` of at most
    ``batch_bytes`` together (a run longer than that is a batch alone)."""
    out: list[tuple[int, int]] = []
    first, total = 0, 0
    for k, span in enumerate(spans.tolist()):
        if k > first and total + span > batch_bytes:
            out.append((first, k))
            first, total = k, 0
        total += span
    if len(spans):
        out.append((first, len(spans)))
    return out


class Ring:
    """Device buffers that batches are gathered into in turn: batch ``b`` goes into buffer ``b % slots``
    once the copies out of it of batch ``b - slots`` are done. Gathering runs on ``streams[0]``, copies
    on ``streams[1]`` (both None on the CPU, in tests)."""

    def __init__(self, device: Any, streams: tuple[Any, Any], slots: int, slot_bytes: int) -> None:
        self.device, self.streams, self.slot_bytes = device, streams, slot_bytes
        self.cuda = device.type == "cuda"
        self.buffers: list[Any] = [None] * max(1, slots)
        self.free: list[Any] = [None] * max(1, slots)
        self.count = self.current = 0

    def slot(self, nbytes: int) -> Any:
        """The next buffer, at least ``nbytes``, ordered after the copies out of it so far."""
        import torch

        k = self.current = self.count % len(self.buffers)
        self.count += 1
        if self.buffers[k] is None or self.buffers[k].numel() < nbytes:
            with torch.cuda.stream(self.streams[0]) if self.cuda else contextlib.nullcontext():
                self.buffers[k] = torch.empty(max(nbytes, self.slot_bytes), dtype=torch.uint8, device=self.device)
        if self.free[k] is not None:
            self.streams[0].wait_event(self.free[k])
        return self.buffers[k]

    def gathered(self) -> None:
        """Copies queued from now on wait for the gathering queued so far."""
        import torch

        if self.cuda:
            event = torch.cuda.Event()
            event.record(self.streams[0])
            self.streams[1].wait_event(event)

    def copied(self) -> None:
        """The current buffer may be gathered into again once the copies queued so far are done."""
        import torch

        if self.cuda:
            self.free[self.current] = torch.cuda.Event()
            self.free[self.current].record(self.streams[1])


def upload(table: np.ndarray, device: Any, stream: Any) -> Any:
    """``table`` (int64) on ``device``, copied on ``stream`` (None: the current one) through page-locked
    memory: from pageable memory the copy costs the host far more. The caller keeps the
    result until ``stream`` is done (the caching allocators order later reuse of both buffers after
    the copy)."""
    import torch

    if device.type != "cuda":
        return torch.from_numpy(table)
    host = torch.empty(table.shape, dtype=torch.int64, pin_memory=True)
    host.numpy()[...] = table
    with contextlib.nullcontext() if stream is None else torch.cuda.stream(stream):
        return host.to(device, non_blocking=True)


@dataclass
class Program:
    """Prepared gathering of one set of copies: the kernel's rows on the device and, for gathering into
    device buffers, the batches (row ranges, buffer sizes) and each run's copy (arena start, bytes,
    place in its batch's buffer). Reused as it is while the copies stay the same (:class:`Prepared`)."""

    table: Any
    batch_rows: list[int] | None = None
    batch_runs: list[tuple[int, int]] | None = None
    needs: list[int] | None = None
    starts: list[int] | None = None
    spans: list[int] | None = None
    bases: list[int] | None = None


class Prepared:
    """The :class:`Program` of the last staging per device, kept by the arena: a training loop saves the
    same state_dict again and again (same tensor addresses, arena offsets, sizes and padding), so the
    host's preparation and the table's upload are done once, not on every save. Looked up by exact
    equality of those arrays and of the knobs that shape a program."""

    def __init__(self) -> None:
        self._programs: dict[Any, tuple[tuple, list[np.ndarray], Program]] = {}

    @staticmethod
    def settings(direct: bool) -> tuple:
        """What besides the copies shapes a program: the pieces, and the runs and batches when gathering
        into device buffers."""
        if direct:
            return (True, PIECE_BYTES)
        return (False, PIECE_BYTES, knobs.STAGE_GATHER_RUN_BYTES, knobs.STAGE_GATHER_MAX_GAP_BYTES)

    def get(self, device: Any, settings: tuple, arrays: list[np.ndarray]) -> Program | None:
        entry = self._programs.get(device)
        if entry is None or entry[0] != settings or len(entry[1]) != len(arrays):
            return None
        same = all(a.shape == b.shape and bool((a == b).all()) for a, b in zip(entry[1], arrays, strict=True))
        return entry[2] if same else None

    def put(self, device: Any, settings: tuple, arrays: list[np.ndarray], program: Program) -> None:
        self._programs[device] = (settings, [a.copy() for a in arrays], program)

    @staticmethod
    def reuse(prepared: Prepared | None, device: Any, direct: bool, arrays: list[np.ndarray],
              make: Callable[[], Program]) -> Program:
        """``prepared``'s program for these copies, or ``make()``'s, kept in ``prepared`` for next time."""
        settings = Prepared.settings(direct)
        program = prepared.get(device, settings, arrays) if prepared is not None else None
        if program is None:
            program = make()
            if prepared is not None:
                prepared.put(device, settings, arrays, program)
        return program

    def clear(self) -> None:
        self._programs.clear()


def gather_to_host(kernel: Any, ring: Ring, addresses: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray,
                   zero_after: np.ndarray, runs: Any, flat: Any, prepared: Prepared | None = None) -> None:
    """Queue the gathering of tensors (``addresses``, sorted by arena ``offsets``) run by run and each
    run's device-to-host copy into ``flat``, through ``ring``'s buffers; returns without waiting.

    A run covers its tensors, the bytes between them (zeroed) and ``zero_after`` of its last tensor,
    so every byte it copies is written. Runs are grouped into :func:`batches` of about
    ``knobs.STAGE_GATHER_RUN_BYTES``, each gathered by one kernel launch into a buffer of the ring.
    ``runs``: a list of (first, stop) pairs, or a callable that makes it (not called when ``prepared``
    holds this staging's program already)."""
    import torch

    program = Prepared.reuse(prepared, ring.device, False, [addresses, offsets, nbytes, zero_after],
                             lambda: _program(addresses, offsets, nbytes, zero_after,
                                              runs() if callable(runs) else runs, ring))
    table = program.table
    # Lean loop: copies on the current stream (the copy stream), kernels given their stream.
    with torch.cuda.stream(ring.streams[1]) if ring.cuda else contextlib.nullcontext():
        for b, (g0, g1) in enumerate(program.batch_runs):
            buffer = ring.slot(program.needs[b])
            _launch(kernel, ring.streams[0], table[program.batch_rows[b]:program.batch_rows[b + 1]], buffer)
            ring.gathered()
            for r in range(g0, g1):
                start, span, at = program.starts[r], program.spans[r], program.bases[r]
                flat[start:start + span].copy_(buffer[at:at + span], non_blocking=ring.cuda)
            ring.copied()


def _program(addresses: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray, zero_after: np.ndarray,
             runs: list[tuple[int, int]], ring: Ring) -> Program:
    """:func:`gather_to_host`'s preparation: zeros, run spans, batches, the table (uploaded)."""
    ends = offsets + nbytes
    first = np.array([f for f, _ in runs], np.int64)
    last = np.array([s - 1 for _, s in runs], np.int64)
    run_of = np.repeat(np.arange(len(runs)), last - first + 1)
    # Zeros after each tensor: up to the next one in its run, or its own padding after the run's last.
    zeros = np.empty(len(offsets), np.int64)
    zeros[:-1] = offsets[1:] - ends[:-1]
    zeros[last] = zero_after[last]
    spans = ends[last] + zeros[last] - offsets[first]
    aligned = -(-spans // 256) * 256
    groups = batches(aligned, knobs.STAGE_GATHER_RUN_BYTES)
    base = np.zeros(len(runs), np.int64)  # each run's place in its batch's buffer
    for g0, g1 in groups:
        base[g0 + 1:g1] = np.cumsum(aligned[g0:g1 - 1])
    table, row_starts = kernel_table(addresses, offsets - offsets[first][run_of] + base[run_of], nbytes, zeros)
    return Program(upload(table, ring.device, ring.streams[0]),
                   row_starts[np.append(first[[g0 for g0, _ in groups]], len(offsets))].tolist(), groups,
                   [int(base[g1 - 1] + aligned[g1 - 1]) for _, g1 in groups], offsets[first].tolist(), spans.tolist(),
                   base.tolist())


def prepared_direct(device: Any, addresses: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray,
                    zero_after: np.ndarray, prepared: Prepared | None = None) -> Program:
    """The program of a kernel that copies every tensor, and the ``zero_after`` bytes of padding after
    it, straight into registered (mapped) host memory, the device writing across the bus itself: no
    device buffer and no separate copies. Its table (uploaded on the current stream) goes to
    ``prepared``: the same copies again need no preparation or upload."""
    arrays = [addresses, offsets, nbytes, zero_after]
    with on_device(device):
        return Prepared.reuse(prepared, device, True, arrays,
                              lambda: Program(upload(kernel_table(*arrays)[0], device, None)))


def launch_direct(kernel: Any, device: Any, stream: Any, program: Program, flat: Any) -> None:
    """Queue :func:`prepared_direct`'s ``program`` on ``stream`` (the current stream of ``device``),
    into ``flat``, the registered arena; returns without waiting."""
    with on_device(device):
        _launch(kernel, stream, program.table, flat)


def _launch(kernel: Any, stream: Any, table: Any, dst: Any) -> None:
    """Queue the kernel on ``stream`` (its device current) over ``table`` (a (rows, 4) int64 tensor on
    that device): each row copied to ``dst`` (a device tensor, or registered host memory) at its offset.

    One driver call: torch's launcher opens the driver library, checks that host tensors are pinned and
    converts its arguments anew on every call, a noticeable part of a staging of small tensors. A
    stand-in kernel (no ``func``, as in the CPU tests) is called the way torch's launcher is, and so is
    the kernel where there is no CUDA driver library to call (a ROCm build)."""
    rows = int(table.shape[0])
    grid = min(rows, MAX_BLOCKS)
    func = getattr(kernel, "func", None)
    driver = _driver() if func is not None and stream is not None else None
    if driver is None:
        kernel(grid=(grid, 1, 1), block=(THREADS_PER_BLOCK, 1, 1), args=[table, rows, dst], stream=stream)
        return
    values = (ctypes.c_void_p(table.data_ptr()), ctypes.c_int(rows), ctypes.c_void_p(dst.data_ptr()))
    params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    _check(driver.cuLaunchKernel(func, grid, 1, 1, THREADS_PER_BLOCK, 1, 1, 0, stream.cuda_stream, params, None),
           "launching the gather kernel")


@dataclass(frozen=True)
class CurrentStream:
    """This thread's current CUDA stream on ``device``, by handle: all that launching the kernel on it and
    waiting for it take. Getting torch's stream object and joining a side stream to it costs the host
    a noticeable part of staging small tensors. Work queued on it runs after the
    tensors' producers (queued there before), as a side stream made to wait for it would."""

    device: Any
    cuda_stream: int

    @classmethod
    def of(cls, device: Any) -> Any:
        """The current stream of ``device``; torch's stream object where the driver is not called
        directly (:func:`_driver`)."""
        import torch

        index = device_index(device)
        if _driver() is None:
            return torch.cuda.current_stream(index)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return cls(device, raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream)

    def synchronize(self) -> None:
        with on_device(self.device):  # handle 0, the legacy default stream, is the current context's
            _check(_driver().cuStreamSynchronize(self.cuda_stream), "waiting for the staging stream")


def on_device(device: Any) -> contextlib.AbstractContextManager:
    """CUDA ``device`` made current for the driver calls inside (nothing to do where it already is, as
    nearly always: ``torch.cuda.device`` costs the host time)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    import torch

    index = device_index(device)
    current = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)()
    return contextlib.nullcontext() if current == index else torch.cuda.device(index)


def device_index(device: Any) -> int:
    """The index of CUDA ``device`` (``cuda`` alone: the current one)."""
    if device.index is not None:
        return device.index
    import torch

    return torch.cuda.current_device()


def _check(err: int, what: str) -> None:
    if err:
        text = ctypes.c_char_p()
        _driver().cuGetErrorString(err, ctypes.byref(text))
        raise RuntimeError(f"{what} failed: CUDA error {err} ({(text.value or b'unknown').decode()})")


@functools.cache
def _driver() -> Any | None:
    """The CUDA driver library, the calls made here typed once; None on a ROCm build of torch (its
    kernels compile with hiprtc and launch through torch's launcher) or without the library."""
    import torch

    if getattr(torch.version, "hip", None):
        return None
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    driver.cuLaunchKernel.argtypes = (ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_void_p)
    driver.cuStreamSynchronize.argtypes = (ctypes.c_void_p,)
    for call in (driver.cuLaunchKernel, driver.cuStreamSynchronize):
        call.restype = ctypes.c_int
    return driver
