"""Guarantee 6: two saves to one path at once: one wins, the other fails at once naming the holder;
nothing mixed. Local paths (flock) here; the S3 lease against Ceph RGW in tests/storage/test_save_lock_s3.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer, lock
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.api import CheckpointExistsError
from ckptbench.checkpoint.lock import LOCK_NAME, CheckpointLockedError, LockLostError, acquire_save_lock
from ckptbench.errors import StorageIOError
from ckptbench.storage.store import LocalStore, open_store

#: A child that saves on command: "go VERSION" on stdin -> one save of its own state -> one line on stdout.
SAVER = textwrap.dedent("""
    import json, os, sys, torch
    from ckptbench.checkpoint import Checkpointer
    from ckptbench.checkpoint.lock import CheckpointLockedError

    path, who = sys.argv[1], sys.argv[2]
    options = json.loads(os.environ.get("CKPT_TEST_OPTIONS", "null"))
    ckpt = Checkpointer(threads=2, shard_size=4 * 2**20)
    code = {"A": 1, "B": 2}[who]
    print("ready", flush=True)
    for line in sys.stdin:
        version = int(line.split()[1])
        sd = {f"w{i}": torch.full((2**20,), float(code * 10000 + version * 10 + i)) for i in range(4)}
        sd.update(who=who, version=version)
        try:
            ckpt.save(sd, path, overwrite=True, storage_options=options)
        except CheckpointLockedError as exc:
            print("locked", json.dumps(str(exc)), flush=True)
        except Exception as exc:
            print("error", json.dumps(f"{type(exc).__name__}: {exc}"), flush=True)
        else:
            print("ok", flush=True)
""")


def expected_tensor(who: str, version: int, i: int) -> torch.Tensor:
    return torch.full((2**20,), float({"A": 1, "B": 2}[who] * 10000 + version * 10 + i))


def start_saver(path: str, who: str, options: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "CKPT_TEST_OPTIONS": json.dumps(options)}
    proc = subprocess.Popen([sys.executable, "-c", SAVER, path, who], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    return proc


def race_rounds(path: str, rounds: int, options: dict | None = None) -> tuple[int, list[str], list[int]]:
    """Both savers get "go" at once, ``rounds`` times; after each round the checkpoint must load as
    exactly the version of one saver that reported success. Returns (rounds with a refused save, the
    refusals, the savers' pids)."""
    savers = {who: start_saver(path, who, options) for who in "AB"}
    conflicts, messages = 0, []
    try:
        for proc in savers.values():
            assert proc.stdout.readline().strip() == "ready"
        for version in range(1, rounds + 1):
            for proc in savers.values():
                proc.stdin.write(f"go {version}\n")
                proc.stdin.flush()
            answers = {who: proc.stdout.readline().split(" ", 1) for who, proc in savers.items()}
            for who, answer in answers.items():
                assert answer[0].strip() in ("ok", "locked"), f"{who}: {answer}"
                if answer[0] == "locked":
                    messages.append(json.loads(answer[1]))
            winners = {who for who, answer in answers.items() if answer[0].strip() == "ok"}
            assert winners, f"round {version}: neither save succeeded: {answers}"
            conflicts += len(winners) == 1
            out = ckptbench.load(path, storage_options=options)
            assert (out["who"], out["version"]) in {(who, version) for who in winners}, (version, answers)
            for i in range(4):
                assert torch.equal(out[f"w{i}"], expected_tensor(out["who"], version, i)), (version, i)
    finally:
        for proc in savers.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    return conflicts, messages, [proc.pid for proc in savers.values()]


def test_two_processes_saving_to_one_path_one_wins_and_nothing_is_mixed(tmp_path: Path):
    path = tmp_path / "c"
    conflicts, messages, pids = race_rounds(str(path), rounds=15)
    assert conflicts > 0, "the two saves never overlapped: the test did not exercise the lock"
    # the refusal names the path, and the holder once it has recorded itself (right after taking the lock)
    assert all(message.startswith(f"{path} is being saved by ") for message in messages), messages
    assert any(f"is being saved by pid {pid} on host {socket.gethostname()}" in message
               for message in messages for pid in pids), messages
    manifest = json.loads((path / mf.MANIFEST_NAME).read_text())
    # the winner's sweep left exactly its own files; the loser wrote nothing; the lock file is gone
    assert sorted(p.name for p in path.iterdir()) == sorted([mf.MANIFEST_NAME] + [s["name"] for s in manifest["shards"]])


HOLDER = textwrap.dedent("""
    import sys, time
    from ckptbench.checkpoint.lock import acquire_save_lock
    from ckptbench.storage.store import open_store
    store = open_store(sys.argv[1])
    store.prepare()
    held = acquire_save_lock(store)
    print("held", flush=True)
    time.sleep(600)
""")


def test_a_second_process_fails_fast_naming_the_holder_and_writes_nothing(tmp_path: Path):
    path = tmp_path / "c"
    ckptbench.save({"v": torch.tensor([1])}, path)
    before = sorted(p.name for p in path.iterdir())
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        child = subprocess.run(
            [sys.executable, "-c", "import sys, torch, ckptbench\n"
             "ckptbench.save({'v': torch.tensor([2])}, sys.argv[1], overwrite=True)", str(path)],
            capture_output=True, text=True, timeout=120)
        assert child.returncode == 1
        last = child.stderr.strip().splitlines()[-1]
        assert last.startswith("ckptbench.errors.CheckpointLockedError: ")
        assert f"{path} is being saved by pid {holder.pid} on host {socket.gethostname()}" in last
        assert sorted(p.name for p in path.iterdir()) == sorted([*before, LOCK_NAME])  # no shard written
    finally:
        holder.kill()
        holder.wait()
    assert ckptbench.load(path)["v"].item() == 1
    ckptbench.save({"v": torch.tensor([3])}, path, overwrite=True)
    assert ckptbench.load(path)["v"].item() == 3


def test_a_lock_left_by_a_sigkilled_process_does_not_block_the_next_save(tmp_path: Path):
    path = tmp_path / "c"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (path / LOCK_NAME).exists()  # the file stays; the kernel dropped the flock with the process
    ckptbench.save({"v": torch.tensor([1])}, path)
    assert ckptbench.load(path)["v"].item() == 1
    assert not (path / LOCK_NAME).exists()


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch):
    """LocalStore.write_files waits for the returned event before writing (a save held mid-persist)."""
    go = threading.Event()
    original = LocalStore.write_files

    def write_files(self, *args, **kwargs):
        assert go.wait(60)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LocalStore, "write_files", write_files)
    yield go
    go.set()


