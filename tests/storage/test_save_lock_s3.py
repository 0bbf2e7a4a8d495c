"""Guarantee 6 on S3 (Ceph RGW): the save lock is a lease object created with ``If-None-Match: *``,
renewed and taken over with ``If-Match``. Local paths: tests/checkpoint/test_concurrency.py."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import lock
from ckptbench.checkpoint.lock import LOCK_NAME, CheckpointLockedError, Holder, LockLostError, acquire_save_lock
from ckptbench.checkpoint.manifest import MANIFEST_NAME, read_manifest
from ckptbench.storage.store import open_store

pytestmark = pytest.mark.s3

SAVER = textwrap.dedent("""
    import json, os, sys, torch
    from ckptbench.checkpoint import Checkpointer
    from ckptbench.checkpoint.lock import CheckpointLockedError

    url, who, options = sys.argv[1], sys.argv[2], json.loads(os.environ["CKPT_TEST_OPTIONS"])
    ckpt = Checkpointer(threads=2, shard_size=4 * 2**20)
    print("ready", flush=True)
    for line in sys.stdin:
        version = int(line)
        sd = {f"w{i}": torch.full((2**20,), float(ord(who) * 1000 + version * 10 + i)) for i in range(3)}
        sd.update(who=who, version=version)
        try:
            ckpt.save(sd, url, overwrite=True, storage_options=options)
            print("ok", flush=True)
        except CheckpointLockedError as exc:
            print("locked", json.dumps(str(exc)), flush=True)
""")

HOLDER = textwrap.dedent("""
    import json, os, sys, time
    from ckptbench.checkpoint.lock import acquire_save_lock
    from ckptbench.storage.store import open_store
    store = open_store(sys.argv[1], json.loads(os.environ["CKPT_TEST_OPTIONS"]))
    held = acquire_save_lock(store)
    print("held", flush=True)
    time.sleep(600)
