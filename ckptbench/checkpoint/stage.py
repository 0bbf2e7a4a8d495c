"""Staging: copy every tensor of a plan into one page-aligned host arena, reused across saves.

The arena is allocated and touched once (the first touch of fresh memory is far slower than a copy) and grows only when
a plan needs more. Contiguous CPU tensors are copied by the engine on N threads without the GIL;
anything else (non-contiguous views, GPU tensors) goes through ``Tensor.copy_`` into a typed view of
the arena, GPU copies on a side stream into the arena registered with CUDA (cudaHostRegister) so the
device-to-host copy runs at pinned speed. Staging is the only step that blocks the caller of an
asynchronous save.

A save may stage its host tensors copy-on-write instead (:class:`CowStaging`, the engine's
``CowCopy``): their pages are write-protected, the caller of an asynchronous save goes on at once,
and the copy runs behind it, the write following the copy; a write to a page not yet copied waits
until its chunk is.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptbench import knobs, native
from ckptbench.checkpoint import gather
from ckptbench.checkpoint.host_memory import available_memory_bytes
from ckptbench.checkpoint.plan import SavePlan
from ckptbench.checkpoint.routing import ROUTE_HOST, ROUTE_TORCH, Sources
from ckptbench.errors import CowStagingError, InsufficientMemoryError, UsageError
from ckptbench.units import format_size

log = logging.getLogger(__name__)


class Arena:
    """One aligned host allocation for a whole checkpoint; grows, never shrinks, until closed."""

    def __init__(self) -> None:
        self.buffer: native.AlignedBuffer | None = None
        self._registered = False
        self._bytes_view: Any = None
        self.prepared = gather.Prepared()  # GPU staging work prepared for the last save, reused when it repeats
        self._repeat: tuple[tuple, tuple, MappedStaging] | None = None

    @property
    def mapped(self) -> bool:
        """Registered with CUDA, so kernels can write into it (at the same address: unified addressing)."""
        return self._registered

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
        log.info("allocating a %s staging arena (reused)", format_size(nbytes))
        self.buffer = native.AlignedBuffer(nbytes, prefault=bool(knobs.ARENA_PREFAULT))
        self._register_with_cuda()

    def _register_with_cuda(self) -> None:
        import torch

        if not torch.cuda.is_available():
            return
        # Portable | Mapped: pinned for every device, and addressable by kernels at the same address (UVA).
        err = torch.cuda.cudart().cudaHostRegister(self.buffer.address, len(self.buffer), 3)
        self._registered = int(err) == 0
        log.info("arena pinned with cudaHostRegister: %s", self._registered)

    def bytes_tensor(self) -> Any:
        """The arena as a flat uint8 tensor (no copy)."""
        import torch

        if self._bytes_view is None:
            self._bytes_view = torch.frombuffer(self.buffer, dtype=torch.uint8)
        return self._bytes_view

    def remember(self, key: tuple, mapped_staging: MappedStaging) -> None:
        """Keep ``mapped_staging``, the staging worked out from the arrays ``key``, for :meth:`repeat_for`."""
        self._repeat = (key, _mapped_staging_settings(), mapped_staging)

    def repeat_for(self, key: tuple) -> MappedStaging | None:
        """The staging remembered for the very arrays ``key`` (the same objects: they are never changed
        once planned, so the work out of them is the same) under the same knobs, else None. The key's
        arrays stay referenced while remembered, so no other array can take an identity."""
        if self._repeat is None or self._repeat[1] != _mapped_staging_settings():
            return None
        known = self._repeat[0]
        return self._repeat[2] if len(known) == len(key) and all(a is b for a, b in zip(known, key, strict=True)) else None

    def forget(self) -> None:
        """Drop the remembered staging (:meth:`repeat_for`); the prepared tables stay."""
        self._repeat = None

    def close(self) -> None:
        self.prepared.clear()
        self.forget()
        if self.buffer is None:
            return
        if self._registered:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.buffer.address)
            self._registered = False
        self._bytes_view = None
        self.buffer = None


def _mapped_staging_settings() -> tuple:
    """The knobs a remembered mapped staging was worked out under."""
    return (knobs.STAGE_GATHER_MAPPED, knobs.STAGE_GATHER_KERNEL, knobs.STAGE_GATHER_BELOW_BYTES,
            gather.Prepared.settings(True))


def dtype_of(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UsageError(f"unknown dtype {name!r} in checkpoint")
    return dtype


def typed_view(flat: Any, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """A (shape, dtype) tensor over ``flat[offset : offset + nbytes]`` without copying."""
    return flat[offset:offset + nbytes].view(dtype).view(shape)


def copy_values(dst: Any, src: Any, *, non_blocking: bool = False) -> None:
    """``dst.copy_(src)`` of two tensors of one dtype and shape, also for the dtypes torch stores but
    has no copy kernel for (``uint1``-``uint7``, ``int1``-``int7``, ``quint4x2``...): those are copied
    as the integers of their width. Lazy conjugate/negative bits of ``src`` are resolved."""
    src = src.resolve_conj().resolve_neg()
    try:
        dst.copy_(src, non_blocking=non_blocking)
    except NotImplementedError:  # raised before anything is copied
        as_int = _same_width_int(src.element_size())
        dst.view(as_int).copy_(src.view(as_int), non_blocking=non_blocking)


def _same_width_int(nbytes: int) -> Any:
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[nbytes]


def cow_unavailable() -> str:
    """Why host tensors cannot be staged copy-on-write here ('' when they can): the knob, or the engine's probe."""
    if not knobs.STAGE_COW:
        return "CKPTBENCH_STAGE_COW=0"
    return native.cow_unavailable()


