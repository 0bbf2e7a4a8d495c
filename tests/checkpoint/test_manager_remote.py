"""``CheckpointManager(remote=...)``: every k-th local step drained to a remote tier, loads across tiers.

The remote tier here is another directory; on S3 (Ceph RGW): tests/storage/test_manager_s3.py.
This file is also the worker of the SIGKILL and hung-drain tests: ``python test_manager_remote.py LOCAL REMOTE``,
``python test_manager_remote.py timeout|kill LOCAL REMOTE FLAG``, and holds the hooks their drain processes
load (``_DRAIN_HOOKS``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench import knobs
from ckptbench.checkpoint.drain import copy_checkpoint
from ckptbench.errors import CorruptCheckpointError, StepNotFoundError, UsageError
from ckptbench.storage.store import LocalStore

HERE = Path(__file__).resolve()


def state(step: int, n: int = 64) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn((n, n), generator=generator), "b": torch.arange(8) + step}, "step": step}


def assert_state(loaded: dict, step: int, n: int = 64) -> None:
    expected = state(step, n)
    assert loaded["step"] == step
    assert torch.equal(loaded["model"]["w"], expected["model"]["w"])
    assert torch.equal(loaded["model"]["b"], expected["model"]["b"])


def steps_in(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_every_kth_step_is_drained_and_each_tier_keeps_its_own(tmp_path: Path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptbench.CheckpointManager(local, keep_last=2, remote=remote, remote_every=3, keep_remote=2) as manager:
        for step in range(1, 10):
            manager.save(step, state(step), async_=step % 2 == 0)
            manager.wait_remote()
        status = manager.remote_status()
        assert status.idle and status.last_error is None and status.drained_step == 9
        assert status.last.bytes > 0 and status.last.copied
        assert manager.steps("local") == [8, 9]
        assert manager.steps("remote") == [6, 9]
        assert manager.steps() == [6, 8, 9] and manager.latest() == 9
        assert_state(manager.load(6), 6)  # only remote
    # the remote copy is an ordinary checkpoint, bit-exact, with the very manifest of the local one
    assert_state(ckptbench.load(remote / "step-00000009"), 9)
    assert (remote / "step-00000009" / "manifest.json").read_bytes() == \
        (local / "step-00000009" / "manifest.json").read_bytes()
    assert steps_in(remote) == ["step-00000006", "step-00000009"]
    assert not any(p.name.startswith(".") for p in (remote / "step-00000009").iterdir())


def test_a_deleted_local_tier_loads_from_the_remote_one(tmp_path: Path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptbench.CheckpointManager(local, remote=remote) as manager:
        for step in (1, 2):
            manager.save(step, state(step))
    shutil.rmtree(local)
    with ckptbench.CheckpointManager(local, remote=remote) as manager:
        assert manager.steps("local") == [] and manager.latest() == 2
        assert_state(manager.load(), 2)
        into = state(0)
        assert manager.load(1, into=into) is into
        assert_state(into, 1)


def test_a_damaged_local_copy_falls_back_to_the_remote_one(tmp_path: Path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptbench.CheckpointManager(local, remote=remote, remote_every=2) as manager:
        for step in (1, 2, 3):
            manager.save(step, state(step))
        manager.wait_remote()
        assert manager.steps("remote") == [2]
        # step 2: one flipped byte in its local shard -> the remote copy is loaded
        shard = next((local / "step-00000002").glob("shard-*.bin"))
        data = bytearray(shard.read_bytes())
        data[100] ^= 0xFF
        shard.write_bytes(bytes(data))
        assert_state(manager.load(2), 2)
        # step 3 (local only) loses its manifest: the latest loadable one is step 2, from the remote tier
        (local / "step-00000003" / "manifest.json").unlink()
        assert manager.latest() == 2
        assert_state(manager.load(), 2)
        # a damaged local step is never copied: the drain checks every checksum first
        target = LocalStore(tmp_path / "elsewhere")
        with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
            copy_checkpoint(LocalStore(local / "step-00000002"), target, step=2, threads=2, block_size=1 << 20,
                            direct=False)
        assert not (tmp_path / "elsewhere" / "manifest.json").exists()
        assert not list((tmp_path / "elsewhere").glob("shard-*"))


@pytest.mark.parametrize("name", ["../outside.bin", "/tmp/absolute.bin", "sub/dir.bin", ".."])
def test_a_copy_reads_and_writes_no_shard_named_outside_the_checkpoint(tmp_path: Path, name: str):
    """The copy to the remote tier takes its shard names from the local manifest: one that names a path
    out of the checkpoint is refused before anything is read or written, so a manifest edited in the
    local tier can neither copy another file of the host out nor write one beside the remote step."""
    from ckptbench.errors import NotACheckpointError

    source = tmp_path / "local" / "step-00000001"
    ckptbench.save({"w": torch.arange(256, dtype=torch.float32)}, source)
    document = json.loads((source / "manifest.json").read_text())
    shard = document["shards"][0]["name"]
    outside = tmp_path / "local" / "outside.bin"
    outside.write_bytes((source / shard).read_bytes())  # a file that is no shard, with the shard's size
    document["shards"][0]["name"] = name if name != "/tmp/absolute.bin" else str(outside)
    (source / "manifest.json").write_text(json.dumps(document))
    target = tmp_path / "remote" / "step-00000001"
    with pytest.raises(NotACheckpointError, match="not a valid manifest"):
        copy_checkpoint(LocalStore(source), LocalStore(target), step=1, threads=2, block_size=1 << 20, direct=False)
    assert not (tmp_path / "remote" / "outside.bin").exists()
    assert not target.exists() or not any(target.iterdir())


def test_a_copy_refuses_a_manifest_that_names_a_shard_twice(tmp_path: Path):
    """A save names each shard once; a manifest edited to list one twice (two sizes for one file) is
    refused as malformed before anything is written, with ckptbench's error, not a ValueError of the
    engine after the file was created."""
    from ckptbench.errors import NotACheckpointError

    source = tmp_path / "local" / "step-00000001"
    ckptbench.save({"w": torch.arange(256, dtype=torch.float32)}, source)
    document = json.loads((source / "manifest.json").read_text())
    document["shards"].append(dict(document["shards"][0]))
    (source / "manifest.json").write_text(json.dumps(document))
    target = tmp_path / "remote" / "step-00000001"
    with pytest.raises(NotACheckpointError, match="named twice"):
        copy_checkpoint(LocalStore(source), LocalStore(target), step=1, threads=2, block_size=1 << 20, direct=False)
    assert not target.exists() or not any(target.iterdir())


def test_local_saves_go_on_while_the_remote_tier_is_unreachable(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "DRAIN_RETRY_S", 0.2)
    mount = tmp_path / "mount"
    mount.write_text("the remote tier's mount point is not there")  # a file: nothing can be made under it
    local, remote = tmp_path / "local", mount / "remote"
    with ckptbench.CheckpointManager(local, keep_last=1, remote=remote) as manager:
        manager.save(1, state(1))
        manager.save(2, state(2), async_=True).result()
        status = manager.wait_remote()
        assert status.pending_step == 2 and status.drained_step is None and status.failures >= 1
        assert "step 2" in status.last_error
        # keep_last=1, and step 1 stays only while its copy was under way when step 2 committed
        assert manager.steps("local")[-1] == 2 and manager.latest() == 2
        assert_state(manager.load(), 2)
        # the remote tier comes back: the retry copies step 2 without another save
        mount.unlink()
        mount.mkdir()
        deadline = time.monotonic() + 60
        while manager.remote_status().drained_step != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        status = manager.wait_remote()
        assert status.idle and status.drained_step == 2 and status.last_error is None
        # and the next save is drained at once
        manager.save(3, state(3))
        assert manager.wait_remote().drained_step == 3
        assert manager.steps("remote") == [2, 3] and manager.steps("local") == [3]
    assert_state(ckptbench.load(remote / "step-00000002"), 2)
    assert_state(ckptbench.load(remote / "step-00000003"), 3)


def test_the_local_tier_keeps_a_step_until_its_copy_is_done(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "DRAIN_RETRY_S", 3600.0)
    mount = tmp_path / "mount"
    mount.write_text("")
    local, remote = tmp_path / "local", mount / "remote"
    manager = ckptbench.CheckpointManager(local, keep_last=1, remote=remote, remote_every=2)
    for step in (1, 2, 3):
        manager.save(step, state(step))
    assert manager.wait_remote().pending_step == 2
    assert manager.steps("local") == [2, 3]  # keep_last=1, and step 2 still waits for its copy
    mount.unlink()
    mount.mkdir()
    manager.close()  # one last try at close
    assert steps_in(remote) == ["step-00000002"]
    assert_state(ckptbench.load(remote / "step-00000002"), 2)


#: Installed as ``sitecustomize`` for the workers below: in their spawned drain process (which imports neither
#: the worker's script nor this file), it loads this file and applies the hook the environment names.
_DRAIN_HOOKS = """
import os, sys
if "--multiprocessing-fork" in sys.argv and os.environ.get("CKPTBENCH_TEST_HOOKS"):
    import importlib.util
    spec = importlib.util.spec_from_file_location("_drain_hooks", os.environ["CKPTBENCH_TEST_HOOKS"])
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    if os.environ.get("CKPTBENCH_TEST_SLOW_DRAIN"):
        hooks._slow_down_the_drain(os.environ["CKPTBENCH_TEST_SLOW_DRAIN"])
    elif os.environ.get("CKPTBENCH_TEST_HANG_DRAIN"):
        hooks._hang_the_drain(os.environ["CKPTBENCH_TEST_HANG_DRAIN"])
