"""The shard layout (pure): a flattened state_dict's tensors laid out in shards, and the plan reused
by the next save of the same layout. No I/O, no copies; the result is a frozen :class:`SavePlan` that
staging and writing consume. The state_dict's format (flatten, rebuild) is ``state_dict_format.py``.

Layout rules: tensors are sorted largest first and each goes to the shard with the fewest bytes so
far (greedy balancing, so shards come out near ``shard_size``); inside a shard a tensor starts at a
4 KiB boundary when it is at least 64 KiB and at a 64-byte boundary otherwise, so many tiny tensors
pack densely while big ones stay page-aligned. Tied weights (the same storage, offset, shape and
strides) are stored once and loaded as one tensor.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import heapq
import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ckptbench import knobs
from ckptbench.checkpoint.routing import Sources
from ckptbench.checkpoint.state_dict_format import Flattener, Relayout, Row, encode_metadata, flatten
from ckptbench.errors import UsageError

BIG_TENSOR_BYTES = 64 * 1024
BIG_ALIGN = 4096
SMALL_ALIGN = 64
#: Checksums cover at most this many bytes each, so big tensors verify in parallel pieces.
CHECKSUM_BLOCK_BYTES = 64 * 2**20


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def padding_after(offsets: Any, nbytes: Any, limits: Any) -> np.ndarray:
    """For extents sorted by offset: how many bytes after each one are padding, i.e. up to where the
    next non-empty extent starts or ``limits`` (the end of its file; one per extent, or one for all),
    whichever comes first. Those bytes go into the file but belong to no extent: staging zeroes them,
    or a reused arena would write what an earlier save left there."""
    offsets, nbytes = np.asarray(offsets, np.int64), np.asarray(nbytes, np.int64)
    filled = np.flatnonzero(nbytes > 0)
    following = np.append(offsets[filled], np.iinfo(np.int64).max)[
        np.searchsorted(filled, np.arange(len(offsets)), side="right")]
    return np.maximum(np.minimum(following, limits) - (offsets + nbytes), 0)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the state_dict. ``alias_of`` names the entry it shares storage with (tied weights)."""

    index: int
    key: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    shard: int = -1
    offset: int = 0
    alias_of: int | None = None


@dataclass(frozen=True)
class ShardPlan:
    index: int
    name: str
    nbytes: int
    arena_offset: int


