"""The guarantees (docs/guarantees.md) of crash safety and, for the library, of signals during an async save.

- SIGKILL at many seeded random moments of sync and async saves, the very first save included:
  afterwards ``load`` returns a whole version, bit-exact and never older than the last one the
  child saw committed, or (nothing committed yet) refuses with NotACheckpointError.
- Power loss: under strace, the order data fdatasync -> directory fsync -> manifest temp write +
  fsync -> rename -> directory fsync.
- SIGINT / SIGTERM during an async save: completed before exit (a second Ctrl-C abandons it; SIGTERM
  without a handler kills like SIGKILL), the previous checkpoint intact either way.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.lock import LOCK_NAME
from ckptbench.checkpoint.manifest import NotACheckpointError
from ckptbench.errors import StorageIOError

STATE = textwrap.dedent("""
    def make_state(version):
        import torch
        model = {f"w{i}": torch.full((2**20,), float(version * 16 + i)) for i in range(4)}  # 16 MiB
        return {"model": model, "step": version * 10, "version": version,
                "small": [torch.arange(version % 7 + 1, dtype=torch.int64), (float(version), "tag")]}
""")
exec(STATE)  # make_state, for the checks here

#: The child: resume from the committed version, then save the next ones back to back until killed,
#: reporting each version once ``save`` (sync) or ``handle.result()`` (async) returned.
CHILD = STATE + textwrap.dedent("""
    from ckptbench.checkpoint import Checkpointer
    from ckptbench.checkpoint.manifest import NotACheckpointError
    ckpt = Checkpointer(threads=2, shard_size=4 * 2**20)
    try:
        version = ckpt.load(path)["version"]
    except NotACheckpointError:
        version = 0
    conn.send(("started", version))
    while True:
        version += 1
        sd = make_state(version)
        if mode == "async":
            handle = ckpt.save(sd, path, overwrite=True, async_=True)
            for t in sd["model"].values():
                t.add_(1.0)  # training goes on meanwhile: what was staged is what must be saved
            handle.result()
        else:
            ckpt.save(sd, path, overwrite=True)
        conn.send(("committed", version))
""")


def assert_is_version(loaded: dict, version: int) -> None:
    expected = make_state(version)  # noqa: F821 - defined by exec(STATE)
    assert loaded["version"] == version and loaded["step"] == expected["step"]
    assert loaded["small"][1] == expected["small"][1]
    assert torch.equal(loaded["small"][0], expected["small"][0])
    for key, tensor in expected["model"].items():
        assert torch.equal(loaded["model"][key], tensor), (version, key)


@pytest.fixture(scope="module")
def forkserver():
    """Children forked from a server that has torch and ckptbench imported: ~20 ms a start, not ~2 s."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "ckptbench.checkpoint.api"])
    return ctx


def start_child(ctx, path: Path, mode: str):
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=exec, args=(CHILD, {"conn": child, "path": str(path), "mode": mode}), daemon=True)
    proc.start()
    child.close()
    return proc, parent


def kill(proc, conn) -> list[int]:
    """SIGKILL the child; the versions it reported committed (messages are single atomic pipe writes)."""
    proc.kill()
    proc.join()
    committed = []
    while conn.poll():
        try:
            kind, version = conn.recv()
        except EOFError:
            break
        if kind == "committed":
            committed.append(version)
    conn.close()
    return committed