"""


def _hooked(tmp_path: Path, **env: str) -> dict[str, str]:
    """The environment of a worker whose drain process gets ``_DRAIN_HOOKS``' hook (``env`` names it)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(_DRAIN_HOOKS)
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": path, "CKPTBENCH_TEST_HOOKS": str(HERE), **env}


def test_a_drain_killed_midway_leaves_both_tiers_loadable(tmp_path: Path, kill_when_it_says):
    # SIGKILL to the saving process takes its drain process along, midway through a copy
    local, remote = tmp_path / "local", tmp_path / "remote"
    env = _hooked(tmp_path, CKPTBENCH_DRAIN_BUFFER_BYTES=str(64 * 1024), CKPTBENCH_TEST_SLOW_DRAIN=str(remote))
    kill_when_it_says([sys.executable, str(HERE), str(local), str(remote)], env, "draining step 2")
    partial = remote / "step-00000002"
    assert list(partial.glob("shard-*.bin")) and not (partial / "manifest.json").exists()
    with ckptbench.CheckpointManager(local, remote=remote, shard_size=16 * 1024) as manager:
        assert manager.steps("remote") == [1] and manager.steps("local") == [1, 2]
        assert_state(manager.load(), 2, 128)
        shutil.rmtree(local / "step-00000002")
        assert_state(manager.load(), 1, 128)  # the half-copied step is not a checkpoint
        manager.save(3, state(3, 128))  # the next drain commits step 3 and sweeps the leftovers of step 2
        manager.wait_remote()
        assert manager.steps("remote") == [1, 3]
    assert steps_in(remote) == ["step-00000001", "step-00000003"]
    assert_state(ckptbench.load(remote / "step-00000003"), 3, 128)