@dataclass(frozen=True)
class SavePlan:
    """Where every tensor goes. ``skeleton`` is the state_dict's structure with tensors replaced by
    ``{"__tensor__": index}`` (JSON-ready); ``arena_bytes`` is the staging memory the plan needs;
    ``entries`` (one per tensor, placed) are built on first use, off an async save's stall."""

    shards: tuple[ShardPlan, ...]
    skeleton: Any
    arena_bytes: int
    #: One row (entry index, arena offset, nbytes) per stored entry (not aliased, not empty), by arena
    #: offset: what staging copies, without visiting the entries again.
    placements: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64), compare=False, repr=False)
    #: (index, key, dtype, shape, nbytes, alias_of) per tensor and (shard, offset) per stored index.
    rows: tuple[list[Row], dict[int, tuple[int, int]]] = field(default_factory=lambda: ([], {}), compare=False,
                                                                repr=False)
    #: (OrderedDict node of the skeleton, its ``_metadata`` items) to encode off the stall, see :attr:`manifest_skeleton`.
    later: tuple[tuple[dict, list], ...] = field(default=(), compare=False, repr=False)
    #: Laid out by an earlier save and reused for this one (:class:`PlanCache`).
    reused: bool = field(default=False, compare=False)

    @functools.cached_property
    def manifest_skeleton(self) -> Any:
        """``skeleton`` as the manifest stores it: with each OrderedDict's ``_metadata`` (module versions)
        encoded, which planning only takes a list of: the encoding, one entry per module, stays out of an
        async save's stall."""
        for node, items in self.later:
            metadata = encode_metadata(items)
            if metadata is not None:
                node["__metadata__"] = metadata
        return self.skeleton

    def relaid(self, shard_prefix: str, skeleton: Any, later: tuple[tuple[dict, list], ...]) -> SavePlan:
        """This plan for another save of the same layout (:class:`PlanCache`): that save's skeleton and
        module metadata, its shards named after ``shard_prefix``; what was worked out from the layout
        already (entries, padding) goes along."""
        shards = tuple(replace(s, name=shard_name(shard_prefix, s.index)) for s in self.shards)
        plan = replace(self, shards=shards, skeleton=skeleton, later=later, reused=True)
        for worked_out in ("entries", "padding"):
            if worked_out in self.__dict__:
                plan.__dict__[worked_out] = self.__dict__[worked_out]
        return plan

    @functools.cached_property
    def entries(self) -> tuple[TensorEntry, ...]:
        rows, placed = self.rows
        unplaced = (-1, 0)
        return tuple(TensorEntry(index, key, dtype, shape, nbytes, *placed.get(index, unplaced), alias_of=alias)
                     for index, key, dtype, shape, nbytes, alias in rows)

    @functools.cached_property
    def padding(self) -> np.ndarray:
        """Per placements row: how many bytes after that tensor, up to the next one of its shard, go into
        the shard file but belong to no tensor (alignment, each shorter than BIG_ALIGN). Staging zeroes
        them, or a reused arena would write a previous save's bytes into the files."""
        offsets, nbytes = self.placements[:, 1], self.placements[:, 2]
        bases = np.array([s.arena_offset for s in self.shards], np.int64)
        ends = bases + np.array([s.nbytes for s in self.shards], np.int64)
        return padding_after(offsets, nbytes, ends[np.searchsorted(bases, offsets, side="right") - 1])

    @property
    def total_bytes(self) -> int:
        return int(self.placements[:, 2].sum())

    def arena_offset(self, entry: TensorEntry) -> int:
        return self.shards[entry.shard].arena_offset + entry.offset

    def checksum_ranges(self) -> list[tuple[int, int, int]]:
        """(entry index, arena offset, nbytes) per checksum block, in entry order."""
        out = []
        for e in self.entries:
            if e.alias_of is not None or e.nbytes == 0:
                continue
            base = self.arena_offset(e)
            for start in range(0, e.nbytes, CHECKSUM_BLOCK_BYTES):
                out.append((e.index, base + start, min(CHECKSUM_BLOCK_BYTES, e.nbytes - start)))
        return out




def plan_save(state_dict: Any, shard_size: int, shard_prefix: str = "shard",
              allow_pickle: bool = False) -> tuple[SavePlan, Sources]:
    """Flatten and lay out ``state_dict``; returns the plan and the tensors in entry order."""
    # Planning creates a few objects per tensor; with many tensors alive a collection pass in the
    # middle would more than double the planning time, and it lands in an async save's stall.
    with _gc_paused():
        plan, f = _plan(state_dict, shard_size, shard_prefix, allow_pickle)
        return plan, f.tensors


def _plan(state_dict: Any, shard_size: int, shard_prefix: str,
          allow_pickle: bool = False) -> tuple[SavePlan, Flattener]:
    if shard_size <= 0:
        raise UsageError(f"shard_size {shard_size} must be positive")
    f = flatten(state_dict, allow_pickle)
    return layout(f.entries, f.skeleton, shard_size, shard_prefix, later=tuple(f.later)), f


