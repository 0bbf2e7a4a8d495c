"""The writer's per-target settings (checkpoint/tuning.py): mount detection, the auto choice of the durable
mode, threads and block size from measurements, the per-mount cache, settings and result files, and how
save/Checkpointer/the DCP Writer take and record them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench import native
from ckptbench.checkpoint import tuning
from ckptbench.errors import UsageError
from ckptbench.storage import store as store_module
from ckptbench.storage.local_target import MountInfo, mount_of
from ckptbench.storage.store import LocalStore, WriteReport

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev 0 0
ceph-fuse /mnt/ceph fuse.ceph-fuse rw,nosuid,nodev,relatime 0 0
10.0.0.1:/export /mnt/ceph/nfs nfs4 rw,vers=4.2 0 0
192.168.1.5@tcp:/lustre /scratch lustre rw,flock 0 0
/dev/nvme0n1 /scratch2 xfs rw 0 0
server:/with\\040space /mnt/with\\040space nfs rw 0 0
"""


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(tuning.knobs, "TUNE", 1)  # tests/conftest.py turns it off for the other tests
    tuning.forget()
    yield
    tuning.forget()


@pytest.mark.parametrize(("path", "point", "fstype", "network"), [
    ("/mnt/ceph/run/ckpt", "/mnt/ceph", "fuse.ceph-fuse", True),
    ("/mnt/ceph/nfs/a", "/mnt/ceph/nfs", "nfs4", True),  # the longest mount-point prefix wins
    ("/mnt/cephx/a", "/", "ext4", False),  # a prefix of the name is not a parent directory
    ("/scratch/job", "/scratch", "lustre", True),
    ("/scratch2/job", "/scratch2", "xfs", False),
    ("/tmp/x", "/tmp", "tmpfs", False),
    ("/mnt/with space/ckpt", "/mnt/with space", "nfs", True),
])
def test_mount_type_from_proc_mounts_text(path, point, fstype, network):
    mount = mount_of(Path(path), MOUNTS)
    assert (mount.mount_point, mount.fstype) == (point, fstype)
    assert tuning.is_network(mount.fstype) is network


@pytest.mark.parametrize("fstype", ["ceph", "nfs", "nfs4", "lustre", "gpfs", "beegfs", "wekafs", "9p", "cifs",
                                    "fuse.sshfs", "fuse.juicefs", "fuse"])
def test_network_and_fuse_types(fstype):
    assert tuning.is_network(fstype)


