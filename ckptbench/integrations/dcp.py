"""``torch.distributed.checkpoint`` storage backed by ckptbench's engine: :class:`Writer` and :class:`Reader`.

    import torch.distributed.checkpoint as dcp
    from ckptbench.integrations.dcp import Reader, Writer

    dcp.save(state_dict, storage_writer=Writer("/ckpt/step-1000"))
    dcp.load(state_dict, storage_reader=Reader("/ckpt/step-1000"))

    writer = Writer("/ckpt")                      # keep one: its staging memory is reused
    future = dcp.async_save(state_dict, storage_writer=writer, checkpoint_id="/ckpt/step-2000")
    ...                                           # training continues; the writer staged the tensors
    future.result()                               # durable

Single process (no process group) and multi-process (any backend with a CPU side, e.g. gloo) work
alike; ranks must see one shared directory, as with ``FileSystemWriter``.

**What lands on disk.** FileSystemWriter's layout: data files ``__{rank}_{n}.{save}.distcp`` and one
``.metadata`` (the pickled DCP ``Metadata``), whose ``storage_data`` maps every item to torch's own
``_StorageInfo(relative_path, offset, length, transform_descriptors)``. What differs is how a tensor
is stored. With ``serialization="raw"`` (the default) it is its bytes, row-major in the chunk's shape,
starting 64-byte aligned, with the descriptor ``ckptbench-raw/1;DTYPE;SHAPE;crc32c=BLOCK:CRC,...``:
no pickling, no zip, nothing to parse, and CRC-32C per 64 MiB verified on load. Non-tensor values
(``BYTE_IO`` items) are stored exactly as DCP stores them (their ``torch.save`` bytes), and so are
tensors that are more than their bytes (quantized: scale and zero point; sparse, nested). With
``serialization="torch_save"`` every tensor is a ``torch.save`` blob as FileSystemWriter writes it,
so the checkpoint is byte-for-byte stock format.

**Interoperability.** :class:`Reader` loads checkpoints written by :class:`Writer` (either
serialization) and by torch's ``FileSystemWriter`` (``torch_save`` serialization, with or without
its stream extensions). Torch's ``FileSystemReader`` loads a ``torch_save`` checkpoint of ours as is,
and a ``raw`` one when given ``_extension_registry=extension_registry()``; without it, it stops with
``ValueError: Unknown extension name='ckptbench-raw'`` (as does ``dcp.load(checkpoint_id=...)``
without a ``storage_reader``, which picks FileSystemReader).

**Durability.** When ``write_data`` returns on a rank, that rank's data files are on the device
(O_DIRECT where the filesystem allows it, every file fdatasynced, the directory fsynced). ``finish``
(the coordinator, after every rank's ``write_data``) writes ``.metadata`` to a temporary name,
fsyncs it, renames it into place and fsyncs the directory: only then does the checkpoint exist. A
save never overwrites the files of a committed checkpoint (data files carry a per-save id); files of
earlier saves are removed only after the new ``.metadata`` is committed. A failed write removes the
files it created and leaves no ``.metadata``.

Importing this module does not import torch: ``Writer``, ``Reader`` and ``RawTensorExtension``
subclass torch's DCP classes and are created on first access (their logic lives in ``_Writer``,
``_Reader`` and ``_RawTensorExtension``).
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import functools
import gc
import io
import logging
import math
import os
import pickle
import re
import secrets
import threading
import time
import types
import weakref
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from ckptbench import interrupts, knobs, native
from ckptbench.checkpoint.manifest import CorruptCheckpointError, NotACheckpointError
from ckptbench.checkpoint.plan import (
    BIG_ALIGN,
    BIG_TENSOR_BYTES,
    CHECKSUM_BLOCK_BYTES,
    SMALL_ALIGN,
    padding_after,
)
from ckptbench.checkpoint.routing import Sources
from ckptbench.checkpoint.stage import Arena, copy_into_arena, dtype_of, typed_view
from ckptbench.errors import (
    DcpCheckpointExistsError,
    InsufficientSpaceError,
    MissingDependencyError,
    StorageIOError,
    TargetError,
    UnsafeFileError,
    UsageError,
)
from ckptbench.interrupts import QuietThread
from ckptbench.storage import scheme_of
from ckptbench.storage.store import Store, open_store
from ckptbench.units import format_size

if TYPE_CHECKING:
    import torch
    from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
    from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner, WriteItem
    from torch.distributed.checkpoint.staging import AsyncStager
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
    from torch.futures import Future

__all__ = ["RAW_EXTENSION", "RawTensorExtension", "Reader", "SaveStats", "Writer", "extension_registry",
           "release_staging_memory"]

log = logging.getLogger(__name__)

#: The metadata file DCP's readers look for.
METADATA_NAME = ".metadata"
#: Transform-descriptor name of a tensor stored as raw bytes.
RAW_EXTENSION = "ckptbench-raw"
_RAW_VERSION = "1"
_PAGE = knobs.ALIGNMENT_BYTES
#: Inside a file every item starts at this alignment, so any dtype can be viewed in place on load.
_ITEM_ALIGN = SMALL_ALIGN
#: Staged tensors further apart than this in memory go to separate files (the gap is not written).
_SEGMENT_GAP_BYTES = 256 * 1024
#: A rank's data is spread over at most ``files_per_rank`` files of at least this size.
_MIN_FILE_BYTES = 16 * 2**20
#: Reads of one file closer than this are merged into one request.
_READ_MERGE_GAP_BYTES = 1 * 2**20
#: Default bound of the reader's aligned buffer; bigger checkpoints are read in batches of this size.
READ_BUFFER_BYTES = 1 * 2**30

#: Data files of a DCP checkpoint: ours, named by rank and save, and FileSystemWriter's (``__{rank}_{n}.distcp``,
#: left by a checkpoint of torch's that a save of ours replaced); the metadata's temp names, ours and torch's.
_DATA_FILE = re.compile(r"^__(?P<rank>\d+)_\d+(\.(?P<tag>[0-9a-f]{8}))?\.distcp$")
_TMP_METADATA = re.compile(r"^(\.(__(?P<rank>\d+))?\.metadata\.tmp-[0-9a-f]{8}|(__(?P<torch_rank>\d+))?\.metadata\.tmp)$")
#: Committed metadata: ``.metadata`` (collective saves) or ``__{rank}.metadata`` (per-rank saves).
_METADATA_FILE = re.compile(r"^(__(?P<rank>\d+))?\.metadata$")


class _Url(str):
    """An object-storage checkpoint location (``s3://bucket/prefix``): a string that joins a name
    with ``/`` as a Path does, so messages name objects as they name files."""

    def __truediv__(self, name: str) -> str:
        return f"{self.rstrip('/')}/{name}"


def _location(path: str | os.PathLike) -> Path | _Url:
    """A checkpoint location: a directory (a path, or ``file://``) as a Path, a URL as it is."""
    text = os.fspath(path)
    return Path(text.removeprefix("file://")) if scheme_of(text) == "file" else _Url(text)


def _valid_checkpoint_id(checkpoint_id: str | os.PathLike) -> bool:
    """A URL that ckptbench can store to (``s3://``, or a protocol fsspec knows), or what torch's
    FileSystem accepts (a directory it can create)."""
    text = os.fspath(checkpoint_id)
    scheme = scheme_of(text)
    if scheme != "file":
        from ckptbench.storage.store import STORES

        if scheme in STORES:
            return True
        try:
            import fsspec
            from fsspec.registry import known_implementations
        except ImportError:
            return False
        return scheme in known_implementations or scheme in fsspec.registry
    from torch.distributed.checkpoint.filesystem import FileSystem

    if text.startswith("file://"):  # ours (``_location``), not torch's: it refuses anything with ``://``
        checkpoint_id = text.removeprefix("file://")
    return FileSystem.validate_checkpoint_id(checkpoint_id)


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _align_down(value: int, alignment: int) -> int:
    return value // alignment * alignment


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- the raw tensor descriptor ----------------------------------------------------------------


@dataclass(frozen=True)
class _RawDescriptor:
    """How a raw tensor is stored: dtype, chunk shape, and CRC-32C of each ``crc_block`` bytes."""

    dtype: str
    shape: tuple[int, ...]
    crc_block: int = 0
    crcs: tuple[int, ...] = ()

    def encode(self) -> str:
        text = f"{RAW_EXTENSION}/{_RAW_VERSION};{self.dtype};{','.join(map(str, self.shape))}"
        if self.crcs:
            text += f";crc32c={self.crc_block}:{','.join(f'{c:08x}' for c in self.crcs)}"
        return text

    @classmethod
    def parse_version(cls, version: str) -> _RawDescriptor:
        """Parse what follows ``ckptbench-raw/`` (ExtensionRegistry hands extensions this part)."""
        parts = version.split(";")
        if len(parts) < 3 or parts[0] != _RAW_VERSION:
            raise CorruptCheckpointError(f"unsupported {RAW_EXTENSION} descriptor {version!r}",
                                         hint=f"this ckptbench reads {RAW_EXTENSION}/{_RAW_VERSION}")
        shape = tuple(int(d) for d in parts[2].split(",") if d)
        crc_block, crcs = 0, ()
        for extra in parts[3:]:
            key, _, value = extra.partition("=")
            if key == "crc32c":
                block, _, listed = value.partition(":")
                crc_block, crcs = int(block), tuple(int(c, 16) for c in listed.split(",") if c)
        return cls(parts[1], shape, crc_block, crcs)

    @classmethod
    def find(cls, descriptors: Sequence[str] | None) -> _RawDescriptor | None:
        for desc in descriptors or ():
            name, _, version = desc.partition("/")
            if name == RAW_EXTENSION:
                return cls.parse_version(version)
        return None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_of(self.dtype).itemsize


class _RawTensorExtension:
    """Lets torch's own ``FileSystemReader`` read tensors that :class:`Writer` stored raw.

    It turns the raw bytes of one chunk back into the ``torch.save`` stream FileSystemReader expects
    (one extra copy per tensor: an escape hatch, not a fast path). Use :func:`extension_registry`.
    """

    def __init__(self, descriptor: _RawDescriptor) -> None:
        self.descriptor = descriptor

    @staticmethod
    def registry_name() -> str:
        return RAW_EXTENSION

    @classmethod
    def from_descriptor(cls, version: str) -> _RawTensorExtension:
        return cls(_RawDescriptor.parse_version(version))

    def get_descriptor(self) -> str:
        return self.descriptor.encode()

    def transform_to(self, output: IO[bytes]) -> IO[bytes]:
        raise UsageError(f"{RAW_EXTENSION} is written by ckptbench.integrations.dcp.Writer, not as a stream extension")

    def transform_from(self, input: IO[bytes]) -> IO[bytes]:
        import torch

        data = bytearray(input.read())
        d = self.descriptor
        dtype = dtype_of(d.dtype)
        if len(data) != d.nbytes:
            raise CorruptCheckpointError(f"raw tensor holds {len(data)} bytes; its descriptor says {d.nbytes}")
        tensor = torch.frombuffer(data, dtype=torch.uint8).view(dtype).view(d.shape) if data else \
            torch.empty(d.shape, dtype=dtype)
        out = io.BytesIO()
        torch.save(tensor, out)
        out.seek(0)
        return out


def extension_registry() -> ExtensionRegistry:
    """An ExtensionRegistry for ``FileSystemReader(path, _extension_registry=...)`` that reads raw tensors."""
    from torch.distributed.checkpoint._extension import ExtensionRegistry

    registry = ExtensionRegistry()
    registry.register(_classes()["RawTensorExtension"])
    return registry


# -- copying tensors into an arena ------------------------------------------------------------


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _copy_into(arena: Arena, placements: Sequence[tuple[torch.Tensor, int, int]], threads: int) -> None:
    """Copy each tensor's bytes (row-major) to its arena offset and zero the third value's count of
    bytes after it (padding, which would otherwise carry what the reused arena held before); returns
    when every byte is there (``checkpoint.stage.copy_into_arena``: the engine for CPU tensors, one
    gather for small GPU ones)."""
    import numpy as np
    import torch

    sources = Sources(tensor for tensor, _, _ in placements)
    offsets = np.fromiter((offset for _, offset, _ in placements), np.int64, len(placements))
    padding = np.fromiter((pad for _, _, pad in placements), np.int64, len(placements))
    nbytes = np.fromiter((_nbytes(tensor) for tensor, _, _ in placements), np.int64, len(placements))
    order = np.argsort(offsets, kind="stable")
    keep = order[nbytes[order] > 0]
    with torch.no_grad():
        copy_into_arena(sources, keep, offsets[keep], nbytes[keep], arena, threads, zero_after=padding[keep])


# -- staging (AsyncStager) --------------------------------------------------------------------


@functools.cache
def _distributed_tensor_types() -> tuple[type, type]:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    return DTensor, ShardedTensor


def _raw_storable(tensor: torch.Tensor) -> bool:
    """Whether a tensor is its values' bytes: dense and strided, not quantized (a quantized tensor's
    scale and zero point, a sparse one's indices live outside them). Others go as ``torch.save``."""
    import torch

    return tensor.layout == torch.strided and not tensor.is_quantized and not tensor.is_nested


def _local_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The local tensors of a state_dict that staging copies as bytes, in the order :func:`_rebuild`
    consumes them."""
    import torch

    DTensor, ShardedTensor = _distributed_tensor_types()
    if isinstance(obj, DTensor):
        yield obj._local_tensor
    elif isinstance(obj, ShardedTensor):
        for shard in obj.local_shards():
            yield shard.tensor
    elif isinstance(obj, torch.Tensor):
        if _raw_storable(obj):
            yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _local_tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _local_tensors(value)


def _rebuild(obj: Any, staged: Iterator[torch.Tensor]) -> Any:
    """``obj`` with every local tensor replaced by the next staged one (same structure and wrappers)."""
    import torch

    DTensor, ShardedTensor = _distributed_tensor_types()
    if isinstance(obj, DTensor):
        return DTensor(next(staged), obj._spec, requires_grad=False)
    if isinstance(obj, ShardedTensor):
        # As torch's own stager does it; ShardedTensor is deprecated upstream.
        out = obj.to("cpu") if obj.device.type != "cpu" else copy.deepcopy(obj)
        for shard in out.local_shards():
            shard.tensor = next(staged)
        return out
    if isinstance(obj, torch.Tensor):
        return next(staged) if _raw_storable(obj) else obj.detach().clone()
    if isinstance(obj, Mapping):
        return {key: _rebuild(value, staged) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_rebuild(value, staged) for value in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(value, staged) for value in obj)
    if obj is None or isinstance(obj, (int, float, str, bytes, io.BytesIO)):
        return obj
    return copy.deepcopy(obj)


class _ArenaPool:
    """Idle staging arenas shared by every Writer of this process, so a new ``Writer(path)`` per save
    reuses the memory the last save staged into instead of allocating and faulting in a fresh arena
    (about 1 GB/s) each time.

    A Writer takes an arena for a save (``take``: the smallest idle one that fits, else the biggest,
    grown) and gives it back when the save's use of it has ended (``give``). At most
    ``knobs.DCP_IDLE_ARENAS`` stay idle (the biggest); each is freed after ``knobs.DCP_ARENA_IDLE_S``
    seconds unused, or at once by :func:`release_staging_memory` (and ``Writer.close``).
    """

    def __init__(self) -> None:
        self._idle: list[tuple[Arena, float]] = []  # (arena, time it was given back)
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def take(self, nbytes: int) -> Arena:
        with self._lock:
            fitting = [entry for entry in self._idle if entry[0].nbytes >= nbytes]
            chosen = (min(fitting, key=lambda e: e[0].nbytes) if fitting
                      else max(self._idle, key=lambda e: e[0].nbytes, default=None))
            if chosen is not None:
                self._idle.remove(chosen)
            spares = [] if fitting else [arena for arena, _ in self._idle]
            if spares:  # a bigger arena is needed: the smaller idle ones are no use, free them first
                self._idle = []
        for arena in spares:
            arena.close()
        arena = chosen[0] if chosen is not None else Arena()
        try:
            arena.ensure(nbytes)
        except BaseException:
            self.give(arena)
            raise
        return arena

    def give(self, arena: Arena) -> None:
        if arena.buffer is None:
            return
        with self._lock:
            self._idle.append((arena, time.monotonic()))
            self._idle.sort(key=lambda e: e[0].nbytes, reverse=True)
            surplus = self._idle[knobs.DCP_IDLE_ARENAS:]
            del self._idle[knobs.DCP_IDLE_ARENAS:]
            self._arm()
        for spare, _ in surplus:
            spare.close()

    def _arm(self) -> None:
        """Start the timer that frees arenas idle too long (called with the lock held)."""
        if self._timer is None and self._idle:
            self._timer = threading.Timer(knobs.DCP_ARENA_IDLE_S, self._expire)
            self._timer.daemon = True
            self._timer.name = "ckptbench-dcp-arena-idle"
            self._timer.start()

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._timer = None
            expired = [arena for arena, since in self._idle if now - since >= knobs.DCP_ARENA_IDLE_S]
            self._idle = [entry for entry in self._idle if entry[0] not in expired]
            if self._idle:
                oldest = min(since for _, since in self._idle)
                self._timer = threading.Timer(max(0.0, oldest + knobs.DCP_ARENA_IDLE_S - now), self._expire)
                self._timer.daemon = True
                self._timer.start()
        for arena in expired:
            arena.close()
        if expired:
            log.debug("freed %d idle DCP staging arena(s)", len(expired))

    def clear(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for arena, _ in idle:
            arena.close()

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return sum(arena.nbytes for arena, _ in self._idle)


_POOL = _ArenaPool()


@dataclass
class _WriterMemory:
    """A Writer's staging memory (see ``_Writer._adopt_memory``)."""

    arena: Arena
    stagings: list[_Staging]

    def bequeath(self) -> None:
        """The writer is gone: its arenas no save needs any more go to the pool, for the next Writer.
        One still in use (a failed save's staged tensors still referenced) is freed with its tensors."""
        _POOL.give(self.arena)
        for staging in self.stagings:
            if not staging.in_use:
                _POOL.give(staging.arena)


def release_staging_memory() -> None:
    """Free the idle staging memory the DCP Writers of this process keep for their next saves."""
    _POOL.clear()


class _Staging:
    """A staging arena and what may still read it.

    ``pending``: a state_dict staged into it (or a ``write_data`` reading it) whose save has not ended
    in this writer's ``write_data``. The staged tensors: each one's memory is a window of the arena
    that its storage holds (views of it share that storage); weak references to the windows tell
    whether any staged tensor is left. The arena may be staged over once it is not :attr:`in_use`.
    """

    def __init__(self, arena: Arena | None = None) -> None:
        self.arena = arena if arena is not None else Arena()
        self.pending = False
        self._windows: list[weakref.ref[memoryview]] = []

    @property
    def in_use(self) -> bool:
        """Its save has not ended and a staged tensor still exists: someone may read these bytes.

        A save that ended in our ``write_data`` is over for the staged bytes (DCP's ``finish`` reads
        none). Any other reader (another storage writer, a process executor, a caller) reads through
        the staged tensors, so once none is left nobody can; a save that failed before writing is over
        once its staged tensors are gone too."""
        return self.pending and any(window() is not None for window in self._windows)

    def restage(self) -> None:
        """Forget the previous staged tensors (their save is over); the caller stages over the arena."""
        self._windows = []
        self.pending = True

    def tensor(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A staged tensor over ``[offset, offset + nbytes)`` of the arena, tracked (see :func:`_over`)."""
        window = memoryview(self.arena.buffer)[offset:offset + nbytes]
        if nbytes:
            self._windows.append(weakref.ref(window))
        return _over(window, dtype, shape)

    def contains(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage lies in this arena (a staged tensor, or a view of one)."""
        buffer = self.arena.buffer
        if buffer is None or tensor.device.type != "cpu":
            return False
        return 0 <= tensor.untyped_storage().data_ptr() - buffer.address < len(buffer)

    def holds(self, tensor: torch.Tensor) -> int | None:
        """The arena offset of ``tensor``'s bytes when they lie in this arena as-is, else None."""
        buffer = self.arena.buffer
        if buffer is None or tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.is_conj() \
                or tensor.is_neg():
            return None
        offset = tensor.data_ptr() - buffer.address
        return offset if offset >= 0 and offset + _nbytes(tensor) <= len(buffer) else None


# -- planning a rank's files (pure) -----------------------------------------------------------


@dataclass(frozen=True)
class _RankPrefix:
    """``SavePlan.storage_data`` between planning and writing: the file-name prefix of one rank, and the
    durable mode the coordinator settled for every rank (None: each rank's own, ``_durable_mode``)."""

    prefix: str
    direct: bool | None = None


def _settled_direct(plan: SavePlan) -> bool | None:
    """The durable mode the coordinator settled for every rank (``Writer.prepare_global_plan``), if any."""
    return plan.storage_data.direct if isinstance(plan.storage_data, _RankPrefix) else None


def _plan_bytes(plan: SavePlan) -> int:
    """The tensor bytes a rank's save plan writes (what the durable-mode measurement is sized by)."""
    total = 0
    for item in plan.items:
        if item.tensor_data is not None:
            total += math.prod(item.tensor_data.chunk.sizes) * item.tensor_data.properties.dtype.itemsize
    return total


@dataclass(frozen=True)
class _Placed:
    """Where one item's bytes sit before writing: ``source`` 0 = the writer's arena, 1 = staged in place."""

    index: int
    source: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _File:
    """One data file: the byte range ``[start, end)`` of one source buffer, and the items in it."""

    source: int
    start: int
    end: int
    items: tuple[_Placed, ...]


def _bucket_copies(items: Sequence[_Placed], files: int) -> list[list[_Placed]]:
    """Items to copy, largest first onto the lightest of ``files`` buckets (empty buckets dropped)."""
    buckets: list[list[_Placed]] = [[] for _ in range(max(1, files))]
    loads = [0] * len(buckets)
    for p in sorted(items, key=lambda p: -p.nbytes):
        lightest = loads.index(min(loads))
        buckets[lightest].append(p)
        loads[lightest] += p.nbytes
    return [b for b in buckets if b]


def _layout_copies(buckets: Sequence[Sequence[_Placed]]) -> tuple[list[_File], int]:
    """Each bucket becomes one page-aligned run of the arena (items 64-byte aligned inside): the
    files to write and the arena bytes they need."""
    files: list[_File] = []
    cursor = 0
    for bucket in buckets:
        start = cursor = _align_up(cursor, _PAGE)
        laid = []
        for p in bucket:
            cursor = _align_up(cursor, _ITEM_ALIGN)
            laid.append(dataclasses.replace(p, offset=cursor))
            cursor += p.nbytes
        files.append(_File(0, start, cursor, tuple(laid)))
    return files, cursor


def _staged_runs(items: Sequence[_Placed], files: int) -> list[_File]:
    """Items already in the staging arena, in address order, cut into about ``files`` contiguous runs
    of similar size, and also wherever a gap is too large to write along (tensors this rank does not
    save). Each run starts page-aligned, so the engine can write it with O_DIRECT straight from memory."""
    ordered = sorted(items, key=lambda p: p.offset)
    target = -(-sum(p.nbytes for p in ordered) // max(1, files))
    out: list[_File] = []
    run: list[_Placed] = []
    start = end = run_bytes = 0
    for p in ordered:
        if run and (p.offset - end > _SEGMENT_GAP_BYTES or run_bytes >= target):
            out.append(_File(1, start, end, tuple(run)))
            run = []
        if not run:
            start, end, run_bytes = _align_down(p.offset, _PAGE), p.offset, 0
        run.append(p)
        end = max(end, p.offset + p.nbytes)
        run_bytes += p.nbytes
    if run:
        out.append(_File(1, start, end, tuple(run)))
    return out


@dataclass(frozen=True)
class SaveStats:
    """What one rank's ``write_data`` did (``Writer.last_stats``). ``stage_s``: resolving and copying
    into the arena; ``write_s``: the engine's write including fdatasync of every file and the directory."""

    bytes: int
    files: int
    items: int
    in_place_bytes: int
    stage_s: float
    write_s: float
    direct: bool
    sync: str
    fallback_reason: str | None = None

    @property
    def gbps(self) -> float:
        total = self.stage_s + self.write_s
        return self.bytes / total / 1e9 if total > 0 else float("inf")


# -- the writer -------------------------------------------------------------------------------


@dataclass
class _SaveTarget:
    """Where one save through a Writer goes, and as which rank: what ``reset`` and
    ``set_up_storage_writer`` set. DCP calls every step of a save on one thread, so a Writer keeps one
    per thread: a second save through it (an ``async_save`` started before the last one ended) never
    moves the files or the commit of the first."""

    path: Path | _Url
    save_id: str
    rank: int | None = None
    use_collectives: bool = True
    tag: str = ""
    set_up: bool = False  # set_up_storage_writer ran for this save
    done: bool = False  # this rank's part of the save ended (write_data, or finish on the coordinator)
    coordinator: bool = False


#: Every Writer of this process: a save's sweep spares the files that saves through any of them are writing.
_WRITERS: weakref.WeakSet[_Writer] = weakref.WeakSet()
_WRITERS_LOCK = threading.Lock()


class _Writer:
    """A DCP StorageWriter that writes through ckptbench's engine (and an AsyncStager for async_save).

    DCP calls, per save (``torch/distributed/checkpoint/storage.py``):

    0. (all ranks)   ``reset(checkpoint_id)`` - only when ``dcp.save`` is given a ``checkpoint_id``
    1. (all ranks)   ``set_up_storage_writer`` - records rank and coordination, draws this save's id
    2. (all ranks)   ``prepare_local_plan`` - creates the directory; refuses an existing checkpoint when
                     ``overwrite`` is False (nothing is written then)
    3. (coordinator) ``prepare_global_plan`` - gives every rank its file prefix ``__{rank}_``
    4. (all ranks)   ``write_data`` - resolves every item, copies it into one page-aligned arena (or
                     leaves it where :meth:`stage` put it), writes all files with one engine call;
                     returns a completed Future once this rank's files are durable. Once it returns
                     or raises, the staging arena it read may be staged over
    5. (coordinator) ``finish`` - commits ``.metadata`` atomically; the checkpoint exists from here

    ``dcp.async_save(sd, storage_writer=writer)`` first calls :meth:`stage` on the caller's thread.

    A drop-in for torch's ``FileSystemWriter``: it takes the same arguments, positional or keyword,
    in the same order (``path, single_file_per_rank, sync_files, thread_count, per_thread_copy_ahead,
    cache_staged_state_dict, overwrite, _extensions, serialization_format``), and its own after them
    (keyword only). What each of torch's does here:

    - ``thread_count``: the engine's threads (the same as ``threads``; default ``knobs.SAVE_THREADS``
      where FileSystemWriter's is 1).
    - ``single_file_per_rank=True``: FileSystemWriter's default, which writes one file per thread;
      so do we (``files_per_rank``). False (a file per tensor) is refused with the reason.
    - ``sync_files``: every file is fdatasynced and the directory fsynced either way; False gives
      no weaker guarantee here, and no speed (the engine's O_DIRECT writes need the sync anyway).
    - ``per_thread_copy_ahead``: accepted and unused (staging copies everything ahead of the write).
    - ``cache_staged_state_dict``: accepted; the staging memory is always reused (see below).
    - ``overwrite``: as torch's: False raises, with torch's message, before anything is written.
    - ``_extensions``: stream transforms (compression) are refused unless empty.
    - ``serialization_format``: TORCH_SAVE means ``serialization="torch_save"``; SAFETENSORS is refused.

    Args:
        path: checkpoint directory (created if missing, parents included).
        threads: engine threads for copying and writing (default ``knobs.SAVE_THREADS``).
        files_per_rank: at most this many data files per rank (default ``threads``), each at least
            16 MiB; several files let filesystems that serialise appends to one file write in parallel.
        block_size: bytes per pwrite (default ``knobs.SAVE_BLOCK_BYTES``).
        direct: True: O_DIRECT where the filesystem allows it (elsewhere buffered + fdatasync, logged,
            and in ``last_stats``); False: buffered + fdatasync; None (default): the faster of the two
            for the target's mount (``checkpoint.tuning``). Either way every file is fdatasynced and the
            directory fsynced.
        checksum: store CRC-32C of raw tensors (verified by :class:`Reader`).
        serialization: ``"raw"`` (tensor bytes) or ``"torch_save"`` (FileSystemWriter's exact format).
        overwrite: replace a checkpoint already at ``path`` (the old one stays loadable until the new
            ``.metadata`` commits); False raises CheckpointExistsError before anything is written.

    The staging memory (the size of this rank's checkpoint) is shared by every Writer of the process:
    a save takes an idle arena that fits from a process-wide pool and gives it back when it ends, so
    a new ``Writer(path)`` per save is as fast as one Writer kept (pass ``checkpoint_id=`` to each
    save). Idle arenas are freed after ``CKPTBENCH_DCP_ARENA_IDLE_S`` (300 s), by :meth:`close`, or by
    :func:`release_staging_memory`. A second arena is taken only while the first is still in use
    (see :meth:`stage`).

    Saves through one Writer may overlap in a process (an ``async_save`` started before the last one's
    future completed): each goes where its own ``checkpoint_id`` said, since what ``reset`` and
    ``set_up_storage_writer`` set is kept per thread (DCP runs every step of a save on one thread; see
    ``_SaveTarget``); their ``write_data`` calls take turns, and a save's sweep of stale files spares
    those of a save still being written (through any Writer of the process). (FileSystemWriter's ``reset`` repoints a save in flight.)
    Under a process group, DCP's own collectives still need one save at a time: wait for the future.
    """

    _synchronize_after_execute: bool = False  # stage() returns only when its copy is complete

    def __init__(
        self,
        path: str | os.PathLike,
        single_file_per_rank: bool = True,
        sync_files: bool = True,
        thread_count: int | None = None,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        overwrite: bool = True,
        _extensions: Sequence[Any] | None = None,
        serialization_format: Any = None,
        *,
        threads: int | None = None,
        files_per_rank: int | None = None,
        block_size: int | None = None,
        direct: bool | None = None,
        checksum: bool = True,
        serialization: Literal["raw", "torch_save"] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        from ckptbench.checkpoint import tuning

        tuning.check_direct(direct)
        # Where a save goes unless its own reset says otherwise (see _SaveTarget).
        self._shared = _SaveTarget(_location(path), secrets.token_hex(8), tag=secrets.token_hex(4))
        self._saves: dict[int, _SaveTarget] = {}  # this writer's saves, by the thread that runs each
        self.storage_options = dict(storage_options or {})
        threads = _same_setting("thread_count", thread_count, "threads", threads)
        serialization = _same_setting("serialization_format", _serialization_of(serialization_format),
                                      "serialization", serialization) or "raw"
        if not single_file_per_rank:
            raise UsageError("single_file_per_rank=False (a file per tensor) is not supported by ckptbench's Writer",
                             hint="leave it True (a file per thread, as FileSystemWriter does) or set files_per_rank=")
        if _extensions:
            raise UsageError(f"_extensions ({', '.join(type(e).__name__ for e in _extensions)}) are not supported by "
                             "ckptbench's Writer: it stores tensors as their bytes, with no stream transforms",
                             hint="use torch's FileSystemWriter for compressed checkpoints")
        if isinstance(per_thread_copy_ahead, bool) or not isinstance(per_thread_copy_ahead, int) \
                or per_thread_copy_ahead < 0:
            raise UsageError(f"per_thread_copy_ahead must be an int >= 0, got {per_thread_copy_ahead!r}")
        self.sync_files = True  # always: see the class docstring
        if not sync_files:
            log.info("sync_files=False: ckptbench's Writer makes every file durable all the same")
        self.cache_staged_state_dict = cache_staged_state_dict
        self.threads = threads if threads is not None else knobs.SAVE_THREADS
        self.files_per_rank = files_per_rank if files_per_rank is not None else self.threads
        self.block_size = block_size if block_size is not None else knobs.SAVE_BLOCK_BYTES
        if self.threads < 1 or self.files_per_rank < 1 or self.block_size < 1:
            raise UsageError(f"threads ({self.threads}), files_per_rank ({self.files_per_rank}) and block_size "
                             f"({self.block_size}) must be positive")
        if serialization not in ("raw", "torch_save"):
            raise UsageError(f"serialization must be 'raw' or 'torch_save', not {serialization!r}")
        self.direct = direct
        self.checksum = checksum
        self.serialization = serialization
        self.overwrite = overwrite
        self.last_stats: SaveStats | None = None
        self._adopt_memory()
        self._write_lock = threading.Lock()  # one write_data at a time uses the arena
        self._stage_lock = threading.Lock()  # guards the staging arenas and their state
        with _WRITERS_LOCK:
            _WRITERS.add(self)

    # The arenas and locks stay in this process (DCP's process-based async executor pickles the writer).
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for transient in ("_memory", "_write_lock", "_stage_lock", "_saves"):
            state.pop(transient)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._saves = {}
        self._adopt_memory()
        self._write_lock, self._stage_lock = threading.Lock(), threading.Lock()
        with _WRITERS_LOCK:
            _WRITERS.add(self)

    def _adopt_memory(self) -> None:
        """This writer's staging memory: a copy arena and the staging arenas (those in use by saves in
        flight, and at most one idle). Both are taken from the process's pool when first needed and
        given back to it when the writer is garbage-collected (or at :meth:`close`, freed)."""
        self._memory = _WriterMemory(Arena(), [])
        weakref.finalize(self, self._memory.bequeath)

    @property
    def _arena(self) -> Arena:
        return self._memory.arena

    @property
    def _stagings(self) -> list[_Staging]:
        return self._memory.stagings

    @property
    def _store(self) -> Store:
        return open_store(self.path, self.storage_options)

    # -- where the save of the calling thread goes (_SaveTarget) -----------------------------

    def _current(self) -> _SaveTarget:
        """The save this thread runs through the writer; between saves, where the next one goes."""
        target = self._saves.get(threading.get_ident())
        return target if target is not None and not target.done else self._shared

    def _end_save(self) -> None:
        target = self._saves.get(threading.get_ident())
        if target is not None:
            target.done = True

    @property
    def path(self) -> Path | _Url:
        return self._current().path

    @path.setter
    def path(self, value: str | os.PathLike) -> None:
        self._shared.path = _location(value)

    @property
    def save_id(self) -> str:
        return self._current().save_id

    @property
    def _rank(self) -> int | None:
        return self._current().rank

    @property
    def _use_collectives(self) -> bool:
        return self._current().use_collectives

    @property
    def _tag(self) -> str:
        return self._current().tag

    # -- StorageWriter ----------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Point the next save at ``checkpoint_id`` (a directory or URL) when given; draws a new save id.
        A save of another thread still running through this writer goes on where it was going."""
        path = _location(checkpoint_id) if checkpoint_id else self._shared.path
        self._shared = dataclasses.replace(self._shared, path=path, save_id=secrets.token_hex(8))
        self._saves[threading.get_ident()] = _SaveTarget(path, self._shared.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        ident = threading.get_ident()
        target = self._saves.get(ident)
        if target is None or target.set_up or target.done:  # no reset in this save: where the writer points
            target = _SaveTarget(self._shared.path, self._shared.save_id)
        target.rank = kwargs.get("rank")
        target.use_collectives = kwargs.get("use_collectives", True)
        target.tag = secrets.token_hex(4)
        target.coordinator = is_coordinator
        target.set_up = True
        alive = {thread.ident for thread in threading.enumerate()}
        for gone in [key for key in self._saves if key not in alive]:  # saves of threads that ended
            self._saves.pop(gone, None)
        self._saves[ident] = target

    def _metadata_name(self) -> str:
        """``.metadata``, or ``__{rank}.metadata`` when ranks save without collectives."""
        return METADATA_NAME if self._use_collectives or self._rank is None else f"__{self._rank}{METADATA_NAME}"

    def _committed_names(self) -> tuple[str, str]:
        """The metadata whose presence means a checkpoint is already here, for ``overwrite=False``:
        ``.metadata``, and rank 0's in a collective save (every per-rank save has one) or this rank's
        own in a per-rank save (not rank 0's: with no collectives rank 0 may have committed this very
        save before this rank gets here)."""
        if self._rank is not None and not self._use_collectives:
            return METADATA_NAME, self._metadata_name()
        return METADATA_NAME, f"__0{METADATA_NAME}"

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        store = self._store
        if not store.is_dir_like():
            raise TargetError(f"{self.path} is a file; a DCP checkpoint is a directory", hint="give a directory")
        try:
            store.prepare()
        except OSError as exc:
            raise TargetError(f"cannot create the checkpoint directory {self.path}: {exc.strerror or exc}",
                              hint="save to a writable directory") from exc
        if any(store.size(name) is not None for name in self._committed_names()):
            if not self.overwrite:
                # torch's FileSystemWriter's words, so code matching them works with either writer
                raise DcpCheckpointExistsError(f"Checkpoint already exists and self.overwrite={self.overwrite}.",
                                   hint=f"{self.path} holds one; pass overwrite=True to replace it")
            log.info("replacing the checkpoint in %s (it stays loadable until the new one commits)", self.path)
        if self._rank is not None and not self._use_collectives:
            plan = dataclasses.replace(plan, storage_data=_RankPrefix(f"__{self._rank}_"))
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Each rank's file prefix; with ``direct=None`` under a launch, also the durable mode for every
        rank, settled here on the coordinator alone (it measures its mount once per process where it
        must, while the other ranks wait for the plans: ranks probing at once would measure each other)."""
        direct = None
        if self.direct is None and len(plans) > 1:
            direct = self._settle_direct(self._store, _plan_bytes(plans[0]), may_measure=True)
        return [plan if plan.storage_data is not None
                else dataclasses.replace(plan, storage_data=_RankPrefix(f"__{i}_", direct))
                for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write every item of this rank's ``plan``; returns an already completed Future once the
        files are durable. Errors raise here (DCP gathers them from every rank); a failed write
        removes the files it created."""
        from torch.futures import Future

        with self._write_lock:
            used: list[_Staging] = []
            try:
                results = self._write(plan, planner, used)
            finally:
                # The save of what was staged there has ended (its bytes are written, or it failed):
                # a later stage() may reuse those arenas, even while the failed save's traceback keeps
                # the staged tensors alive.
                with self._stage_lock:
                    for staging in used:
                        staging.pending = False
                    self._keep_one_idle()
                target = self._current()
                if target.use_collectives and not target.coordinator:  # else its save ends in finish
                    self._end_save()
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _write(self, plan: SavePlan, planner: SavePlanner, used: list[_Staging]) -> list[WriteResult]:
        """write_data's work; appends to ``used`` each staging arena it reads (pending until it ends)."""
        from torch.distributed.checkpoint.planner import WriteItemType

        t0 = time.perf_counter()
        store = self._store
        prefix = plan.storage_data.prefix if isinstance(plan.storage_data, _RankPrefix) else f"__{self._rank or 0}_"
        items: list[WriteItem] = list(plan.items)
        with self._stage_lock:
            stagings = list(self._stagings)
        staging: _Staging | None = None  # the one whose tensors are written in place (the first found)

        # Resolve every item: a tensor to the chunk it stores, anything else to its bytes.
        tensors: dict[int, torch.Tensor] = {}
        blobs: dict[int, memoryview] = {}
        placed: list[_Placed] = []
        for i, item in enumerate(items):
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                blobs[i] = _as_bytes(data)
                placed.append(_Placed(i, 0, 0, len(blobs[i])))
                continue
            chunk = _chunk_of(data, item)
            if not _raw_storable(chunk):  # as FileSystemWriter stores it, whatever the serialization
                blobs[i] = _torch_save_bytes(chunk)
                placed.append(_Placed(i, 0, 0, len(blobs[i])))
                continue
            owner = next((s for s in stagings if s.contains(chunk)), None)
            if owner is not None and owner not in used:
                with self._stage_lock:
                    owner.pending = True  # no stage() over it until this write ends
                used.append(owner)
            if self.serialization == "torch_save":
                blobs[i] = _torch_save_bytes(chunk)
                placed.append(_Placed(i, 0, 0, len(blobs[i])))
                continue
            tensors[i] = chunk
            in_place = owner.holds(chunk) if owner is not None and staging in (None, owner) else None
            if in_place is not None:
                staging = owner
            nbytes = _nbytes(chunk)
            placed.append(_Placed(i, 1, in_place, nbytes) if in_place is not None else _Placed(i, 0, 0, nbytes))

        # Files: staged items as contiguous runs of the staging arena, the rest copied into the arena.
        total = sum(p.nbytes for p in placed)
        staged_bytes = sum(p.nbytes for p in placed if p.source == 1)
        n_files = max(1, min(self.files_per_rank, len(items), -(-total // _MIN_FILE_BYTES)))
        n_staged = min(n_files, max(1, round(n_files * staged_bytes / total))) if staged_bytes else 0
        files = _staged_runs([p for p in placed if p.source == 1], n_staged)
        copy_files, copy_bytes = _layout_copies(_bucket_copies([p for p in placed if p.source == 0],
                                                               max(1, n_files - n_staged)))
        files += copy_files
        free = store.free_bytes()
        if free is not None and free < total:
            raise InsufficientSpaceError(
                f"{self.path} has {format_size(free)} free but this rank's checkpoint needs {format_size(total)}",
                hint="free space or save elsewhere")
        if copy_bytes and self._arena.nbytes < copy_bytes:
            _POOL.give(self._arena)
            self._memory.arena = _POOL.take(copy_bytes)
        return self._copy_and_write(self._arena if copy_bytes else None, plan, items, placed, tensors, blobs, files,
                                    copy_files, staging, store, prefix, total, staged_bytes, t0)

    def _durable_mode(self, store: Store, total: int, settled: bool | None = None) -> bool:
        """``direct`` as given, else the mode the coordinator ``settled`` for every rank of a launch
        (``prepare_global_plan``), else the faster durable mode of the target's mount
        (``checkpoint.tuning``; measured only by a save from one process)."""
        if self.direct is not None:
            return self.direct
        if settled is not None:
            return settled
        import torch.distributed as dist

        alone = not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
        return self._settle_direct(store, total, may_measure=alone)

    def _settle_direct(self, store: Store, total: int, *, may_measure: bool) -> bool:
        from ckptbench.checkpoint import tuning

        return tuning.settle(store, direct=None, threads=self.threads, block_size=self.block_size, total_bytes=total,
                             shard_size=max(1, total // self.files_per_rank), may_measure=may_measure).direct.value

    def _copy_and_write(self, arena: Arena | None, plan: SavePlan, items: list[WriteItem], placed: list[_Placed],
                        tensors: dict[int, torch.Tensor], blobs: dict[int, memoryview], files: list[_File],
                        copy_files: list[_File], staging: _Staging | None, store: Store, prefix: str, total: int,
                        staged_bytes: int, t0: float) -> list[WriteResult]:
        """Copy what is not staged in place into ``arena``, write every file, describe the results."""
        from torch.distributed.checkpoint import filesystem as _fs
        from torch.distributed.checkpoint.storage import WriteResult

        if arena is not None:
            # Each item with its padding (up to the next item of its file), which is zeroed.
            copies = [(p, int(pad)) for f in copy_files
                      for p, pad in zip(f.items, padding_after([p.offset for p in f.items], [p.nbytes for p in f.items],
                                                               f.end), strict=True)]
            _copy_into(arena, [(tensors[p.index], p.offset, pad) for p, pad in copies if p.index in tensors],
                       self.threads)
            arena_view = memoryview(arena.buffer)
            for p, pad in copies:
                if p.index in blobs:
                    end = p.offset + p.nbytes
                    arena_view[p.offset:end] = blobs[p.index]
                    arena_view[end:end + pad] = bytes(pad)
        buffers = [arena.buffer if arena is not None else None, staging.arena.buffer if staging is not None else None]
        names = [f"{prefix}{n}.{self._tag}.distcp" for n in range(len(files))]
        writes = [(name, memoryview(buffers[f.source])[f.start:f.end])
                  for name, f in zip(names, files, strict=True) if f.end > f.start]
        stage_s = time.perf_counter() - t0

        # CRC-32C of every raw tensor, beside the write (CPU-bound against I/O-bound).
        crcs: dict[int, list[int]] = {}
        crc_thread = None
        if self.checksum and tensors:
            by_source: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
            for f in files:
                for p in f.items:
                    if p.index in tensors:
                        for start in range(0, p.nbytes, CHECKSUM_BLOCK_BYTES):
                            by_source[f.source].append((p.index, p.offset + start,
                                                        min(CHECKSUM_BLOCK_BYTES, p.nbytes - start)))

            def checksum() -> None:
                for source, ranges in by_source.items():
                    values = native.crc32c_ranges(buffers[source], [(o, n) for _, o, n in ranges],
                                                  max(1, self.threads // 2))
                    for (index, _, _), value in zip(ranges, values, strict=True):
                        crcs.setdefault(index, []).append(value)

            crc_thread = QuietThread(target=checksum, name="ckptbench-dcp-crc")
        t1 = time.perf_counter()
        try:
            if crc_thread is not None:  # inside the try: a signal raised as it starts still joins it
                crc_thread.start()
            report = store.write_files(writes, threads=self.threads, block_size=self.block_size,
                                       direct=self._durable_mode(store, total, _settled_direct(plan)))
        except OSError as exc:
            raise StorageIOError(f"writing the checkpoint to {self.path} failed: {exc}",
                                 hint="check free space and permissions of the target") from exc
        finally:
            if crc_thread is not None:
                interrupts.join(crc_thread)
        write_s = time.perf_counter() - t1

        results: dict[int, WriteResult] = {}
        for name, f in zip(names, files, strict=True):
            for p in f.items:
                descriptors = None
                if p.index in tensors:
                    t = tensors[p.index]
                    crc = tuple(crcs.get(p.index, ()))
                    descriptors = [_RawDescriptor(_dtype_name(t.dtype), tuple(t.shape),
                                                  CHECKSUM_BLOCK_BYTES if crc else 0, crc).encode()]
                offset = p.offset - f.start if p.nbytes else 0
                info = _fs._StorageInfo(name, offset, p.nbytes, transform_descriptors=descriptors)
                results[p.index] = WriteResult(index=items[p.index].index, size_in_bytes=p.nbytes, storage_data=info)

        self.last_stats = SaveStats(
            bytes=total, files=len(writes), items=len(items), in_place_bytes=staged_bytes, stage_s=stage_s,
            write_s=write_s, direct=report.direct, sync=report.sync, fallback_reason=report.fallback_reason)
        if report.fallback_reason:
            log.info("O_DIRECT not used for %s: %s", self.path, report.fallback_reason)
        log.info("dcp write_data: %s in %d files (%s from the staging arena), stage %.3f s, write %.3f s, "
                 "direct=%s sync=%s", format_size(total), len(writes), format_size(staged_bytes), stage_s, write_s,
                 report.direct, report.sync)
        return [results[i] for i in range(len(items))]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The commit, on the coordinator once every rank's write_data returned: ``.metadata`` goes to
        a temp name, is fsynced, renamed into place, the directory fsynced; then the data files of
        earlier saves are removed."""
        from torch.distributed.checkpoint import filesystem as _fs

        storage_data = {wr.index: wr.storage_data for wr_list in results for wr in wr_list}
        metadata.storage_data = storage_data
        metadata.storage_meta = self.storage_meta()
        metadata.version = getattr(_fs, "CURRENT_DCP_VERSION", metadata.version)
        name = self._metadata_name()
        store = self._store
        try:
            try:
                store.put_atomic(name, pickle.dumps(metadata))
            except OSError as exc:
                raise StorageIOError(f"committing {self.path / name} failed: {exc}") from exc
            self._remove_stale(store, {info.relative_path for info in storage_data.values()})
        finally:
            self._end_save()

    def _remove_stale(self, store: Store, keep: set[str]) -> None:
        """Data files (and metadata temps) of earlier or crashed saves, ours or FileSystemWriter's; with per-rank
        metadata a rank removes only its own. Metadata of the other mode goes too: it names files
        this sweep removes, and DCP's loaders read ``.metadata`` first, so a collective one left
        behind a per-rank save would make the directory load the replaced checkpoint, or fail."""
        own = None if self._use_collectives or self._rank is None else str(self._rank)
        # files of saves that other threads are still writing (an async_save started before this one ended,
        # to the same directory), through this writer or another one of this process
        with _WRITERS_LOCK:
            writers = list(_WRITERS)
        current = self._current()
        in_flight = [t for w in writers for t in list(w._saves.values()) if t.set_up and not t.done and t is not current]
        writing = {t.tag for t in in_flight}
        # While a save to this directory is in flight, its files on other ranks carry tags of their own (unknown
        # in this process) and its commit may be writing a metadata temp: those wait for the sweep of a commit
        # with none in flight.
        wait = any(t.path == current.path for t in in_flight)
        stale = []
        for name in store.list():
            committed = _METADATA_FILE.match(name)
            if committed is not None:
                if name != self._metadata_name() and (committed.group("rank") is None) == (own is not None):
                    stale.append(name)  # the other mode's
                continue
            match = _DATA_FILE.match(name) or _TMP_METADATA.match(name)
            if match is None or name in keep or match.groupdict().get("tag") in writing:
                continue
            if wait and (match.re is _TMP_METADATA or match.groupdict().get("tag")):
                continue
            if own is not None and (match.group("rank") or match.groupdict().get("torch_rank")) != own:
                continue
            stale.append(name)
        if stale:
            log.info("removing %d files of earlier saves from %s", len(stale), self.path)
            store.remove(stale)

    def storage_meta(self) -> StorageMeta | None:
        from torch.distributed.checkpoint.metadata import StorageMeta

        # A directory as a Path, as FileSystemWriter records it; a URL as a plain str (no class of ours
        # in the pickle, so any DCP reader can unpickle it).
        checkpoint_id = self.path if isinstance(self.path, Path) else str(self.path)
        return StorageMeta(checkpoint_id=checkpoint_id, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _valid_checkpoint_id(checkpoint_id)

    # -- AsyncStager ------------------------------------------------------------------------

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state_dict`` whose tensors live in this writer's page-aligned staging arena
        (pinned with cudaHostRegister when CUDA is present); returns once every byte is copied, so
        the caller may then change its tensors. ``write_data`` writes these tensors straight from the
        arena (no second copy).

        The staged copy is valid until its save has ended and a later ``stage`` reuses the arena. Its
        save has ended when this writer's ``write_data`` that wrote it returns or raises; when it is
        not written through this writer (``async_save(..., async_stager=writer)`` with another storage
        writer, a save that failed before ``write_data``, a copy never saved), once none of its
        tensors is referenced any more. A ``stage`` while every arena of this writer is still in use
        stages into another one; the writer keeps those in use and at most one idle arena."""
        sources = list(_local_tensors(state_dict))
        offsets, cursor = [], 0
        for tensor in sources:
            nbytes = _nbytes(tensor)
            cursor = _align_up(cursor, BIG_ALIGN if nbytes >= BIG_TENSOR_BYTES else SMALL_ALIGN)
            offsets.append(cursor)
            cursor += nbytes
        with self._stage_lock:
            staging = self._idle_staging(max(cursor, _PAGE))
            staging.restage()
            staging.arena.ensure(max(cursor, _PAGE))
            # Files are runs of this arena: the bytes between tensors are padding.
            padding = padding_after(offsets, [_nbytes(t) for t in sources], cursor).tolist()
            _copy_into(staging.arena, list(zip(sources, offsets, padding, strict=True)), self.threads)
            # Made under the lock: from here the staged tensors keep the arena in use.
            staged = [staging.tensor(offset, _nbytes(t), t.dtype, tuple(t.shape))
                      for t, offset in zip(sources, offsets, strict=True)]
        return _rebuild(state_dict, iter(staged))

    def _idle_staging(self, nbytes: int) -> _Staging:
        """A staging arena no save needs any more: this writer's (the biggest), else one from the
        process's pool (sized ``nbytes``). Called with ``_stage_lock`` held."""
        staging = self._keep_one_idle()
        if staging is None and len(self._stagings) >= 2:
            # A failed save's staged tensors outlive it in reference cycles (its exception's traceback
            # holds the frames that hold them) until the collector runs. Collected only before a third
            # arena: one save still in flight (the common overlap) costs no collection in the stall.
            gc.collect()
            staging = self._keep_one_idle()
        if staging is None:
            if self._stagings:
                log.info("the %d staging arena(s) of this writer are still in use by saves in flight (an async "
                         "save not waited for, or a failed one whose error is still referenced); staging into "
                         "another", len(self._stagings))
            staging = _Staging(_POOL.take(nbytes))
            self._stagings.append(staging)
        return staging

    def _keep_one_idle(self) -> _Staging | None:
        """Give every idle staging arena but the biggest back to the pool, and return that one (None:
        none is idle). Memory a staged tensor still points into stays valid: its storage holds the buffer."""
        idle = [s for s in self._stagings if not s.in_use]
        if not idle:
            return None
        kept = max(idle, key=lambda s: s.arena.nbytes)
        for spare in idle:
            if spare is not kept:
                self._stagings.remove(spare)
                _POOL.give(spare.arena)
        return kept

    def synchronize_staging(self) -> None:
        """Nothing to wait for: :meth:`stage` returns after its copy completes."""

    def close(self) -> None:
        """Free the staging memory: this writer's arenas and the idle ones of the process's pool. The
        writer stays usable; its next save reallocates."""
        with self._write_lock, self._stage_lock:
            self._arena.close()
            for staging in self._stagings:
                staging.arena.close()
            self._stagings.clear()
        _POOL.clear()


def _same_setting(torch_name: str, torch_value: Any, our_name: str, our_value: Any) -> Any:
    """One setting given under torch's name or ours (or both, alike)."""
    if torch_value is not None and our_value is not None and torch_value != our_value:
        raise UsageError(f"{torch_name}={torch_value!r} and {our_name}={our_value!r} disagree; they are one setting",
                         hint="give one of them")
    return torch_value if torch_value is not None else our_value


def _serialization_of(serialization_format: Any) -> str | None:
    """FileSystemWriter's ``serialization_format`` (a SerializationFormat or its value) as ours."""
    if serialization_format is None:
        return None
    value = getattr(serialization_format, "value", serialization_format)
    if value == "torch_save":
        return "torch_save"
    raise UsageError(f"serialization_format={serialization_format!r} is not supported by ckptbench's Writer",
                     hint="use serialization='raw' (tensor bytes, the default) or serialization_format=TORCH_SAVE")


def _over(window: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A staged tensor: ``window`` (a slice of the arena) as (shape, dtype), with a storage of its own
    that holds ``window`` (and so the arena) alive.

    Not a view of one tensor over the whole arena: DCP torch.saves whatever it does not save as a
    tensor (a tuple, a list of plain values, everything nested when the planner does not flatten),
    and torch.save writes a view's whole storage: every other tensor, and what earlier saves left."""
    import torch

    if not len(window):
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(window, dtype=torch.uint8).view(dtype).view(shape)


def _as_bytes(data: Any) -> memoryview:
    if isinstance(data, io.BytesIO):
        return data.getbuffer()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).cast("B")
    raise UsageError(f"a BYTE_IO item resolved to {type(data).__name__}, not io.BytesIO")


def _chunk_of(data: Any, item: WriteItem) -> torch.Tensor:
    """The tensor bytes one WriteItem stores: the resolved tensor, narrowed to the chunk when the
    planner handed back the whole tensor."""
    import torch
    from torch.distributed._shard._utils import narrow_tensor_by_index

    DTensor, _ = _distributed_tensor_types()
    if not isinstance(data, torch.Tensor):
        raise UsageError(f"{item.index.fqn}: a tensor item resolved to {type(data).__name__}")
    tensor = data.detach()
    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    chunk = item.tensor_data.chunk if item.tensor_data is not None else None
    if chunk is not None and tuple(tensor.shape) != tuple(chunk.sizes):
        if tuple(tensor.shape) == tuple(item.tensor_data.size):
            tensor = narrow_tensor_by_index(tensor, chunk.offsets, chunk.sizes)
        else:
            raise UsageError(f"{item.index.fqn}: resolved tensor has shape {tuple(tensor.shape)}, the plan's chunk "
                             f"{tuple(chunk.sizes)}")
    return tensor


def _torch_save_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor as FileSystemWriter stores it: ``torch.save`` of a CPU tensor with minimal storage."""
    import torch

    tensor = tensor.cpu()
    if tensor.untyped_storage().nbytes() != _nbytes(tensor):
        tensor = tensor.clone()
    out = io.BytesIO()
    torch.save(tensor, out)
    return out.getbuffer()


# -- the reader -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Range:
    """One read request: ``[start, end)`` of ``file`` holding ``members`` (storage keys)."""

    file: str
    start: int
    end: int
    members: tuple[MetadataIndex, ...]

    @property
    def buffer_bytes(self) -> int:
        return _align_up(self.end - self.start, _PAGE)


def _plan_reads(entries: dict[MetadataIndex, Any], max_bytes: int) -> list[list[_Range]]:
    """Group the stored items to read into ranges (per file, merged when close) and the ranges into
    batches that fit the read buffer (a range bigger than the buffer is a batch of its own)."""
    by_file: dict[str, list[MetadataIndex]] = defaultdict(list)
    for key, info in entries.items():
        if info.length:
            by_file[info.relative_path].append(key)
    ranges: list[_Range] = []
    for file, keys in sorted(by_file.items()):
        keys.sort(key=lambda k: entries[k].offset)
        members: list[MetadataIndex] = []
        start = end = 0
        for key in keys:
            info = entries[key]
            item_end = info.offset + info.length
            if members and info.offset - end <= _READ_MERGE_GAP_BYTES and max(end, item_end) - start <= max_bytes:
                members.append(key)
                end = max(end, item_end)
                continue
            if members:
                ranges.append(_Range(file, start, end, tuple(members)))
            members, start, end = [key], _align_down(info.offset, _PAGE), item_end
        if members:
            ranges.append(_Range(file, start, end, tuple(members)))
    batches: list[list[_Range]] = []
    used = 0
    for r in ranges:
        if not batches or used + r.buffer_bytes > max_bytes:
            batches.append([])
            used = 0
        batches[-1].append(r)
        used += r.buffer_bytes
    return batches


class _Reader:
    """A DCP StorageReader that reads through ckptbench's engine.

    DCP calls, per load: 0) ``reset(checkpoint_id)`` when ``dcp.load`` is given one, 1) ``read_metadata``,
    2) ``set_up_storage_reader``, 3) ``prepare_local_plan``, 4) (coordinator) ``prepare_global_plan``,
    5) ``read_data``: the byte ranges this rank needs are read with the engine (O_DIRECT, N threads)
    into one page-aligned buffer, in batches of at most ``buffer_bytes``; each raw tensor is verified
    against its CRC-32C (``verify``) and copied into the destination the planner resolves. Reads
    checkpoints of :class:`Writer` and of torch's FileSystemWriter.

    Args:
        path: checkpoint directory.
        threads, block_size, direct: as for the engine's reads (defaults: ``knobs``, O_DIRECT).
        verify: check CRC-32C of raw tensors; a mismatch raises CorruptCheckpointError.
        buffer_bytes: bound of the read buffer, kept between loads until :meth:`close`.
        safe: (default) refuse metadata that a plain unpickle would let run code: ``.metadata`` is
            unpickled with only DCP's own metadata classes allowed (anything else it names is refused
            with NotACheckpointError), and a non-tensor value is refused unless ``torch.load`` reads it
            with ``weights_only=True``. ``safe=False`` is the opt-in for checkpoints whose author you
            trust (values that are arbitrary Python objects): loading then unpickles as torch's
            FileSystemReader does, and a crafted ``.metadata`` or value runs code.
        _extension_registry: stream extensions of FileSystemWriter checkpoints (default: torch's).

    Every file is opened inside ``path`` only, never through a symlink, and must be a regular file
    (``ckptbench.safeio``); anything else is a CorruptCheckpointError.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        threads: int | None = None,
        block_size: int | None = None,
        direct: bool = True,
        verify: bool = True,
        buffer_bytes: int = READ_BUFFER_BYTES,
        safe: bool = True,
        _extension_registry: ExtensionRegistry | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.path = _location(path)
        self.storage_options = dict(storage_options or {})
        self.safe = safe
        self.threads = threads if threads is not None else knobs.SAVE_THREADS
        self.block_size = block_size if block_size is not None else knobs.SAVE_BLOCK_BYTES
        if self.threads < 1 or self.block_size < 1 or buffer_bytes < _PAGE:
            raise UsageError(f"threads ({self.threads}) and block_size ({self.block_size}) must be positive and "
                             f"buffer_bytes ({buffer_bytes}) at least {_PAGE}")
        self.direct = direct
        self.verify = verify
        self.buffer_bytes = buffer_bytes
        self.storage_data: dict[MetadataIndex, Any] = {}
        self.load_id = secrets.token_hex(8)
        from torch.distributed.checkpoint.filesystem import _StorageReaderTransforms

        self._transforms = _StorageReaderTransforms(_extension_registry)
        self._arena = Arena()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = _location(checkpoint_id)
        self.load_id = secrets.token_hex(8)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The pickled Metadata of ``path`` (``__{rank}.metadata`` when DCP passes ``rank``)."""
        rank = kwargs.get("rank")
        name = METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
        from torch.distributed.checkpoint.metadata import Metadata

        try:
            data = self._store.get(name)
            metadata = _SafeUnpickler(io.BytesIO(data)).load() if self.safe else pickle.loads(data)
        except FileNotFoundError:
            raise NotACheckpointError(f"{self.path} holds no committed DCP checkpoint (no {name})",
                                      hint="a save that did not finish leaves no metadata; nothing here can be "
                                           "loaded") from None
        except NotACheckpointError:
            raise
        except UnsafeFileError as exc:
            raise NotACheckpointError(f"{self.path} holds no readable DCP checkpoint: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - whatever unpickling arbitrary bytes raises: one clear error
            raise NotACheckpointError(f"cannot read {self.path / name}: not DCP metadata "
                                      f"({type(exc).__name__}: {exc})") from exc
        if not isinstance(metadata, Metadata):
            raise NotACheckpointError(f"{self.path / name} holds a {type(metadata).__name__}, not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    @property
    def _store(self) -> Store:
        return open_store(self.path, self.storage_options)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise NotACheckpointError(f"{self.path}: the metadata has no storage_data")
        if not isinstance(metadata.storage_data, dict) or not all(
                isinstance(getattr(i, "relative_path", None), str)
                and all(type(getattr(i, f, None)) is int and getattr(i, f) >= 0 for f in ("offset", "length"))
                for i in metadata.storage_data.values()):
            raise NotACheckpointError(f"{self.path}: the metadata's storage_data is not a map of items to "
                                      f"(relative_path, offset, length)")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read every item of ``plan`` into the destinations ``planner`` resolves; the returned
        Future is already complete (errors raise here)."""
        from torch.futures import Future

        requests: dict[MetadataIndex, list[ReadItem]] = defaultdict(list)
        entries: dict[MetadataIndex, Any] = {}
        for req in plan.items:
            try:
                entries[req.storage_index] = self.storage_data[req.storage_index]
            except KeyError:
                raise CorruptCheckpointError(f"{self.path}: the metadata has no storage entry for "
                                             f"{req.storage_index.fqn!r}") from None
            requests[req.storage_index].append(req)
        self._check_files(entries)
        for key, info in entries.items():
            if not info.length:
                self._deliver(key, info, memoryview(b""), planner, requests[key])
        for batch in _plan_reads(entries, self.buffer_bytes):
            self._read_batch(batch, entries, requests, planner)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _check_files(self, entries: dict[MetadataIndex, Any]) -> None:
        """Every data file ``entries`` read from a name inside the checkpoint (never a path out of it) and
        reaching the end of every item read from it: checked before a read buffer is sized by what the
        metadata claims, so a length it lies about is not allocated first."""
        ends: dict[str, int] = {}
        for info in entries.values():
            if info.length:
                ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
        store = self._store
        for file, end in sorted(ends.items()):
            if not _FLAT_NAME.match(file):
                raise CorruptCheckpointError(f"{self.path}: the metadata names the data file {file!r}, which is not a "
                                             "file name inside the checkpoint")
            try:
                size = store.size(file)
            except UnsafeFileError as exc:
                raise CorruptCheckpointError(f"{self.path}: {exc}") from None
            if size is None:
                raise CorruptCheckpointError(f"data file {self.path / file} of the checkpoint is missing")
            if size < end:
                raise CorruptCheckpointError(f"data file {self.path / file} is {size} bytes, shorter than the {end} "
                                             "the checkpoint metadata says")

    def _read_batch(self, batch: list[_Range], entries: dict[MetadataIndex, Any],
                    requests: dict[MetadataIndex, list[ReadItem]], planner: LoadPlanner) -> None:
        self._arena.ensure(max(_PAGE, sum(r.buffer_bytes for r in batch)))
        view = memoryview(self._arena.buffer)
        placed: list[tuple[_Range, int]] = []
        jobs = []
        cursor = 0
        for r in batch:
            placed.append((r, cursor))
            jobs.append((r.file, r.start, view[cursor:cursor + r.end - r.start]))
            cursor += r.buffer_bytes
        try:
            self._store.read_ranges(jobs, threads=self.threads, block_size=self.block_size, direct=self.direct)
        except UnsafeFileError as exc:
            raise CorruptCheckpointError(f"{self.path}: {exc}") from None
        except OSError as exc:
            where = exc.filename or self.path
            if isinstance(exc, FileNotFoundError) and not exc.filename:  # an object store's: names the object
                raise CorruptCheckpointError(f"a data file of the checkpoint is missing: {exc}") from exc
            if exc.errno == errno.ENOENT:
                raise CorruptCheckpointError(f"data file {where} of the checkpoint is missing") from exc
            if exc.errno == errno.ENODATA:
                raise CorruptCheckpointError(f"data file {where} is shorter than the checkpoint metadata says") from exc
            raise StorageIOError(f"reading the checkpoint {self.path} failed: {exc}") from exc
        located = [(key, r, base + entries[key].offset - r.start) for r, base in placed for key in r.members]
        if self.verify:
            self._verify(located, entries)
        for key, _, at in located:
            info = entries[key]
            self._deliver(key, info, view[at:at + info.length], planner, requests[key], at)

    def _verify(self, located: list[tuple[MetadataIndex, _Range, int]], entries: dict[MetadataIndex, Any]) -> None:
        ranges, expected = [], []
        for key, r, at in located:
            raw = _RawDescriptor.find(entries[key].transform_descriptors)
            if raw is None or not raw.crcs:
                continue
            length = entries[key].length
            for k, start in enumerate(range(0, length, raw.crc_block)):
                ranges.append((at + start, min(raw.crc_block, length - start)))
                expected.append((key, r, raw.crcs[k] if k < len(raw.crcs) else None))
        if not ranges:
            return
        for got, (key, r, want) in zip(native.crc32c_ranges(self._arena.buffer, ranges, self.threads), expected,
                                       strict=True):
            if got != want:
                raise CorruptCheckpointError(
                    f"checksum mismatch in {key.fqn!r} (chunk at {tuple(key.offset or ())}) in {self.path / r.file}: "
                    f"crc32c {got:#010x}, metadata {want if want is None else f'{want:#010x}'}",
                    hint="the checkpoint is damaged; restore from another one")

    def _deliver(self, key: MetadataIndex, info: Any, data: memoryview, planner: LoadPlanner,
                 reqs: list[ReadItem], at: int = 0) -> None:
        """Hand one stored item to the planner: bytes to ``load_bytes``, a tensor narrowed to each request."""
        import torch
        from torch.distributed._shard._utils import narrow_tensor_by_index
        from torch.distributed.checkpoint.planner import LoadItemType

        raw = _RawDescriptor.find(info.transform_descriptors)
        tensor: torch.Tensor | None = None
        for req in reqs:
            if req.type == LoadItemType.BYTE_IO:
                stream = self._stream(req, info, data)
                stream = stream if isinstance(stream, io.BytesIO) else io.BytesIO(stream.read())
                if self.safe:
                    _check_weights_only(stream, req.dest_index.fqn, self.path)
                planner.load_bytes(req, stream)
                continue
            if tensor is None:
                tensor = self._raw_tensor(raw, data, at, info) if raw is not None else torch.load(
                    self._seekable(req, info, data), map_location="cpu", weights_only=True)
            piece = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != piece.size():
                raise UsageError(f"{req.dest_index.fqn!r}: the stored chunk gives {tuple(piece.shape)} but the "
                                 f"destination is {tuple(target.shape)}")
            target.copy_(piece)
            planner.commit_tensor(req, target)

    def _raw_tensor(self, raw: _RawDescriptor, data: memoryview, at: int, info: Any) -> torch.Tensor:
        import torch

        if len(data) != raw.nbytes:
            raise CorruptCheckpointError(f"{self.path / info.relative_path}: a raw tensor of {raw.nbytes} bytes "
                                         f"is recorded with length {len(data)}")
        dtype = dtype_of(raw.dtype)
        if not len(data):
            return torch.empty(raw.shape, dtype=dtype)
        flat = self._arena.bytes_tensor()
        if at % dtype.itemsize:
            return flat[at:at + len(data)].clone().view(dtype).view(raw.shape)
        return typed_view(flat, at, len(data), dtype, raw.shape)

    def _stream(self, req: ReadItem, info: Any, data: memoryview) -> IO[bytes]:
        raw_stream = io.BytesIO(data)
        descriptors = info.transform_descriptors or ()
        return self._transforms.transform_load_stream(req, descriptors, raw_stream) if descriptors else raw_stream

    def _seekable(self, req: ReadItem, info: Any, data: memoryview) -> IO[bytes]:
        stream = self._stream(req, info, data)
        return stream if stream.seekable() else io.BytesIO(stream.read())

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _valid_checkpoint_id(checkpoint_id)

    def close(self) -> None:
        """Free the read buffer; the reader stays usable."""
        self._arena.close()


_FLAT_NAME = re.compile(r"^(?!\.\.?$)[^/\\\x00]+$")
#: What ``safe=True`` lets ``.metadata`` name: DCP's metadata classes and the torch values they hold.
_SAFE_GLOBALS = {
    "torch.distributed.checkpoint.metadata": None,  # any of its classes
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "Path"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice", "complex"},
}


def _check_weights_only(stream: io.BytesIO, fqn: str, where: Path) -> None:
    """Refuse a non-tensor value that ``torch.load(weights_only=True)`` cannot read (the planner
    unpickles it fully): it names something beyond plain data and tensors."""
    import torch

    try:
        torch.load(stream, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the unpickler's refusal, or damage
        raise NotACheckpointError(f"{where}: the value {fqn!r} is not plain data (torch.load with weights_only=True "
                                  f"refuses it: {str(exc).splitlines()[0][:200]})",
                                  hint="load it with safe=False only if you trust whoever wrote it") from None
    finally:
        stream.seek(0)


class _SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds only what DCP metadata holds; anything else it names is refused."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        allowed = _SAFE_GLOBALS.get(module, set())
        # A dotted name (protocol 4 looks it up attribute by attribute) could reach through the module to
        # what it imported (``metadata.os.system``): never looked up.
        wanted = "." not in name and (allowed is None or name in allowed or module == "torch")
        obj = super().find_class(module, name) if wanted else None
        if allowed is None and not (isinstance(obj, type) and obj.__module__ == module):
            obj = None  # of a module allowed whole, only the classes it defines
        if module == "torch" and name not in (allowed or set()) and not isinstance(obj, (torch.dtype, torch.layout,
                                                                                          torch.memory_format)):
            obj = None
        if obj is None:
            raise NotACheckpointError(f"the DCP metadata names {module}.{name}, which a safe load does not build "
                                      f"(unpickling it could run code)",
                                      hint="load it with safe=False only if you trust whoever wrote it")
        return obj


# -- the public classes: subclasses of torch's DCP classes, created on first use ----------------

_PUBLIC_CLASSES = ("Writer", "Reader", "RawTensorExtension")


@functools.cache
def _classes() -> dict[str, type]:
    """Writer (a StorageWriter and AsyncStager), Reader (a StorageReader) and RawTensorExtension (a
    StreamTransformExtension), built on first use: importing this module must not import torch."""
    from torch.distributed.checkpoint import filesystem as _fs

    # checked first: an older torch has no _extension module either (torch >= 2.2 is ckptbench's floor)
    if "transform_descriptors" not in {f.name for f in dataclasses.fields(_fs._StorageInfo)}:
        import torch

        raise MissingDependencyError(
            f"ckptbench.integrations.dcp needs torch >= 2.7 (DCP transform descriptors); found {torch.__version__}",
            hint="pip install -U torch")
    from torch.distributed.checkpoint._extension import StreamTransformExtension
    from torch.distributed.checkpoint.staging import AsyncStager
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter

    def subclass(name: str, implementation: type, *bases: type) -> type:
        def body(namespace: dict[str, Any]) -> None:
            namespace.update(__module__=__name__, __qualname__=name, __doc__=implementation.__doc__)

        return types.new_class(name, (implementation, *bases), exec_body=body)

    return {
        "Writer": subclass("Writer", _Writer, StorageWriter, AsyncStager),
        "Reader": subclass("Reader", _Reader, StorageReader),
        "RawTensorExtension": subclass("RawTensorExtension", _RawTensorExtension, StreamTransformExtension),
    }


def __getattr__(name: str) -> Any:
    if name in _PUBLIC_CLASSES:
        cls = _classes()[name]
        globals()[name] = cls  # later lookups (and pickle) find the same class object
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:

    class Writer(_Writer, StorageWriter, AsyncStager): ...

    class Reader(_Reader, StorageReader): ...

    class RawTensorExtension(_RawTensorExtension, StreamTransformExtension): ...