def _run_worker(mode: str, local: Path, remote: Path, flag: Path, *, kill_drain: bool = False) -> dict:
    """Run ``_hang_worker`` in a process of its own (its drain process hangs while ``flag`` exists); with
    ``kill_drain``, SIGKILL the drain process once the worker says it hangs. The worker's findings."""
    env = _hooked(local.parent, CKPTBENCH_TEST_HANG_DRAIN=str(flag), CKPTBENCH_DRAIN_RETRY_S="0.2")
    worker = subprocess.Popen([sys.executable, str(HERE), mode, str(local), str(remote), str(flag)],
                              stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=env)
    try:
        assert worker.stdout is not None and worker.stdin is not None
        if kill_drain:
            line = worker.stdout.readline()
            assert line.startswith("hung "), line
            os.kill(int(line.split()[1]), signal.SIGKILL)
            worker.stdin.write("killed\n")
            worker.stdin.flush()
        out, _ = worker.communicate(timeout=240)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_a_hung_drain_is_stopped_kept_and_retried(tmp_path: Path):
    # the remote tier accepts the copy and never answers: the watchdog (drain_timeout=2) kills the drain
    # process; the step stays undrained (pending, kept locally beyond keep_last) and is retried
    local, remote, flag = tmp_path / "local", tmp_path / "remote", tmp_path / "hang"
    flag.write_text("")
    found = _run_worker("timeout", local, remote, flag)
    stalled = found["stalled"]
    assert stalled["pending_step"] == 2 and stalled["drained_step"] is None and stalled["stalls"] >= 1
    assert "step 2: the drain made no progress for 2 s" in stalled["last_error"]
    assert found["local_after_3"] == [2, 3]  # keep_last=1, and step 2 waits for its drain
    assert found["final"]["drained_step"] == 4 and found["final"]["last_error"] is None
    assert found["remote"] == [2, 4] and found["local"] == [4]
    for step in (2, 4):
        assert_state(ckptbench.load(remote / f"step-{step:08d}"), step, 128)
    assert not any(p.name.startswith(("shard-", ".")) for p in remote.iterdir())


