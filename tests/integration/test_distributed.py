"""Distributed launches: ``ckptbench.save/load`` and ``ckptbench bench`` under torchrun (gloo, localhost).

The two-phase commit (every rank's shards durable -> rank 0's manifest), per-rank parts on load, a
rank that fails or dies mid-save (no checkpoint, the previous one intact, the rank named), ranks that
disagree, a group that cannot form, and the distributed benchmark's aggregate. Launch detection and
manifest parts are also tested without processes.

This file is also the worker of those launches: ``python test_distributed.py SCENARIO DIR``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.distributed import detect_launch
from ckptbench.errors import UsageError

HERE = Path(__file__).resolve()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                          "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
                                                          "SLURM_STEP_NUM_TASKS")}
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def torchrun(args: list[str], cwd: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=timeout)


def by_hand(argvs: list[list[str]], cwd: Path, timeout: float = 120, **env: str) -> list[subprocess.CompletedProcess]:
    """One process per argv, ranks 0.. of one launch, started without torchrun (as srun would)."""
    port = str(_free_port())
    procs = [subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(len(argvs)),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env))
             for r, argv in enumerate(argvs)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


# -- launch detection and manifest parts (no processes) ----------------------------------------


def test_detect_launch_from_torchrun_and_slurm_variables():
    assert detect_launch({}) is None
    launch = detect_launch({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n0",
                            "MASTER_PORT": "29500"})
    assert (launch.rank, launch.world_size, launch.local_rank, launch.master_addr, launch.master_port,
            launch.source) == (3, 8, 1, "n0", 29500, "torchrun")
    slurm = detect_launch({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "16", "SLURM_NTASKS": "16",
                           "SLURM_LOCALID": "1"})
    assert (slurm.rank, slurm.world_size, slurm.local_rank, slurm.source) == (5, 16, 1, "slurm")
    # the batch script of an 8-task job is one process, not rank 0 of 8 (no srun step yet)
    assert detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0"}) is None
    # torchrun inside srun: torchrun's variables win
    both = detect_launch({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"})
    assert (both.rank, both.world_size) == (1, 2)
    assert not detect_launch({"RANK": "0", "WORLD_SIZE": "1"}).distributed


@pytest.mark.parametrize("env, message", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "outside a world of 2"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "at least 1"),
    ({"WORLD_SIZE": "2"}, "RANK is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "not a TCP port"),
])
def test_detect_launch_refuses_impossible_environments(env, message):
    with pytest.raises(UsageError, match=message):
        detect_launch(env)


def _two_rank_manifest() -> dict:
    part = {"total_bytes": 0, "shards": [], "tensors": [], "skeleton": {"__dict__": []}}
    return {"format": mf.FORMAT, "world_size": 2, "ranks": [dict(part, rank=0), dict(part, rank=1)]}


def test_rank_part_matches_the_world_or_explains():
    manifest = _two_rank_manifest()
    assert mf.rank_part(manifest, "c", rank=1, world_size=2)["rank"] == 1
    assert mf.rank_part(manifest, "c", rank=0, world_size=1)["rank"] == 0  # rank= in one process
    with pytest.raises(UsageError, match="saved by 2 ranks and this is one process.*rank=K \\(0..1\\)"):
        mf.rank_part(manifest, "c", rank=None, world_size=1)
    with pytest.raises(UsageError, match="saved by 2 ranks and this launch has 4 ranks"):
        mf.rank_part(manifest, "c", rank=3, world_size=4)
    with pytest.raises(UsageError, match="rank 5 is not one of 0..1"):
        mf.rank_part(manifest, "c", rank=5, world_size=1)
    single = {"format": mf.FORMAT, "total_bytes": 0, "shards": [], "tensors": [], "skeleton": {"__dict__": []}}
    assert mf.rank_part(single, "c", rank=None, world_size=2) is single  # every rank may load a whole one
    with pytest.raises(UsageError, match="saved by one process; it has no rank 1"):
        mf.rank_part(single, "c", rank=1, world_size=1)
    broken = dict(manifest, world_size=3)
    with pytest.raises(mf.NotACheckpointError, match="world_size 3 but lists 2"):
        mf.rank_part(broken, "c", rank=0, world_size=3)


# -- save and load under torchrun --------------------------------------------------------------


@pytest.mark.slow
def test_two_ranks_save_and_load_their_own_parts(tmp_path: Path):
    proc = torchrun([str(HERE), "roundtrip", str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (tmp_path / "rank0.ok").exists() and (tmp_path / "rank1.ok").exists()
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and [p["rank"] for p in manifest["ranks"]] == [0, 1]
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    # the async overwrite committed, then removed the first save's shards: one save's shards per rank
    assert {n.split("-")[2] for n in names if n.startswith("shard-")} == {"r00000", "r00001"}
    assert len([n for n in names if n.startswith("shard-")]) == 2

    import torch

    import ckptbench

    for rank in (0, 1):  # one rank's part in one process
        part = ckptbench.load(tmp_path / "ckpt", rank=rank)
        assert torch.equal(part["w"], torch.full((1000,), 10.0 + rank)) and part["step"] == 7
        assert torch.equal(part[f"only{rank}"], torch.arange(rank + 3))
    with pytest.raises(UsageError, match="saved by 2 ranks"):
        ckptbench.load(tmp_path / "ckpt")


@pytest.mark.slow
def test_a_rank_that_fails_mid_save_leaves_the_previous_checkpoint(tmp_path: Path):
    """Rank 1's write fails (ENOSPC): nothing is committed, rank 0 names rank 1, the old checkpoint loads."""
    proc = torchrun([str(HERE), "fail", str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    errors = {r: (tmp_path / f"rank{r}.error").read_text() for r in (0, 1)}
    assert errors[0].startswith("RankFailedError") and "rank 1 failed" in errors[0] and "not committed" in errors[0]
    assert "InsufficientSpaceError" in errors[0]  # rank 1's own error, as rank 1 raised it
    assert errors[1].startswith("InsufficientSpaceError")
    import torch

    import ckptbench

    for rank in (0, 1):
        assert torch.equal(ckptbench.load(tmp_path / "ckpt", rank=rank)["w"], torch.full((1000,), float(rank)))
    shards = [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("shard-")]
    assert len(shards) == 2  # the failed save's shards were removed by both ranks


@pytest.mark.slow
def test_a_rank_killed_mid_save_is_named_and_nothing_commits(tmp_path: Path):
    """Rank 1 dies (SIGKILL-like exit) while saving; rank 0 stops within seconds, naming it."""
    argv = [sys.executable, str(HERE), "die", str(tmp_path)]
    rank0, rank1 = by_hand([argv, argv], cwd=tmp_path, CKPTBENCH_DIST_DEAD_AFTER_S="2")
    assert rank1.returncode == 9
    assert rank0.returncode == 0, rank0.stderr[-3000:]
    error = (tmp_path / "rank0.error").read_text()
    assert "rank 1 stopped responding" in error and "not committed" in error
    import torch

    import ckptbench

    assert torch.equal(ckptbench.load(tmp_path / "ckpt", rank=0)["w"], torch.full((1000,), 0.0))  # the old one


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["single_under_launch", "async_fail", "async_exit", "unknown", "badpath",
                                      "rank0_plan", "into_misfit"])
def test_every_rank_ends_the_same_way(tmp_path: Path, scenario: str):
    """A whole single-process checkpoint loads on every rank; a rank 1 failure during an async save
    commits nothing; an async save still running at a normal exit is completed on every rank; a
    manifest write whose outcome is unknown leaves every rank's shards; rank 0's own setup error
    reaches rank 1 at once (no wait for the timeout); a load into= that does not fit on rank 1 leaves
    rank 0's into= untouched too."""
    import torch

    import ckptbench

    if scenario == "single_under_launch":
        ckptbench.save({"w": torch.arange(10.0), "step": 3}, tmp_path / "ckpt")
    proc = torchrun([str(HERE), scenario, str(tmp_path)], cwd=tmp_path, timeout=120,
                    CKPTBENCH_DIST_TIMEOUT_S="60")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (tmp_path / "rank0.ok").exists() and (tmp_path / "rank1.ok").exists()
    errors = {r: (tmp_path / f"rank{r}.error").read_text() if (tmp_path / f"rank{r}.error").exists() else None
              for r in (0, 1)}
    ckpt = tmp_path / "ckpt"
    if scenario == "single_under_launch":
        assert errors == {0: None, 1: None}
    elif scenario == "async_fail":
        assert "rank 1 failed" in errors[0] and "not committed" in errors[0]
        assert errors[1].startswith("InsufficientSpaceError")
        assert torch.equal(ckptbench.load(ckpt, rank=1)["w"], torch.full((1000,), 1.0))  # the previous one
    elif scenario == "async_exit":
        for rank in (0, 1):  # committed although nobody waited for the result
            assert torch.equal(ckptbench.load(ckpt, rank=rank)["w"], torch.full((1000,), 5.0 + rank))
    elif scenario == "unknown":
        assert errors[0].startswith("CommitOutcomeUnknown") and "shards are kept" in errors[0]
        assert "whether" in errors[1] and "is unknown" in errors[1]
        manifest = json.loads((ckpt / "manifest.json").read_text())  # it did land: and every shard it names is there
        for part in manifest["ranks"]:
            assert all((ckpt / s["name"]).exists() for s in part["shards"])
        for rank in (0, 1):
            assert torch.equal(ckptbench.load(ckpt, rank=rank)["w"], torch.full((1000,), 5.0 + rank))
    elif scenario == "into_misfit":
        assert errors[1].startswith("UsageError") and "does not fit" in errors[1], errors[1]
        assert errors[0].startswith("RankFailedError") and "rank 1 (UsageError" in errors[0], errors[0]
        assert (tmp_path / "rank0.untouched").exists()  # nothing copied: another rank's into= did not fit
    elif scenario == "rank0_plan":  # rank 0's state_dict cannot be saved: rank 1 hears it, removes its shards
        assert errors[0].startswith("UsageError") and "cannot be saved" in errors[0], errors[0]
        assert errors[1].startswith("RankFailedError") and "rank 0 failed: UsageError" in errors[1], errors[1]
        assert sorted(p.name for p in ckpt.iterdir()) == []
    else:  # badpath
        assert errors[0].startswith("NotADirectoryError"), errors[0]
        assert errors[1].startswith("RankFailedError: rank 1: rank 0 could not start the save: NotADirectoryError")


def _new_state(rank: int | None) -> dict:
    """What a save replacing the checkpoint mid-load writes: one process's state (None) or rank ``rank``'s."""
    import torch

    gen = torch.Generator().manual_seed(100 + (rank or 0))
    state = {"w": torch.randn(1000, generator=gen), "bf16": torch.randn(33, 17, generator=gen).to(torch.bfloat16),
             "step": 9}
    if rank is not None:
        state[f"only{rank}"] = torch.arange(rank + 5)
    return state


@pytest.mark.slow
@pytest.mark.parametrize("scenario, reads", [
    # rank 0 has read the old checkpoint whole before rank 1 sees it replaced (by one process)
    ("replaced_after_rank0_read", {0: ["ok", "ok"], 1: ["failed", "ok"]}),
    # another launch of 2 replaces it before either rank reads: each rank gets its part of the new one
    ("replaced_by_a_launch", {0: ["failed", "ok"], 1: ["failed", "ok"]}),
])
def test_a_checkpoint_replaced_mid_load_is_loaded_anew_by_every_rank(tmp_path: Path, scenario: str, reads: dict):
    """A save with overwrite=True commits a new checkpoint, and removes the shards being read, after
    rank 0 handed the manifest round: every rank loads the new one, bit-exact, also a rank whose
    read of the old one had gone through (never one rank on the old checkpoint, another on the new)."""
    import torch

    proc = torchrun([str(HERE), scenario, str(tmp_path)], cwd=tmp_path, timeout=120, CKPTBENCH_DIST_TIMEOUT_S="60")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for rank in (0, 1):
        assert not (tmp_path / f"rank{rank}.error").exists(), (tmp_path / f"rank{rank}.error").read_text()
        assert json.loads((tmp_path / f"rank{rank}.reads").read_text()) == reads[rank]
        loaded = torch.load(tmp_path / f"rank{rank}.pt")
        expected = _new_state(rank if scenario == "replaced_by_a_launch" else None)
        assert loaded.keys() == expected.keys()
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), (rank, key)
            else:
                assert loaded[key] == value, (rank, key)