def test_sigkill_at_25_random_moments_of_sync_and_async_saves(tmp_path: Path, forkserver):
    rng = random.Random(20240808)
    path = tmp_path / "c"
    last_committed = 0
    refused_first = 0
    for trial in range(25):
        mode = "async" if trial % 2 else "sync"
        first_save = trial < 5
        where = tmp_path / f"first-{trial}" if first_save else path
        proc, conn = start_child(forkserver, where, mode)
        assert conn.poll(60), "the child did not start"
        kind, started = conn.recv()
        assert kind == "started"
        if first_save:
            # Kill inside the very first save: once its first shard file exists, before the commit.
            deadline = time.monotonic() + 30
            while not list(where.glob("shard-*")) and proc.is_alive() and time.monotonic() < deadline:
                time.sleep(0.0005)
        else:
            assert started == last_committed  # resumed from the newest committed checkpoint
            time.sleep(rng.uniform(0.0, 0.4))
        committed = kill(proc, conn)
        if first_save:
            try:
                loaded = ckptbench.load(where)
            except NotACheckpointError as exc:
                assert "no committed checkpoint" in str(exc)
                assert not (where / mf.MANIFEST_NAME).exists()
                refused_first += 1
            else:  # the kill came after the commit (the poll above was not scheduled in time): whole, and
                # at most the one it committed but did not report
                newest = max(committed, default=0)
                assert max(newest, 1) <= loaded["version"] <= newest + 1, (trial, mode, committed, loaded["version"])
                assert_is_version(loaded, loaded["version"])
            continue
        newest = max(committed, default=started)
        if newest == 0 and not (path / mf.MANIFEST_NAME).exists():
            # killed inside the first save into ``path`` (a slow start on a busy host): nothing committed
            # there yet, which the next trial resumes from
            with pytest.raises(NotACheckpointError, match="no committed checkpoint"):
                ckptbench.load(path)
            continue
        loaded = ckptbench.load(path)
        # never older than what the child saw committed; at most the one it committed but did not report
        assert newest <= loaded["version"] <= newest + 1, (trial, mode, committed, loaded["version"])
        assert_is_version(loaded, loaded["version"])
        last_committed = loaded["version"]
    assert refused_first > 0, "no kill landed inside a first save"
    assert last_committed > 5
    # What the killed saves left (partial shards, manifest temp files, the lock file) goes with the next save.
    Checkpointer().save(make_state(999), path, overwrite=True)  # noqa: F821
    manifest = json.loads((path / mf.MANIFEST_NAME).read_text())
    assert sorted(p.name for p in path.iterdir()) == sorted([mf.MANIFEST_NAME] + [s["name"] for s in manifest["shards"]])
    assert_is_version(ckptbench.load(path), 999)


# -- power loss: the order of the durability syscalls -------------------------------------------

SAVE_ONCE = textwrap.dedent("""
    import os, sys, torch, ckptbench
    sd = {f"w{i}": torch.full((3 * 2**18 + 100 * i,), float(i)) for i in range(4)}
    zero_copy = sys.argv[2] == "zero-copy"  # buffered, written from the tensors' memory (pwritev)
    os.environ["CKPTBENCH_SAVE_ZERO_COPY"] = str(int(zero_copy))
    result = ckptbench.save(sd, sys.argv[1], threads=2, shard_size=2**20, direct=False if zero_copy else None)
    assert (result.staging == "zero-copy") is zero_copy, result.staging
""")

_START = re.compile(r"^(\d+) +(\w+)\((.*)$")
_RESUMED = re.compile(r"^(\d+) +<\.\.\. (\w+) resumed>(.*)$")
_RESULT = re.compile(r"\)\s+= (-?\d+)")


def syscalls(trace: str) -> list[tuple[str, str, int]]:
    """(name, arguments, result) of every finished syscall in ``strace -f -y`` output, in the order
    they returned (a call split into ``<unfinished ...>`` and ``resumed`` counts when it returned)."""
    pending: dict[str, tuple[str, str]] = {}
    calls = []
    for line in trace.splitlines():
        if m := _RESUMED.match(line):
            name, args = pending.pop(m.group(1), (m.group(2), ""))
            tail = m.group(3)
        elif m := _START.match(line):
            pid, name, rest = m.groups()
            if rest.endswith("<unfinished ...>"):
                pending[pid] = (name, rest)
                continue
            args, tail = rest, rest
        else:
            continue
        result = _RESULT.search(tail)
        calls.append((name, args, int(result.group(1)) if result else -1))
    return calls


def fd_path(args: str) -> str | None:
    m = re.match(r"\d+<(.*?)>", args)
    return m.group(1) if m else None


def rename_paths(args: str) -> tuple[str, str]:
    """The two paths of a rename: ``"old", "new"``, or relative to directory descriptors (renameat:
    ``3</dir>, "old", 3</dir>, "new"``, as ``strace -y`` shows them)."""
    at = re.match(r'\s*\d+<(.*?)>, "([^"]*)", \d+<(.*?)>, "([^"]*)"', args)
    if at:
        return f"{at.group(1)}/{at.group(2)}", f"{at.group(3)}/{at.group(4)}"
    plain = re.findall(r'"([^"]*)"', args)
    return (plain[0], plain[1]) if len(plain) >= 2 else ("", "")