class CowStaging:
    """A copy-on-write staging still copying behind the caller: :meth:`finish` before the arena is read
    (or write it with the engine, block by block as the copy lands: ``native.write(after=cow_copy)``).

    Holds the staged tensors' storages until then (their memory must stay where it is) and the engine's
    ``CowCopy``, which keeps their pages write-protected until each chunk is copied."""

    def __init__(self, cow_copy: native.CowCopy, storages: list[Any]) -> None:
        self.cow_copy = cow_copy
        self._storages = storages
        self._lock = threading.Lock()
        self._finished = False
        self._failure: str | None = None
        self.faults = 0

    def finish(self) -> None:
        """Wait for the copy (any thread, any number of times); raises CowStagingError when the tensors'
        memory was freed or moved meanwhile, so the arena does not hold them."""
        with self._lock:
            if not self._finished:
                self._finished = True
                try:
                    self.cow_copy.finish()
                except RuntimeError as exc:
                    self._failure = str(exc)
                finally:
                    self.faults = self.cow_copy.stats()["faults"]
                    self._storages = []
        if self._failure is not None:
            raise CowStagingError(
                f"a tensor changed under the save's copy-on-write staging: {self._failure}; nothing was written",
                hint="keep the saved tensors' storage in place (no resize_ or set_ of it) until the save is "
                     "durable, or set CKPTBENCH_STAGE_COW=0 to copy them before save() returns")

    def close(self) -> None:
        """Finish, dropping any error (for cleanup after another failure)."""
        with contextlib.suppress(CowStagingError):
            self.finish()