@pytest.mark.slow
def test_a_checkpoint_replaced_on_every_try_fails_alike_on_every_rank(tmp_path: Path):
    """Replaced before every read, LOAD_ATTEMPTS times: every rank stops with the same clear error, and
    what the last save committed stays loadable."""
    import torch

    import ckptbench
    from ckptbench.checkpoint import api

    proc = torchrun([str(HERE), "replaced_every_try", str(tmp_path)], cwd=tmp_path, timeout=120,
                    CKPTBENCH_DIST_TIMEOUT_S="60")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    errors = [(tmp_path / f"rank{rank}.error").read_text() for rank in (0, 1)]
    assert errors[0] == errors[1], errors
    assert errors[0].startswith(f"CorruptCheckpointError: {tmp_path / 'ckpt'} was replaced by a new save "
                                f"{api.LOAD_ATTEMPTS} times while loading it"), errors[0]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.reads").read_text()) == ["failed"] * api.LOAD_ATTEMPTS
    assert torch.equal(ckptbench.load(tmp_path / "ckpt")["w"], torch.full((1000,), 100.0 + api.LOAD_ATTEMPTS))


@pytest.mark.slow
def test_a_shard_removed_under_an_unchanged_manifest_is_damage_on_every_rank(tmp_path: Path):
    """Rank 1's shard vanishes while it is read, no new save: no retry; rank 1 calls it damage, rank 0
    names rank 1."""
    proc = torchrun([str(HERE), "shard_removed", str(tmp_path)], cwd=tmp_path, timeout=120,
                    CKPTBENCH_DIST_TIMEOUT_S="60")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    errors = [(tmp_path / f"rank{rank}.error").read_text() for rank in (0, 1)]
    assert errors[1].startswith(f"CorruptCheckpointError: a shard of {tmp_path / 'ckpt'} disappeared while it "
                                "was read"), errors[1]
    assert errors[0].startswith("RankFailedError: rank 0: loading") and "on rank 1 (FileNotFoundError" in errors[0]
    assert [json.loads((tmp_path / f"rank{rank}.reads").read_text()) for rank in (0, 1)] == [["ok"], ["failed"]]


