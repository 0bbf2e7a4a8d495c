"""Zero-copy sync saves: the shards written straight from the tensors' own memory, with no staging copy.

A sync save whose durable mode is buffered (+ fdatasync) has no use for the aligned arena that O_DIRECT
needs: the kernel copies the bytes into its page cache (or a FUSE client into its own) anyway. Here the
engine writes each shard with ``pwritev`` from the tensors where they are (``Store.write_gathered``):
one table of (tensor address, offset in the shard, nbytes) rows per shard, the alignment padding
between tensors written as zeros, one vector call per block of the file. The CRC-32C of every checksum
range is computed by the thread that writes its bytes, just before it writes them, so the tensors'
memory is read once for both (the checksum rides on the same pass instead of reading a staged copy).

Tensors that cannot be written from their own memory as they are (non-contiguous views, conjugate or
negative bits: ``routing.ROUTE_TORCH``) are made contiguous first, into one host buffer of their size
alone; a save with tensors on a GPU is staged as before (``unavailable``). The caller is blocked for
the whole write (sync saves only), and the tensors must not be changed by another thread meanwhile,
as for ``torch.save``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckptbench.checkpoint.plan import SavePlan
from ckptbench.checkpoint.routing import ROUTE_HOST, ROUTE_TORCH, Sources
from ckptbench.checkpoint.stage import copy_values, typed_view
from ckptbench.storage.store import Store, WriteReport

#: Where the contiguous copies of views start in their buffer (cache-line aligned).
_COPY_ALIGN = 64


def unavailable(plan: SavePlan, sources: Sources) -> str:
    """Why ``plan``'s tensors cannot be written from their own memory ('' when they can): a tensor not
    in host memory (a GPU's must be copied to the host anyway)."""
    routes = np.frombuffer(sources.routes, np.int16)
    stored = routes[plan.placements[:, 0]] if len(plan.placements) else routes[:0]
    if (stored >= 0).any():
        return "a tensor is on a GPU"
    for i in np.flatnonzero(stored == ROUTE_TORCH).tolist():
        tensor = sources[int(plan.placements[i, 0])]
        if tensor.device.type != "cpu":
            return f"a tensor is on {tensor.device}"
    return ""


def _addresses(plan: SavePlan, sources: Sources) -> tuple[np.ndarray, Any]:
    """The address of each placements row's bytes: the tensor's own, or (views and tensors with lazy
    bits) of its contiguous copy in the returned buffer, which must stay alive while they are written."""
    index = plan.placements[:, 0]
    addresses = np.frombuffer(sources.addresses, np.int64)[index].copy()
    copied = np.flatnonzero(np.frombuffer(sources.routes, np.int16)[index] != ROUTE_HOST)
    if not len(copied):
        return addresses, None
    import torch

    sizes = plan.placements[copied, 2]
    starts = np.concatenate(([0], np.cumsum(-(-sizes // _COPY_ALIGN) * _COPY_ALIGN)))
    flat = torch.empty(int(starts[-1]), dtype=torch.uint8)
    for k, row in enumerate(copied.tolist()):
        tensor = sources[int(index[row])]
        copy_values(typed_view(flat, int(starts[k]), int(sizes[k]), tensor.dtype, tuple(tensor.shape)), tensor)
    addresses[copied] = flat.data_ptr() + starts[:-1]
    return addresses, flat


def write_zero_copy(plan: SavePlan, sources: Sources, store: Store, *, threads: int, block_size: int,
                    checksum: bool) -> tuple[WriteReport, list[int], list[tuple[int, int, int]]]:
    """Write ``plan``'s shards from ``sources`` (its tensors in entry order, all in host memory:
    ``unavailable`` is '') into ``store`` (``writes_gathered``), buffered; durable on return (files
    fdatasynced, the directory fsynced). Returns the store's WriteReport, the CRC-32C of each of
    ``plan.checksum_ranges()`` (none without ``checksum``) and those ranges."""
    placements = plan.placements
    addresses, copies = _addresses(plan, sources)  # `copies` stays referenced until the write returns
    bases = np.array([s.arena_offset for s in plan.shards], np.int64)
    offsets = np.asarray(placements[:, 1], np.int64)
    shard_of = np.searchsorted(bases, offsets, side="right") - 1
    rows = np.column_stack((addresses, offsets - bases[shard_of], placements[:, 2])).astype(np.int64)
    cuts = np.searchsorted(shard_of, np.arange(len(plan.shards) + 1))  # placements are sorted by offset
    files = [(shard.name, np.ascontiguousarray(rows[cuts[k]:cuts[k + 1]]), shard.nbytes)
             for k, shard in enumerate(plan.shards)]
    ranges = plan.checksum_ranges() if checksum else []
    at = np.array([offset for _, offset, _ in ranges], np.int64)
    in_shard = np.searchsorted(bases, at, side="right") - 1
    table = np.ascontiguousarray(np.column_stack((in_shard, at - bases[in_shard],
                                                  np.array([n for _, _, n in ranges], np.int64))), dtype=np.int64)
    report, crcs = store.write_gathered(files, table.reshape(-1, 3), threads=threads, block_size=block_size)
    del copies
    return report, crcs, ranges