def stage(plan: SavePlan, tensors: list[Any], arena: Arena, threads: int, *, cow: bool = False) -> CowStaging | None:
    """Copy each stored tensor into its place in the arena. Returns None once every byte is there, or,
    with ``cow``, a :class:`CowStaging` still copying the host tensors (see below).

    ``tensors`` are ``plan_save``'s sources (a plain list works too, at the cost of visiting each
    tensor again). Contiguous CPU tensors: one engine call on ``threads`` threads; contiguous CUDA
    tensors: :func:`stage_from_device` per device; anything else: ``Tensor.copy_`` one by one.

    ``cow``: stage contiguous CPU tensors copy-on-write where this machine allows it
    (:func:`cow_unavailable`); then the return is a :class:`CowStaging` still copying them, to be
    finished before the arena is read, and the caller may write to its tensors at once.
    """
    arena.ensure(plan.arena_bytes)
    sources = Sources.of(tensors)
    key = (plan.placements, sources.addresses, sources.routes, plan.padding)
    repeat = arena.repeat_for(key)
    if repeat is not None:  # the very arrays staged last time (a Checkpointer's reused plan): as it was
        repeat.issue(sources, arena.bytes_tensor()).wait()
        return None
    index, offsets, nbytes = plan.placements.T
    cow_copy = copy_into_arena(sources, index, offsets, nbytes, arena, threads, zero_after=plan.padding, key=key,
                               cow=cow)
    if cow_copy is None:
        return None
    try:  # their storages, not the tensors: `param.data = ...` must not free the memory being copied
        host = np.flatnonzero(np.frombuffer(sources.routes, np.int16) == ROUTE_HOST).tolist()
        return CowStaging(cow_copy, [sources[i].untyped_storage() for i in host])
    except BaseException:
        _finish_quietly(cow_copy)
        raise


def copy_into_arena(sources: Sources, index: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray, arena: Arena,
                    threads: int, zero_after: np.ndarray | None = None, key: tuple | None = None,
                    cow: bool = False) -> native.CowCopy | None:
    """Copy ``sources[index[k]]`` (all of its bytes, row-major) to ``offsets[k]`` in ``arena``, for every k
    (rows sorted by offset, non-empty, not overlapping). The arena
    must already be large enough. ``zero_after[k]``: zero that many bytes after copy k (the padding
    of shard files, up to the next copy). ``key``: the arrays these come from, under which the arena
    keeps a staging of one device's tensors straight into it for the next time (:meth:`Arena.repeat_for`).
    ``cow``: the contiguous CPU tensors copy-on-write where possible; the engine's CowCopy still copying
    them is returned (else None: every byte is there)."""
    if len(index) == 0:
        return None
    routes = np.frombuffer(sources.routes, np.int16)
    lowest, highest = int(routes.min()), int(routes.max())
    if lowest == highest:  # every source takes one route: no need to pick the copied ones' out
        routes = np.full(len(index), lowest, np.int16)
    else:
        routes = routes[index]
        lowest, highest = int(routes.min()), int(routes.max())
    addresses = np.frombuffer(sources.addresses, np.int64)[index]
    if zero_after is None:
        zero_after = np.zeros(len(index), np.int64)
    if lowest == highest == ROUTE_HOST:  # all on the host: one engine call
        return _copy_host(arena, np.column_stack((addresses, offsets, nbytes, zero_after)), threads,
                          cow, lambda: _pinned(sources, index))
    # The GPU copies are queued first, then the engine copies the CPU tensors (and zeroes the padding
    # after the tensors copied by value) meanwhile: every copy writes its own bytes, none overlap.
    flat = arena.bytes_tensor()
    queued: list[gather.Queued] = []
    cow_copy: native.CowCopy | None = None
    try:
        if lowest == highest >= 0:  # all on one GPU: no masks, every tensor a neighbour of the next
            copies = DeviceCopies(sources, index, addresses, offsets, nbytes, None, zero_after)
            mapped_staging = MappedStaging.of(copies, arena.mapped, arena.prepared)
            if mapped_staging is None:
                queued.append(queue_from_device(copies, flat, arena.mapped, arena.prepared))
                return None
            if key is not None:
                arena.remember(key, mapped_staging)
            queued.append(mapped_staging.issue(sources, flat))
            return None
        for device in np.unique(routes[routes >= 0]).tolist():
            on = np.flatnonzero(routes == device)
            queued.append(queue_from_device(DeviceCopies(sources, index[on], addresses[on], offsets[on], nbytes[on], on,
                                                         zero_after[on]), flat, arena.mapped, arena.prepared))
        host = np.flatnonzero(routes == ROUTE_HOST)
        others = np.flatnonzero(routes == ROUTE_TORCH)
        padded = others[zero_after[others] > 0]
        none = np.zeros(len(padded), np.int64)
        rows = np.vstack((np.column_stack((addresses[host], offsets[host], nbytes[host], zero_after[host])),
                          np.column_stack((none, offsets[padded] + nbytes[padded], none, zero_after[padded]))))
        if len(rows):
            cow_copy = _copy_host(arena, rows, threads, cow,
                                  lambda: np.concatenate((_pinned(sources, index[host]), np.zeros(len(padded), bool))))
        if others.size:
            _copy_by_value([(sources[i], offsets[k], nbytes[k])
                            for k, i in zip(others.tolist(), index[others].tolist(), strict=True)], flat)
        return cow_copy
    except BaseException:
        _finish_quietly(cow_copy)
        raise
    finally:  # also after an error: nothing may still be copying into the arena once this returns
        try:
            gather.wait_all(work.wait for work in queued)
        except BaseException:
            _finish_quietly(cow_copy)
            raise