@pytest.mark.slow
def test_a_rank_that_stops_answering_is_named_in_a_barrier(tmp_path: Path):
    """Rank 1 freezes (SIGSTOP: its sockets stay open, gloo sees nothing); rank 0's barrier names it
    from the heartbeats instead of waiting for the timeout."""
    import signal

    argv = [sys.executable, str(HERE), "freeze", str(tmp_path)]
    port = str(_free_port())
    procs = [subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port, CKPTBENCH_DIST_DEAD_AFTER_S="2"))
             for r in (0, 1)]
    try:
        procs[0].communicate(timeout=60)
        assert procs[0].returncode == 0
        error = (tmp_path / "rank0.error").read_text()
        assert error.startswith("RankFailedError") and "rank 1 stopped responding" in error, error
    finally:
        procs[1].send_signal(signal.SIGKILL)
        procs[1].communicate()


@pytest.mark.slow
def test_ranks_that_disagree_on_the_path_are_told_which(tmp_path: Path):
    results = by_hand([[sys.executable, str(HERE), "disagree", str(tmp_path)]] * 2, cwd=tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-2000:] + results[1].stderr[-2000:]
    for r in (0, 1):
        text = (tmp_path / f"rank{r}.error").read_text()
        assert "UsageError" in text and "ranks disagree on the checkpoint path" in text
        assert "rank 0:" in text and "rank 1:" in text
    assert not (tmp_path / "a0").exists() or not (tmp_path / "a0" / "manifest.json").exists()