def test_a_second_checkpointer_in_the_same_process_gets_the_error(tmp_path: Path, slow_writes):
    path = tmp_path / "c"
    first, second = Checkpointer(), Checkpointer()
    pending = first.save({"v": torch.tensor([1])}, path, async_=True)
    with pytest.raises(CheckpointLockedError, match=f"{path} is being saved by another Checkpointer in this process"):
        second.save({"v": torch.tensor([2])}, path)
    with pytest.raises(CheckpointLockedError):  # also with overwrite, and also the process-wide one
        ckptbench.save({"v": torch.tensor([2])}, path, overwrite=True)
    slow_writes.set()
    pending.result(timeout=60)
    assert ckptbench.load(path)["v"].item() == 1
    second.save({"v": torch.tensor([3])}, path, overwrite=True)  # free again once the first is durable
    assert ckptbench.load(path)["v"].item() == 3
    first.close()
    second.close()


def test_a_save_that_started_without_a_checkpoint_refuses_one_committed_meanwhile(tmp_path: Path, slow_writes):
    """The existence check is repeated under the lock: a save that planned before another committed
    does not replace that checkpoint without overwrite=True."""
    path = tmp_path / "c"
    first = Checkpointer()
    pending = first.save({"v": torch.tensor([1])}, path, async_=True)
    with pytest.raises(CheckpointLockedError):
        ckptbench.save({"v": torch.tensor([2])}, path)
    slow_writes.set()
    pending.result(timeout=60)
    with pytest.raises(CheckpointExistsError):
        ckptbench.save({"v": torch.tensor([2])}, path)
    assert ckptbench.load(path)["v"].item() == 1
    first.close()


def test_the_lock_is_released_when_a_save_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "c"

    def broken(self, *args, **kwargs):
        raise OSError(5, "injected write failure")

    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "write_files", broken)
        with pytest.raises(StorageIOError, match="injected"):
            ckptbench.save({"v": torch.tensor([1])}, path)
        with pytest.raises(StorageIOError):
            ckptbench.save({"v": torch.tensor([1])}, path, async_=True).result(timeout=60)
    assert not (path / LOCK_NAME).exists()
    ckptbench.save({"v": torch.tensor([2])}, path)
    assert ckptbench.load(path)["v"].item() == 2


def test_a_lock_released_before_the_commit_commits_nothing_and_removes_the_shards(tmp_path: Path):
    """What abandoning an async save at exit does: the persist finds its lock gone and stops."""
    path = tmp_path / "c"
    ckptbench.save({"v": torch.tensor([1])}, path)
    store = open_store(path)
    held = acquire_save_lock(store)
    (path / "shard-0123abcd-00000.bin").write_bytes(b"partial")
    assert held.release() is False  # not committed
    with pytest.raises(LockLostError, match="abandoned"), held.committing(store, ["shard-0123abcd-00000.bin"]):
        pytest.fail("the commit ran without the lock")
    assert not (path / "shard-0123abcd-00000.bin").exists()
    assert ckptbench.load(path)["v"].item() == 1


def test_best_effort_lease_on_a_generic_object_store():
    """fsspec stores get the best-effort lease: a second save is refused while the first holds it."""
    import fsspec

    url = f"memory://ckptbench-lock-{os.getpid()}/c"
    store = open_store(url)
    store.prepare()
    held = acquire_save_lock(store)
    try:
        assert isinstance(held, lock._Lease) and held._conditions == lock._Conditions(create=False, replace=False)
        with pytest.raises(CheckpointLockedError, match="another Checkpointer in this process"):
            ckptbench.save({"v": torch.tensor([1])}, url)
    finally:
        held.release()
    assert LOCK_NAME not in store.list()
    ckptbench.save({"v": torch.tensor([2])}, url)
    assert ckptbench.load(url)["v"].item() == 2 and LOCK_NAME not in store.list()
    fsspec.filesystem("memory").rm(f"/ckptbench-lock-{os.getpid()}", recursive=True)