def _copy_host(arena: Arena, rows: np.ndarray, threads: int, cow: bool,
               pinned: Callable[[], np.ndarray]) -> native.CowCopy | None:
    """The engine's copy of (address, offset, nbytes, zeros after) rows into the arena, or with ``cow``
    (and where :func:`cow_unavailable` allows) its copy-on-write CowCopy of them, still copying.
    ``pinned()``: which rows' memory is pinned for DMA (a GPU or NIC writes it without a page fault, so
    no write-protection can see it coming): those are copied now."""
    if cow and not cow_unavailable():
        dma = pinned()
        if dma.any():
            native.copy_from_addresses(arena.buffer, np.ascontiguousarray(rows[dma]), threads)
            rows = np.ascontiguousarray(rows[~dma])
        try:
            return native.CowCopy(arena.buffer, rows, threads, knobs.STAGE_COW_CHUNK_BYTES)
        except Exception as exc:  # noqa: BLE001 - out of memory or descriptors: nothing is protected, copy instead
            log.warning("copy-on-write staging failed (%s); copying the tensors instead", exc)
    native.copy_from_addresses(arena.buffer, rows, threads)
    return None


def _pinned(sources: Sources, index: np.ndarray) -> np.ndarray:
    """Which of ``sources[index]`` are in pinned (page-locked, DMA-mapped) host memory."""
    import torch

    if not torch.cuda.is_available():  # nothing is pinned without a CUDA runtime
        return np.zeros(len(index), bool)
    return np.fromiter((sources[i].is_pinned() for i in index.tolist()), bool, len(index))


def _finish_quietly(cow_copy: native.CowCopy | None) -> None:
    """Wait for a CowCopy that no one else will (an error is on its way already)."""
    if cow_copy is not None:
        with contextlib.suppress(RuntimeError):
            cow_copy.finish()


def _copy_by_value(items: list[tuple[Any, int, int]], flat: Any) -> None:
    """Copy (tensor, arena offset, nbytes) items one by one with ``Tensor.copy_`` (views, other devices)."""
    import torch

    streams: dict[Any, Any] = {}
    try:
        for tensor, offset, nbytes in items:
            stream = None
            if tensor.is_cuda:
                stream = streams.get(tensor.device)
                if stream is None:
                    stream = streams[tensor.device] = side_stream(tensor.device)
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                copy_values(typed_view(flat, int(offset), int(nbytes), tensor.dtype, tuple(tensor.shape)), tensor,
                            non_blocking=stream is not None)
    finally:  # also after an error: nothing may still be copying into the arena once this returns
        gather.wait_all(stream.synchronize for stream in streams.values())


_streams: dict[tuple[int, int], Any] = {}
GATHER_STREAM, COPY_STREAM = 0, 1


def side_stream(device: Any, role: int = GATHER_STREAM) -> Any:
    """This process's staging stream on CUDA ``device`` for ``role`` (gathering, or the copy engine's
    device-to-host copies), made to wait for the work already queued on the current stream there (the
    tensors' producers). One stream per device and role for the whole process, so the caching
    allocator reuses the gather buffers of earlier saves (its blocks belong to a stream)."""
    import torch

    index = gather.device_index(device)
    stream = _streams.get((index, role))
    if stream is None:
        stream = _streams.setdefault((index, role), torch.cuda.Stream(device=index))
    stream.wait_stream(torch.cuda.current_stream(index))
    return stream