@pytest.mark.slow
def test_a_distributed_save_to_a_locked_path_fails_on_every_rank(tmp_path: Path):
    """Another save holds the path: rank 0 cannot take the lock, so no rank writes anything."""
    from ckptbench.checkpoint.lock import acquire_save_lock
    from ckptbench.storage.store import LocalStore

    store = LocalStore(tmp_path / "ckpt")
    store.prepare()
    lock = acquire_save_lock(store)
    try:
        proc = torchrun([str(HERE), "locked", str(tmp_path)], cwd=tmp_path)
    finally:
        lock.release()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for r in (0, 1):
        text = (tmp_path / f"rank{r}.error").read_text()
        assert text.startswith("CheckpointLockedError") and "is being saved by pid" in text, text
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == []


@pytest.mark.slow
def test_bench_ranks_started_differently_are_told_which(tmp_path: Path):
    """Two ranks of one launch given different --size: both stop with one line naming both values, exit 2."""
    (tmp_path / "t").mkdir()
    base = [sys.executable, "-m", "ckptbench", "bench", str(tmp_path / "t"), "--repeat", "1", "--warmup", "0"]
    results = by_hand([base + ["--size", "8MiB"], base + ["--size", "16MiB"]], cwd=tmp_path)
    for r in results:
        assert r.returncode == 2, r.stderr[-2000:]
        [line] = [x for x in r.stderr.splitlines() if x.strip()]
        assert line.startswith("ckptbench: error: the ranks disagree on the target and the benchmark options")
        assert "rank 0:" in line and "rank 1:" in line
    assert list((tmp_path / "t").iterdir()) == []


def test_a_group_that_cannot_form_is_an_error_not_a_hang(tmp_path: Path):
    """One rank of two started: it gives up after the connect timeout, one line, exit 1."""
    port = str(_free_port())
    proc = subprocess.run(
        [sys.executable, "-m", "ckptbench", "bench", str(tmp_path), "--size", "8MiB", "--repeat", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=_env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                 CKPTBENCH_DIST_CONNECT_TIMEOUT_S="2"))
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("ckptbench: error: rank 1: the process group of 2 ranks did not form within 2 s")
    assert "Traceback" not in proc.stderr
    assert not [p for p in tmp_path.iterdir()]  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["alone_in_their_group", "alone"])