def test_a_drain_process_killed_midway_is_retried_and_both_tiers_load_bit_exact(tmp_path: Path):
    local, remote, flag = tmp_path / "local", tmp_path / "remote", tmp_path / "hang"
    flag.write_text("")
    found = _run_worker("kill", local, remote, flag, kill_drain=True)
    assert found["killed"]["pending_step"] == 2 and found["killed"]["failures"] >= 1
    assert found["killed"]["stalls"] == 0  # killed from outside, not by the watchdog
    assert found["final"]["drained_step"] == 2 and found["final"]["last_error"] is None
    assert found["remote"] == [2]
    with ckptbench.CheckpointManager(local, remote=remote, shard_size=16 * 1024) as manager:
        assert_state(manager.load(2), 2, 128)
        shutil.rmtree(local / "step-00000002")
        assert_state(manager.load(2), 2, 128)  # from the remote tier
    assert_state(ckptbench.load(remote / "step-00000002"), 2, 128)


def _process_state(pid: int, until: str | None = None) -> str:
    """The process's state letter (``/proc/PID/stat``); with ``until``, once it is one of those (signals are
    delivered asynchronously), or whatever it is after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if until is None or state in until or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def test_the_drain_process_is_stopped_while_a_save_blocks_training(tmp_path: Path):
    from ckptbench.checkpoint.drain import DrainProcess

    ckptbench.save(state(1), tmp_path / "local")
    drain = DrainProcess()
    try:
        with drain.paused():  # no process yet: nothing to stop
            assert drain.pid is None
        drain.copy((str(tmp_path / "local"), None), (str(tmp_path / "remote"), None), step=1, threads=2,
                   block_size=1 << 20, direct=False)
        pid = drain.pid
        assert pid and _process_state(pid) in "SR"
        with drain.paused():
            with drain.paused():  # nested: stopped once, continued by the outer block's end
                assert _process_state(pid, until="T") == "T"
            time.sleep(0.2)
            assert _process_state(pid) == "T"
        assert _process_state(pid, until="SR") in "SR"
        # a copy after a pause runs as before
        result = drain.copy((str(tmp_path / "local"), None), (str(tmp_path / "again"), None), step=1, threads=2,
                            block_size=1 << 20, direct=False)
        assert result.copied
    finally:
        drain.close()
    assert_state(ckptbench.load(tmp_path / "again"), 1)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "1", True])
def test_a_bad_drain_timeout_is_refused(tmp_path: Path, timeout):
    with pytest.raises(UsageError, match="drain_timeout must be a positive number of seconds"):
        ckptbench.CheckpointManager(tmp_path / "local", remote=tmp_path / "remote", drain_timeout=timeout)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"remote_every": 0}, "remote_every must be a positive integer, got 0"),
        ({"remote_every": 1.5}, "remote_every must be a positive integer, got 1.5"),
        ({"keep_remote": 0}, "keep_remote must be a positive integer or None"),
    ],
)
def test_bad_remote_settings_are_refused(tmp_path: Path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        ckptbench.CheckpointManager(tmp_path / "local", remote=tmp_path / "remote", **kwargs)


def test_a_remote_tier_that_is_the_local_one_is_refused(tmp_path: Path):
    for remote in (tmp_path / "local", tmp_path / "local" / "remote", tmp_path, f"{tmp_path}/local/"):
        with pytest.raises(UsageError, match="is the local tier"):
            ckptbench.CheckpointManager(tmp_path / "local", remote=remote)
    with pytest.raises(UsageError, match="remote_every need remote=URL"):
        ckptbench.CheckpointManager(tmp_path / "local", remote_every=2)
    with ckptbench.CheckpointManager(tmp_path / "local") as manager:
        assert manager.remote is None and manager.remote_status() is None
        with pytest.raises(UsageError, match="no remote tier"):
            manager.steps("remote")
        with pytest.raises(StepNotFoundError, match="no committed step"):
            manager.load()


def _slow_down_the_drain(remote: str) -> None:
    """In the drain process: say so once the copy of step 2 has written a shard, then stall until killed."""
    real_write = LocalStore.write_files

    def slow_write(self, files, **kwargs):
        report = real_write(self, files, **kwargs)
        if str(self.local_path).startswith(remote) and "step-00000002" in str(self.local_path):
            print("draining step 2", flush=True)
            time.sleep(600)
        return report

    LocalStore.write_files = slow_write  # type: ignore[method-assign]


def _hang_the_drain(flag: str) -> None:
    """In the drain process: while ``flag`` exists, a write to the remote tier never returns (no progress)."""
    real_write = LocalStore.write_files

    def hung_write(self, files, **kwargs):
        if os.path.exists(flag) and "remote" in str(self.local_path):
            time.sleep(600)
        return real_write(self, files, **kwargs)

    LocalStore.write_files = hung_write  # type: ignore[method-assign]


def _wait_for(manager, done, what: str) -> None:
    deadline = time.monotonic() + 120
    while not done(manager.remote_status()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in 120 s: {manager.remote_status()}")
        time.sleep(0.05)


def _status(manager) -> dict:
    status = manager.remote_status()
    return {"pending_step": status.pending_step, "drained_step": status.drained_step,
            "last_error": status.last_error, "failures": status.failures, "stalls": status.stalls}


def _hang_worker(mode: str, local: str, remote: str, flag: str) -> None:
    """Steps 1 and 2 saved, step 2 due for its drain, which hangs (while ``flag`` exists); ``timeout``:
    the watchdog stops it, step 3 is saved meanwhile, the remote tier comes back, step 4 drains too;
    ``kill``: the test SIGKILLs the drain process, then the remote tier comes back. Prints what it saw."""
    found: dict = {}
    timeout = 2.0 if mode == "timeout" else 3600.0
    manager = ckptbench.CheckpointManager(local, keep_last=1, remote=remote, remote_every=2, shard_size=16 * 1024,
                                          drain_timeout=timeout)
    for step in (1, 2):
        manager.save(step, state(step, 128))
    if mode == "timeout":
        _wait_for(manager, lambda s: s.stalls >= 1, "stall")
        found["stalled"] = _status(manager)
        manager.save(3, state(3, 128))
        found["local_after_3"] = manager.steps("local")
    else:
        _wait_for(manager, lambda s: s.draining_step == 2 and manager._drain_process.pid, "drain")
        time.sleep(0.5)  # in the hung write
        print(f"hung {manager._drain_process.pid}", flush=True)
        assert sys.stdin.readline().strip() == "killed"
        _wait_for(manager, lambda s: s.failures >= 1, "failure")
        found["killed"] = _status(manager)
    os.unlink(flag)  # the remote tier answers again
    _wait_for(manager, lambda s: s.drained_step == 2, "retry")
    if mode == "timeout":
        manager.save(4, state(4, 128))
    manager.wait_remote()
    found["final"] = _status(manager)
    found["remote"], found["local"] = manager.steps("remote"), manager.steps("local")
    manager.close()
    print(json.dumps(found), flush=True)


def _worker(local: str, remote: str) -> None:
    """Save step 1 (drained), then step 2, whose drain stalls (above) until the test kills this process."""
    manager = ckptbench.CheckpointManager(local, remote=remote, shard_size=16 * 1024)
    manager.save(1, state(1, 128))
    manager.wait_remote()
    manager.save(2, state(2, 128))
    time.sleep(600)


if __name__ == "__main__":
    if sys.argv[1] in ("timeout", "kill"):
        _hang_worker(*sys.argv[1:5])
    else:
        _worker(sys.argv[1], sys.argv[2])


#: A training script as many are written: no ``if __name__ == "__main__":`` guard. Each run of its top level
#: appends its pid to RUNS.
_UNGUARDED = """
import os, sys, torch, ckptbench
with open(sys.argv[3], "a") as runs:
    runs.write(f"{os.getpid()}\\n")
