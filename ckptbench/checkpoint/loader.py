"""The load path of :class:`~ckptbench.checkpoint.api.Checkpointer` (``api.py`` holds the public surface).

Call sequence of a load:

1. the manifest read and checked, this process's part of it (under a launch rank 0 reads it and
   hands it round: ``_shared_manifest``)
2. every shard's size checked against the manifest, then the read buffer sized: a fresh mmap faulted
   in ahead of the reads (``_faulting_ahead``), or the Checkpointer's own, reused, for ``into=`` and
   device loads
3. the shards read a group of ``threads`` at a time, each group's CRC-32C checked beside the next
   group's read (``_read_verified``)
4. every tensor a view into the buffer (or copied to the device), the skeleton rebuilt (``state_dict_format.rebuild``)
5. with ``into=``: the loaded tree checked against the live one, then copied into it (``_fit_into``)

With ``into=`` and ``bounded_memory`` (contiguous CPU tensors, a directory not on a network or FUSE mount,
a part larger than the staging ring), steps 2-5 go through the Checkpointer's bounded staging ring instead of a read
buffer of the part's size (``_load_through_ring``): the fit is checked first (nothing read yet), then each
slot-sized chunk of each shard is read into a slot while the one before is checked (CRC-32C pieces,
continued across chunks) and its tensors' pieces copied into the ``into=`` tensors.

A load that fails in a way a concurrent ``overwrite=True`` save can cause, with a new manifest in
place, loads the new checkpoint instead, at most ``LOAD_ATTEMPTS`` times.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from ckptbench import interrupts, native
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint import tuning
from ckptbench.checkpoint.commit import current_manifest
from ckptbench.checkpoint.distributed import RankFailedError, World
from ckptbench.checkpoint.host_memory import MADV_POPULATE_WRITE, available_memory_bytes
from ckptbench.checkpoint.ring import Pipeline, Ring, RunningCrcs, chunks, ring_bytes
from ckptbench.checkpoint.stage import Arena, as_bytes, copy_values, dtype_of, typed_view
from ckptbench.checkpoint.state_dict_format import rebuild, refuse_pickled
from ckptbench.errors import InsufficientMemoryError, StorageIOError, UnsafeFileError, UsageError
from ckptbench.interrupts import QuietThread, Workers
from ckptbench.storage.store import Store
from ckptbench.units import format_size

log = logging.getLogger(__name__)

#: Loads of a checkpoint that a save with overwrite=True keeps replacing, before giving up.
LOAD_ATTEMPTS = 3
#: Load failures a replacing save can cause (its sweep removes the shards being read); the manifest decides.
_MAYBE_REPLACED = (mf.CorruptCheckpointError, OSError, StorageIOError)


def _require_memory(store: Store, nbytes: int) -> None:
    """Refuse a load whose read buffer (``nbytes``, what the manifest and the shards' sizes claim) is
    more than the host has available, before allocating it."""
    available = available_memory_bytes()
    if available is not None and nbytes > available:
        raise InsufficientMemoryError(
            f"loading {store.url} needs {format_size(nbytes)} of host memory for its shards but only "
            f"{format_size(available)} is available", hint="free memory, or load on a host with more")


class _Loader:
    """The load steps of a Checkpointer: its settings and read buffer are the Checkpointer's."""

    threads: int
    block_size: int
    direct: bool
    _given: tuple[int | None, int | None, bool | None]
    _read_buffer: Arena
    _ring: Ring
    last_load_s: float

    def _load_latest(self, store: Store, rank: int | None, device: Any, verify: bool, into: dict | None,
                     allow_pickle: bool = False, bounded: bool = False) -> dict:
        """Load what the manifest names; when a save with ``overwrite=True`` commits a new checkpoint
        meanwhile (and removes the shards being read), load the new one instead. A failure with the
        manifest unchanged is the checkpoint's own (a missing shard is damage, said as such)."""
        manifest = mf.read_manifest(store)
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            part = mf.rank_part(manifest, store.url, rank=rank, world_size=1)
            try:
                return self._timed_load(store, manifest, part, device, verify, into, False, allow_pickle, bounded)
            except _MAYBE_REPLACED as exc:
                latest = current_manifest(store) or manifest  # gone altogether: report what went wrong
                if latest == manifest:
                    damage = _vanished_shard(store, exc)
                    if damage is not None:
                        raise damage from None
                    raise
                if attempt == LOAD_ATTEMPTS:
                    raise _replaced_too_often(store) from exc
                log.info("%s was replaced by a new save while loading it: loading the new one", store.url)
                manifest = latest
        raise AssertionError("unreachable")

    def _load_distributed(self, world: World, store: Store, device: Any, verify: bool, into: dict | None,
                          allow_pickle: bool = False, bounded: bool = False) -> dict:
        """This rank's part of a load under a launch, of the same committed checkpoint as every other rank.

        1. rank 0 reads the manifest and hands it round (node-local storage works too)
        2. every rank loads its part (a single-process checkpoint: all of it), and all compare outcomes
        3. all loaded: done. Some failed, each in a way a replacing save can cause (a shard gone, a read
           error): rank 0 reads the manifest again and decides for everyone. A new one (a save with
           ``overwrite=True`` committed meanwhile): every rank loads it, back to 2, up to
           ``LOAD_ATTEMPTS`` loads, then every rank raises the same CorruptCheckpointError. The same one,
           or any other failure: a rank that failed raises its error, the others RankFailedError
           naming it.

        So no rank returns a part of one checkpoint while another loads a different one, and every
        rank makes the same collective calls (the failures gathered are the same on all of them). With
        ``into=``, a rank copies into it only once every rank has read its part and found that it fits:
        when one fails, no rank's ``into`` has changed (with ``bounded``, a load through the ring copies
        as it reads: only the fit is checked before).
        """
        manifest = _shared_manifest(world, store)
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            loaded, failure, error = None, None, None
            try:
                # A single-process checkpoint loads whole on every rank; a distributed one part by part.
                part = mf.rank_part(manifest, store.url, rank=world.rank if "ranks" in manifest else None,
                                    world_size=world.world_size)
                # With into=, each rank reads its part and checks that it fits, but copies nothing yet.
                loaded = self._timed_load(store, manifest, part, device, verify, into, into is not None, allow_pickle,
                                          bounded)
            except Exception as exc:
                failure, error = (f"{type(exc).__name__}: {exc}", isinstance(exc, _MAYBE_REPLACED)), exc
            failures = world.all_gather(failure, "loading")  # every rank gets here, failed or not
            bad = {r: f for r, f in enumerate(failures) if f is not None}
            if not bad:
                if into is not None:
                    loaded()  # every rank's part was read and fits its into=: now each copies
                    return into
                return loaded
            verdict, latest = "failed", None
            if all(maybe_replaced for _, maybe_replaced in bad.values()):
                verdict, latest = _recheck_together(world, store, manifest, attempt)
            if verdict == "retry":
                if world.is_first:
                    log.info("%s was replaced by a new save while loading it: every rank loads the new one",
                             store.url)
                manifest = latest
                continue
            if verdict == "replaced":
                raise _replaced_too_often(store) from error
            if error is not None:
                damage = _vanished_shard(store, error) if verdict == "unchanged" else None
                if damage is not None:
                    raise damage from None
                raise error
            raise RankFailedError(f"rank {world.rank}: loading {store.url} failed on "
                                  + "; ".join(f"rank {r} ({text})" for r, (text, _) in sorted(bad.items())))
        raise AssertionError("unreachable")

    def _timed_load(self, store: Store, manifest: dict, part: dict, device: Any, verify: bool,
                    into: dict | None, defer: bool = False, allow_pickle: bool = False, bounded: bool = False) -> Any:
        """``_load_part``, its time kept in ``last_load_s`` (reads and rebuild, no coordination; with
        ``defer``, the copy into ``into`` is timed into it when it is made)."""
        start = time.perf_counter()
        loaded = self._load_part(store, manifest, part, device, verify, into, defer, allow_pickle, bounded)
        self.last_load_s = time.perf_counter() - start
        if not defer:
            return loaded

        def copy() -> None:
            started = time.perf_counter()
            loaded()
            self.last_load_s += time.perf_counter() - started

        return copy

    def _load_part(self, store: Store, manifest: dict, part: dict, device: Any, verify: bool,
                   into: dict | None, defer: bool = False, allow_pickle: bool = False, bounded: bool = False) -> Any:
        """Load one save's (or one rank's) ``part`` of ``manifest``; see :meth:`load`. With ``into`` and
        ``defer``: check that the part fits ``into`` and return the copy into it, to be called (before
        the next load reuses the read buffer) instead of made."""
        import torch

        if not allow_pickle:
            refuse_pickled(part["skeleton"])  # before anything is read
        shards = part["shards"]  # checked by mf.check_part: well formed, every tensor inside its shard
        for s in shards:  # before the read buffer is sized by what the manifest claims
            try:
                size = store.size(s["name"])
            except UnsafeFileError as exc:  # a symlink or special file where a shard belongs: never read
                raise mf.CorruptCheckpointError(f"shard {s['name']} of {store.url}: {exc}") from None
            if size != s["nbytes"]:
                raise mf.CorruptCheckpointError(
                    f"shard {s['name']} of {store.url} is {'missing' if size is None else f'{size} bytes'}; "
                    f"the manifest says {s['nbytes']} bytes")
        offsets, total = [], 0
        for s in shards:
            offsets.append(total)
            total = -(-(total + s["nbytes"]) // 4096) * 4096
        # Through the ring on a store read in ranges chunk by chunk (a directory, not on a network or FUSE
        # mount, whose shards are read whole in streams, and written so: ``writes_pieces``).
        if bounded and into is not None and store.ranged_reads and store.writes_pieces and total > ring_bytes():
            streamed = self._load_through_ring(store, manifest, part, offsets, verify, into, allow_pickle)
            if streamed is not None:
                if defer:
                    return streamed
                streamed()
                return into
        relocate = device if callable(device) else None  # torch.load's map_location function
        if relocate is not None:
            device = "cpu"
        to_device = into is None and torch.device(device).type != "cpu"
        if into is not None or to_device:
            # The Checkpointer's own read buffer: reused, and registered with CUDA (pinned) where
            # one is present, so host-to-device copies out of it run at full speed.
            self._read_buffer.ensure(max(total, 4096))
            buffer = self._read_buffer.buffer
            faulting: Any = contextlib.nullcontext()  # in memory since its first load
        else:
            _require_memory(store, total)
            buffer = _fresh_read_buffer(max(total, 4096))
            faulting = _faulting_ahead(buffer)
        entries = part["tensors"]
        with faulting:
            view = memoryview(buffer)
            files = [(s["name"], view[o:o + s["nbytes"]]) for s, o in zip(shards, offsets, strict=True)]
            try:
                if verify and manifest.get("checksum"):
                    checks = _checksum_ranges(entries, offsets, manifest["checksum"]["block_bytes"], store.url)
                    self._read_verified(store, buffer, files, checks, shards)
                else:
                    store.read_files(files, **tuning.read_settings(store, self._given[2], self.threads,
                                                                   self.block_size))
            except UnsafeFileError as exc:  # a shard swapped for a symlink or special file since its size was checked
                raise mf.CorruptCheckpointError(f"{store.url}: {exc}") from None
        flat = torch.frombuffer(buffer, dtype=torch.uint8) if total and into is not None else None
        tensors: list[Any] = []
        for e in entries:
            dtype, shape = dtype_of(e["dtype"]), tuple(e["shape"])
            if e["alias_of"] is not None:
                tensors.append(tensors[e["alias_of"]])
                continue
            if e["nbytes"] == 0:
                tensors.append(torch.empty(shape, dtype=dtype, device=device if to_device else "cpu"))
                continue
            offset = offsets[e["shard"]] + e["offset"]
            if flat is not None:  # into=: views into the reused read buffer, copied out below
                t = typed_view(flat, offset, e["nbytes"], dtype, shape)
            elif to_device:  # its own device memory, copied out of the pinned read buffer
                t = torch.empty(shape, dtype=dtype, device=device)
                copy_values(t, _own_storage_view(buffer, offset, e["nbytes"], dtype, shape), non_blocking=True)
            else:
                t = _own_storage_view(buffer, offset, e["nbytes"], dtype, shape)
            tensors.append(t)
        if relocate is not None and into is None:
            tensors = _relocated(tensors, relocate)
        loaded = rebuild(part["skeleton"], tensors, allow_pickle)
        if to_device:
            _synchronize(device)  # the read buffer is reused by the next load
        if into is None:
            return loaded
        copy = _fit_into(into, loaded)
        if defer:
            return copy
        copy()
        return into

    def _load_through_ring(self, store: Store, manifest: dict, part: dict, offsets: list[int], verify: bool,
                           into: dict, allow_pickle: bool) -> Callable[[], None] | None:
        """Read ``part`` straight into ``into``'s tensors through the staging ring (see the module
        docstring); returns what is left to do (the plain values, put into ``into``), or None, having
        read nothing, where it cannot (a tensor of ``into`` not contiguous on the CPU, or an entry
        stored as bytes: numpy arrays, pickles). A misfit raises UsageError before anything is read; a
        checksum mismatch raises CorruptCheckpointError once every chunk was read, with the tensors
        of ``into`` holding what was read (a partial load)."""
        import torch

        entries = part["tensors"]
        if _stores_values(part["skeleton"]):
            return None
        metas: list[Any] = []
        for e in entries:
            metas.append(metas[e["alias_of"]] if e["alias_of"] is not None else
                         torch.empty(tuple(e["shape"]), dtype=dtype_of(e["dtype"]), device="meta"))
        fit = _fit_into(into, rebuild(part["skeleton"], metas, allow_pickle))
        entry_of = {metas[i].untyped_storage()._cdata: i for i, e in enumerate(entries) if e["alias_of"] is None}
        targets: dict[int, list[Any]] = {}
        for d, src, _ in fit.tensors:
            if d.device.type != "cpu" or not d.is_contiguous() or d.is_conj() or d.is_neg():
                log.info("loading through the ring: an into= tensor is not contiguous on the CPU; reading whole")
                return None
            targets.setdefault(entry_of[src.untyped_storage()._cdata], []).append(d)
        shards = part["shards"]
        # Per shard: its stored tensors by offset, each with the into= tensors (flat bytes) it goes to.
        layout: list[tuple[np.ndarray, np.ndarray, list[list[Any]]]] = []
        for shard in range(len(shards)):
            placed = sorted((e["offset"], e["nbytes"], i) for i, e in enumerate(entries)
                            if e["alias_of"] is None and e["nbytes"] and e["shard"] == shard)
            layout.append((np.array([p[0] for p in placed], np.int64), np.array([p[1] for p in placed], np.int64),
                           [[as_bytes(d) for d in targets.get(p[2], [])] for p in placed]))
        checks = [c for by_shard in _checksum_ranges(entries, offsets, manifest["checksum"]["block_bytes"], store.url)
                  for c in by_shard] if verify and manifest.get("checksum") else []
        crcs = RunningCrcs(np.array([c.offset for c in checks], np.int64), np.array([c.nbytes for c in checks], np.int64))
        threads = max(1, self.threads // 2)

        def process(slot: Any, shard: int, start: int, length: int) -> None:
            if checks:
                crcs.add(slot, offsets[shard] + start, offsets[shard] + start + length, threads)
            flat = torch.frombuffer(slot, dtype=torch.uint8)
            starts, sizes, goes_to = layout[shard]
            first = int(np.searchsorted(starts + sizes, start, side="right"))
            last = int(np.searchsorted(starts, start + length, side="left"))
            with torch.no_grad():
                for k in range(first, last):
                    begin, end = max(int(starts[k]), start), min(int(starts[k] + sizes[k]), start + length)
                    for d in goes_to[k]:
                        d[begin - int(starts[k]):end - int(starts[k])].copy_(flat[begin - start:end - start])

        settings = tuning.read_settings(store, self._given[2], self.threads, self.block_size)
        with self._ring.lock:
            slots = self._ring.slots()
            with Pipeline(slots, ("check",)) as pipe:
                for k, (shard, start, length) in enumerate(chunks([(0, s["nbytes"]) for s in shards], len(slots[0]))):
                    slot = pipe.slot(k)
                    try:
                        store.read_ranges([(shards[shard]["name"], start, memoryview(slot)[:length])], **settings)
                    except UnsafeFileError as exc:  # a shard swapped for a symlink or special file since its size was checked
                        raise mf.CorruptCheckpointError(f"{store.url}: {exc}") from None
                    pipe.submit(k, "check", process, slot, shard, start, length)
                pipe.join()
        if checks:
            _raise_first_mismatch([(c, got) for c, got in zip(checks, crcs.crcs, strict=True) if got != c.crc32c],
                                  shards, store, "; the into= tensors hold what was read")
        return fit.rest

    def _read_verified(self, store: Store, buffer: Any, files: list[tuple[str, memoryview]],
                       checks: list[list[_Check]], shards: list[dict]) -> None:
        """Read ``files`` (one per shard) in groups of ``threads`` shards, and check the CRC-32C of each
        group's tensors on a second thread while the next group is read (engine reads and CRCs both
        release the GIL). Fails like reading everything, then checking everything: a read error
        first, else the mismatch of the first tensor in manifest order."""
        reads_done = threading.Event()

        def check(group: range) -> list[tuple[_Check, int]]:
            # Beside the reads, half the threads (the readers fault pages in); all of them after.
            threads = self.threads if reads_done.is_set() else max(1, self.threads // 2)
            ranges = [c for shard in group for c in checks[shard]]
            crcs = native.crc32c_ranges(buffer, [(c.offset, c.nbytes) for c in ranges], threads)
            return [(c, got) for c, got in zip(ranges, crcs, strict=True) if got != c.crc32c]

        per_group = max(1, self.threads)  # stores that read whole files in parallel keep every thread busy
        groups = [range(i, min(i + per_group, len(files))) for i in range(0, len(files), per_group)]
        with Workers(1, "ckptbench-verify") as verifier:
            for n, group in enumerate(groups):
                store.read_files(files[group.start:group.stop], **tuning.read_settings(
                    store, self._given[2], self.threads, self.block_size))
                if n == len(groups) - 1:
                    reads_done.set()
                verifier.submit(check, group)
            mismatches = [m for found in verifier.join() for m in found]
        _raise_first_mismatch(mismatches, shards, store)


def _raise_first_mismatch(mismatches: list[tuple[Any, int]], shards: list[dict], store: Store, after: str = "") -> None:
    """CorruptCheckpointError naming the first tensor (manifest order) whose CRC-32C differs; nothing if none."""
    if not mismatches:
        return
    first, got = min(mismatches, key=lambda m: m[0].order)
    raise mf.CorruptCheckpointError(
        f"checksum mismatch in tensor {first.key!r} (shard {shards[first.shard]['name']} of {store.url}): "
        f"crc32c {got:#010x}, manifest {first.crc32c:#010x}{after}",
        hint="the checkpoint is damaged; restore from another one")


def _relocated(tensors: list[Any], relocate: Callable[[Any, str], Any]) -> list[Any]:
    """Each tensor on the storage ``relocate(storage, "cpu")`` returns for its own, as ``torch.load`` calls
    a ``map_location`` function (None keeps it on the CPU); tied tensors stay one tensor."""
    import torch

    moved: dict[int, Any] = {}
    out = []
    for t in tensors:
        if id(t) not in moved:
            storage = relocate(t.untyped_storage(), "cpu")
            if storage is None:
                moved[id(t)] = t
            else:
                if isinstance(storage, torch.TypedStorage):
                    storage = storage.untyped()
                if not isinstance(storage, torch.UntypedStorage) or storage.nbytes() < t.untyped_storage().nbytes():
                    raise UsageError(f"map_location returned {type(storage).__name__} for a storage of "
                                     f"{t.untyped_storage().nbytes()} bytes", hint="return the storage it was "
                                     "given, moved (storage.cuda(), storage.cpu()), or None")
                moved[id(t)] = torch.empty(0, dtype=t.dtype, device=storage.device).set_(
                    storage, t.storage_offset(), t.shape, t.stride())
        out.append(moved[id(t)])
    return out


def _own_storage_view(buffer: Any, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """A (shape, dtype) tensor over ``buffer[offset : offset + nbytes]`` with a storage of its own.

    As after ``torch.load``, a loaded tensor's storage starts at its first byte and ends at its last:
    ``torch.set_rng_state`` accepts it, ``torch.save``/pickle write only its bytes, and no two loaded
    tensors share one (their storages all keep ``buffer`` alive, which is freed with the last of them,
    as the tensors of ``torch.load(mmap=True)`` keep their file's mapping)."""
    import torch

    return torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).view(shape)


class _Check(NamedTuple):
    """One checksummed range of the read buffer: whose it is, where, and the CRC-32C the manifest holds."""

    order: tuple[int, int]  # (tensor index in the manifest, block index in the tensor)
    key: str
    shard: int
    offset: int
    nbytes: int
    crc32c: int


def _checksum_ranges(entries: list[dict], offsets: list[int], block: int, where: str) -> list[list[_Check]]:
    """The checksummed ranges of every stored tensor, by shard (aliases and empty tensors have none)."""
    by_shard: list[list[_Check]] = [[] for _ in offsets]
    for index, e in enumerate(entries):
        if e["alias_of"] is not None or not e["nbytes"]:
            continue
        starts = range(0, e["nbytes"], block)
        if len(e["crc32c"] or ()) != len(starts):
            raise mf.CorruptCheckpointError(
                f"the manifest of {where} lists {len(e['crc32c'] or ())} checksums for tensor {e['key']!r}, "
                f"which needs {len(starts)}")
        base = offsets[e["shard"]] + e["offset"]
        by_shard[e["shard"]].extend(
            _Check((index, k), e["key"], e["shard"], base + start, min(block, e["nbytes"] - start), crc)
            for k, (start, crc) in enumerate(zip(starts, e["crc32c"], strict=True)))
    return by_shard


#: Bytes faulted in per madvise call ahead of the readers (the call holds the GIL: keep it short).
_FAULT_AHEAD_BYTES = 8 * 2**20


def _fresh_read_buffer(nbytes: int) -> mmap.mmap:
    """Zeroed, page-aligned memory for one load, not yet faulted in (see :func:`_faulting_ahead`).

    Not MADV_HUGEPAGE: huge pages speed reads up only while the host still backs the memory, and slow
    them down a lot once it has taken it back (a VM's free page reporting), which can change within a run."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)


@contextlib.contextmanager
def _faulting_ahead(buffer: mmap.mmap) -> Iterator[None]:
    """Fault ``buffer`` in from its start on a helper thread while the body reads into it in order.

    Page faults are most of a cold load's CPU time: done by the reader threads, between their
    reads, they leave the device idle; touching the whole buffer first, on one thread, delays every
    read. Faulted in alongside the reads, from the front, the buffer stays ahead of the readers
    (where they overtake it, they fault their own pages). Without MADV_POPULATE_WRITE (Linux before
    5.14, other systems) the readers fault every page themselves.
    """
    stop = threading.Event()

    def fault_in() -> None:
        for start in range(0, len(buffer), _FAULT_AHEAD_BYTES):
            if stop.is_set():
                return
            try:
                buffer.madvise(MADV_POPULATE_WRITE, start, min(_FAULT_AHEAD_BYTES, len(buffer) - start))
            except OSError:
                return

    helper = QuietThread(target=fault_in, name="ckptbench-fault-ahead", daemon=True)
    try:
        if sys.platform == "linux":
            helper.start()
        yield
    finally:
        stop.set()
        interrupts.join(helper)


def _stores_values(skeleton: Any) -> bool:
    """Whether ``skeleton`` holds an entry stored as bytes and rebuilt from them (a numpy array, bytes, a pickle)."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return any(k in skeleton for k in ("__numpy__", "__bytes__", "__pickle__"))
        return any(_stores_values(v) for v in skeleton.values())
    if isinstance(skeleton, list):
        return any(_stores_values(v) for v in skeleton)
    return False


class _Fit:
    """How ``into=`` comes to hold a loaded tree (:func:`_fit_into`): calling it makes every copy;
    ``tensors`` lists the (into= tensor, loaded tensor, path) pairs, ``rest`` puts the rest in
    (numpy arrays copied in place, plain values replaced) and waits for CUDA copies."""

    def __init__(self, dst: Any, tensors: list[tuple[Any, Any, str]], arrays: list[tuple[np.ndarray, np.ndarray]],
                 updates: list[tuple[Any, Any, Any]]) -> None:
        self.dst, self.tensors, self._arrays, self._updates = dst, tensors, arrays, updates

    def __call__(self) -> None:
        import torch

        with torch.no_grad():
            for d, s, path in self.tensors:
                try:
                    copy_values(d, s, non_blocking=d.device.type == "cuda")  # out of pinned memory; synchronized after
                except RuntimeError as exc:  # a destination torch refuses that the checks above did not foresee
                    raise UsageError(f"{path or '<root>'}: copying into the into= tensor failed ({exc}); the tensors "
                                     "before it in into= were loaded") from exc
        self.rest()

    def rest(self) -> None:
        for d, s in self._arrays:
            np.copyto(d, s)
        for container, slot, value in self._updates:
            container[slot] = value
        _synchronize_all(self.dst)


def _fit_into(dst: Any, src: Any) -> _Fit:
    """How ``dst`` (``load``'s ``into=``) comes to hold the loaded ``src``: each tensor copied into the
    matching preallocated tensor, in place (under no_grad: parameters are fine), and each plain value
    that differs (a step counter, a learning rate) put into its dict or list. Everything is checked
    here, and the copy returned to be made: an ``into=`` that does not fit is refused untouched, naming
    the first misfit."""
    fit = _Fit(dst, [], [], [])
    _fit_visit(fit, dst, src, "")
    return fit


def _where(path: str) -> str:
    return path or "<root>"


def _fit_visit(fit: _Fit, d: Any, s: Any, path: str, parent: Any = None, slot: Any = None) -> None:
    """:func:`_fit_into`'s walk, a function of its own: a closure that names itself to recurse is a reference
    cycle, and this one would hold the loaded tensors until the cyclic garbage collector runs."""
    import torch

    if isinstance(s, torch.Tensor):
        if not isinstance(d, torch.Tensor):
            raise UsageError(f"{_where(path)}: the checkpoint holds a tensor, into= holds {type(d).__name__}")
        if d.shape != s.shape or d.dtype != s.dtype:
            raise UsageError(f"{_where(path)}: checkpoint tensor {tuple(s.shape)} {s.dtype} does not fit into "
                             f"{tuple(d.shape)} {d.dtype}")
        problem = _unwritable(d)
        if problem:
            raise UsageError(f"{_where(path)}: the into= tensor cannot be loaded into: {problem}")
        fit.tensors.append((d, s, path))
    elif isinstance(s, dict):
        if not isinstance(d, dict):
            raise UsageError(f"{_where(path)}: the checkpoint holds a dict, into= holds {type(d).__name__}")
        if d.keys() != s.keys():
            missing, extra = [k for k in s if k not in d], [k for k in d if k not in s]
            raise UsageError(f"{_where(path)}: keys differ between the checkpoint and into= ("
                             + "; ".join(f"{label}: {', '.join(map(repr, keys[:5]))}{' ...' if len(keys) > 5 else ''}"
                                         for label, keys in (("missing from into=", missing),
                                                             ("not in the checkpoint", extra)) if keys) + ")")
        for key in s:
            _fit_visit(fit, d[key], s[key], f"{path}.{key}" if path else str(key), d, key)
    elif isinstance(s, np.ndarray):
        if isinstance(d, np.ndarray) and d.shape == s.shape and d.dtype == s.dtype and d.flags.writeable:
            fit._arrays.append((d, s))  # in place, as tensors are
        elif isinstance(parent, tuple):
            raise UsageError(f"{_where(path)}: the checkpoint holds a {s.dtype} array of shape {s.shape}, into= "
                             f"holds {type(d).__name__} inside a tuple, which cannot be updated")
        else:
            fit._updates.append((parent, slot, s))
    elif isinstance(s, (list, tuple)):
        if not isinstance(d, (list, tuple)) or len(d) != len(s):
            raise UsageError(f"{_where(path)}: a sequence of {len(s)} items does not fit into= here")
        for i, (di, si) in enumerate(zip(d, s, strict=True)):
            _fit_visit(fit, di, si, f"{path}[{i}]", d, i)
    else:
        if isinstance(d, (torch.Tensor, dict, list, tuple)):
            raise UsageError(f"{_where(path)}: the checkpoint holds a {type(s).__name__}, "
                             f"into= holds {type(d).__name__}")
        if type(d) is type(s) and bool(d == s or d != d and s != s):  # equal (NaN equals NaN here)
            return
        if isinstance(parent, tuple):
            raise UsageError(f"{_where(path)}: the checkpoint holds {s!r}, into= holds {d!r} inside a tuple, "
                             "which cannot be updated", hint="use a list, or pass into= without it")
        fit._updates.append((parent, slot, s))


def _unwritable(t: Any) -> str | None:
    """Why ``t`` cannot take an in-place copy (checked before any is made), or None."""
    import torch

    if t.device.type == "meta":
        return "it is on the meta device (no memory to load into)"
    if t.layout is not torch.strided:
        return f"it is a {t.layout} tensor"
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return "it was made under torch.inference_mode() and can only be updated inside it"
    if any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(), strict=True)):
        return "its elements overlap (an expanded view)"
    return None


def _synchronize(device: Any) -> None:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _synchronize_all(tree: Any) -> None:
    """Wait for the non-blocking copies into every CUDA device that ``tree``'s tensors live on."""
    import torch

    devices: set[Any] = set()
    _cuda_devices(tree, devices, torch.Tensor)
    for device in devices:
        torch.cuda.synchronize(device)


def _cuda_devices(node: Any, devices: set[Any], tensor_type: type) -> None:
    if isinstance(node, tensor_type):
        if node.device.type == "cuda":
            devices.add(node.device)
    elif isinstance(node, dict):
        for value in node.values():
            _cuda_devices(value, devices, tensor_type)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _cuda_devices(value, devices, tensor_type)


def _shared_manifest(world: World, store: Store) -> dict:
    """The manifest rank 0 reads, on every rank; rank 0 raises its own error, the others say so."""
    found: tuple[dict | None, str | None] = (None, None)
    first_error: BaseException | None = None
    if world.is_first:
        try:
            found = (mf.read_manifest(store), None)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they wait in the broadcast
            first_error, found = exc, (None, str(exc))
    manifest, problem = world.broadcast(found, "reading the manifest")
    if first_error is not None:
        raise first_error
    if problem is not None:
        raise mf.NotACheckpointError(f"rank 0 could not read the manifest: {problem}")
    return manifest


def _recheck_together(world: World, store: Store, manifest: dict, attempt: int) -> tuple[str, dict | None]:
    """After load failures a replacing save can cause, rank 0 reads the manifest again and every rank
    gets its verdict: ("retry", the new manifest), ("replaced", None) after ``LOAD_ATTEMPTS``, or
    ("unchanged", None). A rank 0 that cannot read it raises its error, the others RankFailedError."""
    verdict: tuple[str, Any] = ("unreadable", None)
    reread_error: BaseException | None = None
    if world.is_first:
        try:
            latest = current_manifest(store) or manifest  # gone altogether: report what went wrong
            if latest == manifest:
                verdict = ("unchanged", None)
            else:
                verdict = ("replaced", None) if attempt == LOAD_ATTEMPTS else ("retry", latest)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they wait in the broadcast
            reread_error, verdict = exc, ("unreadable", f"{type(exc).__name__}: {exc}")
    verdict = world.broadcast(verdict, "checking whether the checkpoint was replaced")
    if reread_error is not None:
        raise reread_error
    if verdict[0] == "unreadable":
        raise RankFailedError(f"rank {world.rank}: loading {store.url} failed, and rank 0 could not read "
                              f"its manifest again: {verdict[1]}")
    return verdict


def _vanished_shard(store: Store, exc: BaseException) -> mf.CorruptCheckpointError | None:
    """A shard that was not found under an unchanged manifest, said as the damage it is; else None."""
    if not isinstance(exc, FileNotFoundError):
        return None
    return mf.CorruptCheckpointError(
        f"a shard of {store.url} disappeared while it was read ({exc.filename or exc})",
        hint="the checkpoint is damaged or was removed meanwhile; restore from another one")


def _replaced_too_often(store: Store) -> mf.CorruptCheckpointError:
    return mf.CorruptCheckpointError(
        f"{store.url} was replaced by a new save {LOAD_ATTEMPTS} times while loading it",
        hint="load it when no save is writing to it")