def test_a_save_only_rank_0_makes_is_an_error_not_a_hang(tmp_path: Path, scenario: str):
    """torch.save's habit under torchrun: only rank 0 saves, the others wait in a barrier of the job's own
    group (or go on). Rank 0 gives up after the connect timeout, naming rank 1 and distributed=False;
    saves of every rank form the group afterwards, and distributed=False saves from rank 0 alone."""
    proc = torchrun([str(HERE), scenario, str(tmp_path)], cwd=tmp_path, timeout=150,
                    CKPTBENCH_DIST_CONNECT_TIMEOUT_S="3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    error = (tmp_path / "rank0.error").read_text()
    assert error.startswith("RankFailedError: rank 0: the process group of 2 ranks did not form within 3 s: "
                            "rank 1 did not call ckptbench"), error
    assert "distributed=False" in error
    assert (tmp_path / "rank0.ok").exists() and (tmp_path / "rank1.ok").exists()


def _alone(scenario: str, out: Path) -> None:
    """Rank 0 saves alone first (``if rank == 0: ckptbench.save(...)``), then as the docs say."""
    import torch
    import torch.distributed as dist

    import ckptbench

    rank = int(os.environ["RANK"])
    if scenario == "alone_in_their_group":
        dist.init_process_group("gloo")
    if rank == 0:
        try:
            ckptbench.save({"w": torch.ones(3)}, out / "only-rank-0")
            raise AssertionError("a save of rank 0 alone went through")
        except ckptbench.RankFailedError as exc:
            (out / "rank0.error").write_text(f"{type(exc).__name__}: {exc}")
        ckptbench.save({"w": torch.ones(3)}, out / "only-rank-0", distributed=False)
    if scenario == "alone_in_their_group":
        dist.barrier()
    else:
        _wait_for_file(out / "rank0.error", timeout_s=60)
    ckptbench.save({"w": torch.full((3,), float(rank))}, out / "every-rank")
    assert torch.equal(ckptbench.load(out / "every-rank")["w"], torch.full((3,), float(rank)))
    assert torch.equal(ckptbench.load(out / "only-rank-0")["w"], torch.ones(3))
    (out / f"rank{rank}.ok").touch()


# -- the benchmark under torchrun --------------------------------------------------------------


@pytest.mark.slow
def test_bench_under_torchrun_aggregates_every_rank(tmp_path: Path):
    target = tmp_path / "target"
    target.mkdir()
    proc = torchrun(["-m", "ckptbench", "bench", str(target), "--size", "24MiB", "--repeat", "2", "--warmup", "0",
                     "--json", "--plot", str(tmp_path / "d.png"), "--output", str(tmp_path / "out")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    doc = json.loads(proc.stdout)  # rank 0 alone prints
    assert doc["schema"] == "ckptbench.bench.distributed/1" and doc["launch"]["world_size"] == 2
    assert doc["spec"]["parallelism"] == {"dp": 2, "tp": 1, "pp": 1, "sharding": "fsdp"}
    assert sum(doc["rank_bytes"]) == doc["workload"]["total_bytes"] and min(doc["rank_bytes"]) > 0
    for op in ("save", "load", "async"):
        rounds = doc["rounds"][op]
        assert len(rounds) == 2
        for r in rounds:
            assert [s["rank"] for s in r["ranks"]] == [0, 1]
            assert r["total_bytes"] == doc["workload"]["total_bytes"]
            assert r["duration_s"] == max(s["end_s"] for s in r["ranks"])
            assert r["gbps"] == pytest.approx(r["total_bytes"] / r["duration_s"] / 1e9)
            assert all(s["io_s"] <= s["end_s"] for s in r["ranks"])
        assert doc["summary"][op]["gbps"]["n"] == 2
        # each rank's engine timeline from the barrier; the summary's per round is their sum
        runs = doc["summary"][op]["timeline"]["runs"]
        assert [sum(run["bytes"]) for run in runs] == [
            sum(sum(s["timeline"]["bytes"]) for s in r["ranks"]) for r in rounds]
        assert doc["summary"][op]["latency_histogram"]["count"] > 0
    assert doc["data_verified"] is True
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [result] = list((tmp_path / "out").glob("bench-distributed-*.json"))
    assert list(target.iterdir()) == []  # scratch removed

    from click.testing import CliRunner

    from ckptbench.cli import main

    report = CliRunner().invoke(main, ["report", str(result), "--markdown", str(tmp_path / "r.md")])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "r.md").read_text()
    assert "Distributed checkpoint, 2 ranks" in text and "| durable save |" in text and "(the median one)" in text
    assert "all ranks together: bandwidth over time" in text


def _imported_rss_bytes() -> int:
    """The resident memory of a fresh interpreter once torch, torch.distributed and ckptbench's bench are
    imported: what every rank holds before its share."""
    code = ("import torch, torch.distributed, ckptbench.cli, ckptbench.bench.shootout_launched\n"
            "print(next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')))")
    return int(subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                              env=_env()).stdout)


@pytest.mark.slow
def test_bench_under_torchrun_holds_each_share_about_once(tmp_path: Path):
    """Sync saves through the staging ring, loads into the share's own tensors: with a host memory that
    cannot hold two copies, every rank's peak RSS stays within 1.25 shares of what the imports hold, and
    the async saves are measured on a part of the share (said so)."""
    share, ring = 512 * 2**20, 4 * 4 * 2**20
    target = tmp_path / "target"
    target.mkdir()
    proc = torchrun(["-m", "ckptbench", "bench", str(target), "--size", f"{2 * share // 2**20}MiB", "--repeat", "1",
                     "--warmup", "0", "--json"], cwd=tmp_path, timeout=300,
                    CKPTBENCH_STAGE_RING_SLOTS="4", CKPTBENCH_STAGE_RING_SLOT_BYTES=str(ring // 4),
                    CKPTBENCH_BENCH_MEMORY_BYTES=str(int(2 * (1.15 * share + ring))))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    doc = json.loads(proc.stdout)
    baseline = _imported_rss_bytes()
    memory = doc["memory"]
    assert memory["ring_bytes"] == ring and [r["rank"] for r in memory["ranks"]] == [0, 1]
    for r in memory["ranks"]:
        assert r["share_bytes"] == doc["rank_bytes"][r["rank"]]
        assert r["peak_rss_bytes"] <= 1.25 * r["share_bytes"] + baseline, (r, baseline)
        assert 0 < r["async_bytes"] < r["share_bytes"] // 8
    part = doc["async_part"]
    assert part["measured_bytes"] == min(r["async_bytes"] for r in memory["ranks"]) and part["scaled_by"] > 8
    assert "async-part" in [w["code"] for w in doc["warnings"]]
    assert [r["total_bytes"] for r in doc["rounds"]["async"]] == [sum(doc["rank_bytes"])]  # scaled to the shares
    assert doc["data_verified"] is True and list(target.iterdir()) == []


@pytest.mark.slow
def test_bench_layout_must_fit_the_launch(tmp_path: Path):
    proc = torchrun(["-m", "ckptbench", "bench", str(tmp_path), "--size", "8MiB", "--tp", "4"], cwd=tmp_path,
                    timeout=120)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("ckptbench: error:")]
    layout = [line for line in ours if "--tp 4 x --pp 1 does not divide the launch's 2 ranks" in line]
    # torchrun stops the other rank (SIGTERM) as soon as the first one fails: it may not get to say it too
    assert layout and all(line in layout or line == "ckptbench: error: terminated (SIGTERM)" for line in ours), ours
    # torchrun prints its own traceback (ChildFailedError) for failed workers; none comes from ckptbench
    assert "ckptbench/" not in "".join(line for line in proc.stderr.splitlines() if line.lstrip().startswith("File"))


def test_layout_options_outside_a_launch_are_refused(tmp_path: Path):
    from click.testing import CliRunner

    from ckptbench.cli import main

    result = CliRunner().invoke(main, ["bench", str(tmp_path), "--workload", "checkpoint", "--dp", "2"],
                                env={"RANK": None, "WORLD_SIZE": None, "SLURM_PROCID": None,
                                     "SLURM_STEP_NUM_TASKS": None})
    assert result.exit_code == 2
    assert "--dp splits the checkpoint over the ranks of a distributed launch" in result.output


@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_a_named_gpu_under_a_launch_is_refused_before_any_rank_waits(tmp_path: Path, command: str):
    from click.testing import CliRunner

    from ckptbench.cli import main

    args = [command, str(tmp_path), "--device", "cuda:1"] + (["--workload", "checkpoint"] if command == "bench" else [])
    result = CliRunner().invoke(main, args, env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    assert result.exit_code == 2, result.output
    assert "under a" in result.output and "launch each rank uses its own GPU" in result.output
    assert list(tmp_path.iterdir()) == []


# -- the worker ---------------------------------------------------------------------------------


def _wait_for_file(path: Path, timeout_s: float = 60) -> None:
    """Until the other rank of a scenario has got to its mark (it touches ``path``)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} did not appear within {timeout_s:g} s")
        time.sleep(0.01)


def _worker(scenario: str, out: Path) -> None:
    import torch

    import ckptbench
    from ckptbench.checkpoint.distributed import current_world

    world = current_world()
    assert world is not None
    rank = world.rank

    def record_error(exc: BaseException) -> None:
        (out / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}")

    if scenario == "roundtrip":
        sd = {"w": torch.full((1000,), 10.0 + rank), "step": 7, f"only{rank}": torch.arange(rank + 3),
              "bf16": torch.randn(33, 17).to(torch.bfloat16)}
        first = ckptbench.save(sd, out / "ckpt")
        assert (first.rank, first.world_size) == (rank, 2) and first.world_bytes > first.bytes
        loaded = ckptbench.load(out / "ckpt")
        assert torch.equal(loaded["w"], sd["w"]) and torch.equal(loaded["bf16"], sd["bf16"])
        assert torch.equal(loaded[f"only{rank}"], sd[f"only{rank}"]) and loaded["step"] == 7
        try:
            ckptbench.save(sd, out / "ckpt")
            raise AssertionError("a second save without overwrite went through")
        except ckptbench.checkpoint.api.CheckpointExistsError:
            pass
        sd["w"] = torch.full((1000,), 10.0 + rank)
        handle = ckptbench.save(sd, out / "ckpt", overwrite=True, async_=True)
        sd["w"].fill_(-1.0)  # staged: the caller may change its tensors
        assert handle.result().world_size == 2
        assert torch.equal(ckptbench.load(out / "ckpt")["w"], torch.full((1000,), 10.0 + rank))
    elif scenario in ("fail", "die"):
        ckptbench.save({"w": torch.full((1000,), float(rank))}, out / "ckpt")
        if rank == 1:
            from ckptbench.storage.store import LocalStore

            def broken(self, files, **kwargs):
                if scenario == "die":
                    os._exit(9)
                raise OSError(28, "No space left on device")

            LocalStore.write_files = broken
        try:
            ckptbench.save({"w": torch.full((1000,), 5.0 + rank)}, out / "ckpt", overwrite=True)
            raise AssertionError("the save went through")
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            record_error(exc)
    elif scenario == "single_under_launch":
        loaded = ckptbench.load(out / "ckpt")  # saved by one process: every rank gets all of it
        assert torch.equal(loaded["w"], torch.arange(10.0)) and loaded["step"] == 3
    elif scenario in ("async_fail", "async_exit", "unknown"):
        ckptbench.save({"w": torch.full((1000,), float(rank))}, out / "ckpt")
        if scenario == "async_fail" and rank == 1:
            from ckptbench.storage.store import LocalStore

            def broken(self, files, **kwargs):
                raise OSError(28, "No space left on device")

            LocalStore.write_files = broken
        if scenario == "unknown" and rank == 0:
            from ckptbench.checkpoint import manifest as mf

            real_commit = mf.commit

            def commit_then_fail(store, manifest):
                real_commit(store, manifest)  # it lands, but the answer is lost...
                mf.read_manifest = lambda store: (_ for _ in ()).throw(OSError(5, "read-back failed"))
                raise OSError(104, "connection reset")

            mf.commit = commit_then_fail
        handle = ckptbench.save({"w": torch.full((1000,), 5.0 + rank)}, out / "ckpt", overwrite=True, async_=True)
        if scenario == "async_exit":
            (out / f"rank{rank}.ok").touch()
            sys.exit(0)  # a normal exit with the persist in flight: it must be completed first
        try:
            handle.result()
            raise AssertionError("the save went through")
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            record_error(exc)
    elif scenario == "into_misfit":
        ckptbench.save({"w": torch.full((1000,), float(rank)), "step": 5}, out / "ckpt")
        into = {"w": torch.zeros(1000 if rank == 0 else 999), "step": 0}
        try:
            ckptbench.load(out / "ckpt", into=into)
            raise AssertionError("the load went through")
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            record_error(exc)
        if torch.equal(into["w"], torch.zeros(into["w"].shape)) and into["step"] == 0:
            (out / f"rank{rank}.untouched").touch()
        fits = {"w": torch.zeros(1000), "step": 0}
        assert ckptbench.load(out / "ckpt", into=fits) is fits
        assert torch.equal(fits["w"], torch.full((1000,), float(rank))) and fits["step"] == 5
    elif scenario == "rank0_plan":
        state = {"w": torch.full((1000,), float(rank))}
        if rank == 0:
            state["bad"] = object()
        try:
            ckptbench.save(state, out / "ckpt")
            raise AssertionError("the save went through")
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            record_error(exc)
    elif scenario == "badpath":
        (out / "file").write_text("x")
        try:
            ckptbench.save({"w": torch.zeros(3)}, out / "file" / "ckpt")
            raise AssertionError("the save went through")
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            record_error(exc)
    elif scenario in ("replaced_after_rank0_read", "replaced_by_a_launch", "replaced_every_try", "shard_removed"):
        from ckptbench.checkpoint import api
        from ckptbench.storage.store import LocalStore

        ckptbench.save({"w": torch.full((1000,), float(rank)), "step": 1}, out / "ckpt")
        real, reads = api.Checkpointer._timed_load, []
        if scenario == "shard_removed" and rank == 1:
            real_read = LocalStore.read_files

            def removed_first(self, files, **kwargs):
                for name, _ in files:
                    (self.path / name).unlink()
                return real_read(self, files, **kwargs)

            LocalStore.read_files = removed_first

        def replace_then_read(self, store, manifest, part, *args, **kwargs):
            """Between rank 0 handing the manifest round and this rank's reads: a save replaces it."""
            if scenario == "replaced_after_rank0_read" and not reads:
                if rank == 1:  # once rank 0 read the old checkpoint, another process replaces it
                    _wait_for_file(out / "rank0.read-1")
                    ckptbench.save(_new_state(None), out / "ckpt", overwrite=True, distributed=False)
            elif scenario == "replaced_by_a_launch" and not reads:
                ckptbench.save(_new_state(rank), out / "ckpt", overwrite=True)  # both ranks: a save of 2
            elif scenario == "replaced_every_try":
                if rank == 1:
                    ckptbench.save({"w": torch.full((1000,), 101.0 + len(reads))}, out / "ckpt", overwrite=True,
                                   distributed=False)
                    (out / f"replaced-{len(reads) + 1}").touch()
                else:
                    _wait_for_file(out / f"replaced-{len(reads) + 1}")
            try:
                loaded = real(self, store, manifest, part, *args, **kwargs)
            except Exception:
                reads.append("failed")
                raise
            reads.append("ok")
            (out / f"rank{rank}.read-{len(reads)}").touch()
            return loaded

        api.Checkpointer._timed_load = replace_then_read
        try:
            loaded = ckptbench.load(out / "ckpt")
            torch.save({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in loaded.items()},
                       out / f"rank{rank}.pt")
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            record_error(exc)
        (out / f"rank{rank}.reads").write_text(json.dumps(reads))
    elif scenario == "freeze":
        world.barrier("warming up")
        if rank == 1:
            import signal

            os.kill(os.getpid(), signal.SIGSTOP)  # frozen: heartbeats stop, sockets stay open
        try:
            world.barrier("the barrier rank 1 never reaches")
            raise AssertionError("the barrier passed")
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            record_error(exc)
    elif scenario == "locked":
        try:
            ckptbench.save({"w": torch.zeros(3)}, out / "ckpt")
            raise AssertionError("the save went through")
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            record_error(exc)
    elif scenario == "disagree":
        try:
            ckptbench.save({"w": torch.zeros(3)}, out / f"a{rank}")
            raise AssertionError("the save went through")
        except UsageError as exc:
            record_error(exc)
    (out / f"rank{rank}.ok").touch()


if __name__ == "__main__":
    if sys.argv[1].startswith("alone"):
        _alone(sys.argv[1], Path(sys.argv[2]))
    else:
        _worker(sys.argv[1], Path(sys.argv[2]))
    os._exit(0)  # skip interpreter teardown with a live gloo group (torch sometimes aborts there)


# -- preflight at the job's real shape ------------------------------------------------------------------


def test_preflight_under_torchrun_measures_the_jobs_real_shape(tmp_path: Path):
    target = tmp_path / "target"
    target.mkdir()
    proc = torchrun(["-m", "ckptbench", "preflight", str(target), "--params", "20M", "--ranks", "2",
                     "--gpus-per-node", "2", "--mtbf", "1d", "--repeat", "2", "--json"], cwd=tmp_path)
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-5000:]
    doc = json.loads(proc.stdout)  # rank 0 alone prints
    m, p = doc["measurements"], doc["predictions"]
    assert doc["schema"] == "ckptbench.preflight/1" and m["shape"] == "job" and m["launched_ranks"] == 2
    bench = m["checkpoint_bench"]
    assert bench["schema"] == "ckptbench.bench.distributed/1" and bench["launch"]["world_size"] == 2
    # every rank wrote its real share of the job's checkpoint (20M params x 14 B over 2 ranks), to the
    # granularity of the model-shaped tensors
    assert m["per_rank_bytes"] == max(bench["rank_bytes"])
    assert m["per_rank_bytes"] == pytest.approx(p["checkpoint_per_rank_bytes"], rel=0.1)
    assert m["measured_bytes"] == pytest.approx(sum(bench["rank_bytes"]))  # one host: a node's bytes
    # the node's sync checkpoint is the slowest rank's time of the rounds, scaled to the job's exact bytes
    durations = [r["duration_s"] for r in bench["rounds"]["save"]]
    scale = p["checkpoint_per_node_bytes"] / m["measured_bytes"]
    low, high = p["sync_checkpoint_s_range"]
    from ckptbench.decide.scaling import fit_sizes  # the runs' spread, at least, and their interval made again

    fitted = fit_sizes([1.0], [durations], 1.0)
    assert low == pytest.approx(fitted.low_s * scale) and high == pytest.approx(fitted.high_s * scale)
    assert low <= min(durations) * scale and high >= max(durations) * scale
    assert p["extrapolation_factor"] == 1.0 and doc["verdict"] in ("PASS", "WARN", "BORDERLINE")
    assert any("measured at the job's shape" in a for a in doc["assumptions"])
    assert list(target.iterdir()) == []  # scratch removed


@pytest.mark.parametrize(("args", "needle"), [
    (["--ranks", "1", "--gpus-per-node", "1"], "the launch has 2 ranks but the job has 1 (--ranks)"),
    (["--ranks", "8", "--gpus-per-node", "4"], "runs 2 ranks per node but the job has 4"),
])
def test_preflight_launch_that_does_not_fit_the_job_is_refused(tmp_path: Path, args, needle):
    proc = torchrun(["-m", "ckptbench", "preflight", str(tmp_path), "--params", "20M", "--mtbf", "1d", *args],
                    cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("ckptbench: error:")]
    assert any(needle in line for line in ours) and all(
        needle in line or line == "ckptbench: error: terminated (SIGTERM)" for line in ours), ours
    # torchrun prints its own traceback (ChildFailedError) for failed workers; none comes from ckptbench
    assert "ckptbench/" not in "".join(line for line in proc.stderr.splitlines() if line.lstrip().startswith("File"))
    assert list(tmp_path.iterdir()) == []  # nothing measured


def test_preflight_shape_from_the_launch():
    from ckptbench.cli.preflight import check_launch
    from ckptbench.decide.verdict import Job
    from ckptbench.model.failures import FailureModel
    from ckptbench.model.sizing import Parallelism, TrainingRecipe, checkpoint_size

    job = Job(size=checkpoint_size(1e9, TrainingRecipe(), Parallelism(dp=16)), model_name="1B", ranks=16,
              ranks_per_node=8, failures=FailureModel(86400.0))
    assert check_launch(job, 16, 8) == "job" and check_launch(job, 8, 8) == "nodes"
    assert check_launch(job, 8, None) == "nodes"
    with pytest.raises(UsageError, match="not whole nodes"):
        check_launch(job, 4, None)
    with pytest.raises(UsageError, match="runs 4 ranks per node"):
        check_launch(job, 8, 4)