@pytest.mark.parametrize("fstype", ["ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "", None])
def test_local_types(fstype):
    assert not tuning.is_network(fstype)


def test_faster_mode_takes_the_other_mode_only_beyond_the_noise():
    assert tuning.faster_mode([0.05, 0.06, 0.055], [0.39, 0.40, 0.41])[0] is False
    assert tuning.faster_mode([1.2, 1.3, 1.25], [0.8, 0.9, 0.85])[0] is True
    # Overlapping ranges: a tie keeps the default, whichever median is higher.
    value, why = tuning.faster_mode([1.0, 1.2, 0.9], [1.1, 1.3, 0.95])
    assert value is True and "tied" in why
    value, _ = tuning.faster_mode([1.0, 1.2, 0.9], [1.1, 1.3, 0.95], default=False)
    assert value is False
    # One sample says nothing about the noise.
    assert tuning.faster_mode([0.01], [1.0])[0] is True


def test_pick_keeps_the_default_unless_beaten():
    assert tuning.pick({2: [1.0, 1.1], 4: [1.05, 1.2], 8: [0.5, 0.6]}, 2)[0] == 2
    assert tuning.pick({2: [0.8, 0.82], 4: [1.2, 1.3], 8: [1.0, 1.25]}, 2)[0] == 4


def test_a_gain_beyond_the_noise_but_under_the_material_gain_keeps_the_default():
    # Two samples a side that do not overlap, 5 % apart: chance does that often on a busy host.
    value, why = tuning.pick({2: [1.00, 1.01], 4: [1.05, 1.06]}, 2)
    assert value == 2 and "less than 10%" in why
    assert tuning.pick({2: [1.00, 1.01], 4: [1.11, 1.12]}, 2)[0] == 4
    value, why = tuning.faster_mode([1.00, 1.01, 1.02], [1.05, 1.06, 1.07])
    assert value is True and "less than 10%" in why
    assert tuning.faster_mode([1.00, 1.01, 1.02], [1.12, 1.13, 1.14])[0] is False


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _FakeStore:
    """A store whose writes take nbytes / rate on a fake clock: synthetic measurements, no timing noise."""

    def __init__(self, clock: _Clock, rate, direct_works: bool = True) -> None:
        self.clock, self.rate, self.direct_works = clock, rate, direct_works
        self.local_path = Path("/fake")
        self.writes: list[tuple[bool, int, int, int]] = []
        self.removed: list[str] = []

    def write_files(self, files, *, threads, block_size, direct):
        used = direct and self.direct_works
        nbytes = sum(len(v) for _, v in files)
        self.writes.append((used, threads, block_size, nbytes))
        self.clock.now += nbytes / (self.rate(used, threads, block_size) * 1e9)
        return WriteReport(direct=used, sync="fdatasync",
                           fallback_reason=None if used or not direct else "EINVAL on open")

    def read_files(self, files, *, threads, block_size, direct):
        self.clock.now += sum(len(v) for _, v in files) / 1e9

    def remove(self, names):
        self.removed += names


MOUNT = MountInfo("/fake", "fakefs", "fuse.fake", "rw")


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(tuning, "time", types.SimpleNamespace(perf_counter=c))
    return c


LOCAL = MountInfo("/fake", "/dev/sda", "ext4", "rw")


def _measure(store, mount=MOUNT):
    return tuning.measure(store, mount, 256 << 20, 256 << 20, default_threads=2, default_block=4 << 20)


def test_measure_picks_buffered_threads_and_block_from_synthetic_rates(clock):
    def rate(direct, threads, block):
        base = 0.05 if direct else 0.4
        return base * (1.5 if threads == 4 else 1.0) * (1.2 if block == 16 << 20 else 1.0)

    store = _FakeStore(clock, rate)
    chosen = _measure(store)
    assert (chosen.direct.value, chosen.direct.source) == (False, "measured")
    assert "buffered + fdatasync faster beyond the noise" in chosen.direct.reason
    assert chosen.threads.value == 4 and chosen.block_size.value == 16 << 20
    assert len(chosen.measured["direct_gbps"]) >= 2 and len(chosen.measured["buffered_gbps"]) >= 2
    assert all(name.startswith(".ckptbench-tune-") for name in store.removed)
    assert len(store.removed) == len(store.writes)  # every probe file removed


@pytest.mark.parametrize(("mount", "default", "threads"), [(MOUNT, False, 2), (LOCAL, True, tuning.DIRECT_MIN_THREADS)])
def test_measure_ties_keep_the_defaults(clock, mount, default, threads):
    """A tie keeps O_DIRECT on local block storage, buffered + fdatasync on a network or FUSE filesystem; the
    threads stay the default, which for O_DIRECT is at least DIRECT_MIN_THREADS (each one a request in flight)."""
    rates = iter([0.5, 0.6, 0.55, 0.52, 0.58, 0.51] + [0.5, 0.6, 0.55, 0.65, 0.5, 0.6] * 10)  # every range overlaps
    store = _FakeStore(clock, lambda *a: next(rates))
    chosen = _measure(store, mount)
    assert chosen.direct.value is default and "tied" in chosen.direct.reason
    assert chosen.threads.value == threads and chosen.block_size.value == 4 << 20
    assert str(threads) in chosen.measured["threads_gbps"]  # the sweep measured the default it kept


@pytest.mark.parametrize(("mount", "direct_gbps", "buffered_gbps", "chosen"), [
    (LOCAL, 0.4, 1.2, False),  # the other mode beyond the noise wins on a local disk too
    (MOUNT, 1.5, 0.3, True),   # and O_DIRECT on a network filesystem where it is faster (Lustre, large I/O)
])
def test_measure_takes_the_other_mode_beyond_the_noise(clock, mount, direct_gbps, buffered_gbps, chosen):
    store = _FakeStore(clock, lambda direct, *a: direct_gbps if direct else buffered_gbps)
    assert _measure(store, mount).direct.value is chosen


def test_measure_stays_within_its_time_budget(clock, monkeypatch):
    monkeypatch.setattr(tuning.knobs, "TUNE_SECONDS", 2.0)
    store = _FakeStore(clock, lambda direct, *a: 0.003 if direct else 0.3)  # O_DIRECT at 3 MB/s
    chosen = _measure(store)
    assert chosen.direct.value is False
    assert clock.now < 2.0 * 2


def test_a_failed_o_direct_probe_keeps_the_fallback_and_says_so(clock):
    store = _FakeStore(clock, lambda *a: 0.3, direct_works=False)
    chosen = _measure(store)
    assert chosen.direct.value is False
    assert "O_DIRECT probe failed" in chosen.direct.reason and "EINVAL" in chosen.direct.reason


def _count_measures(monkeypatch):
    calls = []

    def fake(store, mount, total, shard, *, default_threads, default_block):
        calls.append(mount.mount_point)
        return tuning.Tuning(tuning.Choice(False, "measured", "synthetic"), tuning.Choice(4, "measured", "synthetic"),
                             tuning.Choice(8 << 20, "measured", "synthetic"), mount.mount_point, mount.fstype)

    monkeypatch.setattr(tuning, "measure", fake)
    return calls


def test_one_measurement_per_mount_and_process(monkeypatch):
    calls = _count_measures(monkeypatch)
    mounts = {"/a": MountInfo("/a", "d1", "fuse.ceph-fuse", "rw"), "/b": MountInfo("/b", "d2", "nfs4", "rw")}
    monkeypatch.setattr(tuning, "mount_of", lambda path, *a: mounts[str(path)[:2]])
    big = tuning.knobs.TUNE_MIN_BYTES
    for path in ("/a/x", "/a/y", "/b/z", "/a/x"):
        chosen = tuning.settle(types.SimpleNamespace(local_path=Path(path)), direct=None, threads=None,
                               block_size=None, total_bytes=big, shard_size=big)
        assert (chosen.direct.value, chosen.threads.value, chosen.block_size.value) == (False, 4, 8 << 20)
    assert calls == ["/a", "/b"]


def test_given_values_and_settings_win(monkeypatch, tmp_path):
    calls = _count_measures(monkeypatch)
    store = LocalStore(tmp_path)
    big = tuning.knobs.TUNE_MIN_BYTES
    chosen = tuning.settle(store, direct=True, threads=3, block_size=1 << 20, total_bytes=big, shard_size=big)
    assert {c.source for c in (chosen.direct, chosen.threads, chosen.block_size)} == {"given"} and calls == []
    monkeypatch.setenv("CKPTBENCH_SAVE_DIRECT", "1")
    chosen = tuning.settle(store, direct=None, threads=5, block_size=None, total_bytes=big, shard_size=big)
    assert (chosen.direct.value, chosen.direct.source) == (True, "settings")
    assert (chosen.threads.value, chosen.threads.source) == (5, "given")
    assert (chosen.block_size.value, chosen.block_size.source) == (8 << 20, "measured")
    monkeypatch.setenv("CKPTBENCH_SAVE_DIRECT", "yes")
    with pytest.raises(UsageError, match="CKPTBENCH_SAVE_DIRECT"):
        tuning.settle(store, direct=None, threads=None, block_size=None, total_bytes=big, shard_size=big)


def test_small_saves_and_tune_off_use_the_defaults(monkeypatch, tmp_path):
    calls = _count_measures(monkeypatch)
    store = LocalStore(tmp_path)
    chosen = tuning.settle(store, direct=None, threads=None, block_size=None, total_bytes=1 << 20,
                           shard_size=1 << 28)
    assert chosen.direct.value is True and chosen.direct.source == "default" and "TUNE_MIN_BYTES" in chosen.direct.reason
    monkeypatch.setattr(tuning.knobs, "TUNE", 0)
    chosen = tuning.settle(store, direct=None, threads=None, block_size=None, total_bytes=1 << 30,
                           shard_size=1 << 28)
    assert chosen.direct.source == "default" and "CKPTBENCH_TUNE=0" in chosen.direct.reason
    assert calls == []


def test_settings_from_a_bench_or_recommend_result(monkeypatch, tmp_path):
    bench = {"schema": "ckptbench.fs-bench/1", "target": str(tmp_path), "best": 1, "results": [
        {"config": {"threads": 2, "block_size": 1 << 20, "direct": True}},
        {"config": {"threads": 4, "block_size": 16 << 20, "direct": True},
         "durable_modes": {"write_direct": False, "write_reason": "buffered faster"}}]}
    got = tuning.from_result(bench, "b.json")
    assert (got["threads"].value, got["block_size"].value, got["direct"].value) == (4, 16 << 20, False)
    recommend = {"schema": "ckptbench.recommendation/1", "settings": {
        "threads": {"value": 8, "reason": "r"}, "block_size_bytes": {"value": 4 << 20, "reason": "r"},
        "direct": {"value": True, "reason": "r"}}}
    got = tuning.from_result(recommend, "r.json")
    assert (got["threads"].value, got["block_size"].value, got["direct"].value) == (8, 4 << 20, True)
    with pytest.raises(UsageError, match="neither"):
        tuning.from_result({"schema": "x"}, "x.json")
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    monkeypatch.setenv("CKPTBENCH_TUNE_FROM", str(path))
    chosen = tuning.settle(LocalStore(tmp_path), direct=None, threads=None, block_size=None, total_bytes=1,
                           shard_size=1)
    assert (chosen.threads.value, chosen.threads.source) == (4, "result file")
    assert chosen.direct.value is False


@pytest.mark.parametrize("bad", ["yes", 1, 0, "True", 1.0])
def test_direct_must_be_none_true_or_false(bad, tmp_path):
    with pytest.raises(TypeError, match="direct must be None"):
        ckptbench.Checkpointer(direct=bad)
    with pytest.raises(TypeError, match="direct must be None"):
        ckptbench.save({"w": torch.zeros(4)}, tmp_path / "c", direct=bad)
    assert not (tmp_path / "c").exists()
    from ckptbench.integrations.dcp import Writer

    with pytest.raises(TypeError, match="direct must be None"):
        Writer(tmp_path / "d", direct=bad)


def test_save_result_records_the_choice(tmp_path):
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    auto = ckptbench.save(state, tmp_path / "auto")
    assert auto.tuning["direct"]["source"] == "default" and auto.tuning["mount"] is not None
    assert auto.tuning["fstype"] == mount_of(tmp_path).fstype
    forced = ckptbench.save(state, tmp_path / "forced", direct=False, threads=3)
    assert forced.direct is False and forced.threads == 3
    assert forced.tuning["direct"] == {"value": False, "source": "given", "reason": "given by the caller"}
    assert forced.to_dict()["tuning"]["threads"]["value"] == 3
    assert torch.equal(ckptbench.load(tmp_path / "forced")["w"], state["w"])


def test_auto_save_measures_this_mount_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning.knobs, "TUNE_MIN_BYTES", 0)
    monkeypatch.setattr(tuning.knobs, "TUNE_PROBE_BYTES", 1 << 20)
    monkeypatch.setattr(tuning.knobs, "TUNE_SECONDS", 1.0)
    state = {"w": torch.ones(1 << 18)}
    with ckptbench.Checkpointer() as ckpt:
        first = ckpt.save(state, tmp_path / "a")
        second = ckpt.save(state, tmp_path / "b")
    t = first.tuning
    assert t["direct"]["source"] == "measured" and t["measured"]["buffered_gbps"]
    chosen = t["direct"]["value"]
    assert first.direct == chosen or first.direct_fallback_reason  # O_DIRECT asked for may fall back
    samples = {True: t["measured"]["direct_gbps"], False: t["measured"]["buffered_gbps"]}
    assert chosen == tuning.faster_mode(samples[True], samples[False],
                                        default=tuning.durable_default(mount_of(tmp_path).fstype))[0]
    assert second.tuning["measured"] == t["measured"]  # from the cache, not measured again
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".ckptbench-tune-")]