with ckptbench.CheckpointManager(sys.argv[1], remote=sys.argv[2], remote_every=1) as manager:
    for step in (1, 2):
        manager.save(step, {"w": torch.full((64,), float(step))})
    status = manager.wait_remote(timeout=120)
    assert status.drained_step == 2, status
"""


@pytest.mark.parametrize("how", ["path", "module"])
def test_the_drain_process_never_runs_the_callers_unguarded_script(tmp_path: Path, how: str):
    """The drain's copy process is spawned: a spawned child imports the parent's main module again (by path,
    or by name under ``python -m``), which runs an unguarded script's top level, training included, once
    more. The drain's processes are given no main module to import; the script runs once."""
    script = tmp_path / "train_unguarded.py"
    script.write_text(_UNGUARDED)
    runs = tmp_path / "runs.txt"
    args = [str(tmp_path / "local"), str(tmp_path / "remote"), str(runs)]
    command = [sys.executable, str(script), *args] if how == "path" else [sys.executable, "-m", "train_unguarded", *args]
    # the script's directory on the path (for -m too), before whatever the tests run with: ckptbench is the
    # one they import, as for any user's script
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(runs.read_text().split()) == 1, runs.read_text()
    assert torch.equal(ckptbench.load(tmp_path / "remote" / "step-00000002")["w"], torch.full((64,), 2.0))
