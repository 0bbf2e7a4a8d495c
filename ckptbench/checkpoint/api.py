"""``save`` / ``load`` and the reusable :class:`Checkpointer` (the common training-loop use).

Call sequence of a save (each step's result feeds the next; only step 2 blocks an async caller):

1. plan   - flatten the state_dict, lay tensors out in shards (pure, ``plan.plan_save``)
2. stage  - copy every tensor into the reused host arena (``stage.stage``); ``stall_s`` ends here
3. write  - the engine writes the shards from the arena, O_DIRECT where possible, each file
            fdatasynced and the directory fsynced; CRC-32C of every tensor computed alongside
4. commit - the manifest, written to a temp name, fsynced, renamed, directory fsynced. Only now does
            the checkpoint exist; ``persist_s`` (staging end -> durable) ends here.

A save never touches the files of a committed checkpoint: shards carry a per-save id, and the files
of the previous checkpoint are removed only after the new manifest is committed.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from ckptbench import __version__, knobs, native
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.plan import CHECKSUM_BLOCK_BYTES, SavePlan, plan_save
from ckptbench.checkpoint.stage import Arena, dtype_of, stage, typed_view
from ckptbench.errors import InsufficientSpaceError, StorageIOError, UsageError
from ckptbench.storage.store import Store, open_store
from ckptbench.units import format_size

log = logging.getLogger(__name__)


class CheckpointExistsError(UsageError):
    """The target already holds a committed checkpoint and ``overwrite`` was not given."""


@dataclass(frozen=True)
class SaveResult:
    """What a save did. ``stall_s``: time the caller was blocked (plan + stage, plus any wait for a
    previous save); ``persist_s``: staging end -> durable commit; ``gbps``: bytes / (stall + persist)."""

    path: str
    bytes: int
    files: int
    tensors: int
    stall_s: float
    persist_s: float
    threads: int
    shard_size: int
    block_size: int
    direct: bool
    sync: str
    checksum: bool
    direct_fallback_reason: str | None = None

    @property
    def total_s(self) -> float:
        return self.stall_s + self.persist_s

    @property
    def gbps(self) -> float:
        return self.bytes / self.total_s / 1e9 if self.total_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_s": self.total_s, "gbps": self.gbps}


class SaveHandle:
    """An asynchronous save in flight. ``staged`` is True once the caller may change its tensors
    (always on return from ``save``); ``result()`` blocks until the checkpoint is durable."""

    def __init__(self, future: Future) -> None:
        self._future = future
        self.staged = True

    def wait_staged(self) -> None:
        """Returns at once: ``save(..., async_=True)`` returns only after staging."""

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> SaveResult:
        return self._future.result(timeout)


def _require_free(store: Store, nbytes: int) -> None:
    free = store.free_bytes()
    if free is not None and free < nbytes:
        raise InsufficientSpaceError(
            f"{store.url} has {format_size(free)} free but the checkpoint needs {format_size(nbytes)}",
            hint="free space or save elsewhere",
        )


class Checkpointer:
    """Saves and loads checkpoints, keeping its staging arena between saves.

    At most one save is in flight: a save started while the previous one persists first waits for
    it, and that wait counts as stall. ``close()`` frees the arena.
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        shard_size: int | None = None,
        block_size: int | None = None,
        direct: bool | None = None,
        checksum: bool = True,
    ) -> None:
        self.threads = threads or knobs.SAVE_THREADS
        self.shard_size = shard_size or knobs.SAVE_SHARD_BYTES
        self.block_size = block_size or knobs.SAVE_BLOCK_BYTES
        self.direct = True if direct is None else direct
        self.checksum = checksum
        if self.threads < 1 or self.shard_size <= 0 or self.block_size <= 0:
            raise UsageError(f"threads ({self.threads}), shard_size ({self.shard_size}) and block_size "
                             f"({self.block_size}) must be positive")
        self._arena = Arena()
        self._read_buffer = Arena()
        self._in_flight: Future | None = None
        self._lock = threading.Lock()

    # -- save ---------------------------------------------------------------------------------

    def save(self, state_dict: Any, path: str | os.PathLike, *, async_: bool = False,
             overwrite: bool = False, storage_options: dict | None = None) -> SaveResult | SaveHandle:
        """Save ``state_dict`` to the directory ``path`` (created if missing).

        Sync: returns the SaveResult once the checkpoint is durable. Async: returns a SaveHandle
        after staging; the caller may then modify its tensors. Raises CheckpointExistsError when
        ``path`` holds a checkpoint and ``overwrite`` is False (nothing is written then).
        """
        t0 = time.perf_counter()
        self._wait_in_flight()
        store = open_store(path, storage_options)
        if not store.is_dir_like():
            raise UsageError(f"{os.fspath(path)!r} is a file; a checkpoint is a directory")
        if store.size(mf.MANIFEST_NAME) is not None and not overwrite:
            raise CheckpointExistsError(f"{store.url} already holds a checkpoint",
                                        hint="pass overwrite=True to replace it (the old one stays valid until "
                                             "the new one commits)")
        save_id = secrets.token_hex(4)
        plan, tensors = plan_save(state_dict, self.shard_size, shard_prefix=f"shard-{save_id}")
        store.prepare()
        _require_free(store, plan.total_bytes)
        with self._lock:
            stage(plan, tensors, self._arena, self.threads)
        del tensors  # the arena holds the bytes now
        stall_s = time.perf_counter() - t0
        if not async_:
            return self._persist(plan, store, save_id, stall_s, time.perf_counter())
        future: Future = Future()
        staged_at = time.perf_counter()

        def run() -> None:
            try:
                future.set_result(self._persist(plan, store, save_id, stall_s, staged_at))
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                future.set_exception(exc)

        self._in_flight = future
        threading.Thread(target=run, name="ckptbench-persist", daemon=True).start()
        return SaveHandle(future)

    def _wait_in_flight(self) -> None:
        if self._in_flight is not None:
            with contextlib.suppress(Exception):  # that save's caller sees its own error
                self._in_flight.result()
            self._in_flight = None

    def _persist(self, plan: SavePlan, store: Store, save_id: str, stall_s: float, staged_at: float) -> SaveResult:
        arena = self._arena.buffer
        view = memoryview(arena)
        files = [(s.name, view[s.arena_offset:s.arena_offset + s.nbytes]) for s in plan.shards]
        ranges = plan.checksum_ranges() if self.checksum else []
        crcs: list[int] = []
        crc_thread = None
        if ranges:
            # CRC-32C of the staged bytes runs beside the write (CPU-bound vs I/O-bound).
            def checksum() -> None:
                crcs.extend(native.crc32c_ranges(arena, [(o, n) for _, o, n in ranges], max(1, self.threads // 2)))

            crc_thread = threading.Thread(target=checksum, name="ckptbench-crc")
            crc_thread.start()
        try:
            report = store.write_files(files, threads=self.threads, block_size=self.block_size, direct=self.direct)
        except OSError as exc:
            raise StorageIOError(f"writing the checkpoint to {store.url} failed: {exc}") from exc
        finally:
            if crc_thread is not None:
                crc_thread.join()
        per_entry: dict[int, list[int]] = {}
        for (index, _, _), crc in zip(ranges, crcs, strict=True):
            per_entry.setdefault(index, []).append(crc)
        manifest = {
            "format": mf.FORMAT,
            "save_id": save_id,
            "tool_version": __version__,
            "created_unix_s": time.time(),
            "total_bytes": plan.total_bytes,
            "checksum": {"algorithm": "crc32c", "block_bytes": CHECKSUM_BLOCK_BYTES} if self.checksum else None,
            "shards": [{"name": s.name, "nbytes": s.nbytes} for s in plan.shards],
            "tensors": [
                {"key": e.key, "dtype": e.dtype, "shape": list(e.shape), "nbytes": e.nbytes, "shard": e.shard,
                 "offset": e.offset, "alias_of": e.alias_of, "crc32c": per_entry.get(e.index)}
                for e in plan.entries
            ],
            "skeleton": plan.skeleton,
        }
        self._commit(store, manifest, [s.name for s in plan.shards])
        keep = {s.name for s in plan.shards}
        store.remove(mf.stale_files(store, keep))
        if hasattr(store, "abort_incomplete_uploads"):  # uploads an earlier, failed save could not abort
            store.abort_incomplete_uploads(lambda name: bool(mf.OWNED_FILE.match(name)) and name not in keep)
        persist_s = time.perf_counter() - staged_at
        return SaveResult(
            path=store.url, bytes=plan.total_bytes, files=len(plan.shards) + 1, tensors=len(plan.entries),
            stall_s=stall_s, persist_s=persist_s, threads=self.threads, shard_size=self.shard_size,
            block_size=self.block_size, direct=report.direct, sync=report.sync, checksum=self.checksum,
            direct_fallback_reason=report.fallback_reason,
        )

    @staticmethod
    def _commit(store: Store, manifest: dict, shards: list[str]) -> None:
        """Write the manifest; if that fails, remove this save's shards unless the manifest did land.

        A failed PUT may still have been stored (the answer was lost), so the manifest is read back:
        ours -> the commit happened; another save's, or none -> our shards are orphans, removed; not
        readable -> left for the next save's sweep (removing them could break a committed checkpoint).
        """
        try:
            mf.commit(store, manifest)
        except BaseException as failure:
            try:
                current: dict | None = mf.read_manifest(store)
            except mf.NotACheckpointError:
                current = None
            except Exception:  # noqa: BLE001 - unreachable: leave the shards to the next sweep, report the commit
                raise failure from None
            if current is not None and current.get("save_id") == manifest["save_id"]:
                return
            store.remove(shards)
            raise

    # -- load ---------------------------------------------------------------------------------

    def load(self, path: str | os.PathLike, *, device: Any = "cpu", verify: bool = True,
             into: dict | None = None, storage_options: dict | None = None) -> dict:
        """The state_dict saved at ``path``: same structure, dtypes and shapes, bit-exact.

        Shards are read with the engine (O_DIRECT) into one aligned buffer, a group of ``threads``
        shards at a time; ``verify`` checks the CRC-32C of each group while the next one is read.
        Without ``into``, the tensors are views into a fresh buffer (no copies on CPU; a helper
        thread faults it in ahead of the reads), or copies on ``device``. With ``into`` (a
        state_dict of the same structure, e.g. the live model's), every tensor is copied into the
        matching preallocated tensor, on whatever device it lives, the read buffer is the
        Checkpointer's own and reused across loads, and ``into`` is returned. ``verify`` checks every
        CRC-32C and names the tensor and shard of any mismatch (CorruptCheckpointError).
        """
        import torch

        store = open_store(path, storage_options)
        manifest = mf.read_manifest(store)
        shards = manifest["shards"]
        offsets, total = [], 0
        for s in shards:
            offsets.append(total)
            total = -(-(total + s["nbytes"]) // 4096) * 4096
        to_device = into is None and torch.device(device).type != "cpu"
        if into is not None or to_device:
            # The Checkpointer's own read buffer: reused, and registered with CUDA (pinned) where
            # one is present, so host-to-device copies out of it run at full speed.
            self._read_buffer.ensure(max(total, 4096))
            buffer = self._read_buffer.buffer
            faulting: Any = contextlib.nullcontext()  # in memory since its first load
        else:
            buffer = _fresh_read_buffer(max(total, 4096))
            faulting = _faulting_ahead(buffer)
        entries = manifest["tensors"]
        with faulting:
            view = memoryview(buffer)
            for s in shards:
                size = store.size(s["name"])
                if size != s["nbytes"]:
                    raise mf.CorruptCheckpointError(
                        f"shard {s['name']} of {store.url} is {'missing' if size is None else f'{size} bytes'}; "
                        f"the manifest says {s['nbytes']} bytes")
            files = [(s["name"], view[o:o + s["nbytes"]]) for s, o in zip(shards, offsets, strict=True)]
            if verify and manifest.get("checksum"):
                checks = _checksum_ranges(entries, offsets, manifest["checksum"]["block_bytes"], store.url)
                self._read_verified(store, buffer, files, checks, shards)
            else:
                store.read_files(files, threads=self.threads, block_size=self.block_size, direct=self.direct)
        flat = torch.frombuffer(buffer, dtype=torch.uint8) if total else None
        if to_device and flat is not None:
            # One host-to-device copy of everything; the tensors are views into it on the device.
            flat = flat[:total].to(device, non_blocking=True)
        tensors: list[Any] = []
        for e in entries:
            dtype, shape = dtype_of(e["dtype"]), tuple(e["shape"])
            if e["alias_of"] is not None:
                tensors.append(tensors[e["alias_of"]])
                continue
            if e["nbytes"] == 0:
                t = torch.empty(shape, dtype=dtype, device=device if to_device else "cpu")
            else:
                t = typed_view(flat, offsets[e["shard"]] + e["offset"], e["nbytes"], dtype, shape)
            tensors.append(t)
        loaded = _rebuild(manifest["skeleton"], tensors)
        if to_device:
            _synchronize(device)  # the read buffer is reused by the next load
        if into is None:
            return loaded
        _copy_into(into, loaded, "")
        _synchronize_all(into)
        return into

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
        with ThreadPoolExecutor(1, thread_name_prefix="ckptbench-verify") as verifier:
            pending = []
            try:
                for n, group in enumerate(groups):
                    store.read_files(files[group.start:group.stop], threads=self.threads,
                                     block_size=self.block_size, direct=self.direct)
                    if n == len(groups) - 1:
                        reads_done.set()
                    pending.append(verifier.submit(check, group))
            except BaseException:
                verifier.shutdown(wait=True, cancel_futures=True)
                raise
            mismatches = [m for future in pending for m in future.result()]
        if mismatches:
            first, got = min(mismatches, key=lambda m: m[0].order)
            raise mf.CorruptCheckpointError(
                f"checksum mismatch in tensor {first.key!r} (shard {shards[first.shard]['name']} of {store.url}): "
                f"crc32c {got:#010x}, manifest {first.crc32c:#010x}",
                hint="the checkpoint is damaged; restore from another one")

    def close(self) -> None:
        """Wait for a save in flight, then free the staging arena."""
        self._wait_in_flight()
        self._arena.close()
        self._read_buffer.close()


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


#: madvise(2) advice that faults a range in, writable, in one call (Linux 5.14+; Python has no name for it).
_MADV_POPULATE_WRITE = 23
#: Bytes faulted in per madvise call ahead of the readers (the call holds the GIL: keep it short).
_FAULT_AHEAD_BYTES = 8 * 2**20


def _fresh_read_buffer(nbytes: int) -> mmap.mmap:
    """Zeroed, page-aligned memory for one load, not yet faulted in (see :func:`_faulting_ahead`).

    Not MADV_HUGEPAGE: on a 2-vCPU VM it made reads 1.5x faster when the host still backed the
    memory and 2-3x slower when it had taken it back (free page reporting), in the same run."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)


@contextlib.contextmanager
def _faulting_ahead(buffer: mmap.mmap) -> Iterator[None]:
    """Fault ``buffer`` in from its start on a helper thread while the body reads into it in order.

    Page faults are most of a cold load's CPU time: done by the reader threads, between their
    reads, they leave the device idle. Touching the whole buffer first, on one thread, made cold
    loads 1.6-3.6x slower here; faulting it in alongside the reads, from the front, keeps ahead of
    the readers (where they overtake it, they fault their own pages as before): cold loads
    1.1-1.3x faster (median of 8 paired rounds, 2 vCPUs, virtio disk). Without
    MADV_POPULATE_WRITE (Linux before 5.14, other systems) the readers fault every page themselves.
    """
    stop = threading.Event()

    def fault_in() -> None:
        for start in range(0, len(buffer), _FAULT_AHEAD_BYTES):
            if stop.is_set():
                return
            try:
                buffer.madvise(_MADV_POPULATE_WRITE, start, min(_FAULT_AHEAD_BYTES, len(buffer) - start))
            except OSError:
                return

    helper = threading.Thread(target=fault_in, name="ckptbench-fault-ahead", daemon=True)
    if sys.platform == "linux":
        helper.start()
    try:
        yield
    finally:
        stop.set()
        if helper.is_alive():
            helper.join()


def _copy_into(dst: Any, src: Any, path: str) -> None:
    """Copy loaded tensors into ``dst``'s tensors in place; plain values must already match."""
    import torch

    where = path or "<root>"
    if isinstance(src, torch.Tensor):
        if not isinstance(dst, torch.Tensor):
            raise UsageError(f"{where}: the checkpoint holds a tensor, into= holds {type(dst).__name__}")
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise UsageError(f"{where}: checkpoint tensor {tuple(src.shape)} {src.dtype} does not fit into "
                             f"{tuple(dst.shape)} {dst.dtype}")
        dst.copy_(src, non_blocking=dst.device.type == "cuda")  # out of pinned memory; synchronized after
    elif isinstance(src, dict):
        if not isinstance(dst, dict) or dst.keys() != src.keys():
            raise UsageError(f"{where}: keys differ between the checkpoint and into=")
        for key in src:
            _copy_into(dst[key], src[key], f"{path}.{key}" if path else str(key))
    elif isinstance(src, (list, tuple)):
        if not isinstance(dst, (list, tuple)) or len(dst) != len(src):
            raise UsageError(f"{where}: a sequence of {len(src)} items does not fit into= here")
        for i, (d, s) in enumerate(zip(dst, src, strict=True)):
            _copy_into(d, s, f"{path}[{i}]")


def _synchronize(device: Any) -> None:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _synchronize_all(tree: Any) -> None:
    """Wait for the non-blocking copies into every CUDA device that ``tree``'s tensors live on."""
    import torch

    devices: set[Any] = set()

    def walk(node: Any) -> None:
        if isinstance(node, torch.Tensor):
            if node.device.type == "cuda":
                devices.add(node.device)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(tree)
    for device in devices:
        torch.cuda.synchronize(device)


def _decode_value(node: Any) -> Any:
    if isinstance(node, list):
        return [_decode_value(v) for v in node]
    if isinstance(node, dict):
        if "__tuple__" in node:
            return tuple(_decode_value(v) for v in node["__tuple__"])
        if "__float__" in node:
            return float(node["__float__"])
    return node


def _rebuild(node: Any, tensors: list[Any]) -> Any:
    """Invert ``plan.flatten``'s skeleton."""
    if "__tensor__" in node:
        return tensors[node["__tensor__"]]
    if "__dict__" in node:
        return {(_decode_value(k["__key__"]) if isinstance(k, dict) else k): _rebuild(v, tensors)
                for k, v in node["__dict__"]}
    if "__list__" in node:
        return [_rebuild(v, tensors) for v in node["__list__"]]
    if "__tuple__" in node:
        return tuple(_rebuild(v, tensors) for v in node["__tuple__"])
    return _decode_value(node["__value__"])


_default: Checkpointer | None = None
_default_lock = threading.Lock()


def _default_checkpointer() -> Checkpointer:
    global _default
    with _default_lock:
        if _default is None:
            _default = Checkpointer()
        return _default


def save(state_dict: Any, path: str | os.PathLike, *, async_: bool = False, threads: int | None = None,
         shard_size: int | None = None, direct: bool | None = None, checksum: bool = True,
         overwrite: bool = False, storage_options: dict | None = None) -> SaveResult | SaveHandle:
    """Save ``state_dict`` to the directory ``path``; see :meth:`Checkpointer.save`.

    With default settings a process-wide Checkpointer is reused, so its staging arena survives
    between calls (allocate once, save many). Custom settings use a one-off Checkpointer.
    """
    if threads is None and shard_size is None and direct is None and checksum:
        return _default_checkpointer().save(state_dict, path, async_=async_, overwrite=overwrite,
                                            storage_options=storage_options)
    ckpt = Checkpointer(threads=threads, shard_size=shard_size, direct=direct, checksum=checksum)
    return ckpt.save(state_dict, path, async_=async_, overwrite=overwrite, storage_options=storage_options)


def load(path: str | os.PathLike, *, device: Any = "cpu", verify: bool = True, into: dict | None = None,
         storage_options: dict | None = None) -> dict:
    """Load the checkpoint at ``path``; see :meth:`Checkpointer.load`."""
    return _default_checkpointer().load(path, device=device, verify=verify, into=into,
                                        storage_options=storage_options)