def test_a_probe_file_left_by_a_killed_save_is_swept_by_the_next(tmp_path):
    path = tmp_path / "c"
    ckptbench.save({"w": torch.ones(8)}, path)
    (path / ".ckptbench-tune-0a1b2c-0").write_bytes(b"x" * 4096)
    ckptbench.save({"w": torch.zeros(8)}, path, overwrite=True)
    assert not (path / ".ckptbench-tune-0a1b2c-0").exists()


def test_buffered_loads_on_a_network_mount_read_in_several_large_streams(monkeypatch):
    mounts = {"/net": MountInfo("/net", "ceph-fuse", "fuse.ceph-fuse", "rw"), "/loc": MountInfo("/loc", "sda", "ext4", "rw")}
    monkeypatch.setattr(tuning, "mount_of", lambda path, *a: mounts[str(path)[:4]])
    buffered = tuning.Choice(False, "measured", "synthetic")
    for mount in mounts.values():
        tuning.remember(mount, tuning.Tuning(buffered, tuning.Choice(8, "measured", ""), tuning.Choice(1 << 20, "measured", ""),
                                             mount.mount_point, mount.fstype, read_direct=buffered))
    net, loc = (types.SimpleNamespace(local_path=Path(p)) for p in ("/net/c", "/loc/c"))
    streams = tuning.NETWORK_READ_STREAMS
    assert tuning.read_settings(net, None, 1, 1 << 20) == {"direct": False, "threads": streams, "block_size": 16 << 20}
    assert tuning.read_settings(net, None, streams + 4, 32 << 20) == {"direct": False, "threads": streams + 4,
                                                                      "block_size": 32 << 20}
    assert tuning.read_settings(loc, None, 1, 1 << 20) == {"direct": False, "threads": 1, "block_size": 1 << 20}
    assert tuning.read_settings(net, True, 1, 1 << 20) == {"direct": True, "threads": 1, "block_size": 1 << 20}