def strace_usable() -> str | None:
    if shutil.which("strace") is None:
        return "strace is not installed"
    probe = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"strace cannot trace here (ptrace refused?): {probe.stderr.strip()[:200]}"
    return None


@pytest.mark.parametrize("how", ["default", "zero-copy"])
def test_power_loss_order_data_fsync_then_manifest_fsync_then_rename_then_directory_fsync(tmp_path: Path, how: str):
    why = strace_usable()
    if why:
        pytest.skip(why)
    path, out = tmp_path / "c", tmp_path / "trace.txt"
    cmd = ["strace", "-f", "-qq", "-y", "-e", "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2",
           "-o", str(out), sys.executable, "-c", SAVE_ONCE, str(path), how]
    if subprocess.run(["strace", "--seccomp-bpf", "-f", "-qq", "-o", "/dev/null", "true"], capture_output=True).returncode == 0:
        cmd.insert(1, "--seccomp-bpf")  # stop only at the traced calls: torch's import stays fast
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = syscalls(out.read_text())
    directory = str(path)
    shards = [f"{directory}/{s['name']}" for s in json.loads((path / mf.MANIFEST_NAME).read_text())["shards"]]
    assert len(shards) >= 3

    renames = [i for i, (name, args, rc) in enumerate(calls) if name.startswith("rename") and rc == 0
               and rename_paths(args)[1] == f"{directory}/{mf.MANIFEST_NAME}"]
    assert len(renames) == 1, "the manifest is committed by exactly one rename"
    commit = renames[0]
    tmp = rename_paths(calls[commit][1])[0]
    assert re.fullmatch(re.escape(directory) + r"/\.manifest\.json\.tmp-[0-9a-f]{8}", tmp)

    def finished(names: tuple[str, ...], target: str) -> list[int]:
        return [i for i, (name, args, rc) in enumerate(calls) if name in names and rc >= 0 and fd_path(args) == target]

    data_synced = []
    for shard in shards:
        syncs = finished(("fdatasync", "fsync"), shard)
        assert syncs and syncs[0] < commit, f"{shard} was not fdatasync'ed before the manifest was renamed"
        data_synced.append(syncs[0])
    directory_syncs = finished(("fsync",), directory)
    assert any(max(data_synced) < i < commit for i in directory_syncs), \
        "the directory (the shards' entries) was not fsynced between the data syncs and the commit"
    tmp_writes, tmp_syncs = finished(("write",), tmp), finished(("fsync", "fdatasync"), tmp)
    assert tmp_writes and tmp_syncs, "the manifest temp file was not written and fsynced"
    assert max(data_synced) < min(tmp_writes) <= max(tmp_writes) < tmp_syncs[0] < commit
    assert any(i > commit for i in directory_syncs), "the directory was not fsynced after the rename"
    parent_syncs = finished(("fsync",), str(tmp_path))  # the new directory's entry, fsynced on a thread
    assert any(i < commit for i in parent_syncs), "the new checkpoint directory's entry was not durable before the commit"
    if how == "zero-copy":  # the engine writes through the descriptor the safe open holds
        for shard in shards:
            name = os.path.basename(shard)
            opens = [args for call, args, rc in calls
                     if call == "openat" and rc >= 0 and (f'"{name}"' in args or f'/{name}"' in args)]
            assert len(opens) == 1, f"{name} opened {len(opens)} times: {opens}"