def as_bytes(tensor: Any) -> Any:
    """A contiguous flat uint8 view of ``tensor`` (a copy only when it is not contiguous or has conj/neg bits)."""
    import torch

    if tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg():
        return tensor.view(-1).view(torch.uint8)
    return tensor.resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)


@dataclass(frozen=True)
class DeviceCopies:
    """Contiguous tensors of one device to stage, by arena offset: ``sources[index[k]]`` starts at
    ``addresses[k]`` and goes to ``offsets[k]`` in the arena, ``nbytes[k]`` long. ``positions[k]`` is
    its place among *all* the tensors staged into the arena, by offset: a gathered run may only span
    neighbours, or its zero padding would overwrite a tensor staged another way (a CPU tensor, say);
    None when these are all the tensors. ``zero_after[k]``: bytes of padding after it to zero (up to the next tensor of its shard file)."""

    sources: list[Any]
    index: np.ndarray
    addresses: np.ndarray
    offsets: np.ndarray
    nbytes: np.ndarray
    positions: np.ndarray | None
    zero_after: np.ndarray

    def where(self, mask: np.ndarray) -> DeviceCopies:
        """The copies that ``mask`` selects."""
        return DeviceCopies(self.sources, self.index[mask], self.addresses[mask], self.offsets[mask],
                            self.nbytes[mask], None if self.positions is None else self.positions[mask],
                            self.zero_after[mask])

    @classmethod
    def of(cls, items: list[tuple[Any, int, int, int]]) -> DeviceCopies:
        """From (tensor, arena offset, nbytes, zero bytes after) items (contiguous tensors, the arena's only
        ones), in any order."""
        items = sorted(items, key=lambda item: item[1])
        column = np.array([[t.data_ptr(), *rest] for t, *rest in items], np.int64).reshape(-1, 4)
        return cls([item[0] for item in items], np.arange(len(items)), *column[:, :3].T, None, column[:, 3])