def test_one_stream_per_file_on_network_mounts_reads_and_writes_the_same_bytes(tmp_path, monkeypatch):
    """LocalStore writes and reads each file as one stream on a network or FUSE mount (per-file schedule),
    elsewhere the threads share every file's blocks; both give the same bytes."""
    schedules = []
    real_write, real_read = native.write, native.read
    monkeypatch.setattr(native, "write", lambda *a, **k: schedules.append(k["schedule"]) or real_write(*a, **k))
    jobs = []
    monkeypatch.setattr(native, "read", lambda j, **k: schedules.append(k["schedule"]) or jobs.append(j)
                        or real_read(j, **k))
    for fstype, expected in (("fuse.ceph-fuse", "per-file"), ("ext4", "shared")):
        monkeypatch.setattr(store_module, "mount_of", lambda path, t=fstype: MountInfo("/", "d", t, "rw"))
        store = LocalStore(tmp_path / fstype)
        store.prepare()
        data = [bytes(range(256)) * (4096 * (i + 1)) for i in range(3)]
        schedules.clear()
        store.write_files([(f"f{i}", memoryview(d)) for i, d in enumerate(data)], threads=2, block_size=1 << 16,
                          direct=False)
        sinks = [bytearray(len(d)) for d in data]
        store.read_files([(f"f{i}", memoryview(b)) for i, b in enumerate(sinks)], threads=2, block_size=1 << 16,
                         direct=False)
        assert [bytes(b) for b in sinks] == data and schedules == [expected, expected]
        # more threads than files: on a network mount each file is read as contiguous parts, one per
        # thread, each through its own descriptor (a path of its own); a file of one block stays whole
        data.append(b"x" * 1000)
        store.write_files([("small", memoryview(data[-1]))], threads=1, block_size=1 << 16, direct=False)
        sinks = [bytearray(len(d)) for d in data]
        store.read_files([(name, memoryview(b)) for name, b in zip(["f0", "f1", "f2", "small"], sinks, strict=True)],
                         threads=8, block_size=1 << 16, direct=False)
        assert [bytes(b) for b in sinks] == data
        parts = [(len(view), offset) for view, _, offset in jobs[-1]]
        if expected == "per-file":
            assert len({path for _, path, _ in jobs[-1]}) == len(jobs[-1]) == 2 + 2 + 2 + 1
            assert parts[:2] == [(1 << 19, 0), (1 << 19, 1 << 19)] and parts[-1] == (1000, 0)
        else:
            assert parts == [(len(d), 0) for d in data]



