"""The streamed drain (``checkpoint/drain.py``): to a target that uploads files part by part, each shard is
read a part at a time and each part uploaded while the next ones are read, in bounded memory.

The target here is :class:`PartsStore`, a directory that takes files part by part as S3 does
(``upload_in_parts``: parts kept apart until ``complete()``), instrumented: parts in flight, reads made
while a part uploads. On S3 (Ceph RGW): tests/storage/test_manager_s3.py.
This file is also the worker of the SIGKILL test: ``python test_drain_stream.py SOURCE TARGET``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint.drain import DrainBuffers, copy_checkpoint
from ckptbench.errors import CorruptCheckpointError
from ckptbench.storage.store import LocalStore

HERE = Path(__file__).resolve()
PART = 64 * 1024
IO = {"threads": 2, "block_size": 1 << 20, "direct": False}


class _Parts:
    """One file of a PartsStore: each part a file ``NAME.part-INDEX`` until ``complete()`` joins them."""

    def __init__(self, store: PartsStore, name: str, nbytes: int, part_bytes: int | None = None) -> None:
        self.store, self.name = store, name
        self.part_bytes = part_bytes or store.part_bytes
        self.parts = max(1, -(-nbytes // self.part_bytes))
        self.completed = False

    def _path(self, index: int) -> Path:
        return self.store.local_path / f"{self.name}.part-{index}"

    def put(self, index: int, view: memoryview) -> None:
        store = self.store
        with store.lock:
            store.in_flight += 1
            store.most_in_flight = max(store.most_in_flight, store.in_flight)
        try:
            if store.on_put is not None:
                store.on_put(self, index)
            time.sleep(store.put_s)
            self._path(index).write_bytes(bytes(view))
            with store.lock:
                store.puts += 1
        finally:
            with store.lock:
                store.in_flight -= 1

    def complete(self) -> None:
        with open(self.store.local_path / self.name, "wb") as out:
            for index in range(self.parts):
                out.write(self._path(index).read_bytes())
            out.flush()
            os.fsync(out.fileno())
        for index in range(self.parts):
            self._path(index).unlink()
        self.completed = True
        self.store.completed.append(self.name)

    def abort(self) -> None:
        for index in range(self.parts):
            self._path(index).unlink(missing_ok=True)
        if self.completed:
            (self.store.local_path / self.name).unlink(missing_ok=True)
        self.store.aborted.append(self.name)


class PartsStore(LocalStore):
    """A directory written part by part (``upload_in_parts``), counting the parts uploading at once."""

    def __init__(self, path: os.PathLike | str, *, part_bytes: int = PART, workers: int = 8,
                 put_s: float = 0.0) -> None:
        super().__init__(path)
        self.part_bytes, self.workers, self.put_s = part_bytes, workers, put_s
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = self.puts = 0
        self.completed: list[str] = []
        self.aborted: list[str] = []
        self.part_sizes: set[int] = set()  # of the uploads opened
        self.on_put = None

    def concurrency(self, threads: int) -> int:
        return self.workers

    def upload_in_parts(self, name: str, nbytes: int, part_bytes: int | None = None) -> _Parts:
        self.part_sizes.add(part_bytes or self.part_bytes)
        return _Parts(self, name, nbytes, part_bytes)


class WatchedSource(LocalStore):
    """A source that counts its reads made while a part of ``target`` was uploading."""

    def __init__(self, path: os.PathLike | str, target: PartsStore) -> None:
        super().__init__(path)
        self.target = target
        self.reads = self.overlapped = 0

    def read_ranges(self, ranges, **kwargs) -> None:
        with self.target.lock:
            self.reads += 1
            self.overlapped += self.target.in_flight > 0
        super().read_ranges(ranges, **kwargs)


def state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    # odd sizes: tensors (and their checksummed blocks) straddle the parts' boundaries
    return {"a": torch.randn(300_001, generator=generator), "b": torch.randint(0, 255, (77_777,), dtype=torch.uint8, generator=generator),
            "c": {"d": torch.randn((129, 257), generator=generator)}, "step": seed}


def assert_same(loaded: dict, expected: dict) -> None:
    assert loaded["step"] == expected["step"]
    for key in ("a", "b"):
        assert torch.equal(loaded[key], expected[key])
    assert torch.equal(loaded["c"]["d"], expected["c"]["d"])


def _shards(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("shard-*"))}


def test_a_streamed_drain_is_bit_exact_and_reads_while_it_uploads(tmp_path: Path):
    source_dir, target_dir = tmp_path / "local", tmp_path / "remote"
    saved = state(1)
    ckptbench.save(saved, source_dir, shard_size=512 * 1024)
    target = PartsStore(target_dir, put_s=0.005)
    source = WatchedSource(source_dir, target)
    result = copy_checkpoint(source, target, step=1, **IO)
    shards = _shards(source_dir)
    assert len(shards) >= 3 and result.copied and result.bytes == sum(len(b) for b in shards.values())
    assert _shards(target_dir) == shards  # every byte
    assert sorted(target.completed) == sorted(shards) and not target.aborted
    assert target.puts == sum(-(-len(b) // PART) for b in shards.values())  # part by part, not whole files
    assert source.reads == target.puts and source.overlapped > 0  # reads went on while parts uploaded
    assert not list(target_dir.glob("*.part-*"))
    assert_same(ckptbench.load(target_dir), saved)


@pytest.mark.parametrize("budget_parts", [1, 3, 5])
def test_parts_in_flight_never_exceed_the_buffer_bound(tmp_path: Path, budget_parts: int):
    # uploads slower than reads, 8 upload workers: the reader waits for free part buffers
    ckptbench.save(state(2), tmp_path / "local", shard_size=512 * 1024)
    target = PartsStore(tmp_path / "remote", workers=8, put_s=0.01)
    buffers = DrainBuffers()
    copy_checkpoint(LocalStore(tmp_path / "local"), target, step=2, buffers=buffers,
                    buffer_bytes=budget_parts * PART, **IO)
    bound = max(2, budget_parts)  # at least one part read while one uploads
    assert target.puts > 4 * bound
    assert buffers.slots == bound and buffers.held_bytes == bound * PART
    assert 2 <= target.most_in_flight <= bound  # pipelined, and bounded
    assert_same(ckptbench.load(tmp_path / "remote"), state(2))


def test_the_buffers_stay_within_the_upload_workers(tmp_path: Path):
    # a large budget holds no more parts than the workers can upload, plus the one being read
    ckptbench.save(state(3), tmp_path / "local", shard_size=512 * 1024)
    target = PartsStore(tmp_path / "remote", workers=2, put_s=0.01)
    buffers = DrainBuffers()
    copy_checkpoint(LocalStore(tmp_path / "local"), target, step=3, buffers=buffers, buffer_bytes=1 << 30, **IO)
    assert buffers.slots == 3 and target.most_in_flight == 2
    assert_same(ckptbench.load(tmp_path / "remote"), state(3))


def test_the_drain_uploads_as_many_parts_at_once_as_it_is_told(tmp_path: Path, monkeypatch):
    from ckptbench import knobs

    monkeypatch.setattr(knobs, "DRAIN_UPLOADS", 1)
    ckptbench.save(state(3), tmp_path / "local", shard_size=512 * 1024)
    target = PartsStore(tmp_path / "remote", workers=8, put_s=0.005)
    buffers = DrainBuffers()
    copy_checkpoint(LocalStore(tmp_path / "local"), target, step=3, buffers=buffers, buffer_bytes=1 << 30, **IO)
    assert target.most_in_flight == 1 and buffers.slots == 2
    assert_same(ckptbench.load(tmp_path / "remote"), state(3))


def test_the_drain_uploads_parts_of_the_size_it_is_told(tmp_path: Path, monkeypatch):
    from ckptbench import knobs

    ckptbench.save(state(4), tmp_path / "local", shard_size=512 * 1024)
    shards = _shards(tmp_path / "local")
    monkeypatch.setattr(knobs, "DRAIN_PART_BYTES", 3 * PART)
    target = PartsStore(tmp_path / "remote", put_s=0.001)
    copy_checkpoint(LocalStore(tmp_path / "local"), target, step=4, **IO)
    assert target.part_sizes == {3 * PART}
    assert target.puts == sum(-(-len(data) // (3 * PART)) for data in shards.values())
    assert _shards(tmp_path / "remote") == shards
    assert_same(ckptbench.load(tmp_path / "remote"), state(4))


def test_a_damaged_source_completes_nothing(tmp_path: Path):
    ckptbench.save(state(4), tmp_path / "remote")  # the target's previous checkpoint
    ckptbench.save(state(5), tmp_path / "local", shard_size=512 * 1024)
    shard = sorted((tmp_path / "local").glob("shard-*"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) - 100] ^= 0xFF  # in the last part of the last shard: earlier parts are uploaded by then
    shard.write_bytes(bytes(data))
    target = PartsStore(tmp_path / "remote")
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        copy_checkpoint(LocalStore(tmp_path / "local"), target, step=5, **IO)
    assert target.puts > 0 and not target.completed and target.aborted
    assert not list((tmp_path / "remote").glob("*.part-*"))
    assert_same(ckptbench.load(tmp_path / "remote"), state(4))


def test_a_failed_upload_aborts_every_object_and_keeps_the_previous_checkpoint(tmp_path: Path):
    ckptbench.save(state(6), tmp_path / "remote")
    ckptbench.save(state(7), tmp_path / "local", shard_size=512 * 1024)
    target = PartsStore(tmp_path / "remote")
    before = _shards(tmp_path / "remote")

    def fail(upload, index):
        if upload.name == sorted(_shards(tmp_path / "local"))[1] and index == 2:
            raise OSError("the remote tier went away")

    target.on_put = fail
    with pytest.raises(OSError, match="went away"):
        copy_checkpoint(LocalStore(tmp_path / "local"), target, step=7, **IO)
    assert not target.completed and target.aborted
    assert not list((tmp_path / "remote").glob("*.part-*"))
    assert _shards(tmp_path / "remote") == before
    assert_same(ckptbench.load(tmp_path / "remote"), state(6))


def test_a_streamed_drain_killed_midway_leaves_a_loadable_checkpoint(tmp_path: Path, kill_when_it_says):
    source, target = tmp_path / "local", tmp_path / "remote"
    ckptbench.save(state(8), source, shard_size=512 * 1024)
    copy_checkpoint(LocalStore(source), PartsStore(target), step=8, **IO)
    ckptbench.save(state(9), source, shard_size=512 * 1024, overwrite=True)
    kill_when_it_says([sys.executable, str(HERE), str(source), str(target)], {**os.environ, "PYTHONSAFEPATH": "1"},
                      "uploading")
    assert list(target.glob("*.part-*"))  # killed with parts uploaded, nothing completed
    assert_same(ckptbench.load(target), state(8))
    copy_checkpoint(LocalStore(source), PartsStore(target), step=9, **IO)  # the next copy goes through
    assert_same(ckptbench.load(target), state(9))


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="ioprio_get: x86_64 Linux")
def test_the_drain_thread_yields_the_cpu_and_the_disk(monkeypatch):
    import ctypes

    from ckptbench import knobs
    from ckptbench.checkpoint.drain import lower_priority

    monkeypatch.setattr(knobs, "DRAIN_NICE", 5)
    monkeypatch.setattr(knobs, "DRAIN_IDLE_IO", 1)
    seen: dict = {}

    def drain_thread() -> None:  # a thread's nice value and I/O class are its own: the test's stay as they are
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        lower_priority()

        def started() -> None:
            tid = threading.get_native_id()
            seen["nice"] = os.getpriority(os.PRIO_PROCESS, tid) - before
            seen["io_class"] = ctypes.CDLL(None).syscall(252, 1, tid) >> 13  # ioprio_get(IOPRIO_WHO_PROCESS)

        child = threading.Thread(target=started)  # as the drain's upload and engine workers
        child.start()
        child.join()

    thread = threading.Thread(target=drain_thread)
    thread.start()
    thread.join()
    assert seen == {"nice": min(5, 19 - os.getpriority(os.PRIO_PROCESS, 0)), "io_class": 3}  # idle class


def _worker(source: str, target: str) -> None:
    """Copy SOURCE to TARGET streamed; say so once parts of the second shard are in, then hang until killed."""
    store = PartsStore(target)

    said = threading.Event()

    def hang(upload, index):
        with store.lock:
            if store.puts <= 8:
                return
            if not said.is_set():
                said.set()
                print("uploading", flush=True)
        time.sleep(600)

    store.on_put = hang
    copy_checkpoint(LocalStore(source), store, step=9, **IO)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