def test_a_failed_fsync_of_a_new_directorys_parent_fails_the_save_and_leaves_nothing(tmp_path: Path,
                                                                                      monkeypatch: pytest.MonkeyPatch):
    from ckptbench.storage import store as store_module

    def failing(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(store_module, "fsync_directory", failing)
    with pytest.raises(StorageIOError, match="Input/output error"):
        ckptbench.save({"w": torch.ones(1000)}, tmp_path / "a" / "c")
    assert list(tmp_path.iterdir()) == []  # no shard, no lock, not the directories it made


# -- signals during an async save ---------------------------------------------------------------

SIGNALLED = textwrap.dedent("""
    import signal, sys, time, torch, ckptbench
    from ckptbench.storage.store import LocalStore
    path, how, pause_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if how == "sigterm-exit":  # an application that turns SIGTERM into a normal exit
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if how == "sigint-slow-log":  # the next Ctrl-C lands right after the "finishing" line, before any wait
        from ckptbench.checkpoint import at_exit
        warning = at_exit.log.warning

        def slow_warning(*args, **kwargs):
            warning(*args, **kwargs)
            time.sleep(1.0)

        at_exit.log.warning = slow_warning
    if pause_s:
        original = LocalStore.write_files

        def write_files(self, *args, **kwargs):  # data written, commit not yet: the signal lands mid-persist
            report = original(self, *args, **kwargs)
            print("written", flush=True)
            time.sleep(pause_s)
            return report

        LocalStore.write_files = write_files
    sd = {f"w{i}": torch.full((2**24,), float(i + 2)) for i in range(4)}  # 256 MiB
    sd["version"] = 2
    handle = ckptbench.save(sd, path, overwrite=True, async_=True)
    print("staged", flush=True)
    for _ in range(6000):  # training; short sleeps: a signal caught between the print and one long
        time.sleep(0.1)    # sleep's syscall would wait for its end (CPython checks only after waking)
""")


def version_1(path: Path) -> None:
    ckptbench.save({**{f"w{i}": torch.full((2**10,), float(i + 1)) for i in range(4)}, "version": 1}, path)


def assert_version(path: Path, version: int) -> None:
    loaded = ckptbench.load(path)
    assert loaded["version"] == version
    size = 2**24 if version == 2 else 2**10
    for i in range(4):
        assert torch.equal(loaded[f"w{i}"], torch.full((size,), float(i + version))), i


def files_of_the_committed_checkpoint_only(path: Path) -> bool:
    manifest = json.loads((path / mf.MANIFEST_NAME).read_text())
    return sorted(p.name for p in path.iterdir()) == sorted([mf.MANIFEST_NAME] + [s["name"] for s in manifest["shards"]])


def start_signalled(path: Path, how: str, pause_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SIGNALLED, str(path), how, str(pause_s)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "staged"
    return proc


@pytest.mark.parametrize(("how", "sent", "exit_code"), [("sigint", signal.SIGINT, -signal.SIGINT),
                                                         ("sigterm-exit", signal.SIGTERM, 143)])
def test_an_interrupt_during_an_async_save_completes_it_before_exit(tmp_path: Path, how, sent, exit_code):
    path = tmp_path / "c"
    version_1(path)
    proc = start_signalled(path, how, pause_s=1.0)
    proc.send_signal(sent)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == exit_code, stderr
    assert f"finishing the async save to {path} before exit (Ctrl-C again to abandon it)" in stderr
    assert_version(path, 2)
    assert files_of_the_committed_checkpoint_only(path)  # swept, and the lock released


@pytest.mark.parametrize("how", ["sigint", "sigint-slow-log"])
def test_a_second_ctrl_c_abandons_the_async_save_and_the_previous_checkpoint_stays(tmp_path: Path, how):
    path = tmp_path / "c"
    version_1(path)
    before = {p.name for p in path.iterdir()}
    proc = start_signalled(path, how, pause_s=30.0)
    assert proc.stdout.readline().strip() == "written"  # the shards are durable; the commit waits 30 s
    proc.send_signal(signal.SIGINT)
    for line in proc.stderr:
        if "finishing the async save" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT
    assert f"abandoned the async save to {path}: nothing was committed" in stderr
    assert_version(path, 1)  # its data was complete, but it was abandoned before the commit
    left = {p.name for p in path.iterdir()} - before
    assert left and all(mf.OWNED_FILE.match(name) for name in left), left  # the abandoned save's shards
    ckptbench.save({"version": 3, "w": torch.ones(4)}, path, overwrite=True)  # not blocked by a lock
    assert files_of_the_committed_checkpoint_only(path)  # and the leftovers are gone


def test_sigterm_without_a_handler_abandons_the_async_save_like_a_crash(tmp_path: Path):
    path = tmp_path / "c"
    version_1(path)
    proc = start_signalled(path, "default", pause_s=0.0)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    loaded_version = ckptbench.load(path)["version"]  # the previous one, or the new one if it made it: whole
    assert_version(path, loaded_version)
    ckptbench.save({"version": 3, "w": torch.ones(4)}, path, overwrite=True)
    assert files_of_the_committed_checkpoint_only(path) and not (path / LOCK_NAME).exists()