class PlanCache:
    """The last :func:`plan_save` of a checkpointer, for the next save of a state_dict laid out the same
    way, as a training loop saves the same model and optimizer again and again.

    Planning visits every tensor and builds a few objects for each, all of it in an async save's
    stall. The next save walks the state_dict more lightly
    (:class:`Relayout`): it makes the skeleton anew, as plain values change from save to save, and a
    record of what the layout depends on: each container's type and length, each key, each plain
    value's place, and of each tensor its address, shape, strides, dtype, device, conjugate and
    negative bits. A record equal to the one planning made gives the same layout, so the plan is
    reused with the new skeleton and this save's shard names, and the sources are the tensors just
    visited with the addresses and routes recorded then. Otherwise it plans afresh. Nothing of the
    tensors is kept between saves (records hold none). ``knobs.PLAN_REUSE=0`` plans every save
    afresh."""

    def __init__(self) -> None:
        self._last: tuple[int, list, SavePlan, array, array] | None = None
        self.reused = False  #: whether the last :meth:`plan` reused the plan before it

    def plan(self, state_dict: Any, shard_size: int, shard_prefix: str = "shard",
             allow_pickle: bool = False) -> tuple[SavePlan, Sources]:
        """:func:`plan_save`'s result for ``state_dict``, reusing the last plan where it holds."""
        self.reused = False
        if not knobs.PLAN_REUSE:
            self._last = None
            return plan_save(state_dict, shard_size, shard_prefix, allow_pickle)
        with _gc_paused():
            last = self._last
            if last is not None and last[0] == shard_size and isinstance(state_dict, dict):
                walk = Relayout(allow_pickle)
                try:
                    skeleton = walk.visit(state_dict, "")
                except Exception:  # noqa: BLE001 - planning below says what is wrong, with the key
                    walk.record = None
                if walk.record == last[1]:
                    self.reused = True
                    return (last[2].relaid(shard_prefix, skeleton, tuple(walk.later)),
                            Sources.of_columns(walk.tensors, last[3], last[4]))
            self._last = None
            plan, f = _plan(state_dict, shard_size, shard_prefix, allow_pickle)
            # The arrays themselves, never changed once planned: every save of this layout shares them,
            # and staging knows them again (``Arena.repeat_for``).
            self._last = (shard_size, f.record, plan, f.tensors.addresses, f.tensors.routes)
            return plan, f.tensors

    def clear(self) -> None:
        self._last = None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:05d}.bin"


def layout(entries: list[Row], skeleton: Any, shard_size: int, shard_prefix: str = "shard",
           later: tuple[tuple[dict, list], ...] = ()) -> SavePlan:
    """Place unaliased, non-empty entries into balanced shards of about ``shard_size`` bytes."""
    stored = [(nbytes, index) for index, _, _, _, nbytes, alias in entries if alias is None and nbytes > 0]
    total = sum(nbytes for nbytes, _ in stored)
    nshards = max(1, min(len(stored), math.ceil(total / shard_size))) if stored else 0
    heap = [(0, s) for s in range(nshards)]  # (bytes so far, shard): the emptiest shard on top
    placed: dict[int, tuple[int, int]] = {}
    stored.sort(key=lambda row: (-row[0], row[1]))
    for nbytes, index in stored:
        used, shard = heapq.heappop(heap)
        offset = _align(used, BIG_ALIGN if nbytes >= BIG_TENSOR_BYTES else SMALL_ALIGN)
        placed[index] = (shard, offset)
        heapq.heappush(heap, (offset + nbytes, shard))
    fill = [0] * nshards
    for used, shard in heap:
        fill[shard] = used
    shards, arena = [], 0
    for s in range(nshards):
        shards.append(ShardPlan(s, shard_name(shard_prefix, s), fill[s], arena))
        arena = _align(arena + fill[s], BIG_ALIGN)
    placements = np.zeros((len(placed), 3), np.int64)
    if placed:
        index = np.fromiter(placed, np.int64, len(placed))
        where = np.array(list(placed.values()), np.int64)
        bases = np.array([s.arena_offset for s in shards], np.int64)
        placements[:, 0] = index
        placements[:, 1] = bases[where[:, 0]] + where[:, 1]
        placements[:, 2] = [entries[i][4] for i in index.tolist()]
        # Column-major: staging reads whole columns (offsets, sizes), faster to scan when contiguous.
        placements = np.asfortranarray(placements[np.argsort(placements[:, 1], kind="stable")])
    return SavePlan(tuple(shards), skeleton, max(arena, BIG_ALIGN), placements, (entries, placed), later)