""")


def child(code: str, url: str, options: dict, *args: str) -> subprocess.Popen:
    env = {**os.environ, "CKPT_TEST_OPTIONS": json.dumps(options)}
    return subprocess.Popen([sys.executable, "-c", code, url, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)


def put_lease(s3_server, bucket: str, holder: Holder) -> None:
    s3_server.client().put_object(Bucket=bucket, Key=f"ckpt/{LOCK_NAME}", Body=holder.encode())


def foreign(renewed_s_ago: float) -> Holder:
    now = time.time()
    return Holder("f" * 16, "elsewhere", 4242, now - renewed_s_ago, now - renewed_s_ago, 60.0, "other-boot", "", "")


def test_two_processes_on_s3_one_wins_and_nothing_is_mixed(s3_server, s3_bucket):
    url, options = f"s3://{s3_bucket}/ckpt", s3_server.options()
    savers = {who: child(SAVER, url, options, who) for who in "AB"}
    conflicts = 0
    try:
        for proc in savers.values():
            assert proc.stdout.readline().strip() == "ready"
        for version in range(1, 7):
            for proc in savers.values():
                proc.stdin.write(f"{version}\n")
                proc.stdin.flush()
            answers = {who: proc.stdout.readline().split(" ", 1) for who, proc in savers.items()}
            winners = {who for who, answer in answers.items() if answer[0].strip() == "ok"}
            assert winners and all(a[0].strip() in ("ok", "locked") for a in answers.values()), answers
            conflicts += len(winners) == 1
            for who, answer in answers.items():
                if answer[0] == "locked":
                    assert f"{url} is being saved by pid {savers['B' if who == 'A' else 'A'].pid}" in json.loads(answer[1])
            out = ckptbench.load(url, storage_options=options)
            assert (out["who"], out["version"]) in {(who, version) for who in winners}
            for i in range(3):
                assert torch.equal(out[f"w{i}"], torch.full((2**20,), float(ord(out["who"]) * 1000 + version * 10 + i)))
    finally:
        for proc in savers.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    assert conflicts > 0, "the two saves never overlapped: the test did not exercise the lock"
    store = open_store(url, options)
    shards = [s["name"] for s in read_manifest(store)["shards"]]
    assert sorted(store.list()) == sorted([MANIFEST_NAME, *shards])  # no lease, nothing of the loser


def test_rgw_honours_conditional_writes(s3_server, s3_bucket):
    store = open_store(f"s3://{s3_bucket}/ckpt", s3_server.options())
    first = store.put_if("x", b"1")
    assert first is not None and store.put_if("x", b"2") is None
    assert store.put_if("x", b"3", etag='"0123456789abcdef0123456789abcdef"') is None
    assert store.put_if("x", b"4", etag=first) is not None  # as given (quoted): RGW 16 needs the unquoted retry
    assert store.get("x") == b"4"
    lock._conditions_honoured.pop(store.server(), None)
    assert lock._honours_conditions(store) == lock._Conditions(create=True, replace=True)


def test_a_lease_held_elsewhere_is_named_and_a_dead_or_expired_one_is_taken_over(s3_server, s3_bucket, caplog):
    url, options = f"s3://{s3_bucket}/ckpt", s3_server.options()
    put_lease(s3_server, s3_bucket, foreign(renewed_s_ago=1))
    with pytest.raises(CheckpointLockedError, match=f"{url} is being saved by pid 4242 on host elsewhere"):
        ckptbench.save({"v": torch.tensor([1])}, url, storage_options=options)
    put_lease(s3_server, s3_bucket, foreign(renewed_s_ago=61))  # not renewed within its TTL
    with caplog.at_level(logging.WARNING, logger="ckptbench.checkpoint.lock"):
        ckptbench.save({"v": torch.tensor([2])}, url, storage_options=options)
    assert "taking over the save lock of pid 4242 on host elsewhere" in caplog.text
    assert ckptbench.load(url, storage_options=options)["v"].item() == 2
    assert LOCK_NAME not in open_store(url, options).list()


def test_a_lease_of_a_sigkilled_process_on_this_host_is_taken_over_at_once(s3_server, s3_bucket):
    url, options = f"s3://{s3_bucket}/ckpt", s3_server.options()
    holder = child(HOLDER, url, options)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(CheckpointLockedError, match=f"pid {holder.pid} on host {socket.gethostname()}"):
        ckptbench.save({"v": torch.tensor([1])}, url, storage_options=options)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    ckptbench.save({"v": torch.tensor([2])}, url, storage_options=options)  # well within the TTL
    assert ckptbench.load(url, storage_options=options)["v"].item() == 2


def test_a_lease_taken_over_before_the_commit_commits_nothing(s3_server, s3_bucket):
    url, options = f"s3://{s3_bucket}/ckpt", s3_server.options()
    ckptbench.save({"v": torch.tensor([1])}, url, storage_options=options)
    store = open_store(url, options)
    held = acquire_save_lock(store)
    store.put_atomic("shard-0123abcd-00000.bin", b"partial")
    put_lease(s3_server, s3_bucket, foreign(renewed_s_ago=0))  # as if it had stalled past its TTL
    with pytest.raises(LockLostError, match="taken over by pid 4242 on host elsewhere"), \
            held.committing(store, ["shard-0123abcd-00000.bin"]):
        pytest.fail("committed without the lock")
    held.release()
    assert "shard-0123abcd-00000.bin" not in store.list()
    assert Holder.decode(store.get(LOCK_NAME)).host == "elsewhere"  # the new holder's lease is left alone
    assert ckptbench.load(url, storage_options=options)["v"].item() == 1


def test_the_holder_renews_its_lease(s3_server, s3_bucket, monkeypatch):
    monkeypatch.setattr(lock, "LEASE_TTL_S", 0.8)  # renewed every 0.2 s
    store = open_store(f"s3://{s3_bucket}/ckpt", s3_server.options())
    held = acquire_save_lock(store)
    try:
        first = Holder.decode(store.get(LOCK_NAME))
        time.sleep(2.0)  # more than two TTLs: without renewals the lease would have expired
        now = Holder.decode(store.get(LOCK_NAME))
        assert now.token == first.token and now.renewed_unix_s > first.renewed_unix_s
        with pytest.raises(CheckpointLockedError, match="another Checkpointer in this process"):
            acquire_save_lock(store)
    finally:
        held.release()
    assert LOCK_NAME not in store.list()


INTERRUPTED = textwrap.dedent("""
    import json, os, sys, time, torch, ckptbench
    sd = {f"w{i}": torch.full((2**22,), float(i + 2)) for i in range(4)}  # 64 MiB: multipart uploads
    sd["version"] = 2
    ckptbench.save(sd, sys.argv[1], overwrite=True, async_=True, storage_options=json.loads(os.environ["CKPT_TEST_OPTIONS"]))
    print("staged", flush=True)
    for _ in range(6000):  # short sleeps: a SIGINT caught between the print and one long sleep's syscall
        time.sleep(0.1)    # would wait for its end (CPython checks for signals only after waking)
""")


def test_ctrl_c_right_after_an_async_s3_save_starts_completes_it_before_exit(s3_server, s3_bucket):
    """Python's exit stops thread pools from taking work; the persist still queues its part uploads."""
    url, options = f"s3://{s3_bucket}/ckpt", s3_server.options(part_size=5 * 2**20)
    ckptbench.save({"version": 1}, url, storage_options=options)
    proc = child(INTERRUPTED, url, options)
    assert proc.stdout.readline().strip() == "staged"
    proc.send_signal(signal.SIGINT)
    proc.stdin.close()
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGINT
    loaded = ckptbench.load(url, storage_options=options)
    assert loaded["version"] == 2
    assert all(torch.equal(loaded[f"w{i}"], torch.full((2**22,), float(i + 2))) for i in range(4))
    store = open_store(url, options)
    assert sorted(store.list()) == sorted([MANIFEST_NAME, *(s["name"] for s in read_manifest(store)["shards"])])