def gather_runs(offsets: np.ndarray, nbytes: np.ndarray, max_gap: int, run_bytes: int,
                positions: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Split tensors sorted by arena offset into runs ``[first, stop)`` gathered as one piece each.

    A run ends where the next tensor starts more than ``max_gap`` bytes after the end of the last one,
    where another tensor lies between them (``positions``, each tensor's place among all the arena's,
    not consecutive), or where it would reach more than ``run_bytes`` past the run's start (a run is
    thus at most ``run_bytes`` plus one tensor long).
    """
    n = len(offsets)
    if n == 0:
        return []
    ends = offsets + nbytes
    breaks = np.zeros(n, bool)
    breaks[0] = True
    breaks[1:] = offsets[1:] - ends[:-1] > max_gap
    if positions is not None:
        breaks[1:] |= np.diff(positions) != 1
    first = np.flatnonzero(breaks)
    start_of = offsets[first][np.cumsum(breaks) - 1]  # each tensor's segment start
    piece = (offsets - start_of) // max(1, run_bytes)
    breaks[1:] |= piece[1:] != piece[:-1]
    first = np.flatnonzero(breaks).tolist()
    return list(zip(first, first[1:] + [n], strict=True))


def stage_from_device(copies: DeviceCopies, flat: Any, mapped: bool = False,
                      prepared: gather.Prepared | None = None) -> None:
    """:func:`queue_from_device`, then wait for it."""
    queue_from_device(copies, flat, mapped, prepared).wait()


def queue_from_device(copies: DeviceCopies, flat: Any, mapped: bool = False,
                      prepared: gather.Prepared | None = None) -> gather.Queued:
    """Queue the device-to-host copies of contiguous (CUDA) tensors into the (registered) arena ``flat``,
    and the zeroing of their padding, on side streams; :meth:`~gather.Queued.wait` waits for them.

    Big tensors are copied straight into their place by the copy engine. Small ones would each pay a
    copy's fixed cost (several microseconds), so a kernel (:mod:`ckptbench.checkpoint.gather`) copies
    thousands per launch: with ``mapped`` (``flat`` is registered host memory the GPU can address) and
    ``knobs.STAGE_GATHER_MAPPED`` (the default) straight into ``flat``; otherwise runs of neighbours in
    the arena (:func:`gather_runs`) are gathered into device buffers, one launch per batch of runs,
    while the copy engine moves the batches gathered before to the host. Where the kernel cannot be
    compiled, one ``torch.cat`` per run. ``prepared`` (the arena's) keeps the kernel's prepared work
    for the next staging of the same copies. Once waited for, nothing copies into the arena or reads
    the tensors any more.
    """
    import torch

    device = copies.sources[int(copies.index[0])].device if len(copies.index) else None
    if device is None:
        return gather.Queued((), [])
    mapped_staging = MappedStaging.of(copies, mapped, prepared)
    if mapped_staging is not None:
        return mapped_staging.issue(copies.sources, flat)
    cuda = device.type == "cuda"  # CPU tensors: how it is unit-tested, everything in order
    big, small, kernel = _by_size(copies, device)
    gather_stream = side_stream(device) if cuda else None
    copy_stream = side_stream(device, COPY_STREAM) if cuda else None
    queued = gather.Queued((gather_stream, copy_stream), [])
    try:
        rows = _big_rows(copies, big)
        _copy_big(rows, copies.sources, flat, copy_stream, cuda)
        if len(small.index):
            def runs() -> list[tuple[int, int]]:
                return gather_runs(small.offsets, small.nbytes, knobs.STAGE_GATHER_MAX_GAP_BYTES,
                                   knobs.STAGE_GATHER_RUN_BYTES, small.positions)

            if kernel is not None:
                ring = gather.Ring(device, (gather_stream, copy_stream), knobs.STAGE_GATHER_SLOTS, _slot_bytes(small))
                queued.keep.append(ring)
                gather.gather_to_host(kernel, ring, small.addresses, small.offsets, small.nbytes, small.zero_after,
                                      runs, flat, prepared)
            else:
                with torch.cuda.stream(gather_stream) if cuda else contextlib.nullcontext():
                    _cat_runs([small.sources[i] for i in small.index.tolist()], small.offsets.tolist(),
                              small.nbytes.tolist(), small.zero_after.tolist(), runs(), flat, device)
        _zero_after_big(rows, flat)
    except BaseException:
        queued.wait()
        raise
    return queued


@dataclass
class MappedStaging:
    """One device's contiguous tensors staged straight into the registered (mapped) arena, worked out:
    the big ones are copied by the copy engine on a side stream (``big``: source position, arena
    offset, bytes, padding after), the small ones by one launch of the gather kernel over its prepared
    table (``program``), on the current stream, after the tensors' producers. The arena keeps it and
    issues it again as it is for the next staging of the very same plan arrays (a Checkpointer's
    reused plan), with none of the per-tensor work of working it out."""

    device: Any
    big: list[tuple[int, int, int, int]]
    kernel: Any
    program: gather.Program | None

    @classmethod
    def of(cls, copies: DeviceCopies, mapped: bool, prepared: gather.Prepared | None) -> MappedStaging | None:
        """The mapped staging of ``copies``, or None where the kernel cannot write into the arena
        (not ``mapped``, no kernel, ``knobs.STAGE_GATHER_MAPPED`` off); its table from ``prepared``."""
        if not (mapped and knobs.STAGE_GATHER_MAPPED and len(copies.index)):
            return None
        device = copies.sources[int(copies.index[0])].device
        big, small, kernel = _by_size(copies, device)
        if len(small.index) and kernel is None:
            return None
        program = None
        if len(small.index):
            program = gather.prepared_direct(device, small.addresses, small.offsets, small.nbytes, small.zero_after,
                                             prepared)
        return cls(device, _big_rows(copies, big) if small is not copies else [], kernel, program)

    def issue(self, sources: list[Any], flat: Any) -> gather.Queued:
        """Queue it for ``sources`` (the tensors, by position) into ``flat``; returns without waiting."""
        cuda = self.device.type == "cuda"
        stream = gather.CurrentStream.of(self.device) if cuda else None
        # The copy engine's stream only where it copies something (joining a stream costs the host time).
        copy_stream = side_stream(self.device, COPY_STREAM) if cuda and self.big else None
        queued = gather.Queued((stream, copy_stream), [])
        try:
            _copy_big(self.big, sources, flat, copy_stream, cuda)
            if self.program is not None:
                gather.launch_direct(self.kernel, self.device, stream, self.program, flat)
                queued.keep.append(self.program.table)
            _zero_after_big(self.big, flat)
        except BaseException:
            queued.wait()
            raise
        return queued


def _by_size(copies: DeviceCopies, device: Any) -> tuple[np.ndarray, DeviceCopies, Any]:
    """Which ``copies`` are big (the copy engine's), the small ones (``copies`` itself when none is big),
    and the gather kernel for them (None when there are none, or no kernel)."""
    big = copies.nbytes >= knobs.STAGE_GATHER_BELOW_BYTES
    small = copies.where(~big) if big.any() else copies
    return big, small, gather.kernel_for(device) if len(small.index) else None


def _big_rows(copies: DeviceCopies, big: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(source position, arena offset, bytes, padding after) of the ``big`` copies, for the copy engine."""
    at = np.flatnonzero(big)
    return list(zip(copies.index[at].tolist(), copies.offsets[at].tolist(), copies.nbytes[at].tolist(),
                    copies.zero_after[at].tolist(), strict=True))


def _copy_big(rows: list[tuple[int, int, int, int]], sources: list[Any], flat: Any, stream: Any, cuda: bool) -> None:
    """Queue the copy engine's copies of ``rows`` on ``stream`` (first in its queue: nothing to wait for)."""
    import torch

    if not rows:
        return
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for i, offset, nbytes, _ in rows:
            flat[offset:offset + nbytes].copy_(as_bytes(sources[i]), non_blocking=cuda)


def _zero_after_big(rows: list[tuple[int, int, int, int]], flat: Any) -> None:
    """Zero the padding after the big copies, on the host (the copies write only their own bytes)."""
    for _, offset, nbytes, zeros in rows:
        if zeros:
            flat[offset + nbytes:offset + nbytes + zeros].zero_()


def _slot_bytes(small: DeviceCopies) -> int:
    """A gather buffer's size: a batch (up to ``knobs.STAGE_GATHER_RUN_BYTES``, plus the tensor that
    crosses it and padding), or everything when that is less."""
    everything = int(small.offsets[-1] + small.nbytes[-1] + small.zero_after[-1] - small.offsets[0])
    return min(everything, knobs.STAGE_GATHER_RUN_BYTES + knobs.STAGE_GATHER_BELOW_BYTES + 2 * 4096)


def _cat_runs(sources: list[Any], offsets: list[int], nbytes: list[int], zero_after: list[int],
              runs: list[tuple[int, int]], flat: Any, device: Any) -> None:
    """Gather each run with one ``torch.cat`` (zeros between tensors and after the last, its padding)
    and copy it to the arena."""
    import torch

    pad = torch.zeros(max(knobs.STAGE_GATHER_MAX_GAP_BYTES, max(zero_after, default=0)), dtype=torch.uint8,
                      device=device)
    for first, stop in runs:
        start = offsets[first]
        parts = []
        for k in range(first, stop):
            parts.append(as_bytes(sources[k]))
            gap = offsets[k + 1] - offsets[k] - nbytes[k] if k + 1 < stop else zero_after[k]
            if gap:
                parts.append(pad[:gap])
        gathered = parts[0] if len(parts) == 1 else torch.cat(parts)
        flat[start:start + len(gathered)].copy_(gathered, non_blocking=device.type == "cuda")
