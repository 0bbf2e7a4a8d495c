"""Staging: copy every tensor of a plan into one page-aligned host arena, reused across saves.

The arena is allocated and touched once (fresh memory costs ~1 GB/s on small VMs) and grows only when
a plan needs more. Contiguous CPU tensors are copied by the engine on N threads without the GIL;
anything else (non-contiguous views, GPU tensors) goes through ``Tensor.copy_`` into a typed view of
the arena, GPU copies on a side stream into the arena registered with CUDA (cudaHostRegister) so the
device-to-host copy runs at pinned speed. Staging is the only step that blocks the caller of an
asynchronous save.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ckptbench import knobs, native
from ckptbench.checkpoint.plan import SavePlan
from ckptbench.errors import UsageError
from ckptbench.units import format_size

log = logging.getLogger(__name__)


class InsufficientMemoryError(UsageError):
    """Not enough host memory for the staging arena."""


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Arena:
    """One aligned host allocation for a whole checkpoint; grows, never shrinks, until closed."""

    def __init__(self) -> None:
        self.buffer: native.AlignedBuffer | None = None
        self._registered = False
        self._bytes_view: Any = None

    @property
    def nbytes(self) -> int:
        return len(self.buffer) if self.buffer is not None else 0

    def ensure(self, nbytes: int) -> None:
        """Make the arena at least ``nbytes``; checks available memory first and says what it needs."""
        if self.nbytes >= nbytes:
            return
        available = available_memory_bytes()
        if available is not None and nbytes - self.nbytes > available:
            raise InsufficientMemoryError(
                f"staging this checkpoint needs {format_size(nbytes)} of host memory but only "
                f"{format_size(available)} is available",
                hint="free memory, save fewer tensors at once, or shard the model over more ranks",
            )
        self.close()
        log.info("allocating a %s staging arena (touched once, reused)", format_size(nbytes))
        self.buffer = native.AlignedBuffer(nbytes)
        self._register_with_cuda()

    def _register_with_cuda(self) -> None:
        import torch

        if not torch.cuda.is_available():
            return
        err = torch.cuda.cudart().cudaHostRegister(self.buffer.address, len(self.buffer), 0)
        self._registered = int(err) == 0
        log.info("arena pinned with cudaHostRegister: %s", self._registered)

    def bytes_tensor(self) -> Any:
        """The arena as a flat uint8 tensor (no copy)."""
        import torch

        if self._bytes_view is None:
            self._bytes_view = torch.frombuffer(self.buffer, dtype=torch.uint8)
        return self._bytes_view

    def close(self) -> None:
        if self.buffer is None:
            return
        if self._registered:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.buffer.address)
            self._registered = False
        self._bytes_view = None
        self.buffer = None


def dtype_of(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UsageError(f"unknown dtype {name!r} in checkpoint")
    return dtype


def typed_view(flat: Any, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """A (shape, dtype) tensor over ``flat[offset : offset + nbytes]`` without copying."""
    return flat[offset:offset + nbytes].view(dtype).view(shape)


def stage(plan: SavePlan, tensors: list[Any], arena: Arena, threads: int) -> None:
    """Copy each stored tensor into its place in the arena; returns when every byte is there."""
    arena.ensure(plan.arena_bytes)
    fast: list[tuple[int, int, int]] = []
    slow: list[tuple[Any, int, int]] = []
    for entry, tensor in zip(plan.entries, tensors, strict=True):
        if entry.alias_of is not None or entry.nbytes == 0:
            continue
        offset = plan.arena_offset(entry)
        if tensor.device.type == "cpu" and tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg():
            fast.append((tensor.data_ptr(), offset, entry.nbytes))
        else:
            slow.append((tensor, offset, entry.nbytes))
    if fast:
        # The tensors list keeps every source alive for the duration of the call.
        native.copy_from_addresses(arena.buffer, fast, threads)
    if slow:
        flat = arena.bytes_tensor()
        on_gpu = [item for item in slow if item[0].is_cuda]
        for tensor, offset, nbytes in slow:
            if not tensor.is_cuda:  # non-contiguous, conjugate or negative views on the CPU
                typed_view(flat, offset, nbytes, tensor.dtype, tuple(tensor.shape)).copy_(
                    tensor.resolve_conj().resolve_neg())
        if on_gpu:
            stage_from_device(on_gpu, flat)


def as_bytes(tensor: Any) -> Any:
    """A contiguous flat uint8 view of ``tensor`` (a copy only when it is not contiguous or has conj/neg bits)."""
    import torch

    if tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg():
        return tensor.view(-1).view(torch.uint8)
    return tensor.resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)


def stage_from_device(items: list[tuple[Any, int, int]], flat: Any) -> None:
    """Device-to-host copies of (CUDA) tensors into the (registered) arena ``flat`` on a side stream.

    ``items`` are ``(tensor, arena offset, nbytes)``.
    Big tensors are copied straight into their place. Small ones would each pay a copy's fixed cost
    (several microseconds), so runs of neighbours in the arena are first gathered on the device into
    one buffer laid out exactly as in the arena (one ``torch.cat``, padding included) and then moved
    with a single device-to-host copy.
    """
    import torch

    items = sorted(items, key=lambda item: item[1])
    device = items[0][0].device
    stream = None
    if device.type == "cuda":  # (the same gathering runs on CPU tensors, which is how it is unit-tested)
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))  # the tensors' producers come first
    pad = torch.zeros(knobs.STAGE_GATHER_MAX_GAP_BYTES, dtype=torch.uint8, device=device)
    run: list[tuple[Any, int, int]] = []

    def flush() -> None:
        if not run:
            return
        start, parts, cursor = run[0][1], [], run[0][1]
        for tensor, offset, nbytes in run:
            if offset > cursor:
                parts.append(pad[:offset - cursor])
            parts.append(as_bytes(tensor))
            cursor = offset + nbytes
        gathered = parts[0] if len(parts) == 1 else torch.cat(parts)
        flat[start:cursor].copy_(gathered, non_blocking=True)
        run.clear()

    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for item in items:
            tensor, offset, nbytes = item
            if nbytes >= knobs.STAGE_GATHER_BELOW_BYTES:
                flat[offset:offset + nbytes].copy_(as_bytes(tensor), non_blocking=True)
                continue
            if run:
                last_tensor, last_offset, last_nbytes = run[-1]
                if (offset - last_offset - last_nbytes > knobs.STAGE_GATHER_MAX_GAP_BYTES
                        or offset + nbytes - run[0][1] > knobs.STAGE_GATHER_RUN_BYTES
                        or tensor.get_device() != last_tensor.get_device()):
                    flush()
            run.append(item)
        flush()
    # Buffers freed above return to the caching allocator on this stream, so their reuse is ordered
    # after the copies that read them; the caller may change its tensors once this returns.
    if stream is not None:
        stream.synchronize()