# -- under a launch: rank 0 measures, every rank uses its settings ---------------------------------------

HERE = Path(__file__).resolve()


def _launch_env(**extra: str) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.slow
def test_ranks_under_a_launch_use_rank_0s_measurement(tmp_path):
    """Two ranks (torchrun, gloo): rank 0 alone probes the mount, once; both record the same tuning in
    every SaveResult and read the checkpoint back in the same mode."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(HERE), "launch", str(tmp_path)]
    env = _launch_env(CKPTBENCH_TUNE="1", CKPTBENCH_TUNE_MIN_BYTES="0", CKPTBENCH_TUNE_PROBE_BYTES=str(1 << 20),
                      CKPTBENCH_TUNE_SECONDS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["measures"] for r in ranks] == [1, 0]  # rank 1 never probed
    first = ranks[0]["first"]
    assert first["direct"]["source"] == "measured" and first["measured"]["buffered_gbps"]
    assert first["decided_by"] == "rank 0 of 2"
    for r in ranks:
        assert r["first"] == first and r["second"] == first  # the same settings, and the cache on every rank
        direct, threads, block_size = r["saved_with"]
        assert (threads, block_size) == (first["threads"]["value"], first["block_size"]["value"])
        assert direct == first["direct"]["value"] or r["fallback"]  # O_DIRECT asked for may fall back
        assert r["read_direct"] == first["read_direct"]["value"]
    # ckptbench's DCP Writer in the same launch (measurements forgotten first): the coordinator measures,
    # alone, and every rank writes in the mode it settled
    assert [r["dcp_measures"] for r in ranks] == [1, 0]
    assert ranks[0]["dcp_chosen"] is not None and ranks[1]["dcp_chosen"] is None
    assert ranks[0]["dcp_direct"] == ranks[1]["dcp_direct"] == ranks[0]["dcp_chosen"]


def _launch_worker(out: Path) -> None:
    import ckptbench
    from ckptbench.checkpoint import tuning as tuning_module

    rank = int(os.environ["RANK"])
    measures = []
    real = tuning_module.measure

    def counted(*args, **kwargs):
        measures.append(1)
        return real(*args, **kwargs)

    tuning_module.measure = counted
    state = {"w": torch.full((1 << 18,), float(rank))}
    with ckptbench.Checkpointer() as ckpt:
        first = ckpt.save(state, out / "one")
        second = ckpt.save(state, out / "two")
        assert torch.equal(ckpt.load(out / "one")["w"], state["w"])
    import torch.distributed.checkpoint as dcp

    from ckptbench.integrations.dcp import Writer

    tuning_module.forget()
    before = len(measures)
    writer = Writer(out / "dcp")
    dcp.save({f"w{rank}": state["w"]}, storage_writer=writer)
    measured = tuning_module.cached(tuning_module.mount_of(out))  # rank 0's, where it measured
    (out / f"rank{rank}.json").write_text(json.dumps({
        "dcp_measures": len(measures) - before, "dcp_direct": writer.last_stats.direct,
        "dcp_chosen": measured.direct.value if measured is not None else None,
        "measures": before, "first": first.tuning, "second": second.tuning,
        "saved_with": [first.direct, first.threads, first.block_size],
        "fallback": bool(first.direct_fallback_reason),
        "read_direct": tuning_module.read_mode(LocalStore(out / "one"), None)}))


if __name__ == "__main__":
    _launch_worker(Path(sys.argv[2]))
    os._exit(0)  # skip interpreter teardown with a live gloo group


def test_a_sweep_takes_three_samples_of_each_and_one_cut_short_keeps_the_default(clock):
    """Between equal settings, two samples a side part by chance one time in six (two of three processes on one
    mount chose differently); three samples each are asked for, and a sweep the time budget cut before every
    candidate had them keeps the default, however the samples it has look."""
    def trial(threads: int) -> float:
        clock.now += 1.0
        return 2.0 if threads == 8 else 1.0

    measured: dict = {}
    chosen = tuning._sweep(None, "threads", (2, 4, 8), 2, 100.0, measured, trial, "here")
    assert chosen.value == 8 and chosen.source == "measured"
    assert [len(v) for v in measured["threads_gbps"].values()] == [tuning.REPEATS] * 3 == [3] * 3

    clock.now = 0.0
    measured = {}
    chosen = tuning._sweep(None, "threads", (2, 4, 8), 2, 7.5, measured, trial, "here")  # 8 trials of 9
    assert (chosen.value, chosen.source) == (2, "default") and "no time for 3 samples of every threads" in chosen.reason
    assert measured["threads_gbps"]["8"] == [2.0, 2.0]


def test_on_a_slow_mount_every_sweep_finishes_within_the_budget(clock):
    """Trials sized to a share of the budget: on a mount where every trial takes its full share (50 MB/s here,
    far below the probe's bytes per second), both sweeps still get their three samples of every candidate
    and decide by measurement, within the budget."""
    def rate(direct, threads, block):
        return 0.05 * (1.5 if threads == 4 else 1.0)

    chosen = _measure(_FakeStore(clock, rate))
    assert (chosen.threads.value, chosen.threads.source) == (4, "measured")
    assert chosen.block_size.source == "measured"
    assert all(len(v) == tuning.REPEATS for v in chosen.measured["threads_gbps"].values())
    assert clock.now <= tuning.knobs.TUNE_SECONDS * 1.15


_BENCH = {"schema": "ckptbench.fs-bench/1", "best": 0,
          "results": [{"config": {"threads": 4, "block_size": 1 << 20, "direct": True}}]}


def _bench_with(path: tuple, value):
    document = json.loads(json.dumps(_BENCH))
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return document


@pytest.mark.parametrize("document", [
    _bench_with(("best",), 5), _bench_with(("best",), "0"), _bench_with(("best",), -1), _bench_with(("best",), True),
    _bench_with(("results", 0, "config"), "x"), _bench_with(("results", 0), "x"),
    _bench_with(("results", 0, "config", "threads"), 10**9), _bench_with(("results", 0, "config", "threads"), 0),
    _bench_with(("results", 0, "config", "threads"), float("inf")),
    _bench_with(("results", 0, "config", "threads"), "8"), _bench_with(("results", 0, "config", "threads"), True),
    _bench_with(("results", 0, "config", "block_size"), 2**70), _bench_with(("results", 0, "config", "block_size"), -1),
    _bench_with(("results", 0, "config", "direct"), "no"),
    {"settings": {"threads": "8"}}, {"settings": {"threads": {"value": -3}}},
    {"settings": {"block_size_bytes": {"value": 1e308}}}, {"settings": {"direct": {"value": "yes"}}},
    {"settings": {"threads": {"value": 2**40, "reason": "r"}}},
])
def test_a_result_file_with_settings_no_caller_may_give_is_one_usage_error(document) -> None:
    """What a result file names reaches the engine as the caller's own settings would: checked as they are."""
    with pytest.raises(UsageError, match="x.json"):
        tuning.from_result(document, "x.json")


def _result_file_in_thread(timeout_s: float = 10.0):
    """``tuning._result_file(None)``'s outcome (its value, or the exception it raised), or "hung"."""
    import threading

    outcome: list = []

    def run() -> None:
        try:
            outcome.append(tuning._result_file(None))
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return outcome[0] if outcome else "hung"


def test_a_result_file_that_is_a_fifo_is_refused_without_hanging(tmp_path, monkeypatch) -> None:
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    monkeypatch.setenv("CKPTBENCH_TUNE_FROM", str(fifo))
    got = _result_file_in_thread()
    if got == "hung":  # let the reader go (a writer that closes at once: it reads end of file)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert isinstance(got, UsageError) and "FIFO" in str(got), got


def test_a_result_file_that_is_a_symlink_is_not_followed(tmp_path, monkeypatch) -> None:
    real = tmp_path / "real.json"
    real.write_text(json.dumps(_BENCH))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    monkeypatch.setenv("CKPTBENCH_TUNE_FROM", str(link))
    with pytest.raises(UsageError, match="symbolic link"):
        tuning._result_file(None)
    monkeypatch.setenv("CKPTBENCH_TUNE_FROM", str(real))
    assert tuning._result_file(None)["threads"].value == 4
