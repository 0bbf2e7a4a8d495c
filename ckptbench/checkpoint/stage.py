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

from ckptbench import native
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
    import torch

    arena.ensure(plan.arena_bytes)
    fast: list[tuple[int, int, int]] = []
    slow: list[tuple[Any, int]] = []
    for entry, tensor in zip(plan.entries, tensors, strict=True):
        if entry.alias_of is not None or entry.nbytes == 0:
            continue
        offset = plan.arena_offset(entry)
        if tensor.device.type == "cpu" and tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg():
            fast.append((tensor.data_ptr(), offset, entry.nbytes))
        else:
            slow.append((tensor, offset))
    if fast:
        # The tensors list keeps every source alive for the duration of the call.
        native.copy_from_addresses(arena.buffer, fast, threads)
    if slow:
        flat = arena.bytes_tensor()
        stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())  # the tensors' producers come first
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for tensor, offset in slow:
                nbytes = tensor.numel() * tensor.element_size()
                dst = typed_view(flat, offset, nbytes, tensor.dtype, tuple(tensor.shape))
                dst.copy_(tensor.resolve_conj().resolve_neg(), non_blocking=tensor.device.type == "cuda")
        if stream is not None:
            stream.synchronize()

